/*
 * C test driver for the rt_cpu plugin: dlopens the plugin, runs InitPlugin like a host and exercises the hooks.
 *
 *   rt_cpu_driver <path/to/librt_cpu.so> <test>...     (test "all" runs every test that needs no special env)
 *
 * Exit status 0 when every check passed. Compiled by tests/test_rt_cpu.py with -rdynamic so that the plugin's weak
 * reference to profiler_add_runtime_trace_event resolves to the definition below.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "paddle_rt/device_ext.h"

static int g_failures = 0;
#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
      g_failures++;                                                              \
    }                                                                            \
  } while (0)
#define CHECK_EQ(a, b)                                                                               \
  do {                                                                                               \
    long long _a = (long long)(a), _b = (long long)(b);                                              \
    if (_a != _b) {                                                                                  \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, #a, #b, \
              _a, _b);                                                                               \
      g_failures++;                                                                                  \
    }                                                                                                \
  } while (0)

static void* g_lib;
static C_DeviceInterface g_if;
static CustomRuntimeParams g_params;
static size_t (*live_bytes)(int);
static size_t (*live_count)(int);
static size_t (*alloc_calls)(int);
static size_t (*host_live_bytes)(void);
static int (*init_refcount)(void);
static size_t (*live_streams)(void);
static size_t (*live_events)(void);
static int (*async_memset)(int, void*, void*, int, size_t);

static struct C_Device_st D0 = {0}, D1 = {1};

/* The value the plugin should have taken from the environment: EXPECT_<name> when the test sets it (e.g. for bad
 * values that fall back to the default), else <name> itself. */
static size_t env_size(const char* name, size_t dflt) {
  char key[128];
  snprintf(key, sizeof(key), "EXPECT_%s", name);
  const char* s = getenv(key);
  if (!s || !*s) s = getenv(name);
  return s && *s ? (size_t)strtoull(s, NULL, 10) : dflt;
}


/* ---- host functions the plugin may call (weakly referenced by it) ---- */
static atomic_int g_trace_events;
static char g_trace_name[64];
__attribute__((visibility("default"))) void profiler_add_runtime_trace_event(C_Profiler prof, void* event) {
  (void)prof;
  struct {
    uint32_t magic, version;
    const char* name;
    uint64_t start_ns, end_ns, stream_ops, collect_start_ns;
  }* rec = event;
  if (rec && rec->magic == 0x52544350u && rec->name) {
    snprintf(g_trace_name, sizeof(g_trace_name), "%s", rec->name);
    if (rec->end_ns >= rec->start_ns && rec->start_ns > 0) atomic_fetch_add(&g_trace_events, 1);
  }
}
__attribute__((visibility("default"))) void profiler_add_device_trace_event(C_Profiler prof, void* event) {
  (void)prof;
  (void)event;
}

static void load(const char* path) {
  g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!g_lib) {
    fprintf(stderr, "dlopen failed: %s\n", dlerror());
    exit(2);
  }
  void (*init)(CustomRuntimeParams*) = (void (*)(CustomRuntimeParams*))dlsym(g_lib, "InitPlugin");
  if (!init) {
    fprintf(stderr, "no InitPlugin\n");
    exit(2);
  }
  memset(&g_params, 0, sizeof(g_params));
  memset(&g_if, 0, sizeof(g_if));
  g_params.size = sizeof(g_params);
  g_params.interface = &g_if;
  g_if.size = sizeof(g_if);
  init(&g_params);
  live_bytes = (size_t(*)(int))dlsym(g_lib, "rt_cpu_live_bytes");
  live_count = (size_t(*)(int))dlsym(g_lib, "rt_cpu_live_count");
  alloc_calls = (size_t(*)(int))dlsym(g_lib, "rt_cpu_alloc_calls");
  host_live_bytes = (size_t(*)(void))dlsym(g_lib, "rt_cpu_host_live_bytes");
  init_refcount = (int (*)(void))dlsym(g_lib, "rt_cpu_initialize_refcount");
  live_streams = (size_t(*)(void))dlsym(g_lib, "rt_cpu_live_streams");
  live_events = (size_t(*)(void))dlsym(g_lib, "rt_cpu_live_events");
  async_memset = (int (*)(int, void*, void*, int, size_t))dlsym(g_lib, "rt_cpu_async_memset");
  if (!live_bytes || !live_count || !alloc_calls || !host_live_bytes || !init_refcount || !live_streams ||
      !live_events || !async_memset) {
    fprintf(stderr, "missing exported helper\n");
    exit(2);
  }
}

static void begin(void) { CHECK_EQ(g_if.initialize(), C_SUCCESS); }

static void end(void) {
  CHECK_EQ(g_if.finalize(), C_SUCCESS);
  CHECK_EQ(init_refcount(), 0);
  for (int d = 0; d < 2; d++) {
    CHECK_EQ(live_bytes(d), 0);
    CHECK_EQ(live_count(d), 0);
  }
  CHECK_EQ(host_live_bytes(), 0);
  CHECK_EQ(live_streams(), 0);
  CHECK_EQ(live_events(), 0);
}

/* ================================================================================================= tests */

