"""Stream-ordered pool benchmarks (paddle_rt/_core/pool.pyx), run by ``python -m paddle_rt bench`` and by
bench/bench_pool.py. Medians over the repetitions; within a repetition the cases are interleaved so that a loaded
machine slows them alike.

1. ``pool.free_async(pool.malloc_async(256, s), s)`` on one stream from Python (target <= 150 ns per pair, loop
   included), against the allocator's ``paddle_rt.malloc(256).free()`` pair measured in the same run (the baseline).
   These loops never block, so they are timed with the calling thread's CPU clock (``time.thread_time_ns``: the
   same as the wall clock on an idle machine, but not inflated when other processes take the cores); the wall-clock
   medians are given in the notes.
2. Cross-stream reuse: a block freed on stream A, then allocated on stream B, per policy (all off + host synchronize
   of A; follow event dependencies: B waits on an event recorded on A; opportunistic: A idle; internal dependencies:
   the pool inserts the wait), microseconds per handoff, including the synchronize / event work each case needs.
3. ``paddle_rt.malloc`` + ``record_stream`` + ``free`` (a free deferred until the recorded stream passes it),
   against the plain malloc/free pair.
"""
import statistics
import time

import paddle_rt
from paddle_rt import MemPool
from paddle_rt.bench import figure, result, format_rows as _format_rows

AREA = "pool"
TARGET_PAIR_NS = 150.0


def _timed(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def _timed_cpu(fn, n):
    """(thread CPU ns, wall ns) per iteration."""
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    fn(n)
    t1 = time.perf_counter_ns()
    c1 = time.thread_time_ns()
    return (c1 - c0) / n, (t1 - t0) / n


def same_stream(reps, n):
    """Medians in ns per iteration (thread CPU time, and wall time under the key + " wall"): empty loop, pool pair,
    module-level pair, malloc/free baseline, and the malloc + record_stream + free pair."""
    s = paddle_rt.Stream()
    other = paddle_rt.Stream()
    pool = MemPool(s.device)
    m, f = pool.malloc_async, pool.free_async
    gm, gf = paddle_rt.malloc_async, paddle_rt.free_async
    malloc = paddle_rt.malloc

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
            malloc(256).free()

    def pair_recorded(n):
        for i in range(n):
            x = malloc(256)
            x.record_stream(other)
            x.free()
            if i % 256 == 255:
                other.synchronize()     # let the deferred frees run: the working set stays bounded
        other.synchronize()

    cases = {"empty": empty, "pool": pair_pool, "global": pair_global, "malloc": pair_malloc,
             "recorded": pair_recorded}
    rows = {k: [] for k in cases}
    walls = {k: [] for k in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            cpu, wall = _timed_cpu(fn, n if name != "recorded" else max(1, n // 10))
            rows[name].append(cpu)
            walls[name].append(wall)
    s.close()
    other.close()
    out = {k: statistics.median(v) for k, v in rows.items()}
    out.update({k + " wall": statistics.median(v) for k, v in walls.items()})
    out["pool samples"] = rows["pool"]
    return out


CROSS_CASES = {
    "all policies off (host synchronizes A)": dict(reuse_follow_event_dependencies=False,
                                                   reuse_allow_opportunistic=False,
                                                   reuse_allow_internal_dependencies=False),
    "follow event dependencies": dict(reuse_follow_event_dependencies=True, reuse_allow_opportunistic=False,
                                      reuse_allow_internal_dependencies=False),
    "opportunistic": dict(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=True,
                          reuse_allow_internal_dependencies=False),
    "internal dependencies": dict(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
                                  reuse_allow_internal_dependencies=True),
}


def cross_stream(reps, n):
    """Median microseconds per cross-stream handoff, per policy."""
    a, b = paddle_rt.Stream(), paddle_rt.Stream()
    out = {}
    for name, kw in CROSS_CASES.items():
        pool = MemPool(a.device, release_threshold=1 << 30, **kw)
        state = {"x": pool.malloc_async(4096, a)}

        def order(src, dst, name=name):
            """What the policy needs before `dst` may reuse a block freed on `src`."""
            if name.startswith("all"):
                src.synchronize()
            elif name.startswith("follow"):
                e = paddle_rt.Event()
                e.record(src)
                dst.wait_event(e)
            elif name.startswith("opportunistic"):
                while not src.query():
                    pass

        def run(n, name=name, pool=pool):
            x = state["x"]
            reused = 0
            for _ in range(n):
                p = x.ptr
                pool.free_async(x, a)
                order(a, b)
                y = pool.malloc_async(4096, b)
                reused += y.ptr == p
                pool.free_async(y, b)
                if not name.startswith("opportunistic"):
                    order(b, a)
                x = pool.malloc_async(4096, a)     # back to A the same way (b's free must be handed over)
            state["x"] = x
            if reused != n:
                raise AssertionError(f"{name}: {reused} of {n} handoffs reused the block")

        out[name] = statistics.median(_timed(run, n) / 2 / 1000 for _ in range(reps))
        pool.free_async(state["x"], a)
        a.synchronize()
        b.synchronize()
    a.close()
    b.close()
    return out


def measure(quick=False, reps=None, n=None):
    """The pool's figures as rows {"area", "name", "value", "unit", "target", "met", "note"}."""
    reps = reps or (3 if quick else 7)
    n = n or (20000 if quick else 100000)
    same = same_stream(reps, n)
    cross = cross_stream(reps, max(1, n // 100))
    empty = same["empty"]
    rows = []

    def row(name, value, unit, target=None, met=None, note=""):
        rows.append(result(AREA, name, value, unit, target, met, note))

    pair = same["pool"]
    rows.append(figure(
        AREA, "pool.free_async(pool.malloc_async(256, s), s), one stream", same["pool samples"], "ns",
        at_most=TARGET_PAIR_NS, note=f"thread CPU time, median of {reps} x {n} pairs, Python loop included "
                                f"({pair - empty:.0f} ns net; wall clock {same['pool wall']:.0f} ns)"))
    row("paddle_rt.free_async(paddle_rt.malloc_async(256, s), s)", same["global"], "ns",
        note=f"module-level functions ({same['global'] - empty:.0f} ns net; wall clock {same['global wall']:.0f} ns)")
    row("baseline paddle_rt.malloc(256).free(), same run", same["malloc"], "ns",
        note=f"{same['malloc'] - empty:.0f} ns net; wall clock {same['malloc wall']:.0f} ns")
    row("pool pair / malloc pair", pair / same["malloc"], "x", note="ratio in the same run, loop included")
    row("paddle_rt.malloc(256) + record_stream + free (deferred)", same["recorded"], "ns",
        note=f"the free runs from a host function on the recorded stream; {same['recorded'] / same['malloc']:.1f}x "
             f"the plain pair (thread CPU time; wall clock {same['recorded wall']:.0f} ns)")
    for name, us in cross.items():
        row(f"cross-stream reuse: {name}", us, "us", note="per handoff, including the sync/event work it needs")
    return rows


def format_rows(rows):
    """A plain-text table of measure()'s rows."""
    return _format_rows(rows, 62)
