/* The two functions that the ABI says the host exports for plugins' profiler hooks. paddle_rt loads this small
 * library with RTLD_GLOBAL before it opens any plugin, so a plugin that references them resolves them here.
 * Trace events handed in while a paddle_rt profiler session is active are forwarded to the sink it installed;
 * otherwise they are counted and dropped. */
#include <stdatomic.h>
#include <stddef.h>

#include "paddle_rt/device_ext.h"

typedef void (*paddle_rt_trace_sink)(C_Profiler prof, void* event, int is_device);

static _Atomic(paddle_rt_trace_sink) g_sink = NULL;
static atomic_ulong g_runtime_events = 0;
static atomic_ulong g_device_events = 0;

__attribute__((visibility("default"))) void profiler_add_runtime_trace_event(C_Profiler prof, void* event) {
  atomic_fetch_add(&g_runtime_events, 1);
  paddle_rt_trace_sink sink = atomic_load(&g_sink);
  if (sink) sink(prof, event, 0);
}

__attribute__((visibility("default"))) void profiler_add_device_trace_event(C_Profiler prof, void* event) {
  atomic_fetch_add(&g_device_events, 1);
  paddle_rt_trace_sink sink = atomic_load(&g_sink);
  if (sink) sink(prof, event, 1);
}

/* Install (or clear, with NULL) the sink; returns the previous one. */
__attribute__((visibility("default"))) paddle_rt_trace_sink paddle_rt_set_trace_sink(paddle_rt_trace_sink sink) {
  return atomic_exchange(&g_sink, sink);
}

__attribute__((visibility("default"))) unsigned long paddle_rt_trace_event_count(int is_device) {
  return is_device ? atomic_load(&g_device_events) : atomic_load(&g_runtime_events);
}
