"""InfiniCore's operator test suite (InfiniTensor/InfiniCore, test/infiniop/<op>.py) ported as facts: for every
operator paddle_rt implements, the same shapes, strides (in elements, including 0 and padded or permuted layouts),
in-place variants, dtypes and per-dtype tolerances, with InfiniCore's own skips (an in-place case whose input and
output strides differ; a broadcast output). Inputs are drawn as InfiniCore's TestTensor draws them (uniform [0, 1)
floats, integers in [-2e9, 2e9), the per-test scales); references are float64 numpy (tests/infinicore_reference.py).

Comparison: InfiniCore compares with torch computing in the same dtype; here the float64 result is rounded to the
output dtype and compared with InfiniCore's atol/rtol plus one unit in the last place of that dtype (the kernel
computes in float32 or float64 and rounds once, which may land one ulp from the rounded float64 result).

Cases whose operands exceed ~3M elements carry the ``slow`` marker (run by .ci/run). Batched random_sample (a
separate InfiniOP entry point over (batch, vocab) logits with per-row parameters) is not ported."""
import math

import numpy as np
import pytest

import paddle_rt
from paddle_rt import ops
import infinicore_reference as ref

pytest.importorskip("ml_dtypes")

F16, BF16, F32, F64, I32, I64 = "float16", "bfloat16", "float32", "float64", "int32", "int64"
ULP = {F16: 2.0 ** -10, BF16: 2.0 ** -7, F32: 2.0 ** -23, F64: 2.0 ** -52}
SLOW_ELEMENTS = 3_000_000


def _numel(*shapes):
    return sum(math.prod(s) for s in shapes)


def params(op, rows, dtypes, shapes_of=lambda r: (r[0],)):
    """pytest params: every row in every dtype; `slow` when the operands are large. Ids: op-index-dtype."""
    out = []
    for i, row in enumerate(rows):
        big = _numel(*shapes_of(row)) > SLOW_ELEMENTS
        for dt in dtypes:
            out.append(pytest.param(row, dt, id=f"{op}-{i}-{dt}", marks=[pytest.mark.slow] if big else []))
    return out


def make(shape, strides, dtype, rng, mode="random", scale=None, low=None, high=None):
    """(device tensor, logical numpy values) as InfiniCore's TestTensor builds them: a stride-0 dimension holds one
    value (broadcast); other strides lay the values out in a buffer that spans exactly them."""
    dt = ref.np_dtype(dtype)
    shape = tuple(shape)
    tshape = tuple(1 if (strides is not None and s == 0) else n for n, s in zip(shape, strides or [1] * len(shape)))
    if mode == "zeros":
        vals = np.zeros(tshape)
    elif mode == "ones":
        vals = np.ones(tshape)
    elif np.issubdtype(np.dtype(dt), np.integer) if dtype not in (BF16,) else False:
        vals = rng.integers(-2_000_000_000 if low is None else low, 2_000_000_000 if high is None else high,
                            size=tshape)
    else:
        vals = rng.random(tshape, dtype=np.float32)
    if scale is not None:
        vals = vals * scale
    vals = vals.astype(dt)
    if strides is None:
        return paddle_rt.tensor(vals), vals
    tstrides = [s if s else 1 for s in strides]
    span = sum((n - 1) * s for n, s in zip(tshape, tstrides)) + 1 if all(tshape) else 1
    buf = np.zeros(span, dt)
    np.lib.stride_tricks.as_strided(buf, tshape, [s * buf.itemsize for s in tstrides])[...] = vals
    t = paddle_rt.tensor(buf).as_strided(shape, tuple(strides))
    return t, np.broadcast_to(vals, shape)


def assert_close(got, want, dtype, atol, rtol):
    """float64 `want` rounded to dtype; InfiniCore's atol/rtol plus one ulp of dtype (relative)."""
    dt = ref.np_dtype(dtype)
    want = np.asarray(want, np.float64).astype(dt).astype(np.float64)
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), want, atol=atol, rtol=rtol + ULP[dtype])


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % (2 ** 32))


