"""paddle_rt/tools/plot.py: reading snapshots, Chrome traces and RMM logs into timelines and segment maps, the
drawing (a real PNG), the ``plot`` command and its errors, and the message when matplotlib (the extra) is missing."""
import json
import os
import re
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


# -- what the figures hold (matplotlib objects inspected in-process, not pixels) -------------------------------------

def _drawn(draw, d):
    """The axes ``draw`` (figures._draw_timeline or _draw_segments) fills for ``d``, laid out (a renderer ran)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    draw(ax, d)
    fig.canvas.draw()
    return ax


def _legend_is_right_of(ax):
    """The legend sits outside the plot, to its right, its top at the top of the axes: it hides no curve or bar."""
    leg, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    return leg.x0 >= box.x1 and 0 <= box.y1 - leg.y1 < 12      # (12 px: the legend's own padding)


@needs_mpl
def test_timeline_draws_each_series_in_mib_as_steps_with_its_peak_and_end():
    """The timeline a user reads: reserved and allocated as steps (a level holds until the next event) in MiB over
    the times given, the area under "allocated" filled, each legend entry with that series' peak and last value
    (thousands separated), the markers as vertical lines at their times (labelled once per kind), the note in the
    title, and the legend beside the plot."""
    from paddle_rt.tools import figures
    d = {"device": "rt_cpu:3", "time_unit": "ms", "time": [0.0, 1.5, 4.0, 6.0], "note": "partial history",
         "reserved": [2 * MiB, 2048 * MiB, 6 * MiB, 6 * MiB], "allocated": [MiB, 1536 * MiB, 3 * MiB // 2, 0],
         "requested": None, "markers": [(4.0, "empty_cache"), (1.5, "empty_cache"), (6.0, "oom")]}
    ax = _drawn(figures._draw_timeline, d)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "reserved (peak 2,048.0 MiB, end 6.0 MiB)", "allocated (peak 1,536.0 MiB, end 0.0 MiB)", "empty_cache",
        "out of memory"]                                          # no "live requested": that series is absent
    lines = ax.get_lines()
    reserved, allocated, marks = lines[0], lines[1], lines[2:]
    for line, series in ((reserved, d["reserved"]), (allocated, d["allocated"])):
        assert line.get_drawstyle() == "steps-post"
        assert list(line.get_xdata()) == d["time"]
        assert list(line.get_ydata()) == [v / MiB for v in series]
    assert [m.get_xdata()[0] for m in marks] == [4.0, 1.5, 6.0]
    labels = [m.get_label() for m in marks]                      # a label starting with "_" is not in the legend
    assert labels[0] == "empty_cache" and labels[1].startswith("_") and labels[2] == "out of memory"
    assert marks[0].get_linestyle() == marks[1].get_linestyle() != marks[2].get_linestyle()   # OOM marks differ
    (area,) = ax.collections                                      # the area under "allocated", to its top
    ext = area.get_paths()[0].get_extents()
    assert (ext.x0, ext.x1, ext.y0, ext.y1) == (0.0, 6.0, 0.0, 1536.0)
    assert ax.get_xlabel() == "time (ms)" and ax.get_ylim()[0] == 0.0
    assert ax.get_title(loc="left") == "rt_cpu:3: memory over time (partial history)"
    assert _legend_is_right_of(ax)
    quiet_end = dict(d, time=[0.0, 1.0, 2.0, 10.0], reserved=[MiB, 4 * MiB, MiB, 0], allocated=[MiB, 3 * MiB, 0, 0],
                     markers=[(1.0, "oom")])                 # room at the top right: the legend stays outside
    assert _legend_is_right_of(_drawn(figures._draw_timeline, quiet_end))


@needs_mpl
def test_timeline_without_history_says_why_instead_of_drawing():
    """A device with no timeline (a snapshot taken without record_history) gets its note, or "no timeline", in the
    middle of an empty panel: no curve, no legend, no ticks."""
    from paddle_rt.tools import figures
    for note, shown in (("call record_history() first", "call record_history() first"), (None, "no timeline")):
        d = {"device": "rt_cpu:1", "time_unit": "ms", "time": [], "note": note, "reserved": [], "allocated": [],
             "requested": None, "markers": []}
        ax = _drawn(figures._draw_timeline, d)
        assert [t.get_text() for t in ax.texts] == [shown]
        assert ax.get_lines() == [] and ax.get_legend() is None
        assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []
        assert ax.get_title(loc="left") == "rt_cpu:1: memory over time"


def test_long_series_keep_the_first_time_and_the_maximum_of_each_bucket():
    """A series longer than the point budget is cut into buckets: each keeps its first time and the maximum of each
    series over the bucket, so no peak is lost; a short series is drawn as it is."""
    n, limit = 103, 10
    time = list(range(n))
    a = [(i * 37) % 101 for i in range(n)]
    b = [n - i for i in range(n)]
    t, ra, rb = plot._reduce(time, a, b, limit=limit)
    t = [int(x) for x in t]
    assert len(t) == len(ra) == len(rb) == limit and t[0] == 0 and t == sorted(set(t))
    bounds = t + [n]
    for k in range(limit):
        assert ra[k] == max(a[bounds[k]:bounds[k + 1]]) and rb[k] == max(b[bounds[k]:bounds[k + 1]])
    short = plot._reduce([0.5, 1.5], [3, 4], limit=2)
    assert short == ([0.5, 1.5], [3, 4])


def _bars(ax):
    """{row: {"outline" | "allocated" | "free": [(offset MiB, width MiB)]}} of a segment map, and the hatches."""
    from matplotlib.colors import to_hex
    from paddle_rt.tools import figures
    rows, hatches = {}, {}
    for c in ax.collections:
        face = c.get_facecolor()
        kind = "outline" if not len(face) or face[0][3] == 0 else \
            {figures.COLOR_ALLOCATED: "allocated", figures.COLOR_FREE: "free"}[to_hex(face[0])]
        hatches.setdefault(kind, set()).add(c.get_hatch())
        for p in c.get_paths():
            e = p.get_extents()
            row = round(e.y0 + e.height / 2)
            assert abs(e.y0 + e.height / 2 - row) < 1e-9 and 0.5 <= e.height < 1    # on its row, apart from the next
            rows.setdefault(row, {}).setdefault(kind, []).append((round(e.x0, 6), round(e.width, 6)))
    return rows, hatches


@needs_mpl
def test_segment_map_draws_each_block_at_its_offset_in_address_order():
    """Each segment is a row (lowest address at the top), its outline as long as the segment, its allocated blocks
    and its free holes (hatched) at their offsets from the segment's start, adjacent blocks of one kind drawn as
    one bar, whatever order the blocks are listed in."""
    from paddle_rt.tools import figures
    lo, hi = BASE, BASE + 0x4000000
    interleaved = {"address": lo, "total_size": 4 * MiB, "segment_type": "large", "blocks": [
        {"address": lo, "size": MiB, "state": "active_allocated"},
        {"address": lo + MiB, "size": MiB, "state": "inactive"},
        {"address": lo + 2 * MiB, "size": MiB, "state": "active_allocated"},
        {"address": lo + 3 * MiB, "size": MiB, "state": "inactive"}]}
    merged = {"address": hi, "total_size": 6 * MiB, "segment_type": "large", "blocks": [
        {"address": hi + 3 * MiB, "size": MiB, "state": "inactive"},
        {"address": hi + MiB, "size": 2 * MiB, "state": "active_allocated"},
        {"address": hi, "size": MiB, "state": "active_allocated"},
        {"address": hi + 4 * MiB, "size": 2 * MiB, "state": "active_pending_free"}]}
    ax = _drawn(figures._draw_segments, {"device": "rt_cpu:0", "segments": [merged, interleaved]})
    rows, hatches = _bars(ax)
    assert rows == {0: {"outline": [(0, 4)], "allocated": [(0, 1), (2, 1)], "free": [(1, 1), (3, 1)]},
                    1: {"outline": [(0, 6)], "allocated": [(0, 3)], "free": [(3, 3)]}}
    assert hatches["free"] == {"//"} and hatches["allocated"] == {None}            # the holes stand out
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"0x{lo:x} large 4.0 MiB", f"0x{hi:x} large 6.0 MiB"]
    assert ax.get_ylim() == (1.5, -0.5) and ax.get_xlim()[0] == 0
    assert ax.get_xlabel() == "offset in segment (MiB)"
    assert ax.get_title(loc="left").split("\n")[1] == \
        "reserved 10.0 MiB, allocated 5.0 MiB, free 5.0 MiB in 4 holes, largest hole 2.0 MiB"
    assert _legend_is_right_of(ax)


@needs_mpl
def test_segment_map_sizes_in_bytes_kib_and_mib():
    """Sizes read as bytes below 1 KiB, KiB below 1 MiB, MiB from there (one decimal); no free block is "0 holes"."""
    from paddle_rt.tools import figures
    sizes = [1023, 1024, 1536, MiB, 3 * MiB // 2]
    segs = [{"address": 0x1000 * (i + 1), "total_size": n, "segment_type": "small", "blocks": []}
            for i, n in enumerate(sizes)]
    ax = _drawn(figures._draw_segments, {"device": "rt_cpu:2", "segments": segs})
    assert [t.get_text().split(" ", 2)[2] for t in ax.get_yticklabels()] == \
        ["1023 B", "1.0 KiB", "1.5 KiB", "1.0 MiB", "1.5 MiB"]
    assert ax.get_title(loc="left") == ("rt_cpu:2: segments (5)\nreserved 2.5 MiB, allocated 0 B, free 0 B in "
                                        "0 holes, largest hole 0 B")
    hole = {"address": 0x100, "total_size": 2048, "segment_type": "small", "blocks": [
        {"address": 0x100, "size": 512, "state": "active_allocated"},
        {"address": 0x300, "size": 1536, "state": "inactive"}]}
    ax = _drawn(figures._draw_segments, {"device": "rt_cpu:2", "segments": [hole]})
    assert ax.get_title(loc="left").split("\n")[1] == \
        "reserved 2.0 KiB, allocated 512 B, free 1.5 KiB in 1 hole, largest hole 1.5 KiB"


@needs_mpl
def test_segment_map_of_more_segments_than_rows_keeps_those_with_most_free_bytes():
    """Beyond MAX_SEGMENT_ROWS segments, the rows drawn are those with the most free bytes, still in address order,
    and the title says so while its totals count every segment."""
    from paddle_rt.tools import figures
    n = plot.MAX_SEGMENT_ROWS + 5
    segs, free_of = [], {}
    for i in range(n):
        a = BASE + i * 0x1000000
        free = ((i * 7) % n) * 4096                          # all different: 0, 4 KiB, ... in a shuffled order
        free_of[a] = free
        blocks = [{"address": a, "size": MiB - free, "state": "active_allocated"}]
        if free:
            blocks.append({"address": a + MiB - free, "size": free, "state": "inactive"})
        segs.append({"address": a, "total_size": MiB, "segment_type": "large", "blocks": blocks})
    ax = _drawn(figures._draw_segments, {"device": "rt_cpu:0", "segments": segs[::-1]})
    kept = sorted(sorted(free_of, key=free_of.get, reverse=True)[:plot.MAX_SEGMENT_ROWS])
    assert [int(t.get_text().split()[0], 16) for t in ax.get_yticklabels()] == kept
    title = ax.get_title(loc="left").split("\n")
    assert title[0] == f"rt_cpu:0: segments ({n}, showing the {plot.MAX_SEGMENT_ROWS} with the most free bytes)"
    assert f"reserved {n}.0 MiB," in title[1] and f" in {n - 1} holes," in title[1]
    assert len(_bars(ax)[0]) == plot.MAX_SEGMENT_ROWS
    exact = segs[:plot.MAX_SEGMENT_ROWS]
    ax = _drawn(figures._draw_segments, {"device": "rt_cpu:0", "segments": exact})
    assert ax.get_title(loc="left").split("\n")[0] == f"rt_cpu:0: segments ({plot.MAX_SEGMENT_ROWS})"
    assert len(ax.get_yticklabels()) == plot.MAX_SEGMENT_ROWS


def _figure_of(monkeypatch, data, path, **kw):
    """The matplotlib Figure plot_memory draws ``data`` on (the image is written too)."""
    from paddle_rt.tools import figures
    mpl, Figure, Canvas = figures.require_matplotlib()
    made = []

    class Kept(Figure):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(figures, "require_matplotlib", lambda: (mpl, Kept, Canvas))
    assert plot.plot_memory(data, str(path), **kw) == str(path)
    (fig,) = made
    return fig


@needs_mpl
def test_figure_has_a_timeline_per_device_and_a_segment_map_where_there_are_segments(tmp_path, monkeypatch):
    """The panels of the image, top to bottom: per device its timeline, then its segment map when the input has
    segments; the title names the input file and its kind, or is the one given."""
    snap = write_json(tmp_path / "mem.json", make_snapshot())
    fig = _figure_of(monkeypatch, snap, tmp_path / "a.png")
    titles = [ax.get_title(loc="left").split("\n")[0] for ax in fig.axes]
    assert titles == ["rt_cpu:0: memory over time", "rt_cpu:0: segments (2)",
                      "rt_cpu:1: memory over time", "rt_cpu:1: segments (1)"]
    assert fig.get_suptitle() == "paddle_rt memory: mem.json (memory snapshot)"
    assert_png(tmp_path / "a.png")
    fig = _figure_of(monkeypatch, make_chrome_trace(), tmp_path / "b.png", title="step 12")
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "rt_cpu:0: memory over time", "rt_cpu:0 pinned host: memory over time", "rt_cpu:1: memory over time"]
    assert fig.get_suptitle() == "step 12"
    trace = write_json(tmp_path / "prof.json", make_chrome_trace())
    import pathlib
    assert _figure_of(monkeypatch, pathlib.Path(trace), tmp_path / "c.png").get_suptitle() == \
        "paddle_rt memory: prof.json (profiler trace)"
    other = {"source": "/x/y/run.log", "kind": "mine", "devices": [dict(plot.from_chrome_trace(
        make_chrome_trace())["devices"][0])]}
    assert _figure_of(monkeypatch, other, tmp_path / "d.png").get_suptitle() == "paddle_rt memory: run.log (mine)"


@needs_mpl
def test_timelines_of_one_clock_share_the_time_axis(tmp_path, monkeypatch):
    """Devices of one trace or snapshot (times in ms on one clock) are drawn over the same time range, all of each
    in view; timelines counted in events (each device its own count) keep their own."""
    fig = _figure_of(monkeypatch, make_chrome_trace(), tmp_path / "t.png")
    lims = {ax.get_xlim() for ax in fig.axes}
    assert len(lims) == 1
    (lo, hi), = lims
    assert -0.1 <= lo < 0.0 and 2.0 < hi <= 2.1                  # the counters run from 0 to 2 ms
    dev = {"time_unit": "event", "note": None, "requested": None, "markers": [], "segments": None}
    data = {"source": "s", "kind": "rmm_trace", "devices": [
        dict(dev, device="a", time=list(range(10)), allocated=[1] * 10, reserved=[2] * 10),
        dict(dev, device="b", time=list(range(1000)), allocated=[1] * 1000, reserved=[2] * 1000)]}
    a, b = _figure_of(monkeypatch, data, tmp_path / "e.png").axes
    assert a.get_xlim()[1] < 20 < 900 < b.get_xlim()[1]


@needs_mpl
def test_resolution_follows_dpi(tmp_path):
    """``dpi`` sets the image's resolution: twice the dpi, twice the pixels each way."""
    import matplotlib.image
    small = matplotlib.image.imread(plot.plot_memory(make_chrome_trace(), str(tmp_path / "s.png"), dpi=40))
    large = matplotlib.image.imread(plot.plot_memory(make_chrome_trace(), str(tmp_path / "l.png"), dpi=80))
    assert large.shape[0] == 2 * small.shape[0] and large.shape[1] == 2 * small.shape[1]


