"""The caching allocator (paddle_rt/_core/allocator.pyx): Paddle's rounding and best fit in paddle_compat mode, split
and merge, idle chunks, the OOM ladder through rt_cpu, bad frees, stats and snapshots, a hypothesis state machine,
an 8-thread stress test, buffer/DLPack exports, pinned host memory, configuration and teardown."""
import gc
import gzip
import json
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, precondition, initialize

import paddle_rt
from paddle_rt import plugins
from paddle_rt._core import alloc_config

from conftest import TRACES, TRACES_MISSING, run_python_code, include_dir
from memory_helpers import clean_allocator, hold_stream, run_past

MiB = 1 << 20

# Paddle 3.3.1's requests, as measured: (min_chunk, padding) -> [(request, plugin allocation)].
ABI_TABLE = {
    (256, 0): [(1, 256), (257, 512), (1000, 1024), (4097, 4352), (1048577, 1048832)],
    (4096, 0): [(1, 4096), (4097, 8192), (1048577, 1052672)],
    (64, 0): [(4000, 4032)],
    (256, 64): [(255, 512), (1000, 1280), (4096, 4352), (65536, 65792)],
}


def dev1():
    return paddle_rt.device("rt_cpu:1")


@pytest.fixture
def d1():
    """rt_cpu:1 with a clean allocator (nothing live, nothing cached, default configuration) before and after."""
    yield from clean_allocator(dev1())


def check_consistent(d):
    """Stats add up and agree with the snapshot; blocks tile their segments; the plugin holds what we reserve (an
    expandable segment's reserved bytes are its mapped pages)."""
    s = paddle_rt.memory_stats(d)
    snap = paddle_rt.memory_snapshot(d)
    reserved = sum(seg["mapped_size"] if seg.get("expandable") else seg["total_size"] for seg in snap)
    extent = sum(seg["total_size"] for seg in snap)
    allocated = sum(b["size"] for seg in snap for b in seg["blocks"] if b["state"] == "active_allocated")
    requested = sum(b["requested_size"] for seg in snap for b in seg["blocks"] if b["state"] == "active_allocated")
    cached = sum(b["size"] for seg in snap for b in seg["blocks"] if b["state"] == "inactive")
    split = sum(b["size"] for seg in snap for b in seg["blocks"]
                if b["state"] == "inactive" and len(seg["blocks"]) > 1)
    assert s["reserved_bytes.all.current"] == reserved
    assert s["allocated_bytes.all.current"] == allocated
    assert s["active_bytes.all.current"] == allocated
    assert s["requested_bytes.all.current"] == requested
    assert s["inactive_split_bytes.all.current"] == split
    assert allocated + cached == extent and allocated <= reserved
    assert s["segment.all.current"] == len(snap)
    assert s["allocation.all.current"] == sum(1 for seg in snap for b in seg["blocks"]
                                              if b["state"] == "active_allocated")
    for name in ("allocated_bytes", "reserved_bytes", "requested_bytes", "segment", "allocation"):
        assert (s[f"{name}.all.current"] == s[f"{name}.small_pool.current"] + s[f"{name}.large_pool.current"])
        assert s[f"{name}.all.allocated"] - s[f"{name}.all.freed"] == s[f"{name}.all.current"]
        assert s[f"{name}.all.peak"] >= s[f"{name}.all.current"]
    for seg in snap:
        addr = seg["address"]
        prev_free = False
        for b in seg["blocks"]:
            assert b["address"] == addr
            addr += b["size"]
            free_ = b["state"] == "inactive"
            assert not (free_ and prev_free), "two free neighbours were not merged"
            prev_free = free_
        assert addr == seg["address"] + seg["total_size"]
    if d.type == "rt_cpu":
        assert plugins.rt_cpu_live_bytes(d.index) == reserved
    return s


# ----------------------------------------------------------------------------------------------------------------------
# Rounding and Paddle compatibility
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
@pytest.mark.parametrize("hints", sorted(ABI_TABLE))
def test_rounding_matches_paddle_table(hints):
    """paddle_compat: a miss asks the plugin for exactly what Paddle asks for (the table below, measured on Paddle 3.3.1); default mode rounds
    requests the same way."""
    align, pad = hints
    code = f"""
        import json, paddle_rt
        from paddle_rt import plugins
        out = []
        a = paddle_rt.get_allocator("rt_cpu:0")
        a.configure(paddle_compat=1)
        for req, _ in {ABI_TABLE[hints]!r}:
            before_b, before_n = plugins.rt_cpu_live_bytes(0), plugins.rt_cpu_alloc_calls(0)
            x = paddle_rt.malloc(req)
            out.append((plugins.rt_cpu_live_bytes(0) - before_b, plugins.rt_cpu_alloc_calls(0) - before_n,
                        a.round_size(req), paddle_rt.memory_allocated()))
            x.free(); paddle_rt.empty_cache()
        print(json.dumps(out))
    """
    r = run_python_code(code, env={"RT_CPU_MIN_CHUNK": align, "RT_CPU_EXTRA_PADDING": pad})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for (req, want), (plugin_bytes, calls, rounded, allocated) in zip(ABI_TABLE[hints], got):
        assert plugin_bytes == want, (req, plugin_bytes, want)
        assert calls == 1
        assert rounded == want
        assert allocated == want      # Paddle's "allocated" counts rounded sizes


