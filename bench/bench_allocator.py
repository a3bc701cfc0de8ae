"""Allocator benchmarks (paddle_rt/_core/allocator.pyx). Every ratio is measured within one run, the two sides
interleaved, and reported as the median over --reps repetitions (default 7).

  python bench/bench_allocator.py [--reps N] [--json]

1. Cached alloc+free pair from Python: ``paddle_rt.malloc(256).free()`` (Allocation path) and
   ``raw_free(raw_malloc(256))`` (raw-pointer path) against creating and dropping a trivial cdef-class object (the
   floor). Targets: <= 100 ns per pair and <= 3x the floor. Figures include the Python loop; "net" subtracts an empty
   loop measured in the same repetition.
2. The pair through the public Cython API (core_malloc/core_free) in a nogil loop against glibc malloc+free, both
   cycling through the power-of-two sizes 256 B ... 1 MiB. Target (a stretch): <= 2x.
3. The nogil pair with 100,000 live blocks (random sizes 64 B .. 70 KB) against 10 live blocks. Target: <= 2x.
   Also reported: 100,000 live blocks plus 33,000 free fragments between them (a harsher case).
"""
import argparse
import json
import statistics
import sys
import time

import os

# numpy's OpenBLAS threads spin in the background and steal the CPU from the measured loops
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

try:
    import paddle_rt
except ImportError:     # running from a checkout with an in-place build (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import paddle_rt
from paddle_rt._core import _bench_alloc as B

SIZES = np.array([1 << k for k in range(8, 21)], dtype=np.int64)   # 256 B ... 1 MiB