def test_nothing_to_plot_and_data_of_no_known_kind():
    """Data without devices, or of no kind plot_memory reads, is one clear error, not an empty image."""
    pytest.importorskip("matplotlib")
    with pytest.raises(InvalidArgument, match="^plot: run.json: nothing to plot$"):
        plot.plot_memory({"source": "run.json", "kind": "snapshot", "devices": []}, "x.png")
    with pytest.raises(InvalidArgument, match="^plot_memory: data must be a path, a memory snapshot, a Chrome trace"):
        plot.plot_memory(42, "x.png")


# -- reading, in detail ---------------------------------------------------------------------------------------------

def test_snapshot_history_sorted_by_time_with_memory_freed_from_before_it():
    """The history is replayed in time order; a free (or segment_free) of memory the history never allocated counts
    that memory as there from the start; a marker before the last event does not lengthen the timeline; and the
    end agrees with the segments."""
    S, T, A, B = BASE, BASE + 0x8000000, BASE + 0x1000000, BASE + 0x2000
    trace = [
        {"action": "free", "addr": A, "size": 2 * MiB, "time_ns": 13_000_000},
        {"action": "segment_alloc", "addr": S, "size": 8 * MiB, "time_ns": 11_000_000},
        {"action": "alloc", "addr": B, "size": MiB, "time_ns": 12_000_000},
        {"action": "segment_free", "addr": T, "size": 4 * MiB, "time_ns": 14_000_000},
        {"action": "oom", "addr": 0, "size": 64 * MiB, "time_ns": 12_500_000},
        {"action": "empty_cache", "addr": 0, "size": 0, "time_ns": 14_000_000},    # at the last event: no new point
    ]
    seg = {"address": S, "total_size": 8 * MiB, "segment_type": "large", "blocks": [
        {"address": S, "size": MiB, "state": "inactive"}, {"address": B, "size": MiB, "state": "active_allocated"}]}
    snap = {"format": "paddle_rt.memory_snapshot", "version": 1,
            "devices": {"rt_cpu:0": {"segments": [seg], "trace": trace}}}
    d = plot.from_snapshot(snap)["devices"][0]
    assert d["time"] == [0.0, 0.0, 1.0, 2.0, 3.0]
    assert d["allocated"] == [2 * MiB, 2 * MiB, 3 * MiB, MiB, MiB]
    assert d["reserved"] == [4 * MiB, 12 * MiB, 12 * MiB, 12 * MiB, 8 * MiB]
    assert d["markers"] == [(1.5, "oom"), (3.0, "empty_cache")]
    s = plot.segment_summary(d["segments"])
    assert (s["allocated"], s["reserved"]) == (d["allocated"][-1], d["reserved"][-1])


