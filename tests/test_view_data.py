"""The memory viewer's data (paddle_rt/tools/view_data.py, view_levels.py) from hand-made histories, snapshots and
traces: the series of every level, pool and stream, blocks and segments with their ``before`` flags, peaks and top
sites, marks, the budgets that thin long runs, and the message naming each malformed entry. Every expected figure is
computed from the input the test builds."""
import json

import numpy as np
import pytest

import paddle_rt
from paddle_rt import memory
from paddle_rt.tools import view_data
from paddle_rt.tools.view_data import ViewInputError, detect_kind
from paddle_rt.tools.view_levels import minmax_levels


plotly = pytest.importorskip("plotly", reason="the view extra (plotly) is not installed: pip install '.[view]'")

DEV = "rt_cpu:0"


@pytest.fixture(autouse=True)
def _clean():
    """No history recording left on, nor cached memory of DEV, between tests (test_view*.py)."""
    memory.record_history(False)
    memory.clear_history()
    yield
    memory.record_history(False)
    memory.clear_history()
    paddle_rt.empty_cache(DEV)



# ---------------------------------------------------------------------------------------------------------------------
# the data of a hand-made history (every expected figure computed from the input)

MB = 1 << 20
FRAMES_A = [{"filename": "train.py", "line": 10, "name": "step"}, {"filename": "main.py", "line": 3, "name": "<module>"}]
FRAMES_B = [{"filename": "model.py", "line": 7, "name": "forward"}]


def _snapdoc(devices):
    return {"format": "paddle_rt.memory_snapshot", "version": 1, "devices": devices}


def _tr(action, addr, size, ms, stream=0, frames=(), requested=None):
    e = {"action": action, "addr": addr, "size": size, "time_ns": 1_000_000 + int(ms * 1e6), "stream": stream,
         "frames": list(frames)}
    if requested is not None:
        e["requested"] = requested
    return e


def two_pool_doc():
    """One device: a small segment S0 (stream 1) there before the history with a block B0 of 4 KiB still live and a
    block of 2 KiB the history frees; a large segment S1 the history allocates, blocks in both, an oom, empty_cache.
    Times: event i at i ms."""
    s0, s1 = 0x10000, 0x200000
    trace = [_tr("segment_alloc", s1, 4 * MB, 0),
             _tr("alloc", s1, 1 * MB, 1, 0, FRAMES_A, requested=1_000_000),
             _tr("alloc", s1 + MB, 2 * MB, 2, 1, FRAMES_B, requested=2_000_000),
             _tr("alloc", s0 + 4096, 8192, 3, 0, FRAMES_A),
             _tr("free", s1 + MB, 2 * MB, 4, 1),
             _tr("free", s0 + 3 * 4096, 2048, 5, 1),                      # a block allocated before the history
             _tr("oom", 0, 64 * MB, 6, 0, FRAMES_B, requested=64 * MB),
             _tr("empty_cache", 0, 0, 7, 0)]
    segments = [{"address": s0, "total_size": MB, "segment_type": "small", "stream": 1,
                 "blocks": [{"address": s0, "size": 4096, "requested_size": 4000, "state": "active_allocated"},
                            {"address": s0 + 4096, "size": 8192, "state": "active_allocated"}]},
                {"address": s1, "total_size": 4 * MB, "segment_type": "large", "stream": 0, "mapped_size": 3 * MB,
                 "blocks": [{"address": s1, "size": MB, "state": "active_allocated"},
                            {"address": s1 + MB, "size": 3 * MB, "state": "inactive"}]}]
    return _snapdoc({"d": {"segments": segments, "trace": trace}})


def two_pool_run(**kw):
    return view_data.build_run(view_data.events_from_history(two_pool_doc())["d"], **kw)


