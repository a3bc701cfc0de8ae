"""The allocator's errors as exceptions (_core/alloc_errors.pyx): a failed call of the virtual-memory extension is a
PluginError naming that call (paddle_rt_ext_vmm_reserve, _create, _map, _map_pages), not device_memory_allocate,
on each path that makes it (a new range, growth, pages mapped back under a cached block), with the plugin's status
(the allocation hook's own errors, named device_memory_allocate: tests/test_allocator.py). Faults come from rt_cpu's RT_CPU_FAIL_VMM (read at each call)."""
import pytest

import paddle_rt

from memory_helpers import clean_allocator

MiB = 1 << 20


@pytest.fixture
def dev():
    yield from clean_allocator(paddle_rt.device("rt_cpu:1"))


@pytest.fixture
def expandable(dev):
    a = paddle_rt.get_allocator(dev)
    a.configure(expandable_segments=1)
    assert a.config()["expandable_active"]
    batched = dev.plugin._set_vmm_batched
    yield dev
    batched(True)


def fails_naming(dev, monkeypatch, fault, call, nbytes):
    """raw_malloc(nbytes) under RT_CPU_FAIL_VMM=fault: a PluginError of `call` with C_ERROR; nothing held after."""
    before = paddle_rt.memory_reserved(dev)
    monkeypatch.setenv("RT_CPU_FAIL_VMM", fault)
    with pytest.raises(paddle_rt.PluginError) as ei:
        paddle_rt.raw_malloc(nbytes, dev)
    monkeypatch.setenv("RT_CPU_FAIL_VMM", "")
    e = ei.value
    assert e.call == call and e.status_name == "C_ERROR" and e.device == str(dev), str(e)
    assert str(e).startswith(f"{dev}: {call} failed with C_ERROR: while allocating {nbytes} bytes"), str(e)
    assert "device_memory_allocate" not in str(e)
    assert paddle_rt.memory_reserved(dev) == before
    return e


def test_a_failed_reserve_names_the_extension_call(expandable, monkeypatch):
    fails_naming(expandable, monkeypatch, "reserve", "paddle_rt_ext_vmm_reserve", MiB)


def test_a_failed_create_names_the_extension_call(expandable, monkeypatch):
    fails_naming(expandable, monkeypatch, "create", "paddle_rt_ext_vmm_create", 3 * MiB)


@pytest.mark.parametrize("batched,call", [(True, "paddle_rt_ext_vmm_map_pages"), (False, "paddle_rt_ext_vmm_map")])
def test_a_failed_map_names_the_extension_call(expandable, monkeypatch, batched, call):
    """Issue 46 item 11: a failing map_pages read "device_memory_allocate failed with C_ERROR"."""
    expandable.plugin._set_vmm_batched(batched)
    paddle_rt.get_allocator(expandable).configure(expandable_segments=1)     # takes the calls as set now
    p = paddle_rt.raw_malloc(MiB, expandable)                     # the range exists: the next request grows it
    try:
        fails_naming(expandable, monkeypatch, "map_pages" if batched else "map", call, 8 * MiB)
        q = paddle_rt.raw_malloc(8 * MiB, expandable)             # the fault gone, the same request is served
        paddle_rt.raw_free(q, expandable)
    finally:
        paddle_rt.raw_free(p, expandable)


def test_a_failed_map_under_a_cached_block_names_the_call_and_its_status(expandable, monkeypatch):
    """A cached free block whose pages were unmapped (empty_cache) is mapped back before it is handed out (the cached
    path, alloc_segment.vmm_back): its failure kept neither the call nor the status (it read "C_SUCCESS")."""
    x = paddle_rt.raw_malloc(8 * MiB, expandable)
    pin = paddle_rt.raw_malloc(MiB, expandable)                   # keeps the range's end in use
    paddle_rt.raw_free(x, expandable)
    paddle_rt.empty_cache(expandable)                             # the hole's whole pages are unmapped
    try:
        fails_naming(expandable, monkeypatch, "map_pages", "paddle_rt_ext_vmm_map_pages", 6 * MiB)
        w = paddle_rt.raw_malloc(6 * MiB, expandable)
        assert w == x                                             # the hole, mapped back
        paddle_rt.raw_free(w, expandable)
    finally:
        paddle_rt.raw_free(pin, expandable)

