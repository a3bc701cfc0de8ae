# cython: freethreading_compatible = False
"""The allocator's snapshot (``DeviceAllocator.snapshot``, ``paddle_rt.memory_snapshot``): every segment (chunk, or
expandable range) with its blocks, ordered by address, in PyTorch's ``memory_snapshot`` shape. The segments are
copied under the allocator's lock (no GIL), then turned into Python objects after it is released."""
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc

from paddle_rt._core.alloc_types cimport AllocatorCore, Block, Chunk, POOL_SMALL
from paddle_rt._core.alloc_blocks cimport _q_flush, _first_block
from paddle_rt._core.alloc_segment cimport vmm_mapped_runs
from paddle_rt._core.includes.alloc_support cimport prt_chunk_map


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
