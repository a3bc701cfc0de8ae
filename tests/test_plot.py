"""paddle_rt/tools/plot.py: reading snapshots, Chrome traces and RMM logs into timelines and segment maps, the
drawing (a real PNG), the ``plot`` command and its errors, and the message when matplotlib (the extra) is missing."""
import json
import os
import subprocess
import sys

import pytest

import paddle_rt
from paddle_rt._core.errors import InvalidArgument
from paddle_rt.tools import plot
from trace_helpers import write_text, write_trace

MiB = 1 << 20
SRC = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
HAVE_MPL = True
try:
    import matplotlib  # noqa: F401
except ImportError:
    HAVE_MPL = False
needs_mpl = pytest.mark.skipif(not HAVE_MPL, reason="matplotlib (the plot extra) is not installed")

BASE = 0x7F0000000000
SEG2 = BASE + 0x10000000


def make_snapshot():
    """A snapshot in dump_snapshot's format (version 1), written by hand. History on rt_cpu:0 starts late: the
    block at BASE (1 MiB) and the segment at BASE (8 MiB) predate it. rt_cpu:1 has segments and no history."""
    trace = [
        {"action": "segment_alloc", "addr": SEG2, "size": 4 * MiB, "stream": 0, "time_ns": 1_000_000, "frames": []},
        {"action": "alloc", "addr": SEG2, "size": 3 * MiB, "stream": 0, "time_ns": 2_000_000, "frames": []},
        {"action": "alloc", "addr": BASE + MiB, "size": 2 * MiB, "stream": 0, "time_ns": 3_000_000, "frames": []},
        {"action": "oom", "addr": 0, "size": 64 * MiB, "stream": 0, "time_ns": 3_500_000, "frames": []},
        {"action": "free", "addr": BASE + MiB, "size": 2 * MiB, "stream": 0, "time_ns": 4_000_000, "frames": []},
        {"action": "alloc", "addr": BASE + 3 * MiB, "size": MiB, "stream": 0, "time_ns": 5_000_000, "frames": []},
        {"action": "empty_cache", "addr": 0, "size": 0, "stream": 0, "time_ns": 6_000_000, "frames": []},
    ]
    seg0 = {"address": BASE, "total_size": 8 * MiB, "stream": 0, "segment_type": "large",
            "allocated_size": 2 * MiB, "active_size": 2 * MiB, "requested_size": 2 * MiB - 100, "blocks": [
                {"address": BASE, "size": MiB, "requested_size": MiB, "state": "active_allocated"},
                {"address": BASE + MiB, "size": 2 * MiB, "requested_size": 0, "state": "inactive"},
                {"address": BASE + 3 * MiB, "size": MiB, "requested_size": MiB - 100, "state": "active_allocated"},
                {"address": BASE + 4 * MiB, "size": 4 * MiB, "requested_size": 0, "state": "inactive"}]}
    seg1 = {"address": SEG2, "total_size": 4 * MiB, "stream": 0, "segment_type": "large",
            "allocated_size": 3 * MiB, "active_size": 3 * MiB, "requested_size": 3 * MiB, "blocks": [
                {"address": SEG2, "size": 3 * MiB, "requested_size": 3 * MiB, "state": "active_allocated"},
                {"address": SEG2 + 3 * MiB, "size": MiB, "requested_size": 0, "state": "inactive"}]}
    small = {"address": BASE + 0x20000000, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
             "allocated_size": 512, "active_size": 512, "requested_size": 300, "blocks": [
                 {"address": BASE + 0x20000000, "size": 512, "requested_size": 300, "state": "active_allocated"},
                 {"address": BASE + 0x20000200, "size": 2 * MiB - 512, "requested_size": 0, "state": "inactive"}]}
    return {"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {
        "rt_cpu:0": {"segments": [seg0, seg1], "trace": trace, "stats": {"allocated_bytes.all.current": 5 * MiB}},
        "rt_cpu:1": {"segments": [small], "trace": [], "stats": {}},
        "rt_cpu:2": {"segments": [], "trace": [], "stats": {}},
    }}


