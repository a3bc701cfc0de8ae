"""The memory viewer (paddle_rt/tools/view*.py): kinds detection, the data of each kind of input (the timeline, the
marked events, block lifetimes, the peak and its top sites), min/max downsampling keeping peaks, the page being
self-contained, the CLI as users run it; and, behind the ``browser`` marker, the page in a real headless Chromium:
no JavaScript error, the rendered number of blocks, a hover's text, the moment chosen, zooming."""
import gzip
import json
import os
import shutil
import sys
import time

import numpy as np
import pytest

import paddle_rt
from paddle_rt import memory, profiler
from paddle_rt._core import alloc_log
from paddle_rt.tools import anchor_models, replay, view_data
from paddle_rt.tools.view_data import ViewInputError, detect_kind
from paddle_rt.tools.view_levels import minmax_levels

from conftest import run_python_code
from test_cli import cli, run_cli

plotly = pytest.importorskip("plotly", reason="the view extra (plotly) is not installed: pip install '.[view]'")
from paddle_rt.tools import view_page  # noqa: E402

DEV = "rt_cpu:0"


@pytest.fixture(autouse=True)
def _clean():
    memory.record_history(False)
    memory.clear_history()
    yield
    memory.record_history(False)
    memory.clear_history()
    paddle_rt.empty_cache(DEV)


def _alloc_site(n):
    return paddle_rt.malloc(n, DEV)


def make_history():
    """A recorded history on rt_cpu:0: allocations from _alloc_site, a free, empty_cache, an out-of-memory."""
    paddle_rt.empty_cache(DEV)
    memory.record_history()
    keep = [_alloc_site(n) for n in (1000, 3 << 20, 200_000)]
    tmp = _alloc_site(5 << 20)
    tmp.free()
    paddle_rt.empty_cache(DEV)
    with pytest.raises(paddle_rt.OutOfMemoryError):
        paddle_rt.malloc(1 << 52, DEV)
    doc = memory.history()
    memory.record_history(False)
    return doc, keep


def write_log(path, events):
    """An RMM allocation log from (is_alloc, ptr, size, stream) tuples."""
    alloc_log.write(str(path), [(0, i, a, p, n, s) for i, (a, p, n, s) in enumerate(events)], "test")
    return str(path)


def small_log(path):
    ev, live, rng = [], {}, np.random.default_rng(5)
    for i in range(400):
        if live and rng.random() < 0.45:
            p = sorted(live)[int(rng.integers(len(live)))]
            ev.append((False, p, live.pop(p), i % 2))
        else:
            p = 0x1000 + i
            live[p] = int(rng.integers(1, 3 << 20))
            ev.append((True, p, live[p], i % 2))
    return write_log(path, ev)


# ---------------------------------------------------------------------------------------------------------------------
# kinds

def test_detect_kind_of_every_input(tmp_path):
    doc, keep = make_history()
    hist = tmp_path / "hist.json"
    hist.write_text(json.dumps(doc))
    assert detect_kind(str(hist))[0] == "history"
    snap = tmp_path / "snap.json.gz"
    memory.dump_snapshot(str(tmp_path / "plain.json"))        # no history recorded now: segments only
    snap.write_bytes(gzip.compress((tmp_path / "plain.json").read_bytes()))
    no_trace = json.loads((tmp_path / "plain.json").read_text())
    if any(d["trace"] for d in no_trace["devices"].values()):   # the last history is kept until the next start
        for d in no_trace["devices"].values():
            d["trace"] = []
        snap.write_bytes(gzip.compress(json.dumps(no_trace).encode()))
    assert detect_kind(str(snap))[0] == "snapshot"
    log = small_log(tmp_path / "log.csv.gz")
    assert detect_kind(log)[0] == "alloc_log"
    with profiler.profile(streams=False, plugin=False) as prof:
        paddle_rt.malloc(4096, DEV).free()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    assert detect_kind(str(tmp_path / "trace.json"))[0] == "chrome_trace"
    del keep


@pytest.mark.parametrize("content, says", [
    (b"", "not a memory snapshot"),
    (b"\x00\x01\x02binary", "not a memory snapshot"),
    (b'{"format": "something else"}', "neither a paddle_rt memory snapshot nor a Chrome trace"),
    (b"{broken json", "not valid JSON"),
    (b"a,b,c\n1,2,3\n", "not a memory snapshot"),
    (b"\x1f\x8b\x08garbage", "broken gzip data"),
])
def test_detect_kind_rejects_other_files(tmp_path, content, says):
    p = tmp_path / "bad"
    p.write_bytes(content)
    with pytest.raises(ViewInputError, match=says):
        detect_kind(str(p))


def test_bad_snapshot_entries_are_named(tmp_path):
    doc = {"format": "paddle_rt.memory_snapshot", "version": 1,
           "devices": {"d": {"segments": [], "trace": [{"action": "alloc", "addr": 1, "size": -5, "time_ns": 0}]}}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ViewInputError, match="trace entry 0 size"):
        view_data.load_source(str(p))
    doc["version"] = 7
    p.write_text(json.dumps(doc))
    with pytest.raises(ViewInputError, match="version 7"):
        view_data.load_source(str(p))


# ---------------------------------------------------------------------------------------------------------------------
# downsampling

def test_minmax_levels_keep_every_peak_and_dip():
    rng = np.random.default_rng(1)
    n = 300_001
    t = np.cumsum(rng.random(n))
    y = rng.integers(0, 1000, n).astype(np.float64)
    y[123_457] = 10_000          # a one-event peak
    y[222_222] = -50             # a one-event dip
    other = rng.integers(0, 50, n).astype(np.float64)
    levels = minmax_levels(t, {"allocated": y, "pools": other}, levels=(1000, 20_000))
    assert [lv["buckets"] for lv in levels] == [1000, 20_000]
    assert "pools" in levels[0] and "pools" not in levels[1]        # finer levels: the main series only
    for lv in levels:
        b = lv["buckets"]
        assert len(lv["t"]) == len(lv["allocated"]) == 2 * b
        assert lv["allocated"].max() == 10_000 and lv["allocated"].min() == -50
        starts = np.unique(np.linspace(0, n, b, endpoint=False).astype(np.int64))
        ends = np.append(starts[1:], n)
        k = int(rng.integers(b))                                    # any bucket: its exact extremes, at its start
        assert lv["allocated"][2 * k] == y[starts[k]:ends[k]].min()
        assert lv["allocated"][2 * k + 1] == y[starts[k]:ends[k]].max()
        assert lv["t"][2 * k] == t[starts[k]]
    short = minmax_levels(t[:1500], {"allocated": y[:1500]}, levels=(1000, 20_000))
    assert len(short) == 1 and short[0]["buckets"] == 0 and np.array_equal(short[0]["allocated"], y[:1500])


# ---------------------------------------------------------------------------------------------------------------------
# the data of each kind