class PaddleModel:
    """Paddle's auto-growth best-fit rules in plain Python (paddlepaddle 3.3.1's auto_growth_best_fit_allocator): the reference for paddle_compat."""

    def __init__(self, align=256, pad=0, chunk=0):
        self.align, self.pad, self.chunk = align, pad, chunk
        self.free = []          # sorted (size, addr)
        self.blocks = {}        # addr -> [size, free, chunk_base]
        self.chunks = {}        # base -> size
        self.device_allocs = []
        self.next = 1 << 40

    def malloc(self, n, new_base=None):
        import bisect
        size = -(-(n + self.pad) // self.align) * self.align
        i = bisect.bisect_left(self.free, (size, -1))
        if i == len(self.free):
            c = max(size, self.chunk)
            base = new_base() if new_base else self.next
            self.next += c + (1 << 30)
            self.chunks[base] = c
            self.device_allocs.append(c)
            self.blocks[base] = [c, True, base]
            bisect.insort(self.free, (c, base))
            i = bisect.bisect_left(self.free, (size, -1))
        bsize, addr = self.free.pop(i)
        rest = bsize - size
        base = self.blocks[addr][2]
        if rest:
            self.blocks[addr] = [rest, True, base]
            bisect.insort(self.free, (rest, addr))
            addr += rest
        self.blocks[addr] = [size, False, base]
        return addr

    def _neighbours(self, addr):
        base = self.blocks[addr][2]
        keys = sorted(k for k, v in self.blocks.items() if v[2] == base)
        i = keys.index(addr)
        return (keys[i - 1] if i > 0 else None), (keys[i + 1] if i + 1 < len(keys) else None)

    def release(self, addr):
        b = self.blocks[addr]
        b[1] = True
        prev, nxt = self._neighbours(addr)
        if prev is not None and self.blocks[prev][1]:
            self.free.remove((self.blocks[prev][0], prev))
            self.blocks[prev][0] += b[0]
            del self.blocks[addr]
            addr = prev
        if nxt is not None and self.blocks[nxt][1]:
            self.free.remove((self.blocks[nxt][0], nxt))
            self.blocks[addr][0] += self.blocks[nxt][0]
            del self.blocks[nxt]
        import bisect
        bisect.insort(self.free, (self.blocks[addr][0], addr))

    def layout(self):
        """Per chunk (in allocation order), the list of (offset, size, free)."""
        out = []
        for base in self.chunks:
            out.append([(a - base, v[0], v[1]) for a, v in sorted(self.blocks.items()) if v[2] == base])
        return out


def trace_events(name, limit):
    import csv
    with gzip.open(os.path.join(TRACES, name), "rt") as f:
        rows = list(csv.DictReader(f))[:limit]
    return [(r["Action"] == "allocate", r["Pointer"], int(r["Size"])) for r in rows]


@pytest.mark.parametrize("chunk", [0, 3 * MiB])
def test_paddle_compat_replays_like_paddle(d1, chunk):
    """On the first 1500 events of a real trace, paddle_compat asks the plugin for the same sizes in the same order
    as Paddle's rules and ends with the same block layout in every chunk (the remainder at the low end)."""
    if not os.path.exists(os.path.join(TRACES, "resnet18_train.csv.gz")):
        pytest.skip(TRACES_MISSING)
    paddle_rt.set_allocator_config(d1, paddle_compat=1, chunk_size=chunk)
    model = PaddleModel(chunk=chunk)
    live, mlive = {}, {}
    known = set()
    calls0 = paddle_rt.memory_stats(d1)["num_device_alloc"]

    def new_base():        # the model's chunks get the plugin's addresses (best fit breaks ties by address)
        bases = {seg["address"] for seg in paddle_rt.memory_snapshot(d1)} - known
        assert len(bases) == 1, "paddle_compat missed where Paddle's rules hit (or the reverse)"
        known.update(bases)
        return bases.pop()

    for is_alloc, ptr, size in trace_events("resnet18_train.csv.gz", 1500):
        if is_alloc:
            live[ptr] = paddle_rt.raw_malloc(size, d1)
            mlive[ptr] = model.malloc(size, new_base)
            assert mlive[ptr] == live[ptr]
        else:
            paddle_rt.raw_free(live.pop(ptr), d1)
            model.release(mlive.pop(ptr))
    snap = paddle_rt.memory_snapshot(d1)
    s = check_consistent(d1)
    assert s["num_device_alloc"] - calls0 == len(model.device_allocs)
    # chunks in allocation order = the model's; the snapshot is by address, so compare as multisets + layouts
    ours = sorted(([(b["address"] - seg["address"], b["size"], b["state"] == "inactive") for b in seg["blocks"]]
                   for seg in snap), key=repr)
    theirs = sorted(model.layout(), key=repr)
    for p in live.values():
        paddle_rt.raw_free(p, d1)
    assert ours == theirs


# ----------------------------------------------------------------------------------------------------------------------
# Split, merge, best fit, idle chunks
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_split_and_merge_compat(d1):
    paddle_rt.set_allocator_config(d1, paddle_compat=1, chunk_size=MiB)
    a = paddle_rt.raw_malloc(1000, d1)           # 1024 at the high end of a 1 MiB chunk
    snap = paddle_rt.memory_snapshot(d1)
    (seg,) = snap
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [(MiB - 1024, "inactive"), (1024, "active_allocated")]
    assert a == seg["address"] + MiB - 1024
    b = paddle_rt.raw_malloc(4096, d1)           # best fit takes the high end of the remainder
    assert b == a - 4096
    c = paddle_rt.raw_malloc(256, d1)
    assert c == b - 256
    check_consistent(d1)
    paddle_rt.raw_free(b, d1)                    # a hole between c and a: no merge possible
    snap = paddle_rt.memory_snapshot(d1)
    assert [b_["state"] for b_ in snap[0]["blocks"]] == ["inactive", "active_allocated", "inactive",
                                                         "active_allocated"]
    assert paddle_rt.memory_stats(d1)["inactive_split_bytes.all.current"] == MiB - 1024 - 256
    d = paddle_rt.raw_malloc(4000, d1)           # best fit: the 4096 hole (smaller than the big remainder)
    assert d == b
    paddle_rt.raw_free(d, d1)
    paddle_rt.raw_free(c, d1)                    # merges with the low remainder and the hole
    snap = paddle_rt.memory_snapshot(d1)
    assert [(b_["size"], b_["state"]) for b_ in snap[0]["blocks"]] == [(MiB - 1024, "inactive"),
                                                                       (1024, "active_allocated")]
    paddle_rt.raw_free(a, d1)
    snap = paddle_rt.memory_snapshot(d1)
    assert [(b_["size"], b_["state"]) for b_ in snap[0]["blocks"]] == [(MiB, "inactive")]
    assert paddle_rt.memory_stats(d1)["inactive_split_bytes.all.current"] == 0
    check_consistent(d1)
    assert paddle_rt.empty_cache(d1) == MiB
    assert plugins.rt_cpu_live_bytes(1) == 0


def test_best_fit_oldest_chunk_on_tie(d1):
    """Among free blocks of the best size the oldest chunk serves, wherever the plugin put it: placement does not
    depend on addresses, so a sequence of requests gives the same figures in any process."""
    paddle_rt.set_allocator_config(d1, growth="exact", small_size=0)
    ptrs = [paddle_rt.raw_malloc(8192, d1) for _ in range(4)]
    for p in reversed(ptrs):
        paddle_rt.raw_free(p, d1)                # four idle 8 KiB chunks of the same size, freed newest first
    assert paddle_rt.raw_malloc(8192, d1) == ptrs[0]
    paddle_rt.raw_free(ptrs[0], d1)


def test_paddle_compat_best_fit_lowest_address_on_tie(d1):
    paddle_rt.set_allocator_config(d1, paddle_compat=True, chunk_size=8192)
    ptrs = [paddle_rt.raw_malloc(8192, d1) for _ in range(4)]
    for p in ptrs:
        paddle_rt.raw_free(p, d1)
    lowest = min(ptrs)
    assert paddle_rt.raw_malloc(8192, d1) == lowest
    paddle_rt.raw_free(lowest, d1)
    paddle_rt.empty_cache(d1)


def test_default_split_puts_allocation_low(d1):
    paddle_rt.set_allocator_config(d1, growth="fixed", chunk_size=MiB)
    a = paddle_rt.raw_malloc(100_000, d1)
    (seg,) = paddle_rt.memory_snapshot(d1)
    assert a == seg["address"]
    b = paddle_rt.raw_malloc(100_000, d1)
    assert b == a + paddle_rt.get_allocator(d1).round_size(100_000)
    paddle_rt.raw_free(a, d1)
    paddle_rt.raw_free(b, d1)
    check_consistent(d1)


def test_small_pool_separates_small_requests(d1):
    paddle_rt.get_allocator(d1).configure(expandable_segments=0)     # with segments, every size shares one range
    small = paddle_rt.raw_malloc(8, d1)
    big = paddle_rt.raw_malloc(4 * MiB, d1)
    snap = paddle_rt.memory_snapshot(d1)
    types = {seg["segment_type"] for seg in snap}
    assert types == {"small", "large"}
    s = check_consistent(d1)
    assert s["allocated_bytes.small_pool.current"] == 256
    assert s["allocated_bytes.large_pool.current"] == 4 * MiB
    paddle_rt.raw_free(small, d1)
    paddle_rt.raw_free(big, d1)


def test_idle_chunk_release_on_empty_cache_and_on_free(d1):
    # small_borrow off: b in the small pool's own chunk (with it on, b would take the free end of a's chunk and keep
    # that chunk from being idle: tests/test_alloc_policy.py)
    paddle_rt.set_allocator_config(d1, small_borrow=0, expandable_segments=0)
    a = paddle_rt.malloc(3 * MiB, d1)
    b = paddle_rt.malloc(100, d1)
    reserved = paddle_rt.memory_reserved(d1)
    a.free()
    assert paddle_rt.memory_reserved(d1) == reserved          # cached, not released
    assert paddle_rt.memory_stats(d1)["num_device_free"] == 0
    released = paddle_rt.empty_cache(d1)
    assert released >= 3 * MiB
    assert paddle_rt.memory_reserved(d1) == reserved - released
    assert plugins.rt_cpu_live_bytes(1) == paddle_rt.memory_reserved(d1)   # the small chunk is pinned by b
    b.free()
    paddle_rt.empty_cache(d1)
    assert plugins.rt_cpu_live_bytes(1) == 0
    paddle_rt.set_allocator_config(d1, release="free")
    c = paddle_rt.malloc(3 * MiB, d1)
    assert paddle_rt.memory_reserved(d1) > 0
    c.free()
    assert paddle_rt.memory_reserved(d1) == 0 and plugins.rt_cpu_live_bytes(1) == 0


def test_adaptive_growth_consolidates_idle_chunks(d1):
    """consolidate:fold: a miss in the large pool gives back the pool's idle chunks and asks for one chunk covering
    them (the default, consolidate:release, sizes the new chunk by the rule alone: tests/test_alloc_policy.py)."""
    paddle_rt.set_allocator_config(d1, growth="exact", expandable_segments=0)
    xs = [paddle_rt.raw_malloc(5 * MiB, d1) for _ in range(3)]
    for x in xs:
        paddle_rt.raw_free(x, d1)
    paddle_rt.set_allocator_config(d1, growth="adaptive", consolidate="fold")
    before = paddle_rt.memory_stats(d1)
    y = paddle_rt.raw_malloc(6 * MiB, d1)                    # fits none of the 5 MiB idle chunks
    after = paddle_rt.memory_stats(d1)
    assert after["num_device_free"] - before["num_device_free"] == 3
    assert after["num_device_alloc"] - before["num_device_alloc"] == 1
    assert after["reserved_bytes.all.current"] == 21 * MiB   # 15 released + 6 asked, in one chunk
    z = [paddle_rt.raw_malloc(5 * MiB, d1) for _ in range(3)]  # now served from the cache
    assert paddle_rt.memory_stats(d1)["num_device_alloc"] == after["num_device_alloc"]
    for p in z + [y]:
        paddle_rt.raw_free(p, d1)
    check_consistent(d1)


def test_max_split_size(d1):
    paddle_rt.set_allocator_config(d1, growth="exact", max_split_size=MiB, small_size=0)
    big = paddle_rt.raw_malloc(4 * MiB, d1)
    paddle_rt.raw_free(big, d1)
    small = paddle_rt.raw_malloc(4096, d1)                 # must not split the oversize block
    assert paddle_rt.memory_stats(d1)["segment.all.current"] == 2
    big2 = paddle_rt.raw_malloc(3 * MiB, d1)               # an oversize request takes it whole (no split)
    assert big2 == big
    snap = {seg["address"]: seg for seg in paddle_rt.memory_snapshot(d1)}
    assert len(snap[big]["blocks"]) == 1
    paddle_rt.raw_free(small, d1)
    paddle_rt.raw_free(big2, d1)
    check_consistent(d1)


# ----------------------------------------------------------------------------------------------------------------------
# Bad frees
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_bad_frees_raise_and_change_nothing(d1):
    p = paddle_rt.raw_malloc(1000, d1)
    q = paddle_rt.raw_malloc(1000, d1)
    paddle_rt.raw_free(q, d1)
    before = paddle_rt.memory_stats(d1), paddle_rt.memory_snapshot(d1)

    with pytest.raises(paddle_rt.InvalidArgument, match="double free"):
        paddle_rt.raw_free(q, d1)
    with pytest.raises(paddle_rt.InvalidArgument, match="not the start"):
        paddle_rt.raw_free(p + 8, d1)
    with pytest.raises(paddle_rt.InvalidArgument, match="not allocated by paddle_rt"):
        paddle_rt.raw_free(0x1234567, d1)
    with pytest.raises(paddle_rt.InvalidArgument, match="not allocated by paddle_rt"):
        paddle_rt.raw_free(0x1234567)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"wrong device.*rt_cpu:1"):
        paddle_rt.raw_free(p, "rt_cpu:0")
    with pytest.raises(paddle_rt.InvalidArgument):
        paddle_rt.raw_free(0)
    with pytest.raises(paddle_rt.InvalidArgument):
        paddle_rt.raw_free(-5)
    with pytest.raises(TypeError):
        paddle_rt.raw_free("0x10")
    assert (paddle_rt.memory_stats(d1), paddle_rt.memory_snapshot(d1)) == before
    paddle_rt.raw_free(p)                                 # without a device: the owner is found
    check_consistent(d1)

    a = paddle_rt.malloc(10, d1)
    a.free()
    with pytest.raises(paddle_rt.InvalidArgument, match="already freed"):
        a.free()
    with pytest.raises(paddle_rt.InvalidArgument, match="already freed"):
        paddle_rt.free(a)
    with pytest.raises(TypeError):
        paddle_rt.free(123)
    check_consistent(d1)


