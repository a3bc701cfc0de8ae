/*
 * paddle_rt_vmm_ext.h -- optional virtual-memory extension of the custom-device plugin ABI that paddle_rt understands.
 *
 * With it, paddle_rt's caching allocator grows its segments in place (expandable segments): it reserves one virtual
 * address range per pool and maps physical memory into it as the pool grows, and unmaps physical memory under free
 * space so that it can be used elsewhere. A plugin exports these functions (C linkage, default visibility) next to
 * InitPlugin, as those of paddle_rt/extension.h; paddle_rt finds them with dlsym on the plugin's handle after the
 * handshake. All seven must be present, or paddle_rt ignores the extension (a plugin that exports none of them works
 * as before: chunks come from device_memory_allocate); the two batched calls at the end are optional. The reference plugin rt_cpu exports all of them
 * (plugins/rt_cpu/rt_cpu_vmm.c). docs/expandable_segments.md, "Writing a plugin: the virtual-memory extension",
 * describes the semantics and how each call maps onto CUDA's cuMem* and Level Zero's ze*Mem* calls.
 *
 * Common rules:
 *  - Every size and offset is a multiple of the device's granularity (paddle_rt_ext_vmm_granularity); a range's base
 *    is aligned to it. Anything else: C_ERROR, nothing changed.
 *  - Status: C_SUCCESS on success; C_FAILED only where stated (out of memory / out of address space), so that
 *    paddle_rt can treat it as "try again after giving memory back"; C_ERROR for every misuse (unknown handle or
 *    range, misaligned argument, a map over a mapped page, an unmap of something not mapped, releasing something
 *    still mapped). A call that fails changes nothing.
 *  - Thread safety: every call may be made from any thread, concurrently with any other call (paddle_rt serialises
 *    the calls on one range itself, but several allocators of one device share the device).
 *  - Memory mapped into a range is readable and writable by the device's kernels and copies (and, when the plugin is
 *    host addressable, by the host) at its virtual address, until it is unmapped. Touching an unmapped part of a range
 *    is the device's equivalent of an invalid address (on rt_cpu: SIGSEGV).
 *  - Capacity: physical allocations count against the device's memory (device_memory_stats) from create to release;
 *    reserving or mapping costs no memory.
 */
#ifndef PADDLE_RT_VMM_EXT_H_
#define PADDLE_RT_VMM_EXT_H_

#include <stddef.h>
#include <stdint.h>

#include "paddle_rt/device_ext.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An opaque handle to one physical allocation (CUDA: CUmemGenericAllocationHandle; Level Zero:
 * ze_physical_mem_handle_t). */
typedef struct PaddleRtVmmPhys_st* PaddleRtVmmPhys;

/* The granularity of `device` in bytes: a power of two (CUDA: cuMemGetAllocationGranularity with
 * CU_MEM_ALLOC_GRANULARITY_RECOMMENDED; Level Zero: zeVirtualMemQueryPageSize). It must not change while the plugin
 * is loaded. */
C_Status paddle_rt_ext_vmm_granularity(const C_Device device, size_t* granularity);
typedef C_Status (*paddle_rt_ext_vmm_granularity_fn)(const C_Device device, size_t* granularity);

/* Reserve `size` bytes of virtual address space for `device`, nothing mapped; *base receives its start (aligned to
 * the granularity). C_FAILED when the address space is exhausted. (CUDA: cuMemAddressReserve; Level Zero:
 * zeVirtualMemReserve.) */
C_Status paddle_rt_ext_vmm_reserve(const C_Device device, size_t size, void** base);
typedef C_Status (*paddle_rt_ext_vmm_reserve_fn)(const C_Device device, size_t size, void** base);

/* Give back a range made by paddle_rt_ext_vmm_reserve (the same base and size). Every mapping inside must have been
 * unmapped: otherwise C_ERROR and the range stays. (CUDA: cuMemAddressFree; Level Zero: zeVirtualMemFree.) */
C_Status paddle_rt_ext_vmm_free_range(const C_Device device, void* base, size_t size);
typedef C_Status (*paddle_rt_ext_vmm_free_range_fn)(const C_Device device, void* base, size_t size);

/* Create a physical allocation of `size` bytes on `device` (not mapped anywhere). C_FAILED when the device is out of
 * memory. (CUDA: cuMemCreate; Level Zero: zePhysicalMemCreate.) */
