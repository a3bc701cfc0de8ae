"""Loading plugins (paddle_rt/_core/plugin.pyx): the InitPlugin handshake, validation errors, the registry and
discovery at import. Plugins are never unloaded and device types must be unique in a process, so every build here
uses its own DEVICE_TYPE; discovery runs in child processes with the environment set."""
import ctypes
import functools
import json
import os
import shutil

import pytest

import paddle_rt
from paddle_rt import (
    DuplicateDeviceTypeError, MissingEntryPointError, MissingHookError, NotASharedLibraryError, Plugin,
    PluginLoadError, PluginNotFoundError, PluginRefusedError, PluginVersionError,
)

REQUIRED = ("set_device", "get_device", "create_event", "record_event", "destroy_event", "synchronize_event",
            "device_memory_allocate", "device_memory_deallocate", "get_device_count", "get_device_list")


def dtype(name):
    """A DEVICE_TYPE define (the C string literal)."""
    return f'"{name}"'


def registry_snapshot():
    return [p.path for p in paddle_rt.list_plugins()], list(paddle_rt.device_types())


def refused_load(path, error):
    """Load path expecting error, whose message names the path; the registry is left as it was. Returns the error."""
    before = registry_snapshot()
    with pytest.raises(error) as info:
        paddle_rt.load_plugin(path)
    assert str(path) in str(info.value)
    assert registry_snapshot() == before
    return info.value


# -- the handshake and the Plugin object ------------------------------------------------------------------------------
def test_required_hooks_are_abi_order():
    assert tuple(paddle_rt.REQUIRED_HOOKS) == REQUIRED


@pytest.mark.smoke
def test_load_minimal_plugin(build_plugin):
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("tp_load")})
    p = paddle_rt.load_plugin(so)
    assert isinstance(p, Plugin)
    assert p.device_type == "tp_load"
    assert p.sub_device_type == "v1"
    assert p.version == (0, 1, 1)
    assert p.path == os.path.realpath(str(so))
    assert p.bundled is False
    # exactly the ten required hooks, in ABI table order
    assert set(p.capabilities) == set(REQUIRED)
    assert list(p.capabilities) == [h for h in paddle_rt.ALL_HOOKS if h in REQUIRED]
    assert "create_stream" in p.missing and "stream_add_callback" in p.missing
    assert "device_memory_stats" in p.missing and "async_memory_copy_h2d" in p.missing
    assert set(p.missing).isdisjoint(p.capabilities)
    assert set(p.missing) | set(p.capabilities) == set(paddle_rt.ALL_HOOKS)
    assert "tp_load" in paddle_rt.device_types()
    assert p in paddle_rt.list_plugins()
    assert p.has_hook("set_device") and not p.has_hook("create_stream")
    with pytest.raises(paddle_rt.InvalidArgument):
        p.has_hook("no_such_hook")
    assert "tp_load" in repr(p)


def test_plugin_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        Plugin()


def test_all_hooks_is_the_abi_table():
    hooks = list(paddle_rt.ALL_HOOKS)
    assert hooks[0] == "initialize" and hooks[-1] == "blas_axpby"
    assert len(hooks) == len(set(hooks))
    # every function-pointer field of C_DeviceInterface (1128 bytes: size + 5 x 8 reserved + 7 reserved_other)
    assert len(hooks) == (1128 - 8 - 5 * 64 - 56) // 8


def test_loading_the_same_file_twice_returns_the_same_plugin(build_plugin, tmp_path):
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("tp_twice")})
    p1 = paddle_rt.load_plugin(so)
    p2 = paddle_rt.load_plugin(str(so))
    assert p1 is p2
    link = tmp_path / "alias.so"
    os.symlink(so, link)
    assert paddle_rt.load_plugin(link) is p1
    assert paddle_rt.device_types().count("tp_twice") == 1


def test_plugin_version_above_host_is_accepted(build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_v900"), "VERSION_MAJOR": 9, "VERSION_MINOR": 0,
                                  "VERSION_PATCH": 0})
    p = paddle_rt.load_plugin(so)
    assert p.version == (9, 0, 0)


