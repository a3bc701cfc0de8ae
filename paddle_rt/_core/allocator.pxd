# The caching best-fit allocator: one AllocatorCore per (device, memory kind). Public C API for other Cython code:
#
#   cimport paddle_rt._core.allocator as A
#   cdef A.AllocatorCore* core = A.get_core(device, A.KIND_DEVICE)        # with the GIL, once
#   cdef void* p
#   with nogil:
#       A.core_malloc(core, nbytes, 0, &p)                                  # except -1: raises OutOfMemoryError...
#       A.core_free(core, p)                                                # except -1: raises InvalidArgument...
#
# Both functions take the GIL only to raise; the error cannot be lost (Cython checks the -1 return).
cimport cython
from libc.stdint cimport uintptr_t, int64_t, uint64_t
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_Status
from paddle_rt._core.device cimport Device
from paddle_rt._core.includes.alloc_support cimport prt_alloc_containers

from paddle_rt._core.alloc_types cimport (
    KIND_DEVICE, KIND_HOST, POOL_SMALL, POOL_LARGE, N_STAT_GROUPS, N_QUICK_SLOTS, GROWTH_ADAPTIVE, GROWTH_EXACT,
    GROWTH_FIXED, RELEASE_EMPTY_CACHE, RELEASE_ON_FREE, ROUND_NEAREST, ROUND_UP, ROUND_DOWN, ROUND_OFF, ROUND_WITHIN,
    CONSOLIDATE_FOLD, CONSOLIDATE_RELEASE, CONSOLIDATE_OFF, BASE_RESERVED, BASE_GROWN, ERR_NONE, ERR_OOM, ERR_PLUGIN,
    ERR_FOREIGN, ERR_DOUBLE_FREE, ERR_TORN_DOWN, ERR_BAD_SIZE, ERR_INTERIOR, ERR_HOST_OOM, ERR_PLUGIN_NULL, ERR_OWNED,
    ERR_WAIT, N_FREE_WAITS,
    VMM_CALL_NONE, Stat,
    ST_ALLOCATED_BYTES, ST_RESERVED_BYTES, ST_ACTIVE_BYTES, ST_INACTIVE_SPLIT_BYTES, ST_REQUESTED_BYTES,
    ST_ALLOCATION, ST_SEGMENT, ST_ACTIVE, ST_INACTIVE_SPLIT, N_STATS, Chunk, Block, AllocConfig, AllocError,
    AllocatorCore, EXPANDABLE_OFF, EXPANDABLE_ON, EXPANDABLE_AUTO, N_RANGES,
)

# With the GIL: the allocator of `device` (None: current device) for KIND_DEVICE or KIND_HOST, created on first use.
cdef AllocatorCore* get_core(object device, int kind) except NULL
# nogil hot path. `stream` is an opaque tag (0: the default stream). Return 0, or -1 with a Python exception set.
# Its out-of-memory ladder gives idle chunks back only while the device's streams are idle (it never waits); the
# Python-level malloc paths then wait for the streams and retry (allocator.pyx's module docstring).
cdef int core_malloc(AllocatorCore* core, size_t nbytes, uintptr_t stream, void** out) except -1 nogil
cdef int core_free(AllocatorCore* core, void* ptr) except -1 nogil
# The bytes held for a live pointer (its rounded size), or 0 if the pointer is not live here.
cdef size_t core_block_size(AllocatorCore* core, void* ptr) noexcept nogil
# Give every idle chunk back to the plugin; returns the number of bytes released, or -1 with an exception set.
# Never blocks: while a stream of the device (of any device, for pinned host memory) still has queued work, nothing
# is released (that work may use the memory); the chunks stay cached, counted in num_release_deferred.
# DeviceAllocator.empty_cache / paddle_rt.empty_cache first wait for the streams (stream_device_quiesce).
cdef int64_t core_empty_cache(AllocatorCore* core) except -1 nogil
# Frees deferred by record_stream (deferred_free.pyx) still waiting for their streams.
cdef int64_t core_deferred_pending(AllocatorCore* core) noexcept nogil

