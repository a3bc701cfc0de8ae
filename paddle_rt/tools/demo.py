"""``python -m paddle_rt demo``: a walk through paddle_rt on the bundled rt_cpu plugin, printing what it does."""

import paddle_rt
from paddle_rt.tools.cli import command_parser


def step(title):
    print(f"\n== {title}")


def demo_plugins():
    step("plugins")
    for p in paddle_rt.list_plugins():
        print(f"loaded {p.device_type!r} ({p.sub_device_type}), ABI {'.'.join(map(str, p.version))}, "
              f"{len(p.capabilities)} hooks implemented, {len(p.missing)} missing")
    rt = paddle_rt.device("rt_cpu:0").plugin
    print(f"rt_cpu at {rt.path}")


def demo_devices():
    step("devices")
    for d in paddle_rt.devices("rt_cpu"):
        free, total = d.memory_info()
        props = d.properties
        print(f"{d}: {free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB, min chunk {props.get('min_chunk_size')}, "
              f"extra padding {props.get('extra_padding_size')}, bf16 {props.get('bfloat16_supported')}")
    d1 = paddle_rt.set_device("rt_cpu:1")
    print(f"set_device({d1}) -> current device of this thread: {paddle_rt.get_device()}")
    paddle_rt.set_device("rt_cpu:0")
    paddle_rt.synchronize()
    print("synchronize() returned: the device is idle")


def demo_memory():
    step("memory: the caching allocator")
    import numpy as np

    d = paddle_rt.device("rt_cpu:0")
    hints = d.properties
    a = paddle_rt.malloc(1000, d)
    print(f"malloc(1000) -> Allocation at {a.ptr:#x}, {a.size} bytes requested; with min chunk "
          f"{hints.get('min_chunk_size')} and padding {hints.get('extra_padding_size')} the block holds "
          f"{paddle_rt.memory_allocated(d)} bytes")
    view = np.asarray(a)
    view[:] = 7
    print(f"numpy.asarray(a) is a zero-copy uint8 view: sum after filling with 7 = {int(view.sum())}")
    del view
    a.free()
    b = paddle_rt.malloc(1000, d)
    print(f"free + malloc of the same size reuses the cached block: same address = {b.ptr == a.ptr}")
    b.free()
    stats = paddle_rt.memory_stats(d)
    print(f"memory_stats: allocated {stats['allocated_bytes.all.current']} B, reserved "
          f"{stats['reserved_bytes.all.current']} B in {stats['segment.all.current']} segment(s), "
          f"{stats['num_device_alloc']} device allocation(s)")
    free_before = d.memory_info()[0]
    released = paddle_rt.empty_cache(d)
    print(f"empty_cache() gave {released} bytes back; "
          f"device free memory {free_before} -> {d.memory_info()[0]}")
    try:
        paddle_rt.malloc(d.memory_info()[1] * 2, d)
    except paddle_rt.OutOfMemoryError as exc:
        print(f"asking for twice the capacity raises OutOfMemoryError:\n  {str(exc).splitlines()[0]}")


def demo_streams():
    step("streams, events, copies")
    import numpy as np

    d = paddle_rt.device("rt_cpu:0")
    n = 8 << 20
    host = np.arange(n, dtype=np.uint8)
    buf = paddle_rt.malloc(n, d)
    s1, s2 = paddle_rt.Stream(d), paddle_rt.Stream(d)
    order = []
    start, end = paddle_rt.Event(enable_timing=True), paddle_rt.Event(enable_timing=True)
    start.record(s1)
    paddle_rt.memcpy_async(buf, host, stream=s1)
    s1.add_callback(order.append, "after the H2D copy on s1")
    end.record(s1)
    s2.wait_event(end)
    paddle_rt.memset_async(buf, 1, 16, stream=s2)
    s2.add_callback(order.append, "after the memset on s2, which waited for s1's event")
    s2.synchronize()
    out = np.empty(16, np.uint8)
    paddle_rt.memcpy(out, buf, 16)
    print(f"callbacks ran in order: {order}")
    print(f"first bytes after copy then memset: {out[:4].tolist()} (the memset ran after the copy)")
    print(f"copying {n >> 20} MiB host->device took {start.elapsed_time(end):.3f} ms (event timing)")

    def boom():
        raise ValueError("a callback failed")

    s1.add_callback(boom)
    try:
        s1.synchronize()
    except paddle_rt.StreamError as exc:
        print(f"an exception in a callback comes back at synchronize(): {type(exc).__name__}: {exc} "
              f"(caused by {type(exc.__cause__).__name__})")
    s1.close()
    s2.close()
    buf.free()


