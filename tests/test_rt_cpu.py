"""The bundled rt_cpu plugin, exercised directly (independent of paddle_rt's Cython layers).

Most checks live in the C driver tests/c/rt_cpu_driver.c, which dlopens librt_cpu.so like a host, runs InitPlugin and
drives every hook; pytest compiles it and runs it in child processes, one per environment configuration (the plugin
reads its environment once per process). The driver is also what runs under valgrind (the `smoke` test below).
A few checks use ctypes in a child Python process: loading into a host that exports no profiler functions (like
real Paddle), the symbol table, and the Python wrappers in paddle_rt.plugins.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import importlib.util

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The paddle_rt under test (installed, or the in-place build in development), located without importing it.
PACKAGE_DIR = os.path.dirname(importlib.util.find_spec("paddle_rt").origin)
PLUGINS_INIT = os.path.join(PACKAGE_DIR, "plugins", "__init__.py")


def _load_plugins_module():
    """paddle_rt.plugins loaded from its file, so these tests do not depend on the rest of paddle_rt importing."""
    spec = importlib.util.spec_from_file_location("_rt_cpu_plugins_under_test", PLUGINS_INIT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plugins = _load_plugins_module()
DRIVER_SOURCE = os.path.join(REPO_ROOT, "tests", "c", "rt_cpu_driver.c")
INCLUDE = os.path.join(PACKAGE_DIR, "include")

# every RT_CPU_* variable is cleared in the children unless a test sets it
RT_CPU_VARS = [
    "RT_CPU_DEVICE_COUNT", "RT_CPU_MEMORY_BYTES", "RT_CPU_MIN_CHUNK", "RT_CPU_EXTRA_PADDING",
    "RT_CPU_FAIL_ALLOC_EVERY", "RT_CPU_FAIL_ALLOC_AFTER", "RT_CPU_FAIL_HOST_ALLOC_EVERY", "RT_CPU_OOM_NULL",
    "RT_CPU_STREAM_DELAY_US", "RT_CPU_MAX_STREAMS", "RT_CPU_CCL_TIMEOUT_MS", "RT_CPU_VERBOSE",
]


def child_env(env=None):
    e = dict(os.environ)
    for k in RT_CPU_VARS:
        e.pop(k, None)
    for k, v in (env or {}).items():
        e[k] = str(v)
    return e


@pytest.fixture(scope="session")
def plugin_path():
    path = plugins.rt_cpu_path()
    if not os.path.exists(path):
        pytest.fail(f"rt_cpu is not built ({path}); run: PADDLE_RT_ONLY=librt_cpu python setup.py build_ext --inplace")
    return path


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        pytest.skip("no C compiler (gcc) to build the rt_cpu test driver")
    out = tmp_path_factory.mktemp("rt_cpu_driver") / "rt_cpu_driver"
    sanitize = os.environ.get("PADDLE_RT_SANITIZE", "")  # the plugin is built with it too: match it
    extra = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"] if sanitize else []
    cmd = [compiler, "-std=gnu11", "-O1", "-g", "-Wall", "-Werror", "-pthread", "-rdynamic", *extra,
           f"-I{INCLUDE}", DRIVER_SOURCE, "-o", str(out), "-ldl", "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building the driver failed: {' '.join(cmd)}\n{res.stderr}")
    return str(out)


def run_driver(driver, plugin_path, tests, env=None, prefix=(), timeout=300):
    res = subprocess.run([*prefix, driver, plugin_path, *tests], env=child_env(env), capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"driver {tests} env={env}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert lines and all(ln.endswith(": ok") for ln in lines), res.stdout
    return res


# ---------------------------------------------------------------------------------------------------- C driver

def test_default_configuration_all_hooks(driver, plugin_path):
    """Handshake, devices, every copy kind and memset with content checks, bad frees, handles, refcounted
    initialize/finalize, stream order, events, callbacks, blas_axpby, profiler, threads; live bytes back to 0."""
    res = run_driver(driver, plugin_path, ["all"])
    names = [ln.split(":")[0] for ln in res.stdout.splitlines()]
    for expected in ("handshake", "devices", "memory", "handles", "refcount", "stream_order", "events", "blas",
                     "profiler", "threads", "ccl_reductions", "ccl_data_movement", "ccl_threads", "ccl_two_comms", "ccl_group_exit"):
        assert expected in names


def test_stream_order_with_delay(driver, plugin_path):
    """Under RT_CPU_STREAM_DELAY_US the stream is visibly busy: query_stream/query_event report C_FAILED without
    blocking, and work still runs in submission order; stream_wait_event orders two streams."""
    run_driver(driver, plugin_path, ["stream_order", "events", "threads"], {"RT_CPU_STREAM_DELAY_US": 2000})


@pytest.mark.parametrize("oom_null", [0, 1])
def test_capacity(driver, plugin_path, oom_null):
    run_driver(driver, plugin_path, ["capacity"], {"RT_CPU_MEMORY_BYTES": 1048576, "RT_CPU_OOM_NULL": oom_null})


def test_capacity_with_suffix(driver, plugin_path):
    run_driver(driver, plugin_path, ["capacity"], {"RT_CPU_MEMORY_BYTES": "1M", "EXPECT_RT_CPU_MEMORY_BYTES": 1048576})


@pytest.mark.parametrize("oom_null", [0, 1])
def test_fail_alloc_every(driver, plugin_path, oom_null):
    run_driver(driver, plugin_path, ["fail_every"], {"RT_CPU_FAIL_ALLOC_EVERY": 3, "RT_CPU_OOM_NULL": oom_null})


def test_fail_alloc_after_and_host_faults(driver, plugin_path):
    run_driver(driver, plugin_path, ["fail_after"], {"RT_CPU_FAIL_ALLOC_AFTER": 2, "RT_CPU_FAIL_HOST_ALLOC_EVERY": 2})


def test_max_streams(driver, plugin_path):
    run_driver(driver, plugin_path, ["max_streams"], {"RT_CPU_MAX_STREAMS": 2})


@pytest.mark.parametrize("env", [
    {"RT_CPU_DEVICE_COUNT": 5, "RT_CPU_MIN_CHUNK": 4096, "RT_CPU_EXTRA_PADDING": 64},
    {"RT_CPU_DEVICE_COUNT": 1 + 1, "RT_CPU_MIN_CHUNK": 1000, "RT_CPU_MEMORY_BYTES": 64 << 20},
    {"RT_CPU_DEVICE_COUNT": 64, "RT_CPU_MIN_CHUNK": 512, "RT_CPU_EXTRA_PADDING": 32},
])
def test_configurations(driver, plugin_path, env):
    run_driver(driver, plugin_path, ["devices", "memory", "handles"], env)


@pytest.mark.parametrize("name,value,default", [
    ("RT_CPU_DEVICE_COUNT", "0", 2),
    ("RT_CPU_DEVICE_COUNT", "two", 2),
    ("RT_CPU_DEVICE_COUNT", "65", 2),
    ("RT_CPU_MIN_CHUNK", "abc", 256),
    ("RT_CPU_MIN_CHUNK", "0", 256),
    ("RT_CPU_EXTRA_PADDING", "-1", 0),
    ("RT_CPU_EXTRA_PADDING", "12x", 0),
])
def test_bad_environment_falls_back_with_a_message(driver, plugin_path, name, value, default):
    res = run_driver(driver, plugin_path, ["devices"], {name: value, f"EXPECT_{name}": default})
    assert f"rt_cpu: ignoring {name}='{value}'" in res.stderr
    assert f"default {default}" in res.stderr


def test_bad_memory_bytes_falls_back(driver, plugin_path):
    res = run_driver(driver, plugin_path, ["memory"], {"RT_CPU_MEMORY_BYTES": "lots", "RT_CPU_STREAM_DELAY_US": "x"})
    assert "RT_CPU_MEMORY_BYTES='lots'" in res.stderr
    assert "RT_CPU_STREAM_DELAY_US='x'" in res.stderr


def test_verbose_prints_configuration(driver, plugin_path):
    res = run_driver(driver, plugin_path, ["handshake"], {"RT_CPU_VERBOSE": 1, "RT_CPU_DEVICE_COUNT": 3})
    assert "rt_cpu: devices=3" in res.stderr


@pytest.mark.smoke
def test_driver_under_valgrind(driver, plugin_path):
    if os.environ.get("PADDLE_RT_SANITIZE"):
        pytest.skip("the plugin is built with a sanitizer: valgrind does not run sanitized binaries")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    prefix = [valgrind, "-q", "--error-exitcode=1", "--leak-check=full", "--errors-for-leak-kinds=definite,possible"]
    run_driver(driver, plugin_path, ["all"], prefix=prefix, timeout=600)
    run_driver(driver, plugin_path, ["stream_order", "events", "capacity", "ccl_timeout"],
               {"RT_CPU_STREAM_DELAY_US": 500, "RT_CPU_MEMORY_BYTES": 1048576, "RT_CPU_CCL_TIMEOUT_MS": 300},
               prefix=prefix, timeout=600)


@pytest.mark.smoke
def test_driver_smoke(driver, plugin_path):
    """The same driver without valgrind (under ASan when the build is sanitized)."""
    run_driver(driver, plugin_path, ["all"])


# ---------------------------------------------------------------------------------------------------- collectives

@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_collectives(driver, plugin_path, ranks):
    """all_reduce/reduce/reduce_scatter for every reducible type and op (in place too), broadcast, all_gather,
    send/recv rings in groups, all_to_all with uneven counts, ranks as threads on streams or synchronous; one rank
    per rt_cpu device."""
    run_driver(driver, plugin_path, ["ccl_reductions", "ccl_data_movement", "ccl_threads", "ccl_two_comms"],
               {"RT_CPU_DEVICE_COUNT": ranks, "RT_CPU_CCL_TIMEOUT_MS": 20000})


def test_collectives_with_slow_streams(driver, plugin_path):
    run_driver(driver, plugin_path, ["ccl_data_movement", "ccl_threads"],
               {"RT_CPU_DEVICE_COUNT": 3, "RT_CPU_STREAM_DELAY_US": 300})


@pytest.mark.parametrize("ranks", [2, 4])
def test_collective_timeout_and_mismatch(driver, plugin_path, ranks):
    """A rank whose peers never come returns C_ERROR after RT_CPU_CCL_TIMEOUT_MS (synchronously) or marks its
    communicator in error (on a stream, which then goes on); mismatched counts fail on every rank; destroying a
    communicator with queued work is safe."""
    res = run_driver(driver, plugin_path, ["ccl_timeout"], {"RT_CPU_DEVICE_COUNT": ranks, "RT_CPU_CCL_TIMEOUT_MS": 200})
    assert "peers did not join within 200 ms" in res.stderr


# ---------------------------------------------------------------------------------------------------- ctypes

CTYPES_PRELUDE = """
import ctypes, sys
path = sys.argv[1]
lib = ctypes.CDLL(path)
PARAMS_SIZE, IFACE_SIZE = 96, 1128
params = ctypes.create_string_buffer(PARAMS_SIZE)
iface = ctypes.create_string_buffer(IFACE_SIZE)
ctypes.c_size_t.from_buffer(params, 0).value = PARAMS_SIZE
ctypes.c_void_p.from_buffer(params, 8).value = ctypes.addressof(iface)
ctypes.c_size_t.from_buffer(iface, 0).value = IFACE_SIZE
lib.InitPlugin.argtypes = [ctypes.c_void_p]
lib.InitPlugin.restype = None
lib.InitPlugin(ctypes.addressof(params))

