"""Streams: ordered queues of work with host callbacks.

Every paddle_rt :class:`Stream` has a library-side ordered queue (a C++ linked queue under a mutex, operations
recycled through a free list) and one worker thread that runs it; every plugin call on the worker first sets that call's
device. When the plugin has streams (``create_stream``), plugin work with an async hook (copies)
is handed to the plugin's stream and the worker synchronises that stream before the next host operation (callbacks,
event marks, memsets, synchronous-hook copies) and whenever it runs out of work. So submission order is execution
order on every plugin, and a plugin without ``create_stream``, async copies, ``stream_add_callback`` or the query hooks
gets the same asynchronous semantics from the worker alone (paddle_rt never needs ``stream_add_callback``). Hooks that
return ``C_WARNING`` (done synchronously) count as done.

Semantics and decisions:
- Python callbacks run on the stream's worker thread, holding the GIL only while they run. Inside one, enqueueing
  more work anywhere and synchronising *other* streams is fine; synchronising or closing the callback's own stream
  raises :class:`StreamError` (it would wait for itself).
- Errors: an exception raised by a Python callback (any BaseException) or a plugin error in asynchronous work is kept
  with the position of its operation and raised once, as :class:`StreamError` chained to the original (``__cause__``
  keeps its traceback; ``.errors`` lists all of them), by the next ``synchronize()`` of the stream, by
  ``synchronize()`` of an event recorded after it, or by ``close()``. Later work on the stream is NOT cancelled: it
  runs, so a stream never hangs or silently drops work after an error.
- Cross-stream waits (``wait_event``/``wait_stream``) are paddle_rt's own: the waiting stream's worker blocks until
  the event's record completes, which works across devices and plugins.
- Positions: the n-th operation submitted to a stream has position n; ``completed_position`` is the highest position
  known complete (see stream.pxd for the nogil C API).
- Interop: ``Stream.from_handle`` wraps a plugin stream; paddle_rt's plugin work reaches the handle from the worker,
  in order, so work that other code submits directly to the handle is ordered with paddle_rt's work only through
  ``synchronize()`` or events.
- Releasing memory: a C-level registry of the live streams (stream_support.pxd) tells the allocator whether the
  streams of a device still have queued work (stream_device_idle); the allocator keeps idle chunks cached until they
  have none, and ``empty_cache()`` first waits for them (stream_device_quiesce). A stream that ran a P2P copy counts
  for both devices (for every device, simply). Closed or collected streams leave the registry.
- Every wait releases the GIL and polls every 20 ms, so Ctrl-C raises KeyboardInterrupt in the waiting thread (the
  queued work keeps running). ``close()`` (also at interpreter exit, and when a stream is garbage collected) waits
  for pending work; only streams paddle_rt created are destroyed in the plugin.
"""
import sys
import threading
import weakref

from libc.stdint cimport uint64_t, uintptr_t, int64_t
from libc.stdlib cimport calloc, free
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.exc cimport PyErr_CheckSignals
from posix.unistd cimport usleep

from paddle_rt._core.device_ext cimport (
    C_DeviceInterface, C_Device, C_Stream, C_Event, C_Status, C_SUCCESS, C_WARNING, C_FAILED,
)
from paddle_rt._core.device cimport Device, resolve_device, check_status, add_synchronize_hook
from paddle_rt._core.includes.stream_support cimport (
    prt_stream_core, prt_stream_core_new, prt_stream_core_delete, prt_t_worker, prt_op_fn, PRT_OP_NEEDS_IDLE,
    prt_t_stream_tag, prt_t_stream_dev, prt_save_thread, prt_restore_thread, prt_gil_ensure, prt_gil_release,
    prt_op_kind, PRT_OPK_NOP, PRT_OPK_HOST_FUNC, PRT_OPK_PY_CALLBACK, PRT_OPK_MEMCPY_P2P, PRT_OP_DROPPABLE,
    PRT_POS_DROPPED, prt_event_core, prt_event_core_new, PRT_OPK_EVENT_RECORD, PRT_OPK_EVENT_WAIT,
    prt_streams_reset, prt_streams_add, prt_streams_remove, prt_streams_idle, prt_streams_count,
    prt_order_counter, prt_streams_done, prt_streams_wait_done, prt_streams_set_default, prt_next_stream_tag,
)
from paddle_rt._core.includes.trace_support cimport prt_trace_record, PRT_TRACE_STREAMS, PRT_EV_OP
from paddle_rt._core.trace cimport trace_mask, trace_emit

from paddle_rt._core import errors
from paddle_rt._core import device as _device_mod

cdef long POLL_US = 20000          # waits poll every 20 ms so that Ctrl-C is seen
_live_streams = weakref.WeakSet()  # open streams (closed at exit; only those paddle_rt created are destroyed)
_tls = threading.local()
_default_lock = threading.Lock()
_stream_counter = [0]
cdef int _fork_generation = 0


def _after_fork_in_child():
    global _fork_generation, _default_lock
    _fork_generation += 1
    _default_lock = threading.Lock()     # a thread of the parent may have held it at the fork
    _live_streams.clear()
    prt_streams_reset()          # the parent's streams have no workers here (and their registry lock may be held)


