/* A configurable test plugin: the minimal plugin's ten hooks (tp_common.h) plus switches that make it misbehave in
 * the ways real plugins do, or add optional hooks. Give every build its own DEVICE_TYPE when several are loaded in
 * one process.
 *
 *   NO_ENTRY                 export no InitPlugin at all (the entry point is misspelled)
 *   VERSION_MAJOR/MINOR/PATCH  report this version instead of the header's 0.1.1 (e.g. 0.1.0 too old, 9.0.0 fine)
 *   REFUSE                   fill the hooks but leave device_type NULL (what a plugin does on a size mismatch)
 *   MISSING=hook, MISSING2=hook  leave these hooks NULL (e.g. -DMISSING=set_device)
 *   MEMSET_IFACE             memset the interface to zero after the version check, as many real plugins do, so
 *                            interface->size reads 0 once InitPlugin returns
 *   STRICT_SIZES             refuse unless params->size == 96 and interface->size == 1128 exactly; the sizes seen are
 *                            exported as tp_seen_params_size / tp_seen_interface_size
 *   PROFILER_STRONG          reference profiler_add_runtime_trace_event as a strong undefined symbol (its address is
 *                            taken, so dlopen fails unless the host exports it globally) and call it once in
 *                            InitPlugin with (NULL, NULL)
 *   NULL_STREAMS             create_stream returns success without writing the handle (like PaddleCustomDevice's
 *                            custom_cpu); destroy/query/synchronize_stream, stream_wait_event, synchronize_device
 *                            are no-ops
 *   WITH_INFO                the information hooks: memory stats (total TP_TOTAL_MEMORY, free = total - live bytes),
 *                            min chunk 512, extra padding 32, compute capability 75, runtime 12030, driver 53500,
 *                            multi_process 8, threads/mp 2048, threads/block 1024, grid {2^31-1, 65535, 65535},
 *                            float16 yes, bfloat16 no, dnn yes
 *   LIFECYCLE                initialize/finalize/init_device/deinit_device, each appending a line ("initialize",
 *                            "init_device 0", ...) to the file named by $TP_LOG (if set)
 *   FAIL_INITIALIZE          initialize returns C_ERROR (implies LIFECYCLE)
 *   FAIL_INIT_DEVICE=id      init_device of that physical id returns C_ERROR (implies LIFECYCLE)
 *   FAIL_DEVICE_COUNT        get_device_count returns C_ERROR
 *   HUGE_DEVICE_COUNT        get_device_count reports 2^40 devices
 *   FAIL_DEVICE_LIST         get_device_list returns C_ERROR
 *   FAIL_SET_DEVICE=id       set_device of that physical id returns C_ERROR
 *   NO_SUB_TYPE              leave sub_device_type NULL
 *   WRITE_PAST=n             write n bytes of non-zero pointers just past the 1128-byte interface and the 96-byte
 *                            parameter block, as a plugin built for a larger future layout would (the host must
 *                            hand InitPlugin blocks with slack)
 */
#include <stdio.h>

#include "tp_common.h"

#if defined(FAIL_INITIALIZE) || defined(FAIL_INIT_DEVICE)
#ifndef LIFECYCLE
#define LIFECYCLE
#endif
#endif

#ifdef STRICT_SIZES
TP_EXPORT size_t tp_seen_params_size = 0;
TP_EXPORT size_t tp_seen_interface_size = 0;
#endif

#ifdef PROFILER_STRONG
/* Taking the address makes the reference a data relocation, resolved when the library is loaded (even with
 * RTLD_LAZY), so a host that does not export the symbol globally cannot load this plugin. */
void (*volatile tp_trace_hook)(C_Profiler, void*) = profiler_add_runtime_trace_event;
#endif

#ifdef NULL_STREAMS
static C_Status ns_create_stream(const C_Device device, C_Stream* stream) {
  (void)device;
  (void)stream; /* deliberately leaves *stream untouched */
  return C_SUCCESS;
}
static C_Status ns_stream_op(const C_Device device, C_Stream stream) {
  (void)device;
  (void)stream;
  return C_SUCCESS;
}
static C_Status ns_stream_wait_event(const C_Device device, C_Stream stream, C_Event event) {
  (void)device;
  (void)stream;
  (void)event;
  return C_SUCCESS;
}
static C_Status ns_synchronize_device(const C_Device device) {
  (void)device;
  return C_SUCCESS;
}
#endif