def test_expandable_segments_reserve_by_their_maps():
    """segment_alloc / segment_free of a range (size 0) reserve nothing; segment_map / segment_unmap move reserved by
    their run; a range reserved before the history starts at what it had mapped then (its final mapped bytes less
    the maps in the history); the end agrees with the segments' mapped bytes."""
    R, Q = BASE, BASE + 0x40000000
    trace = [
        {"action": "segment_alloc", "addr": R, "size": 0, "time_ns": 1_000_000},
        {"action": "segment_map", "addr": R, "size": 4 * MiB, "time_ns": 2_000_000},
        {"action": "alloc", "addr": R, "size": 3 * MiB, "time_ns": 3_000_000},
        {"action": "segment_map", "addr": Q + 2 * MiB, "size": 2 * MiB, "time_ns": 4_000_000},
        {"action": "segment_unmap", "addr": R + 2 * MiB, "size": 2 * MiB, "time_ns": 5_000_000},
    ]
    segs = [{"address": R, "total_size": 4 * MiB, "expandable": True, "reserved_size": 64 * MiB,
             "mapped_size": 2 * MiB, "blocks": [{"address": R, "size": 3 * MiB, "state": "active_allocated"},
                                                {"address": R + 3 * MiB, "size": MiB, "state": "inactive"}]},
            {"address": Q, "total_size": 4 * MiB, "expandable": True, "reserved_size": 64 * MiB,
             "mapped_size": 4 * MiB, "blocks": [{"address": Q, "size": 4 * MiB, "state": "inactive"}]}]
    snap = {"format": "paddle_rt.memory_snapshot", "version": 1,
            "devices": {"rt_cpu:0": {"segments": segs, "trace": trace}}}
    d = plot.from_snapshot(snap)["devices"][0]
    assert d["reserved"] == [2 * MiB, 2 * MiB, 6 * MiB, 6 * MiB, 8 * MiB, 6 * MiB]
    assert d["allocated"][-1] == 3 * MiB
    s = plot.segment_summary(d["segments"])
    assert (s["allocated"], s["reserved"]) == (d["allocated"][-1], d["reserved"][-1])
    bad = {"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {"rt_cpu:0": {"segments": [
        dict(segs[0], mapped_size="2")], "trace": trace}}}
    with pytest.raises(paddle_rt.InvalidArgument, match="mapped_size"):
        plot.from_snapshot(bad)