def demo_collectives():
    step("collectives")
    import numpy as np
    from paddle_rt import ccl

    devs = paddle_rt.devices("rt_cpu")
    comms = ccl.comm_init_all(devs)
    bufs = [paddle_rt.malloc(4 * 1024, device=c.device) for c in comms]
    for rank, b in enumerate(bufs):
        np.asarray(b).view(np.float32)[:] = rank + 1
    works = [ccl.all_reduce(b, b, "sum", comm=c, dtype="float32") for b, c in zip(bufs, comms)]
    for w in works:
        w.wait(timeout=30)
    values = [float(np.asarray(b).view(np.float32)[0]) for b in bufs]
    print(f"all_reduce(sum) over {len(comms)} devices from one thread: every rank now holds {values}")
    for b in bufs:
        b.free()
    for c in comms:
        c.destroy()


def decoder_block(x, w, ops, np):
    """One pre-norm decoder block (RMSNorm, causal self-attention with rotary embeddings, SwiGLU MLP) forward. With
    ops=paddle_rt.ops it runs on device tensors; with ops=None it is the numpy reference."""
    seq, d = x.shape
    heads, hd = w["heads"], d // w["heads"]
    if ops is None:
        def rms(v, g):
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6) * g

        def rope(v):
            s, c = w["sin"][np.arange(seq)][:, None, :], w["cos"][np.arange(seq)][:, None, :]
            a, b = v[..., :hd // 2], v[..., hd // 2:]
            return np.concatenate([a * c - b * s, a * s + b * c], -1)

        h = rms(x, w["g1"])
        q, k, v = (rope((h @ w[n]).reshape(seq, heads, hd)) if n != "wv" else (h @ w[n]).reshape(seq, heads, hd)
                   for n in ("wq", "wk", "wv"))
        att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        att = np.where(np.tril(np.ones((seq, seq), bool)), att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, v).reshape(seq, d)
        x = x + o @ w["wo"]
        h = rms(x, w["g2"])
        u, g = h @ w["w1"], h @ w["w3"]
        return x + (u * g / (1 + np.exp(-g))) @ w["w2"]
    t = {n: (paddle_rt.tensor(a) if isinstance(a, np.ndarray) else a) for n, a in w.items()}
    pos = paddle_rt.tensor(np.arange(seq, dtype=np.int64))
    tx = paddle_rt.tensor(x)
    h = ops.rms_norm(tx, t["g1"])
    q = ops.rope(ops.gemm(h, t["wq"]).view(seq, heads, hd), pos, t["sin"], t["cos"])
    k = ops.rope(ops.gemm(h, t["wk"]).view(seq, heads, hd), pos, t["sin"], t["cos"])
    v = ops.gemm(h, t["wv"]).view(seq, heads, hd)
    scores = ops.gemm(q.permute(1, 0, 2), k.permute(1, 2, 0), alpha=1 / np.sqrt(hd))     # (heads, seq, seq)
    att = ops.causal_softmax(scores)
    o = ops.gemm(att, v.permute(1, 0, 2))                                               # (heads, seq, hd)
    o = ops.rearrange(o.permute(1, 0, 2)).view(seq, d)
    x1 = ops.add(tx, ops.gemm(o, t["wo"]))
    h = ops.rms_norm(x1, t["g2"])
    m = ops.swiglu(ops.gemm(h, t["w1"]), ops.gemm(h, t["w3"]))        # swiglu(a, b) = a * b * sigmoid(b)
    return ops.add(x1, ops.gemm(m, t["w2"])).numpy()


def demo_ops():
    step("operators: one transformer decoder block on rt_cpu against numpy")
    import numpy as np

    rng = np.random.default_rng(0)
    seq, d, heads, ff = 16, 64, 4, 128
    hd = d // heads
    ang = np.arange(seq)[:, None] / 10000 ** (np.arange(hd // 2)[None, :] * 2 / hd)
    w = {n: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
         for n, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("w1", (d, ff)),
                          ("w3", (d, ff)), ("w2", (ff, d)))}
    w.update(g1=np.ones(d, np.float32), g2=np.ones(d, np.float32), heads=heads,
             sin=np.sin(ang).astype(np.float32), cos=np.cos(ang).astype(np.float32))
    x = rng.standard_normal((seq, d)).astype(np.float32)
    got = decoder_block(x, w, paddle_rt.ops, np)
    want = decoder_block(x.astype(np.float64), {k: (v.astype(np.float64) if isinstance(v, np.ndarray) else v)
                                                for k, v in w.items()}, None, np)
    err = float(np.abs(got - want).max())
    print(f"decoder block (seq {seq}, d {d}, {heads} heads, ff {ff}): 9 gemm, 2 rms_norm, 2 rope, causal_softmax, "
          f"swiglu, 2 add on rt_cpu; max |paddle_rt - numpy float64| = {err:.2e}")
    if not err < 1e-3:
        raise SystemExit(f"demo: the decoder block differs from the numpy reference by {err}")


SECTIONS = [demo_plugins, demo_devices, demo_memory, demo_streams, demo_collectives, demo_ops]


def main(argv=None):
    ap = command_parser("demo", description=__doc__)
    ap.parse_args(argv)
    print(f"paddle_rt {paddle_rt.__version__} demo on the bundled rt_cpu plugin")
    for section in SECTIONS:
        section()
    print("\ndemo finished")
    return 0
