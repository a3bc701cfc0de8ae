"""paddle_rt.profiler: sessions, Chrome trace export, key_averages, plugin profiler hooks, bad paths."""
import ctypes
import gc
import json
import threading
import uuid
import warnings

import pytest

import paddle_rt
from paddle_rt import profiler
from paddle_rt._core import trace
from paddle_rt._core import stream as _stream
from paddle_rt._core.errors import ProfilerError


@pytest.fixture(autouse=True)
def _clean():
    assert trace.mask() == 0
    yield
    assert trace.mask() == 0, "a profile left the recorder on"
    assert not trace.sink_installed(), "a profile left the plugin trace sink installed"
    gc.collect()
    for d in ("rt_cpu:0", "rt_cpu:1"):
        paddle_rt.empty_cache(d)


def rt_cpu_lib():
    from paddle_rt._core.plugin import bundled_plugin_path
    lib = ctypes.CDLL(bundled_plugin_path())
    lib.rt_cpu_profiler_count.restype = ctypes.c_size_t
    return lib


def workload(s, n_cb=7, n_copy=3, n_set=2):
    a = paddle_rt.malloc(1 << 16, s.device)
    b = paddle_rt.malloc(1 << 16, s.device)
    for _ in range(n_cb):
        s.add_callback(lambda: None)
    for _ in range(n_copy):
        paddle_rt.memcpy_async(b, a, stream=s)
    for _ in range(n_set):
        paddle_rt.memset_async(a, 1, stream=s)
    e = paddle_rt.Event()
    e.record(s)
    s.synchronize()
    a.free()
    b.free()


@pytest.mark.smoke
def test_key_averages_count_the_operations_done():
    with paddle_rt.Stream("rt_cpu:0") as s:
        with profiler.profile() as prof:
            workload(s)
    rows = prof.key_averages().by_kind()
    assert rows["callback"].count == 7
    assert rows["memcpy_d2d"].count == 3 and rows["memcpy_d2d"].bytes == 3 << 16
    assert rows["memset"].count == 2
    assert rows["event_record"].count == 1
    for r in rows.values():
        assert 0 <= r.min_us <= r.mean_us <= r.max_us
        assert r.queue_mean_us >= 0
        assert abs(r.total_us - r.mean_us * r.count) < 1e-6 * max(1.0, r.total_us)
    text = str(prof.key_averages())
    assert "callback" in text and "memcpy_d2d" in text and "13 operations" in text
    by_count = prof.key_averages().table(sort_by="count").splitlines()
    assert by_count[3].startswith("callback")
    assert len(prof.key_averages().table(row_limit=1).splitlines()) == 6


def test_key_averages_agree_with_the_events():
    """Every figure of a key_averages row is the events' own: durations and queue delays in microseconds, bytes."""
    with paddle_rt.Stream("rt_cpu:0") as s:
        with profiler.profile(plugin=False) as prof:
            workload(s)
    ops = [e for e in prof.events if e["kind"] == "op"]
    rows = prof.key_averages()
    assert sorted(r.kind for r in rows) == sorted({e["op"] for e in ops})
    assert [r.total_us for r in rows] == sorted((r.total_us for r in rows), reverse=True)
    for r in rows:
        mine = [e for e in ops if e["op"] == r.kind]
        durs = [(e["end_ns"] - e["start_ns"]) / 1000.0 for e in mine]
        queue = [(e["start_ns"] - e["enqueue_ns"]) / 1000.0 for e in mine]
        assert r.count == len(mine) and r.bytes == sum(e["bytes"] for e in mine)
        assert r.total_us == pytest.approx(sum(durs)) and r.mean_us == pytest.approx(sum(durs) / len(durs))
        assert (r.min_us, r.max_us) == (pytest.approx(min(durs)), pytest.approx(max(durs)))
        assert r.queue_mean_us == pytest.approx(sum(queue) / len(queue))
    table = rows.table(sort_by="bytes").splitlines()
    assert table[1].split() == ["operation", "count", "total", "us", "mean", "us", "min", "us", "max", "us", "queue",
                                "us", "bytes"]
    first = rows.by_kind()["memcpy_d2d"]
    assert table[3].split() == ["memcpy_d2d", "3", f"{first.total_us:.1f}", f"{first.mean_us:.2f}",
                                f"{first.min_us:.2f}", f"{first.max_us:.2f}", f"{first.queue_mean_us:.2f}",
                                str(3 << 16)]
    assert table[-1] == f"13 operations, {sum(r.total_us for r in rows):.1f} us of stream time"
    # the columns line up: names left-aligned, figures right-aligned, every line as wide as the rules
    assert table[0] == table[2] == table[-2] == "-" * len(table[1])
    for line, r in zip(table[3:-2], sorted(rows, key=lambda r: r.bytes, reverse=True)):
        assert len(line) == len(table[1]) and line.startswith(r.kind + " ") and line.endswith(" " + str(r.bytes))
    assert table[1].startswith("operation ") and table[1].endswith(" bytes")
    by_kind = rows.table(sort_by="kind").splitlines()[3:-2]      # names ascending; every other key descending
    assert [line.split()[0] for line in by_kind] == sorted(r.kind for r in rows)


