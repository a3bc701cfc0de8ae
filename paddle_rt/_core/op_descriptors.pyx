# cython: wraparound=True, boundscheck=True
# One descriptor class per operator: every shape, stride, dtype and attribute rule of the operator, checked once at
# creation (InfiniOP's infiniopCreate<Op>Descriptor). A violation raises InvalidArgument naming the device, the
# operator, the operand and both shapes; a dtype no kernel serves raises NotSupportedError (op.pyx).
import math

from libc.stdint cimport int32_t, int64_t
from libc.limits cimport INT_MAX

from paddle_rt._core.device_ext cimport (
    INT32, INT64, UINT32, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16,
)
from paddle_rt._core.op cimport Handle, OpDescriptor, op_stream
from paddle_rt._core.stream cimport Stream
from paddle_rt._core.tensor cimport TensorDesc, Tensor, new_desc, dtype_name
from paddle_rt._core.includes.op_support cimport (
    PADDLE_RT_OP_ADD, PADDLE_RT_OP_SUB, PADDLE_RT_OP_MUL, PADDLE_RT_OP_GEMM, PADDLE_RT_OP_RMS_NORM,
    PADDLE_RT_OP_LAYER_NORM, PADDLE_RT_OP_CAUSAL_SOFTMAX, PADDLE_RT_OP_SWIGLU, PADDLE_RT_OP_ROPE,
    PADDLE_RT_OP_REARRANGE, PADDLE_RT_OP_RELU, PADDLE_RT_OP_GELU, PADDLE_RT_OP_SILU, PADDLE_RT_OP_RANDOM_SAMPLE,
    PADDLE_RT_OP_AXPBY, PADDLE_RT_OP_ADD_RMS_NORM, PADDLE_RT_OP_SOFTMAX, PADDLE_RT_OP_SILU_AND_MUL,
    PADDLE_RT_OP_KV_CACHING, PADDLE_RT_OP_ATTENTION, PADDLE_RT_OP_EMBEDDING, PADDLE_RT_OP_BATCH_ATTENTION,
)

from paddle_rt._core import errors

ROPE_ALGOS = {"gpt_j": 0, "gpt_neox": 1}
GELU_FORMS = {"none": 0, "tanh": 1}


cdef class _Rules:
    """The operand checks of one descriptor under construction (names the device and the operator)."""
    cdef Handle h
    cdef str op

    def __cinit__(self, Handle h, str op):
        if not isinstance(h, Handle):
            raise errors.InvalidArgument(f"operator {op}: the first argument must be a paddle_rt.op.Handle, not "
                                         f"{type(h).__name__}")
        h.check_open()
        self.h = h
        self.op = op

    cdef fail(self, str msg):
        raise errors.InvalidArgument(f"{self.h.device}: operator {self.op}: {msg}")

    cdef TensorDesc desc(self, object x, str what):
        """The layout of operand `what` (a TensorDesc, or a Tensor's layout: descriptors never hold memory)."""
        if not isinstance(x, TensorDesc):
            self.fail(f"{what} must be a TensorDesc or a Tensor, not {type(x).__name__}")
        cdef TensorDesc t = x
        if isinstance(x, Tensor) and (<Tensor>x).storage.device is not self.h.device:
            self.fail(f"{what} is on {(<Tensor>x).storage.device}, the handle on {self.h.device}")
        return new_desc(t.ndim_, t.shape_, t.strides_, t.dtype_code)

    cdef int writable(self, TensorDesc out, str what="out") except -1:
        """An output's elements are distinct memory: no stride 0 over an extent > 1 and no overlapping strides
        (torch's rule: checked by ordering the dimensions by stride, each must step past all smaller ones)."""
        for i in range(out.ndim_):
            if out.strides_[i] == 0 and out.shape_[i] > 1:
                self.fail(f"{what} has stride 0 in dimension {i} (shape {out.shape}, strides {out.strides}): an "
                          f"output cannot be broadcast")
        if out.numel() == 0:
            return 0
        dims = sorted((abs(out.strides_[i]), out.shape_[i]) for i in range(out.ndim_) if out.shape_[i] > 1)
        reach = 0
        for stride, extent in dims:
            if stride <= reach:
                self.fail(f"{what} overlaps itself (shape {out.shape}, strides {out.strides}): an output's elements "
                          f"must not share memory")
            reach += (extent - 1) * stride
        return 0

    cdef int same_dtype(self, TensorDesc x, TensorDesc out, str what) except -1:
        if x.dtype_code != out.dtype_code:
            self.fail(f"{what} has dtype {x.dtype}, out {out.dtype}: they must match")
        return 0

    cdef int same_shape(self, TensorDesc x, TensorDesc out, str what) except -1:
        if x.shape != out.shape:
            self.fail(f"{what} has shape {x.shape}, out {out.shape}: they must match")
        return 0

    cdef TensorDesc broadcast(self, TensorDesc x, TensorDesc out, str what):
        """x's layout with out's dimensions (numpy broadcasting: stride 0 where x has extent 1 or no dimension)."""
        cdef int64_t shape[8]
        cdef int64_t strides[8]
        cdef int n = out.ndim_, off = out.ndim_ - x.ndim_, i
        if off < 0:
            self.fail(f"{what} has shape {x.shape}, more dimensions than out {out.shape}")
        for i in range(n):
            shape[i] = out.shape_[i]
            if i < off:
                strides[i] = 0
            elif x.shape_[i - off] == out.shape_[i]:
                strides[i] = x.strides_[i - off] if out.shape_[i] != 1 else 0
            elif x.shape_[i - off] == 1:
                strides[i] = 0
            else:
                self.fail(f"{what} has shape {x.shape}, which does not broadcast to out {out.shape}")
        return new_desc(n, shape, strides, x.dtype_code)

    cdef int float_weight(self, TensorDesc w, TensorDesc x, str what) except -1:
        """Weights and tables: any float dtype, whatever x's float dtype (InfiniCore's rms_norm takes e.g. a float16
        weight with bfloat16 x)."""
        if w.dtype_code not in (FLOAT32, FLOAT16, BFLOAT16, FLOAT64):
            self.fail(f"{what} has dtype {w.dtype}; it must be a float dtype (x {x.dtype})")
        return 0

    cdef int float_dtype(self, TensorDesc x, str what) except -1:
        if x.dtype_code not in (FLOAT32, FLOAT64, FLOAT16, BFLOAT16):
            self.fail(f"{what} has dtype {x.dtype}; it must be float32, float64, float16 or bfloat16")
        return 0


