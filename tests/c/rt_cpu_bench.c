/*
 * Micro-benchmark of the rt_cpu plugin's own costs (not a test; prints medians of 7 repetitions).
 *
 *   gcc -std=gnu11 -O2 -pthread -Ipaddle_rt/include tests/c/rt_cpu_bench.c -o /tmp/rt_cpu_bench -ldl
 *   /tmp/rt_cpu_bench paddle_rt/plugins/librt_cpu.so
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "paddle_rt/device_ext.h"
#include "paddle_rt/paddle_rt_vmm_ext.h"

static C_DeviceInterface f;
static struct C_Device_st D0 = {0}, D1 = {1};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

#define REPS 7
typedef double (*bench_fn)(void);
static void run(const char* name, const char* unit, bench_fn fn) {
  double v[REPS];
  for (int i = 0; i < REPS; i++) v[i] = fn();
  qsort(v, REPS, sizeof(double), cmp);
  printf("%-44s %12.1f %s   (min %.1f, max %.1f)\n", name, v[REPS / 2], unit, v[0], v[REPS - 1]);
}

static double b_alloc_free(void) {
  enum { N = 200000 };
  double t = now_s();
  for (int i = 0; i < N; i++) {
    void* p;
    f.device_memory_allocate(&D0, &p, 1024);
    f.device_memory_deallocate(&D0, p, 1024);
  }
  return (now_s() - t) / N * 1e9;
}

/* A chunk of 20 MiB from device_memory_allocate (what the chunk allocator pays per growth; never touched here). */
static double b_chunk_alloc_free(void) {
  enum { N = 2000 };
  size_t n = (size_t)20 << 20;
  double t = now_s();
  for (int i = 0; i < N; i++) {
    void* p;
    f.device_memory_allocate(&D0, &p, n);
    f.device_memory_deallocate(&D0, p, n);
  }
  return (now_s() - t) / N * 1e9;
}

/* The virtual-memory extension (dlsym'd in main; all NULL when the plugin does not export it). */
static paddle_rt_ext_vmm_granularity_fn vg;
static paddle_rt_ext_vmm_reserve_fn vreserve;
static paddle_rt_ext_vmm_free_range_fn vfree_range;
static paddle_rt_ext_vmm_create_fn vcreate;
static paddle_rt_ext_vmm_release_fn vrelease;
static paddle_rt_ext_vmm_map_fn vmap;
static paddle_rt_ext_vmm_unmap_fn vunmap;
enum { VPAGES = 32 };

/* One page created and released (no mapping): what a growth by one page pays before its map. */
static double b_vmm_create_release(void) {
  enum { N = 20000 };
  size_t g;
  vg(&D0, &g);
  double t = now_s();
  for (int i = 0; i < N; i++) {
    PaddleRtVmmPhys h;
    vcreate(&D0, g, &h);
    vrelease(&D0, h);
  }
  return (now_s() - t) / N * 1e9;
}

/* A page moved: unmapped where it is, mapped at another offset of the range (what a donor page costs the allocator:
   two calls, each one mmap on rt_cpu). 32 pages mapped in the low half of a 64-page range move up and back. */
static double b_vmm_move(void) {
  enum { ROUNDS = 200 };
  size_t g;
  vg(&D0, &g);
  void* base;
  PaddleRtVmmPhys h[VPAGES];
  vreserve(&D0, 2 * VPAGES * g, &base);
  for (int i = 0; i < VPAGES; i++) {
    vcreate(&D0, g, &h[i]);
    vmap(&D0, base, (size_t)i * g, h[i], g);
  }
  double t = now_s();
  for (int r = 0; r < ROUNDS; r++) {
    size_t from = (r & 1) ? VPAGES : 0, to = (r & 1) ? 0 : VPAGES;
    for (int i = 0; i < VPAGES; i++) {
      vunmap(&D0, base, (from + (size_t)i) * g, g);
      vmap(&D0, base, (to + (size_t)i) * g, h[i], g);
    }
  }
  double ns = (now_s() - t) / ((double)ROUNDS * VPAGES) * 1e9;
  size_t at = (ROUNDS & 1) ? VPAGES : 0;
  for (int i = 0; i < VPAGES; i++) {
    vunmap(&D0, base, (at + (size_t)i) * g, g);
    vrelease(&D0, h[i]);
  }
  vfree_range(&D0, base, 2 * VPAGES * g);
  return ns;
}

static C_Stream s0, s1;
static double b_stream_ops(void) {
  enum { N = 100000 };
  char a[64], b[64];
  double t = now_s();
  for (int i = 0; i < N; i++) f.async_memory_copy_d2d(&D0, s0, a, b, sizeof(a));
  f.synchronize_stream(&D0, s0);
  return (now_s() - t) / N * 1e9;
}

static void nop_cb(C_Device d, C_Stream s, void* u, C_Status* st) {
  (void)d;
  (void)s;
  (void)st;
  (*(int*)u)++;
}