def test_history_levels_count_what_was_there_before():
    """The timeline of a history that starts on a busy device: the device's, each pool's and each stream's levels
    start with the blocks and segments the history did not allocate (from the snapshot's end, or freed during the
    history), and every event moves the right pool and stream."""
    run = two_pool_run()
    s = run["series"]
    pre = 4096 + 2048                                   # B0 live at the end + the 2 KiB block freed at 5 ms
    steps_al = [0, MB, 2 * MB, 8192, -2 * MB, -2048, 0, 0]
    assert s["allocated"].tolist() == (pre + np.cumsum(steps_al)).tolist()
    assert s["reserved"].tolist() == [MB + 4 * MB] * 8
    assert np.asarray(run["t"]).tolist() == [float(i) for i in range(8)]
    # the pools: S0 small (with both pre-existing blocks), S1 large
    assert s["allocated small pool"].tolist() == (pre + np.cumsum([0, 0, 0, 8192, 0, -2048, 0, 0])).tolist()
    assert s["allocated large pool"].tolist() == np.cumsum([0, MB, 2 * MB, 0, -2 * MB, 0, 0, 0]).tolist()
    assert s["reserved small pool"].tolist() == [MB] * 8
    assert s["reserved large pool"].tolist() == [4 * MB] * 8
    # the streams: stream 1 holds the pre-existing blocks (S0's stream) and the 2 MiB block
    assert s["allocated stream 0"].tolist() == np.cumsum([0, MB, 0, 8192, 0, 0, 0, 0]).tolist()
    assert s["allocated stream 1"].tolist() == (pre + np.cumsum([0, 0, 2 * MB, 0, -2 * MB, -2048, 0, 0])).tolist()
    assert sorted(s) == sorted(["allocated", "reserved", "allocated small pool", "allocated large pool",
                                "reserved small pool", "reserved large pool", "allocated stream 0",
                                "allocated stream 1"])
    for kind in ("allocated", "reserved"):
        assert np.array_equal(s[f"{kind} small pool"] + s[f"{kind} large pool"], s[kind])
    assert np.array_equal(s["allocated stream 0"] + s["allocated stream 1"], s["allocated"])


def test_history_blocks_segments_and_before_flags():
    """Block and segment lifetimes for the segment map: what was there before the history is flagged ``before`` and
    starts at the history's start; a block keeps its size, requested bytes, stream, stack and segment."""
    run = two_pool_run()
    segs = run["segments"]
    assert [(sg["addr"], sg["size"], sg["pool"], sg["t_alloc"], sg["t_free"]) for sg in segs] == [
        (0x10000, MB, "small", 0.0, float("inf")), (0x200000, 4 * MB, "large", 0.0, float("inf"))]
    assert segs[0].get("before") is True and not segs[1].get("before")
    assert segs[1]["mapped_size"] == 3 * MB and "mapped_size" not in segs[0]
    by_addr = {b["addr"]: b for b in run["blocks"]}
    assert sorted(by_addr) == [0x10000, 0x11000, 0x200000, 0x300000]
    b0 = by_addr[0x10000]
    assert (b0.get("before"), b0["size"], b0["req"], b0["stream"], b0["stack"], b0["seg"], b0["t_alloc"]) == \
        (True, 4096, 4000, "1", -1, 0, 0.0)
    assert b0["t_free"] == float("inf")
    big = by_addr[0x300000]
    assert (big["size"], big["req"], big["stream"], big["seg"], big["t_alloc"], big["t_free"]) == \
        (2 * MB, 2_000_000, "1", 1, 2.0, 4.0)
    assert not big.get("before") and not by_addr[0x11000].get("before")
    assert by_addr[0x11000]["req"] == -1 and by_addr[0x11000]["seg"] == 0
    assert run["stacks"][by_addr[0x200000]["stack"]] == "train.py:10 step\nmain.py:3 <module>"
    assert by_addr[0x200000]["stack"] == by_addr[0x11000]["stack"]          # one stack, stored once
    assert run["stacks"][big["stack"]] == "model.py:7 forward"
    assert len(run["stacks"]) == 2
    assert (run["label"], run["device"], run["events"], run["t_range"], run["exact"], run["moments"]) == \
        ("d", "d", 8, (0.0, 7.0), True, None)
    assert view_data.live_at(run["blocks"], 4.0) == [i for i, b in enumerate(run["blocks"]) if b["addr"] != 0x300000]
    assert [run["blocks"][i]["addr"] for i in view_data.live_at(run["blocks"], 2.0)] == \
        [0x10000, 0x200000, 0x300000]