# ---- add, sub, mul, swiglu (test/infiniop/{add,sub,mul,swiglu}.py) --------------------------------------------------
_BINARY_BASE = [
    ((13, 4), None, None, None),
    ((13, 4), (10, 1), (10, 1), (10, 1)),
    ((13, 4), (0, 1), None, None),
    ((13, 4, 4), None, None, None),
    ((13, 4, 4), (20, 4, 1), (20, 4, 1), (20, 4, 1)),
    ((13, 4, 4), (4, 0, 1), (0, 4, 1), None),
    ((16, 5632), None, None, None),
    ((16, 5632), (13312, 1), (13312, 1), (13312, 1)),
    ((4, 4, 5632), None, None, None),
    ((4, 4, 5632), (45056, 5632, 1), (45056, 5632, 1), (45056, 5632, 1)),
]
_ADD_EXTRA = [                       # add.py has two more, between (16, 5632) strided and (4, 4, 5632)
    ((13, 16, 2), (128, 4, 1), (0, 2, 1), (64, 4, 1)),
    ((13, 16, 2), (128, 4, 1), (2, 0, 1), (64, 4, 1)),
]
INPLACE_AB = ("out", "a", "b")


def _binary_rows(base):
    rows = []
    for shape, sa, sb, sc in base:
        for inplace in INPLACE_AB:
            if inplace == "a" and sa != sc or inplace == "b" and sb != sc:
                continue                         # InfiniCore's skip: in place needs the same strides
            if (sa if inplace == "a" else sb if inplace == "b" else sc) is not None and \
                    0 in (sa if inplace == "a" else sb if inplace == "b" else sc):
                continue                         # InfiniCore's skip: a broadcast output
            rows.append((shape, sa, sb, sc, inplace))
    return rows


BINARY = {
    "add": (_binary_rows(_BINARY_BASE[:8] + _ADD_EXTRA + _BINARY_BASE[8:]), [F16, F32, BF16, I32, I64],
            {F16: (1e-3, 1e-3), F32: (1e-7, 1e-7), BF16: (1e-3, 1e-3), I32: (0, 0), I64: (0, 0)}),
    "sub": (_binary_rows(_BINARY_BASE), [F16, F32, BF16], {F16: (1e-3, 1e-3), F32: (1e-7, 1e-7), BF16: (1e-3, 1e-3)}),
    "mul": (_binary_rows(_BINARY_BASE), [F16, F32, BF16], {F16: (1e-3, 1e-3), F32: (1e-7, 1e-7), BF16: (1e-3, 1e-3)}),
    "swiglu": (_binary_rows(_BINARY_BASE), [F16, BF16, F32],
               {F16: (1e-3, 1e-3), BF16: (5e-3, 1e-2), F32: (1e-5, 1e-5)}),
}
_BINARY_REF = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
               "swiglu": lambda a, b: a * b / (1.0 + np.exp(-b))}


def named_params(table):
    """params() of every operator of a {name: (rows, dtypes, tolerances)} table, with the name first."""
    out = []
    for name, (rows, dtypes, _) in table.items():
        out += [pytest.param(name, *p.values, id=p.id, marks=p.marks) for p in params(name, rows, dtypes)]
    return out


@pytest.mark.parametrize("name,row,dtype", named_params(BINARY))
def test_binary(name, row, dtype, rng):
    shape, sa, sb, sc, inplace = row
    a, av = make(shape, sa, dtype, rng)
    b, bv = make(shape, sb, dtype, rng)
    c = a if inplace == "a" else b if inplace == "b" else make(shape, sc, dtype, rng, mode="ones")[0]
    getattr(ops, name)(a, b, out=c)
    if dtype in (I32, I64):
        with np.errstate(over="ignore"):
            want = _BINARY_REF[name](av.astype(dtype), bv.astype(dtype))     # wraps around, as the kernel does
        np.testing.assert_array_equal(c.numpy(), want)
        return
    atol, rtol = BINARY[name][2][dtype]
    assert_close(c.numpy(), _BINARY_REF[name](ref.f64(av), ref.f64(bv)), dtype, atol, rtol)