#ifdef WITH_INFO
#ifndef TP_TOTAL_MEMORY
#define TP_TOTAL_MEMORY (1L << 30)
#endif
#define INFO_SIZE_HOOK(name, value)                                  \
  static C_Status name(const C_Device device, size_t* out) {         \
    if (!tp_valid_device(device) || out == NULL) return C_ERROR;     \
    *out = (value);                                                  \
    return C_SUCCESS;                                                \
  }
INFO_SIZE_HOOK(info_min_chunk, 512)
INFO_SIZE_HOOK(info_extra_padding, 32)
INFO_SIZE_HOOK(info_compute_capability, 75)
INFO_SIZE_HOOK(info_runtime_version, 12030)
INFO_SIZE_HOOK(info_driver_version, 53500)
INFO_SIZE_HOOK(info_multi_process, 8)
INFO_SIZE_HOOK(info_threads_per_mp, 2048)
INFO_SIZE_HOOK(info_threads_per_block, 1024)
#define INFO_BOOL_HOOK(name, value)                                  \
  static C_Status name(const C_Device device, bool* out) {           \
    if (!tp_valid_device(device) || out == NULL) return C_ERROR;     \
    *out = (value);                                                  \
    return C_SUCCESS;                                                \
  }
INFO_BOOL_HOOK(info_float16, true)
INFO_BOOL_HOOK(info_bfloat16, false)
INFO_BOOL_HOOK(info_dnn, true)
static C_Status info_grid(const C_Device device, C_GridDim3* dims) {
  if (!tp_valid_device(device) || dims == NULL) return C_ERROR;
  (*dims)[0] = 2147483647u;
  (*dims)[1] = 65535u;
  (*dims)[2] = 65535u;
  return C_SUCCESS;
}
static C_Status info_memory_stats(const C_Device device, size_t* total, size_t* free_memory) {
  if (!tp_valid_device(device) || total == NULL || free_memory == NULL) return C_ERROR;
  *total = (size_t)TP_TOTAL_MEMORY;
  *free_memory = (size_t)(TP_TOTAL_MEMORY - tp_live_bytes());
  return C_SUCCESS;
}
#endif

#ifdef LIFECYCLE
static void lc_log(const char* what, int id) {
  const char* path = getenv("TP_LOG");
  if (path == NULL || *path == '\0') return;
  FILE* f = fopen(path, "a");
  if (f == NULL) return;
  if (id >= 0)
    fprintf(f, "%s %d\n", what, id);
  else
    fprintf(f, "%s\n", what);
  fclose(f);
}
static C_Status lc_initialize(void) {
  lc_log("initialize", -1);
#ifdef FAIL_INITIALIZE
  return C_ERROR;
#else
  return C_SUCCESS;
#endif
}
static C_Status lc_finalize(void) {
  lc_log("finalize", -1);
  return C_SUCCESS;
}
static C_Status lc_init_device(const C_Device device) {
  if (!tp_valid_device(device)) return C_ERROR;
  lc_log("init_device", device->id);
#ifdef FAIL_INIT_DEVICE
  if (device->id == FAIL_INIT_DEVICE) return C_ERROR;
#endif
  return C_SUCCESS;
}
static C_Status lc_deinit_device(const C_Device device) {
  if (!tp_valid_device(device)) return C_ERROR;
  lc_log("deinit_device", device->id);
  return C_SUCCESS;
}
#endif