def test_devices_of_a_snapshot_share_one_clock():
    """Every device's times count from the first event recorded on any device (one clock for all)."""
    def dev(t_seg, t_alloc, addr):
        return {"segments": [], "trace": [
            {"action": "segment_alloc", "addr": addr, "size": 2 * MiB, "time_ns": t_seg},
            {"action": "alloc", "addr": addr, "size": MiB, "time_ns": t_alloc},
            {"action": "free", "addr": addr, "size": MiB, "time_ns": t_alloc + 1_000_000},
            {"action": "segment_free", "addr": addr, "size": 2 * MiB, "time_ns": t_alloc + 2_000_000}]}
    snap = {"format": "paddle_rt.memory_snapshot", "version": 1,
            "devices": {"rt_cpu:0": dev(6_000_000, 9_000_000, BASE), "rt_cpu:1": dev(5_000_000, 7_000_000, SEG2)}}
    d0, d1 = plot.from_snapshot(snap)["devices"]
    assert d0["time"] == [1.0, 1.0, 4.0, 5.0, 6.0] and d1["time"] == [0.0, 0.0, 2.0, 3.0, 4.0]
    assert d0["allocated"] == [0, 0, MiB, 0, 0] and d0["reserved"] == [0, 2 * MiB, 2 * MiB, 2 * MiB, 0]


