# Declarations of the operator layer's C side: the kernel call of include/paddle_rt/extension.h and the host kernels
# of engine/op_kernels.h (state in engine/op_kernels.cpp, linked into the op extension only: other modules cimport
# what they need from paddle_rt._core.op).
from libc.stdint cimport int32_t, int64_t, uint32_t
from paddle_rt._core.device_ext cimport C_Device, C_Stream, C_Status

cdef extern from "paddle_rt/extension.h" nogil:
    enum:
        PADDLE_RT_OP_MAX_NDIM
        PADDLE_RT_OP_MAX_INPUTS
        PADDLE_RT_OP_MAX_ATTRS
    enum:
        PADDLE_RT_OP_ADD
        PADDLE_RT_OP_SUB
        PADDLE_RT_OP_MUL
        PADDLE_RT_OP_GEMM
        PADDLE_RT_OP_RMS_NORM
        PADDLE_RT_OP_LAYER_NORM
        PADDLE_RT_OP_CAUSAL_SOFTMAX
        PADDLE_RT_OP_SWIGLU
        PADDLE_RT_OP_ROPE
        PADDLE_RT_OP_REARRANGE
        PADDLE_RT_OP_RELU
        PADDLE_RT_OP_GELU
        PADDLE_RT_OP_SILU
        PADDLE_RT_OP_RANDOM_SAMPLE
        PADDLE_RT_OP_AXPBY
        PADDLE_RT_OP_ADD_RMS_NORM
        PADDLE_RT_OP_SOFTMAX
        PADDLE_RT_OP_SILU_AND_MUL
        PADDLE_RT_OP_KV_CACHING
        PADDLE_RT_OP_ATTENTION
        PADDLE_RT_OP_EMBEDDING
        PADDLE_RT_OP_BATCH_ATTENTION
        PADDLE_RT_OP_COUNT
    ctypedef struct paddle_rt_tensor:
        void* data
        int32_t ndim
        int32_t dtype
        int64_t shape[8]
        int64_t strides[8]
    ctypedef struct paddle_rt_op_call:
        uint32_t struct_size
        int32_t op
        int32_t dtype
        int32_t n_inputs
        paddle_rt_tensor out
        paddle_rt_tensor inputs[5]
        double attrs[8]
        void* workspace
        size_t workspace_size
        C_Device device
        C_Stream stream
    ctypedef C_Status (*paddle_rt_kernel_fn)(const paddle_rt_op_call* call) noexcept nogil
    ctypedef size_t (*paddle_rt_workspace_fn)(const paddle_rt_op_call* call) noexcept nogil
    ctypedef int (*paddle_rt_register_kernel_cb)(void* registry, int32_t op, int32_t dtype,
                                                 paddle_rt_kernel_fn kernel,
                                                 paddle_rt_workspace_fn workspace) noexcept nogil
    ctypedef int (*paddle_rt_ext_register_kernels_fn)(void* registry,
                                                      paddle_rt_register_kernel_cb register_kernel) noexcept nogil

cdef extern from "engine/op_kernels.h" nogil:
    paddle_rt_kernel_fn prt_host_kernel(int op, int dtype)
    size_t prt_host_workspace(const paddle_rt_op_call* call)
    void prt_set_blas(void* sgemm, void* dgemm, void* sgemv, void* dgemv, int ilp64)
    int prt_dtype_size(int dtype)
