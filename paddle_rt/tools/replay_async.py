"""``paddle-rt replay TRACE --async [--api malloc|pool|both] [--delay-us N]``: the allocation log replayed with each
block used by a kernel on its stream, twice, each in a fresh process on a lagging device (rt_cpu's
``RT_CPU_STREAM_DELAY_US``): once with the host waiting (``synchronize()`` after every event) and once with the host
running ahead (never waiting until the end of the log). Their peak reserved bytes and pages mapped / unmapped are
reported side by side (issue 45).

The APIs: ``malloc`` is the caching allocator (``paddle_rt.malloc`` on one stream, ``Allocation.free()``); ``pool`` is
stream-ordered memory (``MemPool.malloc_async`` / ``free_async`` on one stream). After each allocation a
``memset_async`` of the whole block is enqueued on the stream, then a copy of its first ``READ_BYTES`` bytes into a
scratch block (the kernel that writes and reads it). The copy is what makes the device lag: rt_cpu delays the plugin's
stream operations, and the ABI has no asynchronous memset (paddle_rt's stream worker runs ``device_memory_set`` once
the plugin stream reaches it, undelayed), so the memset alone would keep up with the host.
"""
import json
import os

MiB = 1 << 20
DELAY_US = 20        # rt_cpu's per-operation delay in the children, by default
AHEAD_LIMIT = 1.02   # target: peak reserved running ahead / waiting (both APIs, every log)
POOL_LIMIT = 1.02    # target: the pool's waiting peak / the caching allocator's
APIS = ("malloc", "pool")
READ_BYTES = 256     # the kernel reads this much of each block (a plugin copy: the operation rt_cpu delays)
MODES = ("waiting", "ahead")


def run(trace, device=None, conf=None, api="malloc", wait=False):
    """Replay ``trace`` (load_trace's tuple) in this process through ``api`` on one fresh stream, a ``memset_async``
    of each block and a copy of its first bytes on the stream after its allocation; ``wait``: ``synchronize()``
    after every event. Returns
    {"peak_reserved", "maps", "unmaps", "device_allocs", "device_frees", "events", "seconds"}."""
    import time
    import paddle_rt

    is_alloc, sizes, slots, nslots, _ = trace
    dev = paddle_rt.device(device) if device else paddle_rt.get_device()
    alloc = paddle_rt.get_allocator(dev)
    alloc.empty_cache()
    if conf:
        alloc.configure(**conf)
    s = paddle_rt.Stream(dev)
    pool = paddle_rt.MemPool(dev) if api == "pool" else None
    scratch = paddle_rt.malloc(READ_BYTES, dev, s)      # the kernel's output, held through both modes alike
    alloc.reset_peak_stats()
    before = alloc.stats()
    table = [None] * nslots
    memset, copy = paddle_rt.memset_async, paddle_rt.memcpy_async
    t0 = time.perf_counter()
    try:
        for k in range(len(is_alloc)):
            slot = int(slots[k])
            if is_alloc[k]:
                a = pool.malloc_async(int(sizes[k]), s) if pool is not None else paddle_rt.malloc(int(sizes[k]),
                                                                                                    dev, s)
                table[slot] = a
                if a.size:
                    memset(a, k & 0xff, stream=s)
                    copy(scratch, a, min(a.size, READ_BYTES), stream=s)
            else:
                a, table[slot] = table[slot], None
                if pool is not None:
                    pool.free_async(a, s)
                else:
                    a.free()
            if wait:
                s.synchronize()
        s.synchronize()
        seconds = time.perf_counter() - t0
        after = alloc.stats()
    finally:
        for a in table:
            if a is not None:
                pool.free_async(a, s) if pool is not None else a.free()
        scratch.free()
        s.synchronize()
        if pool is not None:
            pool.trim_to(0)
        s.close()
        alloc.empty_cache()
    return {"api": api, "mode": "waiting" if wait else "ahead", "events": len(is_alloc), "seconds": seconds,
            "peak_reserved": after["reserved_bytes.all.peak"],
            "maps": after["num_maps"] - before["num_maps"], "unmaps": after["num_unmaps"] - before["num_unmaps"],
            "device_allocs": after["num_device_alloc"] - before["num_device_alloc"],
            "device_frees": after["num_device_free"] - before["num_device_free"],
            "config": alloc.config()}


