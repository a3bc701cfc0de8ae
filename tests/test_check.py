"""paddle_rt.tools.check: the plugin conformance suite. Every check runs in a child process, so a plugin that crashes
or hangs fails that check while the suite finishes; skipped checks name the hooks the plugin lacks."""
import json
import os
import re
import signal
import subprocess
import sys
import types

import pytest

import paddle_rt
from paddle_rt._core.plugin import bundled_plugin_path
from paddle_rt.tools import check

CHECK_NAMES = [c.name for c in check.CHECKS]
PROBES = {c.name for c in check.CHECKS if c.group == "probe"}


def run(capsys, *args):
    rc = check.main([*map(str, args), "--json"])
    out = capsys.readouterr().out
    results = json.loads(out)
    return rc, {r["name"]: r for r in results}, results


def lacked_hooks(detail):
    """The hook names of a 'plugin lacks a, b (why)' detail."""
    m = re.match(r"plugin lacks ([a-z0-9_, ]+)", detail)
    assert m, detail
    return [h.strip() for h in m.group(1).split(",") if h.strip()]


def test_rt_cpu_passes_everything(capsys):
    rc, by_name, results = run(capsys, bundled_plugin_path())
    assert rc == 0
    assert [r["name"] for r in results] == CHECK_NAMES
    bad = {n: r for n, r in by_name.items() if r["result"] not in ("pass", "skip")}
    assert not bad, bad
    # rt_cpu implements every checked feature: nothing may be skipped except p2p with a single device
    skipped = {n for n, r in by_name.items() if r["result"] == "skip"}
    assert skipped <= {"copy_p2p"}, {n: by_name[n]["detail"] for n in skipped}
    assert "C_FAILED" in by_name["probe_beyond_capacity"]["detail"]
    assert "double free -> C_ERROR" in by_name["probe_double_free"]["detail"]
    assert {r["name"] for r in results if r["group"] == "probe"} == PROBES
    assert check.main([bundled_plugin_path(), "--strict", "--only", "memory_stats,probe_double_free"]) == 0
    assert "at the device address" in by_name["copy_h2d"]["detail"]


def test_rt_cpu_with_round_trips_only(capsys, monkeypatch):
    """The path used for device types the host may not address: contents verified through copies only."""
    monkeypatch.setenv("PADDLE_RT_CHECK_ROUND_TRIPS", "1")
    rc, by_name, _ = run(capsys, bundled_plugin_path(), "--only", "copy_h2d,copy_d2d,memset,allocate_free,xccl")
    assert rc == 0
    assert all(r["result"] == "pass" for r in by_name.values()), by_name
    assert "by d2h" in by_name["copy_h2d"]["detail"]
    assert "round trips" in by_name["copy_d2d"]["detail"]


def test_minimal_passes_what_applies_and_names_missing_hooks(capsys, build_plugin):
    so = build_plugin("minimal")
    rc, by_name, results = run(capsys, so)
    assert rc == 0, results
    passing = {"handshake", "required_hooks", "device_enumeration", "allocate_free", "events", "probe_double_free",
               "probe_bad_device_id", "probe_null_free"}
    for name in passing:
        assert by_name[name]["result"] == "pass", by_name[name]
    # its allocate(0) hands out a block (nothing refused): not guarded, a warning (docs/plugins.md's verdicts)
    assert by_name["probe_zero_size"]["result"] == "warn"
    assert by_name["probe_zero_size"]["detail"].startswith(
        "warning: not guarded: allocate(0) returned C_SUCCESS with a pointer")
    assert "0/" in by_name["required_hooks"]["detail"]            # no optional hook
    assert "NULL stream" in by_name["events"]["detail"]
    # its blocks sit 16 bytes past the address malloc returned: at least 16-byte aligned, and 32-, 64- or 128-byte
    # aligned when that address happens to be (it depends on the heap's history in this process), but always below
    # the 256 bytes assumed without a min chunk size: a hazard
    assert by_name["block_alignment"]["result"] == "warn"
    assert re.search(r"is (16|32|64|128)-byte aligned", by_name["block_alignment"]["detail"])
    skipped = [r for r in results if r["result"] == "skip"]
    assert {r["name"] for r in skipped} == set(CHECK_NAMES) - passing - {"block_alignment", "probe_zero_size"}
    for r in skipped:
        if r["name"].startswith("vmm_"):        # paddle_rt's optional extension, not a hook (check_vmm.py)
            assert "virtual-memory extension" in r["detail"], r
            continue
        hooks = lacked_hooks(r["detail"])
        assert hooks, r
        for hook in hooks:
            assert hook in paddle_rt.ALL_HOOKS and hook not in paddle_rt.REQUIRED_HOOKS, (r, hook)
    assert "stream_add_callback" in by_name["callbacks"]["detail"]
    assert "memory_copy_h2d" in by_name["copy_h2d"]["detail"]
    assert "device_memory_stats" in by_name["memory_stats"]["detail"]
    assert "xccl_all_reduce" in by_name["xccl"]["detail"]


