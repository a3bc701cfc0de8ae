"""LLM generation benchmark: a thin wrapper over paddle_rt.bench.llm (the same code ``python -m paddle_rt bench
--only llm`` runs; see that module for what is measured).

  python bench/bench_llm.py [--quick] [--reps N] [--sizes 15M,100M] [--threads N] [--families qwen2,...|none]
      [--batches 1,4,16] [--json]
"""

import _checkout  # first: a checkout's in-place build when paddle_rt is not installed
from paddle_rt.bench import llm as llm_bench


def main():
    ap = _checkout.quick_parser(5, 2, "tokens")
    ap.add_argument("--sizes", default=None, help="comma-separated model sizes (default: all of " +
                    ", ".join(llm_bench.CONFIGS) + ")")
    ap.add_argument("--threads", type=int, default=None, help="threads of both sides (default: the CPUs available)")
    ap.add_argument("--families", default=None, help="comma-separated families (default: all of " +
                    ", ".join(llm_bench.FAMILIES) + "; 'none': no family rows)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes of the family rows (default 1,4,16)")
    args = ap.parse_args()
    families = None if args.families is None else (() if args.families == "none" else args.families.split(","))
    rows = llm_bench.measure(args.quick, reps=args.reps, sizes=args.sizes.split(",") if args.sizes else None,
                             threads=args.threads, families=families,
                             batches=tuple(int(b) for b in args.batches.split(",")) if args.batches else None)
    _checkout.print_rows(llm_bench, rows, args.json)


if __name__ == "__main__":
    main()