static double b_callback_roundtrip(void) {
  enum { N = 5000 };
  int count = 0;
  double t = now_s();
  for (int i = 0; i < N; i++) {
    f.stream_add_callback(&D0, s0, nop_cb, &count);
    f.synchronize_stream(&D0, s0);
  }
  return (now_s() - t) / N * 1e6;
}

static double b_event_roundtrip(void) {
  enum { N = 5000 };
  C_Event e;
  f.create_event(&D0, &e);
  double t = now_s();
  for (int i = 0; i < N; i++) {
    f.record_event(&D0, s0, e);
    f.synchronize_event(&D0, e);
  }
  double r = (now_s() - t) / N * 1e6;
  f.destroy_event(&D0, e);
  return r;
}

static C_CCLComm comm[2];
static float* big[2];
static size_t big_n = 16u << 20; /* floats: 64 MiB per rank */
static double b_allreduce_big(void) {
  double t = now_s();
  f.xccl_all_reduce(big[0], big[0], big_n, FLOAT32, SUM, comm[0], s0);
  f.xccl_all_reduce(big[1], big[1], big_n, FLOAT32, SUM, comm[1], s1);
  f.synchronize_stream(&D0, s0);
  f.synchronize_stream(&D1, s1);
  double dt = now_s() - t;
  return (double)(big_n * sizeof(float)) / dt / 1e9; /* algorithm bandwidth, GB/s */
}

static double b_allreduce_small(void) {
  enum { N = 2000 };
  float x[2] = {1, 2};
  double t = now_s();
  for (int i = 0; i < N; i++) {
    f.xccl_all_reduce(&x[0], &x[0], 1, FLOAT32, SUM, comm[0], s0);
    f.xccl_all_reduce(&x[1], &x[1], 1, FLOAT32, SUM, comm[1], s1);
  }
  f.synchronize_stream(&D0, s0);
  f.synchronize_stream(&D1, s1);
  return (now_s() - t) / N * 1e6;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  CustomRuntimeParams p;
  memset(&p, 0, sizeof(p));
  memset(&f, 0, sizeof(f));
  p.size = sizeof(p);
  p.interface = &f;
  f.size = sizeof(f);
  ((void (*)(CustomRuntimeParams*))dlsym(lib, "InitPlugin"))(&p);
  f.initialize();
  f.create_stream(&D0, &s0);
  f.create_stream(&D1, &s1);
  size_t idsz;
  f.xccl_get_unique_id_size(&idsz);
  unsigned char* idb = calloc(1, idsz);
  C_CCLRootId id = {idsz, idb};
  f.xccl_get_unique_id(&id);
  f.set_device(&D0);
  f.xccl_comm_init_rank(2, &id, 0, &comm[0]);
  f.set_device(&D1);
  f.xccl_comm_init_rank(2, &id, 1, &comm[1]);
  for (int r = 0; r < 2; r++) {
    big[r] = malloc(big_n * sizeof(float));
    for (size_t i = 0; i < big_n; i++) big[r][i] = 1.0f;
  }
  run("device alloc+free pair (1 KiB)", "ns", b_alloc_free);
  run("device alloc+free pair (20 MiB chunk)", "ns", b_chunk_alloc_free);
  vg = (paddle_rt_ext_vmm_granularity_fn)dlsym(lib, "paddle_rt_ext_vmm_granularity");
  vreserve = (paddle_rt_ext_vmm_reserve_fn)dlsym(lib, "paddle_rt_ext_vmm_reserve");
  vfree_range = (paddle_rt_ext_vmm_free_range_fn)dlsym(lib, "paddle_rt_ext_vmm_free_range");
  vcreate = (paddle_rt_ext_vmm_create_fn)dlsym(lib, "paddle_rt_ext_vmm_create");
  vrelease = (paddle_rt_ext_vmm_release_fn)dlsym(lib, "paddle_rt_ext_vmm_release");
  vmap = (paddle_rt_ext_vmm_map_fn)dlsym(lib, "paddle_rt_ext_vmm_map");
  vunmap = (paddle_rt_ext_vmm_unmap_fn)dlsym(lib, "paddle_rt_ext_vmm_unmap");
  if (vg && vreserve && vfree_range && vcreate && vrelease && vmap && vunmap) {
    run("vmm page create+release (one granule)", "ns", b_vmm_create_release);
    run("vmm page move (unmap + map, one granule)", "ns", b_vmm_move);
  }
  run("async d2d copy (64 B), enqueue+run", "ns/op", b_stream_ops);
  run("callback + synchronize_stream round trip", "us", b_callback_roundtrip);
  run("record_event + synchronize_event round trip", "us", b_event_roundtrip);
  run("all_reduce 2 ranks, 1 float, on streams", "us/op", b_allreduce_small);
  run("all_reduce 2 ranks, 64 MiB float32 each", "GB/s", b_allreduce_big);
  f.xccl_destroy_comm(comm[0]);
  f.xccl_destroy_comm(comm[1]);
  free(big[0]);
  free(big[1]);
  free(idb);
  f.finalize();
  return 0;
}
