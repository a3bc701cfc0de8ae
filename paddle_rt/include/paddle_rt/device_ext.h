/*
 * paddle_rt/device_ext.h -- the custom-device plugin ABI spoken by PaddlePaddle (layout of paddlepaddle 3.3.1),
 * declared independently by paddle_rt.
 *
 * The names follow Paddle's so that a plugin source written against Paddle's header compiles unchanged against this
 * one. Only the layout is normative: every offset below is checked by tests/test_header.py and, on LP64 targets, by
 * the static assertions at the end of this file. Valid C99/C11 and C++11.
 *
 * Sizes (x86-64): CustomRuntimeParams 96 bytes, C_DeviceInterface 1128 bytes.
 */
#ifndef PADDLE_RT_DEVICE_EXT_H_
#define PADDLE_RT_DEVICE_EXT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <array>
extern "C" {
#else
#include <stdbool.h>
#endif

/* The ABI version a plugin reports; the host accepts major*10000 + minor*100 + patch >= 101. */
#define PADDLE_CUSTOM_RUNTIME_MAJOR_VERSION 0
#define PADDLE_CUSTOM_RUNTIME_MINOR_VERSION 1
#define PADDLE_CUSTOM_RUNTIME_PATCH_VERSION 1

typedef enum {
  UNDEFINED = 0,
  BOOL,
  UINT8,
  UINT16,
  UINT32,
  UINT64,
  INT8,
  INT16,
  INT32,
  INT64,
  FLOAT16,
  FLOAT32,
  FLOAT64,
  BFLOAT16,
  COMPLEX64,
  COMPLEX128
} C_DataType;

typedef enum {
  ANY = 0,
  NHWC,
  NCHW,
  NCDHW,
  NDHWC,
  STRIDED,
  NUM_DATA_LAYOUTS,
  ALL_LAYOUT = ANY
} C_DataLayout;

typedef enum {
  C_SUCCESS = 0,    /* done */
  C_WARNING = 1,    /* done, but not as asked (e.g. an asynchronous call that ran synchronously) */
  C_FAILED = 2,     /* resource exhausted, or a query that is not ready */
  C_ERROR = 3,      /* bad argument, wrong use, not initialised */
  C_INTERNAL_ERROR = 4
} C_Status;

typedef struct C_Device_st {
  int id;
} *C_Device;

/* Opaque handles: a host never dereferences or interprets them. */
typedef struct C_Stream_st* C_Stream;
typedef struct C_Event_st* C_Event;
typedef struct C_CCLComm_st* C_CCLComm;
typedef struct C_Profiler_st* C_Profiler;
typedef struct C_Place_st* C_Place;
typedef struct C_EigenDevice_st* C_EigenDevice;
typedef struct C_Allocator_st* C_Allocator;

typedef void (*C_Callback)(C_Device device, C_Stream stream, void* user_data, C_Status* status);

typedef struct {
  size_t sz;
  void* data;
} C_CCLRootId;

typedef enum { SUM = 0, AVG, MAX, MIN, PRODUCT } C_CCLReduceOp;

/* A pointer slot the host never calls: only its size and position matter. */
typedef C_Status (*C_OpaqueHook)(void);

#ifdef __cplusplus
typedef std::array<unsigned int, 3> C_GridDim3;
#else
typedef unsigned int C_GridDim3[3];
#endif

/* Exported by the host (with global visibility) for plugins' profiler hooks. */
void profiler_add_runtime_trace_event(C_Profiler prof, void* event);
void profiler_add_device_trace_event(C_Profiler prof, void* event);

struct C_DeviceInterface {
  size_t size; /* set by the host before InitPlugin */

  /* device management */
  C_Status (*initialize)(void);
  C_Status (*finalize)(void);
  C_Status (*init_device)(const C_Device device);
  C_Status (*set_device)(const C_Device device);
  C_Status (*get_device)(const C_Device device);
  C_Status (*deinit_device)(const C_Device device);
  C_Status (*create_stream)(const C_Device device, C_Stream* stream);
  C_Status (*destroy_stream)(const C_Device device, C_Stream stream);
  C_Status (*query_stream)(const C_Device device, C_Stream stream);
  C_Status (*stream_add_callback)(const C_Device device, C_Stream stream, C_Callback callback, void* user_data);
  C_Status (*create_event)(const C_Device device, C_Event* event);
  C_Status (*record_event)(const C_Device device, C_Stream stream, C_Event event);
  C_Status (*destroy_event)(const C_Device device, C_Event event);
  C_Status (*query_event)(const C_Device device, C_Event event);
  C_Status (*synchronize_device)(const C_Device device);
  C_Status (*synchronize_stream)(const C_Device device, C_Stream stream);
  C_Status (*synchronize_event)(const C_Device device, C_Event event);
  C_Status (*stream_wait_event)(const C_Device device, C_Stream stream, C_Event event);
  void* reserved_dev_api[8];

  /* memory management */
  C_Status (*device_memory_allocate)(const C_Device device, void** ptr, size_t size);
  C_Status (*device_memory_deallocate)(const C_Device device, void* ptr, size_t size);
  C_Status (*device_memory_set)(const C_Device device, void* ptr, unsigned char value, size_t size);
  C_Status (*host_memory_allocate)(const C_Device device, void** ptr, size_t size);
  C_Status (*host_memory_deallocate)(const C_Device device, void* ptr, size_t size);
  C_Status (*unified_memory_allocate)(const C_Device device, void** ptr, size_t size);
  C_Status (*unified_memory_deallocate)(const C_Device device, void* ptr, size_t size);
  C_Status (*memory_copy_h2d)(const C_Device device, void* dst, const void* src, size_t size);
  C_Status (*memory_copy_d2h)(const C_Device device, void* dst, const void* src, size_t size);
  C_Status (*memory_copy_d2d)(const C_Device device, void* dst, const void* src, size_t size);
  C_Status (*memory_copy_p2p)(const C_Device dst_device, const C_Device src_device, void* dst, const void* src,
                              size_t size);
  C_Status (*async_memory_copy_h2d)(const C_Device device, C_Stream stream, void* dst, const void* src, size_t size);
  C_Status (*async_memory_copy_d2h)(const C_Device device, C_Stream stream, void* dst, const void* src, size_t size);
  C_Status (*async_memory_copy_d2d)(const C_Device device, C_Stream stream, void* dst, const void* src, size_t size);
  C_Status (*async_memory_copy_p2p)(const C_Device dst_device, const C_Device src_device, C_Stream stream, void* dst,
                                    const void* src, size_t size);
  void* reserved_mem_api[8];

  /* information */
  C_Status (*get_device_count)(size_t* count);
  C_Status (*get_device_list)(size_t* devices);
  C_Status (*device_memory_stats)(const C_Device device, size_t* total_memory, size_t* free_memory);
  C_Status (*device_min_chunk_size)(const C_Device device, size_t* size);
  C_Status (*device_max_chunk_size)(const C_Device device, size_t* size);
  C_Status (*device_max_alloc_size)(const C_Device device, size_t* size);
  C_Status (*device_extra_padding_size)(const C_Device device, size_t* size);
  C_Status (*device_init_alloc_size)(const C_Device device, size_t* size);
  C_Status (*device_realloc_size)(const C_Device device, size_t* size);
  C_Status (*get_compute_capability)(const C_Device device, size_t* compute_capability);
  C_Status (*get_device_properties)(const C_Device device, void* properties);
  C_Status (*get_runtime_version)(const C_Device device, size_t* version);
  C_Status (*get_driver_version)(const C_Device device, size_t* version);
  C_Status (*get_multi_process)(const C_Device device, size_t* count);
  C_Status (*get_max_threads_per_mp)(const C_Device device, size_t* count);
  C_Status (*get_max_threads_per_block)(const C_Device device, size_t* count);
  C_Status (*get_max_grid_dim_size)(const C_Device device, C_GridDim3* dims);
  C_Status (*is_float16_supported)(const C_Device device, bool* supported);
  C_Status (*is_bfloat16_supported)(const C_Device device, bool* supported);
  C_Status (*is_dnn_supported)(const C_Device device, bool* supported);
  C_Status (*init_eigen_device)(C_Place place, C_EigenDevice* eigen_device, C_Stream stream, C_Allocator allocator);
  C_Status (*destroy_eigen_device)(const C_Device device, C_EigenDevice* eigen_device);
  void* reserved_info_api[8];

  /* collective communication */
  C_Status (*xccl_get_comm_name)(C_CCLComm comm, char* name);
  C_Status (*xccl_get_unique_id_size)(size_t* size);
  C_Status (*xccl_get_unique_id)(C_CCLRootId* unique_id);
  C_Status (*xccl_comm_init_rank)(size_t nranks, C_CCLRootId* unique_id, size_t rank, C_CCLComm* comm);
  C_Status (*xccl_destroy_comm)(C_CCLComm comm);
  C_Status (*xccl_all_reduce)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type, C_CCLReduceOp op,
                              C_CCLComm comm, C_Stream stream);
  C_Status (*xccl_broadcast)(void* buf, size_t count, C_DataType data_type, size_t root, C_CCLComm comm,
                             C_Stream stream);
  C_Status (*xccl_reduce)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type, C_CCLReduceOp op,
                          size_t root, C_CCLComm comm, C_Stream stream);
  C_Status (*xccl_all_gather)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type, C_CCLComm comm,
                              C_Stream stream);
  C_Status (*xccl_reduce_scatter)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type,
                                  C_CCLReduceOp op, C_CCLComm comm, C_Stream stream);
  C_Status (*xccl_group_start)(void);
  C_Status (*xccl_group_end)(void);
  C_Status (*xccl_send)(void* send_buf, size_t count, C_DataType data_type, size_t dest_rank, C_CCLComm comm,
                        C_Stream stream);
  C_Status (*xccl_recv)(void* recv_buf, size_t count, C_DataType data_type, size_t src_rank, C_CCLComm comm,
                        C_Stream stream);
  C_Status (*xccl_all_to_all)(const void** send_buf, const size_t* send_count, const C_DataType* send_dtype,
                              void** recv_buf, const size_t* recv_count, const C_DataType* recv_dtype, size_t rank,
                              size_t nranks, C_CCLComm comm, C_Stream stream);
  void* reserved_ccl_api[8];

  /* profiler */
  C_Status (*profiler_initialize)(C_Profiler prof, void** user_data);
  C_Status (*profiler_finalize)(C_Profiler prof, void* user_data);
  C_Status (*profiler_prepare_tracing)(C_Profiler prof, void* user_data);
  C_Status (*profiler_start_tracing)(C_Profiler prof, void* user_data);
  C_Status (*profiler_stop_tracing)(C_Profiler prof, void* user_data);
  C_Status (*profiler_collect_trace_data)(C_Profiler prof, uint64_t start_ns, void* user_data);
  void* reserved_profiler_api[8];

  /* graph / BLAS group: never called by paddle_rt, declared for layout only */
  C_OpaqueHook init_blas_handle;
  C_OpaqueHook blas_set_math_mode;
  C_OpaqueHook init_blaslt_handle;
  C_OpaqueHook destroy_blas_handle;
  C_OpaqueHook destroy_blaslt_handle;
  C_OpaqueHook cuda_stream_begin_capture;
  C_OpaqueHook cuda_stream_end_captrue;
  C_OpaqueHook cuda_graph_launch;
  C_OpaqueHook cuda_graph_destroy;
  C_OpaqueHook cuda_graph_exec_destroy;
  C_OpaqueHook cuda_graph_instantiate;
  C_OpaqueHook cuda_graph_get_nodes;
  C_OpaqueHook cuda_stream_capture_info;
  C_OpaqueHook get_parameter_setter_for_exec_graph;
  C_OpaqueHook cuda_graph_debug_dot_print;
  C_OpaqueHook cuda_thread_exchange_stream_capthure_mode;

  /* y = alpha * x + beta * y */
  C_Status (*blas_axpby)(const C_Device device, C_Stream stream, C_DataType dtype, size_t numel, float alpha, void* x,
                         float beta, void* y);
  void* reserved_other_api[7];
};
typedef struct C_DeviceInterface C_DeviceInterface;