def test_history_peak_sites_and_markers():
    """The peak of allocated bytes (and reserved's own), the sites live at it (one per Python stack, per stream for
    blocks without one: bytes, requested bytes, block count), and the marked events with their size, request,
    stream and stack."""
    run = two_pool_run()
    assert run["peak"] == {"allocated": 4096 + 2048 + 3 * MB + 8192, "t": 3.0, "reserved": 5 * MB, "t_reserved": 0.0}
    sites = {(run["stacks"][x["stack"]] if x["stack"] >= 0 else f"stream {x['stream']}"): x for x in run["sites"]}
    assert {k: (v["bytes"], v["requested"], v["blocks"]) for k, v in sites.items()} == {
        "model.py:7 forward": (2 * MB, 2_000_000, 1),
        "train.py:10 step\nmain.py:3 <module>": (MB + 8192, 1_000_000, 2),
        "stream 1": (4096, 4000, 1)}
    assert [x["bytes"] for x in run["sites"]] == [2 * MB, MB + 8192, 4096]
    ms = run["markers"]
    assert [(m["kind"], m["t"], m["size"], m["stream"]) for m in ms] == [
        ("oom", 6.0, 64 * MB, "0"), ("empty_cache", 7.0, 0, "0"), ("growth", 0.0, 4 * MB, "0")]
    assert ms[0]["req"] == 64 * MB and run["stacks"][ms[0]["stack"]] == "model.py:7 forward"
    assert ms[1]["stack"] == -1 and ms[2]["seg"] == 1


def test_sites_per_stream_without_stacks():
    """Blocks without a Python stack (allocation logs) are grouped per stream at the peak."""
    trace = [_tr("segment_alloc", 0x100000, 8 * MB, 0)] + [
        _tr("alloc", 0x100000 + i * MB, MB * (1 + i % 2), 1 + i, stream=i % 2) for i in range(4)]
    run = view_data.build_run(view_data.events_from_history(_snapdoc({"d": {"segments": [], "trace": trace}}))["d"])
    assert [(x["stream"], x["bytes"], x["blocks"], x["stack"]) for x in run["sites"]] == [
        ("1", 4 * MB, 2, -1), ("0", 2 * MB, 2, -1)]


def test_one_pool_and_one_stream_add_no_lines():
    """A run with a single pool and a single stream has only the device's two lines (no copies in the legend)."""
    trace = [_tr("segment_alloc", 0x100000, 8 * MB, 0), _tr("alloc", 0x100000, 3 * MB, 1),
             _tr("free", 0x100000, 3 * MB, 2), _tr("segment_free", 0x100000, 8 * MB, 3)]
    run = view_data.build_run(view_data.events_from_history(_snapdoc({"d": {"segments": [], "trace": trace}}))["d"])
    assert sorted(run["series"]) == ["allocated", "reserved"]
    assert run["series"]["reserved"].tolist() == [8 * MB, 8 * MB, 8 * MB, 0]
    assert run["segments"][0]["t_free"] == 3.0 and run["segments"][0]["pool"] == "large"


def test_lost_frees_unknown_segments_and_pools_from_sizes():
    """A history that lost events still adds up: an alloc at a live address ends the old block there; a free of an
    unknown segment counts it as reserved from the start; a segment without a type is small when its first block
    fits the allocator's small size."""
    small = view_data.DEFAULT_SMALL_SIZE
    trace = [_tr("segment_alloc", 0x100000, 2 * MB, 0), _tr("alloc", 0x100000, 1000, 1),
             _tr("alloc", 0x100000, 2000, 2),                               # the free of the first one was lost
             _tr("segment_alloc", 0x800000, 4 * MB, 3), _tr("alloc", 0x800000, small + 1, 4),
             _tr("segment_free", 0xF00000, 6 * MB, 5)]                     # a segment from before the history
    run = view_data.build_run(view_data.events_from_history(_snapdoc({"d": {"segments": [], "trace": trace}}))["d"])
    assert [(b["size"], b["t_alloc"], b["t_free"]) for b in run["blocks"]] == [
        (1000, 1.0, 2.0), (2000, 2.0, float("inf")), (small + 1, 4.0, float("inf"))]
    assert run["series"]["allocated"].tolist() == [0, 1000, 3000, 3000, 3000 + small + 1, 3000 + small + 1]
    assert run["series"]["reserved"].tolist() == [6 * MB + x for x in (2 * MB, 2 * MB, 2 * MB, 6 * MB, 6 * MB, 0)]
    assert [sg["pool"] for sg in run["segments"]] == ["small", "large"]
    assert run["peak"]["reserved"] == 12 * MB and run["peak"]["t_reserved"] == 3.0


