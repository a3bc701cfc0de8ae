"""``paddle-rt replay --loader [--api malloc|pool|both] [--delay-us N]``: the two-stream workload of issue 45, the
pattern of a trainer's data loader. A copy stream uploads batches that a compute stream uses: each batch is uploaded
(host to device) on the copy stream one step ahead of its use; the compute stream waits on the upload's event, its
kernel copies the batch into an activation block of its own and copies that back to the host (the result checked
after the run); the batch is then freed with the compute stream's use declared, and the copy stream waits on an event
recorded on the compute stream after it before its next upload, so that the memory can be reused in stream order.

- ``malloc``: the caching allocator, ``paddle_rt.malloc(n, stream=copy)``, ``batch.record_stream(compute)`` then
  ``batch.free()`` (PyTorch's data-loader pattern);
- ``pool``: stream-ordered memory, ``MemPool.malloc_async(n, copy)`` and ``free_async(batch, compute)`` (the free
  ordered after the compute stream's use; the pool's "follow event dependencies" policy lets the copy stream reuse
  it once it has waited on the compute stream's event).

It runs twice, each in a fresh process on a lagging device (rt_cpu's ``RT_CPU_STREAM_DELAY_US``): with the host
waiting (both streams synchronized after every step) and running ahead (no wait until the end). Reported: peak
reserved bytes of both, pages mapped / unmapped, and the number of batches whose result differs from what was
uploaded (wrong results).
"""
import json
import os

MiB = 1 << 20
BATCHES = 48
BATCH_BYTES = 1 << 20
LOADER_LIMIT = 1.05      # target: peak reserved running ahead / waiting


def batch_content(i, n):
    """The bytes uploaded as batch ``i`` (``n`` of them, uint8): a pattern that differs between batches."""
    import numpy as np
    return (((np.arange(n, dtype=np.uint32) + np.uint32(i * 7919)) * np.uint32(2654435761)) >> 24).astype(np.uint8)


def run(api="pool", wait=False, batches=BATCHES, batch_bytes=BATCH_BYTES, device=None, unsafe=False, conf=None):
    """Run the workload in this process. Returns {"peak_reserved", "maps", "unmaps", "wrong", "batches", "seconds"}.
    ``unsafe``: free each batch without declaring the compute stream's use (``malloc``: no ``record_stream``;
    ``pool``: ``free_async`` on the copy stream) and without the copy stream's wait for the compute stream, a bug
    the check must catch when the host runs ahead (the next upload overwrites a batch not yet read). ``conf``: dict of
    allocator keys."""
    import time
    import numpy as np
    import paddle_rt

    dev = paddle_rt.device(device) if device else paddle_rt.get_device()
    alloc = paddle_rt.get_allocator(dev)
    alloc.empty_cache()
    if conf:
        alloc.configure(**conf)
    copy, compute = paddle_rt.Stream(dev), paddle_rt.Stream(dev)
    pool = paddle_rt.MemPool(dev) if api == "pool" else None
    inputs = [batch_content(i, batch_bytes) for i in range(batches)]
    outputs = [np.zeros(batch_bytes, np.uint8) for _ in range(batches)]
    alloc.reset_peak_stats()
    before = alloc.stats()

    def new(n, s):
        return pool.malloc_async(n, s) if pool is not None else paddle_rt.malloc(n, dev, s)

    def upload(i):
        buf = new(batch_bytes, copy)
        paddle_rt.memcpy_async(buf, inputs[i], stream=copy)
        ev = paddle_rt.Event()
        ev.record(copy)
        return buf, ev

    def sync():
        if wait:
            copy.synchronize()
            compute.synchronize()

    t0 = time.perf_counter()
    pending = upload(0)
    sync()
    try:
        for i in range(batches):
            buf, uploaded = pending
            pending = upload(i + 1) if i + 1 < batches else None       # the next batch, one step ahead
            sync()
            compute.wait_event(uploaded)
            act = new(batch_bytes, compute)                             # the kernel: reads the batch, writes act
            paddle_rt.memcpy_async(act, buf, stream=compute)
            paddle_rt.memcpy_async(outputs[i], act, stream=compute)
            sync()
            _free(pool, act, compute)
            _free_batch(pool, buf, copy, compute, unsafe)
            if not unsafe:
                done = paddle_rt.Event()
                done.record(compute)
                copy.wait_event(done)                                   # later uploads follow the compute stream
            sync()
        copy.synchronize()
        compute.synchronize()
        seconds = time.perf_counter() - t0
        after = alloc.stats()
    finally:
        copy.synchronize()
        compute.synchronize()
        if pool is not None:
            pool.trim_to(0)
        copy.close()
        compute.close()
        alloc.empty_cache()
    wrong = sum(not np.array_equal(o, x) for o, x in zip(outputs, inputs))
    return {"api": api, "mode": "waiting" if wait else "ahead", "batches": batches, "batch_bytes": batch_bytes,
            "seconds": seconds, "peak_reserved": after["reserved_bytes.all.peak"], "wrong": wrong,
            "maps": after["num_maps"] - before["num_maps"], "unmaps": after["num_unmaps"] - before["num_unmaps"],
            "device_allocs": after["num_device_alloc"] - before["num_device_alloc"]}