import os as _os


cdef int fork_generation() noexcept nogil:
    return _fork_generation

_os.register_at_fork(after_in_child=_after_fork_in_child)

if prt_streams_reset() != 0:
    raise MemoryError("paddle_rt streams: no memory for the stream registry")


# -- worker-side helpers (no GIL unless said) ------------------------------------------------------------------------
cdef void _worker_init(void* p) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    # Give the worker a Python thread state for its whole life: otherwise every Python callback would create and
    # destroy one (~10 us each).
    ctx.gstate = prt_gil_ensure()
    ctx.tstate = prt_save_thread()
    ctx.iface.set_device(ctx.cdev)


cdef void _worker_exit(void* p) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    if ctx.tstate != NULL:
        prt_restore_thread(ctx.tstate)
        ctx.tstate = NULL
        prt_gil_release(ctx.gstate)


cdef int _plugin_sync(void* p) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    cdef C_Status st = C_SUCCESS
    ctx.iface.set_device(ctx.cdev)
    if ctx.iface.synchronize_stream != NULL:
        st = ctx.iface.synchronize_stream(ctx.cdev, ctx.pstream)
        if st != C_SUCCESS and st != C_WARNING:
            record_plugin_error(ctx, ctx.core.completed_now() + 1, "synchronize_stream", st)
            return -1
    elif ctx.iface.synchronize_device != NULL:
        st = ctx.iface.synchronize_device(ctx.cdev)
        if st != C_SUCCESS and st != C_WARNING:
            record_plugin_error(ctx, ctx.core.completed_now() + 1, "synchronize_device", st)
            return -1
    return 0


cdef int stream_ctx_plugin_sync(StreamCtx* ctx) noexcept nogil:
    if not ctx.has_pstream:
        return 0
    return _plugin_sync(ctx)


cdef void record_plugin_error(StreamCtx* ctx, uint64_t pos, const char* call, C_Status status) noexcept nogil:
    with gil:
        try:
            exc = errors.PluginError(repr(<object>ctx.device), call.decode(), status,
                                     "in asynchronous work on a stream")
            (<list>ctx.errors).append((pos, exc, call.decode()))
        except BaseException:
            pass


cdef int _run_host_func(void* p, void* arg, uint64_t aux, uint64_t pos) noexcept nogil:
    (<host_func_t><uintptr_t>aux)(arg)
    return 0


cdef int _run_py_callback(void* p, void* arg, uint64_t aux, uint64_t pos) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    if pos & PRT_POS_DROPPED:
        with gil:
            Py_DECREF(<object>arg)   # dropped (close(wait=False), exit): only the queue's reference goes
        return 0
    with gil:
        item = <object>arg
        Py_DECREF(item)          # the queue's reference; `item` keeps it alive until the end of this block
        fn, args = item
        try:
            fn(*args)
        except BaseException as exc:
            try:
                (<list>ctx.errors).append((pos, exc, fn))
            except BaseException:
                pass
        item = None
        fn = args = None
    ctx.iface.set_device(ctx.cdev)   # a callback may have changed this thread's device
    return 0


cdef int _run_nothing(void* p, void* arg, uint64_t aux, uint64_t pos) noexcept nogil:
    return 0


# The worker reports a traced operation (stream_support.pxd: prt_stream_core.traced).
cdef void _trace_op(void* p, int kind, uint64_t pos, uint64_t nbytes, int64_t enq_ns, int64_t start_ns,
                    int64_t end_ns) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    cdef prt_trace_record r
    r.kind = PRT_EV_OP
    r.op = kind
    r.device = <void*>ctx.device
    r.stream = ctx.core.tag
    r.addr = 0
    r.size = nbytes
    r.pos = pos
    r.t_ns = start_ns
    r.t_end_ns = end_ns
    r.t_enq_ns = enq_ns
    r.allocated = 0
    r.reserved = 0
    r.frames = NULL
    trace_emit(&r)


def stream_tag(Stream s):
    """The opaque tag of ``s`` in recorded events and allocator blocks (unique in the process; 0 once closed)."""
    return 0 if s.ctx == NULL else s.ctx.core.tag


def trace_stream_names():
    """{tag: (device string, stream name, is the device's default stream)} of the open streams (for the profiler)."""
    cdef Stream s
    out = {}
    for s in list(_live_streams):
        if s.ctx != NULL and not s.closed:
            d = s.device.layers.get("streams.default")
            out[s.ctx.core.tag] = (str(s.device), s.name, d is s)
    return out


# -- the C API ---------------------------------------------------------------------------------------------------------
cdef uint64_t stream_launch_host_func(Stream s, host_func_t fn, void* arg) except 0 nogil:
    return s.launch_host_func(fn, arg)


cdef uintptr_t stream_alloc_tag(Stream s) noexcept:
    if s.ctx == NULL:
        return 0
    return s._alloc_tag


cdef prt_stream_core* stream_current_worker() noexcept nogil:
    """The stream core whose worker the calling thread is, NULL on other threads. The thread-local lives in this
    module's engine/stream_state.cpp; other modules cimport this function (a copy of their own would never be set)."""
    return prt_t_worker


