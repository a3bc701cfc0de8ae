# Declarations of the host kernels' thread pool (engine/host_parallel.h; state in engine/host_parallel.cpp, linked
# into the op extension only) and of the vector math's dispatch (engine/vector_math.h).
from libc.stdint cimport int32_t, int64_t, uint64_t

cdef extern from "engine/host_parallel.h" nogil:
    ctypedef void (*prt_parallel_body)(void* ctx, int64_t begin, int64_t end) noexcept nogil
    void prt_parallel_for(int64_t n, int64_t grain, prt_parallel_body body, void* ctx)
    int prt_parallel_threads()
    int prt_parallel_set_threads(int n)
    int prt_parallel_source()
    int prt_parallel_started()
    ctypedef struct prt_parallel_event:
        uint64_t job
        int32_t slot
        int64_t begin
        int64_t end
        int64_t t0
        int64_t t1
    void prt_parallel_trace(int on)
    int64_t prt_parallel_trace_take(prt_parallel_event* out, int64_t cap)

cdef extern from "engine/vector_math.h" nogil:
    const char* prt_vm_isa()
    int prt_vm_vector_erf()