def child_run(trace, device, conf, api, mode):
    """The child's part (``replay PATH --async-run MODE --api API``): replay ``trace`` (load_trace's tuple) and print
    the figures as JSON."""
    res = run(trace, device, conf, api, wait=(mode == "waiting"))
    print(json.dumps(res, default=str))
    return 0


def run_fresh(path, device, conf_text, api, mode, delay_us=DELAY_US):
    """:func:`run` of the log at ``path`` in a fresh process with ``RT_CPU_STREAM_DELAY_US=delay_us``."""
    from paddle_rt.tools.replay_child import replay_child
    env = dict(os.environ)
    env["RT_CPU_STREAM_DELAY_US"] = str(delay_us)
    env.setdefault("RT_CPU_MEMORY_BYTES", str(64 << 30))
    r = replay_child([os.path.abspath(path), "--async-run", mode, "--api", api, "--no-progress"], device, conf_text,
                     env)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"replay --async of {path} ({api}, {mode}) failed: {last}")
    return json.loads(r.stdout)


def compare(path, device=None, conf_text="", apis=("malloc",), delay_us=DELAY_US):
    """{api: {"waiting": figures, "ahead": figures, "ratio": ahead / waiting peak}} and, with both APIs,
    ``"pool_vs_malloc"``: the pool's waiting peak / the caching allocator's."""
    out = {"delay_us": delay_us}
    for api in apis:
        w = run_fresh(path, device, conf_text, api, "waiting", delay_us)
        a = run_fresh(path, device, conf_text, api, "ahead", delay_us)
        out[api] = {"waiting": w, "ahead": a, "ratio": ratio(a["peak_reserved"], w["peak_reserved"])}
    if "malloc" in out and "pool" in out:
        out["pool_vs_malloc"] = ratio(out["pool"]["waiting"]["peak_reserved"],
                                      out["malloc"]["waiting"]["peak_reserved"])
    return out


def ratio(a, b):
    return a / b if b else (1.0 if a == b else float("inf"))


def api_list(api):
    """The APIs of the ``--api`` value."""
    return APIS if api == "both" else (api,)


def side_by_side(res):
    """The lines of the "waiting vs ahead" section of ``replay --async`` (``res``: :func:`compare`'s result)."""
    lines = [f"  host waiting vs running ahead (each block written and read on its stream; device lag "
             f"{res['delay_us']} us per operation):"]
    lines.append(f"    {'api':8s} {'':14s} {'waiting':>18s} {'ahead':>18s}")
    for api in APIS:
        if api not in res:
            continue
        w, a = res[api]["waiting"], res[api]["ahead"]
        r = res[api]["ratio"]
        lines.append(f"    {api:8s} {'peak reserved':14s} {w['peak_reserved'] / MiB:14.1f} MiB "
                     f"{a['peak_reserved'] / MiB:14.1f} MiB  ahead/waiting {r:.3f} "
                     f"({'ok' if r <= AHEAD_LIMIT else 'OVER'} {AHEAD_LIMIT:g})")
        lines.append(f"    {'':8s} {'maps / unmaps':14s} {w['maps']:>9d} / {w['unmaps']:<6d} "
                     f"{a['maps']:>9d} / {a['unmaps']:<6d}")
        lines.append(f"    {'':8s} {'seconds':14s} {w['seconds']:18.2f} {a['seconds']:18.2f}")
    if "pool_vs_malloc" in res:
        r = res["pool_vs_malloc"]
        lines.append(f"    pool waiting / malloc waiting peak reserved {r:.3f} "
                     f"({'ok' if r <= POOL_LIMIT else 'OVER'} {POOL_LIMIT:g})")
    return lines