def test_bad_sizes(d1):
    with pytest.raises(paddle_rt.InvalidArgument):
        paddle_rt.malloc(-1, d1)
    with pytest.raises(paddle_rt.InvalidArgument):
        paddle_rt.malloc(1 << 64, d1)
    with pytest.raises(TypeError):
        paddle_rt.malloc(1.5, d1)
    z = paddle_rt.malloc(0, d1)                           # a zero-byte request still gets a distinct block
    assert z.size == 0 and z.ptr != 0
    z.free()
    assert paddle_rt.memory_allocated(d1) == 0


# ----------------------------------------------------------------------------------------------------------------------
# Out of memory
# ----------------------------------------------------------------------------------------------------------------------
OOM_CHILD = r"""
import json, paddle_rt
from paddle_rt import plugins
MiB = 1 << 20
out = {}
d = paddle_rt.device("rt_cpu:0")
x = paddle_rt.malloc(6 * MiB)            # one chunk of 6 MiB (the adaptive chunk is cut to the exact size on OOM)
x.free()                                  # cached: idle
before = paddle_rt.memory_stats()
y = paddle_rt.malloc(7 * MiB)            # needs the ladder: release the idle 6 MiB chunk, retry
s = paddle_rt.memory_stats()
out["retries"] = s["num_alloc_retries"] - before["num_alloc_retries"]
out["reserved_after_retry"] = s["reserved_bytes.all.current"]
snap_before = paddle_rt.memory_snapshot()
st_before = paddle_rt.memory_stats()
try:
    paddle_rt.malloc(5 * MiB)
    out["oom"] = None
except paddle_rt.OutOfMemoryError as e:
    out["oom"] = dict(msg=str(e), requested=e.requested, allocated=e.allocated, reserved=e.reserved,
                      capacity=e.capacity, free=e.free, device=e.device, is_memerr=isinstance(e, MemoryError))
st_after = paddle_rt.memory_stats()
out["unchanged"] = paddle_rt.memory_snapshot() == snap_before
out["ooms"] = st_after["num_ooms"] - st_before["num_ooms"]
same = {k: v for k, v in st_after.items() if k not in ("num_ooms", "num_alloc_retries")}
same_b = {k: v for k, v in st_before.items() if k not in ("num_ooms", "num_alloc_retries")}
out["stats_unchanged"] = same == same_b
y.free()
z = paddle_rt.malloc(5 * MiB)             # works again (the cached 7 MiB block is split)
z.free()
paddle_rt.empty_cache()
out["live"] = plugins.rt_cpu_live_bytes(0)
print(json.dumps(out))
"""


@pytest.mark.parametrize("conf,retries", [("growth:exact,expandable_segments:0", 1), ("paddle_compat:1", 1),
                                          ("expandable_segments:0", 0)])
def test_oom_ladder_through_capacity(conf, retries):
    """The idle 6 MiB chunk goes back before a 7 MiB request on a 10 MiB device: through the OOM ladder (a retry),
    or, in the default adaptive mode, already by consolidation on the miss (chunks: expandable segments off; their
    ladder is in test_expandable_segments.py)."""
    r = run_python_code(OOM_CHILD, env={"RT_CPU_MEMORY_BYTES": 10 * MiB, "PADDLE_RT_ALLOC_CONF": conf})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["retries"] == retries
    assert out["reserved_after_retry"] == 7 * MiB
    oom = out["oom"]
    assert oom is not None and oom["is_memerr"]
    assert oom["requested"] == 5 * MiB and oom["allocated"] == 7 * MiB and oom["reserved"] == 7 * MiB
    assert oom["capacity"] == 10 * MiB and oom["free"] == 3 * MiB and oom["device"] == "rt_cpu:0"
    for text in ("rt_cpu:0", "Tried to allocate 5.00 MiB", "total capacity of 10.00 MiB", "3.00 MiB is free",
                 "7.00 MiB is allocated", "0 B is reserved but unallocated", "max_split_size"):
        assert text in oom["msg"], (text, oom["msg"])
    assert out["unchanged"] and out["stats_unchanged"] and out["ooms"] == 1
    assert out["live"] == 0


