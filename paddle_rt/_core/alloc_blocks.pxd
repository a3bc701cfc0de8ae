# Blocks inside chunks (allocator.pyx's mechanism, called with the lock held): handing out part of a free block,
# merging a freed block with its free neighbours, the quick-reuse slots, and the allocation/free counters and events.
# Inline nogil helpers over alloc_index.pxd; cimported by allocator.pyx (the hot path) and alloc_segment.pyx.
from libc.stdint cimport uintptr_t, int64_t, uint64_t
from cython.operator cimport dereference as deref, preincrement as inc

from paddle_rt._core.alloc_types cimport (
    AllocatorCore, Block, Chunk, N_QUICK_SLOTS, POOL_LARGE, ST_ALLOCATED_BYTES, ST_RESERVED_BYTES, ST_REQUESTED_BYTES,
    ST_ALLOCATION, ST_INACTIVE_SPLIT_BYTES, ST_INACTIVE_SPLIT, ERR_HOST_OOM,
)
from paddle_rt._core.alloc_index cimport (
    stat_add, new_block, drop_block, index_insert, index_remove, split_uncount, split_count, index_find, index_rekey,
    index_of, lowest_key,
)
from paddle_rt._core.alloc_policy cimport splits, serves, remainder_low, places_high, MAPPED_FIT_SCAN
from paddle_rt._core.includes.alloc_support cimport prt_free_set
from paddle_rt._core.includes.trace_support cimport prt_tracing, PRT_TRACE_MEMORY, PRT_EV_ALLOC
from paddle_rt._core.trace cimport trace_mask, trace_memory_event


cdef inline bint _takes_high(AllocatorCore* c, Block* b, size_t size) noexcept nogil:
    """Whether a split of free block b for `size` puts the allocation at b's high end (the remainder low)."""
    if not splits(&c.cfg, b.size, size):
        return False
    if remainder_low(&c.cfg):
        return True
    return b.chunk.expandable != 0 and b.next != NULL and places_high(b.addr - b.chunk.base, b.size, size, c.gran)


# How many bytes _take hands out for `size` from free block b: `size` when it splits b, else all of b (an oversize
# block under max_split_size is not split).
cdef inline size_t handed_out(AllocatorCore* c, Block* b, size_t size) noexcept nogil:
    return size if splits(&c.cfg, b.size, size) else b.size


# Where the allocation of `size` from free block b will start (_take's placement).
cdef inline uintptr_t take_at(AllocatorCore* c, Block* b, size_t size) noexcept nogil:
    return b.addr + (b.size - size) if _takes_high(c, b, size) else b.addr


# Whether a page under [addr, addr + size) of expandable range ch is not mapped (only asked while ch has holes).
cdef inline bint span_unmapped(Chunk* ch, uintptr_t addr, size_t size, size_t g) noexcept nogil:
    cdef size_t i = (addr - ch.base) // g
    cdef size_t hi = (addr + size - ch.base + g - 1) // g
    while i < hi:
        if ch.phys[i] == NULL:
            return True
        i += 1
    return False


# The best fit b of a request in an expandable range lies over unmapped pages: the next free block of b's stream in
# index order (larger, or as large and later) that serves `size` with every page under the part handed out mapped, or
# NULL (none within MAPPED_FIT_SCAN entries, alloc_policy). Past the small index's end the search goes on in the
# large index.
cdef inline Block* mapped_fit(AllocatorCore* c, Block* b, size_t size) noexcept nogil:
    cdef int p = index_of(c, b)
    cdef prt_free_set.iterator it = index_find(c, b)
    cdef Block* x
    cdef int n
    for n in range(MAPPED_FIT_SCAN):
        inc(it)
        if it == c.cx.free_blocks[p].end() or deref(it).stream != b.stream:
            if p == POOL_LARGE:
                return NULL
            p = POOL_LARGE
            it = c.cx.free_blocks[p].lower_bound(lowest_key(b.stream, size))
            if it == c.cx.free_blocks[p].end() or deref(it).stream != b.stream:
                return NULL
        x = <Block*>deref(it).block
        if not serves(&c.cfg, x.size, size):
            return NULL
        if not x.chunk.holes or not span_unmapped(x.chunk, take_at(c, x, size), handed_out(c, x, size), c.gran):
            return x
    return NULL


# Hand out `size` bytes of the free block b (b is in the free index). Returns the allocated block.
cdef inline Block* _take(AllocatorCore* c, Block* b, size_t size, size_t requested, int* fail) noexcept nogil:
    cdef Block* r
    cdef size_t rest
    cdef prt_free_set.iterator it
    cdef int was
    rest = b.size - size
    if splits(&c.cfg, b.size, size):
        r = new_block(c)
        if r == NULL:
            fail[0] = ERR_HOST_OOM
            return NULL
        # b's index entry becomes the remainder's (re-keyed in place when the order allows)
        was = index_of(c, b)
        it = index_find(c, b)
        split_uncount(c, b)
        r.chunk = b.chunk
        r.stream = b.stream
        r.free_seq = b.free_seq
        r.size = rest
        if _takes_high(c, b, size):
            r.addr = b.addr
            r.prev = b.prev
            r.next = b
            if b.prev != NULL:
                b.prev.next = r
            b.prev = r
            b.addr = b.addr + rest
        else:
            r.addr = b.addr + size
            r.next = b.next
            r.prev = b
            if b.next != NULL:
                b.next.prev = r
            b.next = r
            if r.next == NULL:
                r.chunk.tail = r
        b.size = size
        index_rekey(c, was, it, r)
        split_count(c, r)
    else:
        index_remove(c, b)
    _count_alloc(c, b, requested)
    return b


