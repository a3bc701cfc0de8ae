"""Operator benchmarks (paddle_rt.ops on rt_cpu), run by ``python -m paddle_rt bench --only ops`` and
bench/bench_ops.py. Each figure is a ratio against numpy on the same data in the same run (what a user would
otherwise call), both sides interleaved, medians over the repetitions. An op is timed from the call to the moment
its output is ready (``Tensor.synchronize()``); outputs are allocated by the op (paddle_rt: the stream-ordered pool;
numpy: a fresh array), as each would be used.

1. gemm float32 1024x1024x1024 vs numpy.matmul (target >= 0.9x numpy's throughput).
2. add / mul float32, 16 M elements, out of place, vs numpy.add / numpy.multiply (target >= 0.9x).
3. rms_norm, layer_norm, causal_softmax, swiglu, rope on 4096x4096 float32 vs the shortest numpy expression of the
   same math (target >= 1.5x faster).
4. float16 / bfloat16 against float32 on the same ops (target: within 2x of float32's time).
5. A cached op on a 1-element tensor from Python, enqueue to return (target <= 1.5 us): the descriptor call
   ``desc(out, a, b)`` and ``ops.add(a, b)`` (the latter allocates its output).
6. When torch is importable: every operator against PyTorch's CPU operator at 1 thread and at the default thread
   count on both sides, and 1 KiB / 1 MiB uploads against ``torch.tensor`` (paddle_rt/bench/_torch_ops.py).
7. Triton's tutorial vector add on 1 M float32 elements (BLOCK_SIZE 1024) through paddle_rt.triton.launch, which runs
   Triton's interpreter on rt_cpu, vs ops.add: no target (the interpreter is for checking kernels, not for speed);
   only when the ``triton`` extra is installed.
"""
import statistics
import time

import numpy as np

import paddle_rt
from paddle_rt import ops
from paddle_rt.bench import result, at_least, at_most, AreaSkipped, format_rows as _format_rows

AREA = "ops"