def test_injected_failures_are_oom_and_retried():
    code = r"""
import json, paddle_rt
from paddle_rt import plugins
res = []
for i in range(6):
    try:
        a = paddle_rt.malloc((i + 1) * (3 << 20))
        res.append("ok")
    except paddle_rt.OutOfMemoryError as e:
        res.append("oom")
s = paddle_rt.memory_stats()
print(json.dumps([res, s["num_ooms"], s["num_alloc_retries"], plugins.rt_cpu_alloc_calls(0)]))
"""
    # every 2nd call fails: the adaptive chunk fails, the exact retry succeeds -> never an OOM
    chunks = {"PADDLE_RT_ALLOC_CONF": "expandable_segments:0"}     # the chunk path's ladder (adaptive, then exact)
    r = run_python_code(code, env={"RT_CPU_FAIL_ALLOC_EVERY": 2, **chunks})
    assert r.returncode == 0, r.stderr
    res, ooms, retries, calls = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == ["ok"] * 6 and ooms == 0
    # after the 1st call, every call fails: the ladder runs to the end and raises, nothing leaks
    r = run_python_code(code, env={"RT_CPU_FAIL_ALLOC_AFTER": 1, **chunks})
    assert r.returncode == 0, r.stderr
    res, ooms, retries, calls = json.loads(r.stdout.strip().splitlines()[-1])
    assert res[0] == "ok" and "oom" in res and ooms >= 1 and retries >= ooms


def test_limit(d1):
    paddle_rt.set_allocator_config(d1, limit="4MiB")
    a = paddle_rt.malloc(3 * MiB, d1)
    with pytest.raises(paddle_rt.OutOfMemoryError, match="limit is 4.00 MiB"):
        paddle_rt.malloc(2 * MiB, d1)
    assert paddle_rt.memory_reserved(d1) <= 4 * MiB
    a.free()
    b = paddle_rt.malloc(4 * MiB, d1)                 # the ladder releases the idle chunk, then fits
    b.free()
    paddle_rt.set_allocator_config(d1, limit=0.5)      # fraction of the device's total memory
    free_, total = d1.memory_info()
    assert paddle_rt.allocator_config(d1)["limit"] == total // 2