cdef class DeviceAllocator:
    cdef AllocatorCore* core
    cdef readonly Device device
    cdef readonly str kind
    cdef dict _keywords
    cdef readonly bint host_addressable
    cdef object __weakref__
    @staticmethod
    cdef DeviceAllocator _new(Device dev, int kind)
    cdef dict _effective(self)

# The allocator of `dev` for KIND_DEVICE or KIND_HOST, created on first use; existing_allocator: None if not yet made.
cdef DeviceAllocator allocator_of(Device dev, int kind)
cdef DeviceAllocator existing_allocator(Device dev, int kind)
# With the GIL held: serve from the cache without releasing the GIL when the lock is free (never blocks, never calls
# the plugin); NULL: take the slow path (nogil core_malloc). core_try_free: 1 when freed (or torn down), 0 when the
# slow path (core_free) must run.
# `owned`: an Allocation object will hold the block (Block.owned; core_mark_owned marks one the slow path made).
# held: the bytes the block holds (its rounded size, or a whole unsplit block).
cdef void* core_try_malloc_block(AllocatorCore* c, size_t n, uintptr_t stream, int owned, size_t* held) noexcept
cdef inline void* core_try_malloc(AllocatorCore* c, size_t n, uintptr_t stream, int owned) noexcept:
    cdef size_t held
    return core_try_malloc_block(c, n, stream, owned, &held)
# Cross-stream reuse for the stream-ordered pool: a free block of `tag`'s memory whose frees the caller may follow
# (free_seq <= seq_ok, or done_ok and they have run), handed out; NULL when none (lock taken, no plugin call).
cdef void* core_malloc_settled(AllocatorCore* c, size_t n, uintptr_t tag, uint64_t seq_ok, bint done_ok,
                               size_t* held, uint64_t* seq) noexcept nogil
cdef int core_try_free(AllocatorCore* c, uintptr_t p) noexcept
cdef void core_mark_owned(AllocatorCore* c, uintptr_t p) noexcept nogil
# A pool's live block reused for a request of n bytes (Block.requested bounds raw addresses into it).
cdef void core_set_requested(AllocatorCore* c, uintptr_t p, size_t n) noexcept nogil
# raw_free's frees: as core_try_free / core_free, but a block that a live Allocation holds is refused (core_try_raw_free
# leaves it to core_raw_free, which raises InvalidArgument naming the device, raw_free and the Allocation).
cdef int core_try_raw_free(AllocatorCore* c, uintptr_t p) noexcept
cdef int core_raw_free(AllocatorCore* c, void* ptr) except -1 nogil
# Free a live block, ignoring errors (a free deferred by record_stream, on a stream worker).
cdef void core_free_unchecked(AllocatorCore* c, uintptr_t ptr) noexcept nogil
# Takes the lock: 0 not this allocator's, 1 the start of a live block, 2 inside one of its chunks otherwise.
cdef int core_lookup(AllocatorCore* c, uintptr_t ptr) noexcept nogil
# With the GIL: bytes from `ptr` to the end of the bytes requested of the live block holding it in an allocator of
# `kind` (KIND_DEVICE or KIND_HOST) of `device` (None: of any device), or -1 when no live block holds it. For raw
# addresses from users (copies, memset, descriptors' operands): they are bounded by the allocation they point into,
# the bytes asked for, not the rounded block.
cdef int64_t raw_live_extent(object device, int kind, uintptr_t ptr) except -2
# True when no stream that may use this allocator's memory has queued work (idle chunks may then go back).
cdef bint core_streams_idle(AllocatorCore* c) noexcept nogil

# The size a request of `nbytes` holds: Paddle's round_up(nbytes + extra_padding, min_chunk), at least one byte of
# payload. Shared by the allocator and the stream-ordered pool, so both key their caches by the same sizes. The
# caller has checked nbytes + padding for overflow.
cdef inline size_t round_request(AllocatorCore* c, size_t nbytes) noexcept nogil:
    cdef size_t n = nbytes + c.cfg.padding
    cdef size_t a
    if n == 0:
        n = 1
    if c.cfg.align_mask:
        return (n + c.cfg.align_mask) & ~c.cfg.align_mask
    a = c.cfg.alignment
    if a <= 1:
        return n
    return ((n + a - 1) // a) * a