def test_history_run_matches_the_allocator():
    paddle_rt.reset_peak_memory_stats(DEV)
    doc, keep = make_history()
    (run,) = [r for r in (view_data.build_run(ev) for ev in view_data.events_from_history(doc).values())
              if r["device"] == DEV]
    # the timeline ends where the allocator is
    assert run["series"]["allocated"][-1] == paddle_rt.memory_allocated(DEV)
    assert run["series"]["reserved"][-1] == paddle_rt.memory_reserved(DEV)
    assert run["peak"]["allocated"] == paddle_rt.max_memory_allocated(DEV)
    # pools split the device's bytes
    pools = [k for k in run["series"] if k.startswith("allocated ") and k.endswith(" pool")]
    assert pools and np.array_equal(sum(run["series"][k] for k in pools), run["series"]["allocated"])
    kinds = [m["kind"] for m in run["markers"]]
    assert "oom" in kinds and "empty_cache" in kinds and "growth" in kinds
    (oom,) = [m for m in run["markers"] if m["kind"] == "oom"]
    assert "make_history" in run["stacks"][oom["stack"]]
    # the blocks live at the end are the allocator's
    live = {run["blocks"][i]["addr"] for i in view_data.live_at(run["blocks"], run["t_range"][1])}
    before = {b["addr"] for b in run["blocks"] if b["t_alloc"] == run["t_range"][0] and b.get("before")}
    assert live - before == {a.ptr for a in keep}      # (before: what earlier tests of the session still hold)
    big = [b for b in run["blocks"] if b["addr"] == keep[1].ptr][0]
    assert big["req"] == 3 << 20 and big["size"] >= 3 << 20
    assert "_alloc_site" in run["stacks"][big["stack"]].split("\n")[0]
    # top sites at the peak: every byte live then, the site with the most first
    at_peak = [run["blocks"][i] for i in view_data.live_at(run["blocks"], run["peak"]["t"])]
    assert sum(s["bytes"] for s in run["sites"]) == sum(b["size"] for b in at_peak) == run["peak"]["allocated"]
    assert run["sites"] == sorted(run["sites"], key=lambda s: -s["bytes"])


def test_blocks_from_before_the_history_start_the_level():
    paddle_rt.empty_cache(DEV)
    others = paddle_rt.memory_allocated(DEV)         # what earlier tests of the session still hold on DEV
    early = paddle_rt.malloc(1 << 20, DEV)
    memory.record_history()
    late = _alloc_site(2 << 20)
    doc = memory.history()
    memory.record_history(False)
    run = view_data.build_run(view_data.events_from_history(doc)[DEV])
    rs = paddle_rt.get_allocator(DEV).round_size
    assert run["series"]["allocated"][0] == others + rs(1 << 20) + rs(2 << 20)   # after the first event: all counted
    assert run["series"]["allocated"][-1] == paddle_rt.memory_allocated(DEV)
    assert {early.ptr, late.ptr} <= {b["addr"] for b in run["blocks"]}
    assert sum(b["size"] for b in run["blocks"] if b["addr"] not in (early.ptr, late.ptr)) == others
    pools = [k for k in run["series"] if k.startswith("allocated ") and k.endswith(" pool")]
    if pools:                                         # the pools' levels start where the device's does
        assert sum(run["series"][k][0] for k in pools) == run["series"]["allocated"][0]
    del early, late


def test_log_replays_under_two_configurations_share_the_axis(tmp_path):
    log = small_log(tmp_path / "log.csv.gz")
    runs = [view_data.load_source(log, conf)[0] for conf in ("", "growth:fixed,chunk_size:4194304")]
    trace = replay.load_trace(log)
    confs = ({}, {"growth": "fixed", "chunk_size": "4194304"})
    # the reference replays in a fresh process too (this one's devices hold what earlier tests left)
    p = run_python_code(f"""
        import json
        from paddle_rt.tools import replay
        trace = replay.load_trace({str(log)!r})
        print(json.dumps([replay.run_once({str(log)!r}, None, c, trace, record=True)["peak_reserved"]
                          for c in {confs!r}]))
    """)
    assert p.returncode == 0, p.stderr
    refs = json.loads(p.stdout.strip().splitlines()[-1])
    for run, ref in zip(runs, refs):
        assert run["time_unit"] == "event" and run["t"][-1] <= len(trace[0]) - 1
        assert run["peak"]["reserved"] == ref
        # the live requested bytes of the log bound the allocated bytes from below at every event
        req = replay.live_requested(*trace[:3])
        assert (run["series"]["allocated"][-1] >= req[-1])
    assert runs[0]["peak"]["reserved"] != runs[1]["peak"]["reserved"]
    streams = [k for k in runs[0]["series"] if k.startswith("allocated stream")]
    assert len(streams) == 2
    assert np.array_equal(sum(runs[0]["series"][k] for k in streams), runs[0]["series"]["allocated"])


def test_baselines_are_the_models_of_replay(tmp_path):
    log = small_log(tmp_path / "log.csv.gz")
    runs = view_data.load_source(log, baselines=True)
    assert [r["baseline"] for r in runs] == [False, True, True]
    trace = replay.load_trace(log)
    assert runs[1]["peak"]["reserved"] == anchor_models.run_model(anchor_models.PaddleAutoGrowthModel(), trace)[
        "peak_reserved"]
    assert runs[2]["peak"]["reserved"] == anchor_models.run_model(anchor_models.TorchCachingModel(), trace)[
        "peak_reserved"]


def test_profiler_trace_gives_blocks(tmp_path):
    with profiler.profile(streams=False, plugin=False) as prof:
        a = paddle_rt.malloc(300_000, DEV)
        b = paddle_rt.malloc(5000, DEV)
        a.free()
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    (run,) = [r for r in view_data.load_source(path) if r["device"] == DEV]
    assert run["kind"] == "chrome_trace"
    assert {bl["addr"] for bl in run["blocks"]} == {a.ptr, b.ptr}
    assert run["series"]["allocated"][-1] == paddle_rt.get_allocator(DEV).round_size(5000)
    assert run["peak"]["allocated"] == sum(paddle_rt.get_allocator(DEV).round_size(n) for n in (300_000, 5000))
    del b


def test_counter_only_chrome_trace(tmp_path):
    doc = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "gpu:0"}}]
           + [{"ph": "C", "name": "memory", "pid": 1, "ts": i * 1000.0, "args": {"allocated": v, "reserved": 2 * v}}
              for i, v in enumerate([0, 10, 50, 20])]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    (run,) = view_data.load_source(str(p))
    assert run["peak"] == {"allocated": 50, "t": 2.0, "reserved": 100, "t_reserved": 2.0}
    assert run["segments"] == [] and "counters only" in run["note"]


