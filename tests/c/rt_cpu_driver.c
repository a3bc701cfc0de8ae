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
#include <math.h>

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
  size_t calls_before = alloc_calls(0);
  CHECK_EQ(g_if.device_memory_allocate(&D0, &p, 64), C_ERROR);
  CHECK_EQ(alloc_calls(0), calls_before + 1); /* counted whatever the outcome */
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
  size_t (*prof_count)(int) = (size_t(*)(int))dlsym(g_lib, "rt_cpu_profiler_count");
  CHECK(prof_count && prof_count(0) >= 1 && prof_count(1) >= 2);
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


/* ================================================================================================= collectives */

static int g_nranks;

static size_t dt_size(C_DataType t) {
  switch (t) {
    case BOOL: case UINT8: case INT8: return 1;
    case UINT16: case INT16: case FLOAT16: case BFLOAT16: return 2;
    case UINT32: case INT32: case FLOAT32: return 4;
    default: return 8;
  }
}

static int dt_signed(C_DataType t) { return t == INT8 || t == INT16 || t == INT32 || t == INT64; }
static int dt_float(C_DataType t) { return t == FLOAT16 || t == BFLOAT16 || t == FLOAT32 || t == FLOAT64; }

static void dt_store(C_DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case BOOL: case UINT8: ((uint8_t*)buf)[i] = (uint8_t)(long long)v; break;
    case INT8: ((int8_t*)buf)[i] = (int8_t)(long long)v; break;
    case UINT16: ((uint16_t*)buf)[i] = (uint16_t)(long long)v; break;
    case INT16: ((int16_t*)buf)[i] = (int16_t)(long long)v; break;
    case UINT32: ((uint32_t*)buf)[i] = (uint32_t)(long long)v; break;
    case INT32: ((int32_t*)buf)[i] = (int32_t)(long long)v; break;
    case UINT64: ((uint64_t*)buf)[i] = (uint64_t)(long long)v; break;
    case INT64: ((int64_t*)buf)[i] = (int64_t)(long long)v; break;
    case FLOAT16: ((_Float16*)buf)[i] = (_Float16)v; break;
    case BFLOAT16: {
      float f = (float)v;
      uint32_t bits;
      memcpy(&bits, &f, 4);
      ((uint16_t*)buf)[i] = (uint16_t)(bits >> 16); /* test values are exact in bfloat16 */
      break;
    }
    case FLOAT32: ((float*)buf)[i] = (float)v; break;
    case FLOAT64: ((double*)buf)[i] = v; break;
    default: break;
  }
}

static double dt_load(C_DataType t, const void* buf, size_t i) {
  switch (t) {
    case BOOL: case UINT8: return ((const uint8_t*)buf)[i];
    case INT8: return ((const int8_t*)buf)[i];
    case UINT16: return ((const uint16_t*)buf)[i];
    case INT16: return ((const int16_t*)buf)[i];
    case UINT32: return ((const uint32_t*)buf)[i];
    case INT32: return ((const int32_t*)buf)[i];
    case UINT64: return (double)((const uint64_t*)buf)[i];
    case INT64: return (double)((const int64_t*)buf)[i];
    case FLOAT16: return (double)((const _Float16*)buf)[i];
    case BFLOAT16: {
      uint32_t bits = (uint32_t)((const uint16_t*)buf)[i] << 16;
      float f;
      memcpy(&f, &bits, 4);
      return f;
    }
    case FLOAT32: return ((const float*)buf)[i];
    case FLOAT64: return ((const double*)buf)[i];
    default: return 0;
  }
}

/* value of element i on rank r */
static double ccl_value(C_DataType t, int r, size_t i) {
  double v = (double)((r + (int)i) % 3 + 1);
  if (dt_signed(t) && (i % 2)) v = -v;
  if (dt_float(t) && (i % 4 == 3)) v = v / 4; /* exact in every float type */
  return v;
}

