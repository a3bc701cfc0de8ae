# Stream-ordered memory: malloc_async / free_async like CUDA's cudaMallocAsync pools, in the device's caching
# allocator (allocator.pyx) with cheap stream positions (stream.pyx). One allocator, not two stacked: the pool is
# the stream-ordering side (which stream may use a freed block when), the allocator the growth side.
#
# Design
# - A block of malloc_async(n, s) comes from the device's caching allocator with s's allocator tag (the tag of
#   paddle_rt.malloc on s: both APIs share s's memory). A free on the stream it was allocated on, with no
#   record_stream stream, goes back to the allocator at once (as free() does): it merges with its free neighbours
#   and serves any later request on s, of any size, like CUDA's pools and PyTorch's caching allocator. The
#   allocator remembers where s was at the free (Block.free_seq), so the memory leaves s (donor pages, release to
#   the plugin) only once the free has run there.
# - The pool holds back only what another stream may still use: a free on another stream than the allocating one,
#   a block with record_stream streams, or a block another stream took from the pool (its memory belongs to the
#   first stream's range). Each held block carries (stream of the free, that stream's position at the free,
#   record_stream positions). malloc_async(n, B) takes, in order:
#     1. a held block of that size freed on B itself whose record_stream streams passed the free;
#     2. a held block of that size freed on another stream A when the host already waited for A past the free
#        (always allowed), or when a policy allows it: follow event dependencies (B already waits on an event
#        recorded on A at or after the free; tracked through a hook in Event.wait), opportunistic (A has already run
#        past the free);
#     3. internal dependencies: a held block of that size freed on another stream, after inserting into B a wait on
#        an event recorded on A now;
#     4. the allocator (after handing it every held block that is safe for every stream: the free completed and the
#        host saw it, or completed under the opportunistic policy), which may grow.
# - Out of memory ladder of malloc_async: (1)-(4) above; then synchronize every stream holding pending frees (and
#   recorded streams), after which any stream may reuse them: hand them all to the allocator and retry (the
#   allocator's own ladder releases its idle chunks to the plugin), after also waiting for the device's frees deferred
#   by record_stream on paddle_rt.malloc blocks and for every stream of the device; then OutOfMemoryError.
# - Release threshold: at synchronize points (Stream.synchronize / Event.synchronize, seen through a hook in
#   stream.pyx; paddle_rt.synchronize / Device.synchronize synchronize every stream of the device through the stream
#   layer's device hook, so they count for every stream), held blocks above the threshold are given back to the
#   allocator. trim_to(n) gives back safe held blocks down to n held bytes and then returns the allocator's memory
#   whose frees have run to the plugin (it never waits); it never touches memory in use or whose free has not
#   completed.
# The pool's bookkeeping of held blocks is Python-level state (dicts) used with the GIL held; allocator calls are
# nogil (or the allocator's GIL fast path when its lock is free).
from libc.stdint cimport uintptr_t, uint64_t, int64_t
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.object cimport PyTypeObject
from paddle_rt._core.includes.obj_freelist cimport prt_objfl_install
from paddle_rt._core.allocator cimport (
    AllocatorCore, get_core, core_malloc, core_free, core_block_size, core_empty_cache, KIND_DEVICE,
    round_request, core_deferred_pending, core_try_malloc_block, core_try_free, core_malloc_settled, core_mark_owned,
    core_set_requested,
)
from paddle_rt._core.allocation cimport Allocation, check_nbytes, _check_nbytes
from paddle_rt._core.deferred_free cimport core_wait_deferred, free_now, free_after_streams
from paddle_rt._core.device cimport Device, resolve_device
from paddle_rt._core.stream cimport (
    Stream, stream_position, stream_reached, stream_set_order_hooks, current_stream, default_stream,
    stream_device_idle, stream_device_quiesce, stream_alloc_tag, stream_done_seq, device_open_streams,
)
import sys
import threading
import weakref
cimport cython

from paddle_rt._core import errors
from paddle_rt._core import device as _device_mod

_pools = weakref.WeakSet()
_default_pool_lock = threading.Lock()


def _new_lock_after_fork():
    global _default_pool_lock
    _default_pool_lock = threading.Lock()     # a thread of the parent may have held it at the fork