def test_chrome_trace_devices_without_names_markers_and_stray_events():
    """Counters of a pid without a process name are "pid N" (a name entry without a name: the pid); markers are the
    ``memory`` instant events of that pid, sorted, on its device memory (not on pinned host); other instants and
    non-object entries are ignored."""
    ev = ["junk", 5,
          {"ph": "M", "name": "process_name", "pid": 1, "args": {}},
          {"ph": "C", "name": "memory", "pid": 1, "ts": 300, "args": {"allocated": 30}},
          {"ph": "C", "name": "memory", "pid": 1, "ts": 100, "args": {"allocated": 10, "reserved": 20}},
          {"ph": "C", "name": "memory", "pid": 2, "ts": 200, "args": {"allocated": 5, "reserved": 6}},
          {"ph": "C", "name": "memory (pinned host)", "pid": 2, "ts": 400, "args": {"allocated": 1, "reserved": 2}},
          {"ph": "C", "name": "other counter", "pid": 2, "ts": 50, "args": {"allocated": 99}},
          {"ph": "i", "name": "oom", "cat": "memory", "pid": 2, "ts": 250},
          {"ph": "i", "name": "empty_cache", "cat": "memory", "pid": 2, "ts": 150},
          {"ph": "i", "name": "oom", "cat": "other", "pid": 2, "ts": 260},
          {"ph": "i", "name": "oom", "cat": "memory", "pid": 2, "ts": "late"},
          {"ph": "i", "name": "sync", "cat": "memory", "pid": 2, "ts": 270}]
    data = plot.from_chrome_trace(ev)
    assert data["kind"] == "chrome_trace" and data["source"] == "<trace>"
    one, two, pinned = data["devices"]
    assert (one["device"], two["device"], pinned["device"]) == ("1", "pid 2", "pid 2 pinned host")
    assert one["time"] == [0.0, 0.2] and one["allocated"] == [10, 30] and one["reserved"] == [20, 20]
    assert two["time"] == [0.1] and two["markers"] == [(0.05, "empty_cache"), (0.15, "oom")]
    assert pinned["time"] == [0.3] and pinned["allocated"] == [1] and pinned["markers"] == []


