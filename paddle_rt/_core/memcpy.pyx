"""Copies and memset, synchronous and stream-ordered, of every kind (InfiniRT's H2H/H2D/D2H/D2D, plus P2P).

Endpoints are Allocations (any object with ``ptr``, ``size`` and a paddle_rt ``device``; ``pinned``/host ones count
as host memory), host buffers (the buffer protocol, C-contiguous; writable for a destination) or raw integer
addresses (they need ``kind``; their device is ``device`` or the stream's; each must lie inside a live allocation
paddle_rt made, and is trusted no further than that allocation's end). The kind is inferred when the endpoints
tell it; an explicit kind that contradicts them is an error. Fallbacks follow Paddle: a missing async hook becomes the
synchronous hook run in order on the stream's worker; a missing p2p hook stages through host memory; a missing
``device_memory_set`` fills a host buffer and copies it h2d.

A small host-to-device copy from a Python buffer (at most ``STAGE_MAX_BYTES``) is staged at enqueue, as CUDA does
for pageable memory: the bytes are copied into a buffer the queued copy owns and the Python buffer is released at
once, on the submitting thread. The stream's worker then never needs the GIL for it (a GIL hand-off between the two
threads cost ~80 us per copy), and the caller may reuse its array as soon as ``memcpy_async`` returns."""
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memmove, memset as c_memset
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBUF_SIMPLE
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF

from paddle_rt._core.checked cimport PRT_MAX_BYTES, prt_add_size
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_Stream, C_Status, C_SUCCESS, C_WARNING, C_FAILED
from paddle_rt._core.device cimport Device, resolve_device, check_status
from paddle_rt._core.allocation cimport Allocation
from paddle_rt._core.allocator cimport raw_live_extent, KIND_DEVICE, KIND_HOST
from paddle_rt._core.stream cimport (
    Stream, StreamCtx, current_stream, record_plugin_error, stream_ctx_plugin_sync,
)
from paddle_rt._core.includes.stream_support cimport (
    PRT_OP_NEEDS_IDLE, PRT_OP_DROPPABLE, PRT_POS_DROPPED, prt_op_kind, PRT_OPK_MEMCPY_H2H, PRT_OPK_MEMCPY_H2D,
    PRT_OPK_MEMSET,
)

from paddle_rt._core import errors

# Host-to-device copies from a Python buffer up to this size are staged at enqueue (see _stages).
STAGE_MAX_BYTES = 64 * 1024
cdef size_t _STAGE_MAX = STAGE_MAX_BYTES

# InfiniRT's infinirtMemcpyKind values, plus P2P (two devices).
MEMCPY_KINDS = {"H2H": 0, "H2D": 1, "D2H": 2, "D2D": 3, "P2P": 4}
_KIND_NAMES = {v: k for k, v in MEMCPY_KINDS.items()}
cdef enum:
    K_H2H = 0
    K_H2D = 1
    K_D2H = 2
    K_D2D = 3
    K_P2P = 4
    K_SET = 5
    K_SET_HOST = 6


# -- plain hook calls, no GIL; return the failing status and set *call --------------------------------------------
cdef C_Status _sync_copy(int kind, C_DeviceInterface* f, C_Device d, void* dst, const void* src, size_t n,
                         C_DeviceInterface* sf, C_Device sd, const char** call) noexcept nogil:
    cdef C_Status st = C_SUCCESS
    cdef void* tmp
    if n == 0:
        return C_SUCCESS
    if kind == K_H2H:
        memmove(dst, src, n)
        return C_SUCCESS
    f.set_device(d)
    if kind == K_H2D:
        call[0] = "memory_copy_h2d"
        return f.memory_copy_h2d(d, dst, src, n)
    if kind == K_D2H:
        call[0] = "memory_copy_d2h"
        return f.memory_copy_d2h(d, dst, src, n)
    if kind == K_D2D:
        call[0] = "memory_copy_d2d"
        return f.memory_copy_d2d(d, dst, src, n)
    # P2P
    if f == sf and f.memory_copy_p2p != NULL:
        call[0] = "memory_copy_p2p"
        return f.memory_copy_p2p(d, sd, dst, src, n)
    tmp = malloc(n)
    if tmp == NULL:
        call[0] = "malloc (p2p staging buffer)"
        return C_FAILED
    sf.set_device(sd)
    call[0] = "memory_copy_d2h"
    st = sf.memory_copy_d2h(sd, tmp, src, n)
    if st == C_SUCCESS or st == C_WARNING:
        f.set_device(d)
        call[0] = "memory_copy_h2d"
        st = f.memory_copy_h2d(d, dst, tmp, n)
    free(tmp)
    return st