@pytest.fixture(scope="module")
def erring_plugin(tmp_path_factory):
    """A plugin whose device_memory_allocate returns C_ERROR for requests of 1 GiB or more and has no host memory."""
    src = tmp_path_factory.mktemp("erring") / "erring.c"
    src.write_text(r'''
#define DEVICE_TYPE "td_alloc_err"
#include "tp_common.h"
static C_Status err_alloc(const C_Device device, void** ptr, size_t size) {
  if (size >= ((size_t)1 << 30)) return C_ERROR;
  return tp_device_memory_allocate(device, ptr, size);
}
void InitPlugin(CustomRuntimeParams* params) {
  TP_INIT_PLUGIN(params);  /* version, type names, the ten required hooks (tp_common.h) */
  params->interface->device_memory_allocate = err_alloc;
}
''')
    out = src.parent / "erring.so"
    tp = os.path.join(os.path.dirname(__file__), "plugins")
    r = subprocess.run(["gcc", "-std=gnu11", "-O1", "-shared", "-fPIC", "-pthread", f"-I{include_dir()}", f"-I{tp}",
                        str(src), "-o", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot build the test plugin (a broken test plugin is a failure, not a skip): {r.stderr}")
    return paddle_rt.load_plugin(str(out))


def test_plugin_error_status_is_plugin_error(erring_plugin):
    d = paddle_rt.device("td_alloc_err:0")
    with pytest.raises(paddle_rt.PluginError) as ei:
        paddle_rt.malloc(1 << 30, d)
    assert ei.value.call == "device_memory_allocate" and ei.value.status == 3
    assert "td_alloc_err:0" in str(ei.value)
    assert paddle_rt.memory_stats(d)["num_ooms"] == 0
    a = paddle_rt.malloc(1000, d)                      # still usable
    with pytest.raises(BufferError, match="not host-addressable"):
        memoryview(a)
    with pytest.raises(BufferError):
        a.__dlpack__()
    a.free()
    with pytest.raises(paddle_rt.NotSupportedError, match="host_memory_allocate"):
        paddle_rt.malloc_host(10, d)
    paddle_rt.empty_cache(d)


# ----------------------------------------------------------------------------------------------------------------------
# Python API: Allocation, exports, host memory, configuration
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_allocation_api(d1):
    a = paddle_rt.malloc(1000, d1)
    assert a.size == 1000 and a.device is d1 and a.ptr % 256 == 0 and int(a) == a.ptr
    with paddle_rt.malloc(50, d1) as b:
        assert not b.freed
    assert b.freed
    a.free()
    assert a.freed
    c = paddle_rt.malloc(123, d1)
    del c
    gc.collect()
    assert paddle_rt.memory_allocated(d1) == 0


def test_buffer_numpy_dlpack(d1):
    a = paddle_rt.malloc(4096, d1)
    v = np.asarray(a)
    assert v.dtype == np.uint8 and v.shape == (4096,)
    v[:] = 9
    assert np.frombuffer(memoryview(a), dtype=np.uint8)[100] == 9
    assert v.__array_interface__["data"][0] == a.ptr   # zero copy
    with pytest.raises(BufferError, match="exported"):
        a.free()
    del v
    gc.collect()
    w = np.from_dlpack(a)
    assert w.__array_interface__["data"][0] == a.ptr and w[5] == 9
    assert a.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        a.free()
    ref = weakref_of(a)
    del a
    gc.collect()
    assert ref() is not None                            # the view keeps the Allocation alive
    assert w[0] == 9
    del w
    gc.collect()
    assert ref() is None
    assert paddle_rt.memory_allocated(d1) == 0
    cap = paddle_rt.malloc(64, d1)
    capsule = cap.__dlpack__()                          # never consumed: the capsule cleans up
    del capsule
    cap.free()
    ai = paddle_rt.malloc(16, d1)
    assert ai.__array_interface__["shape"] == (16,)
    ai.free()
    with pytest.raises(BufferError, match="freed"):
        memoryview(ai)


def weakref_of(obj):
    import weakref
    return weakref.ref(obj)


def test_host_addressable_env(erring_plugin, run_python):
    """A device type listed in PADDLE_RT_HOST_ADDRESSABLE exports its memory (the test plugin's memory is host
    memory); unlisted, the same export raises BufferError (checked in test_plugin_error_status_is_plugin_error)."""
    code = f"""
import numpy as np, paddle_rt
paddle_rt.load_plugin({erring_plugin.path!r})
a = paddle_rt.malloc(10, "td_alloc_err:0")
v = np.asarray(a); v[:] = 5
print("ok", len(memoryview(a)), int(np.from_dlpack(a)[3]))
"""
    r = run_python(code, env={"PADDLE_RT_HOST_ADDRESSABLE": "other_type, td_alloc_err"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-3:] == ["ok", "10", "5"]
    r = run_python(code, env={"PADDLE_RT_HOST_ADDRESSABLE": None})
    assert r.returncode != 0 and "not host-addressable" in r.stderr


def test_malloc_host(d1):
    before = plugins.rt_cpu_host_live_bytes()
    h = paddle_rt.malloc_host(1000, d1)
    assert plugins.rt_cpu_host_live_bytes() > before
    np.asarray(h)[:] = 3
    h.free()
    a = paddle_rt.get_allocator(d1, kind="host")
    assert a.stats()["allocated_bytes.all.current"] == 0
    paddle_rt.empty_cache(d1)
    assert plugins.rt_cpu_host_live_bytes() == before


def test_config_validation(d1, run_python):
    with pytest.raises(paddle_rt.InvalidArgument, match="bogus"):
        paddle_rt.set_allocator_config(d1, bogus=1)
    with pytest.raises(paddle_rt.InvalidArgument, match="growth"):
        paddle_rt.set_allocator_config(d1, growth="fast")
    with pytest.raises(paddle_rt.InvalidArgument, match="limit"):
        paddle_rt.set_allocator_config(d1, limit=1.5)
    with pytest.raises(paddle_rt.InvalidArgument, match="chunk_size"):
        paddle_rt.set_allocator_config(d1, chunk_size="12 parsecs")
    assert paddle_rt.allocator_config(d1)["growth"] == "adaptive"
    paddle_rt.set_allocator_config(d1, chunk_size="2MiB")
    assert paddle_rt.allocator_config(d1)["growth"] == "fixed"
    assert paddle_rt.allocator_config(d1)["chunk_size"] == 2 * MiB
    x = paddle_rt.malloc(10, d1)
    with pytest.raises(paddle_rt.InvalidArgument, match="holds no memory"):
        paddle_rt.set_allocator_config(d1, paddle_compat=1)
    x.free()
    r = run_python("import paddle_rt; print(paddle_rt.allocator_config())",
                   env={"PADDLE_RT_ALLOC_CONF": "paddle_compat:1,limit:64M,release:free"})
    assert r.returncode == 0, r.stderr
    assert "'paddle_compat': True" in r.stdout and f"'limit': {64 * MiB}" in r.stdout and "'free'" in r.stdout
    r = run_python("import paddle_rt; paddle_rt.malloc(1)", env={"PADDLE_RT_ALLOC_CONF": "nope:1"})
    assert r.returncode != 0 and "PADDLE_RT_ALLOC_CONF" in r.stderr and "nope" in r.stderr


def test_teardown_returns_everything(run_python):
    code = r"""
import atexit, paddle_rt
from paddle_rt import plugins
keep = [paddle_rt.malloc(1 << 20), paddle_rt.malloc(10), paddle_rt.malloc_host(100)]
paddle_rt.malloc(3 << 20).free()
def check():
    print("live", plugins.rt_cpu_live_bytes(0), plugins.rt_cpu_host_live_bytes(), flush=True)
    keep[0].free()     # after teardown: harmless
    del keep[:]
from paddle_rt._core import device
device.register_teardown(check, 99)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "live 0 0" in r.stdout
    assert "Traceback" not in r.stderr


# ----------------------------------------------------------------------------------------------------------------------
# Property test and threads
# ----------------------------------------------------------------------------------------------------------------------
class AllocMachine(RuleBasedStateMachine):
    """Random alloc/free of random sizes on rt_cpu:1 in a random configuration."""

    @initialize(conf=st.sampled_from([{}, {"paddle_compat": 1}, {"release": "free"}, {"growth": "exact"},
                                      {"max_split_size": 1 << 20}, {"small_size": 0},
                                      {"paddle_compat": 1, "chunk_size": 1 << 20}, {"expandable_segments": 0},
                                      {"expandable_segments": 0, "max_split_size": 1 << 20}]))
    def setup(self, conf):
        self.d = dev1()
        self.a = paddle_rt.get_allocator(self.d)
        gc.collect()
        self.a.empty_cache()
        self.a.configure(**conf)
        self.live = {}
        self.align = self.a.config()["alignment"]

    @rule(size=st.one_of(st.integers(0, 600), st.integers(0, 70_000), st.integers(0, 6 << 20)))
    def alloc(self, size):
        p = paddle_rt.raw_malloc(size, self.d)
        assert p not in self.live
        self.live[p] = size

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        p = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[p]
        paddle_rt.raw_free(p, self.d)

    @rule()
    def empty(self):
        self.a.empty_cache()

    @invariant()
    def consistent(self):
        if not hasattr(self, "d"):
            return
        rounded = {p: self.a.round_size(n) for p, n in self.live.items()}
        spans = sorted((p, p + rounded[p]) for p in self.live)
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert a1 <= b0, "two live blocks overlap"
        assert all(p % self.align == 0 for p in self.live)
        s = check_consistent(self.d)
        assert s["requested_bytes.all.current"] == sum(self.live.values())
        assert s["allocation.all.current"] == len(self.live)

    def teardown(self):
        if not hasattr(self, "d"):
            return
        for p in list(self.live):
            paddle_rt.raw_free(p, self.d)
        self.a.empty_cache()
        assert plugins.rt_cpu_live_bytes(1) == 0
        assert self.a.stats()["reserved_bytes.all.current"] == 0
        self.a.configure(**{k: None for k in alloc_config.CONF_KEYS})


TestAllocMachine = AllocMachine.TestCase
TestAllocMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


def test_eight_threads_no_overlap(d1):
    """8 threads allocate, fill with their own byte, check and free; any overlap corrupts another thread's data."""
    errors = []
    stop = threading.Event()

    def work(tid):
        rng = random.Random(tid)
        mine = []
        try:
            for i in range(1500):
                if mine and (rng.random() < 0.45 or len(mine) > 40):
                    a, tag = mine.pop(rng.randrange(len(mine)))
                    v = np.asarray(a)
                    if not (v == tag).all():
                        errors.append(f"thread {tid}: block 0x{a.ptr:x} was overwritten")
                    del v
                    a.free()
                else:
                    n = rng.choice([8, 100, 3000, 70_000, 1 << 20, 3 << 20])
                    a = paddle_rt.malloc(n, d1)
                    tag = (tid * 31 + i) % 251 + 1
                    np.asarray(a)[:] = tag
                    mine.append((a, tag))
            for a, tag in mine:
                if not (np.asarray(a) == tag).all():
                    errors.append(f"thread {tid}: overwritten at the end")
                a.free()
        except BaseException as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not errors, errors[:5]
    s = check_consistent(d1)
    assert s["allocation.all.current"] == 0
    paddle_rt.empty_cache(d1)
    assert plugins.rt_cpu_live_bytes(1) == 0


def test_allocator_functions_straight_through_the_allocator(d1):
    """allocator_functions(stream_ordered=False): C function pointers in PyTorch's pluggable-allocator shape over the
    caching allocator's nogil core, called through ctypes; errors are NULL plus allocator_functions_error(), the one
    error model of both kinds."""
    import ctypes
    a, f = paddle_rt.allocator_functions(d1, stream_ordered=False)
    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(a)
    free_ = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(f)
    p = alloc(1000, 1, None)
    assert p and paddle_rt.get_allocator(d1).owns(p)
    assert paddle_rt.memory_allocated(d1) == 1024
    free_(p, 1000, 1, None)
    assert paddle_rt.memory_allocated(d1) == 0
    assert paddle_rt.allocator_functions_error() is None
    assert alloc(10, 99, None) is None                  # no such device: NULL
    err = paddle_rt.allocator_functions_error()
    assert isinstance(err, paddle_rt.InvalidArgument) and "index 99" in str(err)
    assert alloc(1 << 62, 1, None) is None              # OOM: NULL, the error kept for allocator_functions_error
    assert isinstance(paddle_rt.allocator_functions_error(), paddle_rt.OutOfMemoryError)
    free_(12345, 8, 1, None)                            # a foreign pointer: nothing happens, the error is kept
    assert isinstance(paddle_rt.allocator_functions_error(), paddle_rt.InvalidArgument)
    assert paddle_rt.allocator_functions_error() is None


def test_cython_api_from_another_module(d1):
    """paddle_rt.bench._alloc_kernels cimports the public .pxd and runs core_malloc/core_free in nogil loops."""
    from paddle_rt.bench import _alloc_kernels as B
    sizes = np.array([1 << k for k in range(8, 21)], dtype=np.int64)
    ns = B.core_pairs(d1, sizes, 10)
    assert ns > 0
    held = B.hold_blocks(d1, 100, 4096)
    assert len(set(held)) == 100 and paddle_rt.memory_stats(d1)["allocation.all.current"] == 100
    B.release_blocks(d1, held)
    check_consistent(d1)
    with pytest.raises(paddle_rt.InvalidArgument):          # the error of a nogil core_free is not lost
        B.release_blocks(d1, [held[0]])
    assert paddle_rt.memory_allocated(d1) == 0


def test_peak_and_accumulated_stats(d1):
    a = paddle_rt.malloc(3 * MiB, d1)
    b = paddle_rt.malloc(1000, d1)
    peak_alloc = paddle_rt.max_memory_allocated(d1)
    assert peak_alloc == paddle_rt.memory_allocated(d1) == 3 * MiB + 1024
    a.free()
    assert paddle_rt.max_memory_allocated(d1) == peak_alloc
    assert paddle_rt.max_memory_reserved(d1) >= paddle_rt.memory_reserved(d1)
    paddle_rt.reset_peak_memory_stats(d1)
    assert paddle_rt.max_memory_allocated(d1) == 1024
    assert paddle_rt.max_memory_reserved(d1) == paddle_rt.memory_reserved(d1)
    s = paddle_rt.memory_stats("rt_cpu:1")                 # a device string works too
    assert s["allocation.all.allocated"] == 2 and s["allocation.all.freed"] == 1
    assert s["requested_bytes.all.current"] == 1000
    paddle_rt.reset_accumulated_memory_stats(d1)
    s = paddle_rt.memory_stats(d1)
    assert s["allocation.all.allocated"] == 0 and s["allocation.all.current"] == 1
    assert s["num_device_alloc"] == 0
    b.free()
    assert paddle_rt.memory_allocated(d1) == 0


@pytest.mark.parametrize("conf", [{}, {"paddle_compat": 1}, {"release": "free"}])
def test_eight_threads_nogil_stress(d1, conf):
    """8 threads run random alloc/fill/check/free loops through the C API without the GIL (true concurrency on the
    allocator's lock); a block shared by two threads would show the other thread's fill byte."""
    from paddle_rt.bench import _alloc_kernels as B
    paddle_rt.set_allocator_config(d1, **conf)
    results = [None] * 8

    def run(t):
        results[t] = B.stress_worker(d1, 3000, t + 1, 0x40 + t)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0] * 8
    s = check_consistent(d1)
    assert s["allocation.all.current"] == 0
    paddle_rt.empty_cache(d1)
    assert plugins.rt_cpu_live_bytes(1) == 0


def test_fork_child_cannot_use_the_parents_allocator(run_python):
    code = r"""
import os, sys, paddle_rt
a = paddle_rt.malloc(1000)
p = paddle_rt.raw_malloc(5000)
pid = os.fork()
if pid == 0:
    out = []
    try:
        paddle_rt.malloc(10)
        out.append("allocated")
    except paddle_rt.ForkError:
        out.append("ForkError")
    for free in (a.free, lambda: paddle_rt.raw_free(p), paddle_rt.empty_cache):   # issue 46 item 7
        try:
            free()
            out.append("freed")
        except paddle_rt.ForkError:
            out.append("ForkError")
    paddle_rt.reinitialize_after_fork()
    a.free()                          # the parent's memory: nothing happens in the child
    b = paddle_rt.malloc(10)
    b.free()
    out.append("reinit-ok")
    print(" ".join(out), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
a.free()
paddle_rt.raw_free(p)
print("parent", paddle_rt.memory_allocated(), flush=True)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "ForkError ForkError ForkError ForkError reinit-ok" in r.stdout and "parent 0" in r.stdout


@pytest.mark.parametrize("expandable", [1, 0])
def test_fork_child_never_waits_for_a_lock_a_parent_thread_held(run_python, expandable):
    """Issue 46 item 7: a parent thread is inside the plugin's allocation (rt_cpu's alloc delay), holding the
    allocator's lock, when the main thread forks. In the child every call raises ForkError at once (empty_cache used
    to spin on that lock forever: gdb showed __nanosleep in core_empty_cache); after reinitialize_after_fork the child
    allocates, frees and empties its own cache."""
    code = r"""
