# Allocation: memory from paddle_rt.malloc (allocation.pyx). Subclassed by the stream-ordered pool (AsyncAllocation).
cimport cython
from libc.stdint cimport uintptr_t, int64_t
from paddle_rt._core.allocator cimport AllocatorCore
from paddle_rt._core.includes.dlpack cimport prt_DLManagedTensor
from paddle_rt._core.includes.alloc_support cimport _long_as_ssize, PyErr_Occurred
from paddle_rt._core.checked cimport PRT_MAX_BYTES
from cpython.exc cimport PyErr_Clear

@cython.no_gc          # (also in allocation.pyx) no reference cycles through it; subclasses inherit this
cdef class Allocation:
    cdef AllocatorCore* core
    cdef readonly uintptr_t ptr
    cdef readonly size_t size
    cdef readonly object device
    cdef int _freed
    cdef int exports
    cdef int host_addressable
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]
    cdef readonly uintptr_t stream_tag  # the allocator stream tag it was allocated with (its stream)
    cdef list _recorded                # Streams given to record_stream (None: none)
    cdef object __weakref__
    cdef int _release(self) except -1
    cdef int _check_host(self) except -1
    # True when `stream` (a Stream) is the stream the memory belongs to (record_stream of it is a no-op).
    cdef bint _own_stream(self, object stream) except -1

# DLPack exports: the "dltensor" capsule of a filled managed tensor (its deleter runs if the capsule cannot be made,
# and when the capsule dies unconsumed).
# A managed tensor over host-addressable `data` (CPU device, lanes 1, shape and strides copied; strides NULL: compact)
# that holds a reference to `owner` (its manager_ctx) until `deleter` runs; MemoryError when it cannot be allocated.
cdef prt_DLManagedTensor* dl_managed_new(void* data, int ndim, const int64_t* shape, const int64_t* strides,
                                          int code, int bits, object owner,
                                          void (*deleter)(prt_DLManagedTensor*) noexcept) except NULL
cdef object dl_capsule(prt_DLManagedTensor* m)
cdef void dl_capsule_destructor(object capsule) noexcept

# A byte count from a user (malloc, malloc_async, malloc_host, raw_malloc, the pools): InvalidArgument naming `call`
# for a non-int, negative or beyond-64-bit value, OutOfMemoryError beyond checked.pxd's PRT_MAX_BYTES.
cdef size_t check_nbytes(object nbytes, str call, object device) except? 0
# check_nbytes with the common case (an int within bounds) inline, for the hot paths (malloc, malloc_async).
cdef inline size_t _check_nbytes(object nbytes, str call="malloc", object device=None) except? 0:
    cdef Py_ssize_t v
    if type(nbytes) is int:
        v = _long_as_ssize(nbytes)
        if v == -1 and PyErr_Occurred() != NULL:
            PyErr_Clear()
            v = -2 if nbytes >= 0 else -1
        if v >= 0 and v <= PRT_MAX_BYTES:
            return <size_t>v
    return check_nbytes(nbytes, call, device)
