# cython: freethreading_compatible = False
"""Allocations and the memory API over the caching allocator (allocator.pyx): :class:`Allocation` (memory from
:func:`malloc`, with buffer-protocol, ``__array_interface__`` and DLPack export on host-addressable devices, and
``record_stream``), and the module functions that ``paddle_rt`` exports (malloc, free, raw_malloc, raw_free,
malloc_host, the memory_* figures, empty_cache, the configuration). The fast path serves from the allocator's cache
with the GIL held when its lock is free (``core_try_malloc``/``core_try_free``); otherwise the nogil core runs, with
the out-of-memory ladder's last step (deferred_free.malloc_waiting)."""
import os

cimport cython
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer
from cpython.ref cimport Py_INCREF, Py_DECREF
from cpython.exc cimport PyErr_Clear
from libc.stdint cimport uintptr_t, int64_t, SIZE_MAX, UINTPTR_MAX
from libc.stdlib cimport malloc as c_malloc, free as c_free
from libc.string cimport memset
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES

from paddle_rt._core.device cimport Device, resolve_device, raise_forked
from paddle_rt._core.plugin cimport process_forked
from paddle_rt._core.allocator cimport (
    AllocatorCore, DeviceAllocator, KIND_DEVICE, KIND_HOST, ST_ALLOCATED_BYTES, ST_RESERVED_BYTES, core_free,
    core_try_malloc, core_try_free, core_lookup, core_deferred_pending, allocator_of, existing_allocator,
    core_mark_owned, core_try_raw_free, core_raw_free,
)
from paddle_rt._core.deferred_free cimport free_after_streams, malloc_waiting
from paddle_rt._core.stream cimport Stream, current_stream_tag, stream_alloc_tag
from paddle_rt._core.includes.alloc_support cimport _long_as_ssize, PyErr_Occurred
from paddle_rt._core.checked cimport PRT_MAX_BYTES
from paddle_rt._core.includes.dlpack cimport prt_DLManagedTensor, kDLCPU, kDLUInt

from paddle_rt._core import errors
from paddle_rt._core import allocator as _allocator_mod
from paddle_rt._core import device as _device_mod

__all__ = [
    "Allocation", "malloc", "free", "raw_malloc", "raw_free", "malloc_host", "memory_stats", "memory_allocated",
    "memory_reserved", "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "reset_allocator", "empty_cache", "memory_snapshot", "set_allocator_config",
    "allocator_config",
]

cdef char* _FORMAT_B = "B"

# The allocator of the most recently named device (the module functions' fast path).
cdef Device _last_dev = None
cdef AllocatorCore* _last_core = NULL
cdef DeviceAllocator _last_alloc = None


cdef inline DeviceAllocator _dev_alloc(object device):
    global _last_dev, _last_core, _last_alloc
    if device is not None and device is _last_dev:
        return _last_alloc
    cdef Device dev = resolve_device(device)
    if dev is _last_dev:
        return _last_alloc
    a = allocator_of(dev, KIND_DEVICE)
    _last_dev = dev
    _last_alloc = a
    _last_core = (<DeviceAllocator>a).core
    return a



cdef size_t check_nbytes(object nbytes, str call, object device) except? 0:
    """A byte count from a user (malloc, malloc_async, malloc_host, the pools): an int in [0, PRT_MAX_BYTES]; a
    larger one that fits 64 bits is out of memory (OutOfMemoryError); a negative or wider one InvalidArgument naming
    `call`'s nbytes (a non-int: TypeError)."""
    where = f"{device}: {call}" if device is not None else call
    if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__"):
        raise TypeError(f"{where}: nbytes must be an int, not {type(nbytes).__name__}")
    n = nbytes.__index__()
    if n < 0:
        raise errors.InvalidArgument(f"{where}: nbytes must not be negative, got {n}")
    if n >= (1 << 64):
        raise errors.InvalidArgument(f"{where}: nbytes = {n} does not fit a 64-bit size")
    if n > PRT_MAX_BYTES:
        raise errors.OutOfMemoryError(f"{where}: {n} bytes is more memory than any device holds",
                                      device=str(device) if device is not None else None, requested=n, call=call)
    return <size_t>n


