# The operator layer's mechanism: handles, the kernel registry, and the one path by which an operator call reaches a
# stream (OpDescriptor.launch). The per-operator rules (shapes, strides, dtypes, attributes) are in
# op_descriptors.pyx; the Python ops on tensors in ops.pyx.
cimport cython
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_GetName, PyCapsule_CheckExact
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc as c_malloc, free as c_free
from libc.string cimport memcpy

from paddle_rt._core.device_ext cimport C_Status, C_SUCCESS, C_DataType, C_DeviceInterface, FLOAT32, FLOAT64
from paddle_rt._core.device cimport Device, resolve_device, device_host_addressable
from paddle_rt._core.plugin cimport Plugin
from paddle_rt._core.stream cimport Stream, StreamCtx, stream_of_device
from paddle_rt._core.pool cimport pool_malloc, pool_free, default_pool_of, AsyncAllocation
from paddle_rt._core.allocation cimport Allocation
from paddle_rt._core.allocator cimport raw_live_extent, KIND_DEVICE
from paddle_rt._core.tensor cimport TensorDesc, Tensor, dtype_name, dtype_code_of, tensor_at
from paddle_rt._core.trace cimport trace_mask, trace_label_op
from paddle_rt._core.includes.trace_support cimport PRT_TRACE_STREAMS
from paddle_rt._core.includes.stream_support cimport PRT_OP_NEEDS_IDLE, PRT_OPK_OPERATOR, prt_op_kind, \
    PRT_OP_DROPPABLE, PRT_POS_DROPPED
from paddle_rt._core.includes.op_support cimport (
    paddle_rt_op_call, paddle_rt_tensor, PADDLE_RT_OP_MAX_ATTRS, paddle_rt_kernel_fn, paddle_rt_workspace_fn,
    paddle_rt_register_kernel_cb,
    paddle_rt_ext_register_kernels_fn, prt_host_kernel, prt_host_workspace, prt_set_blas,
    prt_dtype_size,
    PADDLE_RT_OP_ADD, PADDLE_RT_OP_SUB, PADDLE_RT_OP_MUL, PADDLE_RT_OP_GEMM, PADDLE_RT_OP_RMS_NORM,
    PADDLE_RT_OP_LAYER_NORM, PADDLE_RT_OP_CAUSAL_SOFTMAX, PADDLE_RT_OP_SWIGLU, PADDLE_RT_OP_ROPE,
    PADDLE_RT_OP_REARRANGE, PADDLE_RT_OP_RELU, PADDLE_RT_OP_GELU, PADDLE_RT_OP_SILU, PADDLE_RT_OP_RANDOM_SAMPLE,
    PADDLE_RT_OP_AXPBY, PADDLE_RT_OP_COUNT, PADDLE_RT_OP_ADD_RMS_NORM, PADDLE_RT_OP_SOFTMAX,
    PADDLE_RT_OP_SILU_AND_MUL, PADDLE_RT_OP_KV_CACHING, PADDLE_RT_OP_ATTENTION, PADDLE_RT_OP_EMBEDDING,
    PADDLE_RT_OP_BATCH_ATTENTION,
)

from paddle_rt._core.includes.host_parallel cimport (
    prt_parallel_threads, prt_parallel_set_threads, prt_parallel_source, prt_parallel_started, prt_parallel_event,
    prt_parallel_trace, prt_parallel_trace_take, prt_vm_isa, prt_vm_vector_erf,
)

from posix.dlfcn cimport dlsym, dlopen, RTLD_NOW

cdef extern from "<dlfcn.h>" nogil:
    int RTLD_NOLOAD

from paddle_rt._core import errors

OP_IDS = {
    "add": PADDLE_RT_OP_ADD, "sub": PADDLE_RT_OP_SUB, "mul": PADDLE_RT_OP_MUL, "gemm": PADDLE_RT_OP_GEMM,
    "rms_norm": PADDLE_RT_OP_RMS_NORM, "layer_norm": PADDLE_RT_OP_LAYER_NORM,
    "causal_softmax": PADDLE_RT_OP_CAUSAL_SOFTMAX, "swiglu": PADDLE_RT_OP_SWIGLU, "rope": PADDLE_RT_OP_ROPE,
    "rearrange": PADDLE_RT_OP_REARRANGE, "relu": PADDLE_RT_OP_RELU, "gelu": PADDLE_RT_OP_GELU,
    "silu": PADDLE_RT_OP_SILU, "random_sample": PADDLE_RT_OP_RANDOM_SAMPLE, "axpby": PADDLE_RT_OP_AXPBY,
    "add_rms_norm": PADDLE_RT_OP_ADD_RMS_NORM, "softmax": PADDLE_RT_OP_SOFTMAX,
    "silu_and_mul": PADDLE_RT_OP_SILU_AND_MUL, "kv_caching": PADDLE_RT_OP_KV_CACHING,
    "attention": PADDLE_RT_OP_ATTENTION, "embedding": PADDLE_RT_OP_EMBEDDING,
    "batch_attention": PADDLE_RT_OP_BATCH_ATTENTION,
}
OP_NAMES = {v: k for k, v in OP_IDS.items()}
# The names as C strings for the records the worker makes (alive as long as the module: an operation may outlive its
# descriptor).
cdef dict _C_NAMES = {k: v.encode() for k, v in OP_NAMES.items()}

