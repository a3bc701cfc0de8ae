"""Stream-ordered pool benchmarks (paddle_rt/_core/pool.pyx). Medians over --reps repetitions (default 7), sides
interleaved within each repetition.

  python bench/bench_pool.py [--reps N] [--n N] [--json]

1. ``free_async(malloc_async(256, s), s)`` on one stream from Python (target <= 150 ns per pair), against the
   allocator's ``paddle_rt.malloc(256).free()`` pair measured in the same run (the baseline); "net" subtracts an
   empty Python loop.
2. Cross-stream reuse: a block freed on stream A then allocated on stream B, per policy (all off + host
   synchronize of A; follow event dependencies: B waits on an event recorded on A; opportunistic: A idle;
   internal dependencies: the pool inserts the wait), microseconds per free+malloc handoff (including the
   synchronize / event work each case needs).
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import paddle_rt
except ImportError:     # running from a checkout with an in-place build (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import paddle_rt

from paddle_rt import MemPool


def timed(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def same_stream(reps, n):
    s = paddle_rt.Stream()
    pool = MemPool(s.device)
    m, f = pool.malloc_async, pool.free_async
    gm, gf = paddle_rt.malloc_async, paddle_rt.free_async

    def empty(n):
        for _ in range(n):
            pass

    def pair_pool(n):
        for _ in range(n):
            f(m(256, s), s)

    def pair_global(n):
        for _ in range(n):
            gf(gm(256, s), s)

    def pair_malloc(n):
        for _ in range(n):
            paddle_rt.malloc(256).free()

    rows = {"empty": [], "pool.free_async(pool.malloc_async())": [], "paddle_rt.free_async(paddle_rt.malloc_async())": [],
            "paddle_rt.malloc().free() (baseline)": []}
    for _ in range(reps):
        for name, fn in zip(rows, (empty, pair_pool, pair_global, pair_malloc)):
            rows[name].append(timed(fn, n))
    s.close()
    return {k: statistics.median(v) for k, v in rows.items()}


def cross_stream(reps, n):
    a, b = paddle_rt.Stream(), paddle_rt.Stream()
    out = {}
    cases = {
        "all off (host synchronize of A)": dict(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
                                                reuse_allow_internal_dependencies=False),
        "follow event dependencies": dict(reuse_follow_event_dependencies=True, reuse_allow_opportunistic=False,
                                          reuse_allow_internal_dependencies=False),
        "opportunistic": dict(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=True,
                              reuse_allow_internal_dependencies=False),
        "internal dependencies": dict(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
                                      reuse_allow_internal_dependencies=True),
    }
    for name, kw in cases.items():
        pool = MemPool(a.device, release_threshold=1 << 30, **kw)
        x = pool.malloc_async(4096, a)

        def run(n, name=name, pool=pool):
            nonlocal x
            reused = 0
            for _ in range(n):
                p = x.ptr
                pool.free_async(x, a)
                if name.startswith("all off"):
                    a.synchronize()
                elif name.startswith("follow"):
                    e = paddle_rt.Event()
                    e.record(a)
                    b.wait_event(e)
                elif name.startswith("opportunistic"):
                    while not a.query():
                        pass
                y = pool.malloc_async(4096, b)
                reused += y.ptr == p
                pool.free_async(y, b)
                x = pool.malloc_async(4096, a)     # back to A the same way (b's free must be handed over)
                if name.startswith("all off"):
                    b.synchronize()
                elif name.startswith("follow"):
                    e = paddle_rt.Event()
                    e.record(b)
                    a.wait_event(e)
            assert reused == n, (name, reused, n)

        out[name + " (us per handoff)"] = statistics.median(timed(run, n) / 2 / 1000 for _ in range(reps))
        pool.free_async(x, a)
        a.synchronize()
        b.synchronize()
    a.close()
    b.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = {"same stream, ns per pair": same_stream(args.reps, args.n),
           "cross stream": cross_stream(args.reps, max(1, args.n // 100))}
    empty = res["same stream, ns per pair"]["empty"]
    for k in list(res["same stream, ns per pair"]):
        if k != "empty":
            res["same stream, ns per pair"][k + " net"] = res["same stream, ns per pair"][k] - empty
    if args.json:
        print(json.dumps(res, indent=1))
        return
    for sect, rows in res.items():
        print(sect)
        for k, v in rows.items():
            print(f"  {k:60s} {v:10.1f}")


if __name__ == "__main__":
    main()
