"""The fast paths of the fused host kernels (engine/norm_kernels.cpp layer_norm and add_rms_norm,
engine/attention_kernels.cpp attention): shapes and layouts that a wrong fast path would get wrong -- row lengths
around the kernels' 16-lane blocks and tails, many rows (split over the thread pool), strided rows and outputs, rows
whose mean dwarfs their spread (a one-pass E[x^2] - E[x]^2 variance cancels there), in-place outputs -- against
float64 numpy references, and the same bits at 1 thread and at 2 (one thread computes a whole row or head, so the
split never changes a result)."""
import numpy as np
import pytest

import paddle_rt
from paddle_rt import ops, op
import infinicore_reference as ref

pytest.importorskip("ml_dtypes")

from test_ops_llm import check, rand  # noqa: E402  (the LLM operator tests' tolerances and data)

T = paddle_rt.tensor


def rand_shifted(shape, dtype, rng, shift):
    return (rng.standard_normal(shape) + shift).astype(ref.np_dtype(dtype))


@pytest.fixture
def rng():
    return np.random.default_rng(25)


@pytest.fixture
def threads():
    """Runs the body at the thread counts given to set(), restoring the default after."""
    old = op.get_num_threads()
    yield op.set_num_threads
    op.set_num_threads(old)


LENGTHS = [1, 3, 15, 16, 17, 33, 255, 1000, 4097]


