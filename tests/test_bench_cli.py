"""paddle_rt/tools/bench.py and paddle_rt/bench: the ``bench`` command's discovery of areas, its table and
JSON, error isolation between areas, and the bench/*.py wrappers over the same code. Speed is not asserted here."""
import json
import os
import platform
import re
import subprocess
import sys
import types

import pytest

import paddle_rt
from paddle_rt import bench as benchmarks
from paddle_rt.tools import bench

from test_replay import _Tty

SRC = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))   # the paddle_rt under test
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))            # the checkout (bench/ lives there)
KEYS = {"area", "name", "value", "unit", "target", "met", "note", "low", "high", "verdict"}


def run(args, timeout=300):
    env = dict(os.environ, PYTHONPATH=SRC)
    # cwd: the folder of the paddle_rt under test (from the checkout's top, `python -m` would find its sources first);
    # the bench/*.py scripts are named by absolute path
    args = [os.path.join(ROOT, a) if a.startswith("bench" + os.sep) else a for a in args]
    return subprocess.run([sys.executable] + args, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=SRC)


def check_result(r, area):
    assert set(r) == KEYS, r
    assert r["area"] == area
    assert isinstance(r["name"], str) and r["name"].strip()
    assert isinstance(r["value"], float) and r["value"] == r["value"]          # a number, not NaN
    assert isinstance(r["unit"], str) and isinstance(r["note"], str)
    assert (r["target"] is None) == (r["met"] is None)
    assert (r["low"] is None) == (r["high"] is None)
    if r["low"] is not None:
        assert r["low"] <= r["value"] <= r["high"]
    if r["target"] is not None:
        assert isinstance(r["target"], str) and r["target"][:2] in ("<=", ">=")
        assert isinstance(r["met"], bool)
        # a miss is a spread wholly beyond the target; "noise" a median beyond it with a repetition within it
        op, bound = r["target"].split()[0], float(r["target"].split()[1].rstrip("x%").split()[0])
        meets = (lambda v: v <= bound) if op == "<=" else (lambda v: v >= bound)
        best = r["value"] if r["low"] is None else (r["low"] if op == "<=" else r["high"])
        assert r["verdict"] == ("met" if meets(r["value"]) else "noise" if meets(best) else "MISSED")
        assert r["met"] == (r["verdict"] != "MISSED")
    else:
        assert r["verdict"] is None


