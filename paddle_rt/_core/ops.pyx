# cython: wraparound=True, boundscheck=True
# Python ops on tensors (paddle_rt.ops): one function per operator, each returning its output tensor. A function
# finds (or creates and caches) the descriptor for its operands' layouts and attributes, allocates the output on the
# op's stream when `out` is None, and enqueues the call there (OpDescriptor.launch).
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.string cimport memcpy, memcmp

from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream
from paddle_rt._core.op cimport Handle, OpDescriptor, op_stream
from paddle_rt._core.tensor cimport Tensor, new_tensor, dtype_code_of, MAX_NDIM
from paddle_rt._core.device_ext cimport INT64
from paddle_rt._core.includes.op_support cimport (
    PADDLE_RT_OP_ADD, PADDLE_RT_OP_SUB, PADDLE_RT_OP_MUL, PADDLE_RT_OP_GEMM, PADDLE_RT_OP_RMS_NORM,
    PADDLE_RT_OP_LAYER_NORM, PADDLE_RT_OP_CAUSAL_SOFTMAX, PADDLE_RT_OP_SWIGLU, PADDLE_RT_OP_ROPE,
    PADDLE_RT_OP_REARRANGE, PADDLE_RT_OP_RELU, PADDLE_RT_OP_GELU, PADDLE_RT_OP_SILU, PADDLE_RT_OP_RANDOM_SAMPLE,
    PADDLE_RT_OP_AXPBY, PADDLE_RT_OP_ADD_RMS_NORM, PADDLE_RT_OP_SOFTMAX, PADDLE_RT_OP_SILU_AND_MUL,
    PADDLE_RT_OP_KV_CACHING, PADDLE_RT_OP_ATTENTION, PADDLE_RT_OP_EMBEDDING, PADDLE_RT_OP_BATCH_ATTENTION,
)

import numpy as np

from paddle_rt._core import errors
from paddle_rt._core.op import Handle as _HandleType
from paddle_rt._core.op_descriptors import (
    AddDescriptor, SubDescriptor, MulDescriptor, SwiGLUDescriptor, ReluDescriptor, SiluDescriptor, GeluDescriptor,
    RearrangeDescriptor, AxpbyDescriptor, GemmDescriptor, RMSNormDescriptor, LayerNormDescriptor,
    CausalSoftmaxDescriptor, RoPEDescriptor, RandomSampleDescriptor, AddRMSNormDescriptor, SoftmaxDescriptor,
    SiluAndMulDescriptor, KVCachingDescriptor, AttentionDescriptor, EmbeddingDescriptor, BatchAttentionDescriptor,
    output_layout,
)

# Descriptors by (device, op, attributes, operand layouts); cleared when it reaches CACHE_LIMIT entries (dynamic
# shapes), like a compiled-kernel cache.
CACHE_LIMIT = 4096
cdef dict _cache = {}
cdef dict _handles = {}


def cache_info():
    """{"entries": descriptors cached, "limit": CACHE_LIMIT}."""
    return {"entries": len(_cache), "limit": CACHE_LIMIT}


def clear_cache():
    """Drop the cached descriptors (and the per-device handles of the ops)."""
    _cache.clear()
    _handles.clear()


cdef Handle _handle(Device dev):
    h = _handles.get(dev)
    if h is None:
        h = _handles[dev] = _HandleType(dev)
    return <Handle>h


cdef bytes _key(Device dev, int op, tuple operands, const double* attrs, int nattrs):
    cdef int64_t buf[4 + 8 + 6 * (2 + 2 * MAX_NDIM)]
    cdef int n = 0, i
    cdef Tensor t
    buf[n] = <int64_t><uintptr_t><void*>dev
    buf[n + 1] = op
    n += 2
    for i in range(nattrs):
        memcpy(&buf[n], &attrs[i], 8)
        n += 1
    for x in operands:
        t = <Tensor>x
        buf[n] = t.dtype_code
        buf[n + 1] = t.ndim_
        n += 2
        for i in range(t.ndim_):
            buf[n] = t.shape_[i]
            buf[n + 1] = t.strides_[i]
            n += 2
    return PyBytes_FromStringAndSize(<char*>buf, n * 8)


