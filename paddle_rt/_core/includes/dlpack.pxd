# The DLPack exchange structures (unversioned "dltensor" capsules), declared from the DLPack specification's layout.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t

cdef extern from "engine/dlpack.h" nogil:
    ctypedef struct prt_DLDevice:
        int32_t device_type
        int32_t device_id
    ctypedef struct prt_DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct prt_DLTensor:
        void* data
        prt_DLDevice device
        int32_t ndim
        prt_DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct prt_DLManagedTensor:
        prt_DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(prt_DLManagedTensor* self) noexcept

cdef enum:
    kDLCPU = 1
    kDLUInt = 1