# ---- relu, gelu, silu (test/infiniop/{relu,gelu,silu}.py) ----------------------------------------------------------
RELU_ROWS = [(s, ip) for s in [(1, 3), (3, 3), (32, 20, 512), (33, 333, 333), (32, 256, 112, 112), (3, 3, 13, 9, 17)]
             for ip in ("out", "x")]
_GELU_BASE = [((13, 4), None, None), ((13, 4), (10, 1), (10, 1)), ((13, 4, 4), None, None),
              ((13, 4, 4), (20, 4, 1), (20, 4, 1)), ((16, 5632), None, None), ((16, 5632), (13312, 1), (13312, 1)),
              ((4, 4, 5632), None, None), ((4, 4, 5632), (45056, 5632, 1), (45056, 5632, 1))]
_SILU_BASE = [((13, 4), None, None), ((13, 4), (10, 1), (10, 1)), ((13, 4), (0, 1), None),
              ((13, 4, 4), None, None), ((13, 4, 4), (20, 4, 1), (20, 4, 1)), ((13, 4, 4), (4, 0, 1), None),
              ((16, 5632), None, None), ((16, 5632), (13312, 1), (13312, 1)), ((4, 4, 5632), None, None),
              ((4, 4, 5632), (45056, 5632, 1), (45056, 5632, 1))]


def _unary_rows(base):
    return [(shape, si, so, ip) for shape, si, so in base for ip in ("out", "x")
            if not (ip == "x" and si != so) and not (ip == "x" and si is not None and 0 in si)]


UNARY = {
    "relu": ([(s, None, None, ip) for s, ip in RELU_ROWS], [F16, F32, BF16],
             {F16: (1e-3, 1e-3), F32: (1e-7, 1e-7), BF16: (1e-3, 1e-3)}),
    "gelu": (_unary_rows(_GELU_BASE), [BF16, F16, F32, F64],
             {BF16: (1e-2, 1e-2), F16: (1e-3, 1e-3), F32: (1e-5, 1e-5), F64: (1e-6, 1e-6)}),
    "silu": (_unary_rows(_SILU_BASE), [BF16, F16, F32],
             {BF16: (1e-2, 1e-2), F16: (1e-3, 1e-3), F32: (1e-7, 1e-7)}),
}


def _gelu(x):
    from scipy.special import erf
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


_UNARY_REF = {"relu": lambda x: np.maximum(x, 0.0), "gelu": _gelu, "silu": ref.silu}


@pytest.mark.parametrize("name,row,dtype", named_params(UNARY))
def test_unary(name, row, dtype, rng):
    shape, si, so, inplace = row
    if name == "relu":                     # relu.py draws from [-1, 1), contiguous
        xv = (rng.random(shape, dtype=np.float32) * 2 - 1).astype(ref.np_dtype(dtype))
        x = paddle_rt.tensor(xv)
    else:
        x, xv = make(shape, si, dtype, rng)
    y = x if inplace == "x" else make(shape, so, dtype, rng, mode="ones")[0]
    getattr(ops, name)(x, out=y)
    if name == "relu":                     # exact in float32 (float16/bfloat16 widen exactly): compared as such
        got, xf = y.numpy().astype(np.float32), xv.astype(np.float32)
        np.testing.assert_array_equal(got, np.maximum(xf, np.float32(0)))
        return
    atol, rtol = UNARY[name][2][dtype]
    assert_close(y.numpy(), _UNARY_REF[name](ref.f64(xv)), dtype, atol, rtol)


# ---- gemm (test/infiniop/gemm.py) ---------------------------------------------------------------------------------
GEMM_ROWS = [
    (1.0, 0.0, (1, 2048), (2048, 2048), (1, 2048), None, None, None),
    (1.0, 0.0, (2, 4, 2048), (2, 2048, 2048), (2, 4, 2048), None, None, None),
    (1.0, 0.0, (1, 2048), (2048, 2048), (1, 2048), (4096, 1), (4096, 1), (4096, 1)),
    (1.0, 1.0, (6, 2048), (2048, 2560), (6, 2560), (2048, 1), (1, 2048), (2560, 1)),
    (1.0 / 8.0, 0.0, (4, 8 * 6, 64), (4, 64, 6), (4, 8 * 6, 6), None, None, None),
]
GEMM_TOL = {F16: (0, 1e-2), F32: (0, 1e-3), BF16: (0, 5e-2)}