cdef uint64_t stream_position(Stream s) noexcept nogil:
    if s.ctx == NULL:
        return 0
    return s.ctx.core.submitted_now()


cdef bint stream_reached(Stream s, uint64_t pos) noexcept nogil:
    if s.ctx == NULL:
        return True
    return s.ctx.core.reached(pos)


cdef bint stream_device_idle(void* device) noexcept nogil:
    return prt_streams_idle(device)


cdef uint64_t stream_order_now() noexcept nogil:
    return prt_order_counter().load()


cdef bint stream_tag_done(void* device, uintptr_t tag, uint64_t seq) noexcept nogil:
    return prt_streams_done(device, tag, seq)


cdef bint stream_tag_wait(void* device, uintptr_t tag, uint64_t seq, int64_t timeout_ns) noexcept nogil:
    return prt_streams_wait_done(device, tag, seq, timeout_ns)


cdef int stream_device_quiesce(object device) except -1:
    cdef Stream s
    cdef uint64_t pos
    if prt_t_worker != NULL:
        return 0                 # a callback: its own stream is busy anyway, and waiting could deadlock
    for s in list(_live_streams):
        if s.closed or s.ctx == NULL or s._fork_gen != _fork_generation:
            continue
        if device is not None and s.device is not device and not s.ctx.core.cross_device_now():
            continue
        pos = s.ctx.core.submitted_now()
        s._wait_position(pos)      # pending errors stay for the stream's synchronize()
        stream_notify_host_sync(s, pos)     # a synchronize point for the pools (their held blocks may go back)
    return 0


def _registry_count(device=None):
    """Streams in the C registry the allocator consults (of ``device``, a Device; None: all) and whether they are
    all idle (for tests)."""
    cdef Device d
    cdef void* key = NULL
    if device is not None:
        d = resolve_device(device)
        key = <void*>d
    return prt_streams_count(key), bool(prt_streams_idle(key))


cdef uintptr_t current_stream_tag(Device dev) noexcept nogil:
    if prt_t_stream_dev == <void*>dev:
        return <uintptr_t>prt_t_stream_tag
    return 0


cdef stream_host_sync_hook_t _host_sync_hook = NULL
cdef stream_wait_hook_t _wait_hook = NULL


cdef void stream_set_order_hooks(stream_host_sync_hook_t host_sync, stream_wait_hook_t wait) noexcept:
    global _host_sync_hook, _wait_hook
    _host_sync_hook = host_sync
    _wait_hook = wait


cdef void stream_notify_host_sync(Stream s, uint64_t pos) noexcept:
    if _host_sync_hook != NULL and s is not None:
        _host_sync_hook(<void*>s, pos)


cdef void stream_notify_wait(Stream waiter, Stream recorded, uint64_t pos, uint64_t seq) noexcept:
    if _wait_hook != NULL and waiter is not None and recorded is not None:
        _wait_hook(<void*>waiter, <void*>recorded, pos, seq)


cdef list device_open_streams(Device dev):
    """The open streams of ``dev`` (a snapshot) that belong to this process."""
    cdef Stream s
    out = []
    for ref in list(_live_streams.data):
        s = ref()
        if s is not None and s.device is dev and not s.closed and not s._closing and s.ctx != NULL and \
                s._fork_gen == _fork_generation:
            out.append(s)
    return out


cdef uint64_t stream_done_seq(Stream s) noexcept:
    cdef uint64_t now = prt_order_counter().load()
    if s.ctx == NULL or s.closed or s._fork_gen != _fork_generation or s.ctx.core.idle():
        return now
    return s.ctx.core.completed_seq_now()


# -- marks: points of a stream that other streams wait for ----------------------------------------------------------
# The queue side of event.Event (which derives from StreamMark and adds the plugin's event, timing and the host's
# waits), here so that Stream.wait_event and wait_stream need nothing of event.pyx.

# Runs on the stream's worker when the stream reaches the record (everything before it has completed).
cdef int _mark(void* p, void* arg, uint64_t gen, uint64_t pos) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    cdef prt_event_core* core = <prt_event_core*>arg
    cdef C_Status st
    core.complete(gen)     # stamp first: the plugin call below must not count in the timing
    if pos & PRT_POS_DROPPED:
        core.decref()      # dropped (close(wait=False), exit): complete, so that nothing waits for it forever
        return 0
    if core.plugin_event != NULL and gen == core.gen_now():
        ctx.iface.set_device(ctx.cdev)
        # everything before this point has completed (the worker synchronised the plugin stream), so the plugin
        # event is recorded on the NULL stream: complete at once, without waking the plugin's stream
        st = ctx.iface.record_event(ctx.cdev, NULL, <C_Event>core.plugin_event)
        if st != C_SUCCESS and st != C_WARNING:
            record_plugin_error(ctx, pos, "record_event", st)
    core.decref()
    return 0


