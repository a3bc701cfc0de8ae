"""paddle_rt.ops (paddle_rt/_core/ops.pyx) and the host kernels (engine/op_kernels.cpp) against numpy references: every
operator in its dtypes, contiguous, strided, broadcast, in place, zero-size and odd shapes; ordering with copies and
events on two streams; hypothesis for the elementwise ops and rearrange."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

import paddle_rt
from paddle_rt import ops

from stream_helpers import assert_operand_outlives_other_stream

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

# (rtol, atol) per dtype, as InfiniCore's op tests keep them: float16/bfloat16 compute in float32 and round once
TOL = {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-12), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1e-2)}
FLOATS = ["float32", "float64", "float16", "bfloat16"]


def np_dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def rand(shape, dtype, rng, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np_dtype(dtype))


def check(got, want, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64),
                               rtol=rtol * scale, atol=atol * scale)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# -- elementwise ---------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)])
def test_binary_float(name, fn, dtype, rng):
    a, b = rand((3, 17), dtype, rng), rand((3, 17), dtype, rng)
    out = getattr(ops, name)(paddle_rt.tensor(a), paddle_rt.tensor(b))
    assert out.shape == (3, 17) and out.dtype == dtype
    check(out.numpy(), fn(a.astype(np.float64), b.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
def test_binary_int_wraps(dtype, rng):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(5, 9), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, size=(5, 9), dtype=dtype, endpoint=True)
    ta, tb = paddle_rt.tensor(a), paddle_rt.tensor(b)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ops.add(ta, tb).numpy(), a + b)
        np.testing.assert_array_equal(ops.sub(ta, tb).numpy(), a - b)
        np.testing.assert_array_equal(ops.mul(ta, tb).numpy(), a * b)


def test_broadcast_and_strided(rng):
    a = rand((4, 1, 6), "float32", rng)
    b = rand((5, 6), "float32", rng)
    out = ops.add(paddle_rt.tensor(a), paddle_rt.tensor(b))
    assert out.shape == (4, 5, 6)
    check(out.numpy(), a + b, "float32")
    big = rand((8, 10), "float32", rng)
    t = paddle_rt.tensor(big)
    view = t[1:7:2, ::3]                 # strided view, no copy
    np.testing.assert_array_equal(view.numpy(), big[1:7:2, ::3])
    check(ops.mul(view, view).numpy(), big[1:7:2, ::3] ** 2, "float32")
    check(ops.sub(t.T, t.T).numpy(), np.zeros((10, 8)), "float32")
    rev = t[::-1]                        # negative strides
    check(ops.add(rev, t).numpy(), big[::-1] + big, "float32")


def test_in_place_and_given_out(rng):
    a, b = rand((64,), "float32", rng), rand((64,), "float32", rng)
    ta, tb = paddle_rt.tensor(a), paddle_rt.tensor(b)
    r = ops.add(ta, tb, out=ta)          # out aliases a
    assert r is ta
    check(ta.numpy(), a + b, "float32")
    out = paddle_rt.empty((64,))
    assert ops.mul(ta, tb, out=out) is out
    check(out.numpy(), (a + b) * b, "float32")


def test_partial_overlap_is_refused(rng):
    t = paddle_rt.tensor(rand((10,), "float32", rng))
    with pytest.raises(paddle_rt.InvalidArgument, match="overlaps input 0"):
        ops.add(t[0:8], t[0:8], out=t[2:10])
    before = t.numpy()
    np.testing.assert_array_equal(t.numpy(), before)


def test_zero_size_and_0d(rng):
    z = paddle_rt.tensor(np.zeros((0, 3), np.float32))
    assert ops.add(z, z).numpy().shape == (0, 3)
    s = paddle_rt.tensor(np.float32(2.5))
    assert s.shape == () and float(ops.mul(s, s).numpy()) == 6.25


@pytest.mark.parametrize("dtype", FLOATS)
def test_activations(dtype, rng):
    from math import erf
    x = rand((7, 33), dtype, rng, -4, 4)
    xd = x.astype(np.float64)
    tx = paddle_rt.tensor(x)
    check(ops.relu(tx).numpy(), np.maximum(xd, 0), dtype)
    check(ops.silu(tx).numpy(), xd / (1 + np.exp(-xd)), dtype, 4)
    gelu = 0.5 * xd * (1 + np.vectorize(erf)(xd / np.sqrt(2)))
    check(ops.gelu(tx).numpy(), gelu, dtype, 4)
    tanh = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
    check(ops.gelu(tx, approximate="tanh").numpy(), tanh, dtype, 4)


@pytest.mark.parametrize("dtype", FLOATS)
def test_swiglu(dtype, rng):
    a, b = rand((6, 40), dtype, rng), rand((6, 40), dtype, rng)
    ad, bd = a.astype(np.float64), b.astype(np.float64)
    check(ops.swiglu(paddle_rt.tensor(a), paddle_rt.tensor(b)).numpy(), ad * bd / (1 + np.exp(-bd)), dtype, 4)


def test_float16_rounds_to_nearest_even():
    # 1 + 2**-11 lies exactly between two float16 values: ties go to the even one (1.0)
    a = paddle_rt.tensor(np.array([1.0], np.float16))
    b = paddle_rt.tensor(np.array([2.0 ** -11], np.float16))
    assert ops.add(a, b).numpy()[0] == np.float16(1.0)
    # bfloat16 (8 significant bits): 1 + 2**-8 ties to 1.0 (even); 3 + 3 * 2**-7 ties to 3 + 2**-5 (even)
    x = paddle_rt.tensor(np.array([1.0, 3.0 + 2.0 ** -6], BF16))
    y = paddle_rt.tensor(np.array([2.0 ** -8, 2.0 ** -7], BF16))
    got = ops.add(x, y).numpy()
    assert got[0] == BF16.type(1.0) and got[1] == BF16.type(3.0 + 2.0 ** -5)


# -- rearrange -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "int64", "uint16", "bool"])
def test_rearrange(dtype, rng):
    a = (rng.uniform(-3, 3, size=(4, 6, 5)) > 0 if dtype == "bool" else
         rng.uniform(-100, 100, size=(4, 6, 5)).astype(np_dtype(dtype)))
    t = paddle_rt.tensor(a)
    p = t.permute(2, 0, 1)
    c = ops.rearrange(p)
    assert c.is_contiguous() and not p.is_contiguous()
    np.testing.assert_array_equal(c.numpy(), np.transpose(a, (2, 0, 1)))
    out = paddle_rt.empty((5, 4, 6), dtype).permute(1, 2, 0)      # into a non-contiguous layout
    ops.rearrange(t, out=out)
    np.testing.assert_array_equal(out.numpy(), a)


# -- gemm ----------------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
@pytest.mark.parametrize("dtype", FLOATS)
def test_gemm(dtype, rng):
    a, b = rand((5, 7), dtype, rng), rand((7, 3), dtype, rng)
    out = ops.gemm(paddle_rt.tensor(a), paddle_rt.tensor(b))
    check(out.numpy(), a.astype(np.float64) @ b.astype(np.float64), dtype, 10)


@pytest.mark.parametrize("a_shape, b_shape", [((0, 0), (0, 0, 0)), ((1, 2, 3), (0, 3, 4)), ((0, 2, 3), (3, 4)),
                                              ((0, 2, 3), (1, 3, 4))])
def test_gemm_batch_of_one_broadcasts_to_an_empty_batch(a_shape, b_shape):
    """A batch of 1 (or none) broadcasts to a batch of 0 as numpy's matmul does (found by the fuzzer: the output's
    batch was max(1, 0) = 1 and the call was refused naming an out the user never passed)."""
    a, b = np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)
    out = ops.gemm(paddle_rt.tensor(a), paddle_rt.tensor(b))
    assert out.shape == (a @ b).shape


def test_gemm_transposes_batches_alpha_beta(rng):
    a, b, c = rand((3, 4, 6), "float64", rng), rand((6, 5), "float64", rng), rand((3, 4, 5), "float64", rng)
    ta, tc = paddle_rt.tensor(a), paddle_rt.tensor(c)
    tbt = paddle_rt.tensor(np.ascontiguousarray(b.T)).T     # b as a transposed view (column-major)
    ops.gemm(ta, tbt, out=tc, alpha=0.5, beta=2.0)
    check(tc.numpy(), 0.5 * a @ b + 2.0 * c, "float64")
    # an operand neither row- nor column-major goes through the workspace
    big = rand((8, 12), "float32", rng)
    odd = paddle_rt.tensor(big)[::2, ::3]                    # (4, 4), strides (24, 3)
    check(ops.gemm(odd, odd).numpy(), big[::2, ::3].astype(np.float64) @ big[::2, ::3], "float32", 10)
    d = paddle_rt.op.GemmDescriptor(paddle_rt.op.Handle(), paddle_rt.empty((4, 4)), odd, odd)
    assert d.workspace_size == 2 * 4 * 4 * 4
    # k == 0: out = beta * out
    e = paddle_rt.tensor(np.ones((2, 3), np.float32))
    ops.gemm(paddle_rt.empty((2, 0)), paddle_rt.empty((0, 3)), out=e, beta=3.0)
    np.testing.assert_array_equal(e.numpy(), np.full((2, 3), 3.0))


def test_gemm_blas_numpy_and_scipy(rng):
    """The host gemm calls numpy's own OpenBLAS (ILP64) when numpy bundles one, else SciPy's (LP64): same results."""
    from paddle_rt._core import op as op_core
    a, b = rand((33, 17), "float64", rng), rand((17, 9), "float64", rng)
    ta, tb = paddle_rt.tensor(a), paddle_rt.tensor(b)
    try:
        for source in ("scipy", "numpy"):
            info = op_core._reselect_blas(source)
            assert info["library"] and ("LP64" in info["interface"])
            check(ops.gemm(ta, tb).numpy(), a @ b, "float64")
            check(ops.gemm(ta.T, ta).numpy(), a.T @ a, "float64")
    finally:
        op_core._reselect_blas("numpy")
    assert paddle_rt.op.blas_info() is not None


@pytest.mark.parametrize("source", ["numpy", "scipy"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_one_row_or_column_every_layout(source, dtype, rng):
    """One output row or column (a decode step's x @ W, or W @ x) goes through the BLAS's gemv: every operand layout
    (row-major, a transposed view, a strided row or column), alpha/beta and batches give numpy's product."""
    from paddle_rt._core import op as op_core
    try:
        op_core._reselect_blas(source)
        for m, k, n in ((1, 37, 23), (23, 37, 1), (1, 5, 1)):
            a, b = rand((2, m, k), dtype, rng), rand((2, k, n), dtype, rng)
            c = rand((2, m, n), dtype, rng)
            at = paddle_rt.tensor(np.ascontiguousarray(a.transpose(0, 2, 1))).transpose(1, 2)
            bt = paddle_rt.tensor(np.ascontiguousarray(b.transpose(0, 2, 1))).transpose(1, 2)
            wide_a = np.zeros((2, m, 3 * k), dtype)
            wide_a[:, :, ::3] = a                                   # a row or column with stride 3
            for ta in (paddle_rt.tensor(a), at, paddle_rt.tensor(wide_a)[:, :, ::3]):
                for tb in (paddle_rt.tensor(b), bt):
                    tc = paddle_rt.tensor(c)
                    ops.gemm(ta, tb, out=tc, alpha=0.5, beta=2.0)
                    check(tc.numpy(), 0.5 * (a.astype(np.float64) @ b) + 2.0 * c, dtype, 10)
            ct = paddle_rt.tensor(np.ascontiguousarray(c.transpose(0, 2, 1))).transpose(1, 2)   # a column-major out
            ops.gemm(paddle_rt.tensor(a), paddle_rt.tensor(b), out=ct)
            check(ct.numpy(), a.astype(np.float64) @ b, dtype, 10)
    finally:
        op_core._reselect_blas("numpy")


def test_gemm_shape_errors(rng):
    a, b = paddle_rt.empty((2, 3)), paddle_rt.empty((4, 5))
    with pytest.raises(paddle_rt.InvalidArgument, match=r"gemm: a \(2, 3\) @ b \(4, 5\)"):
        ops.gemm(a, b)
    with pytest.raises(paddle_rt.InvalidArgument, match="beta"):
        ops.gemm(paddle_rt.empty((2, 3)), paddle_rt.empty((3, 2)), beta=1.0)


# -- normalisations, softmax, rope ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_rms_norm(dtype, rng):
    x, w = rand((3, 5, 64), dtype, rng), rand((64,), dtype, rng)
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    want = xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-6) * wd
    check(ops.rms_norm(paddle_rt.tensor(x), paddle_rt.tensor(w)).numpy(), want, dtype, 4)


