"""Stream-ordered memory (facade over paddle_rt._core.pool): ``malloc_async`` / ``free_async`` / ``MemPool``."""
from paddle_rt._core.pool import (
    MemPool, AsyncAllocation, malloc_async, free_async, default_mem_pool,
)
from paddle_rt._core.pluggable import allocator_functions, allocator_functions_error

__all__ = ["MemPool", "AsyncAllocation", "malloc_async", "free_async", "default_mem_pool", "allocator_functions",
           "allocator_functions_error"]
