"""Shared fixtures: test plugins compiled on demand, and child Python processes for other plugin configurations.

    def test_x(build_plugin, run_python):
        so = build_plugin("variant", {"DEVICE_TYPE": '"v_x"', "WITH_INFO": None})   # None -> plain -DWITH_INFO
        res = run_python(f"import paddle_rt; print(paddle_rt.load_plugin({str(so)!r}).device_type)",
                         env={"PADDLE_RT_NO_RT_CPU": "1"})
        assert res.returncode == 0, res.stderr

The test plugins live in tests/plugins/ (see the comment at the top of each source for its switches).
"""
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

# mutmut's coverage pass (docs/testing.md) runs the tests in this process with MUTANT_UNDER_TEST=stats; a child
# process (the CLI, run_python) inheriting it would try to record coverage without mutmut's configuration and fail.
# mutmut keeps the value in this process too, so the variable is dropped from the environment children inherit.
# While a mutant runs, the variable stays: children run the mutant, and a test through the CLI can kill it.
if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    del os.environ["MUTANT_UNDER_TEST"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_SOURCES = os.path.join(REPO_ROOT, "tests", "plugins")
# The workload traces: RMM allocation logs of real PyTorch workloads that some tests and benchmarks replay (docs/tools.md,
# "Trace files"). They are not in the repository: $PADDLE_RT_TRACES names their folder, else shared/traces beside the
# checkout. Tests that need them skip with TRACES_MISSING.
TRACES = os.environ.get("PADDLE_RT_TRACES") or os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "traces"))
TRACES_MISSING = (f"the workload traces are not in {TRACES}: set PADDLE_RT_TRACES to the folder holding them "
                  "(docs/tools.md, 'Trace files')")
skip_without_traces = pytest.mark.skipif(not os.path.exists(os.path.join(TRACES, "resnet18_train.csv.gz")),
                                         reason=TRACES_MISSING)


def _package_under_test():
    """The folder of the paddle_rt these tests import. Stops the run at once when that package has no compiled core:
    the checkout's unbuilt sources shadowing the installed package (``python -m pytest`` from the checkout without
    ``python setup.py build_ext --inplace``) would otherwise fail in every test with an unrelated ImportError."""
    try:
        import paddle_rt
    except ImportError as exc:
        pytest.exit(f"paddle_rt does not import ({exc}); install it (pip install '.[test]') or build it in place "
                    "(python setup.py build_ext --inplace)", returncode=4)
    folder = os.path.dirname(os.path.abspath(paddle_rt.__file__))
    try:
        import paddle_rt._core.allocator  # noqa: F401  (a compiled module: present only in a built package)
    except ImportError as exc:
        pytest.exit(f"the paddle_rt under test ({folder}) is not built: {exc}. Run the tests against the installed "
                    "package (`pytest`, not `python -m pytest`, from the checkout) or build the checkout in place "
                    "first (python setup.py build_ext --inplace)", returncode=4)
    return folder


def pytest_configure(config):
    config._paddle_rt_folder = _package_under_test()


def pytest_report_header(config):
    return f"paddle_rt under test: {config._paddle_rt_folder}"


def include_dir():
    """paddle_rt's include folder: from the package if it imports, else the source tree."""
    try:
        import paddle_rt

        return paddle_rt.get_include()
    except Exception:
        return os.path.join(REPO_ROOT, "paddle_rt", "include")


def _define_args(defines):
    args = []
    for key, value in sorted((defines or {}).items()):
        args.append(f"-D{key}" if value is None else f"-D{key}={value}")
    return args


def _cache_key(name, defines):
    return name, tuple(sorted((k, None if v is None else str(v)) for k, v in (defines or {}).items()))


class PluginBuilder:
    """build(name, defines=None) -> pathlib.Path of tests/plugins/<name>.c compiled into a shared library.

    ``defines`` maps macro names to values, passed verbatim as -DNAME=value (a value None gives -DNAME); string
    macros need their quotes, e.g. {"DEVICE_TYPE": '"x"'}. Builds are cached by (name, defines) for the session.
    The file is named <name>-<hash of the defines>.so so that builds never overwrite each other (a loaded plugin
    stays mapped) and discovery (which wants a '.so' suffix) finds them."""

    def __init__(self, outdir):
        self.outdir = outdir
        self._cache = {}
        self._lock = threading.Lock()

    def __call__(self, name, defines=None):
        key = _cache_key(name, defines)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            compiler = shutil.which(os.environ.get("CC", "gcc"))
            if compiler is None:
                pytest.skip("no C compiler (gcc) to build the test plugins")
            src = os.path.join(PLUGIN_SOURCES, f"{name}.c")
            if not os.path.exists(src):
                raise FileNotFoundError(src)
            tag = hashlib.sha1(repr(key[1]).encode()).hexdigest()[:10]
            out = self.outdir / f"{name}-{tag}.so"
            sanitize = os.environ.get("PADDLE_RT_SANITIZE", "")  # same switch as setup.py
            extra = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"] if sanitize else []
            cmd = [compiler, "-std=gnu11", "-O1", "-g", "-Wall", "-Werror", "-shared", "-fPIC", "-pthread", *extra,
                   f"-I{include_dir()}", *_define_args(defines), src, "-o", str(out)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"building test plugin failed: {' '.join(cmd)}\n{res.stderr}")
            self._cache[key] = out
            return out


@pytest.fixture(scope="session", autouse=True)
def pin_default_device():
    """Decide the test process's default device once, before any test loads a test plugin with load_plugin(), so that
    every test file sees the same default (rt_cpu:0 unless the environment says otherwise) whatever order the tests
    run in."""
    try:
        import paddle_rt

        paddle_rt.get_device()
    except Exception:
        pass  # no plugin at all: tests that need a device report it themselves
    yield


@pytest.fixture(scope="session")
def build_plugin(tmp_path_factory):
    return PluginBuilder(tmp_path_factory.mktemp("plugins"))


def package_parent():
    """The folder from which the paddle_rt under test is imported: the installed package in CI (``pip install .``),
    the checkout when developing with an in-place build."""
    import paddle_rt

    return os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))


def run_python_code(code, env=None, timeout=120):
    """Run ``code`` (dedented) in a child ``sys.executable`` that imports the same paddle_rt as the tests (its parent
    folder is the cwd and first on PYTHONPATH) with ``env`` merged over os.environ (a value None removes
    the variable). Returns the CompletedProcess (text mode, stdout/stderr captured)."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = str(value)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=package_parent(), env=child_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def run_python():
    return run_python_code


def mpiexec_or_skip():
    """The mpiexec of the mpi extra (MPICH's, beside sys.executable when not on PATH); skips the test without it."""
    import shutil
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (pip install \".[mpi]\")")
    exe = shutil.which("mpiexec") or shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("mpiexec is not on PATH (pip install \".[mpi]\" brings MPICH's)")
    return exe
