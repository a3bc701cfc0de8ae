/* A test plugin for the stream layer: the ten required hooks (tests/plugins/tp_common.h) plus synchronous copies,
 * and streams whose asynchronous hooks misbehave the way real plugins do.
 *
 *   ASYNC_WARNING    create_stream returns success without writing the handle; async_memory_copy_* do the copy at
 *                    once and return C_WARNING ("done synchronously"); synchronize_stream is a no-op
 *   ASYNC_FAIL       like ASYNC_WARNING, but async_memory_copy_d2d returns C_ERROR (a plugin error in async work)
 *
 * Exported: long sq_async_calls(void) (async copy calls made), long sq_sync_calls(void) (sync copy calls made).
 */
#include <string.h>

#include "tp_common.h"

static atomic_long sq_n_async;
static atomic_long sq_n_sync;
TP_EXPORT long sq_async_calls(void) { return atomic_load(&sq_n_async); }
TP_EXPORT long sq_sync_calls(void) { return atomic_load(&sq_n_sync); }

static C_Status sq_copy(const C_Device device, void* dst, const void* src, size_t size) {
  if (!tp_valid_device(device)) return C_ERROR;
  atomic_fetch_add(&sq_n_sync, 1);
  memmove(dst, src, size);
  return C_SUCCESS;
}

static C_Status sq_p2p(const C_Device dd, const C_Device sd, void* dst, const void* src, size_t size) {
  if (!tp_valid_device(dd) || !tp_valid_device(sd)) return C_ERROR;
  atomic_fetch_add(&sq_n_sync, 1);
  memmove(dst, src, size);
  return C_SUCCESS;
}

#if defined(ASYNC_WARNING) || defined(ASYNC_FAIL)
static C_Status sq_create_stream(const C_Device device, C_Stream* stream) {
  (void)stream; /* never written */
  return tp_valid_device(device) ? C_SUCCESS : C_ERROR;
}
static C_Status sq_stream_nop(const C_Device device, C_Stream stream) {
  (void)stream;
  return tp_valid_device(device) ? C_SUCCESS : C_ERROR;
}
static C_Status sq_async_copy(const C_Device device, C_Stream stream, void* dst, const void* src, size_t size) {
  (void)stream;
  if (!tp_valid_device(device)) return C_ERROR;
  atomic_fetch_add(&sq_n_async, 1);
  memmove(dst, src, size);
  return C_WARNING;
}
static C_Status sq_async_d2d(const C_Device device, C_Stream stream, void* dst, const void* src, size_t size) {
#ifdef ASYNC_FAIL
  (void)device; (void)stream; (void)dst; (void)src; (void)size;
  atomic_fetch_add(&sq_n_async, 1);
  return C_ERROR;
#else
  return sq_async_copy(device, stream, dst, src, size);
#endif
}
#endif

void InitPlugin(CustomRuntimeParams* params) {
  TP_INIT_PLUGIN(params);  /* version, type names, the ten required hooks (tp_common.h) */
  params->interface->memory_copy_h2d = sq_copy;
  params->interface->memory_copy_d2h = sq_copy;
  params->interface->memory_copy_d2d = sq_copy;
  params->interface->memory_copy_p2p = sq_p2p;
#if defined(ASYNC_WARNING) || defined(ASYNC_FAIL)
  params->interface->create_stream = sq_create_stream;
  params->interface->destroy_stream = sq_stream_nop;
  params->interface->synchronize_stream = sq_stream_nop;
  params->interface->async_memory_copy_h2d = sq_async_copy;
  params->interface->async_memory_copy_d2h = sq_async_copy;
  params->interface->async_memory_copy_d2d = sq_async_d2d;
#endif
}
