"""Memory API: the caching allocator of each device (see :mod:`paddle_rt._core.allocator` for the policy and the
``PADDLE_RT_ALLOC_CONF`` keys)."""
from paddle_rt._core.allocator import (
    Allocation, DeviceAllocator, malloc, free, raw_malloc, raw_free, malloc_host, memory_stats, memory_allocated,
    memory_reserved, max_memory_allocated, max_memory_reserved, reset_peak_memory_stats,
    reset_accumulated_memory_stats, empty_cache, memory_snapshot, set_allocator_config, allocator_config,
    get_allocator, pluggable_allocator_functions, CONF_KEYS as ALLOC_CONF_KEYS,
)

__all__ = [
    "Allocation", "DeviceAllocator", "malloc", "free", "raw_malloc", "raw_free", "malloc_host", "memory_stats",
    "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "empty_cache", "memory_snapshot", "set_allocator_config", "allocator_config",
    "get_allocator", "pluggable_allocator_functions", "ALLOC_CONF_KEYS",
]