cdef OpDescriptor _create(bytes key, factory, tuple args):
    if len(_cache) >= CACHE_LIMIT:
        _cache.clear()
    d = factory(*args)
    _cache[key] = d
    return <OpDescriptor>d


cdef Tensor _tensor(object x, str op, str what):
    if not isinstance(x, Tensor):
        raise errors.InvalidArgument(f"ops.{op}: {what} must be a paddle_rt Tensor, not {type(x).__name__} (make "
                                     f"one with paddle_rt.tensor())")
    return <Tensor>x


cdef Device _device(str op, tuple tensors):
    cdef Device dev = (<Tensor>tensors[0]).storage.device
    for t in tensors[1:]:
        if (<Tensor>t).storage.device is not dev:
            raise errors.InvalidArgument(f"ops.{op}: operands on {dev} and {(<Tensor>t).storage.device}; move them "
                                         f"to one device with Tensor.to()")
    return dev


cdef Tensor _out(object out, Device dev, Stream s, tuple shape, int32_t dtype, str op):
    cdef int64_t sh[8]
    if out is not None:
        return _tensor(out, op, "out")
    if len(shape) > MAX_NDIM:
        raise errors.InvalidArgument(f"{dev}: operator {op}: the output would have {len(shape)} dimensions "
                                     f"{shape}, more than {MAX_NDIM}")
    for i in range(len(shape)):
        sh[i] = shape[i]
    return new_tensor(dev, s, len(shape), sh, dtype, f"{dev}: operator {op}: the output")


cdef Tensor _new_out(object out, Device dev, Stream s, str op, tuple inputs):
    """`out`, or a new tensor with the layout the operator's descriptor derives from `inputs` after checking their
    rules (op_descriptors.output_layout: the one path both share)."""
    if out is not None:
        return _tensor(out, op, "out")
    shape, dt = output_layout(_handle(dev), op, *inputs)
    return _out(None, dev, s, tuple(shape), dtype_code_of(dt), op)


cdef Tensor _binary(int op, str name, factory, a, b, out, stream):
    cdef Tensor ta = _tensor(a, name, "a"), tb = _tensor(b, name, "b")
    cdef Device dev = _device(name, (ta, tb))
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor to
    if out is not None:
        to = _tensor(out, name, "out")
    elif ta.ndim_ == tb.ndim_ and memcmp(ta.shape_, tb.shape_, ta.ndim_ * sizeof(int64_t)) == 0:
        to = new_tensor(dev, s, ta.ndim_, ta.shape_, ta.dtype_code)      # the common case: no broadcast
    else:
        to = _new_out(None, dev, s, name, (ta, tb))
    cdef bytes k = _key(dev, op, (to, ta, tb), NULL, 0)
    d = _cache.get(k) or _create(k, factory, (_handle(dev), to, ta, tb))
    (<OpDescriptor>d).launch(to, (ta, tb), None, s, NULL)
    return to


cdef Tensor _unary(int op, str name, factory, x, out, stream, tuple extra=()):
    cdef Tensor tx = _tensor(x, name, "x")
    cdef Device dev = tx.storage.device
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor to = _tensor(out, name, "out") if out is not None else new_tensor(dev, s, tx.ndim_, tx.shape_,
                                                                                 tx.dtype_code)
    cdef double attrs[1]
    attrs[0] = 1.0 if (extra and extra[0] == "tanh") else 0.0
    cdef bytes k = _key(dev, op, (to, tx), attrs, 1)
    d = _cache.get(k) or _create(k, factory, (_handle(dev), to, tx) + extra)
    (<OpDescriptor>d).launch(to, (tx,), None, s, NULL)
    return to


def add(a, b, out=None, stream=None):
    """out = a + b (numpy broadcasting), enqueued on ``stream`` (default: the current stream of a's device)."""
    return _binary(PADDLE_RT_OP_ADD, "add", AddDescriptor, a, b, out, stream)


def sub(a, b, out=None, stream=None):
    """out = a - b."""
    return _binary(PADDLE_RT_OP_SUB, "sub", SubDescriptor, a, b, out, stream)


