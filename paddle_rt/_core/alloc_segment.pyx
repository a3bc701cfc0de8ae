# cython: freethreading_compatible = False
"""Segments (chunks) of the caching allocator: asking the plugin for a chunk, giving idle chunks back, and the size
of the chunk a miss asks for (the mechanism around alloc_policy's growth rules). Called by allocator.pyx with the
allocator's lock held and no GIL; never on the cached allocation path."""
from libc.stdint cimport uintptr_t, int64_t, SIZE_MAX
from libc.stdlib cimport malloc as c_malloc, free as c_free
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc

from paddle_rt._core.device_ext cimport C_Status, C_SUCCESS, C_WARNING, C_FAILED
from paddle_rt._core.allocator cimport (
    AllocatorCore, AllocError, Block, Chunk, KIND_HOST, POOL_LARGE, ST_RESERVED_BYTES, ST_SEGMENT,
    ERR_NONE, ERR_OOM, ERR_PLUGIN, ERR_PLUGIN_NULL, ERR_HOST_OOM,
)
from paddle_rt._core.alloc_index cimport stat_add, new_block, drop_block, index_insert, index_remove
from paddle_rt._core.alloc_blocks cimport _q_flush, _trace_mem
from paddle_rt._core.alloc_policy cimport (
    consolidates_before_growth, chunk_for_miss, growth_base, ramp_ended,
)
from paddle_rt._core.stream cimport stream_device_idle
from paddle_rt._core.includes.alloc_support cimport prt_free_set
from paddle_rt._core.includes.trace_support cimport prt_tracing, PRT_TRACE_MEMORY, PRT_EV_SEGMENT_ALLOC, PRT_EV_SEGMENT_FREE
from paddle_rt._core.trace cimport trace_mask


cdef inline C_Status _plugin_alloc(AllocatorCore* c, size_t size, void** out) noexcept nogil:
    cdef C_Status st = c.iface.set_device(c.cdev)
    if st != C_SUCCESS and st != C_WARNING:
        return st
    if c.kind == KIND_HOST:
        return c.iface.host_memory_allocate(c.cdev, out, size)
    return c.iface.device_memory_allocate(c.cdev, out, size)


cdef void plugin_free(AllocatorCore* c, uintptr_t ptr, size_t size) noexcept nogil:
    c.iface.set_device(c.cdev)
    if c.kind == KIND_HOST:
        c.iface.host_memory_deallocate(c.cdev, <void*>ptr, size)
    else:
        c.iface.device_memory_deallocate(c.cdev, <void*>ptr, size)
    c.num_device_free += 1


cdef inline int _plugin_alloc_outcome(C_Status st, void* p) noexcept nogil:
    """What the plugin's answer to an allocation means: ERR_NONE (memory), ERR_OOM (C_FAILED: out of memory),
    ERR_PLUGIN_NULL (success with a NULL pointer for a non-zero size: the plugin broke the ABI's contract; paddle_rt
    names it rather than retrying it as out of memory) or ERR_PLUGIN (any other failure status)."""
    if st == C_SUCCESS or st == C_WARNING:
        return ERR_PLUGIN_NULL if p == NULL else ERR_NONE
    return ERR_OOM if st == C_FAILED else ERR_PLUGIN


# A new chunk of `size` bytes; NULL with err.kind set (ERR_OOM, ERR_PLUGIN or ERR_PLUGIN_NULL) on failure.
cdef Block* new_chunk(AllocatorCore* c, int pool, uintptr_t stream, size_t size, AllocError* err) noexcept nogil:
    cdef void* p = NULL
    cdef C_Status st
    cdef Chunk* ch
    cdef Block* b
    cdef int64_t reserved = c.stats[0][ST_RESERVED_BYTES].current
    if c.cfg.limit != SIZE_MAX and (<size_t>reserved > c.cfg.limit or size > c.cfg.limit - <size_t>reserved):
        err.kind = ERR_OOM
        return NULL
    st = _plugin_alloc(c, size, &p)
    err.kind = _plugin_alloc_outcome(st, p)
    if err.kind != ERR_NONE:
        err.status = st
        return NULL
    ch = <Chunk*>c_malloc(sizeof(Chunk))
    b = new_block(c)
    if ch == NULL or b == NULL:
        plugin_free(c, <uintptr_t>p, size)
        if ch != NULL:
            c_free(ch)
        if b != NULL:
            drop_block(c, b)
        err.kind = ERR_HOST_OOM
        return NULL
    c.num_device_alloc += 1
    ch.base = <uintptr_t>p
    ch.serial = c.chunk_serial
    c.chunk_serial += 1
    ch.size = size
    ch.stream = stream
    ch.pool = pool
    ch.exact = 0
    b.addr = <uintptr_t>p
    b.size = size
    b.stream = stream
    b.chunk = ch
    c.cx.chunks[ch.base] = <void*>ch
    stat_add(c, pool, ST_RESERVED_BYTES, <int64_t>size)
    stat_add(c, pool, ST_SEGMENT, 1)
    index_insert(c, b)
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_SEGMENT_ALLOC, ch.base, size, stream)
    return b


