# The allocator's counters and its index of free blocks (allocator.pyx's mechanism, called with the lock held):
# inline nogil helpers over the C++ containers of includes/alloc_support.pxd. Only allocator.pyx cimports them.
from libc.stdint cimport uintptr_t, int64_t
from libc.stdlib cimport malloc as c_malloc
from libc.string cimport memset
from cython.operator cimport dereference as deref

from paddle_rt._core.alloc_types cimport (
    AllocatorCore, Block, Stat, ST_INACTIVE_SPLIT_BYTES, ST_INACTIVE_SPLIT, POOL_SMALL, POOL_LARGE, N_STATS,
)
from paddle_rt._core.alloc_policy cimport pool_for, serves, tie_rank
from paddle_rt._core.includes.alloc_support cimport prt_free_set, prt_free_key, prt_free_rekey, prt_free_move


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


cdef inline void zero_accumulated(AllocatorCore* c) noexcept nogil:
    """The allocated/freed totals and the num_* counters to 0 (lock held)."""
    cdef int i, p
    for p in range(3):
        for i in range(N_STATS):
            c.stats[p][i].allocated = 0
            c.stats[p][i].freed = 0
    c.num_alloc_retries = c.num_ooms = c.num_device_alloc = c.num_device_free = 0
    c.num_cache_hits = c.num_release_deferred = c.num_maps = c.num_unmaps = c.num_release_failures = 0
    c.hits_at_growth = 0      # alloc_policy.ramp_ended counts hits from here


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


# Which of the two indexes holds free block b: its chunk's pool; in an expandable range, where blocks of every size
# share one range, a block below index_split(c) bytes goes in the small index. The large requests' cached path then
# searches and re-keys among large blocks only, as with chunks. Best fit is unchanged: every block of the small index
# is smaller than every block of the large one, and best_fit_range searches the small index first.
cdef inline size_t index_split(AllocatorCore* c) noexcept nogil:
    return c.gran if c.gran <= c.cfg.small_size else c.cfg.small_size + 1


cdef inline int index_of(AllocatorCore* c, Block* b) noexcept nogil:
    if b.chunk.expandable and b.size < index_split(c):
        return POOL_SMALL
    return b.chunk.pool


cdef inline void index_insert(AllocatorCore* c, Block* b) noexcept nogil:
    cdef prt_free_key k = key_of(c, b, <void*>b)
    c.cx.free_blocks[index_of(c, b)].insert(k)
    b.counted_split = 0
    split_count(c, b)


cdef inline void index_remove(AllocatorCore* c, Block* b) noexcept nogil:
    cdef prt_free_key k = key_of(c, b, NULL)
    c.cx.free_blocks[index_of(c, b)].erase(k)
    split_uncount(c, b)


# The index entry of free block b (b's fields must still hold the key it was indexed with).
cdef inline prt_free_set.iterator index_find(AllocatorCore* c, Block* b) noexcept nogil:
    cdef prt_free_key k = key_of(c, b, NULL)
    return c.cx.free_blocks[index_of(c, b)].find(k)


# Point the index entry `it` (of index `was`: index_of the block it was found for) at block nb with nb's current
# size and address.
cdef inline void index_rekey(AllocatorCore* c, int was, prt_free_set.iterator it, Block* nb) noexcept nogil:
    cdef prt_free_key k = key_of(c, nb, <void*>nb)
    cdef int now = index_of(c, nb)
    if now == was:
        prt_free_rekey(c.cx.free_blocks[now], it, k)
    else:
        prt_free_move(c.cx.free_blocks[was], it, c.cx.free_blocks[now], k)


cdef inline int pool_of(AllocatorCore* c, size_t size) noexcept nogil:
    return pool_for(&c.cfg, size, c.vmm_on)


# The lowest index key of `stream` with at least `size` bytes (a lower bound to search from).
cdef inline prt_free_key lowest_key(uintptr_t stream, size_t size) noexcept nogil:
    cdef prt_free_key k
    k.stream = stream
    k.size = size
    k.chunk = 0
    k.addr = 0
    k.block = NULL
    return k


cdef inline Block* best_fit(AllocatorCore* c, int pool, uintptr_t stream, size_t size) noexcept nogil:
    cdef prt_free_set.iterator it = c.cx.free_blocks[pool].lower_bound(lowest_key(stream, size))
    if it == c.cx.free_blocks[pool].end():
        return NULL
    if deref(it).stream != stream:
        return NULL
    cdef Block* b = <Block*>deref(it).block
    if not serves(&c.cfg, b.size, size):
        return NULL
    return b


# Best fit in expandable ranges (index_of): the small index first, for a request that a block there can serve.
cdef inline Block* best_fit_range(AllocatorCore* c, uintptr_t stream, size_t size) noexcept nogil:
    cdef Block* b = NULL
    if size < index_split(c):
        b = best_fit(c, POOL_SMALL, stream, size)
    if b == NULL:
        b = best_fit(c, POOL_LARGE, stream, size)
    return b
