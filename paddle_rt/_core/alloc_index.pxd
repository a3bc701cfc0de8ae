# The allocator's counters and its index of free blocks (allocator.pyx's mechanism, called with the lock held):
# inline nogil helpers over the C++ containers of includes/alloc_support.pxd. Only allocator.pyx cimports them.
from libc.stdint cimport uintptr_t, int64_t
from libc.stdlib cimport malloc as c_malloc
from libc.string cimport memset
from cython.operator cimport dereference as deref

from paddle_rt._core.alloc_types cimport (
    AllocatorCore, Block, Stat, ST_INACTIVE_SPLIT_BYTES, ST_INACTIVE_SPLIT,
)
from paddle_rt._core.alloc_policy cimport pool_for, serves, tie_rank
from paddle_rt._core.includes.alloc_support cimport prt_free_set, prt_free_key, prt_free_rekey


# Add d to counter `which` of the pool and of "all" (peak, allocated and freed totals follow).
cdef inline void stat_add(AllocatorCore* c, int pool, int which, int64_t d) noexcept nogil:
    cdef Stat* s
    cdef int i
    for i in range(2):
        s = &c.stats[0 if i == 0 else pool + 1][which]
        s.current += d
        if d > 0:
            s.allocated += d
            if s.current > s.peak:
                s.peak = s.current
        else:
            s.freed -= d


# Block structs come from a free list of spares.
cdef inline Block* new_block(AllocatorCore* c) noexcept nogil:
    cdef Block* b = c.spare_blocks
    if b != NULL:
        c.spare_blocks = b.next
    else:
        b = <Block*>c_malloc(sizeof(Block))
        if b == NULL:
            return NULL
    memset(b, 0, sizeof(Block))
    return b


cdef inline void drop_block(AllocatorCore* c, Block* b) noexcept nogil:
    b.next = c.spare_blocks
    c.spare_blocks = b


# A free block that is part of a split chunk counts as inactive split memory (PyTorch's inactive_split).
cdef inline void split_uncount(AllocatorCore* c, Block* b) noexcept nogil:
    if b.counted_split:
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT_BYTES, -<int64_t>b.size)
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT, -1)
        b.counted_split = 0


cdef inline void split_count(AllocatorCore* c, Block* b) noexcept nogil:
    if b.prev != NULL or b.next != NULL:
        b.counted_split = 1
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT_BYTES, <int64_t>b.size)
        stat_add(c, b.chunk.pool, ST_INACTIVE_SPLIT, 1)


# The index key of block b: (stream, size, tie rank of its chunk, address), with `payload` as the entry's block.
cdef inline prt_free_key key_of(AllocatorCore* c, Block* b, void* payload) noexcept nogil:
    cdef prt_free_key k
    k.stream = b.stream
    k.size = b.size
    k.chunk = tie_rank(&c.cfg, b.chunk.serial)
    k.addr = b.addr
    k.block = payload
    return k


cdef inline void index_insert(AllocatorCore* c, Block* b) noexcept nogil:
    cdef prt_free_key k = key_of(c, b, <void*>b)
    c.cx.free_blocks[b.chunk.pool].insert(k)
    b.counted_split = 0
    split_count(c, b)


cdef inline void index_remove(AllocatorCore* c, Block* b) noexcept nogil:
    cdef prt_free_key k = key_of(c, b, NULL)
    c.cx.free_blocks[b.chunk.pool].erase(k)
    split_uncount(c, b)


# The index entry of free block b (b's fields must still hold the key it was indexed with).
cdef inline prt_free_set.iterator index_find(AllocatorCore* c, Block* b) noexcept nogil:
    cdef prt_free_key k = key_of(c, b, NULL)
    return c.cx.free_blocks[b.chunk.pool].find(k)


# Point the index entry `it` at block nb with nb's current size and address.
cdef inline void index_rekey(AllocatorCore* c, prt_free_set.iterator it, Block* nb) noexcept nogil:
    cdef prt_free_key k = key_of(c, nb, <void*>nb)
    prt_free_rekey(c.cx.free_blocks[nb.chunk.pool], it, k)


cdef inline int pool_of(AllocatorCore* c, size_t size) noexcept nogil:
    return pool_for(&c.cfg, size, c.vmm_on)


cdef inline Block* best_fit(AllocatorCore* c, int pool, uintptr_t stream, size_t size) noexcept nogil:
    cdef prt_free_key k
    k.stream = stream
    k.size = size
    k.chunk = 0
    k.addr = 0
    k.block = NULL
    cdef prt_free_set.iterator it = c.cx.free_blocks[pool].lower_bound(k)
    if it == c.cx.free_blocks[pool].end():
        return NULL
    if deref(it).stream != stream:
        return NULL
    cdef Block* b = <Block*>deref(it).block
    if not serves(&c.cfg, b.size, size):
        return NULL
    return b
