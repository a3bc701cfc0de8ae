"""rt_cpu's fault injection changed at run time (paddle_rt.plugins.rt_cpu_set_fault): each kind makes the matching
paddle_rt call fail with a typed error, on schedule, and rt_cpu_clear_faults ends it."""
import numpy as np
import pytest

import paddle_rt
from paddle_rt import StreamError, OutOfMemoryError, PluginError
from paddle_rt.plugins import rt_cpu_set_fault, rt_cpu_clear_faults, RT_CPU_FAULT_KINDS


@pytest.fixture(autouse=True)
def clear():
    rt_cpu_clear_faults()
    yield
    rt_cpu_clear_faults()


def test_each_kind_fails_its_call_and_clear_ends_it():
    s = paddle_rt.Stream()
    a = paddle_rt.malloc(4096)
    h = np.zeros(4096, np.uint8)
    calls = {
        "create_stream": lambda: paddle_rt.Stream().close(),
        "create_event": lambda: paddle_rt.Event().record(s),
        "memset": lambda: (paddle_rt.memset_async(a, 7, stream=s), s.synchronize()),
        "memcpy": lambda: (paddle_rt.memcpy_async(h, a, stream=s), s.synchronize()),
    }
    for kind, call in calls.items():
        rt_cpu_set_fault(kind, every=1)
        with pytest.raises((PluginError, StreamError)):
            call()
        rt_cpu_clear_faults()
        try:
            s.synchronize()
        except StreamError:
            pass
        call()                                   # works again
    a.free()
    s.close()


def test_after_counts_from_the_change_and_alloc_is_out_of_memory():
    from paddle_rt.pool import MemPool
    paddle_rt.memory.empty_cache()
    pool = MemPool()
    # a new chunk from rt_cpu each time; with expandable segments a new page (one physical creation) each time
    size = (2 << 20) if paddle_rt.memory.allocator_config()["expandable_active"] else (64 << 20)
    rt_cpu_set_fault("alloc", after=1)             # the first call from now succeeds, the rest fail
    got = []
    outcomes = []
    for _ in range(4):
        try:
            got.append(pool.malloc_async(size))
            outcomes.append("ok")
        except OutOfMemoryError:
            outcomes.append("oom")
    rt_cpu_clear_faults()
    assert outcomes == ["ok", "oom", "oom", "oom"]
    for x in got:
        paddle_rt.free_async(x)
    paddle_rt.synchronize()
    pool.trim_to(0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown kind"):
        rt_cpu_set_fault("nope", every=1)
    with pytest.raises(ValueError):
        rt_cpu_set_fault("memcpy", every=-1)
    assert "synchronize" in RT_CPU_FAULT_KINDS


def test_the_release_side_kinds_refuse_on_schedule_and_change_nothing():
    """free (device_memory_deallocate) on a schedule: of two idle chunks, the second free is refused; rt_cpu keeps
    that chunk (its live bytes) and the allocator keeps counting it, until the fault is cleared."""
    import ctypes
    from paddle_rt import plugins
    from memory_helpers import clean_allocator
    lib = ctypes.CDLL(plugins.rt_cpu_path())
    lib.rt_cpu_live_bytes.restype = ctypes.c_size_t
    assert {"free", "unmap", "release", "free_range"} <= set(RT_CPU_FAULT_KINDS)
    for d in clean_allocator(paddle_rt.device("rt_cpu:1")):
        a = paddle_rt.get_allocator(d)
        a.configure(expandable_segments=0, growth="exact")
        ps = [paddle_rt.raw_malloc(8 << 20, d) for _ in range(2)]
        for p in ps:
            paddle_rt.raw_free(p, d)
        assert lib.rt_cpu_live_bytes(1) == 16 << 20
        rt_cpu_set_fault("free", every=2)
        with pytest.raises(PluginError, match="device_memory_deallocate failed with C_ERROR") as ei:
            a.empty_cache()
        assert ei.value.released == 8 << 20
        assert lib.rt_cpu_live_bytes(1) == 8 << 20 == paddle_rt.memory_reserved(d)
        rt_cpu_clear_faults()
        assert a.empty_cache() == 8 << 20 and lib.rt_cpu_live_bytes(1) == 0
