# The caching allocator's types: its enums and structs, shared by allocator.pyx and its helper modules
# (alloc_index.pxd, alloc_policy.pxd, alloc_blocks.pxd, alloc_segment.pyx). allocator.pxd cimports them for users.
from libc.stdint cimport uintptr_t, int64_t, uint64_t
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_Status
from paddle_rt._core.includes.alloc_support cimport prt_alloc_containers
from paddle_rt._core.includes.vmm_ext cimport prt_vmm_fns

cdef enum:
    KIND_DEVICE = 0       # device_memory_allocate / device_memory_deallocate
    KIND_HOST = 1         # host_memory_allocate / host_memory_deallocate (pinned host memory)

cdef enum:
    POOL_SMALL = 0
    POOL_LARGE = 1
    N_STAT_GROUPS = 3     # stats[0] all pools, stats[1 + pool] one pool

cdef enum:
    EXPANDABLE_OFF = 0
    EXPANDABLE_ON = 1     # required: InvalidArgument when the plugin lacks the extension
    EXPANDABLE_AUTO = 2   # on when the plugin exports the extension and its granularity call succeeds

cdef enum:
    N_RANGES = 64         # expandable segments: ranges per allocator (pools x stream tags); beyond, no in-place growth

cdef enum:
    N_QUICK_SLOTS = 64    # quick-reuse slots, by a hash of (size, stream)

cdef enum:
    N_FREE_WAITS = 4      # streams one growth waits for at most (AllocatorCore.wait_tag)

cdef enum:
    GROWTH_ADAPTIVE = 0   # paddle_rt's default: grow from the current demand (see allocator.pyx)
    GROWTH_EXACT = 1      # a miss asks the plugin for exactly the rounded request
    GROWTH_FIXED = 2      # a miss asks for max(request, chunk_size)

cdef enum:
    RELEASE_EMPTY_CACHE = 0   # idle chunks go back to the plugin on empty_cache() and on the OOM ladder only
    RELEASE_ON_FREE = 1       # ... and as soon as a free makes a chunk idle

cdef enum:
    ROUND_NEAREST = 0     # adaptive growth: the nearest whole number of requests (at least one)
    ROUND_UP = 1          # ... the next whole number of requests at or above the target
    ROUND_DOWN = 2        # ... the whole number of requests at or below the target (at least one)
    ROUND_OFF = 3         # ... the target itself
    ROUND_WITHIN = 4      # ... the next whole number at or above the target, but no more than fit in the cap

cdef enum:
    CONSOLIDATE_FOLD = 0      # a large-pool miss gives idle chunks back; the new chunk is at least request + released
    CONSOLIDATE_RELEASE = 1   # ... gives idle chunks back; the new chunk is sized by the growth rule alone
    CONSOLIDATE_OFF = 2       # ... keeps them

cdef enum:
    BASE_RESERVED = 0     # adaptive growth sizes a chunk from everything the allocator holds
    BASE_GROWN = 1        # ... from what it holds minus the chunks made exactly for one request (alloc_policy)

# What went wrong in an allocator call (AllocError.kind), found under the lock and raised after it is released.
cdef enum:
    ERR_NONE = 0
    ERR_OOM = 1
    ERR_PLUGIN = 2
    ERR_FOREIGN = 3
    ERR_DOUBLE_FREE = 4
    ERR_TORN_DOWN = 5
    ERR_BAD_SIZE = 6
    ERR_INTERIOR = 7
    ERR_HOST_OOM = 8
    ERR_PLUGIN_NULL = 9     # the plugin reported success but gave no memory (a plugin bug, not out of memory)
    ERR_OWNED = 10          # raw_free of a block that a live Allocation holds (Block.owned)
    ERR_WAIT = 11           # never raised: growth should first wait for queued frees (AllocatorCore.wait_*)

# Which call of the virtual-memory extension failed (AllocError.call; alloc_errors.VMM_CALL_NAMES has their names).
cdef enum:
    VMM_CALL_NONE = 0       # not the extension: the plugin's allocation hook (device/host_memory_allocate)
    VMM_CALL_RESERVE = 1
    VMM_CALL_CREATE = 2
    VMM_CALL_MAP = 3
    VMM_CALL_MAP_PAGES = 4

# A release-side plugin call the plugin refused (AllocatorCore.rel_call): the books keep what the plugin still holds.
cdef enum:
    REL_NONE = 0
    REL_FREE = 1          # device_memory_deallocate / host_memory_deallocate: the chunk stays, idle
    REL_UNMAP = 2         # the extension's unmap / unmap_pages: the pages stay mapped
    REL_RELEASE = 3       # the extension's release: the physical allocation is held (AllocatorCore.held)
    REL_FREE_RANGE = 4    # the extension's free_range: the empty range stays
    REL_HOST_OOM = 5      # host memory for the bookkeeping ran out (std::bad_alloc caught): nothing was released