cdef inline uintptr_t _check_ptr(object ptr) except? 0:
    if not isinstance(ptr, int) or isinstance(ptr, bool):
        raise TypeError(f"expected a pointer as int, got {type(ptr).__name__}")
    if ptr <= 0 or ptr > <object>SIZE_MAX:
        raise errors.InvalidArgument(f"0x{ptr:x} is not a valid pointer" if ptr >= 0 else f"{ptr} is not a pointer")
    return ptr


cdef inline uintptr_t _tag_of(Stream s) noexcept:
    return stream_alloc_tag(s)


# The allocator tag of malloc's `stream` argument. Inline for the common None (a tag is an address or 0, never
# UINTPTR_MAX, so the error value costs no PyErr_Occurred() check on the hot path).
cdef inline uintptr_t _stream_arg(DeviceAllocator a, object stream) except? <uintptr_t>UINTPTR_MAX:
    if stream is None:
        return 0 if a.core.kind == KIND_HOST else current_stream_tag(a.device)
    return _stream_arg_slow(a, stream)


cdef uintptr_t _stream_arg_slow(DeviceAllocator a, object stream) except? <uintptr_t>UINTPTR_MAX:
    if isinstance(stream, Stream):
        if (<Stream>stream).device is not a.device:
            raise errors.InvalidArgument(f"{a.device}: malloc: {(<Stream>stream).name} belongs to "
                                         f"{(<Stream>stream).device}")
        (<Stream>stream)._check_open()
        return _tag_of(<Stream>stream)
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream <= <object>SIZE_MAX:
        raise errors.InvalidArgument(f"{a.device}: malloc: stream must be a Stream, None or an int tag, not "
                                     f"{stream!r}")
    return <uintptr_t>stream


