# Stream-ordered memory (malloc_async / free_async) on top of the caching allocator and stream positions.
#
# C-level users: cimport paddle_rt._core.pool as P; P.pool_malloc(pool, n, stream) / P.pool_free(alloc, stream)
# (with the GIL; see pool.pyx for the reuse rules).
from libc.stdint cimport uintptr_t, uint64_t, int64_t
from paddle_rt._core.allocator cimport AllocatorCore
from paddle_rt._core.allocation cimport Allocation
from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream

# A freed block the pool holds back (not yet given back to the allocator): freed on another stream than its
# allocating one, with record_stream streams, or in another stream's range (taken from the pool across streams).
cdef class _FreedBlock:
    cdef uintptr_t ptr
    cdef size_t size           # the block's rounded size
    cdef uintptr_t tag         # the allocator tag of the memory (the stream whose range holds it)
    cdef Stream stream         # the stream the free was ordered on
    cdef uint64_t pos          # that stream's position at the free (everything before it may still use the block)
    cdef list recorded         # [(Stream, position at the free)] of record_stream streams, or None

# How a freed block came to be reused (the steps of MemPool.malloc_on, in order) and the counters of stats().
cdef enum:                           # ReuseKind
    REUSE_NONE = 0
    REUSE_SAME_STREAM = 1            # held, and freed on the allocating stream itself
    REUSE_HOST_SYNCED = 2            # the host synchronized the freeing stream past the free (or it was closed)
    REUSE_EVENT_DEPENDENCY = 3       # the allocating stream waits on an event recorded after the free
    REUSE_OPPORTUNISTIC = 4          # the free has already run
    REUSE_INTERNAL_DEPENDENCY = 5    # the pool made the allocating stream wait for the freeing one
    N_REUSE_KINDS = 6

cdef class MemPool:
    cdef AllocatorCore* core
    cdef readonly Device device
    cdef readonly size_t release_threshold
    cdef readonly bint reuse_follow_event_dependencies
    cdef readonly bint reuse_allow_opportunistic
    cdef readonly bint reuse_allow_internal_dependencies
    cdef bint host_addressable
    cdef dict _cache                   # Stream -> {block size: [_FreedBlock]}: the blocks held back
    cdef object _synced                # weak Stream -> highest position the host waited for
    cdef object _synced_seq            # weak Stream -> how far it had run then, in order-counter terms
    cdef object _waits                 # weak waiter Stream -> weak recorded Stream -> (highest position waited for,
                                       # the order counter before that record)
    cdef int64_t used_cur, used_high, reserved_cur, reserved_high
    cdef int64_t cached_bytes
    cdef int64_t n_reuse[N_REUSE_KINDS]   # reuses of freed blocks from the cache, by ReuseKind
    cdef object __weakref__

    cdef AsyncAllocation malloc_on(self, size_t n, Stream s)
    cdef int free_on(self, AsyncAllocation a, Stream s) except -1
    cdef int _reusable(self, _FreedBlock e, Stream b) except -1           # a ReuseKind
    cdef bint _host_synced(self, _FreedBlock e)
    cdef bint _follows_event(self, _FreedBlock e, Stream b)
    cdef bint _recorded_ordered(self, _FreedBlock e, Stream b)
    cdef bint _opportunistic(self, _FreedBlock e)
    cdef bint _safe_for_every_stream(self, _FreedBlock e)
    cdef list _freed_blocks(self, size_t size=*, object skip=*)
    cdef _FreedBlock _take_same_stream(self, size_t r, Stream s)
    cdef _FreedBlock _take_cross_stream(self, size_t r, Stream s)
    cdef _FreedBlock _take_with_internal_dependency(self, size_t r, Stream s)
    cdef AsyncAllocation _from_allocator(self, size_t n, Stream s, uintptr_t tag)
    cdef AsyncAllocation _from_other_streams(self, size_t n, Stream s, uintptr_t tag)
    cdef AsyncAllocation _from_other(self, void* p, size_t n, size_t held, Stream s, uintptr_t otag, uintptr_t tag,
                                     int how)
    cdef int _retire(self, _FreedBlock e) except -1
    cdef int _give_back_later(self, _FreedBlock e) except -1
    cdef int _retire_safe(self, int64_t keep) except -1
    cdef int _drop_entry(self, _FreedBlock e) except -1
    cdef int _check(self) except -1
    cdef int _prune(self) except -1
    cdef AsyncAllocation _wrap(self, uintptr_t p, size_t n, size_t block, Stream s, uintptr_t tag, bint foreign)

cdef class AsyncAllocation(Allocation):
    cdef readonly MemPool pool
    cdef readonly Stream stream        # the stream it was allocated on
    cdef size_t block                  # rounded size
    cdef bint foreign                  # its memory lies in another stream's range (taken from the pool across
                                       # streams): freed, the pool holds it until that is safe for the range's stream

cdef AsyncAllocation pool_malloc(MemPool pool, size_t n, Stream s)
# The device's default pool (created on first use).
cdef MemPool default_pool_of(Device dev)
cdef int pool_free(AsyncAllocation a, Stream s) except -1
