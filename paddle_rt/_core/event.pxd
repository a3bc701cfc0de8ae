# Events: a record marks a point of a stream; paddle_rt knows when the stream reaches it (its own queue), so query,
# synchronize, cross-stream waits and timing (a nanosecond host clock stamped when the stream reaches the record)
# work on every plugin. The plugin's event (created on the first record, on the stream's device) is recorded at that
# point too, so `handle` can be given to code that uses the plugin directly.
from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream, StreamMark

# The queue side (the event core, the record, a stream's wait) is StreamMark's (stream.pxd); Event adds the plugin's
# event, timing and the host's waits.
cdef class Event(StreamMark):
    cdef readonly bint enable_timing
    cdef readonly bint blocking
    cdef readonly Device device      # set by the first record
    cdef object __weakref__

    cdef int _ensure_plugin_event(self, Stream s) except -1
    cdef int record_on(self, Stream s) except -1