import os as _os
_os.register_at_fork(after_in_child=_new_lock_after_fork)
cdef bint _torn_down = False


cdef inline bint _recorded_done(_FreedBlock e) noexcept:
    cdef Stream y
    if e.recorded is None:
        return True
    for y, p in e.recorded:
        if not stream_reached(y, p):
            return False
    return True


@cython.freelist(256)
cdef class _FreedBlock:
    pass


# -- ordering hooks (called by stream.pyx / event.pyx with the GIL) ---------------------------------------------------
cdef void _on_host_sync(void* sp, uint64_t pos) noexcept:
    cdef Stream s = <Stream>sp
    cdef MemPool p
    try:
        # every synchronize comes here: a snapshot of the WeakSet's references, without its iteration guard
        # (a Python-level generator that cost ~1 us per synchronize)
        for ref in list(_pools.data):
            p = ref()
            if p is None:
                continue
            if p.device is s.device:
                if p._synced.get(s, 0) < pos:
                    p._synced[s] = pos
                p._synced_seq[s] = stream_done_seq(s)
                if p.cached_bytes > <int64_t>p.release_threshold:
                    p._retire_safe(p.release_threshold)
    except BaseException:
        pass                     # the hooks must not fail a synchronize; the pool stays conservative


cdef void _on_wait(void* wp, void* rp, uint64_t pos, uint64_t seq) noexcept:
    cdef Stream w = <Stream>wp
    cdef Stream r = <Stream>rp
    cdef MemPool p
    try:
        for p in list(_pools):
            if p.device is w.device and p.reuse_follow_event_dependencies:
                ws = p._waits.get(w)
                if ws is None:
                    ws = p._waits[w] = weakref.WeakKeyDictionary()
                was = ws.get(r)
                if was is None or was[0] < pos:
                    ws[r] = (pos, seq)
    except BaseException:
        pass


stream_set_order_hooks(_on_host_sync, _on_wait)


# Not tracked by the garbage collector: it references only its pool and stream, which never reference it back (no
# cycles), and the hot path makes one per malloc_async.
@cython.no_gc
cdef class AsyncAllocation(Allocation):
    """Memory from :func:`malloc_async`: an :class:`Allocation` that belongs to a :class:`MemPool` and a stream.
    Free it with :func:`free_async` (or ``free()``/``with``, which free it on the stream it was allocated on)."""

    def __dealloc__(self):
        if not self._freed and self.pool is not None and not _torn_down:
            try:
                self.pool.free_on(self, self.stream)
            except BaseException:
                pass

    cdef int _release(self) except -1:
        if self._freed:
            raise errors.InvalidArgument(f"{self.device}: free of 0x{self.ptr:x}: the allocation was already freed "
                                         f"(double free)")
        self.pool.free_on(self, self.stream)
        return 0

    cdef bint _own_stream(self, object stream) except -1:
        return stream is self.stream

    @property
    def block_size(self):
        """Bytes the pool holds for it (the rounded size)."""
        return self.block

    def __repr__(self):
        state = "freed" if self._freed else f"ptr=0x{self.ptr:x}"
        return f"<AsyncAllocation {self.size} bytes on {self.device}, stream {self.stream.name}, {state}>"


# Cython keeps no free list for a subclass: keep AsyncAllocation's object memory ourselves (the hot path makes one
# per malloc_async).
if prt_objfl_install(<PyTypeObject*>AsyncAllocation) != 0:
    raise ImportError("paddle_rt._core.pool: AsyncAllocation is tracked by the garbage collector (no free list)")