# ---- the input rules and output layout of each operator -------------------------------------------------------------
# One path: paddle_rt.ops (which allocates the output) and the descriptors (given one) run the same rules on the
# inputs, here, before the output is looked at; a descriptor then checks that the given output has this layout. A
# rule's error names only the inputs. Each returns (output shape, output dtype code); a descriptor class exposes its
# rule as the static method ``output(handle, *inputs, ...)``, so a new operator (and paddle_rt.ops) reuses it.

cdef tuple _binary_rule(_Rules r, TensorDesc a, TensorDesc b):
    """numpy's broadcast of a's and b's shapes; one dtype."""
    cdef int n = a.ndim_ if a.ndim_ > b.ndim_ else b.ndim_, i
    cdef int64_t x, y
    if b.dtype_code != a.dtype_code:
        r.fail(f"b has dtype {b.dtype}, a {a.dtype}: they must match")
    shape = [0] * n
    for i in range(n):
        x = a.shape_[a.ndim_ - n + i] if i >= n - a.ndim_ else 1
        y = b.shape_[b.ndim_ - n + i] if i >= n - b.ndim_ else 1
        if x != y and x != 1 and y != 1:
            r.fail(f"a {a.shape} and b {b.shape} do not broadcast (dimension {i}: {x} and {y})")
        shape[i] = y if x == 1 else x
    return tuple(shape), a.dtype_code


cdef tuple _gemm_rule(_Rules r, TensorDesc ad, TensorDesc bd):
    """(m, n) or (batch, m, n) of a (m, k) / (batch, m, k) @ b (k, n) / (batch, k, n)."""
    for d, what in ((ad, "a"), (bd, "b")):
        if d.ndim_ not in (2, 3):
            r.fail(f"{what} has shape {d.shape}: gemm takes 2 or 3 dimensions")
    if bd.dtype_code != ad.dtype_code:
        r.fail(f"b has dtype {bd.dtype}, a {ad.dtype}: they must match")
    if ad.shape[-1] != bd.shape[-2]:
        r.fail(f"a {ad.shape} @ b {bd.shape}: a's {ad.shape[-1]} columns do not match b's {bd.shape[-2]} rows")
    ba = ad.shape_[0] if ad.ndim_ == 3 else 1
    bb = bd.shape_[0] if bd.ndim_ == 3 else 1
    if ba != bb and ba != 1 and bb != 1:
        r.fail(f"a {ad.shape} and b {bd.shape}: batches {ba} and {bb} differ (a batch of 1 broadcasts)")
    shape = (ad.shape[-2], bd.shape[-1])
    if ad.ndim_ == 3 or bd.ndim_ == 3:
        shape = (bb if ba == 1 else ba,) + shape      # a batch of 1 broadcasts, to 0 as well (numpy's rule)
    if max(ad.shape[-2], bd.shape[-1], ad.shape[-1]) > INT_MAX:
        r.fail(f"a dimension of a {ad.shape} @ b {bd.shape} exceeds BLAS's 32-bit int")
    return shape, ad.dtype_code


cdef tuple _embedding_rule(_Rules r, TensorDesc idd, TensorDesc wd):
    if idd.dtype_code not in (INT32, INT64):
        r.fail(f"ids has dtype {idd.dtype}; it must be int32 or int64")
    if wd.ndim_ != 2:
        r.fail(f"weight has shape {wd.shape}; it must be (vocab, dim)")
    r.float_dtype(wd, "weight")
    if idd.ndim_ >= 8:
        r.fail(f"ids has {idd.ndim_} dimensions (shape {idd.shape}): the output (*ids.shape, dim) would have "
               f"{idd.ndim_ + 1}, more than 8")
    return idd.shape + (wd.shape[1],), wd.dtype_code