# What a host kernel's failure at run time means (everything else was checked at descriptor creation). The kernels
# of rope, embedding and kv_caching leave two int64 (a, b) at the start of their workspace (engine/host_float.h
# set_detail) that the message names.
_HOST_FAILURES = {
    PADDLE_RT_OP_ROPE: "a position id is outside [0, max_pos) of the sin/cos tables",
    PADDLE_RT_OP_GEMM: "no BLAS was loaded",
    PADDLE_RT_OP_EMBEDDING: "an id is outside [0, vocab) of the table",
    PADDLE_RT_OP_KV_CACHING: "a past length puts the new keys/values outside the cache",
    PADDLE_RT_OP_BATCH_ATTENTION: "a position puts the queries outside the cache",
}


cdef str _host_failure(const paddle_rt_op_call* c):
    cdef const int64_t* d = <const int64_t*>c.workspace
    msg = _HOST_FAILURES[c.op]
    if d == NULL or c.workspace_size < 16:
        return msg
    if c.op == PADDLE_RT_OP_ROPE:
        return f"a position id is outside [0, max_pos = {d[1]}) of the sin/cos tables: {d[0]}"
    if c.op == PADDLE_RT_OP_EMBEDDING:
        return f"id {d[1]} (element {d[0]} of ids, flattened) is outside [0, {c.inputs[1].shape[0]}) of the table"
    if c.op == PADDLE_RT_OP_KV_CACHING:
        return (f"past_kv_lengths[{d[0]}] = {d[1]}: with {c.inputs[1].shape[2]} new positions it must be in "
                f"[0, {c.out.shape[2] - c.inputs[1].shape[2]}] for max_seq {c.out.shape[2]}; nothing was written")
    if c.op == PADDLE_RT_OP_BATCH_ATTENTION:
        return (f"pos[{d[0]}] = {d[1]}: with {c.inputs[0].shape[2]} queries it must be in "
                f"[0, {c.inputs[1].shape[2] - c.inputs[0].shape[2]}] for max_seq {c.inputs[1].shape[2]}; nothing was "
                f"written")
    return msg

# (device type, op, dtype) -> (kernel address, workspace function address, source)
cdef dict _registered = {}      # paddle_rt.op.register_kernel / op_register_kernel
cdef dict _from_plugins = {}    # paddle_rt_ext_register_kernels of the plugins
cdef set _plugins_asked = set() # device types whose plugin export was called
# Bumped by every register/unregister: a descriptor whose generation differs picks its kernel again at its next call,
# so a registration takes effect on descriptors made before it (ops' cached ones included).
cdef uint64_t _generation = 0
# Sources of registered kernels that work from the host on host-addressable memory (paddle_rt.op.register_triton's):
# like paddle_rt's host kernels, each runs only after the plugin stream's earlier work completed.
_HOST_SIDE_SOURCES = frozenset({"triton"})
_kernel_errors = __import__("threading").local()   # .exc: the exception a Python kernel raised on this worker


cdef struct OpLaunch:
    paddle_rt_op_call call
    paddle_rt_kernel_fn kernel
    int hook
    bint plugin_kernel
    const char* name


def _op_id(op):
    if isinstance(op, str):
        i = OP_IDS.get(op)
        if i is None:
            raise errors.InvalidArgument(f"unknown operator {op!r}: one of {', '.join(sorted(OP_IDS))}")
        return i
    if op in OP_NAMES:
        return op
    raise errors.InvalidArgument(f"unknown operator id {op!r}")


# ---- handles -------------------------------------------------------------------------------------------------------

cdef int _check_span(Device dev, str op, str what, TensorDesc want, object avail, str has) except -1:
    """An operand given as memory (an Allocation, a raw address) holds `want`'s layout from its start: no negative
    reach, and the highest element's end within `avail` bytes."""
    cdef int64_t es = prt_dtype_size(want.dtype_code)
    cdef int64_t lo = 0, hi = 0
    cdef int j
    for j in range(want.ndim_):
        if want.shape_[j] == 0:
            return 0
        if want.strides_[j] < 0:
            lo += (want.shape_[j] - 1) * want.strides_[j]
        else:
            hi += (want.shape_[j] - 1) * want.strides_[j]
    if lo < 0 or (hi + 1) * es > avail:
        raise errors.InvalidArgument(
            f"{dev}: operator {op}: {what} laid out as shape {want.shape}, strides {want.strides}, {want.dtype} "
            f"spans {(hi + 1) * es} bytes from its start{' and reaches before it' if lo < 0 else ''}; {has} "
            f"{avail}")
    return 0

cdef class Handle:
    """``Handle(device=None)``: the operator layer on a device (InfiniOP's ``infiniopHandle_t``). Descriptors are
    created against a handle; ``close()`` (or leaving a ``with`` block) ends it."""

    def __init__(self, device=None):
        self.device = resolve_device(device)
        self.device.ensure_ready()
        _ask_plugin(self.device.plugin)

    cdef int check_open(self) except -1:
        if self.closed:
            raise errors.InvalidArgument(f"{self.device}: the operator handle is closed")
        return 0

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Handle({self.device}{', closed' if self.closed else ''})"