def test_crash_in_a_hook_fails_that_check_only(capsys, build_plugin):
    so = build_plugin("crashy", {"DEVICE_TYPE": '"crashy"'})
    rc, by_name, results = run(capsys, so)
    assert rc == 1
    assert [r["name"] for r in results] == CHECK_NAMES                # the suite went on after the crash
    failed = {n for n, r in by_name.items() if r["result"] == "fail"}
    assert failed == {"allocate_free"}
    detail = by_name["allocate_free"]["detail"]
    assert "SIGABRT" in detail and "device_memory_allocate" in detail
    assert by_name["events"]["result"] == "pass"


def test_fault_on_a_hooks_first_instruction_names_that_hook(capsys, build_plugin):
    """crashy.c ENTRY_FAULT: device_memory_allocate faults on its first instruction, just after synchronize_event's
    last byte; the check's detail names the hook that was called (it named synchronize_event)."""
    so = build_plugin("crashy", {"DEVICE_TYPE": '"crashy_entry"', "ENTRY_FAULT": None})
    rc, by_name, _ = run(capsys, so, "--only", "allocate_free,events")
    assert rc == 1
    assert by_name["allocate_free"]["result"] == "fail"
    detail = by_name["allocate_free"]["detail"]
    assert "device_memory_allocate" in detail and "synchronize_event" not in detail, detail
    assert by_name["events"]["result"] == "pass"


def test_hang_in_a_hook_is_a_timeout_failure(capsys, build_plugin):
    so = build_plugin("crashy", {"DEVICE_TYPE": '"crashy_hang"', "HANG": None, "ABORT_ABOVE": 0})
    rc, by_name, results = run(capsys, so, "--timeout", "2", "--only", "events,allocate_free,device_enumeration")
    assert rc == 1
    assert by_name["events"]["result"] == "fail"
    assert "hung" in by_name["events"]["detail"] and "synchronize_event" in by_name["events"]["detail"]
    assert by_name["allocate_free"]["result"] == "pass"
    assert by_name["device_enumeration"]["result"] == "pass"


def test_wrong_results_and_lax_double_free(capsys, build_plugin):
    so = build_plugin("crashy", {"DEVICE_TYPE": '"crashy_copy"', "COPIES": None, "SHORT_D2D": None,
                                 "LAX_FREE": None, "ABORT_ABOVE": 0})
    rc, by_name, _ = run(capsys, so, "--only", "allocate_free,copy_h2d,copy_d2h,copy_d2d,memset,probe_double_free")
    assert rc == 1
    # a short d2d is caught by the h2d -> d2d -> d2h round trip (the type is not host-addressable)
    assert by_name["copy_d2d"]["result"] == "fail"
    assert "byte 65548" in by_name["copy_d2d"]["detail"]
    assert by_name["copy_h2d"]["result"] == "pass" and "by d2h" in by_name["copy_h2d"]["detail"]
    assert by_name["copy_d2h"]["result"] == "pass"
    # a double free reported as success: the probe warns, allocate_free is not concerned
    assert by_name["allocate_free"]["result"] == "pass"
    assert by_name["probe_double_free"]["result"] == "warn"
    assert "not guarded: double free returned C_SUCCESS" in by_name["probe_double_free"]["detail"]
    assert lacked_hooks(by_name["memset"]["detail"]) == ["device_memory_set"]


def test_host_addressable_types_use_direct_access(capsys, build_plugin, monkeypatch):
    so = build_plugin("crashy", {"DEVICE_TYPE": '"crashy_direct"', "COPIES": None, "ABORT_ABOVE": 0})
    monkeypatch.setenv("PADDLE_RT_HOST_ADDRESSABLE", "crashy_direct")
    rc, by_name, _ = run(capsys, so, "--only", "copy_h2d,copy_d2d")
    assert rc == 0
    assert "at the device address" in by_name["copy_h2d"]["detail"]


def test_plugin_that_does_not_load_fails_handshake(capsys, build_plugin):
    so = build_plugin("variant", {"DEVICE_TYPE": '"chk_old"', "VERSION_MAJOR": 0, "VERSION_MINOR": 1,
                                  "VERSION_PATCH": 0})
    rc, by_name, results = run(capsys, so)
    assert rc == 1
    assert by_name["handshake"]["result"] == "fail"
    assert "0.1.0" in by_name["handshake"]["detail"] and "0.1.1" in by_name["handshake"]["detail"]
    assert all(r["result"] == "skip" and "did not load" in r["detail"] for r in results[1:])


