"""Cost of recording (issue 7: profiler and memory history). Run from the repository root after an in-place build:

    python bench/bench_trace.py [--reps 7]

Each hot path is timed with nothing recording and while the recorder takes memory events, memory events with Python
stacks, or stream operations; the ratio to "off" is measured within one run (medians of --reps repetitions). The
cost of the disabled check itself (one load and one predictable branch) is measured against a build without the
hooks: run bench/bench_allocator.py and bench/bench_stream.py on both builds (bench/RESULTS.md, "Profiler").
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

try:
    import paddle_rt
except ImportError:     # running from a checkout with an in-place build (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import paddle_rt
from paddle_rt._core import _bench_alloc as B, _bench_stream as CB, trace

SIZES = np.array([1 << k for k in range(8, 21)], dtype=np.int64)


class Sub:
    def __init__(self, mask):
        self.mask = mask
        self.start_ns = trace.now_ns()
        self.stop_ns = None
        self.n = 0

    def _deliver(self, events):
        self.n += len(events)


def measure(s):
    core = B.core_pairs("rt_cpu:0", SIZES, 1000)
    m = paddle_rt.malloc
    n = 20_000
    t0 = time.perf_counter_ns()
    for _ in range(n):
        m(256).free()
    py = (time.perf_counter_ns() - t0) / n
    enq, total, ran = CB.enqueue_host_funcs(s, 50_000)
    return core, py, enq / 50_000, 50_000 / (total / 1e9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    s = paddle_rt.Stream("rt_cpu:0")
    modes = [("off", 0), ("memory", trace.MEMORY), ("memory+stacks", trace.MEMORY | trace.STACKS),
             ("streams", trace.STREAMS)]
    res = {name: [] for name, _ in modes}
    measure(s)
    for _ in range(args.reps):
        for name, mask in modes:
            sub = None
            if mask:
                sub = Sub(mask)
                trace.subscribe(sub)
            res[name].append(measure(s))
            if sub is not None:
                sub.stop_ns = trace.now_ns()
                trace.unsubscribe(sub)
    s.close()
    cols = ("nogil alloc+free pair (ns)", "Python malloc(256).free() (ns)", "C host func enqueue, nogil (ns)",
            "stream throughput (M ops/s)")
    off = [statistics.median(x[i] for x in res["off"]) for i in range(4)]
    print(f"paddle_rt {paddle_rt.__version__}, python {sys.version.split()[0]}, reps={args.reps} (medians)")
    print(f"| {'recording':14} | " + " | ".join(f"{c:>31}" for c in cols) + " |")
    for name, _ in modes:
        med = [statistics.median(x[i] for x in res[name]) for i in range(4)]
        cells = []
        for i, v in enumerate(med):
            v2 = v / 1e6 if i == 3 else v
            cells.append(f"{v2:8.1f} ({v / off[i]:5.2f}x off)" if i != 3 else f"{v2:8.2f} ({v / off[i]:5.2f}x off)")
        print(f"| {name:14} | " + " | ".join(f"{c:>31}" for c in cells) + " |")


if __name__ == "__main__":
    main()
