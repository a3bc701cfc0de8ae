/*
 * rt_cpu -- paddle_rt's reference plugin: a virtual accelerator whose "device memory" is ordinary host memory.
 *
 * It speaks PaddlePaddle's custom-device C ABI (paddle_rt/device_ext.h) and loads into paddle_rt and into real
 * Paddle (CUSTOM_DEVICE_ROOT). device_type "rt_cpu", sub_device_type "v0.1", ABI version 0.1.1.
 *
 * Environment (read once per process, at the first InitPlugin; a bad value falls back to the default with a
 * message on stderr). Numbers accept an optional K/M/G suffix (powers of 1024) where they are sizes.
 *   RT_CPU_DEVICE_COUNT        number of devices, 1..64 (default 2)
 *   RT_CPU_MEMORY_BYTES        capacity of each device: the sum of the sizes of its live device allocations may not
 *                              exceed it (default: a quarter of physical memory / device count)
 *   RT_CPU_MIN_CHUNK           device_min_chunk_size (default 256); allocations are aligned to 256 bytes, and to
 *                              min_chunk when it is a power of two up to 4096
 *   RT_CPU_EXTRA_PADDING       device_extra_padding_size (default 0)
 *   RT_CPU_FAIL_ALLOC_EVERY=N  every Nth device_memory_allocate call (counted over all devices) fails as out of
 *                              memory (0 = off)
 *   RT_CPU_FAIL_ALLOC_AFTER=N  every device_memory_allocate call after the Nth fails as out of memory (0 = off)
 *   RT_CPU_FAIL_HOST_ALLOC_EVERY=N  every Nth host/unified allocation fails with C_FAILED (0 = off)
 *   RT_CPU_FAULTS=kind:every[:after[:delay_us]],...  fault injection for any kind of call (rt_cpu_faults.c: copies,
 *                              memset, stream/event creation, record_event, synchronize, allocations); also at run
 *                              time through the exported rt_cpu_set_fault / rt_cpu_clear_faults
 *   RT_CPU_OOM_NULL=1          out of memory (capacity or injected) is reported as C_SUCCESS with *ptr = NULL
 *                              instead of C_FAILED
 *   RT_CPU_STREAM_DELAY_US     each stream operation waits this long on the stream's worker before it runs
 *   RT_CPU_MAX_STREAMS=N       at most N live streams per device; create_stream beyond that returns C_FAILED
 *                              (0 = unlimited, the default)
 *   RT_CPU_CCL_TIMEOUT_MS      collective rendezvous timeout (default 30000); a timed-out collective reports
 *                              C_ERROR instead of hanging
 *   RT_CPU_VERBOSE=1           print the configuration on stderr at the first InitPlugin
 *   RT_CPU_FAIL_PROFILER=hook  that profiler hook (initialize, prepare, start, stop, collect or finalize) returns
 *                              C_ERROR and does nothing (read at each call)
 *
 * Semantics worth knowing:
 *   - initialize/finalize are reference-counted; finalize without initialize returns C_ERROR. When the count returns
 *     to 0 every stream is drained and joined, every event and profiler session is freed, every live allocation
 *     (device, pinned host, unified) is released and every handle becomes invalid (C_ERROR).
 *   - Everything that creates a resource (allocation, stream, event) needs the plugin initialised (C_ERROR
 *     otherwise). init_device/deinit_device are optional (devices are usable lazily, like CUDA); deinit_device waits
 *     for the device's streams.
 *   - Allocation of size 0 (device, host or unified) returns C_ERROR. Deallocation checks pointer and size against
 *     the plugin's table: unknown pointer, double free or wrong size returns C_ERROR and changes nothing.
 *   - Unified memory is host memory tracked with pinned host memory (rt_cpu_host_live_bytes); it does not count
 *     against device capacity.
 *   - A stream belongs to the device it was created on: stream calls naming another device return C_ERROR (p2p
 *     copies accept either device). Handles are checked against registries of live streams, events and profiler
 *     sessions: unknown handles return C_ERROR.
 *   - A NULL stream in an asynchronous call means "synchronous": the work runs in the caller's thread at once and
 *     the call returns C_SUCCESS (record_event on NULL completes the event at once, stream_wait_event on NULL waits
 *     for the event in the caller's thread, a callback on NULL runs at once).
 *   - Calling synchronize_stream/destroy_stream on a stream (or synchronize_device/deinit_device on its device)
 *     from that stream's own worker (i.e. inside a callback) returns C_ERROR instead of deadlocking.
 *   - Events are reference-counted: destroying an event that a stream still has to record or wait on is safe; the
 *     handle dies at once, the object when the last queued operation on it has run.
 *   - The profiler hooks keep a per-session state. At collect time, when the host exports
 *     profiler_add_runtime_trace_event (resolved through a weak reference, so the plugin still loads into hosts
 *     that do not, such as real Paddle), one rt_cpu_trace_record (below) describing the traced span is reported;
 *     the pointer is valid only during that call.
 *   - Collectives (xccl_*) across rt_cpu's devices in one process are in rt_cpu_ccl.c (see its header comment).
 *   - fork(): pthread_atfork handlers take the registries' and the devices' locks (and the layers': rt_layer.at_fork)
 *     before the fork and release them after, so a child never finds a lock held by a thread that does not exist in
 *     it. The child's rt_cpu starts with no streams and no memory: the parent's streams (their workers are not in
 *     the child) and allocations are forgotten (not freed: what the child inherited is its own copy-on-write copy,
 *     readable until it exits); freeing one of them, or naming one of those streams, returns C_ERROR. Nothing of the
 *     parent's memory is shared with the child (device memory is private memory, malloc'd or rt_cpu_vmm.c's).
 *
 * Exported helpers (default visibility, not part of the ABI; used by tests and paddle_rt.plugins):
 *   size_t rt_cpu_live_bytes(int device), rt_cpu_live_count(int device)   live device allocations
 *   size_t rt_cpu_alloc_calls(int device)     device_memory_allocate calls seen (failed ones included)
 *   size_t rt_cpu_host_live_bytes(void)       live pinned host + unified bytes
 *   int    rt_cpu_initialize_refcount(void)   initialize calls not yet matched by finalize
 *   size_t rt_cpu_live_streams(void), rt_cpu_live_events(void)
 *   int    rt_cpu_async_memset(int device, void* stream, void* ptr, int value, size_t size)   (C_Status)
 *   size_t rt_cpu_profiler_count(int which)   profiler sessions initialised (0) / collect calls served (1)
 *
 * The virtual-memory extension (paddle_rt/paddle_rt_vmm_ext.h) is in rt_cpu_vmm.c (see its header comment).
 * paddle_rt's optional extensions (paddle_rt/extension.h): paddle_rt_ext_host_addressable (1: device memory is host
 * memory) and paddle_rt_ext_ccl_comm_error (rt_cpu_ccl.c); from paddle_rt/paddle_rt_ccl_ext.h:
 * paddle_rt_ext_ccl_comm_failure and paddle_rt_ext_ccl_comm_init_rank_mpi (ranks in different processes, with MPI as
 * the transport: rt_cpu_mpi.c, MPI loaded at communicator creation; see its header comment).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt_cpu_internal.h"

/* ------------------------------------------------------------------------------------------------------------ */
/* Host functions, resolved weakly.                                                                               */

extern void profiler_add_runtime_trace_event(C_Profiler prof, void* event) __attribute__((weak));
extern void profiler_add_device_trace_event(C_Profiler prof, void* event) __attribute__((weak));

/* What collect_trace_data reports through profiler_add_runtime_trace_event. */
#define RT_CPU_TRACE_MAGIC 0x52544350u /* "RTCP" */
typedef struct {
  uint32_t magic;        /* RT_CPU_TRACE_MAGIC */
  uint32_t version;      /* 1 */
  const char* name;      /* "rt_cpu::tracing" */
  uint64_t start_ns;     /* CLOCK_MONOTONIC, start_tracing */
  uint64_t end_ns;       /* CLOCK_MONOTONIC, stop_tracing (or collect time when still running) */
  uint64_t stream_ops;   /* stream operations completed by rt_cpu's workers in between */
  uint64_t collect_start_ns; /* the start_ns argument of collect_trace_data */
} rt_cpu_trace_record;

/* ------------------------------------------------------------------------------------------------------------ */
/* Small utilities.                                                                                               */

rt_config rt_cfg;

uint64_t rt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