# ---- the kernel registry -------------------------------------------------------------------------------------------
cdef int _register_from_plugin(void* registry, int32_t op, int32_t dtype, paddle_rt_kernel_fn kernel,
                               paddle_rt_workspace_fn workspace) noexcept nogil:
    if op < 1 or op >= PADDLE_RT_OP_COUNT or prt_dtype_size(dtype) == 0 or kernel == NULL:
        return -1
    with gil:
        try:
            _from_plugins[(<str>(<object>registry), op, dtype)] = (<uintptr_t>kernel, <uintptr_t>workspace,
                                                                   "plugin")
        except BaseException:
            return -1
    return 0


cdef int _ask_plugin(Plugin p) except -1:
    """Call the plugin's paddle_rt_ext_register_kernels once for its device type."""
    cdef paddle_rt_ext_register_kernels_fn fn
    cdef int rc
    cdef str dtype = p.device_type
    if dtype in _plugins_asked:
        return 0
    _plugins_asked.add(dtype)
    fn = <paddle_rt_ext_register_kernels_fn>dlsym(p._dl, b"paddle_rt_ext_register_kernels")
    if fn == NULL:
        return 0
    rc = fn(<void*>dtype, _register_from_plugin)
    if rc != 0:
        _plugins_asked.discard(dtype)          # asked again (and refused again) at the next Handle
        for key in [k for k in _from_plugins if k[0] == dtype]:
            del _from_plugins[key]             # nothing half-registered stays
        raise errors.PluginError(p.device_type, "paddle_rt_ext_register_kernels", rc,
                                 "the plugin's kernel registration failed")
    return 0


cdef int op_register_kernel(int op, str device_type, int32_t dtype, paddle_rt_kernel_fn fn,
                            paddle_rt_workspace_fn ws, str source) except -1:
    global _generation
    if op < 1 or op >= PADDLE_RT_OP_COUNT:
        raise errors.InvalidArgument(f"register_kernel: unknown operator id {op}")
    if fn == NULL:
        raise errors.InvalidArgument(f"register_kernel({OP_NAMES[op]!r}, {device_type!r}): the kernel is NULL")
    _registered[(device_type, op, dtype)] = (<uintptr_t>fn, <uintptr_t>ws, source)
    _generation += 1
    return 0


def _registry_key(str call, op, device_type, dtype):
    """(device type, op id, dtype code) of register_kernel/unregister_kernel's arguments, checked alike."""
    if not isinstance(device_type, str) or not device_type:
        raise errors.InvalidArgument(f"{call}: device_type must be a device type name (str), not {device_type!r}")
    return device_type, _op_id(op), dtype_code_of(dtype)


cdef uintptr_t _address(object f, str what) except? 0:
    if f is None:
        return 0
    if isinstance(f, int):
        return f
    if PyCapsule_CheckExact(f):
        return <uintptr_t>PyCapsule_GetPointer(f, PyCapsule_GetName(f))
    import ctypes
    if isinstance(f, ctypes._CFuncPtr):
        return ctypes.cast(f, ctypes.c_void_p).value or 0
    raise errors.InvalidArgument(f"register_kernel: {what} must be a C function: an address (int), a PyCapsule or a "
                                 f"ctypes function pointer, not {type(f).__name__}")


def register_kernel(op, device_type, dtype, kernel, workspace=None, *, _source="registered"):
    """Register a C kernel ``C_Status kernel(const paddle_rt_op_call*)`` (paddle_rt/extension.h) for ``op`` on
    devices of ``device_type`` in ``dtype``, with an optional ``size_t workspace(const paddle_rt_op_call*)``.
    ``kernel``/``workspace``: an address, a PyCapsule or a ctypes function pointer (kept alive by the caller until
    it is unregistered and the calls enqueued with it have run). Takes precedence over plugin and host kernels, for
    descriptors created before the registration too (ops' cached ones included: each picks its kernel again at its
    next call)."""
    t, o, d = _registry_key("register_kernel", op, device_type, dtype)
    cdef uintptr_t k = _address(kernel, "kernel")
    cdef uintptr_t w = _address(workspace, "workspace")
    if _source not in ("registered", "triton"):
        raise errors.InvalidArgument(f"register_kernel: unknown kernel source {_source!r}")
    op_register_kernel(o, t, d, <paddle_rt_kernel_fn>k, <paddle_rt_workspace_fn>w, _source)


def _python_kernel_call(uintptr_t address):
    """What a kernel written in Python (a ctypes callback, e.g. paddle_rt.op.register_triton's) reads from the
    ``const paddle_rt_op_call*`` it is given: (op name, dtype name, out, inputs, attrs), each tensor as (data address,
    shape, strides in elements, dtype name)."""
    cdef const paddle_rt_op_call* c = <const paddle_rt_op_call*>address
    return (OP_NAMES[c.op], dtype_name(c.dtype), _operand(&c.out),
            [_operand(&c.inputs[i]) for i in range(c.n_inputs)],
            tuple([c.attrs[i] for i in range(PADDLE_RT_OP_MAX_ATTRS)]))


