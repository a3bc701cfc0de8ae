# cython: freethreading_compatible = False
"""The allocator's errors as exceptions (allocator.pyx finds an error under its lock, releases the lock, takes the
GIL and calls raise_alloc_error): out of memory with the device's capacity and the allocator's counters, a plugin's
failed call named (the allocation hook, or the virtual-memory extension's call: AllocError.call), and the ways a free
can be wrong."""
from libc.stdint cimport SIZE_MAX

from paddle_rt._core.alloc_types cimport (
    AllocatorCore, AllocError, KIND_HOST, ERR_OOM, ERR_PLUGIN, ERR_PLUGIN_NULL, ERR_HOST_OOM, ERR_TORN_DOWN,
    ERR_BAD_SIZE, ERR_DOUBLE_FREE, ERR_OWNED, ERR_INTERIOR, ERR_FOREIGN, VMM_CALL_NONE, VMM_CALL_RESERVE, VMM_CALL_CREATE,
    VMM_CALL_MAP, VMM_CALL_MAP_PAGES,
)
from paddle_rt._core.includes.trace_support cimport prt_tracing, PRT_TRACE_MEMORY, PRT_EV_OOM
from paddle_rt._core.trace cimport trace_mask, trace_memory_event

from paddle_rt._core import errors


# The exported symbols of the virtual-memory extension (paddle_rt_vmm_ext.h), by AllocError.call.
VMM_CALL_NAMES = {VMM_CALL_RESERVE: "paddle_rt_ext_vmm_reserve", VMM_CALL_CREATE: "paddle_rt_ext_vmm_create",
                  VMM_CALL_MAP: "paddle_rt_ext_vmm_map", VMM_CALL_MAP_PAGES: "paddle_rt_ext_vmm_map_pages"}


cdef str _failed_call(AllocatorCore* c, AllocError* e):
    """The plugin call that failed: the extension's call when an expandable segment's step failed, else the
    allocation hook."""
    if e.call != VMM_CALL_NONE:
        return VMM_CALL_NAMES[e.call]
    return "host_memory_allocate" if c.kind == KIND_HOST else "device_memory_allocate"


def _fmt(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024


cdef int raise_alloc_error(AllocatorCore* c, AllocError* e, object owner) except -1:
    dev = <object>c.device
    what = "pinned host memory" if c.kind == KIND_HOST else "memory"
    if e.kind == ERR_OOM:
        # the counters as they were under the lock when the request failed (_note_counts): read here, without the
        # lock, they would race with other threads' allocations
        if prt_tracing(trace_mask, PRT_TRACE_MEMORY):
            trace_memory_event(c.device, c.kind, PRT_EV_OOM, 0, e.requested, 0, 0, e.allocated, e.reserved)
        allocated = e.allocated
        reserved = e.reserved
        try:
            free_, total = dev.memory_info()
        except BaseException:
            free_, total = 0, 0
        cap_text = (f"{dev} has a total capacity of {_fmt(total)} of which {_fmt(free_)} is free. "
                    if total else f"{dev} does not report its capacity. ")
        lim = ""
        if c.cfg.limit != SIZE_MAX:
            lim = f"The allocator's limit is {_fmt(c.cfg.limit)}. "
        msg = (f"{dev}: out of {what}. Tried to allocate {_fmt(e.requested)} ({e.requested} bytes). {cap_text}{lim}"
               f"Of the memory held by paddle_rt, {_fmt(allocated)} is allocated and "
               f"{_fmt(reserved - allocated)} is reserved but unallocated. If reserved but unallocated memory is "
               f"large, try PADDLE_RT_ALLOC_CONF=max_split_size:<bytes> to avoid fragmentation, or "
               f"paddle_rt.empty_cache(); otherwise lower the memory demand.")
        raise errors.OutOfMemoryError(msg, device=str(dev), requested=int(e.requested), allocated=int(allocated),
                                      reserved=int(reserved), capacity=int(total) if total else None,
                                      free=int(free_) if total else None,
                                      call="malloc_host" if c.kind == KIND_HOST else "malloc")
    if e.kind == ERR_PLUGIN:
        raise errors.PluginError(str(dev), _failed_call(c, e), e.status, f"while allocating {e.requested} bytes")
    if e.kind == ERR_PLUGIN_NULL:
        asked = (f"asked for a chunk of at least {e.requested} bytes" if e.call == VMM_CALL_NONE else
                 f"while allocating {e.requested} bytes")
        raise errors.PluginError(
            str(dev), _failed_call(c, e), e.status,
            returned="a NULL base" if e.call == VMM_CALL_RESERVE else "a NULL pointer",
            detail=f"{asked}; a plugin out of memory must return C_FAILED", plugin=dev.type)
    if e.kind == ERR_HOST_OOM:
        raise MemoryError(f"{dev}: out of host memory for the allocator's bookkeeping")
    if e.kind == ERR_TORN_DOWN:
        if c.torn_down == 2:
            raise errors.ForkError(f"{dev}: the allocator belongs to the parent process; in a child after fork() "
                                   f"call paddle_rt.reinitialize_after_fork() before allocating")
        raise errors.DeviceError(f"{dev}: the allocator was torn down (interpreter shutting down)")
    if e.kind == ERR_BAD_SIZE:
        raise errors.InvalidArgument(f"{dev}: malloc of {e.requested} bytes: the size is too large")
    if e.kind == ERR_DOUBLE_FREE:
        raise errors.InvalidArgument(f"{dev}: free of 0x{e.ptr:x}: double free (the block is already free)")
    if e.kind == ERR_OWNED:
        raise errors.InvalidArgument(
            f"{dev}: raw_free of 0x{e.ptr:x}: a live Allocation owns this memory (paddle_rt.malloc, malloc_async or a "
            f"tensor's); free the Allocation instead (Allocation.free()): raw_free takes only raw_malloc's pointers")
    if e.kind == ERR_INTERIOR:
        raise errors.InvalidArgument(
            f"{dev}: free of 0x{e.ptr:x}: the pointer is inside a chunk of this allocator but is not the start of "
            f"a live allocation")
    if e.kind == ERR_FOREIGN:
        if owner is not None:
            raise errors.InvalidArgument(
                f"{dev}: free of 0x{e.ptr:x}: wrong device, the pointer belongs to {owner}")
        raise errors.InvalidArgument(f"{dev}: free of 0x{e.ptr:x}: the pointer was not allocated by paddle_rt's "
                                     f"{'host ' if c.kind == KIND_HOST else ''}allocator of {dev}")
    raise errors.PaddleRTError(f"{dev}: allocator error {e.kind}")
