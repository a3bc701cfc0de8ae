/*
 * rt_cpu_vmm.c -- rt_cpu's virtual-memory extension (paddle_rt/paddle_rt_vmm_ext.h), with real memory.
 *
 * - A reserved range is address space mapped PROT_NONE: touching a part of it that is not mapped faults (SIGSEGV),
 *   as an unmapped device address would.
 * - Physical memory of a device is one memfd per device (sparse, sized to the device's capacity); a physical
 *   allocation is a run of whole granules of that file, so it is memory of its own: unmapping it and mapping it at
 *   another offset (of any range of the device) keeps its bytes. Release punches the run out of the file (the pages
 *   go back to the kernel). Mapping is mmap(MAP_SHARED | MAP_FIXED) of the run over the reservation; unmapping puts
 *   PROT_NONE address space back in its place, so the range stays reserved. The batched calls (map_pages,
 *   unmap_pages) make one mmap per run of physical allocations that are contiguous in the file (creations in a row
 *   get contiguous runs while the file is not fragmented), so growing a range by many pages costs a few system calls.
 * - Capacity: physical bytes count against RT_CPU_MEMORY_BYTES together with device_memory_allocate's (rt_cpu.c's
 *   rt_device_charge), from create to release.
 * - One mutex guards this file's state; every call is thread-safe and a failing call changes nothing.
 *
 * Environment (read once, at the first call):
 *   RT_CPU_VMM=0                  the extension is unavailable: paddle_rt_ext_vmm_granularity returns C_ERROR (paddle_rt
 *                                 then allocates chunks with device_memory_allocate); default 1
 *   RT_CPU_VMM_GRANULARITY=N      granularity in bytes, a power of two of at least the page size (default 2M, CUDA's)
 *   RT_CPU_VMM_LIE=remap          a broken plugin, for paddle_rt's `check`: map gives fresh zero pages instead of the
 *                                 physical allocation's bytes
 * Fault injection: physical creations are calls of rt_cpu_faults.c's kind "alloc" (RT_CPU_FAIL_ALLOC_EVERY / _AFTER,
 * RT_CPU_FAULTS=alloc:..., rt_cpu_set_fault("alloc", ...)): C_FAILED, or C_SUCCESS with a NULL handle under
 * RT_CPU_OOM_NULL=1; RT_CPU_FAIL_VMM=call[,call...] (granularity, reserve,
 * free_range, create, release, map, unmap, map_pages, unmap_pages; read at each call) makes those calls return
 * C_ERROR and do nothing; at run time the fault kinds "unmap" (unmap, unmap_pages), "release" and "free_range" do
 * the same on a schedule (rt_cpu_set_fault). Past the kernel's vm.max_map_count an mmap fails with ENOMEM: map and
 * unmap then fail with C_ERROR (the call failed; the device is not out of memory) and change nothing.
 *
 * Exported helpers (not part of the ABI; tests): size_t rt_cpu_vmm_count(int device, int which): physical bytes (0),
 * physical allocations (1), mappings (2), ranges (3) of the device.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rt_cpu_internal.h"
#include "paddle_rt/paddle_rt_vmm_ext.h"

#define VMM_MAGIC 0x766d6d70687973ULL /* "vmmphys" */

struct PaddleRtVmmPhys_st {
  uint64_t magic;
  int device;
  size_t offset;  /* in the device's memfd */
  size_t size;
  uintptr_t mapped_at; /* 0 when not mapped */
};

typedef struct {
  uintptr_t base;
  size_t size;
  int device;
  uint64_t* pages;   /* one bit per granule: mapped */
  size_t n_maps;
} vmm_range;

typedef struct {
  int fd;            /* -1 until the first creation */
  size_t n_granules; /* of the file */
  size_t hint;       /* no granule below it is free */
  uint64_t* used;    /* one bit per granule of the file */
  size_t bytes, count, maps, ranges;
} vmm_device;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_enabled = 1;
static int g_lie_remap = 0;
static size_t g_gran = (size_t)2 << 20;
static vmm_device g_vdev[RT_CPU_MAX_DEVICES];
static ptrmap g_handles;  /* PaddleRtVmmPhys -> device */
static ptrmap g_ranges;   /* base -> vmm_range* */
static ptrmap g_mappings; /* mapped address -> PaddleRtVmmPhys */

