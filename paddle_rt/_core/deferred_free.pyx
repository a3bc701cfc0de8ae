# cython: freethreading_compatible = False
"""Deferred frees (``Allocation.record_stream``): a block used on other streams goes back to the allocator only after
every recorded stream has run everything submitted to it before the free. The free enqueues a host function on each
recorded stream; the last one to run returns the block (under the allocator's lock, on that stream's worker, no GIL).
The out-of-memory ladder's last step (``malloc_waiting``) waits for them."""
import weakref

from libc.stdint cimport uintptr_t, int64_t, uint64_t
from libc.stdlib cimport malloc as c_malloc, free as c_free

from paddle_rt._core.allocator cimport (
    AllocatorCore, KIND_HOST, core_malloc, core_free, core_try_free, core_free_unchecked, core_deferred_pending,
    core_streams_idle,
)
from paddle_rt._core.stream cimport Stream, stream_launch_host_func, stream_position, fork_generation, \
    stream_device_quiesce
from paddle_rt._core.includes.atomics cimport prt_atomic_add_i64, prt_atomic_add_int

from paddle_rt._core import errors

cdef struct DeferredFree:
    AllocatorCore* core
    uintptr_t ptr
    int remaining              # host functions still to run, +1 while the free is being enqueued (atomic)


_deferred_waits = {}           # core address -> [(weakref to Stream, position of its host function)] (OOM ladder)
_deferred_prune_at = {}        # core address -> length at which the list is pruned next (amortised O(1) per free)


cdef void _deferred_finish(DeferredFree* d) noexcept nogil:
    cdef AllocatorCore* c = d.core
    core_free_unchecked(c, d.ptr)
    prt_atomic_add_i64(&c.deferred_pending, -1)
    c_free(d)


cdef void _deferred_step(void* arg) noexcept nogil:
    cdef DeferredFree* d = <DeferredFree*>arg
    if prt_atomic_add_int(&d.remaining, -1) == 0:
        _deferred_finish(d)


cdef int free_now(AllocatorCore* c, uintptr_t ptr) except -1:
    if not core_try_free(c, ptr):
        with nogil:
            core_free(c, <void*>ptr)
    return 0


cdef int free_after_streams(AllocatorCore* c, uintptr_t ptr, list streams) except -1:
    """Free `ptr` once every stream of `streams` has passed this point (with the GIL)."""
    cdef Stream st
    cdef DeferredFree* d
    cdef uint64_t pos
    cdef list live = []
    if c.torn_down:
        return 0
    for st in streams:
        if not st.closed and st.ctx != NULL and st._fork_gen == fork_generation():
            live.append(st)
    if not live:
        return free_now(c, ptr)
    d = <DeferredFree*>c_malloc(sizeof(DeferredFree))
    if d == NULL:
        raise MemoryError(f"{<object>c.device}: free of 0x{ptr:x}: no host memory to defer the free")
    d.core = c
    d.ptr = ptr
    d.remaining = len(live) + 1
    prt_atomic_add_i64(&c.deferred_pending, 1)
    waits = _deferred_waits.get(<uintptr_t>c)
    if waits is None:
        waits = _deferred_waits[<uintptr_t>c] = []
    elif len(waits) >= _deferred_prune_at.get(<uintptr_t>c, 64):
        waits[:] = [w for w in waits if _wait_pending(w)]
        _deferred_prune_at[<uintptr_t>c] = max(64, 2 * len(waits))
    err = None
    try:
        for st in live:
            try:
                pos = stream_launch_host_func(st, _deferred_step, <void*>d)
            except (errors.StreamError, MemoryError):
                # the stream is closing (its work has run) or has no memory for the operation: wait for it here
                try:
                    if not st.closed and st.ctx != NULL:
                        st._wait_position(stream_position(st))
                except BaseException as e:
                    err = e
                _deferred_step(<void*>d)
                continue
            try:
                waits.append((weakref.ref(st), pos))
            except MemoryError:
                pass                        # only the OOM ladder's view of this free is lost, not the free
    finally:
        _deferred_step(<void*>d)          # drop the guard: the block goes back when the last stream passed
    if err is not None:
        raise err
    return 0


cdef bint _wait_pending(object w) except -1:
    cdef Stream st = w[0]()
    if st is None or st.closed or st.ctx == NULL:
        return False
    return not st.ctx.core.reached(<uint64_t>w[1])


cdef int core_wait_deferred(AllocatorCore* c) except -1:
    cdef Stream st
    waits = _deferred_waits.get(<uintptr_t>c)
    if not waits:
        return 0
    for w in list(waits):
        st = w[0]()
        if st is None or st.closed or st.ctx == NULL:
            continue
        try:
            st._wait_position(<uint64_t>w[1])
        except errors.StreamError:
            pass                          # a callback of that very stream: its free cannot complete before it
    waits[:] = [w for w in waits if _wait_pending(w)]
    return 0


# Allocate with the OOM ladder's last steps: when the allocator is out of memory while frees deferred by
# record_stream are pending or while streams are busy (so its ladder could not give idle chunks back), wait for the
# deferred frees' streams and then for every stream of the device (every device's for pinned host memory), and
# retry once.
cdef int malloc_waiting(AllocatorCore* c, size_t n, uintptr_t s, void** p) except -1:
    try:
        with nogil:
            core_malloc(c, n, s, p)
    except errors.OutOfMemoryError:
        if core_deferred_pending(c) == 0 and core_streams_idle(c):
            raise
        core_wait_deferred(c)
        stream_device_quiesce(None if c.kind == KIND_HOST else <object>c.device)
        with nogil:
            core_malloc(c, n, s, p)
    return 0