def mul(a, b, out=None, stream=None):
    """out = a * b."""
    return _binary(PADDLE_RT_OP_MUL, "mul", MulDescriptor, a, b, out, stream)


def swiglu(a, b, out=None, stream=None):
    """out = a * b * sigmoid(b)."""
    return _binary(PADDLE_RT_OP_SWIGLU, "swiglu", SwiGLUDescriptor, a, b, out, stream)


def relu(x, out=None, stream=None):
    """out = max(x, 0)."""
    return _unary(PADDLE_RT_OP_RELU, "relu", ReluDescriptor, x, out, stream)


def silu(x, out=None, stream=None):
    """out = x * sigmoid(x)."""
    return _unary(PADDLE_RT_OP_SILU, "silu", SiluDescriptor, x, out, stream)


def gelu(x, approximate="none", out=None, stream=None):
    """GELU: the erf form, or ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise errors.InvalidArgument(f"ops.gelu: approximate must be 'none' or 'tanh', not {approximate!r}")
    return _unary(PADDLE_RT_OP_GELU, "gelu", GeluDescriptor, x, out, stream, (approximate,))


def rearrange(x, out=None, stream=None):
    """Copy x into ``out``'s layout (default: a new C-contiguous tensor)."""
    return _unary(PADDLE_RT_OP_REARRANGE, "rearrange", RearrangeDescriptor, x, out, stream)


def gemm(a, b, out=None, alpha=1.0, beta=0.0, stream=None):
    """out = alpha * a @ b + beta * out; a (m, k) or (batch, m, k), b (k, n) or (batch, k, n)."""
    cdef Tensor ta = _tensor(a, "gemm", "a"), tb = _tensor(b, "gemm", "b")
    cdef Device dev = _device("gemm", (ta, tb))
    cdef Stream s = op_stream(dev, stream)
    cdef double attrs[2]
    attrs[0] = alpha
    attrs[1] = beta
    if out is None and beta != 0:
        raise errors.InvalidArgument(f"{dev}: operator gemm: beta = {beta} reads out, so out must be given")
    cdef Tensor to = _new_out(out, dev, s, "gemm", (ta, tb))
    cdef bytes k = _key(dev, PADDLE_RT_OP_GEMM, (to, ta, tb), attrs, 2)
    d = _cache.get(k) or _create(k, GemmDescriptor, (_handle(dev), to, ta, tb, alpha, beta))
    (<OpDescriptor>d).launch(to, (ta, tb), None, s, NULL)
    return to


cdef Tensor _norm(int op, str name, factory, tuple ins, double eps, out, stream):
    cdef Tensor tx = _tensor(ins[0], name, "x")
    ts = (tx,) + tuple(_tensor(w, name, what) for w, what in zip(ins[1:], ("weight", "bias")) if w is not None)
    cdef Device dev = _device(name, ts)
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor to = _out(out, dev, s, tx.shape if out is None else (), tx.dtype_code, name)
    cdef double attrs[1]
    attrs[0] = eps
    cdef bytes k = _key(dev, op, (to,) + ts, attrs, 1)
    extra = (None,) if (op == PADDLE_RT_OP_LAYER_NORM and len(ts) == 2) else ()
    d = _cache.get(k) or _create(k, factory, (_handle(dev), to) + ts + extra + (eps,))
    (<OpDescriptor>d).launch(to, ts, None, s, NULL)
    return to


def rms_norm(x, weight, eps=1e-6, out=None, stream=None):
    """out = x / sqrt(mean(x**2, -1) + eps) * weight; weight (d,) of any float dtype (whatever x's float dtype)."""
    return _norm(PADDLE_RT_OP_RMS_NORM, "rms_norm", RMSNormDescriptor, (x, weight), eps, out, stream)


def layer_norm(x, weight, bias=None, eps=1e-5, out=None, stream=None):
    """out = (x - mean) / sqrt(var + eps) * weight + bias over the last axis; ``bias=None``: none."""
    return _norm(PADDLE_RT_OP_LAYER_NORM, "layer_norm", LayerNormDescriptor, (x, weight, bias), eps, out, stream)


