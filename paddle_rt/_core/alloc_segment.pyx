# cython: freethreading_compatible = False
"""Segments (chunks) of the caching allocator: asking the plugin for a chunk, giving idle chunks back, the size
of the chunk a miss asks for (the mechanism around alloc_policy's growth rules), expandable ranges, and where an
address lies among the segments. Called by allocator.pyx with the allocator's lock held and no GIL; never on the
cached allocation path."""
from libc.stdint cimport uintptr_t, int64_t, uint64_t, SIZE_MAX
from libc.stdlib cimport malloc as c_malloc, calloc as c_calloc, realloc as c_realloc, free as c_free
from libc.string cimport memset
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc, predecrement as dec

from paddle_rt._core.device_ext cimport C_Status, C_SUCCESS, C_WARNING, C_FAILED
from paddle_rt._core.alloc_types cimport (
    AllocatorCore, AllocError, Block, Chunk, N_QUICK_SLOTS, KIND_HOST, POOL_SMALL, POOL_LARGE, ST_RESERVED_BYTES,
    ST_SEGMENT, ERR_NONE, ERR_WAIT, ERR_OOM, ERR_PLUGIN, ERR_PLUGIN_NULL, ERR_HOST_OOM, ERR_BAD_SIZE,
    N_RANGES, HeldPhys,
    REL_NONE, REL_FREE, REL_UNMAP, REL_RELEASE, REL_FREE_RANGE, REL_HOST_OOM, VMM_CALL_RESERVE, VMM_CALL_CREATE,
    VMM_CALL_MAP, VMM_CALL_MAP_PAGES,
)
from paddle_rt._core.includes.vmm_ext cimport PaddleRtVmmPhys
from paddle_rt._core.alloc_index cimport (
    stat_add, new_block, drop_block, index_insert, index_remove, lowest_key, index_split, pool_of,
)
from paddle_rt._core.alloc_blocks cimport _q_flush, _trace_mem, handed_out, take_at, span_unmapped, _take
from paddle_rt._core.alloc_policy cimport (
    consolidates_before_growth, waits_for_frees, chunk_for_miss, growth_base, ramp_ended, serves, borrows_from_large,
    SETTLED_SCAN,
)
from paddle_rt._core.alloc_order cimport free_done, want_wait
from paddle_rt._core.includes.alloc_support cimport prt_free_set, prt_chunk_map, prt_push
from paddle_rt._core.includes.trace_support cimport (
    prt_tracing, PRT_TRACE_MEMORY, PRT_EV_SEGMENT_ALLOC, PRT_EV_SEGMENT_FREE, PRT_EV_SEGMENT_MAP, PRT_EV_SEGMENT_UNMAP,
)
from paddle_rt._core.trace cimport trace_mask
from paddle_rt._core import errors


cdef inline C_Status _plugin_alloc(AllocatorCore* c, size_t size, void** out) noexcept nogil:
    cdef C_Status st = c.iface.set_device(c.cdev)
    if st != C_SUCCESS and st != C_WARNING:
        return st
    if c.kind == KIND_HOST:
        return c.iface.host_memory_allocate(c.cdev, out, size)
    return c.iface.device_memory_allocate(c.cdev, out, size)


cdef C_Status plugin_free(AllocatorCore* c, uintptr_t ptr, size_t size) noexcept nogil:
    cdef C_Status st
    c.iface.set_device(c.cdev)
    if c.kind == KIND_HOST:
        st = c.iface.host_memory_deallocate(c.cdev, <void*>ptr, size)
    else:
        st = c.iface.device_memory_deallocate(c.cdev, <void*>ptr, size)
    if st != C_SUCCESS and st != C_WARNING:
        return st
    c.num_device_free += 1
    return C_SUCCESS


# ---------------------------------------------------------------------------------------------------------------------
# When the plugin refuses to give memory back (a release-side call fails: device_memory_deallocate, the extension's
# unmap, release, free_range). The books follow the plugin's state: what the plugin still holds stays counted in
# reserved memory and is retried at the next release point (empty_cache, the OOM ladder, release on free). A chunk
# whose free failed stays a chunk, idle; a page whose unmap failed stays mapped; a physical allocation whose release
# failed is held (AllocatorCore.held); a range whose free_range failed stays, empty. The refusal is recorded
# (rel_call, rel_status) and reported once the lock is released: empty_cache raises PluginError, the other release
# points warn (report_refusal).
# ---------------------------------------------------------------------------------------------------------------------
cdef inline void _refused(AllocatorCore* c, int call, C_Status st) noexcept nogil:
    """Record a refusal: the first one since the last report is the one reported (later ones often follow from it)."""
    if c.rel_call == REL_NONE:
        c.rel_call = call
        c.rel_status = st
    c.num_release_failures += 1


cdef int take_refusal(AllocatorCore* c, C_Status* st) noexcept nogil:
    """Lock held: the refused call recorded since the last report (REL_NONE: none) and its status; clears it."""
    cdef int call = c.rel_call
    st[0] = c.rel_status
    c.rel_call = REL_NONE
    return call


