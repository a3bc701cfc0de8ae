"""``python -m paddle_rt capture``: the allocation log of a PyTorch CPU program, run as users run it (a folder of their
own, relative paths). Tests that run torch are marked ``capture`` (.ci/run installs torch==2.13.0+cpu first)."""
import csv
import gzip
import os
import subprocess
import sys

import pytest

import paddle_rt
from paddle_rt.tools import replay

SRC = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))   # the paddle_rt under test

SCRIPT = """\
import sys
import torch
n = int(sys.argv[1])
keep = []
for i in range(n):
    keep.append(torch.empty(1000 * (i + 1), dtype=torch.uint8))
del keep[0]
"""


def has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def run(args, cwd, pythonpath=()):
    """`python -m paddle_rt capture ARGS` in cwd; pythonpath's folders come first (before the paddle_rt under test's
    folder, which is site-packages when it is installed: a stand-in module there must not be shadowed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*pythonpath, SRC]))
    return subprocess.run([sys.executable, "-m", "paddle_rt", "capture", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def our_lines(stderr):
    """The command's own lines on stderr (torch's profiler prints its own)."""
    return [line for line in stderr.splitlines()
            if line.startswith(("paddle-rt capture:", "python -m paddle_rt capture:"))]


@pytest.mark.capture
@pytest.mark.skipif(not has_torch(), reason="torch is not installed (pip install torch==2.13.0+cpu)")
def test_capture_writes_a_valid_log_that_replays(tmp_path):
    (tmp_path / "work.py").write_text(SCRIPT)
    r = run(["-o", "out.csv.gz", "--", sys.executable, "work.py", "5"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "out.csv.gz: " in r.stdout and "allocations" in r.stdout
    with gzip.open(tmp_path / "out.csv.gz", "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
    sizes = [int(r["Size"]) for r in rows if r["Action"] == "allocate"]
    for k in range(1, 6):                        # the script's exact requests are in the log, in order
        assert 1000 * k in sizes
    assert [s for s in sizes if s % 1000 == 0 and s <= 5000][:5] == [1000, 2000, 3000, 4000, 5000]
    live = {}
    for row in rows:                             # every free matches a live allocation of the same size
        if row["Action"] == "allocate":
            assert row["Pointer"] not in live
            live[row["Pointer"]] = row["Size"]
        else:
            assert live.pop(row["Pointer"]) == row["Size"]
    t = replay.load_trace(str(tmp_path / "out.csv.gz"))
    assert t[4] >= 14000                         # the peak: 2000..5000 live after 1000 was freed, at least


@pytest.mark.capture
@pytest.mark.skipif(not has_torch(), reason="torch is not installed (pip install torch==2.13.0+cpu)")
@pytest.mark.parametrize("command", [["-m", "work", "3"], ["-c", "import torch; x = torch.ones(100)"],
                                     ["work.py", "3"]])
def test_capture_module_code_and_bare_script_forms(tmp_path, command):
    (tmp_path / "work.py").write_text(SCRIPT)
    if command[0] == "work.py":
        r = run(["-o", "out.csv", "--", *command], tmp_path)
    else:
        r = run(["-o", "out.csv", "--", sys.executable, *command], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.csv").read_text().startswith("Thread,Time,Action,Pointer,Size,Stream\n")


@pytest.mark.capture
@pytest.mark.skipif(not has_torch(), reason="torch is not installed (pip install torch==2.13.0+cpu)")
@pytest.mark.parametrize("body, expect", [
    ("import torch\nraise ValueError('boom')\n", "failed (exit status 1); no trace written"),
    ("import sys, torch\nsys.exit(4)\n", "failed (exit status 4); no trace written"),
    ("import torch\nx = 1\n", "allocated no CPU memory through torch"),
])
def test_a_failing_or_empty_program_is_one_line_and_writes_nothing(tmp_path, body, expect):
    (tmp_path / "work.py").write_text(body)
    r = run(["-o", "out.csv.gz", "--", sys.executable, "work.py"], tmp_path)
    assert r.returncode == 1
    lines = our_lines(r.stderr)
    assert len(lines) == 1 and expect in lines[0], r.stderr
    assert not (tmp_path / "out.csv.gz").exists()


def test_missing_torch_is_one_line_with_the_install_command(tmp_path):
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    (tmp_path / "work.py").write_text("x = 1\n")
    r = run(["-o", "out.csv", "--", sys.executable, "work.py"], tmp_path, pythonpath=[str(fake)])
    assert r.returncode == 1
    lines = our_lines(r.stderr)
    assert len(lines) == 1 and "torch is not installed" in lines[0] and "--index-url" in lines[0]
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("command, expect", [
    ([], "nothing to run"),
    (["ls", "-l"], "is not a Python program"),
    ([sys.executable, "missing.py"], "missing.py: no such script"),
    ([sys.executable, "-m"], "give a script, -m MODULE or -c CODE"),
])
def test_bad_commands_are_one_line(tmp_path, command, expect):
    r = run(["-o", "out.csv", "--", *command] if command else ["-o", "out.csv"], tmp_path)
    assert r.returncode == 2          # nothing was run: a usage error (docs/cli.md)
    lines = our_lines(r.stderr)
    assert len(lines) == 1 and expect in lines[0], r.stderr
    assert not (tmp_path / "out.csv").exists()


def test_output_folder_must_exist(tmp_path):
    (tmp_path / "work.py").write_text("x = 1\n")
    r = run(["-o", "no/such/out.csv", "--", sys.executable, "work.py"], tmp_path)
    assert r.returncode == 2          # checked before the program runs
    lines = our_lines(r.stderr)
    assert lines == ["paddle-rt capture: --output no/such/out.csv: no such folder no/such (create it first)"]


def test_output_is_required(tmp_path):
    r = run(["--", sys.executable, "x.py"], tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert "-o/--output" in line and "--help" in line
