"""Devices (paddle_rt/_core/device.pyx): naming and resolving devices, the current device per thread, synchronize,
memory info, properties, the ordered teardown at exit, and the ``info`` command. In-process tests use test plugins
with their own device types; configurations read from the environment (rt_cpu's device count, the default device)
run in child processes."""
import json
import pickle
import re
import subprocess
import sys
import threading

import ctypes
import pytest

import paddle_rt
from paddle_rt import Device, DeviceError, PluginError

from conftest import package_parent


def dtype(name):
    return f'"{name}"'


@pytest.fixture(autouse=True)
def restore_current_device():
    """Tests here change the main thread's current device; give it back so other test files are unaffected."""
    saved = paddle_rt.get_device()
    yield
    paddle_rt.set_device(saved)


@pytest.fixture(scope="module")
def td_min(build_plugin):
    """Two devices, only the ten required hooks."""
    return paddle_rt.load_plugin(build_plugin("minimal", {"DEVICE_TYPE": dtype("td_min"), "NDEV": 2}))


@pytest.fixture(scope="module")
def td_info(build_plugin):
    """Three devices with physical ids 5, 6, 7 and every information hook."""
    return paddle_rt.load_plugin(build_plugin("variant", {"DEVICE_TYPE": dtype("td_info"), "NDEV": 3,
                                                          "DEVICE_ID_BASE": 5, "WITH_INFO": None}))


def plugin_lib(plugin):
    lib = ctypes.CDLL(plugin.path)
    lib.tp_current_device.restype = ctypes.c_int
    lib.tp_set_device_calls.restype = ctypes.c_long
    return lib


# -- naming devices ----------------------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_device_from_string_and_pair(td_min):
    d1 = paddle_rt.device("td_min:1")
    assert isinstance(d1, Device)
    assert d1.type == "td_min" and d1.index == 1 and d1.plugin is td_min
    assert repr(d1) == "td_min:1" and str(d1) == "td_min:1"
    assert paddle_rt.device("td_min", 1) is d1
    assert paddle_rt.device("td_min:1") is d1
    assert paddle_rt.device(" td_min:1 ") is d1
    assert paddle_rt.device(d1) is d1
    assert paddle_rt.device("td_min") is paddle_rt.device("td_min:0")
    assert paddle_rt.device("td_min:0") is not d1


def test_device_from_int_uses_current_type(td_min):
    paddle_rt.set_device("td_min:0")
    assert paddle_rt.device(1) is paddle_rt.device("td_min:1")
    with pytest.raises(DeviceError) as info:
        paddle_rt.device(2)
    assert "2" in str(info.value) and "td_min" in str(info.value)


def test_device_none_is_current(td_min):
    paddle_rt.set_device("td_min:1")
    assert paddle_rt.device() is paddle_rt.device("td_min:1")
    assert paddle_rt.device(None) is paddle_rt.get_device()


def test_device_constructor_is_not_public():
    with pytest.raises(TypeError):
        Device()


def test_device_pickles_to_the_same_object(td_min):
    d = paddle_rt.device("td_min:1")
    assert pickle.loads(pickle.dumps(d)) is d


@pytest.mark.smoke
@pytest.mark.parametrize("spec", ["td_min:x", "nope:0", "td_min:-1", "td_min:", "td_min:1.5", ":0", "td_min:0:1",
                                  "rt_cpu:x", "rt_cpu:-1"])
def test_bad_device_strings(td_min, spec):
    with pytest.raises(DeviceError) as info:
        paddle_rt.device(spec)
    assert isinstance(info.value, ValueError)
    assert spec in str(info.value)


@pytest.mark.parametrize("spec", [1.5, b"td_min:0", True, ("td_min", 0), object()])
def test_bad_device_objects(td_min, spec):
    with pytest.raises(DeviceError):
        paddle_rt.device(spec)


@pytest.mark.parametrize("args", [("td_min:0", 1), ("td_min", -1), ("td_min", "1"), (0, 1)])
def test_bad_type_index_pairs(td_min, args):
    with pytest.raises(DeviceError):
        paddle_rt.device(*args)


