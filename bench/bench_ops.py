"""Operator benchmarks: a thin wrapper over paddle_rt.bench.ops (the same code
``python -m paddle_rt bench`` runs; see that module for what is measured).

  python bench/bench_ops.py [--quick] [--reps N] [--json]
"""

import _checkout  # first: a checkout's in-place build when paddle_rt is not installed
from paddle_rt.bench import ops as ops_bench


def main():
    args = _checkout.quick_parser(7, 3, "iterations").parse_args()
    _checkout.print_rows(ops_bench, ops_bench.measure(args.quick, reps=args.reps), args.json)


if __name__ == "__main__":
    main()