# Runs on the waiting stream's worker: blocks that stream until the record completes.
cdef int _wait_mark(void* p, void* arg, uint64_t gen, uint64_t pos) noexcept nogil:
    cdef prt_event_core* core = <prt_event_core*>arg
    if not (pos & PRT_POS_DROPPED):
        core.wait_for(gen, -1)
    core.decref()
    return 0


cdef class StreamMark:
    """A point of a stream (its latest record) that other streams can be made to wait for (internal: the public
    kind is :class:`paddle_rt.Event`)."""

    def __cinit__(self, *args, **kwargs):
        self.core = prt_event_core_new()
        if self.core == NULL:
            raise MemoryError()
        self._gen = 0

    def __dealloc__(self):
        if self.core != NULL:
            self.core.decref()
            self.core = NULL

    cdef int record_on(self, Stream s) except -1:
        cdef uint64_t gen, pos, seq
        cdef StreamCtx* ctx
        cdef C_Status st
        ctx = s.pin()                 # checks s is open (StreamError, not a crash) and keeps ctx until unpin
        seq = prt_order_counter().load()
        try:
            gen = self.core.gen_next(1) + 1
            if not self.core.timing and ctx.core.idle() and not (trace_mask & PRT_TRACE_STREAMS):
                # Everything submitted to s has completed: the record completes now, without a queue round trip,
                # and the plugin event (if any) is recorded on the NULL stream (= at once). Timing events always go
                # through the queue so that the worker stamps them right where the stream is.
                pos = ctx.core.submitted_now()
                if self.core.plugin_event != NULL:
                    with nogil:
                        ctx.iface.set_device(ctx.cdev)
                        st = ctx.iface.record_event(ctx.cdev, NULL, <C_Event>self.core.plugin_event)
                    if st != C_SUCCESS and st != C_WARNING:
                        self.core.complete(gen)
                        check_status(s.device, "record_event", st)
                self.core.complete(gen)
            else:
                self.core.incref()
                try:
                    pos = s._enqueue_pinned(_mark, <void*>self.core, gen,
                                            PRT_OP_NEEDS_IDLE | PRT_OP_DROPPABLE | prt_op_kind(PRT_OPK_EVENT_RECORD))
                except BaseException:
                    self.core.complete(gen)
                    self.core.decref()
                    raise
        finally:
            s.unpin()
        self._gen = gen
        self._stream = s
        self._pos = pos
        self._seq = seq
        return 0

    cdef int _check_process(self) except -1:
        if self._stream is not None and self._stream._fork_gen != _fork_generation and \
                not self.core.is_done(self._gen):
            raise errors.ForkError("this event was recorded in the parent process (fork()) and will never "
                                   "complete here")
        return 0

    cdef int wait_on(self, Stream s) except -1:
        cdef uint64_t gen = self._gen
        s._check_open()
        self._check_process()
        if gen == 0:
            return 0
        if self.core.is_done(gen):
            stream_notify_wait(s, self._stream, self._pos, self._seq)
            return 0
        self.core.incref()
        try:
            s.enqueue(_wait_mark, <void*>self.core, gen, PRT_OP_DROPPABLE | prt_op_kind(PRT_OPK_EVENT_WAIT))
        except BaseException:
            self.core.decref()
            raise
        stream_notify_wait(s, self._stream, self._pos, self._seq)
        return 0


# (Device, handle) of plugin streams paddle_rt destroyed (Stream.close of a stream it created): Stream.from_handle
# refuses them (the plugin may still hand the value out again: create_stream takes it off).
cdef set _destroyed_handles = set()