/* A pointer -> size map with linear probing and backward-shift deletion. Not thread-safe: callers lock. */

static size_t ptr_hash(uintptr_t k, size_t mask) {
  uint64_t h = (uint64_t)k;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return (size_t)h & mask;
}

static int ptrmap_grow(ptrmap* m) {
  size_t ncap = m->cap ? m->cap * 2 : 16;
  uintptr_t* nk = calloc(ncap, sizeof(uintptr_t));
  size_t* nv = calloc(ncap, sizeof(size_t));
  if (!nk || !nv) {
    free(nk);
    free(nv);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = ptr_hash(m->keys[i], ncap - 1);
    while (nk[j]) j = (j + 1) & (ncap - 1);
    nk[j] = m->keys[i];
    nv[j] = m->vals[i];
  }
  free(m->keys);
  free(m->vals);
  m->keys = nk;
  m->vals = nv;
  m->cap = ncap;
  return 0;
}

int ptrmap_put(ptrmap* m, const void* key, size_t val) {
  if ((m->count + 1) * 4 > m->cap * 3 && ptrmap_grow(m) != 0) return -1;
  uintptr_t k = (uintptr_t)key;
  size_t j = ptr_hash(k, m->cap - 1);
  while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
  if (!m->keys[j]) m->count++;
  m->keys[j] = k;
  m->vals[j] = val;
  return 0;
}

void* ptrmap_ref(pthread_mutex_t* mu, const ptrmap* m, void* key, size_t refs_offset) {
  if (!key) return NULL;
  pthread_mutex_lock(mu);
  if (!ptrmap_find(m, key, NULL)) key = NULL;
  else atomic_fetch_add((atomic_int*)((char*)key + refs_offset), 1);
  pthread_mutex_unlock(mu);
  return key;
}

void ptrmap_drain(pthread_mutex_t* mu, ptrmap* m, void (*release)(void*)) {
  pthread_mutex_lock(mu);
  ptrmap taken = *m;
  memset(m, 0, sizeof(*m));
  pthread_mutex_unlock(mu);
  for (size_t i = 0; i < taken.cap; i++)
    if (taken.keys[i]) release((void*)taken.keys[i]);
  ptrmap_free(&taken);
}

int ptrmap_unregister(pthread_mutex_t* mu, ptrmap* m, void* key, void (*release)(void*)) {
  if (!key) return C_ERROR;
  pthread_mutex_lock(mu);
  int found = ptrmap_remove(m, key);
  pthread_mutex_unlock(mu);
  if (!found) return C_ERROR;
  release(key);
  return C_SUCCESS;
}

int ptrmap_find(const ptrmap* m, const void* key, size_t* val) {
  if (!m->cap || !key) return 0;
  uintptr_t k = (uintptr_t)key;
  size_t j = ptr_hash(k, m->cap - 1);
  while (m->keys[j]) {
    if (m->keys[j] == k) {
      if (val) *val = m->vals[j];
      return 1;
    }
    j = (j + 1) & (m->cap - 1);
  }
  return 0;
}

int ptrmap_remove(ptrmap* m, const void* key) {
  if (!m->cap || !key) return 0;
  size_t mask = m->cap - 1;
  uintptr_t k = (uintptr_t)key;
  size_t i = ptr_hash(k, mask);
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
  if (!m->keys[i]) return 0;
  /* backward shift */
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!m->keys[j]) break;
    size_t home = ptr_hash(m->keys[j], mask);
    /* move j to i if home is not cyclically in (i, j] */
    int in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!in_range) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->keys[i] = 0;
  m->vals[i] = 0;
  m->count--;
  return 1;
}

void ptrmap_free(ptrmap* m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof(*m));
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Configuration.                                                                                                 */

static int parse_number(const char* s, int allow_suffix, uint64_t* out) {
  if (!s) return -1;
  while (*s == ' ' || *s == '\t') s++;
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  uint64_t mult = 1;
  if (allow_suffix && *end) {
    switch (*end) {
      case 'k': case 'K': mult = 1ull << 10; break;
      case 'm': case 'M': mult = 1ull << 20; break;
      case 'g': case 'G': mult = 1ull << 30; break;
      case 't': case 'T': mult = 1ull << 40; break;
      default: return -1;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
  }
  while (*end == ' ' || *end == '\t') end++;
  if (*end) return -1;
  if (v && mult > UINT64_MAX / v) return -1;
  *out = (uint64_t)v * mult;
  return 0;
}

static uint64_t env_number(const char* name, uint64_t dflt, uint64_t lo, uint64_t hi, int allow_suffix) {
  const char* s = getenv(name);
  if (!s || !*s) return dflt;
  uint64_t v;
  if (parse_number(s, allow_suffix, &v) != 0) {
    fprintf(stderr, "rt_cpu: ignoring %s='%s' (not a number); using the default %" PRIu64 "\n", name, s, dflt);
    return dflt;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "rt_cpu: ignoring %s='%s' (must be in %" PRIu64 "..%" PRIu64 "); using the default %" PRIu64 "\n",
            name, s, lo, hi, dflt);
    return dflt;
  }
  return v;
}

static pthread_once_t g_config_once = PTHREAD_ONCE_INIT;

static void read_config(void) {
  rt_config c;
  memset(&c, 0, sizeof(c));
  c.device_count = (size_t)env_number("RT_CPU_DEVICE_COUNT", 2, 1, RT_CPU_MAX_DEVICES, 0);
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  uint64_t phys = (pages > 0 && page > 0) ? (uint64_t)pages * (uint64_t)page : (8ull << 30);
  uint64_t dflt_mem = phys / 4 / c.device_count;
  if (dflt_mem < (1u << 20)) dflt_mem = 1u << 20;
  c.memory_bytes = (size_t)env_number("RT_CPU_MEMORY_BYTES", dflt_mem, 1, (uint64_t)SIZE_MAX / 2, 1);
  c.min_chunk = (size_t)env_number("RT_CPU_MIN_CHUNK", 256, 1, 1ull << 30, 1);
  c.extra_padding = (size_t)env_number("RT_CPU_EXTRA_PADDING", 0, 0, 1ull << 30, 1);
  c.fail_alloc_every = (size_t)env_number("RT_CPU_FAIL_ALLOC_EVERY", 0, 0, UINT32_MAX, 0);
  c.fail_alloc_after = (size_t)env_number("RT_CPU_FAIL_ALLOC_AFTER", 0, 0, UINT32_MAX, 0);
  c.fail_host_alloc_every = (size_t)env_number("RT_CPU_FAIL_HOST_ALLOC_EVERY", 0, 0, UINT32_MAX, 0);
  c.oom_null = (int)env_number("RT_CPU_OOM_NULL", 0, 0, 1, 0);
  c.stream_delay_us = env_number("RT_CPU_STREAM_DELAY_US", 0, 0, 10000000, 0);
  c.max_streams = (size_t)env_number("RT_CPU_MAX_STREAMS", 0, 0, 1000000, 0);
  c.ccl_timeout_ms = env_number("RT_CPU_CCL_TIMEOUT_MS", 30000, 1, 86400000ull, 0);
  c.verbose = (int)env_number("RT_CPU_VERBOSE", 0, 0, 1, 0);
  size_t align = 256;
  if (c.min_chunk > align && c.min_chunk <= 4096 && (c.min_chunk & (c.min_chunk - 1)) == 0) align = c.min_chunk;
  c.alignment = align;
  rt_cfg = c;
  rt_fault_init(&rt_cfg);
  if (c.verbose) {
    fprintf(stderr,
            "rt_cpu: devices=%zu memory_bytes=%zu min_chunk=%zu extra_padding=%zu fail_alloc_every=%zu "
            "fail_alloc_after=%zu fail_host_alloc_every=%zu oom_null=%d stream_delay_us=%" PRIu64
            " max_streams=%zu ccl_timeout_ms=%" PRIu64 " alignment=%zu\n",
            c.device_count, c.memory_bytes, c.min_chunk, c.extra_padding, c.fail_alloc_every, c.fail_alloc_after,
            c.fail_host_alloc_every, c.oom_null, c.stream_delay_us, c.max_streams, c.ccl_timeout_ms, c.alignment);
  }
}

static void ensure_config(void) { pthread_once(&g_config_once, read_config); }

/* ------------------------------------------------------------------------------------------------------------ */
/* Global state.                                                                                                  */

