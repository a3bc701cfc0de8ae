"""paddle_rt.memory.record_history / history / dump_snapshot: the allocation history and the snapshot format."""
import gc
import json

import pytest

import paddle_rt
from paddle_rt import memory, profiler
from paddle_rt._core import trace
from paddle_rt.bench import _alloc_kernels as _bench_alloc

TRACE_KEYS = {"action", "addr", "size", "requested", "stream", "time_ns", "frames"}
SEGMENT_KEYS = {"address", "total_size", "stream", "segment_type", "allocated_size", "active_size",
                "requested_size", "blocks"}
ACTIONS = {"alloc", "free", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom", "empty_cache"}


@pytest.fixture(autouse=True)
def _clean():
    memory.record_history(False)
    assert trace.mask() == 0
    yield
    memory.record_history(False)
    assert trace.mask() == 0
    gc.collect()
    for d in ("rt_cpu:0", "rt_cpu:1"):
        paddle_rt.empty_cache(d)


def dev_trace(doc, dev="rt_cpu:0"):
    return doc["devices"][dev]["trace"]


def test_snapshot_round_trip(tmp_path):
    memory.record_history()
    assert memory.is_recording_history()
    a = paddle_rt.malloc(1000, "rt_cpu:0")
    b = paddle_rt.malloc(3000, "rt_cpu:0")
    a.free()
    path = tmp_path / "snap.json"
    assert memory.dump_snapshot(str(path)) == str(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "paddle_rt.memory_snapshot" and doc["version"] == 1
    assert memory.load_snapshot(str(path)) == doc
    d0 = doc["devices"]["rt_cpu:0"]
    assert set(d0) == {"segments", "trace", "stats"}
    tr = d0["trace"]
    assert all(set(e) == TRACE_KEYS and e["action"] in ACTIONS for e in tr)
    allocs = [e for e in tr if e["action"] == "alloc"]
    assert [e["addr"] for e in allocs] == [a.ptr, b.ptr]
    assert [e["size"] for e in allocs] == [paddle_rt.get_allocator("rt_cpu:0").round_size(n) for n in (1000, 3000)]
    assert [e["requested"] for e in allocs] == [1000, 3000]
    assert [e["addr"] for e in tr if e["action"] == "free"] == [a.ptr]
    times = [e["time_ns"] for e in tr]
    assert times == sorted(times)
    for e in allocs:
        top = e["frames"][0]
        assert set(top) == {"filename", "line", "name"}
        assert top["name"] == "test_snapshot_round_trip" and top["filename"].endswith("test_memory_history.py")
    # the segments are the allocator's own snapshot, JSON-normalised
    assert d0["segments"] == json.loads(json.dumps(paddle_rt.memory_snapshot("rt_cpu:0")))
    assert all(SEGMENT_KEYS <= set(s) for s in d0["segments"])
    live = [blk for s in d0["segments"] for blk in s["blocks"] if blk["state"] == "active_allocated"]
    assert b.ptr in [blk["address"] for blk in live] and a.ptr not in [blk["address"] for blk in live]
    assert d0["stats"]["allocated_bytes.all.current"] == paddle_rt.memory_allocated("rt_cpu:0")
    b.free()


def test_history_matches_dump(tmp_path):
    memory.record_history()
    paddle_rt.malloc(512, "rt_cpu:0").free()
    memory.record_history(False)
    h = memory.history()
    path = tmp_path / "s.json"
    memory.dump_snapshot(str(path))
    doc = json.loads(path.read_text())
    assert doc["format"] == h["format"] and doc["version"] == h["version"]
    assert dev_trace(doc) == json.loads(json.dumps(dev_trace(h)))


@pytest.mark.smoke      # (json.loads is left out of the smoke set: CPython's _json trips valgrind by itself)
def test_stop_keeps_the_history_and_records_nothing_more():
    memory.record_history()
    a = paddle_rt.malloc(256, "rt_cpu:0")
    memory.record_history(False)
    assert not memory.is_recording_history()
    b = paddle_rt.malloc(256, "rt_cpu:0")
    tr = dev_trace(memory.history())
    assert [e["addr"] for e in tr if e["action"] == "alloc"] == [a.ptr]
    assert trace.pending() == 0
    a.free()
    b.free()
    memory.record_history()          # a new start begins a new history
    assert dev_trace(memory.history()) == []


def test_max_entries_keeps_the_newest():
    memory.record_history(max_entries=10)
    ptrs = []
    for i in range(50):
        x = paddle_rt.malloc(256 * (i % 3 + 1), "rt_cpu:0")
        ptrs.append(x.ptr)
        x.free()
    tr = dev_trace(memory.history())
    assert len(tr) == 10
    assert tr[-1]["action"] == "free" and tr[-1]["addr"] == ptrs[-1]
    memory.record_history(max_entries=3)     # reconfigure while recording: keeps the newest three
    assert len(dev_trace(memory.history())) == 3


def test_max_entries_holds_while_the_history_is_read():
    """Reading the history while recording (each read takes what the recorder holds) never grows it past
    max_entries; max_entries=1 is allowed and keeps the last event."""
    memory.record_history(max_entries=10)
    for _ in range(30):
        paddle_rt.malloc(256, "rt_cpu:0").free()
        assert len(dev_trace(memory.history())) <= 10
    assert len(dev_trace(memory.history())) == 10
    memory.record_history(False)
    memory.record_history(max_entries=1)
    x = paddle_rt.malloc(512, "rt_cpu:0")
    x.free()
    assert [(e["action"], e["addr"]) for e in dev_trace(memory.history())] == [("free", x.ptr)]


def test_stacks_setting_changes_while_recording():
    """record_history(stacks=...) while recording applies to the allocations that follow, both ways."""
    memory.record_history(stacks=False)
    paddle_rt.malloc(512, "rt_cpu:0").free()
    memory.record_history(stacks=True)
    paddle_rt.malloc(1536, "rt_cpu:0").free()
    memory.record_history(stacks=False)
    paddle_rt.malloc(2560, "rt_cpu:0").free()
    frames = {e["requested"]: e["frames"] for e in dev_trace(memory.history()) if e["action"] == "alloc"}
    assert frames[512] == [] and frames[2560] == []
    assert frames[1536][0]["name"] == "test_stacks_setting_changes_while_recording"
    assert {e["action"] for e in dev_trace(memory.history())} <= ACTIONS


def test_stacks_off_and_c_path_have_no_frames():
    memory.record_history(stacks=False)
    paddle_rt.malloc(512, "rt_cpu:0").free()
    assert all(e["frames"] == [] for e in dev_trace(memory.history()))
    memory.record_history(stacks=True)
    ptrs = _bench_alloc.hold_blocks("rt_cpu:0", 2, 512)
    _bench_alloc.release_blocks("rt_cpu:0", ptrs)
    tr = dev_trace(memory.history())
    assert [e["frames"] for e in tr if e["action"] == "alloc"][-2:] == [[], []]
    assert [e["addr"] for e in tr if e["action"] == "alloc"][-2:] == ptrs


def test_oom_is_in_the_history_with_its_caller():
    memory.record_history()
    with pytest.raises(paddle_rt.OutOfMemoryError):
        paddle_rt.malloc(1 << 50, "rt_cpu:0")
    oom = [e for e in dev_trace(memory.history()) if e["action"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == 1 << 50
    assert oom[0]["frames"][0]["name"] == "test_oom_is_in_the_history_with_its_caller"


def test_pinned_memory_and_other_devices_have_their_own_entries():
    memory.record_history()
    h = paddle_rt.malloc_host(100, "rt_cpu:0")
    x = paddle_rt.malloc(100, "rt_cpu:1")
    doc = memory.history()
    assert any(e["action"] == "alloc" and e["addr"] == h.ptr for e in dev_trace(doc, "rt_cpu:0/pinned"))
    assert any(e["action"] == "alloc" and e["addr"] == x.ptr for e in dev_trace(doc, "rt_cpu:1"))
    assert not any(e["addr"] == h.ptr for e in dev_trace(doc, "rt_cpu:0"))
    h.free()
    x.free()


def test_history_and_profiler_together():
    memory.record_history()
    with profiler.profile(plugin=False) as prof:
        a = paddle_rt.malloc(2048, "rt_cpu:0")
        a.free()
    assert trace.mask() & trace.MEMORY          # the history still records
    b = paddle_rt.malloc(4096, "rt_cpu:0")
    b.free()
    tr = dev_trace(memory.history())
    assert {e["size"] for e in tr if e["action"] == "alloc"} >= {2048, 4096}
    assert {e["size"] for e in prof.events if e["kind"] == "alloc"} == {2048}


def test_snapshot_without_history_has_segments(tmp_path):
    memory.record_history()
    paddle_rt.malloc(100, "rt_cpu:0").free()
    memory.record_history(False)
    memory.clear_history()
    keep = paddle_rt.malloc(700, "rt_cpu:0")
    doc = json.loads(open(memory.dump_snapshot(str(tmp_path / "s.json"))).read())
    assert dev_trace(doc) == []
    assert any(blk["address"] == keep.ptr for s in doc["devices"]["rt_cpu:0"]["segments"] for blk in s["blocks"])
    keep.free()


def test_bad_arguments_and_paths(tmp_path):
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(paddle_rt.InvalidArgument, match="max_entries"):
            memory.record_history(max_entries=bad)
    assert not memory.is_recording_history() and trace.mask() == 0
    with pytest.raises(OSError):
        memory.dump_snapshot(str(tmp_path / "missing" / "s.json"))
    notjson = tmp_path / "x.json"
    notjson.write_text("{not json")
    with pytest.raises(paddle_rt.InvalidArgument, match="not JSON"):
        memory.load_snapshot(str(notjson))
    notjson.write_text('{"format": "other"}')
    with pytest.raises(paddle_rt.InvalidArgument, match="not a paddle_rt memory snapshot"):
        memory.load_snapshot(str(notjson))
    notjson.write_text('{"format": "paddle_rt.memory_snapshot", "version": 99, "devices": {}}')
    with pytest.raises(paddle_rt.InvalidArgument, match="has version 99; this paddle_rt reads version 1"):
        memory.load_snapshot(str(notjson))


def _read_log(path):
    import csv
    import gzip
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def test_dump_trace_writes_requested_sizes_and_replays(tmp_path):
    from paddle_rt.tools import replay
    before = paddle_rt.malloc(5000, "rt_cpu:0")      # allocated before the history: its free is left out
    memory.record_history()
    a = paddle_rt.malloc(1000, "rt_cpu:0")
    b = paddle_rt.malloc(3000, "rt_cpu:0")
    a.free()
    before.free()
    path = tmp_path / "mem.csv.gz"
    out, allocs, peak = memory.dump_trace(path)
    assert out == str(path) and allocs == 2 and peak == 4000
    rows = _read_log(path)
    assert list(rows[0]) == ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
    assert [(r["Action"], int(r["Size"])) for r in rows] == [("allocate", 1000), ("allocate", 3000), ("free", 1000)]
    assert rows[0]["Pointer"] == hex(a.ptr) and rows[1]["Pointer"] == hex(b.ptr)
    t = replay.load_trace(str(path))            # the replay tool reads it back: same events, same peak
    assert list(t[0]) == [1, 1, 0] and t[4] == 4000
    b.free()


def test_dump_trace_without_history_or_with_two_devices_is_refused(tmp_path):
    memory.clear_history()
    with pytest.raises(paddle_rt.InvalidArgument, match=r"^dump_trace: no allocation was recorded \(call paddle_rt"):
        memory.dump_trace(tmp_path / "x.csv")
    with pytest.raises(paddle_rt.InvalidArgument, match=r"no allocation on rt_cpu:0 .*recorded: nothing\)$"):
        memory.dump_trace(tmp_path / "x.csv", device="rt_cpu:0")
    memory.record_history()
    a = paddle_rt.malloc(100, "rt_cpu:0")
    b = paddle_rt.malloc(100, "rt_cpu:1")
    with pytest.raises(paddle_rt.InvalidArgument, match=r"2 devices were recorded \(rt_cpu:0, rt_cpu:1\); name one"):
        memory.dump_trace(tmp_path / "x.csv")
    with pytest.raises(paddle_rt.InvalidArgument,
                       match=r"no allocation on rt_cpu:2 .*recorded: \['rt_cpu:0', 'rt_cpu:1'\]\)$"):
        memory.dump_trace(tmp_path / "x.csv", device="rt_cpu:2")
    assert not (tmp_path / "x.csv").exists()
    _, allocs, _ = memory.dump_trace(tmp_path / "x.csv", device="rt_cpu:1")
    assert allocs == 1
    assert (tmp_path / "x.csv").read_text().splitlines()[1].split(",")[2:] == ["allocate", hex(b.ptr), "100", "0"]
    a.free()
    b.free()


def test_dump_trace_keeps_only_device_allocations_and_frees(tmp_path):
    """Pinned host memory and the allocator's segment events of the same device are recorded too, but the log holds
    the device's allocations and frees only (a pinned block or a segment in it would replay as device memory)."""
    paddle_rt.empty_cache("rt_cpu:0")
    memory.record_history()
    h = paddle_rt.malloc_host(4096, "rt_cpu:0")
    a = paddle_rt.malloc(3 << 20, "rt_cpu:0")           # a new segment, or pages mapped in the stream's range
    a.free()
    h.free()
    paddle_rt.empty_cache("rt_cpu:0")                     # segment_free or segment_unmap, empty_cache
    kinds = {e["action"] for e in dev_trace(memory.history())}
    assert {"alloc", "free"} <= kinds and kinds & {"segment_alloc", "segment_map"}
    _, allocs, peak = memory.dump_trace(tmp_path / "x.csv", device="rt_cpu:0")
    assert (allocs, peak) == (1, 3 << 20)
    rows = [line.split(",")[2:5] for line in (tmp_path / "x.csv").read_text().splitlines()[1:]]
    assert rows == [["allocate", hex(a.ptr), str(3 << 20)], ["free", hex(a.ptr), str(3 << 20)]]


def test_dump_trace_of_only_frees_names_the_device_and_writes_nothing(tmp_path):
    """A history holding only frees of blocks allocated before it started has nothing to replay: the error names the
    call and the device, and no file is left behind."""
    before = paddle_rt.malloc(2048, "rt_cpu:0")
    memory.record_history()
    before.free()
    with pytest.raises(paddle_rt.InvalidArgument, match=r"^dump_trace\(rt_cpu:0\): no allocation was recorded"):
        memory.dump_trace(tmp_path / "x.csv.gz")
    assert list(tmp_path.iterdir()) == []


def test_clear_history_while_recording_forgets_what_the_recorder_still_holds():
    """clear_history() while recording first takes what the recorder holds but has not delivered yet: those events
    happened before the clear and must not come back after it."""
    memory.record_history()
    try:
        paddle_rt.malloc(7168, "rt_cpu:0").free()      # recorded, possibly not delivered yet
        memory.clear_history()
        paddle_rt.malloc(9216, "rt_cpu:0").free()
        sizes = [e["size"] for e in dev_trace(memory.history()) if e["action"] == "alloc"]
        assert 9216 in sizes and 7168 not in sizes
    finally:
        memory.record_history(False)
        memory.clear_history()