def test_stream_names_and_chrome_trace_times(tmp_path):
    """stream_name names a stream by its device and tag (the current stream marked "(default)", tag 0 the default
    stream, a tag not of that device by its number), and the Chrome trace's times are microseconds since the start."""
    with paddle_rt.Stream("rt_cpu:0") as s:
        with profiler.profile(plugin=False) as prof:
            s.add_callback(lambda: None)
            s.synchronize()
            d = paddle_rt.current_stream("rt_cpu:0")
            d.add_callback(lambda: None)
            d.synchronize()
    mine, cur = [e for e in prof.events if e["kind"] == "op"]
    assert prof.stream_name("rt_cpu:0", mine["stream"]) == s.name
    assert prof.stream_name("rt_cpu:0", cur["stream"]) == f"{d.name} (default)"
    assert prof.stream_name("rt_cpu:1", mine["stream"]) == f"stream 0x{mine['stream']:x}"
    assert prof.stream_name("rt_cpu:0", 0) == "default stream"
    doc = json.loads(open(prof.export_chrome_trace(str(tmp_path / "t.json"))).read())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] for e in slices] == [pytest.approx((e["start_ns"] - prof.start_ns) / 1000.0) for e in (mine, cur)]
    assert [e["args"]["enqueue_us"] for e in slices] == [
        pytest.approx((e["enqueue_ns"] - prof.start_ns) / 1000.0) for e in (mine, cur)]


def test_events_have_allocations_and_operations():
    with paddle_rt.Stream("rt_cpu:0") as s:
        with profiler.profile() as prof:
            workload(s, n_cb=2, n_copy=1, n_set=0)
    evs = prof.events
    assert [e["time_ns"] for e in evs] == sorted(e["time_ns"] for e in evs)
    allocs = [e for e in evs if e["kind"] == "alloc"]
    frees = [e for e in evs if e["kind"] == "free"]
    assert len(allocs) == 2 and len(frees) == 2 and {e["size"] for e in allocs} == {1 << 16}
    opsl = [e for e in evs if e["kind"] == "op"]
    assert sorted(e["op"] for e in opsl) == ["callback", "callback", "event_record", "memcpy_d2d"]
    assert all(prof.start_ns <= e["enqueue_ns"] <= e["start_ns"] <= e["end_ns"] <= prof.stop_ns for e in opsl)
    assert all("session" not in e for e in evs)


