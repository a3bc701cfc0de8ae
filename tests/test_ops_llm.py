"""The operators LLM inference needs (paddle_rt.ops add_rms_norm, softmax, silu_and_mul, kv_caching, attention,
embedding; rope on 4-D input) against float64 numpy references of InfiniCore's definitions, in every float dtype;
their descriptors' rules (typed errors naming the operator, the operand and the rule; nothing written when refused)
and their run-time failures (an id or a length out of range, named at the next synchronize)."""
import numpy as np
import pytest

import paddle_rt
from paddle_rt import ops, op
import infinicore_reference as ref

pytest.importorskip("ml_dtypes")

FLOATS = ["float32", "float64", "float16", "bfloat16"]
TOL = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1e-2)}


def rand(shape, dtype, rng, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(ref.np_dtype(dtype))


def check(got, want, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(ref.f64(got), ref.f64(want), rtol=rtol * scale, atol=atol * scale)


@pytest.fixture
def rng():
    return np.random.default_rng(23)


T = paddle_rt.tensor


# -- add_rms_norm -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("wdtype", [None, "float32", "float16", "bfloat16"])
def test_add_rms_norm(dtype, wdtype, rng):
    a, b = rand((3, 5, 24), dtype, rng), rand((3, 5, 24), dtype, rng)
    w = rand((24,), wdtype or dtype, rng)
    y, r = ops.add_rms_norm(T(a), T(b), T(w), eps=1e-6)
    want_y, want_r = ref.add_rms_norm(a, b, w, 1e-6)
    check(y.numpy(), want_y, dtype, 2)
    check(r.numpy(), want_r, dtype)
    assert y.dtype == r.dtype == dtype


def test_add_rms_norm_residual_in_place(rng):
    a, b, w = rand((4, 16), "float32", rng), rand((4, 16), "float32", rng), rand((16,), "float32", rng)
    ta = T(a)
    y, r = ops.add_rms_norm(ta, T(b), T(w), residual_out=ta)
    assert r is ta
    want_y, want_r = ref.add_rms_norm(a, b, w, 1e-6)
    check(ta.numpy(), want_r, "float32")
    check(y.numpy(), want_y, "float32")


def test_add_rms_norm_strided(rng):
    base = rand((2, 2, 12), "float32", rng)        # InfiniCore's (12, 8, 1) strides for (2, 2, 4)
    a_t = paddle_rt.as_strided(T(base), (2, 2, 4), (12, 8, 1))
    b = rand((2, 2, 4), "float32", rng)
    w = rand((4,), "float32", rng)
    y, r = ops.add_rms_norm(a_t, T(b), T(w))
    a = np.lib.stride_tricks.as_strided(base, (2, 2, 4), (48, 32, 4))
    want_y, want_r = ref.add_rms_norm(a, b, w, 1e-6)
    check(y.numpy(), want_y, "float32")
    check(r.numpy(), want_r, "float32")


# -- softmax ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax(dtype, axis, rng):
    x = rand((3, 4, 7), dtype, rng, 3)
    check(ops.softmax(T(x), axis=axis).numpy(), ref.softmax(x, axis), dtype)


def test_softmax_in_place_and_transposed(rng):
    x = rand((5, 6), "float32", rng)
    t = T(x)
    assert ops.softmax(t, axis=0, out=t) is t
    check(t.numpy(), ref.softmax(x, 0), "float32")
    t = T(x).T                                    # (6, 5) with strides (1, 6)
    check(ops.softmax(t, axis=1).numpy(), ref.softmax(x.T, 1), "float32")


# -- silu_and_mul -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 8), (3, 1, 32), (2, 2, 3, 10)])
def test_silu_and_mul(dtype, shape, rng):
    x = rand(shape, dtype, rng, 2)
    y = ops.silu_and_mul(T(x))
    assert y.shape == shape[:-1] + (shape[-1] // 2,)
    check(y.numpy(), ref.silu_and_mul(x), dtype, 2)


# -- rope on 4-D input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("algo", ["gpt_j", "gpt_neox"])
@pytest.mark.parametrize("batch_pos", [False, True])
def test_rope_4d(dtype, algo, batch_pos, rng):
    b, seq, heads, dim, max_pos = 3, 5, 2, 16, 20
    x = rand((b, seq, heads, dim), dtype, rng)
    pos = rng.integers(0, max_pos, size=(b, seq) if batch_pos else (seq,)).astype(np.int32)
    sin, cos = ref.rope_tables(np.arange(max_pos), dim)
    sin, cos = sin.astype(ref.np_dtype(dtype)), cos.astype(ref.np_dtype(dtype))
    y = ops.rope(T(x), T(pos), T(sin), T(cos), algo=algo)
    check(y.numpy(), ref.rope(x, pos, sin, cos, algo), dtype, 2)


def test_rope_4d_position_out_of_range_names_it(rng):
    x = rand((2, 3, 1, 4), "float32", rng)
    sin, cos = ref.rope_tables(np.arange(4), 4)
    out = T(np.zeros(x.shape, np.float32))
    ops.rope(T(x), T(np.array([[0, 1, 2], [3, 9, 0]], np.int64)), T(sin.astype(np.float32)),
             T(cos.astype(np.float32)), out=out)
    with pytest.raises(paddle_rt.StreamError, match=r"rope.*position id is outside \[0, max_pos = 4\).*: 9"):
        out.synchronize()
    assert not out.numpy().any()                  # nothing written


# -- embedding --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_embedding(dtype, id_dtype, rng):
    w = rand((11, 6), dtype, rng)
    ids = rng.integers(0, 11, size=(2, 5)).astype(id_dtype)
    y = ops.embedding(T(ids), T(w))
    assert y.shape == (2, 5, 6) and y.dtype == dtype
    np.testing.assert_array_equal(ref.f64(y.numpy()), ref.f64(w[ids]))


def test_embedding_scalar_id_and_strided_table(rng):
    w = rand((6, 11), "float32", rng)
    t = T(w).T                                    # (11, 6), strides (1, 11)
    y = ops.embedding(T(np.array(4, np.int64)), t)
    np.testing.assert_array_equal(y.numpy(), w.T[4])


def test_embedding_id_out_of_range_names_the_id(rng):
    w = T(rand((5, 3), "float32", rng))
    out = T(np.zeros((3, 3), np.float32))
    ops.embedding(T(np.array([1, 7, 2], np.int32)), w, out=out)
    with pytest.raises(paddle_rt.StreamError, match=r"embedding.*id 7 .*outside \[0, 5\)"):
        out.synchronize()
    assert not out.numpy().any()                  # nothing written
    bad = ops.embedding(T(np.array([-1], np.int64)), w)
    with pytest.raises(paddle_rt.StreamError, match=r"id -1 "):
        bad.synchronize()


@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding_vocab_shards_sum_to_the_whole_table(dtype, rng):
    """vocab_start (tensor parallelism): each shard's rows for its ids, zero rows for the others' (a strided output
    included); the sum over the shards is the whole table's lookup, exactly."""
    w = rand((12, 5), dtype, rng)
    ids = np.array([[0, 11, 3], [4, 7, 8]], np.int64)
    parts = []
    for start in (0, 4, 8):
        y = ops.embedding(T(ids), T(w[start:start + 4]), vocab_start=start)
        want = np.where(((ids >= start) & (ids < start + 4))[..., None], w[np.clip(ids - start, 0, 3) + start], 0)
        np.testing.assert_array_equal(ref.f64(y.numpy()), ref.f64(want.astype(w.dtype)))
        parts.append(ref.f64(y.numpy()))
    np.testing.assert_array_equal(sum(parts), ref.f64(w[ids]))
    out = T(np.ones((5, 3), ref.np_dtype(dtype)))
    ops.embedding(T(np.array([1, 9, 6], np.int32)), T(w[4:8]), out=out.T, vocab_start=4)   # out (3, 5) strided
    np.testing.assert_array_equal(ref.f64(out.numpy().T), ref.f64(np.stack([0 * w[0], 0 * w[0], w[6]])))


def test_embedding_vocab_start_refused_and_negative_id_fails(rng):
    w = T(rand((4, 3), "float32", rng))
    ids = T(np.array([1], np.int64))
    for bad in (-1, 1.5, True, "2", 2**53):
        with pytest.raises(paddle_rt.InvalidArgument, match=r"operator embedding: vocab_start must be an int"):
            ops.embedding(ids, w, vocab_start=bad)
    y = ops.embedding(T(np.array([9, -2], np.int64)), w, vocab_start=8)
    with pytest.raises(paddle_rt.StreamError, match=r"id -2 "):
        y.synchronize()
    same = ops.embedding(ids, w)                  # the unsharded call after a sharded one: its own descriptor
    np.testing.assert_array_equal(same.numpy(), w.numpy()[[1]])


# -- kv_caching -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("past_dtype", ["int32", "int64"])
def test_kv_caching(dtype, past_dtype, rng):
    kc, vc = rand((3, 2, 10, 4), dtype, rng), rand((3, 2, 10, 4), dtype, rng)
    k, v = rand((3, 2, 3, 4), dtype, rng), rand((3, 2, 3, 4), dtype, rng)
    past = np.array([0, 4, 7], past_dtype)
    tk, tv = T(kc), T(vc)
    assert ops.kv_caching(tk, tv, T(k), T(v), T(past)) == (tk, tv)
    wk, wv = ref.kv_caching(kc, vc, k, v, past)
    np.testing.assert_array_equal(ref.f64(tk.numpy()), ref.f64(wk))
    np.testing.assert_array_equal(ref.f64(tv.numpy()), ref.f64(wv))


def test_kv_caching_length_out_of_range_writes_nothing(rng):
    kc = np.zeros((2, 1, 4, 2), np.float32)
    tk, tv = T(kc), T(kc)
    k = T(rand((2, 1, 2, 2), "float32", rng))
    ops.kv_caching(tk, tv, k, k, T(np.array([0, 3], np.int64)))
    with pytest.raises(paddle_rt.StreamError, match=r"kv_caching.*past_kv_lengths\[1\] = 3.*\[0, 2\]"):
        tk.synchronize()
    assert not tk.numpy().any() and not tv.numpy().any()


# -- attention --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("nq,nkv,seq,dim,pos,buf", [(8, 4, 2, 16, 1, 8), (4, 4, 5, 8, 0, 5), (6, 2, 1, 8, 6, 9)])
def test_attention(dtype, nq, nkv, seq, dim, pos, buf, rng):
    q = rand((nq, seq, dim), dtype, rng, 0.5)
    k, v = rand((nkv, seq, dim), dtype, rng, 0.5), rand((nkv, seq, dim), dtype, rng, 0.5)
    kc, vc = rand((nkv, buf, dim), dtype, rng, 0.5), rand((nkv, buf, dim), dtype, rng, 0.5)
    tkc, tvc = T(kc), T(vc)
    y = ops.attention(T(q), T(k), T(v), tkc, tvc, pos)
    assert y.shape == (seq, nq, dim)
    check(y.numpy(), ref.attention(q, k, v, kc, vc, pos), dtype, 2)
    np.testing.assert_array_equal(ref.f64(tkc.numpy()[:, pos:pos + seq]), ref.f64(k))     # stored in the caches
    np.testing.assert_array_equal(ref.f64(tvc.numpy()[:, pos:pos + seq]), ref.f64(v))
    np.testing.assert_array_equal(ref.f64(tkc.numpy()[:, :pos]), ref.f64(kc[:, :pos]))    # the rest untouched


def test_attention_decode_steps_match_one_prefill(rng):
    """Prefill of 3 then two decode steps equals one prefill of 5 (the cache carries the keys)."""
    nq, nkv, dim, buf = 4, 2, 8, 8
    q = rand((nq, 5, dim), "float64", rng)
    k, v = rand((nkv, 5, dim), "float64", rng), rand((nkv, 5, dim), "float64", rng)
    kc, vc = T(np.zeros((nkv, buf, dim))), T(np.zeros((nkv, buf, dim)))
    outs = [ops.attention(T(q[:, :3].copy()), T(k[:, :3].copy()), T(v[:, :3].copy()), kc, vc, 0).numpy()]
    for p in (3, 4):
        outs.append(ops.attention(T(q[:, p:p + 1].copy()), T(k[:, p:p + 1].copy()), T(v[:, p:p + 1].copy()), kc, vc,
                                  p).numpy())
    full = ref.attention(q, k, v, np.zeros((nkv, buf, dim)), np.zeros((nkv, buf, dim)), 0)
    check(np.concatenate(outs, axis=0), full, "float64")


# -- rules: typed errors naming the operator, the operand and the rule; nothing written -------------------------------
def _zeros(shape, dtype="float32"):
    return T(np.zeros(shape, ref.np_dtype(dtype)))


BAD = [
    ("add_rms_norm", lambda: op.AddRMSNormDescriptor(H(), _zeros((2, 4)), _zeros((2, 4)), _zeros((2, 4)),
                                                      _zeros((2, 5)), _zeros((4,))), r"add_rms_norm: b has shape"),
    ("add_rms_norm", lambda: op.AddRMSNormDescriptor(H(), _zeros((2, 4)), _zeros((2, 4)), _zeros((2, 4)),
                                                      _zeros((2, 4)), _zeros((3,))), r"add_rms_norm: weight has shape"),
    ("add_rms_norm", lambda: op.AddRMSNormDescriptor(H(), _zeros((2, 4)), _zeros((2, 4), "float16"),
                                                      _zeros((2, 4)), _zeros((2, 4)), _zeros((4,))),
     r"add_rms_norm: residual_out has dtype float16"),
    ("add_rms_norm", lambda: op.AddRMSNormDescriptor(H(), _zeros((2, 4), "float64"), _zeros((2, 4), "float64"),
                                                      _zeros((2, 4), "float64"), _zeros((2, 4), "float64"),
                                                      _zeros((4,), "int32")), r"add_rms_norm: weight has dtype"),
    ("softmax", lambda: op.SoftmaxDescriptor(H(), _zeros((2, 4)), _zeros((2, 4)), 2), r"softmax: axis 2 is not"),
    ("softmax", lambda: op.SoftmaxDescriptor(H(), _zeros((2, 4), "int32"), _zeros((2, 4), "int32")),
     r"softmax: x has dtype int32"),
    ("silu_and_mul", lambda: op.SiluAndMulDescriptor(H(), _zeros((2, 4)), _zeros((2, 7))), r"silu_and_mul: x has"),
    ("embedding", lambda: op.EmbeddingDescriptor(H(), _zeros((3, 4)), _zeros((3,), "float32"), _zeros((5, 4))),
     r"embedding: ids has dtype float32"),
    ("embedding", lambda: op.EmbeddingDescriptor(H(), _zeros((3, 5)), _zeros((3,), "int64"), _zeros((5, 4))),
     r"embedding: out has shape"),
    ("kv_caching", lambda: op.KVCachingDescriptor(H(), _zeros((1, 2, 4, 3)), _zeros((1, 2, 4, 3)),
                                                  _zeros((1, 2, 5, 3)), _zeros((1, 2, 5, 3)), _zeros((1,), "int64")),
     r"kv_caching: k has shape"),
    ("kv_caching", lambda: op.KVCachingDescriptor(H(), _zeros((1, 2, 4, 3)), _zeros((1, 2, 4, 3)),
                                                  _zeros((1, 2, 2, 3)), _zeros((1, 2, 2, 3)), _zeros((1,), "float32")),
     r"kv_caching: past_kv_lengths has shape"),
    ("attention", lambda: op.AttentionDescriptor(H(), _zeros((2, 6, 4)), _zeros((6, 2, 4)), _zeros((4, 2, 4)),
                                                 _zeros((4, 2, 4)), _zeros((4, 8, 4)), _zeros((4, 8, 4)), 0),
     r"attention: q has 6 heads, k 4: q_heads must be a multiple"),
    ("attention", lambda: op.AttentionDescriptor(H(), _zeros((2, 4, 4)), _zeros((4, 2, 4)), _zeros((2, 2, 4)),
                                                 _zeros((2, 2, 4)), _zeros((2, 3, 4)), _zeros((2, 8, 4)), 2),
     r"attention: k_cache has shape \(2, 3, 4\); it must be \(2, >= pos \+ seq = 4, 4\)"),
    ("attention", lambda: op.AttentionDescriptor(H(), _zeros((2, 4, 4)), _zeros((4, 2, 4)), _zeros((2, 2, 4)),
                                                 _zeros((2, 2, 4)), _zeros((2, 8, 4)), _zeros((2, 8, 4)), -1),
     r"attention: pos must be an int >= 0"),
    ("rope", lambda: op.RoPEDescriptor(H(), _zeros((2, 3, 1, 4)), _zeros((2, 3, 1, 4)), _zeros((3, 2), "int64"),
                                       _zeros((5, 2)), _zeros((5, 2))), r"rope: pos_ids has shape \(3, 2\)"),
]


def H():
    return op.Handle()


@pytest.mark.parametrize("name,make,match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_descriptor_rules(name, make, match):
    with pytest.raises(paddle_rt.InvalidArgument, match=match):
        make()


def test_refused_calls_write_nothing(rng):
    """Overlapping outputs are refused at the call, before anything is enqueued."""
    a = rand((2, 4), "float32", rng)
    ta, tb, tw = T(a), T(a + 1), T(np.ones(4, np.float32))
    with pytest.raises(paddle_rt.InvalidArgument, match=r"add_rms_norm: out overlaps input 0"):
        ops.add_rms_norm(ta, tb, tw, out=ta, residual_out=ta)
    np.testing.assert_array_equal(ta.numpy(), a)
    kc = T(np.zeros((2, 4, 4), np.float32))
    q = T(np.ones((2, 2, 4), np.float32))
    with pytest.raises(paddle_rt.InvalidArgument, match=r"attention: out overlaps input \d; this operator's outputs may not share"):
        ops.attention(q, kc[:, :2], kc[:, 2:], kc, T(np.zeros((2, 4, 4), np.float32)), 0,
                      out=kc.permute(1, 0, 2)[:2])
    assert not kc.numpy().any()


def test_layer_norm_without_bias(rng):
    x, w = rand((3, 10), "float32", rng), rand((10,), "float32", rng)
    check(ops.layer_norm(T(x), T(w)).numpy(), ref.layer_norm(x, w, None, 1e-5), "float32", 2)
    d = op.LayerNormDescriptor(H(), T(x), T(x), T(w))
    assert d(T(np.zeros_like(x)), T(x), T(w)) is not None


def test_rms_norm_any_float_weight(rng):
    x = rand((2, 8), "bfloat16", rng)
    w = rand((8,), "float16", rng)
    check(ops.rms_norm(T(x), T(w)).numpy(), ref.rms_norm(x, w, 1e-6), "bfloat16")


def test_random_sample_topp_zero_is_argmax(rng):
    x = rand((50,), "float32", rng)
    for rv in (0.0, 0.5, 0.99):
        assert int(ops.random_sample(T(x), random_val=rv, topp=0.0, topk=10).numpy()) == int(np.argmax(x))


def _sentinel(shape):
    return T(np.full(shape, 7.0, np.float32))


def _bad_calls():
    """(name, outputs, call, match): a refused call on the ops layer and the outputs it must leave as they were."""
    kc = _sentinel((1, 2, 4, 3))
    k = T(np.ones((1, 2, 1, 3), np.float32))
    past = T(np.zeros(1, np.int64))
    y2 = _sentinel((2, 4))
    x2 = T(np.ones((2, 4), np.float32))
    w4 = T(np.ones(4, np.float32))
    bcast = T(np.full(4, 7.0, np.float32)).expand(2, 4)
    cache = _sentinel((2, 8, 4))
    q = T(np.ones((2, 1, 4), np.float32))
    kv = T(np.ones((2, 1, 4), np.float32))
    emb_out = _sentinel((3, 2))
    return [
        ("kv_caching", [kc], lambda: ops.kv_caching(kc, kc, k, k, past),
         r"kv_caching: out overlaps input 0; this operator's outputs may not share memory"),
        ("kv_caching", [kc], lambda: ops.kv_caching(kc, T(np.zeros((1, 2, 5, 3), np.float32)), k, k, past),
         r"kv_caching: v_cache has shape \(1, 2, 5, 3\), out \(1, 2, 4, 3\): they must match"),
        ("add_rms_norm", [y2], lambda: ops.add_rms_norm(x2, x2, w4, out=y2, residual_out=bcast),
         r"add_rms_norm: residual_out has stride 0 in dimension 0"),
        ("add_rms_norm", [y2], lambda: ops.add_rms_norm(x2, x2, w4, out=y2, residual_out=y2),
         r"add_rms_norm: out overlaps input 0; this operator's outputs may not share memory"),
        ("softmax", [y2], lambda: ops.softmax(x2, axis=1.0, out=y2), r"softmax: axis must be an int"),
        ("softmax", [y2], lambda: ops.softmax(x2, axis=-3, out=y2), r"softmax: axis -3 is not an axis"),
        ("attention", [cache], lambda: ops.attention(q, kv, kv, cache, cache, 0),
         r"attention: input 3 \(an output too\) overlaps input 4"),
        ("attention", [cache], lambda: ops.attention(q, kv, kv, cache, T(np.zeros((2, 8, 4), np.float32)), True),
         r"attention: pos must be an int >= 0"),
        ("attention", [cache], lambda: ops.attention(q, kv, kv, cache, T(np.zeros((2, 8, 4), np.float32)), 8),
         r"attention: k_cache has shape \(2, 8, 4\); it must be \(2, >= pos \+ seq = 9, 4\)"),
        ("embedding", [emb_out], lambda: ops.embedding(T(np.zeros(3, np.int64)), T(np.ones((4, 2), np.float32)),
                                                       out=emb_out.as_strided((3, 2), (1, 1))),
         r"embedding: out overlaps itself"),
        ("layer_norm", [y2], lambda: ops.layer_norm(x2, w4, T(np.ones(3, np.float32)), out=y2),
         r"layer_norm: bias has shape \(3,\); it must be \(4,\)"),
        ("silu_and_mul", [y2], lambda: ops.silu_and_mul(T(np.ones((2, 7), np.float32)), out=y2),
         r"silu_and_mul: x has shape \(2, 7\)"),
        ("rope", [y2], lambda: ops.rope(T(np.ones((1, 2, 1, 4), np.float32)), T(np.zeros(2, np.float32)),
                                        T(np.ones((3, 2), np.float32)), T(np.ones((3, 2), np.float32))),
         r"rope: pos_ids has shape \(2,\), dtype float32"),
    ]


@pytest.mark.parametrize("i", range(13))
def test_refused_op_calls_name_the_rule_and_write_nothing(i):
    name, outs, call, match = _bad_calls()[i]
    before = [o.numpy().copy() for o in outs]
    with pytest.raises(paddle_rt.InvalidArgument, match=f"operator {match}"):
        call()
    paddle_rt.synchronize()
    for o, b in zip(outs, before):
        np.testing.assert_array_equal(o.numpy(), b)


def test_bad_call_table_size():
    assert len(_bad_calls()) == 13


# -- the families' operators: sliding window, batch_attention, linear, per-head RMSNorm ------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("nq,nkv,seq,dim,pos,window", [(8, 2, 20, 16, 5, 7), (4, 4, 1, 8, 30, 4), (4, 1, 3, 64, 70, 1),
                                                       (6, 3, 40, 8, 0, 100)])
def test_attention_sliding_window(dtype, nq, nkv, seq, dim, pos, window, rng):
    """window w: query i sees only the last w positions up to its own (a window larger than the sequence is none;
    1: itself only); the prefill (seq > 1, transposed keys) and decode (seq 1, key rows) paths both."""
    q = rand((nq, seq, dim), dtype, rng, 0.5)
    k, v = rand((nkv, seq, dim), dtype, rng, 0.5), rand((nkv, seq, dim), dtype, rng, 0.5)
    kc, vc = rand((nkv, pos + seq, dim), dtype, rng, 0.5), rand((nkv, pos + seq, dim), dtype, rng, 0.5)
    y = ops.attention(T(q), T(k), T(v), T(kc), T(vc), pos, window=window)
    want = ref.attention(q, k, v, kc, vc, pos, window)
    check(y.numpy(), want, dtype, 2)
    if window < pos + seq:        # the window changes the result (the test would catch a window ignored)
        assert np.abs(want - ref.attention(q, k, v, kc, vc, pos)).max() > 1e-3


def batch_attention_ref(q, kc, vc, pos, window):
    b, nq, seq, dim = q.shape
    return np.stack([ref.attention(q[i], kc[i][:, pos[i]:pos[i] + seq], vc[i][:, pos[i]:pos[i] + seq], kc[i],
                                   vc[i], pos[i], window) for i in range(b)])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("pos_dtype", ["int32", "int64"])
@pytest.mark.parametrize("b,nq,nkv,seq,dim,window", [(3, 4, 2, 1, 16, 0), (4, 8, 1, 1, 64, 5), (2, 6, 3, 7, 8, 0),
                                                      (5, 4, 4, 2, 32, 3)])
def test_batch_attention(dtype, pos_dtype, b, nq, nkv, seq, dim, window, rng):
    """Each sequence at its own position reads only its own cache row, up to its own position."""
    cap = 50
    q = rand((b, nq, seq, dim), dtype, rng, 0.5)
    kc, vc = rand((b, nkv, cap, dim), dtype, rng, 0.5), rand((b, nkv, cap, dim), dtype, rng, 0.5)
    pos = rng.integers(0, cap - seq, b).astype(pos_dtype)
    pos[0] = 0
    y = ops.batch_attention(T(q), T(kc), T(vc), T(pos), window=window)
    assert y.shape == (b, seq, nq, dim)
    check(y.numpy(), batch_attention_ref(q, kc, vc, pos.astype(np.int64), window).transpose(0, 1, 2, 3), dtype, 2)


def test_batch_attention_equals_attention_per_sequence(rng):
    """A decode step of three sequences at positions 3, 9 and 0 equals each sequence's own attention call."""
    nq, nkv, dim, cap = 4, 2, 16, 12
    kc, vc = rand((3, nkv, cap, dim), "float32", rng), rand((3, nkv, cap, dim), "float32", rng)
    q = rand((3, nq, 1, dim), "float32", rng)
    pos = np.array([3, 9, 0])
    got = ops.batch_attention(T(q), T(kc), T(vc), T(pos)).numpy()
    for i in range(3):
        p = pos[i]
        alone = ops.attention(T(q[i]), T(kc[i][:, p:p + 1].copy()), T(vc[i][:, p:p + 1].copy()), T(kc[i].copy()),
                              T(vc[i].copy()), int(p)).numpy()
        np.testing.assert_array_equal(got[i], alone)


def test_batch_attention_position_out_of_range_writes_nothing(rng):
    q, kc = T(rand((2, 2, 3, 4), "float32", rng)), T(rand((2, 2, 8, 4), "float32", rng))
    out = T(np.full((2, 3, 2, 4), 7.0, np.float32))
    ops.batch_attention(q, kc, kc, T(np.array([0, 6])), out=out)
    with pytest.raises(paddle_rt.StreamError, match=r"batch_attention.*pos\[1\] = 6: with 3 queries it must be "
                                                    r"in \[0, 5\]"):
        out.synchronize()
    assert (out.numpy() == 7).all()


BAD_FAMILY_OPS = [
    (lambda: op.BatchAttentionDescriptor(H(), _zeros((2, 1, 4, 8)), _zeros((2, 4, 1, 8)), _zeros((2, 3, 9, 8)),
                                         _zeros((2, 3, 9, 8)), _zeros((2,), "int64")),
     r"batch_attention: q has 4 heads, k_cache 3"),
    (lambda: op.BatchAttentionDescriptor(H(), _zeros((2, 1, 4, 8)), _zeros((2, 4, 1, 8)), _zeros((2, 2, 9, 8)),
                                         _zeros((2, 2, 9, 8)), _zeros((3,), "int64")), r"pos has shape \(3,\)"),
    (lambda: op.BatchAttentionDescriptor(H(), _zeros((2, 1, 4, 8)), _zeros((2, 4, 1, 8)), _zeros((2, 2, 9, 8)),
                                         _zeros((2, 2, 9, 8)), _zeros((2,), "float32")), r"int32/int64"),
    (lambda: op.BatchAttentionDescriptor(H(), _zeros((2, 1, 4, 8)), _zeros((2, 4, 1, 8)), _zeros((2, 2, 9, 8)),
                                         _zeros((2, 2, 9, 8)), _zeros((2,), "int64"), -1), r"window must be an int"),
    (lambda: op.BatchAttentionDescriptor(H(), _zeros((2, 1, 4, 6)), _zeros((2, 4, 1, 8)), _zeros((2, 2, 9, 8)),
                                         _zeros((2, 2, 9, 8)), _zeros((2,), "int64")), r"out has shape"),
    (lambda: op.AttentionDescriptor(H(), _zeros((2, 4, 4)), _zeros((4, 2, 4)), _zeros((2, 2, 4)), _zeros((2, 2, 4)),
                                    _zeros((2, 8, 4)), _zeros((2, 8, 4)), 0, 2.5), r"window must be an int"),
    (lambda: ops.attention(_zeros((4, 2, 4)), _zeros((2, 2, 4)), _zeros((2, 2, 4)), _zeros((2, 8, 4)),
                           _zeros((2, 8, 4)), 0, window=-3), r"window must be an int >= 0"),
    (lambda: ops.linear(_zeros((3, 5)), _zeros((4, 6))), r"linear: x has shape \(3, 5\)"),
    (lambda: ops.linear(_zeros((3, 5)), _zeros((4, 5)), _zeros((5,))), r"linear: bias has shape \(5,\)"),
    (lambda: ops.linear(_zeros((3, 5)), _zeros((4, 5, 1))), r"linear: weight has shape"),
]


@pytest.mark.parametrize("i", range(len(BAD_FAMILY_OPS)))
def test_family_op_rules(i):
    make, match = BAD_FAMILY_OPS[i]
    with pytest.raises(paddle_rt.InvalidArgument, match=match):
        make()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("xshape,bias", [((5, 24), True), ((5, 24), False), ((24,), True), ((2, 3, 24), True)])
def test_linear(dtype, xshape, bias, rng):
    """A projection with and without bias (Qwen2's q/k/v) against x @ W^T + b, the weight used through its
    transposed view."""
    x, w, b = rand(xshape, dtype, rng), rand((10, 24), dtype, rng, 0.3), rand((10,), dtype, rng)
    y = ops.linear(T(x), T(w), T(b) if bias else None)
    want = ref.f64(x) @ ref.f64(w).T + (ref.f64(b) if bias else 0)
    assert y.shape == xshape[:-1] + (10,)
    check(y.numpy(), want, dtype, 8)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rms_norm_per_head_of_a_strided_view(dtype, rng):
    """Qwen3's q_norm: RMSNorm over head_dim of every head of q, q a (seq, heads, head_dim) view of the fused
    q/k/v projection's columns (row stride (heads + 2 kv) * head_dim)."""
    seq, heads, kv, hd = 3, 4, 2, 8
    qkv = rand((seq, (heads + 2 * kv) * hd), dtype, rng)
    w = rand((hd,), dtype, rng)
    tq = T(qkv)[:, :heads * hd].view(seq, heads, hd)
    y = ops.rms_norm(tq, T(w), eps=1e-6)
    x = ref.f64(qkv[:, :heads * hd]).reshape(seq, heads, hd)
    want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * ref.f64(w)
    check(y.numpy(), want, dtype, 2)
