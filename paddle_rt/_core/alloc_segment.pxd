# Segments (chunks) of the caching allocator (alloc_segment.pyx): every function is called with the allocator's lock
# held and no GIL. Only allocator.pyx cimports them.
from libc.stdint cimport uintptr_t, int64_t, uint64_t
from paddle_rt._core.device_ext cimport C_Status
from paddle_rt._core.alloc_types cimport AllocatorCore, AllocError, Block, Chunk

# Give `size` bytes at `ptr` back to the plugin (counts num_device_free): C_SUCCESS or the plugin's failure status.
cdef C_Status plugin_free(AllocatorCore* c, uintptr_t ptr, size_t size) noexcept nogil
# A new chunk of `size` bytes as one free indexed block; NULL with err.kind set (ERR_OOM, ERR_PLUGIN, ERR_PLUGIN_NULL,
# ERR_HOST_OOM) on failure.
cdef Block* new_chunk(AllocatorCore* c, int pool, uintptr_t stream, size_t size, AllocError* err) noexcept nogil
# Cross-stream reuse: a free block of `tag`'s memory serving `size` (mapped) whose frees the caller may follow
# (free_seq <= seq_ok, or done_ok and free_done), or NULL.
cdef Block* settled_fit(AllocatorCore* c, uintptr_t tag, size_t size, uint64_t seq_ok, bint done_ok) noexcept nogil
# settled_fit's block handed out for nbytes (size rounded), held[0] its size, seq[0] its free_seq; NULL: none.
cdef Block* take_settled(AllocatorCore* c, size_t nbytes, size_t size, uintptr_t tag, uint64_t seq_ok, bint done_ok,
                         size_t* held, uint64_t* seq) noexcept nogil
# Give one idle chunk (b is its single free block) back to the plugin; the bytes released (0: the plugin refused).
cdef size_t release_chunk(AllocatorCore* c, Block* b) noexcept nogil
# Give back every idle chunk of `pool` (-1: all pools) and `stream` (only_stream=0: every stream). Returns bytes.
cdef size_t release_idle(AllocatorCore* c, int pool, int only_stream, uintptr_t stream) noexcept nogil
# A release-side call the plugin refused (REL_*; REL_NONE: none) since the last report, and its status; clears it.
cdef int take_refusal(AllocatorCore* c, C_Status* st) noexcept nogil
# Report it (no lock held): PluginError from empty_cache (warn=0), a RuntimeWarning from the other release points.
cdef int report_refusal(AllocatorCore* c, int call, C_Status st, int64_t released, int64_t reserved,
                        bint warn) except -1 with gil
# Size of the chunk to ask for on a miss of `size` bytes (alloc_policy.chunk_for_miss, after consolidation).
cdef size_t growth_size(AllocatorCore* c, int pool, uintptr_t stream, size_t size) noexcept nogil

# Expandable segments (docs/expandable_segments.md; c.vmm_on).
# Map the pages not yet mapped under [at, at + size) of free block b of a range (b.chunk.holes != 0).
# With c.may_wait, fails with ERR_WAIT (nothing done) when the donor pages whose frees have run are too few and
# others' frees are queued (alloc_order.want_wait recorded them).
cdef int vmm_back(AllocatorCore* c, Block* b, uintptr_t at, size_t size, AllocError* err) noexcept nogil
# Grow the range of (pool, stream) at its end so that its last block is free and holds `size` bytes (not yet backed).
cdef Block* vmm_grow(AllocatorCore* c, int pool, uintptr_t stream, size_t size, AllocError* err) noexcept nogil
# vmm_grow, then the pages under the block's first `size` bytes mapped: ready to hand out.
cdef Block* vmm_grow_backed(AllocatorCore* c, int pool, uintptr_t stream, size_t size, AllocError* err) noexcept nogil
# Unmap and release every whole free page, trim the ranges' free ends, free empty ranges. Returns bytes released.
cdef size_t vmm_release(AllocatorCore* c, int64_t* kept) noexcept nogil
# Interpreter exit: everything unmapped, released and freed.
cdef void vmm_teardown(AllocatorCore* c) noexcept nogil
# The mapped pages of range ch as (offset, length) runs, at most cap; returns the count.
cdef size_t vmm_mapped_runs(Chunk* ch, size_t g, size_t* out, size_t cap) noexcept nogil

# Where an address lies (lock held).
# The chunk whose [base, base + size) holds ptr, or NULL.
cdef Chunk* chunk_holding(AllocatorCore* c, uintptr_t ptr) noexcept nogil
# 1: the start of a live block, 2: inside a chunk otherwise, 0: not in this allocator.
cdef int owns(AllocatorCore* c, uintptr_t ptr) noexcept nogil
# Bytes from ptr to the end of the bytes requested of the live block holding it (Block.requested, not the rounded
# size); -1 when no live block's [addr, addr + requested] holds it.
cdef int64_t live_extent(AllocatorCore* c, uintptr_t ptr) noexcept nogil
# Whether ptr is the start of a free block (parked in a quick-reuse slot or in the free index): a double free.
cdef int is_free_block_start(AllocatorCore* c, uintptr_t ptr) noexcept nogil