def _free(pool, a, s):
    """Free ``a`` on the stream it was allocated on."""
    if pool is not None:
        pool.free_async(a, s)
    else:
        a.free()


def _free_batch(pool, buf, copy, compute, unsafe):
    """Free a batch the compute stream used (its use declared unless ``unsafe``)."""
    if pool is not None:
        pool.free_async(buf, copy if unsafe else compute)
        return
    if not unsafe:
        buf.record_stream(compute)
    buf.free()


def child_run(api, mode, device=None, conf=None):
    """The child's part (``replay --loader-run MODE --api API [--conf C]``): run and print the figures as JSON."""
    print(json.dumps(run(api, wait=(mode == "waiting"), device=device, conf=conf)))
    return 0


def run_fresh(api, mode, device=None, conf_text="", delay_us=20):
    """:func:`run` in a fresh process with ``RT_CPU_STREAM_DELAY_US=delay_us``."""
    from paddle_rt.tools.replay_child import replay_child
    env = dict(os.environ)
    env["RT_CPU_STREAM_DELAY_US"] = str(delay_us)
    env.setdefault("RT_CPU_MEMORY_BYTES", str(64 << 30))
    r = replay_child(["--loader-run", mode, "--api", api, "--no-progress"], device, conf_text, env)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"replay --loader ({api}, {mode}) failed: {last}")
    return json.loads(r.stdout)


def compare(apis=("malloc", "pool"), device=None, conf_text="", delay_us=20):
    """{"delay_us", api: {"waiting", "ahead", "ratio"}}."""
    from paddle_rt.tools.replay_async import ratio
    out = {"delay_us": delay_us}
    for api in apis:
        w = run_fresh(api, "waiting", device, conf_text, delay_us)
        a = run_fresh(api, "ahead", device, conf_text, delay_us)
        out[api] = {"waiting": w, "ahead": a, "ratio": ratio(a["peak_reserved"], w["peak_reserved"])}
    return out


def report(res):
    """The lines of ``replay --loader``."""
    lines = [f"two-stream loader: {BATCHES} batches of {BATCH_BYTES / MiB:g} MiB uploaded on a copy stream, used by "
             f"a compute stream (device lag {res['delay_us']} us per operation)",
             f"  {'api':8s} {'':14s} {'waiting':>18s} {'ahead':>18s}"]
    for api in ("malloc", "pool"):
        if api not in res:
            continue
        w, a, r = res[api]["waiting"], res[api]["ahead"], res[api]["ratio"]
        lines.append(f"  {api:8s} {'peak reserved':14s} {w['peak_reserved'] / MiB:14.1f} MiB "
                     f"{a['peak_reserved'] / MiB:14.1f} MiB  ahead/waiting {r:.3f} "
                     f"({'ok' if r <= LOADER_LIMIT else 'OVER'} {LOADER_LIMIT:g})")
        lines.append(f"  {'':8s} {'maps / unmaps':14s} {w['maps']:>9d} / {w['unmaps']:<6d} "
                     f"{a['maps']:>9d} / {a['unmaps']:<6d}")
        lines.append(f"  {'':8s} {'wrong results':14s} {w['wrong']:>18d} {a['wrong']:>18d}")
        lines.append(f"  {'':8s} {'seconds':14s} {w['seconds']:18.2f} {a['seconds']:18.2f}")
    return lines
