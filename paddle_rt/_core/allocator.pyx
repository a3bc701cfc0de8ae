# cython: freethreading_compatible = False
"""The caching best-fit allocator: one per device (and one per device for pinned host memory).

Requests are rounded as Paddle rounds them: ``n -> round_up(n + extra_padding, min_chunk)`` with the plugin's
``device_extra_padding_size`` (0 when missing) and ``device_min_chunk_size`` (1 when missing). Free blocks are kept in
an ordered index by (stream, size, age of the chunk, address): the best fit is the smallest free block that fits, on a
tie the one in the oldest chunk (placement then does not depend on where the plugin's memory lies; paddle_compat:
the lowest address, as Paddle). A freed block merges with both neighbours inside its chunk. Every byte held from the plugin belongs to a chunk;
a chunk that is one whole free block is *idle* and can be given back.

Two policies (docs/memory.md has the rules and every key): ``paddle_compat:1`` reproduces Paddle's auto-growth
allocator exactly (one pool, the free remainder of a split at the low end, a miss asks for ``max(size, chunk_size)``,
idle chunks go back only on ``empty_cache`` and when an allocation fails). The default (paddle_rt's own) keeps
small requests (up to ``small_size``) in a pool of their own with quick-reuse slots (a freed small block waits
unmerged for the next request of exactly its size; every slot is merged back before the allocator grows, releases,
snapshots or reports stats), and sizes the chunk a miss asks for from the current demand
(alloc_policy.chunk_for_miss; growth in place on plugins with the virtual-memory extension:
docs/expandable_segments.md). A split puts the allocation at the low end of the free block.

Out of memory (a plugin returning ``C_FAILED``, or success with a NULL pointer, or the ``limit`` reached): the ladder
is best fit -> grow -> retry with exactly the request -> give back every idle chunk and retry -> (``malloc`` and
``raw_malloc``, when frees deferred by ``Allocation.record_stream`` are pending or streams are busy) wait until the
deferred frees' streams passed them, then until every stream of the device has run everything submitted so far
(not inside a stream callback), and retry the whole ladder once -> ``OutOfMemoryError``.

Giving memory back never races with queued work: a free is stream-ordered (reusable at once by its stream while
earlier work on it may still use the block) and plugins free at once, unlike ``cudaFree``. A free block remembers
where its stream was at its frees (``Block.free_seq``); its memory leaves the stream (donor pages, growth's
consolidation, the ladder, ``release:free``, ``empty_cache``) once the stream has run that far, a query of its
position (alloc_order.free_done); until then it stays cached, counted in ``num_release_deferred``. A growth that
such memory would serve, or made while ``record_stream`` frees are pending, waits for them first (alloc_order.pyx).
``empty_cache()`` waits for the streams first unless ``wait=False``. Teardown gives everything back.
Any other plugin status raises ``PluginError``. Nothing is changed by a failed allocation except that idle chunks given
back by the ladder stay given back. A release the plugin refuses: alloc_segment.pyx ("When the plugin refuses").

Configuration: the keys, their values and their precedence are documented in alloc_config.py.
"""
import os
import threading

cimport cython
from libc.stdint cimport uintptr_t, int64_t, uint64_t, SIZE_MAX
from libc.stdlib cimport malloc as c_malloc, free as c_free
from libc.string cimport memset, memcpy
from cython.operator cimport dereference as deref, preincrement as inc, predecrement as dec

from paddle_rt._core.device_ext cimport (
    C_DeviceInterface, C_Device, C_Status, C_SUCCESS, C_WARNING, C_FAILED, C_ERROR,
)
from paddle_rt._core.device cimport Device, resolve_device, device_host_addressable
from paddle_rt._core.plugin cimport Plugin
from paddle_rt._core.alloc_index cimport (
    stat_add, new_block, drop_block, index_insert, index_remove, split_uncount, split_count, index_find, index_rekey,
    pool_of, best_fit, best_fit_range, zero_accumulated,
)
from paddle_rt._core.alloc_policy cimport (
    pool_for, serves, splits, remainder_low, tie_rank, consolidates_before_growth, chunk_for_miss, releases_on_free,
    made_for_one_request, growth_base, ramp_ended, borrows_from_large, parks_quick,
)
from paddle_rt._core.alloc_blocks cimport (
    _take, take_at, handed_out, _trace_mem, _count_alloc, _q_pop, _q_push, _merge_insert, _q_flush, span_unmapped,
    mapped_fit,
)
from paddle_rt._core.alloc_segment cimport (
    plugin_free as _plugin_free, new_chunk as _new_chunk,
    release_chunk as _release_chunk, release_idle as _release_idle, growth_size as _growth, vmm_back, vmm_grow_backed,
    owns as _owns, live_extent as _live_extent, is_free_block_start as _is_free_block_start,
    vmm_teardown, take_settled as _take_settled, take_refusal, report_refusal,
)
from paddle_rt._core.alloc_order cimport (
    streams_idle as _streams_idle, free_done as _free_done, queued_consolidation, queued_deferred, caller_may_wait,
    growth_deadline, wait_queued_frees, MAX_GROWTH_WAITS,
)
from paddle_rt._core cimport alloc_snapshot
from paddle_rt._core.alloc_errors cimport raise_alloc_error
from paddle_rt._core.stream cimport Stream, stream_device_idle, stream_device_quiesce, stream_order_now
from paddle_rt._core.includes.atomics cimport prt_atomic_load_i64
from paddle_rt._core.includes.alloc_support cimport (
    prt_alloc_containers, prt_free_set, prt_free_key, prt_ptr_table, prt_chunk_map, prt_free_rekey,
)
from paddle_rt._core.includes.trace_support cimport (
    prt_tracing, PRT_TRACE_MEMORY, PRT_TRACE_STACKS, PRT_EV_ALLOC, PRT_EV_FREE, PRT_EV_SEGMENT_ALLOC,
    PRT_EV_SEGMENT_FREE, PRT_EV_OOM, PRT_EV_EMPTY_CACHE,
)
from paddle_rt._core.trace cimport trace_mask, trace_memory_event, trace_note_caller