class Dev(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int)]

def hook(offset, *argtypes):
    addr = ctypes.c_void_p.from_buffer(iface, offset).value
    assert addr, f"hook at offset {offset} is NULL"
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(addr)

P = ctypes.c_void_p
initialize = hook(8)
finalize = hook(16)
device_memory_allocate = hook(216, ctypes.POINTER(Dev), ctypes.POINTER(P), ctypes.c_size_t)
device_memory_deallocate = hook(224, ctypes.POINTER(Dev), P, ctypes.c_size_t)
host_memory_allocate = hook(240, ctypes.POINTER(Dev), ctypes.POINTER(P), ctypes.c_size_t)
host_memory_deallocate = hook(248, ctypes.POINTER(Dev), P, ctypes.c_size_t)
profiler_initialize = hook(824, P, ctypes.POINTER(P))
profiler_finalize = hook(832, P, P)
profiler_start = hook(848, P, P)
profiler_stop = hook(856, P, P)
profiler_collect = hook(864, P, ctypes.c_uint64, P)
device_type = ctypes.c_char_p.from_buffer(params, 40).value
"""


def run_ctypes(plugin_path, body, env=None):
    code = textwrap.dedent(CTYPES_PRELUDE) + textwrap.dedent(body)
    res = subprocess.run([sys.executable, "-c", code, plugin_path, PLUGINS_INIT], env=child_env(env), capture_output=True,
                         text=True, timeout=120, cwd=REPO_ROOT)
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res


def test_loads_without_host_profiler_symbols(plugin_path):
    """A plain Python process exports no profiler_add_* functions (like real Paddle): the plugin still loads, and a
    full profiler session reports nothing instead of crashing."""
    run_ctypes(plugin_path, """
        assert device_type == b"rt_cpu", device_type
        assert initialize() == 0
        ud = P()
        assert profiler_initialize(None, ctypes.byref(ud)) == 0 and ud.value
        assert profiler_start(None, ud) == 0
        assert profiler_stop(None, ud) == 0
        assert profiler_collect(None, 0, ud) == 0
        assert profiler_finalize(None, ud) == 0
        assert profiler_finalize(None, ud) == 3
        assert finalize() == 0
        print("ok")
    """)


def test_no_undefined_strong_symbols_outside_libc(plugin_path):
    """Real Paddle dlopens the plugin RTLD_NOW: every undefined symbol must come from the C runtime or be weak."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--undefined-only", plugin_path], capture_output=True, text=True, check=True).stdout
    strong = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        if kind in ("w", "v"):
            continue
        if "@GLIBC" in name or name.startswith("__asan") or name.startswith("__tsan") or name.startswith("__ubsan"):
            continue
        strong.append(name)
    assert strong == [], f"undefined strong symbols: {strong}"
    assert "profiler_add_runtime_trace_event" in out  # referenced, weakly
    exported = subprocess.run([nm, "-D", "--defined-only", plugin_path], capture_output=True, text=True,
                              check=True).stdout.split()
    for name in ("InitPlugin", "rt_cpu_live_bytes", "rt_cpu_live_count", "rt_cpu_host_live_bytes",
                 "rt_cpu_initialize_refcount", "rt_cpu_alloc_calls"):
        assert name in exported
    # internals stay hidden
    assert "h_device_memory_allocate" not in exported and "rt_stream_get" not in exported


