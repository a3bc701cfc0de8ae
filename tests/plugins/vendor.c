/* A small vendor-style plugin for the tests of `paddle_rt check` and of paddle_rt's handling of plugin bugs.
 * Without switches it is correct and guarded: device memory is host memory aligned to 256 bytes, a registry of live
 * blocks rejects double frees and foreign pointers, a real capacity (CAPACITY_MIB, default 64) is enforced and
 * reported by device_memory_stats, out-of-range device ids are refused, and it has synchronous copies and memset
 * (no streams: paddle_rt's own workers order the work).
 *
 * Switches (-D...), one per bug of a kind real plugins have:
 *   FREE_DIRECT        device_memory_deallocate calls free() on the pointer without looking (a double free aborts
 *                      inside glibc)
 *   PLAIN_MALLOC       device_memory_allocate is plain malloc(size) (allocate(0) gets a pointer; no registry, so no
 *                      capacity) and device_memory_deallocate plain free(ptr) (deallocate(NULL) succeeds)
 *   ZERO_NULL          device_memory_allocate(0) answers C_SUCCESS with a NULL pointer
 *   FIXED_STATS        device_memory_stats always reports free == total
 *   NO_LIMIT           allocations beyond the capacity succeed (host-backed memory)
 *   NULL_SUCCESS       out of capacity is answered with C_SUCCESS and a NULL pointer
 *   LAX_SET_DEVICE     set_device accepts any id
 *   MISALIGN=k         blocks start k bytes past a 256-byte boundary
 *   MIN_CHUNK=n        device_min_chunk_size reports n (default 256)
 *   SEGV_SIZE=n        device_memory_allocate of exactly n bytes writes through a NULL pointer (SIGSEGV)
 *   SEGV_MEMSET        device_memory_set writes through a NULL pointer
 *   HOST_MEMORY        exports paddle_rt_ext_host_addressable() returning 1 (paddle_rt/extension.h)
 * Switches of tp_common.h (DEVICE_TYPE, NDEV...) apply too. */
#include <pthread.h>
#include <stdint.h>

#include "tp_common.h"

#ifndef CAPACITY_MIB
#define CAPACITY_MIB 64
#endif
#ifndef MISALIGN
#define MISALIGN 0
#endif
#ifndef MIN_CHUNK
#define MIN_CHUNK 256
#endif
#define VD_CAPACITY ((size_t)CAPACITY_MIB << 20)
#define VD_MAX_BLOCKS 4096

static pthread_mutex_t vd_mu = PTHREAD_MUTEX_INITIALIZER;
static void* vd_blocks[VD_MAX_BLOCKS]; /* user pointers of live blocks */
static size_t vd_sizes[VD_MAX_BLOCKS];
static size_t vd_used;

static C_Status vd_set_device(const C_Device device) {
#ifdef LAX_SET_DEVICE
  if (device == NULL) return C_ERROR;
  tp_current = device->id;
  return C_SUCCESS;
#else
  return tp_set_device(device);
#endif
}

static C_Status vd_allocate(const C_Device device, void** ptr, size_t size) {
  if (!tp_valid_device(device) || ptr == NULL) return C_ERROR;
#ifdef PLAIN_MALLOC
  *ptr = malloc(size);
  return (*ptr != NULL || size == 0) ? C_SUCCESS : C_FAILED;
#endif
  *ptr = NULL;
#ifdef ZERO_NULL
  if (size == 0) return C_SUCCESS;
#endif
  if (size == 0) return C_ERROR;
#ifdef SEGV_SIZE
  if (size == (size_t)SEGV_SIZE) {
    volatile int* bad = NULL;
    *bad = 1;
  }
#endif
  pthread_mutex_lock(&vd_mu);
  int over = size > VD_CAPACITY || vd_used > VD_CAPACITY - size;
#ifdef NO_LIMIT
  over = 0;
#endif
  int slot = -1;
  for (int i = 0; i < VD_MAX_BLOCKS && slot < 0; i++)
    if (vd_blocks[i] == NULL) slot = i;
  void* raw = NULL;
  if (!over && slot >= 0 && posix_memalign(&raw, 256, size + MISALIGN) != 0) raw = NULL;
  if (raw == NULL) {
    pthread_mutex_unlock(&vd_mu);
#ifdef NULL_SUCCESS
    return C_SUCCESS;
#else
    return C_FAILED;
#endif
  }
  vd_blocks[slot] = (char*)raw + MISALIGN;
  vd_sizes[slot] = size;
  vd_used += size;
  *ptr = vd_blocks[slot];
  pthread_mutex_unlock(&vd_mu);
  return C_SUCCESS;
}

