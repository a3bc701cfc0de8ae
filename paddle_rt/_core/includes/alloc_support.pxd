# C++ support for the caching allocator: a mutex, the ordered set of free blocks and the pointer -> block table.
# Only declarations and tiny inline helpers live here; the allocator's logic is in paddle_rt/_core/allocator.pyx.
from libc.stdint cimport uintptr_t
from libcpp.utility cimport pair

cdef extern from * nogil:
    """
    #include <stdint.h>
    #include <stddef.h>
    #include <mutex>
    #include <set>
    #include <map>
    #include <unordered_map>

    /* A free block in the best-fit index: ordered by (stream, pool, size, address); `block` is the payload. */
    struct prt_free_key {
        uintptr_t stream;
        size_t size;
        uintptr_t addr;
        void* block;
    };
    static inline bool operator<(const prt_free_key& a, const prt_free_key& b) {
        if (a.stream != b.stream) return a.stream < b.stream;
        if (a.size != b.size) return a.size < b.size;
        return a.addr < b.addr;
    }
    typedef std::set<prt_free_key> prt_free_set;
    typedef std::unordered_map<uintptr_t, void*> prt_ptr_table;
    typedef std::map<uintptr_t, void*> prt_chunk_map;

    /* The C++ half of one allocator: its lock and its containers (the plain counters live in a Cython struct). */
    struct prt_alloc_containers {
        std::mutex mu;
        prt_free_set free_blocks[2];     /* [0] small pool, [1] large pool */
        prt_ptr_table live;              /* address -> allocated block */
        prt_chunk_map chunks;            /* base address -> chunk */
    };
    """
    ctypedef struct prt_free_key:
        uintptr_t stream
        size_t size
        uintptr_t addr
        void* block

    cdef cppclass prt_free_set:
        cppclass iterator:
            prt_free_key& operator*()
            iterator operator++()
            iterator operator--()
            bint operator==(iterator)
            bint operator!=(iterator)
        iterator begin()
        iterator end()
        iterator lower_bound(const prt_free_key&)
        iterator find(const prt_free_key&)
        void insert(const prt_free_key&)
        size_t erase(const prt_free_key&)
        void erase(iterator)
        size_t size()
        bint empty()

    cdef cppclass prt_ptr_table:
        cppclass iterator:
            pair[uintptr_t, void*]& operator*()
            iterator operator++()
            iterator operator--()
            bint operator==(iterator)
            bint operator!=(iterator)
        iterator begin()
        iterator end()
        iterator find(uintptr_t)
        void* & operator[](uintptr_t)
        size_t erase(uintptr_t)
        void erase(iterator)
        size_t size()
        void reserve(size_t)

    cdef cppclass prt_chunk_map:
        cppclass iterator:
            pair[uintptr_t, void*]& operator*()
            iterator operator++()
            iterator operator--()
            bint operator==(iterator)
            bint operator!=(iterator)
        iterator begin()
        iterator end()
        iterator find(uintptr_t)
        iterator upper_bound(uintptr_t)
        void* & operator[](uintptr_t)
        size_t erase(uintptr_t)
        size_t size()

    cdef cppclass std_mutex "std::mutex":
        void lock()
        void unlock()
        bint try_lock()

    cdef cppclass prt_alloc_containers:
        std_mutex mu
        prt_free_set free_blocks[2]
        prt_ptr_table live
        prt_chunk_map chunks
