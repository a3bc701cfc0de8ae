"""C allocation functions for other runtimes, in the shape of PyTorch's pluggable allocators:

    void* alloc(size_t size, int device, void* stream)
    void  free(void* ptr, size_t size, int device, void* stream)

``device`` is the device's index within its type; ``stream`` is NULL (the device's current stream) or the ``handle``
of a live paddle_rt :class:`Stream`. One error model for both kinds: on an error ``alloc`` returns NULL and ``free``
does nothing, and :func:`allocator_functions_error` returns the exception (the latest one, per process).

Two kinds, chosen with ``stream_ordered``:

* ``True`` (default): through the device's default :class:`MemPool`, stream-ordered (``malloc_async`` /
  ``free_async``); ``free`` with NULL frees on the allocating stream. Takes the GIL.
* ``False``: straight through the caching allocator's nogil core (``core_malloc`` / ``core_free``), the fastest;
  the block belongs to ``stream``'s tag. It takes the GIL only to record an error. Its out-of-memory ladder does not
  wait for the device's streams, so while they have queued work it cannot give idle chunks back; a growth that
  memory with queued frees would serve waits for them (at most ``growth_wait_ms``) when called without the GIL.
"""
from libc.stdint cimport uintptr_t
from libc.string cimport memset

from paddle_rt._core.allocator cimport AllocatorCore, get_core, core_malloc, core_free, KIND_DEVICE
from paddle_rt._core.device cimport Device, resolve_device
from paddle_rt._core.pool cimport MemPool, AsyncAllocation, default_pool_of
from paddle_rt._core.stream cimport Stream, current_stream

import os

from paddle_rt._core import errors
from paddle_rt._core import device as _device_mod

__all__ = ["allocator_functions", "allocator_functions_error"]

cdef enum:
    MAX_DEVICES = 64          # devices of one type the nogil functions serve (by index)

_errors = []                  # the latest error of the C functions
_live = {}                    # (device index, ptr) -> AsyncAllocation handed out by the stream-ordered alloc
cdef AllocatorCore* _cores[MAX_DEVICES]   # the nogil functions' allocators, by device index
memset(_cores, 0, sizeof(_cores))


cdef void _record_error(BaseException e):
    _errors[:] = [e]


# core_malloc/core_free called through pointers without Cython's exception check: on -1 the exception they raised
# stays set, and _record_pending_error moves it into allocator_functions_error().
ctypedef int (*_malloc_fn)(AllocatorCore* c, size_t nbytes, uintptr_t stream, void** out) noexcept nogil
ctypedef int (*_free_fn)(AllocatorCore* c, void* ptr) noexcept nogil


cdef int _pending() except -1:
    return -1                 # the exception set by the failed call propagates from here


cdef void _record_pending_error() noexcept with gil:
    try:
        _pending()
    except BaseException as e:
        _record_error(e)


# -- stream-ordered, through the default pool ------------------------------------------------------------------------
cdef Stream _stream_of(Device dev, void* handle):
    from paddle_rt._core.stream import _live_streams
    if handle == NULL:
        return current_stream(dev)
    for st in list(_live_streams):
        if (<Stream>st).device is dev and not (<Stream>st).closed and st.handle == <uintptr_t>handle:
            return <Stream>st
    raise errors.InvalidArgument(f"{dev}: stream handle 0x{<uintptr_t>handle:x} is not a live paddle_rt stream of "
                                 f"this device")


cdef void* _ordered_alloc(size_t size, int device, void* stream) noexcept with gil:
    cdef AsyncAllocation a
    cdef Device dev
    cdef MemPool pool
    try:
        dev = resolve_device(device)
        pool = default_pool_of(dev)
        a = pool.malloc_on(size, _stream_of(dev, stream))
        _live[(dev.index, a.ptr)] = a
        return <void*>a.ptr
    except BaseException as e:
        _record_error(e)
        return NULL


cdef void _ordered_free(void* ptr, size_t size, int device, void* stream) noexcept with gil:
    cdef AsyncAllocation a
    cdef Device dev
    cdef Stream s
    try:
        if ptr == NULL:
            return
        dev = resolve_device(device)
        a = _live.get((dev.index, <uintptr_t>ptr))
        if a is None:
            raise errors.InvalidArgument(f"{dev}: free of 0x{<uintptr_t>ptr:x}: not allocated through "
                                         f"allocator_functions() on this device (or already freed)")
        if size != 0 and size != a.size:
            raise errors.InvalidArgument(f"{dev}: free of 0x{<uintptr_t>ptr:x}: size {size} does not match the "
                                         f"allocated {a.size}")
        s = a.stream if stream == NULL else _stream_of(dev, stream)
        a.pool.free_on(a, s)
        del _live[(dev.index, <uintptr_t>ptr)]
    except BaseException as e:
        _record_error(e)


# -- straight through the caching allocator (nogil) ------------------------------------------------------------------
cdef void* _direct_alloc(size_t size, int device, void* stream) noexcept nogil:
    cdef void* p = NULL
    cdef AllocatorCore* c
    if device < 0 or device >= MAX_DEVICES or _cores[device] == NULL:
        with gil:
            _record_error(errors.InvalidArgument(f"allocator_functions: no device of index {device} (the "
                                                 f"functions serve the devices of the type they were made for)"))
        return NULL
    c = _cores[device]
    if (<_malloc_fn>core_malloc)(c, size, <uintptr_t>stream, &p) != 0:
        _record_pending_error()
        return NULL
    return p


cdef void _direct_free(void* ptr, size_t size, int device, void* stream) noexcept nogil:
    if ptr == NULL:
        return
    if device < 0 or device >= MAX_DEVICES or _cores[device] == NULL:
        with gil:
            _record_error(errors.InvalidArgument(f"allocator_functions: no device of index {device}"))
        return
    if (<_free_fn>core_free)(_cores[device], ptr) != 0:
        _record_pending_error()


def allocator_functions(device=None, *, stream_ordered=True):
    """Addresses (ints) of ``alloc`` and ``free`` (see the module documentation) serving every device of the type of
    ``device`` (default: the current device) by index. ``stream_ordered=True``: through the default pool (created
    now for ``device``); ``False``: straight through the caching allocators (made ready now for every device of the
    type). Returns ``(alloc_address, free_address)``."""
    cdef Device dev = resolve_device(device)
    cdef Device d
    if stream_ordered:
        default_pool_of(dev)
        return <uintptr_t><void*>_ordered_alloc, <uintptr_t><void*>_ordered_free
    devs = _device_mod.devices(dev.type)
    if len(devs) > MAX_DEVICES:
        raise errors.NotSupportedError(f"{dev.type}: allocator_functions(stream_ordered=False) serves at most "
                                       f"{MAX_DEVICES} devices of a type")
    for d in devs:
        _cores[d.index] = get_core(d, KIND_DEVICE)
    return <uintptr_t><void*>_direct_alloc, <uintptr_t><void*>_direct_free


def allocator_functions_error(clear=True):
    """The latest error of the C functions of :func:`allocator_functions` (None if none)."""
    e = _errors[0] if _errors else None
    if clear:
        _errors.clear()
    return e


def _forget_cores():
    """At exit and in a child after fork(): the allocators the nogil functions used are gone."""
    memset(_cores, 0, sizeof(_cores))


_device_mod.register_teardown(_forget_cores, 25)
_device_mod.register_fork_reset(_forget_cores)
os.register_at_fork(after_in_child=_forget_cores)
