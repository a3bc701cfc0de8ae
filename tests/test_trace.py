"""paddle_rt._core.trace: the event recorder (allocator events, stream operations, plugin sink, bounds)."""
import gc
import threading

import pytest
from hypothesis import given, settings, strategies as st

import paddle_rt
from paddle_rt._core import trace
from paddle_rt._core import stream as _stream
from paddle_rt.bench import _alloc_kernels as _bench_alloc


class Sub:
    """A minimal subscriber of the recorder."""

    def __init__(self, mask):
        self.mask = mask
        self.start_ns = trace.now_ns()
        self.stop_ns = None
        self.events = []

    def _deliver(self, events):
        self.events.extend(events)


class recording:
    def __init__(self, mask=trace.MEMORY | trace.STREAMS):
        self.sub = Sub(mask)

    def __enter__(self):
        trace.subscribe(self.sub)
        return self.sub

    def __exit__(self, *exc):
        self.sub.stop_ns = trace.now_ns()
        trace.unsubscribe(self.sub)


@pytest.fixture(autouse=True)
def _clean():
    assert trace.mask() == 0, "a recorder was left subscribed"
    yield
    assert trace.mask() == 0
    gc.collect()
    for d in ("rt_cpu:0", "rt_cpu:1"):
        paddle_rt.empty_cache(d)


def mem(sub, kind=None, memory=None):
    return [e for e in sub.events if e["kind"] != "op" and e["kind"] != "plugin" and (kind is None or e["kind"] == kind)
            and (memory is None or e["memory"] == memory)]


def ops(sub):
    return [e for e in sub.events if e["kind"] == "op"]


@pytest.mark.smoke
def test_nothing_is_recorded_without_a_subscriber():
    assert trace.mask() == 0
    before = trace.pending()
    a = paddle_rt.malloc(4096)
    with paddle_rt.Stream() as s:
        for _ in range(10):
            s.add_callback(lambda: None)
        e = paddle_rt.Event()
        e.record(s)
        s.synchronize()
    a.free()
    paddle_rt.empty_cache()
    assert trace.pending() == before == 0


@pytest.mark.smoke
def test_alloc_and_free_events_carry_size_stream_and_counters():
    alloc = paddle_rt.get_allocator("rt_cpu:0")
    with recording() as sub:
        p = paddle_rt.raw_malloc(300, "rt_cpu:0", stream=12345)
        paddle_rt.raw_free(p, "rt_cpu:0")
    a, f = mem(sub, "alloc"), mem(sub, "free")
    assert len(a) == 1 and len(f) == 1
    assert a[0]["addr"] == p == f[0]["addr"]
    assert a[0]["size"] == alloc.round_size(300) == f[0]["size"]
    assert a[0]["stream"] == 12345 == f[0]["stream"]
    assert a[0]["device"] == "rt_cpu:0" and a[0]["memory"] == "device"
    assert f[0]["allocated"] == a[0]["allocated"] - a[0]["size"]
    assert a[0]["time_ns"] <= f[0]["time_ns"]
    assert sub.start_ns <= a[0]["time_ns"] <= sub.stop_ns
    assert a[0]["frames"] == []          # no stacks asked for


@pytest.fixture(params=[0, 1], ids=["chunks", "expandable"])
def segments_mode(request):
    """rt_cpu:0's allocator with expandable segments off (chunks) and on, empty before and after."""
    a = paddle_rt.get_allocator("rt_cpu:0")
    gc.collect()
    paddle_rt.default_mem_pool("rt_cpu:0").trim_to(0)
    a.empty_cache()
    a.configure(expandable_segments=request.param)
    yield request.param
    gc.collect()
    a.empty_cache()
    a.configure(expandable_segments=None)


def test_segments_and_empty_cache_are_recorded(segments_mode):
    """A chunk: segment_alloc / segment_free of its size. An expandable segment: segment_alloc / segment_free of its
    range (size 0) and segment_map / segment_unmap of its pages. Either way the event sizes add up to reserved."""
    with recording() as sub:
        a = paddle_rt.malloc(3 << 20, "rt_cpu:0")
        reserved = paddle_rt.memory_reserved("rt_cpu:0")
        a.free()
        released = paddle_rt.empty_cache("rt_cpu:0")
    seg_a, seg_f, ec = (mem(sub, k, "device") for k in ("segment_alloc", "segment_free", "empty_cache"))
    kinds = [e["kind"] for e in mem(sub, memory="device")]
    assert len(seg_a) == 1 and [s["addr"] for s in seg_f] == [seg_a[0]["addr"]]
    assert seg_f[0]["reserved"] == 0
    if segments_mode:
        maps, unmaps = mem(sub, "segment_map", "device"), mem(sub, "segment_unmap", "device")
        assert seg_a[0]["size"] == 0 == seg_f[0]["size"]
        assert kinds == ["segment_alloc", "segment_map", "alloc", "free", "segment_unmap", "segment_free",
                         "empty_cache"]
        assert maps[0]["addr"] == seg_a[0]["addr"] and maps[0]["size"] == reserved >= 3 << 20
        assert maps[0]["reserved"] == reserved
        assert (unmaps[0]["addr"], unmaps[0]["size"]) == (maps[0]["addr"], maps[0]["size"])
        assert len(ec) == 1 and ec[0]["size"] == released == maps[0]["size"]
    else:
        assert seg_a[0]["size"] >= 3 << 20
        assert seg_a[0]["reserved"] == reserved
        assert len(ec) == 1 and ec[0]["size"] == released == seg_a[0]["size"]
        assert kinds == ["segment_alloc", "alloc", "free", "segment_free", "empty_cache"]