@pytest.mark.parametrize("row,dtype", params("gemm", GEMM_ROWS, [F16, BF16, F32], lambda r: r[2:5]))
def test_gemm(row, dtype, rng):
    alpha, beta, ash, bsh, csh, sa, sb, sc = row
    a, av = make(ash, sa, dtype, rng)
    b, bv = make(bsh, sb, dtype, rng)
    c, cv = make(csh, sc, dtype, rng, mode="ones")
    ops.gemm(a, b, out=c, alpha=alpha, beta=beta)
    want = alpha * np.matmul(ref.f64(av), ref.f64(bv)) + beta * ref.f64(cv)
    assert_close(c.numpy(), want, dtype, *GEMM_TOL[dtype])


# ---- rms_norm (test/infiniop/rms_norm.py), add_rms_norm (test/infiniop/add_rms_norm.py) ----------------------------
NORM_BASE = [
    ((1, 4), (4,), None), ((2, 4), (4,), None), ((2, 2, 4), (4,), None), ((2, 2, 4), (4,), (12, 8, 1)),
    ((16, 2048), (2048,), None), ((16, 2048), (2048,), (4096, 1)), ((15, 3584), (3584,), None),
    ((4, 4, 2048), (2048,), None), ((4, 4, 2048), (2048,), (2048, 8192, 1)),
    ((4, 4, 2048), (2048,), (16384, 4096, 1)), ((15, 3584), (3584,), None), ((15, 8192), (8192,), None),
]
NORM_ROWS = [r + (w,) for r in NORM_BASE for w in (None, F32, F16, BF16)]
RMS_TOL = {F16: (2e-3, 2e-3), BF16: (1e-2, 1e-2)}


@pytest.mark.parametrize("row,dtype", params("rms_norm", NORM_ROWS, [F16, BF16]))
def test_rms_norm(row, dtype, rng):
    shape, wshape, stride, wdt = row                  # rms_norm.py: y and x take the same strides
    y, _ = make(shape, stride, dtype, rng, mode="ones")
    x, xv = make(shape, stride, dtype, rng, scale=0.01)
    w, wv = make(wshape, None, wdt or dtype, rng)
    ops.rms_norm(x, w, eps=1e-6, out=y)
    assert_close(y.numpy(), ref.rms_norm(xv, wv, 1e-6), dtype, *RMS_TOL[dtype])


@pytest.mark.parametrize("row,dtype", params("add_rms_norm", NORM_ROWS, [F16, BF16]))
def test_add_rms_norm(row, dtype, rng):
    shape, wshape, stride, wdt = row                  # add_rms_norm.py: y, residual_out, a, b share the strides
    y, _ = make(shape, stride, dtype, rng, mode="ones")
    r, _ = make(shape, stride, dtype, rng, mode="ones")
    a, av = make(shape, stride, dtype, rng, scale=0.01)
    b, bv = make(shape, stride, dtype, rng, scale=0.01)
    w, wv = make(wshape, None, wdt or dtype, rng)
    ops.add_rms_norm(a, b, w, eps=1e-6, out=y, residual_out=r)
    want_y, want_r = ref.add_rms_norm(av, bv, wv, 1e-6)
    assert_close(y.numpy(), want_y, dtype, *RMS_TOL[dtype])
    assert_close(r.numpy(), want_r, dtype, *RMS_TOL[dtype])


# ---- layer_norm (test/infiniop/layer_norm.py) ---------------------------------------------------------------------
LAYER_NORM_BASE = [
    ((5, 4), True, 1e-5, None, None, None),
    ((5, 4, 32, 2048), True, 1e-5, None, None, None),
    ((13, 4, 4), True, 1e-5, (30, 4, 1), (50, 4, 1), (2,)),
    ((16, 5, 563), True, 1e-4, None, None, None),
    ((5, 16, 563), False, 1e-5, None, None, (10,)),
    ((4, 4, 563), True, 1e-5, None, None, None),
    ((40, 40, 56), True, 1e-5, (3600, 56, 1), None, None),
    ((40, 40, 56), False, 1e-5, (3600, 56, 1), None, None),
]
LAYER_NORM_ROWS = [r + (ip,) for r in LAYER_NORM_BASE for ip in ("out", "x") if not (ip == "x" and r[3] != r[4])]
LAYER_NORM_TOL = {F16: (5e-2, 5e-2), F32: (1e-3, 1e-3), BF16: (5e-2, 5e-2)}


