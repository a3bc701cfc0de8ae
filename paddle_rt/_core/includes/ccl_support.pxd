# Small C helpers for the collectives layer (ccl.pyx): per-rank progress counters written by stream workers
# without the GIL and read by waiters that name the ranks a collective is missing.
from libc.stdint cimport uint64_t

cdef extern from * nogil:
    """
    #include <stdint.h>
    static inline void prt_ccl_store_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline uint64_t prt_ccl_load_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    /* the signature of rt_cpu's exported rt_cpu_ccl_comm_error (1: in error, 0: fine, -1: unknown comm) */
    typedef int (*prt_ccl_comm_error_fn)(void* comm);
    """
    void prt_ccl_store_u64(uint64_t* p, uint64_t v)
    uint64_t prt_ccl_load_u64(const uint64_t* p)
    ctypedef int (*prt_ccl_comm_error_fn)(void* comm) noexcept nogil