def test_counter_only_chrome_trace_keeps_its_oom_and_empty_cache_marks(tmp_path):
    doc = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "gpu:0"}}]
           + [{"ph": "C", "name": "memory", "pid": 1, "ts": i * 1000.0, "args": {"allocated": v, "reserved": 2 * v}}
              for i, v in enumerate([0, 10, 50, 20])]
           + [{"ph": "i", "cat": "memory", "name": "oom", "pid": 1, "ts": 1500.0, "args": {"size": 4096, "stream": 7}},
              {"ph": "i", "cat": "memory", "name": "empty_cache", "pid": 1, "ts": 3000.0}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    (run,) = view_data.load_source(str(p))
    assert run["markers"] == [{"kind": "oom", "t": 1.5, "size": 4096, "stream": "7", "stack": -1, "req": -1},
                              {"kind": "empty_cache", "t": 3.0, "size": 0, "stream": "0", "stack": -1, "req": -1}]
    assert (run["label"], run["device"], run["kind"], run["time_unit"], run["events"]) == \
        (f"t.json gpu:0", "gpu:0", "chrome_trace", "ms", 4)
    assert run["t_range"] == (0.0, 3.0) and run["exact"] is True and run["baseline"] is False


def test_mapped_pages_of_expandable_segments():
    seg = {"addr": 0, "size": 8 << 20, "mapped_ranges": [[0, 2 << 20], [4 << 20, 2 << 20]]}
    assert view_page._unmapped_ranges(seg) == [[2 << 20, 2 << 20], [6 << 20, 2 << 20]]
    pages = {"addr": 0, "size": 4 << 20, "page_size": 1 << 20, "mapped_pages": [1, 0, 0, 1]}
    assert view_page._unmapped_ranges(pages) == [[1 << 20, 2 << 20]]
    assert view_page._unmapped_ranges({"addr": 0, "size": 10}) is None
    doc = {"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {"d": {"trace": [], "segments": [
        {"address": 4096, "total_size": 4 << 20, "segment_type": "large", "mapped_ranges": [[0, 1 << 20]],
         "blocks": [{"address": 4096, "size": 1 << 20, "state": "active_allocated"}]}]}}}
    run = view_data.build_run(view_data.events_from_history(doc)["d"])
    data = view_page._segment_data(run)
    assert data["segments"][0][5] == [[1 << 20, 3 << 20]]
    assert data["blocks"]["size"] == [1 << 20]


def test_page_is_self_contained(tmp_path):
    doc, keep = make_history()
    page = memory.view(doc, output=str(tmp_path / "p.html"))
    text = (tmp_path / "p.html").read_text()
    assert text == page.html
    low = text.lower()
    assert "<script src" not in low and "<link" not in low and "@import" not in low
    assert low.count("<script") >= 3 and "plotly.js" in low       # plotly.js written inline
    start = text.index('id="prt-data">') + len('id="prt-data">')
    data = json.loads(text[start:text.index("</script>", start)])
    (r,) = [r for r in data["runs"] if r["label"].endswith(DEV)]
    assert len(r["segmap"]["blocks"]["size"]) >= 4
    assert page._repr_html_().startswith("<iframe srcdoc=")
    del keep


def test_view_without_plotly_says_how_to_install(run_python):
    res = run_python("""
        import sys
        sys.modules["plotly"] = None
        from paddle_rt import memory
        try:
            memory.view({"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {}})
        except ImportError as exc:
            print("ERR", exc)
    """)
    assert "ERR the memory viewer needs plotly" in res.stdout and 'paddle_rt[view]' in res.stdout, res.stderr


# ---------------------------------------------------------------------------------------------------------------------
# the CLI as users run it

def test_cli_views_each_kind_from_a_folder_of_the_users(tmp_path):
    doc, keep = make_history()
    (tmp_path / "hist.json").write_text(json.dumps(doc))
    small_log(tmp_path / "log.csv.gz")
    res = run_cli(["view", "hist.json", "log.csv.gz", "--conf", "growth:fixed", "-o", "page.html"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("wrote page.html (") and (tmp_path / "page.html").stat().st_size > 1 << 20
    html_text = (tmp_path / "page.html").read_text()
    assert "log.csv.gz --conf growth:fixed" in html_text and "hist.json" in html_text
    del keep


@pytest.mark.parametrize("files, says", [
    (["missing.json"], "missing.json: no such file"),
    (["bad.json"], "bad.json: not valid JSON"),
    (["notes.txt"], "notes.txt: not a memory snapshot, a recorded history, an allocation log or a profiler trace"),
    (["broken.csv"], "broken.csv:3"),
    (["bad.json", "-o", "nodir/out.html"], "--output nodir/out.html: no such folder nodir"),
])
def test_cli_bad_files_one_line_status_2(tmp_path, files, says):
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "broken.csv").write_text("Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1,10,0\n"
                                         "0,1,free,0x2,10,0\n")
    _, prog = cli()
    res = run_cli(["view", "-o", "out.html", *files], tmp_path)      # a later -o wins
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog} view: ") and says in lines[0], res.stderr
    assert not (tmp_path / "out.html").exists()


