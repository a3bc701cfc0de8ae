"""The README's Python examples run as written (on rt_cpu), so the documentation stays true."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
# The tour loads a vendor plugin that does not exist here; the example stands in the bundled one for it.
VENDOR_LINE = 'p = paddle_rt.load_plugin("/opt/vendor/libnpu_runtime.so")'


def python_blocks():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_has_examples():
    assert len(python_blocks()) >= 4


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_example_runs(index, run_python, tmp_path):
    block = python_blocks()[index]
    if VENDOR_LINE in block:
        block = block.replace(VENDOR_LINE, "p = paddle_rt.list_plugins()[0]")
    # examples that write files (the profiler's trace.json) write them into a temporary folder
    code = f"import os; os.chdir({str(tmp_path)!r})\nimport paddle_rt\n" + block
    res = run_python(code, env={"PADDLE_RT_NO_RT_CPU": None, "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_PLUGIN_PATH": None,
                                "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, f"README example {index} failed:\n{block}\n{res.stderr}"


def test_demo_command_runs(run_python):
    """README command 1's main job: `python -m paddle_rt demo` walks through every layer on rt_cpu."""
    res = run_python("import sys, paddle_rt.__main__ as m; sys.exit(m.main(['demo']))",
                     env={"PADDLE_RT_NO_RT_CPU": None, "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_PLUGIN_PATH": None,
                          "PADDLE_RT_DEFAULT_DEVICE": None}, timeout=300)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for section in ("== plugins", "== devices", "== memory", "== streams", "== collectives", "demo finished"):
        assert section in out
    assert "every rank now holds [3.0, 3.0]" in out
    assert "(caused by ValueError)" in out


def test_cli_lists_commands_and_rejects_unknown(run_python):
    res = run_python("import sys, paddle_rt.__main__ as m; sys.exit(m.main(['nope']))")
    assert res.returncode == 2
    assert "unknown command 'nope'" in res.stderr
    for cmd in ("demo", "info", "replay", "check", "plot", "bench"):
        assert cmd in res.stdout


def test_unbuilt_source_folder_says_so(tmp_path):
    """The package's sources without their compiled core (a checkout that was never built, first on sys.path as
    `python -m` puts it) fail to import with a message that says so and how to run the installed package."""
    import shutil
    import subprocess
    import sys

    import paddle_rt

    src = os.path.dirname(os.path.abspath(paddle_rt.__file__))
    shutil.copytree(src, tmp_path / "paddle_rt", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    res = subprocess.run([sys.executable, "-c", "import paddle_rt"], cwd=tmp_path, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert res.returncode != 0
    assert "compiled core is missing" in res.stderr and "paddle-rt demo" in res.stderr
    assert str(tmp_path / "paddle_rt") in res.stderr