cdef tuple _silu_and_mul_rule(_Rules r, TensorDesc xd):
    r.float_dtype(xd, "x")
    if xd.ndim_ < 1 or xd.shape[-1] % 2:
        r.fail(f"x has shape {xd.shape}: it must be (..., 2d) with an even last dimension")
    return xd.shape[:-1] + (xd.shape[-1] // 2,), xd.dtype_code


cdef tuple _attention_rule(_Rules r, TensorDesc qd):
    r.float_dtype(qd, "q")
    if qd.ndim_ != 3:
        r.fail(f"q has shape {qd.shape}; it must be (q_heads, seq, dim)")
    return (qd.shape[1], qd.shape[0], qd.shape[2]), qd.dtype_code


cdef _Rules _rules_of(handle, str op):
    return _Rules(handle, op)


def output_layout(handle, str op, *inputs):
    """``output_layout(handle, op, *inputs) -> (shape, dtype)``: the output an operator makes of ``inputs`` (the
    inputs' rules checked first, InvalidArgument naming them); the rule paddle_rt.ops allocates by."""
    cdef _Rules r = _rules_of(handle, op)
    ds = [r.desc(x, w) for x, w in zip(inputs, _INPUT_NAMES.get(op, ("x",)))]
    if op in ("add", "sub", "mul", "swiglu"):
        shape, code = _binary_rule(r, ds[0], ds[1])
    elif op == "gemm":
        shape, code = _gemm_rule(r, ds[0], ds[1])
    elif op == "embedding":
        shape, code = _embedding_rule(r, ds[0], ds[1])
    elif op == "silu_and_mul":
        shape, code = _silu_and_mul_rule(r, ds[0])
    elif op == "attention":
        shape, code = _attention_rule(r, ds[0])
    else:                       # unary and normalising operators: x's layout
        shape, code = ds[0].shape, (<TensorDesc>ds[0]).dtype_code
    return shape, dtype_name(code)


_INPUT_NAMES = {"add": ("a", "b"), "sub": ("a", "b"), "mul": ("a", "b"), "swiglu": ("a", "b"), "gemm": ("a", "b"),
                "embedding": ("ids", "weight"), "attention": ("q",), "add_rms_norm": ("a",)}


cdef int _elementwise(OpDescriptor self, Handle handle, int op, tuple operands, str name) except -1:
    cdef _Rules r = _Rules(handle, name)
    if len(operands) == 3:
        _binary_rule(r, r.desc(operands[1], "a"), r.desc(operands[2], "b"))
    cdef TensorDesc out = r.desc(operands[0], "out")
    r.writable(out)
    ins = []
    layouts = []
    for i in range(1, len(operands)):
        what = "a" if (len(operands) == 3 and i == 1) else ("b" if len(operands) == 3 else "x")
        x = r.desc(operands[i], what)
        r.same_dtype(x, out, what)
        ins.append(x)
        layouts.append(r.broadcast(x, out, what))
    self.setup(handle, op, out.dtype_code, out, tuple(ins), tuple(layouts))
    return 0


cdef class AddDescriptor(OpDescriptor):
    """``AddDescriptor(handle, out, a, b)``: out = a + b (numpy broadcasting; integers wrap around)."""
    def __init__(self, Handle handle, out, a, b):
        _elementwise(self, handle, PADDLE_RT_OP_ADD, (out, a, b), "add")


cdef class SubDescriptor(OpDescriptor):
    """``SubDescriptor(handle, out, a, b)``: out = a - b."""
    def __init__(self, Handle handle, out, a, b):
        _elementwise(self, handle, PADDLE_RT_OP_SUB, (out, a, b), "sub")


cdef class MulDescriptor(OpDescriptor):
    """``MulDescriptor(handle, out, a, b)``: out = a * b."""
    def __init__(self, Handle handle, out, a, b):
        _elementwise(self, handle, PADDLE_RT_OP_MUL, (out, a, b), "mul")


cdef class SwiGLUDescriptor(OpDescriptor):
    """``SwiGLUDescriptor(handle, out, a, b)``: out = a * b * sigmoid(b)."""
    def __init__(self, Handle handle, out, a, b):
        _elementwise(self, handle, PADDLE_RT_OP_SWIGLU, (out, a, b), "swiglu")


cdef class ReluDescriptor(OpDescriptor):
    """``ReluDescriptor(handle, out, x)``: out = max(x, 0)."""
    def __init__(self, Handle handle, out, x):
        _elementwise(self, handle, PADDLE_RT_OP_RELU, (out, x), "relu")


cdef class SiluDescriptor(OpDescriptor):
    """``SiluDescriptor(handle, out, x)``: out = x * sigmoid(x)."""
    def __init__(self, Handle handle, out, x):
        _elementwise(self, handle, PADDLE_RT_OP_SILU, (out, x), "silu")


cdef class GeluDescriptor(OpDescriptor):
    """``GeluDescriptor(handle, out, x, approximate="none")``: the erf form, or ``"tanh"`` for the approximation."""
    def __init__(self, Handle handle, out, x, approximate="none"):
        if approximate not in GELU_FORMS:
            raise errors.InvalidArgument(f"{handle.device}: operator gelu: approximate must be 'none' or 'tanh', "
                                         f"not {approximate!r}")
        self.call.attrs[0] = GELU_FORMS[approximate]
        _elementwise(self, handle, PADDLE_RT_OP_GELU, (out, x), "gelu")


cdef class RearrangeDescriptor(OpDescriptor):
    """``RearrangeDescriptor(handle, out, x)``: copies x into out's layout (x broadcasts to out's shape)."""
    def __init__(self, Handle handle, out, x):
        _elementwise(self, handle, PADDLE_RT_OP_REARRANGE, (out, x), "rearrange")


cdef class AxpbyDescriptor(OpDescriptor):
    """``AxpbyDescriptor(handle, y, x, alpha=1.0, beta=1.0)``: y = alpha * x + beta * y in place (contiguous x and
    y of one shape), through the plugin's ``blas_axpby`` in float32, and in float64 when alpha and beta are float32
    values (the hook's scalars are C floats); else the host kernel on host-addressable devices. On other devices
    float64 keeps the hook with alpha and beta rounded to float32, and other dtypes raise NotSupportedError here."""
    def __init__(self, Handle handle, y, x, alpha=1.0, beta=1.0):
        cdef _Rules r = _Rules(handle, "axpby")
        cdef TensorDesc yd = r.desc(y, "y"), xd = r.desc(x, "x")
        r.same_dtype(xd, yd, "x")
        r.same_shape(xd, yd, "x")
        if not (xd.is_contiguous() and yd.is_contiguous()):
            r.fail(f"x (strides {xd.strides}) and y (strides {yd.strides}) must be contiguous")
        self.call.attrs[0] = float(alpha)
        self.call.attrs[1] = float(beta)
        self.setup(handle, PADDLE_RT_OP_AXPBY, yd.dtype_code, yd, (xd,), (xd,))


cdef class GemmDescriptor(OpDescriptor):
    """``GemmDescriptor(handle, out, a, b, alpha=1.0, beta=0.0)``: out = alpha * a @ b + beta * out. a (m, k) or
    (batch, m, k), b (k, n) or (batch, k, n), out (m, n) or (batch, m, n); a batch of 1 (or none) broadcasts; any
    strides (transposed views go to BLAS as they are, other layouts through the workspace)."""
    def __init__(self, Handle handle, out, a, b, alpha=1.0, beta=0.0):
        cdef _Rules r = _Rules(handle, "gemm")
        cdef TensorDesc ad = r.desc(a, "a"), bd = r.desc(b, "b")
        _gemm_rule(r, ad, bd)
        cdef TensorDesc od = r.desc(out, "out")
        r.writable(od)
        r.same_dtype(ad, od, "a")
        r.same_dtype(bd, od, "b")
        for d, what in ((od, "out"), (ad, "a"), (bd, "b")):
            if d.ndim_ not in (2, 3):
                r.fail(f"{what} has shape {d.shape}: gemm takes 2 or 3 dimensions")
        m, n = od.shape[-2], od.shape[-1]
        batch = od.shape[0] if od.ndim_ == 3 else 1
        if ad.shape[-2] != m or bd.shape[-1] != n:
            r.fail(f"out has shape {od.shape}; a {ad.shape} @ b {bd.shape} gives ({ad.shape[-2]}, {bd.shape[-1]})")
        for d, what in ((ad, "a"), (bd, "b")):
            if d.ndim_ == 3 and d.shape_[0] not in (1, batch):
                r.fail(f"{what} has batch {d.shape_[0]} (shape {d.shape}), out {batch} (shape {od.shape})")
        if max(m, n, ad.shape[-1]) > INT_MAX:
            r.fail(f"a dimension of a {ad.shape} @ b {bd.shape} exceeds BLAS's 32-bit int")
        self.call.attrs[0] = float(alpha)
        self.call.attrs[1] = float(beta)
        self.setup(handle, PADDLE_RT_OP_GEMM, od.dtype_code, od, (ad, bd), (_as3(ad, batch), _as3(bd, batch)),
                   _as3(od, batch))


cdef TensorDesc _as3(TensorDesc d, int64_t batch):
    """(m, n) or (b, m, n) as (batch, m, n), a batch of 1 broadcast with stride 0."""
    cdef int64_t shape[3]
    cdef int64_t strides[3]
    if d.ndim_ == 3:
        shape[0] = batch
        strides[0] = d.strides_[0] if d.shape_[0] == batch and batch != 1 else 0
        shape[1], shape[2] = d.shape_[1], d.shape_[2]
        strides[1], strides[2] = d.strides_[1], d.strides_[2]
    else:
        shape[0] = batch
        strides[0] = 0
        shape[1], shape[2] = d.shape_[0], d.shape_[1]
        strides[1], strides[2] = d.strides_[0], d.strides_[1]
    return new_desc(3, shape, strides, d.dtype_code)


cdef int _norm(OpDescriptor self, Handle handle, int op, str name, tuple operands, double eps) except -1:
    cdef _Rules r = _Rules(handle, name)
    cdef TensorDesc od = r.desc(operands[0], "out"), xd = r.desc(operands[1], "x")
    r.writable(od)
    r.same_dtype(xd, od, "x")
    r.same_shape(xd, od, "x")
    if od.ndim_ < 1:
        r.fail("x must have at least one dimension (normalised over the last)")
    d = od.shape[-1]
    ins = [xd]
    for what, w in zip(("weight", "bias"), operands[2:]):
        if w is None and what == "bias":
            continue            # layer_norm without a bias (InfiniCore's optional bias): the kernel adds none
        wd = r.desc(w, what)
        if wd.shape != (d,):
            r.fail(f"{what} has shape {wd.shape}; it must be ({d},), x's last dimension (x {xd.shape})")
        r.float_weight(wd, xd, what)
        ins.append(wd)
    if not (eps >= 0 and math.isfinite(eps)):
        r.fail(f"eps must be finite and >= 0, not {eps}")
    self.call.attrs[0] = eps
    self.setup(handle, op, od.dtype_code, od, tuple(ins), tuple(ins))
    return 0


cdef class RMSNormDescriptor(OpDescriptor):
    """``RMSNormDescriptor(handle, out, x, weight, eps=1e-6)``: out = x / sqrt(mean(x**2) + eps) * weight over the
    last axis; weight (d,) in x's dtype or float32."""
    def __init__(self, Handle handle, out, x, weight, eps=1e-6):
        _norm(self, handle, PADDLE_RT_OP_RMS_NORM, "rms_norm", (out, x, weight), eps)


cdef class LayerNormDescriptor(OpDescriptor):
    """``LayerNormDescriptor(handle, out, x, weight, bias=None, eps=1e-5)``: out = (x - mean) / sqrt(var + eps) *
    weight + bias over the last axis (biased variance); ``bias=None``: no bias (InfiniCore's layer_norm takes the
    bias as optional), and the descriptor is called ``desc(out, x, weight)``."""
    def __init__(self, Handle handle, out, x, weight, bias=None, eps=1e-5):
        _norm(self, handle, PADDLE_RT_OP_LAYER_NORM, "layer_norm", (out, x, weight, bias), eps)


cdef class CausalSoftmaxDescriptor(OpDescriptor):
    """``CausalSoftmaxDescriptor(handle, out, x)``: softmax over the last axis of (..., n, total) where position j
    of row i is kept iff j <= i + total - n (InfiniCore's definition); the rest is 0."""
    def __init__(self, Handle handle, out, x):
        cdef _Rules r = _Rules(handle, "causal_softmax")
        cdef TensorDesc od = r.desc(out, "out"), xd = r.desc(x, "x")
        r.writable(od)
        r.same_dtype(xd, od, "x")
        r.same_shape(xd, od, "x")
        if od.ndim_ < 2:
            r.fail(f"x has shape {xd.shape}: causal_softmax needs (..., n, total)")
        if od.shape[-1] < od.shape[-2]:
            r.fail(f"x has shape {xd.shape}: total ({od.shape[-1]}) must be >= n ({od.shape[-2]})")
        self.setup(handle, PADDLE_RT_OP_CAUSAL_SOFTMAX, od.dtype_code, od, (xd,), (xd,))


cdef class RoPEDescriptor(OpDescriptor):
    """``RoPEDescriptor(handle, out, x, pos_ids, sin_table, cos_table, algo="gpt_neox")``: rotary embedding of x
    (seq, heads, dim) or (batch, seq, heads, dim) (InfiniCore's 4-D form) at positions pos_ids: (seq,) for every batch
    entry, or (batch, seq) (int32/int64/uint32/uint64), with tables (max_pos, dim / 2) of any float dtype; ``algo``
    "gpt_j" rotates pairs (2i, 2i+1), "gpt_neox" pairs (i, i + dim/2). A position id outside [0, max_pos) makes the
    call fail on the stream (InvalidArgument naming it at the next synchronize; nothing written)."""
    def __init__(self, Handle handle, out, x, pos_ids, sin_table, cos_table, algo="gpt_neox"):
        cdef _Rules r = _Rules(handle, "rope")
        cdef TensorDesc od = r.desc(out, "out"), xd = r.desc(x, "x"), pd = r.desc(pos_ids, "pos_ids")
        cdef TensorDesc sd = r.desc(sin_table, "sin_table"), cd = r.desc(cos_table, "cos_table")
        r.writable(od)
        r.same_dtype(xd, od, "x")
        r.same_shape(xd, od, "x")
        r.float_dtype(xd, "x")
        if algo not in ROPE_ALGOS:
            r.fail(f"algo must be 'gpt_j' or 'gpt_neox', not {algo!r}")
        if od.ndim_ not in (3, 4) or od.shape[-1] % 2:
            r.fail(f"x has shape {xd.shape}: rope needs (seq, heads, dim) or (batch, seq, heads, dim) with an even "
                   f"dim")
        seq, dim = od.shape[-3], od.shape[-1]
        want = ((seq,),) if od.ndim_ == 3 else ((seq,), (od.shape[0], seq))
        if pd.shape not in want or pd.dtype_code not in (INT32, INT64, UINT32, UINT64):
            r.fail(f"pos_ids has shape {pd.shape}, dtype {pd.dtype}; it must be "
                   f"{' or '.join(str(w) for w in want)} of int32/int64/uint32/uint64 (x {xd.shape})")
        for d, what in ((sd, "sin_table"), (cd, "cos_table")):
            if d.ndim_ != 2 or d.shape[1] != dim // 2 or d.shape[0] < 1:
                r.fail(f"{what} has shape {d.shape}; it must be (max_pos, {dim // 2}) for x {xd.shape}")
            r.float_weight(d, xd, what)
        if sd.shape != cd.shape:
            r.fail(f"sin_table {sd.shape} and cos_table {cd.shape} differ")
        self.call.attrs[0] = ROPE_ALGOS[algo]
        self.setup(handle, PADDLE_RT_OP_ROPE, od.dtype_code, od, (xd, pd, sd, cd), (xd, pd, sd, cd))


cdef int _sample_attrs(str dev, double* a, random_val, topp, topk, temperature) except -1:
    if not (0.0 <= random_val < 1.0):
        raise errors.InvalidArgument(f"{dev}: operator random_sample: random_val must be in [0, 1), not {random_val}")
    if not (0.0 <= topp <= 1.0):
        raise errors.InvalidArgument(f"{dev}: operator random_sample: topp must be in [0, 1] (0: the argmax, as "
                                     f"InfiniCore reads it), not {topp}")
    if int(topk) != topk or topk < 0:
        raise errors.InvalidArgument(f"{dev}: operator random_sample: topk must be an int >= 0 (0: all), not {topk}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise errors.InvalidArgument(f"{dev}: operator random_sample: temperature must be finite and >= 0, not "
                                     f"{temperature}")
    a[0] = random_val
    a[1] = topp
    a[2] = topk
    a[3] = temperature
    return 0


cdef class RandomSampleDescriptor(OpDescriptor):
    """``RandomSampleDescriptor(handle, out, logits)``: out (shape (), int32 or int64) receives an index sampled from
    logits (vocab,). The sampling parameters come with each call, as in InfiniOP:
    ``desc(out, logits, random_val=..., topp=1.0, topk=0, temperature=1.0)``. InfiniCore's rule: greedy (the first
    index of the largest logit) when topp == 0, topk == 1 or temperature == 0; otherwise indices by logit descending
    (ties: lower index first), p = softmax((l - max) / temperature) over the whole vocabulary, cum = running sums in
    that order, threshold = min(cum[min(topk, vocab) - 1], topp) * random_val, and the first index whose cum reaches
    the threshold. topk 0 means the whole vocabulary (paddle_rt's extension; InfiniCore reads topk <= 1 as greedy)."""
    def __init__(self, Handle handle, out, logits):
        cdef _Rules r = _Rules(handle, "random_sample")
        cdef TensorDesc od = r.desc(out, "out"), ld = r.desc(logits, "logits")
        if od.ndim_ != 0 or od.dtype_code not in (INT32, INT64):
            r.fail(f"out has shape {od.shape}, dtype {od.dtype}; it must be () of int32 or int64")
        if ld.ndim_ != 1 or ld.shape[0] < 1 or ld.dtype_code not in (FLOAT32, FLOAT64, FLOAT16, BFLOAT16):
            r.fail(f"logits has shape {ld.shape}, dtype {ld.dtype}; it must be (vocab,) of a float dtype")
        self.setup(handle, PADDLE_RT_OP_RANDOM_SAMPLE, ld.dtype_code, od, (ld,), (ld,))

    def __call__(self, out, logits, *, random_val, topp=1.0, topk=0, temperature=1.0, workspace=None, stream=None):
        cdef double attrs[8]
        cdef Stream s = op_stream(self.handle.device, stream)
        for i in range(8):
            attrs[i] = 0
        _sample_attrs(str(self.handle.device), attrs, random_val, topp, topk, temperature)
        if not isinstance(out, Tensor) or not isinstance(logits, Tensor):
            out, (logits,) = self._operands(out, (logits,), s)
        self.launch(out, (logits,), workspace, s, attrs)
        return out


# ---- the operators LLM inference needs (InfiniCore's definitions) ---------------------------------------------------
cdef class AddRMSNormDescriptor(OpDescriptor):
    """``AddRMSNormDescriptor(handle, y, residual_out, a, b, weight, eps=1e-6)``, called
    ``desc(y, residual_out, a, b, weight)`` (InfiniCore's AddRMSNorm): residual_out = a + b (rounded to its dtype);
    y = (a + b) / sqrt(mean((a + b)**2) + eps) * weight over the last axis, from the unrounded sum. y, residual_out, a,
    b: one shape (..., d) and float dtype; weight (d,) of any float dtype (float64 or float32 for float64 x).
    residual_out may be a or b itself (the residual stream updated in place), y may be a or b; y and residual_out may
    not overlap."""
    def __init__(self, Handle handle, y, residual_out, a, b, weight, eps=1e-6):
        cdef _Rules r = _Rules(handle, "add_rms_norm")
        cdef TensorDesc yd = r.desc(y, "y"), rd = r.desc(residual_out, "residual_out")
        cdef TensorDesc ad = r.desc(a, "a"), bd = r.desc(b, "b"), wd = r.desc(weight, "weight")
        r.writable(yd, "y")
        r.writable(rd, "residual_out")
        r.float_dtype(yd, "y")
        if yd.ndim_ < 1:
            r.fail("y must have at least one dimension (normalised over the last)")
        for d, what in ((rd, "residual_out"), (ad, "a"), (bd, "b")):
            r.same_dtype(d, yd, what)
            r.same_shape(d, yd, what)
        if wd.shape != (yd.shape[-1],):
            r.fail(f"weight has shape {wd.shape}; it must be ({yd.shape[-1]},), the last dimension of a {ad.shape}")
        r.float_weight(wd, yd, "weight")
        if not (eps >= 0 and math.isfinite(eps)):
            r.fail(f"eps must be finite and >= 0, not {eps}")
        self.call.attrs[0] = eps
        self.written = 1
        self.setup(handle, PADDLE_RT_OP_ADD_RMS_NORM, yd.dtype_code, yd, (rd, ad, bd, wd), (rd, ad, bd, wd))


cdef TensorDesc _axis_last(TensorDesc d, int axis):
    """d's layout with dimension `axis` moved last."""
    cdef int64_t shape[8]
    cdef int64_t strides[8]
    cdef int i, j = 0
    for i in range(d.ndim_):
        if i != axis:
            shape[j], strides[j] = d.shape_[i], d.strides_[i]
            j += 1
    shape[j], strides[j] = d.shape_[axis], d.strides_[axis]
    return new_desc(d.ndim_, shape, strides, d.dtype_code)


cdef class SoftmaxDescriptor(OpDescriptor):
    """``SoftmaxDescriptor(handle, y, x, axis=-1)`` (InfiniCore's Softmax): y = exp(x - max) / sum(exp(x - max))
    along ``axis`` (any axis, negative counts from the end). y and x: one shape and float dtype; y may be x (in
    place). A kernel sees the layouts with ``axis`` moved last (attrs[0] = the caller's axis)."""
    def __init__(self, Handle handle, y, x, axis=-1):
        cdef _Rules r = _Rules(handle, "softmax")
        cdef TensorDesc yd = r.desc(y, "y"), xd = r.desc(x, "x")
        r.writable(yd, "y")
        r.same_dtype(xd, yd, "x")
        r.same_shape(xd, yd, "x")
        r.float_dtype(xd, "x")
        if isinstance(axis, bool) or not isinstance(axis, int) or not -yd.ndim_ <= axis < max(yd.ndim_, 1):
            r.fail(f"axis {axis!r} is not an axis of x {xd.shape}")
        if yd.ndim_ == 0:
            r.fail("x must have at least one dimension")
        ax = axis % yd.ndim_
        self.call.attrs[0] = ax
        self.setup(handle, PADDLE_RT_OP_SOFTMAX, yd.dtype_code, yd, (xd,), (_axis_last(xd, ax),),
                   _axis_last(yd, ax))


cdef class SiluAndMulDescriptor(OpDescriptor):
    """``SiluAndMulDescriptor(handle, out, x)`` (InfiniCore's SiluAndMul, vLLM's): x (..., 2d), out (..., d);
    out = silu(x[..., :d]) * x[..., d:]; one float dtype."""
    def __init__(self, Handle handle, out, x):
        cdef _Rules r = _Rules(handle, "silu_and_mul")
        cdef TensorDesc xd = r.desc(x, "x")
        _silu_and_mul_rule(r, xd)
        cdef TensorDesc od = r.desc(out, "out")
        r.writable(od)
        r.same_dtype(xd, od, "x")
        r.float_dtype(xd, "x")
        if xd.ndim_ < 1 or od.shape != xd.shape[:-1] + (xd.shape[-1] // 2,) or xd.shape[-1] % 2:
            r.fail(f"x has shape {xd.shape}, out {od.shape}: x must be (..., 2d) with an even last dimension and "
                   f"out (..., d)")
        self.setup(handle, PADDLE_RT_OP_SILU_AND_MUL, od.dtype_code, od, (xd,), (xd,))


cdef class KVCachingDescriptor(OpDescriptor):
    """``KVCachingDescriptor(handle, k_cache, v_cache, k, v, past_kv_lengths)``, called
    ``desc(k_cache, v_cache, k, v, past_kv_lengths)`` (InfiniCore's KVCaching): for every sequence b,
    k_cache[b, :, past[b]:past[b] + seq] = k[b] and the same for v. Caches (batch, kv_heads, max_seq, dim), k and v
    (batch, kv_heads, seq, dim) of one float dtype, past_kv_lengths (batch,) int32/int64. A past length with
    past < 0 or past + seq > max_seq makes the call fail on the stream (InvalidArgument naming the sequence and its
    length at the next synchronize), and nothing is written."""
    def __init__(self, Handle handle, k_cache, v_cache, k, v, past_kv_lengths):
        cdef _Rules r = _Rules(handle, "kv_caching")
        cdef TensorDesc kc = r.desc(k_cache, "k_cache"), vc = r.desc(v_cache, "v_cache")
        cdef TensorDesc kd = r.desc(k, "k"), vd = r.desc(v, "v"), pd = r.desc(past_kv_lengths, "past_kv_lengths")
        r.writable(kc, "k_cache")
        r.writable(vc, "v_cache")
        r.float_dtype(kc, "k_cache")
        for d, what in ((vc, "v_cache"), (kd, "k"), (vd, "v")):
            r.same_dtype(d, kc, what)
            if d.ndim_ != 4:
                r.fail(f"{what} has shape {d.shape}: it must be (batch, kv_heads, seq, dim)")
        if kc.ndim_ != 4:
            r.fail(f"k_cache has shape {kc.shape}: it must be (batch, kv_heads, max_seq, dim)")
        r.same_shape(vc, kc, "v_cache")
        r.same_shape(vd, kd, "v")
        b, h, m, dim = kc.shape
        if kd.shape[0] != b or kd.shape[1] != h or kd.shape[3] != dim or kd.shape[2] > m:
            r.fail(f"k has shape {kd.shape}; it must be ({b}, {h}, seq <= {m}, {dim}) for caches {kc.shape}")
        if pd.shape != (b,) or pd.dtype_code not in (INT32, INT64):
            r.fail(f"past_kv_lengths has shape {pd.shape}, dtype {pd.dtype}; it must be ({b},) of int32/int64")
        self.written = 1
        self.exclusive = True
        self.setup(handle, PADDLE_RT_OP_KV_CACHING, kc.dtype_code, kc, (vc, kd, vd, pd), (vc, kd, vd, pd))


cdef int64_t _window(_Rules r, window) except -1:
    if isinstance(window, bool) or not isinstance(window, int) or window < 0 or window > INT64_MAX_EXACT:
        r.fail(f"window must be an int >= 0 (0: no window), not {window!r}")
    return window


# The largest int a double attribute holds exactly (attrs are doubles).
INT64_MAX_EXACT = 2 ** 53


cdef class AttentionDescriptor(OpDescriptor):
    """``AttentionDescriptor(handle, out, q, k, v, k_cache, v_cache, pos)``, called
    ``desc(out, q, k, v, k_cache, v_cache)`` (InfiniCore's Attention): k and v are stored in the caches at
    [pos, pos + seq); then causal grouped-query attention over the first total = pos + seq cached positions:
    query head h uses kv head h // (q_heads // kv_heads), scores q.k / sqrt(dim), query i sees positions
    j <= i + pos, softmax, weighted sum of the cached values. q (q_heads, seq, dim); k, v (kv_heads, seq, dim);
    caches (kv_heads, >= pos + seq, dim); out (seq, q_heads, dim); one float dtype; q_heads a multiple of kv_heads.
    ``window`` > 0 keeps for each query only the last ``window`` positions up to its own (a sliding window, as
    Mistral's; 0: all). Outputs (out and the caches) may not share memory with any operand."""
    def __init__(self, Handle handle, out, q, k, v, k_cache, v_cache, pos, window=0):
        cdef _Rules r = _Rules(handle, "attention")
        _attention_rule(r, r.desc(q, "q"))
        cdef TensorDesc od = r.desc(out, "out"), qd = r.desc(q, "q"), kd = r.desc(k, "k"), vd = r.desc(v, "v")
        cdef TensorDesc kc = r.desc(k_cache, "k_cache"), vc = r.desc(v_cache, "v_cache")
        r.writable(od)
        r.writable(kc, "k_cache")
        r.writable(vc, "v_cache")
        r.float_dtype(qd, "q")
        for d, what in ((od, "out"), (qd, "q"), (kd, "k"), (vd, "v"), (kc, "k_cache"), (vc, "v_cache")):
            if d.ndim_ != 3:
                r.fail(f"{what} has shape {d.shape}: attention takes 3-dimensional operands")
            r.same_dtype(d, qd, what)
        if isinstance(pos, bool) or int(pos) != pos or pos < 0:
            r.fail(f"pos must be an int >= 0, not {pos!r}")
        pos = int(pos)
        nq, seq, dim = qd.shape
        nkv = kd.shape[0]
        if nkv < 1 or nq % nkv:
            r.fail(f"q has {nq} heads, k {nkv}: q_heads must be a multiple of kv_heads (q {qd.shape}, k {kd.shape})")
        if od.shape != (seq, nq, dim):
            r.fail(f"out has shape {od.shape}; it must be ({seq}, {nq}, {dim}) for q {qd.shape}")
        for d, what in ((kd, "k"), (vd, "v")):
            if d.shape != (nkv, seq, dim):
                r.fail(f"{what} has shape {d.shape}; it must be ({nkv}, {seq}, {dim}) for q {qd.shape}")
        for d, what in ((kc, "k_cache"), (vc, "v_cache")):
            if d.shape[0] != nkv or d.shape[2] != dim or d.shape[1] < pos + seq:
                r.fail(f"{what} has shape {d.shape}; it must be ({nkv}, >= pos + seq = {pos + seq}, {dim})")
        self.call.attrs[0] = pos
        self.call.attrs[1] = _window(r, window)
        self.written = (1 << 3) | (1 << 4)
        self.exclusive = True
        self.setup(handle, PADDLE_RT_OP_ATTENTION, od.dtype_code, od, (qd, kd, vd, kc, vc), (qd, kd, vd, kc, vc))


cdef class EmbeddingDescriptor(OpDescriptor):
    """``EmbeddingDescriptor(handle, out, ids, weight)`` (InfiniCore's Embedding, torch's embedding):
    out[i...] = weight[ids[i...]]; ids of any shape (int32/int64), weight (vocab, dim) of a float dtype, out
    ``(*ids.shape, dim)`` in weight's dtype. An id outside [0, vocab) makes the call fail on the stream
    (InvalidArgument naming the id at the next synchronize), and nothing is written. ``vocab_start`` (an int): weight
    is the shard of rows [vocab_start, vocab_start + vocab) of a larger table; an id >= 0 outside it gives a zero row
    (a vocabulary-parallel embedding: the sum of the shards' outputs is the whole table's lookup)."""
    def __init__(self, Handle handle, out, ids, weight, vocab_start=None):
        cdef _Rules r = _Rules(handle, "embedding")
        cdef TensorDesc idd = r.desc(ids, "ids"), wd = r.desc(weight, "weight")
        _embedding_rule(r, idd, wd)
        if vocab_start is not None:
            if isinstance(vocab_start, bool) or not isinstance(vocab_start, int) or not 0 <= vocab_start < 2**53:
                r.fail(f"vocab_start must be an int in [0, 2**53) or None, not {vocab_start!r}")
            self.call.attrs[0] = 1
            self.call.attrs[1] = int(vocab_start)
        cdef TensorDesc od = r.desc(out, "out")
        r.writable(od)
        r.same_dtype(od, wd, "out")
        if od.shape != idd.shape + (wd.shape[1],):
            r.fail(f"out has shape {od.shape}; it must be ids' shape + (dim,) = {idd.shape + (wd.shape[1],)}")
        self.setup(handle, PADDLE_RT_OP_EMBEDDING, od.dtype_code, od, (idd, wd), (idd, wd))


cdef class BatchAttentionDescriptor(OpDescriptor):
    """``BatchAttentionDescriptor(handle, out, q, k_cache, v_cache, pos, window=0)``, called
    ``desc(out, q, k_cache, v_cache, pos)``: attention of a batch of sequences, each at its own position. q (batch,
    q_heads, seq, dim); caches (batch, kv_heads, max_seq, dim) already holding every sequence's keys and values up to
    pos[b] + seq (kv_caching writes them); pos (batch,) int32/int64 on the device; out (batch, seq, q_heads, dim).
    Sequence b's query i is at position pos[b] + i and attends causally to its own cache's positions up to it (the
    last ``window`` of them when window > 0), query head h to kv head h // (q_heads // kv_heads), scale
    1/sqrt(dim). A position with pos < 0 or pos + seq > max_seq makes the call fail on the stream (InvalidArgument
    naming the sequence at the next synchronize), and nothing is written."""
    def __init__(self, Handle handle, out, q, k_cache, v_cache, pos, window=0):
        cdef _Rules r = _Rules(handle, "batch_attention")
        cdef TensorDesc od = r.desc(out, "out"), qd = r.desc(q, "q"), kc = r.desc(k_cache, "k_cache")
        cdef TensorDesc vc = r.desc(v_cache, "v_cache"), pd = r.desc(pos, "pos")
        r.writable(od)
        r.float_dtype(qd, "q")
        for d, what in ((od, "out"), (qd, "q"), (kc, "k_cache"), (vc, "v_cache")):
            if d.ndim_ != 4:
                r.fail(f"{what} has shape {d.shape}: batch_attention takes 4-dimensional operands")
            r.same_dtype(d, qd, what)
        b, nq, seq, dim = qd.shape
        nkv = kc.shape[1]
        if nkv < 1 or nq % nkv:
            r.fail(f"q has {nq} heads, k_cache {nkv}: q_heads must be a multiple of kv_heads (q {qd.shape}, "
                   f"k_cache {kc.shape})")
        if kc.shape[0] != b or kc.shape[3] != dim or kc.shape[2] < seq:
            r.fail(f"k_cache has shape {kc.shape}; it must be ({b}, kv_heads, >= {seq}, {dim}) for q {qd.shape}")
        r.same_shape(vc, kc, "v_cache")
        if od.shape != (b, seq, nq, dim):
            r.fail(f"out has shape {od.shape}; it must be ({b}, {seq}, {nq}, {dim}) for q {qd.shape}")
        if pd.shape != (b,) or pd.dtype_code not in (INT32, INT64):
            r.fail(f"pos has shape {pd.shape}, dtype {pd.dtype}; it must be ({b},) of int32/int64")
        self.call.attrs[0] = _window(r, window)
        self.exclusive = True
        self.setup(handle, PADDLE_RT_OP_BATCH_ATTENTION, od.dtype_code, od, (qd, kc, vc, pd), (qd, kc, vc, pd))
