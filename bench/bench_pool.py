"""Stream-ordered pool benchmarks: a thin wrapper over paddle_rt.bench.pool (the same code
``python -m paddle_rt bench`` runs; see that module for what is measured).

  python bench/bench_pool.py [--quick] [--reps N] [--n N] [--json]
"""

import _checkout  # first: a checkout's in-place build when paddle_rt is not installed
from paddle_rt.bench import pool as pool_bench


def main():
    ap = _checkout.quick_parser(7, 3, "iterations")
    ap.add_argument("--n", type=int, default=None, help="pairs per repetition (default 100000, quick 20000)")
    args = ap.parse_args()
    _checkout.print_rows(pool_bench, pool_bench.measure(args.quick, reps=args.reps, n=args.n), args.json)


if __name__ == "__main__":
    main()