@pytest.mark.parametrize("obj,match", [
    ({"traceEvents": {"ph": "C"}}, 'plot: prof.json: "traceEvents" is not a list'),
    ({"traceEvents": [{"ph": "C", "name": "memory", "pid": 1, "ts": "0", "args": {}}]},
     'plot: prof.json: a memory counter event has no numeric "ts"'),
    ({"traceEvents": []}, "plot: prof.json: no memory counters in this trace"),
])
def test_chrome_trace_errors_name_the_input(obj, match):
    """A malformed Chrome trace is one message naming the file and what is wrong with it."""
    with pytest.raises(InvalidArgument, match="^" + re.escape(match)):
        plot.from_chrome_trace(obj, source="prof.json")


def _snap(**devices):
    return {"format": "paddle_rt.memory_snapshot", "version": 1, "devices": devices}


@pytest.mark.parametrize("obj,match", [
    ({"format": "paddle_rt.memory_snapshot", "version": 1, "devices": []}, 'plot: s.json: "devices" is not an object'),
    (_snap(gpu0=[]), "plot: s.json: device 'gpu0' is not an object"),
    (_snap(gpu0={"segments": {"address": 16}}), 'plot: gpu0: "segments" is not a list'),
    (_snap(gpu0={"segments": [7]}), "plot: gpu0: segment 0 is not an object"),
    (_snap(gpu0={"segments": [{"address": "0x10", "total_size": 5}]}),
     "plot: gpu0: segment 0 address is not an integer ('0x10')"),
    (_snap(gpu0={"segments": [{"address": 16, "total_size": 5.0}]}),
     "plot: gpu0: segment 0 total_size is not an integer (5.0)"),
    (_snap(gpu0={"segments": [{"address": 16, "total_size": 5, "blocks": [{"address": 16, "size": 1}, 3]}]}),
     "plot: gpu0: segment 0 block 1 address is not an integer (None)"),
    (_snap(gpu0={"segments": [{"address": 16, "total_size": 5, "blocks": [{"address": 16, "size": True}]}]}),
     "plot: gpu0: segment 0 block 0 size is not an integer (True)"),
    (_snap(gpu0={"trace": {"action": "alloc"}}), 'plot: gpu0: "trace" is not a list'),
    (_snap(gpu0={"trace": [{"action": "alloc", "addr": 1, "size": 8}, {"addr": 2}]}),
     'plot: gpu0: trace entry 1 has no "action"'),
    (_snap(gpu0={"trace": [{"action": "alloc", "addr": 1, "size": True}]}),
     "plot: gpu0: trace entry 0 size is not an integer (True)"),
    (_snap(gpu0={"trace": [{"action": "segment_alloc", "addr": 1, "size": 2.5}]}),
     "plot: gpu0: trace entry 0 size is not an integer (2.5)"),
    (_snap(gpu0={"trace": [{"action": "free", "addr": 1, "size": "8"}]}),
     "plot: gpu0: trace entry 0 size is not an integer ('8')"),
    (_snap(gpu0={"trace": [{"action": "segment_free", "addr": 1, "size": "2"}]}),
     "plot: gpu0: trace entry 0 size is not an integer ('2')"),
])
def test_snapshot_errors_name_the_input_and_the_device(obj, match):
    """A malformed snapshot is one message naming the file, or the device and the entry, and what is wrong."""
    with pytest.raises(InvalidArgument, match="^" + re.escape(match) + "$"):
        plot.from_snapshot(obj, source="s.json")