static void test_handshake(void) {
  CHECK(g_params.device_type && strcmp(g_params.device_type, "rt_cpu") == 0);
  CHECK(g_params.sub_device_type && strcmp(g_params.sub_device_type, "v0.1") == 0);
  CHECK_EQ(g_params.version.major, 0);
  CHECK_EQ(g_params.version.minor, 1);
  CHECK_EQ(g_params.version.patch, 1);
  /* every hook that makes sense on a CPU is filled */
  void** slots = (void**)&g_if;
  size_t nslots = sizeof(g_if) / sizeof(void*);
  size_t xccl_lo = offsetof(C_DeviceInterface, xccl_get_comm_name) / sizeof(void*);
  size_t xccl_hi = offsetof(C_DeviceInterface, reserved_ccl_api) / sizeof(void*);
  size_t filled = 0;
  for (size_t i = 1; i < nslots; i++) filled += slots[i] != NULL;
#define MUST(f) CHECK(g_if.f != NULL)
  MUST(initialize); MUST(finalize); MUST(init_device); MUST(set_device); MUST(get_device); MUST(deinit_device);
  MUST(create_stream); MUST(destroy_stream); MUST(query_stream); MUST(stream_add_callback); MUST(create_event);
  MUST(record_event); MUST(destroy_event); MUST(query_event); MUST(synchronize_device); MUST(synchronize_stream);
  MUST(synchronize_event); MUST(stream_wait_event); MUST(device_memory_allocate); MUST(device_memory_deallocate);
  MUST(device_memory_set); MUST(host_memory_allocate); MUST(host_memory_deallocate); MUST(unified_memory_allocate);
  MUST(unified_memory_deallocate); MUST(memory_copy_h2d); MUST(memory_copy_d2h); MUST(memory_copy_d2d);
  MUST(memory_copy_p2p); MUST(async_memory_copy_h2d); MUST(async_memory_copy_d2h); MUST(async_memory_copy_d2d);
  MUST(async_memory_copy_p2p); MUST(get_device_count); MUST(get_device_list); MUST(device_memory_stats);
  MUST(device_min_chunk_size); MUST(device_max_chunk_size); MUST(device_max_alloc_size);
  MUST(device_extra_padding_size); MUST(device_init_alloc_size); MUST(device_realloc_size);
  MUST(get_compute_capability); MUST(get_runtime_version); MUST(get_driver_version); MUST(get_multi_process);
  MUST(get_max_threads_per_mp); MUST(get_max_threads_per_block); MUST(get_max_grid_dim_size);
  MUST(is_float16_supported); MUST(is_bfloat16_supported); MUST(is_dnn_supported); MUST(profiler_initialize);
  MUST(profiler_finalize); MUST(profiler_prepare_tracing); MUST(profiler_start_tracing); MUST(profiler_stop_tracing);
  MUST(profiler_collect_trace_data); MUST(blas_axpby);
#undef MUST
  if (filled < 59) fprintf(stderr, "filled %zu\n", filled);
  CHECK(filled >= 59);
  /* the layout-only groups stay NULL; the xccl group is phase 2 (either all NULL or all set) */
  size_t xccl_set = 0;
  for (size_t i = xccl_lo; i < xccl_hi; i++) xccl_set += slots[i] != NULL;
  CHECK(xccl_set == 0 || xccl_set == xccl_hi - xccl_lo);
  CHECK(g_if.init_eigen_device == NULL);
  CHECK(g_if.init_blas_handle == NULL);

  /* the size-check rule: refuse only when BOTH sizes differ */
  void (*init)(CustomRuntimeParams*) = (void (*)(CustomRuntimeParams*))dlsym(g_lib, "InitPlugin");
  CustomRuntimeParams p;
  C_DeviceInterface* f = calloc(1, sizeof(*f));
  memset(&p, 0, sizeof(p));
  p.size = sizeof(p) - 8;  /* wrong */
  p.interface = f;
  f->size = sizeof(*f);    /* right */
  init(&p);
  CHECK(p.device_type && strcmp(p.device_type, "rt_cpu") == 0);
  CHECK(f->device_memory_allocate != NULL);
  memset(&p, 0, sizeof(p));
  memset(f, 0, sizeof(*f));
  p.size = sizeof(p); /* right */
  p.interface = f;
  f->size = 8;        /* wrong */
  init(&p);
  CHECK(p.device_type != NULL);
  CHECK_EQ(p.version.patch, 1);
  memset(&p, 0, sizeof(p));
  memset(f, 0, sizeof(*f));
  p.size = sizeof(p) + 8; /* both wrong */
  p.interface = f;
  f->size = sizeof(*f) - 8;
  init(&p);
  CHECK(p.device_type == NULL);
  CHECK_EQ(p.version.major + p.version.minor + p.version.patch, 0);
  CHECK(f->device_memory_allocate == NULL);
  free(f);
}

static void* get_device_thread(void* arg) {
  struct C_Device_st d = {-5};
  g_if.get_device(&d);
  *(int*)arg = d.id;
  return NULL;
}

static void test_devices(void) {
  size_t expect = env_size("RT_CPU_DEVICE_COUNT", 2);
  size_t n = 0;
  CHECK_EQ(g_if.get_device_count(&n), C_SUCCESS);
  CHECK_EQ(n, expect);
  size_t ids[64];
  memset(ids, 0xff, sizeof(ids));
  CHECK_EQ(g_if.get_device_list(ids), C_SUCCESS);
  for (size_t i = 0; i < n; i++) CHECK_EQ(ids[i], i);
  CHECK_EQ(g_if.get_device_count(NULL), C_ERROR);

  /* before initialize: resource creation refused */
  void* p = (void*)1;
  CHECK_EQ(g_if.device_memory_allocate(&D0, &p, 64), C_ERROR);
  C_Stream s = NULL;
  CHECK_EQ(g_if.create_stream(&D0, &s), C_ERROR);
  CHECK_EQ(g_if.finalize(), C_ERROR);

  begin();
  struct C_Device_st bad = {(int)n}, neg = {-1}, last = {(int)n - 1};
  CHECK_EQ(g_if.init_device(&D0), C_SUCCESS);
  CHECK_EQ(g_if.init_device(&bad), C_ERROR);
  CHECK_EQ(g_if.init_device(NULL), C_ERROR);
  CHECK_EQ(g_if.set_device(&last), C_SUCCESS);
  struct C_Device_st cur = {-7};
  CHECK_EQ(g_if.get_device(&cur), C_SUCCESS);
  CHECK_EQ(cur.id, (int)n - 1);
  CHECK_EQ(g_if.set_device(&bad), C_ERROR);
  CHECK_EQ(g_if.set_device(&neg), C_ERROR);
  CHECK_EQ(g_if.get_device(&cur), C_SUCCESS);
  CHECK_EQ(cur.id, (int)n - 1); /* unchanged after an error */
  /* thread-local: another thread starts on device 0 */
  int other = -9;
  pthread_t t;
  pthread_create(&t, NULL, get_device_thread, &other);
  pthread_join(t, NULL);
  CHECK_EQ(other, 0);
  CHECK_EQ(g_if.set_device(&D0), C_SUCCESS);

  size_t v = 0;
  CHECK_EQ(g_if.device_min_chunk_size(&D0, &v), C_SUCCESS);
  CHECK_EQ(v, env_size("RT_CPU_MIN_CHUNK", 256));
  CHECK_EQ(g_if.device_extra_padding_size(&D0, &v), C_SUCCESS);
  CHECK_EQ(v, env_size("RT_CPU_EXTRA_PADDING", 0));
  size_t total = 0, freeb = 0;
  CHECK_EQ(g_if.device_memory_stats(&D0, &total, &freeb), C_SUCCESS);
  CHECK(total > 0);
  CHECK_EQ(freeb, total);
  if (getenv("RT_CPU_MEMORY_BYTES")) CHECK_EQ(total, env_size("RT_CPU_MEMORY_BYTES", 0));
  CHECK_EQ(g_if.device_max_alloc_size(&D0, &v), C_SUCCESS);
  CHECK_EQ(v, total);
  CHECK_EQ(g_if.device_max_chunk_size(&D0, &v), C_SUCCESS);
  CHECK(v > 0 && v <= total);
  CHECK_EQ(g_if.device_init_alloc_size(&D0, &v), C_SUCCESS);
  CHECK(v > 0 && v <= total);
  CHECK_EQ(g_if.device_realloc_size(&D0, &v), C_SUCCESS);
  CHECK(v > 0 && v <= total);
  CHECK_EQ(g_if.device_min_chunk_size(&bad, &v), C_ERROR);
  CHECK_EQ(g_if.device_min_chunk_size(&D0, NULL), C_ERROR);
  CHECK_EQ(g_if.get_compute_capability(&D0, &v), C_SUCCESS);
  CHECK(v > 0);
  CHECK_EQ(g_if.get_runtime_version(&D0, &v), C_SUCCESS);
  CHECK(v > 0);
  CHECK_EQ(g_if.get_driver_version(&D0, &v), C_SUCCESS);
  CHECK(v > 0);
  CHECK_EQ(g_if.get_multi_process(&D0, &v), C_SUCCESS);
  CHECK(v >= 1);
  CHECK_EQ(g_if.get_max_threads_per_mp(&D0, &v), C_SUCCESS);
  CHECK(v >= 1);
  CHECK_EQ(g_if.get_max_threads_per_block(&D0, &v), C_SUCCESS);
  CHECK(v >= 1);
  C_GridDim3 dims = {0, 0, 0};
  CHECK_EQ(g_if.get_max_grid_dim_size(&D0, &dims), C_SUCCESS);
  CHECK(dims[0] > 0 && dims[1] > 0 && dims[2] > 0);
  bool b = false;
  CHECK_EQ(g_if.is_float16_supported(&D0, &b), C_SUCCESS);
  CHECK(b);
  CHECK_EQ(g_if.is_bfloat16_supported(&D0, &b), C_SUCCESS);
  CHECK(b);
  b = true;
  CHECK_EQ(g_if.is_dnn_supported(&D0, &b), C_SUCCESS);
  CHECK(!b);
  CHECK_EQ(g_if.is_dnn_supported(&bad, &b), C_ERROR);
  CHECK_EQ(g_if.deinit_device(&D0), C_SUCCESS);
  CHECK_EQ(g_if.deinit_device(&bad), C_ERROR);
  end();
}

