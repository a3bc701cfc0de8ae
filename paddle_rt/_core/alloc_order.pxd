# Where a free stands in its stream's order (alloc_order.pyx): whether memory freed on a stream may leave it now, and
# the growth that first waits for queued frees. Called with the allocator's lock held and no GIL, except
# wait_queued_frees (lock held on entry and on return, released while it waits). Cimported by alloc_segment.pyx and
# allocator.pyx.
from libc.stdint cimport uintptr_t, int64_t

from paddle_rt._core.alloc_types cimport AllocatorCore, Block

# Whether every stream that may still use this allocator's memory has completed everything submitted so far.
cdef bint streams_idle(AllocatorCore* c) noexcept nogil
# Whether the memory of free block b may leave its stream now (back to the plugin, or a page to another range): the
# work submitted to its stream before the frees that made it has run. A query of the stream's position, never a wait.
cdef bint free_done(AllocatorCore* c, Block* b) noexcept nogil
# Whether a core_malloc call may wait for streams at all (not on a stream's worker, not with the GIL held, not for
# pinned host memory). Lock-free (a thread-local look-up each).
cdef bint caller_may_wait(AllocatorCore* c) noexcept nogil
# Record that a growth should first wait until b's stream ran past its frees (c.wait_*).
cdef void want_wait(AllocatorCore* c, Block* b) noexcept nogil
# With c.may_wait: whether the consolidation before a growth of `pool` on `stream` would give back chunks whose frees
# are still queued (recorded with want_wait: the caller waits for them before it grows).
cdef bint queued_consolidation(AllocatorCore* c, int pool, uintptr_t stream) noexcept nogil
# With c.may_wait: whether record_stream frees of this allocator are pending (recorded in c.wait_deferred: the caller
# waits until one has finished before it grows).
cdef bint queued_deferred(AllocatorCore* c) noexcept nogil
# The end of one core_malloc call's waits (now + growth_wait_ms); counts num_free_waits.
cdef int64_t growth_deadline(AllocatorCore* c) noexcept nogil
# Wait for what c.wait_* recorded, until `deadline` at most, the lock released meanwhile: whether all of it came
# before the deadline. Lock held on entry and on return.
cdef bint wait_queued_frees(AllocatorCore* c, int64_t deadline) noexcept nogil
# A core_malloc call waits at most this many times (each for what its pass found), all by one deadline.
cdef enum:
    MAX_GROWTH_WAITS = 8
