# The event recorder: allocator events, stream operations and plugin trace records, appended without the GIL to one
# C-level buffer while a profiler or the memory history is active (trace.pyx). Producers test `trace_mask` (one load,
# one predictable branch) and call the functions below only when their bit is set.
from libc.stdint cimport uintptr_t, int64_t, uint64_t
from paddle_rt._core.includes.trace_support cimport prt_trace_record

# PRT_TRACE_* bits (includes/trace_support.pxd) of what is being recorded; 0 when nothing is.
cdef int trace_mask

# Append one record (nogil, thread-safe).
cdef void trace_emit(const prt_trace_record* r) noexcept nogil
# An allocator event (PRT_EV_*): `device` is the borrowed PyObject* of the Device, memkind 0 device / 1 pinned host,
# `requested` the bytes the caller asked for (alloc and free; 0 for the others), allocated/reserved the allocator's
# counters after the event. Alloc and OOM events take the Python frames noted by trace_note_caller() on this thread,
# if any.
cdef void trace_memory_event(void* device, int memkind, int ev, uintptr_t addr, uint64_t size, uintptr_t stream,
                             uint64_t requested, int64_t allocated, int64_t reserved) noexcept nogil
# With the GIL, at the entry of a Python-API allocation while PRT_TRACE_STACKS is set: remember the caller's Python
# frames for the allocation (or OOM) event this thread records next.
cdef void trace_note_caller() noexcept
# While streams are traced: the label of the operator enqueued at `pos` of the stream with tag `stream` (its queue's
# address): {"name", "shapes", "dtype"}; the operation's record takes it when collected (with the GIL).
cdef int trace_label_op(uintptr_t stream, uint64_t pos, dict label) except -1