static void test_memory(void) {
  begin();
  size_t align = 256;
  size_t mc = env_size("RT_CPU_MIN_CHUNK", 256);
  if (mc > 256 && mc <= 4096 && (mc & (mc - 1)) == 0) align = mc;
  const size_t N = 10000;
  void *a = NULL, *b = NULL, *c = NULL;
  size_t calls0 = alloc_calls(0);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &a, N), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &b, N), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D1, &c, N), C_SUCCESS);
  CHECK(a && b && c && a != b);
  CHECK_EQ((uintptr_t)a % align, 0);
  CHECK_EQ((uintptr_t)c % align, 0);
  CHECK_EQ(alloc_calls(0) - calls0, 2);
  CHECK_EQ(live_bytes(0), 2 * N);
  CHECK_EQ(live_count(0), 2);
  CHECK_EQ(live_bytes(1), N);
  size_t total, freeb;
  CHECK_EQ(g_if.device_memory_stats(&D0, &total, &freeb), C_SUCCESS);
  CHECK_EQ(total - freeb, 2 * N);

  unsigned char* host = malloc(N);
  unsigned char* back = malloc(N);
  for (size_t i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + 3);
  /* memset */
  CHECK_EQ(g_if.device_memory_set(&D0, a, 0xAB, N), C_SUCCESS);
  for (size_t i = 0; i < N; i++)
    if (((unsigned char*)a)[i] != 0xAB) { CHECK(!"memset content"); break; }
  /* h2d, d2d, p2p, d2h */
  CHECK_EQ(g_if.memory_copy_h2d(&D0, a, host, N), C_SUCCESS);
  CHECK_EQ(g_if.memory_copy_d2d(&D0, b, a, N), C_SUCCESS);
  CHECK_EQ(g_if.memory_copy_p2p(&D1, &D0, c, b, N), C_SUCCESS);
  memset(back, 0, N);
  CHECK_EQ(g_if.memory_copy_d2h(&D1, back, c, N), C_SUCCESS);
  CHECK(memcmp(back, host, N) == 0);
  CHECK_EQ(g_if.memory_copy_h2d(&D0, NULL, host, N), C_ERROR);
  CHECK_EQ(g_if.memory_copy_h2d(&D0, a, host, 0), C_SUCCESS);
  struct C_Device_st bad = {99};
  CHECK_EQ(g_if.memory_copy_p2p(&bad, &D0, c, b, N), C_ERROR);

  /* async copies on a stream, and with a NULL stream (synchronous) */
  C_Stream s = NULL;
  CHECK_EQ(g_if.create_stream(&D0, &s), C_SUCCESS);
  CHECK(s != NULL);
  for (size_t i = 0; i < N; i++) host[i] = (unsigned char)(i * 13 + 1);
  CHECK_EQ(g_if.async_memory_copy_h2d(&D0, s, a, host, N), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2d(&D0, s, b, a, N), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_p2p(&D1, &D0, s, c, b, N), C_SUCCESS);
  memset(back, 0, N);
  CHECK_EQ(g_if.async_memory_copy_d2h(&D1, s, back, c, N), C_ERROR); /* the stream belongs to device 0 */
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, s, back, c, N), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D0, s), C_SUCCESS);
  CHECK(memcmp(back, host, N) == 0);
  CHECK_EQ(async_memset(0, s, a, 0x5A, N), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, s, back, a, N), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D0, s), C_SUCCESS);
  CHECK(back[0] == 0x5A && back[N - 1] == 0x5A);
  for (size_t i = 0; i < N; i++) host[i] = (unsigned char)(i * 5 + 9);
  CHECK_EQ(g_if.async_memory_copy_h2d(&D0, NULL, a, host, N), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2d(&D0, NULL, b, a, N), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_p2p(&D1, &D0, NULL, c, b, N), C_SUCCESS);
  memset(back, 0, N);
  CHECK_EQ(g_if.async_memory_copy_d2h(&D1, NULL, back, c, N), C_SUCCESS);
  CHECK(memcmp(back, host, N) == 0);
  CHECK_EQ(g_if.destroy_stream(&D0, s), C_SUCCESS);

  /* host (pinned) and unified memory */
  void *h = NULL, *u = NULL;
  CHECK_EQ(g_if.host_memory_allocate(&D0, &h, 1000), C_SUCCESS);
  CHECK_EQ(g_if.unified_memory_allocate(&D1, &u, 3000), C_SUCCESS);
  CHECK(h && u);
  CHECK_EQ(host_live_bytes(), 4000);
  memset(h, 1, 1000);
  memset(u, 2, 3000);
  CHECK_EQ(g_if.host_memory_allocate(&D0, &h, 0), C_ERROR);
  CHECK_EQ(g_if.host_memory_deallocate(&D0, u, 3000), C_ERROR);    /* unified via host */
  CHECK_EQ(g_if.unified_memory_deallocate(&D1, u, 2999), C_ERROR); /* wrong size */
  CHECK_EQ(g_if.device_memory_deallocate(&D0, h, 1000), C_ERROR);  /* host via device */
  CHECK_EQ(g_if.host_memory_deallocate(&D0, h, 1000), C_SUCCESS);
  CHECK_EQ(g_if.host_memory_deallocate(&D0, h, 1000), C_ERROR);    /* double */
  CHECK_EQ(g_if.unified_memory_deallocate(&D1, u, 3000), C_SUCCESS);
  CHECK_EQ(host_live_bytes(), 0);

  /* bad frees: unknown, wrong size, wrong device, double; none changes the books */
  int local;
  CHECK_EQ(g_if.device_memory_deallocate(&D0, &local, 4), C_ERROR);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, (char*)a + 256, N - 256), C_ERROR);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, a, N + 1), C_ERROR);
  CHECK_EQ(g_if.device_memory_deallocate(&D1, a, N), C_ERROR);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, NULL, N), C_ERROR);
  CHECK_EQ(live_bytes(0), 2 * N);
  CHECK_EQ(live_count(0), 2);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, a, N), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, a, N), C_ERROR);
  CHECK_EQ(live_bytes(0), N);
  CHECK_EQ(live_count(0), 1);
  /* size 0 and bad arguments */
  void* z = (void*)1;
  CHECK_EQ(g_if.device_memory_allocate(&D0, &z, 0), C_ERROR);
  CHECK_EQ(g_if.device_memory_allocate(&D0, NULL, 10), C_ERROR);
  CHECK_EQ(g_if.device_memory_allocate(&bad, &z, 10), C_ERROR);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, b, N), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_deallocate(&D1, c, N), C_SUCCESS);
  CHECK_EQ(live_bytes(0), 0);
  CHECK_EQ(live_bytes(1), 0);
  /* many allocations (hash table growth and removal) */
  enum { M = 500 };
  void* many[M];
  for (int i = 0; i < M; i++) CHECK_EQ(g_if.device_memory_allocate(&D1, &many[i], 100 + i), C_SUCCESS);
  CHECK_EQ(live_count(1), M);
  for (int i = 0; i < M; i += 2) CHECK_EQ(g_if.device_memory_deallocate(&D1, many[i], 100 + i), C_SUCCESS);
  for (int i = 1; i < M; i += 2) CHECK_EQ(g_if.device_memory_deallocate(&D1, many[i], 100 + i + 1), C_ERROR);
  for (int i = 1; i < M; i += 2) CHECK_EQ(g_if.device_memory_deallocate(&D1, many[i], 100 + i), C_SUCCESS);
  CHECK_EQ(live_count(1), 0);
  /* leave one allocation live: finalize must release it */
  void* leak = NULL;
  CHECK_EQ(g_if.device_memory_allocate(&D0, &leak, 4096), C_SUCCESS);
  CHECK_EQ(g_if.host_memory_allocate(&D0, &h, 100), C_SUCCESS);
  free(host);
  free(back);
  end();
}