def _time(fn, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _pair(ours, theirs, reps):
    """Median seconds of each, interleaved."""
    a, b = [], []
    ours()
    theirs()
    for _ in range(reps):
        a.append(_time(ours, 1))
        b.append(_time(theirs, 1))
    return statistics.median(a), statistics.median(b)


def _sync(t):
    t.synchronize()
    return t


def _cases(n, rng):
    x = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    eps = 1e-6
    heads, dim = 64, 64                                 # rope on the same n x n data as (seq, heads, dim)
    seq = n * n // (heads * dim)
    ang = np.arange(seq)[:, None] / 10000 ** (np.arange(dim // 2)[None, :] * 2 / dim)
    sin, cos = np.sin(ang).astype(np.float32), np.cos(ang).astype(np.float32)
    pos = np.arange(seq, dtype=np.int64)

    def np_rms():
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def np_ln():
        m = x.mean(-1, keepdims=True)
        return (x - m) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b

    tri = np.tril(np.ones((n, n), dtype=bool))

    def np_softmax():
        z = np.where(tri, x, -np.inf)
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)

    def np_swiglu():
        return x * y / (1 + np.exp(-y))

    x3 = x.reshape(seq, heads, dim)

    def np_rope():
        h = dim // 2
        s, c = sin[pos][:, None, :], cos[pos][:, None, :]
        a1, a2 = x3[..., :h], x3[..., h:]
        return np.concatenate([a1 * c - a2 * s, a1 * s + a2 * c], axis=-1)

    return {"x": x, "w": w, "b": b, "y": y, "sin": sin, "cos": cos, "pos": pos, "x3": x3,
            "numpy": {"rms_norm": np_rms, "layer_norm": np_ln, "causal_softmax": np_softmax, "swiglu": np_swiglu,
                      "rope": np_rope}}


def _ours(name, t):
    if name == "rms_norm":
        return lambda: _sync(ops.rms_norm(t["x"], t["w"]))
    if name == "layer_norm":
        return lambda: _sync(ops.layer_norm(t["x"], t["w"], t["b"]))
    if name == "causal_softmax":
        return lambda: _sync(ops.causal_softmax(t["x"]))
    if name == "swiglu":
        return lambda: _sync(ops.swiglu(t["x"], t["y"]))
    return lambda: _sync(ops.rope(t["x3"], t["pos"], t["sin"], t["cos"]))


def _tensors(c, dtype):
    cast = (lambda a: paddle_rt.tensor(a, dtype=dtype)) if dtype != "float32" else paddle_rt.tensor
    return {"x": cast(c["x"]), "w": cast(c["w"]), "b": cast(c["b"]), "y": cast(c["y"]),
            "x3": cast(c["x3"]), "sin": cast(c["sin"]), "cos": cast(c["cos"]), "pos": paddle_rt.tensor(c["pos"])}


def measure(quick=False, reps=None):
    try:
        dev = paddle_rt.get_device()
    except paddle_rt.PaddleRTError as e:
        raise AreaSkipped(str(e))
    if not dev.host_addressable:
        raise AreaSkipped(f"{dev} is not host-addressable: the ops' host kernels do not run there")
    reps = reps or (3 if quick else 7)
    rng = np.random.default_rng(0)
    rows = []
    # 1. gemm
    n = 512 if quick else 1024
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    ta, tb = paddle_rt.tensor(a), paddle_rt.tensor(b)
    ours, theirs = _pair(lambda: _sync(ops.gemm(ta, tb)), lambda: np.matmul(a, b), reps)
    ratio = theirs / ours
    rows.append(result(AREA, f"gemm float32 {n}x{n}x{n}: throughput vs numpy.matmul", ratio, "x",
                       *at_least(ratio, 0.9, "x"),
                       note=f"{2 * n ** 3 / ours / 1e9:.1f} GFLOP/s vs {2 * n ** 3 / theirs / 1e9:.1f}"))
    # 2. add / mul
    m = (4 if quick else 16) << 20
    a, b = rng.standard_normal(m, dtype=np.float32), rng.standard_normal(m, dtype=np.float32)
    ta, tb = paddle_rt.tensor(a), paddle_rt.tensor(b)
    for name, fn in (("add", np.add), ("mul", np.multiply)):
        op = getattr(ops, name)
        ours, theirs = _pair(lambda: _sync(op(ta, tb)), lambda: fn(a, b), reps)
        ratio = theirs / ours
        rows.append(result(AREA, f"{name} float32 {m >> 20} M elements, out of place: vs numpy", ratio, "x",
                           *at_least(ratio, 0.9, "x"), note=f"{ours * 1e3:.2f} ms vs {theirs * 1e3:.2f} ms"))
    # 3. fused row ops, 4. half precisions
    n = 1024 if quick else 4096
    c = _cases(n, rng)
    t32 = _tensors(c, "float32")
    halves = {d: _tensors(c, d) for d in ("float16", "bfloat16")}
    for name in ("rms_norm", "layer_norm", "causal_softmax", "swiglu", "rope"):
        ours, theirs = _pair(_ours(name, t32), c["numpy"][name], reps)
        ratio = theirs / ours
        rows.append(result(AREA, f"{name} float32 {n}x{n}: speed-up over numpy", ratio, "x",
                           *at_least(ratio, 1.5, "x"), note=f"{ours * 1e3:.2f} ms vs {theirs * 1e3:.2f} ms"))
        for dtype, th in halves.items():
            t_half, t_f32 = _pair(_ours(name, th), _ours(name, t32), reps)
            r = t_half / t_f32
            rows.append(result(AREA, f"{name} {dtype} / float32 time", r, "x", *at_most(r, 2.0, "x"),
                               note=f"{t_half * 1e3:.2f} ms vs {t_f32 * 1e3:.2f} ms"))
    # 5. a cached op on one element, enqueue to return
    k = 20000 if quick else 100000
    one = paddle_rt.tensor(np.ones(1, np.float32))
    out = paddle_rt.empty((1,))
    desc = paddle_rt.op.AddDescriptor(paddle_rt.op.Handle(), out, one, one)
    s = paddle_rt.current_stream()

    def desc_loop():
        for _ in range(k):
            desc(out, one, one)

    def ops_loop():
        for _ in range(k):
            ops.add(one, one)

    def empty_loop():
        for _ in range(k):
            pass

    t_desc, t_ops, t_empty = [], [], []
    for _ in range(reps):
        s.synchronize()
        t_desc.append(_time(desc_loop, 1) / k)
        s.synchronize()
        t_ops.append(_time(ops_loop, 1) / k)
        s.synchronize()
        t_empty.append(_time(empty_loop, 1) / k)
    d_us = statistics.median(t_desc) * 1e6
    o_us = statistics.median(t_ops) * 1e6
    rows.append(result(AREA, "cached descriptor call desc(out, a, b), 1 element, enqueue to return", d_us, "us",
                       *at_most(d_us, 1.5, "us"), note=f"Python loop included ({statistics.median(t_empty) * 1e9:.0f}"
                                                        f" ns per empty iteration)"))
    rows.append(result(AREA, "ops.add(a, b), 1 element (cached descriptor, output allocated), enqueue to return", o_us,
                       "us", *at_most(o_us, 1.5, "us"), note="Python loop included"))
    s.synchronize()
    from paddle_rt.bench import _torch_ops
    rows += _torch_ops.measure(AREA, quick, reps)
    rows.extend(_triton_rows(rng, 1 if quick else 3))
    return rows


def _triton_rows(rng, reps):
    """7. One Triton row (the interpreter) when paddle_rt.triton can be imported."""
    try:
        import triton
        import triton.language as tl
        from paddle_rt import triton as prt
    except ImportError:
        return []

    @triton.jit
    def vector_add(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
    n = 1 << 20
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    ta, tb, out = paddle_rt.tensor(a), paddle_rt.tensor(b), paddle_rt.empty((n,), "float32")

    def interpreted():
        prt.launch(vector_add, (triton.cdiv(n, 1024),), ta, tb, out, n, BLOCK_SIZE=1024)
        out.synchronize()
    t_tri, t_ops = _pair(interpreted, lambda: _sync(ops.add(ta, tb)), reps)
    if not np.array_equal(out.numpy(), a + b):
        raise AssertionError("bench ops: the Triton vector add gave a wrong result")
    return [result(AREA, "Triton vector add float32 1 M, Triton's interpreter: time / ops.add's", t_tri / t_ops, "x",
                   note=f"{t_tri * 1e3:.0f} ms vs {t_ops * 1e3:.2f} ms; the interpreter: no target")]


def format_rows(rows):
    return _format_rows(rows, 78)