struct CustomRuntimeVersion {
  size_t major, minor, patch;
};
typedef struct CustomRuntimeVersion CustomRuntimeVersion;

struct CustomRuntimeParams {
  size_t size;                    /* set by the host */
  C_DeviceInterface* interface;   /* set by the host, filled by the plugin */
  CustomRuntimeVersion version;   /* filled by the plugin */
  char* device_type;              /* filled by the plugin */
  char* sub_device_type;          /* filled by the plugin */
  void* pir_default_passes;       /* optional, filled by the plugin; paddle_rt ignores it */
  char reserved[32];
};
typedef struct CustomRuntimeParams CustomRuntimeParams;

/* The handshake check a plugin runs first: it gives up only when both sizes differ (as Paddle's macro does), then
 * reports the ABI version it was built for. */
#define PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params)                     \
  if ((params)->size != sizeof(CustomRuntimeParams) &&                  \
      (params)->interface->size != sizeof(C_DeviceInterface)) {         \
    return;                                                             \
  }                                                                     \
  (params)->version.major = PADDLE_CUSTOM_RUNTIME_MAJOR_VERSION;        \
  (params)->version.minor = PADDLE_CUSTOM_RUNTIME_MINOR_VERSION;        \
  (params)->version.patch = PADDLE_CUSTOM_RUNTIME_PATCH_VERSION;