@pytest.mark.parametrize("row,dtype", params("layer_norm", LAYER_NORM_ROWS, [F16, F32, BF16]))
def test_layer_norm(row, dtype, rng):
    shape, has_bias, eps, si, so, sw, inplace = row
    x, xv = make(shape, si, dtype, rng)
    y = x if inplace == "x" else make(shape, so, dtype, rng)[0]
    w, wv = make(shape[-1:], sw, dtype, rng)
    b, bv = make(shape[-1:], None, dtype, rng) if has_bias else (None, None)
    ops.layer_norm(x, w, b, eps=eps, out=y)
    assert_close(y.numpy(), ref.layer_norm(xv, wv, bv, eps), dtype, *LAYER_NORM_TOL[dtype])


# ---- causal_softmax (test/infiniop/causal_softmax.py), softmax (test/infiniop/softmax.py) ----------------------------
CAUSAL_BASE = [((3, 3), None), ((32, 512), None), ((32, 512), (1024, 1)), ((32, 5, 5), None), ((32, 20, 512), None),
               ((32, 20, 512), (20480, 512, 1)), ((28, 15, 15), None), ((28, 1024, 1024), None),
               ((28, 1025, 1025), None), ((28, 1031, 1031), None)]
CAUSAL_ROWS = [r + (ip,) for r in CAUSAL_BASE for ip in ("x", "out")]
CAUSAL_TOL = {F16: (1e-3, 1e-2), BF16: (5e-3, 5e-2), F32: (3e-5, 1e-5)}


@pytest.mark.parametrize("row,dtype", params("causal_softmax", CAUSAL_ROWS, [F16, BF16, F32]))
def test_causal_softmax(row, dtype, rng):
    shape, stride, inplace = row                      # causal_softmax.py: y takes x's strides
    x, xv = make(shape, stride, dtype, rng)
    y = x if inplace == "x" else make(shape, stride, dtype, rng)[0]
    ops.causal_softmax(x, out=y)
    assert_close(y.numpy(), ref.causal_softmax(xv), dtype, *CAUSAL_TOL[dtype])


SOFTMAX_ROWS = [r + (ip,) for r in [((4, 4), 0)] + [((b, 16, 512, 512), ax) for b in (12, 1) for ax in range(4)]
                for ip in ("x", "out")]
SOFTMAX_TOL = {F16: (1e-3, 1e-2), F32: (3e-5, 1e-5)}


@pytest.mark.parametrize("row,dtype", params("softmax", SOFTMAX_ROWS, [F16, F32]))
def test_softmax(row, dtype, rng):
    shape, axis, inplace = row
    x, xv = make(shape, None, dtype, rng)
    y = x if inplace == "x" else make(shape, None, dtype, rng)[0]
    ops.softmax(x, axis=axis, out=y)
    assert_close(y.numpy(), ref.softmax(xv, axis), dtype, *SOFTMAX_TOL[dtype])


# ---- silu_and_mul (test/infiniop/silu_and_mul.py) -----------------------------------------------------------------
SILU_AND_MUL_ROWS = [((2, 8), (2, 4)), ((1024, 1024), (1024, 512)), ((16, 8192), (16, 4096)),
                     ((2, 128, 2048), (2, 128, 1024)), ((8, 1, 4096), (8, 1, 2048)), ((2, 4, 16, 256), (2, 4, 16, 128))]
SILU_AND_MUL_TOL = {F16: (1e-3, 1e-3), F32: (1e-6, 1e-6), BF16: (1e-2, 1e-2)}


