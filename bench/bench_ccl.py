"""Collective benchmark (issue 6): a thin wrapper over paddle_rt.bench.ccl (the same code
``python -m paddle_rt bench --only ccl`` runs). all_reduce of float32 on rt_cpu, reported like nccl-tests.

    python bench/bench_ccl.py [--reps 5] [--max-mib 256] [--devices 2,4]

For each size: time per all_reduce (out of place, every rank issued from one thread; each rank's call runs on its
device's current stream), algbw = bytes / time, busbw = algbw * 2 * (n - 1) / n, against the memcpy bandwidth of the
same size measured in the same run (numpy.copyto of a host buffer). Figures are medians of --reps repetitions. The
4-device run happens in a child process (RT_CPU_DEVICE_COUNT=4) whose results are printed in the same table form.
"""
import argparse
import sys

import _checkout  # noqa: F401  (first: a checkout's in-place build when paddle_rt is not installed)
import paddle_rt
from paddle_rt.bench import ccl as ccl_bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--devices", default="2,4")
    args = ap.parse_args()
    max_bytes = args.max_mib << 20
    for n in (int(x) for x in args.devices.split(",")):
        try:
            rows = ccl_bench.run_on(n, max_bytes, args.reps)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            sys.exit(1)
        ccl_bench.show(rows)
        print()


if __name__ == "__main__":
    main()