cdef tuple _operand(const paddle_rt_tensor* t):
    return (<uintptr_t>t.data, tuple([t.shape[i] for i in range(t.ndim)]),
            tuple([t.strides[i] for i in range(t.ndim)]), dtype_name(t.dtype))


def _python_kernel_raised(exc):
    """A kernel written in Python hands the exception it caught to the stream's error record (it then returns a
    failure status): the next synchronize raises StreamError from it instead of a bare status."""
    _kernel_errors.exc = exc


def _record_python_launch(Stream s not None, uint64_t pos, tensors, str name):
    """Record the operand tensors of work a Python launcher enqueued at position `pos` of `s` (paddle_rt.triton), as
    OpDescriptor.launch records an operator's: each may be written there (readers of the tensor wait for it) and is
    used there (its memory is not reused before that position ran)."""
    cdef Tensor t
    for x in tensors:
        t = <Tensor?>x
        t.storage.note_writer(s, pos)
        t.storage.used_on(s)
    if trace_mask & PRT_TRACE_STREAMS:
        trace_label_op(s.ctx.core.tag, pos, {"name": name, "shapes": [(<Tensor>x).shape for x in tensors]})


def unregister_kernel(op, device_type, dtype):
    """Remove a kernel registered with :func:`register_kernel` (same argument checks); descriptors, those made
    before included, go back to the plugin's or the host kernel at their next call. Returns whether one was
    registered."""
    global _generation
    key = _registry_key("unregister_kernel", op, device_type, dtype)
    if _registered.pop(key, None) is None:
        return False
    _generation += 1
    return True


def kernels(device_type=None):
    """{(device type, op name, dtype name): source} of the registered and plugin kernels."""
    out = {}
    for table in (_from_plugins, _registered):
        for (t, o, d), (_, _, src) in table.items():
            if device_type is None or t == device_type:
                out[(t, OP_NAMES[o], dtype_name(d))] = src
    return out


cdef bint _axpby_hook_serves(int32_t dtype, const double* attrs) noexcept:
    """Whether the plugin's blas_axpby computes axpby in ``dtype`` with the caller's alpha and beta: Paddle calls the
    hook with float32 and float64 only (its gradient accumulation), and its alpha and beta are C floats, so a float64
    call goes to it only when both are float32 values (otherwise they would be rounded)."""
    if dtype == FLOAT32:
        return True
    return dtype == FLOAT64 and <double><float>attrs[0] == attrs[0] and <double><float>attrs[1] == attrs[1]


cdef object _blas = None     # {"library", "interface"} of the BLAS the host gemm calls, once found


cdef int _ensure_blas(bint numpy_first=True) except -1:
    """The BLAS for the host gemm, found once: numpy's own OpenBLAS (the numpy wheel's numpy.libs/libscipy_openblas64_,
    already loaded by numpy: the same library and thread pool numpy.matmul uses, so the two do not fight over the
    cores), else SciPy's (scipy.linalg.cython_blas)."""
    global _blas
    cdef void* h
    cdef void* s
    cdef void* d
    if _blas is not None:
        return 0
    if not numpy_first:
        return _scipy_blas()
    import glob
    import os
    import numpy
    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(numpy.__file__))), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*.so"))):
        h = dlopen(os.fsencode(path), RTLD_NOW | RTLD_NOLOAD)     # only the copy numpy loaded
        if h == NULL:
            continue
        s = dlsym(h, b"scipy_sgemm_64_")
        d = dlsym(h, b"scipy_dgemm_64_")
        if s != NULL and d != NULL:
            prt_set_blas(s, d, dlsym(h, b"scipy_sgemv_64_"), dlsym(h, b"scipy_dgemv_64_"), 1)
            _blas = {"library": path, "interface": "ILP64 (numpy's OpenBLAS)"}
            return 0
    return _scipy_blas()


cdef int _scipy_blas() except -1:
    global _blas
    cdef void* s
    cdef void* d
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        raise errors.NotSupportedError("gemm on host-addressable devices needs a BLAS: numpy's bundled OpenBLAS was "
                                       "not found and SciPy is not installed (pip install scipy)") from None
    caps = cython_blas.__pyx_capi__
    s = PyCapsule_GetPointer(caps["sgemm"], PyCapsule_GetName(caps["sgemm"]))
    d = PyCapsule_GetPointer(caps["dgemm"], PyCapsule_GetName(caps["dgemm"]))
    prt_set_blas(s, d, PyCapsule_GetPointer(caps["sgemv"], PyCapsule_GetName(caps["sgemv"])),
                 PyCapsule_GetPointer(caps["dgemv"], PyCapsule_GetName(caps["dgemv"])), 0)
    _blas = {"library": cython_blas.__file__, "interface": "LP64 (scipy.linalg.cython_blas)"}
    return 0


def _reselect_blas(source):
    """For tests: use ``"numpy"``'s OpenBLAS (when found) or ``"scipy"``'s for the host gemms from now on."""
    global _blas
    _blas = None
    _ensure_blas(source == "numpy")
    return blas_info()


def blas_info():
    """{"library", "interface"} of the BLAS the host gemm calls (found at the first gemm descriptor; None before)."""
    return None if _blas is None else dict(_blas)