def _call_name(int call, int kind, bint batched):
    if call == REL_FREE:
        return "host_memory_deallocate" if kind == KIND_HOST else "device_memory_deallocate"
    if call == REL_UNMAP:
        return "paddle_rt_ext_vmm_unmap_pages" if batched else "paddle_rt_ext_vmm_unmap"
    if call == REL_RELEASE:
        return "paddle_rt_ext_vmm_release"
    if call == REL_FREE_RANGE:
        return "paddle_rt_ext_vmm_free_range"
    return "the allocator's bookkeeping"


cdef int report_refusal(AllocatorCore* c, int call, C_Status st, int64_t released, int64_t reserved,
                        bint warn) except -1 with gil:
    """Report a refused release-side call (take_refusal): PluginError naming the device and the call (warn=0:
    empty_cache, which released `released` bytes), or a RuntimeWarning (the other release points)."""
    import warnings
    dev = str(<object>c.device)
    kept = (f"what the plugin still holds stays counted{f' ({reserved} bytes reserved)' if reserved >= 0 else ''} and "
            f"is given back at the next release point")
    if call == REL_HOST_OOM:
        msg = f"{dev}: out of host memory for the allocator's bookkeeping while giving memory back; {kept}"
        if warn:
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            return 0
        raise MemoryError(msg + (f" (empty_cache released {released} bytes)" if released >= 0 else ""))
    name = _call_name(call, c.kind, c.vmm.unmap_pages != NULL)
    if warn:
        warnings.warn(f"{dev}: {name} failed with {errors.STATUS_NAMES.get(<int>st, <int>st)}: the plugin refused "
                      f"to give memory back; {kept}", RuntimeWarning, stacklevel=2)
        return 0
    e = errors.PluginError(dev, name, st, f"the plugin refused to give memory back; empty_cache released {released} "
                                          f"bytes, and {kept}")
    e.released = int(released)
    raise e


cdef inline int _plugin_alloc_outcome(C_Status st, void* p) noexcept nogil:
    """What the plugin's answer to an allocation means: ERR_NONE (memory), ERR_OOM (C_FAILED: out of memory),
    ERR_PLUGIN_NULL (success with a NULL pointer for a non-zero size: the plugin broke the ABI's contract; paddle_rt
    names it rather than retrying it as out of memory) or ERR_PLUGIN (any other failure status)."""
    if st == C_SUCCESS or st == C_WARNING:
        return ERR_PLUGIN_NULL if p == NULL else ERR_NONE
    return ERR_OOM if st == C_FAILED else ERR_PLUGIN


cdef inline void _name_chunk(AllocatorCore* c, Chunk* ch, uintptr_t base, int pool, uintptr_t stream) noexcept nogil:
    """What identifies a new chunk: its base, its serial number (order of creation), its pool and stream tag."""
    ch.base = base
    ch.serial = c.chunk_serial
    c.chunk_serial += 1
    ch.pool = pool
    ch.stream = stream


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
    _name_chunk(c, ch, <uintptr_t>p, pool, stream)
    ch.size = size
    ch.exact = 0
    ch.expandable = 0
    ch.vsize = size
    ch.phys = NULL
    ch.holes = 0
    ch.tail = b
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


# Cross-stream reuse (the stream-ordered pool's policies over the allocator's free blocks): the smallest free block of
# stream tag `tag`'s memory, within SETTLED_SCAN index entries of the best fit, that serves `size` with every page
# under it mapped and whose frees the caller may follow: free_seq <= seq_ok (the caller's stream already waits for
# that much of the stream's work, or the host saw it run), or, with done_ok, they have run (free_done). NULL: none.
cdef Block* settled_fit(AllocatorCore* c, uintptr_t tag, size_t size, uint64_t seq_ok, bint done_ok) noexcept nogil:
    cdef prt_free_set.iterator it
    cdef Block* b
    cdef int p, n, first = POOL_SMALL if c.vmm_on and size < index_split(c) else pool_of(c, size)
    _q_flush(c)
    for p in range(first, 2):
        it = c.cx.free_blocks[p].lower_bound(lowest_key(tag, size))
        n = 0
        while it != c.cx.free_blocks[p].end() and deref(it).stream == tag and n < SETTLED_SCAN:
            b = <Block*>deref(it).block
            if not serves(&c.cfg, b.size, size):
                break
            if (b.free_seq <= seq_ok or (done_ok and free_done(c, b))) and not (
                    b.chunk.holes and span_unmapped(b.chunk, take_at(c, b, size), handed_out(c, b, size), c.gran)):
                return b
            inc(it)
            n += 1
        if not c.vmm_on and not borrows_from_large(&c.cfg, p):
            break
    return NULL


