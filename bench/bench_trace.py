"""Cost of recording (issue 7: profiler and memory history). Run from the repository root after an in-place build:

    python bench/bench_trace.py [--reps 7]
    python bench/bench_trace.py --baseline-src DIR [--pairs 10]

The first form times each hot path with nothing recording and while the recorder takes memory events, memory events
with Python stacks, or stream operations; the ratio to "off" is measured within one run (medians of --reps
repetitions). The second measures the cost of the disabled check itself (one load and one branch marked unlikely)
against another build: DIR is the ``src`` folder of a checkout built without the hooks (e.g. ``git archive <commit>``
into a scratch folder, ``python setup.py build_ext --inplace`` there). Child processes of the two builds alternate
--pairs times; each reports the minimum of 9 timings; the medians are printed.
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

import _checkout  # noqa: F401  (first: a checkout's in-place build when paddle_rt is not installed)
import paddle_rt
from paddle_rt._core import trace
from paddle_rt.bench import _alloc_kernels as B, _stream_kernels as CB

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


PROBE = r"""
import time, numpy as np, paddle_rt
from paddle_rt.bench import _alloc_kernels as B, _stream_kernels as CB
sizes = np.array([1 << k for k in range(8, 21)], dtype=np.int64)
B.core_pairs("rt_cpu:0", sizes, 2000)
core = min(B.core_pairs("rt_cpu:0", sizes, 5000) for _ in range(9))
m = paddle_rt.malloc
def pyp(n=200000):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        m(256).free()
    return (time.perf_counter_ns() - t0) / n
pyp(20000)
py = min(pyp() for _ in range(9))
s = paddle_rt.Stream("rt_cpu:0")
def enq(n=200000):
    e, tot, ran = CB.enqueue_host_funcs(s, n)
    return e / n
enq(20000)
st = min(enq() for _ in range(9))
e = paddle_rt.Event()
rec, q = e.record, e.query
def ev(n=100000):
    s.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        rec(s)
        q()
    return (time.perf_counter_ns() - t0) / n
ev(10000)
evr = min(ev() for _ in range(9))
s.close()
print(core, py, st, evr)
"""


def compare(baseline_src, pairs):
    import subprocess
    here = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
    trees = {"baseline": os.path.abspath(baseline_src), "this build": here}
    res = {t: [] for t in trees}
    for i in range(pairs):
        for t in (list(trees) if i % 2 == 0 else list(reversed(list(trees)))):
            env = dict(os.environ, PYTHONPATH=trees[t], OPENBLAS_NUM_THREADS="1")
            out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                 cwd=os.path.dirname(trees[t]))
            if out.returncode:
                sys.exit(f"{t} ({trees[t]}) failed:\n{out.stderr}")
            res[t].append([float(x) for x in out.stdout.split()])
    names = ["nogil core_malloc+core_free pair (ns)", "Python malloc(256).free() (ns)",
             "stream_launch_host_func enqueue, nogil (ns)", "Event record+query, idle stream (ns)"]
    print(f"nothing recording; medians over {pairs} alternating process pairs (each the min of 9 timings)")
    print(f"| {'measure':44} | {'baseline':>9} | {'this build':>10} | {'diff':>7} |")
    for j, n in enumerate(names):
        b = statistics.median(r[j] for r in res["baseline"])
        a = statistics.median(r[j] for r in res["this build"])
        print(f"| {n:44} | {b:9.1f} | {a:10.1f} | {a - b:+7.1f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--baseline-src", help="src folder of a build without the hooks: measure the disabled check")
    ap.add_argument("--pairs", type=int, default=10)
    args = ap.parse_args()
    if args.baseline_src:
        compare(args.baseline_src, args.pairs)
        return
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