def causal_softmax(x, out=None, stream=None):
    """Softmax over the last axis of (..., n, total) with position j of row i kept iff j <= i + total - n."""
    return _unary(PADDLE_RT_OP_CAUSAL_SOFTMAX, "causal_softmax", CausalSoftmaxDescriptor, x, out, stream)


def rope(x, pos_ids, sin_table, cos_table, algo="gpt_neox", out=None, stream=None):
    """Rotary embedding of x (seq, heads, dim) or (batch, seq, heads, dim) at pos_ids (seq,) (every batch entry) or
    (batch, seq), with tables (max_pos, dim/2); ``algo`` "gpt_neox" (pairs i, i + dim/2) or "gpt_j" (pairs 2i,
    2i+1)."""
    if algo not in ("gpt_j", "gpt_neox"):
        raise errors.InvalidArgument(f"ops.rope: algo must be 'gpt_j' or 'gpt_neox', not {algo!r}")
    ts = tuple(_tensor(t, "rope", w) for t, w in zip((x, pos_ids, sin_table, cos_table),
                                                     ("x", "pos_ids", "sin_table", "cos_table")))
    cdef Tensor tx = ts[0]
    cdef Device dev = _device("rope", ts)
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor to = _out(out, dev, s, tx.shape if out is None else (), tx.dtype_code, "rope")
    cdef double attrs[1]
    attrs[0] = 1 if algo == "gpt_neox" else 0
    cdef bytes k = _key(dev, PADDLE_RT_OP_ROPE, (to,) + ts, attrs, 1)
    d = _cache.get(k) or _create(k, RoPEDescriptor, (_handle(dev), to) + ts + (algo,))
    (<OpDescriptor>d).launch(to, ts, None, s, NULL)
    return to


def random_sample(logits, *, random_val=None, seed=None, topp=1.0, topk=0, temperature=1.0, out=None,
                  dtype="int64", stream=None):
    """An index sampled from ``logits`` (vocab,) as a 0-d int tensor (see RandomSampleDescriptor for the rule).
    Reproducible: give ``random_val`` in [0, 1), or ``seed`` (random_val = numpy.random.default_rng(seed).random()).
    With neither, a fresh random value is drawn."""
    cdef Tensor tl = _tensor(logits, "random_sample", "logits")
    cdef Device dev = tl.storage.device
    cdef Stream s = op_stream(dev, stream)
    if random_val is not None and seed is not None:
        raise errors.InvalidArgument("ops.random_sample: give random_val or seed, not both")
    if random_val is None:
        random_val = float(np.random.default_rng(seed).random())
    cdef Tensor to = _out(out, dev, s, (), dtype_code_of(dtype), "random_sample")
    cdef bytes k = _key(dev, PADDLE_RT_OP_RANDOM_SAMPLE, (to, tl), NULL, 0)
    d = _cache.get(k) or _create(k, RandomSampleDescriptor, (_handle(dev), to, tl))
    d(to, tl, random_val=random_val, topp=topp, topk=topk, temperature=temperature, stream=s)
    return to


def axpby(x, y, alpha=1.0, beta=1.0, stream=None):
    """y = alpha * x + beta * y in place; returns y. Runs the plugin's blas_axpby in float32, and in float64 when
    alpha and beta are float32 values (the hook takes them as C floats); otherwise the host kernel on host-addressable
    devices. On other devices a float64 call keeps the hook, with alpha and beta rounded to float32
    (docs/operators.md), and float16/bfloat16 need a registered or plugin kernel (NotSupportedError otherwise)."""
    cdef Tensor tx = _tensor(x, "axpby", "x"), ty = _tensor(y, "axpby", "y")
    cdef Device dev = _device("axpby", (tx, ty))
    cdef Stream s = op_stream(dev, stream)
    cdef double attrs[2]
    attrs[0] = alpha
    attrs[1] = beta
    cdef bytes k = _key(dev, PADDLE_RT_OP_AXPBY, (ty, tx), attrs, 2)
    d = _cache.get(k) or _create(k, AxpbyDescriptor, (_handle(dev), ty, tx, alpha, beta))
    (<OpDescriptor>d).launch(ty, (tx,), None, s, NULL)
    return ty