# settled_fit's block for a request of nbytes (rounded: size), handed out with its stream's tag and marked as held by
# an Allocation (the pool's). held: its size, seq: its free_seq (which policy allowed it). NULL: none.
cdef Block* take_settled(AllocatorCore* c, size_t nbytes, size_t size, uintptr_t tag, uint64_t seq_ok, bint done_ok,
                         size_t* held, uint64_t* seq) noexcept nogil:
    cdef int fail = 0
    cdef Block* b = settled_fit(c, tag, size, seq_ok, done_ok)
    if b == NULL:
        return NULL
    seq[0] = b.free_seq
    c.num_cache_hits += 1
    b = _take(c, b, size, nbytes, &fail)
    if b != NULL:
        b.owned = 1
        held[0] = b.size
    return b


# Give one idle chunk (b is its single free block) back to the plugin (outside teardown: after streams_idle). The
# bytes released: 0 when the plugin refused (the chunk stays, idle and counted, retried at the next release point).
cdef size_t release_chunk(AllocatorCore* c, Block* b) noexcept nogil:
    cdef Chunk* ch = b.chunk
    cdef size_t size = ch.size
    cdef C_Status st
    if ch.expandable:
        return vmm_release(c, NULL)
    st = plugin_free(c, ch.base, ch.size)
    if st != C_SUCCESS:
        _refused(c, REL_FREE, st)
        c.release_kept = 1
        return 0
    index_remove(c, b)
    c.cx.chunks.erase(ch.base)
    stat_add(c, ch.pool, ST_RESERVED_BYTES, -<int64_t>ch.size)
    stat_add(c, ch.pool, ST_SEGMENT, -1)
    if ch.exact:
        c.exact_bytes -= ch.size
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_SEGMENT_FREE, ch.base, ch.size, ch.stream)
    c_free(ch)
    drop_block(c, b)
    return size


# Give back every idle chunk of `pool` (-1: all pools) and `stream` (only_stream=0: every stream). Returns bytes.
# A chunk (or page) whose frees have not run yet on its stream (free_done) stays cached, counted in
# num_release_deferred, and goes back at a later release point.
cdef size_t release_idle(AllocatorCore* c, int pool, int only_stream, uintptr_t stream) noexcept nogil:
    cdef vector[Block*] idle
    cdef prt_free_set.iterator it
    cdef Block* b
    cdef size_t total = 0
    cdef int64_t kept = 0
    cdef int p
    _q_flush(c)
    for p in range(2):
        if pool != -1 and p != pool:
            continue
        it = c.cx.free_blocks[p].begin()
        while it != c.cx.free_blocks[p].end():
            b = <Block*>deref(it).block
            if b.prev == NULL and b.next == NULL and not b.chunk.expandable and (not only_stream or b.stream == stream):
                if not free_done(c, b):
                    kept += 1        # queued work of its stream may still use it
                elif prt_push(idle, b) != 0:
                    _refused(c, REL_HOST_OOM, C_SUCCESS)     # the chunks not listed stay cached
                    break
            inc(it)
    if (c.n_ranges or c.n_held) and pool == -1 and not only_stream:
        total += vmm_release(c, &kept)
    if kept:
        c.num_release_deferred += kept
        c.release_kept = 1
    elif pool == -1 and not only_stream:
        c.release_kept = 0
    for b in idle:
        total += release_chunk(c, b)
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



# ---------------------------------------------------------------------------------------------------------------------
# Expandable segments (docs/expandable_segments.md): one reserved virtual range per (pool, stream tag), grown in place
# by mapping pages (the plugin's granularity) of physical memory at its end. Pages under free space inside a range may
# be unmapped: when a page is needed elsewhere and no new memory should be created for it (a "donor" page), and on
# empty_cache / the OOM ladder (every whole free page). A free block may therefore lie over unmapped pages (holes);
# before any part of such a block is handed out, the pages under that part are mapped again (vmm_back).
# ---------------------------------------------------------------------------------------------------------------------
cdef inline size_t _page_lo(Chunk* ch, uintptr_t a, size_t g) noexcept nogil:
    """The first whole page at or above address a (index in the range)."""
    return (a - ch.base + g - 1) // g


cdef inline size_t _page_hi(Chunk* ch, uintptr_t a, size_t g) noexcept nogil:
    """One past the last whole page ending at or below address a."""
    return (a - ch.base) // g


cdef int _vmm_status(AllocError* err, C_Status st, int call) noexcept nogil:
    """A failed call of the extension (VMM_CALL_*): out of memory for C_FAILED, else the plugin's error naming it."""
    err.status = st
    err.kind = ERR_OOM if st == C_FAILED else ERR_PLUGIN
    err.call = call
    return -1


cdef C_Status _map_pages(AllocatorCore* c, Chunk* ch, size_t first, void** hs, size_t n) noexcept nogil:
    """Map the physical allocations hs[0..n) (one page each) at pages first .. first + n - 1 of ch (unmapped), all or
    nothing: one call of the plugin's batched map when it has one, else one call per page (those made are undone
    when one fails). The plugin's status."""
    cdef size_t g = c.gran, k, j
    cdef C_Status st = C_SUCCESS, ust
    if c.vmm.map_pages != NULL:
        st = c.vmm.map_pages(c.cdev, <void*>ch.base, first * g, <const PaddleRtVmmPhys*>hs, n, g)
    else:
        for k in range(n):
            st = c.vmm.map(c.cdev, <void*>ch.base, (first + k) * g, <PaddleRtVmmPhys>hs[k], g)
            if st != C_SUCCESS:
                for j in range(k):
                    ust = c.vmm.unmap(c.cdev, <void*>ch.base, (first + j) * g, g)
                    if ust != C_SUCCESS:          # the page stays mapped: counted as such, not released by the caller
                        _refused(c, REL_UNMAP, ust)
                        _mark_mapped(c, ch, first + j, &hs[j], 1)
                        hs[j] = NULL
                break
    if st != C_SUCCESS:
        return st
    _mark_mapped(c, ch, first, hs, n)
    return C_SUCCESS