def test_rms_norm_float32_weight_for_half(rng):
    x, w = rand((4, 32), "float16", rng), rand((32,), "float32", rng)
    xd = x.astype(np.float64)
    want = xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-5) * w
    check(ops.rms_norm(paddle_rt.tensor(x), paddle_rt.tensor(w), eps=1e-5).numpy(), want, "float16", 4)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm(dtype, rng):
    x, w, b = rand((6, 48), dtype, rng), rand((48,), dtype, rng), rand((48,), dtype, rng)
    xd = x.astype(np.float64)
    want = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * w.astype(np.float64) \
        + b.astype(np.float64)
    got = ops.layer_norm(paddle_rt.tensor(x), paddle_rt.tensor(w), paddle_rt.tensor(b)).numpy()
    check(got, want, dtype, 4)


def causal_softmax_ref(x):
    n, total = x.shape[-2], x.shape[-1]
    i = np.arange(n)[:, None]
    j = np.arange(total)[None, :]
    keep = j <= i + total - n
    y = np.where(keep, x, -np.inf)
    y = np.exp(y - y.max(-1, keepdims=True))
    return y / y.sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 7), (1, 5, 5)])
def test_causal_softmax(dtype, shape, rng):
    x = rand(shape, dtype, rng, -5, 5)
    check(ops.causal_softmax(paddle_rt.tensor(x)).numpy(), causal_softmax_ref(x.astype(np.float64)), dtype, 4)