def test_history_requested_and_times():
    """Requested bytes are kept only when they are a byte count; times are ms from the first event of any device."""
    doc = _snapdoc({"a": {"segments": [], "trace": [
        _tr("alloc", 4096, 100, 0.5, requested=90), _tr("alloc", 8192, 100, 2.5, requested=True),
        _tr("alloc", 12288, 100, 3.5, requested=-3)]},
        "b": {"segments": [], "trace": [_tr("alloc", 4096, 10, 0.25)]}})
    evs = view_data.events_from_history(doc)
    assert evs["a"].t == [0.25, 2.25, 3.25] and evs["b"].t == [0.0]
    assert evs["a"].req == [90, -1, -1]
    assert evs["a"].stream == ["0", "0", "0"]


@pytest.mark.parametrize("device, says", [
    ({"segments": {"a": 1}, "trace": []}, '"segments" and "trace" must be lists'),
    ({"segments": [], "trace": {"a": 1}}, '"segments" and "trace" must be lists'),
    ({"segments": [5], "trace": []}, "d: segment 0 is not an object"),
    ({"segments": [{"address": -1, "total_size": 1}], "trace": []}, "d: segment 0 address is not a byte count"),
    ({"segments": [{"address": 1, "total_size": "x"}], "trace": []}, "d: segment 0 total_size is not a byte count"),
    ({"segments": [{"address": 1, "total_size": 9, "blocks": [3]}], "trace": []}, "d: segment 0 block 0 is not an"),
    ({"segments": [{"address": 1, "total_size": 9, "blocks": [{"address": None, "size": 1}]}], "trace": []},
     "d: segment 0 block 0 address is not"),
    ({"segments": [{"address": 1, "total_size": 9, "blocks": [{"address": 1, "size": True}]}], "trace": []},
     "d: segment 0 block 0 size is not a byte count or address (True)"),
    ({"segments": [], "trace": [{"action": "move", "time_ns": 0}]}, 'd: trace entry 0 has no known "action" (\'move\')'),
    ({"segments": [], "trace": [{"action": "free", "time_ns": 0}, 7]}, 'd: trace entry 1 has no known "action" (7)'),
    ({"segments": [], "trace": [{"action": "alloc", "time_ns": "0"}]}, 'd: trace entry 0 has no numeric "time_ns"'),
    ({"segments": [], "trace": [{"action": "alloc", "time_ns": 0, "size": 8, "addr": -4}]},
     "d: trace entry 0 addr is not a byte count or address (-4)"),
    ({"segments": [], "trace": []}, "the snapshot holds no segments and no history on any device"),
])
def test_malformed_snapshot_says_what_is_wrong(device, says):
    with pytest.raises(ViewInputError) as exc:
        view_data.events_from_history(_snapdoc({"d": device}), "s.json")
    assert str(exc.value).startswith("s.json: ") and says in str(exc.value), str(exc.value)


def test_long_runs_keep_the_blocks_live_at_the_moments(monkeypatch):
    """Beyond the block budget, the segment map keeps exactly the blocks live at its moments, and the moments hold
    the peaks and every out-of-memory and empty_cache event."""
    rng = np.random.default_rng(3)
    trace, live, t = [_tr("segment_alloc", 0x1000000, 64 * MB, 0)], {}, 1
    for i in range(600):
        if live and rng.random() < 0.5:
            a = sorted(live)[int(rng.integers(len(live)))]
            trace.append(_tr("free", a, live.pop(a), t))
        else:
            a = 0x1000000 + 4096 * i
            live[a] = int(rng.integers(1, 64)) * 4096
            trace.append(_tr("alloc", a, live[a], t))
        if i in (100, 400):
            trace.append(_tr("oom" if i == 100 else "empty_cache", 0, MB, t + 0.5))
        t += 1
    doc = _snapdoc({"d": {"segments": [], "trace": trace}})
    full = view_data.build_run(view_data.events_from_history(doc)["d"])
    assert full["exact"] and full["moments"] is None
    monkeypatch.setattr(view_data, "BLOCK_BUDGET", 40)
    monkeypatch.setattr(view_data, "MOMENTS", 16)
    run = view_data.build_run(view_data.events_from_history(doc)["d"])
    assert run["exact"] is False
    ms = run["moments"]
    assert ms == sorted(ms) and {full["peak"]["t"], full["peak"]["t_reserved"], 101.5, 401.5} <= set(ms)
    assert set(ms) <= set(np.asarray(full["t"]).tolist())
    want = sorted({i for m in ms for i in view_data.live_at(full["blocks"], m)})
    assert [b["addr"] for b in run["blocks"]] == [full["blocks"][i]["addr"] for i in want]
    assert [b["t_alloc"] for b in run["blocks"]] == [full["blocks"][i]["t_alloc"] for i in want]
    assert 0 < len(run["blocks"]) < len(full["blocks"])
    # everything else is the exact run's
    assert run["peak"] == full["peak"] and run["sites"] == full["sites"]
    assert np.array_equal(run["series"]["allocated"], full["series"]["allocated"])


