"""paddle_rt/_core/engine/: the C++ engines are real headers and sources. Every header compiles on its own with
-Wall -Wextra -Werror (the sources are built that way by setup.py); no .pxd under includes/ carries C++ of its own;
and the process state has exactly one owner: only the extension that links an engine's state source defines it."""
import glob
import os
import shutil
import subprocess
import sysconfig

import pytest

import paddle_rt

CORE = os.path.join(os.path.dirname(os.path.abspath(paddle_rt.__file__)), "_core")
HEADERS = sorted(glob.glob(os.path.join(CORE, "engine", "*.h")))


def test_headers_are_installed():
    names = {os.path.basename(h) for h in HEADERS}
    assert {"clock.h", "stream_core.h", "event_core.h", "alloc_containers.h", "trace_buffer.h", "atomics.h",
            "ccl_support.h", "obj_freelist.h", "dlpack.h", "python_thread.h"} <= names


@pytest.mark.parametrize("header", [os.path.basename(h) for h in HEADERS])
def test_header_compiles_alone_with_warnings_as_errors(header, tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++")
    tu = tmp_path / "tu.cpp"
    tu.write_text(f'#include <Python.h>\n#include "engine/{header}"\nint main() {{ return 0; }}\n')
    res = subprocess.run([gxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                          f"-I{sysconfig.get_paths()['include']}", f"-I{CORE}",
                          f"-I{os.path.join(os.path.dirname(CORE), 'include')}", str(tu)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_no_cpp_left_in_pxd_strings():
    for pxd in glob.glob(os.path.join(CORE, "includes", "*.pxd")):
        with open(pxd, encoding="utf-8") as f:
            text = f.read()
        assert 'extern from *' not in text, f"{pxd} still carries C/C++ in a verbatim block"


@pytest.mark.parametrize("symbol,owner", [("prt_streams_idle", "stream"), ("prt_ccl_defer", "ccl"),
                                          ("prt_trace_pending_frames", "trace"), ("prt_objfl_install", "pool")])
def test_state_is_defined_in_one_extension(symbol, owner):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    owners = []
    for so in glob.glob(os.path.join(CORE, "*.so")):
        out = subprocess.run([nm, "-C", "--defined-only", so], capture_output=True, text=True).stdout
        if any(line.split(" ", 2)[-1].startswith(symbol + "(") for line in out.splitlines() if " T " in line):
            owners.append(os.path.basename(so).split(".")[0])
    assert owners == [owner], owners
