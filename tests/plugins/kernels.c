/* A plugin that brings its own operator kernels (paddle_rt_ext_register_kernels, paddle_rt/extension.h): the ten
 * required hooks of tp_common.h (memory the host cannot be told to address: no paddle_rt_ext_host_addressable, so
 * paddle_rt's host kernels do not serve it) plus
 *   add   float32: out = a + b over contiguous operands of one shape, with a 64-byte workspace it checks;
 *   mul   float32: fails with C_ERROR (a kernel's failure reaches the stream's synchronize).
 * and the copy hooks and blas_axpby (float32, counted), so tensors can live on it and axpby goes through the hook.
 * Exported for tests: long kt_add_calls(void), long kt_bad_workspace(void), long kt_axpby_calls(void). -DREGISTER_FAILS makes the export
 * return -1. -DHOST_ADDRESSABLE exports paddle_rt_ext_host_addressable (1) and -DNO_AXPBY leaves blas_axpby out, so
 * paddle_rt's host kernels serve the device (axpby included). */
#include "tp_common.h"

#include "paddle_rt/extension.h"

static atomic_long kt_n_add;
static atomic_long kt_n_bad_ws;

static atomic_long kt_n_axpby;
TP_EXPORT long kt_axpby_calls(void) { return atomic_load(&kt_n_axpby); }

static C_Status kt_copy(const C_Device device, void* dst, const void* src, size_t size) {
  (void)device;
  memmove(dst, src, size);
  return C_SUCCESS;
}

static C_Status kt_axpby(const C_Device device, C_Stream stream, C_DataType dtype, size_t numel, float alpha, void* x,
                         float beta, void* y) {
  (void)device;
  (void)stream;
  if (dtype != FLOAT32) return C_ERROR;
  for (size_t i = 0; i < numel; i++) ((float*)y)[i] = alpha * ((const float*)x)[i] + beta * ((float*)y)[i];
  atomic_fetch_add(&kt_n_axpby, 1);
  return C_SUCCESS;
}

TP_EXPORT long kt_add_calls(void) { return atomic_load(&kt_n_add); }
TP_EXPORT long kt_bad_workspace(void) { return atomic_load(&kt_n_bad_ws); }

static size_t kt_add_workspace(const paddle_rt_op_call* call) {
  (void)call;
  return 64;
}

static C_Status kt_add(const paddle_rt_op_call* call) {
  int64_t n = 1;
  for (int i = 0; i < call->out.ndim; i++) n *= call->out.shape[i];
  if (call->workspace == NULL || call->workspace_size < 64) atomic_fetch_add(&kt_n_bad_ws, 1);
  else memset(call->workspace, 0xab, 64);
  const float* a = (const float*)call->inputs[0].data;
  const float* b = (const float*)call->inputs[1].data;
  float* o = (float*)call->out.data;
  for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i];
  atomic_fetch_add(&kt_n_add, 1);
  return C_SUCCESS;
}

static C_Status kt_mul(const paddle_rt_op_call* call) {
  (void)call;
  return C_ERROR;
}

TP_EXPORT int paddle_rt_ext_register_kernels(void* registry, paddle_rt_register_kernel_cb register_kernel) {
#ifdef REGISTER_FAILS
  (void)registry;
  (void)register_kernel;
  (void)kt_add;
  (void)kt_mul;
  (void)kt_add_workspace;
  return -1;
#else
  if (register_kernel(registry, PADDLE_RT_OP_ADD, FLOAT32, kt_add, kt_add_workspace) != 0) return -1;
  if (register_kernel(registry, PADDLE_RT_OP_MUL, FLOAT32, kt_mul, NULL) != 0) return -1;
  /* an unknown op is refused, not stored */
  if (register_kernel(registry, 999, FLOAT32, kt_mul, NULL) != -1) return -1;
  return 0;
#endif
}

#ifdef HOST_ADDRESSABLE
TP_EXPORT int paddle_rt_ext_host_addressable(void) { return 1; }
#endif

void InitPlugin(CustomRuntimeParams* params) {
  TP_INIT_PLUGIN(params);  /* version, type names, the ten required hooks (tp_common.h) */
  params->interface->memory_copy_h2d = kt_copy;
  params->interface->memory_copy_d2h = kt_copy;
  params->interface->memory_copy_d2d = kt_copy;
#ifndef NO_AXPBY
  params->interface->blas_axpby = kt_axpby;
#else
  (void)kt_axpby;
#endif
}
