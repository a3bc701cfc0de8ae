# The caching allocator's policy decisions, one small named function each (inline, nogil, stateless: they read the
# resolved configuration and the figures they are given). allocator.pyx is the mechanism that calls them: it holds
# no `if paddle_compat` branch; paddle_compat is a preset of these settings (alloc_config.resolve).
from libc.stdint cimport SIZE_MAX, int64_t, uint64_t

from paddle_rt._core.alloc_types cimport (
    AllocConfig, POOL_SMALL, POOL_LARGE, GROWTH_ADAPTIVE, GROWTH_EXACT, GROWTH_FIXED, RELEASE_ON_FREE,
    ROUND_NEAREST, ROUND_UP, ROUND_DOWN, ROUND_WITHIN, CONSOLIDATE_FOLD, CONSOLIDATE_OFF, BASE_GROWN,
)

cdef inline int pool_for(const AllocConfig* cfg, size_t size, bint ranges) noexcept nogil:
    """Small requests (up to small_size) come from the small pool's chunks, the rest from the large pool. With
    expandable segments (`ranges`) every size shares the large pool's range of its stream: a small pool's range of
    its own would end in a part-used page of its own (on the corpus's small logs that page was 2-5% of the peak)."""
    if not ranges and cfg.small_size != 0 and size <= cfg.small_size:
        return POOL_SMALL
    return POOL_LARGE


cdef inline bint parks_quick(const AllocConfig* cfg, int pool, size_t size, bint ranges, int64_t parked_bytes,
                             size_t page) noexcept nogil:
    """Whether a freed block may wait, unmerged, in a quick-reuse slot for the next request of its size: a small
    pool's block; with expandable segments (one range for every size) a block of at most small_size while the
    blocks waiting hold less than one page (parked blocks do not merge with their free neighbours, so in a shared
    range they can keep free space from forming whole pages: bounded so, they cost at most about one page). Parked
    blocks are merged back before any growth or mapping."""
    if pool == POOL_SMALL:
        return True
    return (ranges and cfg.small_size != 0 and size <= cfg.small_size and
            parked_bytes + <int64_t>size <= <int64_t>page)


cdef inline bint borrows_from_large(const AllocConfig* cfg, int pool) noexcept nogil:
    """Whether a small request that no free block of the small pool serves first looks for one in the large pool
    (small_borrow), before the small pool grows: the free end of a large chunk serves it instead of a new small
    chunk that small workloads would hold mostly unused."""
    return pool == POOL_SMALL and cfg.small_borrow != 0


cdef inline bint serves(const AllocConfig* cfg, size_t block, size_t size) noexcept nogil:
    """Whether a free block of `block` bytes may serve a request of `size` (max_split_size: oversize blocks serve
    only oversize requests)."""
    return cfg.max_split_size == SIZE_MAX or size > cfg.max_split_size or block <= cfg.max_split_size


cdef inline bint splits(const AllocConfig* cfg, size_t block, size_t size) noexcept nogil:
    """Whether serving `size` from a free block of `block` bytes leaves the rest as a free block."""
    return block > size and (cfg.max_split_size == SIZE_MAX or block <= cfg.max_split_size)


cdef inline size_t _whole_pages(size_t lo, size_t hi, size_t g) noexcept nogil:
    """Bytes of the whole pages of g bytes (a power of two) inside [lo, hi) (offsets from a page-aligned base)."""
    cdef size_t a = (lo + g - 1) & ~(g - 1)
    cdef size_t z = hi & ~(g - 1)
    return z - a if z > a else 0


cdef inline bint places_high(size_t off, size_t block, size_t size, size_t g) noexcept nogil:
    """In an expandable range, where a split of a free block (at offset `off` of the range, `block` bytes) puts an
    allocation of `size`: at the high end when that leaves more whole free pages in the remainder than the low end
    does. A whole free page can be unmapped and used elsewhere; a part-used one stays mapped, so this keeps the
    pages under live blocks fewest. g is the granularity, a power of two (the handshake checks it)."""
    return _whole_pages(off, off + block - size, g) > _whole_pages(off + size, off + block, g)


