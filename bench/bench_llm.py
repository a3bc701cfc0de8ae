"""LLM generation benchmark: a thin wrapper over paddle_rt.bench.llm (the same code ``python -m paddle_rt bench
--only llm`` runs; see that module for what is measured).

  python bench/bench_llm.py [--quick] [--reps N] [--sizes 15M,100M] [--threads N] [--families qwen2,...|none]
      [--batches 1,4,16] [--json]
"""
import argparse
import json
import os
import sys

try:
    import paddle_rt
except ImportError:     # running from a checkout with an in-place build (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import paddle_rt  # noqa: F401

from paddle_rt.bench import llm as llm_bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and tokens")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5, quick 2)")
    ap.add_argument("--sizes", default=None, help="comma-separated model sizes (default: all of " +
                    ", ".join(llm_bench.CONFIGS) + ")")
    ap.add_argument("--threads", type=int, default=None, help="threads of both sides (default: the CPUs available)")
    ap.add_argument("--families", default=None, help="comma-separated families (default: all of " +
                    ", ".join(llm_bench.FAMILIES) + "; 'none': no family rows)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes of the family rows (default 1,4,16)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    families = None if args.families is None else (() if args.families == "none" else args.families.split(","))
    rows = llm_bench.measure(args.quick, reps=args.reps, sizes=args.sizes.split(",") if args.sizes else None,
                             threads=args.threads, families=families,
                             batches=tuple(int(b) for b in args.batches.split(",")) if args.batches else None)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(llm_bench.format_rows(rows))


if __name__ == "__main__":
    main()
