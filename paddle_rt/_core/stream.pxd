# Streams: an ordered library-side queue per stream with its own worker thread (stream_support.pxd), driving the
# plugin's stream when it has one. Positions are cheap: the n-th operation submitted to a stream has position n.
#
# C API for Cython users (cimport paddle_rt._core.stream):
#   stream_launch_host_func(s, fn, arg)   enqueue `fn(arg)` (a `void (*)(void*) noexcept nogil`) on s; nogil; returns
#                                         the operation's position, or 0 with an exception set (closed stream, no
#                                         memory). fn runs on s's worker thread, after everything submitted before it.
#   stream_position(s)                    position of the last operation submitted to s (nogil)
#   stream_reached(s, pos)                True when everything up to `pos` has completed (nogil, never blocks)
#   stream_device_idle(device)            True when every live stream of `device` (a Device as void*; NULL: of every
#                                         device) has completed everything submitted to it so far (nogil, never
#                                         blocks; may be called with an allocator lock held, never the reverse).
#                                         A stream that ever ran a P2P copy counts for every device.
#   stream_device_quiesce(device)         with the GIL: wait (GIL released, Ctrl-C raises) until every open stream of
#                                         `device` (None: every device) has reached its current position; pending
#                                         errors are not raised (they stay for the stream's synchronize). On a
#                                         stream's worker (inside a callback) it does not wait at all: that stream
#                                         is busy running the callback, and waiting for the others could deadlock.
#   stream_order_now()                    the process's order counter (nogil, one atomic load): memory freed when it
#                                         read S, last used by work on its stream, may go elsewhere once
#                                         stream_tag_done(device, tag, S) (the stream's work before S has run)
#   stream_tag_done(device, tag, seq)     nogil, never blocks beyond the stream registry's mutex; tag = an allocator
#                                         tag (stream_alloc_tag); True also for a tag of no live stream (closed)
#   stream_tag_wait(device, tag, seq, ns) nogil: wait (polling, nothing held between polls) until stream_tag_done,
#                                         at most ns nanoseconds; whether it became true. Never from a stream's worker
#                                         (it may be the stream waited for) nor with the GIL held (a callback may need it).
#   current_stream_tag(dev)               an opaque tag of the calling thread's current stream on `dev` (nogil):
#                                         the selected stream's core address, or 0 for the device's default stream
from libc.stdint cimport uint64_t, uintptr_t, int64_t
from cpython.ref cimport PyObject
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_Stream, C_Status
from paddle_rt._core.device cimport Device
from paddle_rt._core.includes.stream_support cimport prt_stream_core, prt_op_fn, prt_event_core

ctypedef void (*host_func_t)(void* arg) noexcept nogil

# What the worker's operations need, reachable without the GIL (core.ctx points here).
cdef struct StreamCtx:
    C_DeviceInterface* iface
    C_Device cdev
    C_Stream pstream           # the plugin's stream (opaque; NULL when the plugin has no streams)
    bint has_pstream           # created by create_stream (or wrapped) -> async hooks may be used with it
    PyObject* errors           # list of (position, exception, what): owned reference
    PyObject* device           # the Device (owned reference) for error messages
    prt_stream_core* core
    void* tstate               # the worker's own PyThreadState (kept for its lifetime: cheap GIL for callbacks)
    int gstate

cdef class Stream:
    cdef StreamCtx* ctx
    cdef readonly Device device
    cdef readonly bint owned           # created by paddle_rt (destroyed by close); False for from_handle
    cdef readonly bint closed
    cdef readonly str name
    cdef int _waiting                # pins: threads using ctx without the GIL (_wait_position, pin/unpin);
                                     # close() frees ctx only after they left (docs/concurrency.md)
    cdef bint _closing               # close() is under way: no new work; ctx stays until the worker is joined
    cdef int _fork_gen               # _fork_generation when created: a child of fork() must not touch the worker
    cdef uintptr_t _alloc_tag        # stream_alloc_tag: its queue's tag, 0 once it is its device's default stream
    cdef object __weakref__

    cdef int _setup(self, Device dev, uintptr_t handle, bint has_pstream, bint owned) except -1
    cdef int _free_ctx(self) except -1
    cdef int _check_process(self) except -1
    cdef int _check_open(self) except -1
    # Pin ctx for a section that releases the GIL (close() waits for the pins before freeing it): after
    # _check_open, with the GIL held and no Python call between the check and the pin. unpin() with the GIL.
    cdef StreamCtx* pin(self) except NULL
    cdef void unpin(self) noexcept
    # flags: PRT_OP_* | prt_op_kind(PRT_OPK_...) (what the profiler calls the operation); nbytes: bytes it moves
    cdef uint64_t enqueue(self, prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes=*) except 0
    cdef uint64_t _enqueue_pinned(self, prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes=*) except 0
    # run fn on the calling thread at once as the next operation when the stream is idle (short host-side operations
    # only); its position, or 0 when the stream is busy (enqueue it then)
    cdef uint64_t run_now_if_idle(self, prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes) except? 0
    cdef int _wait_position(self, uint64_t pos) except -1
    cdef int raise_errors(self, uint64_t upto) except -1
    cdef uint64_t launch_host_func(self, host_func_t fn, void* arg) except 0 nogil

