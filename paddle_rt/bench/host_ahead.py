"""Host running ahead of the device (issue 45), run by ``python -m paddle_rt bench``: peak reserved bytes with the host
waiting (``synchronize()`` after every event) and running ahead (never waiting), each in a fresh process on a lagging
device (rt_cpu's ``RT_CPU_STREAM_DELAY_US``, :data:`paddle_rt.tools.replay_async.DELAY_US` µs per operation):

1. an allocation log (a synthetic one, made here from a fixed seed: allocations of 256 B .. 8 MiB, log-uniform, freed
   mostly in reverse order) replayed by ``paddle-rt replay --async`` through the caching allocator (malloc/free) and
   through the stream-ordered pool (malloc_async/free_async on one stream), each block used by a kernel on its stream;
   targets: ahead <= 1.02 x waiting for both, and the pool's waiting peak <= 1.02 x the caching allocator's;
2. the two-stream data-loader workload of ``paddle-rt replay --loader`` (a copy stream uploads batches that a compute
   stream uses): with the pool (``free_async`` on the compute stream, the copy stream waiting on its event) ahead
   <= 1.05 x waiting; with the caching allocator and ``record_stream`` the figure is given without a target (a
   recorded free returns only once the compute stream ran past it: bench/RESULTS.md, issue 45); wrong results 0.

The corpus figures (every log, both allocator modes) are in bench/RESULTS.md, "Issue 45: host running ahead".
"""
import os
import tempfile

from paddle_rt.bench import result

AREA = "host_ahead"
MiB = 1 << 20


def synthetic_log(path, events=1500, seed=0):
    """Write an allocation log of ``events`` rows (RMM's CSV) to ``path``: allocations log-uniform over 256 B .. 8 MiB,
    frees mostly of the newest live block; everything freed at the end."""
    import numpy as np
    rng = np.random.default_rng(seed)
    live, rows, ptr = [], [], 0
    for t in range(events):
        if live and rng.random() < 0.45:
            k = len(live) - 1 - min(len(live) - 1, int(rng.geometric(0.5)) - 1)
            rows.append(("free", live.pop(k), 0))
        else:
            ptr += 1
            size = int(256 * 2 ** rng.uniform(0, 15))
            live.append(ptr)
            rows.append(("allocate", ptr, size))
    rows += [("free", p, 0) for p in reversed(live)]
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for t, (act, p, size) in enumerate(rows):
            f.write(f"0,{t},{act},{p:#x},{size},0\n")
    return path


def measure(quick=False):
    """The area's figures as rows {"area", "name", "value", "unit", "target", "met", "note"}."""
    from paddle_rt.tools import replay_async, replay_loader
    rows = []

    def row(name, value, unit, limit=None, note=""):
        target = None if limit is None else f"<= {limit:g}{unit}"
        rows.append(result(AREA, name, value, unit, target, None if limit is None else value <= limit, note))

    delay = replay_async.DELAY_US
    with tempfile.TemporaryDirectory() as d:
        log = synthetic_log(os.path.join(d, "synthetic.csv"), events=600 if quick else 1500)
        res = replay_async.compare(log, apis=replay_async.APIS, delay_us=delay)
    for api, label in (("malloc", "caching allocator"), ("pool", "stream-ordered pool")):
        w, a = res[api]["waiting"], res[api]["ahead"]
        row(f"replay, {label}: peak reserved ahead / waiting", res[api]["ratio"], "x", replay_async.AHEAD_LIMIT,
            f"{a['peak_reserved'] / MiB:.1f} vs {w['peak_reserved'] / MiB:.1f} MiB; maps/unmaps ahead "
            f"{a['maps']}/{a['unmaps']}, waiting {w['maps']}/{w['unmaps']}; {delay} us per device op")
    row("replay: pool's waiting peak / caching allocator's", res["pool_vs_malloc"], "x", replay_async.POOL_LIMIT,
        "peak reserved, host waiting")
    lo = replay_loader.compare(("pool", "malloc"), delay_us=delay)
    for api, label, limit in (("pool", "pool, free_async on the compute stream", replay_loader.LOADER_LIMIT),
                              ("malloc", "caching allocator + record_stream", None)):
        w, a = lo[api]["waiting"], lo[api]["ahead"]
        row(f"loader, {label}: ahead / waiting", lo[api]["ratio"], "x", limit,
            f"{a['peak_reserved'] / MiB:.1f} vs {w['peak_reserved'] / MiB:.1f} MiB"
            + ("" if limit else "; no target: recorded frees return once the compute stream ran past them"))
    wrong = sum(lo[api][m]["wrong"] for api in ("pool", "malloc") for m in ("waiting", "ahead"))
    row("loader: batches with a wrong result (both APIs, both modes)", wrong, "", 0,
        f"{replay_loader.BATCHES} batches per run, each checked after the run")
    return rows