def test_undecodable_and_broken_files_are_a_clear_error(tmp_path):
    """A binary file is "not a memory snapshot..." (its first line shown), not a decoding traceback; a file with
    gzip's magic bytes and broken data is named as broken gzip."""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xff\xfe\x80 binary,\x9c stuff\n\x00\x01")
    first = "\ufffd\ufffd\ufffd binary,\ufffd stuff"          # undecodable bytes shown as U+FFFD
    with pytest.raises(InvalidArgument, match=r"^plot: .*junk\.bin: " + re.escape(
            f"not a memory snapshot, a Chrome trace or an RMM allocation log (first line {first!r})") + "$"):
        plot.load_memory_data(str(junk))
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InvalidArgument, match=r"^plot: .*trace\.json\.gz: broken gzip data \("):
        plot.load_memory_data(str(gz))
    lst = write_json(tmp_path / "bare.json", make_chrome_trace()["traceEvents"])
    assert plot.load_memory_data(lst)["kind"] == "chrome_trace"


def test_load_recognises_json_after_blank_space_and_a_log_by_its_header(tmp_path, monkeypatch):
    """JSON is recognised after leading blank space; a file whose first line names RMM's Action, Pointer and Size
    columns (spaces around the names allowed, gzip-compressed or not) is replayed with --device, --conf and the
    progress bars given; a header without them is not a log."""
    snap = tmp_path / "s.json"
    snap.write_text("\n   " + json.dumps(make_snapshot()))
    assert plot.load_memory_data(str(snap), device="rt_cpu:0")["devices"][0]["device"] == "rt_cpu:0"
    calls = []
    monkeypatch.setattr(plot, "from_rmm_trace", lambda *a, **k: calls.append((a, k)) or "replayed")
    bars = object()
    header = "Thread , Time, Action ,Pointer, Size ,Stream\n"
    for gz in (False, True):
        log = write_text(tmp_path / f"log{gz}.csv", header + "1,0,allocate,0x1,8,0\n", gz)
        assert plot.load_memory_data(log, device="rt_cpu:1", conf="growth:exact", progress=bars) == "replayed"
        assert calls.pop() == ((log,), {"device": "rt_cpu:1", "conf": "growth:exact", "progress": bars})
    other = write_text(tmp_path / "other.csv", "Thread,Time,Action,Pointer,Stream\n1,0,allocate,0x1,0\n")
    with pytest.raises(InvalidArgument, match=r"not a memory snapshot, a Chrome trace or an RMM allocation log "
                                              r"\(first line 'Thread,Time,Action,Pointer,Stream'\)$"):
        plot.load_memory_data(other)
    assert calls == []


# -- the command ----------------------------------------------------------------------------------------------------