cdef void _mark_mapped(AllocatorCore* c, Chunk* ch, size_t first, void** hs, size_t n) noexcept nogil:
    """The books of pages first .. first + n - 1 of ch, mapped with hs[0..n): counters and the event."""
    cdef size_t g = c.gran, k
    for k in range(n):
        ch.phys[first + k] = hs[k]
    ch.holes -= n
    c.num_maps += <int64_t>n
    stat_add(c, ch.pool, ST_RESERVED_BYTES, <int64_t>(n * g))
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_SEGMENT_MAP, ch.base + first * g, n * g, ch.stream)


cdef size_t _plugin_unmap(AllocatorCore* c, Chunk* ch, size_t first, size_t n) noexcept nogil:
    """The plugin calls that unmap pages first .. first + n - 1 of ch: one batched call when the plugin has one
    (all or nothing), else one call per page up to the first the plugin refuses (recorded: _refused). How many of
    the pages, from `first`, are unmapped."""
    cdef size_t g = c.gran, k
    cdef C_Status st
    if c.vmm.unmap_pages != NULL:
        st = c.vmm.unmap_pages(c.cdev, <void*>ch.base, first * g, n, g)
        if st != C_SUCCESS:
            _refused(c, REL_UNMAP, st)
            return 0
        return n
    for k in range(n):
        st = c.vmm.unmap(c.cdev, <void*>ch.base, (first + k) * g, g)
        if st != C_SUCCESS:
            _refused(c, REL_UNMAP, st)
            return k
    return n


cdef size_t _unmap_pages(AllocatorCore* c, Chunk* ch, size_t first, size_t n) noexcept nogil:
    """Unmap pages first .. first + n - 1 of ch (each mapped), keeping their physical allocations (the caller read
    them from ch.phys), with the counters and the event. How many of them, from `first`, are unmapped: the pages
    the plugin refused to unmap stay mapped and counted."""
    cdef size_t g = c.gran, k
    n = _plugin_unmap(c, ch, first, n)
    if n == 0:
        return 0
    for k in range(n):
        ch.phys[first + k] = NULL
    ch.holes += n
    c.num_unmaps += <int64_t>n
    stat_add(c, ch.pool, ST_RESERVED_BYTES, -<int64_t>(n * g))
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_SEGMENT_UNMAP, ch.base + first * g, n * g, ch.stream)
    return n


cdef size_t _take_pages(AllocatorCore* c, Chunk* ch, size_t a, size_t z, Chunk* excl, size_t lo, size_t hi,
                        size_t want, vector[void*]& out) noexcept nogil:
    """Unmap up to `want` mapped pages among pages a .. z - 1 of ch (not pages lo .. hi - 1 of excl), run by run,
    appending their physical allocations to out. How many were taken: it stops at a run the plugin refuses to unmap
    (those pages stay mapped) or that host memory cannot list (REL_HOST_OOM; nothing of that run is unmapped)."""
    cdef size_t i = a, j, n, got = 0, start
    while i < z and got < want:
        if ch.phys[i] == NULL or (ch == excl and lo <= i < hi):
            i += 1
            continue
        j = i
        start = out.size()
        while j < z and got + (j - i) < want and ch.phys[j] != NULL and not (ch == excl and lo <= j < hi):
            if prt_push(out, ch.phys[j]) != 0:
                out.resize(start)
                _refused(c, REL_HOST_OOM, C_SUCCESS)
                return got
            j += 1
        n = _unmap_pages(c, ch, i, j - i)
        got += n
        if n < j - i:
            out.resize(start + n)      # the pages from i + n on stay mapped (their handles are still in ch.phys)
            return got
        i = j
    return got


cdef enum:
    DONOR_TAKE = 0       # _donor_walk: unmap the pages of blocks whose frees have run
    DONOR_COUNT = 1      # count them only
    DONOR_QUEUED = 2     # count the pages of blocks whose frees are still queued, recording each to be waited for


