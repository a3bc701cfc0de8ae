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
