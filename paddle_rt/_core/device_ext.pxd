# Declarations of the plugin ABI (paddle_rt/device_ext.h). Nothing here is implemented; every other module cimports it.
from libc.stdint cimport uint64_t
from libcpp cimport bool as cbool

cdef extern from "paddle_rt/device_ext.h" nogil:
    int PADDLE_CUSTOM_RUNTIME_MAJOR_VERSION
    int PADDLE_CUSTOM_RUNTIME_MINOR_VERSION
    int PADDLE_CUSTOM_RUNTIME_PATCH_VERSION

    ctypedef enum C_Status:
        C_SUCCESS
        C_WARNING
        C_FAILED
        C_ERROR
        C_INTERNAL_ERROR

    ctypedef enum C_DataType:
        UNDEFINED
        BOOL
        UINT8
        UINT16
        UINT32
        UINT64
        INT8
        INT16
        INT32
        INT64
        FLOAT16
        FLOAT32
        FLOAT64
        BFLOAT16
        COMPLEX64
        COMPLEX128

    ctypedef enum C_CCLReduceOp:
        SUM
        AVG
        MAX
        MIN
        PRODUCT

    cdef struct C_Device_st:
        int id
    ctypedef C_Device_st* C_Device

    cdef struct C_Stream_st
    ctypedef C_Stream_st* C_Stream
    cdef struct C_Event_st
    ctypedef C_Event_st* C_Event
    cdef struct C_CCLComm_st
    ctypedef C_CCLComm_st* C_CCLComm
    cdef struct C_Profiler_st
    ctypedef C_Profiler_st* C_Profiler
    ctypedef void* C_Place
    ctypedef void* C_EigenDevice
    ctypedef void* C_Allocator
    ctypedef struct C_GridDim3:  # unsigned int[3] (std::array<unsigned int, 3> in C++)
        pass
    ctypedef C_Status (*C_OpaqueHook)() noexcept nogil

    ctypedef struct C_CCLRootId:
        size_t sz
        void* data

    ctypedef void (*C_Callback)(C_Device device, C_Stream stream, void* user_data, C_Status* status) noexcept nogil

    ctypedef struct C_DeviceInterface:
        size_t size
        C_Status (*initialize)() noexcept nogil
        C_Status (*finalize)() noexcept nogil
        C_Status (*init_device)(C_Device device) noexcept nogil
        C_Status (*set_device)(C_Device device) noexcept nogil
        C_Status (*get_device)(C_Device device) noexcept nogil
        C_Status (*deinit_device)(C_Device device) noexcept nogil
        C_Status (*create_stream)(C_Device device, C_Stream* stream) noexcept nogil
        C_Status (*destroy_stream)(C_Device device, C_Stream stream) noexcept nogil
        C_Status (*query_stream)(C_Device device, C_Stream stream) noexcept nogil
        C_Status (*stream_add_callback)(C_Device device, C_Stream stream, C_Callback callback, void* user_data) noexcept nogil
        C_Status (*create_event)(C_Device device, C_Event* event) noexcept nogil
        C_Status (*record_event)(C_Device device, C_Stream stream, C_Event event) noexcept nogil
        C_Status (*destroy_event)(C_Device device, C_Event event) noexcept nogil
        C_Status (*query_event)(C_Device device, C_Event event) noexcept nogil
        C_Status (*synchronize_device)(C_Device device) noexcept nogil
        C_Status (*synchronize_stream)(C_Device device, C_Stream stream) noexcept nogil
        C_Status (*synchronize_event)(C_Device device, C_Event event) noexcept nogil
        C_Status (*stream_wait_event)(C_Device device, C_Stream stream, C_Event event) noexcept nogil
        void* reserved_dev_api[8]

        C_Status (*device_memory_allocate)(C_Device device, void** ptr, size_t size) noexcept nogil
        C_Status (*device_memory_deallocate)(C_Device device, void* ptr, size_t size) noexcept nogil
        C_Status (*device_memory_set)(C_Device device, void* ptr, unsigned char value, size_t size) noexcept nogil
        C_Status (*host_memory_allocate)(C_Device device, void** ptr, size_t size) noexcept nogil
        C_Status (*host_memory_deallocate)(C_Device device, void* ptr, size_t size) noexcept nogil
        C_Status (*unified_memory_allocate)(C_Device device, void** ptr, size_t size) noexcept nogil
        C_Status (*unified_memory_deallocate)(C_Device device, void* ptr, size_t size) noexcept nogil
        C_Status (*memory_copy_h2d)(C_Device device, void* dst, const void* src, size_t size) noexcept nogil
        C_Status (*memory_copy_d2h)(C_Device device, void* dst, const void* src, size_t size) noexcept nogil
        C_Status (*memory_copy_d2d)(C_Device device, void* dst, const void* src, size_t size) noexcept nogil
        C_Status (*memory_copy_p2p)(C_Device dst_device, C_Device src_device, void* dst, const void* src,
                                    size_t size) noexcept nogil
        C_Status (*async_memory_copy_h2d)(C_Device device, C_Stream stream, void* dst, const void* src, size_t size) noexcept nogil
        C_Status (*async_memory_copy_d2h)(C_Device device, C_Stream stream, void* dst, const void* src, size_t size) noexcept nogil
        C_Status (*async_memory_copy_d2d)(C_Device device, C_Stream stream, void* dst, const void* src, size_t size) noexcept nogil
        C_Status (*async_memory_copy_p2p)(C_Device dst_device, C_Device src_device, C_Stream stream, void* dst,
                                          const void* src, size_t size) noexcept nogil
        void* reserved_mem_api[8]

        C_Status (*get_device_count)(size_t* count) noexcept nogil
        C_Status (*get_device_list)(size_t* devices) noexcept nogil
        C_Status (*device_memory_stats)(C_Device device, size_t* total_memory, size_t* free_memory) noexcept nogil
        C_Status (*device_min_chunk_size)(C_Device device, size_t* size) noexcept nogil
        C_Status (*device_max_chunk_size)(C_Device device, size_t* size) noexcept nogil
        C_Status (*device_max_alloc_size)(C_Device device, size_t* size) noexcept nogil
        C_Status (*device_extra_padding_size)(C_Device device, size_t* size) noexcept nogil
        C_Status (*device_init_alloc_size)(C_Device device, size_t* size) noexcept nogil
        C_Status (*device_realloc_size)(C_Device device, size_t* size) noexcept nogil
        C_Status (*get_compute_capability)(C_Device device, size_t* value) noexcept nogil
        C_Status (*get_device_properties)(C_Device device, void* properties) noexcept nogil
        C_Status (*get_runtime_version)(C_Device device, size_t* version) noexcept nogil
        C_Status (*get_driver_version)(C_Device device, size_t* version) noexcept nogil
        C_Status (*get_multi_process)(C_Device device, size_t* count) noexcept nogil
        C_Status (*get_max_threads_per_mp)(C_Device device, size_t* count) noexcept nogil
        C_Status (*get_max_threads_per_block)(C_Device device, size_t* count) noexcept nogil
        C_Status (*get_max_grid_dim_size)(C_Device device, C_GridDim3* dims) noexcept nogil
        C_Status (*is_float16_supported)(C_Device device, cbool* supported) noexcept nogil
        C_Status (*is_bfloat16_supported)(C_Device device, cbool* supported) noexcept nogil
        C_Status (*is_dnn_supported)(C_Device device, cbool* supported) noexcept nogil
        C_Status (*init_eigen_device)(C_Place place, C_EigenDevice* eigen_device, C_Stream stream,
                                      C_Allocator allocator) noexcept nogil
        C_Status (*destroy_eigen_device)(C_Device device, C_EigenDevice* eigen_device) noexcept nogil
        void* reserved_info_api[8]

        C_Status (*xccl_get_comm_name)(C_CCLComm comm, char* name) noexcept nogil
        C_Status (*xccl_get_unique_id_size)(size_t* size) noexcept nogil
        C_Status (*xccl_get_unique_id)(C_CCLRootId* unique_id) noexcept nogil
        C_Status (*xccl_comm_init_rank)(size_t nranks, C_CCLRootId* unique_id, size_t rank, C_CCLComm* comm) noexcept nogil
        C_Status (*xccl_destroy_comm)(C_CCLComm comm) noexcept nogil
        C_Status (*xccl_all_reduce)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type,
                                    C_CCLReduceOp op, C_CCLComm comm, C_Stream stream) noexcept nogil
        C_Status (*xccl_broadcast)(void* buf, size_t count, C_DataType data_type, size_t root, C_CCLComm comm,
                                   C_Stream stream) noexcept nogil
        C_Status (*xccl_reduce)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type,
                                C_CCLReduceOp op, size_t root, C_CCLComm comm, C_Stream stream) noexcept nogil
        C_Status (*xccl_all_gather)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type,
                                    C_CCLComm comm, C_Stream stream) noexcept nogil
        C_Status (*xccl_reduce_scatter)(void* send_buf, void* recv_buf, size_t count, C_DataType data_type,
                                        C_CCLReduceOp op, C_CCLComm comm, C_Stream stream) noexcept nogil
        C_Status (*xccl_group_start)() noexcept nogil
        C_Status (*xccl_group_end)() noexcept nogil
        C_Status (*xccl_send)(void* send_buf, size_t count, C_DataType data_type, size_t dest_rank, C_CCLComm comm,
                              C_Stream stream) noexcept nogil
        C_Status (*xccl_recv)(void* recv_buf, size_t count, C_DataType data_type, size_t src_rank, C_CCLComm comm,
                              C_Stream stream) noexcept nogil
        C_Status (*xccl_all_to_all)(const void** send_buf, const size_t* send_count, const C_DataType* send_dtype,
                                    void** recv_buf, const size_t* recv_count, const C_DataType* recv_dtype,
                                    size_t rank, size_t nranks, C_CCLComm comm, C_Stream stream) noexcept nogil
        void* reserved_ccl_api[8]

        C_Status (*profiler_initialize)(C_Profiler prof, void** user_data) noexcept nogil
        C_Status (*profiler_finalize)(C_Profiler prof, void* user_data) noexcept nogil
        C_Status (*profiler_prepare_tracing)(C_Profiler prof, void* user_data) noexcept nogil
        C_Status (*profiler_start_tracing)(C_Profiler prof, void* user_data) noexcept nogil
        C_Status (*profiler_stop_tracing)(C_Profiler prof, void* user_data) noexcept nogil
        C_Status (*profiler_collect_trace_data)(C_Profiler prof, uint64_t start_ns, void* user_data) noexcept nogil
        void* reserved_profiler_api[8]

        C_OpaqueHook init_blas_handle
        C_OpaqueHook blas_set_math_mode
        C_OpaqueHook init_blaslt_handle
        C_OpaqueHook destroy_blas_handle
        C_OpaqueHook destroy_blaslt_handle
        C_OpaqueHook cuda_stream_begin_capture
        C_OpaqueHook cuda_stream_end_captrue
        C_OpaqueHook cuda_graph_launch
        C_OpaqueHook cuda_graph_destroy
        C_OpaqueHook cuda_graph_exec_destroy
        C_OpaqueHook cuda_graph_instantiate
        C_OpaqueHook cuda_graph_get_nodes
        C_OpaqueHook cuda_stream_capture_info
        C_OpaqueHook get_parameter_setter_for_exec_graph
        C_OpaqueHook cuda_graph_debug_dot_print
        C_OpaqueHook cuda_thread_exchange_stream_capthure_mode

        C_Status (*blas_axpby)(C_Device device, C_Stream stream, C_DataType dtype, size_t numel, float alpha,
                               void* x, float beta, void* y) noexcept nogil
        void* reserved_other_api[7]

    ctypedef struct CustomRuntimeVersion:
        size_t major
        size_t minor
        size_t patch

    ctypedef struct CustomRuntimeParams:
        size_t size
        C_DeviceInterface* interface
        CustomRuntimeVersion version
        char* device_type
        char* sub_device_type
        void* pir_default_passes
        char reserved[32]


# The entry point's type (not named in the header).
ctypedef void (*InitPluginFn)(CustomRuntimeParams* params) noexcept nogil