/* capacity: expects RT_CPU_MEMORY_BYTES=1048576; RT_CPU_OOM_NULL decides the OOM report */
static void test_capacity(void) {
  begin();
  size_t cap = env_size("RT_CPU_MEMORY_BYTES", 0);
  int oom_null = (int)env_size("RT_CPU_OOM_NULL", 0);
  CHECK_EQ(cap, 1048576);
  void *a = NULL, *b = NULL, *c = (void*)1;
  CHECK_EQ(g_if.device_memory_allocate(&D0, &a, cap / 2), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &b, cap / 2), C_SUCCESS);
  size_t total, freeb;
  CHECK_EQ(g_if.device_memory_stats(&D0, &total, &freeb), C_SUCCESS);
  CHECK_EQ(total, cap);
  CHECK_EQ(freeb, 0);
  C_Status st = g_if.device_memory_allocate(&D0, &c, 1);
  CHECK_EQ(st, oom_null ? C_SUCCESS : C_FAILED);
  CHECK(c == NULL);
  CHECK_EQ(live_bytes(0), cap);
  CHECK_EQ(live_count(0), 2);
  /* other device unaffected */
  void* d = NULL;
  CHECK_EQ(g_if.device_memory_allocate(&D1, &d, cap), C_SUCCESS);
  c = (void*)1;
  CHECK_EQ(g_if.device_memory_allocate(&D1, &c, cap + 1), oom_null ? C_SUCCESS : C_FAILED);
  CHECK(c == NULL);
  CHECK_EQ(g_if.device_memory_deallocate(&D1, d, cap), C_SUCCESS);
  c = (void*)1;
  CHECK_EQ(g_if.device_memory_allocate(&D1, &c, cap + 1), oom_null ? C_SUCCESS : C_FAILED);
  CHECK(c == NULL);
  /* freeing makes room again */
  CHECK_EQ(g_if.device_memory_deallocate(&D0, a, cap / 2), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &c, cap / 4), C_SUCCESS);
  CHECK(c != NULL);
  CHECK_EQ(g_if.device_memory_stats(&D0, &total, &freeb), C_SUCCESS);
  CHECK_EQ(freeb, cap / 4);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, c, cap / 4), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, b, cap / 2), C_SUCCESS);
  end();
}

/* expects RT_CPU_FAIL_ALLOC_EVERY=3 */
static void test_fail_every(void) {
  begin();
  int oom_null = (int)env_size("RT_CPU_OOM_NULL", 0);
  size_t calls0 = alloc_calls(0) + alloc_calls(1);
  void* p[9];
  int ok = 0;
  for (int i = 0; i < 9; i++) {
    p[i] = (void*)1;
    C_Status st = g_if.device_memory_allocate(i % 2 ? &D1 : &D0, &p[i], 64);
    if ((i + 1) % 3 == 0) {
      CHECK_EQ(st, oom_null ? C_SUCCESS : C_FAILED);
      CHECK(p[i] == NULL);
    } else {
      CHECK_EQ(st, C_SUCCESS);
      CHECK(p[i] != NULL);
      ok++;
    }
  }
  CHECK_EQ(alloc_calls(0) + alloc_calls(1) - calls0, 9);
  CHECK_EQ(live_count(0) + live_count(1), ok);
  for (int i = 0; i < 9; i++)
    if (p[i]) CHECK_EQ(g_if.device_memory_deallocate(i % 2 ? &D1 : &D0, p[i], 64), C_SUCCESS);
  end();
}

