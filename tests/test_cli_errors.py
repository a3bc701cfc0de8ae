"""Every CLI mistake is one line naming the program (``paddle-rt``) and the user's own argument, with the exit status
docs/cli.md documents; output paths are checked before the work starts; a closed pipe ends quietly. Run as users run
the command: from a folder of their own, with relative paths (tests/test_cli.py's run_cli)."""
import os
import subprocess
import sys

import pytest

from paddle_rt.tools import cli as clitools
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


# What pip writes for the console script `paddle-rt` (pyproject's [project.scripts]): the installed-style command.
CONSOLE_SCRIPT = "import sys\nfrom paddle_rt.__main__ import main\nif __name__ == '__main__':\n    sys.exit(main())\n"
COMMANDS = ["demo", "info", "replay", "capture", "check", "plot", "view", "bench"]


def run_into_closed_pipe(argv, cwd):
    """Run argv with its standard output a real pipe whose reader is already gone (`... | head -1` when head has
    exited before the program writes): every write and flush meets EPIPE, no race left to chance."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = __import__("conftest").package_parent()
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, cwd=cwd, env=env, text=True, timeout=300)
    finally:
        os.close(w)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["info"]] + [[c, "--help"] for c in COMMANDS],
                         ids=lambda a: " ".join(a))
def test_every_output_into_a_closed_pipe_ends_quietly_with_141(tmp_path, args):
    """Issue 46 item 12: `paddle-rt --help | head -1` printed a BrokenPipeError report and failed; docs/cli.md
    promises status 141 and nothing on stderr, for the program's own output and every command's (argparse's --help
    leaves through SystemExit with its text still buffered)."""
    script = tmp_path / "paddle-rt"
    script.write_text(CONSOLE_SCRIPT)
    for argv in ([sys.executable, str(script)], [sys.executable, "-m", "paddle_rt"]):
        p = run_into_closed_pipe(argv + args, tmp_path)
        assert (p.returncode, p.stderr) == (141, ""), (argv + args, p.returncode, p.stderr)


def test_help_into_head_never_reports_a_broken_pipe(tmp_path):
    """`paddle-rt --help | head -1` as typed, many times: head may exit before or after the program writes (the race
    the closed-pipe test above forces), and either way nothing reaches stderr and the status is 0 or 141."""
    script = tmp_path / "paddle-rt"
    script.write_text(CONSOLE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=__import__("conftest").package_parent())
    cmd = (f"for i in $(seq 8); do '{sys.executable}' '{script}' --help | head -1; echo \"status ${{PIPESTATUS[0]}}\"; "
           f"'{sys.executable}' '{script}' replay --help | head -c 1 >/dev/null; echo \"status ${{PIPESTATUS[0]}}\"; done")
    p = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                       executable="/bin/bash")
    assert p.stderr == "", p.stderr
    statuses = [line.split()[1] for line in p.stdout.splitlines() if line.startswith("status ")]
    assert len(statuses) == 16 and set(statuses) <= {"0", "141"}, p.stdout
    assert p.stdout.count("usage: paddle-rt COMMAND") == 8


def test_output_into_an_open_pipe_is_unchanged(tmp_path):
    """The guard flushes, nothing more: with a reader the whole help arrives and the status is 0."""
    res = run_cli(["--help"], tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("usage: paddle-rt COMMAND") and res.stderr == ""
    res = run_cli(["replay", "--help"], tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("usage: paddle-rt replay") and res.stderr == ""


# -- paddle_rt.tools.cli in this process: the parts every command uses ------------------------------------------------


def test_exit_statuses_are_the_documented_ones():
    assert (clitools.EXIT_OK, clitools.EXIT_FAILED, clitools.EXIT_USAGE, clitools.EXIT_DOES_NOT_FIT,
            clitools.EXIT_INTERRUPTED, clitools.EXIT_BROKEN_PIPE) == (0, 1, 2, 3, 130, 141)
    assert clitools.program() == PROG


def test_error_is_one_line_without_a_repeated_prefix(capsys):
    """`paddle-rt COMMAND: message`: the message's first line, its spaces collapsed, without the "replay: " (or
    "paddle_rt replay: ") it may start with; status 2 unless told."""
    for text in ("replay: x.csv: no such file", "paddle_rt replay: x.csv: no such file",
                 "paddle-rt replay: x.csv: no such file", "x.csv:   no such\tfile\nsecond line"):
        assert clitools.error("replay", text) == 2
        assert capsys.readouterr().err == "paddle-rt replay: x.csv: no such file\n"
    assert clitools.error("plot", ValueError("plot: bad value")) == 2
    assert capsys.readouterr().err == "paddle-rt plot: bad value\n"
    assert clitools.error("check", "", 7) == 7
    assert capsys.readouterr().err == "paddle-rt check: failed\n"
    assert clitools.error("bench", "replay: kept") == 2                   # another command's prefix is the text
    assert capsys.readouterr().err == "paddle-rt bench: replay: kept\n"


def test_usage_errors_point_at_help(capsys):
    assert clitools.usage_error("plot", "give -o OUT.png") == 2
    captured = capsys.readouterr()
    assert captured.err == "paddle-rt plot: give -o OUT.png (see `paddle-rt plot --help`)\n" and captured.out == ""
    ap = clitools.command_parser("demo", description="Try ``python -m paddle_rt demo``.")
    ap.add_argument("--count", type=int, default=3, help="how many")
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--count", "x"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("paddle-rt demo: argument --count: invalid int value: 'x' "
                                       "(see `paddle-rt demo --help`)\n")


def test_help_states_each_default_once(capsys, monkeypatch):
    """The description as written (the installed command's name, no rst quotes); every option with a default says it,
    unless its help already does; flags, positionals and options without a default do not."""
    from test_cli import option_entries
    monkeypatch.setenv("COLUMNS", "200")
    ap = clitools.command_parser("demo", description="Try ``python -m paddle_rt demo``.\n\n  indented as written")
    ap.add_argument("path", nargs="?", default="a.csv", help="the input")
    ap.add_argument("--count", type=int, default=3, help="how many")
    ap.add_argument("--size", default="4K", help="bytes (default: one page)")
    ap.add_argument("--name", default=None, help="a name")
    ap.add_argument("--empty", default="", help="nothing")
    ap.add_argument("--off", type=float, default=0.0, help="zero")
    ap.add_argument("--flag", action="store_true", help="a switch")
    ap.add_argument("--no-flag", dest="flag2", action="store_false", help="another switch")
    text = ap.format_help()
    assert text.startswith("usage: paddle-rt demo ")
    assert "Try paddle-rt demo.\n\n  indented as written\n" in text
    entries = option_entries(text)
    assert entries["--count"].endswith("how many (default: 3)")
    assert entries["--size"].endswith("bytes (default: one page)") and entries["--size"].count("default") == 1
    assert entries["--off"].endswith("zero (default: 0.0)")
    for option in ("--name", "--empty", "--flag", "--no-flag"):
        assert "(default" not in entries[option], entries[option]
    assert "the input" in text and "(default: a.csv)" not in text
    assert clitools.command_parser("demo").description is None


def test_output_path_problems(tmp_path, monkeypatch):
    """Checked before the work: an empty path, a folder, a missing folder, a folder or file that cannot be written."""
    assert clitools.output_path_problem("") == "the output: an empty path"
    assert clitools.output_path_problem(tmp_path, "-o") == f"-o {tmp_path} is a folder; give a file name"
    missing = tmp_path / "nodir" / "x.png"
    assert clitools.output_path_problem(missing, "--plot") == \
        f"--plot {missing}: no such folder {tmp_path / 'nodir'} (create it first)"
    out = tmp_path / "x.png"
    assert clitools.output_path_problem(out) is None
    monkeypatch.chdir(tmp_path)
    assert clitools.output_path_problem("here.png") is None               # a bare name: the current folder
    real_access = os.access
    denied = set()
    # (as root every path is writable: the refusals of a read-only folder or file are simulated)
    monkeypatch.setattr(os, "access", lambda p, mode: not (mode & os.W_OK and os.fspath(p) in denied)
                        and real_access(p, mode))
    denied.add(str(tmp_path))
    assert clitools.output_path_problem(out, "--output") == f"--output {out}: not writable"
    assert clitools.output_path_problem("here.png") is None                # "." is not the folder refused
    denied.clear()
    out.write_text("old")
    denied.add(str(out))
    assert clitools.output_path_problem(out) == f"the output {out}: not writable"
    assert clitools.output_path_problem(tmp_path / "new.png") is None      # a new file beside it is fine
    denied.clear()
    monkeypatch.setattr(os, "access", lambda p, mode: not (mode & os.X_OK) and real_access(p, mode))
    assert clitools.output_path_problem(out) == f"the output {out}: not writable"   # a folder one cannot enter


def test_run_command_statuses(capsys):
    """A command's status (None is 0); a paddle_rt error is one line and status 2; Ctrl-C is 130."""
    import paddle_rt
    seen = []
    assert clitools.run_command("demo", lambda argv: seen.append(argv), ["--x"]) == 0 and seen == [["--x"]]
    assert clitools.run_command("demo", lambda argv: 3, []) == 3

    def bad(argv):
        raise paddle_rt.InvalidArgument("demo: bad value\nmore detail")
    assert clitools.run_command("demo", bad, []) == 2
    assert capsys.readouterr().err == "paddle-rt demo: bad value\n"

    def interrupted(argv):
        raise KeyboardInterrupt
    assert clitools.run_command("replay", interrupted, []) == 130
    assert capsys.readouterr().err == "paddle-rt replay: interrupted\n"


def test_closed_pipe_points_stdout_at_devnull(tmp_path, monkeypatch):
    """After the reader went away the command ends with 141 and later output goes nowhere (no second error)."""
    target = tmp_path / "stdout.txt"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT)

    class Out:
        def fileno(self):
            return fd

        def flush(self):
            pass

    monkeypatch.setattr("sys.stdout", Out())

    def gone(argv):
        raise BrokenPipeError
    try:
        assert clitools.run_command("demo", gone, []) == 141
        os.write(fd, b"late output")
    finally:
        os.close(fd)
    assert target.read_bytes() == b""


def test_run_program_turns_a_closed_pipe_at_the_last_flush_or_in_system_exit_into_141(monkeypatch):
    """run_program flushes inside its guard: a BrokenPipeError of the final flush (after a normal return or after
    argparse's SystemExit) is the quiet 141; another SystemExit keeps its code."""
    flushes = []

    class Gone:
        def fileno(self):
            return 1

        def flush(self):
            flushes.append(1)
            raise BrokenPipeError

    monkeypatch.setattr(clitools, "_quiet_stdout", lambda: None)
    monkeypatch.setattr("sys.stdout", Gone())
    assert clitools.run_program(lambda argv: 0, []) == 141

    def help_exit(argv):
        raise SystemExit(0)
    assert clitools.run_program(help_exit, []) == 141
    assert len(flushes) == 2
    monkeypatch.setattr("sys.stdout", type("Ok", (), {"flush": lambda self: None})())
    with pytest.raises(SystemExit) as exc:
        clitools.run_program(lambda argv: (_ for _ in ()).throw(SystemExit(2)), [])
    assert exc.value.code == 2
    assert clitools.run_program(lambda argv: 3, []) == 3