@pytest.mark.smoke
@pytest.mark.parametrize("version,accepted", [
    ((0, 1, 0), False), ((0, 0, 99), False), ((0, 0, 0), False),
    ((0, 1, 2), True), ((0, 2, 0), True), ((1, 0, 0), True),
    # Paddle's formula is major*10000 + minor*100 + patch >= 101, not a tuple comparison
    ((0, 0, 101), True),
])
def test_version_rule(build_plugin, version, accepted):
    name = "tp_ver_%d_%d_%d" % version
    so = build_plugin("variant", {"DEVICE_TYPE": dtype(name), "VERSION_MAJOR": version[0],
                                  "VERSION_MINOR": version[1], "VERSION_PATCH": version[2]})
    if accepted:
        assert paddle_rt.load_plugin(so).version == version
        return
    err = refused_load(so, PluginVersionError)
    number = version[0] * 10000 + version[1] * 100 + version[2]
    msg = str(err)
    assert "%d.%d.%d (%d)" % (*version, number) in msg
    assert "0.1.1 (101)" in msg
    assert err.plugin_version == version
    assert tuple(err.host_version) == (0, 1, 1)
    assert name not in paddle_rt.device_types()


# -- load errors ------------------------------------------------------------------------------------------------------
def test_error_types_are_plugin_load_errors():
    for cls in (PluginNotFoundError, NotASharedLibraryError, MissingEntryPointError, PluginVersionError,
                PluginRefusedError, MissingHookError, DuplicateDeviceTypeError):
        assert issubclass(cls, PluginLoadError)
    assert issubclass(PluginNotFoundError, FileNotFoundError)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere" / "absent.so"
    err = refused_load(path, PluginNotFoundError)
    assert err.path == str(path)


@pytest.mark.smoke
def test_text_file_named_so(tmp_path):
    path = tmp_path / "x.so"
    path.write_text("this is not a shared library\n")
    refused_load(path, NotASharedLibraryError)


def test_empty_file_and_directory(tmp_path):
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    with pytest.raises(NotASharedLibraryError):
        paddle_rt.load_plugin(empty)
    folder = tmp_path / "folder.so"
    folder.mkdir()
    with pytest.raises(NotASharedLibraryError) as info:
        paddle_rt.load_plugin(folder)
    assert str(folder) in str(info.value)


@pytest.mark.smoke
def test_library_without_init_plugin(build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_noentry"), "NO_ENTRY": None})
    err = refused_load(so, MissingEntryPointError)
    assert "InitPlugin" in str(err)


def test_ordinary_shared_library_is_not_a_plugin():
    # a real shared library without InitPlugin: one of Python's own extension modules
    import _ctypes

    with pytest.raises(MissingEntryPointError) as info:
        paddle_rt.load_plugin(_ctypes.__file__)
    assert _ctypes.__file__ in str(info.value)


def test_plugin_that_refuses(build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_refuse"), "REFUSE": None})
    err = refused_load(so, PluginRefusedError)
    assert "device_type" in str(err)
    assert "tp_refuse" not in paddle_rt.device_types()


@pytest.mark.smoke
@pytest.mark.parametrize("hook", REQUIRED)
def test_each_required_hook_missing(build_plugin, hook):
    name = f"tp_miss_{hook}"
    so = build_plugin("variant", {"DEVICE_TYPE": dtype(name), "MISSING": hook})
    err = refused_load(so, MissingHookError)
    assert err.hook == hook
    assert hook in str(err)
    assert name not in paddle_rt.device_types()


@pytest.mark.parametrize("first,second", [("get_device_list", "set_device"), ("device_memory_allocate",
                                                                              "record_event"),
                                          ("get_device_count", "device_memory_deallocate")])
def test_first_missing_hook_in_abi_order_is_named(build_plugin, first, second):
    # `second` comes before `first` in Paddle's order of checks, so it is the one named
    name = f"tp_miss2_{first}_{second}"
    so = build_plugin("variant", {"DEVICE_TYPE": dtype(name), "MISSING": first, "MISSING2": second})
    with pytest.raises(MissingHookError) as info:
        paddle_rt.load_plugin(so)
    assert info.value.hook == second


def test_optional_hook_missing_is_fine(build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_opt_missing"), "NULL_STREAMS": None,
                                  "MISSING": "query_stream"})
    p = paddle_rt.load_plugin(so)
    assert "query_stream" in p.missing and "create_stream" in p.capabilities


def test_plugin_that_memsets_the_interface_loads(build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_memset"), "MEMSET_IFACE": None, "WITH_INFO": None})
    p = paddle_rt.load_plugin(so)
    assert p.device_type == "tp_memset"
    assert set(REQUIRED) <= set(p.capabilities)
    assert "device_memory_stats" in p.capabilities


def test_host_passes_exact_sizes(build_plugin):
    """A plugin that insists on both sizes loads, and saw 96 / 1128 (Paddle's rule only needs one of them right;
    the macro side of that rule is tested in test_header.py)."""
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_strict"), "STRICT_SIZES": None})
    p = paddle_rt.load_plugin(so)
    assert p.device_type == "tp_strict"
    lib = ctypes.CDLL(str(so))
    assert ctypes.c_size_t.in_dll(lib, "tp_seen_params_size").value == 96
    assert ctypes.c_size_t.in_dll(lib, "tp_seen_interface_size").value == 1128


@pytest.mark.smoke
def test_duplicate_device_type(build_plugin):
    first = build_plugin("minimal", {"DEVICE_TYPE": dtype("tp_dup")})
    second = build_plugin("minimal", {"DEVICE_TYPE": dtype("tp_dup"), "NDEV": 2})
    p = paddle_rt.load_plugin(first)
    err = refused_load(second, DuplicateDeviceTypeError)
    msg = str(err)
    assert str(second) in msg and "tp_dup" in msg and p.path in msg
    assert err.device_type == "tp_dup"
    assert paddle_rt.load_plugin(first) is p


def test_duplicate_of_bundled_rt_cpu(build_plugin):
    if "rt_cpu" not in paddle_rt.device_types():
        pytest.fail("the bundled rt_cpu is not loaded (a broken build is a failure, not a skip)")
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("rt_cpu")})
    with pytest.raises(DuplicateDeviceTypeError):
        paddle_rt.load_plugin(so)
    assert paddle_rt.list_plugins()[0].bundled