from paddle_rt._core import errors
from paddle_rt._core import device as _device_mod

__all__ = ["DeviceAllocator", "get_allocator", "CONF_KEYS"]

cdef size_t KiB = 1024
cdef size_t MiB = 1024 * 1024


from paddle_rt._core.alloc_config import CONF_KEYS
from paddle_rt._core import alloc_config

_registry_lock = threading.RLock()
_allocators = []          # every DeviceAllocator ever created (they live as long as the process)
_torn_down = False


# Cached allocation only (lock held): a parked block of exactly this size, or the best fit. NULL on a miss.
# With may_map (the nogil path), pages of an expandable range under the part handed out are mapped first (vmm_back);
# without (the GIL path, which never calls the plugin), such a block is a miss.
cdef inline Block* _alloc_cached(AllocatorCore* c, size_t size, size_t nbytes, uintptr_t stream, AllocError* err,
                                 bint may_map=True) noexcept nogil:
    cdef Block* b
    cdef int pool
    cdef Block* x
    cdef uintptr_t at
    cdef size_t span
    if c.q_blocks:
        b = _q_pop(c, size, stream)
        if b != NULL:
            _count_alloc(c, b, nbytes)
            c.num_cache_hits += 1
            return b
    if c.vmm_on:
        b = best_fit_range(c, stream, size)
    else:
        pool = pool_of(c, size)
        b = best_fit(c, pool, stream, size)
        if b == NULL and borrows_from_large(&c.cfg, pool):
            b = best_fit(c, POOL_LARGE, stream, size)
    if b == NULL:
        return NULL
    if b.chunk.holes:
        at = take_at(c, b, size)
        span = handed_out(c, b, size)
        if span_unmapped(b.chunk, at, span, c.gran):
            x = mapped_fit(c, b, size)
            if x != NULL:
                b = x                   # a larger free block that needs no page mapped
            elif not may_map or c.q_blocks:
                return NULL     # mapping may create memory: parked blocks are merged first (the caller flushes)
            elif vmm_back(c, b, at, span, err) != 0:
                return NULL             # err names the extension's call that failed, with its status
    c.num_cache_hits += 1
    return _take(c, b, size, nbytes, &err.kind)