/* expects RT_CPU_FAIL_ALLOC_AFTER=2 and RT_CPU_FAIL_HOST_ALLOC_EVERY=2 */
static void test_fail_after(void) {
  begin();
  void *a = NULL, *b = NULL, *c = (void*)1;
  CHECK_EQ(g_if.device_memory_allocate(&D0, &a, 64), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &b, 64), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &c, 64), C_FAILED);
  CHECK(c == NULL);
  CHECK_EQ(g_if.device_memory_allocate(&D1, &c, 64), C_FAILED);
  void *h1 = NULL, *h2 = (void*)1, *h3 = NULL;
  CHECK_EQ(g_if.host_memory_allocate(&D0, &h1, 64), C_SUCCESS);
  CHECK_EQ(g_if.host_memory_allocate(&D0, &h2, 64), C_FAILED);
  CHECK(h2 == NULL);
  CHECK_EQ(g_if.unified_memory_allocate(&D0, &h3, 64), C_SUCCESS);
  CHECK_EQ(host_live_bytes(), 128);
  CHECK_EQ(g_if.host_memory_deallocate(&D0, h1, 64), C_SUCCESS);
  CHECK_EQ(g_if.unified_memory_deallocate(&D0, h3, 64), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, a, 64), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, b, 64), C_SUCCESS);
  end();
}

/* ---- streams ---- */

typedef struct {
  pthread_mutex_t mu;
  int order[64];
  int n;
  unsigned char seen[64];
  unsigned char* watch;
  int device[64];
  C_Status status_in[64];
} cb_log;

typedef struct {
  cb_log* log;
  int id;
} cb_arg;

static void log_cb(C_Device dev, C_Stream stream, void* user_data, C_Status* status) {
  (void)stream;
  cb_arg* a = user_data;
  pthread_mutex_lock(&a->log->mu);
  int k = a->log->n++;
  a->log->order[k] = a->id;
  a->log->seen[k] = a->log->watch ? a->log->watch[0] : 0;
  a->log->device[k] = dev ? dev->id : -1;
  a->log->status_in[k] = status ? *status : C_INTERNAL_ERROR;
  pthread_mutex_unlock(&a->log->mu);
}

/* expects RT_CPU_STREAM_DELAY_US (e.g. 2000) so that the stream is visibly busy */
static void test_stream_order(void) {
  begin();
  int delayed = env_size("RT_CPU_STREAM_DELAY_US", 0) > 0;
  const size_t N = 4096;
  void *a = NULL, *b = NULL;
  CHECK_EQ(g_if.device_memory_allocate(&D0, &a, N), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &b, N), C_SUCCESS);
  unsigned char* h = calloc(1, N);
  unsigned char* out = calloc(4, N);
  for (size_t i = 0; i < N; i++) h[i] = (unsigned char)(i & 0xff);
  C_Stream s = NULL;
  CHECK_EQ(g_if.create_stream(&D0, &s), C_SUCCESS);
  CHECK_EQ(g_if.query_stream(&D0, s), C_SUCCESS); /* idle */
  cb_log log;
  memset(&log, 0, sizeof(log));
  pthread_mutex_init(&log.mu, NULL);
  log.watch = a;
  cb_arg args[6];
  for (int i = 0; i < 6; i++) args[i] = (cb_arg){&log, i};
  /* a ; step by step, snapshots into out[k*N] */
  CHECK_EQ(async_memset(0, s, a, 1, N), C_SUCCESS);
  CHECK_EQ(g_if.stream_add_callback(&D0, s, log_cb, &args[0]), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, s, out, a, N), C_SUCCESS);          /* out0 = 1s */
  CHECK_EQ(g_if.async_memory_copy_h2d(&D0, s, a, h, N), C_SUCCESS);            /* a = pattern */
  CHECK_EQ(g_if.stream_add_callback(&D0, s, log_cb, &args[1]), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2d(&D0, s, b, a, N), C_SUCCESS);            /* b = pattern */
  CHECK_EQ(async_memset(0, s, a, 7, N / 2), C_SUCCESS);                        /* a = 7s | pattern */
  CHECK_EQ(g_if.stream_add_callback(&D0, s, log_cb, &args[2]), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, s, out + N, a, N), C_SUCCESS);      /* out1 */
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, s, out + 2 * N, b, N), C_SUCCESS);  /* out2 = pattern */
  CHECK_EQ(async_memset(0, s, b, 9, N), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, s, out + 3 * N, b, N), C_SUCCESS);  /* out3 = 9s */
  CHECK_EQ(g_if.stream_add_callback(&D0, s, log_cb, &args[3]), C_SUCCESS);
  if (delayed) CHECK_EQ(g_if.query_stream(&D0, s), C_FAILED); /* busy, and query does not block */
  CHECK_EQ(g_if.synchronize_stream(&D0, s), C_SUCCESS);
  CHECK_EQ(g_if.query_stream(&D0, s), C_SUCCESS);
  for (size_t i = 0; i < N; i++) {
    if (out[i] != 1 || out[N + i] != (i < N / 2 ? 7 : h[i]) || out[2 * N + i] != h[i] || out[3 * N + i] != 9) {
      CHECK(!"stream order content");
      break;
    }
  }
  CHECK_EQ(log.n, 4);
  for (int i = 0; i < log.n; i++) {
    CHECK_EQ(log.order[i], i);
    CHECK_EQ(log.device[i], 0);
    CHECK_EQ(log.status_in[i], C_SUCCESS);
  }
  CHECK_EQ(log.seen[0], 1);    /* the callback saw the memset before it */
  CHECK_EQ(log.seen[1], h[0]); /* ... and the h2d */
  CHECK_EQ(log.seen[2], 7);
  /* callback on the NULL stream runs at once */
  CHECK_EQ(g_if.stream_add_callback(&D0, NULL, log_cb, &args[4]), C_SUCCESS);
  CHECK_EQ(log.n, 5);
  CHECK_EQ(g_if.stream_add_callback(&D0, s, NULL, NULL), C_ERROR);
  /* destroy drains pending work */
  CHECK_EQ(async_memset(0, s, a, 0x33, N), C_SUCCESS);
  CHECK_EQ(g_if.stream_add_callback(&D0, s, log_cb, &args[5]), C_SUCCESS);
  CHECK_EQ(g_if.destroy_stream(&D0, s), C_SUCCESS);
  CHECK_EQ(log.n, 6);
  CHECK_EQ(((unsigned char*)a)[N - 1], 0x33);
  /* the handle is dead now */
  CHECK_EQ(g_if.query_stream(&D0, s), C_ERROR);
  CHECK_EQ(g_if.synchronize_stream(&D0, s), C_ERROR);
  CHECK_EQ(g_if.destroy_stream(&D0, s), C_ERROR);
  CHECK_EQ(g_if.async_memory_copy_h2d(&D0, s, a, h, N), C_ERROR);
  pthread_mutex_destroy(&log.mu);
  free(h);
  free(out);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, a, N), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, b, N), C_SUCCESS);
  end();
}