# ---- the host kernels' thread pool (engine/host_parallel.h) --------------------------------------------------------
def get_num_threads():
    """The host kernels' thread limit: the CPUs this process may use (``os.sched_getaffinity``), or
    ``PADDLE_RT_NUM_THREADS``, or the last :func:`set_num_threads`. 1: each kernel runs on its stream's worker alone."""
    return prt_parallel_threads()


def set_num_threads(n):
    """Set the host kernels' thread limit (>= 1) for the whole process (every stream shares the one pool); returns
    the previous limit. Kernels already running finish with the threads they had. numpy's BLAS (gemm) keeps its own
    thread count (``threadpoolctl`` or ``OPENBLAS_NUM_THREADS`` set it)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > 256:
        raise errors.InvalidArgument(f"set_num_threads: n must be an int in 1..256, not {n!r}")
    return prt_parallel_set_threads(n)


def host_threads_info():
    """{"threads", "source", "started", "vector_isa", "vector_erf"}: the thread limit, where it came from
    ("PADDLE_RT_NUM_THREADS", "affinity", or "affinity (PADDLE_RT_NUM_THREADS=... ignored: not a positive integer)"),
    the pool threads started so far, and the vector math in use (libmvec's "avx512", "avx2" or "sse" forms, or
    "scalar")."""
    import os
    cdef int src = prt_parallel_source()
    if src == 1:
        source = "PADDLE_RT_NUM_THREADS"
    elif src == 0:
        source = "affinity"
    else:
        source = (f"affinity (PADDLE_RT_NUM_THREADS={os.environ.get('PADDLE_RT_NUM_THREADS', '')!r} ignored: not a "
                  f"positive integer)")
    return {"threads": prt_parallel_threads(), "source": source, "started": prt_parallel_started(),
            "vector_isa": prt_vm_isa().decode(), "vector_erf": bool(prt_vm_vector_erf())}


def _pool_trace(bint on):
    """For tests: start (True) or stop recording which thread ran which chunk of which parallel call."""
    prt_parallel_trace(1 if on else 0)


def _pool_trace_take():
    """For tests: the recorded chunks as (job, slot, begin, end, t0_ns, t1_ns) tuples (slot 0: the calling thread;
    1..: the pool's threads; [begin, end) the chunk's range), and clear the record."""
    cdef int64_t cap = 1 << 14
    cdef prt_parallel_event* ev = <prt_parallel_event*>c_malloc(sizeof(prt_parallel_event) * cap)
    if ev == NULL:
        raise MemoryError()
    try:
        n = prt_parallel_trace_take(ev, cap)
        return [(ev[i].job, ev[i].slot, ev[i].begin, ev[i].end, ev[i].t0, ev[i].t1) for i in range(n)]
    finally:
        c_free(ev)


# ---- running a call on the stream's worker -------------------------------------------------------------------------
cdef int _run_op(void* p, void* arg, uint64_t aux, uint64_t pos) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    cdef OpLaunch* L = <OpLaunch*>arg
    cdef C_Status st
    cdef int r = 0
    cdef size_t numel = 1
    cdef int i
    if pos & PRT_POS_DROPPED:
        c_free(L)                # dropped (close(wait=False), exit): never run
        return 0
    if L.hook == HOOK_AXPBY:
        for i in range(L.call.out.ndim):
            numel *= L.call.out.shape[i]
        ctx.iface.set_device(ctx.cdev)
        st = ctx.iface.blas_axpby(ctx.cdev, ctx.pstream, <C_DataType>L.call.dtype, numel, <float>L.call.attrs[0],
                                  L.call.inputs[0].data, <float>L.call.attrs[1], L.call.out.data)
        r = 1 if ctx.has_pstream else 0
    else:
        if L.plugin_kernel:
            ctx.iface.set_device(ctx.cdev)
        st = L.kernel(&L.call)
        r = 1 if (L.plugin_kernel and ctx.has_pstream) else 0
    if st != C_SUCCESS:
        _record_failure(ctx, pos, L, st)
        r = -1
    c_free(L)
    return r


cdef void _record_failure(StreamCtx* ctx, uint64_t pos, OpLaunch* L, C_Status st) noexcept nogil:
    with gil:
        try:
            name = L.name.decode()
            raised = getattr(_kernel_errors, "exc", None)
            if raised is not None:                # a kernel written in Python said why (_python_kernel_raised)
                _kernel_errors.exc = None
                (<list>ctx.errors).append((pos, raised, f"{name} kernel"))
                return
            if L.hook == HOOK_AXPBY:
                exc = errors.PluginError(repr(<object>ctx.device), "blas_axpby", st,
                                         f"in operator {name} on a stream")
            elif not L.plugin_kernel and L.call.op in _HOST_FAILURES:
                exc = errors.InvalidArgument(f"{<object>ctx.device!r}: operator {name}: "
                                             f"{_host_failure(&L.call)} (found when it ran on the stream)")
            else:
                exc = errors.PluginError(repr(<object>ctx.device), f"{name} kernel", st,
                                         "in operator work on a stream")
            (<list>ctx.errors).append((pos, exc, name))
        except BaseException:
            pass


cdef Stream op_stream(Device dev, object stream):
    if stream is None:
        return stream_of_device(dev)
    if not isinstance(stream, Stream):
        raise errors.InvalidArgument(f"{dev}: stream must be a paddle_rt Stream, not {type(stream).__name__}")
    if (<Stream>stream).device is not dev:
        raise errors.InvalidArgument(f"{dev}: stream {(<Stream>stream).name} belongs to {(<Stream>stream).device}")
    return <Stream>stream


cdef inline bint _span(Tensor t, int64_t* lo, int64_t* hi) noexcept:
    """The byte range [lo, hi) that t's elements cover; False when t has no elements."""
    cdef int64_t l = 0, h = 0, e
    cdef int i, es = prt_dtype_size(t.dtype_code)
    for i in range(t.ndim_):
        if t.shape_[i] == 0:
            return False
        e = (t.shape_[i] - 1) * t.strides_[i]
        if e < 0:
            l += e
        else:
            h += e
    lo[0] = <int64_t>t.data + l * es
    hi[0] = <int64_t>t.data + (h + 1) * es
    return True