cdef class MemPool:
    """A stream-ordered memory pool of one device (like ``cudaMemPool_t``). See :func:`malloc_async` for the reuse
    rules; the three ``reuse_*`` policies can each be switched off. ``release_threshold``: bytes of freed blocks the
    pool keeps at synchronize points (the rest goes back to the caching allocator)."""

    def __init__(self, device=None, release_threshold=0, reuse_follow_event_dependencies=True,
                 reuse_allow_opportunistic=True, reuse_allow_internal_dependencies=True):
        if self.device is not None:
            raise errors.InvalidArgument("MemPool.__init__ called twice")
        cdef Device dev = resolve_device(device)
        if release_threshold < 0:
            raise errors.InvalidArgument(f"{dev}: MemPool: release_threshold must be >= 0, not {release_threshold}")
        self.core = get_core(dev, KIND_DEVICE)
        self.device = dev
        self.release_threshold = release_threshold
        self.reuse_follow_event_dependencies = bool(reuse_follow_event_dependencies)
        self.reuse_allow_opportunistic = bool(reuse_allow_opportunistic)
        self.reuse_allow_internal_dependencies = bool(reuse_allow_internal_dependencies)
        self._cache = {}
        self._synced = weakref.WeakKeyDictionary()    # streams dropped by the user are not kept alive
        self._synced_seq = weakref.WeakKeyDictionary()
        self._waits = weakref.WeakKeyDictionary()
        from paddle_rt._core.allocator import get_allocator
        self.host_addressable = get_allocator(dev).host_addressable
        _pools.add(self)

    def __dealloc__(self):
        # give held blocks back: at once those every stream may reuse; the others (work queued on their freeing,
        # recorded or allocating streams may still use them) once those streams have run what was submitted so far
        cdef _FreedBlock e
        cdef bint give_back = not (self.core == NULL or _torn_down or self.core.torn_down)
        if not give_back or self._cache is None:
            return
        for e in self._freed_blocks():
            try:
                self._give_back_later(e)
            except BaseException:
                pass

    def __repr__(self):
        return (f"<MemPool on {self.device}: used {self.used_cur}, reserved {self.reserved_cur}, "
                f"release_threshold {self.release_threshold}>")

    cdef int _check(self) except -1:
        if self.core == NULL:
            raise errors.InvalidArgument("MemPool not initialised (call MemPool(device))")
        if self.core.torn_down == 2:
            raise errors.ForkError(f"{self.device}: this memory pool belongs to the parent process (fork()); in the "
                                   f"child call paddle_rt.reinitialize_after_fork() and use a new pool")
        if _torn_down or self.core.torn_down:
            raise errors.DeviceError(f"{self.device}: the memory pool was torn down (interpreter exit)")
        return 0

    # -- reuse ---------------------------------------------------------------------------------------------------------
    cdef bint _host_synced(self, _FreedBlock e):
        """The host waited for the freeing stream past the free (or the stream is closed: ``closed`` is set only once
        its worker is joined, so nothing of it runs any more)."""
        return self._synced.get(e.stream, 0) >= e.pos or e.stream.closed

    cdef bint _follows_event(self, _FreedBlock e, Stream b):
        """``b`` waits on an event recorded on the freeing stream after the free (a direct wait)."""
        if not self.reuse_follow_event_dependencies:
            return False
        ws = self._waits.get(b)
        w = ws.get(e.stream) if ws is not None else None
        return w is not None and w[0] >= e.pos

    cdef bint _opportunistic(self, _FreedBlock e):
        """The free has already run, and the opportunistic policy allows using that."""
        return self.reuse_allow_opportunistic and stream_reached(e.stream, e.pos)

    cdef bint _safe_for_every_stream(self, _FreedBlock e):
        """Any stream may reuse ``e`` now: its record_stream streams passed the free, and the free completed as the
        host saw it (or as the opportunistic policy accepts)."""
        return _recorded_done(e) and (self._host_synced(e) or self._opportunistic(e))

    cdef bint _recorded_ordered(self, _FreedBlock e, Stream b):
        """Work of ``b`` from now on runs after every use of ``e`` on its recorded streams (record_stream, and the
        allocating stream when freed on another): each such stream has run past its use, or is ``b`` itself (stream
        order), or ``b`` waits on an event recorded on it after the use (followed under the event policy). A host
        running ahead of the device thus reuses, on the allocating stream, a block that another stream used and
        freed, once it waited for that stream (the data loader's copy stream after the compute stream)."""
        cdef Stream y
        if e.recorded is None:
            return True
        ws = self._waits.get(b) if self.reuse_follow_event_dependencies else None
        for y, p in e.recorded:
            if y is b or stream_reached(y, p):
                continue
            w = ws.get(y) if ws is not None else None
            if w is None or w[0] < p:
                return False
        return True

    cdef int _reusable(self, _FreedBlock e, Stream b) except -1:
        """How stream ``b`` may reuse ``e`` (a ReuseKind; REUSE_NONE: not now). Internal dependencies are not
        considered here: they change ``b``."""
        if not self._recorded_ordered(e, b):
            return REUSE_NONE
        if e.stream is b:
            return REUSE_SAME_STREAM
        if self._host_synced(e):
            return REUSE_HOST_SYNCED
        if self._follows_event(e, b):
            return REUSE_EVENT_DEPENDENCY
        if self._opportunistic(e):
            return REUSE_OPPORTUNISTIC
        return REUSE_NONE

    cdef list _freed_blocks(self, size_t size=0, object skip=None):
        """Every freed block the cache holds (of ``size`` when non-zero; not those freed on ``skip``), as a list that
        stays valid while the cache changes."""
        cdef list out = []
        for st, d in self._cache.items():
            if st is skip:
                continue
            if size:
                lst = d.get(size)
                if lst:
                    out.extend(lst)
            else:
                for lst in d.values():
                    out.extend(lst)
        return out

    cdef int _drop_entry(self, _FreedBlock e) except -1:
        # 1 when removed, 0 when another thread took it meanwhile (a wait released the GIL)
        cdef dict d = self._cache.get(e.stream)
        cdef list lst = d.get(e.size) if d is not None else None
        if lst is None:
            return 0
        for i in range(len(lst)):
            if lst[i] is e:
                del lst[i]
                return 1
        return 0

    cdef int _retire(self, _FreedBlock e) except -1:
        # give a freed block (already removed from the cache) back to the allocator
        self.cached_bytes -= e.size
        self.reserved_cur -= e.size
        if not self.core.torn_down:
            core_free(self.core, <void*>e.ptr)     # with the GIL: the pool's dicts stay consistent
        return 0

    cdef int _give_back_later(self, _FreedBlock e) except -1:
        # (the pool is going away) the block goes back to the allocator once every stream that may still use it has
        # run past this point: the freeing stream and the recorded ones (with the allocating stream) not yet there
        cdef Stream y
        if self._safe_for_every_stream(e):
            return free_now(self.core, e.ptr)
        streams = [e.stream]
        if e.recorded is not None:
            for y, p in e.recorded:
                if y is not e.stream and not stream_reached(y, p):
                    streams.append(y)
        return free_after_streams(self.core, e.ptr, streams)

    cdef int _retire_safe(self, int64_t keep) except -1:
        """Give back freed blocks that every stream may reuse (free completed and seen by the host, or completed under
        the opportunistic policy) until at most ``keep`` bytes are held."""
        cdef _FreedBlock e
        cdef list safe = [e for e in self._freed_blocks() if self._safe_for_every_stream(e)]
        safe.sort(key=lambda x: -(<_FreedBlock>x).size)
        for e in safe:
            if self.cached_bytes <= keep:
                break
            if self._drop_entry(e):
                self._retire(e)
        self._prune()
        return 0

    cdef int _prune(self) except -1:
        # drop empty containers (their Stream keys would keep dropped streams alive)
        for s in list(self._cache):
            d = self._cache[s]
            for k in [k for k, v in d.items() if not v]:
                del d[k]
            if not d:
                del self._cache[s]
        return 0

    cdef AsyncAllocation _wrap(self, uintptr_t p, size_t n, size_t block, Stream s, uintptr_t tag, bint foreign):
        cdef AsyncAllocation a = AsyncAllocation.__new__(AsyncAllocation)
        a.core = NULL                 # the base class must not free it: the pool does
        a.ptr = p
        a.size = n
        a.block = block
        a.device = self.device
        a.host_addressable = self.host_addressable
        a.pool = self
        a.stream = s
        a.stream_tag = tag
        a.foreign = foreign
        self.used_cur += block
        if self.used_cur > self.used_high:
            self.used_high = self.used_cur
        return a

    cdef AsyncAllocation malloc_on(self, size_t n, Stream s):
        """The allocation steps, in order: a held block freed on ``s`` -> one freed on another stream that ``s`` may
        reuse (host-synchronised, event dependencies, opportunistic) -> one the pool makes ``s`` wait for (internal
        dependencies) -> the allocator with ``s``'s tag (after giving back what every stream may reuse), where every
        block freed on ``s`` already is, merged with its neighbours."""
        cdef size_t r
        cdef size_t held = 0
        cdef void* p
        cdef uintptr_t tag
        cdef _FreedBlock e = None
        if s.device is not self.device:
            raise errors.InvalidArgument(f"{self.device}: malloc_async: {s.name} belongs to {s.device}, not to the "
                                         f"pool's device")
        s._check_open()
        tag = stream_alloc_tag(s)
        if self._cache:
            r = round_request(self.core, n)
            e = self._take_same_stream(r, s)
            if e is None:
                e = self._take_cross_stream(r, s)
            if e is None and self.reuse_allow_internal_dependencies:
                e = self._take_with_internal_dependency(r, s)
            if e is not None:
                self.cached_bytes -= e.size
                core_set_requested(self.core, e.ptr, n)   # raw addresses into it are bounded by n, not the last request
                return self._wrap(e.ptr, n, e.size, s, e.tag, e.tag != tag)
            self._retire_safe(0)
        p = core_try_malloc_block(self.core, n, tag, 1, &held)      # the allocator's cached path, GIL held
        if p != NULL:
            self.reserved_cur += held
            if self.reserved_cur > self.reserved_high:
                self.reserved_high = self.reserved_cur
            return self._wrap(<uintptr_t>p, n, held, s, tag, False)
        a = self._from_other_streams(n, s, tag)
        if a is not None:
            return a
        return self._from_allocator(n, s, tag)

    cdef AsyncAllocation _from_other_streams(self, size_t n, Stream s, uintptr_t tag):
        """Steps 2 and 3 over the allocator's free memory of the device's other open streams (what they freed went
        back to their ranges at once): a free block whose frees ``s`` may follow (the host saw them run, ``s``
        waits on an event recorded after them, or, opportunistic, they have run), else (internal dependencies) any
        free block of another stream, after making ``s`` wait for that stream's work so far. None: none."""
        cdef Stream o
        cdef uintptr_t otag
        cdef uint64_t seq_ok, seq = 0
        cdef size_t held = 0
        cdef void* p
        cdef int how
        others = [o for o in device_open_streams(self.device) if o is not s]
        if not others:
            return None
        ws = self._waits.get(s) if self.reuse_follow_event_dependencies else None
        for o in others:
            otag = stream_alloc_tag(o)
            synced = self._synced_seq.get(o, 0)
            w = ws.get(o) if ws is not None else None
            seq_ok = max(synced, w[1]) if w is not None else synced
            with nogil:
                p = core_malloc_settled(self.core, n, otag, seq_ok, self.reuse_allow_opportunistic, &held, &seq)
            if p != NULL:
                how = REUSE_HOST_SYNCED if seq <= synced else (
                    REUSE_EVENT_DEPENDENCY if seq <= seq_ok else REUSE_OPPORTUNISTIC)
                return self._from_other(p, n, held, s, otag, tag, how)
        if not self.reuse_allow_internal_dependencies:
            return None
        for o in others:
            otag = stream_alloc_tag(o)
            with nogil:
                p = core_malloc_settled(self.core, n, otag, <uint64_t>-1, False, &held, &seq)
            if p == NULL:
                continue
            from paddle_rt._core.event import Event
            ev = Event()
            try:
                ev.record(o)               # releases the GIL (event creation): o may be closed meanwhile
                ev.wait(s)
            except BaseException:
                with nogil:
                    core_free(self.core, p)
                if isinstance(sys.exc_info()[1], errors.StreamError) and (o._closing or o.closed):
                    continue               # closing: its memory becomes reusable once it is closed
                raise
            return self._from_other(p, n, held, s, otag, tag, REUSE_INTERNAL_DEPENDENCY)
        return None

    cdef AsyncAllocation _from_other(self, void* p, size_t n, size_t held, Stream s, uintptr_t otag, uintptr_t tag,
                                     int how):
        if s.closed or s._closing:
            # closed by another thread while the GIL was released (the allocator's lock, an event): the caller's error
            core_free(self.core, p)
            s._check_open()
        self.n_reuse[how] += 1
        self.reserved_cur += held
        if self.reserved_cur > self.reserved_high:
            self.reserved_high = self.reserved_cur
        return self._wrap(<uintptr_t>p, n, held, s, otag, otag != tag)

    cdef _FreedBlock _take_same_stream(self, size_t r, Stream s):
        """Step 1: the newest held block of size ``r`` freed on ``s`` whose record_stream streams passed the free."""
        cdef _FreedBlock e
        cdef dict d = self._cache.get(s)
        cdef list lst = d.get(r) if d is not None else None
        if lst:
            for i in range(len(lst) - 1, -1, -1):
                e = lst[i]
                if _recorded_done(e):
                    del lst[i]        # empty containers stay (cheap steady state)
                    return e
        return None

    cdef _FreedBlock _take_cross_stream(self, size_t r, Stream s):
        """Step 2: a block of size ``r`` freed on another stream that ``s`` may reuse as it is (see _reusable)."""
        cdef _FreedBlock e
        cdef int how
        for e in self._freed_blocks(r, s):
            how = self._reusable(e, s)
            if how != REUSE_NONE and self._drop_entry(e):
                self.n_reuse[how] += 1
                return e
        return None

    cdef _FreedBlock _take_with_internal_dependency(self, size_t r, Stream s):
        """Step 3: a block of size ``r`` freed on another open stream; ``s`` is made to wait for that free."""
        cdef _FreedBlock e
        for e in self._freed_blocks(r, s):
            if e.stream.closed or not _recorded_done(e):
                continue
            from paddle_rt._core.event import Event
            ev = Event()
            try:
                ev.record(e.stream)        # releases the GIL (event creation): e.stream may be closed meanwhile
            except errors.StreamError:
                if e.stream._closing or e.stream.closed:
                    continue               # closing: its blocks become reusable once it is closed
                raise
            ev.wait(s)                     # s closed meanwhile by another thread: StreamError for the caller
            if not self._drop_entry(e):
                return None               # taken meanwhile by another thread: allocate instead
            self.n_reuse[REUSE_INTERNAL_DEPENDENCY] += 1
            return e
        return None

    cdef AsyncAllocation _from_allocator(self, size_t n, Stream s, uintptr_t tag):
        """Step 4's slow path: a block from the device's allocator that may grow or call the plugin (GIL released),
        after the pool's OOM ladder when it is out of memory."""
        cdef void* p = NULL
        try:
            with nogil:
                core_malloc(self.core, n, tag, &p)
        except errors.OutOfMemoryError:
            if not self._cache and core_deferred_pending(self.core) == 0 and stream_device_idle(<void*>self.device):
                raise
            self._oom_ladder()
            with nogil:
                core_malloc(self.core, n, tag, &p)
        core_mark_owned(self.core, <uintptr_t>p)      # the pool's (its AsyncAllocation's): raw_free refuses it
        cdef size_t block = core_block_size(self.core, p)
        if s.closed or s._closing:
            # closed by another thread while the GIL was released (allocation, OOM ladder): the caller's error
            core_free(self.core, p)
            s._check_open()
        self.reserved_cur += block
        if self.reserved_cur > self.reserved_high:
            self.reserved_high = self.reserved_cur
        return self._wrap(<uintptr_t>p, n, block, s, tag, False)

    def _oom_ladder(self):
        # synchronize the streams holding pending frees (and their recorded streams); then every stream may reuse
        # those blocks: give them back to the allocator. The waits release the GIL: other threads free blocks
        # meanwhile (with record_stream uses and stream positions not waited for here), so only the blocks of the
        # snapshot taken before the waits are given back (docs/concurrency.md).
        cdef _FreedBlock e
        cdef Stream st
        cdef dict need = {}
        cdef list snapshot
        snapshot = self._freed_blocks()
        for e in snapshot:
            if need.get(e.stream, 0) < e.pos:
                need[e.stream] = e.pos
            if e.recorded is not None:
                for y, yp in e.recorded:
                    if need.get(y, 0) < yp:
                        need[y] = yp
        for st, pos in need.items():
            st._wait_position(pos)            # returns at once for a closed stream (nothing of it runs any more)
            if self._synced.get(st, 0) < pos:
                self._synced[st] = pos
        for e in snapshot:
            if self._drop_entry(e):           # 0: another thread took it during the waits
                self._retire(e)
        self._prune()
        # blocks of paddle_rt.malloc whose frees wait for record_stream streams: let them reach the allocator
        core_wait_deferred(self.core)
        # the allocator gives idle chunks back only while the device's streams are idle (queued work may use them)
        stream_device_quiesce(self.device)

    cdef int free_on(self, AsyncAllocation a, Stream s) except -1:
        cdef _FreedBlock e
        cdef dict d
        cdef list lst
        if a._freed:
            raise errors.InvalidArgument(f"{self.device}: free_async of 0x{a.ptr:x}: the allocation was already freed "
                                         f"(double free)")
        if a.pool is not self:
            raise errors.InvalidArgument(f"{self.device}: free_async of 0x{a.ptr:x}: it belongs to another pool")
        if s.device is not self.device:
            raise errors.InvalidArgument(f"{self.device}: free_async of 0x{a.ptr:x} on {s.name}: the stream belongs "
                                         f"to {s.device}, the memory to {self.device}")
        if a.exports > 0:
            raise BufferError(f"{self.device}: cannot free 0x{a.ptr:x}: {a.exports} view(s) of it are still exported "
                              f"(release the memoryview/array first)")
        if _torn_down or self.core.torn_down:
            a._freed = 1
            return 0
        if a._recorded is None and a.stream is s and not a.foreign:
            # freed on its own stream: back to the allocator at once, merged, reusable by later work on s for any
            # size (the allocator notes where s is, so the memory leaves s only once the free has run)
            a._freed = 1
            self.used_cur -= a.block
            self.reserved_cur -= a.block
            if not core_try_free(self.core, a.ptr):
                with nogil:
                    core_free(self.core, <void*>a.ptr)
            return 0
        e = _FreedBlock.__new__(_FreedBlock)
        e.ptr = a.ptr
        e.size = a.block
        e.tag = a.stream_tag
        e.stream = s
        e.pos = stream_position(s)
        if a._recorded is not None or a.stream is not s:
            # work submitted to the recorded streams (and to the allocating stream, when the free is on another one)
            # before the free may still use the block
            e.recorded = [(y, stream_position(y)) for y in (a._recorded or []) if y is not s]
            if a.stream is not s and not a.stream.closed:
                e.recorded.append((a.stream, stream_position(a.stream)))
            if not e.recorded:
                e.recorded = None
        a._freed = 1
        a._recorded = None
        d = self._cache.get(s)
        if d is None:
            d = self._cache[s] = {}
        lst = d.get(e.size)
        if lst is None:
            lst = d[e.size] = []
        lst.append(e)
        self.used_cur -= e.size
        self.cached_bytes += e.size
        return 0

    # -- public methods ------------------------------------------------------------------------------------------------
    def malloc_async(self, nbytes, stream=None):
        """Allocate ``nbytes`` ordered on ``stream`` (default: the current stream of the pool's device)."""
        self._check()
        cdef size_t n = _check_nbytes(nbytes, "malloc_async", self.device)
        cdef Stream s = current_stream(self.device) if stream is None else _as_stream(stream, self.device)
        return self.malloc_on(n, s)

    def free_async(self, a, stream=None):
        """Free ``a`` ordered on ``stream`` (default: the stream it was allocated on)."""
        if not isinstance(a, AsyncAllocation):
            raise errors.InvalidArgument(f"{self.device}: free_async needs an allocation from malloc_async, not "
                                         f"{type(a).__name__}")
        cdef Stream s = (<AsyncAllocation>a).stream if stream is None else _as_stream(stream, self.device)
        self.free_on(<AsyncAllocation>a, s)

    def trim_to(self, nbytes):
        """Give back freed blocks down to ``nbytes`` held bytes (to the caching allocator, whose idle chunks then go
        back to the plugin if the device's streams are idle; it does not wait for them, see ``empty_cache()``).
        Memory in use, or whose free has not completed, is never touched. Returns the bytes the pool still holds in
        freed blocks."""
        self._check()
        if nbytes < 0:
            raise errors.InvalidArgument(f"{self.device}: trim_to: nbytes must be >= 0, not {nbytes}")
        self._retire_safe(nbytes)
        with nogil:
            core_empty_cache(self.core)
        return self.cached_bytes

    def stats(self):
        """Bytes of the pool like cudaMemPool's attributes: ``reserved_mem_current``/``_high`` (held from the
        allocator: in use + freed blocks kept), ``used_mem_current``/``_high`` (in use), plus ``cached`` and the
        number of cross-stream reuses by reason."""
        return {
            "reserved_mem_current": self.reserved_cur, "reserved_mem_high": self.reserved_high,
            "used_mem_current": self.used_cur, "used_mem_high": self.used_high,
            "cached": self.cached_bytes,
            "reuse_after_host_sync": self.n_reuse[REUSE_HOST_SYNCED],
            "reuse_follow_event_dependencies": self.n_reuse[REUSE_EVENT_DEPENDENCY],
            "reuse_opportunistic": self.n_reuse[REUSE_OPPORTUNISTIC],
            "reuse_internal_dependencies": self.n_reuse[REUSE_INTERNAL_DEPENDENCY],
        }

    def reset_peak(self):
        """Reset the high-water marks to the current values (cudaMemPoolAttrReservedMemHigh/UsedMemHigh = 0)."""
        self.used_high = self.used_cur
        self.reserved_high = self.reserved_cur

    def pending_frees(self):
        """[(stream name, position of the free, size)] of the freed blocks the pool holds (for tests and tools)."""
        cdef _FreedBlock e
        return [(e.stream.name, e.pos, e.size) for e in self._freed_blocks()]


