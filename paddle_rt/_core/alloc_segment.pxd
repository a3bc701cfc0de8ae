# Segments (chunks) of the caching allocator (alloc_segment.pyx): every function is called with the allocator's lock
# held and no GIL. Only allocator.pyx cimports them.
from libc.stdint cimport uintptr_t
from paddle_rt._core.allocator cimport AllocatorCore, AllocError, Block

# Give `size` bytes at `ptr` back to the plugin (counts num_device_free).
cdef void plugin_free(AllocatorCore* c, uintptr_t ptr, size_t size) noexcept nogil
# A new chunk of `size` bytes as one free indexed block; NULL with err.kind set (ERR_OOM, ERR_PLUGIN, ERR_PLUGIN_NULL,
# ERR_HOST_OOM) on failure.
cdef Block* new_chunk(AllocatorCore* c, int pool, uintptr_t stream, size_t size, AllocError* err) noexcept nogil
# Whether every stream that may still use this allocator's memory has completed everything submitted so far.
cdef bint streams_idle(AllocatorCore* c) noexcept nogil
# Give one idle chunk (b is its single free block) back to the plugin.
cdef void release_chunk(AllocatorCore* c, Block* b) noexcept nogil
# Give back every idle chunk of `pool` (-1: all pools) and `stream` (only_stream=0: every stream). Returns bytes.
cdef size_t release_idle(AllocatorCore* c, int pool, int only_stream, uintptr_t stream) noexcept nogil
# Size of the chunk to ask for on a miss of `size` bytes (alloc_policy.chunk_for_miss, after consolidation).
cdef size_t growth_size(AllocatorCore* c, int pool, uintptr_t stream, size_t size) noexcept nogil
