"""The torch column of the operator benchmarks (``python -m paddle_rt bench --only ops``, when torch is importable):
paddle_rt's host kernels against PyTorch's CPU operators on the same data in the same run, both sides alternating,
medians, at 1 thread and at the default thread count on both sides (``paddle_rt.op.set_num_threads`` and
``torch.set_num_threads``; numpy's OpenBLAS, which paddle_rt's gemm calls, is set to the same count). Outputs are
preallocated on both sides where torch has an ``out=`` form; otherwise both sides allocate (paddle_rt from its
stream-ordered pool, torch from its CPU allocator), as each would be used.

Each figure is paddle_rt's speed over torch's (torch's time / paddle_rt's), with the targets of issue 25: >= 1x for
every operator, >= 2x for the fused ones (rms_norm, layer_norm, causal_softmax, swiglu, add_rms_norm, attention),
the one-element call no slower than torch's, and a small upload (1 KiB, with its synchronize) at most 5 us.

add_rms_norm is compared with ``h = x + r; F.rms_norm(h, ...)`` (h is the residual both sides return); attention
(grouped-query, 32 query heads / 8 KV heads, head_dim 128, as in Llama-3-8B) with what a torch user writes: the new
keys and values stored into a KV cache by slice assignment, then ``F.scaled_dot_product_attention(...,
enable_gqa=True)`` over the cache's filled part, causal for a prefill; once a decode step (one query, a cache of 1024
positions) and once a prefill block (256 queries from position 0).
"""
import ctypes
import statistics
import time

import numpy as np

import paddle_rt
from paddle_rt import ops
from paddle_rt.bench import result, figure

FUSED = ("rms_norm", "layer_norm", "causal_softmax", "swiglu", "add_rms_norm", "attention")


# A pause before each timed call (not timed): torch's OpenMP threads (libgomp) spin for some milliseconds after each
# parallel region before they sleep, and on a 2-core machine such a spinning thread takes a core from paddle_rt's pool
# during the paddle_rt call that follows it; paddle_rt's pool threads sleep at once, so the reverse never happens.
# Measured here (silu 4096^2 float32, 2 threads, torch call just before): paddle_rt 8.6 ms with no pause, 5.1-6.1 ms
# with 5-20 ms; torch's own time did not change. With the pause each side starts from its idle state, as a lone call.
SETTLE_S = 0.02


def _pairs(ours, theirs, reps):
    """Seconds of each callable per repetition, alternating (one warm-up call each), each after SETTLE_S."""
    ours()
    theirs()
    a, b = [], []
    for _ in range(reps):
        time.sleep(SETTLE_S)
        t0 = time.perf_counter()
        ours()
        a.append(time.perf_counter() - t0)
        time.sleep(SETTLE_S)
        t0 = time.perf_counter()
        theirs()
        b.append(time.perf_counter() - t0)
    return a, b


def _per_call_pairs(ours, theirs, k, reps):
    """Seconds per call of k calls of each, per repetition, alternating."""
    def loop(fn):
        def run():
            for _ in range(k):
                fn()
        return run
    a, b = _pairs(loop(ours), loop(theirs), reps)
    return [x / k for x in a], [x / k for x in b]


def _speed_figure(area, name, ours, theirs, bound, scale, unit):
    """paddle_rt's speed over torch's per repetition (torch's time / paddle_rt's), judged against bound."""
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    return figure(area, name, [t / o for o, t in zip(ours, theirs)], "x", at_least=bound,
                  note=f"{m_ours * scale:.2f} {unit} vs {m_theirs * scale:.2f} {unit}")