def test_index_out_of_range_names_the_count(td_min, td_info):
    for spec, count in (("td_min:2", 2), ("td_min:99", 2), ("td_info:3", 3)):
        with pytest.raises(DeviceError) as info:
            paddle_rt.device(spec)
        msg = str(info.value)
        assert re.search(rf"\b{count} device", msg), msg
        assert spec.split(":")[0] in msg
    with pytest.raises(DeviceError):
        paddle_rt.device("td_min", 2)


def test_plugin_without_devices(build_plugin):
    p = paddle_rt.load_plugin(build_plugin("minimal", {"DEVICE_TYPE": dtype("td_zero"), "NDEV": 0}))
    assert p.device_count() == 0
    assert paddle_rt.device_count("td_zero") == 0
    assert paddle_rt.devices("td_zero") == []
    with pytest.raises(DeviceError) as info:
        paddle_rt.device("td_zero:0")
    assert re.search(r"\b0 device", str(info.value))


def test_devices_and_device_count(td_min, td_info):
    assert paddle_rt.device_count("td_min") == 2
    assert paddle_rt.device_count("td_info") == 3
    assert [repr(d) for d in paddle_rt.devices("td_info")] == ["td_info:0", "td_info:1", "td_info:2"]
    all_devices = paddle_rt.devices()
    # every plugin's devices, in plugin load order, each once
    expected = [paddle_rt.device(p.device_type, i) for p in paddle_rt.list_plugins()
                for i in range(p.device_count())]
    assert all_devices == expected
    assert len(set(map(id, all_devices))) == len(all_devices)
    paddle_rt.set_device("td_info:1")
    assert paddle_rt.device_count() == 3
    with pytest.raises(DeviceError) as info:
        paddle_rt.devices("nope")
    assert "nope" in str(info.value)
    with pytest.raises(DeviceError):
        paddle_rt.device_count("nope")


def test_physical_ids_come_from_the_device_list(td_info):
    assert [d.id for d in paddle_rt.devices("td_info")] == [5, 6, 7]
    lib = plugin_lib(td_info)
    paddle_rt.set_device("td_info:2")
    assert lib.tp_current_device() == 7
    paddle_rt.set_device("td_info:0")
    assert lib.tp_current_device() == 5
    assert paddle_rt.device("td_info:2").properties["physical_id"] == 7


# -- the current device ------------------------------------------------------------------------------------------------
def test_set_device_accepts_every_form(td_min):
    assert paddle_rt.set_device("td_min:1") is paddle_rt.device("td_min:1")
    assert paddle_rt.get_device() is paddle_rt.device("td_min:1")
    assert paddle_rt.set_device(0) is paddle_rt.device("td_min:0")
    d = paddle_rt.device("td_min:1")
    assert paddle_rt.set_device(d) is d
    assert paddle_rt.get_device() is d


def test_set_device_reaches_the_plugin(td_min):
    lib = plugin_lib(td_min)
    calls = lib.tp_set_device_calls()
    paddle_rt.set_device("td_min:1")
    assert lib.tp_current_device() == 1
    assert lib.tp_set_device_calls() > calls


def test_bad_set_device_leaves_current_unchanged(td_min):
    paddle_rt.set_device("td_min:1")
    for bad in ("td_min:2", "nope:0", "td_min:x", None.__class__):
        with pytest.raises(DeviceError):
            paddle_rt.set_device(bad)
        assert paddle_rt.get_device() is paddle_rt.device("td_min:1")


@pytest.mark.smoke
def test_current_device_is_per_thread(td_min):
    default = paddle_rt._core.device._initial_device()
    paddle_rt.set_device("td_min:1")
    lib = plugin_lib(td_min)
    seen = {}

    def worker():
        try:
            seen["start"] = paddle_rt.get_device()
            paddle_rt.set_device("td_min:0")
            seen["after"] = paddle_rt.get_device()
            seen["plugin"] = lib.tp_current_device()
        except BaseException as exc:  # pragma: no cover - reported below
            seen["error"] = exc

    t = threading.Thread(target=worker)
    t.start()
    t.join(60)
    assert "error" not in seen, seen.get("error")
    assert seen["start"] is default
    assert seen["after"] is paddle_rt.device("td_min:0")
    assert seen["plugin"] == 0
    # the main thread is unaffected, in paddle_rt and in the plugin's thread-local state
    assert paddle_rt.get_device() is paddle_rt.device("td_min:1")
    assert lib.tp_current_device() == 1


