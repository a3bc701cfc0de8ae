"""Embedding as docs/embedding.md documents it: a user's Cython extensions (the page's allocator and stream blocks, as
printed) built with the page's setup.py in a folder of their own against the paddle_rt under test (the installed
package in CI), then imported and run."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import package_parent
from conftest import REPO_ROOT

import paddle_rt


EMBEDDING_PAGE = os.path.join(REPO_ROOT, "docs", "embedding.md")


def _named_blocks():
    """{file name: code} of docs/embedding.md's blocks whose first line is a comment naming their file."""
    with open(EMBEDDING_PAGE, encoding="utf-8") as f:
        text = f.read()
    out = {}
    for lang, code in re.findall(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M):
        m = re.match(r"#\s*([\w.]+\.(?:pyx|py))\b", code)
        if lang in ("cython", "py") and m:
            out[m.group(1)] = code
    return out


def test_include_dirs_hold_every_header_the_pxd_files_include():
    """Every header named by a `cdef extern from` of an installed .pxd is found in get_include_dirs()."""
    core = os.path.join(os.path.dirname(paddle_rt.__file__), "_core")
    dirs = paddle_rt.get_include_dirs()
    assert paddle_rt.get_include() in dirs
    headers = set()
    for root, _, files in os.walk(core):
        for name in files:
            if name.endswith(".pxd"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    headers.update(re.findall(r'cdef extern from "([^"<>*]+/[^"<>*]+\.h)"', f.read()))
    assert "engine/alloc_containers.h" in headers
    for h in sorted(headers):
        assert any(os.path.exists(os.path.join(d, h)) for d in dirs), f"{h} is in none of {dirs}"


def test_embedding_page_names_the_embedding_files():
    blocks = _named_blocks()
    for name in ("setup.py", "alloc_ext.pyx", "stream_ext.pyx", "use_ext.py"):
        assert name in blocks, f"docs/embedding.md has no block starting '# {name}'"
    assert "get_include_dirs()" in blocks["setup.py"]


@pytest.mark.slow
def test_user_extension_builds_from_the_embedding_page_and_runs(tmp_path):
    if shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    pytest.importorskip("Cython")
    for name, code in _named_blocks().items():
        if name in ("setup.py", "alloc_ext.pyx", "stream_ext.pyx", "use_ext.py"):
            (tmp_path / name).write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PADDLE_RT_NO_RT_CPU", "PADDLE_RT_DEFAULT_DEVICE")}
    env["PYTHONPATH"] = package_parent()        # the paddle_rt under test, not the checkout's sources
    build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-4000:]
    run = subprocess.run([sys.executable, "use_ext.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    ptr, counted = run.stdout.split("\n")[:2]
    assert int(ptr, 16) != 0
    count, submitted = eval(counted)          # "(1000, N)": the C function ran 1000 times, in order
    assert count == 1000 and submitted >= 1000


@pytest.mark.slow
def test_a_second_build_compiles_nothing(tmp_path):
    """README, set-up: the second command does not compile again. A copy of the checkout's tracked files built twice
    (one extension with an engine source, `trace`): the second build compiles nothing and keeps the library."""
    from conftest import REPO_ROOT

    if not os.path.exists(os.path.join(REPO_ROOT, ".git")) or shutil.which("git") is None:
        pytest.skip("needs the checkout's git metadata")
    pytest.importorskip("Cython")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if os.path.isfile(os.path.join(REPO_ROOT, rel)):
            os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
            shutil.copy2(os.path.join(REPO_ROOT, rel), tmp_path / rel)
    env = dict(os.environ, PADDLE_RT_ONLY="trace")
    env.pop("PADDLE_RT_SANITIZE", None)

    def build():
        res = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        return res.stdout + res.stderr

    first = build()
    assert "trace_state.cpp" in first
    (lib,) = (tmp_path / "paddle_rt" / "_core").glob("trace.*.so")
    before = lib.stat().st_mtime_ns
    second = build()
    assert "trace_state.cpp" not in second and "trace.cpp" not in second and "Cythonizing" not in second
    assert lib.stat().st_mtime_ns == before