def test_oom_event_on_an_injected_oom():
    with recording(trace.MEMORY | trace.STACKS) as sub:
        with pytest.raises(paddle_rt.OutOfMemoryError):
            paddle_rt.malloc(1 << 50, "rt_cpu:0")
    oom = mem(sub, "oom")
    assert len(oom) == 1
    assert oom[0]["size"] == 1 << 50 and oom[0]["device"] == "rt_cpu:0"
    assert any(fr["name"] == "test_oom_event_on_an_injected_oom" for fr in oom[0]["frames"])


def test_pinned_host_memory_is_labelled():
    with recording() as sub:
        h = paddle_rt.malloc_host(1000, "rt_cpu:0")
        h.free()
    kinds = {(e["kind"], e["memory"]) for e in mem(sub)}
    assert ("alloc", "pinned") in kinds and ("free", "pinned") in kinds


def test_stacks_only_for_python_api_allocations():
    with recording(trace.MEMORY | trace.STACKS) as sub:
        a = paddle_rt.malloc(512, "rt_cpu:0")
        ptrs = _bench_alloc.hold_blocks("rt_cpu:0", 3, 512)       # the nogil C path
        _bench_alloc.release_blocks("rt_cpu:0", ptrs)
        a.free()
    allocs = mem(sub, "alloc")
    by_addr = {e["addr"]: e for e in allocs}
    py = by_addr[a.ptr]
    assert py["frames"][0]["name"] == "test_stacks_only_for_python_api_allocations"
    assert py["frames"][0]["filename"].endswith("test_trace.py") and py["frames"][0]["line"] > 0
    for p in ptrs:
        assert by_addr[p]["frames"] == []
    assert all(e["frames"] == [] for e in mem(sub, "free"))


def test_stacks_are_not_taken_without_the_bit():
    with recording(trace.MEMORY) as sub:
        paddle_rt.malloc(512, "rt_cpu:0").free()
    assert all(e["frames"] == [] for e in mem(sub))


@pytest.mark.smoke
def test_stream_operations_are_ordered_and_timed():
    with paddle_rt.Stream("rt_cpu:0") as s, recording() as sub:
        for _ in range(20):
            s.add_callback(lambda: None)
        s.synchronize()
    evs = [e for e in ops(sub) if e["stream"] == _stream_tag_of(sub, s)]
    assert [e["op"] for e in evs] == ["callback"] * 20
    assert [e["position"] for e in evs] == list(range(evs[0]["position"], evs[0]["position"] + 20))
    for e in evs:
        assert e["enqueue_ns"] <= e["start_ns"] <= e["end_ns"]
        assert e["device"] == "rt_cpu:0"
    for x, y in zip(evs, evs[1:]):
        assert x["end_ns"] <= y["start_ns"]       # one worker: one after the other


def _stream_tag_of(sub, s):
    tags = {e["stream"] for e in ops(sub)}
    assert len(tags) == 1
    return tags.pop()


def test_operation_kinds_and_bytes():
    a = paddle_rt.malloc(4096, "rt_cpu:0")
    b = paddle_rt.malloc(4096, "rt_cpu:0")
    host = bytearray(4096)
    with paddle_rt.Stream("rt_cpu:0") as s, paddle_rt.Stream("rt_cpu:0") as t:
        tag_s = _stream.stream_tag(s)
        with recording(trace.STREAMS) as sub:
            paddle_rt.memcpy_async(b, a, stream=s)
            paddle_rt.memcpy_async(a, host, stream=s)
            paddle_rt.memcpy_async(host, b, 1000, stream=s)
            paddle_rt.memset_async(a, 7, stream=s)
            e = paddle_rt.Event()
            e.record(s)
            t.wait_event(e)
            t.add_callback(lambda: None)
            s.synchronize()
            t.synchronize()
    assert mem(sub) == []                        # memory not asked for
    on_s = [(x["op"], x["bytes"]) for x in sorted(ops(sub), key=lambda x: x["position"]) if x["stream"] == tag_s]
    assert on_s == [("memcpy_d2d", 4096), ("memcpy_h2d", 4096), ("memcpy_d2h", 1000), ("memset", 4096),
                    ("event_record", 0)]
    on_t = [x["op"] for x in sorted(ops(sub), key=lambda x: x["position"]) if x["stream"] != tag_s]
    assert on_t in (["event_wait", "callback"], ["callback"])   # a record already complete needs no wait
    for x in ops(sub):
        assert x["enqueue_ns"] <= x["start_ns"] <= x["end_ns"]
    a.free()
    b.free()