cdef size_t _donor_walk(AllocatorCore* c, Chunk* excl, size_t lo, size_t hi, size_t want, int mode,
                        vector[void*]* out) noexcept nogil:
    """Up to `want` mapped pages that lie wholly inside free blocks of any range (not pages lo .. hi - 1 of `excl`),
    largest blocks first: with DONOR_TAKE unmapped (a run of pages per unmap) and their physical allocations appended
    to out; with DONOR_COUNT / DONOR_QUEUED only counted (DONOR_QUEUED: of blocks whose frees are still queued, each
    recorded with alloc_order.want_wait). How many."""
    cdef prt_free_set.iterator it
    cdef Block* b
    cdef Chunk* ch
    cdef size_t g = c.gran, got = 0, i, n
    cdef int r
    for r in range(c.n_ranges):
        ch = c.ranges[r]
        if ch.stream == <uintptr_t>-1:
            it = c.cx.free_blocks[ch.pool].end()
        else:
            it = c.cx.free_blocks[ch.pool].lower_bound(lowest_key(ch.stream + 1, 0))
        while it != c.cx.free_blocks[ch.pool].begin() and got < want:
            dec(it)
            if deref(it).stream != ch.stream or deref(it).size < g:
                break
            b = <Block*>deref(it).block
            if not b.chunk.expandable or free_done(c, b) == (mode == DONOR_QUEUED):
                continue
            if mode == DONOR_TAKE:
                got += _take_pages(c, b.chunk, _page_lo(b.chunk, b.addr, g), _page_hi(b.chunk, b.addr + b.size, g),
                                   excl, lo, hi, want - got, out[0])
                continue
            n = 0
            for i in range(_page_lo(b.chunk, b.addr, g), _page_hi(b.chunk, b.addr + b.size, g)):
                if b.chunk.phys[i] != NULL and not (b.chunk == excl and lo <= i < hi):
                    n += 1
            if n and mode == DONOR_QUEUED:
                want_wait(c, b)
            got += n
        if got >= want:
            break
    return got


cdef size_t _release_one(AllocatorCore* c, void* h, int pool) noexcept nogil:
    """Give one unmapped physical allocation back: 1, or 0 when the plugin refused and it is now held (counted in
    pool's reserved bytes, retried by _retry_held)."""
    cdef C_Status st = c.vmm.release(c.cdev, <PaddleRtVmmPhys>h)
    cdef HeldPhys* grown
    cdef size_t cap
    if st == C_SUCCESS:
        c.num_device_free += 1
        return 1
    _refused(c, REL_RELEASE, st)
    if c.n_held == c.cap_held:
        cap = c.cap_held * 2 if c.cap_held else 16
        grown = <HeldPhys*>c_realloc(c.held, cap * sizeof(HeldPhys))
        if grown == NULL:
            _refused(c, REL_HOST_OOM, C_SUCCESS)   # not even listed: the one thing the books lose
            return 0
        c.held = grown
        c.cap_held = cap
    c.held[c.n_held].handle = h
    c.held[c.n_held].pool = pool
    c.n_held += 1
    stat_add(c, pool, ST_RESERVED_BYTES, <int64_t>c.gran)
    return 0


cdef size_t _release_handles(AllocatorCore* c, vector[void*]& hs, size_t start, int pool) noexcept nogil:
    """Give the (unmapped) physical allocations hs[start:] (NULL entries skipped) back to the device; those the plugin
    refuses are held, counted in `pool`. How many were released."""
    cdef size_t k, n = 0
    for k in range(start, hs.size()):
        if hs[k] != NULL:
            n += _release_one(c, hs[k], pool)
    return n


cdef size_t _retry_held(AllocatorCore* c) noexcept nogil:
    """Release again the physical allocations the plugin refused before; those it refuses again stay held. Bytes
    released."""
    cdef size_t k, j = 0, n = 0
    cdef C_Status st
    for k in range(c.n_held):
        st = c.vmm.release(c.cdev, <PaddleRtVmmPhys>c.held[k].handle)
        if st == C_SUCCESS:
            c.num_device_free += 1
            stat_add(c, c.held[k].pool, ST_RESERVED_BYTES, -<int64_t>c.gran)
            n += 1
        else:
            _refused(c, REL_RELEASE, st)
            c.held[j] = c.held[k]
            j += 1
    c.n_held = j
    return n * c.gran