@cython.freelist(64)
@cython.no_gc
cdef class Allocation:
    """Memory from :func:`malloc`: ``ptr`` (int), ``size`` (the requested bytes), ``device``. Freed by
    :meth:`free`, by leaving a ``with`` block, or when garbage-collected. On host-addressable devices it exports the
    buffer protocol (``memoryview(a)``, ``numpy.asarray(a)`` is a zero-copy uint8 view), ``__array_interface__`` and
    DLPack; views keep the Allocation alive and an explicit :meth:`free` while one is exported raises BufferError."""

    def __init__(self):
        raise TypeError("use paddle_rt.malloc(nbytes)")

    def __dealloc__(self):
        cdef AllocatorCore* c = self.core
        if not self._freed and c != NULL:
            self._freed = 1
            if self._recorded is not None:
                try:
                    free_after_streams(c, self.ptr, self._recorded)
                except BaseException:
                    pass
                return
            if core_try_free(c, self.ptr):
                return
            try:
                with nogil:
                    core_free(c, <void*>self.ptr)
            except BaseException:
                pass

    cdef int _release(self) except -1:
        if process_forked():
            raise_forked(self.device)
        if self._freed:
            raise errors.InvalidArgument(f"{self.device}: free of 0x{self.ptr:x}: the Allocation was already freed")
        if self.exports > 0:
            raise BufferError(f"{self.device}: cannot free 0x{self.ptr:x}: {self.exports} view(s) of it are still "
                              f"exported (release the memoryview/array first)")
        cdef AllocatorCore* c = self.core
        cdef void* p = <void*>self.ptr
        cdef list rec = self._recorded
        self._freed = 1
        if rec is not None:
            self._recorded = None
            return free_after_streams(c, self.ptr, rec)
        if not core_try_free(c, self.ptr):
            with nogil:
                core_free(c, p)
        return 0

    cdef bint _own_stream(self, object stream) except -1:
        return _tag_of(<Stream>stream) == self.stream_tag or \
            (self.stream_tag != 0 and (<Stream>stream).ctx != NULL and
             self.stream_tag == (<Stream>stream).ctx.core.tag)

    def record_stream(self, stream):
        """Mark the memory as used by work on ``stream`` (PyTorch's ``record_stream``): when it is freed, its reuse
        waits until ``stream`` has run everything submitted to it before the free (the block goes back to the
        allocator from ``stream``'s worker; until then it counts as allocated). Recording the stream the memory
        belongs to, or a closed stream, does nothing."""
        if process_forked():
            raise_forked(self.device)
        if not isinstance(stream, Stream):
            raise errors.InvalidArgument(f"{self.device}: record_stream of 0x{self.ptr:x}: expected a paddle_rt "
                                         f"Stream, not {type(stream).__name__}")
        cdef Stream st = <Stream>stream
        if self._freed:
            raise errors.InvalidArgument(f"{self.device}: record_stream of 0x{self.ptr:x}: the allocation was freed")
        if st.device is not self.device:
            raise errors.InvalidArgument(f"{self.device}: record_stream of 0x{self.ptr:x}: {st.name} belongs to "
                                         f"{st.device}")
        if st.closed:
            return                        # nothing of it can run after the free
        if self._own_stream(st):
            return
        if self._recorded is None:
            self._recorded = [st]
        elif st not in self._recorded:
            self._recorded.append(st)

    @property
    def recorded(self):
        """The streams given to :meth:`record_stream` (a tuple)."""
        return tuple(self._recorded or ())

    def free(self):
        """Give the memory back to the allocator (not to the device: it stays cached). After
        :meth:`record_stream`, it becomes reusable once every recorded stream has passed this point."""
        self._release()

    @property
    def freed(self):
        return bool(self._freed)

    @property
    def nbytes(self):
        return self.size

    @property
    def memory_kind(self):
        """``"device"`` (device_memory_allocate) or ``"host"`` (pinned host memory from ``malloc_host``)."""
        return "host" if self.core != NULL and self.core.kind == KIND_HOST else "device"

    @property
    def pinned(self):
        """True for pinned host memory (``malloc_host``): copies treat it as host memory."""
        return self.core != NULL and self.core.kind == KIND_HOST

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._freed:
            self._release()
        return False

    def __int__(self):
        return self.ptr

    def __repr__(self):
        state = "freed" if self._freed else f"ptr=0x{self.ptr:x}"
        return f"<Allocation {self.size} bytes on {self.device}, {state}>"

    cdef int _check_host(self) except -1:
        if self._freed:
            raise BufferError(f"{self.device}: the Allocation at 0x{self.ptr:x} was freed")
        if not self.host_addressable:
            raise BufferError(f"{self.device}: memory of device type {self.device.type!r} is not host-addressable "
                              f"(list the type in PADDLE_RT_HOST_ADDRESSABLE if it is)")
        return 0

    def __getbuffer__(self, Py_buffer* buf, int flags):
        self._check_host()
        self.shape[0] = self.size
        self.strides[0] = 1
        buf.buf = <void*>self.ptr
        buf.obj = self
        buf.len = self.size
        buf.readonly = 0
        buf.itemsize = 1
        buf.format = NULL
        if flags & PyBUF_FORMAT:
            buf.format = _FORMAT_B
        buf.ndim = 1
        buf.shape = NULL
        buf.strides = NULL
        if (flags & PyBUF_ND) == PyBUF_ND:
            buf.shape = self.shape
        if (flags & PyBUF_STRIDES) == PyBUF_STRIDES:
            buf.strides = self.strides
        buf.suboffsets = NULL
        buf.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buf):
        self.exports -= 1

    @property
    def __array_interface__(self):
        self._check_host()
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False), "version": 3,
                "strides": None}

    def __dlpack_device__(self):
        self._check_host()
        return (kDLCPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        cdef prt_DLManagedTensor* m
        self._check_host()
        if copy:
            raise BufferError(f"{self.device}: __dlpack__(copy=True) is not supported (the export is zero-copy)")
        if dl_device is not None and tuple(dl_device) != (kDLCPU, 0):
            raise BufferError(f"{self.device}: __dlpack__ can only export to the CPU device (1, 0), "
                              f"got {tuple(dl_device)}")
        cdef int64_t n = self.size
        m = dl_managed_new(<void*>self.ptr, 1, &n, NULL, kDLUInt, 8, self, _dl_deleter)
        self.exports += 1
        return dl_capsule(m)


cdef void _dl_deleter(prt_DLManagedTensor* m) noexcept with gil:
    cdef Allocation a = <Allocation>m.manager_ctx
    a.exports -= 1
    Py_DECREF(a)
    c_free(m)


cdef prt_DLManagedTensor* dl_managed_new(void* data, int ndim, const int64_t* shape, const int64_t* strides,
                                          int code, int bits, object owner,
                                          void (*deleter)(prt_DLManagedTensor*) noexcept) except NULL:
    cdef int i
    cdef prt_DLManagedTensor* m = <prt_DLManagedTensor*>c_malloc(sizeof(prt_DLManagedTensor) +
                                                                 2 * max(ndim, 1) * sizeof(int64_t))
    if m == NULL:
        raise MemoryError()
    memset(m, 0, sizeof(prt_DLManagedTensor))
    m.dl_tensor.data = data
    m.dl_tensor.device.device_type = kDLCPU
    m.dl_tensor.device.device_id = 0
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype.code = code
    m.dl_tensor.dtype.bits = bits
    m.dl_tensor.dtype.lanes = 1
    m.dl_tensor.shape = <int64_t*>(<char*>m + sizeof(prt_DLManagedTensor))
    m.dl_tensor.strides = NULL
    if strides != NULL:
        m.dl_tensor.strides = m.dl_tensor.shape + ndim
    for i in range(ndim):
        m.dl_tensor.shape[i] = shape[i]
        if strides != NULL:
            m.dl_tensor.strides[i] = strides[i]
    m.dl_tensor.byte_offset = 0
    m.manager_ctx = <void*>owner
    m.deleter = deleter
    Py_INCREF(owner)
    return m


cdef object dl_capsule(prt_DLManagedTensor* m):
    try:
        return PyCapsule_New(<void*>m, "dltensor", dl_capsule_destructor)
    except BaseException:
        m.deleter(m)
        raise


cdef void dl_capsule_destructor(object capsule) noexcept:
    cdef prt_DLManagedTensor* m
    if PyCapsule_IsValid(capsule, "dltensor"):     # never consumed: we still own it
        m = <prt_DLManagedTensor*>PyCapsule_GetPointer(capsule, "dltensor")
        if m != NULL and m.deleter != NULL:
            m.deleter(m)


cdef Allocation _make_allocation(DeviceAllocator a, object nbytes, object stream, str call="malloc"):
    cdef size_t n = _check_nbytes(nbytes, call, a.device)
    cdef uintptr_t s = _stream_arg(a, stream)
    cdef AllocatorCore* c = a.core
    cdef void* p = core_try_malloc(c, n, s, 1)
    if p == NULL:
        malloc_waiting(c, n, s, &p)
        core_mark_owned(c, <uintptr_t>p)      # raw_free refuses it while the Allocation lives
    cdef Allocation r = Allocation.__new__(Allocation)
    r.core = c
    r.ptr = <uintptr_t>p
    r.size = n
    r.device = a.device
    r.host_addressable = a.host_addressable
    r.stream_tag = s
    return r


def malloc(nbytes, device=None, stream=None):
    """Allocate ``nbytes`` on ``device`` (default: the current device) from the caching allocator; returns an
    :class:`Allocation`. The block belongs to ``stream`` (default: the calling thread's current stream, see
    ``paddle_rt.stream``; an int is a raw allocator tag): freed, it is reused at once by later allocations on the
    same stream, never by another stream's (use :meth:`Allocation.record_stream` for other streams that use it).
    Raises OutOfMemoryError when the device cannot hold it, after the ladder: cached blocks, growth, giving back
    idle chunks (only while the device's streams are idle: queued work may still use them), then waiting for frees
    deferred by ``record_stream`` and for the device's streams, and retrying once."""
    return _make_allocation(_dev_alloc(device), nbytes, stream)


def free(allocation):
    """Free an :class:`Allocation` (same as ``allocation.free()``)."""
    if not isinstance(allocation, Allocation):
        raise TypeError(f"free: expected an Allocation, got {type(allocation).__name__} (use raw_free for pointers)")
    (<Allocation>allocation)._release()


def raw_malloc(nbytes, device=None, stream=0):
    """Allocate ``nbytes`` and return the raw pointer (int); give it back with :func:`raw_free`
    (like ``torch.cuda.caching_allocator_alloc``)."""
    cdef DeviceAllocator a = _dev_alloc(device)
    cdef size_t n = _check_nbytes(nbytes, "raw_malloc", a.device)
    cdef uintptr_t s = stream
    cdef void* p = core_try_malloc(a.core, n, s, 0)
    if p == NULL:
        malloc_waiting(a.core, n, s, &p)
    return <uintptr_t>p


def raw_free(ptr, device=None):
    """Free a pointer from :func:`raw_malloc`. Without ``device`` the owning device is found (the current device is
    tried first); with ``device``, a pointer of another device raises InvalidArgument. The pointer of a live
    :class:`Allocation` (``malloc``, ``malloc_async``, a tensor's memory) raises InvalidArgument and stays allocated:
    free the Allocation instead."""
    cdef uintptr_t p = _check_ptr(ptr)
    cdef DeviceAllocator a
    cdef DeviceAllocator o
    cdef int r
    if device is not None:
        a = _dev_alloc(device)
        if not core_try_raw_free(a.core, p):
            with nogil:
                core_raw_free(a.core, <void*>p)
        return
    if _last_core != NULL and core_try_raw_free(_last_core, p):     # the most recently used allocator owns it
        return
    a = _dev_alloc(None)
    if core_try_raw_free(a.core, p):
        return
    with nogil:
        r = core_lookup(a.core, p)
    if r == 1 or r == 2:
        with nogil:
            core_raw_free(a.core, <void*>p)
        return
    for o in list(_allocator_mod._allocators):
        if o is a or o.core.torn_down:
            continue
        with nogil:
            r = core_lookup(o.core, p)
        if r:
            with nogil:
                core_raw_free(o.core, <void*>p)
            return
    if _allocator_mod._torn_down:
        return
    raise errors.InvalidArgument(f"raw_free of 0x{p:x}: the pointer was not allocated by paddle_rt")


def malloc_host(nbytes, device=None):
    """Pinned host memory through the plugin's ``host_memory_allocate``, cached like device memory. Raises
    NotSupportedError when the plugin lacks the hook."""
    return _make_allocation(allocator_of(resolve_device(device), KIND_HOST), nbytes, 0, "malloc_host")


def memory_stats(device=None):
    """PyTorch-style counters of the device's allocator: ``<stat>.<pool>.<field>`` for stat in allocated_bytes,
    reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes, allocation, segment, active,
    inactive_split; pool in all, small_pool, large_pool; field in current, peak, allocated, freed. Plus
    num_alloc_retries, num_ooms, num_device_alloc, num_device_free, num_cache_hits, num_release_deferred (idle
    chunks kept cached instead of given back because streams still had queued work, counted per attempt), num_maps,
    num_unmaps, num_release_failures (plugin calls that refused to give memory back: docs/memory.md), num_free_waits
    (growths that first waited for the streams to run past the frees of memory they could use instead: docs/memory.md)."""
    return _dev_alloc(device).stats()


def memory_allocated(device=None):
    """Bytes held by live allocations (rounded block sizes)."""
    return _dev_alloc(device).core.stats[0][ST_ALLOCATED_BYTES].current


def memory_reserved(device=None):
    """Bytes held from the device (allocated + cached)."""
    return _dev_alloc(device).core.stats[0][ST_RESERVED_BYTES].current


def max_memory_allocated(device=None):
    """The peak of memory_allocated since the start or the last reset_peak_memory_stats."""
    return _dev_alloc(device).core.stats[0][ST_ALLOCATED_BYTES].peak


def max_memory_reserved(device=None):
    """The peak of memory_reserved since the start or the last reset_peak_memory_stats."""
    return _dev_alloc(device).core.stats[0][ST_RESERVED_BYTES].peak


def reset_peak_memory_stats(device=None):
    """Set every peak counter to its current value."""
    _dev_alloc(device).reset_peak_stats()


def reset_accumulated_memory_stats(device=None):
    """Zero the allocated/freed totals and the num_* counters."""
    _dev_alloc(device).reset_accumulated_stats()


def empty_cache(device=None, wait=True):
    """Give every idle cached chunk of ``device`` back to the plugin (pinned host memory too); returns the bytes
    released. With ``wait=True`` (the default) it waits first until the device's streams (every stream, for pinned
    host memory) have run everything submitted so far: queued work may still use freed memory. With ``wait=False``
    it does not wait and gives back only the memory whose frees have already run on their streams (see
    :meth:`DeviceAllocator.empty_cache`). Inside a stream callback it does not wait. When the plugin refuses to give
    memory back, what it still holds stays counted (and is retried at the next release point) and PluginError is
    raised, naming the device and the call, with ``released``: the bytes that did go back (both allocators are
    emptied first)."""
    cdef Device dev = resolve_device(device)
    total = 0
    refused = None
    for a in (_dev_alloc(dev), existing_allocator(dev, KIND_HOST)):
        if a is None:
            continue
        try:
            total += a.empty_cache(wait)
        except errors.PluginError as e:
            total += e.released
            refused = e
    if refused is not None:
        refused.released = total
        raise refused
    return total


def reset_allocator(device=None):
    """Start the allocator of ``device`` (default: the current device) afresh without a new process: see
    :meth:`DeviceAllocator.reset`. Nothing may be allocated on it."""
    _dev_alloc(device).reset()


def memory_snapshot(device=None):
    """The device's segments (chunks), each with its blocks: address, size, requested_size, state."""
    return _dev_alloc(device).snapshot()


def set_allocator_config(device=None, **kw):
    """Configure the allocator of ``device`` (default: the current device). Keys: paddle_compat, growth, chunk_size,
    max_split_size, limit, release, small_size, small_chunk, grow_min, grow_step, grow_fraction, grow_ratio,
    grow_round, consolidate (see alloc_config.py)."""
    _dev_alloc(device).configure(**kw)


def allocator_config(device=None):
    """The effective allocator configuration of ``device`` (keys of PADDLE_RT_ALLOC_CONF plus the plugin's
    alignment and padding)."""
    return _dev_alloc(device).config()


def _deferred_frees_pending(device=None):
    """Number of frees of ``device``'s allocator still waiting for record_stream streams (for tests and tools)."""
    return core_deferred_pending(_dev_alloc(device).core)


def _allocate(DeviceAllocator a, nbytes, stream=None):
    """DeviceAllocator.malloc."""
    return _make_allocation(a, nbytes, stream)


def _raw_allocate(DeviceAllocator a, nbytes, stream=0):
    """DeviceAllocator.raw_malloc."""
    cdef void* p = NULL
    cdef size_t n = _check_nbytes(nbytes)
    cdef uintptr_t s = stream
    malloc_waiting(a.core, n, s, &p)
    return <uintptr_t>p


# DeviceAllocator.malloc / raw_malloc (allocator.pyx, below this module) call these.
_allocator_mod.register_allocation_api(_allocate, _raw_allocate)


def _forget_last():
    """Teardown, fork: the cached allocator of the last device is not to be used again."""
    global _last_dev, _last_alloc, _last_core
    _last_dev = None
    _last_alloc = None
    _last_core = NULL


_device_mod.register_teardown(_forget_last, 31)
_device_mod.register_fork_reset(_forget_last)
os.register_at_fork(after_in_child=_forget_last)
