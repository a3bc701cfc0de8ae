"""Operator benchmarks: a thin wrapper over paddle_rt.bench.ops (the same code
``python -m paddle_rt bench`` runs; see that module for what is measured).

  python bench/bench_ops.py [--quick] [--reps N] [--json]
"""
import argparse
import json
import os
import sys

try:
    import paddle_rt
except ImportError:     # running from a checkout with an in-place build (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import paddle_rt

from paddle_rt.bench import ops as ops_bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and iterations")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 7, quick 3)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = ops_bench.measure(args.quick, reps=args.reps)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(ops_bench.format_rows(rows))


if __name__ == "__main__":
    main()