def test_marks_beyond_the_budget_keep_the_largest_in_time_order(monkeypatch):
    monkeypatch.setattr(view_data, "MARKER_BUDGET", 3)
    sizes = [5, 9, 1, 7, 3, 8]
    trace = [_tr("segment_alloc", 0x100000 * (i + 1), n * MB, i) for i, n in enumerate(sizes)]
    trace += [_tr("oom", 0, 1, 10 + i) for i in range(2)]
    run = view_data.build_run(view_data.events_from_history(_snapdoc({"d": {"segments": [], "trace": trace}}))["d"])
    assert [(m["kind"], m["size"], m["t"]) for m in run["markers"]] == [
        ("oom", 1, 10.0), ("oom", 1, 11.0), ("growth", 9 * MB, 1.0), ("growth", 7 * MB, 3.0), ("growth", 8 * MB, 5.0)]


# ---------------------------------------------------------------------------------------------------------------------
# Chrome traces

def test_chrome_trace_memory_events(tmp_path):
    """A trace with the profiler's memory instant events gives blocks per process (named by its metadata, else
    "pid N"), addresses in hex or decimal, times in ms from the first memory event, the event's stream."""
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "gpu:0"}},
          {"ph": "i", "cat": "memory", "name": "segment_alloc", "pid": 1, "ts": 1000.0,
           "args": {"addr": "0x100000", "size": 8 * MB, "stream": 3}},
          {"ph": "i", "cat": "memory", "name": "alloc", "pid": 1, "ts": 1500.0,
           "args": {"addr": "0x100000", "size": MB, "stream": 3}},
          {"ph": "i", "cat": "memory", "name": "alloc", "pid": 2, "ts": 2000.0, "args": {"addr": 4096, "size": 512}},
          {"ph": "i", "cat": "memory", "name": "free", "pid": 1, "ts": 3000.0, "args": {"addr": "0x100000"}},
          {"ph": "i", "cat": "other", "name": "alloc", "pid": 1, "ts": 10.0, "args": {"addr": 1, "size": 1}}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(ev))                          # a bare list of events is a Chrome trace too
    assert detect_kind(str(p))[0] == "chrome_trace"
    runs = {r["device"]: r for r in view_data.load_source(str(p), label="T")}
    assert sorted(runs) == ["gpu:0", "pid 2"]
    g = runs["gpu:0"]
    assert g["label"] == "T gpu:0" and g["kind"] == "chrome_trace" and g["source"] == str(p)
    assert np.asarray(g["t"]).tolist() == [0.0, 0.5, 2.0]
    assert [(b["addr"], b["size"], b["stream"], b["t_alloc"], b["t_free"]) for b in g["blocks"]] == [
        (0x100000, MB, "3", 0.5, 2.0)]
    assert g["series"]["allocated"].tolist() == [0, MB, 0] and g["series"]["reserved"].tolist() == [8 * MB] * 3
    assert runs["pid 2"]["blocks"][0]["stream"] == "0" and runs["pid 2"]["blocks"][0]["t_alloc"] == 1.0
    assert [r["device"] for r in view_data.load_source(str(p), device="pid 2")] == ["pid 2"]
    bad = ev + [{"ph": "i", "cat": "memory", "name": "alloc", "pid": 1, "ts": 4000.0, "args": {"addr": "0xZZ"}}]
    p.write_text(json.dumps(bad))
    with pytest.raises(ViewInputError, match="a memory event with a malformed addr or size"):
        view_data.load_source(str(p))


