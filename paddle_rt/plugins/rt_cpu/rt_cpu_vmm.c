/*
 * rt_cpu_vmm.c -- rt_cpu's virtual-memory extension (paddle_rt/paddle_rt_vmm_ext.h), with real memory.
 *
 * - A reserved range is address space mapped PROT_NONE: touching a part of it that is not mapped faults (SIGSEGV),
 *   as an unmapped device address would.
 * - A physical allocation is anonymous private memory of its own (its "parking" place, aligned to the granularity,
 *   madvise(MADV_HUGEPAGE)): mapping moves its pages into the reservation with mremap(MREMAP_FIXED); unmapping moves
 *   them out to a new parking place (mremap(MREMAP_DONTUNMAP), then PROT_NONE address space is mapped over the
 *   emptied span in one mmap(MAP_FIXED), so the range never has a hole another thread's mmap could take), so an
 *   allocation keeps its bytes wherever it is mapped next. Release unmaps its parking place (the pages go back to the
 *   kernel). Why not a memfd with MAP_SHARED (the design before issue 46): (1) shared memory gets no transparent huge
 *   pages unless shmem_enabled allows them (it is "never" by default), so every 4 KiB page faulted on first touch and
 *   copies ran on 4 KiB TLB entries (memcpy_async at 0.83x numpy.copyto, which madvises huge pages); (2) a child of
 *   fork() shared the parent's pages: its writes showed in the parent, and its release punched the parent's file.
 *   Private anonymous memory is copy-on-write across fork(), as malloc'd (chunk) memory is.
 * - fork(): pthread_atfork handlers (the core's, which call this layer's at_fork) take the lock before the fork and
 *   release it after, so the child's copy of the state is consistent; the child then forgets the parent's ranges and
 *   physical allocations (their bytes are given back to the core's accounting) without unmapping them: what the child
 *   inherited stays readable and writable in the child as its private copy until it exits, and the child's rt_cpu
 *   starts with no device memory. Nothing of the parent's memory is shared with the child.
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
 * physical allocations (1), mappings (2), ranges (3) of the device. The batched calls move one allocation per mremap
 * (an allocation is its own mapping: max_map_count, 65530 by default, bounds the mapped granules of a process).
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

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

struct PaddleRtVmmPhys_st {
  uint64_t magic;
  int device;
  uintptr_t parked;    /* where its pages are while it is not mapped */
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

/* `size` bytes of fresh anonymous private address space aligned to the granularity (size + one granule mapped, the
 * slack cut), with protection `prot` (PROT_NONE: a reservation, or a place to move pages to; read-write: the pages of
 * a physical allocation, with transparent huge pages asked for); 0 on failure. */
static uintptr_t aligned_area(size_t size, int prot) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (prot == PROT_NONE ? MAP_NORESERVE : 0);
  uintptr_t b;
  /* the kernel aligns large anonymous mappings to 2 MiB when THP is on: then one call is enough */
  char* p = mmap(NULL, size, prot, flags, -1, 0);
  if (p != MAP_FAILED && ((uintptr_t)p & (g_gran - 1)) == 0) {
    b = (uintptr_t)p;
  } else {
    if (p != MAP_FAILED) munmap(p, size);
    p = mmap(NULL, size + g_gran, prot, flags, -1, 0);
    if (p == MAP_FAILED) return 0;
    b = ((uintptr_t)p + g_gran - 1) & ~(uintptr_t)(g_gran - 1);
    if (b > (uintptr_t)p) munmap(p, b - (uintptr_t)p);
    uintptr_t tail = (uintptr_t)p + size + g_gran;
    if (tail > b + size) munmap((void*)(b + size), tail - (b + size));
  }
  if (prot != PROT_NONE) madvise((void*)b, size, MADV_HUGEPAGE); /* a hint: without THP it does nothing */
  return b;
}

/* Move `size` bytes of pages from `from` to `to` (replacing what is mapped there); 0 or -1. With `keep`, `from` stays
 * mapped (emptied) so that no hole opens in a reservation. */
static int move_pages(uintptr_t from, size_t size, uintptr_t to, int keep) {
  int flags = MREMAP_MAYMOVE | MREMAP_FIXED;
  void* p = mremap((void*)from, size, size, flags | (keep ? MREMAP_DONTUNMAP : 0), (void*)to);
  if (p == MAP_FAILED && keep && errno == EINVAL) /* a kernel before 5.7: no DONTUNMAP */
    p = mremap((void*)from, size, size, flags, (void*)to);
  return p == MAP_FAILED ? -1 : 0;
}

