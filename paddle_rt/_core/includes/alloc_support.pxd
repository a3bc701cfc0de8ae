# C++ support for the caching allocator: a mutex, the ordered set of free blocks and the pointer -> block table.
# Only declarations and tiny inline helpers live here; the allocator's logic is in paddle_rt/_core/allocator.pyx.
from libc.stdint cimport uintptr_t, uint64_t
from libcpp.utility cimport pair
from libcpp.vector cimport vector

cdef extern from "engine/alloc_containers.h" nogil:
    ctypedef struct prt_free_key:
        uintptr_t stream
        size_t size
        uint64_t chunk
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

    # v.push_back(x), std::bad_alloc caught: 0, or -1 when host memory runs out
    int prt_push[T](vector[T]& v, const T& x)

    void prt_free_rekey(prt_free_set& s, prt_free_set.iterator it, const prt_free_key& k)
    void prt_free_move(prt_free_set& src, prt_free_set.iterator it, prt_free_set& dst, const prt_free_key& k)

    cdef cppclass prt_ptr_table:
        void insert(uintptr_t, void*)
        void* find(uintptr_t)
        void* erase(uintptr_t)
        size_t size()

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

    cdef cppclass prt_lock:
        void lock()
        void unlock()
        bint try_lock()

    cdef cppclass prt_alloc_containers:
        prt_lock mu
        prt_free_set free_blocks[2]
        prt_ptr_table live
        prt_chunk_map chunks


cdef extern from "Python.h":
    # Declared without an exception clause: the allocator turns an overflow into InvalidArgument itself.
    Py_ssize_t _long_as_ssize "PyLong_AsSsize_t"(object o) noexcept
    void* PyErr_Occurred() noexcept