def corpus_rows(logs, device=None, conf_text="", apis=("malloc",), delay_us=DELAY_US, progress=None):
    """One row per log of ``logs`` ((name, path) pairs): ``{"trace": name, **compare(path, ...)}``."""
    bar = progress("corpus --async", total=len(logs), unit="trace") if progress else None
    rows = []
    try:
        for name, p in logs:
            rows.append({"trace": name, **compare(p, device, conf_text, apis, delay_us)})
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return rows


def corpus_table(rows):
    """The markdown table of :func:`corpus_rows`: per log and API, peak reserved waiting / ahead, the ratio, maps and
    unmaps of both; with both APIs, the pool's waiting peak over the caching allocator's."""
    apis = [a for a in APIS if rows and a in rows[0]]
    both = len(apis) == 2
    head = "| trace | api | waiting: peak MiB / maps / unmaps | ahead: peak MiB / maps / unmaps | ahead / waiting |"
    sep = "|---|---|---:|---:|---:|"
    if both:
        head += " pool / malloc (waiting) |"
        sep += "---:|"
    lines = [head, sep]
    for r in rows:
        for api in apis:
            w, a = r[api]["waiting"], r[api]["ahead"]
            line = (f"| {r['trace']} | {api} | {w['peak_reserved'] / MiB:.1f} / {w['maps']} / {w['unmaps']} | "
                    f"{a['peak_reserved'] / MiB:.1f} / {a['maps']} / {a['unmaps']} | {r[api]['ratio']:.3f}"
                    f"{'' if r[api]['ratio'] <= AHEAD_LIMIT else ' OVER'} |")
            if both:
                pv = r["pool_vs_malloc"]
                line += (f" {pv:.3f}{'' if pv <= POOL_LIMIT else ' OVER'} |" if api == "pool" else " |")
            lines.append(line)
    return "\n".join(lines)


def corpus_summary(rows):
    """{"traces", "ahead_over": [(trace, api, ratio)], "pool_over": [(trace, ratio)], "worst_ahead", "worst_pool",
    "met"}: the logs that miss the targets (ahead <= ``AHEAD_LIMIT`` x waiting; pool <= ``POOL_LIMIT`` x malloc)."""
    ahead = [(r["trace"], api, r[api]["ratio"]) for r in rows for api in APIS if api in r]
    pool = [(r["trace"], r["pool_vs_malloc"]) for r in rows if "pool_vs_malloc" in r]
    ahead_over = [x for x in ahead if x[2] > AHEAD_LIMIT]
    pool_over = [x for x in pool if x[1] > POOL_LIMIT]
    return {"traces": len(rows), "ahead_over": ahead_over, "pool_over": pool_over,
            "worst_ahead": max((x[2] for x in ahead), default=1.0),
            "worst_pool": max((x[1] for x in pool), default=1.0) if pool else None,
            "met": not ahead_over and not pool_over and bool(rows)}


def corpus_summary_text(s):
    out = [f"{s['traces']} traces, host running ahead vs waiting: worst {s['worst_ahead']:.3f} (target "
           f"<= {AHEAD_LIMIT:g})" + (f"; pool vs caching allocator (waiting): worst {s['worst_pool']:.3f} "
                                     f"(target <= {POOL_LIMIT:g})" if s["worst_pool"] is not None else "")
           + f": targets {'met' if s['met'] else 'MISSED'}"]
    if s["ahead_over"]:
        out.append("ahead over target: " + ", ".join(f"{t} {a} ({r:.3f}x)" for t, a, r in s["ahead_over"]))
    if s["pool_over"]:
        out.append("pool over target: " + ", ".join(f"{t} ({r:.3f}x)" for t, r in s["pool_over"]))
    return "\n".join(out)