/* Put reserved (PROT_NONE) address space over [at, at + size), in one call. */
static int reserve_over(uintptr_t at, size_t size) {
  return mmap((void*)at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) ==
                 MAP_FAILED
             ? -1
             : 0;
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
  uintptr_t b = r && pages ? aligned_area(size, PROT_NONE) : 0;
  if (!b) {
    free(r);
    free(pages);
    return C_FAILED;
  }
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
  if (id < 0 || !handle || size == 0 || !aligned(size) || size > SIZE_MAX - g_gran) return C_ERROR;
  if (rt_fault_hit(RT_FAULT_ALLOC) || rt_device_charge(id, size) != 0) {
    *handle = NULL;
    return rt_cfg.oom_null ? C_SUCCESS : C_FAILED;
  }
  C_Status st = C_FAILED;
  struct PaddleRtVmmPhys_st* h = calloc(1, sizeof *h);
  uintptr_t at = h ? aligned_area(size, PROT_READ | PROT_WRITE) : 0;
  if (h && !at) st = C_ERROR; /* the kernel refused the mapping (vm.max_map_count): not a device out of memory */
  if (!at) goto fail;
  h->magic = VMM_MAGIC;
  h->device = id;
  h->parked = at;
  h->size = size;
  pthread_mutex_lock(&g_mu);
  if (ptrmap_put(&g_handles, h, (size_t)id) != 0) {
    pthread_mutex_unlock(&g_mu);
    munmap((void*)at, size);
    goto fail;
  }
  g_vdev[id].bytes += size;
  g_vdev[id].count++;
  pthread_mutex_unlock(&g_mu);
  *handle = h;
  return C_SUCCESS;
fail:
  free(h);
  rt_device_uncharge(id, size);
  return st;
}

/* The physical allocation `h` of device `id` (lock held), or NULL. */
static struct PaddleRtVmmPhys_st* find_handle(int id, PaddleRtVmmPhys h) {
  size_t v;
  if (!h || !ptrmap_find(&g_handles, h, &v) || (int)v != id || h->magic != VMM_MAGIC) return NULL;
  return h;
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
  g_vdev[id].bytes -= size;
  g_vdev[id].count--;
  ptrmap_remove(&g_handles, h);
  h->magic = 0;
  pthread_mutex_unlock(&g_mu);
  munmap((void*)h->parked, size); /* the pages go back to the kernel */
  rt_device_uncharge(id, size);
  free(h);
  return C_SUCCESS;
}

/* Move the pages of handles[0..n) (mapped at at + k * page) out to fresh parking places, leaving the span mapped
 * but empty; 0, or -1 with every handle back where it was. RT_CPU_VMM_LIE=remap: the handles never left their
 * parking places. */
static int park_all(uintptr_t at, struct PaddleRtVmmPhys_st* const* hs, size_t n, size_t page) {
  if (g_lie_remap) return 0;
  uintptr_t slot = aligned_area(n * page, PROT_NONE);
  size_t k;
  if (!slot) return -1;
  for (k = 0; k < n; k++)
    if (move_pages(at + k * page, page, slot + k * page, 1) != 0) break;
  if (k < n) {
    while (k > 0) { /* back where they were */
      k--;
      move_pages(slot + k * page, page, at + k * page, 0);
    }
    munmap((void*)slot, n * page);
    return -1;
  }
  for (k = 0; k < n; k++) hs[k]->parked = slot + k * page;
  return 0;
}

/* Map handles[0..n) (each of `page` bytes) at base + offset + k * page, all or nothing (lock held): one mremap per
 * handle moves its pages from their parking place into the reservation. */