static double ccl_expected(C_DataType t, C_CCLReduceOp op, int n, size_t i) {
  double acc = ccl_value(t, 0, i);
  for (int r = 1; r < n; r++) {
    double v = ccl_value(t, r, i);
    switch (op) {
      case SUM: case AVG: acc += v; break;
      case PRODUCT: acc *= v; break;
      case MAX: if (v > acc) acc = v; break;
      case MIN: if (v < acc) acc = v; break;
    }
  }
  if (op == AVG) acc = dt_float(t) ? acc / n : (double)((long long)acc / n); /* integers truncate */
  return acc;
}

static int close_enough(C_DataType t, double got, double want) {
  if (!dt_float(t)) return got == want;
  double tol = (t == FLOAT16 || t == BFLOAT16) ? 1e-2 : 1e-6;
  return fabs(got - want) <= tol * (1 + fabs(want));
}

typedef struct {
  C_CCLComm comm[64];
  C_Stream stream[64];
  struct C_Device_st dev[64];
} ccl_world;

static void ccl_init_world(ccl_world* w, int with_streams) {
  size_t idsz = 0;
  CHECK_EQ(g_if.xccl_get_unique_id_size(&idsz), C_SUCCESS);
  CHECK(idsz >= 16 && idsz <= 4096);
  unsigned char* idbuf = calloc(1, idsz);
  C_CCLRootId id = {idsz, idbuf};
  CHECK_EQ(g_if.xccl_get_unique_id(&id), C_SUCCESS);
  /* InfiniCCL's comm_init_all: every rank initialised from this one thread, one after another */
  for (int r = 0; r < g_nranks; r++) {
    w->dev[r].id = r;
    CHECK_EQ(g_if.set_device(&w->dev[r]), C_SUCCESS);
    w->comm[r] = NULL;
    CHECK_EQ(g_if.xccl_comm_init_rank((size_t)g_nranks, &id, (size_t)r, &w->comm[r]), C_SUCCESS);
    CHECK(w->comm[r] != NULL);
    w->stream[r] = NULL;
    if (with_streams) CHECK_EQ(g_if.create_stream(&w->dev[r], &w->stream[r]), C_SUCCESS);
  }
  g_if.set_device(&D0);
  /* a rank taken twice, or a different nranks, is refused */
  C_CCLComm extra = NULL;
  CHECK_EQ(g_if.xccl_comm_init_rank((size_t)g_nranks, &id, 0, &extra), C_ERROR);
  CHECK_EQ(g_if.xccl_comm_init_rank((size_t)g_nranks + 1, &id, (size_t)g_nranks, &extra), C_ERROR);
  CHECK_EQ(g_if.xccl_comm_init_rank((size_t)g_nranks, &id, (size_t)g_nranks, &extra), C_ERROR);
  CHECK(extra == NULL);
  free(idbuf);
}

static void ccl_sync_world(ccl_world* w) {
  for (int r = 0; r < g_nranks; r++)
    if (w->stream[r]) CHECK_EQ(g_if.synchronize_stream(&w->dev[r], w->stream[r]), C_SUCCESS);
}

static void ccl_free_world(ccl_world* w) {
  for (int r = 0; r < g_nranks; r++) {
    CHECK_EQ(g_if.xccl_destroy_comm(w->comm[r]), C_SUCCESS);
    if (w->stream[r]) CHECK_EQ(g_if.destroy_stream(&w->dev[r], w->stream[r]), C_SUCCESS);
  }
}

static const C_DataType REDUCIBLE[] = {UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64,
                                       FLOAT16, FLOAT32, FLOAT64, BFLOAT16};