def test_cli_usage(tmp_path):
    _, prog = cli()
    res = run_cli(["view", "--help"], tmp_path)
    assert res.returncode == 0 and " ".join(res.stdout.split()).startswith(f"usage: {prog} view ")
    for opt in ("--output", "--conf", "--baselines", "--device", "--title"):
        assert opt in res.stdout
    res = run_cli(["view", "x.json"], tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "--output" in res.stderr


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
# the page's content

def test_fmt_bytes_units():
    """Byte counts as the tables and hovers print them: binary units, one decimal, a sign for differences."""
    f = view_page.fmt_bytes
    assert [f(3 << 30), f(1536 << 20), f(5 * MB), f(1536), f(1024), f(1023), f(0), f(None)] == [
        "3.0 GiB", "1.5 GiB", "5.0 MiB", "1.5 KiB", "1.0 KiB", "1,023 B", "0 B", "-"]
    assert [f(-(2 << 30)), f(-3 * MB), f(-2048), f(-5)] == ["-2.0 GiB", "-3.0 MiB", "-2.0 KiB", "-5 B"]
    assert f(2048 << 30) == "2,048.0 GiB"


def _hist_run(label, trace, segments=(), **kw):
    return view_data.build_run(view_data.events_from_history(
        _snapdoc({"d": {"segments": list(segments), "trace": trace}}))["d"], label=label, **kw)


def no_growth_run(label="B"):
    """A run without growth marks: a 2 MiB segment from before the history, a 1 MiB one freed at 3 ms, an oom at
    2 ms and empty_cache at 4 ms (reserved: 3 MiB until 3 ms, then 2 MiB)."""
    trace = [_tr("alloc", 0x100000, 4096, 0, frames=FRAMES_A), _tr("oom", 0, 8 * MB, 2, requested=8 * MB - 1),
             _tr("segment_free", 0xF00000, MB, 3), _tr("empty_cache", 0, MB, 4)]
    return _hist_run(label, trace, [{"address": 0x100000, "total_size": 2 * MB, "segment_type": "small",
                                     "blocks": [{"address": 0x100000, "size": 4096, "state": "active_allocated"}]}])


def test_marker_hover_texts():
    """Hovering a mark: what happened, the run, the time (ms, or the log's event number), the size (released bytes
    for empty_cache, the request for an oom), the stream and the Python stack (escaped, at most 8 frames)."""
    stack = "\n".join(f"f{i}.py:{i} fn<{i}>" for i in range(10))
    run = {"label": "R", "time_unit": "ms", "stacks": ["x.py:1 a", stack]}
    oom = {"kind": "oom", "t": 1234.5, "size": 3 * MB, "req": 3 * MB - 5, "stream": "7", "stack": 1}
    want_stack = "<br>".join(f"f{i}.py:{i} fn&lt;{i}&gt;" for i in range(8))
    assert view_page._marker_text(run, oom).split("<br>") == [
        "<b>out of memory</b>", "R", "t = 1,234.500 ms", "size 3.0 MiB", "requested 3.0 MiB", "stream 7", "stack:",
        *want_stack.split("<br>")]
    grow = {"kind": "growth", "t": 2.0, "size": 2 * MB, "stream": "0", "stack": -1, "seg": 0}
    assert view_page._marker_text({**run, "time_unit": "event"}, grow).split("<br>") == [
        "<b>growth (new segment)</b>", "R", "t = event 2", "size 2.0 MiB", "stream 0", "no Python stack recorded"]
    empty = {"kind": "empty_cache", "t": 3.0, "size": 5 * MB, "req": 5, "stream": "1", "stack": 0}
    assert view_page._marker_text(run, empty).split("<br>") == [
        "<b>empty_cache</b>", "R", "t = 3.000 ms", "size 5.0 MiB released", "stream 1", "stack:", "x.py:1 a"]
    assert "requested" not in view_page._marker_text(run, {**oom, "req": -1})
    assert "requested" not in view_page._marker_text(run, {**oom, "req": None})
    # a run's label (a file name, a labels= entry) is text, as in the series' hover and the tables
    assert view_page._marker_text({**run, "label": "a<b>.csv"}, grow).split("<br>")[1] == "a&lt;b&gt;.csv"


def test_timeline_traces():
    """The timeline: per run its colour, allocated dotted and reserved solid (both shown), pools and streams dashed
    behind the legend; a trace per kind of mark at the reserved level of its moment, hovering its text."""
    _, go = view_page.require_plotly()
    from paddle_rt.tools.view_levels import minmax_levels
    runs = [two_pool_run(label="A"), no_growth_run("B")]
    levels = [minmax_levels(r["t"], r["series"]) for r in runs]
    fig = view_page._timeline(go, runs, levels)
    lines = [tr for tr in fig.data if tr.mode == "lines"]
    assert [tr.name for tr in lines] == [f"{r['label']}: {k}" for r in runs for k in r["series"]]
    for tr in lines:
        i, name = tr.meta["run"], tr.meta["series"]
        assert tr.line.color == view_page.RUN_COLORS[i] and tr.line.shape == "hv"
        assert tr.line.dash == {"reserved": "solid", "allocated": "dot"}.get(name, "dash")
        assert tr.line.width == (2 if name in ("allocated", "reserved") else 1)
        assert tr.visible is (True if name in ("allocated", "reserved") else "legendonly") or \
            tr.visible == (True if name in ("allocated", "reserved") else "legendonly")
        assert list(tr.x) == list(runs[i]["t"]) and list(tr.y) == list(runs[i]["series"][name])
        assert tr.hovertemplate.startswith(f"{runs[i]['label']}: {name}<br>")
    marks = {(tr.meta["run"], tr.meta["markers"]): tr for tr in fig.data if tr.mode == "markers"}
    assert sorted(marks) == [(0, "empty_cache"), (0, "growth"), (0, "oom"), (1, "empty_cache"), (1, "oom")]
    assert marks[(0, "growth")].name == "A: growth" and marks[(1, "empty_cache")].name == "B: empty cache"
    assert marks[(0, "growth")].visible == "legendonly" and marks[(1, "oom")].visible is True
    assert marks[(0, "growth")].marker.color == view_page.RUN_COLORS[0]
    assert marks[(1, "oom")].marker.symbol == "x" and marks[(1, "empty_cache")].marker.symbol == "triangle-down"
    assert list(marks[(1, "oom")].x) == [2.0] and list(marks[(1, "oom")].y) == [3 * MB]
    assert list(marks[(1, "empty_cache")].x) == [4.0] and list(marks[(1, "empty_cache")].y) == [2 * MB]
    assert list(marks[(0, "oom")].x) == [6.0] and list(marks[(0, "oom")].y) == [5 * MB]
    oom_text = marks[(1, "oom")].text[0]
    assert oom_text.startswith("<b>out of memory</b><br>B<br>t = 2.000 ms<br>size 8.0 MiB") and \
        "requested 8.0 MiB" in oom_text
    assert marks[(0, "growth")].text[0].startswith("<b>growth (new segment)</b><br>A<br>t = 0.000 ms<br>size 4.0 MiB")
    assert all(tr.hovertemplate == "%{text}<extra></extra>" for tr in marks.values())
    assert fig.layout.title.text == "Memory over time (click to choose the moment of the segment maps)"
    assert fig.layout.xaxis.title.text == "time (ms)" and fig.layout.yaxis.title.text == "bytes"
    log_run = {**no_growth_run("L"), "time_unit": "event"}
    fig = view_page._timeline(go, [log_run], [minmax_levels(log_run["t"], log_run["series"])])
    assert fig.layout.xaxis.title.text == "log event"
    assert [tr.text[0].split("<br>")[2] for tr in fig.data if tr.mode == "markers"] == ["t = event 4", "t = event 2"]


def test_peak_table_rows():
    """The peaks table: each run's peaks and when, and its difference from the first run (bytes and percent); a
    model run (no allocated bytes) shows '-' there."""
    import re
    runs = [{"label": "A<1>", "time_unit": "ms", "peak": {"allocated": 2 * MB, "t": 1.5, "reserved": 4 * MB,
                                                        "t_reserved": 2.25}},
            {"label": "B", "time_unit": "event", "peak": {"allocated": 3 * MB, "t": 12345.0, "reserved": 3 * MB,
                                                          "t_reserved": 7.0}},
            {"label": "C", "time_unit": "event", "peak": {"allocated": None, "t": 0.0, "reserved": 6 * MB,
                                                          "t_reserved": 3.0}}]
    text = view_page._peak_table(runs)
    assert text.startswith('<table class="peaks" id="peaks"><tr><th>run</th><th>peak allocated</th><th>at</th>'
                           '<th>peak reserved</th><th>at</th><th>reserved vs first run</th>'
                           '<th>allocated vs first run</th></tr>')
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in text.split("</tr>")[1:-1]]
    assert rows == [["A&lt;1&gt;", "2.0 MiB", "1.500 ms", "4.0 MiB", "2.250 ms", "0 B (+0.0%)", "0 B (+0.0%)"],
                    ["B", "3.0 MiB", "event 12,345", "3.0 MiB", "event 7", "-1.0 MiB (-25.0%)", "1.0 MiB (+50.0%)"],
                    ["C", "-", "-", "6.0 MiB", "event 3", "2.0 MiB (+50.0%)", "-"]]
    zero = [{"label": "Z", "time_unit": "ms", "peak": {"allocated": 0, "t": 0.0, "reserved": 0, "t_reserved": 0.0}},
            runs[0]]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in view_page._peak_table(zero).split("</tr>")[1:-1]]
    assert rows[1][5:] == ["4.0 MiB", "2.0 MiB"]                 # no percent of nothing