cdef inline bint _overlap(Tensor a, Tensor b) noexcept:
    """Whether the bytes a and b span intersect."""
    cdef int64_t alo, ahi, blo, bhi
    if not _span(a, &alo, &ahi) or not _span(b, &blo, &bhi):
        return False
    return alo < bhi and blo < ahi


cdef class OpDescriptor:
    """An operator's descriptor (InfiniOP's ``infiniop<Op>Descriptor_t``): the operands' layouts checked once, the
    kernel chosen, ``workspace_size`` in bytes. Calling it, ``desc(out, *inputs, workspace=None, stream=None)``,
    enqueues the operator on ``stream`` (default: the current stream of the handle's device) and returns at once;
    without ``workspace`` one comes from the stream-ordered pool on that stream. ``destroy()`` ends it."""

    def __init__(self, *args, **kwargs):
        raise TypeError("create a descriptor of an operator, e.g. paddle_rt.op.AddDescriptor(handle, out, a, b)")

    cdef int setup(self, Handle h, int op, int32_t dtype, TensorDesc out, tuple ins, tuple layouts,
                   TensorDesc out_layout=None) except -1:
        cdef int i
        cdef TensorDesc t
        h.check_open()
        self.handle = h
        self.name = OP_NAMES[op]
        self._cname = _C_NAMES[op]
        self.out_desc = out
        self.in_descs = ins
        self.call.struct_size = sizeof(paddle_rt_op_call)
        self.call.op = op
        self.call.dtype = dtype
        self.call.n_inputs = len(ins)
        (out if out_layout is None else out_layout).fill(&self.call.out)
        for i in range(len(layouts)):
            t = layouts[i]
            t.fill(&self.call.inputs[i])
        self._pick_kernel(h.device, op, dtype)
        return 0

    cdef int _pick_kernel(self, Device dev, int op, int32_t dtype) except -1:
        cdef str dt = dev.type
        cdef paddle_rt_workspace_fn ws = NULL
        cdef bint host = device_host_addressable(dev)
        self.kernel = NULL
        self.hook, self.plugin_kernel, self.workspace_size = HOOK_NONE, False, 0
        key = (dt, op, dtype)
        entry = _registered.get(key) or _from_plugins.get(key)
        if entry is not None:
            self.kernel = <paddle_rt_kernel_fn><uintptr_t>entry[0]
            ws = <paddle_rt_workspace_fn><uintptr_t>entry[1]
            self.plugin_kernel = entry[2] not in _HOST_SIDE_SOURCES
            self.kernel_source = entry[2]
            self.workspace_size = ws(&self.call) if ws != NULL else 0
            self._generation = _generation         # picked (a failure leaves it stale: picked again next call)
            return 0
        # float64 with scalars the hook would round: the host kernel where there is one, else the hook (docs/operators.md)
        if op == PADDLE_RT_OP_AXPBY and dev.iface.blas_axpby != NULL and (
                _axpby_hook_serves(dtype, self.call.attrs) or (dtype == FLOAT64 and not host)):
            self.hook = HOOK_AXPBY
            self.kernel_source = "hook"
            self._generation = _generation
            return 0
        if host:
            self.kernel = prt_host_kernel(op, dtype)
            if self.kernel != NULL:
                if op == PADDLE_RT_OP_GEMM:
                    _ensure_blas()
                self.kernel_source = "host"
                self.workspace_size = prt_host_workspace(&self.call)
                self._generation = _generation
                return 0
        raise errors.NotSupportedError(
            f"{dev}: operator {self.name} has no kernel for dtype {dtype_name(dtype)} on device type {dt!r}. "
            f"Provide one: paddle_rt.op.register_kernel({self.name!r}, {dt!r}, {dtype_name(dtype)!r}, kernel) at run "
            f"time, or export paddle_rt_ext_register_kernels from the plugin (paddle_rt/extension.h)"
            + ("; the plugin's blas_axpby serves float32 and float64 only" if op == PADDLE_RT_OP_AXPBY and
               dev.iface.blas_axpby != NULL else "")
            + ("" if host else "; paddle_rt's host kernels serve host-addressable devices only"))

    cdef int _check_operand(self, object t, TensorDesc want, int index, Device dev) except -1:
        if isinstance(t, Tensor) and (<Tensor>t).storage.device is dev and want.same_layout(<Tensor>t):
            return 0
        what = "out" if index < 0 else f"input {index}"
        if not isinstance(t, Tensor):
            raise errors.InvalidArgument(f"{dev}: operator {self.name}: {what} must be a paddle_rt Tensor, not "
                                         f"{type(t).__name__}")
        if (<Tensor>t).storage.device is not dev:
            raise errors.InvalidArgument(f"{dev}: operator {self.name}: {what} is on {(<Tensor>t).storage.device}, "
                                         f"the descriptor's handle on {dev}")
        if not want.same_layout(<Tensor>t):
            raise errors.InvalidArgument(
                f"{dev}: operator {self.name}: {what} has shape {(<Tensor>t).shape}, strides {(<Tensor>t).strides}, "
                f"dtype {(<Tensor>t).dtype}; the descriptor was made for shape {want.shape}, strides {want.strides}, "
                f"dtype {want.dtype}")
        return 0

    cdef uint64_t launch(self, Tensor out, tuple ins, object workspace, Stream s, const double* attrs) except 0:
        cdef Device dev = self.handle.device
        cdef int i, n = self.call.n_inputs
        cdef OpLaunch* L
        cdef Tensor t
        cdef uintptr_t wptr = 0
        cdef AsyncAllocation ws_alloc = None
        cdef uint64_t pos
        if self.destroyed:
            raise errors.InvalidArgument(f"{dev}: operator {self.name}: the descriptor was destroyed")
        self.handle.check_open()
        if self._generation != _generation:           # a kernel was (un)registered since the pick
            self._pick_kernel(dev, self.call.op, self.call.dtype)
        if len(ins) != n:
            raise errors.InvalidArgument(f"{dev}: operator {self.name} takes {n} inputs after out, not {len(ins)}")
        self._check_operand(out, self.out_desc, -1, dev)
        for i in range(n):
            self._check_operand(ins[i], self.in_descs[i], i, dev)
            t = ins[i]
            if _overlap(out, t) and (self.exclusive or (self.written & (1 << i))
                                     or not (t.data == out.data and out.same_layout(t))):
                raise errors.InvalidArgument(
                    f"{dev}: operator {self.name}: out overlaps input {i}"
                    + ("; this operator's outputs may not share memory with other operands"
                       if self.exclusive or (self.written & (1 << i)) else
                       " without being the same elements (in place needs the same address and layout)"))
        if self.written:
            self._check_written(ins, dev)
        if self.workspace_size:
            if workspace is None:
                ws_alloc = pool_malloc(default_pool_of(dev), self.workspace_size, s)
                wptr = ws_alloc.ptr
            else:
                wptr = self._user_workspace(workspace, dev, s)
        L = <OpLaunch*>c_malloc(sizeof(OpLaunch))
        if L == NULL:
            raise MemoryError()
        memcpy(&L.call, &self.call, sizeof(paddle_rt_op_call))
        if attrs != NULL:
            memcpy(L.call.attrs, attrs, sizeof(L.call.attrs))
        L.call.out.data = <void*>out.data
        for i in range(n):
            L.call.inputs[i].data = <void*>(<Tensor>ins[i]).data
        L.call.workspace = <void*>wptr
        L.call.workspace_size = self.workspace_size
        L.call.device = dev.cdev()
        L.call.stream = s.ctx.pstream if s.ctx != NULL else NULL
        L.kernel = self.kernel
        L.hook = self.hook
        L.plugin_kernel = self.plugin_kernel
        L.name = self._cname
        try:
            pos = s.enqueue(_run_op, L, 0,
                            PRT_OP_DROPPABLE | (0 if (self.plugin_kernel or self.hook) else PRT_OP_NEEDS_IDLE)
                            | prt_op_kind(PRT_OPK_OPERATOR), out.numel() * prt_dtype_size(out.dtype_code))
        except BaseException:
            c_free(L)
            raise
        if ws_alloc is not None:
            pool_free(ws_alloc, s)
        out.storage.note_writer(s, pos)
        out.storage.used_on(s)
        for i in range(n):
            (<Tensor>ins[i]).storage.used_on(s)
            if self.written & (1 << i):
                (<Tensor>ins[i]).storage.note_writer(s, pos)
        if trace_mask & PRT_TRACE_STREAMS:
            trace_label_op(s.ctx.core.tag, pos, {
                "name": self.name, "dtype": dtype_name(self.call.dtype),
                "shapes": [out.shape] + [(<Tensor>x).shape for x in ins]})
        return pos

    cdef int _check_written(self, tuple ins, Device dev) except -1:
        """A written input overlaps no other operand, unless it is the same elements (and the op not exclusive)."""
        cdef int i, j, n = len(ins)
        cdef Tensor w, t
        for i in range(n):
            if not self.written & (1 << i):
                continue
            w = ins[i]
            for j in range(n):
                t = ins[j]
                if j == i or not _overlap(w, t):
                    continue
                if (self.written & (1 << j)) or self.exclusive or not (t.data == w.data and w.same_layout(t)):
                    raise errors.InvalidArgument(
                        f"{dev}: operator {self.name}: input {i} (an output too) overlaps input {j}"
                        + ("" if self.exclusive or self.written & (1 << j) else
                           " without being the same elements (in place needs the same address and layout)"))
        return 0

    cdef uintptr_t _user_workspace(self, object workspace, Device dev, Stream s) except? 0:
        if isinstance(workspace, Tensor):
            size = (<Tensor>workspace).nbytes
            (<Tensor>workspace).storage.used_on(s)
            ptr = (<Tensor>workspace).data
            wdev = (<Tensor>workspace).storage.device
        elif isinstance(workspace, Allocation):
            size = (<Allocation>workspace).size
            ptr = (<Allocation>workspace).ptr
            wdev = (<Allocation>workspace).device
            if not (<Allocation>workspace)._own_stream(s):
                workspace.record_stream(s)
        else:
            raise errors.InvalidArgument(f"{dev}: operator {self.name}: workspace must be an Allocation or a Tensor, "
                                         f"not {type(workspace).__name__}")
        if wdev is not dev:
            raise errors.InvalidArgument(f"{dev}: operator {self.name}: the workspace is on {wdev}")
        if size < self.workspace_size:
            raise errors.InvalidArgument(f"{dev}: operator {self.name}: the workspace has {size} bytes, the "
                                         f"descriptor needs workspace_size = {self.workspace_size}")
        return ptr

    cdef tuple _operands(self, object out, tuple ins, Stream s):
        cdef Device dev = self.handle.device
        cdef TensorDesc want
        cdef int64_t extent
        cdef int i
        if len(ins) != self.call.n_inputs:
            raise errors.InvalidArgument(f"{dev}: operator {self.name} takes {self.call.n_inputs} inputs after out, "
                                         f"not {len(ins)}")
        res = []
        for i, x in enumerate((out,) + ins):
            if isinstance(x, Tensor):
                res.append(x)
                continue
            want = self.out_desc if i == 0 else <TensorDesc>self.in_descs[i - 1]
            what = "out" if i == 0 else f"input {i - 1}"
            if isinstance(x, Allocation):
                if (<Allocation>x).device is not dev:
                    raise errors.InvalidArgument(f"{dev}: operator {self.name}: {what} is an allocation on "
                                                 f"{(<Allocation>x).device}")
                _check_span(dev, self.name, what, want, (<Allocation>x).size, "the allocation has")
                if not (<Allocation>x)._own_stream(s):
                    x.record_stream(s)
                res.append(tensor_at(dev, want, (<Allocation>x).ptr))
            elif isinstance(x, int) and not isinstance(x, bool):
                # a raw address is trusted no further than the live allocation of dev it points into
                if x <= 0 or x >= (1 << 64):
                    raise errors.InvalidArgument(f"{dev}: operator {self.name}: {what} is the address {x}")
                extent = raw_live_extent(dev, KIND_DEVICE, <uintptr_t>x)
                if extent < 0:
                    raise errors.InvalidArgument(
                        f"{dev}: operator {self.name}: {what} address {x:#x} is not inside a live allocation on "
                        f"{dev} (raw addresses must point into memory paddle_rt allocated)")
                _check_span(dev, self.name, what, want, extent,
                            f"{extent} bytes lie between address {x:#x} and the end of its allocation; it has")
                res.append(tensor_at(dev, want, <uintptr_t>x))
            else:
                raise errors.InvalidArgument(f"{dev}: operator {self.name}: {what} must be a paddle_rt Tensor, an "
                                             f"Allocation or a device address (int), not {type(x).__name__}")
        return res[0], tuple(res[1:])

    def __call__(self, out, *inputs, workspace=None, stream=None):
        """``desc(out, *inputs, workspace=None, stream=None)``: operands are Tensors, or (InfiniOP's calling shape)
        Allocations or raw device addresses (ints) laid out as the descriptor's TensorDescs. An Allocation is checked
        to hold the layout; a raw address must point into a live allocation paddle_rt made on the device, and the
        layout must fit between it and that allocation's end. A raw address's memory is not tracked: synchronize the
        stream before reading it."""
        cdef Stream s = op_stream(self.handle.device, stream)
        cdef Py_ssize_t i
        cdef tuple ins = inputs
        cdef bint raw = not isinstance(out, Tensor)
        if not raw:
            for i in range(PyTuple_GET_SIZE(ins)):
                if not isinstance(<object>PyTuple_GET_ITEM(ins, i), Tensor):
                    raw = True
                    break
        if raw:
            out, inputs = self._operands(out, inputs, s)
        self.launch(out, inputs, workspace, s, NULL)
        return out

    def destroy(self):
        """End the descriptor (InfiniOP's Destroy): later calls raise InvalidArgument."""
        self.destroyed = True

    @property
    def out_shape(self):
        return self.out_desc.shape

    def __repr__(self):
        return (f"<{type(self).__name__} {self.name} {dtype_name(self.call.dtype)} out {self.out_desc.shape} on "
                f"{self.handle.device} ({self.kernel_source} kernel, workspace {self.workspace_size} B)>")