def test_strong_reference_to_host_profiler_symbol(build_plugin, run_python):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_profsym"), "PROFILER_STRONG": None})
    # control: without paddle_rt's host library the plugin cannot even be opened
    res = run_python(f"import ctypes; ctypes.CDLL({str(so)!r})")
    assert res.returncode != 0
    assert "profiler_add_runtime_trace_event" in res.stderr
    # under paddle_rt it loads, and its InitPlugin call reached the host's function
    host = paddle_rt._core.plugin.load_host_symbols()
    host.paddle_rt_trace_event_count.restype = ctypes.c_ulong
    before = host.paddle_rt_trace_event_count(0)
    p = paddle_rt.load_plugin(so)
    assert p.device_type == "tp_profsym"
    assert host.paddle_rt_trace_event_count(0) == before + 1


@pytest.mark.smoke
def test_plugin_built_for_a_larger_layout(build_plugin):
    """A plugin from a newer ABI writes past today's 1128/96-byte blocks: the host gives it room, and ignores it."""
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_larger"), "WRITE_PAST": 512})
    p = paddle_rt.load_plugin(so)
    assert set(p.capabilities) == set(REQUIRED)


def test_sub_device_type_may_be_null(build_plugin):
    p = paddle_rt.load_plugin(build_plugin("variant", {"DEVICE_TYPE": dtype("tp_nosub"), "NO_SUB_TYPE": None}))
    assert p.sub_device_type == ""


def test_null_stream_plugin_loads(build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("tp_nullstream"), "NULL_STREAMS": None})
    p = paddle_rt.load_plugin(so)
    for hook in ("create_stream", "destroy_stream", "query_stream", "synchronize_stream", "stream_wait_event",
                 "synchronize_device"):
        assert hook in p.capabilities
    assert "stream_add_callback" in p.missing


def test_failed_load_can_be_retried_after_fix(build_plugin, tmp_path):
    """A path that failed is not cached as failed: once a good library is there, it loads."""
    path = tmp_path / "later.so"
    path.write_text("not yet")
    with pytest.raises(NotASharedLibraryError):
        paddle_rt.load_plugin(path)
    path.unlink()
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("tp_later")}), path)
    assert paddle_rt.load_plugin(path).device_type == "tp_later"