def test_chrome_trace_counters_without_process_names(tmp_path):
    """Counters only: one timeline per process ("pid N" without metadata), a missing value carries the last one."""
    doc = {"traceEvents": [{"ph": "C", "name": "memory", "pid": 5, "ts": 2000.0 + i * 500,
                            "args": {"allocated": a, "reserved": r}}
                           for i, (a, r) in enumerate([(1, 10), (None, 30), (4, None), (2, 20)])]
           + [{"ph": "C", "name": "memory", "pid": 6, "ts": 1000.0, "args": {"allocated": 7, "reserved": 8}}]}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    runs = view_data.load_source(str(p))
    assert [(r["device"], r["label"]) for r in runs] == [("pid 5", "c.json pid 5"), ("pid 6", "c.json pid 6")]
    r5 = runs[0]
    assert r5["series"]["allocated"].tolist() == [1, 1, 4, 2] and r5["series"]["reserved"].tolist() == [10, 30, 30, 20]
    assert np.asarray(r5["t"]).tolist() == [1.0, 1.5, 2.0, 2.5]
    assert r5["peak"] == {"allocated": 4, "t": 2.0, "reserved": 30, "t_reserved": 1.5}
    assert r5["t_range"] == (1.0, 2.5) and r5["blocks"] == [] and r5["markers"] == []
    assert [r["device"] for r in view_data.load_source(str(p), device="pid 6")] == ["pid 6"]
    with pytest.raises(ViewInputError, match="c.json: no data for device pid 9"):
        view_data.load_source(str(p), device="pid 9")
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "kernel", "ts": 1}]}))
    with pytest.raises(ViewInputError, match="a Chrome trace without memory events"):
        view_data.load_source(str(p))


@pytest.mark.parametrize("content, says", [
    (b'{"format": "paddle_rt.memory_snapshot", "devices": []}', 'a memory snapshot without a "devices" object'),
    (b'[1, 2', "not valid JSON"),
])
def test_detect_kind_names_a_bad_snapshot(tmp_path, content, says):
    p = tmp_path / "x.json"
    p.write_bytes(content)
    with pytest.raises(ViewInputError) as exc:
        detect_kind(str(p))
    assert str(exc.value).startswith(f"{p}: ") and says in str(exc.value)


def test_unreadable_inputs(tmp_path):
    with pytest.raises(ViewInputError, match=f"^{tmp_path}: is a folder, not a file$"):
        view_data.load_source(str(tmp_path))
    with pytest.raises(ViewInputError, match="nope.json: no such file$"):
        view_data.load_source(str(tmp_path / "nope.json"))
    p = tmp_path / "s.json"
    p.write_text(json.dumps(two_pool_doc()))
    assert detect_kind(str(p))[0] == "history"
    doc = two_pool_doc()
    doc["devices"]["d"]["trace"] = []
    p.write_text(json.dumps(doc))
    assert detect_kind(str(p))[0] == "snapshot"
    with pytest.raises(ViewInputError, match="s.json: no data for device other"):
        view_data.load_source(str(p), device="other")
    (run,) = view_data.load_source(str(p), device="d")
    assert (run["label"], run["kind"], run["events"]) == ("s.json d", "snapshot", 0)
    assert run["peak"] == {"allocated": 4096 + 8192 + MB, "t": 0.0, "reserved": 5 * MB, "t_reserved": 0.0}


# ---------------------------------------------------------------------------------------------------------------------
# levels and kinds at their edges