cdef int vmm_back(AllocatorCore* c, Block* b, uintptr_t at, size_t size, AllocError* err) noexcept nogil:
    """Map every page under [at, at + size) of free block b (in an expandable range) that is not mapped: with donor
    pages when there are any (only while the streams are idle), else with new physical allocations; each run of
    missing pages with one map call when the plugin has the batched calls. 0, or -1 with err set. On failure the
    pages this call created are unmapped and released again (as PyTorch's expandable segments do), and donor pages
    it took but did not map go back to the device, so a request the device cannot hold leaves nothing behind; donor
    pages it already mapped stay (they were reserved before)."""
    cdef Chunk* ch = b.chunk
    cdef size_t g = c.gran
    cdef size_t lo = (at - ch.base) // g
    cdef size_t hi = (at + size - ch.base + g - 1) // g
    cdef size_t i, k, k0, nd, n
    cdef void* h
    cdef C_Status st
    cdef int64_t reserved
    cdef vector[size_t] miss
    cdef vector[void*] hs
    for i in range(lo, hi):
        if ch.phys[i] == NULL and prt_push(miss, i) != 0:
            err.kind = ERR_HOST_OOM
            return -1
    n = miss.size()
    if n == 0:
        return 0
    # donor pages are unmapped at once: only from free blocks whose frees have run on their stream (free_done: work
    # queued before a free may still write the block). When those are too few and this pass may wait, the caller waits
    # for the queued frees of the others first (waits_for_frees) and comes back.
    if c.may_wait:
        nd = _donor_walk(c, ch, lo, hi, n, DONOR_COUNT, NULL)
        if nd < n and waits_for_frees(nd, _donor_walk(c, ch, lo, hi, n - nd, DONOR_QUEUED, NULL), n):
            err.kind = ERR_WAIT
            return -1
    _donor_walk(c, ch, lo, hi, n, DONOR_TAKE, &hs)
    nd = hs.size()
    reserved = c.stats[0][ST_RESERVED_BYTES].current       # donors are not counted while in hand
    for k in range(nd, n):
        if c.cfg.limit != SIZE_MAX and (reserved < 0 or <size_t>reserved > c.cfg.limit or
                                        (k + 1) * g > c.cfg.limit - <size_t>reserved):
            _release_handles(c, hs, 0, ch.pool)
            err.kind = ERR_OOM
            return -1
        h = NULL
        st = c.vmm.create(c.cdev, g, <PaddleRtVmmPhys*>&h)
        if st != C_SUCCESS or h == NULL:
            _release_handles(c, hs, 0, ch.pool)
            if st == C_SUCCESS:
                _vmm_status(err, st, VMM_CALL_CREATE)
                err.kind = ERR_PLUGIN_NULL
                err.status = st
                err.call = VMM_CALL_CREATE
                return -1
            return _vmm_status(err, st, VMM_CALL_CREATE)
        c.num_device_alloc += 1
        if prt_push(hs, h) != 0:
            _release_handles(c, hs, 0, ch.pool)
            _release_one(c, h, ch.pool)
            err.kind = ERR_HOST_OOM
            return -1
    k0 = 0
    while k0 < n:
        k = k0 + 1
        while k < n and miss[k] == miss[k - 1] + 1:
            k += 1
        st = _map_pages(c, ch, miss[k0], &hs[k0], k - k0)
        if st != C_SUCCESS:
            _release_handles(c, hs, k0, ch.pool)
            _undo_created(c, ch, miss, nd, k0)
            return _vmm_status(err, st, VMM_CALL_MAP_PAGES if c.vmm.map_pages != NULL else VMM_CALL_MAP)
        k0 = k
    return 0


cdef void _undo_created(AllocatorCore* c, Chunk* ch, vector[size_t]& miss, size_t start, size_t end) noexcept nogil:
    """Unmap and release pages miss[start:end] of ch, which one vmm_back call created and mapped (it failed
    later). A page the plugin refuses to unmap stays mapped (under the free block: vmm_release retries it)."""
    cdef size_t k, i
    cdef void* h
    for k in range(start, end):
        i = miss[k]
        h = ch.phys[i]
        if _unmap_pages(c, ch, i, 1) == 1:
            _release_one(c, h, ch.pool)


cdef Chunk* _new_range(AllocatorCore* c, int pool, uintptr_t stream, size_t at_least, AllocError* err) noexcept nogil:
    """Reserve a new range for (pool, stream) of the device's capacity (at least `at_least`), with no block."""
    cdef size_t g = c.gran
    cdef size_t v = c.capacity if c.capacity else (<size_t>1 << 40)
    cdef void* base = NULL
    cdef Chunk* ch
    cdef C_Status st
    if c.n_ranges >= N_RANGES:
        err.kind = ERR_OOM
        return NULL
    if at_least > v:
        v = at_least
    if v > SIZE_MAX - g:
        err.kind = ERR_BAD_SIZE
        return NULL
    v = (v + g - 1) // g * g
    ch = <Chunk*>c_malloc(sizeof(Chunk))
    if ch == NULL:
        err.kind = ERR_HOST_OOM
        return NULL
    memset(ch, 0, sizeof(Chunk))
    ch.phys = <void**>c_calloc(v // g, sizeof(void*))
    if ch.phys == NULL:
        c_free(ch)
        err.kind = ERR_HOST_OOM
        return NULL
    st = c.vmm.reserve(c.cdev, v, &base)
    if st != C_SUCCESS or base == NULL:
        c_free(ch.phys)
        c_free(ch)
        _vmm_status(err, st, VMM_CALL_RESERVE)
        if st == C_SUCCESS:
            err.kind = ERR_PLUGIN_NULL
            err.status = st
            err.call = VMM_CALL_RESERVE
            return NULL
        _vmm_status(err, st, VMM_CALL_RESERVE)
        return NULL
    _name_chunk(c, ch, <uintptr_t>base, pool, stream)
    ch.vsize = v
    ch.expandable = 1
    c.ranges[c.n_ranges] = ch
    c.n_ranges += 1
    c.cx.chunks[ch.base] = <void*>ch
    stat_add(c, pool, ST_SEGMENT, 1)
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_SEGMENT_ALLOC, ch.base, 0, stream)
    return ch