static C_Status vd_deallocate(const C_Device device, void* ptr, size_t size) {
  if (!tp_valid_device(device)) return C_ERROR;
#ifdef PLAIN_MALLOC
  (void)size;
  free(ptr);
  return C_SUCCESS;
#endif
#ifdef FREE_DIRECT
  (void)size;
  if (ptr != NULL) {
    pthread_mutex_lock(&vd_mu);
    for (int i = 0; i < VD_MAX_BLOCKS; i++)
      if (vd_blocks[i] == ptr) {
        vd_used -= vd_sizes[i];
        vd_blocks[i] = NULL;
      }
    pthread_mutex_unlock(&vd_mu);
  }
  free((char*)ptr - MISALIGN); /* like most vendor plugins: straight to the system allocator */
  return C_SUCCESS;
#else
  if (ptr == NULL) return C_ERROR;
  pthread_mutex_lock(&vd_mu);
  for (int i = 0; i < VD_MAX_BLOCKS; i++) {
    if (vd_blocks[i] == ptr && vd_sizes[i] == size) {
      vd_blocks[i] = NULL;
      vd_used -= size;
      pthread_mutex_unlock(&vd_mu);
      free((char*)ptr - MISALIGN);
      return C_SUCCESS;
    }
  }
  pthread_mutex_unlock(&vd_mu);
  return C_ERROR; /* a double free or a pointer this plugin did not hand out */
#endif
}

static C_Status vd_memory_stats(const C_Device device, size_t* total, size_t* free_bytes) {
  if (!tp_valid_device(device) || total == NULL || free_bytes == NULL) return C_ERROR;
  *total = VD_CAPACITY;
  pthread_mutex_lock(&vd_mu);
  *free_bytes = vd_used > VD_CAPACITY ? 0 : VD_CAPACITY - vd_used;
  pthread_mutex_unlock(&vd_mu);
#ifdef FIXED_STATS
  *free_bytes = VD_CAPACITY;
#endif
  return C_SUCCESS;
}

static C_Status vd_min_chunk_size(const C_Device device, size_t* size) {
  if (!tp_valid_device(device) || size == NULL) return C_ERROR;
  *size = (size_t)MIN_CHUNK;
  return C_SUCCESS;
}

static C_Status vd_copy(const C_Device device, void* dst, const void* src, size_t size) {
  if (!tp_valid_device(device) || (size && (dst == NULL || src == NULL))) return C_ERROR;
  if (size) memmove(dst, src, size);
  return C_SUCCESS;
}

static C_Status vd_memset(const C_Device device, void* ptr, unsigned char value, size_t size) {
  if (!tp_valid_device(device) || (size && ptr == NULL)) return C_ERROR;
#ifdef SEGV_MEMSET
  volatile unsigned char* bad = NULL;
  *bad = value;
#endif
  if (size) memset(ptr, value, size);
  return C_SUCCESS;
}

#ifdef HOST_MEMORY
#include "paddle_rt/extension.h"
TP_EXPORT int paddle_rt_ext_host_addressable(void) { return 1; }
#endif

void InitPlugin(CustomRuntimeParams* params) {
  TP_INIT_PLUGIN(params);  /* version, type names, the ten required hooks (tp_common.h) */
  params->interface->set_device = vd_set_device;
  params->interface->device_memory_allocate = vd_allocate;
  params->interface->device_memory_deallocate = vd_deallocate;
  params->interface->device_memory_stats = vd_memory_stats;
  params->interface->device_min_chunk_size = vd_min_chunk_size;
  params->interface->memory_copy_h2d = vd_copy;
  params->interface->memory_copy_d2h = vd_copy;
  params->interface->memory_copy_d2d = vd_copy;
  params->interface->device_memory_set = vd_memset;
}