def test_plugin_async_copy_ends_after_the_plugin_stream_ran():
    a = paddle_rt.malloc(8 << 20, "rt_cpu:0")
    b = paddle_rt.malloc(8 << 20, "rt_cpu:0")
    with paddle_rt.Stream("rt_cpu:0") as s, recording(trace.STREAMS) as sub:
        for _ in range(4):
            paddle_rt.memcpy_async(b, a, stream=s)
        s.add_callback(lambda: None)
        s.synchronize()
    copies = [x for x in ops(sub) if x["op"] == "memcpy_d2d"]
    cb = [x for x in ops(sub) if x["op"] == "callback"][0]
    assert len(copies) == 4
    for c in copies:
        assert c["start_ns"] <= c["end_ns"] <= cb["start_ns"]
    # 4 x 8 MiB cannot be copied in under 100 us: the end is when the copies ran, not when they were handed off
    assert max(c["end_ns"] for c in copies) - min(c["start_ns"] for c in copies) > 100_000
    a.free()
    b.free()


def test_events_before_subscribing_are_not_delivered():
    with recording() as first:
        paddle_rt.malloc(256, "rt_cpu:0").free()
        with recording() as second:
            paddle_rt.malloc(768, "rt_cpu:0").free()
    assert {e["size"] for e in mem(second, "alloc")} == {768}
    assert {e["size"] for e in mem(first, "alloc")} == {256, 768}


def test_buffer_is_bounded_and_counts_drops():
    dropped = trace.dropped()
    rec = recording()
    rec.sub.capacity = 10
    with rec as sub:
        assert trace.capacity() == 10
        for _ in range(20):
            paddle_rt.malloc(256, "rt_cpu:0").free()
    assert trace.capacity() == trace.DEFAULT_CAPACITY
    assert len(mem(sub)) == 10
    assert trace.dropped() - dropped >= 30
    assert mem(sub)[-1]["kind"] == "free"     # the newest are kept
    with pytest.raises(ValueError):
        trace.set_capacity(0)


def test_threads_record_every_allocation():
    n, per = 4, 500
    barrier = threading.Barrier(n)

    def work():
        barrier.wait()
        for _ in range(per):
            paddle_rt.malloc(1024, "rt_cpu:0").free()

    with recording() as sub:
        ths = [threading.Thread(target=work) for _ in range(n)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    assert len(mem(sub, "alloc")) == n * per
    assert len(mem(sub, "free")) == n * per
    final = mem(sub, "free")[-1]
    assert final["allocated"] == paddle_rt.memory_allocated("rt_cpu:0")


def test_subscribe_twice_is_an_error():
    sub = Sub(trace.MEMORY)
    trace.subscribe(sub)
    try:
        with pytest.raises(RuntimeError):
            trace.subscribe(sub)
    finally:
        trace.unsubscribe(sub)
    trace.unsubscribe(sub)          # not subscribed: nothing happens
    assert trace.mask() == 0


def test_sink_is_installed_only_on_demand():
    assert not trace.sink_installed()
    assert trace.install_sink(True) is False
    try:
        assert trace.sink_installed()
    finally:
        assert trace.install_sink(False) is True
    assert not trace.sink_installed()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3 << 20)), min_size=1, max_size=40))
def test_replaying_the_events_gives_the_allocator_counters(script):
    """Summing alloc/free and segment_alloc/segment_free (and, with expandable segments, segment_map/segment_unmap)
    sizes from the events reproduces the allocator's allocated and reserved bytes after every event, and every free
    names a block an earlier alloc handed out."""
    dev = "rt_cpu:1"
    live = []
    base_alloc = paddle_rt.memory_allocated(dev)
    base_res = paddle_rt.memory_reserved(dev)
    with recording() as sub:
        for do_alloc, n in script:
            if do_alloc or not live:
                live.append(paddle_rt.malloc(n, dev))
            else:
                live.pop(n % len(live)).free()
        for a in live:
            a.free()
        paddle_rt.empty_cache(dev)
    allocated, reserved, blocks = base_alloc, base_res, {}
    for e in mem(sub, memory="device"):
        assert e["device"] == dev
        k = e["kind"]
        if k == "alloc":
            assert e["addr"] not in blocks
            blocks[e["addr"]] = e["size"]
            allocated += e["size"]
        elif k == "free":
            assert blocks.pop(e["addr"]) == e["size"]
            allocated -= e["size"]
        elif k in ("segment_alloc", "segment_map"):
            reserved += e["size"]
        elif k in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        if k != "empty_cache":
            assert (e["allocated"], e["reserved"]) == (allocated, reserved)
    assert not blocks
    assert allocated == paddle_rt.memory_allocated(dev) and reserved == paddle_rt.memory_reserved(dev)