# ---- the operators LLM inference needs -----------------------------------------------------------------------------
cdef OpDescriptor _cached(int op, factory, Device dev, tuple operands, tuple extra, const double* attrs, int nattrs):
    cdef bytes k = _key(dev, op, operands, attrs, nattrs)
    d = _cache.get(k) or _create(k, factory, (_handle(dev),) + operands + extra)
    return <OpDescriptor>d


cdef tuple _tensors(str op, tuple values, tuple names):
    return tuple(_tensor(v, op, n) for v, n in zip(values, names))


def add_rms_norm(a, b, weight, eps=1e-6, out=None, residual_out=None, stream=None):
    """``add_rms_norm(a, b, weight, eps=1e-6, out=None, residual_out=None, stream=None) -> (y, residual_out)``
    (InfiniCore's AddRMSNorm): residual_out = a + b; y = (a + b) / sqrt(mean((a + b)**2, -1) + eps) * weight, from
    the unrounded sum. a, b (..., d) of one float dtype, weight (d,). ``residual_out=a`` updates the residual stream
    in place; new tensors otherwise."""
    cdef tuple ts = _tensors("add_rms_norm", (a, b, weight), ("a", "b", "weight"))
    cdef Tensor ta = ts[0]
    cdef Device dev = _device("add_rms_norm", ts)
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor y = _out(out, dev, s, ta.shape if out is None else (), ta.dtype_code, "add_rms_norm")
    cdef Tensor r = _out(residual_out, dev, s, ta.shape if residual_out is None else (), ta.dtype_code,
                         "add_rms_norm")
    cdef double attrs[1]
    attrs[0] = eps
    ins = (r,) + ts
    _cached(PADDLE_RT_OP_ADD_RMS_NORM, AddRMSNormDescriptor, dev, (y,) + ins, (eps,), attrs, 1).launch(
        y, ins, None, s, NULL)
    return y, r


def softmax(x, axis=-1, out=None, stream=None):
    """``softmax(x, axis=-1, out=None, stream=None) -> y`` (InfiniCore's Softmax): exp(x - max) / sum along ``axis``
    (any axis); ``out=x`` computes in place."""
    cdef Tensor tx = _tensor(x, "softmax", "x")
    cdef Device dev = tx.storage.device
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor y = _out(out, dev, s, tx.shape if out is None else (), tx.dtype_code, "softmax")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise errors.InvalidArgument(f"{dev}: operator softmax: axis must be an int, not {axis!r}")
    axis = int(axis)
    cdef double attrs[1]
    attrs[0] = axis
    _cached(PADDLE_RT_OP_SOFTMAX, SoftmaxDescriptor, dev, (y, tx), (axis,), attrs, 1).launch(y, (tx,), None, s,
                                                                                           NULL)
    return y


def silu_and_mul(x, out=None, stream=None):
    """``silu_and_mul(x, out=None, stream=None) -> out`` (InfiniCore's SiluAndMul): x (..., 2d) -> out (..., d) =
    silu(x[..., :d]) * x[..., d:]."""
    cdef Tensor tx = _tensor(x, "silu_and_mul", "x")
    cdef Device dev = tx.storage.device
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor y = _new_out(out, dev, s, "silu_and_mul", (tx,))
    _cached(PADDLE_RT_OP_SILU_AND_MUL, SiluAndMulDescriptor, dev, (y, tx), (), NULL, 0).launch(y, (tx,), None, s,
                                                                                             NULL)
    return y


def kv_caching(k_cache, v_cache, k, v, past_kv_lengths, stream=None):
    """``kv_caching(k_cache, v_cache, k, v, past_kv_lengths, stream=None) -> (k_cache, v_cache)`` (InfiniCore's
    KVCaching): k_cache[b, :, past[b]:past[b] + seq] = k[b] (and v) for every sequence b; caches (batch, kv_heads,
    max_seq, dim), k, v (batch, kv_heads, seq, dim), past_kv_lengths (batch,) int32/int64 on the device. A length
    that does not fit fails at the next synchronize (InvalidArgument naming it) and writes nothing."""
    cdef tuple ts = _tensors("kv_caching", (k_cache, v_cache, k, v, past_kv_lengths),
                             ("k_cache", "v_cache", "k", "v", "past_kv_lengths"))
    cdef Device dev = _device("kv_caching", ts)
    cdef Stream s = op_stream(dev, stream)
    _cached(PADDLE_RT_OP_KV_CACHING, KVCachingDescriptor, dev, ts, (), NULL, 0).launch(ts[0], ts[1:], None, s, NULL)
    return ts[0], ts[1]


