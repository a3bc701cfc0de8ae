# The allocator's snapshot (alloc_snapshot.pyx). Only allocator.pyx cimports it. With the GIL, the allocator's lock
# not held: it takes the lock itself.
from paddle_rt._core.alloc_types cimport AllocatorCore

# Every segment of `c` with its blocks, as DeviceAllocator.snapshot documents; `device` names them.
cdef list segments(AllocatorCore* c, str device)
# The allocator's counters (DeviceAllocator.stats): PyTorch's keys, read under the lock (parked blocks merged first).
cdef dict counters(AllocatorCore* c)
# The allocator's settings (DeviceAllocator.config): the configuration keys' values, copied under the lock.
cdef dict settings(AllocatorCore* c)