cdef Stream _as_stream(object stream, Device dev):
    if not isinstance(stream, Stream):
        raise errors.InvalidArgument(f"{dev}: expected a paddle_rt Stream, not {type(stream).__name__}")
    return <Stream>stream


cdef AsyncAllocation pool_malloc(MemPool pool, size_t n, Stream s):
    return pool.malloc_on(n, s)


cdef int pool_free(AsyncAllocation a, Stream s) except -1:
    return a.pool.free_on(a, s)


cdef MemPool default_pool_of(Device dev):
    p = dev.layers.get("mem_pool")
    if p is None:
        with _default_pool_lock:
            # creating a pool releases the GIL: one pool per device, or a second one's held blocks would be freed
            # when its last allocation goes
            p = dev.layers.get("mem_pool")
            if p is None:
                p = MemPool(dev)
                dev.layers["mem_pool"] = p
    return <MemPool>p


def default_mem_pool(device=None):
    """The default :class:`MemPool` of ``device`` (default: the current device), created on first use."""
    return default_pool_of(resolve_device(device))


def malloc_async(nbytes, stream=None, pool=None):
    """Allocate ``nbytes`` ordered on ``stream`` (default: the current stream) from ``pool`` (default: the
    default pool of the stream's device). Memory freed on the same stream is reused at once; memory freed on another
    stream only as the pool's policies allow (see :class:`MemPool`). Out of memory: after the policies, the pool
    synchronizes the streams holding pending frees, hands every freed block back to the allocator and retries (the
    allocator releases its idle chunks to the plugin), then raises :class:`OutOfMemoryError`."""
    cdef Stream s
    cdef MemPool p
    if pool is not None:
        if not isinstance(pool, MemPool):
            raise errors.InvalidArgument(f"malloc_async: pool must be a MemPool, not {type(pool).__name__}")
        p = pool
        s = current_stream(p.device) if stream is None else _as_stream(stream, p.device)
    else:
        s = current_stream(None) if stream is None else _as_stream(stream, None)
        p = default_pool_of(s.device)
    p._check()
    return p.malloc_on(_check_nbytes(nbytes, "malloc_async", p.device), s)


def free_async(a, stream=None):
    """Free an allocation from :func:`malloc_async` ordered on ``stream`` (default: the stream it was allocated
    on): later work on ``stream`` may reuse it at once; other streams as the pool's policies allow."""
    if not isinstance(a, AsyncAllocation):
        raise errors.InvalidArgument(f"free_async needs an allocation from malloc_async, not {type(a).__name__}")
    cdef AsyncAllocation aa = <AsyncAllocation>a
    if aa.pool is None:
        raise errors.InvalidArgument("free_async: not an allocation of a MemPool")
    cdef Stream s = aa.stream if stream is None else _as_stream(stream, aa.device)
    aa.pool.free_on(aa, s)


def _teardown_pools():
    global _torn_down
    cdef MemPool p
    cdef _FreedBlock e
    for p in list(_pools):
        try:
            for e in p._freed_blocks():
                if p._drop_entry(e):
                    p._retire(e)
        except BaseException:
            pass
    _torn_down = True


_device_mod.register_teardown(_teardown_pools, 10)


