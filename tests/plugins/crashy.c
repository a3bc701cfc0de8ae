/* A plugin that misbehaves, for the conformance checker's tests: the minimal plugin's ten required hooks, except
 * that device_memory_allocate calls abort() for any request above 1 MiB, and, built with -DHANG, synchronize_event
 * never returns. The checker must report the failed checks (signal / timeout) and still finish.
 * Switches: those of tp_common.h, plus -DHANG. */
#include <unistd.h>

#include "tp_common.h"

static C_Status crashy_device_memory_allocate(const C_Device device, void** ptr, size_t size) {
  if (size > ((size_t)1 << 20)) abort();
  return tp_device_memory_allocate(device, ptr, size);
}

#ifdef HANG
static C_Status crashy_synchronize_event(const C_Device device, C_Event event) {
  (void)device;
  (void)event;
  for (;;) pause(); /* never returns */
  return C_SUCCESS;
}
#endif

void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  params->device_type = (char*)DEVICE_TYPE;
  params->sub_device_type = (char*)SUB_DEVICE_TYPE;
  tp_fill_required(params->interface);
  params->interface->device_memory_allocate = crashy_device_memory_allocate;
#ifdef HANG
  params->interface->synchronize_event = crashy_synchronize_event;
#endif
}