# -- discovery at import (child processes) ----------------------------------------------------------------------------
DISCOVER = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import paddle_rt
out = {
    "types": paddle_rt.device_types(),
    "paths": [p.path for p in paddle_rt.list_plugins()],
    "bundled": [p.bundled for p in paddle_rt.list_plugins()],
    "warnings": [(w.category.__name__, str(w.message)) for w in caught
                 if "paddle_rt" in str(w.message)],
}
try:
    out["current"] = repr(paddle_rt.get_device())
except Exception as exc:
    out["current_error"] = (type(exc).__name__, str(exc))
print("RESULT " + json.dumps(out))
"""


def discover(run_python, env, code=DISCOVER):
    base = {"CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_PLUGIN_PATH": None, "PADDLE_RT_NO_RT_CPU": None,
            "PADDLE_RT_DEFAULT_DEVICE": None}
    base.update(env)
    res = run_python(code, env=base)
    assert res.returncode == 0, res.stderr
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, res.stdout + res.stderr
    return json.loads(line[-1][len("RESULT "):])


def rt_cpu_built():
    return os.path.exists(paddle_rt._core.plugin.bundled_plugin_path())


def needs_rt_cpu(fn):
    """The bundled rt_cpu must be built: a missing librt_cpu.so fails the test (a broken build), it is not skipped."""
    def run(*args, **kwargs):
        assert rt_cpu_built(), f"the bundled rt_cpu is not built ({paddle_rt._core.plugin.bundled_plugin_path()})"
        return fn(*args, **kwargs)
    return functools.wraps(fn)(run)


@pytest.fixture
def plugin_root(build_plugin, tmp_path):
    """A CUSTOM_DEVICE_ROOT as Paddle would scan it: only '*.so' directly inside count."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_a")}), root / "a.so")
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_b")}), root / "libb.so")
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_ver")}), root / "c.so.1")
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_upper")}), root / "d.SO")
    (root / "sub").mkdir()
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_nested")}), root / "sub" / "e.so")
    (root / "notes.txt").write_text("ignored")
    return root


def test_discovery_in_custom_device_root(run_python, plugin_root):
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(plugin_root), "PADDLE_RT_NO_RT_CPU": "1"})
    assert out["types"] == ["disc_a", "disc_b"]
    assert out["paths"] == [str(plugin_root / "a.so"), str(plugin_root / "libb.so")]
    assert out["bundled"] == [False, False]
    assert out["warnings"] == []
    assert out["current"] == "disc_a:0"


@needs_rt_cpu
def test_discovery_order_rt_cpu_then_root_then_plugin_path(run_python, build_plugin, plugin_root, tmp_path):
    extra_dir = tmp_path / "extra"
    extra_dir.mkdir()
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_dir")}), extra_dir / "zz.so")
    single = build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_file")})
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(plugin_root),
                                "PADDLE_RT_PLUGIN_PATH": os.pathsep.join([str(single), str(extra_dir)])})
    assert out["types"] == ["rt_cpu", "disc_a", "disc_b", "disc_file", "disc_dir"]
    assert out["bundled"] == [True, False, False, False, False]
    # default device: index 0 of the first third-party plugin
    assert out["current"] == "disc_a:0"
    assert out["warnings"] == []


@needs_rt_cpu
def test_only_rt_cpu(run_python):
    out = discover(run_python, {})
    assert out["types"] == ["rt_cpu"]
    assert out["bundled"] == [True]
    assert out["current"] == "rt_cpu:0"


def test_no_plugin_at_all(run_python):
    out = discover(run_python, {"PADDLE_RT_NO_RT_CPU": "1"})
    assert out["types"] == []
    assert out["current_error"][0] == "DeviceError"


def test_default_device_from_environment(run_python, build_plugin, plugin_root):
    env = {"CUSTOM_DEVICE_ROOT": str(plugin_root), "PADDLE_RT_NO_RT_CPU": "1"}
    out = discover(run_python, dict(env, PADDLE_RT_DEFAULT_DEVICE="disc_b:0"))
    assert out["current"] == "disc_b:0"
    out = discover(run_python, dict(env, PADDLE_RT_DEFAULT_DEVICE="nope:0"))
    assert out["current_error"][0] == "DeviceError"
    assert "PADDLE_RT_DEFAULT_DEVICE" in out["current_error"][1] and "nope:0" in out["current_error"][1]
    out = discover(run_python, dict(env, PADDLE_RT_DEFAULT_DEVICE="disc_b:3"))
    assert out["current_error"][0] == "DeviceError"