def test_plot_command_reports_what_it_wrote(tmp_path, capsys):
    """``paddle-rt plot`` says which image it wrote, from how many devices and what kind of input; ``--device``
    keeps that device only."""
    pytest.importorskip("matplotlib")
    from paddle_rt.__main__ import main
    snap = write_json(tmp_path / "s.json", make_snapshot())
    out = str(tmp_path / "o.png")
    assert main(["plot", snap, "-o", out]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (2 devices, from a snapshot)"
    assert main(["plot", snap, "-o", out, "--device", "rt_cpu:1"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (1 device, from a snapshot)"
    trace = write_json(tmp_path / "t.json", make_chrome_trace())
    assert main(["plot", trace, "-o", out, "--device", "rt_cpu:0"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (1 device, from a chrome trace)"


def test_plot_command_passes_its_options_on(tmp_path, monkeypatch, capsys):
    """The options reach the reading (input, --device, --conf, the progress mode: automatic by default, forced by
    --progress, off with --no-progress) and the drawing (--output, --title); errors are one line
    "paddle-rt plot: ..." with exit status 2, the output's folder checked before any work."""
    import errno
    from paddle_rt.__main__ import main
    from paddle_rt.tools import replay
    calls = []

    def load(path, device=None, conf=None, progress=None):
        calls.append(("load", path, device, conf, progress))
        return {"source": path, "kind": "rmm_trace", "devices": [{}, {}, {}]}

    def draw(data, path, title=None, dpi=110):
        calls.append(("draw", len(data["devices"]), path, title))
        return path

    monkeypatch.setattr(plot, "require_matplotlib", lambda: None)
    monkeypatch.setattr(plot, "load_memory_data", load)
    monkeypatch.setattr(plot, "plot_memory", draw)
    monkeypatch.setattr(replay, "progress_factory", lambda mode, stream=None: ("bars", mode))
    out = str(tmp_path / "o.png")
    assert main(["plot", "log.csv", "-o", out]) == 0
    assert calls == [("load", "log.csv", None, "", ("bars", None)), ("draw", 3, out, None)]
    assert capsys.readouterr().out.strip() == f"wrote {out} (3 devices, from a rmm trace)"
    for flag, mode in (("--progress", True), ("--no-progress", False)):
        calls.clear()
        assert main(["plot", "log.csv", "--output", out, "--device", "rt_cpu:1", "--conf", "growth:exact",
                     "--title", "my run", flag]) == 0
        assert calls == [("load", "log.csv", "rt_cpu:1", "growth:exact", ("bars", mode)), ("draw", 3, out, "my run")]
    capsys.readouterr()
    for argv in (["plot", "log.csv"], ["plot", "log.csv", "-o", out, "--progress", "--no-progress"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    capsys.readouterr()
    calls.clear()
    assert main(["plot", "log.csv", "-o", str(tmp_path / "no" / "o.png")]) == 2
    assert calls == [] and capsys.readouterr().err.startswith("paddle-rt plot: --output ")

    def failing(exc):
        def load(*a, **k):
            raise exc
        return load

    for exc, said in ((InvalidArgument("plot: log.csv: broken"), "log.csv: broken"),
                      (plot.MissingExtraError("plotting needs matplotlib"), "plotting needs matplotlib"),
                      (OSError(errno.ENOSPC, "No space left on device", "/full/o.png"),
                       "/full/o.png: No space left on device"),
                      (OSError(errno.EIO, "I/O error"), f"{out}: I/O error")):
        monkeypatch.setattr(plot, "load_memory_data", failing(exc))
        assert main(["plot", "log.csv", "-o", out]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"paddle-rt plot: {said}\n" and captured.out == ""


def test_plot_command_help_describes_every_option(capsys):
    """``paddle-rt plot --help``: what it draws, the extra it needs, the inputs it reads, and each option."""
    from paddle_rt.__main__ import main
    with pytest.raises(SystemExit) as exc:
        main(["plot", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("usage: paddle-rt plot", "Draw a memory timeline", 'Needs matplotlib: pip install "paddle_rt[plot]"',
                   "INPUT is recognised by its content", "RMM's CSV format",
                   "input memory snapshot JSON, Chrome trace JSON or RMM allocation log CSV (.gz too)",
                   "-o OUTPUT, --output OUTPUT image to write (.png, .svg, .pdf)",
                   "--device DEVICE only this device (snapshot, trace) / replay on it (log)",
                   "--conf CONF allocator config key:value,... for replaying a log",
                   "--title TITLE title above the figures",
                   "--progress progress bars while replaying a log, even when stderr is not a terminal (tqdm)",
                   "--no-progress no progress bars"):
        assert re.search(r"(?<![\w])" + re.escape(phrase) + r"(?![\w])", text), phrase