# How many next-larger free blocks of the stream a request looks at when the best fit in an expandable range lies over
# pages that are not mapped (alloc_blocks.mapped_fit). The first that needs no page mapped is taken instead: mapping
# means moving a page from a hole (an unmap and a map, about 4 us on rt_cpu) or creating one, where a somewhat larger
# block costs nothing until it is freed. On the corpus this cut the pages moved on most logs by half or more, with every
# peak within its target. The bound keeps the search cheaper than the map call it may save; no log of the corpus
# looks further than it.
cdef enum:
    MAPPED_FIT_SCAN = 64

# How many free blocks of another stream (from the best fit up) a cross-stream request of the stream-ordered pool
# looks at for one whose frees it may follow (alloc_segment.settled_fit): the best fit may still be in use by work
# queued on its stream where a slightly larger one is not. A bound keeps a miss cheap; past it the allocator grows.
cdef enum:
    SETTLED_SCAN = 64


cdef inline bint remainder_low(const AllocConfig* cfg) noexcept nogil:
    """Where a split puts the free remainder: the low end of the block (Paddle's rule) or the high end."""
    return cfg.remainder_low != 0


cdef inline uint64_t tie_rank(const AllocConfig* cfg, uint64_t chunk_serial) noexcept nogil:
    """Among free blocks of the best size, which serves first: the oldest chunk (its serial number; placement then
    does not depend on the addresses the plugin returns), or with ties_by_address the lowest address (Paddle)."""
    return 0 if cfg.ties_by_address else chunk_serial


cdef inline bint consolidates_before_growth(const AllocConfig* cfg, int pool) noexcept nogil:
    """Adaptive growth of the large pool first gives idle chunks back (consolidate: fold or release), so the new
    chunk replaces them."""
    return cfg.growth == GROWTH_ADAPTIVE and pool == POOL_LARGE and cfg.consolidate != CONSOLIDATE_OFF


cdef inline bint waits_for_frees(size_t ready, size_t queued, size_t need) noexcept nogil:
    """A growth that could use `need` units of memory already cached (donor pages, idle chunks to consolidate), of which
    `ready` have had their frees run on their streams and `queued` have not yet, waits for the queued frees first
    when the ready ones fall short: the device then holds what it holds with the host waiting, as cudaFree (which
    synchronizes) and PyTorch's expandable segments (which synchronize the stream before an unmap) do."""
    return queued != 0 and ready < need


cdef inline bint made_for_one_request(int pool, size_t chunk, size_t size) noexcept nogil:
    """Whether a new chunk of `chunk` bytes, made on a miss of `size` bytes, is exactly that request's: a large-pool
    chunk no larger than the (rounded) request. Such a chunk (the weights of a model, one oversize tensor) says
    nothing about how the pool's other requests grow, so grow_base:grown leaves it out of growth_base."""
    return pool == POOL_LARGE and chunk <= size


cdef inline size_t growth_base(const AllocConfig* cfg, size_t reserved, size_t exact_bytes,
                               size_t size) noexcept nogil:
    """What adaptive growth's target and cap are proportional to, on a miss of `size` bytes: everything the allocator
    holds (grow_base:reserved), or (grow_base:grown) that with the held chunks made exactly for one request
    (made_for_one_request) counted for at most grow_exact_credit requests of the missing size. One huge chunk (a
    model's weights) then does not inflate the steps of the small requests after it, while a miss as large as the
    exact chunks (a run of big activations) still counts them."""
    cdef size_t credit
    if cfg.grow_base != BASE_GROWN or exact_bytes > reserved:
        return reserved
    credit = SIZE_MAX if size != 0 and cfg.grow_exact_credit > SIZE_MAX // size else cfg.grow_exact_credit * size
    return reserved - exact_bytes + (exact_bytes if exact_bytes < credit else credit)


cdef inline size_t grow_cap(const AllocConfig* cfg, size_t reserved) noexcept nogil:
    """The most adaptive growth aims at: max(grow_step, grow_fraction * reserved)."""
    cdef size_t cap = <size_t>(<double>reserved * cfg.grow_fraction)
    return cap if cap > cfg.grow_step else cfg.grow_step


