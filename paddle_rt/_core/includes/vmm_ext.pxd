# The optional virtual-memory extension of plugins (paddle_rt/include/paddle_rt/paddle_rt_vmm_ext.h): symbols a plugin
# may export; plugin.pyx finds them with dlsym on the plugin's handle, the allocator (alloc_segment.pyx) calls them.
from paddle_rt._core.device_ext cimport C_Device, C_Status

cdef extern from "paddle_rt/paddle_rt_vmm_ext.h" nogil:
    ctypedef void* PaddleRtVmmPhys
    ctypedef C_Status (*paddle_rt_ext_vmm_granularity_fn)(const C_Device device, size_t* granularity) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_reserve_fn)(const C_Device device, size_t size, void** base) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_free_range_fn)(const C_Device device, void* base, size_t size) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_create_fn)(const C_Device device, size_t size,
                                                     PaddleRtVmmPhys* handle) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_release_fn)(const C_Device device, PaddleRtVmmPhys handle) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_map_fn)(const C_Device device, void* base, size_t offset,
                                                  PaddleRtVmmPhys handle, size_t size) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_unmap_fn)(const C_Device device, void* base, size_t offset,
                                                    size_t size) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_map_pages_fn)(const C_Device device, void* base, size_t offset,
                                                        const PaddleRtVmmPhys* handles, size_t n,
                                                        size_t page) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_vmm_unmap_pages_fn)(const C_Device device, void* base, size_t offset, size_t n,
                                                          size_t page) noexcept nogil

# The seven calls, all set or all NULL; then the two optional batched calls, both set or both NULL.
cdef struct prt_vmm_fns:
    paddle_rt_ext_vmm_granularity_fn granularity
    paddle_rt_ext_vmm_reserve_fn reserve
    paddle_rt_ext_vmm_free_range_fn free_range
    paddle_rt_ext_vmm_create_fn create
    paddle_rt_ext_vmm_release_fn release
    paddle_rt_ext_vmm_map_fn map
    paddle_rt_ext_vmm_unmap_fn unmap
    paddle_rt_ext_vmm_map_pages_fn map_pages
    paddle_rt_ext_vmm_unmap_pages_fn unmap_pages