import os, threading, time, paddle_rt
from paddle_rt.plugins import rt_cpu_set_fault
paddle_rt.malloc(1).free()
rt_cpu_set_fault("alloc", delay_us=800000)
t = threading.Thread(target=lambda: paddle_rt.malloc(4 << 20).free())   # one or two plugin calls
t.start()
time.sleep(0.3)                      # t is in the plugin's allocation, the allocator's lock held
assert t.is_alive()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    rt_cpu_set_fault("alloc", delay_us=0)
    out = []
    for name, call in (("empty_cache", paddle_rt.empty_cache), ("memory_stats", paddle_rt.memory_stats),
                       ("malloc", lambda: paddle_rt.malloc(10)), ("reset_allocator", paddle_rt.reset_allocator),
                       ("memory_snapshot", paddle_rt.memory_snapshot)):
        try:
            call()
            out.append(name + ":ran")
        except paddle_rt.ForkError:
            out.append(name + ":ForkError")
    paddle_rt.reinitialize_after_fork()
    b = paddle_rt.malloc(3 << 20)
    b.free()
    out.append("released:%d" % paddle_rt.empty_cache())
    os.write(w, " ".join(out).encode())
    os._exit(0)
os.close(w)
deadline = time.monotonic() + 20
while os.waitpid(pid, os.WNOHANG) == (0, 0):
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("CHILD hung")
        break
    time.sleep(0.05)
print("CHILD", os.read(r, 1000).decode())
t.join()
"""
    r = run_python(code, env={"PADDLE_RT_ALLOC_CONF": f"expandable_segments:{expandable}"})
    assert r.returncode == 0, r.stderr
    assert ("CHILD empty_cache:ForkError memory_stats:ForkError malloc:ForkError reset_allocator:ForkError "
            "memory_snapshot:ForkError released:") in r.stdout, r.stdout
    assert "released:0" not in r.stdout


def test_malloc_host_out_of_memory(run_python):
    """A failing host_memory_allocate (C_FAILED) is OutOfMemoryError for pinned memory too."""
    code = r"""
import paddle_rt
try:
    paddle_rt.malloc_host(100)
    print("allocated")
except paddle_rt.OutOfMemoryError as e:
    print("OOM", e.call, "pinned host memory" in str(e), e.requested)
print("device still fine", paddle_rt.malloc(100).size)
"""
    r = run_python(code, env={"RT_CPU_FAIL_HOST_ALLOC_EVERY": 1})
    assert r.returncode == 0, r.stderr
    assert "OOM malloc_host True 100" in r.stdout and "device still fine 100" in r.stdout


NULL_SUCCESS_CHILD = """
import json, paddle_rt
from paddle_rt import plugins
MiB = 1 << 20
out = {}
x = paddle_rt.malloc(6 * MiB)
before, snap = paddle_rt.memory_stats(), paddle_rt.memory_snapshot()
try:
    paddle_rt.malloc(8 * MiB)             # beyond the capacity: rt_cpu answers C_SUCCESS with NULL (RT_CPU_OOM_NULL)
    out["error"] = None
except paddle_rt.PaddleRTError as e:
    out["error"] = dict(type=type(e).__name__, msg=str(e), call=e.call, returned=getattr(e, "returned", None),
                        plugin=getattr(e, "plugin", None), is_oom=isinstance(e, MemoryError))
