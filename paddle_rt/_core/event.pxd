# Events: a record marks a point of a stream; paddle_rt knows when the stream reaches it (its own queue), so query,
# synchronize, cross-stream waits and timing (a nanosecond host clock stamped when the stream reaches the record)
# work on every plugin. The plugin's event (created on the first record, on the stream's device) is recorded at that
# point too, so `handle` can be given to code that uses the plugin directly.
from libc.stdint cimport uint64_t
from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream
from paddle_rt._core.includes.stream_support cimport prt_event_core

cdef class Event:
    cdef prt_event_core* core
    cdef readonly bint enable_timing
    cdef readonly bint blocking
    cdef readonly Device device      # set by the first record
    cdef Stream _stream              # stream of the latest record (for its errors)
    cdef uint64_t _pos               # that stream's position at the latest record
    cdef uint64_t _gen               # the latest record's number (0: never recorded)
    cdef object __weakref__

    cdef int _ensure_plugin_event(self, Stream s) except -1
    cdef int record_on(self, Stream s) except -1
    cdef int wait_on(self, Stream s) except -1
    cdef int _check_process(self) except -1