cdef inline size_t grow_target(const AllocConfig* cfg, size_t reserved, size_t cap) noexcept nogil:
    """The chunk adaptive growth aims at, from what the allocator holds: grow_ratio * reserved, at least grow_min,
    at most `cap` (grow_cap)."""
    cdef size_t want = <size_t>(<double>reserved * cfg.grow_ratio)
    if want < cfg.grow_min:
        want = cfg.grow_min
    return want if want < cap else cap


cdef inline size_t request_bound(const AllocConfig* cfg, size_t want, size_t size) noexcept nogil:
    """`want` at most grow_requests requests of the missing `size` (0: no bound): a small request after the pool has
    grown large (a 0.2 MiB tensor once activations fill tens of MiB) does not make a chunk far beyond what it and
    its like need."""
    if cfg.grow_requests != 0 and size <= SIZE_MAX // cfg.grow_requests and want > cfg.grow_requests * size:
        return cfg.grow_requests * size
    return want


cdef inline size_t whole_requests(const AllocConfig* cfg, size_t want, size_t cap, size_t size) noexcept nogil:
    """`want` made a whole number of requests of `size` (grow_round: the nearest, the next one up, the one below,
    or the next one up but no more than fit in `cap`; at least one), so that the chunk's tail is not a useless
    remainder for the next request of the same size."""
    cdef size_t k, m
    if want > SIZE_MAX - size:
        return want                  # absurd settings (grow_min near SIZE_MAX): no rounding rather than overflow
    if cfg.grow_round == ROUND_NEAREST:
        k = (want + size // 2) // size
    elif cfg.grow_round == ROUND_UP:
        k = (want + size - 1) // size
    elif cfg.grow_round == ROUND_DOWN:
        k = want // size
    elif cfg.grow_round == ROUND_WITHIN:
        k = (want + size - 1) // size
        m = cap // size
        if k > m:
            k = m
    else:
        return want
    return size * (k if k > 0 else 1)


cdef inline bint large_for_step(const AllocConfig* cfg, size_t want, size_t size) noexcept nogil:
    """Whether a missing request of `size` is large for a growth step aiming at `want` bytes: at least exact_above *
    want (0: never). Such a request gets a chunk of its own size, as Paddle and PyTorch give large requests their
    own blocks, instead of a step of whole requests that may end in an unused one."""
    return cfg.exact_above != 0.0 and <double>size >= cfg.exact_above * <double>want


cdef inline bint ramp_ended(const AllocConfig* cfg, int64_t hits_since_growth) noexcept nogil:
    """Whether the growth ramp is over: at least settle_after allocations were served from the cache since the last
    large-pool growth (0: never). A miss after such a steady phase is a late, rare demand, not the pool still filling
    up, so it grows by the least step (chunk_for_miss)."""
    return cfg.settle_after != 0 and hits_since_growth >= <int64_t>cfg.settle_after


cdef inline size_t chunk_for_miss(const AllocConfig* cfg, int pool, size_t size, size_t reserved,
                                  size_t released, bint settled=False) noexcept nogil:
    """Bytes to ask the plugin for when no free block serves a rounded request of `size` bytes. `reserved`: the growth
    base before the miss (growth_base: what the allocator held, with grow_base:grown less its chunks made exactly for
    one request); `released`: what consolidation just gave back; `settled`: the growth ramp is over (ramp_ended),
    so the target is grow_min alone."""
    cdef size_t want, cap
    if cfg.growth == GROWTH_FIXED:
        return size if size >= cfg.chunk_size else cfg.chunk_size
    if cfg.growth == GROWTH_EXACT:
        return size
    if pool == POOL_SMALL:
        return size if size > cfg.small_chunk else cfg.small_chunk
    cap = grow_cap(cfg, reserved)
    want = request_bound(cfg, cfg.grow_min if settled else grow_target(cfg, reserved, cap), size)
    if large_for_step(cfg, want, size):
        want = size
    elif want > size:
        want = whole_requests(cfg, want, cap, size)
    if cfg.consolidate == CONSOLIDATE_FOLD and size + released > want:
        want = size + released
    return want if want > size else size


cdef inline bint releases_on_free(const AllocConfig* cfg) noexcept nogil:
    """A free that makes a chunk idle gives it back to the plugin at once (release:free), not at empty_cache."""
    return cfg.release == RELEASE_ON_FREE
