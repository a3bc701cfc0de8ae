# Small C helpers for the collectives layer (ccl.pyx): per-rank progress counters written by stream workers
# without the GIL and read by waiters that name the ranks a collective is missing.
from libc.stdint cimport uint64_t

cdef extern from "engine/ccl_support.h" nogil:
    int prt_ccl_defer(void* obj)
    void* prt_ccl_pop()
    int prt_ccl_pending()
    void prt_ccl_store_u64(uint64_t* p, uint64_t v)
    uint64_t prt_ccl_load_u64(const uint64_t* p)
    ctypedef int (*prt_ccl_comm_error_fn)(void* comm) noexcept nogil
