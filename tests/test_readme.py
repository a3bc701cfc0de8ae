"""The README's examples run as written, so the documentation stays true.

Each ```python block of README.md is a whole program: it is saved on its own in a temporary folder outside the
checkout and run there in a fresh interpreter (the paddle_rt under test on its path, nothing else of the checkout), and
a failure names the block by its first line and its line in the README. Blocks that are not meant to run alone are
written as ```py (for instance a script for `mpiexec`) and ```cython (built by tests/test_embedding.py)."""
import os
import re
import sys

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def readme_blocks(lang):
    """[(README line of the block's first code line, code)] of every fenced block tagged ``lang``."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in _FENCE.finditer(text) if m.group(1) == lang]


def first_line(code):
    return next((ln.strip() for ln in code.splitlines() if ln.strip()), "")


def _clean_env():
    """The environment of a new user: no plugin search paths or default device from this test run; the paddle_rt under
    test (the installed package, or the checkout's in-place build) importable, and nothing else of the checkout."""
    from conftest import package_parent

    env = {k: v for k, v in os.environ.items()
           if k not in ("PADDLE_RT_NO_RT_CPU", "CUSTOM_DEVICE_ROOT", "PADDLE_RT_PLUGIN_PATH", "PADDLE_RT_DEFAULT_DEVICE",
                        "PYTHONSTARTUP")}
    env["PYTHONPATH"] = package_parent()
    return env


BLOCKS = readme_blocks("python")


def test_readme_has_examples():
    assert len(BLOCKS) >= 6
    # every example is a whole program: it imports what it uses
    for line, code in BLOCKS:
        assert re.search(r"^(import|from) ", code, re.M), f"README line {line}: {first_line(code)!r} imports nothing"


# Pastes a file into Python's interactive console line by line, as a reader pasting the block into `python` would
# (an indented block must end with a blank line there); exit status 1 after any error.
PASTE = """\
import code, sys
class Console(code.InteractiveConsole):
    failed = False
    def showtraceback(self):
        self.failed = True
        super().showtraceback()
    def showsyntaxerror(self, filename=None, **kw):
        self.failed = True
        super().showsyntaxerror(filename)
console = Console()
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f.read().splitlines():
        console.push(line)
console.push("")
sys.exit(1 if console.failed else 0)
"""


def run_block(line, code, folder, how="script"):
    """Run one README block alone in a fresh interpreter started in ``folder``: as a script (``python example.py``)
    or pasted into the interactive interpreter (``how="pasted"``). Fails naming the block's first line."""
    import subprocess

    script = folder / "example.py"
    script.write_text(code, encoding="utf-8")
    argv = [sys.executable, str(script)]
    if how == "pasted":
        (folder / "paste.py").write_text(PASTE, encoding="utf-8")
        argv = [sys.executable, str(folder / "paste.py"), str(script)]
    res = subprocess.run(argv, cwd=folder, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (
        f"the README's python block at line {line}, starting {first_line(code)!r}, fails when run alone "
        f"({'pasted into the interpreter' if how == 'pasted' else 'as a script'}, exit {res.returncode}):\n"
        f"{res.stderr[-3000:]}")
    return res


@pytest.mark.parametrize("how", ["script", "pasted"])
@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{ln}" for ln, _ in BLOCKS])
def test_readme_example_runs_alone(line, code, how, tmp_path):
    """One block, alone, in a fresh interpreter started in an empty folder outside the checkout."""
    run_block(line, code, tmp_path, how)


def test_readme_failure_names_the_block(tmp_path, monkeypatch):
    """A broken example is reported by its first line (checked on a README of our own)."""
    fake = tmp_path / "README.md"
    fake.write_text("intro\n\n```python\nimport paddle_rt\nundefined_name\n```\n\n```py\nnot run\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "README", str(fake))
    blocks = readme_blocks("python")
    assert blocks == [(4, "import paddle_rt\nundefined_name\n")]
    for how in ("script", "pasted"):
        with pytest.raises(AssertionError, match=r"(?s)line 4, starting 'import paddle_rt'.*NameError"):
            run_block(*blocks[0], tmp_path, how)
    # the interactive interpreter needs a blank line after an indented block; a script does not
    run_block(1, "for i in range(2):\n    pass\nprint(i)\n", tmp_path, "script")
    with pytest.raises(AssertionError, match="SyntaxError"):
        run_block(1, "for i in range(2):\n    pass\nprint(i)\n", tmp_path, "pasted")


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


def test_unbuilt_source_folder_says_so(tmp_path):
    """The package's sources without their compiled core (a checkout that was never built, first on sys.path as
    `python -m` puts it) fail to import with a message that says so and how to run the installed package."""
    import shutil
    import subprocess

    import paddle_rt

    src = os.path.dirname(os.path.abspath(paddle_rt.__file__))
    shutil.copytree(src, tmp_path / "paddle_rt", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    res = subprocess.run([sys.executable, "-c", "import paddle_rt"], cwd=tmp_path, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert res.returncode != 0
    assert "compiled core is missing" in res.stderr and "paddle-rt demo" in res.stderr
    assert str(tmp_path / "paddle_rt") in res.stderr