#ifdef FAIL_DEVICE_COUNT
static C_Status fx_device_count(size_t* count) {
  (void)count;
  return C_ERROR;
}
#endif
#ifdef HUGE_DEVICE_COUNT
static C_Status fx_device_count(size_t* count) {
  *count = (size_t)1 << 40;
  return C_SUCCESS;
}
#endif
#ifdef FAIL_DEVICE_LIST
static C_Status fx_device_list(size_t* devices) {
  (void)devices;
  return C_ERROR;
}
#endif
#ifdef FAIL_SET_DEVICE
static C_Status fx_set_device(const C_Device device) {
  if (device != NULL && device->id == FAIL_SET_DEVICE) return C_ERROR;
  return tp_set_device(device);
}
#endif

#ifdef NO_ENTRY
void InitPlugln(CustomRuntimeParams* params) /* sic: no InitPlugin in this library */
#else
void InitPlugin(CustomRuntimeParams* params)
#endif
{
#ifdef STRICT_SIZES
  tp_seen_params_size = params->size;
  tp_seen_interface_size = params->interface->size;
  if (params->size != sizeof(CustomRuntimeParams) || params->interface->size != sizeof(C_DeviceInterface)) return;
#endif
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
#ifdef VERSION_MAJOR
  params->version.major = VERSION_MAJOR;
#endif
#ifdef VERSION_MINOR
  params->version.minor = VERSION_MINOR;
#endif
#ifdef VERSION_PATCH
  params->version.patch = VERSION_PATCH;
#endif
  C_DeviceInterface* iface = params->interface;
#ifdef MEMSET_IFACE
  memset(iface, 0, sizeof(C_DeviceInterface));
#endif
  tp_fill_required(iface);
#ifdef NULL_STREAMS
  iface->create_stream = ns_create_stream;
  iface->destroy_stream = ns_stream_op;
  iface->query_stream = ns_stream_op;
  iface->synchronize_stream = ns_stream_op;
  iface->stream_wait_event = ns_stream_wait_event;
  iface->synchronize_device = ns_synchronize_device;
#endif
#ifdef WITH_INFO
  iface->device_memory_stats = info_memory_stats;
  iface->device_min_chunk_size = info_min_chunk;
  iface->device_extra_padding_size = info_extra_padding;
  iface->get_compute_capability = info_compute_capability;
  iface->get_runtime_version = info_runtime_version;
  iface->get_driver_version = info_driver_version;
  iface->get_multi_process = info_multi_process;
  iface->get_max_threads_per_mp = info_threads_per_mp;
  iface->get_max_threads_per_block = info_threads_per_block;
  iface->get_max_grid_dim_size = info_grid;
  iface->is_float16_supported = info_float16;
  iface->is_bfloat16_supported = info_bfloat16;
  iface->is_dnn_supported = info_dnn;
#endif
#ifdef LIFECYCLE
  iface->initialize = lc_initialize;
  iface->finalize = lc_finalize;
  iface->init_device = lc_init_device;
  iface->deinit_device = lc_deinit_device;
#endif
#if defined(FAIL_DEVICE_COUNT) || defined(HUGE_DEVICE_COUNT)
  iface->get_device_count = fx_device_count;
#endif
#ifdef FAIL_DEVICE_LIST
  iface->get_device_list = fx_device_list;
#endif
#ifdef FAIL_SET_DEVICE
  iface->set_device = fx_set_device;
#endif
#ifdef WRITE_PAST
  {
    char* iface_end = (char*)iface + sizeof(C_DeviceInterface);
    char* params_end = (char*)params + sizeof(CustomRuntimeParams);
    for (size_t off = 0; off + sizeof(void*) <= (size_t)(WRITE_PAST); off += sizeof(void*)) {
      void* junk = (void*)(uintptr_t)0xdeadbeef;
      memcpy(iface_end + off, &junk, sizeof junk);
      memcpy(params_end + off, &junk, sizeof junk);
    }
  }
#endif
#ifdef MISSING
  iface->MISSING = NULL;
#endif
#ifdef MISSING2
  iface->MISSING2 = NULL;
#endif
#ifdef PROFILER_STRONG
  tp_trace_hook(NULL, NULL);
#endif
#ifndef NO_SUB_TYPE
  params->sub_device_type = (char*)SUB_DEVICE_TYPE;
#endif
#ifndef REFUSE
  params->device_type = (char*)DEVICE_TYPE;
#endif
}