# An unmapped physical allocation the plugin refused to release: counted in its pool's reserved bytes, retried.
cdef struct HeldPhys:
    void* handle
    int pool

# One counter of PyTorch's scheme: current, peak, allocated (sum of increases), freed (sum of decreases).
cdef struct Stat:
    int64_t current
    int64_t peak
    int64_t allocated
    int64_t freed

cdef enum:
    ST_ALLOCATED_BYTES = 0
    ST_RESERVED_BYTES = 1
    ST_ACTIVE_BYTES = 2
    ST_INACTIVE_SPLIT_BYTES = 3
    ST_REQUESTED_BYTES = 4
    ST_ALLOCATION = 5
    ST_SEGMENT = 6
    ST_ACTIVE = 7
    ST_INACTIVE_SPLIT = 8
    N_STATS = 9

cdef struct Block

cdef struct Chunk:
    uintptr_t base
    uint64_t serial        # order of creation within its allocator (best fit prefers older chunks on ties)
    size_t size
    uintptr_t stream
    int pool
    int exact              # made exactly for one request (alloc_policy.made_for_one_request): not in the growth base
    # An expandable segment (docs/expandable_segments.md): a reserved virtual range of `vsize` bytes whose blocks cover
    # [base, base + size); physical memory of `gran` bytes per page is mapped under it page by page.
    int expandable
    size_t vsize
    void** phys            # per page of the range: its physical allocation (PaddleRtVmmPhys), NULL while unmapped
    size_t holes           # pages below `size` that are not mapped (0: every block of the range is backed)
    Block* tail            # the block that ends at base + size

cdef struct Block:
    uintptr_t addr
    size_t size            # bytes held (the rounded request, or the whole free block)
    size_t requested       # bytes the caller asked for (0 while free)
    uintptr_t stream       # the stream tag of the chunk it lives in
    Block* prev            # neighbours inside the chunk, by address
    Block* next
    Chunk* chunk
    int allocated          # 0 free (in the best-fit index), 1 allocated, 2 free in a quick-reuse slot (unmerged)
    int counted_split      # 1 while counted in inactive_split_*
    Block* qnext           # next block in its quick-reuse slot (while cached there)
    # The stream layer's order counter at the latest free that made this (free) block, 0 for memory never used
    # (stream.pxd stream_order_now): its memory may leave its stream once that free has run there (free_done). A
    # merged block keeps the latest of its parts, a split remainder its parent's.
    uint64_t free_seq
    int owned              # 1 while an Allocation object holds it (malloc, a pool's blocks): raw_free refuses it;
                           # 0 for raw_malloc's and the C API's pointers (set at each allocation)

cdef struct AllocConfig:
    int paddle_compat
    int growth
    int release
    size_t alignment       # from device_min_chunk_size (1 when missing)
    size_t align_mask      # alignment - 1 when it is a power of two (fast rounding), else 0
    size_t padding         # from device_extra_padding_size (0 when missing)
    size_t chunk_size      # GROWTH_FIXED / paddle_compat: minimum chunk (0 = exact)
    size_t max_split_size  # blocks above it are never split nor used for smaller requests (SIZE_MAX: off)
    size_t limit           # most bytes reserved at once (SIZE_MAX: off)
    size_t small_size      # requests up to it use the small pool (0: one pool)
    size_t small_chunk     # chunk size of the small pool
    size_t grow_min        # adaptive growth of the large pool: the smallest chunk it asks for
    size_t grow_step       # ... the cap's fixed part: a chunk is at most max(grow_step, grow_fraction * reserved)
    double grow_fraction   # ... the cap's proportional part
    double grow_ratio      # ... the target before the cap: grow_ratio * reserved (1: doubling)
    int grow_round         # ... ROUND_*: the target becomes a whole number of requests
    int consolidate        # ... CONSOLIDATE_*: idle chunks before growth
    int grow_base          # ... BASE_*: what the target and the cap are proportional to
    size_t grow_exact_credit   # ... BASE_GROWN: exact chunks count for at most this many missing requests
    size_t grow_requests   # ... a chunk aims at most at this many requests of the missing size (0: no bound)
    size_t settle_after    # ... after this many cache hits since the last large-pool growth, a miss grows by grow_min
    double exact_above     # ... a request at least this fraction of the target gets a chunk of its size (0: off)
    int small_borrow       # a small request that no free small block serves takes a free large block before growth
    int remainder_low      # a split leaves the free remainder at the low end (Paddle's rule), else at the high end
    int ties_by_address    # best fit among equal sizes: the lowest address (Paddle's rule), else the oldest chunk
    int quick_reuse        # freed small blocks wait in quick-reuse slots for a request of exactly their size
    int64_t growth_wait_ns # a growth waits at most this long for queued frees of memory it could use (0: never)