def test_bench_quick_json_allocator():
    r = run(["-m", "paddle_rt", "bench", "--quick", "--json", "--only", "allocator"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["quick"] is True and out["errors"] == []
    assert out["paddle_rt"] == paddle_rt.__version__ and out["machine"]["cpus"] >= 1
    assert set(out["seconds"]) == {"total", "allocator"}
    res = out["results"]
    assert len(res) >= 10
    for x in res:
        check_result(x, "allocator")
    names = [x["name"] for x in res]
    assert "Python pair malloc(256).free()" in names
    targets = {x["name"]: x["target"] for x in res if x["target"]}
    assert targets["Python pair malloc(256).free()"] == "<= 100 ns"
    assert "<= 3x" in targets.values() and "<= 2x" in targets.values()
    # every figure with a target is reported with its spread over the repetitions
    assert all(x["low"] is not None for x in res if x["target"])
    assert out["machine"]["loadavg_1min_start"] is not None and out["machine"]["loadavg_1min_end"] is not None


def test_bench_table_and_bad_area():
    r = run(["-m", "paddle_rt", "bench", "--quick", "--only", "allocator"])
    assert r.returncode == 0, r.stderr
    assert "area" in r.stdout and "target" in r.stdout and "figures with a target" in r.stdout
    assert "median" in r.stdout and "spread" in r.stdout and " .. " in r.stdout
    assert "at the start and" in r.stdout.splitlines()[0] and "at the end" in r.stdout.splitlines()[0]
    assert "<= 100 ns" in r.stdout and ("met" in r.stdout or "MISSED" in r.stdout or "noise" in r.stdout)
    r = run(["-m", "paddle_rt", "bench", "--only", "allocator,nonsense"])
    assert r.returncode == 2
    assert "unknown area(s) nonsense" in r.stderr and "allocator" in r.stderr


def test_every_module_with_measure_is_an_area():
    names = benchmarks.area_names()
    assert names[:2] == ["allocator", "streams"] and "ccl" in names
    here = os.path.dirname(benchmarks.__file__)
    modules = sorted(f[:-3] for f in os.listdir(here) if f.endswith(".py") and not f.startswith("_"))
    assert sorted(names) == modules                       # pool.py is picked up when it is there
    for n in names:
        mod = benchmarks.load_area(n)
        assert mod is not None and callable(mod.measure), n
    r = run(["-m", "paddle_rt", "bench", "--list"])
    assert r.returncode == 0 and r.stdout.split() == names


def test_one_broken_area_does_not_stop_the_others(monkeypatch):
    def good(quick):
        return [benchmarks.result("good", "a figure", 5, "ns", *benchmarks.at_most(5, 10, "ns")),
                benchmarks.result("good", "b figure", 0.5, "x", *benchmarks.at_least(0.5, 2, "x")),
                benchmarks.result("good", "no target", 3, "GB/s")]

    def broken(quick):
        raise RuntimeError("plugin went away")

    def incomplete(quick):
        return [{"area": "half", "name": "x", "value": 1.0}]

    def cannot(quick):
        raise benchmarks.AreaSkipped("needs 8 devices")

    mods = {"good": types.SimpleNamespace(measure=good), "broken": types.SimpleNamespace(measure=broken),
            "half": types.SimpleNamespace(measure=incomplete), "nomeasure": None,
            "skips": types.SimpleNamespace(measure=cannot)}
    monkeypatch.setattr(benchmarks, "area_names", lambda: list(mods))
    monkeypatch.setattr(benchmarks, "load_area", lambda n: mods[n])
    results, errors, seconds = bench.run_suite(quick=True)
    assert [r["name"] for r in results] == ["a figure", "b figure", "no target"]
    assert [e["area"] for e in errors] == ["broken", "half", "skips"]
    assert [e["skipped"] for e in errors] == [False, False, True]
    assert "plugin went away" in errors[0]["error"] and "without" in errors[1]["error"]
    assert results[0]["target"] == "<= 10 ns" and results[0]["met"] is True
    assert results[1]["target"] == ">= 2x" and results[1]["met"] is False
    table = bench.format_table(results, errors)
    assert "MISSED" in table and " met" in table and "ERROR" in table and "(skipped: needs 8 devices)" in table
    assert "2 figures with a target: 1 met, 1 missed; 2 area(s) failed to run; 1 skipped" in table
    with pytest.raises(ValueError, match="unknown area"):
        bench.run_suite(only=["zzz"])


def test_figure_spread_and_verdicts():
    """A target is missed only when the whole spread misses it."""
    f = benchmarks.figure
    assert f("a", "x", [80, 90, 95], "ns", at_most=100)["verdict"] == "met"
    noisy = f("a", "x", [90, 120, 130], "ns", at_most=100)
    assert (noisy["value"], noisy["low"], noisy["high"]) == (120, 90, 130)
    assert noisy["verdict"] == "noise" and noisy["met"] is True and noisy["target"] == "<= 100 ns"
    missed = f("a", "x", [101, 120, 130], "ns", at_most=100)
    assert missed["verdict"] == "MISSED" and missed["met"] is False
    assert f("a", "x", [0.5, 0.8, 0.95], "x", at_least=0.9)["verdict"] == "noise"
    assert f("a", "x", [0.5, 0.8, 0.85], "x", at_least=0.9)["verdict"] == "MISSED"
    once = f("a", "x", [3.0], "GB/s")
    assert once["low"] is None and once["verdict"] is None and once["met"] is None
    table = bench.format_table([noisy, missed])
    assert "90.0 ns .. 130 ns" in table and "noise" in table and "MISSED" in table
    assert "2 figures with a target: 0 met, 1 within noise (median misses, spread reaches), 1 missed" in table


def test_strict_makes_a_miss_exit_1(monkeypatch, capsys):
    rows = {"ok": [benchmarks.figure("ok", "fast", [1, 2, 3], "ns", at_most=5),
                   benchmarks.figure("ok", "noisy", [4, 6, 7], "ns", at_most=5)],
            "bad": [benchmarks.figure("bad", "slow", [6, 7, 8], "ns", at_most=5)]}
    mods = {k: types.SimpleNamespace(measure=lambda quick, k=k: [dict(r) for r in rows[k]]) for k in rows}
    monkeypatch.setattr(benchmarks, "area_names", lambda: list(mods))
    monkeypatch.setattr(benchmarks, "load_area", lambda n: mods[n])
    assert bench.main(["--only", "ok", "--strict"]) == 0          # noise is not a miss
    assert bench.main(["--only", "ok,bad"]) == 0
    assert bench.main(["--only", "ok,bad", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "load " in out.splitlines()[0] and "at the end" in out.splitlines()[0]


def test_bench_scripts_wrap_the_same_code():
    """bench/*.py keep their command lines and output (bench/RESULTS.md cites them)."""
    r = run([os.path.join("bench", "bench_allocator.py"), "--reps", "5", "--json"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"device", "reps", "python", "nogil", "many_live"} and out["reps"] == 5
    r = run([os.path.join("bench", "bench_allocator.py"), "--reps", "2"])
    assert r.returncode == 2 and "--reps must be >= 5" in r.stderr
    r = run([os.path.join("bench", "bench_stream.py"), "--reps", "1"])
    assert r.returncode == 0, r.stderr
    assert "Event record+query from Python, idle stream (target <= 300 ns)" in r.stdout
    assert "median of per-pair ratios (target >= 90%)" in r.stdout
    r = run([os.path.join("bench", "bench_ccl.py"), "--reps", "1", "--max-mib", "1", "--devices", "2,4"])
    assert r.returncode == 0, r.stderr
    assert "# all_reduce float32 sum, 2 ranks" in r.stdout and "# all_reduce float32 sum, 4 ranks" in r.stdout
    assert r.stdout.count("\n   1048576 ") == 2


def test_ccl_area_skipped_without_devices():
    env = dict(os.environ, PYTHONPATH=SRC, PADDLE_RT_NO_RT_CPU="1")
    env.pop("RT_CPU_DEVICE_COUNT", None)
    r = subprocess.run([sys.executable, "-m", "paddle_rt", "bench", "--quick", "--only", "ccl"], env=env,
                       capture_output=True, text=True, timeout=300, cwd=SRC)
    assert r.returncode == 0, r.stderr
    assert "(skipped: needs 2 rt_cpu devices, this process has 0)" in r.stdout


@pytest.mark.slow
def test_whole_quick_suite_json():
    r = run(["-m", "paddle_rt", "bench", "--quick", "--json"], timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # areas whose optional extras are missing (llm without torch/transformers) are skipped, not failed
    assert [e for e in out["errors"] if not e.get("skipped")] == []
    areas = {x["area"] for x in out["results"]}
    assert {"allocator", "streams", "ccl"} <= areas
    for x in out["results"]:
        check_result(x, x["area"])
    targets = {x["target"] for x in out["results"] if x["target"]}
    assert {"<= 300 ns", "<= 50 us", ">= 90%", ">= 1 M/s", ">= 50%"} <= targets


# -- the command in this process: its table, header, JSON, options and messages ---------------------------------------

def fake_areas(monkeypatch, mods):
    """Make the suite's areas the given {name: module or None}."""
    monkeypatch.setattr(benchmarks, "area_names", lambda: list(mods))
    monkeypatch.setattr(benchmarks, "load_area", lambda n: mods[n])


def columns(table):
    """The (start, end) of each column of format_table's text, from its line of dashes."""
    sep = table.splitlines()[1]
    assert set(sep) <= {"-", " "}, sep
    runs = [m.span() for m in re.finditer(r"-+", sep)]
    assert len(runs) == 6 and all(b[0] - a[1] == 2 for a, b in zip(runs, runs[1:])), sep   # two spaces apart
    return runs


def cells(line, runs):
    return [line[s:e].strip() for s, e in runs]


def test_table_columns_and_figures():
    """One column per heading (area, figure, median, spread, target, result) under a line of dashes; the area named
    once per group; medians right-aligned; ratios and percentages without a space before the unit."""
    f = benchmarks.figure
    results = [f("alloc", "small", [4, 5, 6], "ns", at_most=10), f("alloc", "medium", [40, 50, 60], "ns"),
               f("alloc", "large", [400, 500, 600], "ns", at_most=450), f("ratio", "speedup", [0.4, 0.5, 0.6], "x",
                                                                          at_least=2),
               f("ratio", "share", [95.5], "%", at_least=90)]
    table = bench.format_table(results)
    runs = columns(table)
    lines = table.splitlines()
    assert cells(lines[0], runs) == ["area", "figure", "median", "spread", "target", "result"]
    rows = [cells(ln, runs) for ln in lines[2:7]]
    assert rows[0] == ["alloc", "small", "5.00 ns", "4.00 ns .. 6.00 ns", "<= 10 ns", "met"]
    assert rows[1] == ["", "medium", "50.0 ns", "40.0 ns .. 60.0 ns", "", ""]
    assert rows[2] == ["", "large", "500 ns", "400 ns .. 600 ns", "<= 450 ns", "noise"]
    assert rows[3] == ["ratio", "speedup", "0.50x", "0.40x .. 0.60x", ">= 2x", "MISSED"]
    assert rows[4] == ["", "share", "95.5%", "", ">= 90%", "met"]
    median = runs[2]
    for ln in lines[:7]:
        assert ln[median[1] - 1] != " ", ln                                # right-aligned under "median"
    assert lines[7] == ""
    assert lines[8] == "4 figures with a target: 2 met, 1 within noise (median misses, spread reaches), 1 missed"
    assert len(lines) == 9


def test_long_figure_names_do_not_widen_the_column_beyond_64():
    name = "a figure with a very long name " * 4
    runs = columns(bench.format_table([benchmarks.figure("a", name, [1, 2], "ns")]))
    assert runs[1][1] - runs[1][0] == 64


def test_table_of_areas_that_failed_or_were_skipped():
    errors = [{"area": "broken", "error": "RuntimeError: boom", "traceback": "Traceback ...", "skipped": False},
              {"area": "skips", "error": "needs 8 devices", "traceback": "", "skipped": True}]
    table = bench.format_table([], errors)
    runs = columns(table)
    lines = table.splitlines()
    assert cells(lines[2], runs) == ["broken", "(failed to run)", "", "", "", "ERROR"]
    assert cells(lines[3], runs) == ["skips", "(skipped: needs 8 devices)", "", "", "", "skipped"]
    assert lines[5:] == ["0 figures with a target: 0 met, 0 missed; 1 area(s) failed to run; 1 skipped",
                         "  broken: RuntimeError: boom"]
    only_skipped = bench.format_table([], errors[1:]).splitlines()
    assert "ERROR" not in "\n".join(only_skipped) and "failed to run" not in "\n".join(only_skipped)
    assert only_skipped[-1] == "0 figures with a target: 0 met, 0 missed; 1 skipped"
    only_failed = bench.format_table([], errors[:1]).splitlines()
    assert only_failed[-2:] == ["0 figures with a target: 0 met, 0 missed; 1 area(s) failed to run",
                                "  broken: RuntimeError: boom"]
    assert "skipped" not in "\n".join(only_failed)


def _areas():
    def good(quick):
        seen.append(quick)
        return [benchmarks.figure("good", "fast", [1, 2, 3], "ns", at_most=5)]

    def broken(quick):
        raise RuntimeError("plugin went away")

    def cannot(quick):
        raise benchmarks.AreaSkipped("needs 8 devices")
    seen = []
    return {"good": types.SimpleNamespace(measure=good), "nomeasure": None,
            "broken": types.SimpleNamespace(measure=broken), "skips": types.SimpleNamespace(measure=cannot)}, seen


def test_run_suite_logs_each_area_and_keeps_the_traceback(monkeypatch):
    mods, seen = _areas()
    fake_areas(monkeypatch, mods)
    log = []
    results, errors, seconds = bench.run_suite(quick=True, log=log.append)
    assert log == ["bench: good...", "bench: broken...", "bench: skips..."]
    assert seen == [True] and [r["name"] for r in results] == ["fast"]
    assert set(seconds) == {"good", "broken", "skips"} and all(s >= 0 for s in seconds.values())
    broken, skipped = errors
    assert broken["area"] == "broken" and broken["error"] == "RuntimeError: plugin went away"
    assert broken["traceback"].startswith("Traceback (most recent call last)")
    assert broken["traceback"].rstrip().endswith("RuntimeError: plugin went away")
    assert skipped == {"area": "skips", "error": "needs 8 devices", "traceback": "", "skipped": True}
    results, errors, seconds = bench.run_suite(only=["skips", "good"])
    assert seen == [True, False] and [e["area"] for e in errors] == ["skips"] and set(seconds) == {"good", "skips"}


def test_main_progress_on_a_terminal_and_tracebacks(monkeypatch, capsys):
    """On a terminal each area is announced on stderr (not with --json); an area that failed to run prints its
    traceback on stderr and makes the exit status 1; a skipped area does not."""
    mods, seen = _areas()
    fake_areas(monkeypatch, mods)
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert bench.main(["--only", "good,skips"]) == 0
    assert tty.getvalue() == "bench: good...\nbench: skips...\n"
    out = capsys.readouterr().out
    assert "(skipped: needs 8 devices)" in out and "ERROR" not in out
    tty.seek(0)
    tty.truncate()
    assert bench.main(["--only", "good", "--json"]) == 0
    assert tty.getvalue() == ""
    capsys.readouterr()
    assert bench.main(["--only", "good, broken"]) == 1
    err = tty.getvalue()
    assert "\nbroken:\nTraceback (most recent call last)" in err and "RuntimeError: plugin went away" in err
    assert "(failed to run)" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stderr", __import__("io").StringIO())       # not a terminal: no announcements
    assert bench.main(["--only", "good"]) == 0
    assert sys.stderr.getvalue() == ""


@pytest.mark.parametrize("load,text", [(0.0, ", load 0.0 at the start and 0.0 at the end;"),
                                       (1e6, ", load 1000000.0 at the start and 1000000.0 at the end (a busy machine: "
                                                 "absolute figures are noisy);"),
                                       (None, " CPUs; medians")])
def test_header_line(monkeypatch, capsys, load, text):
    """The header: version, quick or not, device, Python, CPUs, the load at the start and the end (a busy machine
    says so), and the total time."""
    mods, seen = _areas()
    fake_areas(monkeypatch, mods)
    monkeypatch.setattr(bench, "_load", lambda: load)
    assert bench.main(["--only", "good", "--quick"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith(f"paddle_rt {paddle_rt.__version__} benchmarks (quick) on {paddle_rt.get_device()}, "
                           f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    assert text in head and re.search(r"; medians and spreads over the repetitions; \d+ s$", head), head
    assert seen == [True]
    assert bench.main(["--only", "good"]) == 0
    assert " benchmarks on " in capsys.readouterr().out.splitlines()[0] and seen == [True, False]


def test_json_output(monkeypatch, capsys):
    mods, seen = _areas()
    fake_areas(monkeypatch, mods)
    monkeypatch.setattr(bench, "_load", lambda: 0.25)
    assert bench.main(["--only", "skips,good", "--json", "--quick"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["paddle_rt"] == paddle_rt.__version__ and out["quick"] is True
    assert out["device"] == str(paddle_rt.get_device())
    assert out["machine"] == {"cpus": os.cpu_count(), "loadavg_1min": 0.25, "loadavg_1min_start": 0.25,
                              "loadavg_1min_end": 0.25, "python": platform.python_version(),
                              "platform": platform.platform()}
    assert set(out["seconds"]) == {"total", "good", "skips"}
    assert out["seconds"]["total"] >= out["seconds"]["good"]
    assert [r["name"] for r in out["results"]] == ["fast"] and out["results"][0]["verdict"] == "met"
    assert out["errors"] == [{"area": "skips", "error": "needs 8 devices", "traceback": "", "skipped": True}]

    def no_device():
        raise paddle_rt.DeviceError("none")
    monkeypatch.setattr(paddle_rt, "get_device", no_device)
    assert bench.main(["--only", "good", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "no device" and out["quick"] is False


def test_help_list_and_bad_only(monkeypatch, capsys):
    """--help gives the description (the exit statuses included) and --only's metavar and default; --list the areas;
    an unknown area is one line naming --only and the known areas."""
    from test_cli import option_entries
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    flat = " ".join(text.split())
    assert flat.startswith("usage: paddle-rt bench ")
    assert "Each ratio is measured within one run" in flat and "--quick takes fewer repetitions" in flat
    assert "The exit status is 0 when every area ran, 1 when an area failed to run" in flat
    assert "python -m paddle_rt" not in text
    entries = option_entries(text)
    assert entries["--only"].startswith("--only AREA[,AREA] ") and entries["--only"].endswith("(default: every area)")
    for option in ("--quick", "--json", "--list", "--strict"):
        assert "(default" not in entries[option], entries[option]
    mods, seen = _areas()
    fake_areas(monkeypatch, mods)
    assert bench.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(mods)
    assert seen == []
    assert bench.main(["--only", "good,zzz"]) == 2
    assert capsys.readouterr().err == ("paddle-rt bench: --only good,zzz: unknown area(s) zzz; the areas are good, "
                                       "nomeasure, broken, skips\n")


def test_a_figure_without_its_fields_fails_its_area(monkeypatch):
    fake_areas(monkeypatch, {"half": types.SimpleNamespace(measure=lambda quick: [{"area": "half", "name": "x",
                                                                                     "value": 1.0}])})
    results, errors, _ = bench.run_suite()
    assert results == [] and errors[0]["skipped"] is False
    assert errors[0]["error"] == ("TypeError: half.measure() returned a figure without ['met', 'note', 'target', "
                                  "'unit']: {'area': 'half', 'name': 'x', 'value': 1.0}")