static void test_handles(void) {
  begin();
  long long garbage[16];
  memset(garbage, 0x41, sizeof(garbage));
  C_Stream gs = (C_Stream)garbage;
  C_Event ge = (C_Event)(garbage + 4);
  char buf[16];
  CHECK_EQ(g_if.query_stream(&D0, gs), C_ERROR);
  CHECK_EQ(g_if.synchronize_stream(&D0, gs), C_ERROR);
  CHECK_EQ(g_if.destroy_stream(&D0, gs), C_ERROR);
  CHECK_EQ(g_if.async_memory_copy_h2d(&D0, gs, buf, buf + 8, 8), C_ERROR);
  CHECK_EQ(g_if.stream_add_callback(&D0, gs, log_cb, NULL), C_ERROR);
  CHECK_EQ(g_if.query_event(&D0, ge), C_ERROR);
  CHECK_EQ(g_if.synchronize_event(&D0, ge), C_ERROR);
  CHECK_EQ(g_if.destroy_event(&D0, ge), C_ERROR);
  CHECK_EQ(g_if.record_event(&D0, NULL, ge), C_ERROR);
  CHECK_EQ(g_if.stream_wait_event(&D0, NULL, ge), C_ERROR);
  CHECK_EQ(g_if.destroy_stream(&D0, NULL), C_ERROR);
  CHECK_EQ(g_if.destroy_event(&D0, NULL), C_ERROR);
  CHECK_EQ(g_if.query_stream(&D0, NULL), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D0, NULL), C_SUCCESS);
  C_Stream s1 = NULL;
  CHECK_EQ(g_if.create_stream(&D1, &s1), C_SUCCESS);
  CHECK_EQ(g_if.query_stream(&D0, s1), C_ERROR); /* a stream of device 1 used as device 0's */
  CHECK_EQ(g_if.destroy_stream(&D0, s1), C_ERROR);
  CHECK_EQ(g_if.query_stream(&D1, s1), C_SUCCESS);
  CHECK_EQ(g_if.create_stream(&D0, NULL), C_ERROR);
  struct C_Device_st bad = {77};
  C_Stream s2 = NULL;
  CHECK_EQ(g_if.create_stream(&bad, &s2), C_ERROR);
  CHECK(s2 == NULL);
  C_Event e = NULL;
  CHECK_EQ(g_if.create_event(&bad, &e), C_ERROR);
  CHECK_EQ(g_if.create_event(&D0, NULL), C_ERROR);
  CHECK_EQ(g_if.create_event(&D1, &e), C_SUCCESS);
  CHECK_EQ(live_streams(), 1);
  CHECK_EQ(live_events(), 1);
  CHECK_EQ(g_if.destroy_event(&D1, e), C_SUCCESS);
  CHECK_EQ(g_if.destroy_event(&D1, e), C_ERROR);
  CHECK_EQ(g_if.query_event(&D1, e), C_ERROR);
  CHECK_EQ(g_if.record_event(&D1, s1, e), C_ERROR);
  CHECK_EQ(g_if.destroy_stream(&D1, s1), C_SUCCESS);
  /* handles left alive at finalize are released by it */
  CHECK_EQ(g_if.create_stream(&D0, &s1), C_SUCCESS);
  CHECK_EQ(g_if.create_event(&D0, &e), C_SUCCESS);
  CHECK_EQ(g_if.record_event(&D0, s1, e), C_SUCCESS);
  end();
  CHECK_EQ(g_if.query_stream(&D0, s1), C_ERROR);
  CHECK_EQ(g_if.query_event(&D0, e), C_ERROR);
}

typedef struct {
  C_Stream s;
  C_Status sync_status, destroy_status, dev_sync_status;
} self_call;

static void self_sync_cb(C_Device dev, C_Stream stream, void* user_data, C_Status* status) {
  (void)status;
  self_call* sc = user_data;
  sc->sync_status = g_if.synchronize_stream(dev, stream);
  sc->destroy_status = g_if.destroy_stream(dev, stream);
  sc->dev_sync_status = g_if.synchronize_device(dev);
}

static void test_events(void) {
  begin();
  int delayed = env_size("RT_CPU_STREAM_DELAY_US", 0) > 0;
  C_Stream sa = NULL, sb = NULL;
  C_Event e = NULL, never = NULL;
  CHECK_EQ(g_if.create_stream(&D0, &sa), C_SUCCESS);
  CHECK_EQ(g_if.create_stream(&D0, &sb), C_SUCCESS);
  CHECK_EQ(g_if.create_event(&D0, &e), C_SUCCESS);
  CHECK_EQ(g_if.create_event(&D0, &never), C_SUCCESS);
  CHECK_EQ(g_if.query_event(&D0, never), C_SUCCESS);       /* never recorded: complete */
  CHECK_EQ(g_if.synchronize_event(&D0, never), C_SUCCESS); /* and does not block */
  const size_t N = 1 << 16;
  unsigned char* src = malloc(N);
  unsigned char* dst = calloc(1, N);
  unsigned char* out = calloc(1, N);
  memset(src, 0x77, N);
  /* stream A: several slow steps then the data, then record; stream B: waits, then copies the data out */
  for (int i = 0; i < 8; i++) CHECK_EQ(async_memset(0, sa, dst, (unsigned char)i, N), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_h2d(&D0, sa, dst, src, N), C_SUCCESS);
  CHECK_EQ(g_if.record_event(&D0, sa, e), C_SUCCESS);
  if (delayed) CHECK_EQ(g_if.query_event(&D0, e), C_FAILED);
  CHECK_EQ(g_if.stream_wait_event(&D0, sb, e), C_SUCCESS);
  CHECK_EQ(g_if.stream_wait_event(&D0, sb, never), C_SUCCESS); /* no-op */
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, sb, out, dst, N), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D0, sb), C_SUCCESS);
  CHECK(out[0] == 0x77 && out[N - 1] == 0x77);
  CHECK_EQ(g_if.query_event(&D0, e), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_event(&D0, e), C_SUCCESS);
  /* re-record: pending again, then complete */
  for (int i = 0; i < 4; i++) CHECK_EQ(async_memset(0, sa, dst, 0x10, N), C_SUCCESS);
  CHECK_EQ(g_if.record_event(&D0, sa, e), C_SUCCESS);
  if (delayed) CHECK_EQ(g_if.query_event(&D0, e), C_FAILED);
  CHECK_EQ(g_if.synchronize_event(&D0, e), C_SUCCESS);
  CHECK_EQ(g_if.query_event(&D0, e), C_SUCCESS);
  CHECK_EQ(((unsigned char*)dst)[N - 1], 0x10);
  /* recording on the NULL stream completes at once */
  CHECK_EQ(g_if.record_event(&D0, NULL, e), C_SUCCESS);
  CHECK_EQ(g_if.query_event(&D0, e), C_SUCCESS);
  /* wait on the NULL stream: the caller waits */
  CHECK_EQ(async_memset(0, sa, dst, 0x21, N), C_SUCCESS);
  CHECK_EQ(g_if.record_event(&D0, sa, e), C_SUCCESS);
  CHECK_EQ(g_if.stream_wait_event(&D0, NULL, e), C_SUCCESS);
  CHECK_EQ(g_if.query_event(&D0, e), C_SUCCESS);
  CHECK_EQ(dst[0], 0x21);
  /* cross-device wait: a stream of device 1 waits on an event recorded on device 0 */
  C_Stream s1 = NULL;
  CHECK_EQ(g_if.create_stream(&D1, &s1), C_SUCCESS);
  for (int i = 0; i < 4; i++) CHECK_EQ(async_memset(0, sa, dst, 0x40 + i, N), C_SUCCESS);
  CHECK_EQ(g_if.record_event(&D0, sa, e), C_SUCCESS);
  CHECK_EQ(g_if.stream_wait_event(&D1, s1, e), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_p2p(&D1, &D0, s1, out, dst, N), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D1, s1), C_SUCCESS);
  CHECK_EQ(out[N / 2], 0x43);
  /* destroying an event that a stream still waits on is safe */
  for (int i = 0; i < 6; i++) CHECK_EQ(async_memset(0, sa, dst, 0x50 + i, N), C_SUCCESS);
  CHECK_EQ(g_if.record_event(&D0, sa, e), C_SUCCESS);
  CHECK_EQ(g_if.stream_wait_event(&D0, sb, e), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_d2h(&D0, sb, out, dst, N), C_SUCCESS);
  CHECK_EQ(g_if.destroy_event(&D0, e), C_SUCCESS);
  CHECK_EQ(g_if.query_event(&D0, e), C_ERROR);
  CHECK_EQ(g_if.synchronize_stream(&D0, sb), C_SUCCESS);
  CHECK_EQ(out[7], 0x55);
  /* synchronize_device waits for every stream of the device */
  for (int i = 0; i < 5; i++) CHECK_EQ(async_memset(0, sa, dst, 0x60 + i, N), C_SUCCESS);
  for (int i = 0; i < 5; i++) CHECK_EQ(async_memset(0, sb, out, 0x70 + i, N), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_device(&D0), C_SUCCESS);
  CHECK_EQ(g_if.query_stream(&D0, sa), C_SUCCESS);
  CHECK_EQ(g_if.query_stream(&D0, sb), C_SUCCESS);
  CHECK_EQ(dst[1], 0x64);
  CHECK_EQ(out[1], 0x74);
  /* calls from a callback on its own stream are refused instead of deadlocking */
  self_call sc = {sa, C_SUCCESS, C_SUCCESS, C_SUCCESS};
  CHECK_EQ(g_if.stream_add_callback(&D0, sa, self_sync_cb, &sc), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D0, sa), C_SUCCESS);
  CHECK_EQ(sc.sync_status, C_ERROR);
  CHECK_EQ(sc.destroy_status, C_ERROR);
  CHECK_EQ(sc.dev_sync_status, C_ERROR);
  CHECK_EQ(g_if.query_stream(&D0, sa), C_SUCCESS);

  CHECK_EQ(g_if.destroy_event(&D0, never), C_SUCCESS);
  CHECK_EQ(g_if.destroy_stream(&D0, sa), C_SUCCESS);
  CHECK_EQ(g_if.destroy_stream(&D0, sb), C_SUCCESS);
  CHECK_EQ(g_if.destroy_stream(&D1, s1), C_SUCCESS);
  free(src);
  free(dst);
  free(out);
  end();
}

