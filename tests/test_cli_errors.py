"""Every CLI mistake is one line naming the program (``paddle-rt``) and the user's own argument, with the exit status
docs/cli.md documents; output paths are checked before the work starts; a closed pipe ends quietly. Run as users run
the command: from a folder of their own, with relative paths (tests/test_cli.py's run_cli)."""
import os
import subprocess

import pytest

from test_cli import cli, run_cli, write_log

PROG = "paddle-rt"


def one_line(res):
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith((f"{PROG} ", f"{PROG}:")), lines[0]
    return lines[0]


def small_log(folder):
    write_log(folder / "log.csv", [("allocate", 0x10, 3 << 20), ("free", 0x10, 3 << 20)])
    return "log.csv"


def test_version(tmp_path):
    import paddle_rt
    res = run_cli(["--version"], tmp_path)
    assert res.returncode == 0 and res.stdout == f"{PROG} {paddle_rt.__version__}\n" and res.stderr == ""


def test_replay_on_an_unknown_device_is_one_line(tmp_path):
    log = small_log(tmp_path)
    res = run_cli(["replay", log, "--device", "cuda:0"], tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    line = one_line(res)
    assert line.startswith(f"{PROG} replay: --device cuda:0: ") and "unknown device type 'cuda'" in line


@pytest.mark.parametrize("args, expect", [
    (["replay", "missing.csv"], "paddle-rt replay: missing.csv: no such file"),
    (["replay", "log.csv", "--conf", "bogus"], "paddle-rt replay: --conf item 'bogus' is not key:value"),
    (["plot", "missing.json", "-o", "x.png"], "paddle-rt plot: missing.json: no such file"),
    (["check", "--timeout", "0", "x.so"], "paddle-rt check: --timeout 0: must be a positive number of seconds"),
    (["check", "--only", "nope", "x.so"], "paddle-rt check: --only nope: no check named nope (see --list)"),
])
def test_each_message_names_the_program_once_and_the_users_argument(tmp_path, args, expect):
    small_log(tmp_path)
    res = run_cli(args, tmp_path)
    assert res.returncode == 2
    assert one_line(res) == expect


@pytest.mark.parametrize("args, option, path", [
    (["replay", "log.csv", "--plot", os.path.join("nodir", "x.png")], "--plot", "nodir/x.png"),
    (["plot", "log.csv", "-o", os.path.join("nodir", "x.png")], "--output", "nodir/x.png"),
    (["capture", "-o", os.path.join("nodir", "t.csv"), "--", "python", "w.py"], "--output", "nodir/t.csv"),
])
def test_output_paths_are_checked_before_the_work(tmp_path, args, option, path):
    small_log(tmp_path)
    (tmp_path / "w.py").write_text("raise SystemExit('the program must not run')\n")
    res = run_cli(args, tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert one_line(res).endswith(f"{option} {path}: no such folder nodir (create it first)")
    (tmp_path / "adir").mkdir()
    res = run_cli([("adir" if "nodir" in a else a) for a in args], tmp_path)
    assert res.returncode == 2 and one_line(res).endswith(f"{option} adir is a folder; give a file name")


def test_check_hint_never_suggests_the_missing_path(tmp_path):
    (tmp_path / "build").mkdir()
    res = run_cli(["check", os.path.join("build", "libmy_device.so")], tmp_path)
    assert res.returncode == 2
    line = one_line(res)
    assert line.startswith(f"{PROG} check: no such file: build/libmy_device.so; ")
    assert line.count("libmy_device.so") == 1          # named once: as the missing file, not as the advice
    (tmp_path / "build" / "libother.so").write_bytes(b"\x7fELF")
    line = one_line(run_cli(["check", os.path.join("build", "libmy_device.so")], tmp_path))
    assert line.endswith("shared libraries beside it: build/libother.so")


def test_capture_help_suggests_the_installed_command(tmp_path):
    res = run_cli(["capture", "--help"], tmp_path)
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    assert f"The log replays with: {PROG} replay TRACE.csv.gz" in text and "python -m paddle_rt" not in text


def test_no_message_names_the_program_another_way(tmp_path):
    small_log(tmp_path)
    for args in (["replay", "nothere.csv"], ["plot", "nothere.csv", "-o", "x.png"], ["check", "nothere.so"],
                 ["replay", "--corpus", "nowhere"], ["bench", "--only", "nope"], ["nope"]):
        res = run_cli(args, tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        line = one_line(res)
        assert "paddle_rt " not in line.split(":")[0] and "plot: plot:" not in line and "python -m" not in line


def test_closed_pipe_ends_quietly(tmp_path):
    argv, _ = cli()
    env = dict(os.environ, PYTHONPATH=__import__("conftest").package_parent())
    p = subprocess.run(" ".join(f"'{a}'" for a in argv) + " demo | head -2", shell=True, cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300, executable="/bin/bash")
    assert len(p.stdout.splitlines()) == 2
    assert p.stderr == "", p.stderr
    p = subprocess.run(" ".join(f"'{a}'" for a in argv) + " demo | head -2; echo \"${PIPESTATUS[0]}\"", shell=True,
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, executable="/bin/bash")
    assert p.stdout.splitlines()[-1] == "141"         # 128 + SIGPIPE, as docs/cli.md says