@pytest.mark.parametrize("row,dtype", params("silu_and_mul", SILU_AND_MUL_ROWS, [F16, BF16, F32]))
def test_silu_and_mul(row, dtype, rng):
    xs, ys = row
    x, xv = make(xs, None, dtype, rng)
    y, _ = make(ys, None, dtype, rng, mode="zeros")
    ops.silu_and_mul(x, out=y)
    assert_close(y.numpy(), ref.silu_and_mul(xv), dtype, *SILU_AND_MUL_TOL[dtype])


# ---- rope (test/infiniop/rope.py) ---------------------------------------------------------------------------------
ROPE_BASE = [((1, 32, 128), None, None), ((10, 32, 64), None, None), ((4, 1, 32), (64, 64, 1), None),
             ((11, 33, 128), None, (8000, 200, 1)), ((3, 32, 128), (8000, 200, 1), (7000, 128, 1)),
             ((8, 1, 32, 128), None, None), ((8, 10, 32, 64), None, None),
             ((8, 20, 32, 64), (40960, 64, 1280, 1), (40960, 64, 1280, 1)),
             ((8, 20, 4, 64), (1048576, 64, 262144, 1), (1048576, 64, 262144, 1))]
ROPE_ROWS = [r + (ip, algo) for r in ROPE_BASE for ip in ("out", "x") for algo in ("gpt_j", "gpt_neox")
             if not (ip == "x" and r[1] != r[2])]
ROPE_TOL = {F16: (1e-3, 1e-2), BF16: (5e-3, 5e-2), F32: (1e-4, 1e-3)}


@pytest.mark.parametrize("row,dtype", params("rope", ROPE_ROWS, [F16, BF16, F32]))
def test_rope(row, dtype, rng):
    """rope.py: x (seq, heads, dim) or (batch, seq, heads, dim); pos_ids = arange(seq) (int32) shared by the batch;
    tables of angle pos * 1e5 ** (-2i / dim) in x's dtype."""
    shape, sx, sy, inplace, algo = row
    x, xv = make(shape, sx, dtype, rng)
    y = x if inplace == "x" else make(shape, sy, dtype, rng)[0]
    seq, dim = shape[-3], shape[-1]
    pos = np.arange(seq, dtype=np.int32)
    sin, cos = ref.rope_tables(pos, dim)
    sin, cos = sin.astype(ref.np_dtype(dtype)), cos.astype(ref.np_dtype(dtype))
    ops.rope(x, paddle_rt.tensor(pos), paddle_rt.tensor(sin), paddle_rt.tensor(cos), algo=algo, out=y)
    assert_close(y.numpy(), ref.rope(xv, pos, sin, cos, algo), dtype, *ROPE_TOL[dtype])


# ---- rearrange (test/infiniop/rearrange.py) -----------------------------------------------------------------------
def _row_major(shape):
    return tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))


def _col_major(shape):
    return tuple(int(np.prod(shape[:i])) for i in range(len(shape)))


REARRANGE_ROWS = [
    ((100, 100), (1, 100), (100, 1)), ((4, 4), (1, 4), (4, 1)), ((4, 6, 64), (64, 4 * 64, 1), (6 * 64, 64, 1)),
    ((2000, 2000), (1, 2000), (2000, 1)), ((2001, 2001), (1, 2001), (2001, 1)),
    ((2, 2, 2, 4), (16, 8, 4, 1), (16, 8, 1, 2)),
    ((3, 4, 7, 53, 9), _row_major((3, 4, 7, 53, 9)), _col_major((3, 4, 7, 53, 9))),
    ((3, 4, 50, 50, 5, 7), _row_major((3, 4, 50, 50, 5, 7)), _col_major((3, 4, 50, 50, 5, 7))),
    ((15, 10752), (0, 1), (10752, 1)),
    ((2, 2, 2, 2, 2, 2), (4, 8, 16, 32, 64, 128), (64, 32, 16, 8, 4, 2)),
    ((8, 4, 20, 64), (5120, 64, 256, 1), None),
    ((8, 4, 20, 64), (5120, 64, 256, 1), (1048576, 262144, 64, 1)),
]