def _blas_threads():
    """(get, set) of the thread count of the BLAS paddle_rt's gemm calls (numpy's OpenBLAS), or None."""
    info = paddle_rt.op.blas_info()
    if not info:
        return None
    try:
        lib = ctypes.CDLL(info["library"], mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    for prefix in ("scipy_openblas_", "openblas_"):
        get = getattr(lib, prefix + "get_num_threads64_", None) or getattr(lib, prefix + "get_num_threads", None)
        set_ = getattr(lib, prefix + "set_num_threads64_", None) or getattr(lib, prefix + "set_num_threads", None)
        if get is not None and set_ is not None:
            get.restype = ctypes.c_int
            set_.argtypes = [ctypes.c_int]
            return get, set_
    return None


def _cases(torch, n, m, rng):
    """(name, paddle_rt call, torch call) for every operator, on n x n float32 (m elements for add/mul)."""
    F = torch.nn.functional
    x = rng.standard_normal((n, n), dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    v1 = rng.standard_normal(m, dtype=np.float32)
    v2 = rng.standard_normal(m, dtype=np.float32)
    g = 512 if n < 4096 else 1024
    ga = rng.standard_normal((g, g), dtype=np.float32)
    gb = rng.standard_normal((g, g), dtype=np.float32)
    heads, dim = 64, 64
    seq = n * n // (heads * dim)
    ang = np.arange(seq)[:, None] / 10000 ** (np.arange(dim // 2)[None, :] * 2 / dim)
    sin, cos = np.sin(ang).astype(np.float32), np.cos(ang).astype(np.float32)
    pos = np.arange(seq, dtype=np.int64)

    P = {k: paddle_rt.tensor(a) for k, a in (("x", x), ("y", y), ("w", w), ("b", b), ("v1", v1), ("v2", v2),
                                              ("ga", ga), ("gb", gb), ("sin", sin), ("cos", cos))}
    P["x3"] = paddle_rt.tensor(x.reshape(seq, heads, dim))
    P["pos"] = paddle_rt.tensor(pos)
    P["h"] = paddle_rt.tensor(x, dtype="float16")
    P["out"] = paddle_rt.empty((n, n))
    P["vout"] = paddle_rt.empty((m,))
    P["gout"] = paddle_rt.empty((g, g))
    P["hout"] = paddle_rt.empty((n, n), dtype="float16")
    T = {k: torch.from_numpy(a) for k, a in (("x", x), ("y", y), ("w", w), ("b", b), ("v1", v1), ("v2", v2),
                                             ("ga", ga), ("gb", gb))}
    T["x3"] = T["x"].reshape(seq, heads, dim)
    T["sin"] = torch.from_numpy(sin)[torch.from_numpy(pos)][:, None, :]
    T["cos"] = torch.from_numpy(cos)[torch.from_numpy(pos)][:, None, :]
    T["h"] = T["x"].to(torch.float16)
    T["out"], T["vout"], T["gout"] = torch.empty(n, n), torch.empty(m), torch.empty(g, g)
    T["hout"] = torch.empty(n, n, dtype=torch.float16)
    T["mask"] = torch.ones(n, n, dtype=torch.bool).triu(1)
    eps = 1e-6

    def t_rope():
        h = dim // 2
        x1, x2 = T["x3"][..., :h], T["x3"][..., h:]
        return torch.cat([x1 * T["cos"] - x2 * T["sin"], x1 * T["sin"] + x2 * T["cos"]], dim=-1)

    s = lambda t: t.synchronize()   # noqa: E731  (paddle_rt: until the output is ready)
    return _fused_llm_cases(torch, n, rng, P, T, eps) + [
        (f"gemm float32 {g}^3 (out=)", lambda: s(ops.gemm(P["ga"], P["gb"], out=P["gout"])),
         lambda: torch.matmul(T["ga"], T["gb"], out=T["gout"])),
        (f"add float32 {m >> 20} M (out=)", lambda: s(ops.add(P["v1"], P["v2"], out=P["vout"])),
         lambda: torch.add(T["v1"], T["v2"], out=T["vout"])),
        (f"mul float32 {m >> 20} M (out=)", lambda: s(ops.mul(P["v1"], P["v2"], out=P["vout"])),
         lambda: torch.mul(T["v1"], T["v2"], out=T["vout"])),
        (f"gelu float32 {n}^2 (out=)", lambda: s(ops.gelu(P["x"], out=P["out"])),
         lambda: torch.ops.aten.gelu.out(T["x"], out=T["out"])),
        (f"gelu tanh float32 {n}^2 (out=)", lambda: s(ops.gelu(P["x"], approximate="tanh", out=P["out"])),
         lambda: torch.ops.aten.gelu.out(T["x"], approximate="tanh", out=T["out"])),
        (f"silu float32 {n}^2 (out=)", lambda: s(ops.silu(P["x"], out=P["out"])),
         lambda: torch.ops.aten.silu.out(T["x"], out=T["out"])),
        (f"rms_norm float32 {n}^2", lambda: s(ops.rms_norm(P["x"], P["w"], eps)),
         lambda: F.rms_norm(T["x"], (n,), T["w"], eps)),
        (f"layer_norm float32 {n}^2", lambda: s(ops.layer_norm(P["x"], P["w"], P["b"], eps)),
         lambda: F.layer_norm(T["x"], (n,), T["w"], T["b"], eps)),
        (f"causal_softmax float32 {n}^2", lambda: s(ops.causal_softmax(P["x"])),
         lambda: torch.softmax(T["x"].masked_fill(T["mask"], float("-inf")), dim=-1)),
        (f"swiglu float32 {n}^2 (out=)", lambda: s(ops.swiglu(P["x"], P["y"], out=P["out"])),
         lambda: torch.mul(T["x"], F.silu(T["y"]), out=T["out"])),
        (f"rope float32 {n}^2 (gpt_neox)", lambda: s(ops.rope(P["x3"], P["pos"], P["sin"], P["cos"])), t_rope),
        (f"add float16 {n}^2 (out=)", lambda: s(ops.add(P["h"], P["h"], out=P["hout"])),
         lambda: torch.add(T["h"], T["h"], out=T["hout"])),
    ]


def _attention_case(torch, rng, seq, pos, cache):
    """(paddle_rt call, torch call) of a grouped-query attention step over a KV cache (see the module's text)."""
    F = torch.nn.functional
    nq, nkv, dim = 32, 8, 128
    q = rng.standard_normal((nq, seq, dim), dtype=np.float32)
    k, v = (rng.standard_normal((nkv, seq, dim), dtype=np.float32) for _ in range(2))
    kc, vc = (rng.standard_normal((nkv, cache, dim), dtype=np.float32) for _ in range(2))
    P = [paddle_rt.tensor(a) for a in (q, k, v, kc, vc)]
    out = paddle_rt.empty((seq, nq, dim))
    tq, tk, tv, tkc, tvc = (torch.from_numpy(a)[None] for a in (q, k, v, kc, vc))
    causal = seq > 1

    def ours():
        ops.attention(*P, pos, out=out).synchronize()

    def theirs():
        tkc[:, :, pos:pos + seq] = tk
        tvc[:, :, pos:pos + seq] = tv
        return F.scaled_dot_product_attention(tq, tkc[:, :, :pos + seq], tvc[:, :, :pos + seq], is_causal=causal,
                                              enable_gqa=True)
    ours()
    _same("attention", out.numpy(), theirs()[0].transpose(0, 1).numpy())
    return ours, theirs


def _same(name, ours, theirs):
    """The two sides of a row compute the same thing (float32 tolerances), or the bench stops."""
    if not np.allclose(ours, theirs, rtol=1e-4, atol=1e-5):
        raise AssertionError(f"bench ops: {name} differs from torch's by {np.abs(ours - theirs).max():.3g}")


def _fused_llm_cases(torch, n, rng, P, T, eps):
    """add_rms_norm on the n x n data, attention at a decode step and for a prefill block."""
    F = torch.nn.functional
    cache, prefill = (256, 64) if n < 4096 else (1024, 256)
    P["aout"], P["ares"] = paddle_rt.empty((n, n)), paddle_rt.empty((n, n))

    def t_add_rms():
        h = T["x"] + T["y"]
        return F.rms_norm(h, (n,), T["w"], eps), h
    y, r = ops.add_rms_norm(P["x"], P["y"], P["w"], eps, out=P["aout"], residual_out=P["ares"])
    ty, tr = t_add_rms()
    _same("add_rms_norm", y.numpy(), ty.numpy())
    _same("add_rms_norm's residual", r.numpy(), tr.numpy())
    dec = _attention_case(torch, rng, 1, cache - 1, cache)
    pre = _attention_case(torch, rng, prefill, 0, cache)
    return [
        (f"add_rms_norm float32 {n}^2 (out=)",
         lambda: ops.add_rms_norm(P["x"], P["y"], P["w"], eps, out=P["aout"], residual_out=P["ares"])[0]
         .synchronize(), t_add_rms),
        (f"attention decode, GQA 32/8 d128, {cache} cached", *dec),
        (f"attention prefill {prefill}, GQA 32/8 d128", *pre),
    ]


def _uploads(torch, area, reps, quick):
    """Host-to-device uploads of a numpy array with their synchronize, against torch.tensor (a copy into torch's
    CPU memory)."""
    rows = []
    s = paddle_rt.current_stream()
    for size in (1 << 10, 1 << 20):
        a = np.ones(size // 4, np.float32)
        k = (200 if quick else 2000) if size <= 4096 else (20 if quick else 100)
        dev = paddle_rt.malloc(a.nbytes)

        def ours_tensor():
            paddle_rt.tensor(a)
            s.synchronize()

        def ours_copy():
            paddle_rt.memcpy_async(dev, a, stream=s)
            s.synchronize()

        s_ours, s_torch = _per_call_pairs(ours_tensor, lambda: torch.tensor(a), k, reps)
        s_copy, _ = _per_call_pairs(ours_copy, lambda: None, k, reps)
        t_ours, t_torch, t_copy = (statistics.median(x) for x in (s_ours, s_torch, s_copy))
        label = "1 KiB" if size == 1 << 10 else "1 MiB"
        if size <= 4096:
            rows.append(figure(area, f"upload {label}: paddle_rt.tensor(a) + synchronize, per call",
                               [x * 1e6 for x in s_ours], "us", at_most=5.0,
                               note=f"torch.tensor(a) {t_torch * 1e6:.2f} us in the same run"))
            rows.append(figure(area, f"upload {label}: memcpy_async(dev, a) + synchronize, per call",
                               [x * 1e6 for x in s_copy], "us", at_most=5.0, note="staged at enqueue"))
        else:
            r = t_torch / t_ours
            rows.append(result(area, f"upload {label}: paddle_rt.tensor(a) + sync vs torch.tensor(a)", r, "x",
                               note=f"{t_ours * 1e6:.0f} us vs {t_torch * 1e6:.0f} us; memcpy_async + sync "
                                    f"{size / t_copy / 1e9:.1f} GB/s"))
        dev.free()
    return rows


def measure(area, quick, reps):
    """The torch rows, or [] with a note row when torch is not importable."""
    try:
        import torch
    except ImportError:
        return []
    rng = np.random.default_rng(1)
    n = 1024 if quick else 4096
    m = (4 if quick else 16) << 20
    cases = _cases(torch, n, m, rng)
    ops.gemm(paddle_rt.tensor(np.ones((2, 2), np.float32)), paddle_rt.tensor(np.ones((2, 2), np.float32)))
    blas = _blas_threads()
    old_blas = blas[0]() if blas else None
    default = paddle_rt.op.get_num_threads()
    old_torch = torch.get_num_threads()
    rows = []
    try:
        for threads in sorted({1, default}):
            paddle_rt.op.set_num_threads(threads)
            torch.set_num_threads(threads)
            if blas:
                blas[1](threads)
            for name, ours, theirs in cases:
                s_ours, s_torch = _pairs(ours, theirs, reps)
                bound = 2.0 if name.split()[0] in FUSED else 1.0
                rows.append(_speed_figure(area, f"{threads} thr: {name}: speed vs torch", s_ours, s_torch, bound,
                                          1e3, "ms"))
            one = paddle_rt.tensor(np.ones(1, np.float32))
            tone = torch.ones(1)
            k = 20000 if quick else 100000
            s = paddle_rt.current_stream()

            def ours_tiny():
                ops.add(one, one)

            s_ours, s_torch = _per_call_pairs(ours_tiny, lambda: torch.add(tone, tone), k, reps)
            s.synchronize()
            rows.append(_speed_figure(area, f"{threads} thr: add 1 element, per call (output allocated): speed vs "
                                            f"torch", s_ours, s_torch, 1.0, 1e6, "us"))
    finally:
        paddle_rt.op.set_num_threads(default)
        torch.set_num_threads(old_torch)
        if blas:
            blas[1](old_blas)
    rows += _uploads(torch, area, reps, quick)
    return rows