def attention(q, k, v, k_cache, v_cache, pos, out=None, stream=None, window=0):
    """``attention(q, k, v, k_cache, v_cache, pos, out=None, stream=None, window=0) -> out`` (InfiniCore's
    Attention): stores k, v (kv_heads, seq, dim) in the caches (kv_heads, max_seq, dim) at [pos, pos + seq), then
    causal grouped-query attention of q (q_heads, seq, dim) over the first pos + seq cached positions (scale
    1/sqrt(dim)); out (seq, q_heads, dim). ``window`` > 0: each query keeps only the last ``window`` positions up to
    its own (Mistral's sliding window)."""
    cdef tuple ts = _tensors("attention", (q, k, v, k_cache, v_cache), ("q", "k", "v", "k_cache", "v_cache"))
    cdef Tensor tq = ts[0]
    cdef Device dev = _device("attention", ts)
    cdef Stream s = op_stream(dev, stream)
    cdef Tensor y = _new_out(out, dev, s, "attention", (tq,))
    if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) or pos < 0:
        raise errors.InvalidArgument(f"{dev}: operator attention: pos must be an int >= 0, not {pos!r}")
    pos = int(pos)
    window = _window_arg(dev, "attention", window)
    cdef double attrs[2]
    attrs[0] = pos
    attrs[1] = window
    _cached(PADDLE_RT_OP_ATTENTION, AttentionDescriptor, dev, (y,) + ts, (pos, window), attrs, 2).launch(
        y, ts, None, s, NULL)
    return y


cdef int64_t _window_arg(Device dev, str op, window) except -1:
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise errors.InvalidArgument(f"{dev}: operator {op}: window must be an int >= 0 (0: no window), not "
                                     f"{window!r}")
    return int(window)


def batch_attention(q, k_cache, v_cache, pos, window=0, out=None, stream=None):
    """``batch_attention(q, k_cache, v_cache, pos, window=0, out=None, stream=None) -> out``: causal grouped-query
    attention of a batch of sequences, each at its own position (the decode step of sequences of different
    lengths). q (batch, q_heads, seq, dim); caches (batch, kv_heads, max_seq, dim) already holding each sequence's
    keys and values up to pos[b] + seq (:func:`kv_caching` writes them); pos (batch,) int32/int64 on the device;
    out (batch, seq, q_heads, dim). Query i of sequence b sits at position pos[b] + i and reads its own cache up to
    there (the last ``window`` positions when window > 0). A position that does not fit fails at the next
    synchronize (InvalidArgument naming the sequence) and writes nothing."""
    cdef tuple ts = _tensors("batch_attention", (q, k_cache, v_cache, pos), ("q", "k_cache", "v_cache", "pos"))
    cdef Tensor tq = ts[0]
    cdef Device dev = _device("batch_attention", ts)
    cdef Stream s = op_stream(dev, stream)
    if tq.ndim_ != 4:
        raise errors.InvalidArgument(f"{dev}: operator batch_attention: q has shape {tq.shape}; it must be (batch, "
                                     f"q_heads, seq, dim)")
    cdef Tensor y = _out(out, dev, s, (tq.shape[0], tq.shape[2], tq.shape[1], tq.shape[3]) if out is None else (),
                         tq.dtype_code, "batch_attention")
    window = _window_arg(dev, "batch_attention", window)
    cdef double attrs[1]
    attrs[0] = window
    _cached(PADDLE_RT_OP_BATCH_ATTENTION, BatchAttentionDescriptor, dev, (y,) + ts, (window,), attrs, 1).launch(
        y, ts, None, s, NULL)
    return y