def make_chrome_trace():
    ev = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "rt_cpu:0"}},
          {"ph": "M", "name": "process_name", "pid": 8, "args": {"name": "rt_cpu:1"}},
          {"ph": "X", "name": "memcpy_async", "pid": 7, "tid": 1, "ts": 5.0, "dur": 3.0},
          {"ph": "C", "name": "memory", "pid": 7, "ts": 1000.0, "args": {"allocated": MiB, "reserved": 2 * MiB}},
          {"ph": "C", "name": "memory", "pid": 7, "ts": 3000.0, "args": {"allocated": 0, "reserved": 2 * MiB}},
          {"ph": "C", "name": "memory", "pid": 7, "ts": 2000.0, "args": {"allocated": 3 * MiB, "reserved": 4 * MiB}},
          {"ph": "C", "name": "memory", "pid": 8, "ts": 1500.0, "args": {"allocated": 256, "reserved": 2 * MiB}},
          {"ph": "C", "name": "memory", "pid": 8, "ts": 2500.0, "args": {"reserved": 0}},
          {"ph": "i", "s": "p", "name": "oom", "cat": "memory", "pid": 7, "tid": 1, "ts": 2500.0, "args": {}},
          {"ph": "i", "s": "t", "name": "alloc", "cat": "memory", "pid": 7, "tid": 1, "ts": 2000.0, "args": {}},
          {"ph": "C", "name": "memory (pinned host)", "pid": 7, "ts": 1200.0,
           "args": {"allocated": 4096, "reserved": 2 * MiB}}]
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def write_json(path, obj, gz=False):
    return write_text(path, json.dumps(obj), gz)


LOG = [("allocate", 0x1000, 3 * MiB), ("allocate", 0x2000, 100), ("free", 0x1000, 3 * MiB),
       ("allocate", 0x3000, 2 * MiB), ("allocate", 0x4000, 5 * MiB), ("free", 0x2000, 100)]


def assert_png(path):
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 20_000       # a drawn figure, not an empty canvas


# -- reading --------------------------------------------------------------------------------------------------------

