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
from test_view_data import DEV, MB, _clean, _tr, two_pool_doc  # noqa: E402,F401 (_clean: the autouse fixture)


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
    # pools split the device's bytes (with expandable segments both pools may share one range: one pool, no split)
    pools = [k for k in run["series"] if k.startswith("allocated ") and k.endswith(" pool")]
    assert pools or paddle_rt.get_allocator(DEV).config()["expandable_active"]
    if pools:
        assert np.array_equal(sum(run["series"][k] for k in pools), run["series"]["allocated"])
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
    ev = view_data.events_from_history(doc)[DEV]
    run = view_data.build_run(ev)
    rs = paddle_rt.get_allocator(DEV).round_size
    first = list(ev.kind).index(view_data.ALLOC)      # (with expandable segments a segment_map may come first)
    assert run["series"]["allocated"][first] == others + rs(1 << 20) + rs(2 << 20)   # after the alloc: all counted
    assert run["series"]["allocated"][-1] == paddle_rt.memory_allocated(DEV)
    assert {early.ptr, late.ptr} <= {b["addr"] for b in run["blocks"]}
    assert sum(b["size"] for b in run["blocks"] if b["addr"] not in (early.ptr, late.ptr)) == others
    pools = [k for k in run["series"] if k.startswith("allocated ") and k.endswith(" pool")]
    if pools:                                         # the pools' levels start where the device's does
        assert sum(run["series"][k][0] for k in pools) == run["series"]["allocated"][0]
    del early, late


def test_log_replays_under_two_configurations_share_the_axis(tmp_path):
    log = small_log(tmp_path / "log.csv.gz")
    # chunk growth keys: with expandable segments off, where they apply
    runs = [view_data.load_source(log, conf)[0]
            for conf in ("expandable_segments:0", "expandable_segments:0,growth:fixed,chunk_size:4194304")]
    trace = replay.load_trace(log)
    confs = ({"expandable_segments": "0"}, {"expandable_segments": "0", "growth": "fixed", "chunk_size": "4194304"})
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
        ("t.json gpu:0", "gpu:0", "chrome_trace", "ms", 4)
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
                                                  baselines=True, device="rt_cpu:1", title="T", ahead=False,
                                                  delay_us=None))]
    assert capsys.readouterr().out.strip() == "wrote p.html (3 runs, 3.0 MiB)"
    assert view_mod.main(["a.csv", "-o", "q.html"]) == 0
    assert calls[-1] == (("a.csv",), dict(output="q.html", conf=None, baselines=False, device=None, title=None,
                                          ahead=False, delay_us=None))
    assert view_mod.main(["a.csv", "-o", "q.html", "--async", "--delay-us", "5"]) == 0
    assert calls[-1][1]["ahead"] is True and calls[-1][1]["delay_us"] == 5
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


def test_view_async_shows_waiting_and_ahead_side_by_side(tmp_path):
    """``paddle-rt view LOG --async`` (issue 45): the page has a table of both replays' figures, both APIs."""
    small_log(tmp_path / "log.csv.gz")
    res = run_cli(["view", "log.csv.gz", "--async", "--delay-us", "0", "-o", "p.html"], tmp_path)
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "p.html").read_text()
    table = page.split('<table class="peaks" id="ahead">', 1)[1].split("</table>", 1)[0]
    assert "<h2>Host waiting vs running ahead</h2>" in page and "device lag 0 us per operation" in page
    rows = table.split("<tr>")[2:]
    assert [r.split("<td>")[2].split("<")[0] for r in rows] == ["malloc", "pool"]
    import re
    for r in rows:
        cells = re.findall(r"<td class=n>([^<]*)</td>", r)
        assert len(cells) == 5 and re.fullmatch(r"\d+\.\d{3}", cells[2]), cells
        assert re.fullmatch(r"\d+ / \d+", cells[3]) and re.fullmatch(r"\d+ / \d+", cells[4]), cells


def test_view_delay_without_async_is_a_usage_error(tmp_path):
    res = run_cli(["view", "log.csv", "--delay-us", "5", "-o", "p.html"], tmp_path)
    assert res.returncode == 2 and "--delay-us goes with --async" in res.stderr
    res = run_cli(["view", "log.csv", "--async", "--delay-us", "x", "-o", "p.html"], tmp_path)
    assert res.returncode == 2 and "'x' is not an integer number of microseconds" in res.stderr