cdef Block* vmm_grow(AllocatorCore* c, int pool, uintptr_t stream, size_t size, AllocError* err) noexcept nogil:
    """On a miss of `size` bytes: the range of (pool, stream) grows at its end so that its last block is free and
    holds at least `size` bytes (the missing pages are not mapped yet: vmm_back maps them). Returns that block (in
    the free index), or NULL with err set."""
    cdef Chunk* ch = NULL
    cdef Block* t
    cdef Block* nb
    cdef size_t have = 0, need, g = c.gran
    cdef int r
    for r in range(c.n_ranges - 1, -1, -1):
        if c.ranges[r].pool == pool and c.ranges[r].stream == stream:
            ch = c.ranges[r]
            break
    if ch != NULL and ch.tail != NULL and ch.tail.allocated == 0:
        have = ch.tail.size
    if size > SIZE_MAX - g:
        err.kind = ERR_BAD_SIZE
        return NULL
    need = (size - have + g - 1) // g * g
    if ch == NULL or need > ch.vsize - ch.size:
        # a range of its own: sized for the whole request (not only the part the old range's free end lacked)
        have = 0
        need = (size + g - 1) // g * g
        if c.capacity and need > c.capacity:
            err.kind = ERR_OOM              # more than the device holds: no range (nor its page table) for it
            return NULL
        ch = _new_range(c, pool, stream, need, err)
        if ch == NULL:
            return NULL
    t = ch.tail
    if have:
        index_remove(c, t)
        t.size += need
        index_insert(c, t)
    else:
        nb = new_block(c)
        if nb == NULL:
            err.kind = ERR_HOST_OOM
            return NULL
        nb.addr = ch.base + ch.size
        nb.size = need
        nb.stream = stream
        nb.chunk = ch
        nb.prev = t
        if t != NULL:
            t.next = nb
        ch.tail = nb
        index_insert(c, nb)
        t = nb
    ch.size += need
    ch.holes += need // g
    return t


cdef Block* vmm_grow_backed(AllocatorCore* c, int pool, uintptr_t stream, size_t size,
                            AllocError* err) noexcept nogil:
    """vmm_grow, then the pages under the block's first `size` bytes mapped (vmm_back): the block is ready to hand
    out. NULL with err set."""
    cdef Block* b = vmm_grow(c, pool, stream, size, err)
    if b != NULL and b.chunk.holes and vmm_back(c, b, b.addr, handed_out(c, b, size), err) != 0:
        return NULL
    return b


cdef void _free_range(AllocatorCore* c, Chunk* ch) noexcept nogil:
    """Give an empty range (no block, nothing mapped) back to the plugin. When the plugin refuses, the range stays
    (empty, in c.ranges: vmm_grow may grow it again, vmm_release frees it again)."""
    cdef int r, j = 0
    cdef C_Status st = c.vmm.free_range(c.cdev, <void*>ch.base, ch.vsize)
    if st != C_SUCCESS:
        _refused(c, REL_FREE_RANGE, st)
        return
    c.cx.chunks.erase(ch.base)
    stat_add(c, ch.pool, ST_SEGMENT, -1)
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_SEGMENT_FREE, ch.base, 0, ch.stream)
    for r in range(c.n_ranges):
        if c.ranges[r] != ch:
            c.ranges[j] = c.ranges[r]
            j += 1
    c.n_ranges = j
    c_free(ch.phys)
    c_free(ch)


cdef inline size_t _last_mapped(Chunk* ch, size_t a, size_t z, size_t g) noexcept nogil:
    """The end (bytes from the base) of the last mapped page among pages a .. z - 1 of ch; a * g when none is."""
    while z > a and ch.phys[z - 1] == NULL:
        z -= 1
    return z * g