@pytest.mark.parametrize("row,dtype", params("rearrange", REARRANGE_ROWS, [F16, F32]))
def test_rearrange(row, dtype, rng):
    shape, sx, sy = row
    x, xv = make(shape, sx, dtype, rng)
    y, _ = make(shape, sy, dtype, rng, mode="ones")
    ops.rearrange(x, out=y)
    np.testing.assert_array_equal(y.numpy(), xv)            # tolerance 0


# ---- random_sample (test/infiniop/random_sample.py) ---------------------------------------------------------------
RANDOM_SAMPLE_ROWS = [(512, 0.8, 0.8, 3, 0.5), (4096, 0.05, 0.9, 5, 1.0), (16384, 0.15, 0.85, 10, 2.0),
                      (512, 0.08, 0, 3, 0.5), (4096, 0.5, 0.9, 1, 1.0), (16384, 0.15, 0, 1, 2.0),
                      (16384, 0.15, 0, 1, 2.0), (32000, 0.08, 0.8, 50, 1.0), (32000, 0.08, 1.0, 25, 1.0),
                      (151936, 0.5, 1.0, 1, 1.0)]


@pytest.mark.parametrize("row,dtype", params("random_sample", RANDOM_SAMPLE_ROWS, [F16, BF16], lambda r: ((r[0],),)))
def test_random_sample(row, dtype, rng):
    """random_sample.py: logits = a permutation of arange(vocab) * 1e-4 in dtype; the picked index, or one whose
    logit equals the reference's (ties after rounding to dtype), as InfiniCore checks; int32 out."""
    vocab, random_val, topp, topk, temperature = row
    logits = (rng.permutation(vocab).astype(np.float64) * 1e-4).astype(ref.np_dtype(dtype))
    got = int(ops.random_sample(paddle_rt.tensor(logits), random_val=random_val, topp=topp, topk=topk,
                                temperature=temperature, dtype="int32").numpy())
    want = ref.random_sample(logits, random_val, topp, topk, temperature)
    assert got == want or logits[got] == logits[want]


# ---- kv_caching (test/infiniop/kv_caching.py) ---------------------------------------------------------------------
KV_ROWS = [((1, 1, 8, 1), None), ((1, 8, 32, 32), None), ((8, 8, 64, 32), None), ((1, 32, 8, 64), (32768, 1024, 64, 1)),
           ((4, 8, 32, 16), (65536, 8192, 256, 16)), ((8, 16, 64, 128), (8388608, 524288, 8192, 1)),
           ((1, 2, 2304, 128), (589824, 294912, 128, 1))]


def _kv_span(row):
    shape, strides = row
    return ((sum((n - 1) * s for n, s in zip(shape, strides)) + 1,),) if strides else (shape,)


@pytest.mark.parametrize("row,dtype", params("kv_caching", KV_ROWS, [BF16, F16, F32], _kv_span))
def test_kv_caching(row, dtype, rng):
    """kv_caching.py: seq drawn from [1, max_seq), past lengths (int64) from [0, max_seq - seq); exact (tolerance 0)."""
    cache_shape, strides = row
    b, h, m, d = cache_shape
    seq = int(rng.integers(1, m)) if m > 1 else 1
    kc, kcv = make(cache_shape, strides, dtype, rng)
    vc, vcv = make(cache_shape, strides, dtype, rng)
    k, kv = make((b, h, seq, d), None, dtype, rng)
    v, vv = make((b, h, seq, d), None, dtype, rng)
    past = rng.integers(0, max(m - seq, 1), size=b).astype(np.int64)
    ops.kv_caching(kc, vc, k, v, paddle_rt.tensor(past))
    wk, wv = ref.kv_caching(kcv, vcv, kv, vv, past)
    np.testing.assert_array_equal(ref.f64(kc.numpy()), ref.f64(wk))
    np.testing.assert_array_equal(ref.f64(vc.numpy()), ref.f64(wv))