typedef struct {
  pthread_mutex_t mu;     /* guards allocs, live_bytes, live_count */
  ptrmap allocs;          /* pointer -> size */
  size_t live_bytes;
  size_t live_count;
  atomic_size_t alloc_calls;
  atomic_int inited;      /* init_device seen (informational) */
} rt_device_state;

static rt_device_state g_dev[RT_CPU_MAX_DEVICES];
static pthread_once_t g_state_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER; /* serialises initialize/finalize */
static atomic_int g_refcount;


static pthread_mutex_t g_host_mu = PTHREAD_MUTEX_INITIALIZER;
static ptrmap g_host_allocs; /* pointer -> (size << 1) | is_unified */
static size_t g_host_live_bytes;

/* Registries of live handles. */
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static ptrmap g_streams;  /* rt_stream* -> device */
static ptrmap g_events;   /* rt_event* -> device */
static ptrmap g_sessions; /* rt_prof_session* -> 0 */

static atomic_uint_fast64_t g_ops_done; /* stream operations completed (for the profiler record) */
static atomic_size_t g_prof_sessions;   /* profiler sessions ever initialised */
static atomic_size_t g_prof_collects;   /* collect_trace_data calls on a live session */

static void init_state(void) {
  for (int i = 0; i < RT_CPU_MAX_DEVICES; i++) pthread_mutex_init(&g_dev[i].mu, NULL);
}

int rt_is_initialized(void) { return atomic_load(&g_refcount) > 0; }

/* The layers above the core (rt_cpu_internal.h): registered by their constructors while the library loads, before
 * any hook can run, so the list needs no lock. */
static rt_layer* g_layers;
static rt_layer** g_layers_tail = &g_layers;

void rt_layer_register(rt_layer* l) {
  l->next = NULL;
  *g_layers_tail = l;
  g_layers_tail = &l->next;
}

/* fork(): the core's locks are held across it (after the layers' are taken), released in the parent; in the child
 * they are made anew and the parent's streams and allocations forgotten, then the layers forget theirs. */
/* The devices whose locks fork_prepare holds: those configured (a device id past the count is refused before any
 * lock is taken), not all RT_CPU_MAX_DEVICES (ThreadSanitizer's deadlock detector follows at most 64 locks held by
 * one thread). */
static int g_fork_locked;

static void fork_prepare(void) {
  pthread_once(&g_state_once, init_state);
  for (rt_layer* l = g_layers; l; l = l->next)
    if (l->at_fork) l->at_fork(RT_FORK_PREPARE);
  pthread_mutex_lock(&g_reg_mu);
  pthread_mutex_lock(&g_host_mu);
  g_fork_locked = rt_cfg.device_count <= RT_CPU_MAX_DEVICES ? (int)rt_cfg.device_count : RT_CPU_MAX_DEVICES;
  for (int i = 0; i < g_fork_locked; i++) pthread_mutex_lock(&g_dev[i].mu);
}

static void fork_parent(void) {
  for (int i = g_fork_locked - 1; i >= 0; i--) pthread_mutex_unlock(&g_dev[i].mu);
  pthread_mutex_unlock(&g_host_mu);
  pthread_mutex_unlock(&g_reg_mu);
  for (rt_layer* l = g_layers; l; l = l->next)
    if (l->at_fork) l->at_fork(RT_FORK_PARENT);
}

static void fork_child(void) {
  for (int i = 0; i < RT_CPU_MAX_DEVICES; i++) {
    rt_device_state* ds = &g_dev[i];
    pthread_mutex_init(&ds->mu, NULL);
    ptrmap_free(&ds->allocs);
    ds->live_bytes = 0;
    ds->live_count = 0;
  }
  pthread_mutex_init(&g_host_mu, NULL);
  ptrmap_free(&g_host_allocs);
  g_host_live_bytes = 0;
  pthread_mutex_init(&g_reg_mu, NULL);
  ptrmap_free(&g_streams); /* their worker threads are the parent's */
  pthread_mutex_init(&g_init_mu, NULL);
  for (rt_layer* l = g_layers; l; l = l->next)
    if (l->at_fork) l->at_fork(RT_FORK_CHILD);
}

__attribute__((constructor)) static void fork_register(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

int rt_device_id(const C_Device device) {
  if (!device) return -1;
  int id = device->id;
  if (id < 0 || (size_t)id >= rt_cfg.device_count) return -1;
  return id;
}

static __thread int t_current_device = 0;

int rt_current_device(void) { return t_current_device; }

/* ------------------------------------------------------------------------------------------------------------ */
/* Events.                                                                                                        */

#define RT_EVENT_MAGIC 0x45565431u
typedef struct rt_event {
  uint32_t magic;
  int device;
  atomic_int refs;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded;  /* generation of the latest record */
  uint64_t completed; /* highest generation reached by a worker */
} rt_event;

static rt_event* event_get(C_Event h) { return ptrmap_ref(&g_reg_mu, &g_events, h, offsetof(rt_event, refs)); }

static void event_put(rt_event* e) {
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    e->magic = 0;
    free(e);
  }
}

static void event_complete(rt_event* e, uint64_t gen) {
  pthread_mutex_lock(&e->mu);
  if (gen > e->completed) e->completed = gen;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

static void event_wait_gen(rt_event* e, uint64_t gen) {
  pthread_mutex_lock(&e->mu);
  while (e->completed < gen) pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams.                                                                                                       */

enum { OP_COPY, OP_SET, OP_CALLBACK, OP_RECORD, OP_WAIT, OP_AXPBY, OP_FN };

typedef struct rt_op {
  struct rt_op* next;
  int kind;
  union {
    struct { void* dst; const void* src; size_t size; } copy;
    struct { void* ptr; unsigned char value; size_t size; } set;
    struct { C_Callback cb; void* user_data; } callback;
    struct { rt_event* ev; uint64_t gen; } event;
    struct { C_DataType dtype; size_t numel; float alpha; void* x; float beta; void* y; } axpby;
    struct { void (*fn)(void*); void (*cleanup)(void*); void* arg; } fn;
  } u;
} rt_op;

#define RT_STREAM_MAGIC 0x53545231u
struct rt_stream {
  uint32_t magic;
  int device;
  struct C_Device_st cdev; /* handed to callbacks */
  atomic_int refs;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;
  pthread_cond_t idle_cv;
  rt_op* head;
  rt_op* tail;
  size_t pending; /* queued + running */
  int stopping;
};

static __thread rt_stream* t_worker_stream = NULL; /* set on a stream's own worker thread */

rt_stream* rt_stream_get(C_Stream h) { return ptrmap_ref(&g_reg_mu, &g_streams, h, offsetof(rt_stream, refs)); }

void rt_stream_put(rt_stream* s) {
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->idle_cv);
    s->magic = 0;
    free(s);
  }
}

int rt_stream_device(const rt_stream* s) { return s->device; }

static void op_release(rt_op* op) {
  if (op->kind == OP_RECORD || op->kind == OP_WAIT) event_put(op->u.event.ev);
  if (op->kind == OP_FN && op->u.fn.cleanup) op->u.fn.cleanup(op->u.fn.arg);
  free(op);
}

static void axpby_run(C_DataType dtype, size_t n, float alpha, const void* x, float beta, void* y) {
  if (dtype == FLOAT32) {
    const float* xs = x;
    float* ys = y;
    for (size_t i = 0; i < n; i++) ys[i] = alpha * xs[i] + beta * ys[i];
  } else {
    const double* xs = x;
    double* ys = y;
    double a = alpha, b = beta;
    for (size_t i = 0; i < n; i++) ys[i] = a * xs[i] + b * ys[i];
  }
}

static void op_run(rt_stream* s, rt_op* op) {
  switch (op->kind) {
    case OP_COPY:
      if (op->u.copy.size) memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.size);
      break;
    case OP_SET:
      if (op->u.set.size) memset(op->u.set.ptr, op->u.set.value, op->u.set.size);
      break;
    case OP_CALLBACK: {
      C_Status st = C_SUCCESS;
      op->u.callback.cb(&s->cdev, (C_Stream)s, op->u.callback.user_data, &st);
      break;
    }
    case OP_RECORD:
      event_complete(op->u.event.ev, op->u.event.gen);
      break;
    case OP_WAIT:
      event_wait_gen(op->u.event.ev, op->u.event.gen);
      break;
    case OP_AXPBY:
      axpby_run(op->u.axpby.dtype, op->u.axpby.numel, op->u.axpby.alpha, op->u.axpby.x, op->u.axpby.beta,
                op->u.axpby.y);
      break;
    case OP_FN:
      op->u.fn.fn(op->u.fn.arg);
      break;
  }
}