cdef class Stream:
    """An ordered queue of work on a device. ``Stream(device=None)`` creates one (with the plugin's
    ``create_stream`` when it has it); :meth:`from_handle` wraps a plugin stream created elsewhere."""

    def __cinit__(self):
        self.ctx = NULL
        self.closed = True
        self.owned = False

    def __init__(self, device=None):
        if self.ctx != NULL:
            raise errors.StreamError(f"{self.name}: the stream is already initialised")
        cdef Device dev = resolve_device(device)
        cdef C_Stream h = NULL
        cdef C_Status st
        dev.activate()
        has = dev.iface.create_stream != NULL
        if has:
            with nogil:
                st = dev.iface.create_stream(dev.cdev(), &h)
            check_status(dev, "create_stream", st)
            _destroyed_handles.discard((dev, <uintptr_t>h))     # the plugin may hand out a destroyed handle again
        self._setup(dev, <uintptr_t>h, has, True)

    @staticmethod
    def from_handle(device, handle):
        """Wrap the plugin stream ``handle`` (an int) of ``device`` without owning it: ``close()`` does not destroy
        it. Work submitted here is ordered with other paddle_rt work on this object, and plugin work is handed to
        the handle."""
        cdef Device dev = resolve_device(device)
        cdef Stream s = Stream.__new__(Stream)
        if not isinstance(handle, int):
            raise errors.InvalidArgument(f"{dev!r}: Stream.from_handle: the handle must be an int, not "
                                         f"{type(handle).__name__}")
        if handle < 0 or handle >= (1 << 64):
            raise errors.InvalidArgument(f"{dev!r}: Stream.from_handle: handle {handle:#x} is out of range")
        if (dev, handle) in _destroyed_handles:
            raise errors.InvalidArgument(f"{dev!r}: Stream.from_handle: handle {handle:#x} is of a stream that was "
                                         f"closed (its plugin stream destroyed); create a new Stream")
        dev.activate()
        s._setup(dev, <uintptr_t>handle, dev.iface.create_stream != NULL, False)
        return s

    cdef int _setup(self, Device dev, uintptr_t handle, bint has_pstream, bint owned) except -1:
        cdef StreamCtx* ctx = <StreamCtx*>calloc(1, sizeof(StreamCtx))
        if ctx == NULL:
            if owned and has_pstream and dev.iface.destroy_stream != NULL:
                dev.iface.destroy_stream(dev.cdev(), <C_Stream>handle)
            raise MemoryError()
        ctx.core = prt_stream_core_new()
        if ctx.core == NULL:
            free(ctx)
            raise MemoryError()
        ctx.iface = dev.iface
        ctx.cdev = dev.cdev()
        ctx.pstream = <C_Stream>handle
        ctx.has_pstream = has_pstream
        errs = []
        ctx.errors = <PyObject*>errs
        Py_INCREF(errs)
        ctx.device = <PyObject*>dev
        Py_INCREF(dev)
        ctx.core.ctx = ctx
        ctx.core.thread_init = _worker_init
        ctx.core.thread_exit = _worker_exit
        ctx.core.plugin_sync = _plugin_sync
        ctx.core.trace_mask = &trace_mask
        ctx.core.trace_bit = PRT_TRACE_STREAMS
        ctx.core.trace_op = _trace_op
        ctx.core.order = prt_order_counter()
        ctx.core.tag = prt_next_stream_tag()
        self._alloc_tag = ctx.core.tag
        self.ctx = ctx
        self.device = dev
        self.owned = owned
        if prt_streams_add(<void*>dev, ctx.core) != 0:
            self._free_ctx()
            raise MemoryError(f"{dev!r}: no memory to register a stream")
        self._fork_gen = _fork_generation
        _stream_counter[0] += 1
        self.name = f"{dev!r}#{_stream_counter[0]}"
        if trace_mask:
            from paddle_rt._core import trace as _trace_mod
            _trace_mod.note_stream(ctx.core.tag, dev, self.name)
        try:
            ctx.core.start()
        except BaseException:
            self._free_ctx()
            raise
        self.closed = False
        _live_streams.add(self)      # closed at exit (a wrapped handle is not destroyed)
        _register_device_sync(dev)
        return 0

    cdef int _free_ctx(self) except -1:
        cdef StreamCtx* ctx = self.ctx
        if ctx == NULL:
            return 0
        self.ctx = NULL
        prt_streams_remove(ctx.core)
        prt_stream_core_delete(ctx.core)
        Py_DECREF(<object>ctx.errors)
        Py_DECREF(<object>ctx.device)
        free(ctx)
        return 0

    def __repr__(self):
        state = "closed" if self.closed else ("idle" if self.ctx.core.idle() else "busy")
        return f"<paddle_rt.Stream {self.name} {state}>"

    cdef int _check_open(self) except -1:
        if self.closed or self.ctx == NULL:
            raise errors.StreamError(f"{self.name}: the stream is closed")
        if self._closing:
            raise errors.StreamError(f"{self.name}: the stream is closing (close() was called)")
        return self._check_process()

    cdef int _check_process(self) except -1:
        if self._fork_gen != _fork_generation:
            raise errors.ForkError(f"{self.name}: this stream belongs to the parent process (fork()); create new "
                                   f"streams in the child after paddle_rt.reinitialize_after_fork()")
        return 0

    cdef StreamCtx* pin(self) except NULL:
        self._check_open()
        self._waiting += 1
        return self.ctx

    cdef void unpin(self) noexcept:
        self._waiting -= 1

    cdef uint64_t enqueue(self, prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes=0) except 0:
        self._check_open()
        return self._enqueue_pinned(fn, arg, aux, flags, nbytes)

    cdef uint64_t _enqueue_pinned(self, prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes=0) except 0:
        """enqueue() for a caller that checked the stream is open and pinned it (ctx stays)."""
        if (flags >> 8) == PRT_OPK_MEMCPY_P2P:
            self.ctx.core.set_cross_device(1)    # it uses another device's memory: count it for every device
        cdef uint64_t pos = self.ctx.core.enqueue(fn, arg, aux, flags, nbytes)
        if pos == 0:
            raise MemoryError(f"{self.name}: no memory for a stream operation")
        if pos == <uint64_t>-1:
            raise errors.StreamError(f"{self.name}: the stream is closing")
        return pos

    cdef uint64_t run_now_if_idle(self, prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes) except? 0:
        """When the stream is idle, run the operation on the calling thread at once (its position is taken and
        completed as if the worker ran it: no hand-off to the worker and back for a short host-side operation such
        as a staged small copy) and return its position; 0 when the stream is busy (nothing ran: enqueue it). fn
        must finish its work before returning (never return 1)."""
        cdef StreamCtx* ctx = self.pin()
        cdef uint64_t pos
        try:
            with nogil:
                pos = ctx.core.run_now_if_idle(fn, arg, aux, flags, nbytes)
        finally:
            self.unpin()
        if pos == <uint64_t>-1:
            raise errors.StreamError(f"{self.name}: the stream is closing")
        return pos

    cdef uint64_t launch_host_func(self, host_func_t fn, void* arg) except 0 nogil:
        cdef uint64_t pos
        if self.ctx == NULL or fn == NULL:
            with gil:
                if fn == NULL:
                    raise errors.InvalidArgument(f"{self.name}: launch_host_func: fn is NULL")
                raise errors.StreamError(f"{self.name}: the stream is closed")
        pos = self.ctx.core.enqueue(_run_host_func, arg, <uint64_t><uintptr_t>fn,
                                    PRT_OP_NEEDS_IDLE | prt_op_kind(PRT_OPK_HOST_FUNC))
        if pos == 0 or pos == <uint64_t>-1:
            with gil:
                raise errors.StreamError(f"{self.name}: cannot enqueue (closing or out of memory)")
        return pos

    @property
    def handle(self):
        """The plugin's stream handle as an int (0 when the plugin has no streams). Opaque: pass it back only to
        the same plugin."""
        self._check_open()
        return <uintptr_t>self.ctx.pstream

    @property
    def position(self):
        """Number of operations submitted to the stream so far."""
        return 0 if self.ctx == NULL else self.ctx.core.submitted_now()

    @property
    def completed_position(self):
        """Highest position known complete (everything up to it has run)."""
        return 0 if self.ctx == NULL else self.ctx.core.completed_now()

    def add_callback(self, fn, *args):
        """Run ``fn(*args)`` on this stream's worker thread after everything submitted before it and before
        everything submitted after it. It holds the GIL only while it runs. An exception is re-raised by the next
        ``synchronize()``. Returns the operation's position."""
        if not callable(fn):
            raise errors.InvalidArgument(f"{self.name}: add_callback: {fn!r} is not callable")
        self._check_open()
        item = (fn, args)
        Py_INCREF(item)
        try:
            return self.enqueue(_run_py_callback, <void*>item, 0,
                                PRT_OP_NEEDS_IDLE | PRT_OP_DROPPABLE | prt_op_kind(PRT_OPK_PY_CALLBACK))
        except BaseException:
            Py_DECREF(item)
            raise

    def add_host_func(self, fn, arg=0):
        """Enqueue a C function ``void fn(void* arg)`` given by address (an int, e.g. ``ctypes.cast(f,
        ctypes.c_void_p).value``), run on the worker like :meth:`add_callback` but without the GIL. ``arg`` is an int
        address passed through unchanged. Returns the operation's position."""
        if isinstance(fn, bool) or not isinstance(fn, int) or not 0 < fn < (1 << 64):
            raise errors.InvalidArgument(f"{self.name}: add_host_func: fn must be a non-zero function address (int)")
        if isinstance(arg, bool) or not isinstance(arg, int) or not 0 <= arg < (1 << 64):
            raise errors.InvalidArgument(f"{self.name}: add_host_func: arg must be an int address")
        self._check_open()
        return self.enqueue(_run_host_func, <void*><uintptr_t>arg, <uint64_t><uintptr_t>fn,
                            PRT_OP_NEEDS_IDLE | prt_op_kind(PRT_OPK_HOST_FUNC))

    def _enqueue_nop(self):
        """An empty operation (for benchmarks)."""
        return self.enqueue(_run_nothing, NULL, 0, prt_op_kind(PRT_OPK_NOP))

    def query(self):
        """True when everything submitted so far has completed."""
        self._check_process()          # the parent's stream: its worker is not in this process
        if self.ctx == NULL:
            return True
        return self.ctx.core.idle()

    cdef int _wait_position(self, uint64_t pos) except -1:
        cdef bint ok = False
        if self.ctx == NULL:
            return 0                 # closed: nothing of it runs any more (everything ran, or was dropped)
        cdef prt_stream_core* core = self.ctx.core
        if core.reached(pos):
            return 0
        if prt_t_worker == core:
            raise errors.StreamError(f"{self.name}: waiting for the stream from its own callback would deadlock")
        self._waiting += 1
        try:
            while True:
                with nogil:
                    ok = core.wait_for(pos, POLL_US)
                if ok:
                    return 0
                PyErr_CheckSignals()
        finally:
            self._waiting -= 1

    cdef int raise_errors(self, uint64_t upto) except -1:
        if self.ctx == NULL:
            return 0
        cdef list errs = <list>self.ctx.errors
        if not errs:
            return 0
        mine = [e for e in errs if e[0] <= upto]
        if not mine:
            return 0
        errs[:] = [e for e in errs if e[0] > upto]
        pos, exc, what = mine[0]
        more = f" (and {len(mine) - 1} more error(s): {[repr(e[1]) for e in mine[1:]]})" if len(mine) > 1 else ""
        if isinstance(exc, errors.PaddleRTError) and not callable(what):
            msg = f"{self.name}: asynchronous work failed at operation {pos}: {exc}{more}"
        else:
            msg = (f"{self.name}: host callback {getattr(what, '__qualname__', what)!s} (operation {pos}) raised "
                   f"{type(exc).__name__}: {exc}{more}")
        # an operator's typed error found on the stream stays catchable as that type (errors.stream_error_type)
        err = errors.stream_error_type(exc)(msg) if not callable(what) else errors.StreamError(msg)
        err.position = pos
        err.errors = [e[1] for e in mine]
        raise err from exc

    def synchronize(self):
        """Wait until everything submitted so far has run (the GIL is released; Ctrl-C interrupts the wait). Raises
        :class:`StreamError` for an exception of a callback or a plugin error in asynchronous work since the last
        synchronize."""
        self._check_open()
        cdef uint64_t pos = self.ctx.core.submitted_now()
        self._wait_position(pos)
        stream_notify_host_sync(self, pos)
        self.raise_errors(pos)

    def wait_event(self, event):
        """Make later work on this stream wait until ``event`` completes."""
        if not isinstance(event, StreamMark):          # an Event (event.pyx derives from StreamMark)
            raise errors.InvalidArgument(f"{self.name}: wait_event needs an Event, not {type(event).__name__}")
        (<StreamMark>event).wait_on(self)

    def wait_stream(self, Stream other not None):
        """Make later work on this stream wait until everything submitted so far to ``other`` completes."""
        if other is self:
            return
        cdef StreamMark m = StreamMark.__new__(StreamMark)
        m.record_on(other)
        m.wait_on(self)

    def close(self, wait=True):
        """Close the stream: no new work is accepted from the call on (``StreamError``); then, with ``wait=True``
        (the default), wait for all pending work; with ``wait=False``, drop the work that has not started yet (the
        operation running finishes; dropped callbacks, copies, memsets and operators never run, events recorded after
        the drop point complete without it; bookkeeping such as deferred frees and collectives still run). Then stop
        the worker and destroy the plugin stream (if paddle_rt created it). Pending errors are raised after the
        stream is closed. Closing twice does nothing; a close() racing another thread's close() returns once the
        stream is closed. Memory freed on the stream or recorded on it (``record_stream``) stays reserved by its
        pool/allocator until the close completes; other threads' calls on the stream raise ``StreamError`` from
        then on (see docs/concurrency.md)."""
        cdef StreamCtx* ctx = self.ctx
        cdef C_Status st = C_SUCCESS
        if self.closed or ctx == NULL:
            return
        if self._fork_gen != _fork_generation:
            self.closed = True       # the parent's worker does not exist here: forget the stream (its memory is lost)
            self.ctx = NULL
            return
        if prt_t_worker == ctx.core:
            raise errors.StreamError(f"{self.name}: a stream cannot be closed from its own callback")
        if self._closing:
            # another thread is closing it: return once it is closed (its ctx stays valid: we hold no pin)
            while not self.closed:
                with nogil:
                    usleep(1000)
                PyErr_CheckSignals()
            return
        self._closing = True
        cdef uint64_t pos = ctx.core.submitted_now()
        if wait:
            try:
                self._wait_position(pos)
            except BaseException:
                self._closing = False        # interrupted (Ctrl-C): the stream stays open
                raise
        else:
            ctx.core.drop_queued()
        with nogil:
            ctx.core.stop_and_join()
        while self._waiting:         # other threads still using ctx without the GIL (synchronize, pins): let them go
            with nogil:
                usleep(200)
        # Only now "closed": nothing of this stream runs any more (pools and deferred frees rely on it)
        self.closed = True
        _live_streams.discard(self)
        pending = list(<list>ctx.errors)
        if self.owned and ctx.has_pstream and ctx.iface.destroy_stream != NULL and self.device.alive():
            with nogil:
                ctx.iface.set_device(ctx.cdev)
                if ctx.iface.synchronize_stream != NULL:
                    ctx.iface.synchronize_stream(ctx.cdev, ctx.pstream)
                st = ctx.iface.destroy_stream(ctx.cdev, ctx.pstream)
            _destroyed_handles.add((self.device, <uintptr_t>ctx.pstream))
        self._free_ctx()
        check_status(self.device, "destroy_stream", st)
        if pending:
            pos0, exc, _ = pending[0]
            err = errors.StreamError(f"{self.name}: closed with {len(pending)} unreported error(s); first at "
                                     f"operation {pos0}: {type(exc).__name__}: {exc}")
            err.errors = [e[1] for e in pending]
            raise err from exc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        cdef StreamCtx* ctx = self.ctx
        if ctx == NULL:
            return
        self.ctx = NULL
        if self._fork_gen != _fork_generation:
            return                   # a child of fork(): the worker thread does not exist here
        if prt_t_worker == ctx.core:
            # dropped inside its own callback: let the worker finish; its memory is left (rare, small)
            with nogil:
                ctx.core.stop_and_join()
            return
        cdef bint destroy = self.owned and self.device is not None and self.device.alive()
        with nogil:
            ctx.core.stop_and_join()       # drains the queue first
            if destroy and ctx.has_pstream and ctx.iface.destroy_stream != NULL:
                ctx.iface.set_device(ctx.cdev)
                if ctx.iface.synchronize_stream != NULL:
                    ctx.iface.synchronize_stream(ctx.cdev, ctx.pstream)
                ctx.iface.destroy_stream(ctx.cdev, ctx.pstream)
        prt_streams_remove(ctx.core)
        prt_stream_core_delete(ctx.core)
        Py_DECREF(<object>ctx.errors)
        Py_DECREF(<object>ctx.device)
        free(ctx)


