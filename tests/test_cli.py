"""The command line as a user runs it: the installed `paddle-rt` command (or `python -m paddle_rt` when the package
under test is the checkout's in-place build), started in a folder of the user's own, with relative paths.

The `--help` texts are asserted here: the program named as invoked, every command with a line, every option of a
command with its default; a wrong command or option is one line and exit status 2."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, package_parent

COMMANDS = ("demo", "info", "replay", "capture", "check", "plot", "bench")
# Options each command's --help must list, with the default it must state (None: an option without a value).
OPTIONS = {
    "demo": {},
    "info": {"--json": None},
    "replay": {"--device": "the current device", "--conf": None, "--baselines": None, "--no-min-capacity": None,
               "--json": None, "--strict": None, "--plot": None, "--progress": None, "--no-progress": None, "--reserve": "0",
               "--async": None, "--api": "malloc with --async, both with --loader", "--delay-us": "20",
               "--loader": None},
    "capture": {"--output": None},
    "check": {"--json": None, "--timeout": "20", "--only": None, "--list": None, "--strict": None},
    "plot": {"--output": None, "--device": None, "--conf": None, "--title": None, "--progress": None},
    "bench": {"--quick": None, "--json": None, "--only": "every area", "--list": None, "--strict": None},
}


def cli():
    """(argv prefix, program name) of the command under test: the console script installed beside this Python when
    the paddle_rt under test is an installed one, else ``python -m paddle_rt``; the program calls itself
    ``paddle-rt`` either way (one name in every message)."""
    script = os.path.join(os.path.dirname(sys.executable), "paddle-rt")
    if os.path.exists(script) and os.path.realpath(package_parent()) != os.path.realpath(REPO_ROOT):
        return [script], "paddle-rt"
    return [sys.executable, "-m", "paddle_rt"], "paddle-rt"


def run_cli(args, cwd, timeout=300, env=None):
    argv, _ = cli()
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("PADDLE_RT_NO_RT_CPU", "CUSTOM_DEVICE_ROOT", "PADDLE_RT_PLUGIN_PATH",
                              "PADDLE_RT_DEFAULT_DEVICE", "COLUMNS")}
    child_env["PYTHONPATH"] = package_parent()
    child_env.update(env or {})
    return subprocess.run(argv + list(args), cwd=cwd, env=child_env, capture_output=True, text=True,
                          timeout=timeout)


def test_help_names_the_program_and_lists_each_command(tmp_path):
    _, prog = cli()
    res = run_cli(["--help"], tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"usage: {prog} COMMAND [OPTIONS...]"
    for cmd in COMMANDS:
        (line,) = [ln for ln in lines if ln.split()[:1] == [cmd]]
        assert len(line.split()) > 3, f"{cmd} has no description: {line!r}"
    assert f"`{prog} COMMAND --help`" in res.stdout
    assert run_cli([], tmp_path).stdout == res.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_lists_options_with_defaults(command, tmp_path):
    _, prog = cli()
    res = run_cli([command, "--help"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert " ".join(res.stdout.split()).startswith(f"usage: {prog} {command} ")
    entries = option_entries(res.stdout)
    for option, default in OPTIONS[command].items():
        assert option in entries, f"{command} --help does not list {option}"
        if default is not None:
            assert f"(default: {default}" in entries[option], \
                f"{command} --help does not state the default of {option}: {entries[option]!r}"


def option_entries(help_text):
    """{option: its help entry, lines joined} of an argparse --help text."""
    entries, current = {}, None
    for line in help_text.split("options:", 1)[1].splitlines():
        text = line.strip()
        if text.startswith("-"):
            current = []
            for word in text.split("  ")[0].split(", "):
                entries[word.split()[0]] = current
        if current is not None and text:
            current.append(text)
    return {k: " ".join(v) for k, v in entries.items()}


@pytest.mark.parametrize("args,what", [(["nope"], "unknown command 'nope'"), (["--nope"], "unknown option '--nope'"),
                                       (["bench", "--nope"], "unrecognized arguments: --nope"),
                                       (["replay"], "give one TRACE or --corpus DIR"),
                                       (["check", "--timeout", "soon"], "invalid float value: 'soon'")])
def test_wrong_command_or_option_is_one_line_and_exit_2(args, what, tmp_path):
    _, prog = cli()
    res = run_cli(args, tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"{prog}") and what in line and "--help" in line


def write_log(path, events):
    """An RMM allocation log: events are (action, pointer, size)."""
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for i, (act, ptr, size) in enumerate(events):
            f.write(f"0,{i},{act},{ptr:#x},{size},0\n")


def test_tools_take_relative_paths_from_any_folder(tmp_path):
    """replay (with its min-capacity probes, run in child processes), plot and check, from a folder of the user's,
    with relative paths; bench from there too."""
    sub = tmp_path / "logs"
    sub.mkdir()
    write_log(sub / "small.csv", [("allocate", 0x10, 3 << 20), ("allocate", 0x20, 1 << 20), ("free", 0x10, 3 << 20),
                                  ("allocate", 0x30, 2 << 20)])
    res = run_cli(["replay", os.path.join("logs", "small.csv"), "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["events"] == 4 and out["min_capacity"] >= 3 << 20
    res = run_cli(["replay", "small.csv", "--no-min-capacity"], sub)
    assert res.returncode == 0 and "small.csv on rt_cpu" in res.stdout, res.stderr
    res = run_cli(["replay", str(sub / "small.csv"), "--no-min-capacity"], "/")       # absolute, from elsewhere
    assert res.returncode == 0, res.stderr

    pytest.importorskip("matplotlib")
    res = run_cli(["plot", os.path.join("logs", "small.csv"), "-o", os.path.join("logs", "small.png")], tmp_path)
    assert res.returncode == 0, res.stderr
    assert (sub / "small.png").stat().st_size > 0

    import paddle_rt.plugins

    shutil.copy(paddle_rt.plugins.rt_cpu_path(), sub / "librt_copy.so")
    res = run_cli(["check", os.path.join("logs", "librt_copy.so"), "--only", "allocate_free", "--json"], tmp_path,
                  env={"PADDLE_RT_NO_RT_CPU": "1"})
    assert res.returncode == 0, res.stderr
    assert {r["name"]: r["result"] for r in json.loads(res.stdout)}["allocate_free"] == "pass"

    res = run_cli(["bench", "--list"], sub)
    assert res.returncode == 0 and "allocator" in res.stdout.split(), res.stderr


def test_trace_that_does_not_fit_is_a_result_line(tmp_path):
    write_log(tmp_path / "huge.csv", [("allocate", 0x10, 4096), ("allocate", 0x20, 1 << 62), ("free", 0x10, 4096)])
    res = run_cli(["replay", "huge.csv"], tmp_path)
    assert res.returncode == 3, res.stderr
    assert "Traceback" not in res.stderr
    (line,) = res.stdout.strip().splitlines()
    assert line.startswith("huge.csv on rt_cpu:0: does not fit: line 3 asks for 4611686018427387904 B with ")
    assert " B free" in line
    res = run_cli(["replay", "huge.csv", "--json"], tmp_path)
    assert res.returncode == 3 and json.loads(res.stdout)["line"] == 3
    # the line is the file's, blank lines counted
    (tmp_path / "gaps.csv").write_text((tmp_path / "huge.csv").read_text().replace("\n0,", "\n\n0,"))
    res = run_cli(["replay", "gaps.csv"], tmp_path)
    assert res.returncode == 3 and ": does not fit: line 5 asks for 4611686018427387904 B" in res.stdout


def test_replay_on_a_file_that_is_not_a_log(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\nworld\n")
    res = run_cli(["replay", "notes.txt"], tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert "notes.txt is not an RMM allocation log" in line
    assert "Thread,Time,Action,Pointer,Size,Stream" in line      # what to give instead


def test_check_on_a_file_that_is_not_a_library(tmp_path):
    (tmp_path / "plugin.c").write_text("int x;\n")
    res = run_cli(["check", "plugin.c"], tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert "plugin.c is not a shared library" in line and "give the plugin's shared library" in line


def test_newcomer_errors_say_what_to_do_next(tmp_path):
    """A wrong device string and a plugin that does not load: one line each, naming the next step."""
    import paddle_rt

    with pytest.raises(paddle_rt.DeviceError) as exc:
        paddle_rt.device("cuda:0")
    msg = str(exc.value)
    assert "\n" not in msg and "unknown device type 'cuda'" in msg
    assert "'rt_cpu:0'" in msg and "paddle_rt.load_plugin(path)" in msg
    with pytest.raises(paddle_rt.DeviceError, match=r"use rt_cpu:0 to rt_cpu:\d+"):
        paddle_rt.device("rt_cpu:99")
    with pytest.raises(paddle_rt.PluginNotFoundError) as exc:
        paddle_rt.load_plugin(str(tmp_path / "libnpu_runtime.so"))
    assert "\n" not in str(exc.value) and "give the path of the plugin's shared library" in str(exc.value)
    (tmp_path / "notes.so").write_text("not a library")
    with pytest.raises(paddle_rt.NotASharedLibraryError) as exc:
        paddle_rt.load_plugin(str(tmp_path / "notes.so"))
    assert "\n" not in str(exc.value) and "compiled shared library" in str(exc.value)


@pytest.mark.parametrize("args", [["bench", "--only", "llm"], []])
def test_python_m_in_an_unbuilt_checkout_is_one_line(tmp_path, args):
    """`python -m paddle_rt ...` at the top of a checkout that was never built imports its sources (-m puts the
    current folder first on sys.path): one line naming the installed command with the same arguments, exit status 2,
    no ImportError traceback (`bench --only llm`, which looks for examples/ under the current folder, gave one)."""
    import paddle_rt

    src = os.path.dirname(os.path.abspath(paddle_rt.__file__))
    shutil.copytree(src, tmp_path / "paddle_rt", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    res = subprocess.run([sys.executable, "-m", "paddle_rt", *args], cwd=tmp_path, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    line = res.stderr.strip()
    assert line.startswith(f"python -m paddle_rt: {tmp_path / 'paddle_rt'} is paddle_rt's source folder without its "
                           "compiled core")
    assert f"`{' '.join(['paddle-rt', *args])}`" in line and "build_ext --inplace" in line