static void test_ccl_reductions(void) {
  begin();
  ccl_world w;
  ccl_init_world(&w, 1);
  char name[64] = {0};
  CHECK_EQ(g_if.xccl_get_comm_name(w.comm[0], name), C_SUCCESS);
  CHECK(strncmp(name, "rt_cpu_ccl_", 11) == 0);
  const size_t N = 37;
  int n = g_nranks;
  for (size_t ti = 0; ti < sizeof(REDUCIBLE) / sizeof(REDUCIBLE[0]); ti++) {
    C_DataType t = REDUCIBLE[ti];
    size_t es = dt_size(t);
    for (int op = SUM; op <= PRODUCT; op++) {
      void* send[64];
      void* recv[64];
      void* inplace[64];
      void* red[64];
      void* rs_send[64];
      void* rs_recv[64];
      for (int r = 0; r < n; r++) {
        send[r] = calloc(N, es);
        recv[r] = calloc(N, es);
        inplace[r] = calloc(N, es);
        red[r] = calloc(N, es);
        rs_send[r] = calloc(N * (size_t)n, es);
        rs_recv[r] = calloc(N, es);
        for (size_t i = 0; i < N; i++) {
          dt_store(t, send[r], i, ccl_value(t, r, i));
          dt_store(t, inplace[r], i, ccl_value(t, r, i));
          dt_store(t, red[r], i, -1 * 0 + 99);
        }
        for (int seg = 0; seg < n; seg++)
          for (size_t i = 0; i < N; i++) dt_store(t, rs_send[r], (size_t)seg * N + i, ccl_value(t, r, i + (size_t)seg));
      }
      for (int r = 0; r < n; r++) {
        CHECK_EQ(g_if.xccl_all_reduce(send[r], recv[r], N, t, (C_CCLReduceOp)op, w.comm[r], w.stream[r]), C_SUCCESS);
        CHECK_EQ(g_if.xccl_all_reduce(inplace[r], inplace[r], N, t, (C_CCLReduceOp)op, w.comm[r], w.stream[r]),
                 C_SUCCESS);
        CHECK_EQ(g_if.xccl_reduce(send[r], red[r], N, t, (C_CCLReduceOp)op, (size_t)(n - 1), w.comm[r], w.stream[r]),
                 C_SUCCESS);
        CHECK_EQ(g_if.xccl_reduce_scatter(rs_send[r], rs_recv[r], N, t, (C_CCLReduceOp)op, w.comm[r], w.stream[r]),
                 C_SUCCESS);
      }
      ccl_sync_world(&w);
      int bad = 0;
      for (int r = 0; r < n && !bad; r++) {
        for (size_t i = 0; i < N; i++) {
          double want = ccl_expected(t, (C_CCLReduceOp)op, n, i);
          if (!close_enough(t, dt_load(t, recv[r], i), want) || !close_enough(t, dt_load(t, inplace[r], i), want)) {
            fprintf(stderr, "all_reduce dtype %d op %d rank %d i %zu: got %g / %g want %g\n", (int)t, op, r, i,
                    dt_load(t, recv[r], i), dt_load(t, inplace[r], i), want);
            bad = 1;
            break;
          }
          double want_red = r == n - 1 ? want : 99;
          if (!close_enough(t, dt_load(t, red[r], i), want_red)) {
            fprintf(stderr, "reduce dtype %d op %d rank %d i %zu: got %g want %g\n", (int)t, op, r, i,
                    dt_load(t, red[r], i), want_red);
            bad = 1;
            break;
          }
          double want_rs = ccl_expected(t, (C_CCLReduceOp)op, n, i + (size_t)r);
          if (!close_enough(t, dt_load(t, rs_recv[r], i), want_rs)) {
            fprintf(stderr, "reduce_scatter dtype %d op %d rank %d i %zu: got %g want %g\n", (int)t, op, r, i,
                    dt_load(t, rs_recv[r], i), want_rs);
            bad = 1;
            break;
          }
        }
      }
      CHECK(!bad);
      for (int r = 0; r < n; r++) {
        free(send[r]);
        free(recv[r]);
        free(inplace[r]);
        free(red[r]);
        free(rs_send[r]);
        free(rs_recv[r]);
      }
    }
  }
  /* refused: complex, bool and undefined reductions, bad op, bad root, NULL buffers, unknown communicator */
  float fb[4] = {0};
  CHECK_EQ(g_if.xccl_all_reduce(fb, fb, 2, COMPLEX64, SUM, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_all_reduce(fb, fb, 2, COMPLEX128, SUM, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_all_reduce(fb, fb, 2, BOOL, SUM, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_all_reduce(fb, fb, 2, UNDEFINED, SUM, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_all_reduce(fb, fb, 2, FLOAT32, (C_CCLReduceOp)7, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_broadcast(fb, 2, COMPLEX64, 0, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_broadcast(fb, 2, FLOAT32, (size_t)n, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_reduce(fb, fb, 2, FLOAT32, SUM, (size_t)n, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_all_reduce(NULL, fb, 2, FLOAT32, SUM, w.comm[0], w.stream[0]), C_ERROR);
  CHECK_EQ(g_if.xccl_send(fb, 2, FLOAT32, (size_t)n, w.comm[0], w.stream[0]), C_ERROR);
  long long garbage[8] = {0};
  CHECK_EQ(g_if.xccl_all_reduce(fb, fb, 2, FLOAT32, SUM, (C_CCLComm)garbage, NULL), C_ERROR);
  CHECK_EQ(g_if.xccl_destroy_comm((C_CCLComm)garbage), C_ERROR);
  CHECK_EQ(g_if.xccl_get_comm_name((C_CCLComm)garbage, name), C_ERROR);
  if (n > 1) /* a stream of another device */
    CHECK_EQ(g_if.xccl_all_reduce(fb, fb, 2, FLOAT32, SUM, w.comm[0], w.stream[1]), C_ERROR);
  /* the refusals consumed no sequence numbers: a further all_reduce still matches */
  float v[64];
  for (int r = 0; r < n; r++) {
    v[r] = (float)(r + 1);
    CHECK_EQ(g_if.xccl_all_reduce(&v[r], &v[r], 1, FLOAT32, SUM, w.comm[r], w.stream[r]), C_SUCCESS);
  }
  ccl_sync_world(&w);
  for (int r = 0; r < n; r++) CHECK(v[r] == (float)(n * (n + 1) / 2));
  ccl_free_world(&w);
  CHECK_EQ(g_if.xccl_destroy_comm(w.comm[0]), C_ERROR);
  /* ids: too small a buffer, foreign id */
  unsigned char small[4];
  C_CCLRootId sid = {sizeof(small), small};
  CHECK_EQ(g_if.xccl_get_unique_id(&sid), C_ERROR);
  unsigned char fake[64];
  memset(fake, 0x5a, sizeof(fake));
  C_CCLRootId fid = {sizeof(fake), fake};
  C_CCLComm fc = NULL;
  CHECK_EQ(g_if.xccl_comm_init_rank(2, &fid, 0, &fc), C_ERROR);
  end();
}

static void test_ccl_data_movement(void) {
  begin();
  ccl_world w;
  ccl_init_world(&w, 1);
  int n = g_nranks;
  const size_t N = 1000;
  int32_t* bc[64];
  int32_t* ag_send[64];
  int32_t* ag_recv[64];
  uint8_t* bools[64];
  for (int r = 0; r < n; r++) {
    bc[r] = calloc(N, 4);
    ag_send[r] = calloc(N, 4);
    ag_recv[r] = calloc(N * (size_t)n, 4);
    bools[r] = calloc(N, 1);
    for (size_t i = 0; i < N; i++) {
      bc[r][i] = r == 1 % n ? (int32_t)(i * 3 + 7) : -1;
      ag_send[r][i] = (int32_t)(r * 100000 + (int)i);
      bools[r][i] = r == 0 ? (uint8_t)(i % 2) : 7;
    }
  }
  for (int r = 0; r < n; r++) {
    CHECK_EQ(g_if.xccl_broadcast(bc[r], N, INT32, (size_t)(1 % n), w.comm[r], w.stream[r]), C_SUCCESS);
    CHECK_EQ(g_if.xccl_all_gather(ag_send[r], ag_recv[r], N, INT32, w.comm[r], w.stream[r]), C_SUCCESS);
    CHECK_EQ(g_if.xccl_broadcast(bools[r], N, BOOL, 0, w.comm[r], w.stream[r]), C_SUCCESS);
  }
  ccl_sync_world(&w);
  for (int r = 0; r < n; r++) {
    int ok = 1;
    for (size_t i = 0; i < N; i++) {
      if (bc[r][i] != (int32_t)(i * 3 + 7) || bools[r][i] != (uint8_t)(i % 2)) ok = 0;
      for (int k = 0; k < n; k++)
        if (ag_recv[r][(size_t)k * N + i] != (int32_t)(k * 100000 + (int)i)) ok = 0;
    }
    CHECK(ok);
  }
  /* send/recv ring inside a group, from this one thread (every rank sends right and receives from the left) */
  double* sbuf[64];
  double* rbuf[64];
  for (int r = 0; r < n; r++) {
    sbuf[r] = malloc(N * sizeof(double));
    rbuf[r] = calloc(N, sizeof(double));
    for (size_t i = 0; i < N; i++) sbuf[r][i] = r * 1000.0 + (double)i;
  }
  CHECK_EQ(g_if.xccl_group_start(), C_SUCCESS);
  for (int r = 0; r < n; r++) {
    CHECK_EQ(g_if.xccl_send(sbuf[r], N, FLOAT64, (size_t)((r + 1) % n), w.comm[r], w.stream[r]), C_SUCCESS);
    CHECK_EQ(g_if.xccl_recv(rbuf[r], N, FLOAT64, (size_t)((r + n - 1) % n), w.comm[r], w.stream[r]), C_SUCCESS);
  }
  CHECK_EQ(g_if.xccl_group_end(), C_SUCCESS);
  ccl_sync_world(&w);
  for (int r = 0; r < n; r++) {
    int left = (r + n - 1) % n;
    CHECK(rbuf[r][0] == left * 1000.0 && rbuf[r][N - 1] == left * 1000.0 + (double)(N - 1));
  }
  CHECK_EQ(g_if.xccl_group_end(), C_ERROR); /* unbalanced */
  /* all_to_all: rank r sends block (r, k) to k, with per-peer counts */
  {
    int64_t* s2[64];
    int64_t* r2[64];
    for (int r = 0; r < n; r++) {
      s2[r] = calloc((size_t)n * 8, sizeof(int64_t));
      r2[r] = calloc((size_t)n * 8, sizeof(int64_t));
      for (int k = 0; k < n; k++)
        for (int i = 0; i < 8; i++) s2[r][k * 8 + i] = r * 100 + k * 10 + i;
    }
    CHECK_EQ(g_if.xccl_group_start(), C_SUCCESS);
    for (int r = 0; r < n; r++) {
      const void* sp[64];
      void* rp[64];
      size_t sc[64], rc[64];
      C_DataType st[64], rt[64];
      for (int k = 0; k < n; k++) {
        sp[k] = &s2[r][k * 8];
        rp[k] = &r2[r][k * 8];
        sc[k] = (size_t)(1 + (r + k) % 8);  /* r -> k sends 1 + (r+k)%8 elements */
        rc[k] = (size_t)(1 + (k + r) % 8);  /* k -> r receives the same */
        st[k] = rt[k] = INT64;
      }
      CHECK_EQ(g_if.xccl_all_to_all(sp, sc, st, rp, rc, rt, (size_t)r, (size_t)n, w.comm[r], w.stream[r]), C_SUCCESS);
    }
    CHECK_EQ(g_if.xccl_group_end(), C_SUCCESS);
    ccl_sync_world(&w);
    int ok = 1;
    for (int r = 0; r < n; r++)
      for (int k = 0; k < n; k++) {
        int cnt = 1 + (r + k) % 8;
        for (int i = 0; i < 8; i++) {
          int64_t want = i < cnt ? k * 100 + r * 10 + i : 0;
          if (r2[r][k * 8 + i] != want) ok = 0;
        }
      }
    CHECK(ok);
    for (int r = 0; r < n; r++) {
      free(s2[r]);
      free(r2[r]);
    }
  }
  for (int r = 0; r < n; r++) {
    free(bc[r]);
    free(ag_send[r]);
    free(ag_recv[r]);
    free(bools[r]);
    free(sbuf[r]);
    free(rbuf[r]);
  }
  ccl_free_world(&w);
  end();
}

/* ranks as threads, each with its own stream or the NULL stream (synchronous rendezvous) */
typedef struct {
  ccl_world* w;
  int rank;
  int use_stream;
  int failures;
} ccl_thread_arg;

static void* ccl_rank_thread(void* p) {
  ccl_thread_arg* a = p;
  ccl_world* w = a->w;
  int r = a->rank, n = g_nranks;
  C_Stream s = a->use_stream ? w->stream[r] : NULL;
  g_if.set_device(&w->dev[r]);
  for (int round = 0; round < 20; round++) {
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = (float)(r + round + i);
    if (g_if.xccl_all_reduce(x, x, 16, FLOAT32, MAX, w->comm[r], s) != C_SUCCESS) a->failures++;
    /* point to point without a group: even ranks send first, odd ranks receive first */
    float y[4] = {(float)r, (float)r, (float)r, (float)r}, z[4] = {0};
    int peer = r ^ 1;
    if (peer < n) {
      if (r % 2 == 0) {
        if (g_if.xccl_send(y, 4, FLOAT32, (size_t)peer, w->comm[r], s) != C_SUCCESS) a->failures++;
        if (g_if.xccl_recv(z, 4, FLOAT32, (size_t)peer, w->comm[r], s) != C_SUCCESS) a->failures++;
      } else {
        if (g_if.xccl_recv(z, 4, FLOAT32, (size_t)peer, w->comm[r], s) != C_SUCCESS) a->failures++;
        if (g_if.xccl_send(y, 4, FLOAT32, (size_t)peer, w->comm[r], s) != C_SUCCESS) a->failures++;
      }
    }
    if (s && g_if.synchronize_stream(&w->dev[r], s) != C_SUCCESS) a->failures++;
    for (int i = 0; i < 16; i++)
      if (x[i] != (float)(n - 1 + round + i)) {
        a->failures++;
        break;
      }
    if (peer < n && z[3] != (float)peer) a->failures++;
  }
  return NULL;
}

static void test_ccl_threads(void) {
  begin();
  for (int use_stream = 0; use_stream < 2; use_stream++) {
    ccl_world w;
    ccl_init_world(&w, 1);
    pthread_t th[64];
    ccl_thread_arg args[64];
    for (int r = 0; r < g_nranks; r++) {
      args[r] = (ccl_thread_arg){&w, r, use_stream, 0};
      pthread_create(&th[r], NULL, ccl_rank_thread, &args[r]);
    }
    for (int r = 0; r < g_nranks; r++) {
      pthread_join(th[r], NULL);
      CHECK_EQ(args[r].failures, 0);
    }
    ccl_free_world(&w);
  }
  end();
}


/* two communicators over the same devices, each rank a thread issuing its two collectives in opposite order inside
 * a group on the NULL stream: everything in a group is posted before anything is waited for, so no deadlock */
typedef struct {
  ccl_world* x;
  ccl_world* y;
  int rank;
  float vx[8], vy[8];
  C_Status st;
} two_comm_arg;

static void* two_comm_thread(void* p) {
  two_comm_arg* a = p;
  int r = a->rank;
  g_if.set_device(&a->x->dev[r]);
  C_Status st = g_if.xccl_group_start();
  if (r % 2 == 0) {
    if (st == C_SUCCESS) st = g_if.xccl_all_reduce(a->vx, a->vx, 8, FLOAT32, SUM, a->x->comm[r], NULL);
    if (st == C_SUCCESS) st = g_if.xccl_all_reduce(a->vy, a->vy, 8, FLOAT32, MAX, a->y->comm[r], NULL);
  } else {
    if (st == C_SUCCESS) st = g_if.xccl_all_reduce(a->vy, a->vy, 8, FLOAT32, MAX, a->y->comm[r], NULL);
    if (st == C_SUCCESS) st = g_if.xccl_all_reduce(a->vx, a->vx, 8, FLOAT32, SUM, a->x->comm[r], NULL);
  }
  C_Status end_st = g_if.xccl_group_end();
  a->st = st != C_SUCCESS ? st : end_st;
  return NULL;
}

static void test_ccl_two_comms(void) {
  begin();
  int n = g_nranks;
  ccl_world x, y;
  ccl_init_world(&x, 0);
  ccl_init_world(&y, 0);
  pthread_t th[64];
  two_comm_arg* args = calloc((size_t)n, sizeof(*args));
  for (int r = 0; r < n; r++) {
    args[r].x = &x;
    args[r].y = &y;
    args[r].rank = r;
    for (int i = 0; i < 8; i++) {
      args[r].vx[i] = (float)(r + i);
      args[r].vy[i] = (float)(r * i);
    }
    pthread_create(&th[r], NULL, two_comm_thread, &args[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < n; r++) {
    CHECK_EQ(args[r].st, C_SUCCESS);
    for (int i = 0; i < 8; i++) {
      CHECK(args[r].vx[i] == (float)(n * (n - 1) / 2 + n * i));
      CHECK(args[r].vy[i] == (float)((n - 1) * i));
    }
  }
  free(args);
  ccl_free_world(&x);
  ccl_free_world(&y);
  end();
}


/* a thread that exits inside an open group: what it deferred is released (its communicator references too) */
static void* group_exit_thread(void* p) {
  ccl_world* w = p;
  static float v[4];
  g_if.xccl_group_start();
  g_if.xccl_group_start(); /* nested */
  g_if.xccl_all_reduce(v, v, 4, FLOAT32, SUM, w->comm[0], NULL);
  g_if.xccl_send(v, 4, FLOAT32, 0, w->comm[0], NULL);
  g_if.xccl_group_end();
  return NULL; /* still one level open */
}

static void test_ccl_group_exit(void) {
  begin();
  ccl_world w;
  ccl_init_world(&w, 0);
  pthread_t t;
  pthread_create(&t, NULL, group_exit_thread, &w);
  pthread_join(t, NULL);
  ccl_free_world(&w); /* the communicators really die (valgrind: no leak) */
  CHECK_EQ(g_if.xccl_group_end(), C_ERROR); /* this thread has no open group */
  end();
}

/* expects RT_CPU_CCL_TIMEOUT_MS small (e.g. 200) */
static void test_ccl_timeout(void) {
  begin();
  int (*comm_error)(void*) = (int (*)(void*))dlsym(g_lib, "paddle_rt_ext_ccl_comm_error");
  CHECK(comm_error != NULL);
  if (!comm_error || g_nranks < 2) {
    end();
    return;
  }
  ccl_world w;
  ccl_init_world(&w, 1);
  float x[4] = {1, 2, 3, 4};
  /* synchronous: only rank 0 shows up -> C_ERROR after the timeout instead of hanging */
  CHECK_EQ(g_if.xccl_all_reduce(x, x, 4, FLOAT32, SUM, w.comm[0], NULL), C_ERROR);
  CHECK(x[0] == 1 && x[3] == 4);
  CHECK_EQ(comm_error(w.comm[0]), 1);
  CHECK_EQ(g_if.xccl_all_reduce(x, x, 4, FLOAT32, SUM, w.comm[0], NULL), C_ERROR); /* sticky */
  /* asynchronous: rank 1's stream gives up, the stream goes on, the communicator reports the error */
  CHECK_EQ(g_if.xccl_broadcast(x, 4, FLOAT32, 0, w.comm[1], w.stream[1]), C_SUCCESS);
  CHECK_EQ(async_memset(1, w.stream[1], x, 0, sizeof(x)), C_SUCCESS);
  CHECK_EQ(g_if.synchronize_stream(&w.dev[1], w.stream[1]), C_SUCCESS);
  CHECK(x[0] == 0); /* the work after the failed collective ran */
  CHECK_EQ(comm_error(w.comm[1]), 1);
  CHECK_EQ(g_if.xccl_broadcast(x, 4, FLOAT32, 0, w.comm[1], w.stream[1]), C_ERROR);
  CHECK_EQ(comm_error((void*)x), -1);
  ccl_free_world(&w);

  /* mismatched arguments between ranks are an error on both, outputs untouched */
  ccl_init_world(&w, 1);
  float a[8] = {1, 1, 1, 1, 1, 1, 1, 1}, b[8] = {2, 2, 2, 2, 2, 2, 2, 2};
  CHECK_EQ(g_if.xccl_all_reduce(a, a, 8, FLOAT32, SUM, w.comm[0], w.stream[0]), C_SUCCESS);
  CHECK_EQ(g_if.xccl_all_reduce(b, b, 4, FLOAT32, SUM, w.comm[1], w.stream[1]), C_SUCCESS);
  for (int r = 2; r < g_nranks; r++) {
    CHECK_EQ(g_if.xccl_all_reduce(a, a, 8, FLOAT32, SUM, w.comm[r], w.stream[r]), C_SUCCESS);
  }
  ccl_sync_world(&w);
  CHECK(a[0] == 1 && b[0] == 2);
  CHECK_EQ(comm_error(w.comm[0]), 1);
  CHECK_EQ(comm_error(w.comm[1]), 1);
  ccl_free_world(&w);

  /* a communicator destroyed while its collective is still queued, and communicators left for finalize */
  ccl_init_world(&w, 1);
  float c0[2] = {1, 2}, c1[2] = {3, 4};
  CHECK_EQ(g_if.xccl_all_reduce(c0, c0, 2, FLOAT32, SUM, w.comm[0], w.stream[0]), C_SUCCESS);
  CHECK_EQ(g_if.xccl_destroy_comm(w.comm[0]), C_SUCCESS);
  CHECK_EQ(g_if.xccl_all_reduce(c1, c1, 2, FLOAT32, SUM, w.comm[1], w.stream[1]), C_SUCCESS);
  float zeros[64][2];
  memset(zeros, 0, sizeof(zeros));
  for (int r = 2; r < g_nranks; r++)
    CHECK_EQ(g_if.xccl_all_reduce(zeros[r], zeros[r], 2, FLOAT32, SUM, w.comm[r], w.stream[r]), C_SUCCESS);
  ccl_sync_world(&w);
  for (int r = 2; r < g_nranks; r++) CHECK(zeros[r][0] == 4 && zeros[r][1] == 6);
  CHECK(c0[0] == 4 && c1[1] == 6);
  end(); /* frees the remaining communicators and streams */
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
    {"ccl_reductions", test_ccl_reductions, 1}, {"ccl_data_movement", test_ccl_data_movement, 1},
    {"ccl_threads", test_ccl_threads, 1}, {"ccl_two_comms", test_ccl_two_comms, 1},
    {"ccl_group_exit", test_ccl_group_exit, 1},
    {"ccl_timeout", test_ccl_timeout, 0},
};

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <librt_cpu.so> <test>... | all\n", argv[0]);
    return 2;
  }
  load(argv[1]);
  g_nranks = (int)env_size("RT_CPU_DEVICE_COUNT", 2);
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