# -- default and current streams -----------------------------------------------------------------------------------
cdef Stream stream_of_device(Device dev):
    """current_stream(dev) for a Device, fast when the thread has selected no stream of it (its default stream)."""
    cdef object s
    if current_stream_tag(dev) == 0:
        s = dev.layers.get("streams.default")
        if s is not None and not (<Stream>s).closed:
            return <Stream>s
    return current_stream(dev)


cpdef Stream default_stream(object device=None):
    """The default stream of ``device`` (created lazily; one per device, shared by all threads)."""
    cdef Device dev = resolve_device(device)
    s = dev.layers.get("streams.default")
    if s is None or (<Stream>s).closed:
        with _default_lock:
            s = dev.layers.get("streams.default")
            if s is None or (<Stream>s).closed:
                s = Stream(dev)
                prt_streams_set_default((<Stream>s).ctx.core)
                (<Stream>s)._alloc_tag = 0            # the default stream's blocks: tag 0 (malloc without a stream)
                dev.layers["streams.default"] = s
                _register_device_sync(dev)
    return s


def _device_sync_hook(Device dev):
    # a snapshot of the WeakSet's references, without its (Python-level, ~1 us) iteration guard
    for ref in list(_live_streams.data):
        s = ref()
        if s is not None and (<Stream>s).device is dev and not (<Stream>s).closed:
            s.synchronize()