def test_default_device_skips_plugins_without_devices(run_python, build_plugin, tmp_path):
    root = tmp_path / "r"
    root.mkdir()
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_zero"), "NDEV": 0}), root / "a0.so")
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_two"), "NDEV": 2}), root / "b2.so")
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(root), "PADDLE_RT_NO_RT_CPU": "1"})
    assert out["types"] == ["disc_zero", "disc_two"]
    assert out["current"] == "disc_two:0"


def test_bad_plugins_warn_at_discovery_and_import_still_works(run_python, build_plugin, tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "x.so").write_text("not a library")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("disc_noentry"), "NO_ENTRY": None}), root / "n.so")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("disc_old"), "VERSION_MINOR": 1, "VERSION_PATCH": 0}),
                root / "old.so")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("disc_miss"), "MISSING": "get_device"}),
                root / "miss.so")
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_good")}), root / "p_good.so")
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_good"), "NDEV": 3}), root / "q_dup.so")
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(root), "PADDLE_RT_NO_RT_CPU": "1"})
    assert out["types"] == ["disc_good"]
    assert out["paths"] == [str(root / "p_good.so")]
    assert out["current"] == "disc_good:0"
    warned = {}
    for category, message in out["warnings"]:
        assert category == "RuntimeWarning"
        for name in ("x.so", "n.so", "old.so", "miss.so", "q_dup.so"):
            if str(root / name) in message:
                warned[name] = message
    assert set(warned) == {"x.so", "n.so", "old.so", "miss.so", "q_dup.so"}, out["warnings"]
    assert "InitPlugin" in warned["n.so"]
    assert "0.1.0 (100)" in warned["old.so"]
    assert "get_device" in warned["miss.so"]
    assert "disc_good" in warned["q_dup.so"]
    assert len(out["warnings"]) == 5


def test_same_file_in_root_and_plugin_path_loads_once(run_python, plugin_root):
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(plugin_root), "PADDLE_RT_NO_RT_CPU": "1",
                                "PADDLE_RT_PLUGIN_PATH": str(plugin_root / "a.so")})
    assert out["types"] == ["disc_a", "disc_b"]
    assert out["warnings"] == []


def test_missing_entries_in_plugin_path_warn(run_python, tmp_path):
    missing = tmp_path / "gone.so"
    out = discover(run_python, {"PADDLE_RT_NO_RT_CPU": "1",
                                "PADDLE_RT_PLUGIN_PATH": os.pathsep.join(["", str(missing), ""])})
    assert out["types"] == []
    assert len(out["warnings"]) == 1 and str(missing) in out["warnings"][0][1]


def test_rt_cpu_can_be_disabled(run_python, plugin_root):
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(plugin_root), "PADDLE_RT_NO_RT_CPU": "1"})
    assert "rt_cpu" not in out["types"]
    assert not any(out["bundled"])


def test_plugins_module_after_a_bare_import(run_python):
    """Issue 27: the README's ``paddle_rt.plugins.rt_cpu_path()`` works after ``import paddle_rt`` alone (a fresh
    interpreter, so no test has imported paddle_rt.plugins before)."""
    res = run_python("""
        import sys, os
        import paddle_rt
        assert "paddle_rt.plugins" in sys.modules
        path = paddle_rt.plugins.rt_cpu_path()
        print(path, any(os.path.samefile(p.path, path) for p in paddle_rt.list_plugins()))
    """)
    assert res.returncode == 0, res.stderr
    path, loaded = res.stdout.split()
    assert os.path.isabs(path) and path.endswith("librt_cpu.so") and loaded == "True"


def test_empty_device_type_is_refused(build_plugin):
    so = build_plugin("minimal", {"DEVICE_TYPE": '""'})
    refused_load(so, PluginRefusedError)
    assert "" not in paddle_rt.device_types()