def test_devices_are_the_same_objects_across_threads(td_min):
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(paddle_rt.device("td_min:1"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 8 and all(d is paddle_rt.device("td_min:1") for d in seen)


FAILING_DEVICE = """
import json, paddle_rt
out = {"start": repr(paddle_rt.set_device(%(t)r + ":0"))}
for attempt in range(2):   # not marked ready after a failure: it fails again, the same way
    try:
        paddle_rt.set_device(%(t)r + ":1")
        out[attempt] = None
    except paddle_rt.PluginError as exc:
        out[attempt] = [exc.device, exc.call, exc.status, str(exc)]
    out["current%%d" %% attempt] = repr(paddle_rt.get_device())
print("RESULT " + json.dumps(out))
"""


@pytest.mark.smoke
@pytest.mark.parametrize("switch,call", [("FAIL_INIT_DEVICE", "init_device"), ("FAIL_SET_DEVICE", "set_device")])
def test_failing_device_leaves_current_unchanged(run_python, build_plugin, switch, call):
    """Run in a child (a device that cannot be used would upset other test files iterating over all devices)."""
    name = "td_" + switch.lower()
    so = build_plugin("variant", {"DEVICE_TYPE": dtype(name), "NDEV": 2, switch: 1})
    res = run_python(FAILING_DEVICE % {"t": name}, env={"PADDLE_RT_PLUGIN_PATH": str(so), "CUSTOM_DEVICE_ROOT": None,
                                                       "PADDLE_RT_NO_RT_CPU": "1", "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.split("RESULT ", 1)[1])
    assert out["start"] == f"{name}:0"
    for attempt in ("0", "1"):
        device, failed_call, status, message = out[attempt]
        assert device == f"{name}:1" and failed_call == call and status == 3
        assert f"{name}:1" in message and call in message
        assert out["current" + attempt] == f"{name}:0"


BROKEN_PLUGIN = """
import json, paddle_rt
out = {}
for attempt in range(2):   # a failure leaves nothing half-initialised: the second attempt fails the same way
    try:
        paddle_rt.device_count(%(t)r)
        out[attempt] = None
    except paddle_rt.PluginError as exc:
        out[attempt] = [exc.device, exc.call, exc.status, str(exc)]
try:
    paddle_rt.device(%(t)r + ":0")
except paddle_rt.PluginError as exc:
    out["device"] = exc.call
out["rt_cpu"] = repr(paddle_rt.set_device("rt_cpu:0"))
out["types"] = paddle_rt.device_types()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("switch,call,text", [
    ("FAIL_INITIALIZE", "initialize", "C_ERROR"),
    ("FAIL_DEVICE_COUNT", "get_device_count", "C_ERROR"),
    ("HUGE_DEVICE_COUNT", "get_device_count", "returned 1099511627776 devices"),
    ("FAIL_DEVICE_LIST", "get_device_list", "C_ERROR"),
])
def test_plugin_failing_to_initialise(run_python, build_plugin, switch, call, text):
    """Run in a child: a plugin that cannot initialise stays registered, and every use raises PluginError naming the
    call; other plugins keep working."""
    if "rt_cpu" not in paddle_rt.device_types():
        pytest.skip("the bundled rt_cpu is not loaded")
    name = "td_broken_" + switch.lower()
    so = build_plugin("variant", {"DEVICE_TYPE": dtype(name), "NDEV": 2, switch: None})
    res = run_python(BROKEN_PLUGIN % {"t": name}, env={"PADDLE_RT_PLUGIN_PATH": str(so), "CUSTOM_DEVICE_ROOT": None,
                                                      "PADDLE_RT_NO_RT_CPU": None,
                                                      "PADDLE_RT_DEFAULT_DEVICE": "rt_cpu:0"})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.split("RESULT ", 1)[1])
    for attempt in ("0", "1"):
        device, failed_call, status, message = out[attempt]
        assert name in device
        assert failed_call == call
        assert name in message and call in message and text in message
    assert out["device"] == call
    assert out["rt_cpu"] == "rt_cpu:0"
    assert name in out["types"]


def test_concurrent_first_use_initialises_once(run_python, build_plugin, tmp_path):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("td_race"), "NDEV": 2, "LIFECYCLE": None})
    log = tmp_path / "race.log"
    code = """
    import threading, paddle_rt
    barrier = threading.Barrier(8)
    errors = []
    def use(i):
        barrier.wait()
        try:
            paddle_rt.set_device("td_race:%d" % (i % 2))
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print("RESULT", errors)
    """
    res = run_python(code, env={"PADDLE_RT_PLUGIN_PATH": str(so), "PADDLE_RT_NO_RT_CPU": "1", "TP_LOG": str(log),
                                "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("RESULT ", 1)[1].strip() == "[]"
    lines = log.read_text().splitlines()
    assert lines.count("initialize") == 1
    assert lines.count("init_device 0") == 1 and lines.count("init_device 1") == 1
    assert lines.count("finalize") == 1 and lines[-1] == "finalize"


# -- synchronize, memory, properties -----------------------------------------------------------------------------------
def test_synchronize_without_synchronize_device(td_min):
    assert "synchronize_device" in td_min.missing
    paddle_rt.device("td_min:1").synchronize()
    paddle_rt.synchronize("td_min:0")
    paddle_rt.set_device("td_min:1")
    paddle_rt.synchronize()


def test_synchronize_with_noop_streams(build_plugin):
    """A plugin whose streams are NULL handles (no-ops): the device's synchronize still waits for the work paddle_rt
    queued on its streams."""
    paddle_rt.load_plugin(build_plugin("variant", {"DEVICE_TYPE": dtype("td_nullstream"), "NULL_STREAMS": None}))
    dev = paddle_rt.device("td_nullstream:0")
    s = paddle_rt.Stream(dev)
    gate, ran = threading.Event(), []
    s.add_callback(lambda: (gate.wait(30), ran.append("callback")))
    threading.Timer(0.05, gate.set).start()
    dev.synchronize()
    assert ran == ["callback"]          # synchronize returned after the queued work, not before
    s.close()


def test_memory_info_without_stats_is_zero(td_min):
    assert paddle_rt.device("td_min:0").memory_info() == (0, 0)


@pytest.mark.smoke
def test_memory_info_from_stats(td_info):
    free, total = paddle_rt.device("td_info:1").memory_info()
    assert total == 1 << 30
    assert 0 <= free <= total


@pytest.mark.smoke
def test_properties_report_what_the_plugin_implements(td_info, td_min):
    props = paddle_rt.device("td_info:1").properties
    expected = {
        "compute_capability": 75, "runtime_version": 12030, "driver_version": 53500, "multi_process": 8,
        "max_threads_per_mp": 2048, "max_threads_per_block": 1024, "min_chunk_size": 512, "extra_padding_size": 32,
        "float16_supported": True, "bfloat16_supported": False, "dnn_supported": True,
    }
    for key, value in expected.items():
        assert props[key] == value, key
    assert tuple(props["max_grid_dim_size"]) == (2147483647, 65535, 65535)
    for key in ("max_chunk_size", "max_alloc_size", "init_alloc_size", "realloc_size"):
        assert key not in props  # not implemented by this plugin
    bare = paddle_rt.device("td_min:0").properties
    assert isinstance(bare, dict)
    for key in list(expected) + ["max_grid_dim_size"]:
        assert key not in bare, key


def test_rt_cpu_devices_in_process():
    if "rt_cpu" not in paddle_rt.device_types():
        pytest.skip("the bundled rt_cpu is not loaded")
    n = paddle_rt.device_count("rt_cpu")
    assert n >= 1
    d = paddle_rt.device("rt_cpu:0")
    assert d.plugin.bundled and repr(d) == "rt_cpu:0"
    assert paddle_rt.device("rt_cpu", 0) is d
    free, total = d.memory_info()
    assert total > 0 and 0 <= free <= total
    props = d.properties
    assert props["min_chunk_size"] >= 1 and "compute_capability" in props
    d.synchronize()
    with pytest.raises(DeviceError) as info:
        paddle_rt.device("rt_cpu", n)
    assert re.search(rf"\b{n} device", str(info.value))


RT_CPU_COUNT = """
import json, paddle_rt
n = paddle_rt.device_count("rt_cpu")
devs = paddle_rt.devices("rt_cpu")
out = {"n": n, "devices": [repr(d) for d in devs], "memory": [d.memory_info() for d in devs],
       "current": repr(paddle_rt.get_device()), "default_count": paddle_rt.device_count()}
try:
    paddle_rt.device("rt_cpu:%d" % n)
except paddle_rt.DeviceError as exc:
    out["error"] = str(exc)
paddle_rt.set_device("rt_cpu:%d" % (n - 1))
out["set"] = repr(paddle_rt.get_device())
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("count", [2, 4])
def test_rt_cpu_device_count_from_environment(run_python, count):
    if "rt_cpu" not in paddle_rt.device_types():
        pytest.skip("the bundled rt_cpu is not loaded")
    res = run_python(RT_CPU_COUNT, env={"RT_CPU_DEVICE_COUNT": count, "PADDLE_RT_NO_RT_CPU": None,
                                        "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_PLUGIN_PATH": None,
                                        "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.split("RESULT ", 1)[1])
    assert out["n"] == count and out["default_count"] == count
    assert out["devices"] == [f"rt_cpu:{i}" for i in range(count)]
    assert all(total > 0 and 0 <= free <= total for free, total in out["memory"])
    assert out["current"] == "rt_cpu:0"
    assert f"rt_cpu:{count}" in out["error"] or re.search(rf"\b{count} device", out["error"])
    assert re.search(rf"\b{count} device", out["error"])
    assert out["set"] == f"rt_cpu:{count - 1}"


def test_new_threads_start_on_the_default_device_from_environment(run_python, build_plugin):
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("td_envdefault"), "NDEV": 3})
    code = """
    import threading, paddle_rt
    main = repr(paddle_rt.get_device())
    paddle_rt.set_device("td_envdefault:0")
    seen = []
    t = threading.Thread(target=lambda: seen.append(repr(paddle_rt.get_device())))
    t.start(); t.join()
    print("RESULT", main, seen[0], repr(paddle_rt.get_device()))
    """
    res = run_python(code, env={"PADDLE_RT_PLUGIN_PATH": str(so), "PADDLE_RT_DEFAULT_DEVICE": "td_envdefault:2",
                                "CUSTOM_DEVICE_ROOT": None})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("RESULT ", 1)[1].split() == ["td_envdefault:2", "td_envdefault:2", "td_envdefault:0"]


def test_default_device_is_decided_by_discovery(run_python, build_plugin):
    """A plugin loaded explicitly after import does not change the default device: it is index 0 of the first
    third-party plugin *found* at import, else rt_cpu:0, whenever get_device() is first called."""
    if "rt_cpu" not in paddle_rt.device_types():
        pytest.skip("the bundled rt_cpu is not loaded")
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("td_late")})
    code = f"""
    import paddle_rt
    paddle_rt.load_plugin({str(so)!r})
    print("RESULT", repr(paddle_rt.get_device()))
    """
    res = run_python(code, env={"PADDLE_RT_NO_RT_CPU": None, "CUSTOM_DEVICE_ROOT": None,
                                "PADDLE_RT_PLUGIN_PATH": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("RESULT ", 1)[1].strip() == "rt_cpu:0"


# -- teardown at exit --------------------------------------------------------------------------------------------------
def test_teardown_at_exit_deinitialises_used_devices_then_finalizes(run_python, build_plugin, tmp_path):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("td_life"), "NDEV": 3, "LIFECYCLE": None})
    log = tmp_path / "life.log"
    code = """
    import paddle_rt
    paddle_rt.set_device("td_life:1")
    paddle_rt.set_device("td_life:0")
    paddle_rt.set_device("td_life:1")
    paddle_rt.device("td_life:2")          # named but never used: not initialised
    print("RESULT ok")
    """
    res = run_python(code, env={"PADDLE_RT_PLUGIN_PATH": str(so), "PADDLE_RT_NO_RT_CPU": "1", "TP_LOG": str(log),
                                "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "initialize"
    assert lines[-1] == "finalize"
    middle = lines[1:-1]
    inits = [ln for ln in middle if ln.startswith("init_device")]
    deinits = [ln for ln in middle if ln.startswith("deinit_device")]
    assert inits == ["init_device 1", "init_device 0"]
    assert sorted(deinits) == ["deinit_device 0", "deinit_device 1"]
    assert middle.index(deinits[0]) > middle.index(inits[-1])
    assert lines.count("initialize") == 1 and lines.count("finalize") == 1


def test_plugin_never_used_is_never_initialised(run_python, build_plugin, tmp_path):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("td_idle"), "LIFECYCLE": None})
    log = tmp_path / "idle.log"
    res = run_python("import paddle_rt; print(paddle_rt.device_types())",
                     env={"PADDLE_RT_PLUGIN_PATH": str(so), "TP_LOG": str(log), "CUSTOM_DEVICE_ROOT": None,
                          "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert "td_idle" in res.stdout
    assert not log.exists() or log.read_text() == ""


# -- python -m paddle_rt info ------------------------------------------------------------------------------------------
def run_cli(args, env):
    import os

    child_env = dict(os.environ)
    for key in ("CUSTOM_DEVICE_ROOT", "PADDLE_RT_PLUGIN_PATH", "PADDLE_RT_NO_RT_CPU", "PADDLE_RT_DEFAULT_DEVICE"):
        child_env.pop(key, None)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
    child_env.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-m", "paddle_rt", *args], cwd=package_parent(), env=child_env,
                          capture_output=True, text=True, timeout=120)


def test_info_command(build_plugin):
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("td_cli"), "NDEV": 2})
    res = run_cli(["info"], {"PADDLE_RT_PLUGIN_PATH": str(so)})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "rt_cpu" in out and "td_cli" in out
    assert "td_cli:0" in out and "td_cli:1" in out and "rt_cpu:0" in out
    # the minimal plugin's section lists a hook it lacks among its missing hooks
    section = out[out.index("plugin td_cli"):]
    missing_line = next(ln for ln in section.splitlines() if "missing hooks" in ln)
    assert "create_stream" in missing_line and "set_device" not in missing_line
    implemented_line = next(ln for ln in section.splitlines() if "implemented hooks" in ln)
    assert "set_device" in implemented_line and "create_stream" not in implemented_line


def test_info_command_json(build_plugin):
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("td_cli_json")})
    res = run_cli(["info", "--json"], {"PADDLE_RT_PLUGIN_PATH": str(so), "RT_CPU_DEVICE_COUNT": 3})
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["device_types"] == ["rt_cpu", "td_cli_json"]
    by_type = {p["device_type"]: p for p in info["plugins"]}
    assert [d["device"] for d in by_type["rt_cpu"]["devices"]] == ["rt_cpu:0", "rt_cpu:1", "rt_cpu:2"]
    assert all(d["total"] > 0 for d in by_type["rt_cpu"]["devices"])
    minimal = by_type["td_cli_json"]
    assert "create_stream" in minimal["missing"] and "device_memory_stats" in minimal["missing"]
    assert [(d["free"], d["total"]) for d in minimal["devices"]] == [(0, 0)]
    assert info["current_device"] == "td_cli_json:0"