def _register_device_sync(Device dev):
    add_synchronize_hook(dev, _device_sync_hook)


cpdef Stream current_stream(object device=None):
    """The calling thread's current stream on ``device``: the one selected with ``with paddle_rt.stream(s)``, else
    the device's default stream."""
    cdef Device dev = resolve_device(device)
    stacks = getattr(_tls, "stacks", None)
    if stacks:
        st = stacks.get(dev)
        if st:
            return st[len(st) - 1]
    return default_stream(dev)


class stream:
    """``with paddle_rt.stream(s):`` makes ``s`` the current stream of this thread on its device (and its device
    the current device) for the block. ``stream(None)`` does nothing."""

    __slots__ = ("s", "prev_device")

    def __init__(self, s):
        if s is not None and not isinstance(s, Stream):
            raise errors.InvalidArgument(f"paddle_rt.stream() needs a Stream or None, not {type(s).__name__}")
        self.s = s

    def __enter__(self):
        cdef Stream s = self.s
        if s is None:
            return None
        s._check_open()
        stacks = getattr(_tls, "stacks", None)
        if stacks is None:
            stacks = _tls.stacks = {}
        stacks.setdefault(s.device, []).append(s)
        self.prev_device = _device_mod.get_device()
        _device_mod.set_device(s.device)
        _set_tag(s.device, s)
        return s

    def __exit__(self, *exc):
        cdef Stream s = self.s
        if s is None:
            return False
        st = _tls.stacks[s.device]
        st.pop()
        _set_tag(s.device, st[len(st) - 1] if st else None)
        _device_mod.set_device(self.prev_device)
        return False