cdef C_Status _sync_set(C_DeviceInterface* f, C_Device d, void* ptr, unsigned char value, size_t n,
                        const char** call) noexcept nogil:
    cdef void* tmp
    cdef C_Status st
    if n == 0:
        return C_SUCCESS
    f.set_device(d)
    if f.device_memory_set != NULL:
        call[0] = "device_memory_set"
        return f.device_memory_set(d, ptr, value, n)
    tmp = malloc(n)
    if tmp == NULL:
        call[0] = "malloc (memset staging buffer)"
        return C_FAILED
    c_memset(tmp, value, n)
    call[0] = "memory_copy_h2d"
    st = f.memory_copy_h2d(d, ptr, tmp, n)
    free(tmp)
    return st


cdef int _copy_op_run(void* p, void* arg, uint64_t aux, uint64_t pos) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    cdef CopyOp* op = <CopyOp*>arg
    cdef C_Status st = C_SUCCESS
    cdef const char* call = "copy"
    cdef int r = 0
    if pos & PRT_POS_DROPPED:
        # dropped (close(wait=False), exit): release what the copy holds, never run it
        if op.keep != NULL or op.nbufs:
            with gil:
                _release_op(op)
        free(op.stage)
        free(op)
        return 0
    if op.kind == K_SET_HOST:
        c_memset(op.dst, op.value, op.n)
    elif op.kind == K_SET:
        st = _sync_set(op.iface, op.dev, op.dst, op.value, op.n, &call)
    elif op.use_async:
        op.iface.set_device(op.dev)
        if op.kind == K_H2D:
            call = "async_memory_copy_h2d"
            st = op.iface.async_memory_copy_h2d(op.dev, ctx.pstream, op.dst, op.src, op.n)
        elif op.kind == K_D2H:
            call = "async_memory_copy_d2h"
            st = op.iface.async_memory_copy_d2h(op.dev, ctx.pstream, op.dst, op.src, op.n)
        elif op.kind == K_D2D:
            call = "async_memory_copy_d2d"
            st = op.iface.async_memory_copy_d2d(op.dev, ctx.pstream, op.dst, op.src, op.n)
        else:
            call = "async_memory_copy_p2p"
            st = op.iface.async_memory_copy_p2p(op.dev, op.src_dev, ctx.pstream, op.dst, op.src, op.n)
        if st == C_SUCCESS:
            r = 1
    else:
        st = _sync_copy(op.kind, op.iface, op.dev, op.dst, op.src, op.n, op.src_iface, op.src_dev, &call)
    if st != C_SUCCESS and st != C_WARNING:
        record_plugin_error(ctx, pos, call, st)
        r = -1
    if op.keep != NULL or op.nbufs or op.stage != NULL:
        if r == 1:
            # host memory must stay valid until the plugin ran the copy
            stream_ctx_plugin_sync(ctx)
            r = 0
        free(op.stage)
        op.stage = NULL
        if op.keep != NULL or op.nbufs:
            with gil:
                _release_op(op)
    free(op)
    return r


cdef void _free_op(CopyOp* op) noexcept:
    """Release what op holds and free it (the submitting side, with the GIL)."""
    _release_op(op)
    free(op.stage)
    free(op)


cdef void _release_op(CopyOp* op) noexcept:
    cdef int i
    for i in range(op.nbufs):
        PyBuffer_Release(&op.bufs[i])
    op.nbufs = 0
    if op.keep != NULL:
        Py_DECREF(<object>op.keep)
        op.keep = NULL