after = paddle_rt.memory_stats()
out["retries"] = after["num_alloc_retries"] - before["num_alloc_retries"]
out["unchanged"] = paddle_rt.memory_snapshot() == snap
y = paddle_rt.malloc(1 * MiB)             # the device still works
y.free(); x.free(); paddle_rt.empty_cache()
out["live"] = plugins.rt_cpu_live_bytes(0)
print(json.dumps(out))
"""


@pytest.mark.parametrize("conf", ["expandable_segments:0", "paddle_compat:1"])
def test_success_with_null_pointer_is_a_plugin_error(conf):
    """A plugin that reports C_SUCCESS but gives a NULL pointer broke the ABI's contract: PluginError naming the
    plugin, the hook and what it returned, not OutOfMemoryError; no OOM-ladder retries; nothing changes."""
    r = run_python_code(NULL_SUCCESS_CHILD, env={"RT_CPU_MEMORY_BYTES": 10 * MiB, "RT_CPU_OOM_NULL": 1,
                                                 "PADDLE_RT_ALLOC_CONF": conf})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    err = out["error"]
    assert err is not None and err["type"] == "PluginError" and not err["is_oom"]
    assert err["call"] == "device_memory_allocate" and err["returned"] == "a NULL pointer" and err["plugin"] == "rt_cpu"
    for text in ("rt_cpu:0", "plugin 'rt_cpu'", "device_memory_allocate", "C_SUCCESS", "NULL pointer", "C_FAILED"):
        assert text in err["msg"], (text, err["msg"])
    assert out["retries"] == 0 and out["unchanged"] and out["live"] == 0


def test_vendor_plugin_null_success_names_the_plugin(build_plugin, run_python):
    """A third-party plugin that answers an allocation beyond its capacity with C_SUCCESS and NULL: PluginError
    naming the plugin and the hook, never OutOfMemoryError; allocations it can serve still work."""
    so = build_plugin("vendor", {"DEVICE_TYPE": '"vd_nullsucc"', "NULL_SUCCESS": None, "CAPACITY_MIB": 8})
    res = run_python(f"""
import paddle_rt
paddle_rt.load_plugin({str(so)!r})
d = paddle_rt.device("vd_nullsucc:0")
a = paddle_rt.malloc(1 << 20, device=d)
try:
    paddle_rt.malloc(16 << 20, device=d)
except paddle_rt.OutOfMemoryError as e:
    print("OOM", e)
except paddle_rt.PluginError as e:
    print("PLUGIN|" + str(e) + "|" + e.call + "|" + e.plugin)
b = paddle_rt.malloc(1 << 20, device=d)
print("still works", b.size)
""", env={"PADDLE_RT_NO_RT_CPU": "1"})
    assert res.returncode == 0, res.stderr
    first, second = res.stdout.strip().splitlines()
    kind, msg, call, plugin = first.split("|")
    assert kind == "PLUGIN" and call == "device_memory_allocate" and plugin == "vd_nullsucc"
    assert "plugin 'vd_nullsucc' device_memory_allocate reported C_SUCCESS but returned a NULL pointer" in msg
    assert second == "still works 1048576"


def test_reset_allocator_starts_afresh(d1):
    """reset_allocator: the cache goes back, counters, peaks and the chunk serial numbers restart (a sequence then
    lands where it lands in a fresh allocator), the configuration stays."""
    paddle_rt.set_allocator_config(d1, growth="exact", small_size=0)

    def sequence():
        ptrs = [paddle_rt.raw_malloc(8192, d1) for _ in range(3)]
        for p in reversed(ptrs):
            paddle_rt.raw_free(p, d1)
        q = paddle_rt.raw_malloc(8192, d1)
        order = ptrs.index(q)
        paddle_rt.raw_free(q, d1)
        return order, paddle_rt.memory_stats(d1)["num_device_alloc"]

    first = sequence()
    paddle_rt.reset_allocator(d1)
    st = paddle_rt.memory_stats(d1)
    assert paddle_rt.memory_reserved(d1) == 0 and paddle_rt.max_memory_reserved(d1) == 0
    assert st["num_device_alloc"] == 0 and st["allocation.all.allocated"] == 0
    assert paddle_rt.allocator_config(d1)["growth"] == "exact"
    assert plugins.rt_cpu_live_bytes(1) == 0
    assert sequence() == first
    check_consistent(d1)


def test_reset_allocator_refuses_while_memory_is_live(d1):
    a = paddle_rt.malloc(1000, device=d1)
    peak = paddle_rt.max_memory_allocated(d1)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"rt_cpu:1: reset of the device allocator: .* still held"):
        paddle_rt.reset_allocator(d1)
    assert paddle_rt.max_memory_allocated(d1) == peak and not a.freed
    a.free()
    paddle_rt.reset_allocator(d1)
    assert paddle_rt.max_memory_allocated(d1) == 0


@pytest.mark.parametrize("expandable", [1, 0])
def test_reset_allocator_racing_an_allocation_keeps_the_counters_true(d1, expandable):
    """Issue 46 item 4: another thread allocates (a new segment, a 2 MiB page in segments mode) after reset's
    empty_cache and before its last step. The reset used to zero the counters after that allocation (reserved 0 and
    0 segments with the page in the snapshot; after the free and empty_cache reserved -2 MiB, segments -1); now its
    check and its zeroing are one hold of the lock: it refuses, and the counters stay true."""
    from paddle_rt._core import allocator as allocator_mod
    paddle_rt.set_allocator_config(d1, expandable_segments=expandable)
    paddle_rt.reset_allocator(d1)
    held = []

    def other_thread_allocates(a):
        t = threading.Thread(target=lambda: held.append(paddle_rt.malloc(70144, device=d1)))
        t.start()
        t.join()

    allocator_mod._reset_pause = other_thread_allocates
    try:
        with pytest.raises(paddle_rt.InvalidArgument, match=r"rt_cpu:1: reset of the device allocator: .* still held"):
            paddle_rt.reset_allocator(d1)
    finally:
        allocator_mod._reset_pause = None
    assert len(held) == 1
    s = paddle_rt.memory_stats(d1)
    assert s["segment.all.current"] == 1 and s["allocated_bytes.all.current"] >= 70144
    check_consistent(d1)
    held.pop().free()
    paddle_rt.empty_cache(d1)
    s = paddle_rt.memory_stats(d1)
    assert (s["reserved_bytes.all.current"], s["segment.all.current"], s["allocated_bytes.all.current"]) == (0, 0, 0)
    check_consistent(d1)
    paddle_rt.reset_allocator(d1)
    assert paddle_rt.memory_stats(d1)["reserved_bytes.all.peak"] == 0


def _allocator_state(d):
    return (paddle_rt.memory_reserved(d), paddle_rt.memory_stats(d), paddle_rt.memory_snapshot(d),
            plugins.rt_cpu_live_bytes(d.index))


def test_refused_reset_allocator_changes_nothing(d1):
    """Issue 27: with 1 MiB live and a 2 MiB idle chunk, the refused reset keeps the idle chunk (it used to give it
    back: reserved 3 MiB -> 1 MiB, num_device_free 0 -> 1), the counters, the peaks and the snapshot."""
    paddle_rt.set_allocator_config(d1, growth="exact", small_size=0, expandable_segments=0)
    live = paddle_rt.malloc(MiB, device=d1)
    try:
        paddle_rt.malloc(2 * MiB, device=d1).free()
        before = _allocator_state(d1)
        assert before[0] == 3 * MiB and before[1]["num_device_free"] == 0
        with pytest.raises(paddle_rt.InvalidArgument,
                           match=r"reset of the device allocator: 1048576 bytes are still held"):
            paddle_rt.reset_allocator(d1)
        assert _allocator_state(d1) == before
    finally:
        live.free()
    paddle_rt.reset_allocator(d1)
    assert paddle_rt.memory_reserved(d1) == 0 and plugins.rt_cpu_live_bytes(1) == 0


def test_reset_allocator_refused_inside_a_stream_callback_changes_nothing(d1):
    """Nothing live, but the call comes from a callback of a busy stream of the device: the idle chunk may still be in
    use by queued work, so the reset is refused and nothing changes (not even the release-deferred counter)."""
    paddle_rt.set_allocator_config(d1, growth="exact", small_size=0, expandable_segments=0)
    paddle_rt.malloc(2 * MiB, device=d1).free()
    s = paddle_rt.Stream(d1)
    seen = []

    def in_callback():
        before = _allocator_state(d1)
        try:
            paddle_rt.reset_allocator(d1)
        except paddle_rt.InvalidArgument as e:
            seen.append((str(e), before, _allocator_state(d1)))

    s.add_callback(in_callback)
    s.synchronize()
    (msg, before, after), = seen
    assert "still held" in msg and before == after and before[0] == 2 * MiB
    paddle_rt.reset_allocator(d1)                  # outside the callback: the chunk goes back
    assert paddle_rt.memory_reserved(d1) == 0
    s.close()


def test_device_allocator_malloc_through_the_registered_allocation_api(monkeypatch):
    """DeviceAllocator.malloc/raw_malloc call what paddle_rt._core.allocation registers at its import (the allocator
    imports nothing of it); without it they say what is missing, and raw_free, which needs nothing above the
    allocator, still works."""
    from paddle_rt._core import allocator as allocator_mod
    a = paddle_rt.get_allocator()
    m = a.malloc(1000)
    assert isinstance(m, paddle_rt.Allocation) and m.size == 1000 and a.owns(m.ptr)
    m.free()
    p = a.raw_malloc(512)
    assert a.owns(p)
    a.raw_free(p)
    assert not a.owns(p)
    with pytest.raises(paddle_rt.InvalidArgument):
        a.raw_free(p)                                       # freed twice
    with pytest.raises(TypeError, match="pointer as int"):
        a.raw_free("0x10")
    with pytest.raises(paddle_rt.InvalidArgument, match="not a valid pointer"):
        a.raw_free(0)
    q = a.raw_malloc(256)
    monkeypatch.setattr(allocator_mod, "_allocation_fns", None)
    for call, run in (("malloc", lambda: a.malloc(64)), ("raw_malloc", lambda: a.raw_malloc(64))):
        with pytest.raises(paddle_rt.NotSupportedError, match=rf"DeviceAllocator.{call}: .*paddle_rt._core.allocation"):
            run()
    a.raw_free(q)
    assert not a.owns(q)


# -- issue 45: memory leaves its stream only once its free has run there (alloc_segment.free_done) ----------------------
def _pending_block(d, s, n, value, h, other=None):
    """A block of n bytes of stream s, freed while a memset of value and a copy into h are queued before the free
    (held by a gate); with `other`, a stream whose work is numbered between s's last work and the free. Returns the
    gate, s's position at the free and the block's address."""
    a = paddle_rt.malloc(n, d, stream=s)
    gate = hold_stream(s)
    paddle_rt.memset_async(a, value, stream=s)
    paddle_rt.memcpy_async(h, a, stream=s)
    at_free = s.position
    if other is not None:
        other.add_callback(lambda: None)
    a.free()
    return gate, at_free, a.ptr


def _chunk_kept(d, ptr, how, s, live):
    """One release point of the allocator (how); then whether the chunk at ptr is still cached."""
    if how == "empty_cache(wait=False)":
        paddle_rt.empty_cache(d, wait=False)
    elif how == "growth":
        live.append(paddle_rt.malloc(24 * MiB, d, stream=s))    # a miss on s: consolidation before growth
    else:
        paddle_rt.malloc(MiB, d, stream=99).free()      # release:free: a free that makes a chunk idle
    return any(seg["address"] == ptr for seg in paddle_rt.memory_snapshot(d))


@pytest.mark.parametrize("interleaved", [False, True], ids=["alone", "interleaved"])
@pytest.mark.parametrize("how", ["empty_cache(wait=False)", "growth", "release:free"])
def test_a_chunk_leaves_its_stream_once_its_free_has_run_there(d1, how, interleaved):
    """A free chunk of stream s is not given back to the plugin while s has queued work before its free (the memset
    would write freed memory), and is once s has run past the free: no synchronize, and s still busy with work queued
    after the free (not "every stream idle"). Interleaved: another stream's work was numbered between s's last work
    and the free (the process-wide order counter moved on), which used to keep the chunk until s completed work
    submitted after the free (stream_core.h first_unfinished_seq). growth_wait_ms=0: the growth does not first wait
    for s's free (test_alloc_segment.py has the waits)."""
    conf = dict(expandable_segments=0, growth_wait_ms=0) if how == "growth" else dict(
        expandable_segments=0, growth="exact", small_size=0)
    if how == "release:free":
        conf["release"] = "free"
    paddle_rt.set_allocator_config(d1, **conf)
    s, t = paddle_rt.Stream(d1), paddle_rt.Stream(d1)
    h = np.zeros(8 * MiB, np.uint8)
    gate, at_free, p = _pending_block(d1, s, 8 * MiB, 7, h, t if interleaved else None)
    later = hold_stream(s)                       # queued after the free
    live = []
    try:
        assert _chunk_kept(d1, p, how, s, live)
        assert paddle_rt.memory_stats(d1)["num_release_deferred"] >= 1
        gate.set()
        run_past(s, at_free)
        assert not s.query() and not later.is_set()
        assert not _chunk_kept(d1, p, how, s, live)
        assert (h == 7).all()
    finally:
        gate.set()
        later.set()
    for x in live:
        x.free()
    for x in (s, t):
        x.synchronize()
        x.close()
    paddle_rt.empty_cache(d1)
    assert paddle_rt.memory_reserved(d1) == 0 and plugins.rt_cpu_live_bytes(1) == 0


