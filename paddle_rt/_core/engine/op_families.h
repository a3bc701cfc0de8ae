/* Host kernels of the operator families kept in their own files (one per family, like InfiniCore's
 * src/infiniop/ops/<op>/): what op_kernels.cpp's prt_host_kernel / prt_host_workspace dispatch to for these ops. The
 * layouts each kernel receives are stated with its op id in include/paddle_rt/extension.h. Stateless; linked into
 * the op extension (setup.py ENGINE_SOURCES). */
#ifndef PADDLE_RT_ENGINE_OP_FAMILIES_H_
#define PADDLE_RT_ENGINE_OP_FAMILIES_H_

#include <stddef.h>

#include "paddle_rt/extension.h"

/* norm_kernels.cpp */
C_Status prt_layer_norm_kernel(const paddle_rt_op_call* call);
size_t prt_layer_norm_workspace(const paddle_rt_op_call* call);
C_Status prt_add_rms_norm_kernel(const paddle_rt_op_call* call);
size_t prt_add_rms_norm_workspace(const paddle_rt_op_call* call);
/* softmax_kernels.cpp */
C_Status prt_softmax_kernel(const paddle_rt_op_call* call);
size_t prt_softmax_workspace(const paddle_rt_op_call* call);
/* activation_kernels.cpp */
C_Status prt_silu_and_mul_kernel(const paddle_rt_op_call* call);
size_t prt_silu_and_mul_workspace(const paddle_rt_op_call* call);
/* rope_kernels.cpp: (seq, heads, dim) or (batch, seq, heads, dim) */
C_Status prt_rope_kernel(const paddle_rt_op_call* call);
size_t prt_rope_workspace(const paddle_rt_op_call* call);
/* attention_kernels.cpp */
C_Status prt_kv_caching_kernel(const paddle_rt_op_call* call);
size_t prt_kv_caching_workspace(const paddle_rt_op_call* call);
C_Status prt_attention_kernel(const paddle_rt_op_call* call);
size_t prt_attention_workspace(const paddle_rt_op_call* call);
C_Status prt_batch_attention_kernel(const paddle_rt_op_call* call);
size_t prt_batch_attention_workspace(const paddle_rt_op_call* call);
/* sampling_kernels.cpp: random_sample with InfiniCore's threshold rule */
C_Status prt_random_sample_kernel(const paddle_rt_op_call* call);
size_t prt_random_sample_workspace(const paddle_rt_op_call* call);
/* embedding_kernels.cpp */
C_Status prt_embedding_kernel(const paddle_rt_op_call* call);
size_t prt_embedding_workspace(const paddle_rt_op_call* call);

#endif /* PADDLE_RT_ENGINE_OP_FAMILIES_H_ */
