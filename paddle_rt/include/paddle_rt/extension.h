/* Optional extensions of the custom-device plugin ABI that paddle_rt understands.
 *
 * A plugin may export any of these functions (C linkage, default visibility) next to InitPlugin. Paddle never looks
 * them up; paddle_rt does, with dlsym on the plugin's own handle, after the handshake. A plugin that exports none of
 * them gets paddle_rt's defaults, which are stated with each. */
#ifndef PADDLE_RT_EXTENSION_H_
#define PADDLE_RT_EXTENSION_H_

#include "paddle_rt/device_ext.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 1 when the memory device_memory_allocate hands out is ordinary memory of this process that the host may
 * read and write at its address (a virtual or host-backed device), 0 otherwise. paddle_rt then exports device
 * allocations zero-copy (buffer protocol, __array_interface__, DLPack as CPU memory) and reads them at their address.
 * Default without it: 0, unless the device type is listed in PADDLE_RT_HOST_ADDRESSABLE. */
int paddle_rt_ext_host_addressable(void);
typedef int (*paddle_rt_ext_host_addressable_fn)(void);

/* Asked after an asynchronous collective on `comm` completed (its stream reached it): returns 1 when that collective
 * failed (a stream's completion cannot carry a status), 0 when it did not, -1 when `comm` is unknown. paddle_rt then
 * raises CollectiveError for it. Default without it: collectives that reported success at submission succeeded. */
int paddle_rt_ext_ccl_comm_error(C_CCLComm comm);
typedef int (*paddle_rt_ext_ccl_comm_error_fn)(C_CCLComm comm);

/* ------------------------------------------------------------------------------------------------------------------
 * Operator kernels (paddle_rt.op, the InfiniOP-style operator layer).
 *
 * An operator call reaches a kernel as one paddle_rt_op_call: the operands' addresses, shapes and strides (in
 * elements, signed; 0 broadcasts), the op's attributes, a workspace and the device and plugin stream it runs on. The
 * kernel runs on the paddle_rt stream's worker thread, in order with the stream's copies and events, with the device
 * current. It may compute synchronously (host-addressable memory) or enqueue device work on `stream` and return: the
 * worker waits for the plugin stream before anything that needs the work done. It returns C_SUCCESS, or C_ERROR
 * (the stream's next synchronize raises PluginError naming the op). Every shape, stride and dtype rule of the op has
 * been checked before a kernel sees the call.
 * ---------------------------------------------------------------------------------------------------------------- */
#define PADDLE_RT_OP_MAX_NDIM 8
#define PADDLE_RT_OP_MAX_INPUTS 5
#define PADDLE_RT_OP_MAX_ATTRS 8