def test_sites_table_rows():
    """The top sites: bytes, requested bytes, blocks and the stack (innermost 4 frames, escaped, '...' when there
    are more) or the stream of blocks without one; the heading gives the peak's time and bytes."""
    import re
    run = two_pool_run()
    text = view_page._sites_table(run, 3)
    assert text.startswith("<h3>Top allocation sites at the peak (3.000 ms, 3.0 MiB allocated)</h3>"
                           '<table class="sites" id="sites-3">')
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in text.split("</tr>")[1:-1]]
    assert rows == [["2.0 MiB", "1.9 MiB", "1", "model.py:7 forward"],
                    ["1.0 MiB", "976.6 KiB", "2", "train.py:10 step<br>main.py:3 &lt;module&gt;"],
                    ["4.0 KiB", "3.9 KiB", "1", "<i>no Python stack recorded</i> (stream 1)"]]
    long = {"sites": [{"stack": 0, "stream": "0", "bytes": 10, "requested": 0, "blocks": 1}],
            "stacks": ["\n".join(f"f{i}" for i in range(5))], "peak": {"t": 4.0, "allocated": 10},
            "time_unit": "event"}
    text = view_page._sites_table(long, 0)
    assert "(event 4, 10 B allocated)" in text and "f0<br>f1<br>f2<br>f3 ...</td>" in text and "f4" not in text
    four = {**long, "stacks": ["f0\nf1\nf2\nf3"]}
    assert "f0<br>f1<br>f2<br>f3</td>" in view_page._sites_table(four, 0)         # all of it: no '...'
    assert view_page._sites_table({**long, "sites": []}, 0) == ""