def test_non_conformance_is_reported(capsys, build_plugin):
    """variant WITH_INFO reports a 1 GiB capacity but does not enforce it; NULL_STREAMS never writes handles."""
    so = build_plugin("variant", {"DEVICE_TYPE": '"chk_info"', "WITH_INFO": None, "NULL_STREAMS": None})
    rc, by_name, _ = run(capsys, so, "--only", "probe_beyond_capacity,memory_stats,size_hints,stream_lifecycle")
    assert rc == 0                                            # a hazard, not a failure: Paddle runs with it
    assert by_name["probe_beyond_capacity"]["result"] == "warn"
    assert "not guarded" in by_name["probe_beyond_capacity"]["detail"]
    assert by_name["memory_stats"]["result"] == "pass"
    assert "min_chunk_size 512" in by_name["size_hints"]["detail"]
    assert "NULL" in by_name["stream_lifecycle"]["detail"]


def test_table_output_and_bad_arguments(capsys, tmp_path):
    rc = check.main([bundled_plugin_path(), "--only", "required_hooks"])
    out = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"^required_hooks\s+pass\s+all 10 required hooks", out, re.M)
    assert "2 pass, 0 warn, 0 skip, 0 fail" in out
    assert check.main([str(tmp_path / "nope.so")]) == 2
    assert check.main([bundled_plugin_path(), "--only", "no_such_check"]) == 2
    assert check.main([bundled_plugin_path(), "--timeout", "0"]) == 2
    assert check.main([bundled_plugin_path(), "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CHECK_NAMES)


def test_not_a_plugin(capsys, tmp_path):
    """A file that is not a shared library at all is one line saying what to give instead (exit 2), not a table of
    skipped checks."""
    bogus = tmp_path / "bogus.so"
    bogus.write_text("not an ELF file")
    assert check.main([str(bogus), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert "bogus.so is not a shared library" in line and "give the plugin's shared library" in line
    assert check.main([str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_callback_delivered_twice_fails(capsys, build_plugin):
    so = build_plugin("crashy", {"DEVICE_TYPE": '"chk_cb_twice"', "CALLBACK_TWICE": None, "ABORT_ABOVE": 0})
    rc, by_name, _ = run(capsys, so, "--only", "callbacks,stream_lifecycle")
    assert rc == 1
    assert by_name["stream_lifecycle"]["result"] == "pass"
    assert by_name["callbacks"]["result"] == "fail"
    assert "more than once" in by_name["callbacks"]["detail"]


def test_hang_at_exit_fails_the_check_it_follows(capsys, build_plugin):
    so = build_plugin("crashy", {"DEVICE_TYPE": '"chk_hang_fin"', "HANG_FINALIZE": None, "ABORT_ABOVE": 0})
    rc, by_name, _ = run(capsys, so, "--only", "device_enumeration", "--timeout", "2")
    assert rc == 1
    assert by_name["handshake"]["result"] == "pass"       # no initialize, so no finalize at exit
    detail = by_name["device_enumeration"]["detail"]
    assert by_name["device_enumeration"]["result"] == "fail"
    assert detail.startswith("pass (") and "hung at exit" in detail


# -- a vendor-style plugin with one switch per bug (tests/plugins/vendor.c) -------------------------------------------

def vendor(build_plugin, name, **switches):
    defines = {"DEVICE_TYPE": f'"{name}"'}
    defines.update({k: v for k, v in switches.items()})
    return build_plugin("vendor", defines)


def test_clean_vendor_plugin_has_no_fail_and_no_warn(capsys, build_plugin):
    so = vendor(build_plugin, "vd_clean")
    rc, by_name, results = run(capsys, so, "--strict")
    assert rc == 0
    assert not [r for r in results if r["result"] in ("fail", "warn")], results
    for name in PROBES - {"probe_host_double_free"}:
        assert by_name[name]["result"] == "pass", by_name[name]


def test_the_usual_vendor_plugin_warns_but_does_not_fail(capsys, build_plugin):
    """free() straight from deallocate, fixed memory figures, host-backed memory beyond the capacity: Paddle works
    with such a plugin, so nothing fails; the double free probe's abort is reported under that probe only."""
    so = vendor(build_plugin, "vd_usual", FREE_DIRECT=None, FIXED_STATS=None, NO_LIMIT=None)
    rc, by_name, results = run(capsys, so)
    assert rc == 0, [r for r in results if r["result"] == "fail"]
    warned = {r["name"] for r in results if r["result"] == "warn"}
    # deallocate(NULL) goes to free(NULL), a success: not guarded
    assert warned == {"memory_stats", "probe_double_free", "probe_beyond_capacity", "probe_null_free"}, results
    assert by_name["allocate_free"]["result"] == "pass"
    detail = by_name["probe_double_free"]["detail"]
    assert detail.startswith("not guarded: double free aborts (SIGABRT)"), detail
    assert "device_memory_deallocate" in detail
    assert "free did not decrease" in by_name["memory_stats"]["detail"]
    assert "not guarded" in by_name["probe_beyond_capacity"]["detail"]
    # --strict: warnings fail (for a vendor's CI)
    assert check.main([str(so), "--strict", "--json", "--only", "memory_stats"]) == 1
    capsys.readouterr()


def test_plain_malloc_probes_warn_not_pass(capsys, build_plugin):
    """A plugin whose allocate is plain malloc and deallocate plain free refuses neither allocate(0) nor
    deallocate(NULL): both probes warn 'not guarded' (pass means the misuse was refused with an error status)."""
    so = vendor(build_plugin, "vd_plain", PLAIN_MALLOC=None)
    rc, by_name, _ = run(capsys, so, "--only", "allocate_free,probe_zero_size,probe_null_free")
    assert rc == 0
    assert by_name["allocate_free"]["result"] == "pass"
    assert by_name["probe_zero_size"]["result"] == "warn"
    assert by_name["probe_zero_size"]["detail"] == ("warning: not guarded: allocate(0) returned C_SUCCESS with a "
                                                    "pointer (a block of 0 bytes, as plain malloc gives)")
    assert by_name["probe_null_free"]["result"] == "warn"
    assert by_name["probe_null_free"]["detail"] == "warning: not guarded: deallocate(NULL) returned C_SUCCESS"
    assert check.main([str(so), "--strict", "--json", "--only", "probe_null_free"]) == 1
    capsys.readouterr()


def test_null_success_at_zero_size_is_not_guarded(capsys, build_plugin):
    """C_SUCCESS with a NULL pointer for allocate(0) refuses nothing either; the clean plugin's C_ERROR passes."""
    rc, by_name, _ = run(capsys, vendor(build_plugin, "vd_zero_null", ZERO_NULL=None), "--only", "probe_zero_size")
    assert by_name["probe_zero_size"]["result"] == "warn"
    assert by_name["probe_zero_size"]["detail"] == ("warning: not guarded: allocate(0) returned C_SUCCESS with "
                                                    "a NULL pointer")
    rc, by_name, _ = run(capsys, vendor(build_plugin, "vd_clean"), "--only", "probe_zero_size,probe_null_free")
    assert rc == 0
    assert (by_name["probe_zero_size"]["result"], by_name["probe_zero_size"]["detail"]) == ("pass",
                                                                                          "allocate(0) -> C_ERROR")
    assert (by_name["probe_null_free"]["result"], by_name["probe_null_free"]["detail"]) == ("pass",
                                                                                          "deallocate(NULL) -> C_ERROR")


def test_block_alignment_rules(capsys, build_plugin):
    rc, by_name, _ = run(capsys, vendor(build_plugin, "vd_mis4", MISALIGN=4), "--only", "block_alignment")
    assert rc == 1 and by_name["block_alignment"]["result"] == "fail"
    assert "4-byte aligned" in by_name["block_alignment"]["detail"]
    rc, by_name, _ = run(capsys, vendor(build_plugin, "vd_mis64", MISALIGN=64), "--only", "block_alignment")
    assert rc == 0 and by_name["block_alignment"]["result"] == "warn"
    assert "64-byte aligned" in by_name["block_alignment"]["detail"] and "(256)" in by_name["block_alignment"]["detail"]
    rc, by_name, _ = run(capsys, vendor(build_plugin, "vd_chunk1k", MIN_CHUNK=1024), "--only", "block_alignment")
    assert by_name["block_alignment"]["result"] == "warn" and "min chunk size (1024)" in by_name["block_alignment"]["detail"]


def test_null_success_and_lax_device_ids_are_probe_warnings(capsys, build_plugin):
    so = vendor(build_plugin, "vd_null", NULL_SUCCESS=None, LAX_SET_DEVICE=None)
    rc, by_name, _ = run(capsys, so, "--only", "probe_beyond_capacity,probe_bad_device_id,device_enumeration")
    assert rc == 0
    assert by_name["device_enumeration"]["result"] == "pass"
    assert by_name["probe_bad_device_id"]["result"] == "warn"
    assert "not guarded: set_device(1000) (no such device) returned C_SUCCESS" in by_name["probe_bad_device_id"]["detail"]
    assert by_name["probe_beyond_capacity"]["result"] == "warn"
    assert "PluginError" in by_name["probe_beyond_capacity"]["detail"]


def test_list_states_every_rule(capsys):
    assert check.main(["--list"]) == 0
    out = capsys.readouterr().out
    for c in check.CHECKS:
        assert c.name in out and c.rule in out
    assert out.count("rule: ") == len(check.CHECKS)
    assert check.main([]) == 2


# -- the parent side in this process: how a child's end is reported, the table, the options ---------------------------

class FakeChild:
    """A check child that printed ``out``/``err`` and ended with ``rc`` (or did not end: ``hangs``)."""

    def __init__(self, out="", err="", rc=0, hangs=False):
        self.out, self.err, self.returncode, self.hangs, self.pid, self.killed = out, err, rc, hangs, 4242, []

    def communicate(self, timeout=None):
        if self.hangs and timeout is not None:
            raise subprocess.TimeoutExpired("check", timeout)
        return self.out, self.err

    def kill(self):
        self.killed.append("kill")


def reported(result, detail):
    return "some output\n" + check._MARK + json.dumps({"result": result, "detail": detail}) + "\n"


@pytest.fixture
def fake_child(monkeypatch):
    """Replace the check child by a FakeChild: returns a function setting it and the calls made."""
    calls = {"popen": [], "killpg": []}

    def use(child):
        def popen(cmd, **kw):
            calls["popen"].append((cmd, kw))
            return child
        monkeypatch.setattr(check.subprocess, "Popen", popen)
        return child

    def killpg(pid, sig):
        calls["killpg"].append((pid, sig))
    monkeypatch.setattr(check.os, "killpg", killpg)
    use.calls = calls
    return use


FAULT = "paddle_rt: fatal signal SIGABRT inside plugin 'x' (/p/libx.so), hook device_memory_allocate\n"


@pytest.mark.parametrize("child,result,detail", [
    (FakeChild(reported("pass", "all good")), "pass", "all good"),
    (FakeChild(reported("warn", "hazard")), "warn", "hazard"),
    (FakeChild(err=FAULT, rc=-signal.SIGABRT), "fail", "crashed with SIGABRT in device_memory_allocate"),
    (FakeChild(reported("pass", "ok"), rc=-signal.SIGSEGV), "fail", "pass (ok), then crashed with SIGSEGV at exit"),
    (FakeChild(err="one\ntwo\n\nthree\nfour\n", rc=3), "fail", "the check process exited with status 3: two | three | four"),
    (FakeChild(rc=3), "fail", "the check process exited with status 3"),
    (FakeChild(reported("skip", "no hooks"), rc=4), "fail", "skip (no hooks), then exited with status 4"),
    (FakeChild(hangs=True), "fail", "hung: no result within 2 s"),
    (FakeChild(reported("pass", "ok"), hangs=True), "fail", "pass (ok), then hung at exit (deinit_device/finalize)"),
    (FakeChild(reported("pass", "ok"), err="Timeout (0:00:02)!\n", rc=1), "fail",
     "pass (ok), then hung at exit (deinit_device/finalize)"),
    (FakeChild(rc=-99), "fail", "crashed with signal 99"),
])
def test_how_a_conformance_childs_end_is_reported(fake_child, child, result, detail):
    fake_child(child)
    res = check._run_one("allocate_free", "/p/libx.so", 2.0)
    assert (res["name"], res["group"], res["result"], res["detail"]) == ("allocate_free", "conformance", result,
                                                                        detail)
    assert isinstance(res["seconds"], float) and res["seconds"] >= 0


@pytest.mark.parametrize("child,result,detail", [
    (FakeChild(reported("pass", "double free -> C_ERROR")), "pass", "double free -> C_ERROR"),
    (FakeChild(rc=-signal.SIGABRT), "warn", "not guarded: double free aborts (SIGABRT)"),
    (FakeChild(rc=-signal.SIGSEGV), "warn", "not guarded: double free crashes (SIGSEGV)"),
    (FakeChild(rc=-signal.SIGBUS), "warn", "not guarded: double free crashes (SIGBUS)"),
    (FakeChild(rc=-signal.SIGTERM), "warn", "not guarded: double free crashes with (SIGTERM)"),
    (FakeChild(rc=5), "warn", "not guarded: double free ends the process (exit status 5)"),
    (FakeChild(hangs=True), "warn", "not guarded: double free hangs (no answer within 2.5 s)"),
    (FakeChild(err=FAULT, rc=-signal.SIGABRT), "warn",
     "not guarded: double free aborts (SIGABRT) in device_memory_allocate"),
    (FakeChild(reported("fail", "bad"), rc=-signal.SIGSEGV), "fail", "fail (bad), then crashed with SIGSEGV at exit"),
])
def test_how_a_probe_childs_end_is_reported(fake_child, child, result, detail):
    """A probe that takes the process down is that probe's warning (the misuse named), never a failure."""
    fake_child(child)
    res = check._run_one("probe_double_free", "/p/libx.so", 2.5)
    assert (res["group"], res["result"], res["detail"]) == ("probe", result, detail)


def test_a_hung_child_is_killed_with_its_process_group(fake_child):
    """The child runs in a session of its own, so that a hang is ended with every process it started."""
    child = fake_child(FakeChild(hangs=True))
    check._run_one("events", "/p/libx.so", 1.0)
    ((cmd, kw),) = fake_child.calls["popen"]
    assert cmd == [sys.executable, "-m", "paddle_rt.tools.check", "--child", "events", "--timeout", "1.0",
                   "/p/libx.so"]
    assert kw["start_new_session"] is True and kw["cwd"] == check._package_parent()
    assert kw["env"] == check._child_env("/p/libx.so")
    assert fake_child.calls["killpg"] == [(child.pid, signal.SIGKILL)] and child.killed == []


def test_where_a_hang_happened_from_a_faulthandler_dump(fake_child):
    """The innermost frame in a check family's file of the thread running the check: its hook, else its line."""
    from paddle_rt._core.rawabi import HOOK_OF
    import paddle_rt.tools.check_memory as fam
    lines = open(fam.__file__).read().splitlines()
    n_hook = next(i for i, ln in enumerate(lines, 1) if "r.allocate(" in ln)
    n_plain = next(i for i, ln in enumerate(lines, 1) if ln.strip().startswith("parts = "))
    dump = (f"Thread 0x0001 (most recent call first):\n  File \"{fam.__file__}\", line {n_plain} in other_thread\n\n"
            f"Current thread 0x0002 (most recent call first):\n"
            f"  File \"{fam.__file__}\", line {n_hook} in check_allocate_free\n"
            f"  File \"{check.__file__}\", line 92 in _child\n")
    fake_child(FakeChild(err="Timeout (0:00:01)!\n" + dump, rc=1))
    res = check._run_one("allocate_free", "/p/libx.so", 1.0)
    assert res["detail"] == (f"hung: no result within 1 s in {HOOK_OF['allocate']} (check_allocate_free, "
                             f"line {n_hook})")
    dump = (f"Current thread 0x0002 (most recent call first):\n"
            f"  File \"{fam.__file__}\", line {n_plain} in check_allocate_free\n"
            f"  File \"{check.__file__}\", line 92 in _child\n")
    fake_child(FakeChild(err=dump, rc=-signal.SIGSEGV))
    res = check._run_one("allocate_free", "/p/libx.so", 1.0)
    assert res["detail"] == (f"crashed with SIGSEGV in check_allocate_free, line {n_plain}: "
                             f"{lines[n_plain - 1].strip()}")


def test_child_environment(monkeypatch):
    """A check child imports this paddle_rt (first on PYTHONPATH), loads no other plugin, and keeps the bundled
    rt_cpu out unless rt_cpu is the plugin under test."""
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("CUSTOM_DEVICE_ROOT", "/plugins")
    monkeypatch.setenv("PADDLE_RT_PLUGIN_PATH", "/more/plugins")
    monkeypatch.setenv("PADDLE_RT_NO_RT_CPU", "1")
    parent = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
    env = check._child_env(bundled_plugin_path())
    assert env["PYTHONPATH"].split(os.pathsep) == [parent, "/somewhere/else"]
    assert "CUSTOM_DEVICE_ROOT" not in env and "PADDLE_RT_PLUGIN_PATH" not in env
    assert "PADDLE_RT_NO_RT_CPU" not in env and env["PYTHONFAULTHANDLER"] == "1"
    assert os.environ["CUSTOM_DEVICE_ROOT"] == "/plugins"               # the caller's environment is untouched
    monkeypatch.delenv("PYTHONPATH")
    monkeypatch.delenv("PADDLE_RT_NO_RT_CPU")
    env = check._child_env("/vendor/libnpu.so")
    assert env["PYTHONPATH"] == parent and env["PADDLE_RT_NO_RT_CPU"] == "1"
    assert os.path.realpath(check._bundled_path()) == os.path.realpath(bundled_plugin_path())


def test_run_checks_always_starts_with_the_handshake(monkeypatch):
    ran, progressed = [], []

    def run_one(name, path, timeout):
        ran.append((name, path, timeout))
        return dict(name=name, group=check._BY_NAME[name].group, result="pass", detail="", seconds=0.5)
    monkeypatch.setattr(check, "_run_one", run_one)
    results = check.run_checks("rel.so", timeout=3.0, only={"memset", "probe_zero_size"}, progress=progressed.append)
    assert ran == [(n, os.path.abspath("rel.so"), 3.0) for n in ("handshake", "memset", "probe_zero_size")]
    assert progressed == results and [r["name"] for r in results] == ["handshake", "memset", "probe_zero_size"]
    ran.clear()
    assert [r["name"] for r in check.run_checks("x.so")] == CHECK_NAMES and [t for *_, t in ran] == [20.0] * len(ran)

    def refused(name, path, timeout):
        ran.append(name)
        return dict(name=name, group="conformance", result="fail", detail="old version", seconds=0.1)
    monkeypatch.setattr(check, "_run_one", refused)
    ran.clear()
    results = check.run_checks("x.so", only={"memset", "probe_zero_size"})
    assert ran == ["handshake"]
    assert results[1:] == [dict(name="memset", group="conformance", result="skip", detail="the plugin did not load",
                                seconds=0.0),
                           dict(name="probe_zero_size", group="probe", result="skip",
                                detail="the plugin did not load", seconds=0.0)]


def test_format_table_groups_the_probes():
    """Conformance checks first, then one heading before the misuse probes; columns aligned; the counts last."""
    results = [dict(name="handshake", group="conformance", result="pass", detail="rt_cpu v0.1"),
               dict(name="memset", group="conformance", result="fail", detail="byte 3 is 0"),
               dict(name="probe_zero_size", group="probe", result="warn", detail="not guarded"),
               dict(name="probe_null_free", group="probe", result="skip", detail="plugin lacks x")]
    lines = check.format_table(results).splitlines()
    heading = "-- misuse probes (calls Paddle never makes; warn: the plugin does not guard against it)"
    assert lines.count(heading) == 1
    assert lines[lines.index(heading) + 1].startswith("probe_zero_size ")
    assert lines[lines.index(heading) - 1].startswith("memset ")
    w = len("probe_zero_size")
    assert lines[0] == "check".ljust(w) + "  result  detail"
    assert lines[1] == "-" * w + "  ------  ------"
    assert lines[2] == "handshake".ljust(w) + "  pass    rt_cpu v0.1"
    assert lines[-2:] == ["", "1 pass, 1 warn, 1 skip, 1 fail"]
    assert heading not in check.format_table(results[:2])
    short = check.format_table([dict(name="abc", group="conformance", result="pass", detail="d")]).splitlines()
    assert short[0] == "check  result  detail" and short[2] == "abc    pass    d"


def test_library_hint_lists_the_shared_libraries_beside_it(tmp_path):
    """Versioned libraries (libx.so.1) count; the path itself is never suggested; at most five are named."""
    lib = tmp_path / "build"
    lib.mkdir()
    missing = os.path.join(str(lib), "libmy.so")
    assert check.library_hint(missing).startswith("give the plugin's shared library")
    (lib / "libother.so.1").write_bytes(b"\x7fELF")
    (lib / "notes.txt").write_text("x")
    assert check.library_hint(missing) == f"shared libraries beside it: {lib / 'libother.so.1'}"
    (lib / "libmy.so").write_text("not ELF")
    for i in range(5):
        (lib / f"lib{i}.so").write_bytes(b"\x7fELF")
    hint = check.library_hint(missing)
    assert hint == "shared libraries beside it: " + ", ".join(
        str(lib / f"lib{i}.so") for i in range(5)) + " ..."
    assert check.library_hint(os.path.join(str(lib), "nothere", "x.so")).startswith("give the plugin's")


def test_main_messages_and_exit_statuses(capsys, monkeypatch, tmp_path):
    """Each mistake is one line naming `paddle-rt check`; the exit status is 1 on a fail (with --strict: or a warn)."""
    assert check.main(["--timeout", "soon", "x.so"]) == 2
    assert capsys.readouterr().err == ("paddle-rt check: argument --timeout: invalid float value: 'soon' "
                                       "(see `paddle-rt check --help`)\n")
    assert check.main([]) == 2
    assert capsys.readouterr().err == "paddle-rt check: the plugin's path is required (or --list)\n"
    assert check.main([bundled_plugin_path(), "--timeout", "-1"]) == 2
    assert capsys.readouterr().err == "paddle-rt check: --timeout -1: must be a positive number of seconds\n"
    assert check.main([bundled_plugin_path(), "--only", "memset, zz,yy"]) == 2
    assert capsys.readouterr().err == "paddle-rt check: --only memset, zz,yy: no check named yy, zz (see --list)\n"
    missing = str(tmp_path / "libnope.so")
    assert check.main([missing]) == 2
    assert capsys.readouterr().err == (f"paddle-rt check: no such file: {missing}; give the plugin's shared library "
                                       "(the .so its build produced; build the plugin first if it has no .so yet)\n")
    assert check.main(["--child", "nope", "x.so"]) == 2
    assert capsys.readouterr().err == "paddle-rt check: --child nope: no such check (see --list)\n"

    verdicts = {}
    monkeypatch.setattr(check, "run_checks", lambda path, timeout, only, progress: [
        dict(name=n, group="conformance", result=r, detail="", seconds=0.1) for n, r in verdicts.items()])
    verdicts.update(handshake="pass", memset="warn")
    assert check.main([bundled_plugin_path()]) == 0
    assert check.main([bundled_plugin_path(), "--strict"]) == 1
    verdicts.update(memset="fail")
    assert check.main([bundled_plugin_path()]) == 1
    verdicts.update(memset="skip")
    assert check.main([bundled_plugin_path(), "--strict"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"paddle_rt check {os.path.abspath(bundled_plugin_path())}"


def test_main_passes_its_options_and_reports_progress_on_a_terminal(capsys, monkeypatch):
    calls = []

    def run_checks(path, timeout, only, progress):
        calls.append((path, timeout, only, progress))
        res = [dict(name="handshake", group="conformance", result="pass", detail="ok", seconds=0.25)]
        if progress:
            progress(res[0])
        return res
    monkeypatch.setattr(check, "run_checks", run_checks)
    tty = types.SimpleNamespace(isatty=lambda: True, lines=[])
    tty.write = tty.lines.append
    tty.flush = lambda: None
    monkeypatch.setattr(sys, "stderr", tty)
    assert check.main([bundled_plugin_path(), "--timeout", "7", "--only", " memset ,,events"]) == 0
    assert calls[-1][:3] == (bundled_plugin_path(), 7.0, {"memset", "events"})
    assert "".join(tty.lines) == "  handshake: pass (0.25 s)\n"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"paddle_rt check {bundled_plugin_path()}" and out[-1] == "1 pass, 0 warn, 0 skip, 0 fail"
    tty.lines.clear()
    assert check.main([bundled_plugin_path(), "--json"]) == 0
    assert calls[-1][1:] == (20.0, None, None) and tty.lines == []
    assert json.loads(capsys.readouterr().out) == [dict(name="handshake", group="conformance", result="pass",
                                                        detail="ok", seconds=0.25)]


def test_help_lists_the_options_with_defaults(capsys, monkeypatch):
    from test_cli import option_entries
    monkeypatch.setenv("COLUMNS", "200")
    assert check.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert " ".join(text.split()).startswith("usage: paddle-rt check ")
    entries = option_entries(text)
    assert entries["--timeout"].endswith("seconds allowed per check (default: 20.0)")
    assert "handshake always runs" in entries["--only"]
    assert "--child" not in text


def test_list_gives_each_checks_group_and_rule(capsys):
    assert check.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(check.CHECKS)
    for c, what, rule in zip(check.CHECKS, lines[::2], lines[1::2]):
        assert what.split(None, 2) == [c.name, c.group, c.what]
        assert rule.strip() == f"rule: {c.rule}"
        assert what.index(c.what, len(c.name) + len(c.group)) == rule.index("rule: ")   # the rule under the text


def test_vmm_checks_pass_on_rt_cpu_and_name_a_plugin_that_loses_bytes(capsys, monkeypatch):
    """The virtual-memory family on rt_cpu: every check passes, the batched calls included; with RT_CPU_VMM_LIE=remap
    (map gives fresh pages instead of the physical allocation's bytes) the remap and batched checks fail and say
    that bytes were lost, while the refusals still pass."""
    only = "vmm_extension,vmm_remap,vmm_refusals,vmm_batched,vmm_capacity"
    rc, by_name, _ = run(capsys, bundled_plugin_path(), "--only", only)
    assert rc == 0 and all(by_name[n]["result"] == "pass" for n in only.split(",")), by_name
    assert "refused whole" in by_name["vmm_batched"]["detail"]
    monkeypatch.setenv("RT_CPU_VMM_LIE", "remap")
    rc, by_name, _ = run(capsys, bundled_plugin_path(), "--only", only)
    assert rc == 1
    assert by_name["vmm_remap"]["result"] == "fail" and "did not survive" in by_name["vmm_remap"]["detail"]
    assert by_name["vmm_batched"]["result"] == "fail" and "bytes" in by_name["vmm_batched"]["detail"]
    assert by_name["vmm_refusals"]["result"] == "pass"
