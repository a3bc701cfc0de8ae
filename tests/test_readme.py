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
def test_readme_example_runs(index, run_python):
    block = python_blocks()[index]
    if VENDOR_LINE in block:
        block = block.replace(VENDOR_LINE, "p = paddle_rt.list_plugins()[0]")
    res = run_python("import paddle_rt\n" + block, env={"PADDLE_RT_NO_RT_CPU": None, "CUSTOM_DEVICE_ROOT": None,
                                                        "PADDLE_RT_PLUGIN_PATH": None,
                                                        "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, f"README example {index} failed:\n{block}\n{res.stderr}"