static void vmm_config(void) {
  const char* s = getenv("RT_CPU_VMM");
  if (s && strcmp(s, "0") == 0) g_enabled = 0;
  s = getenv("RT_CPU_VMM_LIE");
  if (s && strcmp(s, "remap") == 0) g_lie_remap = 1;
  s = getenv("RT_CPU_VMM_GRANULARITY");
  if (s && *s) {
    char* end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end && (*end == 'K' || *end == 'k')) v <<= 10, end++;
    else if (end && (*end == 'M' || *end == 'm')) v <<= 20, end++;
    long page = sysconf(_SC_PAGESIZE);
    if (!end || *end || v < (unsigned long long)page || (v & (v - 1)) || v > ((unsigned long long)1 << 30))
      fprintf(stderr, "rt_cpu: ignoring RT_CPU_VMM_GRANULARITY='%s' (a power of two from the page size to 1G); "
                      "using 2M\n", s);
    else
      g_gran = (size_t)v;
  }
  for (int d = 0; d < RT_CPU_MAX_DEVICES; d++) g_vdev[d].fd = -1;
}

/* RT_CPU_FAIL_VMM names this call. */
static int injected(const char* call) {
  const char* s = getenv("RT_CPU_FAIL_VMM");
  size_t n = strlen(call);
  while (s && *s) {
    if (strncmp(s, call, n) == 0 && (s[n] == 0 || s[n] == ',')) return 1;
    s = strchr(s, ',');
    if (s) s++;
  }
  return 0;
}

/* Validate the device and the common preconditions; the device id or -1. */
static int vmm_device_id(const C_Device device, const char* call) {
  pthread_once(&g_once, vmm_config);
  int id = rt_device_id(device);
  if (id < 0 || !g_enabled || !rt_is_initialized() || injected(call)) return -1;
  return id;
}

static int aligned(size_t x) { return (x & (g_gran - 1)) == 0; }

static int bit_get(const uint64_t* b, size_t i) { return (int)((b[i >> 6] >> (i & 63)) & 1); }
static void bit_set(uint64_t* b, size_t i, int v) {
  if (v) b[i >> 6] |= (uint64_t)1 << (i & 63);
  else b[i >> 6] &= ~((uint64_t)1 << (i & 63));
}

/* The device's backing file (lock held); -1 on failure. */
static int device_file(int id) {
  vmm_device* vd = &g_vdev[id];
  if (vd->fd >= 0) return 0;
  size_t n = rt_cfg.memory_bytes / g_gran + 1;
  if (n > SIZE_MAX / g_gran) return -1;
  char name[32];
  snprintf(name, sizeof name, "rt_cpu_vmm_%d", id);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)(n * g_gran)) != 0) {
    close(fd);
    return -1;
  }
  vd->used = calloc((n + 63) / 64, sizeof(uint64_t));
  if (!vd->used) {
    close(fd);
    return -1;
  }
  vd->fd = fd;
  vd->n_granules = n;
  return 0;
}

RT_EXPORT C_Status paddle_rt_ext_vmm_granularity(const C_Device device, size_t* granularity) {
  if (vmm_device_id(device, "granularity") < 0 || !granularity) return C_ERROR;
  *granularity = g_gran;
  return C_SUCCESS;
}

RT_EXPORT C_Status paddle_rt_ext_vmm_reserve(const C_Device device, size_t size, void** base) {
  int id = vmm_device_id(device, "reserve");
  if (id < 0 || !base || size == 0 || !aligned(size) || size > SIZE_MAX - g_gran) return C_ERROR;
  size_t n = size / g_gran;
  vmm_range* r = calloc(1, sizeof *r);
  uint64_t* pages = calloc((n + 63) / 64, sizeof(uint64_t));
  if (!r || !pages) {
    free(r);
    free(pages);
    return C_FAILED;
  }
  /* reserve size + one granule and cut the slack, so that the base is aligned to the granularity */
  char* p = mmap(NULL, size + g_gran, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    free(r);
    free(pages);
    return C_FAILED;
  }
  uintptr_t b = ((uintptr_t)p + g_gran - 1) & ~(uintptr_t)(g_gran - 1);
  if (b > (uintptr_t)p) munmap(p, b - (uintptr_t)p);
  uintptr_t tail = (uintptr_t)p + size + g_gran;
  if (tail > b + size) munmap((void*)(b + size), tail - (b + size));
  r->base = b;
  r->size = size;
  r->device = id;
  r->pages = pages;
  pthread_mutex_lock(&g_mu);
  if (ptrmap_put(&g_ranges, (void*)b, (size_t)(uintptr_t)r) != 0) {
    pthread_mutex_unlock(&g_mu);
    munmap((void*)b, size);
    free(pages);
    free(r);
    return C_FAILED;
  }
  g_vdev[id].ranges++;
  pthread_mutex_unlock(&g_mu);
  *base = (void*)b;
  return C_SUCCESS;
}

