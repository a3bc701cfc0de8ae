"""Events: points in a stream that other streams and the host can wait for, with host-clock timing on every plugin."""
import weakref

from libc.stdint cimport uint64_t, uintptr_t, int64_t
from libc.stdlib cimport calloc, free
from cpython.exc cimport PyErr_CheckSignals

from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_Event, C_Status
from paddle_rt._core.device cimport Device, check_status, raise_forked
from paddle_rt._core.plugin cimport process_forked
from paddle_rt._core.stream cimport Stream, StreamMark, current_stream, stream_notify_host_sync, \
    stream_current_worker
from paddle_rt._core.includes.stream_support cimport prt_event_core

from paddle_rt._core import errors
from paddle_rt._core import device as _device_mod

cdef long POLL_US = 20000
cdef bint _torn_down = False
_live_events = weakref.WeakSet()


# The plugin event lives as long as the core (queued operations hold references); freed through its device.
cdef struct PluginEventOwner:
    C_DeviceInterface* iface
    C_Device cdev


cdef void _free_plugin_event(prt_event_core* core) noexcept nogil:
    cdef PluginEventOwner* o = <PluginEventOwner*>core.owner
    if o == NULL:
        return
    if core.plugin_event != NULL and not _torn_down:
        o.iface.set_device(o.cdev)
        o.iface.destroy_event(o.cdev, <C_Event>core.plugin_event)
    core.plugin_event = NULL
    core.owner = NULL
    free(o)


cdef class Event(StreamMark):
    """``Event(enable_timing=False, blocking=False)``: like a CUDA event. ``record(stream)`` marks the point of the
    stream (default: the current stream); ``query()``, ``synchronize()``, ``wait(stream)``, ``elapsed_time(end)``
    (milliseconds between two timing events, from a nanosecond host clock stamped when the stream reached each
    record). Waits release the GIL and poll, so Ctrl-C works whether ``blocking`` is set or not."""

    def __cinit__(self, enable_timing=False, blocking=False):
        # StreamMark.__cinit__ made the event core
        if process_forked():
            raise_forked(None)
        self.enable_timing = bool(enable_timing)
        self.blocking = bool(blocking)
        self.core.timing = 1 if self.enable_timing else 0
        _live_events.add(self)

    def __repr__(self):
        state = "unrecorded" if self._gen == 0 else ("complete" if self.core.is_done(self._gen) else "pending")
        return f"<paddle_rt.Event {state}{' timing' if self.enable_timing else ''} device={self.device!r}>"

    cdef int _ensure_plugin_event(self, Stream s) except -1:
        cdef Device dev = s.device
        cdef C_Event h = NULL
        cdef C_Status st
        cdef PluginEventOwner* o
        if self.device is None:
            dev.activate()
            with nogil:
                st = dev.iface.create_event(dev.cdev(), &h)
            check_status(dev, "create_event", st)
            o = <PluginEventOwner*>calloc(1, sizeof(PluginEventOwner))
            if o == NULL:
                with nogil:
                    dev.iface.destroy_event(dev.cdev(), h)
                raise MemoryError()
            o.iface = dev.iface
            o.cdev = dev.cdev()
            self.core.plugin_event = <void*>h
            self.core.owner = o
            self.core.on_free = _free_plugin_event
            self.device = dev
        elif self.device is not dev:
            raise errors.InvalidArgument(f"{s.device!r}: Event.record: the event belongs to {self.device!r} "
                                         f"(it was first recorded there); record it on a stream of that device")
        return 0

    cdef int record_on(self, Stream s) except -1:
        s._check_open()
        # creating the plugin event releases the GIL: s may be closed meanwhile (StreamMark.record_on re-checks it
        # when it pins s: docs/concurrency.md)
        self._ensure_plugin_event(s)
        return StreamMark.record_on(self, s)

    def record(self, stream=None):
        """Record the event on ``stream`` (default: the current stream of the current device)."""
        cdef Stream s = current_stream() if stream is None else stream
        self.record_on(s)

    def query(self):
        """True when the latest record has completed (or the event was never recorded)."""
        if process_forked():
            raise_forked(self.device)
        return self._gen == 0 or self.core.is_done(self._gen)

    def synchronize(self):
        """Wait until the latest record completes (GIL released, Ctrl-C works). Raises :class:`StreamError` for
        errors of the recorded stream's work before the record."""
        if process_forked():
            raise_forked(self.device)
        cdef uint64_t gen = self._gen
        cdef bint ok
        if gen == 0:
            return
        self._check_process()
        if not self.core.is_done(gen) and self._stream is not None and self._stream.ctx != NULL and \
                stream_current_worker() == self._stream.ctx.core:
            raise errors.StreamError(f"{self._stream.name}: waiting for an event recorded later on this stream from "
                                     f"one of its own callbacks would deadlock")
        while not self.core.is_done(gen):
            with nogil:
                ok = self.core.wait_for(gen, POLL_US)
            if not ok:
                PyErr_CheckSignals()
        stream_notify_host_sync(self._stream, self._pos)
        if self._stream is not None and not self._stream.closed:
            self._stream.raise_errors(self._pos)

    def wait(self, stream=None):
        """Make later work on ``stream`` (default: the current stream) wait for this event's latest record."""
        cdef Stream s = current_stream() if stream is None else stream
        self.wait_on(s)

    def elapsed_time(self, Event end not None):
        """Milliseconds from this event's record to ``end``'s (both created with ``enable_timing=True``, recorded
        and complete)."""
        if process_forked():
            raise_forked(self.device)
        pair = (("start", self), ("end", end))
        for name, e in pair:
            if not (<Event>e).enable_timing:
                raise errors.InvalidArgument(f"elapsed_time: the {name} event was created without timing "
                                             f"(use Event(enable_timing=True))")
        for name, e in pair:
            if (<Event>e)._gen == 0:
                raise errors.InvalidArgument(f"elapsed_time: the {name} event was never recorded")
        for name, e in pair:
            if not (<Event>e).core.is_done((<Event>e)._gen):
                raise errors.StreamError(f"elapsed_time: the {name} event's record has not completed yet "
                                         f"(synchronize() it first)")
        cdef int64_t a = self.core.stamp_now()
        cdef int64_t b = end.core.stamp_now()
        return (b - a) / 1e6

    @property
    def handle(self):
        """The plugin's event handle as an int (0 before the first record). Opaque."""
        return <uintptr_t>self.core.plugin_event


def _teardown_events():
    global _torn_down
    cdef Event e
    for e in list(_live_events):
        if e.core != NULL and e.core.owner != NULL:
            _free_plugin_event(e.core)
    _torn_down = True


_device_mod.register_teardown(_teardown_events, 21)