# Free a live pointer (lock held). Returns 1 when a plugin call is needed afterwards (release on free), 0 done,
# -1 when the pointer is not live here.
cdef inline int _free_locked(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    cdef Block* b = <Block*>c.cx.live.erase(ptr)
    cdef int pool
    if b == NULL:
        return -1
    b.free_seq = stream_order_now()    # the work submitted so far (on b's stream) may still use it
    pool = b.chunk.pool
    stat_add(c, pool, ST_ALLOCATED_BYTES, -<int64_t>b.size)
    stat_add(c, pool, ST_REQUESTED_BYTES, -<int64_t>b.requested)
    stat_add(c, pool, ST_ALLOCATION, -1)
    if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
        _trace_mem(c, PRT_EV_FREE, b.addr, b.size, b.stream, b.requested)
    b.requested = 0
    if c.quick and parks_quick(&c.cfg, pool, b.size, c.vmm_on, c.q_bytes, c.gran) and _q_push(c, b):
        return 0
    b.allocated = 0
    b = _merge_insert(c, b)
    if releases_on_free(&c.cfg) and b.prev == NULL and b.next == NULL:
        if not _free_done(c, b):
            # queued work may still use the memory (a stream-ordered free, or this is a stream's callback): keep it
            c.num_release_deferred += 1
            c.release_kept = 1
        elif c.release_kept:
            _release_idle(c, -1, 0, 0)       # this chunk and those kept earlier
        else:
            _release_chunk(c, b)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Raising (GIL taken only here, never with the lock held)
# ---------------------------------------------------------------------------------------------------------------------
cdef inline void _note_counts(AllocatorCore* c, AllocError* e) noexcept nogil:
    """Lock held: the device's counters, as the error's message and trace event will show them."""
    e.allocated = c.stats[0][ST_ALLOCATED_BYTES].current
    e.reserved = c.stats[0][ST_RESERVED_BYTES].current


cdef int _raise(AllocatorCore* c, AllocError* e) except -1 with gil:
    """The exception of error e (alloc_errors.raise_alloc_error; a foreign pointer is looked up among the allocators
    first, to name the device it belongs to)."""
    return raise_alloc_error(c, e, _owner_of(e.ptr, c) if e.kind == ERR_FOREIGN else None)


cdef inline void _new_error(AllocError* e, size_t nbytes) noexcept nogil:
    """No error yet, for a request of nbytes."""
    e.kind = ERR_NONE
    e.status = C_SUCCESS
    e.requested = nbytes
    e.ptr = 0
    e.allocated = e.reserved = 0
    e.call = VMM_CALL_NONE


cdef int64_t _live_extent_locked(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    """alloc_segment.live_extent under c's lock (core_lookup is the same for the owner code)."""
    cdef int64_t r
    c.cx.mu.lock()
    r = _live_extent(c, ptr)
    c.cx.mu.unlock()
    return r


cdef int64_t raw_live_extent(object device, int kind, uintptr_t ptr) except -2:
    cdef DeviceAllocator a
    cdef int64_t n = -1
    # a device's allocator is one lookup (copies and memsets of tensors come here); only "any device" walks them all
    for a in ([existing_allocator(<Device>device, kind)] if isinstance(device, Device) else list(_allocators)):
        if a is not None and not a.core.torn_down and a.core.kind == kind:
            with nogil:
                n = _live_extent_locked(a.core, ptr)
            if n >= 0:
                return n
    return -1


def owner_of(ptr):
    """Where ``ptr`` lies among paddle_rt's allocators ("rt_cpu:1", "rt_cpu:0 (pinned host memory)"), or None."""
    return _owner_of(ptr, NULL)


cdef object _owner_of(uintptr_t ptr, AllocatorCore* exclude):
    cdef DeviceAllocator a
    cdef int r = 0
    for a in list(_allocators):
        if a.core != exclude and not a.core.torn_down:
            with nogil:
                r = core_lookup(a.core, ptr)
            if r:
                return f"{a.device}{' (pinned host memory)' if a.core.kind == KIND_HOST else ''}"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# The C API
# ---------------------------------------------------------------------------------------------------------------------
# One attempt of core_malloc (lock held): the cache, then growth. NULL with err set; ERR_WAIT when c.may_wait and the
# growth should first wait for queued frees (c.wait_*).
cdef Block* _malloc_pass(AllocatorCore* c, int pool, size_t size, size_t nbytes, uintptr_t stream,
                         AllocError* err) noexcept nogil:
    cdef Block* b
    cdef size_t chunk
    b = _alloc_cached(c, size, nbytes, stream, err)
    if b == NULL and err.kind == ERR_NONE and c.q_blocks:
        _q_flush(c)
        b = _alloc_cached(c, size, nbytes, stream, err)
    if b == NULL and c.vmm_on and err.kind == ERR_NONE and queued_deferred(c):
        err.kind = ERR_WAIT
        return NULL
    if b == NULL and c.vmm_on and (err.kind == ERR_NONE or err.kind == ERR_OOM):
        b = _vmm_alloc(c, pool, stream, size, nbytes, err)
    elif b == NULL and err.kind == ERR_NONE:
        if queued_consolidation(c, pool, stream) or queued_deferred(c):
            err.kind = ERR_WAIT
            return NULL
        chunk = _growth(c, pool, stream, size)
        b = _new_chunk(c, pool, stream, chunk, err)
        if b == NULL and (err.kind == ERR_OOM or err.kind == ERR_PLUGIN_NULL) and chunk > size:
            # the larger chunk was paddle_rt's own idea: fall back to exactly the request (a plugin that answers
            # a request it cannot serve with success and NULL is named only when the request itself gets that)
            err.kind = ERR_NONE
            b = _new_chunk(c, pool, stream, size, err)
        if b == NULL and err.kind == ERR_OOM:
            c.num_alloc_retries += 1
            _release_idle(c, -1, 0, 0)
            err.kind = ERR_NONE
            b = _new_chunk(c, pool, stream, size, err)
            if b == NULL and err.kind == ERR_OOM:
                c.num_ooms += 1
        if b != NULL:
            if made_for_one_request(pool, b.size, size):
                b.chunk.exact = 1
                c.exact_bytes += b.size
            b = _take(c, b, size, nbytes, &err.kind)
    return b


cdef int core_malloc(AllocatorCore* c, size_t nbytes, uintptr_t stream, void** out) except -1 nogil:
    cdef AllocError err
    cdef Block* b
    cdef size_t size
    cdef int pool, rc = 0
    cdef C_Status rst = C_SUCCESS
    cdef bint may_wait
    cdef int waits = 0
    cdef int64_t deadline = 0
    _new_error(&err, nbytes)
    if nbytes > SIZE_MAX // 2:
        err.kind = ERR_BAD_SIZE
        return _raise(c, &err)
    if c.torn_down:
        err.kind = ERR_TORN_DOWN
        return _raise(c, &err)
    size = round_request(c, nbytes)
    pool = pool_of(c, size)
    may_wait = True
    c.cx.mu.lock()
    while True:
        if c.torn_down:
            c.cx.mu.unlock()
            err.kind = ERR_TORN_DOWN
            return _raise(c, &err)
        c.may_wait = may_wait and c.cfg.growth_wait_ns > 0
        c.n_waits = 0
        c.wait_deferred = 0
        b = _malloc_pass(c, pool, size, nbytes, stream, &err)
        c.may_wait = 0
        if b != NULL or err.kind != ERR_WAIT:
            break
        err.kind = ERR_NONE
        # a growth that memory with queued frees would serve: wait for them (lock released) when this caller may
        # wait (asked only here, off the hot path), then pass again; whatever other threads changed meanwhile, that
        # pass sees it. All of one call's waits end by one deadline (growth_wait_ms); past it, or after
        # MAX_GROWTH_WAITS, the pass grows without waiting.
        if waits == 0:
            if not caller_may_wait(c):
                may_wait = False
                continue
            deadline = growth_deadline(c)
        waits += 1
        if not wait_queued_frees(c, deadline) or waits >= MAX_GROWTH_WAITS:
            may_wait = False
    if b == NULL:
        _note_counts(c, &err)
    rc = take_refusal(c, &rst) if c.rel_call else 0     # a release point of this call met a refusal: warn
    c.cx.mu.unlock()
    if rc:
        report_refusal(c, rc, rst, -1, -1, 1)
    if b == NULL:
        return _raise(c, &err)
    out[0] = <void*>b.addr
    return 0


# Expandable segments (lock held): a miss grows the (pool, stream) range at its end and maps what is missing; when the
# device is out of memory, every whole free page goes back (vmm_release) and the whole thing is tried once more.
cdef Block* _vmm_alloc(AllocatorCore* c, int pool, uintptr_t stream, size_t size, size_t nbytes,
                       AllocError* err) noexcept nogil:
    cdef Block* b = NULL
    if err.kind == ERR_NONE:
        b = vmm_grow_backed(c, pool, stream, size, err)
    if b == NULL and err.kind == ERR_OOM:
        c.num_alloc_retries += 1
        _release_idle(c, -1, 0, 0)
        err.kind = ERR_NONE
        b = _alloc_cached(c, size, nbytes, stream, err)
        if b != NULL:
            return b
        if err.kind == ERR_NONE:
            b = vmm_grow_backed(c, pool, stream, size, err)
        if b == NULL and err.kind == ERR_OOM:
            c.num_ooms += 1
    if b != NULL:
        b = _take(c, b, size, nbytes, &err.kind)
    return b


cdef int core_free(AllocatorCore* c, void* ptr) except -1 nogil:
    return _core_free(c, <uintptr_t>ptr, 0)


cdef int core_raw_free(AllocatorCore* c, void* ptr) except -1 nogil:
    return _core_free(c, <uintptr_t>ptr, 1)


cdef inline bint _held_by_allocation(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    """Lock held: ptr starts a live block that an Allocation object holds (raw_free must not free it under it)."""
    cdef Block* b = <Block*>c.cx.live.find(ptr)
    return b != NULL and b.owned != 0


cdef int _core_free(AllocatorCore* c, uintptr_t ptr, int raw) except -1 nogil:
    cdef AllocError err
    cdef int rc = 0
    cdef C_Status rst = C_SUCCESS
    if c.torn_down:
        return 0
    c.cx.mu.lock()
    if c.torn_down:
        c.cx.mu.unlock()
        return 0
    err.call = VMM_CALL_NONE
    if raw and _held_by_allocation(c, ptr):
        c.cx.mu.unlock()
        err.kind = ERR_OWNED
        err.ptr = ptr
        err.requested = 0
        err.allocated = err.reserved = 0
        return _raise(c, &err)
    if _free_locked(c, ptr) >= 0:
        rc = take_refusal(c, &rst) if c.rel_call else 0     # release on free met a refusal: warn
        c.cx.mu.unlock()
        return report_refusal(c, rc, rst, -1, -1, 1) if rc else 0
    owns = _owns(c, ptr)
    if owns == 2:
        # the start of a free block is a double free; anything else inside a chunk is an interior pointer
        err.kind = ERR_INTERIOR
        if _is_free_block_start(c, ptr):
            err.kind = ERR_DOUBLE_FREE
    else:
        err.kind = ERR_FOREIGN
    c.cx.mu.unlock()
    err.ptr = ptr
    err.requested = 0
    err.allocated = err.reserved = 0
    return _raise(c, &err)


cdef size_t core_block_size(AllocatorCore* c, void* ptr) noexcept nogil:
    cdef size_t r = 0
    cdef Block* b
    c.cx.mu.lock()
    b = <Block*>c.cx.live.find(<uintptr_t>ptr)
    if b != NULL:
        r = b.size
    c.cx.mu.unlock()
    return r


cdef int64_t core_empty_cache(AllocatorCore* c) except -1 nogil:
    cdef size_t r = 0
    cdef int rc = 0
    cdef C_Status rst = C_SUCCESS
    cdef int64_t held = 0
    c.cx.mu.lock()
    if not c.torn_down:
        r = _release_idle(c, -1, 0, 0)
        if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
            _trace_mem(c, PRT_EV_EMPTY_CACHE, 0, r, 0)
        rc = take_refusal(c, &rst)          # the plugin refused part of it: PluginError (the books keep that part)
        held = c.stats[0][ST_RESERVED_BYTES].current
    c.cx.mu.unlock()
    return report_refusal(c, rc, rst, <int64_t>r, held, 0) if rc else <int64_t>r


# Teardown: every chunk back to the plugin, live blocks included; later frees do nothing.
cdef void _core_teardown(AllocatorCore* c, int release_memory) noexcept nogil:
    cdef prt_chunk_map.iterator it
    cdef Chunk* ch
    c.cx.mu.lock()
    if c.torn_down:
        c.cx.mu.unlock()
        return
    c.torn_down = 1
    if release_memory and c.n_ranges:
        vmm_teardown(c)
    if release_memory:
        it = c.cx.chunks.begin()
        while it != c.cx.chunks.end():
            ch = <Chunk*>(deref(it).second)
            if not ch.expandable:
                _plugin_free(c, ch.base, ch.size)
            inc(it)
    c.cx.mu.unlock()


cdef int64_t _reset_if_empty(AllocatorCore* c) noexcept nogil:
    """DeviceAllocator.reset's last step in one hold of the lock (a thread allocating between a check and the zeroing
    had its segment counted away): when nothing is held, every counter to 0; 0, or the bytes held (nothing done)."""
    cdef int64_t held
    c.cx.mu.lock()
    held = c.stats[0][ST_RESERVED_BYTES].current or c.stats[0][ST_ALLOCATED_BYTES].current or \
        prt_atomic_load_i64(&c.deferred_pending)
    if held == 0:
        zero_accumulated(c)
        memset(c.stats, 0, sizeof(c.stats))
        c.chunk_serial = 0
    c.cx.mu.unlock()
    return held


_reset_pause = None     # tests: called by DeviceAllocator.reset between its empty_cache and its last step


cdef int _refuse_in_child(DeviceAllocator a) except -1:
    """The parent's allocator in a child of fork(): ForkError, never a wait (a parent thread may have held its lock)."""
    if a.core.torn_down == 2:
        raise errors.ForkError(f"{a.device}: the {a.kind} allocator belongs to the parent process (fork()); call "
                               f"paddle_rt.reinitialize_after_fork() and use the child's own allocators")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# DeviceAllocator: the Python owner of one AllocatorCore
# ---------------------------------------------------------------------------------------------------------------------
cdef class DeviceAllocator:
    """The caching allocator of one device (``kind`` "device") or of its pinned host memory (``kind`` "host").
    Get it with :func:`get_allocator`."""

    def __cinit__(self):
        self.core = NULL

    def __init__(self):
        raise TypeError("use paddle_rt.get_allocator(device)")

    def __dealloc__(self):
        # Allocators live for the whole process (Allocations point at their core); nothing to free here.
        pass

    @staticmethod
    cdef DeviceAllocator _new(Device dev, int kind):
        cdef DeviceAllocator a = DeviceAllocator.__new__(DeviceAllocator)
        cdef AllocatorCore* c
        dev.ensure_ready()
        if kind == KIND_HOST and (dev.iface.host_memory_allocate == NULL or dev.iface.host_memory_deallocate == NULL):
            raise errors.NotSupportedError(
                f"{dev}: pinned host memory is unavailable: the plugin {dev.plugin.path} lacks "
                f"host_memory_allocate/host_memory_deallocate")
        c = <AllocatorCore*>c_malloc(sizeof(AllocatorCore))
        if c == NULL:
            raise MemoryError()
        memset(c, 0, sizeof(AllocatorCore))
        c.cx = new prt_alloc_containers()
        c.iface = dev.iface
        c.cdev = dev.cdev()
        c.device = <void*>dev
        c.kind = kind
        a.core = c
        a.device = dev
        a.kind = "host" if kind == KIND_HOST else "device"
        a._keywords = {}
        a.host_addressable = kind == KIND_HOST or device_host_addressable(dev)
        try:
            _, total = dev.memory_info()
        except errors.PaddleRTError:
            total = 0
        c.capacity = total
        a._apply(a._effective())
        return a

    cdef dict _effective(self):
        return alloc_config.effective(self._keywords)

    def _apply(self, conf):
        """Set the core's configuration from a normalised mapping (hints below, then env, then keywords)."""
        _refuse_in_child(self)
        cdef AllocatorCore* c = self.core
        cdef AllocConfig cfg
        align = self.device.size_hint("min_chunk_size") or 1
        pad = self.device.size_hint("extra_padding_size") or 0
        try:
            r = alloc_config.resolve(conf)
        except errors.InvalidArgument as exc:
            raise errors.InvalidArgument(f"{self.device}: {exc}") from None
        memset(&cfg, 0, sizeof(AllocConfig))
        cfg.alignment = align
        cfg.align_mask = (align - 1) if (align & (align - 1)) == 0 else 0
        cfg.padding = pad
        cfg.paddle_compat = r["paddle_compat"]
        cfg.growth = r["growth"]
        cfg.chunk_size = r["chunk_size"]
        cfg.max_split_size = SIZE_MAX if r["max_split_size"] is None else r["max_split_size"]
        cfg.remainder_low = r["remainder_low"]
        cfg.ties_by_address = r["ties_by_address"]
        cfg.quick_reuse = r["quick_reuse"]
        lim = r["limit"]
        if lim is None:
            cfg.limit = SIZE_MAX
        elif isinstance(lim, tuple):
            if not c.capacity:
                raise errors.InvalidArgument(f"{self.device}: allocator config limit: a fraction needs the device's "
                                             f"total memory, which the plugin does not report (give bytes)")
            cfg.limit = int(c.capacity * lim[1])
        else:
            cfg.limit = lim
        cfg.release = r["release"]
        cfg.small_size = r["small_size"]
        cfg.small_chunk = r["small_chunk"]
        cfg.grow_min = r["grow_min"]
        cfg.grow_step = r["grow_step"]
        cfg.grow_fraction = r["grow_fraction"]
        cfg.grow_ratio = r["grow_ratio"]
        cfg.grow_round = r["grow_round"]
        cfg.consolidate = r["consolidate"]
        cfg.grow_base = r["grow_base"]
        cfg.grow_exact_credit = r["grow_exact_credit"]
        cfg.settle_after = r["settle_after"]
        cfg.grow_requests = r["grow_requests"]
        cfg.exact_above = r["exact_above"]
        cfg.small_borrow = r["small_borrow"]
        cfg.growth_wait_ns = <int64_t>r["growth_wait_ms"] * 1000000
        want = r["expandable_segments"]
        vmm_on, gran = self._vmm_handshake(want)
        with nogil:
            c.cx.mu.lock()
        if (c.stats[0][ST_SEGMENT].current != 0 and
                (cfg.paddle_compat != c.cfg.paddle_compat or cfg.small_size != c.cfg.small_size or
                 vmm_on != c.vmm_on)):
            c.cx.mu.unlock()
            raise errors.InvalidArgument(
                f"{self.device}: paddle_compat, small_size and expandable_segments can only change while the "
                f"allocator holds no memory (free everything and call empty_cache() first)")
        _q_flush(c)
        c.cfg = cfg
        c.quick = cfg.quick_reuse
        c.expandable = want
        c.vmm_on = vmm_on
        c.gran = gran
        c.vmm = self.device.plugin.vmm
        c.cx.mu.unlock()

    def _vmm_handshake(self, int want):
        """(on, granularity) for expandable_segments `want`: on when asked (auto or 1), the allocator is a device's
        and the plugin exports the virtual-memory extension whose granularity call returns a power of two. Pinned
        host memory never uses it, whatever is asked (so PADDLE_RT_ALLOC_CONF=expandable_segments:1, which both
        allocators read, leaves malloc_host working)."""
        cdef Plugin pl = self.device.plugin
        cdef size_t g = 0
        cdef C_Status st = C_ERROR
        if want == EXPANDABLE_OFF or self.core.kind == KIND_HOST:
            return 0, 0
        if self.core.kind == KIND_DEVICE and pl.vmm.map != NULL:
            with nogil:
                st = pl.vmm.granularity(self.core.cdev, &g)
            if st == C_SUCCESS and g != 0 and (g & (g - 1)) == 0:
                return 1, g
        if want == EXPANDABLE_ON:
            why = (f"the plugin {pl.path} does not export the virtual-memory extension (paddle_rt_vmm_ext.h)"
                   if pl.vmm.map == NULL else
                   f"the plugin's paddle_rt_ext_vmm_granularity returned status {st} and granularity {g}")
            raise errors.InvalidArgument(f"{self.device}: allocator config expandable_segments:1: {why}")
        return 0, 0

    def configure(self, **kw):
        """Change this allocator's configuration (keys: see the module documentation); keywords win over
        PADDLE_RT_ALLOC_CONF. ``key=None`` removes a keyword setting."""
        new = dict(self._keywords)
        for k, v in kw.items():
            if v is None and k not in ("limit", "max_split_size"):
                new.pop(k, None)
                if k not in CONF_KEYS:
                    raise errors.InvalidArgument(f"unknown allocator config key {k!r} (known: {', '.join(CONF_KEYS)})")
            else:
                new.update(alloc_config.normalize({k: v}, f"{self.device}: set_allocator_config"))
        self._apply(alloc_config.effective(new))
        self._keywords = new

    def config(self):
        """The effective configuration as a dict."""
        return alloc_snapshot.settings(self.core)

    def round_size(self, size_t nbytes):
        """The block size a request of ``nbytes`` gets: round_up(nbytes + extra_padding, min_chunk)."""
        return round_request(self.core, nbytes)

    # The Allocation API lives above the allocator (allocation.pyx): malloc and raw_malloc (whose out-of-memory
    # ladder ends in deferred_free.malloc_waiting, also above) call the functions it registers at its import
    # (register_allocation_api); this module imports nothing of it.
    def malloc(self, nbytes, stream=None):
        """An :class:`Allocation` of ``nbytes`` from this allocator (as :func:`paddle_rt.malloc`)."""
        return _allocation_api(self, "malloc")[0](self, nbytes, stream)

    def raw_malloc(self, nbytes, stream=0):
        """A raw pointer of ``nbytes`` from this allocator (as :func:`paddle_rt.raw_malloc`)."""
        return _allocation_api(self, "raw_malloc")[1](self, nbytes, stream)

    def raw_free(self, ptr):
        """Free a pointer of this allocator (from :meth:`raw_malloc`; the pointer of a live Allocation is refused with
        InvalidArgument, as by :func:`paddle_rt.raw_free`)."""
        if not isinstance(ptr, int) or isinstance(ptr, bool):
            raise TypeError(f"expected a pointer as int, got {type(ptr).__name__}")
        if ptr <= 0 or ptr > <object>SIZE_MAX:
            raise errors.InvalidArgument(f"0x{ptr:x} is not a valid pointer" if ptr >= 0 else f"{ptr} is not a pointer")
        cdef uintptr_t p = ptr
        with nogil:
            core_raw_free(self.core, <void*>p)

    def owns(self, ptr):
        """True if ``ptr`` is the start of a live allocation of this allocator."""
        _refuse_in_child(self)
        if not isinstance(ptr, int) or isinstance(ptr, bool) or not 0 < ptr <= <object>SIZE_MAX:
            return False
        cdef uintptr_t p = ptr
        cdef int r
        with nogil:
            r = core_lookup(self.core, p)
        return r == 1

    def empty_cache(self, wait=True):
        """Give every idle chunk (and, with expandable segments, every whole free page) back to the plugin; returns
        the number of bytes released. A freed block may still be used by work its stream had queued before the free:
        only memory whose frees have run on their stream goes back (a query of the stream's position). With
        ``wait=True`` (the default, like ``torch.cuda.empty_cache``) it first waits until the streams that may use
        the memory (the device's; every device's for pinned host memory) have run everything submitted so far, so
        every idle chunk goes back; with ``wait=False`` it never waits and gives back what has completed while work
        is queued (the rest stays cached, counted in ``num_release_deferred``, and goes back at a later release
        point). Inside a stream callback it does not wait. A refused release (alloc_segment.pyx): PluginError naming
        the device and the call (``released``: the bytes released)."""
        _refuse_in_child(self)
        cdef int64_t r
        if wait:
            stream_device_quiesce(None if self.core.kind == KIND_HOST else self.device)
        with nogil:
            r = core_empty_cache(self.core)
        return r

    def stats(self):
        """PyTorch-style counters (see :func:`memory_stats`)."""
        _refuse_in_child(self)
        return alloc_snapshot.counters(self.core)

    def reset_peak_stats(self):
        _refuse_in_child(self)
        cdef int i, p
        with nogil:
            self.core.cx.mu.lock()
            for p in range(3):
                for i in range(N_STATS):
                    self.core.stats[p][i].peak = self.core.stats[p][i].current
            self.core.cx.mu.unlock()

    def reset_accumulated_stats(self):
        _refuse_in_child(self)
        with nogil:
            self.core.cx.mu.lock()
            zero_accumulated(self.core)
            self.core.cx.mu.unlock()

    def reset(self):
        """Start this allocator afresh, as if the process had just created it: every idle chunk goes back to the
        plugin (as :meth:`empty_cache`), every counter and peak is zeroed, and the chunk serial numbers (best fit's
        tie order, the only thing the policy carries from one allocation to the next besides the cache itself)
        restart. The configuration is kept. Raises InvalidArgument while memory is still allocated (or held by
        busy streams), changing nothing: the live-memory condition is checked before any chunk goes back."""
        _refuse_in_child(self)
        cdef AllocatorCore* c = self.core
        cdef int64_t live, held
        cdef bint idle
        with nogil:
            c.cx.mu.lock()
            live = c.stats[0][ST_ALLOCATED_BYTES].current
            held = c.stats[0][ST_RESERVED_BYTES].current
            c.cx.mu.unlock()
        if live or core_deferred_pending(c):
            self._refuse_reset(live)
        stream_device_quiesce(None if c.kind == KIND_HOST else self.device)
        with nogil:
            idle = _streams_idle(c)    # inside a stream callback the device's streams may still be busy
        if not idle:
            self._refuse_reset(held)
        self.empty_cache()
        if _reset_pause is not None:
            _reset_pause(self)         # tests: another thread allocates here
        with nogil:
            held = _reset_if_empty(c)  # one hold of the lock: memory allocated by another thread meanwhile is seen
        if held:
            self._refuse_reset(held)

    def _refuse_reset(self, int64_t held):
        raise errors.InvalidArgument(
            f"{self.device}: reset of the {self.kind} allocator: {held} bytes are still held (live allocations, "
            f"frees deferred by record_stream, or chunks busy streams may use); free them and synchronize first")

    def snapshot(self):
        """Segments (chunks) with their blocks, ordered by address. An expandable segment (docs/expandable_segments.md)
        also carries ``expandable`` True, ``granularity``, ``reserved_size`` (its virtual range), ``mapped_size`` and
        ``mapped_pages``: the mapped parts as ``[offset, length]`` runs from its address; its ``total_size`` is the
        extent its blocks cover, and an inactive block may lie over unmapped pages."""
        _refuse_in_child(self)
        return alloc_snapshot.segments(self.core, str(self.device))

    def reserve(self, nbytes):
        """Grow the large pool (default stream) by one step of ``nbytes`` (rounded up to the plugin's alignment, and to
        whole pages with expandable segments), before work starts: Paddle's initial-memory flag. With expandable
        segments the range grows in place and its pages are mapped; without, one chunk of that size is made. The
        memory is cached (free) for the allocations that follow. Returns the bytes the pool grew by. Raises
        OutOfMemoryError (changing nothing but what the OOM ladder gave back) or InvalidArgument for a bad size."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0 or nbytes > <object>(SIZE_MAX // 2):
            raise errors.InvalidArgument(f"{self.device}: reserve: nbytes must be a positive int up to "
                                         f"{SIZE_MAX // 2}, got {nbytes!r}")
        cdef size_t n = nbytes
        cdef int64_t grown = 0
        with nogil:
            grown = _core_reserve(self.core, n)
        return grown

    def __repr__(self):
        return f"<DeviceAllocator {self.kind} of {self.device}>"


# DeviceAllocator.reserve: one step of `nbytes` in the large pool of the default stream, left free. -1 with an
# exception set on failure.
cdef int64_t _core_reserve(AllocatorCore* c, size_t nbytes) except -1 nogil:
    cdef AllocError err
    cdef Block* b = NULL
    cdef size_t size = round_request(c, nbytes)
    cdef int64_t before
    _new_error(&err, nbytes)
    if c.torn_down:
        err.kind = ERR_TORN_DOWN
        return _raise(c, &err)
    c.cx.mu.lock()
    before = c.stats[0][ST_RESERVED_BYTES].current
    if c.vmm_on:
        b = vmm_grow_backed(c, POOL_LARGE, 0, size, &err)
    else:
        b = _new_chunk(c, POOL_LARGE, 0, size, &err)
    before = c.stats[0][ST_RESERVED_BYTES].current - before
    if b == NULL:
        _note_counts(c, &err)
    c.cx.mu.unlock()
    if b == NULL:
        return _raise(c, &err)
    return before


# ---------------------------------------------------------------------------------------------------------------------
# Registry, Python API
# ---------------------------------------------------------------------------------------------------------------------
cdef DeviceAllocator allocator_of(Device dev, int kind):
    key = "allocator.host" if kind == KIND_HOST else "allocator"
    a = dev.layers.get(key)
    if a is None:
        with _registry_lock:
            a = dev.layers.get(key)
            if a is None:
                if _torn_down:
                    raise errors.DeviceError(f"{dev}: the allocator was torn down (interpreter shutting down)")
                a = DeviceAllocator._new(dev, kind)
                dev.layers[key] = a
                _allocators.append(a)
    return <DeviceAllocator>a


cdef AllocatorCore* get_core(object device, int kind) except NULL:
    cdef Device dev = resolve_device(device)
    if kind != KIND_DEVICE and kind != KIND_HOST:
        raise errors.InvalidArgument(f"get_core: kind must be KIND_DEVICE or KIND_HOST, got {kind}")
    return allocator_of(dev, kind).core


# The functions behind DeviceAllocator.malloc and raw_malloc, registered by allocation.pyx at its import:
# (allocate(allocator, nbytes, stream) -> Allocation, raw_allocate(allocator, nbytes, stream) -> int).
_allocation_fns = None


def register_allocation_api(allocate, raw_allocate):
    """Called once by paddle_rt._core.allocation at its import (it lives above this module)."""
    global _allocation_fns
    _allocation_fns = (allocate, raw_allocate)


cdef tuple _allocation_api(DeviceAllocator a, str call):
    if _allocation_fns is None:
        raise errors.NotSupportedError(f"{a.device}: DeviceAllocator.{call}: the Allocation API "
                                       f"(paddle_rt._core.allocation) is not loaded; import paddle_rt first")
    return _allocation_fns


def get_allocator(device=None, kind="device"):
    """The :class:`DeviceAllocator` of ``device`` (default: the current device); ``kind="host"`` for pinned host
    memory."""
    if kind not in ("device", "host"):
        raise errors.InvalidArgument(f"get_allocator: kind must be 'device' or 'host', got {kind!r}")
    return allocator_of(resolve_device(device), KIND_HOST if kind == "host" else KIND_DEVICE)



cdef bint core_streams_idle(AllocatorCore* c) noexcept nogil:
    return _streams_idle(c)


cdef int core_lookup(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    cdef int r
    c.cx.mu.lock()
    r = _owns(c, ptr)
    c.cx.mu.unlock()
    return r


cdef int64_t core_deferred_pending(AllocatorCore* c) noexcept nogil:
    return prt_atomic_load_i64(&c.deferred_pending)


cdef void core_free_unchecked(AllocatorCore* c, uintptr_t ptr) noexcept nogil:
    c.cx.mu.lock()
    if not c.torn_down:
        _free_locked(c, ptr)
    c.cx.mu.unlock()


cdef DeviceAllocator existing_allocator(Device dev, int kind):
    return dev.layers.get("allocator.host" if kind == KIND_HOST else "allocator")


# With the GIL held: serve from the cache without releasing the GIL when the lock is free (never blocks, never calls
# the plugin). NULL: take the slow path (nogil core_malloc).
cdef void* core_try_malloc_block(AllocatorCore* c, size_t n, uintptr_t stream, int owned, size_t* held) noexcept:
    cdef Block* b = NULL
    cdef AllocError fail
    fail.kind = ERR_NONE
    fail.call = VMM_CALL_NONE
    if prt_tracing(trace_mask, PRT_TRACE_STACKS):
        trace_note_caller()       # the Python caller's frames, for the event of this allocation
    if c.torn_down or n > SIZE_MAX // 2:
        return NULL
    if not c.cx.mu.try_lock():
        return NULL
    cdef uintptr_t addr = 0
    if not c.torn_down:
        b = _alloc_cached(c, round_request(c, n), n, stream, &fail, False)
        if b != NULL:
            b.owned = owned
            addr = b.addr
            held[0] = b.size
    c.cx.mu.unlock()
    return <void*>addr


# Cross-stream reuse for the stream-ordered pool (takes the lock, never calls the plugin): alloc_segment.take_settled.
cdef void* core_malloc_settled(AllocatorCore* c, size_t n, uintptr_t tag, uint64_t seq_ok, bint done_ok,
                               size_t* held, uint64_t* seq) noexcept nogil:
    cdef Block* b = NULL
    c.cx.mu.lock()
    if not c.torn_down and n <= SIZE_MAX // 2:
        b = _take_settled(c, n, round_request(c, n), tag, seq_ok, done_ok, held, seq)
    c.cx.mu.unlock()
    return <void*>b.addr if b != NULL else NULL


# With the GIL held: 1 when freed (or torn down), 0 when the slow path must run (lock busy, unknown pointer, or a
# plugin call may follow; with raw, also when an Allocation holds the block: core_raw_free raises).
cdef inline int _try_free(AllocatorCore* c, uintptr_t p, bint raw) noexcept:
    cdef int r = -1
    if c.torn_down:
        return 1
    if releases_on_free(&c.cfg) or not c.cx.mu.try_lock():
        return 0
    if not c.torn_down and not (raw and _held_by_allocation(c, p)):
        r = _free_locked(c, p)
    c.cx.mu.unlock()
    return r >= 0


cdef int core_try_free(AllocatorCore* c, uintptr_t p) noexcept:
    return _try_free(c, p, False)


cdef int core_try_raw_free(AllocatorCore* c, uintptr_t p) noexcept:
    return _try_free(c, p, True)


cdef void core_set_requested(AllocatorCore* c, uintptr_t p, size_t n) noexcept nogil:
    """The live block at p (a pool's, reused) now serves a request of n bytes: raw addresses into it are bounded by
    n (raw_live_extent), and requested_bytes counts n."""
    cdef Block* b
    c.cx.mu.lock()
    b = <Block*>c.cx.live.find(p)
    if b != NULL and b.requested != n:
        stat_add(c, b.chunk.pool, ST_REQUESTED_BYTES, <int64_t>n - <int64_t>b.requested)
        b.requested = n
    c.cx.mu.unlock()


cdef void core_mark_owned(AllocatorCore* c, uintptr_t p) noexcept nogil:
    """The live block at p (made by core_malloc) is now held by an Allocation object."""
    cdef Block* b
    c.cx.mu.lock()
    b = <Block*>c.cx.live.find(p)
    if b != NULL:
        b.owned = 1
    c.cx.mu.unlock()


# ---------------------------------------------------------------------------------------------------------------------
def _teardown():
    """Return every chunk (live Allocations' memory included) to the plugins; later frees do nothing."""
    global _torn_down
    cdef DeviceAllocator a
    _torn_down = True
    for a in list(_allocators):
        with nogil:
            _core_teardown(a.core, 1)


def _mark_forked():
    """Right after fork(), in the child: the parent's allocators (and the memory they cache) are not the child's.
    Allocating from them raises ForkError; freeing into them does nothing. Their locks are not touched (another
    thread of the parent may have held one at the fork); the registry's lock is made anew, for the same reason."""
    global _registry_lock
    cdef DeviceAllocator a
    _registry_lock = threading.RLock()
    for a in list(_allocators):
        a.core.torn_down = 2


def _reset_after_fork():
    """paddle_rt.reinitialize_after_fork(): forget the parent's allocators; new ones are made on first use."""
    _mark_forked()
    _allocators.clear()


_device_mod.register_teardown(_teardown, 30)
_device_mod.register_fork_reset(_reset_after_fork)
os.register_at_fork(after_in_child=_mark_forked)