# Whether memory of this allocator may go back to the plugin now: every stream that may still use it (the device's;
# every device's for pinned host memory, which copies on any device read) has completed everything submitted so
# far. A free is stream-ordered (the block is reusable at once by its stream), so an idle chunk can still be the
# target of queued work; plugins free at once (unlike cudaFree, which synchronizes). Release paths only.
cdef bint streams_idle(AllocatorCore* c) noexcept nogil:
    return stream_device_idle(NULL if c.kind == KIND_HOST else c.device)


# Give one idle chunk (b is its single free block) back to the plugin (outside teardown: after streams_idle).
cdef void release_chunk(AllocatorCore* c, Block* b) noexcept nogil:
    cdef Chunk* ch = b.chunk
    index_remove(c, b)
    c.cx.chunks.erase(ch.base)
    stat_add(c, ch.pool, ST_RESERVED_BYTES, -<int64_t>ch.size)
    stat_add(c, ch.pool, ST_SEGMENT, -1)
    if ch.exact:
        c.exact_bytes -= ch.size
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_SEGMENT_FREE, ch.base, ch.size, ch.stream)
    plugin_free(c, ch.base, ch.size)
    c_free(ch)
    drop_block(c, b)


# Give back every idle chunk of `pool` (-1: all pools) and `stream` (only_stream=0: every stream). Returns bytes.
# While streams are busy (streams_idle) nothing is released: the chunks stay cached (num_release_deferred).
cdef size_t release_idle(AllocatorCore* c, int pool, int only_stream, uintptr_t stream) noexcept nogil:
    cdef vector[Block*] idle
    cdef prt_free_set.iterator it
    cdef Block* b
    cdef size_t total = 0
    cdef int p
    _q_flush(c)
    for p in range(2):
        if pool != -1 and p != pool:
            continue
        it = c.cx.free_blocks[p].begin()
        while it != c.cx.free_blocks[p].end():
            b = <Block*>deref(it).block
            if b.prev == NULL and b.next == NULL and (not only_stream or b.stream == stream):
                idle.push_back(b)
            inc(it)
    if idle.empty():
        if pool == -1 and not only_stream:
            c.release_kept = 0
        return 0
    if not streams_idle(c):
        c.num_release_deferred += <int64_t>idle.size()
        c.release_kept = 1
        return 0
    if pool == -1 and not only_stream:
        c.release_kept = 0
    for b in idle:
        total += b.size
        release_chunk(c, b)
    return total


# Size of the chunk to ask for on a miss of `size` bytes: the policy's choice (alloc_policy.chunk_for_miss), after
# consolidating idle chunks when the policy says so, rounded to the plugin's alignment and cut to the limit.
cdef size_t growth_size(AllocatorCore* c, int pool, uintptr_t stream, size_t size) noexcept nogil:
    cdef size_t released = 0, want, reserved, a
    cdef bint settled = False
    reserved = growth_base(&c.cfg, <size_t>c.stats[0][ST_RESERVED_BYTES].current, c.exact_bytes, size)
    if consolidates_before_growth(&c.cfg, pool):
        released = release_idle(c, POOL_LARGE, 1, stream)
    if pool == POOL_LARGE:
        # cache hits since the last large-pool growth (both counters restart with reset_accumulated_stats)
        settled = ramp_ended(&c.cfg, c.num_cache_hits - c.hits_at_growth)
        c.hits_at_growth = c.num_cache_hits
    want = chunk_for_miss(&c.cfg, pool, size, reserved, released, settled)
    a = c.cfg.alignment
    if want <= SIZE_MAX - a:
        want = ((want + a - 1) // a) * a
    if c.cfg.limit != SIZE_MAX:
        reserved = <size_t>c.stats[0][ST_RESERVED_BYTES].current
        if reserved < c.cfg.limit and want > c.cfg.limit - reserved and c.cfg.limit - reserved >= size:
            want = c.cfg.limit - reserved
    return want