# -- endpoints ---------------------------------------------------------------------------------------------------------
cdef class _End:
    cdef int kind            # 0 raw, 1 device memory, 2 host memory
    cdef bint unchecked      # a raw address or an Allocation-like object that is not an Allocation: bounded by
                             # the live allocation it points into (_bound_unchecked)
    cdef uintptr_t ptr
    cdef object size         # None when unknown
    cdef object limit        # unchecked ends: bytes from ptr to the end of the live allocation holding it
    cdef str limit_where     # ... and where that allocation is
    cdef Device device
    cdef object obj


cdef _End _endpoint(object obj, bint writable, CopyOp* op, str what, str call):
    cdef _End e = _End.__new__(_End)
    cdef Py_buffer* buf
    e.obj = obj
    if isinstance(obj, bool):
        raise errors.InvalidArgument(f"{call}: {what} is a bool, not memory")
    if isinstance(obj, int):
        if obj <= 0 or obj >= (1 << 64):
            raise errors.InvalidArgument(f"{call}: {what} address {obj:#x} is not a valid pointer")
        e.kind = 0
        e.unchecked = True
        e.ptr = obj
        e.size = None
        return e
    dev = getattr(obj, "device", None)
    if isinstance(dev, Device) and hasattr(obj, "ptr") and hasattr(obj, "size"):
        if getattr(obj, "freed", False):
            raise errors.InvalidArgument(f"{dev!r}: {call}: {what} {obj!r} was freed")
        e.ptr = obj.ptr
        e.size = int(obj.size)
        e.device = dev
        e.kind = 2 if (getattr(obj, "pinned", False) or getattr(obj, "memory_kind", None) == "host") else 1
        e.unchecked = not isinstance(obj, Allocation)
        return e
    buf = &op.bufs[op.nbufs]
    try:
        PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if writable else PyBUF_SIMPLE))
    except BufferError as exc:
        raise errors.InvalidArgument(f"{call}: {what} {type(obj).__name__} is not a usable host buffer "
                                     f"({'writable, ' if writable else ''}C-contiguous): {exc}") from None
    except TypeError:
        raise errors.InvalidArgument(f"{call}: {what} must be an Allocation, a host buffer or an int address, "
                                     f"not {type(obj).__name__}") from None
    op.nbufs += 1
    e.kind = 2
    e.ptr = <uintptr_t>buf.buf
    e.size = buf.len
    return e


cdef int _kind_of(object kind, str call) except -2:
    if kind is None:
        return -1
    if isinstance(kind, str) and kind.upper() in MEMCPY_KINDS:
        return MEMCPY_KINDS[kind.upper()]
    if isinstance(kind, int) and not isinstance(kind, bool) and 0 <= kind <= 4:
        return kind
    raise errors.InvalidArgument(f"{call}: unknown kind {kind!r} (use one of {', '.join(MEMCPY_KINDS)} or 0..4)")


cdef CopyOp* _new_op() except NULL:
    cdef CopyOp* op = <CopyOp*>malloc(sizeof(CopyOp))
    if op == NULL:
        raise MemoryError()
    c_memset(op, 0, sizeof(CopyOp))
    return op