/* The range of `base` on device `id` (lock held), or NULL. */
static vmm_range* find_range(int id, const void* base) {
  size_t v;
  if (!base || !ptrmap_find(&g_ranges, base, &v)) return NULL;
  vmm_range* r = (vmm_range*)(uintptr_t)v;
  return r->device == id ? r : NULL;
}

RT_EXPORT C_Status paddle_rt_ext_vmm_free_range(const C_Device device, void* base, size_t size) {
  int id = vmm_device_id(device, "free_range");
  if (id < 0 || rt_fault_hit(RT_FAULT_FREE_RANGE)) return C_ERROR;
  pthread_mutex_lock(&g_mu);
  vmm_range* r = find_range(id, base);
  if (!r || r->size != size || r->n_maps != 0) {
    pthread_mutex_unlock(&g_mu);
    return C_ERROR;
  }
  ptrmap_remove(&g_ranges, base);
  g_vdev[id].ranges--;
  pthread_mutex_unlock(&g_mu);
  munmap(base, size);
  free(r->pages);
  free(r);
  return C_SUCCESS;
}

RT_EXPORT C_Status paddle_rt_ext_vmm_create(const C_Device device, size_t size, PaddleRtVmmPhys* handle) {
  int id = vmm_device_id(device, "create");
  if (id < 0 || !handle || size == 0 || !aligned(size)) return C_ERROR;
  if (rt_fault_hit(RT_FAULT_ALLOC) || rt_device_charge(id, size) != 0) {
    *handle = NULL;
    return rt_cfg.oom_null ? C_SUCCESS : C_FAILED;
  }
  struct PaddleRtVmmPhys_st* h = calloc(1, sizeof *h);
  if (!h) {
    rt_device_uncharge(id, size);
    return C_FAILED;
  }
  pthread_mutex_lock(&g_mu);
  vmm_device* vd = &g_vdev[id];
  size_t need = size / g_gran, run = 0, start = 0, i, first_free = SIZE_MAX;
  if (device_file(id) != 0) goto fail;
  /* first fit from the lowest granule that may be free, a whole word of used granules at a time */
  for (i = vd->hint; i < vd->n_granules && run < need; i++) {
    if (run == 0 && (i & 63) == 0 && vd->used[i >> 6] == ~(uint64_t)0) {
      i += 63;
      continue;
    }
    if (bit_get(vd->used, i)) {
      run = 0;
      continue;
    }
    if (first_free == SIZE_MAX) first_free = i;
    if (run++ == 0) start = i;
  }
  if (run < need) goto fail; /* the file is fragmented: no run of that many free granules */
  if (ptrmap_put(&g_handles, h, (size_t)id) != 0) goto fail;
  for (i = start; i < start + need; i++) bit_set(vd->used, i, 1);
  vd->hint = first_free == start ? start + need : first_free;
  h->magic = VMM_MAGIC;
  h->device = id;
  h->offset = start * g_gran;
  h->size = size;
  vd->bytes += size;
  vd->count++;
  pthread_mutex_unlock(&g_mu);
  *handle = h;
  return C_SUCCESS;
fail:
  pthread_mutex_unlock(&g_mu);
  free(h);
  rt_device_uncharge(id, size);
  return C_FAILED;
}

/* The physical allocation `h` of device `id` (lock held), or NULL. */
static struct PaddleRtVmmPhys_st* find_handle(int id, PaddleRtVmmPhys h) {
  size_t v;
  if (!h || !ptrmap_find(&g_handles, h, &v) || (int)v != id || h->magic != VMM_MAGIC) return NULL;
  return h;
}

/* Give the file run of h back (lock held). */
static void drop_physical(struct PaddleRtVmmPhys_st* h) {
  vmm_device* vd = &g_vdev[h->device];
  fallocate(vd->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)h->offset, (off_t)h->size);
  for (size_t i = h->offset / g_gran; i < (h->offset + h->size) / g_gran; i++) bit_set(vd->used, i, 0);
  if (h->offset / g_gran < vd->hint) vd->hint = h->offset / g_gran;
  vd->bytes -= h->size;
  vd->count--;
  ptrmap_remove(&g_handles, h);
  h->magic = 0;
}