# A point of a stream that other streams can be made to wait for: record_on(s) marks s's current end (the latest
# record wins); wait_on(w) makes later work on w wait until it is reached. Stream.wait_stream uses a bare one;
# event.Event derives from it (the plugin's event, timing, the host's waits), so Stream.wait_event needs nothing of
# event.pyx.
cdef class StreamMark:
    cdef prt_event_core* core
    cdef Stream _stream              # stream of the latest record (for its errors)
    cdef uint64_t _pos               # that stream's position at the latest record
    cdef uint64_t _seq               # the order counter just before it (work of that stream up to it precedes it)
    cdef uint64_t _gen               # the latest record's number (0: never recorded)

    cdef int record_on(self, Stream s) except -1
    cdef int wait_on(self, Stream s) except -1
    cdef int _check_process(self) except -1

cdef uint64_t stream_launch_host_func(Stream s, host_func_t fn, void* arg) except 0 nogil
cdef uint64_t stream_position(Stream s) noexcept nogil
# The stream core whose worker the calling thread is (NULL on other threads): one per thread in the process.
cdef prt_stream_core* stream_current_worker() noexcept nogil
cdef bint stream_reached(Stream s, uint64_t pos) noexcept nogil
cdef uintptr_t current_stream_tag(Device dev) noexcept nogil
# The allocator's tag of `s`: 0 for its device's default stream (what current_stream_tag gives when no stream is
# selected), else its queue's tag (unique in the process, never reused).
cdef uintptr_t stream_alloc_tag(Stream s) noexcept
cdef bint stream_device_idle(void* device) noexcept nogil
cdef uint64_t stream_order_now() noexcept nogil
cdef bint stream_tag_done(void* device, uintptr_t tag, uint64_t seq) noexcept nogil
cdef bint stream_tag_wait(void* device, uintptr_t tag, uint64_t seq, int64_t timeout_ns) noexcept nogil
cdef int stream_device_quiesce(object device) except -1
# Ordering hooks for the stream-ordered pool (pool.pyx), called with the GIL: `host_sync(stream, pos)` after the host
# waited until `stream` reached `pos` (Stream.synchronize, Event.synchronize); `wait(waiter, recorded, pos)` after
# `waiter` was made to wait for position `pos` of `recorded` (Event.wait / Stream.wait_event), which covers the work
# of `recorded` that the order counter (stream_order_now) had numbered up to `seq`. Arguments are borrowed
# Stream objects as void*. One pair of hooks per process (NULL: none).
ctypedef void (*stream_host_sync_hook_t)(void* s, uint64_t pos) noexcept
ctypedef void (*stream_wait_hook_t)(void* waiter, void* recorded, uint64_t pos, uint64_t seq) noexcept
cdef void stream_set_order_hooks(stream_host_sync_hook_t host_sync, stream_wait_hook_t wait) noexcept
cdef void stream_notify_host_sync(Stream s, uint64_t pos) noexcept
cdef void stream_notify_wait(Stream waiter, Stream recorded, uint64_t pos, uint64_t seq) noexcept
# With the GIL: how far `s` has run in order-counter terms: every operation of s numbered up to it has completed (the
# counter now when s is idle). A stream closed or of the parent process: the counter now (nothing of it runs here).
cdef uint64_t stream_done_seq(Stream s) noexcept
# With the GIL: the open streams of `dev` of this process (a snapshot list).
cdef list device_open_streams(Device dev)
# Wait (on the worker) for the plugin stream behind ctx: 0, or -1 after recording the error.
cdef int stream_ctx_plugin_sync(StreamCtx* ctx) noexcept nogil
# Record a plugin error found on a worker as an error of the stream (takes the GIL).
cdef void record_plugin_error(StreamCtx* ctx, uint64_t pos, const char* call, C_Status status) noexcept nogil
# Incremented in the child after each fork(): objects made under another generation belong to the parent.
cdef int fork_generation() noexcept nogil
cpdef Stream current_stream(object device=*)
# current_stream(dev) for a Device: the default stream without a look at the thread's stream stack when the thread
# selected none of dev's streams (current_stream_tag(dev) == 0).
cdef Stream stream_of_device(Device dev)
cpdef Stream default_stream(object device=*)