def test_minmax_levels_at_the_whole_series_bound():
    """A series of exactly 2B points is kept whole at that level; one more point and it is cut into B buckets."""
    t = np.arange(21, dtype=np.float64)
    y = (np.arange(21) * 7 % 11).astype(np.float64)
    whole = minmax_levels(t[:20], {"allocated": y[:20], "reserved": y[:20], "x": y[:20]}, levels=(10, 40))
    assert [lv["buckets"] for lv in whole] == [0] and whole[0]["t"].tolist() == t[:20].tolist()
    assert sorted(k for k in whole[0] if k not in ("buckets", "t")) == ["allocated", "reserved", "x"]
    cut = minmax_levels(t, {"allocated": y, "reserved": y, "x": y}, levels=(10, 40))
    assert [lv["buckets"] for lv in cut] == [10, 0]
    assert sorted(k for k in cut[1] if k not in ("buckets", "t")) == ["allocated", "reserved"]   # the default fine
    starts = np.unique(np.linspace(0, 21, 10, endpoint=False).astype(np.int64))
    assert cut[0]["t"].tolist() == np.repeat(t[starts], 2).tolist()
    bounds = list(starts) + [21]
    assert cut[0]["x"].tolist() == [f(y[a:b]) for a, b in zip(bounds, bounds[1:]) for f in (np.min, np.max)]
    assert cut[1]["allocated"].tolist() == y.tolist()


def test_detect_kind_by_content(tmp_path):
    """Kinds are recognised by content: JSON after blank space, a log header with spaces around its names."""
    p = str(tmp_path / "x")
    assert detect_kind(p, raw=b"  \n" + json.dumps(two_pool_doc()).encode())[0] == "history"
    assert detect_kind(p, raw=b"\n[]")[0] == "chrome_trace"
    assert detect_kind(p, raw=b'{"traceEvents": []}')[0] == "chrome_trace"
    assert detect_kind(p, raw=b"Thread, Time, Action , Pointer, Size, Stream\n0,0,allocate,0x1,1,0\n") == \
        ("alloc_log", None)
    with pytest.raises(ViewInputError, match="not a memory snapshot"):
        detect_kind(p, raw=b"Action,Pointer\n")
    with pytest.raises(ViewInputError, match="not a memory snapshot"):
        detect_kind(p, raw=b"\xff\xfeAction,Pointer,Size\n")


def test_expandable_segments_reserve_by_their_maps():
    """An expandable segment: segment_alloc / segment_free of its range (size 0) reserve nothing; segment_map and
    segment_unmap move reserved by the run's bytes; the segment's extent follows its maps, so a block in pages mapped
    later still belongs to it; a range there before the history starts at what it had mapped then."""
    r1, r2 = 0x10000000, 0x40000000
    trace = [_tr("segment_alloc", r1, 0, 0), _tr("segment_map", r1, 4 * MB, 1), _tr("alloc", r1, 3 * MB, 2),
             _tr("segment_map", r1 + 4 * MB, 2 * MB, 3), _tr("alloc", r1 + 3 * MB, 3 * MB, 4),
             _tr("free", r1, 3 * MB, 5), _tr("segment_unmap", r1, 2 * MB, 6),
             _tr("segment_map", r2 + 2 * MB, 2 * MB, 7),           # r2 was reserved (2 MiB mapped) before
             _tr("free", r1 + 3 * MB, 3 * MB, 8), _tr("segment_unmap", r1 + 2 * MB, 4 * MB, 9),
             _tr("segment_free", r1, 0, 10)]
    segments = [{"address": r2, "total_size": 4 * MB, "expandable": True, "reserved_size": 64 * MB,
                 "mapped_size": 4 * MB, "mapped_pages": [[0, 4 * MB]], "granularity": 2 * MB, "blocks": [
                     {"address": r2, "size": MB, "state": "active_allocated"},
                     {"address": r2 + MB, "size": 3 * MB, "state": "inactive"}]}]
    run = view_data.build_run(view_data.events_from_history(
        _snapdoc({"d": {"segments": segments, "trace": trace}}))["d"])
    pre = 2 * MB                                               # r2's pages mapped before the history
    assert run["series"]["reserved"].tolist() == [pre + x * MB for x in (0, 4, 4, 6, 6, 6, 4, 6, 6, 2, 2)]
    assert run["series"]["allocated"].tolist()[-1] == MB       # r2's block from before the history
    seg1 = [sg for sg in run["segments"] if sg["addr"] == r1][0]
    assert seg1["size"] == 6 * MB and seg1["t_free"] == 10.0
    blocks = {b["addr"]: b for b in run["blocks"]}
    assert run["segments"][blocks[r1 + 3 * MB]["seg"]] is seg1      # the block over the later-mapped page
    growth = [m for m in run["markers"] if m["kind"] == "growth"]
    assert [m["size"] for m in growth] == [4 * MB, 2 * MB, 2 * MB]