cdef object _plan_copy(CopyOp* op, object dst, object src, object nbytes, object kind, Device default_dev,
                       str call):
    """Resolve the endpoints, the kind, the size and the devices into op (buffers taken are released by the caller
    on error). Returns the device whose hooks run the copy (the destination's for P2P; None for H2H)."""
    cdef _End d = _endpoint(dst, True, op, "dst", call)
    cdef _End s = _endpoint(src, False, op, "src", call)
    cdef int k = _kind_of(kind, call)
    cdef int inferred = -1
    if d.kind and s.kind:
        if d.kind == 2 and s.kind == 2:
            inferred = K_H2H
        elif d.kind == 1 and s.kind == 2:
            inferred = K_H2D
        elif d.kind == 2 and s.kind == 1:
            inferred = K_D2H
        else:
            inferred = K_D2D if d.device is s.device else K_P2P
        if k >= 0 and k != inferred:
            raise errors.InvalidArgument(
                f"{call}: kind {_KIND_NAMES[k]} contradicts the arguments (dst {_where(d)}, src {_where(s)}: "
                f"{_KIND_NAMES[inferred]})")
        k = inferred
    else:
        if k < 0:
            raise errors.InvalidArgument(f"{call}: a raw integer address needs an explicit kind "
                                         f"({', '.join(MEMCPY_KINDS)})")
        want_dst = 2 if k in (K_H2H, K_D2H) else 1
        want_src = 2 if k in (K_H2H, K_H2D) else 1
        for e, want, what in ((d, want_dst, "dst"), (s, want_src, "src")):
            if (<_End>e).kind and (<_End>e).kind != want:
                raise errors.InvalidArgument(f"{call}: kind {_KIND_NAMES[k]} needs {what} in "
                                             f"{'host' if want == 2 else 'device'} memory, got {_where(e)}")
    # devices
    dev = None
    for e in (d, s):
        if (<_End>e).kind == 1 and dev is None:
            dev = (<_End>e).device
    if dev is None and k != K_H2H:
        dev = default_dev
    if k == K_P2P:
        if d.device is None or s.device is None:
            if d.device is None:
                d.device = default_dev
            if s.device is None:
                s.device = default_dev
        op.iface = (<Device>d.device).iface
        op.dev = (<Device>d.device).cdev()
        op.src_iface = (<Device>s.device).iface
        op.src_dev = (<Device>s.device).cdev()
        dev = d.device
    elif k != K_H2H:
        for e in (d, s):
            if (<_End>e).kind == 1 and (<_End>e).device is not dev:
                raise errors.InvalidArgument(f"{dev!r}: {call}: memory of {(<_End>e).device!r} on a "
                                             f"{_KIND_NAMES[k]} copy of {dev!r}")
        op.iface = (<Device>dev).iface
        op.dev = (<Device>dev).cdev()
    for e, what, host in ((d, "dst", k in (K_H2H, K_D2H)), (s, "src", k in (K_H2H, K_H2D))):
        if (<_End>e).unchecked:
            _bound_unchecked(<_End>e, host, (<_End>e).device if (<_End>e).device is not None else dev, what, call)
    # size
    sizes = [x for x in (d.size, s.size) if x is not None]
    if nbytes is None:
        if not sizes:
            raise errors.InvalidArgument(f"{call}: nbytes is needed with raw addresses")
        if len(sizes) == 2 and sizes[0] != sizes[1]:
            raise errors.InvalidArgument(f"{call}: dst has {sizes[0]} bytes and src {sizes[1]}: give nbytes")
        n = sizes[0]
    else:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise errors.InvalidArgument(f"{call}: nbytes must be a non-negative int, not {nbytes!r}")
        n = nbytes
        for x, what in ((d.size, "dst"), (s.size, "src")):
            if x is not None and n > x:
                raise errors.InvalidArgument(f"{call}: nbytes={n} is larger than {what} ({x} bytes)")
    _check_limit(d, n, "dst", call)
    _check_limit(s, n, "src", call)
    _check_range(d, n, "dst", call)
    _check_range(s, n, "src", call)
    op.kind = k
    op.dst = <void*>d.ptr
    op.src = <const void*>s.ptr
    op.n = n
    return dev if k != K_H2H else None


cdef int _check_range(_End e, object n, str what, str call) except -1:
    """[ptr, ptr + n) is an address range (checked arithmetic): n at most PRT_MAX_BYTES, no wrap past 2**64."""
    cdef size_t end
    if n > PRT_MAX_BYTES:
        raise errors.InvalidArgument(f"{call}: nbytes = {n} is larger than any memory ({what} {_where(e)})")
    if prt_add_size(<size_t>e.ptr, <size_t>n, &end):
        raise errors.InvalidArgument(f"{call}: {what} address {e.ptr:#x} + nbytes {n} wraps around the address "
                                     f"space")
    return 0


cdef int _bound_unchecked(_End e, bint host, object dev, str what, str call) except -1:
    """A raw address (or an object that only looks like an Allocation) is trusted no further than the live allocation
    it points into: e.limit becomes the bytes from it to that allocation's end, and a size beyond it is refused
    (_check_limit). An address inside no live allocation of paddle_rt's (on `dev`; for host memory, pinned host memory of
    any device) is refused: the copy would read or write memory nobody owns."""
    cdef int64_t n = raw_live_extent(None if host else dev, KIND_HOST if host else KIND_DEVICE, e.ptr)
    if n >= 0:
        e.limit = n
        e.limit_where = "pinned host memory" if host else f"on {dev!r}"
        return 0
    from paddle_rt._core.allocator import owner_of
    owner = owner_of(e.ptr)
    where = "pinned host memory" if host else f"memory on {dev!r}"
    found = f"; it lies in memory of {owner}" if owner else ""
    raise errors.InvalidArgument(
        f"{'' if host else repr(dev) + ': '}{call}: {what} address {e.ptr:#x} is not inside a live allocation "
        f"({where}){found} (raw addresses must point into memory paddle_rt allocated; pass host memory as a buffer "
        f"such as a numpy array)")