static void test_blas(void) {
  begin();
  float xf[5] = {1, 2, 3, 4, 5}, yf[5] = {10, 20, 30, 40, 50};
  double xd[3] = {1.5, -2, 0.25}, yd[3] = {4, 8, 16};
  CHECK_EQ(g_if.blas_axpby(&D0, NULL, FLOAT32, 5, 2.0f, xf, 0.5f, yf), C_SUCCESS);
  for (int i = 0; i < 5; i++) CHECK(yf[i] == 2.0f * (i + 1) + 0.5f * 10 * (i + 1));
  C_Stream s = NULL;
  CHECK_EQ(g_if.create_stream(&D0, &s), C_SUCCESS);
  CHECK_EQ(g_if.blas_axpby(&D0, s, FLOAT64, 3, -1.0f, xd, 2.0f, yd), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D0, s), C_SUCCESS);
  CHECK(yd[0] == 6.5 && yd[1] == 18 && yd[2] == 31.75);
  int xi[2] = {1, 2}, yi[2] = {3, 4};
  CHECK_EQ(g_if.blas_axpby(&D0, s, INT32, 2, 1.0f, xi, 1.0f, yi), C_ERROR);
  CHECK_EQ(g_if.blas_axpby(&D0, s, FLOAT16, 2, 1.0f, xi, 1.0f, yi), C_ERROR);
  CHECK_EQ(g_if.blas_axpby(&D0, s, FLOAT32, 2, 1.0f, NULL, 1.0f, yi), C_ERROR);
  CHECK(yi[0] == 3 && yi[1] == 4);
  CHECK_EQ(g_if.destroy_stream(&D0, s), C_SUCCESS);
  end();
}

static void test_refcount(void) {
  CHECK_EQ(init_refcount(), 0);
  CHECK_EQ(g_if.finalize(), C_ERROR);
  CHECK_EQ(g_if.initialize(), C_SUCCESS);
  CHECK_EQ(g_if.initialize(), C_SUCCESS); /* a second host in the same process */
  CHECK_EQ(init_refcount(), 2);
  void* p = NULL;
  C_Stream s = NULL;
  C_Event e = NULL;
  CHECK_EQ(g_if.device_memory_allocate(&D0, &p, 1000), C_SUCCESS);
  CHECK_EQ(g_if.create_stream(&D0, &s), C_SUCCESS);
  CHECK_EQ(g_if.create_event(&D0, &e), C_SUCCESS);
  CHECK_EQ(g_if.finalize(), C_SUCCESS); /* first host leaves: nothing is torn down */
  CHECK_EQ(init_refcount(), 1);
  CHECK_EQ(live_bytes(0), 1000);
  CHECK_EQ(g_if.record_event(&D0, s, e), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_event(&D0, e), C_SUCCESS);
  CHECK_EQ(g_if.query_stream(&D0, s), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_set(&D0, p, 3, 1000), C_SUCCESS);
  CHECK_EQ(g_if.finalize(), C_SUCCESS); /* last host leaves: everything released */
  CHECK_EQ(init_refcount(), 0);
  CHECK_EQ(live_bytes(0), 0);
  CHECK_EQ(live_count(0), 0);
  CHECK_EQ(live_streams(), 0);
  CHECK_EQ(live_events(), 0);
  CHECK_EQ(g_if.query_stream(&D0, s), C_ERROR);
  CHECK_EQ(g_if.query_event(&D0, e), C_ERROR);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, p, 1000), C_ERROR);
  CHECK_EQ(g_if.finalize(), C_ERROR);
  /* and it can start again */
  CHECK_EQ(g_if.initialize(), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &p, 1000), C_SUCCESS);
  CHECK_EQ(g_if.device_memory_deallocate(&D0, p, 1000), C_SUCCESS);
  end();
}