def test_causal_softmax_total_below_n_is_refused():
    with pytest.raises(paddle_rt.InvalidArgument, match=r"total \(3\) must be >= n \(4\)"):
        ops.causal_softmax(paddle_rt.empty((4, 3)))


def rope_ref(x, pos, sin, cos, algo):
    y = x.copy()
    half = x.shape[-1] // 2
    s = sin[pos][:, None, :]
    c = cos[pos][:, None, :]
    if algo == "gpt_j":
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2] = a * c - b * s
        y[..., 1::2] = a * s + b * c
    else:
        a, b = x[..., :half], x[..., half:]
        y[..., :half] = a * c - b * s
        y[..., half:] = a * s + b * c
    return y


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("algo", ["gpt_j", "gpt_neox"])
def test_rope(dtype, algo, rng):
    seq, heads, dim, max_pos = 5, 3, 16, 12
    x = rand((seq, heads, dim), dtype, rng)
    pos = rng.integers(0, max_pos, size=seq).astype(np.int64)
    ang = np.arange(max_pos)[:, None] / 10000 ** (np.arange(dim // 2)[None, :] * 2 / dim)
    sin, cos = np.sin(ang).astype(np_dtype(dtype)), np.cos(ang).astype(np_dtype(dtype))
    got = ops.rope(paddle_rt.tensor(x), paddle_rt.tensor(pos), paddle_rt.tensor(sin), paddle_rt.tensor(cos), algo=algo)
    want = rope_ref(x.astype(np.float64), pos, sin.astype(np.float64), cos.astype(np.float64), algo)
    check(got.numpy(), want, dtype, 4)
    tx = paddle_rt.tensor(x)                             # in place
    ops.rope(tx, paddle_rt.tensor(pos), paddle_rt.tensor(sin), paddle_rt.tensor(cos), algo=algo, out=tx)
    check(tx.numpy(), want, dtype, 4)


def test_rope_position_beyond_the_tables_fails_on_the_stream(rng):
    x = paddle_rt.tensor(rand((2, 1, 4), "float32", rng))
    tables = paddle_rt.tensor(np.zeros((3, 2), np.float32))
    y = ops.rope(x, paddle_rt.tensor(np.array([0, 7], np.int32)), tables, tables)
    with pytest.raises(paddle_rt.StreamError, match="rope.*position id is outside"):
        y.numpy()


# -- random_sample -------------------------------------------------------------------------------------------------------
def sample_ref(logits, r, topp, topk, temp):
    """InfiniCore's rule (tests/infinicore_reference.py) with paddle_rt's extensions: topk 0 is the whole
    vocabulary, temperature 0 the argmax."""
    import infinicore_reference
    if temp == 0:
        return int(np.argmax(logits.astype(np.float64)))
    return infinicore_reference.random_sample(logits, r, topp, topk if topk else len(logits), temp)


@pytest.mark.parametrize("dtype", FLOATS)
def test_random_sample(dtype, rng):
    logits = rand((50,), dtype, rng, -3, 3)
    t = paddle_rt.tensor(logits)
    for r, topp, topk, temp in [(0.3, 1.0, 0, 1.0), (0.9, 0.8, 10, 0.7), (0.5, 0.5, 0, 1.5), (0.1, 1.0, 1, 1.0),
                                (0.7, 1.0, 0, 0.0), (0.999, 0.95, 40, 1.0)]:
        got = int(ops.random_sample(t, random_val=r, topp=topp, topk=topk, temperature=temp).numpy())
        assert got == sample_ref(logits, r, topp, topk, temp), (r, topp, topk, temp)
    a = int(ops.random_sample(t, seed=5, topk=20).numpy())
    assert all(int(ops.random_sample(t, seed=5, topk=20).numpy()) == a for _ in range(3))


def test_random_sample_argument_errors():
    t = paddle_rt.tensor(np.zeros(4, np.float32))
    for kw, match in [({"random_val": 1.0}, "random_val"), ({"random_val": 0.1, "topp": -0.1}, "topp"),
                      ({"random_val": 0.1, "topk": -1}, "topk"), ({"random_val": 0.1, "temperature": -1}, "temp"),
                      ({"random_val": 0.1, "seed": 1}, "not both")]:
        with pytest.raises(paddle_rt.InvalidArgument, match=match):
            ops.random_sample(t, **kw)


# -- axpby on rt_cpu goes through the plugin's blas_axpby ----------------------------------------------------------------
def test_axpby_on_rt_cpu(rng):
    x, y = rand((100,), "float32", rng), rand((100,), "float32", rng)
    ty = paddle_rt.tensor(y)
    assert ops.axpby(paddle_rt.tensor(x), ty, alpha=2.0, beta=-1.0) is ty
    check(ty.numpy(), 2 * x - y.astype(np.float64), "float32")
    d = paddle_rt.op.AxpbyDescriptor(paddle_rt.op.Handle(), ty, ty)
    assert d.kernel_source == "hook"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_axpby_half_on_rt_cpu_runs_the_host_kernel(dtype, rng):
    """Issue 27: rt_cpu's blas_axpby serves float32 and float64 only (as Paddle calls it), so float16/bfloat16 go to
    the host kernel (computed in float32, rounded once) instead of failing on the stream with C_ERROR."""
    x, y = rand((1000,), dtype, rng), rand((1000,), dtype, rng)
    tx, ty = paddle_rt.tensor(x), paddle_rt.tensor(y)
    assert paddle_rt.op.AxpbyDescriptor(paddle_rt.op.Handle(), ty, tx, 0.5, -2.0).kernel_source == "host"
    ops.axpby(tx, ty, alpha=0.5, beta=-2.0)
    want = (np.float32(0.5) * x.astype(np.float32) + np.float32(-2.0) * y.astype(np.float32)).astype(np_dtype(dtype))
    rtol = float(ml_dtypes.finfo(np_dtype(dtype)).eps)
    np.testing.assert_allclose(ty.numpy().astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol)


def test_axpby_float64_keeps_float64_scalars(rng):
    """Issue 27: blas_axpby takes float alpha/beta (0.1 -> 0.10000000149011612, 1 + 1e-12 -> 1.0), so on a
    host-addressable device a float64 axpby whose scalars are not float32 values runs the host kernel, in float64;
    with float32-exact scalars the plugin's hook still serves it."""
    x, y = rng.uniform(-1, 1, 1000), rng.uniform(1e5, 1e6, 1000)
    tx, ty = paddle_rt.tensor(x), paddle_rt.tensor(y)
    alpha, beta = 0.1, 1 + 1e-12
    h = paddle_rt.op.Handle()
    assert paddle_rt.op.AxpbyDescriptor(h, ty, tx, alpha, beta).kernel_source == "host"
    ops.axpby(tx, ty, alpha=alpha, beta=beta)
    want = alpha * x + beta * y
    np.testing.assert_allclose(ty.numpy(), want, rtol=1e-15, atol=0)
    # what the hook's float scalars would give is off by far more than that
    assert np.max(np.abs((np.float32(alpha) * x + np.float32(beta) * y) - want) / want) > 1e-12
    assert paddle_rt.op.AxpbyDescriptor(h, ty, tx, 2.0, 0.5).kernel_source == "hook"
    ty2 = paddle_rt.tensor(y)
    ops.axpby(tx, ty2, alpha=2.0, beta=0.5)
    np.testing.assert_array_equal(ty2.numpy(), 2.0 * x + 0.5 * y)


# -- streams, events and copies ------------------------------------------------------------------------------------------
def test_ops_order_with_copies_and_events_on_two_streams(rng):
    dev = paddle_rt.get_device()
    s1, s2 = paddle_rt.Stream(dev), paddle_rt.Stream(dev)
    a = rand((256, 256), "float32", rng)
    host = np.empty_like(a)
    ta = paddle_rt.tensor(a, stream=s1)
    tb = ops.gemm(ta, ta, stream=s1)                  # long-ish op on s1
    ev = paddle_rt.Event()
    ev.record(s1)
    ev.wait(s2)
    tc = ops.add(tb, tb, stream=s2)                    # reads tb on s2 after the event
    paddle_rt.memcpy_async(host, tc.data_ptr, host.nbytes, stream=s2, kind="D2H")
    s2.synchronize()
    np.testing.assert_allclose(host, 2 * (a @ a), rtol=1e-4, atol=1e-3)
    s1.close()
    s2.close()


def test_output_memory_is_not_reused_before_another_stream_read_it(rng):
    """An input used on another stream stays allocated until that stream ran the op (record_stream)."""
    def use(x, s1, s2):
        s1.synchronize()
        return ops.add(x, x, stream=s2)                # queued behind s2's gate

    def churn(s1):
        return [ops.mul(paddle_rt.tensor(np.zeros(1024, np.float32), stream=s1),
                        paddle_rt.tensor(np.zeros(1024, np.float32), stream=s1), stream=s1) for _ in range(4)]

    assert_operand_outlives_other_stream(use, churn)


def test_ops_appear_in_the_profiler(rng):
    a = paddle_rt.tensor(rand((32, 16), "float32", rng))
    w = paddle_rt.tensor(np.ones(16, np.float32))
    with paddle_rt.profiler.profile() as prof:
        ops.rms_norm(a, w).numpy()
        ops.gemm(a, a.T).numpy()
    names = [e for e in prof.events if e["kind"] == "op" and e["op"] in ("rms_norm", "gemm")]
    assert {e["op"] for e in names} == {"rms_norm", "gemm"}
    g = [e for e in names if e["op"] == "gemm"][0]
    assert g["args"]["shapes"] == [(32, 32), (32, 16), (16, 32)] and g["args"]["dtype"] == "float32"
    assert g["end_ns"] >= g["start_ns"] > 0 and g["bytes"] == 32 * 32 * 4


def test_descriptor_cache_reuses_descriptors(rng):
    ops.clear_cache()
    a = paddle_rt.tensor(rand((8,), "float32", rng))
    for _ in range(5):
        ops.add(a, a)
    assert ops.cache_info()["entries"] == 1
    ops.add(a[::2], a[::2])
    assert ops.cache_info()["entries"] == 2


def give_back(device):
    """Leave `device` as the other tests expect it: nothing held by its pool or its allocator's cache."""
    paddle_rt.synchronize()
    paddle_rt.default_mem_pool(device).trim_to(0)
    paddle_rt.empty_cache(device)


def test_operands_on_two_devices_are_refused():
    if paddle_rt.device_count() < 2:
        pytest.skip("needs two rt_cpu devices")
    a = paddle_rt.tensor(np.ones(4, np.float32), device="rt_cpu:0")
    b = paddle_rt.tensor(np.ones(4, np.float32), device="rt_cpu:1")
    with pytest.raises(paddle_rt.InvalidArgument, match="rt_cpu:0 and rt_cpu:1"):
        ops.add(a, b)
    np.testing.assert_array_equal(ops.add(a, b.to("rt_cpu:0")).numpy(), np.full(4, 2.0))
    del a, b
    give_back("rt_cpu:1")


# -- hypothesis: shapes and strides of the elementwise ops and rearrange --------------------------------------------------
@st.composite
def strided_case(draw):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=nd, max_size=nd)))
    steps = tuple(draw(st.sampled_from([1, 2, -1])) for _ in range(nd))
    perm = draw(st.permutations(range(nd)))
    pshape = tuple(shape[i] for i in perm)
    bshape = tuple(1 if draw(st.booleans()) else s for s in pshape)[draw(st.integers(0, nd)):]
    return shape, steps, perm, bshape


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strided_case(), st.sampled_from(["add", "sub", "mul"]), st.sampled_from(["float32", "int32", "float16"]))
def test_elementwise_any_layout(case, name, dtype):
    shape, steps, perm, bshape = case
    rng = np.random.default_rng(1)
    full = tuple(abs(s) * max(n, 1) for s, n in zip(steps, shape))
    base = (rng.integers(-50, 50, size=full)).astype(np_dtype(dtype))
    view_idx = tuple(slice(None, None, s) if s > 0 else slice(None, None, -1) for s in steps)
    host = base[view_idx][tuple(slice(0, n) for n in shape)]
    t = paddle_rt.tensor(base)[view_idx][tuple(slice(0, n) for n in shape)]
    host_p = np.transpose(host, perm)
    t_p = t.permute(*perm)
    b = (rng.integers(-50, 50, size=bshape)).astype(np_dtype(dtype))
    got = getattr(ops, name)(t_p, paddle_rt.tensor(b)).numpy()
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[name]
    with np.errstate(over="ignore"):
        want = fn(host_p, b)
    np.testing.assert_array_equal(got, want.astype(got.dtype))
    np.testing.assert_array_equal(ops.rearrange(t_p).numpy(), host_p)
