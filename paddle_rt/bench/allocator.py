"""Allocator benchmarks (paddle_rt/_core/allocator.pyx), run by ``python -m paddle_rt bench`` and by
bench/bench_allocator.py. Every ratio is measured within one run, the two sides interleaved, and reported as the
median over the repetitions.

1. Cached alloc+free pair from Python: ``paddle_rt.malloc(256).free()`` (Allocation path) and
   ``raw_free(raw_malloc(256))`` (raw-pointer path) against creating and dropping a trivial cdef-class object (the
   floor). Targets: <= 100 ns per pair and <= 3x the floor. Figures include the Python loop; "net" subtracts an empty
   loop measured in the same repetition.
2. The pair through the public Cython API (core_malloc/core_free) in a nogil loop against glibc malloc+free, both
   cycling through the power-of-two sizes 256 B ... 1 MiB. Target (a stretch): <= 2x.
3. The nogil pair with 100,000 live blocks (random sizes 64 B .. 70 KB) against 10 live blocks. Target: <= 2x.
   Also reported: 100,000 live blocks plus 33,000 free fragments between them (a harsher case).
"""
import os
import statistics
import time

# numpy's OpenBLAS threads spin in the background and steal the CPU from the measured loops
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

import paddle_rt
from paddle_rt.bench import figure

AREA = "allocator"
PAIR_NS, PAIR_RATIO, NOGIL_RATIO, LIVE_RATIO = 100.0, 3.0, 2.0, 2.0
SIZES = np.array([1 << k for k in range(8, 21)], dtype=np.int64)   # 256 B ... 1 MiB
PY_PAIRS = (("allocation", "malloc(256).free()"), ("allocation_device", "malloc(256, d).free()"),
            ("raw", "raw_free(raw_malloc(256))"), ("raw_device", "raw_free(raw_malloc(256, d), d)"))


def _bench():
    from paddle_rt.bench import _alloc_kernels as _bench_alloc
    return _bench_alloc


def _timed(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def py_loops(dev):
    malloc, raw_malloc, raw_free, Trivial = paddle_rt.malloc, paddle_rt.raw_malloc, paddle_rt.raw_free, _bench().Trivial

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
    ratio_samples = {k: [per[k][i] / per["floor"][i] for i in range(reps)]
                     for k in ("allocation", "allocation_device", "raw", "raw_device")}
    ratios = {k: statistics.median(v) for k, v in ratio_samples.items()}
    net = {k: statistics.median((per[k][i] - per["empty"][i]) for i in range(reps))
           for k in ("floor", "allocation", "allocation_device", "raw", "raw_device")}
    return {"ns_per_pair": med, "ratio_to_floor": ratios, "net_ns_per_pair": net,
            "samples": {"ns_per_pair": per, "ratio_to_floor": ratio_samples}}


def bench_nogil(dev, reps, rounds=20_000):
    B = _bench()
    B.core_pairs(dev, SIZES, 200)
    B.glibc_pairs(SIZES, 200)
    core, libc = [], []
    for _ in range(reps):
        core.append(B.core_pairs(dev, SIZES, rounds))
        libc.append(B.glibc_pairs(SIZES, rounds))
    return {"core_ns": statistics.median(core), "glibc_ns": statistics.median(libc),
            "ratio": statistics.median(c / g for c, g in zip(core, libc)),
            "samples": {"core_ns": core, "glibc_ns": libc, "ratio": [c / g for c, g in zip(core, libc)]}}


def _pairs_with_live(dev, reps, rounds, held_sizes, holes):
    """The ns of the nogil pair, one per repetition, while len(held_sizes) blocks are live (after freeing every 4th of them when
    ``holes``, so that the free index also holds many fragments)."""
    B = _bench()
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
    return out


def bench_many_live(dev, reps, rounds=20_000, live=100_000):
    rng = np.random.default_rng(0)
    held = rng.choice(np.array([64, 256, 1000, 4096, 20_000, 70_000], dtype=np.int64), size=live)
    few = _pairs_with_live(dev, reps, rounds, held[:10], False)
    many = _pairs_with_live(dev, reps, rounds, held, False)
    holes = _pairs_with_live(dev, reps, rounds, np.concatenate([held, held[: live // 3]]), True)
    # The two sides cannot alternate (the live blocks differ): the ratio's spread is the widest the two spreads allow.
    med = statistics.median
    return {"live_100k_ns": med(many), "live_10_ns": med(few), "ratio": med(many) / med(few),
            "live_100k_with_holes_ns": med(holes), "ratio_with_holes": med(holes) / med(few),
            "samples": {"ratio": [min(many) / max(few), med(many) / med(few), max(many) / min(few)],
                        "ratio_with_holes": [min(holes) / max(few), med(holes) / med(few), max(holes) / min(few)]}}


def run(dev, reps, quick=False):
    """Every figure of this module as bench/bench_allocator.py's JSON: {"device", "reps", "python", "nogil",
    "many_live"}."""
    paddle_rt.empty_cache(dev)
    return {"device": str(dev), "reps": reps,
            "python": bench_python(dev, reps, 50_000 if quick else 200_000),
            "nogil": bench_nogil(dev, reps, 5_000 if quick else 20_000),
            "many_live": bench_many_live(dev, reps, 5_000 if quick else 20_000)}


def to_results(res):
    """run()'s figures as the suite's result dicts (medians with their spread over the repetitions)."""
    p, g, m = res["python"], res["nogil"], res["many_live"]
    ps, gs = p["samples"], g["samples"]
    reps = res["reps"]
    out = [figure(AREA, "Python floor: create + drop a trivial cdef object", ps["ns_per_pair"]["floor"], "ns",
                  note=f"median of {reps}; baseline of the pair ratios")]
    for k, label in PY_PAIRS:
        out.append(figure(AREA, f"Python pair {label}", ps["ns_per_pair"][k], "ns", at_most=PAIR_NS,
                          note=f"loop included; {p['net_ns_per_pair'][k]:.1f} ns net of the empty loop"))
        out.append(figure(AREA, f"  {label}: ratio to the floor", ps["ratio_to_floor"][k], "x", at_most=PAIR_RATIO,
                          note="same run, interleaved"))
    out.append(figure(AREA, "nogil pair, Cython core API, 256 B..1 MiB", gs["core_ns"], "ns"))
    out.append(figure(AREA, "nogil pair, glibc malloc/free, same sizes", gs["glibc_ns"], "ns"))
    out.append(figure(AREA, "  nogil pair: ratio to glibc", gs["ratio"], "x", at_most=NOGIL_RATIO,
                      note="a stretch target; interleaved"))
    out.append(figure(AREA, "nogil pair with 100,000 live blocks", [m["live_100k_ns"]], "ns"))
    out.append(figure(AREA, "  100,000 live vs 10 live blocks", m["samples"]["ratio"], "x", at_most=LIVE_RATIO,
                      note=f"10 live: {m['live_10_ns']:.1f} ns; spread: fastest/slowest .. slowest/fastest"))
    out.append(figure(AREA, "  100,000 live + 33,000 free fragments vs 10 live", m["samples"]["ratio_with_holes"],
                      "x", note="harsher than the target asks"))
    return out


def measure(quick=False, device=None):
    """The allocator's figures (the current device unless ``device``)."""
    dev = paddle_rt.device(device) if device else paddle_rt.get_device()
    return to_results(run(dev, 3 if quick else 7, quick))