C_Status paddle_rt_ext_vmm_create(const C_Device device, size_t size, PaddleRtVmmPhys* handle);
typedef C_Status (*paddle_rt_ext_vmm_create_fn)(const C_Device device, size_t size, PaddleRtVmmPhys* handle);

/* Release a physical allocation: its memory goes back to the device. C_ERROR while it is mapped (unmap it first).
 * (CUDA: cuMemRelease; Level Zero: zePhysicalMemDestroy.) */
C_Status paddle_rt_ext_vmm_release(const C_Device device, PaddleRtVmmPhys handle);
typedef C_Status (*paddle_rt_ext_vmm_release_fn)(const C_Device device, PaddleRtVmmPhys handle);

/* Map the whole of physical allocation `handle` (`size` = its size) at base + offset of a reserved range, readable
 * and writable. Its bytes are those it held when it was last unmapped (a physical allocation is memory of its own:
 * unmapping it and mapping it elsewhere keeps its contents; a new one holds unspecified bytes). C_ERROR when any page
 * of [offset, offset + size) is already mapped, when the span leaves the range, or when `handle` is mapped elsewhere
 * (one mapping per physical allocation). (CUDA: cuMemMap then cuMemSetAccess; Level Zero: zeVirtualMemMap with
 * ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE.) */
C_Status paddle_rt_ext_vmm_map(const C_Device device, void* base, size_t offset, PaddleRtVmmPhys handle, size_t size);
typedef C_Status (*paddle_rt_ext_vmm_map_fn)(const C_Device device, void* base, size_t offset, PaddleRtVmmPhys handle,
                                            size_t size);

/* Unmap the mapping that starts at base + offset and spans exactly `size` bytes (one earlier map call's). C_ERROR
 * when no mapping starts there or its size differs (in particular for an unmap of an unmapped span); the physical
 * allocation is kept and may be mapped again. Work queued on the device's streams must be done with the span before
 * paddle_rt unmaps it (paddle_rt ensures it). (CUDA: cuMemUnmap; Level Zero: zeVirtualMemUnmap.) */
C_Status paddle_rt_ext_vmm_unmap(const C_Device device, void* base, size_t offset, size_t size);
typedef C_Status (*paddle_rt_ext_vmm_unmap_fn)(const C_Device device, void* base, size_t offset, size_t size);

/* Optional batched forms (a plugin may export both or neither; paddle_rt uses them only when both are there, and
 * otherwise makes one map or unmap call per page). They exist because growing a range maps many pages at once, and
 * on most drivers one call over the whole span is much cheaper than one per page (CUDA: one cuMemSetAccess over the
 * span after the cuMemMap calls, as PyTorch's expandable segments do; rt_cpu: one mmap per run of physical memory
 * that is contiguous in its backing file).
 *
 * paddle_rt_ext_vmm_map_pages: map handles[k] (a physical allocation of exactly `page` bytes, `page` a multiple of the
 * granularity) at base + offset + k * page, for k = 0 .. n - 1. Equal to n calls of paddle_rt_ext_vmm_map, all or
 * nothing: when any of them would fail (the same C_ERROR cases, and a handle given twice), none is mapped and the
 * status is that failure's. n == 0 is C_ERROR.
 * paddle_rt_ext_vmm_unmap_pages: unmap the n mappings of `page` bytes each that start at base + offset + k * page, for
 * k = 0 .. n - 1. Equal to n calls of paddle_rt_ext_vmm_unmap, all or nothing (C_ERROR, nothing unmapped, when any of
 * the n spans is not exactly one mapping of `page` bytes). */
C_Status paddle_rt_ext_vmm_map_pages(const C_Device device, void* base, size_t offset, const PaddleRtVmmPhys* handles,
                                     size_t n, size_t page);
typedef C_Status (*paddle_rt_ext_vmm_map_pages_fn)(const C_Device device, void* base, size_t offset,
                                                  const PaddleRtVmmPhys* handles, size_t n, size_t page);
C_Status paddle_rt_ext_vmm_unmap_pages(const C_Device device, void* base, size_t offset, size_t n, size_t page);
typedef C_Status (*paddle_rt_ext_vmm_unmap_pages_fn)(const C_Device device, void* base, size_t offset, size_t n,
                                                    size_t page);

#ifdef __cplusplus
}
#endif

#endif /* PADDLE_RT_VMM_EXT_H_ */
