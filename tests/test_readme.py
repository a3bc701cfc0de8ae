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