static void* stream_worker(void* arg) {
  rt_stream* s = arg;
  t_worker_stream = s;
  t_current_device = s->device;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stopping) pthread_cond_wait(&s->work_cv, &s->mu);
    if (!s->head) break; /* stopping and drained */
    rt_op* op = s->head;
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    if (rt_cfg.stream_delay_us) sleep_us(rt_cfg.stream_delay_us);
    if (op->kind == OP_RECORD) {
      /* retire the marker and complete the event under the stream's lock, so that whoever sees the event complete
       * also sees the stream past it and vice versa (lock order: stream, then event) */
      atomic_fetch_add(&g_ops_done, 1);
      pthread_mutex_lock(&s->mu);
      op_run(s, op);
      if (--s->pending == 0) pthread_cond_broadcast(&s->idle_cv);
      pthread_mutex_unlock(&s->mu);
      op_release(op);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    op_run(s, op);
    op_release(op);
    atomic_fetch_add(&g_ops_done, 1);
    pthread_mutex_lock(&s->mu);
    if (--s->pending == 0) pthread_cond_broadcast(&s->idle_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Takes ownership of op (released on failure). */
static C_Status stream_enqueue(rt_stream* s, rt_op* op) {
  op->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->stopping) {
    pthread_mutex_unlock(&s->mu);
    op_release(op);
    return C_ERROR;
  }
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  s->pending++;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return C_SUCCESS;
}

/* A heap copy of the op template tmpl (NULL when out of memory). */
static rt_op* op_dup(const rt_op* tmpl) {
  rt_op* op = malloc(sizeof(*op));
  if (op) *op = *tmpl;
  return op;
}

/* Enqueues a copy of tmpl on s, then drops the caller's reference to s. */
static C_Status stream_enqueue_put(rt_stream* s, const rt_op* tmpl) {
  rt_op* op = op_dup(tmpl);
  C_Status st = op ? stream_enqueue(s, op) : C_FAILED;
  rt_stream_put(s);
  return st;
}

C_Status rt_stream_enqueue_fn(rt_stream* s, void (*fn)(void*), void (*cleanup)(void*), void* arg) {
  rt_op* op = op_dup(&(rt_op){.kind = OP_FN, .u.fn = {fn, cleanup, arg}});
  if (!op) return C_FAILED;
  return stream_enqueue(s, op);
}

/* Waits until the stream is idle. */
static void stream_drain(rt_stream* s) {
  pthread_mutex_lock(&s->mu);
  while (s->pending) pthread_cond_wait(&s->idle_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* Stops and joins the worker (after draining) and drops the registry's reference. The stream must already be out
 * of the registry. */
static void stream_shutdown(rt_stream* s) {
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  rt_stream_put(s);
}

/* Looks a stream up for an operation on `dev`: NULL handle -> *out = NULL, C_SUCCESS (synchronous);
 * unknown handle or another device -> C_ERROR. */
static C_Status stream_lookup(int dev, C_Stream h, rt_stream** out) {
  *out = NULL;
  if (!h) return C_SUCCESS;
  rt_stream* s = rt_stream_get(h);
  if (!s) return C_ERROR;
  if (dev >= 0 && s->device != dev) {
    rt_stream_put(s);
    return C_ERROR;
  }
  *out = s;
  return C_SUCCESS;
}

/* References to every live stream of a device (all devices when dev < 0). Returns the count, -1 on OOM. */
static long collect_streams(int dev, rt_stream*** out) {
  pthread_mutex_lock(&g_reg_mu);
  size_t n = 0;
  rt_stream** arr = calloc(g_streams.count ? g_streams.count : 1, sizeof(*arr));
  if (!arr) {
    pthread_mutex_unlock(&g_reg_mu);
    return -1;
  }
  for (size_t i = 0; i < g_streams.cap; i++) {
    if (!g_streams.keys[i]) continue;
    rt_stream* s = (rt_stream*)g_streams.keys[i];
    if (dev >= 0 && s->device != dev) continue;
    atomic_fetch_add(&s->refs, 1);
    arr[n++] = s;
  }
  pthread_mutex_unlock(&g_reg_mu);
  *out = arr;
  return (long)n;
}

static C_Status sync_device_streams(int dev) {
  rt_stream** arr;
  long n = collect_streams(dev, &arr);
  if (n < 0) return C_INTERNAL_ERROR;
  C_Status st = C_SUCCESS;
  for (long i = 0; i < n; i++)
    if (arr[i] == t_worker_stream) st = C_ERROR;
  for (long i = 0; i < n; i++) {
    if (st == C_SUCCESS) stream_drain(arr[i]);
    rt_stream_put(arr[i]);
  }
  free(arr);
  return st;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Profiler sessions.                                                                                             */

enum { PROF_CREATED, PROF_PREPARED, PROF_RUNNING, PROF_STOPPED };
typedef struct {
  int state;
  uint64_t start_ns, stop_ns;
  uint64_t ops_at_start, ops_at_stop;
  uint64_t collected;
} rt_prof_session;

/* ------------------------------------------------------------------------------------------------------------ */
/* Device management hooks.                                                                                       */

#define DEV_OR_ERROR(device, var)      \
  int var = rt_device_id(device);      \
  if (var < 0) return C_ERROR

static C_Status h_initialize(void) {
  ensure_config();
  pthread_once(&g_state_once, init_state);
  pthread_mutex_lock(&g_init_mu);
  atomic_fetch_add(&g_refcount, 1);
  pthread_mutex_unlock(&g_init_mu);
  return C_SUCCESS;
}

static void release_stream(void* s) { stream_shutdown(s); }
static void release_event(void* e) { event_put(e); }

static void teardown_all(void) {
  /* streams first (their queued collectives hold communicator references), then the communicators */
  /* streams: out of the registry first (the registry's references become ours), then drained and joined */
  ptrmap_drain(&g_reg_mu, &g_streams, release_stream);

  for (rt_layer* l = g_layers; l; l = l->next) /* the layers above (collectives: their communicators) */
    if (l->teardown) l->teardown();

  /* events and profiler sessions */
  ptrmap_drain(&g_reg_mu, &g_events, release_event);
  ptrmap_drain(&g_reg_mu, &g_sessions, free);

  /* memory */
  for (size_t d = 0; d < rt_cfg.device_count; d++) {
    rt_device_state* ds = &g_dev[d];
    pthread_mutex_lock(&ds->mu);
    for (size_t i = 0; i < ds->allocs.cap; i++)
      if (ds->allocs.keys[i]) free((void*)ds->allocs.keys[i]);
    ptrmap_free(&ds->allocs);
    ds->live_bytes = 0;
    ds->live_count = 0;
    atomic_store(&ds->inited, 0);
    pthread_mutex_unlock(&ds->mu);
  }
  pthread_mutex_lock(&g_host_mu);
  for (size_t i = 0; i < g_host_allocs.cap; i++)
    if (g_host_allocs.keys[i]) free((void*)g_host_allocs.keys[i]);
  ptrmap_free(&g_host_allocs);
  g_host_live_bytes = 0;
  pthread_mutex_unlock(&g_host_mu);
}

static C_Status h_finalize(void) {
  pthread_mutex_lock(&g_init_mu);
  if (atomic_load(&g_refcount) <= 0) {
    pthread_mutex_unlock(&g_init_mu);
    return C_ERROR;
  }
  if (t_worker_stream && atomic_load(&g_refcount) == 1) {
    /* the last finalize from inside a callback would join its own worker */
    pthread_mutex_unlock(&g_init_mu);
    return C_ERROR;
  }
  if (atomic_fetch_sub(&g_refcount, 1) == 1) teardown_all();
  pthread_mutex_unlock(&g_init_mu);
  return C_SUCCESS;
}

static C_Status h_init_device(const C_Device device) {
  DEV_OR_ERROR(device, id);
  if (!rt_is_initialized()) return C_ERROR;
  atomic_store(&g_dev[id].inited, 1);
  return C_SUCCESS;
}

static C_Status h_deinit_device(const C_Device device) {
  DEV_OR_ERROR(device, id);
  if (!rt_is_initialized()) return C_ERROR;
  C_Status st = sync_device_streams(id);
  if (st != C_SUCCESS) return st;
  atomic_store(&g_dev[id].inited, 0);
  return C_SUCCESS;
}

static C_Status h_set_device(const C_Device device) {
  DEV_OR_ERROR(device, id);
  t_current_device = id;
  return C_SUCCESS;
}

static C_Status h_get_device(const C_Device device) {
  if (!device) return C_ERROR;
  device->id = t_current_device;
  return C_SUCCESS;
}

/* The common start of the create hooks: the out pointer is given, the plugin initialised, the injected fault
 * `fault` not hit; then a zeroed object of `size` bytes (NULL with *st set on any failure). */
static void* new_handle_object(const void* out, int fault, size_t size, C_Status* st) {
  *st = C_ERROR;
  if (!out || !rt_is_initialized()) return NULL;
  *st = C_FAILED;
  if (rt_fault_hit(fault)) return NULL;
  return calloc(1, size);
}

static C_Status h_create_stream(const C_Device device, C_Stream* stream) {
  DEV_OR_ERROR(device, id);
  C_Status st;
  rt_stream* s = new_handle_object(stream, RT_FAULT_CREATE_STREAM, sizeof(*s), &st);
  if (!s) return st;
  s->magic = RT_STREAM_MAGIC;
  s->device = id;
  s->cdev.id = id;
  atomic_init(&s->refs, 1); /* the registry's */
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);

  pthread_mutex_lock(&g_reg_mu);
  if (rt_cfg.max_streams) {
    size_t mine = 0;
    for (size_t i = 0; i < g_streams.cap; i++)
      if (g_streams.keys[i] && ((rt_stream*)g_streams.keys[i])->device == id) mine++;
    if (mine >= rt_cfg.max_streams) {
      pthread_mutex_unlock(&g_reg_mu);
      rt_stream_put(s);
      return C_FAILED;
    }
  }
  if (pthread_create(&s->thread, NULL, stream_worker, s) != 0) {
    pthread_mutex_unlock(&g_reg_mu);
    rt_stream_put(s);
    return C_FAILED;
  }
  if (ptrmap_put(&g_streams, s, (size_t)id) != 0) {
    pthread_mutex_unlock(&g_reg_mu);
    stream_shutdown(s);
    return C_FAILED;
  }
  pthread_mutex_unlock(&g_reg_mu);
  *stream = (C_Stream)s;
  return C_SUCCESS;
}

static C_Status h_destroy_stream(const C_Device device, C_Stream stream) {
  DEV_OR_ERROR(device, id);
  rt_stream* s = (rt_stream*)stream;
  if (!s) return C_ERROR;
  if (s == t_worker_stream) return C_ERROR;
  pthread_mutex_lock(&g_reg_mu);
  if (!ptrmap_find(&g_streams, s, NULL) || s->device != id) {
    pthread_mutex_unlock(&g_reg_mu);
    return C_ERROR;
  }
  ptrmap_remove(&g_streams, s);
  pthread_mutex_unlock(&g_reg_mu);
  stream_shutdown(s);
  return C_SUCCESS;
}

static C_Status h_query_stream(const C_Device device, C_Stream stream) {
  DEV_OR_ERROR(device, id);
  rt_stream* s;
  if (stream_lookup(id, stream, &s) != C_SUCCESS) return C_ERROR;
  if (!s) return C_SUCCESS;
  pthread_mutex_lock(&s->mu);
  int busy = s->pending != 0;
  pthread_mutex_unlock(&s->mu);
  rt_stream_put(s);
  return busy ? C_FAILED : C_SUCCESS;
}

static C_Status h_synchronize_stream(const C_Device device, C_Stream stream) {
  DEV_OR_ERROR(device, id);
  rt_stream* s;
  if (stream_lookup(id, stream, &s) != C_SUCCESS) return C_ERROR;
  if (!s) return C_SUCCESS;
  if (s == t_worker_stream) {
    rt_stream_put(s);
    return C_ERROR;
  }
  int fail = rt_fault_hit(RT_FAULT_SYNCHRONIZE);
  stream_drain(s); /* an injected failure is reported after the wait, like an asynchronous error at a sync point */
  rt_stream_put(s);
  return fail ? C_FAILED : C_SUCCESS;
}

static C_Status h_stream_add_callback(const C_Device device, C_Stream stream, C_Callback callback, void* user_data) {
  DEV_OR_ERROR(device, id);
  if (!callback) return C_ERROR;
  rt_stream* s;
  if (stream_lookup(id, stream, &s) != C_SUCCESS) return C_ERROR;
  if (!s) {
    C_Status st = C_SUCCESS;
    struct C_Device_st d = {id};
    callback(&d, NULL, user_data, &st);
    return C_SUCCESS;
  }
  return stream_enqueue_put(s, &(rt_op){.kind = OP_CALLBACK, .u.callback = {callback, user_data}});
}

static C_Status h_synchronize_device(const C_Device device) {
  DEV_OR_ERROR(device, id);
  int fail = rt_fault_hit(RT_FAULT_SYNCHRONIZE);
  C_Status st = sync_device_streams(id);
  return fail && st == C_SUCCESS ? C_FAILED : st;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Event hooks.                                                                                                   */

static C_Status h_create_event(const C_Device device, C_Event* event) {
  DEV_OR_ERROR(device, id);
  C_Status st;
  rt_event* e = new_handle_object(event, RT_FAULT_CREATE_EVENT, sizeof(*e), &st);
  if (!e) return st;
  e->magic = RT_EVENT_MAGIC;
  e->device = id;
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  pthread_mutex_lock(&g_reg_mu);
  int rc = ptrmap_put(&g_events, e, (size_t)id);
  pthread_mutex_unlock(&g_reg_mu);
  if (rc != 0) {
    event_put(e);
    return C_FAILED;
  }
  *event = (C_Event)e;
  return C_SUCCESS;
}

static C_Status h_destroy_event(const C_Device device, C_Event event) {
  DEV_OR_ERROR(device, id);
  (void)id;
  return ptrmap_unregister(&g_reg_mu, &g_events, event, release_event);
}

static C_Status h_record_event(const C_Device device, C_Stream stream, C_Event event) {
  DEV_OR_ERROR(device, id);
  rt_event* e = event_get(event);
  if (!e) return C_ERROR;
  if (rt_fault_hit(RT_FAULT_RECORD_EVENT)) {
    event_put(e);
    return C_FAILED;
  }
  rt_stream* s;
  if (stream_lookup(id, stream, &s) != C_SUCCESS) {
    event_put(e);
    return C_ERROR;
  }
  pthread_mutex_lock(&e->mu);
  uint64_t gen = ++e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (!s) {
    event_complete(e, gen);
    event_put(e);
    return C_SUCCESS;
  }
  rt_op* op = op_dup(&(rt_op){.kind = OP_RECORD, .u.event = {e, gen}}); /* the op owns our reference */
  if (!op) {
    event_complete(e, gen);
    event_put(e);
    rt_stream_put(s);
    return C_FAILED;
  }
  atomic_fetch_add(&e->refs, 1); /* keep e alive for the failure path below */
  C_Status st = stream_enqueue(s, op);
  if (st != C_SUCCESS) event_complete(e, gen); /* never leave the event pending forever */
  event_put(e);
  rt_stream_put(s);
  return st;
}

static C_Status h_query_event(const C_Device device, C_Event event) {
  DEV_OR_ERROR(device, id);
  (void)id;
  rt_event* e = event_get(event);
  if (!e) return C_ERROR;
  pthread_mutex_lock(&e->mu);
  int done = e->completed >= e->recorded;
  pthread_mutex_unlock(&e->mu);
  event_put(e);
  return done ? C_SUCCESS : C_FAILED;
}

static C_Status h_synchronize_event(const C_Device device, C_Event event) {
  DEV_OR_ERROR(device, id);
  (void)id;
  rt_event* e = event_get(event);
  if (!e) return C_ERROR;
  int fail = rt_fault_hit(RT_FAULT_SYNCHRONIZE);
  pthread_mutex_lock(&e->mu);
  uint64_t target = e->recorded;
  while (e->completed < target) pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  event_put(e);
  return fail ? C_FAILED : C_SUCCESS;
}

static C_Status h_stream_wait_event(const C_Device device, C_Stream stream, C_Event event) {
  DEV_OR_ERROR(device, id);
  rt_event* e = event_get(event);
  if (!e) return C_ERROR;
  rt_stream* s;
  if (stream_lookup(id, stream, &s) != C_SUCCESS) {
    event_put(e);
    return C_ERROR;
  }
  pthread_mutex_lock(&e->mu);
  uint64_t gen = e->recorded;
  int done = e->completed >= gen;
  pthread_mutex_unlock(&e->mu);
  if (done) { /* never recorded, or already complete: nothing to wait for */
    event_put(e);
    if (s) rt_stream_put(s);
    return C_SUCCESS;
  }
  if (!s) {
    event_wait_gen(e, gen);
    event_put(e);
    return C_SUCCESS;
  }
  rt_op* op = op_dup(&(rt_op){.kind = OP_WAIT, .u.event = {e, gen}}); /* the op owns our reference */
  if (!op) {
    event_put(e);
    rt_stream_put(s);
    return C_FAILED;
  }
  C_Status st = stream_enqueue(s, op);
  rt_stream_put(s);
  return st;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Memory hooks.                                                                                                  */

static C_Status oom(void** ptr) {
  *ptr = NULL;
  return rt_cfg.oom_null ? C_SUCCESS : C_FAILED;
}

/* Large device allocations ask for transparent huge pages (as numpy does for its arrays): fewer TLB misses and page
 * faults when a collective or a copy streams through them. Advice only: ignored where THP is off. */
static void advise_huge_pages(void* p, size_t size) {
  const uintptr_t huge = (uintptr_t)2 << 20;
  if (size < ((size_t)4 << 20)) return;
  uintptr_t begin = ((uintptr_t)p + huge - 1) & ~(huge - 1);
  uintptr_t end = ((uintptr_t)p + size) & ~(huge - 1);
  if (end > begin) madvise((void*)begin, end - begin, MADV_HUGEPAGE);
}

static C_Status h_device_memory_allocate(const C_Device device, void** ptr, size_t size) {
  DEV_OR_ERROR(device, id);
  rt_device_state* ds = &g_dev[id];
  atomic_fetch_add(&ds->alloc_calls, 1); /* every call naming a valid device, whatever its outcome */
  if (!ptr) return C_ERROR;
  if (!rt_is_initialized()) return C_ERROR;
  if (size == 0) return C_ERROR;
  if (rt_fault_hit(RT_FAULT_ALLOC)) return oom(ptr);
  pthread_mutex_lock(&ds->mu);
  if (size > rt_cfg.memory_bytes || ds->live_bytes > rt_cfg.memory_bytes - size) {
    pthread_mutex_unlock(&ds->mu);
    return oom(ptr);
  }
  void* p = NULL;
  if (posix_memalign(&p, rt_cfg.alignment, size) != 0 || !p) {
    pthread_mutex_unlock(&ds->mu);
    return oom(ptr);
  }
  if (ptrmap_put(&ds->allocs, p, size) != 0) {
    pthread_mutex_unlock(&ds->mu);
    free(p);
    return oom(ptr);
  }
  advise_huge_pages(p, size);
  ds->live_bytes += size;
  ds->live_count++;
  pthread_mutex_unlock(&ds->mu);
  *ptr = p;
  return C_SUCCESS;
}

static C_Status h_device_memory_deallocate(const C_Device device, void* ptr, size_t size) {
  DEV_OR_ERROR(device, id);
  rt_device_state* ds = &g_dev[id];
  if (!ptr || rt_fault_hit(RT_FAULT_FREE)) return C_ERROR;
  pthread_mutex_lock(&ds->mu);
  size_t have;
  if (!ptrmap_find(&ds->allocs, ptr, &have) || have != size) {
    pthread_mutex_unlock(&ds->mu);
    return C_ERROR;
  }
  ptrmap_remove(&ds->allocs, ptr);
  ds->live_bytes -= size;
  ds->live_count--;
  pthread_mutex_unlock(&ds->mu);
  free(ptr);
  return C_SUCCESS;
}

/* For rt_cpu_vmm.c (rt_cpu_internal.h): physical memory of the virtual-memory extension counts against the device's
 * capacity like device allocations. */
int rt_device_charge(int id, size_t size) {
  rt_device_state* ds = &g_dev[id];
  pthread_mutex_lock(&ds->mu);
  if (size > rt_cfg.memory_bytes || ds->live_bytes > rt_cfg.memory_bytes - size) {
    pthread_mutex_unlock(&ds->mu);
    return -1;
  }
  ds->live_bytes += size;
  pthread_mutex_unlock(&ds->mu);
  return 0;
}

void rt_device_uncharge(int id, size_t size) {
  rt_device_state* ds = &g_dev[id];
  pthread_mutex_lock(&ds->mu);
  ds->live_bytes -= size < ds->live_bytes ? size : ds->live_bytes;
  pthread_mutex_unlock(&ds->mu);
}

static C_Status h_device_memory_set(const C_Device device, void* ptr, unsigned char value, size_t size) {
  DEV_OR_ERROR(device, id);
  (void)id;
  if (!size) return C_SUCCESS;
  if (!ptr) return C_ERROR;
  if (rt_fault_hit(RT_FAULT_MEMSET)) return C_FAILED;
  memset(ptr, value, size);
  return C_SUCCESS;
}

static C_Status host_alloc(const C_Device device, void** ptr, size_t size, int unified) {
  DEV_OR_ERROR(device, id);
  (void)id;
  if (!ptr || !size) return C_ERROR;
  if (!rt_is_initialized()) return C_ERROR;
  if (rt_fault_hit(RT_FAULT_HOST_ALLOC)) {
    *ptr = NULL;
    return C_FAILED;
  }
  if (size > SIZE_MAX / 4) return C_FAILED;
  void* p = NULL;
  if (posix_memalign(&p, 256, size) != 0 || !p) {
    *ptr = NULL;
    return C_FAILED;
  }
  pthread_mutex_lock(&g_host_mu);
  if (ptrmap_put(&g_host_allocs, p, (size << 1) | (size_t)(unified != 0)) != 0) {
    pthread_mutex_unlock(&g_host_mu);
    free(p);
    *ptr = NULL;
    return C_FAILED;
  }
  g_host_live_bytes += size;
  pthread_mutex_unlock(&g_host_mu);
  *ptr = p;
  return C_SUCCESS;
}

static C_Status host_free(const C_Device device, void* ptr, size_t size, int unified) {
  DEV_OR_ERROR(device, id);
  (void)id;
  if (!ptr) return C_ERROR;
  pthread_mutex_lock(&g_host_mu);
  size_t have;
  if (!ptrmap_find(&g_host_allocs, ptr, &have) || have != ((size << 1) | (size_t)(unified != 0))) {
    pthread_mutex_unlock(&g_host_mu);
    return C_ERROR;
  }
  ptrmap_remove(&g_host_allocs, ptr);
  g_host_live_bytes -= size;
  pthread_mutex_unlock(&g_host_mu);
  free(ptr);
  return C_SUCCESS;
}

static C_Status h_host_memory_allocate(const C_Device d, void** p, size_t n) { return host_alloc(d, p, n, 0); }
static C_Status h_host_memory_deallocate(const C_Device d, void* p, size_t n) { return host_free(d, p, n, 0); }
static C_Status h_unified_memory_allocate(const C_Device d, void** p, size_t n) { return host_alloc(d, p, n, 1); }
static C_Status h_unified_memory_deallocate(const C_Device d, void* p, size_t n) { return host_free(d, p, n, 1); }

static C_Status copy_now(void* dst, const void* src, size_t size) {
  if (!size) return C_SUCCESS;
  if (!dst || !src) return C_ERROR;
  if (rt_fault_hit(RT_FAULT_MEMCPY)) return C_FAILED;
  memmove(dst, src, size);
  return C_SUCCESS;
}

static C_Status h_memory_copy(const C_Device device, void* dst, const void* src, size_t size) {
  DEV_OR_ERROR(device, id);
  (void)id;
  return copy_now(dst, src, size);
}

static C_Status h_memory_copy_p2p(const C_Device dst_device, const C_Device src_device, void* dst, const void* src,
                                  size_t size) {
  DEV_OR_ERROR(dst_device, did);
  DEV_OR_ERROR(src_device, sid);
  (void)did;
  (void)sid;
  return copy_now(dst, src, size);
}

static C_Status copy_async(int dev, int other_dev, C_Stream stream, void* dst, const void* src, size_t size) {
  rt_stream* s;
  if (stream_lookup(-1, stream, &s) != C_SUCCESS) return C_ERROR;
  if (s && s->device != dev && s->device != other_dev) {
    rt_stream_put(s);
    return C_ERROR;
  }
  if (size && (!dst || !src)) {
    if (s) rt_stream_put(s);
    return C_ERROR;
  }
  if (!s) return copy_now(dst, src, size);
  if (rt_fault_hit(RT_FAULT_MEMCPY)) {
    rt_stream_put(s);
    return C_FAILED;
  }
  return stream_enqueue_put(s, &(rt_op){.kind = OP_COPY, .u.copy = {dst, src, size}});
}

static C_Status h_async_memory_copy(const C_Device device, C_Stream stream, void* dst, const void* src, size_t size) {
  DEV_OR_ERROR(device, id);
  return copy_async(id, id, stream, dst, src, size);
}

static C_Status h_async_memory_copy_p2p(const C_Device dst_device, const C_Device src_device, C_Stream stream,
                                        void* dst, const void* src, size_t size) {
  DEV_OR_ERROR(dst_device, did);
  DEV_OR_ERROR(src_device, sid);
  return copy_async(did, sid, stream, dst, src, size);
}

/* Not in Paddle's table: an asynchronous memset, used by tests through rt_cpu_async_memset (exported). */
static C_Status memset_async(int dev, C_Stream stream, void* ptr, unsigned char value, size_t size) {
  rt_stream* s;
  if (stream_lookup(dev, stream, &s) != C_SUCCESS) return C_ERROR;
  if (size && !ptr) {
    if (s) rt_stream_put(s);
    return C_ERROR;
  }
  if (rt_fault_hit(RT_FAULT_MEMSET)) {
    if (s) rt_stream_put(s);
    return C_FAILED;
  }
  if (!s) {
    if (size) memset(ptr, value, size);
    return C_SUCCESS;
  }
  return stream_enqueue_put(s, &(rt_op){.kind = OP_SET, .u.set = {ptr, value, size}});
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Information hooks.                                                                                             */

static C_Status h_get_device_count(size_t* count) {
  if (!count) return C_ERROR;
  *count = rt_cfg.device_count;
  return C_SUCCESS;
}

static C_Status h_get_device_list(size_t* devices) {
  if (!devices) return C_ERROR;
  for (size_t i = 0; i < rt_cfg.device_count; i++) devices[i] = i;
  return C_SUCCESS;
}

static C_Status h_device_memory_stats(const C_Device device, size_t* total, size_t* free_bytes) {
  DEV_OR_ERROR(device, id);
  if (!total || !free_bytes) return C_ERROR;
  pthread_mutex_lock(&g_dev[id].mu);
  size_t live = g_dev[id].live_bytes;
  pthread_mutex_unlock(&g_dev[id].mu);
  *total = rt_cfg.memory_bytes;
  *free_bytes = rt_cfg.memory_bytes - live;
  return C_SUCCESS;
}

/* A hook that answers one value of type T for any valid device. */
#define VALUE_HOOK(name, T, expr)                               \
  static C_Status name(const C_Device device, T* out) {         \
    DEV_OR_ERROR(device, id);                                   \
    (void)id;                                                   \
    if (!out) return C_ERROR;                                   \
    *out = (expr);                                              \
    return C_SUCCESS;                                           \
  }
#define SIZE_HOOK(name, expr) VALUE_HOOK(name, size_t, expr)
#define BOOL_HOOK(name, value) VALUE_HOOK(name, bool, value)

static size_t growth_size(void) {
  size_t n = rt_cfg.memory_bytes / 8;
  size_t c = rt_cfg.min_chunk;
  n = n / c * c;
  return n ? n : c;
}

SIZE_HOOK(h_device_min_chunk_size, rt_cfg.min_chunk)
SIZE_HOOK(h_device_max_chunk_size, rt_cfg.memory_bytes)
SIZE_HOOK(h_device_max_alloc_size, rt_cfg.memory_bytes)
SIZE_HOOK(h_device_extra_padding_size, rt_cfg.extra_padding)
SIZE_HOOK(h_device_init_alloc_size, growth_size())
SIZE_HOOK(h_device_realloc_size, growth_size())
SIZE_HOOK(h_get_compute_capability, 10)
SIZE_HOOK(h_get_runtime_version, 101)
SIZE_HOOK(h_get_driver_version, 101)
SIZE_HOOK(h_get_multi_process, (size_t)(sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1))
SIZE_HOOK(h_get_max_threads_per_mp, 1)
SIZE_HOOK(h_get_max_threads_per_block, 1024)

static C_Status h_get_max_grid_dim_size(const C_Device device, C_GridDim3* dims) {
  DEV_OR_ERROR(device, id);
  (void)id;
  if (!dims) return C_ERROR;
  (*dims)[0] = 2147483647u;
  (*dims)[1] = 65535u;
  (*dims)[2] = 65535u;
  return C_SUCCESS;
}

BOOL_HOOK(h_is_float16_supported, true)
BOOL_HOOK(h_is_bfloat16_supported, true)
BOOL_HOOK(h_is_dnn_supported, false)

/* ------------------------------------------------------------------------------------------------------------ */
/* BLAS.                                                                                                          */

static C_Status h_blas_axpby(const C_Device device, C_Stream stream, C_DataType dtype, size_t numel, float alpha,
                             void* x, float beta, void* y) {
  DEV_OR_ERROR(device, id);
  if (dtype != FLOAT32 && dtype != FLOAT64) return C_ERROR;
  if (numel && (!x || !y)) return C_ERROR;
  rt_stream* s;
  if (stream_lookup(id, stream, &s) != C_SUCCESS) return C_ERROR;
  if (!s) {
    axpby_run(dtype, numel, alpha, x, beta, y);
    return C_SUCCESS;
  }
  return stream_enqueue_put(s, &(rt_op){.kind = OP_AXPBY, .u.axpby = {dtype, numel, alpha, x, beta, y}});
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Profiler hooks.                                                                                                */

/* RT_CPU_FAIL_PROFILER: the injected failure of one profiler hook. */
static int prof_fault(const char* hook) {
  const char* s = getenv("RT_CPU_FAIL_PROFILER");
  return s && strcmp(s, hook) == 0;
}

static rt_prof_session* session_find(void* user_data) {
  /* caller holds g_reg_mu */
  return ptrmap_find(&g_sessions, user_data, NULL) ? (rt_prof_session*)user_data : NULL;
}

static C_Status h_profiler_initialize(C_Profiler prof, void** user_data) {
  (void)prof;
  if (!user_data) return C_ERROR;
  if (!rt_is_initialized() || prof_fault("initialize")) return C_ERROR;
  rt_prof_session* p = calloc(1, sizeof(*p));
  if (!p) return C_FAILED;
  pthread_mutex_lock(&g_reg_mu);
  int rc = ptrmap_put(&g_sessions, p, 0);
  pthread_mutex_unlock(&g_reg_mu);
  if (rc != 0) {
    free(p);
    return C_FAILED;
  }
  *user_data = p;
  atomic_fetch_add(&g_prof_sessions, 1);
  return C_SUCCESS;
}

static C_Status h_profiler_finalize(C_Profiler prof, void* user_data) {
  (void)prof;
  if (prof_fault("finalize")) return C_ERROR;
  return ptrmap_unregister(&g_reg_mu, &g_sessions, user_data, free);
}

static C_Status prof_transition(void* user_data, int from_any_but, int to) {
  pthread_mutex_lock(&g_reg_mu);
  rt_prof_session* p = session_find(user_data);
  if (!p) {
    pthread_mutex_unlock(&g_reg_mu);
    return C_ERROR;
  }
  C_Status st = C_SUCCESS;
  uint64_t now = rt_now_ns();
  switch (to) {
    case PROF_PREPARED:
      if (p->state == PROF_RUNNING) st = C_ERROR;
      else p->state = PROF_PREPARED;
      break;
    case PROF_RUNNING:
      if (p->state == PROF_RUNNING) st = C_ERROR;
      else {
        p->state = PROF_RUNNING;
        p->start_ns = now;
        p->stop_ns = 0;
        p->ops_at_start = atomic_load(&g_ops_done);
      }
      break;
    case PROF_STOPPED:
      if (p->state != PROF_RUNNING) st = C_ERROR;
      else {
        p->state = PROF_STOPPED;
        p->stop_ns = now;
        p->ops_at_stop = atomic_load(&g_ops_done);
      }
      break;
  }
  (void)from_any_but;
  pthread_mutex_unlock(&g_reg_mu);
  return st;
}

static C_Status h_profiler_prepare_tracing(C_Profiler prof, void* user_data) {
  (void)prof;
  if (prof_fault("prepare")) return C_ERROR;
  return prof_transition(user_data, -1, PROF_PREPARED);
}

static C_Status h_profiler_start_tracing(C_Profiler prof, void* user_data) {
  (void)prof;
  if (prof_fault("start")) return C_ERROR;
  return prof_transition(user_data, -1, PROF_RUNNING);
}

static C_Status h_profiler_stop_tracing(C_Profiler prof, void* user_data) {
  (void)prof;
  if (prof_fault("stop")) return C_ERROR;
  return prof_transition(user_data, -1, PROF_STOPPED);
}

static C_Status h_profiler_collect_trace_data(C_Profiler prof, uint64_t start_ns, void* user_data) {
  if (prof_fault("collect")) return C_ERROR;
  pthread_mutex_lock(&g_reg_mu);
  rt_prof_session* p = session_find(user_data);
  if (!p) {
    pthread_mutex_unlock(&g_reg_mu);
    return C_ERROR;
  }
  int have_span = p->state == PROF_RUNNING || p->state == PROF_STOPPED;
  rt_cpu_trace_record rec;
  memset(&rec, 0, sizeof(rec));
  rec.magic = RT_CPU_TRACE_MAGIC;
  rec.version = 1;
  rec.name = "rt_cpu::tracing";
  rec.start_ns = p->start_ns;
  rec.end_ns = p->state == PROF_STOPPED ? p->stop_ns : rt_now_ns();
  uint64_t ops_end = p->state == PROF_STOPPED ? p->ops_at_stop : atomic_load(&g_ops_done);
  rec.stream_ops = ops_end - p->ops_at_start;
  rec.collect_start_ns = start_ns;
  p->collected++;
  pthread_mutex_unlock(&g_reg_mu);
  atomic_fetch_add(&g_prof_collects, 1);
  void (*add)(C_Profiler, void*) = profiler_add_runtime_trace_event;
  if (have_span && add) add(prof, &rec);
  return C_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Entry point.                                                                                                   */

RT_EXPORT void InitPlugin(CustomRuntimeParams* params) {
  if (!params || !params->interface) return;
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  ensure_config();
  pthread_once(&g_state_once, init_state);

  params->device_type = (char*)"rt_cpu";
  params->sub_device_type = (char*)"v0.1";

  C_DeviceInterface* f = params->interface;
  f->initialize = h_initialize;
  f->finalize = h_finalize;
  f->init_device = h_init_device;
  f->set_device = h_set_device;
  f->get_device = h_get_device;
  f->deinit_device = h_deinit_device;
  f->create_stream = h_create_stream;
  f->destroy_stream = h_destroy_stream;
  f->query_stream = h_query_stream;
  f->stream_add_callback = h_stream_add_callback;
  f->create_event = h_create_event;
  f->record_event = h_record_event;
  f->destroy_event = h_destroy_event;
  f->query_event = h_query_event;
  f->synchronize_device = h_synchronize_device;
  f->synchronize_stream = h_synchronize_stream;
  f->synchronize_event = h_synchronize_event;
  f->stream_wait_event = h_stream_wait_event;

  f->device_memory_allocate = h_device_memory_allocate;
  f->device_memory_deallocate = h_device_memory_deallocate;
  f->device_memory_set = h_device_memory_set;
  f->host_memory_allocate = h_host_memory_allocate;
  f->host_memory_deallocate = h_host_memory_deallocate;
  f->unified_memory_allocate = h_unified_memory_allocate;
  f->unified_memory_deallocate = h_unified_memory_deallocate;
  f->memory_copy_h2d = h_memory_copy;
  f->memory_copy_d2h = h_memory_copy;
  f->memory_copy_d2d = h_memory_copy;
  f->memory_copy_p2p = h_memory_copy_p2p;
  f->async_memory_copy_h2d = h_async_memory_copy;
  f->async_memory_copy_d2h = h_async_memory_copy;
  f->async_memory_copy_d2d = h_async_memory_copy;
  f->async_memory_copy_p2p = h_async_memory_copy_p2p;

  f->get_device_count = h_get_device_count;
  f->get_device_list = h_get_device_list;
  f->device_memory_stats = h_device_memory_stats;
  f->device_min_chunk_size = h_device_min_chunk_size;
  f->device_max_chunk_size = h_device_max_chunk_size;
  f->device_max_alloc_size = h_device_max_alloc_size;
  f->device_extra_padding_size = h_device_extra_padding_size;
  f->device_init_alloc_size = h_device_init_alloc_size;
  f->device_realloc_size = h_device_realloc_size;
  f->get_compute_capability = h_get_compute_capability;
  f->get_runtime_version = h_get_runtime_version;
  f->get_driver_version = h_get_driver_version;
  f->get_multi_process = h_get_multi_process;
  f->get_max_threads_per_mp = h_get_max_threads_per_mp;
  f->get_max_threads_per_block = h_get_max_threads_per_block;
  f->get_max_grid_dim_size = h_get_max_grid_dim_size;
  f->is_float16_supported = h_is_float16_supported;
  f->is_bfloat16_supported = h_is_bfloat16_supported;
  f->is_dnn_supported = h_is_dnn_supported;

  f->profiler_initialize = h_profiler_initialize;
  f->profiler_finalize = h_profiler_finalize;
  f->profiler_prepare_tracing = h_profiler_prepare_tracing;
  f->profiler_start_tracing = h_profiler_start_tracing;
  f->profiler_stop_tracing = h_profiler_stop_tracing;
  f->profiler_collect_trace_data = h_profiler_collect_trace_data;

  f->blas_axpby = h_blas_axpby;

  for (rt_layer* l = g_layers; l; l = l->next) l->fill(f); /* the layers above: collectives' xccl_* hooks */
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Exported helpers for tests and paddle_rt (not part of the ABI).                                                */

/* paddle_rt's optional extension (paddle_rt/extension.h): rt_cpu's device memory is this process's heap. */
RT_EXPORT int paddle_rt_ext_host_addressable(void) { return 1; }

/* A counter read under the lock that guards it. */
static size_t read_locked(pthread_mutex_t* mu, const size_t* counter) {
  pthread_mutex_lock(mu);
  size_t n = *counter;
  pthread_mutex_unlock(mu);
  return n;
}

/* The state of device `device` for the exported helpers (NULL outside 0..RT_CPU_MAX_DEVICES-1). */
static rt_device_state* exported_device(int device) {
  if (device < 0 || device >= RT_CPU_MAX_DEVICES) return NULL;
  pthread_once(&g_state_once, init_state);
  return &g_dev[device];
}

RT_EXPORT size_t rt_cpu_live_bytes(int device) {
  rt_device_state* ds = exported_device(device);
  return ds ? read_locked(&ds->mu, &ds->live_bytes) : 0;
}

RT_EXPORT size_t rt_cpu_live_count(int device) {
  rt_device_state* ds = exported_device(device);
  return ds ? read_locked(&ds->mu, &ds->live_count) : 0;
}

RT_EXPORT size_t rt_cpu_alloc_calls(int device) {
  if (device < 0 || device >= RT_CPU_MAX_DEVICES) return 0;
  return atomic_load(&g_dev[device].alloc_calls);
}

RT_EXPORT size_t rt_cpu_host_live_bytes(void) { return read_locked(&g_host_mu, &g_host_live_bytes); }

RT_EXPORT int rt_cpu_initialize_refcount(void) { return atomic_load(&g_refcount); }

/* Number of live streams / events (all devices). */
RT_EXPORT size_t rt_cpu_live_streams(void) { return read_locked(&g_reg_mu, &g_streams.count); }

RT_EXPORT size_t rt_cpu_live_events(void) { return read_locked(&g_reg_mu, &g_events.count); }

/* Profiler sessions ever initialised (which = 0) or collect_trace_data calls served (which = 1). */
RT_EXPORT size_t rt_cpu_profiler_count(int which) {
  return which ? atomic_load(&g_prof_collects) : atomic_load(&g_prof_sessions);
}

/* Enqueue a memset on a stream (NULL: synchronous). Returns a C_Status. */
RT_EXPORT int rt_cpu_async_memset(int device, void* stream, void* ptr, int value, size_t size) {
  if (device < 0 || (size_t)device >= rt_cfg.device_count) return C_ERROR;
  return memset_async(device, (C_Stream)stream, ptr, (unsigned char)value, size);
}