def test_concurrent_loads_of_one_file_give_one_plugin(build_plugin):
    import threading

    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("tp_concurrent")})
    results, errors = [], []
    barrier = threading.Barrier(8)

    def load():
        barrier.wait()
        try:
            results.append(paddle_rt.load_plugin(so))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert paddle_rt.device_types().count("tp_concurrent") == 1


def test_unreadable_custom_device_root_warns(run_python, tmp_path):
    missing = tmp_path / "no_such_folder"
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(missing), "PADDLE_RT_NO_RT_CPU": "1"})
    assert out["types"] == []
    assert len(out["warnings"]) == 1
    category, message = out["warnings"][0]
    assert category == "RuntimeWarning" and str(missing) in message


# -- the test plugins themselves, driven by a standalone C host (no paddle_rt) ----------------------------------------
STANDALONE_HOST = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <paddle_rt/device_ext.h>

#define CHECK(c) do { if (!(c)) { printf("FAIL line %d: %s\n", __LINE__, #c); return 1; } } while (0)

int main(int argc, char** argv) {
  (void)argc;
  void* dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  CHECK(dl != NULL);
  void (*init)(CustomRuntimeParams*) = (void (*)(CustomRuntimeParams*))dlsym(dl, "InitPlugin");
  long (*live_allocs)(void) = (long (*)(void))dlsym(dl, "tp_live_allocations");
  long (*live_events)(void) = (long (*)(void))dlsym(dl, "tp_live_events");
  long (*live_bytes)(void) = (long (*)(void))dlsym(dl, "tp_live_bytes");
  CHECK(init && live_allocs && live_events && live_bytes);
  static CustomRuntimeParams params;
  static C_DeviceInterface iface;
  params.size = sizeof params;
  params.interface = &iface;
  iface.size = sizeof iface;
  init(&params);
  CHECK(params.device_type && strcmp(params.device_type, "tp_standalone") == 0);
  CHECK(params.version.major == 0 && params.version.minor == 1 && params.version.patch == 1);
  CHECK(iface.create_stream == NULL && iface.stream_add_callback == NULL && iface.device_memory_stats == NULL);
  size_t n = 0, ids[8];
  CHECK(iface.get_device_count(&n) == C_SUCCESS && n == 2);
  CHECK(iface.get_device_list(ids) == C_SUCCESS && ids[0] == 3 && ids[1] == 4);
  struct C_Device_st dev = {4}, bad = {2}, got = {-1};
  CHECK(iface.set_device(&dev) == C_SUCCESS);
  CHECK(iface.get_device(&got) == C_SUCCESS && got.id == 4);
  CHECK(iface.set_device(&bad) == C_ERROR);
  void* p[16];
  for (int i = 0; i < 16; i++) {
    CHECK(iface.device_memory_allocate(&dev, &p[i], (size_t)i * 1000) == C_SUCCESS && p[i] != NULL);
    CHECK(((size_t)p[i] & 15) == 0);
    memset(p[i], 0xab, (size_t)i * 1000);
  }
  CHECK(live_allocs() == 16 && live_bytes() == 120000);
  CHECK(iface.device_memory_deallocate(&dev, p[3], 1) == C_ERROR);      /* wrong size */
  struct C_Device_st other = {3};
  CHECK(iface.device_memory_deallocate(&other, p[3], 3000) == C_ERROR); /* wrong device */
  void* huge = (void*)1;
  CHECK(iface.device_memory_allocate(&dev, &huge, (size_t)-1) == C_FAILED && huge == NULL);
  for (int i = 0; i < 16; i++) CHECK(iface.device_memory_deallocate(&dev, p[i], (size_t)i * 1000) == C_SUCCESS);
  CHECK(live_allocs() == 0 && live_bytes() == 0);
  C_Event e[4];
  for (int i = 0; i < 4; i++) CHECK(iface.create_event(&dev, &e[i]) == C_SUCCESS);
  CHECK(live_events() == 4);
  for (int i = 0; i < 4; i++) {
    CHECK(iface.record_event(&dev, NULL, e[i]) == C_SUCCESS);
    CHECK(iface.synchronize_event(&dev, e[i]) == C_SUCCESS);
    CHECK(iface.destroy_event(&dev, e[i]) == C_SUCCESS);
  }
  CHECK(live_events() == 0);
  CHECK(iface.record_event(&dev, NULL, NULL) == C_ERROR);
  printf("OK\n");
  dlclose(dl);
  return 0;
}
"""


def test_minimal_plugin_standalone(build_plugin, tmp_path):
    """The minimal plugin is correct on its own (so failures elsewhere are paddle_rt's): driven by a C host, every
    hook works, bad arguments give C_ERROR, and its counters return to zero; under valgrind if available."""
    import subprocess

    from conftest import include_dir

    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("tp_standalone"), "NDEV": 2, "DEVICE_ID_BASE": 3})
    src = tmp_path / "host.c"
    src.write_text(STANDALONE_HOST)
    exe = tmp_path / "host"
    sanitize = os.environ.get("PADDLE_RT_SANITIZE", "")  # then the plugin was built with it too (conftest)
    res = subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror", *([f"-fsanitize={sanitize}"] if sanitize else []),
                          f"-I{include_dir()}", str(src), "-o", str(exe), "-ldl"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    cmd = [str(exe), str(so)]
    if shutil.which("valgrind") and not sanitize:
        cmd = ["valgrind", "-q", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite",
               *cmd]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr


def test_default_device_initialises_only_the_chosen_plugin(run_python, build_plugin, tmp_path):
    """Choosing the default device (index 0 of the first third-party plugin) does not initialise the others."""
    root = tmp_path / "r"
    root.mkdir()
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_first")}), root / "a.so")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("disc_second"), "LIFECYCLE": None}), root / "b.so")
    log = tmp_path / "b.log"
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(root), "TP_LOG": str(log)})
    assert out["current"] == "disc_first:0"
    assert not log.exists() or log.read_text() == ""


def test_default_device_skips_a_plugin_that_fails_to_initialise(run_python, build_plugin, tmp_path):
    """A third-party plugin whose initialize() fails (no hardware...) must not make get_device() unusable."""
    root = tmp_path / "r"
    root.mkdir()
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("disc_broken"), "FAIL_INITIALIZE": None}),
                root / "a.so")
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("disc_fine")}), root / "b.so")
    out = discover(run_python, {"CUSTOM_DEVICE_ROOT": str(root)})
    assert out.get("current") == "disc_fine:0", out


# -- the same rules as real Paddle --------------------------------------------------------------------------------------
@pytest.mark.interop
def test_paddle_and_paddle_rt_accept_the_same_plugins(run_python, build_plugin, tmp_path):
    """One CUSTOM_DEVICE_ROOT, two hosts: real Paddle and paddle_rt load the same plugins (the good one, with the
    same device count) and reject the same ones (too old, a required hook missing, no InitPlugin)."""
    import importlib.util

    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    if os.environ.get("PADDLE_RT_SANITIZE"):
        pytest.skip("real Paddle itself is not clean under the sanitizer")
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(build_plugin("minimal", {"DEVICE_TYPE": dtype("tpi_good"), "NDEV": 2}), root / "a.so")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("tpi_old"), "VERSION_PATCH": 0}), root / "b.so")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("tpi_miss"), "MISSING": "get_device_list"}),
                root / "c.so")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("tpi_noentry"), "NO_ENTRY": None}), root / "d.so")
    shutil.copy(build_plugin("variant", {"DEVICE_TYPE": dtype("tpi_memset"), "MEMSET_IFACE": None}), root / "e.so")
    env = {"CUSTOM_DEVICE_ROOT": str(root), "PADDLE_RT_NO_RT_CPU": "1", "PADDLE_RT_PLUGIN_PATH": None,
           "GLOG_minloglevel": "3"}
    res = run_python("""
    import paddle
    # Paddle spells a type's only device without an index ("t" rather than "t:0")
    print("RESULT", sorted(d if ":" in d else d + ":0" for d in paddle.device.get_available_custom_device()))
    """, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    paddle_devices = res.stdout.split("RESULT ", 1)[1].strip()
    res = run_python("""
    import warnings
    warnings.simplefilter("ignore")
    import paddle_rt
    print("RESULT", sorted(repr(d) for d in paddle_rt.devices()))
    """, env=env)
    assert res.returncode == 0, res.stderr
    ours = res.stdout.split("RESULT ", 1)[1].strip()
    assert paddle_devices == ours == str(["tpi_good:0", "tpi_good:1", "tpi_memset:0"])