def test_info_command_survives_a_bad_plugin(tmp_path):
    bad = tmp_path / "x.so"
    bad.write_text("not a library")
    res = run_cli(["info"], {"PADDLE_RT_PLUGIN_PATH": str(bad)})
    assert res.returncode == 0, res.stderr
    assert "rt_cpu" in res.stdout
    assert str(bad) in res.stderr  # the discovery warning


# -- fork ----------------------------------------------------------------------------------------------------------------
def test_using_a_device_after_fork_raises_until_reinitialised(run_python, build_plugin):
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("td_fork"), "NDEV": 2})
    code = """
    import os, paddle_rt
    paddle_rt.set_device("td_fork:1")
    pid = os.fork()
    if pid == 0:
        code = 10
        try:
            try:
                paddle_rt.set_device("td_fork:0")
            except paddle_rt.ForkError as exc:
                code = 11 if "fork" in str(exc) else 12
            if code == 11:
                paddle_rt.reinitialize_after_fork()
                paddle_rt.set_device("td_fork:0")
                code = 0 if repr(paddle_rt.get_device()) == "td_fork:0" else 13
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("RESULT", os.waitstatus_to_exitcode(status), repr(paddle_rt.get_device()))
    paddle_rt.set_device("td_fork:0")   # the parent is unaffected
    """
    res = run_python(code, env={"PADDLE_RT_PLUGIN_PATH": str(so), "PADDLE_RT_NO_RT_CPU": "1",
                                "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("RESULT ", 1)[1].split() == ["0", "td_fork:1"]



def test_device_string_after_fork_names_the_childs_device(run_python, build_plugin):
    """A device string resolved before fork() resolves, in the child after reinitialize_after_fork(), to the child's
    new Device (the string cache never hands out the parent's)."""
    so = build_plugin("minimal", {"DEVICE_TYPE": dtype("td_fork2"), "NDEV": 2})
    code = """
    import os, paddle_rt
    old = paddle_rt.device("td_fork2:1")
    paddle_rt.malloc(64, device="td_fork2:1").free()
    pid = os.fork()
    if pid == 0:
        code = 10
        try:
            paddle_rt.reinitialize_after_fork()
            d = paddle_rt.device("td_fork2:1")
            code = 11 if d is old else 12
            paddle_rt.malloc(64, device="td_fork2:1").free()
            code = 0 if d is not old and paddle_rt.device("td_fork2:1") is d else code
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("RESULT", os.waitstatus_to_exitcode(status), paddle_rt.device("td_fork2:1") is old)
    """
    res = run_python(code, env={"PADDLE_RT_PLUGIN_PATH": str(so), "PADDLE_RT_NO_RT_CPU": "1",
                                "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("RESULT ", 1)[1].split() == ["0", "True"]

def test_teardown_hooks_run_in_order_before_deinit(run_python, build_plugin, tmp_path):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("td_order"), "LIFECYCLE": None})
    log = tmp_path / "order.log"
    code = f"""
    import paddle_rt
    from paddle_rt._core.device import register_teardown
    def note(text):
        with open({str(log)!r}, "a") as f:
            f.write(text + "\\n")
    def failing():
        note("hook failing")
        raise RuntimeError("boom")
    paddle_rt.set_device("td_order:0")
    register_teardown(lambda: note("hook 30"), 30)
    register_teardown(lambda: note("hook 10"), 10)
    register_teardown(failing, 20)
    register_teardown(lambda: note("hook 20b"), 20)
    """
    res = run_python(code, env={"PADDLE_RT_PLUGIN_PATH": str(so), "PADDLE_RT_NO_RT_CPU": "1", "TP_LOG": str(log),
                                "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert log.read_text().splitlines() == ["initialize", "init_device 0", "hook 10", "hook failing", "hook 20b",
                                            "hook 30", "deinit_device 0", "finalize"]
    assert "boom" in res.stderr  # a failing step is reported, and the others still run


def test_use_after_teardown_raises(run_python, build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": dtype("td_after"), "NDEV": 2, "LIFECYCLE": None})
    code = """
    import paddle_rt
    from paddle_rt._core import device as dev_mod
    paddle_rt.set_device("td_after:0")
    dev_mod._teardown_all()
    dev_mod._teardown_all()          # idempotent
    out = []
    for spec in ("td_after:0", "td_after:1"):
        try:
            paddle_rt.set_device(spec)
            out.append("no error")
        except paddle_rt.DeviceError as exc:
            out.append(str(exc))
    print("RESULT", out)
    """
    res = run_python(code, env={"PADDLE_RT_PLUGIN_PATH": str(so), "PADDLE_RT_NO_RT_CPU": "1",
                                "CUSTOM_DEVICE_ROOT": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    out = res.stdout.split("RESULT ", 1)[1]
    assert "no error" not in out
    assert "torn down" in out or "finalized" in out


def test_resolve_device_follows_the_current_device_per_thread(td_min):
    from paddle_rt._core.device import resolve_device

    paddle_rt.set_device("td_min:1")
    assert resolve_device(None) is paddle_rt.device("td_min:1")
    assert resolve_device("td_min:0") is paddle_rt.device("td_min:0")
    assert resolve_device(0) is paddle_rt.device("td_min:0")
    default = paddle_rt._core.device._initial_device()
    seen = {}

    def worker():
        seen["start"] = resolve_device(None)
        paddle_rt.set_device("td_min:0")
        seen["after"] = resolve_device(None)

    t = threading.Thread(target=worker)
    t.start()
    t.join(60)
    assert seen["start"] is default
    assert seen["after"] is paddle_rt.device("td_min:0")
    assert resolve_device(None) is paddle_rt.device("td_min:1")
    with pytest.raises(DeviceError):
        resolve_device("nope:0")


def test_devices_leaves_out_a_plugin_that_cannot_initialise(run_python, build_plugin):
    """devices() lists every other plugin's devices (with a warning naming the broken one); asking for the broken
    type explicitly raises its PluginError."""
    bad = build_plugin("variant", {"DEVICE_TYPE": '"td_noinit"', "FAIL_INITIALIZE": None})
    code = f"""
    import warnings, paddle_rt
    paddle_rt.load_plugin({str(bad)!r})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        devs = [str(d) for d in paddle_rt.devices()]
    print("DEVS", devs)
    print("WARN", any("td_noinit" in str(x.message) for x in w))
    try:
        paddle_rt.devices("td_noinit")
    except paddle_rt.PluginError as exc:
        print("ERR", exc.call)
    """
    res = run_python(code, env={"PADDLE_RT_NO_RT_CPU": None, "CUSTOM_DEVICE_ROOT": None,
                                "PADDLE_RT_PLUGIN_PATH": None, "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "DEVS ['rt_cpu:0', 'rt_cpu:1']" in out
    assert "WARN True" in out
    assert "ERR initialize" in out


def test_absurd_min_chunk_size_is_a_plugin_error(build_plugin, run_python):
    """A size hint that rounds every allocation (min chunk) reported as more than 1 GiB is garbage: PluginError
    naming the plugin, the hook and the value, at the first use, not an allocation rounded to it."""
    so = build_plugin("vendor", {"DEVICE_TYPE": '"vd_hugechunk"', "MIN_CHUNK": "((size_t)1 << 40)"})
    res = run_python(f"""
import paddle_rt
paddle_rt.load_plugin({str(so)!r})
try:
    paddle_rt.malloc(100, device="vd_hugechunk:0")
except paddle_rt.PluginError as e:
    print(type(e).__name__, "|", e)
""", env={"PADDLE_RT_NO_RT_CPU": "1"})
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert out.startswith("PluginError |"), out
    for text in ("vd_hugechunk:0", "plugin 'vd_hugechunk'", "device_min_chunk_size", "returned 1099511627776 bytes"):
        assert text in out, (text, out)


def test_host_addressable_is_one_fact(build_plugin, run_python):
    """Device.host_addressable: the plugin's paddle_rt_ext_host_addressable (rt_cpu and a test plugin export it),
    or the type listed in PADDLE_RT_HOST_ADDRESSABLE; allocations follow it (zero-copy exports or a clear error)."""
    plain = build_plugin("vendor", {"DEVICE_TYPE": '"vd_plain"'})
    hostmem = build_plugin("vendor", {"DEVICE_TYPE": '"vd_hostmem"', "HOST_MEMORY": None})
    listed = build_plugin("vendor", {"DEVICE_TYPE": '"vd_listed"'})
    res = run_python(f"""
import numpy as np, paddle_rt
for so in ({str(plain)!r}, {str(hostmem)!r}, {str(listed)!r}):
    paddle_rt.load_plugin(so)
out = []
for t in ("rt_cpu", "vd_plain", "vd_hostmem", "vd_listed"):
    d = paddle_rt.device(t + ":0")
    a = paddle_rt.malloc(64, device=d)
    try:
        np.asarray(a)
        exported = True
    except BufferError:
        exported = False
    out.append(f"{{t}}={{d.host_addressable}}/{{exported}}")
    a.free()
print(" ".join(out))
""", env={"PADDLE_RT_HOST_ADDRESSABLE": "vd_listed"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["rt_cpu=True/True", "vd_plain=False/False",
                                  "vd_hostmem=True/True", "vd_listed=True/True"]
