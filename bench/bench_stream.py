"""Stream/event/copy benchmarks (issue 4): a thin wrapper over paddle_rt.bench.streams (the same code
``python -m paddle_rt bench --only streams`` runs). Run from the repository root after an in-place build:

    python bench/bench_stream.py [--reps 7]

Every figure is the median of --reps repetitions; baselines (numpy.copyto) are measured in the same run.
"""
import argparse
import sys

import _checkout  # noqa: F401  (first: a checkout's in-place build when paddle_rt is not installed)
import paddle_rt
from paddle_rt.bench import streams as stream_bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    r = args.reps
    rows = [(label, text) for label, text, _ in stream_bench.collect(r)]
    w = max(len(k) for k, _ in rows)
    print(f"paddle_rt {paddle_rt.__version__}, python {sys.version.split()[0]}, reps={r} (medians)")
    for k, v in rows:
        print(f"| {k:<{w}} | {v:>16} |")


if __name__ == "__main__":
    main()