def test_snapshot_timeline_counts_memory_from_before_the_history():
    data = plot.from_snapshot(make_snapshot())
    assert data["kind"] == "snapshot"
    assert [d["device"] for d in data["devices"]] == ["rt_cpu:0", "rt_cpu:1"]     # rt_cpu:2 holds nothing
    d = data["devices"][0]
    # start: the 1 MiB block and the 8 MiB segment that predate the history
    assert d["allocated"] == [1 * MiB, 1 * MiB, 4 * MiB, 6 * MiB, 4 * MiB, 5 * MiB, 5 * MiB]
    assert d["reserved"] == [8 * MiB, 12 * MiB, 12 * MiB, 12 * MiB, 12 * MiB, 12 * MiB, 12 * MiB]
    assert d["time"] == [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and d["time_unit"] == "ms"   # to the last marker
    assert d["markers"] == [(2.5, "oom"), (5.0, "empty_cache")]
    # the end of the timeline agrees with the segments
    s = plot.segment_summary(d["segments"])
    assert s["allocated"] == d["allocated"][-1] and s["reserved"] == d["reserved"][-1]
    assert s["holes"] == 3 and s["largest_hole"] == 4 * MiB and s["free"] == 7 * MiB
    d1 = data["devices"][1]
    assert d1["time"] == [] and "record_history" in d1["note"]


def test_snapshot_history_without_times_uses_event_order():
    snap = make_snapshot()
    for ev in snap["devices"]["rt_cpu:0"]["trace"]:
        del ev["time_ns"]
    d = plot.from_snapshot(snap)["devices"][0]
    assert d["time_unit"] == "event" and d["time"][-1] == 6.0


def test_chrome_trace_counters():
    data = plot.from_chrome_trace(make_chrome_trace())
    assert [d["device"] for d in data["devices"]] == ["rt_cpu:0", "rt_cpu:0 pinned host", "rt_cpu:1"]
    d0, pinned, d1 = data["devices"]
    assert pinned["time"] == [0.2] and pinned["allocated"] == [4096] and pinned["markers"] == []
    assert d0["markers"] == [(1.5, "oom")]
    assert d0["time"] == [0.0, 1.0, 2.0]                    # us -> ms from the first counter, sorted by ts
    assert d0["allocated"] == [MiB, 3 * MiB, 0] and d0["reserved"] == [2 * MiB, 4 * MiB, 2 * MiB]
    assert d1["allocated"] == [256, 256] and d1["reserved"] == [2 * MiB, 0]   # a missing arg keeps its last value
    assert d0["segments"] is None
    assert plot.from_chrome_trace(make_chrome_trace()["traceEvents"])["devices"][0]["allocated"] == d0["allocated"]


def test_load_detects_the_kind_by_content(tmp_path):
    a = plot.load_memory_data(write_json(tmp_path / "anything.bin", make_snapshot(), gz=True))
    b = plot.load_memory_data(write_json(tmp_path / "trace.json", make_chrome_trace()))
    assert a["kind"] == "snapshot" and b["kind"] == "chrome_trace"
    only = plot.load_memory_data(write_json(tmp_path / "s.json", make_snapshot()), device="rt_cpu:1")
    assert [d["device"] for d in only["devices"]] == ["rt_cpu:1"]


@pytest.mark.parametrize("content,match", [
    ("hello, world\n", "not a memory snapshot, a Chrome trace or an RMM allocation log"),
    ("{not json", "not valid JSON"),
    ('{"a": 1}', "neither a paddle_rt memory snapshot"),
    ('{"format": "paddle_rt.memory_snapshot", "version": 2, "devices": {}}', "version 2 is not supported"),
    ('{"format": "other", "version": 1, "devices": {}}', "is not 'paddle_rt.memory_snapshot'"),
    ('{"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {}}', "holds no segments and no history"),
    ('{"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {"rt_cpu:0": {"segments": [], '
     '"trace": [{"action": "resize", "addr": 1, "size": 2, "time_ns": 0}]}}}', "unknown action 'resize'"),
    ('{"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {"rt_cpu:0": {"segments": '
     '[{"address": "0x10", "total_size": 5}]}}}', "segment 0 address is not an integer"),
    ('{"traceEvents": [{"ph": "X", "name": "op", "ts": 1, "dur": 2}]}', "no memory counters"),
])
def test_bad_inputs_raise_a_clear_error(tmp_path, content, match):
    p = tmp_path / "in.json"
    p.write_text(content)
    with pytest.raises(InvalidArgument, match=match):
        plot.load_memory_data(str(p))


def test_missing_file_and_unknown_device(tmp_path):
    with pytest.raises(InvalidArgument, match="no such file"):
        plot.load_memory_data(str(tmp_path / "nope.json"))
    with pytest.raises(InvalidArgument, match="no data for device rt_cpu:5"):
        plot.load_memory_data(write_json(tmp_path / "s.json", make_snapshot()), device="rt_cpu:5")


def test_rmm_log_is_replayed_with_a_per_event_timeline(tmp_path):
    paddle_rt.empty_cache("rt_cpu:1")            # what earlier tests left cached (tests never assume an empty device)
    before = paddle_rt.memory_reserved("rt_cpu:1")
    data = plot.load_memory_data(write_trace(tmp_path / "log.csv", LOG), device="rt_cpu:1", conf="growth:exact")
    assert data["kind"] == "rmm_trace"
    d = data["devices"][0]
    assert d["device"] == "rt_cpu:1" and d["time_unit"] == "event"
    assert d["time"] == list(range(len(LOG) + 1))
    assert d["requested"] == [0, 3 * MiB, 3 * MiB + 100, 100, 2 * MiB + 100, 7 * MiB + 100, 7 * MiB]
    assert all(a >= r for a, r in zip(d["allocated"], d["requested"]))       # rounded up, never below
    assert all(res >= a for a, res in zip(d["allocated"], d["reserved"]))
    assert d["allocated"][-1] == 7 * MiB
    s = plot.segment_summary(d["segments"])      # the segments at the end of the log
    assert s["allocated"] == d["allocated"][-1] and s["reserved"] == d["reserved"][-1]
    assert data["replay"]["peak_reserved"] == max(d["reserved"])
    assert paddle_rt.memory_reserved("rt_cpu:1") == before                    # the replay gave everything back
    paddle_rt.get_allocator("rt_cpu:1").configure(growth=None)


# -- drawing --------------------------------------------------------------------------------------------------------

@needs_mpl
def test_plot_snapshot_writes_a_png(tmp_path):
    out = plot.plot_memory(make_snapshot(), str(tmp_path / "s.png"))
    assert_png(out)
    import matplotlib.image
    img = matplotlib.image.imread(out)
    assert img.shape[1] > 1000 and img.shape[0] > 600     # 3 panels (timeline, segments; segments of rt_cpu:1)


@needs_mpl
def test_plot_many_segments_and_long_timelines(tmp_path):
    """More segments than rows (the ones with most free bytes are drawn) and a series longer than the point
    budget (reduced to per-bucket maxima: the peak survives)."""
    segs = []
    for i in range(plot.MAX_SEGMENT_ROWS + 25):
        a = BASE + i * 0x1000000
        free = (i % 7) * 65536
        blocks = [{"address": a, "size": MiB - free, "requested_size": 1, "state": "active_allocated"}]
        if free:
            blocks.append({"address": a + MiB - free, "size": free, "requested_size": 0, "state": "inactive"})
        segs.append({"address": a, "total_size": MiB, "segment_type": "large", "blocks": blocks})
    n = 3 * plot.MAX_TIMELINE_POINTS + 17
    alloc = [i % 1000 for i in range(n)]
    alloc[12345] = 10 ** 9
    data = {"source": "synthetic", "kind": "snapshot", "devices": [{
        "device": "rt_cpu:0", "time": list(range(n)), "time_unit": "event", "allocated": alloc, "reserved": alloc,
        "requested": None, "markers": [(5.0, "oom")], "note": None, "segments": segs}]}
    t, a = plot._reduce(list(range(n)), alloc)
    assert len(t) == plot.MAX_TIMELINE_POINTS and max(a) == 10 ** 9
    assert_png(plot.plot_memory(data, str(tmp_path / "many.png"), title="many"))


@needs_mpl
def test_plot_command(tmp_path, capsys):
    from paddle_rt.__main__ import main
    snap = write_json(tmp_path / "s.json", make_snapshot())
    out = tmp_path / "o.png"
    assert main(["plot", snap, "-o", str(out)]) == 0
    assert_png(out)
    assert "wrote" in capsys.readouterr().out
    trace = write_json(tmp_path / "t.json", make_chrome_trace())
    assert main(["plot", trace, "-o", str(tmp_path / "t.png"), "--device", "rt_cpu:1"]) == 0
    assert_png(tmp_path / "t.png")
    log = write_trace(tmp_path / "log.csv", LOG)
    assert main(["plot", log, "-o", str(tmp_path / "l.svg"), "--device", "rt_cpu:1", "--no-progress"]) == 0
    assert (tmp_path / "l.svg").read_text().lstrip().startswith("<?xml")
    # errors: exit status 2 and one line naming the problem, no traceback
    bad = tmp_path / "bad.txt"
    bad.write_text("nothing here\n")
    assert main(["plot", str(bad), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "not a memory snapshot" in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()
    assert main(["plot", log, "-o", str(tmp_path / "y.png"), "--conf", "growth"]) == 2
    assert "not key:value" in capsys.readouterr().err


def _blocked(module, args):
    """Run ``python -m paddle_rt ARGS`` in a child where importing ``module`` fails."""
    code = (f"import sys; sys.modules[{module!r}] = None; from paddle_rt.__main__ import main; "
            f"sys.exit(main({args!r}))")
    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=SRC)


def test_missing_matplotlib_names_the_extra(tmp_path):
    snap = write_json(tmp_path / "s.json", make_snapshot())
    r = _blocked("matplotlib", ["plot", snap, "-o", str(tmp_path / "o.png")])
    assert r.returncode == 2, r.stderr
    assert 'pip install "paddle_rt[plot]"' in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.png").exists()
    r = _blocked("matplotlib", ["replay", write_trace(tmp_path / "log.csv", LOG), "--no-min-capacity",
                                "--plot", str(tmp_path / "r.png")])
    assert r.returncode == 2 and 'pip install "paddle_rt[plot]"' in r.stderr and "Traceback" not in r.stderr


def test_missing_matplotlib_from_python():
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from paddle_rt.tools import plot\n"
            "try:\n    plot.plot_memory({'devices': []}, 'x.png')\n"
            "except ImportError as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC), capture_output=True,
                       text=True, timeout=120, cwd=SRC)
    assert r.stdout.startswith("MissingExtraError") and "paddle_rt[plot]" in r.stdout, r.stderr


@needs_mpl
def test_round_trip_of_a_real_snapshot(tmp_path):
    """A snapshot the memory history (issue 7) writes is read and drawn."""
    from paddle_rt import memory       # memory.dump_snapshot and record_history exist: their removal fails here
    memory.record_history()
    try:
        keep = [paddle_rt.malloc(n, "rt_cpu:0") for n in (100, 3 * MiB, 5 * MiB)]
        keep[1].free()
        path = str(tmp_path / "snap.json")
        try:
            memory.dump_snapshot(path)
        finally:
            keep[0].free()
            keep[2].free()
    finally:
        memory.record_history(False)
    data = plot.load_memory_data(path, device="rt_cpu:0")
    d = data["devices"][0]
    s = plot.segment_summary(d["segments"])
    assert s["allocated"] >= 5 * MiB + 100
    if d["time"]:
        assert d["allocated"][-1] == s["allocated"] and d["reserved"][-1] == s["reserved"]
    assert_png(plot.plot_memory(data, str(tmp_path / "real.png")))


@needs_mpl
def test_round_trip_of_a_profiler_trace(tmp_path):
    """When the profiler of issue 7 is present, the memory counters of its Chrome trace are read and drawn."""
    from paddle_rt import profiler     # the profiler exists: its removal fails here, not skips
    with profiler.profile() as prof:
        a = paddle_rt.malloc(3 * MiB, "rt_cpu:0")
        b = paddle_rt.malloc(MiB, "rt_cpu:0")
        a.free()
        b.free()
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    data = plot.load_memory_data(path, device="rt_cpu:0")
    d = data["devices"][0]
    assert max(d["allocated"]) >= 4 * MiB and d["time_unit"] == "ms"
    assert_png(plot.plot_memory(data, str(tmp_path / "trace.png")))


def test_panels_say_what_they_show():
    """What a reader of the image sees: the timeline's legend (peak and end of each series, the markers once each),
    its colours and styles, axes and title; the segment map's title (totals, "hole"/"holes") and legend."""
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure
    from paddle_rt.tools import figures
    d = {"device": "rt_cpu:0", "time_unit": "event", "time": [0, 1, 2, 3], "note": None,
         "reserved": [0, 4 * MiB, 4 * MiB, 2 * MiB], "allocated": [0, 3 * MiB, MiB, MiB],
         "requested": [0, 3 * MiB - 512, MiB - 512, MiB // 2], "markers": [(1, "oom"), (2, "empty_cache"), (3, "oom")]}
    ax = Figure().subplots()
    figures._draw_timeline(ax, d)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "reserved (peak 4.0 MiB, end 2.0 MiB)", "allocated (peak 3.0 MiB, end 1.0 MiB)",
        "live requested (peak 3.0 MiB, end 0.5 MiB)", "out of memory", "empty_cache"]
    steps, marks = ax.get_lines()[:3], ax.get_lines()[3:]
    assert [to_hex(x.get_color()) for x in steps] == [figures.COLOR_RESERVED, figures.COLOR_ALLOCATED,
                                                     figures.COLOR_REQUESTED]
    assert [(x.get_linestyle(), x.get_linewidth()) for x in steps] == [("-", 1.6), ("-", 1.6), ("--", 1.0)]
    assert [(to_hex(x.get_color()), x.get_linestyle()) for x in marks] == [("#c0392b", "--"), ("#7f7f7f", ":"),
                                                                           ("#c0392b", "--")]
    assert len(ax.collections) == 1                              # the area under "allocated" only
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_ylim()[0], ax.get_title(loc="left")) == \
        ("event", "MiB", 0.0, "rt_cpu:0: memory over time")
    block = {"address": 0, "size": MiB, "state": "active_allocated"}
    for holes, word in ((1, "hole"), (2, "holes")):
        blocks = [block] + [{"address": (1 + i) * MiB, "size": MiB, "state": "inactive"} for i in range(holes)]
        seg = {"address": 0, "total_size": (1 + holes) * MiB, "segment_type": "large", "blocks": blocks}
        ax = Figure().subplots()
        figures._draw_segments(ax, {"device": "rt_cpu:0", "segments": [seg]})
        assert ax.get_title(loc="left") == (f"rt_cpu:0: segments (1)\nreserved {1 + holes}.0 MiB, allocated 1.0 MiB, "
                                            f"free {holes}.0 MiB in {holes} {word}, largest hole 1.0 MiB")
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["allocated block", "free hole (cached)"]
        assert [t.get_text() for t in ax.get_yticklabels()] == [f"0x0 large {1 + holes}.0 MiB"]