def linear(x, weight, bias=None, out=None, stream=None):
    """``linear(x, weight, bias=None, out=None, stream=None) -> out`` (torch's ``nn.functional.linear``): x (..., in)
    @ weight (out_features, in)^T (+ bias (out_features,)) -> (..., out_features), for x of 1 to 3 dimensions.
    The transposed view of weight goes to :func:`gemm` as it is (no copy); the bias is added to the product in place
    by :func:`add` (broadcast over the rows), so a biased projection is two operators on the stream."""
    cdef Tensor tx = _tensor(x, "linear", "x"), tw = _tensor(weight, "linear", "weight")
    cdef Device dev = _device("linear", (tx, tw) + ((_tensor(bias, "linear", "bias"),) if bias is not None else ()))
    if tw.ndim_ != 2:
        raise errors.InvalidArgument(f"{dev}: operator linear: weight has shape {tw.shape}; it must be "
                                     f"(out_features, in_features)")
    if tx.ndim_ < 1 or tx.ndim_ > 3 or tx.shape[-1] != tw.shape[1]:
        raise errors.InvalidArgument(f"{dev}: operator linear: x has shape {tx.shape}; it must be (..., "
                                     f"{tw.shape[1]}) with 1 to 3 dimensions for weight {tw.shape}")
    if bias is not None and (<Tensor>bias).shape != (tw.shape[0],):
        raise errors.InvalidArgument(f"{dev}: operator linear: bias has shape {bias.shape}; it must be "
                                     f"({tw.shape[0]},) for weight {tw.shape}")
    x2 = tx.view(1, tx.shape[0]) if tx.ndim_ == 1 else tx
    o2 = None
    if out is not None:
        o2 = _tensor(out, "linear", "out")
        o2 = o2.view(1, o2.shape[0]) if o2.ndim == 1 else o2
    y = gemm(x2, tw.T, out=o2, stream=stream)
    if bias is not None:
        add(y, bias, out=y, stream=stream)
    return y.view(tw.shape[0]) if tx.ndim_ == 1 else y


def embedding(ids, weight, out=None, stream=None, vocab_start=None):
    """``embedding(ids, weight, out=None, stream=None, vocab_start=None) -> out`` (torch's embedding, InfiniCore's
    Embedding): rows of weight (vocab, dim) by ids (any shape, int32/int64); out ``(*ids.shape, dim)``. An id outside
    [0, vocab) fails at the next synchronize (InvalidArgument naming the id) and writes nothing.

    ``vocab_start`` (an int >= 0; tensor parallelism, Megatron's VocabParallelEmbedding): weight holds rows
    [vocab_start, vocab_start + vocab) of a larger table; an id in that range reads row id - vocab_start, any other
    id >= 0 a row of zeros, so the sum (all_reduce) of every shard's output is the whole table's lookup. A negative
    id still fails."""
    cdef tuple ts = _tensors("embedding", (ids, weight), ("ids", "weight"))
    cdef Tensor ti = ts[0], tw = ts[1]
    cdef Device dev = _device("embedding", ts)
    cdef Stream s = op_stream(dev, stream)
    cdef double attrs[2]
    if vocab_start is not None and (isinstance(vocab_start, bool) or not isinstance(vocab_start, (int, np.integer))
                                    or not 0 <= vocab_start < 2**53):
        raise errors.InvalidArgument(f"{dev}: operator embedding: vocab_start must be an int in [0, 2**53) or None, "
                                     f"not {vocab_start!r}")
    cdef Tensor y = _new_out(out, dev, s, "embedding", (ti, tw))
    if vocab_start is None:
        _cached(PADDLE_RT_OP_EMBEDDING, EmbeddingDescriptor, dev, (y,) + ts, (), NULL, 0).launch(y, ts, None, s, NULL)
        return y
    attrs[0] = 1
    attrs[1] = int(vocab_start)
    _cached(PADDLE_RT_OP_EMBEDDING, EmbeddingDescriptor, dev, (y,) + ts, (int(vocab_start),), attrs, 2).launch(
        y, ts, None, s, NULL)
    return y


# Tensor.contiguous (tensor.pyx, below the operator layer) copies through rearrange.
from paddle_rt._core.tensor import register_contiguous_copy as _register_contiguous_copy
_register_contiguous_copy(rearrange)
