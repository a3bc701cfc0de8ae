/*
 * rt_cpu_faults.c -- rt_cpu's fault injection: chosen calls fail (or wait first) on a schedule, for tests.
 *
 * One schedule per kind of call (rt_fault_call below): `every` N (the Nth, 2Nth... call of that kind fails; 0 = off),
 * `after` N (every call after the Nth fails; 0 = off) and `delay_us` (each call of that kind first sleeps that long,
 * failing or not, in the calling thread: a hook of the ABI, so on paddle_rt's stream worker for work on a stream).
 * Calls are counted over all devices, from the last change of that kind's schedule.
 *
 * Set at load from the environment (RT_CPU_FAIL_ALLOC_EVERY / _AFTER, RT_CPU_FAIL_HOST_ALLOC_EVERY, and
 * RT_CPU_FAULTS="kind:every[:after[:delay_us]],..." for any kind), and at run time with the exported
 *   int rt_cpu_set_fault(const char* kind, uint64_t every, uint64_t after, uint64_t delay_us)
 *     returns 0, or -1 for an unknown kind (paddle_rt.plugins.rt_cpu_set_fault from Python);
 *   void rt_cpu_clear_faults(void)      every schedule off.
 * Kinds: alloc (device_memory_allocate: out of memory), host_alloc (host/unified allocation), memcpy (every copy
 * hook, synchronous and asynchronous), memset (device_memory_set, async_memory_set), create_stream, create_event,
 * record_event, synchronize (synchronize_device, synchronize_stream, synchronize_event); the release side of memory:
 * free (device_memory_deallocate), unmap (the virtual-memory extension's unmap and unmap_pages), release (its release
 * of a physical allocation), free_range (its free_range). A failing call returns C_FAILED (alloc: as configured by
 * RT_CPU_OOM_NULL; the release side: C_ERROR) and changes nothing -- except synchronize, which waits first and then
 * reports the failure (an asynchronous error seen at a sync point: the work is over either way, so the host never
 * reuses memory that queued work may still use).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_cpu_internal.h"

typedef struct {
  _Atomic uint64_t every, after, delay_us;
  atomic_uint_fast64_t seq;
} rt_fault_schedule;

static rt_fault_schedule g_faults[RT_FAULT_N];
static const char* const g_fault_names[RT_FAULT_N] = {
    "alloc", "host_alloc", "memcpy", "memset", "create_stream", "create_event", "record_event", "synchronize",
    "free", "unmap", "release", "free_range",
};

static int fault_kind(const char* name, size_t len) {
  for (int k = 0; k < RT_FAULT_N; k++)
    if (strlen(g_fault_names[k]) == len && strncmp(g_fault_names[k], name, len) == 0) return k;
  return -1;
}

static void fault_store(int k, uint64_t every, uint64_t after, uint64_t delay_us) {
  atomic_store(&g_faults[k].every, 0);  /* no call sees a half-set schedule as "fail everything" */
  atomic_store(&g_faults[k].seq, 0);
  atomic_store(&g_faults[k].after, after);
  atomic_store(&g_faults[k].delay_us, delay_us);
  atomic_store(&g_faults[k].every, every);
}

int rt_fault_hit(int kind) {
  rt_fault_schedule* f = &g_faults[kind];
  uint64_t every = atomic_load(&f->every), after = atomic_load(&f->after), delay = atomic_load(&f->delay_us);
  if (delay) {
    struct timespec ts = {(time_t)(delay / 1000000u), (long)(delay % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0) {}
  }
  if (!every && !after) return 0;
  uint64_t seq = atomic_fetch_add(&f->seq, 1) + 1;
  return (every && seq % every == 0) || (after && seq > after);
}

void rt_fault_init(const rt_config* cfg) {
  fault_store(RT_FAULT_ALLOC, cfg->fail_alloc_every, cfg->fail_alloc_after, 0);
  fault_store(RT_FAULT_HOST_ALLOC, cfg->fail_host_alloc_every, 0, 0);
  const char* spec = getenv("RT_CPU_FAULTS");
  while (spec && *spec) {
    const char* end = strchr(spec, ',');
    size_t len = end ? (size_t)(end - spec) : strlen(spec);
    const char* colon = memchr(spec, ':', len);
    unsigned long long v[3] = {0, 0, 0};
    int k = colon ? fault_kind(spec, (size_t)(colon - spec)) : -1;
    char buf[96];
    size_t rest = colon ? len - (size_t)(colon + 1 - spec) : 0;
    if (k >= 0 && rest < sizeof(buf)) {
      memcpy(buf, colon + 1, rest);
      buf[rest] = 0;
      int n = sscanf(buf, "%llu:%llu:%llu", &v[0], &v[1], &v[2]);
      if (n >= 1) fault_store(k, v[0], v[1], v[2]);
      else k = -1;
    }
    if (k < 0) fprintf(stderr, "rt_cpu: ignoring RT_CPU_FAULTS entry '%.*s' (kind:every[:after[:delay_us]])\n",
                       (int)len, spec);
    spec = end ? end + 1 : NULL;
  }
}

RT_EXPORT int rt_cpu_set_fault(const char* kind, uint64_t every, uint64_t after, uint64_t delay_us) {
  int k = kind ? fault_kind(kind, strlen(kind)) : -1;
  if (k < 0) return -1;
  fault_store(k, every, after, delay_us);
  return 0;
}

RT_EXPORT void rt_cpu_clear_faults(void) {
  for (int k = 0; k < RT_FAULT_N; k++) fault_store(k, 0, 0, 0);
}