cdef int _check_limit(_End e, object n, str what, str call) except -1:
    if e.limit is not None and n > e.limit:
        raise errors.InvalidArgument(f"{call}: nbytes={n} is larger than {what}: {e.limit} bytes lie between address "
                                     f"{e.ptr:#x} and the end of the allocation holding it ({e.limit_where})")
    return 0


cdef str _where(_End e):
    if e.kind == 1:
        return f"device memory of {e.device!r}"
    if e.kind == 2:
        return "host memory"
    return "a raw address"


cdef int _check_hooks(CopyOp* op, str call, bint for_async) except -1:
    cdef C_DeviceInterface* f = op.iface
    if op.kind == K_H2H or op.n == 0:
        return 0
    need = {K_H2D: ("memory_copy_h2d", f.memory_copy_h2d != NULL),
            K_D2H: ("memory_copy_d2h", f.memory_copy_d2h != NULL),
            K_D2D: ("memory_copy_d2d", f.memory_copy_d2d != NULL)}
    if op.kind == K_P2P:
        ok = (f == op.src_iface and f.memory_copy_p2p != NULL) or (
            op.src_iface.memory_copy_d2h != NULL and f.memory_copy_h2d != NULL)
        if not ok and not (for_async and op.use_async):
            raise errors.NotSupportedError(f"{call}: P2P copy: the plugin has neither memory_copy_p2p nor "
                                           f"memory_copy_d2h + memory_copy_h2d")
        return 0
    if op.kind == K_SET:
        if f.device_memory_set == NULL and f.memory_copy_h2d == NULL:
            raise errors.NotSupportedError(f"{call}: the plugin has neither device_memory_set nor "
                                           f"memory_copy_h2d")
        return 0
    name, ok = need[op.kind]
    if not ok and not (for_async and op.use_async):
        raise errors.NotSupportedError(f"{call}: the plugin has no {name} (nor its async form)")
    return 0


cdef bint _async_hook(CopyOp* op) noexcept:
    cdef C_DeviceInterface* f = op.iface
    if op.kind == K_H2D:
        return f.async_memory_copy_h2d != NULL
    if op.kind == K_D2H:
        return f.async_memory_copy_d2h != NULL
    if op.kind == K_D2D:
        return f.async_memory_copy_d2d != NULL
    if op.kind == K_P2P:
        return f == op.src_iface and f.async_memory_copy_p2p != NULL
    return False


def memcpy(dst, src, nbytes=None, kind=None, device=None):
    """Copy ``nbytes`` (default: the endpoints' size) from ``src`` to ``dst`` and return when done. ``device`` is the
    device of raw device addresses (default: the current device). Does not wait for streams."""
    cdef CopyOp* op = _new_op()
    cdef C_Status st = C_SUCCESS
    cdef const char* cname = "copy"
    cdef Device dev
    try:
        dev = _plan_copy(op, dst, src, nbytes, kind, resolve_device(device), "memcpy")
        if op.kind != K_H2H and op.n:
            dev.activate()
            if _missing_sync(op):
                # only the async form exists: run it on the default stream and wait
                memcpy_async(dst, src, op.n, default_stream_of(dev), _KIND_NAMES[op.kind])
                default_stream_of(dev).synchronize()
                return
            _check_hooks(op, f"{dev!r}: memcpy", False)
        with nogil:
            st = _sync_copy(op.kind, op.iface, op.dev, op.dst, op.src, op.n, op.src_iface, op.src_dev, &cname)
        if st != C_SUCCESS and st != C_WARNING:
            raise errors.PluginError(repr(dev), cname.decode(), st, "memcpy")
    finally:
        _release_op(op)
        free(op)


