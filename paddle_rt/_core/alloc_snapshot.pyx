# cython: freethreading_compatible = False
"""The allocator's snapshot (``DeviceAllocator.snapshot``, ``paddle_rt.memory_snapshot``): every segment (chunk, or
expandable range) with its blocks, ordered by address, in PyTorch's ``memory_snapshot`` shape. The segments are
copied under the allocator's lock (no GIL), then turned into Python objects after it is released; likewise its
counters (``DeviceAllocator.stats``, ``paddle_rt.memory_stats``) and its settings (``DeviceAllocator.config``)."""
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc

from libc.stdint cimport int64_t, SIZE_MAX
from libc.string cimport memcpy
from paddle_rt._core.alloc_types cimport (
    AllocatorCore, Block, Chunk, POOL_SMALL, Stat, N_STAT_GROUPS, N_STATS, ST_ACTIVE_BYTES, ST_ALLOCATED_BYTES,
    ST_ACTIVE, ST_ALLOCATION,
)
from paddle_rt._core.alloc_blocks cimport _q_flush, _first_block
from paddle_rt._core.alloc_segment cimport vmm_mapped_runs
from paddle_rt._core.includes.alloc_support cimport prt_chunk_map
from paddle_rt._core.alloc_types cimport AllocConfig

from paddle_rt._core.alloc_config import (
    GROWTH_NAMES, RELEASE_NAMES, ROUND_NAMES, CONSOLIDATE_NAMES, BASE_NAMES, EXPANDABLE_NAMES,
)


cdef list segments(AllocatorCore* c, str device):
    cdef vector[size_t] runs, run_at, tmp
    cdef size_t n, j, i
    cdef vector[Block] blocks
    cdef vector[Chunk] chunks
    cdef prt_chunk_map.iterator it
    cdef Chunk* ch
    cdef Block* b
    with nogil:
        c.cx.mu.lock()
        _q_flush(c)
        it = c.cx.chunks.begin()
        while it != c.cx.chunks.end():
            ch = <Chunk*>(deref(it).second)
            chunks.push_back(ch[0])
            run_at.push_back(runs.size())
            if ch.expandable and c.gran:
                tmp.resize(2 * (ch.size // c.gran + 1))
                n = vmm_mapped_runs(ch, c.gran, tmp.data(), ch.size // c.gran + 1)
                for j in range(2 * n):
                    runs.push_back(tmp[j])
            inc(it)
        run_at.push_back(runs.size())
        # each chunk's blocks, from its first (found through the live table or the free index)
        for i in range(chunks.size()):
            b = _first_block(c, &chunks[i])
            while b != NULL:
                blocks.push_back(b[0])
                b = b.next
        c.cx.mu.unlock()
    segs = []
    bi = 0
    for i in range(chunks.size()):
        seg = {"device": device, "address": chunks[i].base, "total_size": chunks[i].size,
               "stream": chunks[i].stream, "segment_type": "small" if chunks[i].pool == POOL_SMALL else "large",
               "allocated_size": 0, "active_size": 0, "requested_size": 0, "blocks": []}
        if chunks[i].expandable:
            pages = [[runs[j], runs[j + 1]] for j in range(run_at[i], run_at[i + 1], 2)]
            seg.update(expandable=True, granularity=c.gran, reserved_size=chunks[i].vsize,
                       mapped_pages=pages, mapped_size=sum(p[1] for p in pages))
        while bi < blocks.size() and chunks[i].base <= blocks[bi].addr < chunks[i].base + chunks[i].size:
            blk = blocks[bi]
            seg["blocks"].append({"address": blk.addr, "size": blk.size, "requested_size": blk.requested,
                                  "state": "active_allocated" if blk.allocated else "inactive"})
            if blk.allocated:
                seg["allocated_size"] += blk.size
                seg["active_size"] += blk.size
                seg["requested_size"] += blk.requested
            bi += 1
        segs.append(seg)
    return segs


cdef dict counters(AllocatorCore* c):
    cdef Stat st[N_STAT_GROUPS][N_STATS]
    cdef int64_t extra[10]
    cdef int p
    with nogil:
        c.cx.mu.lock()
        _q_flush(c)            # parked blocks are shown merged, as the snapshot shows them
        memcpy(st, c.stats, sizeof(st))
        # no block is pending a stream-ordered free yet: active == allocated (not counted twice on the hot path)
        for p in range(3):
            st[p][ST_ACTIVE_BYTES] = st[p][ST_ALLOCATED_BYTES]
            st[p][ST_ACTIVE] = st[p][ST_ALLOCATION]
        extra[0] = c.num_alloc_retries
        extra[1] = c.num_ooms
        extra[2] = c.num_device_alloc
        extra[3] = c.num_device_free
        extra[4] = c.num_cache_hits
        extra[5] = c.num_release_deferred
        extra[6] = c.num_maps
        extra[7] = c.num_unmaps
        extra[8] = c.num_release_failures
        extra[9] = c.num_free_waits
        c.cx.mu.unlock()
    names = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
             "allocation", "segment", "active", "inactive_split")
    pools = ("all", "small_pool", "large_pool")
    out = {}
    for i in range(N_STATS):
        for p in range(3):
            base = f"{names[i]}.{pools[p]}."
            out[base + "current"] = st[p][i].current
            out[base + "peak"] = st[p][i].peak
            out[base + "allocated"] = st[p][i].allocated
            out[base + "freed"] = st[p][i].freed
    out["num_alloc_retries"] = extra[0]
    out["num_ooms"] = extra[1]
    out["num_device_alloc"] = extra[2]
    out["num_device_free"] = extra[3]
    out["num_cache_hits"] = extra[4]
    out["num_release_deferred"] = extra[5]
    out["num_maps"] = extra[6]
    out["num_unmaps"] = extra[7]
    out["num_release_failures"] = extra[8]
    out["num_free_waits"] = extra[9]
    return out


cdef dict settings(AllocatorCore* c):
    cdef AllocConfig cfg
    with nogil:
        c.cx.mu.lock()
        cfg = c.cfg
        c.cx.mu.unlock()
    return {
        "paddle_compat": bool(cfg.paddle_compat),
        "growth": GROWTH_NAMES[cfg.growth],
        "chunk_size": cfg.chunk_size,
        "max_split_size": None if cfg.max_split_size == SIZE_MAX else cfg.max_split_size,
        "limit": None if cfg.limit == SIZE_MAX else cfg.limit,
        "release": RELEASE_NAMES[cfg.release],
        "small_size": cfg.small_size,
        "small_chunk": cfg.small_chunk,
        "grow_min": cfg.grow_min,
        "grow_step": cfg.grow_step,
        "grow_fraction": cfg.grow_fraction,
        "grow_ratio": cfg.grow_ratio,
        "grow_round": ROUND_NAMES[cfg.grow_round],
        "consolidate": CONSOLIDATE_NAMES[cfg.consolidate],
        "grow_base": BASE_NAMES[cfg.grow_base],
        "grow_exact_credit": cfg.grow_exact_credit,
        "settle_after": cfg.settle_after,
        "grow_requests": cfg.grow_requests,
        "exact_above": cfg.exact_above,
        "small_borrow": bool(cfg.small_borrow),
        "expandable_segments": EXPANDABLE_NAMES[c.expandable],
        "growth_wait_ms": cfg.growth_wait_ns // 1000000,
        "expandable_active": bool(c.vmm_on),
        "granularity": c.gran if c.vmm_on else None,
        "alignment": cfg.alignment,
        "padding": cfg.padding,
    }