/* The plugin's entry point. */
void InitPlugin(CustomRuntimeParams* params);

#if defined(__LP64__) || defined(_LP64)
#ifdef __cplusplus
#define PADDLE_RT_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define PADDLE_RT_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif
PADDLE_RT_STATIC_ASSERT(sizeof(struct CustomRuntimeParams) == 96, "CustomRuntimeParams must be 96 bytes");
PADDLE_RT_STATIC_ASSERT(sizeof(struct C_DeviceInterface) == 1128, "C_DeviceInterface must be 1128 bytes");
PADDLE_RT_STATIC_ASSERT(offsetof(struct C_DeviceInterface, device_memory_allocate) == 216, "layout");
PADDLE_RT_STATIC_ASSERT(offsetof(struct C_DeviceInterface, get_device_count) == 400, "layout");
PADDLE_RT_STATIC_ASSERT(offsetof(struct C_DeviceInterface, xccl_get_comm_name) == 640, "layout");
PADDLE_RT_STATIC_ASSERT(offsetof(struct C_DeviceInterface, profiler_initialize) == 824, "layout");
PADDLE_RT_STATIC_ASSERT(offsetof(struct C_DeviceInterface, blas_axpby) == 1064, "layout");
#undef PADDLE_RT_STATIC_ASSERT
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PADDLE_RT_DEVICE_EXT_H_ */