cdef bint _missing_sync(CopyOp* op):
    cdef C_DeviceInterface* f = op.iface
    if op.kind == K_H2D:
        return f.memory_copy_h2d == NULL and f.async_memory_copy_h2d != NULL and f.create_stream != NULL
    if op.kind == K_D2H:
        return f.memory_copy_d2h == NULL and f.async_memory_copy_d2h != NULL and f.create_stream != NULL
    if op.kind == K_D2D:
        return f.memory_copy_d2d == NULL and f.async_memory_copy_d2d != NULL and f.create_stream != NULL
    return False


def default_stream_of(dev):
    from paddle_rt._core.stream import default_stream
    return default_stream(dev)


def memcpy_async(dst, src, nbytes=None, stream=None, kind=None):
    """Enqueue the copy on ``stream`` (default: the current stream of the current device) and return at once. Raw
    device addresses belong to the stream's device. Host buffers stay referenced until the copy ran."""
    cdef Stream s = current_stream() if stream is None else stream
    cdef CopyOp* op = _new_op()
    s._check_open()
    try:
        _plan_copy(op, dst, src, nbytes, kind, s.device, "memcpy_async")
        if op.kind == K_P2P:
            if s.device.cdev() != op.dev and s.device.cdev() != op.src_dev:
                raise errors.InvalidArgument(f"{s.device!r}: memcpy_async: a P2P copy must run on a stream of "
                                             f"one of its two devices")
        elif op.kind != K_H2H and s.device.cdev() != op.dev:
            raise errors.InvalidArgument(f"{s.device!r}: memcpy_async: the memory is on another device than the "
                                         f"stream {s.name}")
        _submit(s, op, dst, src, "memcpy_async")
    except BaseException:
        _free_op(op)
        raise


cdef int _submit(Stream s, CopyOp* op, object dst, object src, str call) except -1:
    """Enqueue a planned copy on s (on error the caller frees op; once enqueued, the worker does)."""
    s._check_open()          # planning ran Python code (buffers): another thread may have closed s meanwhile
    # the plugin's async hook only when paddle_rt can also wait for the plugin stream afterwards
    op.use_async = s.ctx.has_pstream and _async_hook(op) and (
        s.ctx.iface.synchronize_stream != NULL or s.ctx.iface.synchronize_device != NULL)
    _check_hooks(op, f"{s.device!r}: {call}", True)
    cdef bint planned_async
    if _stages(op):
        _stage_source(op)
        if op.iface.memory_copy_h2d != NULL:
            # an idle stream copies the few staged bytes at once on this thread, through the synchronous hook: no
            # round trip through the worker and back (a busy stream queues the copy as planned)
            planned_async = op.use_async
            op.use_async = False
            if s.run_now_if_idle(_copy_op_run, op, 0, PRT_OP_NEEDS_IDLE | prt_op_kind(PRT_OPK_MEMCPY_H2D), op.n):
                return 0     # ran (and freed op)
            op.use_async = planned_async
    if op.nbufs:
        keep = (dst, src)
        Py_INCREF(keep)
        op.keep = <PyObject*>keep
    # the profiler's operation kinds follow K_H2H..K_P2P in order
    s.enqueue(_copy_op_run, op, 0, PRT_OP_DROPPABLE | (0 if op.use_async else PRT_OP_NEEDS_IDLE) |
              prt_op_kind(PRT_OPK_MEMCPY_H2H + op.kind), op.n)
    return 0


cdef int upload_async(Stream s, uintptr_t dst, object src, size_t n) except -1:
    """Enqueue the copy of n bytes of the C-contiguous host buffer src to the device address dst of s's device (the
    upload of paddle_rt.tensor(): no endpoint inference; staged when small, like memcpy_async)."""
    cdef CopyOp* op = _new_op()
    s._check_open()
    try:
        _endpoint(src, False, op, "src", "tensor upload")
        if <size_t>op.bufs[0].len < n:
            raise errors.InvalidArgument(f"{s.device!r}: tensor upload: the host buffer has {op.bufs[0].len} bytes, "
                                         f"{n} needed")
        op.kind = K_H2D
        op.dst = <void*>dst
        op.src = <const void*>op.bufs[0].buf
        op.n = n
        op.iface = s.device.iface
        op.dev = s.device.cdev()
        _submit(s, op, None, src, "tensor upload")
    except BaseException:
        _free_op(op)
        raise
    return 0


