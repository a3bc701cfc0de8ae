# cython: freethreading_compatible = False
"""Where a free stands in its stream's order. A block of device memory belongs to one stream (its tag); a free is
stream-ordered, so work of that stream submitted before the frees that made a free block may still use it
(``Block.free_seq``, the stream layer's order counter at the latest of them), nothing after. Memory leaves its stream
(back to the plugin, or a page to another range) once that stream has run past the frees: ``free_done``, a query.

A growth that memory already cached could serve instead (donor pages, idle chunks to consolidate) but whose frees are
still queued waits for them first (``alloc_policy.waits_for_frees``), as cudaFree (which synchronizes) and PyTorch's
expandable segments (which synchronize the stream before an unmap) do: the device then holds what it holds with the
host waiting. The pass that finds such memory records the streams and order numbers (``want_wait``) and fails with
ERR_WAIT; core_malloc waits without the lock (``wait_queued_frees``: a deferred free on a stream's worker takes it)
and passes again, all its waits ending by one deadline (``growth_wait_ms``), then grows without waiting. A growth
while ``record_stream`` frees are pending (``queued_deferred``) waits likewise until one of them has finished."""
from libc.stdint cimport uintptr_t, uint64_t, int64_t
from cython.operator cimport dereference as deref, preincrement as inc

from paddle_rt._core.alloc_types cimport AllocatorCore, Block, KIND_HOST, POOL_LARGE, N_FREE_WAITS
from paddle_rt._core.alloc_index cimport lowest_key
from paddle_rt._core.alloc_blocks cimport _q_flush
from paddle_rt._core.alloc_policy cimport consolidates_before_growth, waits_for_frees
from paddle_rt._core.stream cimport stream_device_idle, stream_tag_done, stream_tag_wait, stream_current_worker
from paddle_rt._core.includes.alloc_support cimport prt_free_set
from paddle_rt._core.includes.stream_support cimport prt_now_ns
from paddle_rt._core.includes.atomics cimport prt_atomic_load_i64
from posix.unistd cimport usleep


cdef extern from "Python.h":
    int PyGILState_Check() nogil


# Whether memory of this allocator may go back to the plugin now: every stream that may still use it (the device's;
# every device's for pinned host memory, which copies on any device read) has completed everything submitted so
# far. A free is stream-ordered (the block is reusable at once by its stream), so an idle chunk can still be the
# target of queued work; plugins free at once (unlike cudaFree, which synchronizes). Release paths only.
cdef bint streams_idle(AllocatorCore* c) noexcept nogil:
    return stream_device_idle(NULL if c.kind == KIND_HOST else c.device)


# Whether free block b's memory may go back to the plugin or to another range now: how far its one stream has run,
# a query of its position, so memory whose frees have completed goes back while other work is queued (the host
# running ahead of the device). Pinned host memory can be read by copies on any stream of any device: every stream
# idle.
cdef bint free_done(AllocatorCore* c, Block* b) noexcept nogil:
    if c.kind == KIND_HOST:
        return streams_idle(c)
    if b.free_seq == 0:
        return True                  # never used
    return stream_tag_done(c.device, b.stream, b.free_seq)


# A stream's worker does not wait (its own stream cannot run on meanwhile, and waiting for another could close a
# cycle), nor a caller holding the GIL (a callback of the stream waited for may need it), nor pinned host memory
# (every stream of every device would have to be idle).
cdef bint caller_may_wait(AllocatorCore* c) noexcept nogil:
    return c.kind != KIND_HOST and stream_current_worker() == NULL and not PyGILState_Check()


# Kept as the latest order number per stream; beyond N_FREE_WAITS streams, the rest are not waited for.
cdef void want_wait(AllocatorCore* c, Block* b) noexcept nogil:
    cdef int k
    for k in range(c.n_waits):
        if c.wait_tag[k] == b.stream:
            if b.free_seq > c.wait_seq[k]:
                c.wait_seq[k] = b.free_seq
            return
    if c.n_waits < N_FREE_WAITS:
        c.wait_tag[c.n_waits] = b.stream
        c.wait_seq[c.n_waits] = b.free_seq
        c.n_waits += 1


# Chunks: the consolidation before a growth of the large pool gives back every idle chunk of `stream`
# (alloc_segment.growth_size); those whose frees are still queued are waited for first.
cdef bint queued_consolidation(AllocatorCore* c, int pool, uintptr_t stream) noexcept nogil:
    cdef prt_free_set.iterator it
    cdef Block* b
    cdef size_t ready = 0, queued = 0
    if not c.may_wait or not consolidates_before_growth(&c.cfg, pool):
        return False
    _q_flush(c)
    it = c.cx.free_blocks[POOL_LARGE].lower_bound(lowest_key(stream, 0))
    while it != c.cx.free_blocks[POOL_LARGE].end() and deref(it).stream == stream:
        b = <Block*>deref(it).block
        if b.prev == NULL and b.next == NULL and not b.chunk.expandable:
            if free_done(c, b):
                ready += b.size
            else:
                queued += b.size
                want_wait(c, b)
        inc(it)
    return waits_for_frees(ready, queued, ready + queued)


# record_stream frees (deferred_free.pyx) pending: the memory they give back (on their streams' workers, once those ran
# past the recorded uses) may serve the growth; it waits until one of them has finished.
cdef bint queued_deferred(AllocatorCore* c) noexcept nogil:
    cdef int64_t pending
    if not c.may_wait:
        return False
    pending = prt_atomic_load_i64(&c.deferred_pending)
    if pending <= 0:
        return False
    c.wait_deferred = pending
    return True


cdef int64_t growth_deadline(AllocatorCore* c) noexcept nogil:
    c.num_free_waits += 1
    return prt_now_ns() + c.cfg.growth_wait_ns


cdef bint wait_queued_frees(AllocatorCore* c, int64_t deadline) noexcept nogil:
    cdef uintptr_t tags[N_FREE_WAITS]
    cdef uint64_t seqs[N_FREE_WAITS]
    cdef int k, n = c.n_waits
    cdef int64_t left, deferred = c.wait_deferred
    cdef bint done = True
    for k in range(n):
        tags[k] = c.wait_tag[k]
        seqs[k] = c.wait_seq[k]
    c.n_waits = 0
    c.wait_deferred = 0
    c.cx.mu.unlock()
    for k in range(n):
        left = deadline - prt_now_ns()
        if left <= 0 or not stream_tag_wait(c.device, tags[k], seqs[k], left):
            done = False
            break
    while done and deferred > 0 and prt_atomic_load_i64(&c.deferred_pending) >= deferred:
        if prt_now_ns() >= deadline:
            done = False
        else:
            usleep(20)
    c.cx.mu.lock()
    return done