def test_unmapped_ranges_from_any_offset():
    """Unmapped parts of an expandable segment, wherever its mapping starts; overlapping ranges merged."""
    u = view_page._unmapped_ranges
    assert u({"size": 4 * MB, "mapped_ranges": [[MB, MB]]}) == [[0, MB], [2 * MB, 2 * MB]]
    assert u({"size": 4 * MB, "mapped_ranges": [[2 * MB, MB], [0, MB], [MB // 2, MB]]}) == [[3 * MB // 2, MB // 2],
                                                                                             [3 * MB, MB]]
    assert u({"size": 4 * MB, "page_size": MB, "mapped_pages": [0, 1, 0, 0]}) == [[0, MB], [2 * MB, 2 * MB]]
    assert u({"size": 4 * MB, "page_size": MB, "mapped_pages": [1, 1, 1, 1]}) == []
    assert u({"size": 4 * MB, "mapped_size": 3 * MB}) == [[3 * MB, MB]]
    assert u({"size": 4 * MB, "mapped_pages": [1, 0]}) is None                # pages without a page size


def test_segment_map_data():
    """The segment map's data: segments (hex address, size, pool, lifetime, unmapped part) and blocks by segment
    and offset in it."""
    run = two_pool_run()
    d = view_page._segment_data(run)
    assert d["segments"] == [["0x10000", MB, "small", 0.0, None, None], ["0x200000", 4 * MB, "large", 0.0, None,
                                                                          [[3 * MB, MB]]]]
    order = [b["addr"] for b in run["blocks"]]
    blocks = {a: {k: v[i] for k, v in d["blocks"].items()} for i, a in enumerate(order)}
    assert blocks[0x300000] == {"seg": 1, "off": MB, "size": 2 * MB, "req": 2_000_000, "stream": "1", "ta": 2.0,
                                "tf": 4.0, "stack": 1}
    assert blocks[0x11000]["off"] == 4096 and blocks[0x11000]["tf"] is None and blocks[0x11000]["seg"] == 0
    assert d["stacks"] == run["stacks"] and d["moments"] is None
    outside = view_page._segment_data({**run, "blocks": [{**run["blocks"][0], "seg": None, "addr": 5}]})
    assert outside["blocks"]["seg"] == [-1] and outside["blocks"]["off"] == [0]


def _page_data(text):
    start = text.index('id="prt-data">') + len('id="prt-data">')
    return json.loads(text[start:text.index("</script>", start)])


def test_page_text_and_data(tmp_path):
    """The page: its title, each run's heading in its timeline colour, source, kind and event count, notes, a
    segment map only for runs with segments, the tables; labels escaped everywhere and the embedded data intact."""
    import base64
    hist = two_pool_run(label="hist <b>&</b>", source="a&b.json", kind="history")
    n = 9000
    cnt = view_data.counter_run("gpu:0", np.arange(n) * 0.5, np.arange(n) % 97, np.full(n, 200.0), [],
                                label="trace </script> gpu:0", source="t.json")
    page = view_page.build_page([hist, cnt], title="T <&>")
    text = page.html
    assert "<title>T &lt;&amp;&gt;</title>" in text and "<h1>T &lt;&amp;&gt;</h1>" in text
    assert (f'<h2 style="color:{view_page.RUN_COLORS[0]}">hist &lt;b&gt;&amp;&lt;/b&gt;</h2>'
            '<div class="sub">a&amp;b.json (history, 8 events)</div>') in text
    assert (f'<h2 style="color:{view_page.RUN_COLORS[1]}">trace &lt;/script&gt; gpu:0</h2>'
            '<div class="sub">t.json (chrome_trace, 9,000 events)</div>'
            '<div class="note">a Chrome trace with memory counters only: no segment map</div>') in text
    assert 'id="caption-0"' in text and 'id="segmap-0"' in text and 'id="segmap-1"' not in text
    assert 'id="sites-0"' in text and 'id="sites-1"' not in text
    assert "Long timelines are drawn as the minimum and maximum of each bucket" in text     # 9000 > 2 x 4096
    assert text.count("<script") - text.count("<\\/script") >= 3
    assert '{"displaylogo": false, "responsive": true}' in text             # no link out of the offline page
    data = _page_data(text)
    assert data["maxRows"] == view_page.MAX_SEGMENT_ROWS == 64 and data["start"] == hist["peak"]["t"] == 3.0
    assert [r["label"] for r in data["runs"]] == [hist["label"], cnt["label"]]
    assert [r["time_unit"] for r in data["runs"]] == ["ms", "ms"]
    assert data["runs"][1]["segmap"] is None and data["runs"][0]["segmap"]["segments"][0][0] == "0x10000"
    lv = data["runs"][0]["levels"]
    assert len(lv) == 1 and lv[0]["buckets"] == 0 and sorted(lv[0]["series"]) == sorted(hist["series"])
    assert np.frombuffer(base64.b64decode(lv[0]["t"]), "<f8").tolist() == list(hist["t"])
    assert np.frombuffer(base64.b64decode(lv[0]["series"]["allocated"]), "<f8").tolist() == \
        hist["series"]["allocated"].tolist()
    lv = data["runs"][1]["levels"]
    assert len(base64.b64decode(lv[1]["series"]["allocated"])) == 4 * n          # the finer level: float32
    assert [x["buckets"] for x in lv] == [4096, 0] and np.frombuffer(base64.b64decode(lv[0]["series"]["reserved"]),
                                                                  "<f8").max() == 200.0
    default = view_page.build_page([hist])
    assert "<title>paddle_rt memory view: hist &lt;b&gt;&amp;&lt;/b&gt;</title>" in default.html
    assert "Long timelines" not in default.html
    with pytest.raises(ValueError, match="no runs"):
        view_page.build_page([])
    out = tmp_path / "p.html"
    assert page.save(out) == str(out) and out.read_text(encoding="utf-8") == text
    assert [p.name for p in tmp_path.iterdir()] == ["p.html"]                 # no temporary file left
    assert repr(page) == f"<paddle_rt memory view: 2 run(s), {len(text) / MB:.1f} MiB of HTML>"
    frame = page._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and "&lt;title&gt;T &amp;lt;&amp;amp;&amp;gt;&lt;/title&gt;" in frame
    assert 'sandbox="allow-scripts"' in frame


def test_segment_map_figure_layout():
    """The segment map's frame: offsets as fractions of the segment on x, one row per segment, lowest address on
    top, holes and unmapped pages drawn over the segment's row, the legend (blocks, holes, unmapped) above it."""
    _, go = view_page.require_plotly()
    lay = view_page._segmap_figure(go, 0).layout
    assert tuple(lay.xaxis.range) == (0, 1) and lay.yaxis.type == "category" and lay.yaxis.autorange == "reversed"
    assert lay.barmode == "overlay"
    assert lay.legend.orientation == "h" and lay.legend.yanchor == "bottom" and lay.legend.y == 1.0


# ---------------------------------------------------------------------------------------------------------------------
# view() and the CLI in this process

def test_view_of_history_dicts():
    """``memory.view(dict)``: the runs of the chosen device only, labelled by ``labels``, their source shown as in
    memory; a snapshot without events is a snapshot."""
    from paddle_rt.tools.view import view
    doc = two_pool_doc()
    doc["devices"]["e"] = {"segments": [], "trace": [_tr("alloc", 4096, 10, 0.5)]}
    page = view(doc, device="d", labels=["mine"])
    assert [(r["label"], r["device"], r["source"], r["kind"]) for r in page.runs] == [
        ("mine d", "d", "(in memory)", "history")]
    assert '<div class="sub">(in memory) (history, 8 events)</div>' in page.html
    assert [r["device"] for r in view(doc).runs] == ["d", "e"]
    assert [r["label"] for r in view(doc, doc, labels=["x"]).runs] == ["x d", "x e", "history d", "history e"]
    snap = two_pool_doc()
    snap["devices"]["d"]["trace"] = []
    assert [(r["label"], r["kind"]) for r in view(snap).runs] == [("history d", "snapshot")]
    with pytest.raises(ValueError, match="no runs"):
        view(doc, device="nope")
    with pytest.raises(ValueError, match="give at least one source"):
        view()


def test_conf_list_of_view():
    from paddle_rt.tools.view import _conf_list
    assert _conf_list(None) == [""] and _conf_list([]) == [""]
    assert _conf_list("growth:fixed") == ["growth:fixed"]
    assert _conf_list({"growth": "fixed", "chunk_size": 4096}) == ["growth:fixed,chunk_size:4096"]
    assert _conf_list(["a:1", {"b": 2}, None, ""]) == ["a:1", "b:2", "", ""]


def test_cli_main_in_process(tmp_path, monkeypatch, capsys):
    """``paddle-rt view``: the line saying what was written, the title, --device; one line and status 2 for a bad
    input or output, nothing written."""
    from paddle_rt.tools.view import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text(json.dumps(two_pool_doc()))
    assert main(["s.json", "-o", "one.html", "--title", "My <run>"]) == 0
    out = capsys.readouterr().out
    size = (tmp_path / "one.html").stat().st_size
    text = (tmp_path / "one.html").read_text(encoding="utf-8")
    assert out.strip() == f"wrote one.html (1 run, {len(text) / MB:.1f} MiB)" and size > 0
    assert "<title>My &lt;run&gt;</title>" in text
    assert main(["s.json", "s.json", "-o", "two.html"]) == 0
    assert capsys.readouterr().out.startswith("wrote two.html (2 runs, ")
    assert "<title>paddle_rt memory view: s.json d, s.json d</title>" in (tmp_path / "two.html").read_text()
    assert main(["s.json", "--device", "x", "-o", "dev.html"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["paddle-rt view: s.json: no data for device x"] and not (tmp_path / "dev.html").exists()
    assert main(["missing.json", "-o", "m.html"]) == 2
    assert capsys.readouterr().err.strip() == "paddle-rt view: missing.json: no such file"
    assert main(["s.json", "-o", "nodir/x.html"]) == 2
    assert "--output nodir/x.html: no such folder nodir" in capsys.readouterr().err
    assert not (tmp_path / "m.html").exists() and not (tmp_path / "nodir").exists()


def test_cli_passes_its_options_to_view(tmp_path, monkeypatch, capsys):
    """``paddle-rt view``'s options reach ``view()`` as given: every --conf (repeatable), --baselines as a flag (it
    takes no value), --device, --title; the help says what the command does and names every option."""
    import paddle_rt.tools.view as view_mod
    calls = []

    class FakePage:
        runs = [1, 2, 3]
        html = "x" * (3 << 20)

    def fake_view(*files, **kw):
        calls.append((files, kw))
        return FakePage()
    monkeypatch.setattr(view_mod, "view", fake_view)
    monkeypatch.chdir(tmp_path)
    assert view_mod.main(["a.csv", "b.json", "-o", "p.html", "--conf", "growth:fixed", "--conf", "small_size:0",
                          "--baselines", "--device", "rt_cpu:1", "--title", "T"]) == 0
    assert calls == [(("a.csv", "b.json"), dict(output="p.html", conf=["growth:fixed", "small_size:0"],
                                                  baselines=True, device="rt_cpu:1", title="T"))]
    assert capsys.readouterr().out.strip() == "wrote p.html (3 runs, 3.0 MiB)"
    assert view_mod.main(["a.csv", "-o", "q.html"]) == 0
    assert calls[-1] == (("a.csv",), dict(output="q.html", conf=None, baselines=False, device=None, title=None))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        view_mod.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    first = " ".join(view_mod.__doc__.split("\n\n")[0].replace("``", "").split())
    assert first in text and "``" not in text
    for opt in ("--output", "--conf K:V,...", "--baselines", "--device", "--title"):
        assert opt in text, opt


def test_log_replay_in_child_and_baselines(tmp_path, monkeypatch):
    """An allocation log is replayed in a child that imports this paddle_rt and still sees the caller's PYTHONPATH;
    its runs count events, and the baselines are reserved-bytes-only model runs on the same event axis."""
    import subprocess
    log = write_log(tmp_path / "log.csv", [(True, 0x1000, 3 * MB, 0), (True, 0x2000, MB, 1),
                                           (False, 0x1000, 3 * MB, 0), (True, 0x3000, 512, 0)])
    seen = []
    real_run = subprocess.run

    def spy(cmd, **kw):
        seen.append((cmd, kw))
        return real_run(cmd, **kw)
    monkeypatch.setattr(subprocess, "run", spy)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    runs = view_data.load_source(log, "growth:fixed", baselines=True, label="L")
    ((cmd, kw),) = seen
    parent = os.path.dirname(os.path.dirname(paddle_rt.__file__))
    assert kw["env"]["PYTHONPATH"].split(os.pathsep) == [parent, str(tmp_path / "elsewhere")]
    assert kw["cwd"] == parent and cmd[1:3] == ["-m", "paddle_rt.tools.view_replay"]
    assert [r["label"] for r in runs] == ["L --conf growth:fixed", "L Paddle auto-growth", "L PyTorch caching"]
    rep = runs[0]
    assert (rep["kind"], rep["time_unit"], rep["source"]) == ("alloc_log", "event", log)
    assert rep["config"]["growth"] == "fixed"
    assert [(b["req"], b["stream"], b["t_alloc"], b["t_free"]) for b in rep["blocks"]] == [
        (3 * MB, "0", 0.0, 2.0), (MB, "1", 1.0, float("inf")), (512, "0", 3.0, float("inf"))]
    assert all(b["size"] >= b["req"] for b in rep["blocks"]) and set(np.asarray(rep["t"]).tolist()) == {0, 1, 2, 3}
    assert rep["peak"]["t"] == 1.0 and rep["peak"]["allocated"] >= 4 * MB
    for r in runs[1:]:
        assert (r["kind"], r["device"], r["time_unit"], r["baseline"], r["source"]) == (
            "baseline", "model", "event", True, log)
        assert np.asarray(r["t"]).tolist() == [0.0, 1.0, 2.0, 3.0] and list(r["series"]) == ["reserved"]
        assert r["peak"]["allocated"] is None and r["peak"]["reserved"] == max(r["series"]["reserved"])
        assert r["peak"]["t_reserved"] == float(np.argmax(r["series"]["reserved"]))
        assert r["note"].startswith("a model on an unbounded device: reserved bytes only (")
    monkeypatch.delenv("PYTHONPATH")
    seen.clear()
    view_data.replay_in_child(log)
    assert seen[0][1]["env"]["PYTHONPATH"] == parent


def test_broken_log_names_its_line(tmp_path, monkeypatch):
    """A log the replay rejects gives the child's one-line message, with the path as the user wrote it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.csv").write_text("Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1,10,0\n"
                                         "0,1,free,0x2,10,0\n")
    with pytest.raises(ViewInputError) as exc:
        view_data.load_source("broken.csv")
    assert str(exc.value).startswith("broken.csv:3: ") and str(tmp_path) not in str(exc.value)


def test_view_of_a_log_under_each_conf_with_baselines_once(tmp_path):
    """``view(log, conf=[...], baselines=True)``: one replay per configuration (strings or dicts), the baselines
    once, after the first configuration's run."""
    from paddle_rt.tools.view import view
    log = write_log(tmp_path / "log.csv", [(True, 0x1000, 3 * MB, 0), (True, 0x2000, MB, 0),
                                           (False, 0x1000, 3 * MB, 0)])
    page = view(log, conf=["growth:fixed", {"growth": "exact"}], baselines=True, labels=["L"])
    assert [r["label"] for r in page.runs] == ["L --conf growth:fixed", "L Paddle auto-growth", "L PyTorch caching",
                                              "L --conf growth:exact"]
    assert [r["config"]["growth"] for r in page.runs if not r["baseline"]] == ["fixed", "exact"]
    assert [r["label"] for r in view(log).runs] == ["log.csv"]


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


def test_missing_plotly_says_how_to_install_in_process(tmp_path, monkeypatch, capsys):
    """Without plotly: MissingExtraError naming the ``view`` extra; the CLI prints it on one line, status 2."""
    from paddle_rt.tools.figures import MissingExtraError
    from paddle_rt.tools.view import main
    monkeypatch.setitem(sys.modules, "plotly", None)
    with pytest.raises(MissingExtraError, match=r'the memory viewer needs plotly, which is not installed: '
                                                r'pip install "paddle_rt\[view\]"'):
        view_page.require_plotly()
    (tmp_path / "s.json").write_text(json.dumps(two_pool_doc()))
    assert main([str(tmp_path / "s.json"), "-o", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("paddle-rt view: the memory viewer needs plotly")
    assert not (tmp_path / "p.html").exists()


def test_expandable_segments_keep_their_mapping_at_the_end():
    """The mapping an expandable segment reports at the snapshot's end (pages with their size, ranges, mapped size)
    is kept for the segment live at the end, and gives its unmapped part on the map."""
    segments = [{"address": 0x100000, "total_size": 4 * MB, "page_size": MB, "mapped_pages": [1, 0, 1, 0],
                 "blocks": []},
                {"address": 0x800000, "total_size": 2 * MB, "mapped_ranges": [[0, MB]], "blocks": []}]
    trace = [_tr("segment_alloc", 0x800000, 2 * MB, 0), _tr("segment_free", 0x800000, 2 * MB, 1),
             _tr("segment_alloc", 0x800000, 2 * MB, 2)]
    run = _hist_run("x", trace, segments)
    s0, old, new = run["segments"]
    assert (s0["page_size"], s0["mapped_pages"]) == (MB, [1, 0, 1, 0]) and s0.get("before") is True
    assert "mapped_ranges" not in old and old["t_free"] == 1.0 and new["mapped_ranges"] == [[0, MB]]
    assert [s[5] for s in view_page._segment_data(run)["segments"]] == [[[MB, MB], [3 * MB, MB]], None, [[MB, MB]]]


# ---------------------------------------------------------------------------------------------------------------------
# in a real browser

def chromium_driver():
    """A headless Chromium driven by selenium (Debian's chromium + chromium-driver). Skips the test when they are not
    installed, unless PADDLE_RT_REQUIRE_BROWSER=1 (CI's browser run) makes that a failure."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if not (chromium and driver and webdriver):
        msg = ("the browser tests need selenium (pip install '.[view]') and Debian's chromium + chromium-driver "
               "(apt-get install -y chromium chromium-driver)")
        if os.environ.get("PADDLE_RT_REQUIRE_BROWSER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    opts = Options()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1400"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.fixture(scope="module")
def browser():
    d = chromium_driver()
    yield d
    d.quit()


def open_page(d, path):
    d.get("file://" + os.path.abspath(path))
    for _ in range(1200):
        if d.execute_script("return document.body && document.body.dataset.ready") == "1":
            break
        time.sleep(0.05)
    assert d.execute_script("return document.body.dataset.ready") == "1", "the page's script did not finish"
    return [e for e in d.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]


def segmap_counts(d, i=0):
    """(blocks, holes) drawn in segment map ``i``: bars rendered in its SVG."""
    return tuple(d.execute_script(
        "const g=document.querySelectorAll('#segmap-'+arguments[0]+' g.barlayer g.trace');"
        "return [g[0]?g[0].querySelectorAll('g.point path').length:0, g[1]?g[1].querySelectorAll('g.point path')"
        ".length:0];", i))


@pytest.mark.browser
def test_browser_history_page(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    paddle_rt.reset_peak_memory_stats(DEV)
    doc, keep = make_history()
    doc = {**doc, "devices": {DEV: doc["devices"][DEV]}}
    page = memory.view(doc, output=str(tmp_path / "h.html"))
    (run,) = page.runs
    errors = open_page(browser, tmp_path / "h.html")
    assert errors == []
    # at the peak (the page's first moment): the blocks live then, drawn
    expected = len(view_data.live_at(run["blocks"], run["peak"]["t"]))
    assert expected >= 3
    blocks, holes = segmap_counts(browser)
    assert blocks == expected and holes >= 1
    assert browser.execute_script("return +document.getElementById('segmap-0').dataset.blocks") == expected
    assert f"{expected} blocks" in browser.find_element(By.ID, "caption-0").text
    # hover the largest block the history allocated: its size, requested bytes, stream and the Python stack that
    # allocated it (blocks earlier tests left live are drawn too, without a stack: the bars are tried largest first)
    bars = browser.find_elements(By.CSS_SELECTOR, "#segmap-0 g.barlayer g.trace:first-child g.point path")
    hover = ""
    for target in sorted(bars, key=lambda b: -b.size["width"]):
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", target)
        hover = ""
        for step in range(20):     # the mouse moves over the bar (Plotly draws the label on a later frame)
            ActionChains(browser).move_to_element_with_offset(target, step % 5, 0).perform()
            time.sleep(0.1)
            hover = " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, "#segmap-0 g.hovertext"))
            if hover:
                break
        if "test_view.py" in hover:
            break
    assert "block 5.0 MiB" in hover or "block 3.0 MiB" in hover, hover
    assert "requested" in hover and "stream 0" in hover and "_alloc_site" in hover and "test_view.py" in hover
    # another moment: the end (the 5 MiB block freed)
    t_end = run["t_range"][1]
    browser.execute_script("window.prtShowMoment(arguments[0])", t_end)
    before = sum(1 for b in run["blocks"] if b.get("before"))      # live before the history (earlier tests')
    assert segmap_counts(browser)[0] == len(view_data.live_at(run["blocks"], t_end)) == len(keep) + before
    assert browser.get_log("browser") == []


@pytest.mark.browser
def test_browser_two_runs_side_by_side(browser, tmp_path):
    log = small_log(tmp_path / "log.csv.gz")
    page = view_page.build_page(view_data.load_source(log, "") + view_data.load_source(log, "growth:fixed",
                                                                                      baselines=True))
    page.save(tmp_path / "c.html")
    assert open_page(browser, tmp_path / "c.html") == []
    rows = browser.execute_script("return document.querySelectorAll('#peaks tr').length")
    assert rows == 1 + 4
    diff = page.runs[1]["peak"]["reserved"] - page.runs[0]["peak"]["reserved"]
    text = browser.execute_script("return document.querySelectorAll('#peaks tr')[2].textContent")
    assert view_page.fmt_bytes(diff) in text
    t = page.runs[0]["peak"]["t"]
    for i in (0, 1):
        assert segmap_counts(browser, i)[0] == len(view_data.live_at(page.runs[i]["blocks"], t))
    assert browser.execute_script("return document.getElementById('segmap-2')") is None   # a model: no map


@pytest.mark.browser
def test_browser_zoom_swaps_in_a_finer_level(browser, tmp_path):
    n = 200_000
    trace = [{"action": "alloc" if i % 2 == 0 else "free", "addr": 4096 * (1 + (i // 2) % 64),
              "size": 512 * (1 + (i * 7919) % 1000), "time_ns": i * 1000, "stream": 0, "frames": []}
             for i in range(n)]
    for i in range(1, n, 2):
        trace[i]["size"] = trace[i - 1]["size"]
    trace[150_000]["size"] = trace[150_001]["size"] = 900 << 20          # one short peak
    doc = {"format": "paddle_rt.memory_snapshot", "version": 1, "devices": {"d": {"segments": [], "trace": trace}}}
    page = memory.view(doc, output=str(tmp_path / "z.html"))
    assert open_page(browser, tmp_path / "z.html") == []
    get = ("const tr=document.getElementById('timeline')._fullData.find(t=>t.meta&&t.meta.series==='allocated');"
           "const y=Array.from(tr.y); return [y.length, Math.max(...y), tr.x[0], tr.x[tr.x.length-1]];")
    n0, peak0, _, _ = browser.execute_script(get)
    assert peak0 == 900 << 20 and n0 == 2 * 4096
    t_peak = page.runs[0]["peak"]["t"]
    browser.execute_script("Plotly.relayout('timeline', {'xaxis.range': [arguments[0]-2, arguments[0]+2]})", t_peak)
    n1, peak1, x0, x1 = browser.execute_script(get)
    assert peak1 == 900 << 20 and x0 <= t_peak - 2 and x1 >= t_peak + 2 and n1 < n0
    # finer: the second level's buckets of about 3 events (the first level's hold about 49)
    span = page.runs[0]["t_range"][1] - page.runs[0]["t_range"][0]
    assert (x1 - x0) / n1 < 0.1 * span / n0