def test_python_wrappers(plugin_path):
    assert os.path.isabs(plugins.rt_cpu_path())
    assert os.path.basename(plugins.rt_cpu_path()) == "librt_cpu.so"
    assert os.path.exists(os.path.join(plugins.rt_cpu_source_dir(), "rt_cpu.c"))
    with pytest.raises(ValueError):
        plugins.rt_cpu_live_bytes(-1)
    # the wrappers read the same loaded instance that the host drives (CDLL on the same path)
    run_ctypes(plugin_path, """
        import importlib.util
        spec = importlib.util.spec_from_file_location("plugins_mod", sys.argv[2])
        plugins = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plugins)
        assert plugins.rt_cpu_path() == path
        d0, d1 = Dev(0), Dev(1)
        assert plugins.rt_cpu_initialize_refcount() == 0
        assert initialize() == 0
        assert plugins.rt_cpu_initialize_refcount() == 1
        calls0 = plugins.rt_cpu_alloc_calls(1)
        p, q, h = P(), P(), P()
        assert device_memory_allocate(ctypes.byref(d1), ctypes.byref(p), 1000) == 0
        assert device_memory_allocate(ctypes.byref(d1), ctypes.byref(q), 24) == 0
        assert device_memory_allocate(ctypes.byref(d1), ctypes.byref(q), 0) == 3
        assert plugins.rt_cpu_alloc_calls(1) == calls0 + 3
        assert plugins.rt_cpu_live_bytes(1) == 1024 and plugins.rt_cpu_live_count(1) == 2
        assert plugins.rt_cpu_live_bytes(0) == 0
        assert plugins.rt_cpu_live_bytes(1000) == 0
        assert host_memory_allocate(ctypes.byref(d0), ctypes.byref(h), 300) == 0
        assert plugins.rt_cpu_host_live_bytes() == 300
        assert host_memory_deallocate(ctypes.byref(d0), h, 300) == 0
        assert plugins.rt_cpu_host_live_bytes() == 0
        assert device_memory_deallocate(ctypes.byref(d1), p, 999) == 3
        assert device_memory_deallocate(ctypes.byref(d1), p, 1000) == 0
        assert plugins.rt_cpu_live_bytes(1) == 24
        assert finalize() == 0
        assert plugins.rt_cpu_live_bytes(1) == 0 and plugins.rt_cpu_live_count(1) == 0
        assert plugins.rt_cpu_initialize_refcount() == 0
        print("ok")
    """)


def test_sources_listed_for_packaging():
    src = plugins.rt_cpu_source_dir()
    files = sorted(os.listdir(src))
    assert "rt_cpu.c" in files and "rt_cpu_internal.h" in files
