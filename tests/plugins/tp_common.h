/* Shared by the test plugins: the ten required hooks, on malloc'd "device memory" and heap events that complete at
 * once, plus counters a test can read with ctypes to check that the host gives back everything it took.
 *
 * Switches (-D...):
 *   DEVICE_TYPE="\"x\""      device type (default "minimal")
 *   SUB_DEVICE_TYPE="\"y\""  sub device type (default "v1")
 *   NDEV=n                   number of devices (default 1; 0 is allowed)
 *   DEVICE_ID_BASE=b         physical ids are b, b+1, ... (default 0), so a host must map index -> id via the list
 *
 * Exported for tests (read them with ctypes.CDLL(path); dlopen of the same path returns the same library):
 *   long tp_live_allocations(void), tp_live_bytes(void), tp_live_events(void), tp_total_allocations(void),
 *   long tp_set_device_calls(void), int tp_current_device(void) (of the calling thread, -1 before set_device)
 */
#ifndef TP_COMMON_H_
#define TP_COMMON_H_

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "paddle_rt/device_ext.h"

#ifndef DEVICE_TYPE
#define DEVICE_TYPE "minimal"
#endif
#ifndef SUB_DEVICE_TYPE
#define SUB_DEVICE_TYPE "v1"
#endif
#ifndef NDEV
#define NDEV 1
#endif
#ifndef DEVICE_ID_BASE
#define DEVICE_ID_BASE 0
#endif

#define TP_EXPORT __attribute__((visibility("default")))

static _Thread_local int tp_current = -1;
static atomic_long tp_n_live_allocations;
static atomic_long tp_n_live_bytes;
static atomic_long tp_n_live_events;
static atomic_long tp_n_total_allocations;
static atomic_long tp_n_set_device;

TP_EXPORT long tp_live_allocations(void) { return atomic_load(&tp_n_live_allocations); }
TP_EXPORT long tp_live_bytes(void) { return atomic_load(&tp_n_live_bytes); }
TP_EXPORT long tp_live_events(void) { return atomic_load(&tp_n_live_events); }
TP_EXPORT long tp_total_allocations(void) { return atomic_load(&tp_n_total_allocations); }
TP_EXPORT long tp_set_device_calls(void) { return atomic_load(&tp_n_set_device); }
TP_EXPORT int tp_current_device(void) { return tp_current; }

static int tp_valid_device(const C_Device device) {
  return device != NULL && device->id >= DEVICE_ID_BASE && device->id < DEVICE_ID_BASE + NDEV;
}

static C_Status tp_set_device(const C_Device device) {
  if (!tp_valid_device(device)) return C_ERROR;
  tp_current = device->id;
  atomic_fetch_add(&tp_n_set_device, 1);
  return C_SUCCESS;
}

static C_Status tp_get_device(const C_Device device) {
  if (device == NULL) return C_ERROR;
  device->id = tp_current < 0 ? DEVICE_ID_BASE : tp_current;
  return C_SUCCESS;
}

/* An event: a small heap object, complete as soon as it is recorded (there is no asynchronous work). */
#define TP_EVENT_MAGIC 0x45564e54u
struct tp_event {
  unsigned magic;
  int device;
  int recorded;
};

static struct tp_event* tp_check_event(C_Event event) {
  struct tp_event* e = (struct tp_event*)event;
  if (e == NULL || e->magic != TP_EVENT_MAGIC) return NULL;
  return e;
}

static C_Status tp_create_event(const C_Device device, C_Event* event) {
  if (!tp_valid_device(device) || event == NULL) return C_ERROR;
  struct tp_event* e = (struct tp_event*)malloc(sizeof *e);
  if (e == NULL) return C_FAILED;
  e->magic = TP_EVENT_MAGIC;
  e->device = device->id;
  e->recorded = 0;
  *event = (C_Event)e;
  atomic_fetch_add(&tp_n_live_events, 1);
  return C_SUCCESS;
}

