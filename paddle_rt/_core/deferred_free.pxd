# Frees deferred by Allocation.record_stream, and the out-of-memory ladder's wait for them (deferred_free.pyx).
from libc.stdint cimport uintptr_t
from paddle_rt._core.allocator cimport AllocatorCore

# Free `ptr` at once (the allocator's fast path, else its nogil core).
cdef int free_now(AllocatorCore* c, uintptr_t ptr) except -1
# Free `ptr` once every stream of `streams` (paddle_rt Streams) has run everything submitted to it so far.
cdef int free_after_streams(AllocatorCore* c, uintptr_t ptr, list streams) except -1
# Wait (with the GIL; Ctrl-C raises) until the deferred frees known so far have reached their streams' workers.
cdef int core_wait_deferred(AllocatorCore* core) except -1
# core_malloc with the ladder's last step: out of memory while deferred frees are pending or streams are busy, wait
# for the deferred frees' streams, then for every stream of the device (every device's, for pinned host memory), and
# retry once.
cdef int malloc_waiting(AllocatorCore* c, size_t n, uintptr_t s, void** p) except -1