# The event recorder (trace.pyx): one allocator event with the counters after it; called only while memory is traced.
cdef inline void _trace_mem(AllocatorCore* c, int ev, uintptr_t addr, uint64_t size, uintptr_t stream,
                     uint64_t requested=0) noexcept nogil:
    trace_memory_event(c.device, c.kind, ev, addr, size, stream, requested, c.stats[0][ST_ALLOCATED_BYTES].current,
                       c.stats[0][ST_RESERVED_BYTES].current)


cdef inline void _count_alloc(AllocatorCore* c, Block* b, size_t requested) noexcept nogil:
    cdef int pool = b.chunk.pool
    b.allocated = 1
    b.requested = requested
    b.owned = 0
    c.cx.live.insert(b.addr, <void*>b)
    stat_add(c, pool, ST_ALLOCATED_BYTES, <int64_t>b.size)
    stat_add(c, pool, ST_REQUESTED_BYTES, <int64_t>requested)
    stat_add(c, pool, ST_ALLOCATION, 1)
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_ALLOC, b.addr, b.size, b.stream, requested)


cdef inline int _q_slot(size_t size, uintptr_t stream) noexcept nogil:
    cdef uint64_t h = (<uint64_t>size ^ (<uint64_t>stream * 0x9E3779B97F4A7C15ULL)) * 0x9E3779B97F4A7C15ULL
    return <int>(h >> 58)           # the top 6 bits: one of N_QUICK_SLOTS (64)


cdef inline Block* _q_pop(AllocatorCore* c, size_t size, uintptr_t stream) noexcept nogil:
    cdef int i = _q_slot(size, stream)
    cdef Block* b = c.q_head[i]
    if b == NULL or c.q_size[i] != size or c.q_stream[i] != stream:
        return NULL
    c.q_head[i] = b.qnext
    c.q_count[i] -= 1
    c.q_blocks -= 1
    c.q_bytes -= <int64_t>size
    b.qnext = NULL
    if b.counted_split:
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT_BYTES, -<int64_t>b.size)
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT, -1)
        b.counted_split = 0
    return b


# Park a freed block (already uncounted as allocated) in its quick slot; 0 when the slot is full or taken.
cdef inline int _q_push(AllocatorCore* c, Block* b) noexcept nogil:
    cdef int i = _q_slot(b.size, b.stream)
    if c.q_count[i] != 0 and (c.q_size[i] != b.size or c.q_stream[i] != b.stream):
        return 0
    if c.q_count[i] >= 8:
        return 0
    c.q_size[i] = b.size
    c.q_stream[i] = b.stream
    b.qnext = c.q_head[i]
    c.q_head[i] = b
    c.q_count[i] += 1
    c.q_blocks += 1
    c.q_bytes += <int64_t>b.size
    b.allocated = 2
    if b.prev != NULL or b.next != NULL:
        b.counted_split = 1
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT_BYTES, <int64_t>b.size)
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT, 1)
    return 1


# `x` takes over its next neighbour by address (already out of the free index), which is dropped.
cdef inline void _absorb_next(AllocatorCore* c, Block* x) noexcept nogil:
    cdef Block* y = x.next
    x.size += y.size
    if y.free_seq > x.free_seq:
        x.free_seq = y.free_seq
    x.next = y.next
    if y.next != NULL:
        y.next.prev = x
    else:
        x.chunk.tail = x
    drop_block(c, y)


# A free block (allocated == 0, not indexed): merge with free neighbours, index it. A neighbour's index entry is
# re-keyed (in place when the order allows) instead of being removed and inserted again.
cdef inline Block* _merge_insert(AllocatorCore* c, Block* b) noexcept nogil:
    cdef Block* p = b.prev
    cdef Block* n = b.next
    cdef prt_free_set.iterator it
    cdef int was
    cdef bint pf = p != NULL and p.allocated == 0
    cdef bint nf = n != NULL and n.allocated == 0
    if pf:
        was = index_of(c, p)
        it = index_find(c, p)
        split_uncount(c, p)
        if nf:
            index_remove(c, n)
        _absorb_next(c, p)           # b
        if nf:
            _absorb_next(c, p)       # n
        index_rekey(c, was, it, p)
        split_count(c, p)
        return p
    if nf:
        was = index_of(c, n)
        it = index_find(c, n)
        split_uncount(c, n)
        _absorb_next(c, b)
        index_rekey(c, was, it, b)
        split_count(c, b)
        return b
    index_insert(c, b)
    return b


# Merge every parked block back into the best-fit index.
cdef inline void _q_flush(AllocatorCore* c) noexcept nogil:
    cdef int i
    cdef Block* b
    if c.q_blocks == 0:
        return
    for i in range(N_QUICK_SLOTS):
        while c.q_head[i] != NULL:
            b = c.q_head[i]
            c.q_head[i] = b.qnext
            b.qnext = NULL
            if b.counted_split:
                stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT_BYTES, -<int64_t>b.size)
                stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT, -1)
                b.counted_split = 0
            b.allocated = 0
            _merge_insert(c, b)
        c.q_count[i] = 0
    c.q_blocks = 0
    c.q_bytes = 0


# The lowest block of a chunk (lock held, quick slots flushed): the chunk's base block is live or free.
cdef inline Block* _first_block(AllocatorCore* c, Chunk* ch) noexcept nogil:
    cdef prt_free_set.iterator fi
    cdef Block* b = <Block*>c.cx.live.find(ch.base)
    cdef int p
    if b != NULL:
        return b
    for p in range(2):
        fi = c.cx.free_blocks[p].begin()
        while fi != c.cx.free_blocks[p].end():
            b = <Block*>deref(fi).block
            if b.addr == ch.base:
                return b
            inc(fi)
    return NULL