static C_Status map_locked(int id, void* base, size_t offset, const PaddleRtVmmPhys* handles, size_t n, size_t page) {
  vmm_range* r = find_range(id, base);
  size_t i, k = 0, claimed = 0, put = 0;
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
  /* a mapping the kernel refuses (ENOMEM past vm.max_map_count) is a failure of the call (C_ERROR), not a device
   * out of memory */
  if (g_lie_remap) {
    if (mmap((void*)at, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
      st = C_ERROR;
      goto unclaim;
    }
    k = n;
  } else {
    for (k = 0; k < n; k++)
      if (move_pages(handles[k]->parked, page, at + k * page, 0) != 0) {
        st = C_ERROR;
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
  if (k > 0 && park_all(at, (struct PaddleRtVmmPhys_st* const*)handles, k, page) == 0) reserve_over(at, k * page);
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
  struct PaddleRtVmmPhys_st** hs = malloc(n * sizeof *hs);
  if (!hs) return C_FAILED;
  for (k = 0; k < n; k++) {
    if (!ptrmap_find(&g_mappings, (void*)(at + k * page), &v) ||
        ((struct PaddleRtVmmPhys_st*)(uintptr_t)v)->size != page) {
      free(hs);
      return C_ERROR;
    }
    hs[k] = (struct PaddleRtVmmPhys_st*)(uintptr_t)v;
  }
  /* the kernel refusing a mapping (ENOMEM past vm.max_map_count) fails the call and nothing changes: the pages
   * stay mapped */
  if (park_all(at, hs, n, page) != 0) {
    free(hs);
    return C_ERROR;
  }
  if (reserve_over(at, span) != 0) { /* the pages go back in place: still mapped, nothing changed */
    for (k = 0; k < n; k++)
      if (!g_lie_remap) move_pages(hs[k]->parked, page, at + k * page, 0);
    free(hs);
    return C_ERROR;
  }
  for (k = 0; k < n; k++) {
    hs[k]->mapped_at = 0;
    ptrmap_remove(&g_mappings, (void*)(at + k * page));
  }
  free(hs);
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

/* Forget every range, mapping and physical allocation (lock held). With `unmap` their address space goes back to the
 * kernel; without (a child of fork()), only the parked pages do, and what is mapped in the ranges stays in place, the
 * child's private copy. Returns nothing; the device counters are zeroed and the bytes given back to the core's
 * accounting when `uncharge`. */
static void forget_all(int unmap, int uncharge) {
  for (size_t i = 0; i < g_ranges.cap; i++) {
    if (!g_ranges.keys[i]) continue;
    vmm_range* r = (vmm_range*)(uintptr_t)g_ranges.vals[i];
    if (unmap) munmap((void*)r->base, r->size);
    free(r->pages);
    free(r);
  }
  for (size_t i = 0; i < g_handles.cap; i++) {
    struct PaddleRtVmmPhys_st* h = (struct PaddleRtVmmPhys_st*)g_handles.keys[i];
    if (!h) continue;
    if (!h->mapped_at || g_lie_remap) munmap((void*)h->parked, h->size);
    h->magic = 0;
    free(h);
  }
  ptrmap_free(&g_ranges);
  ptrmap_free(&g_handles);
  ptrmap_free(&g_mappings);
  for (int d = 0; d < RT_CPU_MAX_DEVICES; d++) {
    if (uncharge && g_vdev[d].bytes) rt_device_uncharge(d, g_vdev[d].bytes);
    memset(&g_vdev[d], 0, sizeof g_vdev[d]);
  }
}

/* The last finalize (a layer's teardown): every range, mapping and physical allocation is forgotten. */
static void vmm_teardown(void) {
  pthread_once(&g_once, vmm_config);
  pthread_mutex_lock(&g_mu);
  forget_all(1, 0);
  pthread_mutex_unlock(&g_mu);
}

/* fork() (the core's pthread_atfork handlers; rt_cpu_internal.h): the lock is held across the fork, so the child's
 * copy of the state is whole; the child forgets the parent's memory (the core's locks are usable again by then). */
static void vmm_at_fork(int phase) {
  pthread_once(&g_once, vmm_config);
  if (phase == RT_FORK_PREPARE) {
    pthread_mutex_lock(&g_mu);
    return;
  }
  if (phase == RT_FORK_CHILD) {
    pthread_mutex_init(&g_mu, NULL);
    forget_all(0, 1);
    return;
  }
  pthread_mutex_unlock(&g_mu);
}

static void vmm_fill(C_DeviceInterface* iface) { (void)iface; } /* no ABI hook: the extension is exported symbols */
static rt_layer g_vmm_layer = {"vmm", vmm_fill, vmm_teardown, vmm_at_fork, NULL};
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