def test_nothing_recorded_outside_the_profile():
    with paddle_rt.Stream("rt_cpu:0") as s:
        s.add_callback(lambda: None)
        paddle_rt.malloc(512).free()
        with profiler.profile() as prof:
            s.add_callback(lambda: None)
            s.synchronize()
        s.add_callback(lambda: None)
        paddle_rt.malloc(512).free()
        s.synchronize()
    assert [e["op"] for e in prof.events if e["kind"] == "op"] == ["callback"]
    assert not [e for e in prof.events if e["kind"] in ("alloc", "free")]
    assert trace.pending() == 0


def test_memory_and_streams_switches():
    with paddle_rt.Stream("rt_cpu:0") as s:
        with profiler.profile(memory=False, plugin=False) as p1:
            workload(s, 1, 1, 0)
        with profiler.profile(streams=False, plugin=False) as p2:
            workload(s, 1, 1, 0)
    assert {e["kind"] for e in p1.events} == {"op"}
    assert {e["kind"] for e in p2.events} <= {"alloc", "free", "segment_alloc", "segment_free"}
    assert any(e["kind"] == "alloc" for e in p2.events)


def test_chrome_trace_has_tracks_counters_and_plugin_records(tmp_path):
    lib = rt_cpu_lib()
    collects = lib.rt_cpu_profiler_count(1)
    with paddle_rt.Stream("rt_cpu:0") as s, paddle_rt.Stream("rt_cpu:1") as t:
        with profiler.profile() as prof:
            workload(s, 2, 1, 1)
            workload(t, 3, 0, 0)
            x = paddle_rt.malloc(1000, "rt_cpu:0")
            x.free()
        names = {s.name, t.name}
    assert lib.rt_cpu_profiler_count(1) == collects + 1
    path = tmp_path / "trace.json"
    assert prof.export_chrome_trace(str(path)) == str(path)
    doc = json.loads(path.read_text())
    evs = doc["traceEvents"]
    for e in evs:
        assert {"ph", "pid", "name"} <= e.keys()
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float))
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(procs.values()) >= {"rt_cpu:0", "rt_cpu:1"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names <= set(threads.values())
    slices = [e for e in evs if e["ph"] == "X" and e["cat"] == "stream"]
    assert len(slices) == (2 + 1 + 1 + 1) + (3 + 1)
    for e in slices:
        assert e["dur"] >= 0 and (e["pid"], e["tid"]) in threads
        assert {"position", "bytes", "enqueue_us", "queue_delay_us"} <= e["args"].keys()
    by_track = {}
    for e in slices:
        by_track.setdefault(threads[(e["pid"], e["tid"])], []).append(e)
    assert sorted(len(v) for k, v in by_track.items() if k in names) == [4, 5]
    for v in by_track.values():
        pos = [e["args"]["position"] for e in sorted(v, key=lambda e: e["ts"])]
        assert pos == sorted(pos)
    counters = [e for e in evs if e["ph"] == "C" and e["name"] == "memory"]
    assert counters and all(set(e["args"]) == {"allocated", "reserved"} for e in counters)
    assert {procs[e["pid"]] for e in counters} >= {"rt_cpu:0", "rt_cpu:1"}
    assert any(e["args"]["allocated"] >= 1 << 16 for e in counters)
    instants = [e for e in evs if e["ph"] == "i" and e["cat"] == "memory"]
    assert {"alloc", "free"} <= {e["name"] for e in instants}
    plugin = [e for e in evs if e.get("cat") == "plugin"]
    assert len(plugin) == 1 and plugin[0]["name"] == "rt_cpu::tracing" and plugin[0]["ph"] == "X"
    assert threads[(plugin[0]["pid"], plugin[0]["tid"])] == "plugin rt_cpu trace"
    assert plugin[0]["dur"] > 0
    pe = [e for e in prof.events if e["kind"] == "plugin"]
    assert len(pe) == 1 and pe[0]["device_type"] == "rt_cpu"
    assert prof.start_ns <= pe[0]["start_ns"] <= pe[0]["end_ns"] <= prof.stop_ns


def test_plugin_hooks_are_driven_once_per_session():
    lib = rt_cpu_lib()
    sessions, collects = lib.rt_cpu_profiler_count(0), lib.rt_cpu_profiler_count(1)
    with profiler.profile() as prof:
        assert trace.sink_installed()
    assert (lib.rt_cpu_profiler_count(0), lib.rt_cpu_profiler_count(1)) == (sessions + 1, collects + 1)
    with profiler.profile(plugin=False):
        assert not trace.sink_installed()
    assert (lib.rt_cpu_profiler_count(0), lib.rt_cpu_profiler_count(1)) == (sessions + 1, collects + 1)
    assert [e["name"] for e in prof.events if e["kind"] == "plugin"] == ["rt_cpu::tracing"]


@pytest.mark.parametrize("hook,name", [("initialize", "profiler_initialize"), ("start", "profiler_start_tracing"),
                                       ("collect", "profiler_collect_trace_data"),
                                       ("finalize", "profiler_finalize")])
def test_a_failing_plugin_hook_warns_and_profiling_continues(run_python, hook, name):
    code = """
        import warnings, paddle_rt
        from paddle_rt import profiler
        from paddle_rt._core import trace
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with paddle_rt.Stream() as s, profiler.profile() as prof:
                s.add_callback(lambda: None)
                s.synchronize()
        msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
        print(len(msgs)); print(msgs[0] if msgs else "")
        print(sum(1 for e in prof.events if e["kind"] == "op"))
        print(sum(1 for e in prof.events if e["kind"] == "plugin"))
        print(trace.mask(), trace.sink_installed())
    """
    r = run_python(code, env={"RT_CPU_FAIL_PROFILER": hook})
    assert r.returncode == 0, r.stderr
    n, msg, nops, nplugin, state = r.stdout.strip().splitlines()
    assert n == "1"
    assert "rt_cpu:0" in msg and name in msg and "continues" in msg
    assert nops == "1"
    # a failed collect (or a session that never started) gives no plugin record; a failed finalize comes after it
    assert nplugin == ("1" if hook == "finalize" else "0")
    assert state == "0 False"


def test_a_plugin_without_profiler_hooks_is_profiled(build_plugin):
    dtype = f"tp_prof_{uuid.uuid4().hex[:6]}"
    p = paddle_rt.load_plugin(build_plugin("minimal", {"DEVICE_TYPE": f'"{dtype}"'}))
    assert "profiler_collect_trace_data" in p.missing
    dev = paddle_rt.device(f"{dtype}:0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with paddle_rt.Stream(dev) as s, profiler.profile() as prof:
            a = paddle_rt.malloc(100, dev)
            s.add_callback(lambda: None)
            s.synchronize()
            a.free()
    devs = {e["device"] for e in prof.events if e["kind"] != "plugin"}
    assert f"{dtype}:0" in devs
    assert [e["op"] for e in prof.events if e["kind"] == "op" and e["device"] == f"{dtype}:0"] == ["callback"]
    assert {e.get("device_type") for e in prof.events if e["kind"] == "plugin"} <= {"rt_cpu"}
    assert any(e["kind"] == "alloc" and e["device"] == f"{dtype}:0" for e in prof.events)


def test_oom_appears_in_the_trace(tmp_path):
    with profiler.profile(plugin=False) as prof:
        with pytest.raises(paddle_rt.OutOfMemoryError):
            paddle_rt.malloc(1 << 50, "rt_cpu:0")
    oom = [e for e in prof.events if e["kind"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == 1 << 50
    doc = json.loads(open(prof.export_chrome_trace(str(tmp_path / "t.json"))).read())
    assert [e["s"] for e in doc["traceEvents"] if e.get("name") == "oom"] == ["p"]


# -- bad paths ---------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_nested_and_concurrent_profiles_are_errors():
    with profiler.profile(plugin=False) as outer:
        with pytest.raises(ProfilerError, match="already running"):
            with profiler.profile():
                pass
        errs = []

        def other():
            try:
                profiler.profile().start()
            except ProfilerError as exc:
                errs.append(exc)

        th = threading.Thread(target=other)
        th.start()
        th.join()
        assert len(errs) == 1
        assert outer.running
    assert not outer.running
    with profiler.profile(plugin=False):      # a new one can start afterwards
        pass


def test_results_before_stop_and_double_stop_are_errors(tmp_path):
    prof = profiler.profile(plugin=False)
    with pytest.raises(ProfilerError, match="never started"):
        prof.export_chrome_trace(str(tmp_path / "x.json"))
    with pytest.raises(ProfilerError, match="not running"):
        prof.stop()
    prof.start()
    try:
        with pytest.raises(ProfilerError, match="still running"):
            prof.export_chrome_trace(str(tmp_path / "x.json"))
        with pytest.raises(ProfilerError, match="still running"):
            prof.key_averages()
        with pytest.raises(ProfilerError, match="still running"):
            prof.events
        with pytest.raises(ProfilerError, match="already started"):
            prof.start()
    finally:
        prof.stop()
    with pytest.raises(ProfilerError, match="already stopped"):
        prof.stop()
    assert not (tmp_path / "x.json").exists()


def test_export_to_a_bad_path_raises_and_can_be_retried(tmp_path):
    with profiler.profile(plugin=False) as prof:
        paddle_rt.malloc(256).free()
    with pytest.raises(OSError):
        prof.export_chrome_trace(str(tmp_path / "no" / "such" / "dir" / "t.json"))
    with pytest.raises(OSError):
        prof.export_chrome_trace(str(tmp_path))            # a directory
    good = tmp_path / "t.json"
    prof.export_chrome_trace(str(good))
    assert json.loads(good.read_text())["traceEvents"]


def test_max_events_drops_the_oldest_with_a_warning():
    with pytest.warns(RuntimeWarning, match="dropped"):
        with profiler.profile(plugin=False, max_events=8) as prof:
            for _ in range(10):
                paddle_rt.malloc(256, "rt_cpu:0").free()
    assert len(prof.events) == 8 and prof.dropped >= 12
    for bad in (0, -1, "8", 2.0):
        with pytest.raises(paddle_rt.InvalidArgument, match="max_events"):
            profiler.profile(max_events=bad)


def test_bad_sort_key():
    with profiler.profile(plugin=False) as prof:
        pass
    with pytest.raises(paddle_rt.InvalidArgument, match="sort_by"):
        prof.key_averages().table(sort_by="bogus")
    assert "0 operations" in prof.key_averages().table()


def test_exception_in_the_block_stops_the_profile():
    with pytest.raises(KeyError):
        with profiler.profile() as prof:
            raise KeyError("x")
    assert not prof.running
    assert trace.mask() == 0 and not trace.sink_installed()
    prof.key_averages()


def test_fork_child_starts_with_nothing_recording(run_python):
    code = """
        import os, paddle_rt
        from paddle_rt import profiler, memory
        from paddle_rt._core import trace
        memory.record_history()
        prof = profiler.profile().start()
        paddle_rt.malloc(100).free()
        pid = os.fork()
        if pid == 0:
            ok = trace.mask() == 0 and not memory.is_recording_history() and not prof.running
            with profiler.profile() as p2:       # plugins belong to the parent: not driven here
                pass
            ok = ok and p2.events == [] and trace.mask() == 0 and not trace.sink_installed()
            os._exit(0 if ok else 1)
        _, st = os.waitpid(pid, 0)
        paddle_rt.malloc(200).free()
        prof.stop()
        memory.record_history(False)
        print(os.WEXITSTATUS(st), sorted(e["size"] for e in prof.events if e["kind"] == "alloc"))
    """
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(None, 1) == ["0", "[256, 256]\n"] or r.stdout.startswith("0 [")


def test_a_failed_start_leaves_nothing_behind(monkeypatch):
    lib = rt_cpu_lib()
    sessions = lib.rt_cpu_profiler_count(0)

    def broken(sub):
        raise MemoryError("injected")

    monkeypatch.setattr(profiler._trace, "subscribe", broken)
    prof = profiler.profile()
    with pytest.raises(MemoryError, match="injected"):
        prof.start()
    monkeypatch.undo()
    assert lib.rt_cpu_profiler_count(0) == sessions + 1      # the plugin session was opened, then finalised
    assert not trace.sink_installed() and trace.mask() == 0
    with profiler.profile(plugin=False):                      # nothing is left "running"
        pass


def test_chrome_trace_fields_follow_the_events(tmp_path):
    """Each recorded event is in the Chrome trace with its own figures: an operation as a slice whose duration is its
    run time in microseconds; an allocation or free as an instant with its address, size, stream and the device's
    levels, followed by a 'memory' counter at those levels; each device starts with a counter of the levels it had
    when the profile started; plugin records keep their fields; the document names its producer, bounds and unit."""
    dev = "rt_cpu:0"
    paddle_rt.empty_cache(dev)
    keep = paddle_rt.malloc(3000, dev)
    st = paddle_rt.memory_stats(dev)
    before = (st["allocated_bytes.all.current"], st["reserved_bytes.all.current"])
    with paddle_rt.Stream(dev) as s:
        with profiler.profile() as prof:
            workload(s, 2, 1, 1)
            paddle_rt.malloc(1000, dev).free()
    keep.free()
    doc = json.loads(open(prof.export_chrome_trace(str(tmp_path / "t.json"))).read())
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"] == {"producer": "paddle_rt.profiler", "start_ns": prof.start_ns, "stop_ns": prof.stop_ns,
                                "dropped_records": prof.dropped}
    evs = doc["traceEvents"]
    pid = {e["args"]["name"]: e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    first = [e for e in evs if e["ph"] == "C" and e["pid"] == pid[dev]][0]
    assert first == {"ph": "C", "name": "memory", "pid": pid[dev], "ts": 0.0,
                     "args": {"allocated": before[0], "reserved": before[1]}}
    us = lambda t: (t - prof.start_ns) / 1000.0  # noqa: E731
    ops = [e for e in prof.events if e["kind"] == "op"]
    slices = [e for e in evs if e["ph"] == "X" and e["cat"] == "stream"]
    assert [(e["name"], e["ts"], e["dur"]) for e in slices] == [
        (o["op"], pytest.approx(us(o["start_ns"])), pytest.approx((o["end_ns"] - o["start_ns"]) / 1000.0))
        for o in ops]
    assert all(e["pid"] == pid[dev] for e in slices)
    mem = [e for e in prof.events if e["kind"] in ("alloc", "free") and e.get("device") == dev]
    assert mem
    inst = [e for e in evs if e["ph"] == "i" and e["cat"] == "memory" and e["name"] in ("alloc", "free")]
    assert [(e["name"], e["args"]) for e in inst] == [
        (m["kind"], {"addr": hex(m["addr"]), "size": m["size"], "stream": m["stream"], "allocated": m["allocated"],
                     "reserved": m["reserved"]}) for m in mem]
    counters = [e for e in evs if e["ph"] == "C" and e["pid"] == pid[dev]][1:]
    assert [(c["name"], c["ts"], c["args"]) for c in counters][-len(mem):] == [
        ("memory", pytest.approx(us(m["time_ns"])), {"allocated": m["allocated"], "reserved": m["reserved"]})
        for m in mem]
    plugin = [e for e in prof.events if e["kind"] == "plugin"]
    assert plugin
    recs = [e for e in evs if e.get("cat") == "plugin"]
    assert [r["name"] for r in recs] == [p["name"] for p in plugin]
    for r, p in zip(recs, plugin):
        want = {k: p[k] for k in ("is_device", "stream_ops", "collect_start_ns", "address") if k in p}
        assert r["args"] == want and r["pid"] == pid[p.get("device") or "plugin"]
