# Small C helpers for the collectives layer (ccl.pyx): per-rank progress counters written by stream workers
# without the GIL and read by waiters that name the ranks a collective is missing.
from libc.stdint cimport uint64_t

cdef extern from * nogil:
    """
    #include <stdint.h>
    static inline void prt_ccl_store_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline uint64_t prt_ccl_load_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    /* Finished batches whose Python references (a list of Work) are dropped later by a thread that holds the GIL,
       so that a stream worker never waits for the GIL when a collective succeeded. */
    #include <mutex>
    #include <new>
    struct prt_ccl_node { void* obj; prt_ccl_node* next; };
    static std::mutex prt_ccl_mu;
    static prt_ccl_node* prt_ccl_head = nullptr;
    static inline int prt_ccl_defer(void* obj) {
        prt_ccl_node* n = new (std::nothrow) prt_ccl_node;
        if (!n) return -1;
        n->obj = obj;
        std::lock_guard<std::mutex> lk(prt_ccl_mu);
        n->next = prt_ccl_head;
        prt_ccl_head = n;
        return 0;
    }
    /* Pop one deferred object (NULL when none). */
    static inline void* prt_ccl_pop(void) {
        std::lock_guard<std::mutex> lk(prt_ccl_mu);
        prt_ccl_node* n = prt_ccl_head;
        if (!n) return nullptr;
        prt_ccl_head = n->next;
        void* o = n->obj;
        delete n;
        return o;
    }
    static inline int prt_ccl_pending(void) { return __atomic_load_n(&prt_ccl_head, __ATOMIC_ACQUIRE) != nullptr; }
    """
    int prt_ccl_defer(void* obj)
    void* prt_ccl_pop()
    int prt_ccl_pending()
    void prt_ccl_store_u64(uint64_t* p, uint64_t v)
    uint64_t prt_ccl_load_u64(const uint64_t* p)