# ---- attention (test/infiniop/attention.py) -----------------------------------------------------------------------
ATTENTION_ROWS = [
    (32, 4, 5, 64, 0, 2048, 2048, (64, 2560, 1), (64, 2560, 1), (64, 2560, 1), (64, 11264, 1), (64, 11264, 1)),
    (32, 4, 1, 64, 3, 2048, 2048, (64, 2560, 1), (64, 2560, 1), (64, 2560, 1), (64, 11264, 1), (64, 11264, 1)),
    (8, 4, 2, 16, 1, 8, 8, None, None, None, None, None),
    (28, 28, 15, 128, 0, 2048, 2048, (128, 10752, 1), (128, 10752, 1), (128, 10752, 1), (128, 3584, 1),
     (128, 3584, 1)),
]
ATTENTION_TOL = {F16: (1e-4, 1e-2), F32: (1e-5, 1e-3)}


@pytest.mark.parametrize("row,dtype", params("attention", ATTENTION_ROWS, [F16, F32],
                                             lambda r: ((r[1], r[5], r[3]), (r[1], r[6], r[3]))))
def test_attention(row, dtype, rng):
    """attention.py: q, k, v and the caches scaled by 0.1, out (seq, q_heads, dim) contiguous; the caches receive
    k and v at [pos, pos + seq)."""
    nq, nkv, seq, dim, pos, kbuf, vbuf, sq, sk, sv, skc, svc = row
    q, qv = make((nq, seq, dim), sq, dtype, rng, scale=0.1)
    k, kv = make((nkv, seq, dim), sk, dtype, rng, scale=0.1)
    v, vv = make((nkv, seq, dim), sv, dtype, rng, scale=0.1)
    kc, kcv = make((nkv, kbuf, dim), skc, dtype, rng, scale=0.1)
    vc, vcv = make((nkv, vbuf, dim), svc, dtype, rng, scale=0.1)
    out, _ = make((seq, nq, dim), None, dtype, rng, mode="zeros")
    ops.attention(q, k, v, kc, vc, pos, out=out)
    assert_close(out.numpy(), ref.attention(qv, kv, vv, kcv, vcv, pos), dtype, *ATTENTION_TOL[dtype])
    np.testing.assert_array_equal(ref.f64(kc.numpy()[:, pos:pos + seq]), ref.f64(kv))


# ---- the table of docs/operators.md -------------------------------------------------------------------------------------------
CASE_COUNTS = {
    "add": ("add.py", len(BINARY["add"][0]) * 5), "sub": ("sub.py", len(BINARY["sub"][0]) * 3),
    "mul": ("mul.py", len(BINARY["mul"][0]) * 3), "swiglu": ("swiglu.py", len(BINARY["swiglu"][0]) * 3),
    "relu": ("relu.py", len(UNARY["relu"][0]) * 3), "gelu": ("gelu.py", len(UNARY["gelu"][0]) * 4),
    "silu": ("silu.py", len(UNARY["silu"][0]) * 3), "gemm": ("gemm.py", len(GEMM_ROWS) * 3),
    "rms_norm": ("rms_norm.py", len(NORM_ROWS) * 2), "add_rms_norm": ("add_rms_norm.py", len(NORM_ROWS) * 2),
    "layer_norm": ("layer_norm.py", len(LAYER_NORM_ROWS) * 3),
    "causal_softmax": ("causal_softmax.py", len(CAUSAL_ROWS) * 3), "softmax": ("softmax.py", len(SOFTMAX_ROWS) * 2),
    "silu_and_mul": ("silu_and_mul.py", len(SILU_AND_MUL_ROWS) * 3), "rope": ("rope.py", len(ROPE_ROWS) * 3),
    "rearrange": ("rearrange.py", len(REARRANGE_ROWS) * 2),
    "random_sample": ("random_sample.py", len(RANDOM_SAMPLE_ROWS) * 2),
    "kv_caching": ("kv_caching.py", len(KV_ROWS) * 3), "attention": ("attention.py", len(ATTENTION_ROWS) * 2),
}


def test_docs_table_lists_every_ported_operator():
    """The InfiniCore table of docs/operators.md: one row per operator with its test file and the case count above."""
    import pathlib
    page = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "operators.md")
    if not page.exists():
        pytest.skip("docs/ is not next to the tests (installed layout)")
    text = page.read_text()
    for op, (path, n) in CASE_COUNTS.items():
        assert f"| `{op}` | `test/infiniop/{path}` | {n} |" in text, (op, path, n)
