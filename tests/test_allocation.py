"""_core/allocation.pyx: raw_free and the memory an Allocation holds (issue 46 item 6). raw_free takes only
raw_malloc's pointers: the pointer of a live Allocation (malloc, malloc_host, malloc_async, a tensor's memory) is
refused with InvalidArgument and stays allocated, so later copies, memsets and views of the Allocation still use
memory it owns (before, raw_free + empty_cache gave the chunk back and memset(d, 0) crashed in rt_cpu)."""
import numpy as np
import pytest

import paddle_rt

from memory_helpers import clean_allocator


@pytest.fixture(params=[0, 1], ids=["segments", "expandable"])
def d1(request):
    """rt_cpu:1 with a clean allocator in each mode: PADDLE_RT_ALLOC_CONF=expandable_segments:0 and the extension's
    expandable segments."""
    for d in clean_allocator(paddle_rt.device("rt_cpu:1")):
        paddle_rt.get_allocator(d).configure(expandable_segments=request.param)
        yield d


def refused(d, ptr, device_arg):
    calls = {"raw_free(ptr)": lambda: paddle_rt.raw_free(ptr),
             "raw_free(ptr, device)": lambda: paddle_rt.raw_free(ptr, device_arg),
             "DeviceAllocator.raw_free": lambda: paddle_rt.get_allocator(d).raw_free(ptr)}
    for name, call in calls.items():
        with pytest.raises(paddle_rt.InvalidArgument) as ei:
            call()
        text = str(ei.value)
        assert text.startswith(f"{d}: raw_free of {ptr:#x}: a live Allocation owns this memory"), (name, text)
        assert "free the Allocation instead" in text, (name, text)


def use_all_ways(a):
    """memset, a copy out and a write through numpy: the memory is still the Allocation's."""
    paddle_rt.memset(a, 0)
    np.asarray(a)[:] = 1
    out = np.zeros(a.size, np.uint8)
    paddle_rt.memcpy(out, a)
    assert (out == 1).all()


@pytest.mark.smoke
def test_raw_free_of_an_allocations_pointer_is_refused_and_the_memory_stays(d1):
    a = paddle_rt.malloc(4096, d1)
    before = paddle_rt.memory_stats(d1)
    refused(d1, a.ptr, d1)
    assert paddle_rt.memory_stats(d1) == before                    # nothing was freed
    paddle_rt.empty_cache(d1)
    assert paddle_rt.memory_allocated(d1) == before["allocated_bytes.all.current"]
    use_all_ways(a)                                                 # was SIGSEGV in rt_cpu's device_memory_set
    a.free()
    with pytest.raises(paddle_rt.InvalidArgument, match="double free"):
        paddle_rt.raw_free(a.ptr, d1)                               # freed by its owner: a plain double free


def test_the_slow_paths_refuse_too(d1):
    """release:free sends every free through the nogil path (core_raw_free), not the GIL-held try (the mark set on
    the slow malloc path, core_mark_owned, is read there too)."""
    paddle_rt.get_allocator(d1).configure(release="free")
    a = paddle_rt.malloc(3 << 20, d1)                               # a miss: malloc_waiting, then marked
    refused(d1, a.ptr, d1)
    paddle_rt.empty_cache(d1)
    use_all_ways(a)
    a.free()
    assert paddle_rt.memory_reserved(d1) == 0


def test_a_pools_and_a_tensors_memory_is_refused(d1):
    s = paddle_rt.Stream(d1)
    try:
        x = paddle_rt.malloc_async(1000, stream=s)
        t = paddle_rt.zeros((256,), "float32", device=d1, stream=s)
        s.synchronize()
        refused(d1, x.ptr, d1)
        refused(d1, t.data_ptr, d1)
        paddle_rt.empty_cache(d1)
        use_all_ways(x)
        assert not t.numpy().any()
        paddle_rt.free_async(x, s)
        del t
        s.synchronize()
    finally:
        s.close()


def test_raw_malloc_pointers_are_still_freed_and_reused_blocks_forget_the_owner(d1):
    """The mark belongs to one allocation: a block an Allocation held, freed and taken again by raw_malloc, is
    raw_free's."""
    a = paddle_rt.malloc(4096, d1)
    p = a.ptr
    a.free()
    q = paddle_rt.raw_malloc(4096, d1)
    assert q == p                                                   # the same block, reused at once
    paddle_rt.raw_free(q)
    r = paddle_rt.get_allocator(d1).raw_malloc(100)
    paddle_rt.get_allocator(d1).raw_free(r)
    assert paddle_rt.memory_allocated(d1) == 0