cdef size_t vmm_release(AllocatorCore* c, int64_t* kept) noexcept nogil:
    """Unmap every mapped page that lies wholly inside a free block whose frees have run (free_done) and give its
    physical memory back (and what the plugin refused before: _retry_held); cut each range's free end back to the
    last page it still needs; give back ranges left with no block. Returns the bytes released (what the plugin
    refuses stays counted: _refused); adds the free blocks left mapped (their streams still run work queued before
    their frees) to *kept (NULL: not counted)."""
    cdef size_t total = _retry_held(c), g = c.gran, keep
    cdef prt_free_set.iterator it
    cdef Block* b
    cdef Block* t
    cdef Chunk* ch
    cdef vector[void*] hs
    cdef int p, r
    for p in range(2):
        it = c.cx.free_blocks[p].begin()
        while it != c.cx.free_blocks[p].end():
            b = <Block*>deref(it).block
            inc(it)
            if not b.chunk.expandable or b.size < g:
                continue
            if not free_done(c, b):
                if kept != NULL:
                    kept[0] += 1
                continue
            hs.clear()
            _take_pages(c, b.chunk, _page_lo(b.chunk, b.addr, g), _page_hi(b.chunk, b.addr + b.size, g), NULL, 0, 0,
                        SIZE_MAX, hs)
            total += _release_handles(c, hs, 0, b.chunk.pool) * g
    r = c.n_ranges - 1
    while r >= 0:
        ch = c.ranges[r]
        r -= 1
        t = ch.tail
        if t == NULL and ch.size == 0:
            _free_range(c, ch)                     # an empty range whose free_range the plugin refused before
            continue
        if t == NULL or t.allocated != 0 or not free_done(c, t):
            continue
        keep = _page_lo(ch, t.addr, g) * g         # the pages below the free end that other blocks touch
        keep = _last_mapped(ch, keep // g, ch.size // g, g)    # and those the plugin refused to unmap
        if keep >= ch.size:
            continue
        index_remove(c, t)
        ch.holes -= (ch.size - keep) // g
        t.size -= ch.size - keep
        ch.size = keep
        if t.size == 0:
            ch.tail = t.prev
            if t.prev != NULL:
                t.prev.next = NULL
            drop_block(c, t)
        else:
            index_insert(c, t)
        if ch.size == 0:
            _free_range(c, ch)
    return total


cdef void vmm_teardown(AllocatorCore* c) noexcept nogil:
    """Interpreter exit: every page unmapped and released, every range given back (live blocks included)."""
    cdef Chunk* ch
    cdef size_t i, j, m, npages
    cdef int r
    for r in range(c.n_ranges):
        ch = c.ranges[r]
        npages = ch.size // c.gran
        i = 0
        while i < npages:             # run by run; no counter or event (the interpreter is going away)
            if ch.phys[i] == NULL:
                i += 1
                continue
            j = i
            while j < npages and ch.phys[j] != NULL:
                j += 1
            m = i + _plugin_unmap(c, ch, i, j - i)    # pages the plugin refuses to unmap cannot be released
            while i < m:
                c.vmm.release(c.cdev, <PaddleRtVmmPhys>ch.phys[i])
                ch.phys[i] = NULL
                i += 1
            i = j
        c.vmm.free_range(c.cdev, <void*>ch.base, ch.vsize)
    c.n_ranges = 0
    for i in range(c.n_held):
        c.vmm.release(c.cdev, <PaddleRtVmmPhys>c.held[i].handle)
    c.n_held = 0


cdef size_t vmm_mapped_runs(Chunk* ch, size_t g, size_t* out, size_t cap) noexcept nogil:
    """The mapped pages of range ch as runs (offset, length) in out[2k], out[2k+1], at most cap runs; returns how many."""
    cdef size_t i, n = 0, npages = ch.size // g
    i = 0
    while i < npages and n < cap:
        if ch.phys[i] == NULL:
            i += 1
            continue
        out[2 * n] = i * g
        while i < npages and ch.phys[i] != NULL:
            i += 1
        out[2 * n + 1] = i * g - out[2 * n]
        n += 1
    return n


# Where an address lies among the segments (lock held; the ownership questions of free, owns and raw copies).
cdef Chunk* chunk_holding(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    """Lock held: the chunk whose [base, base + size) holds ptr, or NULL."""
    cdef prt_chunk_map.iterator it = c.cx.chunks.upper_bound(ptr)
    cdef Chunk* ch
    if it == c.cx.chunks.begin():
        return NULL
    dec(it)
    ch = <Chunk*>(deref(it).second)
    return ch if ptr < ch.base + ch.size else NULL


cdef int owns(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    if c.cx.live.find(ptr) != NULL:
        return 1
    return 2 if chunk_holding(c, ptr) != NULL else 0


cdef int64_t live_extent(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    """Lock held: bytes from ptr to the end of the bytes requested of the live block holding it (Block.requested:
    the rounding past them belongs to no allocation), or -1 when ptr lies in no live block's [addr, addr + requested]
    (its end included: an empty range there is valid, as for malloc(0)). A block's start is one lookup; an address
    inside a block walks its chunk's blocks down from the top (parked blocks stay linked, so nothing is flushed)."""
    cdef Block* b = <Block*>c.cx.live.find(ptr)
    cdef Chunk* ch
    if b != NULL:
        return <int64_t>b.requested
    ch = chunk_holding(c, ptr)
    b = ch.tail if ch != NULL else NULL
    while b != NULL and b.addr > ptr:
        b = b.prev
    if b == NULL or b.allocated != 1 or ptr > b.addr + b.requested:
        return -1
    return <int64_t>(b.addr + b.requested - ptr)


cdef int is_free_block_start(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    cdef Chunk* ch = chunk_holding(c, ptr)
    cdef prt_free_set.iterator fi
    cdef int p
    cdef Block* q
    if ch == NULL:
        return 0
    for p in range(N_QUICK_SLOTS):
        q = c.q_head[p]
        while q != NULL:
            if q.addr == ptr:
                return 1
            q = q.qnext
    # walk the free indexes for a free block starting at ptr (error path only; a range's small blocks are indexed
    # apart from its large ones: alloc_index.index_of)
    for p in range(2):
        fi = c.cx.free_blocks[p].begin()
        while fi != c.cx.free_blocks[p].end():
            if deref(fi).addr == ptr:
                return 1
            inc(fi)
    return 0