def _timed(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def py_loops(dev):
    malloc, raw_malloc, raw_free, Trivial = paddle_rt.malloc, paddle_rt.raw_malloc, paddle_rt.raw_free, B.Trivial

    def empty(n):
        for _ in range(n):
            pass

    def floor(n):
        for _ in range(n):
            Trivial()

    def allocation(n):
        for _ in range(n):
            malloc(256).free()

    def allocation_dev(n):
        for _ in range(n):
            malloc(256, dev).free()

    def raw(n):
        for _ in range(n):
            raw_free(raw_malloc(256))

    def raw_dev(n):
        for _ in range(n):
            raw_free(raw_malloc(256, dev), dev)

    return {"empty": empty, "floor": floor, "allocation": allocation, "allocation_device": allocation_dev,
            "raw": raw, "raw_device": raw_dev}


def bench_python(dev, reps, n=200_000):
    loops = py_loops(dev)
    for f in loops.values():        # warm up (the first allocation creates the chunk)
        f(1000)
    per = {k: [] for k in loops}
    for _ in range(reps):
        for k, f in loops.items():
            per[k].append(_timed(f, n))
    med = {k: statistics.median(v) for k, v in per.items()}
    ratios = {k: statistics.median(per[k][i] / per["floor"][i] for i in range(reps))
              for k in ("allocation", "allocation_device", "raw", "raw_device")}
    net = {k: statistics.median((per[k][i] - per["empty"][i]) for i in range(reps))
           for k in ("floor", "allocation", "allocation_device", "raw", "raw_device")}
    return {"ns_per_pair": med, "ratio_to_floor": ratios, "net_ns_per_pair": net}


def bench_nogil(dev, reps, rounds=20_000):
    B.core_pairs(dev, SIZES, 200)
    B.glibc_pairs(SIZES, 200)
    core, libc = [], []
    for _ in range(reps):
        core.append(B.core_pairs(dev, SIZES, rounds))
        libc.append(B.glibc_pairs(SIZES, rounds))
    return {"core_ns": statistics.median(core), "glibc_ns": statistics.median(libc),
            "ratio": statistics.median(c / g for c, g in zip(core, libc))}


def _pairs_with_live(dev, reps, rounds, held_sizes, holes):
    """Median ns of the nogil pair while len(held_sizes) blocks are live (after freeing every 4th of them when
    ``holes``, so that the free index also holds many fragments)."""
    ptrs = B.hold_blocks_sizes(dev, held_sizes)
    try:
        if holes:
            B.release_blocks(dev, ptrs[::4])
            ptrs = ptrs[1::4] + ptrs[2::4] + ptrs[3::4]
        B.core_pairs(dev, SIZES, 200)
        out = [B.core_pairs(dev, SIZES, rounds) for _ in range(reps)]
    finally:
        B.release_blocks(dev, ptrs)
        paddle_rt.empty_cache(dev)
    return statistics.median(out)


def bench_many_live(dev, reps, rounds=20_000, live=100_000):
    rng = np.random.default_rng(0)
    held = rng.choice(np.array([64, 256, 1000, 4096, 20_000, 70_000], dtype=np.int64), size=live)
    few = _pairs_with_live(dev, reps, rounds, held[:10], False)
    many = _pairs_with_live(dev, reps, rounds, held, False)
    holes = _pairs_with_live(dev, reps, rounds, np.concatenate([held, held[: live // 3]]), True)
    return {"live_100k_ns": many, "live_10_ns": few, "ratio": many / few,
            "live_100k_with_holes_ns": holes, "ratio_with_holes": holes / few}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.reps < 5:
        ap.error("--reps must be >= 5")
    dev = paddle_rt.device(args.device) if args.device else paddle_rt.get_device()
    paddle_rt.empty_cache(dev)
    res = {"device": str(dev), "reps": args.reps,
           "python": bench_python(dev, args.reps),
           "nogil": bench_nogil(dev, args.reps),
           "many_live": bench_many_live(dev, args.reps)}
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    p, g, m = res["python"], res["nogil"], res["many_live"]

    def ok(b):
        return "ok" if b else "MISSED"

    print(f"allocator benchmarks on {dev}, medians of {args.reps} repetitions")
    print(f"{'measure':58s} {'figure':>12s} {'target':>10s}")
    print(f"{'python floor: create+drop a trivial cdef object (ns)':58s} {p['ns_per_pair']['floor']:12.1f}")
    for k, label in (("allocation", "malloc(256).free()"), ("allocation_device", "malloc(256, d).free()"),
                     ("raw", "raw_free(raw_malloc(256))"),
                     ("raw_device", "raw_free(raw_malloc(256, d), d)")):
        ns = p["ns_per_pair"][k]
        r = p["ratio_to_floor"][k]
        print(f"{'python pair ' + label + ' (ns)':58s} {ns:12.1f} {'<= 100':>10s} {ok(ns <= 100)}")
        print(f"{'  ratio to the floor':58s} {r:12.2f} {'<= 3x':>10s} {ok(r <= 3)}")
        print(f"{'  net of the empty loop (ns; floor net ' + format(p['net_ns_per_pair']['floor'], '.1f') + ')':58s}"
              f" {p['net_ns_per_pair'][k]:12.1f}")
    print(f"{'nogil pair, core API, 256 B..1 MiB (ns)':58s} {g['core_ns']:12.1f}")
    print(f"{'nogil pair, glibc malloc/free, same sizes (ns)':58s} {g['glibc_ns']:12.1f}")
    print(f"{'  ratio (stretch)':58s} {g['ratio']:12.2f} {'<= 2x':>10s} {ok(g['ratio'] <= 2)}")
    print(f"{'nogil pair with 100,000 live blocks (ns)':58s} {m['live_100k_ns']:12.1f}")
    print(f"{'nogil pair with 10 live blocks (ns)':58s} {m['live_10_ns']:12.1f}")
    print(f"{'  ratio':58s} {m['ratio']:12.2f} {'<= 2x':>10s} {ok(m['ratio'] <= 2)}")
    print(f"{'nogil pair, 100,000 live + 33,000 free fragments (ns)':58s} {m['live_100k_with_holes_ns']:12.1f}")
    print(f"{'  ratio to 10 live (harsher than the target asks)':58s} {m['ratio_with_holes']:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