cdef _set_tag(Device dev, Stream s):
    global prt_t_stream_tag, prt_t_stream_dev
    if s is None or s.ctx == NULL:
        prt_t_stream_tag = NULL
        prt_t_stream_dev = NULL
    else:
        prt_t_stream_tag = <void*>s._alloc_tag
        prt_t_stream_dev = <void*>dev


def _exit_abandons_work():
    """True when the interpreter exits after an unhandled exception or KeyboardInterrupt (the main program's
    traceback was printed: sys.last_value is set): queued work is then abandoned, as a CUDA process exit does not wait
    for queued kernels. A normal exit (end of the program, sys.exit) waits for it. PADDLE_RT_EXIT_WAIT=1/0 forces
    either."""
    forced = _os.environ.get("PADDLE_RT_EXIT_WAIT")
    if forced in ("0", "1"):
        return forced == "0"
    return getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None


def _teardown_streams():
    """At exit: close every stream paddle_rt created (wrapped handles are left alone), waiting for its queued work
    after a normal exit, dropping the work not yet started after an unhandled exception or KeyboardInterrupt."""
    cdef Stream st
    wait = not _exit_abandons_work()
    if not wait:
        for st in list(_live_streams):          # stop every stream's queue first: no stream waits for another's
            if not st.closed and st.ctx != NULL and st._fork_gen == _fork_generation:
                st.ctx.core.drop_queued()
    for s in list(_live_streams):
        try:
            s.close(wait=wait)
        except BaseException as exc:
            print(f"paddle_rt: closing {s.name} at exit: {exc}", file=sys.stderr)


_device_mod.register_teardown(_teardown_streams, 20)