static void test_profiler(void) {
  begin();
  void* ud = NULL;
  C_Profiler prof = (C_Profiler)0x1234;
  CHECK_EQ(g_if.profiler_initialize(prof, NULL), C_ERROR);
  CHECK_EQ(g_if.profiler_initialize(prof, &ud), C_SUCCESS);
  CHECK(ud != NULL);
  int before = atomic_load(&g_trace_events);
  CHECK_EQ(g_if.profiler_collect_trace_data(prof, 0, ud), C_SUCCESS); /* nothing traced yet: no record */
  CHECK_EQ(atomic_load(&g_trace_events), before);
  CHECK_EQ(g_if.profiler_stop_tracing(prof, ud), C_ERROR); /* not started */
  CHECK_EQ(g_if.profiler_prepare_tracing(prof, ud), C_SUCCESS);
  CHECK_EQ(g_if.profiler_start_tracing(prof, ud), C_SUCCESS);
  CHECK_EQ(g_if.profiler_start_tracing(prof, ud), C_ERROR); /* already running */
  C_Stream s = NULL;
  char a[64], b[64];
  CHECK_EQ(g_if.create_stream(&D0, &s), C_SUCCESS);
  CHECK_EQ(g_if.async_memory_copy_h2d(&D0, s, a, b, sizeof(a)), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&D0, s), C_SUCCESS);
  CHECK_EQ(g_if.profiler_stop_tracing(prof, ud), C_SUCCESS);
  CHECK_EQ(g_if.profiler_collect_trace_data(prof, 1, ud), C_SUCCESS);
  CHECK_EQ(atomic_load(&g_trace_events), before + 1);
  CHECK(strcmp(g_trace_name, "rt_cpu::tracing") == 0);
  int garbage[8];
  CHECK_EQ(g_if.profiler_start_tracing(prof, garbage), C_ERROR);
  CHECK_EQ(g_if.profiler_collect_trace_data(prof, 0, garbage), C_ERROR);
  CHECK_EQ(g_if.profiler_finalize(prof, garbage), C_ERROR);
  CHECK_EQ(g_if.profiler_finalize(prof, ud), C_SUCCESS);
  CHECK_EQ(g_if.profiler_finalize(prof, ud), C_ERROR);
  /* a session left open is freed by finalize */
  CHECK_EQ(g_if.profiler_initialize(prof, &ud), C_SUCCESS);
  CHECK_EQ(g_if.destroy_stream(&D0, s), C_SUCCESS);
  end();
}

/* many threads using streams, events and memory at once */
typedef struct {
  int id;
  int failures;
} stress_arg;

static void* stress_thread(void* argp) {
  stress_arg* arg = argp;
  struct C_Device_st dev = {arg->id % 2};
  g_if.set_device(&dev);
  for (int round = 0; round < 20; round++) {
    C_Stream s = NULL;
    C_Event e = NULL;
    void* p = NULL;
    size_t n = 1024 + 64 * (size_t)arg->id + (size_t)round;
    unsigned char host[2048];
    if (g_if.create_stream(&dev, &s) != C_SUCCESS) arg->failures++;
    if (g_if.create_event(&dev, &e) != C_SUCCESS) arg->failures++;
    if (g_if.device_memory_allocate(&dev, &p, n) != C_SUCCESS) {
      arg->failures++;
      continue;
    }
    async_memset(dev.id, s, p, arg->id, n);
    g_if.record_event(&dev, s, e);
    g_if.async_memory_copy_d2h(&dev, s, host, p, n);
    if (g_if.synchronize_event(&dev, e) != C_SUCCESS) arg->failures++;
    if (g_if.synchronize_stream(&dev, s) != C_SUCCESS) arg->failures++;
    if (host[n - 1] != (unsigned char)arg->id) arg->failures++;
    if (g_if.destroy_event(&dev, e) != C_SUCCESS) arg->failures++;
    if (g_if.destroy_stream(&dev, s) != C_SUCCESS) arg->failures++;
    if (g_if.device_memory_deallocate(&dev, p, n) != C_SUCCESS) arg->failures++;
  }
  return NULL;
}

static void test_threads(void) {
  begin();
  enum { T = 6 };
  pthread_t th[T];
  stress_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (stress_arg){i, 0};
    pthread_create(&th[i], NULL, stress_thread, &args[i]);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    CHECK_EQ(args[i].failures, 0);
  }
  end();
}

/* expects RT_CPU_MAX_STREAMS=2 */
static void test_max_streams(void) {
  begin();
  C_Stream s[3] = {NULL, NULL, NULL};
  CHECK_EQ(g_if.create_stream(&D0, &s[0]), C_SUCCESS);
  CHECK_EQ(g_if.create_stream(&D0, &s[1]), C_SUCCESS);
  CHECK_EQ(g_if.create_stream(&D0, &s[2]), C_FAILED);
  CHECK(s[2] == NULL);
  CHECK_EQ(g_if.create_stream(&D1, &s[2]), C_SUCCESS);
  CHECK_EQ(g_if.destroy_stream(&D0, s[0]), C_SUCCESS);
  CHECK_EQ(g_if.create_stream(&D0, &s[0]), C_SUCCESS);
  end();
}

/* ================================================================================================= main */

typedef struct {
  const char* name;
  void (*fn)(void);
  int in_all;
} test_entry;

static const test_entry TESTS[] = {
    {"handshake", test_handshake, 1}, {"devices", test_devices, 1},   {"memory", test_memory, 1},
    {"handles", test_handles, 1},     {"refcount", test_refcount, 1}, {"stream_order", test_stream_order, 1},
    {"events", test_events, 1},       {"blas", test_blas, 1},         {"profiler", test_profiler, 1},
    {"threads", test_threads, 1},     {"capacity", test_capacity, 0}, {"fail_every", test_fail_every, 0},
    {"fail_after", test_fail_after, 0}, {"max_streams", test_max_streams, 0},
};

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <librt_cpu.so> <test>... | all\n", argv[0]);
    return 2;
  }
  load(argv[1]);
  for (int i = 2; i < argc; i++) {
    int found = 0;
    for (size_t k = 0; k < sizeof(TESTS) / sizeof(TESTS[0]); k++) {
      if (strcmp(argv[i], TESTS[k].name) == 0 || (strcmp(argv[i], "all") == 0 && TESTS[k].in_all)) {
        int before = g_failures;
        TESTS[k].fn();
        printf("%s: %s\n", TESTS[k].name, g_failures == before ? "ok" : "FAILED");
        found = 1;
      }
    }
    if (!found) {
      fprintf(stderr, "unknown test %s\n", argv[i]);
      return 2;
    }
  }
  fflush(stdout);
  /* the plugin stays loaded (like Paddle, hosts never unload plugins) */
  return g_failures ? 1 : 0;
}
