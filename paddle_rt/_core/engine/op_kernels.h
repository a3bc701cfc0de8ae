/* paddle_rt's host kernels of the operator layer (op_kernels.cpp): what a device whose memory the host can read and
 * write at its address (rt_cpu, Device.host_addressable) runs for each operator and dtype. They run on the stream's
 * worker thread without the GIL. The calls they receive were checked at descriptor creation (op_descriptors.pyx).
 *
 * Process state (the BLAS entry points) is defined in op_kernels.cpp, which setup.py links into the op extension
 * only; other modules reach it through functions cimported from paddle_rt._core.op. */
#ifndef PADDLE_RT_ENGINE_OP_KERNELS_H_
#define PADDLE_RT_ENGINE_OP_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include "paddle_rt/extension.h"

/* The host kernel of (op, dtype), or NULL when there is none. dtype is the call's dtype (paddle_rt_op_call.dtype). */
paddle_rt_kernel_fn prt_host_kernel(int op, int dtype);
/* Bytes of workspace the host kernel needs for this call (data pointers unused). */
size_t prt_host_workspace(const paddle_rt_op_call* call);
/* Fortran BLAS sgemm/dgemm entry points, found once at the first gemm (op.pyx _ensure_blas): numpy's own OpenBLAS
   (ILP64: 64-bit integer arguments) or SciPy's (LP64: 32-bit). */
void prt_set_blas(void* sgemm, void* dgemm, void* sgemv, void* dgemv, int ilp64);
/* The size in bytes of one element of a C_DataType (0 for an unknown one). Stateless, so inline in every module. */
static inline int prt_dtype_size(int dtype) {
    switch (dtype) {
    case BOOL: case UINT8: case INT8: return 1;
    case UINT16: case INT16: case FLOAT16: case BFLOAT16: return 2;
    case UINT32: case INT32: case FLOAT32: return 4;
    case UINT64: case INT64: case FLOAT64: case COMPLEX64: return 8;
    case COMPLEX128: return 16;
    default: return 0;
    }
}

#endif /* PADDLE_RT_ENGINE_OP_KERNELS_H_ */