cdef bint _stages(CopyOp* op) noexcept:
    """Policy: stage a host-to-device copy whose only host buffer is a small Python source (pageable memory the
    caller may reuse at once); Allocations (pinned or device memory) and raw addresses are the caller's to keep."""
    return op.kind == K_H2D and op.nbufs == 1 and 0 < op.n <= _STAGE_MAX


cdef int _stage_source(CopyOp* op) except -1:
    """Copy the source into a buffer the op owns and release the Python buffer now (the submitting thread)."""
    op.stage = malloc(op.n)
    if op.stage == NULL:
        raise MemoryError()
    memmove(op.stage, op.src, op.n)
    op.src = <const void*>op.stage
    _release_op(op)
    return 0


cdef object _plan_set(CopyOp* op, object dst, object value, object nbytes, Device default_dev, str call):
    cdef _End d
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise errors.InvalidArgument(f"{call}: value must be a byte (0..255), not {value!r}")
    d = _endpoint(dst, True, op, "dst", call)
    if d.unchecked:
        _bound_unchecked(d, d.kind == 2, d.device if d.device is not None else default_dev, "dst", call)
    if nbytes is None:
        if d.size is None:
            raise errors.InvalidArgument(f"{call}: nbytes is needed with a raw address")
        n = d.size
    else:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise errors.InvalidArgument(f"{call}: nbytes must be a non-negative int, not {nbytes!r}")
        if d.size is not None and nbytes > d.size:
            raise errors.InvalidArgument(f"{call}: nbytes={nbytes} is larger than dst ({d.size} bytes)")
        n = nbytes
    _check_limit(d, n, "dst", call)
    _check_range(d, n, "dst", call)
    op.dst = <void*>d.ptr
    op.n = n
    op.value = value
    if d.kind == 2:
        op.kind = K_SET_HOST   # plain host memory
        return None
    dev = d.device if d.kind == 1 else default_dev
    op.kind = K_SET
    op.iface = (<Device>dev).iface
    op.dev = (<Device>dev).cdev()
    return dev


def memset(dst, value, nbytes=None, device=None):
    """Set ``nbytes`` (default: dst's size) bytes of ``dst`` to ``value`` and return when done. ``device`` is the
    device of a raw address (default: the current device)."""
    cdef CopyOp* op = _new_op()
    cdef C_Status st = C_SUCCESS
    cdef const char* cname = "device_memory_set"
    try:
        dev = _plan_set(op, dst, value, nbytes, resolve_device(device), "memset")
        if dev is None:
            with nogil:
                c_memset(op.dst, op.value, op.n)
            return
        (<Device>dev).activate()
        _check_hooks(op, f"{dev!r}: memset", False)
        with nogil:
            st = _sync_set(op.iface, op.dev, op.dst, op.value, op.n, &cname)
        if st != C_SUCCESS and st != C_WARNING:
            raise errors.PluginError(repr(dev), cname.decode(), st, "memset")
    finally:
        _release_op(op)
        free(op)


def memset_async(dst, value, nbytes=None, stream=None):
    """Enqueue a memset on ``stream`` (default: the current stream). The ABI has no asynchronous memset: the
    stream's worker runs ``device_memory_set`` when the stream reaches it."""
    cdef Stream s = current_stream() if stream is None else stream
    cdef CopyOp* op = _new_op()
    s._check_open()
    try:
        if _plan_set(op, dst, value, nbytes, s.device, "memset_async") is not None:
            if s.device.cdev() != op.dev:
                raise errors.InvalidArgument(f"{s.device!r}: memset_async: the memory is on another device than "
                                             f"the stream {s.name}")
            _check_hooks(op, f"{s.device!r}: memset_async", True)
        if op.nbufs:
            keep = (dst,)
            Py_INCREF(keep)
            op.keep = <PyObject*>keep
        s.enqueue(_copy_op_run, op, 0, PRT_OP_DROPPABLE | PRT_OP_NEEDS_IDLE | prt_op_kind(PRT_OPK_MEMSET), op.n)
    except BaseException:
        _release_op(op)
        free(op)
        raise