@pytest.mark.smoke
def test_empty_cache_without_waiting_gives_back_only_completed_memory(d1):
    """empty_cache(wait=False) never waits: the chunk of t, whose free has run, goes back; the chunk of s, whose free
    is behind queued work, stays cached (counted as deferred) until s has run past it."""
    paddle_rt.set_allocator_config(d1, expandable_segments=0, growth="exact", small_size=0)
    s, t = paddle_rt.Stream(d1), paddle_rt.Stream(d1)
    paddle_rt.malloc(4 * MiB, d1, stream=t).free()
    h = np.zeros(8 * MiB, np.uint8)
    gate, at_free, _ = _pending_block(d1, s, 8 * MiB, 3, h)
    assert paddle_rt.empty_cache(d1, wait=False) == 4 * MiB
    assert paddle_rt.memory_reserved(d1) == 8 * MiB and plugins.rt_cpu_live_bytes(1) == 8 * MiB
    assert not gate.is_set() and not s.query()   # it did not wait
    gate.set()
    run_past(s, at_free)
    assert paddle_rt.empty_cache(d1, wait=False) == 8 * MiB
    assert (h == 3).all()
    assert paddle_rt.memory_reserved(d1) == 0 and plugins.rt_cpu_live_bytes(1) == 0
    for x in (s, t):
        x.close()


@pytest.mark.smoke
@pytest.mark.parametrize("segments", [0, 1])
def test_a_merged_block_waits_for_the_latest_free_of_its_parts(d1, segments):
    """Two halves of one chunk (or of a range's pages): the first freed when its stream had run past it, the second
    behind a pending memset. The merged free block carries the later free (free_seq the max of its parts): it is not
    given back until that free has run too."""
    paddle_rt.set_allocator_config(d1, expandable_segments=segments, growth="exact", small_size=0)
    s = paddle_rt.Stream(d1)
    whole = paddle_rt.malloc(8 * MiB, d1, stream=s)
    whole.free()
    x = paddle_rt.malloc(4 * MiB, d1, stream=s)
    y = paddle_rt.malloc(4 * MiB, d1, stream=s)
    assert {x.ptr, y.ptr} == {whole.ptr, whole.ptr + 4 * MiB}     # one chunk (range), split
    paddle_rt.memset_async(x, 1, stream=s)
    x.free()
    s.synchronize()                              # x's free has run
    h = np.zeros(4 * MiB, np.uint8)
    gate = hold_stream(s)
    paddle_rt.memset_async(y, 2, stream=s)
    paddle_rt.memcpy_async(h, y, stream=s)
    at_free = s.position
    y.free()                                     # merges with x: one free block of 8 MiB
    (seg,) = paddle_rt.memory_snapshot(d1)
    assert [b["state"] for b in seg["blocks"]] == ["inactive"]
    assert paddle_rt.empty_cache(d1, wait=False) == 0
    assert paddle_rt.memory_reserved(d1) == 8 * MiB
    gate.set()
    run_past(s, at_free)
    assert paddle_rt.empty_cache(d1, wait=False) == 8 * MiB
    assert (h == 2).all()
    assert paddle_rt.memory_reserved(d1) == 0 and plugins.rt_cpu_live_bytes(1) == 0
    s.close()
