# Copies and memset (memcpy.pyx). The Python API is memcpy / memcpy_async / memset / memset_async; one queued copy
# is a CopyOp, run by the stream's worker (the plugin's async hook when it has one, else the synchronous hook).
from cpython.ref cimport PyObject
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device

from libc.stdint cimport uintptr_t
from paddle_rt._core.stream cimport Stream

cdef struct CopyOp:
    int kind
    void* dst
    const void* src
    size_t n
    unsigned char value
    C_DeviceInterface* iface        # device of the copy (dst device for P2P)
    C_Device dev
    C_DeviceInterface* src_iface    # P2P source
    C_Device src_dev
    bint use_async
    int nbufs
    Py_buffer bufs[2]
    PyObject* keep                  # owned reference to what must stay alive until the copy ran (or NULL)
    void* stage                     # a small pageable source copied at enqueue (src points here), freed by the worker


# Enqueue the copy of n bytes of host buffer `src` (C-contiguous) to device address dst on s (paddle_rt.tensor()).
cdef int upload_async(Stream s, uintptr_t dst, object src, size_t n) except -1