# An error found under the lock, raised after the lock is released.
cdef struct AllocError:
    int kind               # 0 none, 1 OOM, 2 plugin error, 3 invalid pointer, 4 double free, 5 torn down, 6 bad size
    C_Status status
    size_t requested
    uintptr_t ptr
    int64_t allocated      # the device's allocated and reserved bytes when the error was found (read under the lock:
    int64_t reserved       # the message and the trace event must not read the counters without it)
    int call               # ERR_PLUGIN / ERR_PLUGIN_NULL: the call that failed, VMM_CALL_* (0: the allocation hook)

cdef struct AllocatorCore:
    prt_alloc_containers* cx
    C_DeviceInterface* iface
    C_Device cdev
    void* device           # borrowed PyObject* of the Device (devices live as long as the process)
    int kind
    int index              # position in the module's registry
    int torn_down
    AllocConfig cfg
    Stat stats[N_STAT_GROUPS][N_STATS]   # [all, small_pool, large_pool][stat]
    int64_t num_alloc_retries
    int64_t num_ooms
    int64_t num_device_alloc
    int64_t num_device_free
    int64_t num_cache_hits
    uint64_t chunk_serial  # serial number of the next chunk
    Block* spare_blocks    # free list of Block structs
    # Quick reuse (default mode): a freed block waits unmerged in a small slot keyed by (size, stream) for the next
    # request of exactly its size; slots are merged back into the best-fit index before any growth, release,
    # snapshot or configuration change.
    Block* q_head[N_QUICK_SLOTS]
    size_t q_size[N_QUICK_SLOTS]
    uintptr_t q_stream[N_QUICK_SLOTS]
    int q_count[N_QUICK_SLOTS]
    int64_t q_blocks
    int64_t q_bytes        # bytes parked in the quick slots
    int quick              # quick reuse enabled (not in paddle_compat, not with release on free)
    size_t capacity        # device total memory at creation (0: unknown)
    int64_t deferred_pending   # frees waiting for record_stream streams (atomic; see core_wait_deferred)
    int64_t num_release_deferred   # idle chunks kept instead of released because streams were busy (per attempt)
    size_t exact_bytes     # bytes of the held chunks made exactly for one request (Chunk.exact)
    int64_t hits_at_growth # num_cache_hits at the last large-pool growth (alloc_policy.ramp_ended)
    int release_kept       # 1 while idle chunks kept that way may still be cached (release on free sweeps them)
    # Expandable segments (alloc_segment.pyx; docs/expandable_segments.md)
    int expandable         # EXPANDABLE_*: what the configuration asks for
    int vmm_on             # segments grow in place (the configuration asks and the plugin's extension passed)
    size_t gran            # the plugin's granularity (vmm_on)
    prt_vmm_fns vmm        # the plugin's extension (zeroed when it exports none)
    int64_t num_maps       # map / unmap calls made
    int64_t num_unmaps
    Chunk* ranges[N_RANGES]    # the ranges in use, the one a (pool, stream) grows is the last with that pair
    int n_ranges
    # The release side (alloc_segment.pyx "When the plugin refuses"): the last refused call and its status since they
    # were reported (REL_NONE: none), how many were refused, and the physical allocations whose release was refused
    int rel_call
    C_Status rel_status
    int64_t num_release_failures
    HeldPhys* held
    size_t n_held
    size_t cap_held
    # Growth that waits for queued frees (alloc_segment.queued_for_growth; docs/memory.md "Freed memory and queued
    # work"): may_wait is set by core_malloc for one pass under the lock when the caller may wait; a pass that would
    # grow while memory it could use instead has its frees still queued records the streams and order numbers to wait
    # for (at most N_FREE_WAITS) and fails with ERR_WAIT; core_malloc waits without the lock, then tries once more.
    int may_wait
    int n_waits
    int64_t wait_deferred      # ERR_WAIT with record_stream frees pending: deferred_pending as the pass saw it
    uintptr_t wait_tag[N_FREE_WAITS]
    uint64_t wait_seq[N_FREE_WAITS]
    int64_t num_free_waits     # growths that waited for queued frees first