RT_EXPORT C_Status paddle_rt_ext_vmm_release(const C_Device device, PaddleRtVmmPhys handle) {
  int id = vmm_device_id(device, "release");
  if (id < 0 || rt_fault_hit(RT_FAULT_RELEASE)) return C_ERROR;
  pthread_mutex_lock(&g_mu);
  struct PaddleRtVmmPhys_st* h = find_handle(id, handle);
  if (!h || h->mapped_at) {
    pthread_mutex_unlock(&g_mu);
    return C_ERROR;
  }
  size_t size = h->size;
  drop_physical(h);
  pthread_mutex_unlock(&g_mu);
  rt_device_uncharge(id, size);
  free(h);
  return C_SUCCESS;
}

/* Map handles[0..n) (each of `page` bytes) at base + offset + k * page, all or nothing (lock held). One mmap per run
 * of handles that are contiguous in the device's file. */
static C_Status map_locked(int id, void* base, size_t offset, const PaddleRtVmmPhys* handles, size_t n, size_t page) {
  vmm_range* r = find_range(id, base);
  size_t i, k = 0, j, claimed = 0, put = 0;
  C_Status st = C_ERROR;
  if (!r || n == 0 || page == 0 || !aligned(offset) || !aligned(page) || n > SIZE_MAX / page) return C_ERROR;
  size_t span = n * page, first = offset / g_gran, npages = span / g_gran;
  if (offset > r->size || span > r->size - offset) return C_ERROR;
  for (i = first; i < first + npages; i++)
    if (bit_get(r->pages, i)) return C_ERROR; /* a page of the span is mapped already */
  uintptr_t at = r->base + offset;
  /* claim each handle (mapped_at = its destination) so that one given twice is refused */
  for (claimed = 0; claimed < n; claimed++) {
    struct PaddleRtVmmPhys_st* h = find_handle(id, handles[claimed]);
    if (!h || h->mapped_at || h->size != page) goto unclaim;
    h->mapped_at = at + claimed * page;
  }
  for (k = 0; k < n; k = j) {
    for (j = k + 1; j < n && handles[j]->offset == handles[j - 1]->offset + page; j++) {
    }
    void* want = (void*)(at + k * page);
    size_t len = (j - k) * page;
    void* p = g_lie_remap ? mmap(want, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                          : mmap(want, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, g_vdev[id].fd,
                                 (off_t)handles[k]->offset);
    if (p == MAP_FAILED) {
      st = C_ERROR; /* ENOMEM past vm.max_map_count: a failure of the call, not a device out of memory */
      goto unmap;
    }
  }
  for (put = 0; put < n; put++)
    if (ptrmap_put(&g_mappings, (void*)(at + put * page), (size_t)(uintptr_t)handles[put]) != 0) {
      st = C_FAILED;
      goto unmap;
    }
  for (i = first; i < first + npages; i++) bit_set(r->pages, i, 1);
  r->n_maps += n;
  g_vdev[id].maps += n;
  return C_SUCCESS;
unmap:
  while (put > 0) ptrmap_remove(&g_mappings, (void*)(at + --put * page));
  if (k > 0) mmap((void*)at, k * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
unclaim:
  while (claimed > 0) handles[--claimed]->mapped_at = 0;
  return st;
}

/* Unmap the n mappings of `page` bytes at base + offset + k * page, all or nothing (lock held). */
static C_Status unmap_locked(int id, void* base, size_t offset, size_t n, size_t page) {
  vmm_range* r = find_range(id, base);
  size_t k, v;
  if (!r || n == 0 || page == 0 || !aligned(offset) || !aligned(page) || n > SIZE_MAX / page) return C_ERROR;
  size_t span = n * page;
  if (offset > r->size || span > r->size - offset) return C_ERROR;
  uintptr_t at = r->base + offset;
  for (k = 0; k < n; k++) {
    if (!ptrmap_find(&g_mappings, (void*)(at + k * page), &v)) return C_ERROR;
    if (((struct PaddleRtVmmPhys_st*)(uintptr_t)v)->size != page) return C_ERROR;
  }
  /* replacing part of a mapping splits it: past vm.max_map_count the kernel refuses (ENOMEM) and nothing changes;
   * the call fails and the pages stay mapped */
  if (mmap((void*)at, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
    return C_ERROR;
  for (k = 0; k < n; k++) {
    ptrmap_find(&g_mappings, (void*)(at + k * page), &v);
    ((struct PaddleRtVmmPhys_st*)(uintptr_t)v)->mapped_at = 0;
    ptrmap_remove(&g_mappings, (void*)(at + k * page));
  }
  for (size_t i = offset / g_gran; i < (offset + span) / g_gran; i++) bit_set(r->pages, i, 0);
  r->n_maps -= n;
  g_vdev[id].maps -= n;
  return C_SUCCESS;
}

/* The four map / unmap exports: the device checked (with the call's fault-injection name), then the body under the
 * lock. */
static C_Status locked_map(const C_Device device, const char* call, void* base, size_t offset,
                           const PaddleRtVmmPhys* handles, size_t n, size_t page) {
  int id = vmm_device_id(device, call);
  if (id < 0 || !handles) return C_ERROR;
  pthread_mutex_lock(&g_mu);
  C_Status st = map_locked(id, base, offset, handles, n, page);
  pthread_mutex_unlock(&g_mu);
  return st;
}

static C_Status locked_unmap(const C_Device device, const char* call, void* base, size_t offset, size_t n,
                             size_t page) {
  int id = vmm_device_id(device, call);
  if (id < 0 || rt_fault_hit(RT_FAULT_UNMAP)) return C_ERROR;
  pthread_mutex_lock(&g_mu);
  C_Status st = unmap_locked(id, base, offset, n, page);
  pthread_mutex_unlock(&g_mu);
  return st;
}

RT_EXPORT C_Status paddle_rt_ext_vmm_map(const C_Device device, void* base, size_t offset, PaddleRtVmmPhys handle,
                                         size_t size) {
  return locked_map(device, "map", base, offset, &handle, 1, size);
}

RT_EXPORT C_Status paddle_rt_ext_vmm_unmap(const C_Device device, void* base, size_t offset, size_t size) {
  return locked_unmap(device, "unmap", base, offset, 1, size);
}

RT_EXPORT C_Status paddle_rt_ext_vmm_map_pages(const C_Device device, void* base, size_t offset,
                                               const PaddleRtVmmPhys* handles, size_t n, size_t page) {
  return locked_map(device, "map_pages", base, offset, handles, n, page);
}

RT_EXPORT C_Status paddle_rt_ext_vmm_unmap_pages(const C_Device device, void* base, size_t offset, size_t n,
                                                 size_t page) {
  return locked_unmap(device, "unmap_pages", base, offset, n, page);
}

/* The last finalize (a layer's teardown): every range, mapping and physical allocation is forgotten. */
static void vmm_teardown(void) {
  pthread_once(&g_once, vmm_config);
  pthread_mutex_lock(&g_mu);
  for (size_t i = 0; i < g_ranges.cap; i++) {
    if (!g_ranges.keys[i]) continue;
    vmm_range* r = (vmm_range*)(uintptr_t)g_ranges.vals[i];
    munmap((void*)r->base, r->size);
    free(r->pages);
    free(r);
  }
  for (size_t i = 0; i < g_handles.cap; i++)
    if (g_handles.keys[i]) free((void*)g_handles.keys[i]);
  ptrmap_free(&g_ranges);
  ptrmap_free(&g_handles);
  ptrmap_free(&g_mappings);
  for (int d = 0; d < RT_CPU_MAX_DEVICES; d++) {
    vmm_device* vd = &g_vdev[d];
    if (vd->fd >= 0) close(vd->fd);
    free(vd->used);
    memset(vd, 0, sizeof *vd);
    vd->fd = -1;
  }
  pthread_mutex_unlock(&g_mu);
}

static void vmm_fill(C_DeviceInterface* iface) { (void)iface; } /* no ABI hook: the extension is exported symbols */
static rt_layer g_vmm_layer = {"vmm", vmm_fill, vmm_teardown, NULL};
__attribute__((constructor)) static void vmm_register(void) { rt_layer_register(&g_vmm_layer); }

RT_EXPORT size_t rt_cpu_vmm_count(int device, int which) {
  if (device < 0 || device >= RT_CPU_MAX_DEVICES) return 0;
  pthread_once(&g_once, vmm_config);
  pthread_mutex_lock(&g_mu);
  vmm_device* vd = &g_vdev[device];
  size_t n = which == 0 ? vd->bytes : which == 1 ? vd->count : which == 2 ? vd->maps : vd->ranges;
  pthread_mutex_unlock(&g_mu);
  return n;
}