/* Operators, with their operands (out first, then the inputs in order) and attributes (attrs[i]). */
typedef enum {
  PADDLE_RT_OP_ADD = 1,            /* out = a + b (numpy broadcasting through 0-strides) */
  PADDLE_RT_OP_SUB = 2,            /* out = a - b */
  PADDLE_RT_OP_MUL = 3,            /* out = a * b */
  PADDLE_RT_OP_GEMM = 4,           /* out = alpha * a @ b + beta * out; (batch, m, k) x (batch, k, n); attrs: alpha, beta */
  PADDLE_RT_OP_RMS_NORM = 5,       /* out = x / sqrt(mean(x^2) + eps) * w over the last axis; attrs: eps */
  PADDLE_RT_OP_LAYER_NORM = 6,     /* out = (x - mean) / sqrt(var + eps) * w (+ b when n_inputs is 3) over the last
                                      axis; attrs: eps */
  PADDLE_RT_OP_CAUSAL_SOFTMAX = 7, /* softmax over the last axis of (..., n, total), j kept iff j <= i + total - n */
  PADDLE_RT_OP_SWIGLU = 8,         /* out = a * b * sigmoid(b) */
  PADDLE_RT_OP_ROPE = 9,           /* rotary embedding of x (seq, heads, dim) with pos (seq), or x (batch, seq, heads,
                                      dim) with pos (seq) or (batch, seq); sin, cos (max_pos, dim/2);
                                      attrs: 0 = GPT-J (pairs 2i, 2i+1), 1 = GPT-NeoX (pairs i, i + dim/2) */
  PADDLE_RT_OP_REARRANGE = 10,     /* out = x, between any two layouts */
  PADDLE_RT_OP_RELU = 11,
  PADDLE_RT_OP_GELU = 12,          /* attrs: 0 = erf form, 1 = tanh approximation */
  PADDLE_RT_OP_SILU = 13,
  PADDLE_RT_OP_RANDOM_SAMPLE = 14, /* out (shape (), int32/int64) = an index sampled from logits (vocab);
                                      attrs: random value in [0, 1), top-p, top-k (0: all), temperature */
  PADDLE_RT_OP_AXPBY = 15,         /* y = alpha * x + beta * y (out is y); attrs: alpha, beta */
  /* Inputs marked "written" are outputs too (the kernel writes them; paddle_rt orders them like out). */
  PADDLE_RT_OP_ADD_RMS_NORM = 16,  /* out y (..., d); inputs: residual_out (..., d, written), a, b (..., d), weight (d);
                                      residual_out = a + b, y = rms_norm(a + b) * weight from the unrounded sum;
                                      attrs: eps */
  PADDLE_RT_OP_SOFTMAX = 17,       /* out = softmax(x) over one axis, presented LAST in the call's layouts (the
                                      descriptor moves it there); attrs: the caller's axis */
  PADDLE_RT_OP_SILU_AND_MUL = 18,  /* out (..., d) = silu(x[..., :d]) * x[..., d:] for x (..., 2d) */
  PADDLE_RT_OP_KV_CACHING = 19,    /* out k_cache (b, h, max_seq, d); inputs: v_cache (written), k, v (b, h, seq, d),
                                      past_kv_lengths (b) int32/int64; cache[i, :, past[i]:past[i]+seq] = new[i] */
  PADDLE_RT_OP_ATTENTION = 20,     /* out (seq, q_heads, d); inputs: q (q_heads, seq, d), k, v (kv_heads, seq, d),
                                      k_cache, v_cache (kv_heads, >= pos + seq, d; both written: k, v stored at
                                      [pos, pos + seq)); causal grouped-query attention over the first pos + seq
                                      cached positions, scale 1/sqrt(d); attrs: pos, window (0: all; w: each query
                                      keeps the last w positions, itself included) */
  PADDLE_RT_OP_EMBEDDING = 21,     /* out (ids..., d) = weight[ids]; inputs: ids (any shape, int32/int64), weight
                                      (vocab, d); attrs: shard (0: none; else weight holds rows [start, start +
                                      vocab) of a larger table and any other id >= 0 gives a zero row), start */
  PADDLE_RT_OP_BATCH_ATTENTION = 22, /* out (b, seq, q_heads, d); inputs: q (b, q_heads, seq, d), k_cache, v_cache
                                      (b, kv_heads, max_seq, d) already holding the new keys/values, pos (b)
                                      int32/int64: sequence i's queries at [pos[i], pos[i] + seq), each attending
                                      causally to its own cache; attrs: window (as attention's) */
  PADDLE_RT_OP_COUNT = 23
} paddle_rt_op;

typedef struct {
  void* data;                                /* address of element (0, ..., 0) */
  int32_t ndim;
  int32_t dtype;                             /* a C_DataType */
  int64_t shape[PADDLE_RT_OP_MAX_NDIM];
  int64_t strides[PADDLE_RT_OP_MAX_NDIM];    /* in elements */
} paddle_rt_tensor;

typedef struct {
  uint32_t struct_size;                      /* sizeof(paddle_rt_op_call) of the paddle_rt that made the call */
  int32_t op;                                /* a paddle_rt_op */
  int32_t dtype;                             /* the op's dtype: its output's (the logits' for random_sample) */
  int32_t n_inputs;
  paddle_rt_tensor out;
  paddle_rt_tensor inputs[PADDLE_RT_OP_MAX_INPUTS];
  double attrs[PADDLE_RT_OP_MAX_ATTRS];
  void* workspace;                           /* at least what the workspace function asked for (NULL for 0) */
  size_t workspace_size;
  C_Device device;
  C_Stream stream;                           /* the plugin's stream (NULL when the plugin has none) */
} paddle_rt_op_call;

typedef C_Status (*paddle_rt_kernel_fn)(const paddle_rt_op_call* call);
/* Bytes of workspace the kernel needs for a call of this layout (called at descriptor creation; data pointers are
 * NULL). NULL: none. */
typedef size_t (*paddle_rt_workspace_fn)(const paddle_rt_op_call* call);
/* Registers `kernel` for (op, dtype) on the plugin's device type; returns 0, or -1 for an unknown op or dtype. */
typedef int (*paddle_rt_register_kernel_cb)(void* registry, int32_t op, int32_t dtype, paddle_rt_kernel_fn kernel,
                                           paddle_rt_workspace_fn workspace);

/* Called once, the first time an operator is created for the plugin's device type: the plugin registers its kernels
 * with register_kernel(registry, ...) and returns 0. Kernels registered at run time with paddle_rt.op.register_kernel
 * take precedence over these, and these over paddle_rt's host kernels (used for host-addressable devices). Default
 * without it: the plugin brings no kernels. */
int paddle_rt_ext_register_kernels(void* registry, paddle_rt_register_kernel_cb register_kernel);
typedef int (*paddle_rt_ext_register_kernels_fn)(void* registry, paddle_rt_register_kernel_cb register_kernel);

#ifdef __cplusplus
}
#endif

#endif /* PADDLE_RT_EXTENSION_H_ */