static C_Status tp_record_event(const C_Device device, C_Stream stream, C_Event event) {
  (void)stream; /* any stream, NULL included: there is no asynchronous work to wait for */
  struct tp_event* e = tp_check_event(event);
  if (!tp_valid_device(device) || e == NULL) return C_ERROR;
  e->recorded = 1;
  return C_SUCCESS;
}

static C_Status tp_destroy_event(const C_Device device, C_Event event) {
  struct tp_event* e = tp_check_event(event);
  if (!tp_valid_device(device) || e == NULL) return C_ERROR;
  e->magic = 0;
  free(e);
  atomic_fetch_sub(&tp_n_live_events, 1);
  return C_SUCCESS;
}

static C_Status tp_synchronize_event(const C_Device device, C_Event event) {
  if (!tp_valid_device(device) || tp_check_event(event) == NULL) return C_ERROR;
  return C_SUCCESS;
}

/* Device memory is host memory; each block carries its size in a header so that a deallocate with the wrong size
 * or a foreign pointer is caught (C_ERROR) instead of corrupting the heap. */
#define TP_BLOCK_MAGIC 0x424c4b21u
struct tp_block {
  unsigned magic;
  int device;
  size_t size;
  /* 16-byte aligned payload follows */
} __attribute__((aligned(16)));

static C_Status tp_device_memory_allocate(const C_Device device, void** ptr, size_t size) {
  if (!tp_valid_device(device) || ptr == NULL) return C_ERROR;
  if (size > (SIZE_MAX >> 1)) {
    *ptr = NULL;
    return C_FAILED;
  }
  struct tp_block* b = (struct tp_block*)malloc(sizeof(struct tp_block) + (size ? size : 1));
  if (b == NULL) {
    *ptr = NULL;
    return C_FAILED;
  }
  b->magic = TP_BLOCK_MAGIC;
  b->device = device->id;
  b->size = size;
  *ptr = (void*)(b + 1);
  atomic_fetch_add(&tp_n_live_allocations, 1);
  atomic_fetch_add(&tp_n_live_bytes, (long)size);
  atomic_fetch_add(&tp_n_total_allocations, 1);
  return C_SUCCESS;
}

static C_Status tp_device_memory_deallocate(const C_Device device, void* ptr, size_t size) {
  if (!tp_valid_device(device) || ptr == NULL) return C_ERROR;
  struct tp_block* b = (struct tp_block*)ptr - 1;
  if (b->magic != TP_BLOCK_MAGIC || b->device != device->id || b->size != size) return C_ERROR;
  b->magic = 0;
  free(b);
  atomic_fetch_sub(&tp_n_live_allocations, 1);
  atomic_fetch_sub(&tp_n_live_bytes, (long)size);
  return C_SUCCESS;
}

static C_Status tp_get_device_count(size_t* count) {
  if (count == NULL) return C_ERROR;
  *count = NDEV;
  return C_SUCCESS;
}

static C_Status tp_get_device_list(size_t* devices) {
  if (devices == NULL) return C_ERROR;
  for (size_t i = 0; i < (size_t)NDEV; ++i) devices[i] = (size_t)(DEVICE_ID_BASE + (int)i);
  return C_SUCCESS;
}

static void tp_fill_required(C_DeviceInterface* iface) {
  iface->set_device = tp_set_device;
  iface->get_device = tp_get_device;
  iface->create_event = tp_create_event;
  iface->record_event = tp_record_event;
  iface->destroy_event = tp_destroy_event;
  iface->synchronize_event = tp_synchronize_event;
  iface->device_memory_allocate = tp_device_memory_allocate;
  iface->device_memory_deallocate = tp_device_memory_deallocate;
  iface->get_device_count = tp_get_device_count;
  iface->get_device_list = tp_get_device_list;
}

/* The start of every test plugin's InitPlugin: the version handshake (which returns from InitPlugin on a mismatch,
 * hence a macro), the type names, the ten required hooks. */
#define TP_INIT_PLUGIN(params)                          \
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);          \
  (params)->device_type = (char*)DEVICE_TYPE;           \
  (params)->sub_device_type = (char*)SUB_DEVICE_TYPE;   \
  tp_fill_required((params)->interface)

#endif /* TP_COMMON_H_ */