# -- layer_norm --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", LENGTHS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_row_lengths(d, dtype, bias, rng):
    rows = max(3, 70000 // d)                 # enough rows for several chunks of the pool
    x, w, b = rand((rows, d), dtype, rng), rand((d,), dtype, rng), rand((d,), dtype, rng)
    got = ops.layer_norm(T(x), T(w), T(b) if bias else None, eps=1e-5).numpy()
    check(got, ref.layer_norm(x, w, b if bias else None, 1e-5), dtype, 4)


def test_layer_norm_large_mean_keeps_the_variance(rng):
    """float32 rows 1e4 + N(0, 1): E[x^2] - E[x]^2 in float32 would be noise (ulp(1e8) = 8); the centred second
    pass keeps the variance to float32's precision, and the mean kept as x[0] + mean(x - x[0]) keeps every output
    to ~1e-5 (one float32 mean near 1e4 would be off by up to ulp(1e4) / 2 = 5e-4)."""
    x = rand_shifted((64, 1000), "float32", rng, 1e4)
    w, b = np.ones(1000, np.float32), np.zeros(1000, np.float32)
    got = ops.layer_norm(T(x), T(w), T(b), eps=1e-6).numpy()
    want = ref.layer_norm(x, w, b, 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)    # the mean rounded to float32 (ulp 1e-3) fails
    np.testing.assert_allclose(got.std(-1), 1.0, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_layer_norm_strided_rows_and_output(dtype, rng):
    big = rand((40, 2 * 37), dtype, rng)
    x = T(big)[:, ::2]                               # rows of stride 2
    w, b = rand((37,), dtype, rng), rand((37,), dtype, rng)
    want = ref.layer_norm(big[:, ::2], w, b, 1e-5)
    check(ops.layer_norm(x, T(w), T(b)).numpy(), want, dtype, 4)
    out = paddle_rt.empty((37, 40), dtype).permute(1, 0)   # a column-major output: rows of stride 40
    ops.layer_norm(x, T(w), T(b), out=out)
    check(out.numpy(), want, dtype, 4)
    x3 = T(rand((5, 37, 7), dtype, rng)).permute(0, 2, 1)  # (5, 7, 37), last stride 7, leading dims strided too
    check(ops.layer_norm(x3, T(w), T(b)).numpy(), ref.layer_norm(x3.numpy(), w, b, 1e-5), dtype, 4)


def test_layer_norm_in_place(rng):
    x, w, b = rand((50, 129), "float32", rng), rand((129,), "float32", rng), rand((129,), "float32", rng)
    tx = T(x)
    ops.layer_norm(tx, T(w), T(b), out=tx)
    check(tx.numpy(), ref.layer_norm(x, w, b, 1e-5), "float32", 4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_norm_same_bits_at_1_and_2_threads(dtype, threads, rng):
    x, w, b = rand((300, 513), dtype, rng), rand((513,), dtype, rng), rand((513,), dtype, rng)
    outs = []
    for n in (1, 2):
        threads(n)
        outs.append(ops.layer_norm(T(x), T(w), T(b)).numpy())
    np.testing.assert_array_equal(ref.f64(outs[0]), ref.f64(outs[1]))


# -- add_rms_norm ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", LENGTHS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_add_rms_norm_row_lengths(d, dtype, rng):
    rows = max(3, 70000 // d)
    a, b, w = rand((rows, d), dtype, rng), rand((rows, d), dtype, rng), rand((d,), dtype, rng)
    y, r = ops.add_rms_norm(T(a), T(b), T(w), eps=1e-6)
    want_y, want_r = ref.add_rms_norm(a, b, w, 1e-6)
    check(y.numpy(), want_y, dtype, 4)
    check(r.numpy(), want_r, dtype)


def test_add_rms_norm_strided_and_in_place(rng):
    big = rand((60, 2 * 45), "float32", rng)
    a = T(big)[:, ::2]                               # strided a: the widening path
    b, w = rand((60, 45), "float32", rng), rand((45,), "float32", rng)
    want_y, want_r = ref.add_rms_norm(big[:, ::2], b, w, 1e-6)
    tb = T(b)
    out = paddle_rt.empty((45, 60)).permute(1, 0)    # y into a strided output
    y, r = ops.add_rms_norm(a, tb, T(w), out=out, residual_out=tb)   # the residual over b itself
    check(out.numpy(), want_y, "float32", 4)
    check(tb.numpy(), want_r, "float32")
    a2, b2 = rand((60, 45), "float32", rng), rand((60, 45), "float32", rng)
    ta2 = T(a2)
    y2, r2 = ops.add_rms_norm(ta2, T(b2), T(w), out=ta2)            # y over a itself
    want_y2, want_r2 = ref.add_rms_norm(a2, b2, w, 1e-6)
    check(ta2.numpy(), want_y2, "float32", 4)
    check(r2.numpy(), want_r2, "float32")


def test_add_rms_norm_same_bits_at_1_and_2_threads(threads, rng):
    a, b, w = rand((300, 515), "float32", rng), rand((300, 515), "float32", rng), rand((515,), "float32", rng)
    outs = []
    for n in (1, 2):
        threads(n)
        y, r = ops.add_rms_norm(T(a), T(b), T(w))
        outs.append((y.numpy(), r.numpy()))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


# -- attention ---------------------------------------------------------------------------------------------------------
# (q_heads, kv_heads, seq, dim, pos, cache): groups of 4 (the four-head path), 8, 3 and 1 (one head at a time); dims
# that are and are not multiples of the 64-wide blocks; several 16-query blocks; caches across several 64-key blocks,
# full blocks transposed at once and partial ones key by key.
# A unit of one query (a decode step, a prefill whose last 16-query block has one query) reads the key rows directly:
# decode rows with groups of 1, 3, 4 and 8, cached lengths that are not multiples of its 4-key steps, dims around its
# 16-lane sums (5, 40, 130), and prefills of 17 and 33 queries whose last single-query block sits on the causal
# boundary after full blocks.
ATT = [(8, 2, 1, 128, 200, 256), (8, 1, 37, 64, 90, 130), (6, 2, 20, 72, 0, 20), (3, 3, 17, 5, 64, 81),
       (4, 1, 70, 16, 0, 70), (2, 2, 1, 130, 127, 128), (16, 2, 1, 40, 1022, 1024), (6, 2, 1, 64, 6, 9),
       (8, 2, 33, 40, 0, 33), (8, 1, 17, 128, 3, 21), (4, 4, 1, 16, 0, 1)]


@pytest.mark.parametrize("nq,nkv,seq,dim,pos,cache", ATT)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_attention_shapes(nq, nkv, seq, dim, pos, cache, dtype, rng):
    q = rand((nq, seq, dim), dtype, rng, 0.5)
    k, v = rand((nkv, seq, dim), dtype, rng, 0.5), rand((nkv, seq, dim), dtype, rng)
    kc, vc = rand((nkv, cache, dim), dtype, rng, 0.5), rand((nkv, cache, dim), dtype, rng)
    y = ops.attention(T(q), T(k), T(v), T(kc), T(vc), pos)
    check(y.numpy(), ref.attention(q, k, v, kc, vc, pos), dtype, 4)


def test_attention_strided_operands(rng):
    """A cache whose rows are not contiguous (dim stride 2) and a strided query: the widening path."""
    nq, nkv, seq, dim, pos, cache = 8, 2, 18, 24, 70, 96
    qb = rand((nq, seq, 2 * dim), "float32", rng, 0.5)
    kcb, vcb = rand((nkv, cache, 2 * dim), "float32", rng, 0.5), rand((nkv, cache, 2 * dim), "float32", rng)
    k, v = rand((nkv, seq, dim), "float32", rng, 0.5), rand((nkv, seq, dim), "float32", rng)
    tkc, tvc = T(kcb), T(vcb)
    out = paddle_rt.empty((nq, seq, dim)).permute(1, 0, 2)       # (seq, nq, dim) with heads outermost in memory
    ops.attention(T(qb)[:, :, ::2], T(k), T(v), tkc[:, :, ::2], tvc[:, :, ::2], pos, out=out)
    want = ref.attention(qb[:, :, ::2], k, v, kcb[:, :, ::2], vcb[:, :, ::2], pos)
    check(out.numpy(), want, "float32", 4)
    np.testing.assert_array_equal(tkc.numpy()[:, pos:pos + seq, ::2], k)          # stored through the strides
    np.testing.assert_array_equal(tkc.numpy()[:, pos:pos + seq, 1::2], kcb[:, pos:pos + seq, 1::2])


@pytest.mark.parametrize("seq", [1, 17])
def test_attention_padded_cache_rows(seq, rng):
    """Caches whose rows are contiguous but further apart than dim (a slice of wider rows): the single-query
    unit reads the keys in place at their row stride, so the padding must never enter a score."""
    nq, nkv, dim, pos, cache = 8, 2, 48, 50, 80
    kcb, vcb = rand((nkv, cache, dim + 16), "float32", rng, 0.5), rand((nkv, cache, dim + 16), "float32", rng)
    kcb[:, :, dim:] = vcb[:, :, dim:] = 1e6                                     # poison past each row
    q = rand((nq, seq, dim), "float32", rng, 0.5)
    k, v = rand((nkv, seq, dim), "float32", rng, 0.5), rand((nkv, seq, dim), "float32", rng)
    y = ops.attention(T(q), T(k), T(v), T(kcb)[:, :, :dim], T(vcb)[:, :, :dim], pos)
    check(y.numpy(), ref.attention(q, k, v, kcb[:, :, :dim].copy(), vcb[:, :, :dim].copy(), pos), "float32", 4)


@pytest.mark.parametrize("seq", [1, 40])
def test_attention_same_bits_at_1_and_2_threads(threads, rng, seq):
    nq, nkv, dim, pos, cache = 16, 4, 64, 100, 140
    args = [rand(s, "float32", rng, 0.5) for s in ((nq, seq, dim), (nkv, seq, dim), (nkv, seq, dim),
                                                    (nkv, cache, dim), (nkv, cache, dim))]
    outs = []
    for n in (1, 2):
        threads(n)
        outs.append(ops.attention(*[T(a) for a in args], pos).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
