"""paddle_rt/_core/fault_handler.c: a fatal signal inside a plugin hook prints one line naming the plugin, the hook
and the device, then the handler installed before runs (Python's faulthandler here); PADDLE_RT_FAULT_HANDLER=0 turns
it off. Each crash happens in a child process (tests/plugins/vendor.c's SEGV switches)."""
import os
import re
import signal

import pytest

LINE = re.compile(r"^paddle_rt: fatal signal (\w+) inside plugin '([^']+)' \((.+)\), hook (\w+), device (.+)$", re.M)

MALLOC_CRASH = """
import paddle_rt
p = paddle_rt.load_plugin({so!r})
d = paddle_rt.device("{name}:1")
print("before", flush=True)
paddle_rt.malloc(12544, device=d)        # vendor.c: SEGV_SIZE=12544 (a fresh chunk of exactly the request)
print("not reached", flush=True)
"""


def vendor(build_plugin, name, **switches):
    return build_plugin("vendor", {"DEVICE_TYPE": f'"{name}"', **switches})


def crash(run_python, so, name, code=MALLOC_CRASH, env=None):
    base = {"PADDLE_RT_NO_RT_CPU": "1", "PADDLE_RT_ALLOC_CONF": "growth:exact"}
    base.update(env or {})
    return run_python(code.format(so=str(so), name=name), env=base)


def test_segfault_in_a_hook_names_plugin_hook_and_device(build_plugin, run_python):
    so = vendor(build_plugin, "vd_segv", SEGV_SIZE=12544, NDEV=2)
    res = crash(run_python, so, "vd_segv", env={"PYTHONFAULTHANDLER": None})
    assert res.returncode == -signal.SIGSEGV, res.stderr
    assert "before" in res.stdout and "not reached" not in res.stdout
    lines = LINE.findall(res.stderr)
    assert len(lines) == 1, res.stderr
    sig, plugin, path, hook, device = lines[0]
    assert (sig, plugin, hook) == ("SIGSEGV", "vd_segv", "device_memory_allocate")
    assert path == str(so)
    assert device == "vd_segv:1 (physical id 1)"


def test_chains_to_pythons_faulthandler(build_plugin, run_python):
    so = vendor(build_plugin, "vd_segv_fh", SEGV_SIZE=12544)
    res = crash(run_python, so, "vd_segv_fh", code=MALLOC_CRASH.replace(":1", ":0"),
                env={"PYTHONFAULTHANDLER": "1"})
    assert res.returncode == -signal.SIGSEGV, res.stderr
    assert len(LINE.findall(res.stderr)) == 1
    assert "Fatal Python error: Segmentation fault" in res.stderr      # faulthandler ran after our line
    assert res.stderr.index("paddle_rt: fatal signal") < res.stderr.index("Fatal Python error")


def test_crash_on_a_stream_worker_names_the_hook_and_device(build_plugin, run_python):
    """vendor.c has no streams: paddle_rt's worker thread calls device_memory_set; the crash happens there."""
    so = vendor(build_plugin, "vd_segv_set", SEGV_MEMSET=None, NDEV=2)
    code = """
import paddle_rt
paddle_rt.load_plugin({so!r})
d = paddle_rt.device("{name}:1")
a = paddle_rt.malloc(4096, device=d)
s = paddle_rt.Stream(d)
paddle_rt.memset_async(a, 7, stream=s)
s.synchronize()
print("not reached", flush=True)
"""
    res = crash(run_python, so, "vd_segv_set", code=code, env={"PYTHONFAULTHANDLER": None})
    assert res.returncode == -signal.SIGSEGV, res.stderr
    lines = LINE.findall(res.stderr)
    assert len(lines) == 1, res.stderr
    assert lines[0][3] == "device_memory_set" and lines[0][4] == "vd_segv_set:1 (physical id 1)"


def test_switched_off(build_plugin, run_python):
    so = vendor(build_plugin, "vd_segv_off", SEGV_SIZE=12544)
    res = crash(run_python, so, "vd_segv_off", code=MALLOC_CRASH.replace(":1", ":0"),
                env={"PADDLE_RT_FAULT_HANDLER": "0", "PYTHONFAULTHANDLER": None})
    assert res.returncode == -signal.SIGSEGV
    assert "paddle_rt: fatal signal" not in res.stderr


def test_crash_outside_plugins_says_nothing(run_python):
    """A fatal signal that is not inside a plugin's code (here: raised from Python) gets no paddle_rt line, and the
    previous disposition (the default: die by the signal) still applies."""
    res = run_python("import os, signal, paddle_rt; paddle_rt.device('rt_cpu:0'); os.kill(os.getpid(), signal.SIGSEGV)",
                     env={"PYTHONFAULTHANDLER": None})
    assert res.returncode == -signal.SIGSEGV
    assert "paddle_rt: fatal signal" not in res.stderr


def test_normal_use_is_unchanged(build_plugin, run_python):
    """The set_device trampoline passes every call through: a plugin's own set_device still runs, the device a
    thread made current is the plugin's, and nothing is printed."""
    so = vendor(build_plugin, "vd_quiet", NDEV=2)
    res = run_python(f"""
import ctypes, paddle_rt
paddle_rt.load_plugin({str(so)!r})
a = paddle_rt.malloc(1000, device="vd_quiet:1")
lib = ctypes.CDLL({str(so)!r})
print(lib.tp_current_device(), paddle_rt.device("vd_quiet:1").plugin.has_hook("set_device"))
a.free()
""", env={"PADDLE_RT_NO_RT_CPU": "1"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "True"]
    assert "paddle_rt:" not in res.stderr


ABORT_IN_MALLOC = """
import paddle_rt
p = paddle_rt.load_plugin({so!r})
d = paddle_rt.device("{name}:0")
print("before", flush=True)
paddle_rt.malloc(2 << 20, device=d)      # crashy.c aborts above 1 MiB
print("not reached", flush=True)
"""


@pytest.mark.parametrize("opt", ["-O2", "-O3"])
def test_abort_moved_to_a_cold_section_names_the_hook(tmp_path, run_python, opt):
    """gcc -O2/-O3 moves a hook's abort path into `hook.cold`, below every hook's entry point: the fault line still
    names the hook (the frame's function from the plugin's symbols, .cold/.part/.isra folded into it), not "unknown"
    as the nearest-entry-point rule gave."""
    import shutil
    import subprocess

    from conftest import include_dir

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler: the test plugins need one")
    so = tmp_path / f"libcrashy{opt[1:]}.so"
    here = os.path.join(os.path.dirname(__file__), "plugins")
    subprocess.run([cc, "-std=gnu11", opt, "-shared", "-fPIC", "-pthread", f"-I{include_dir()}", f"-I{here}",
                    f'-DDEVICE_TYPE="cold{opt[2:]}"', os.path.join(here, "crashy.c"), "-o", str(so)], check=True)
    syms = subprocess.run(["nm", str(so)], capture_output=True, text=True, check=True).stdout
    cold = [ln for ln in syms.splitlines() if ln.endswith("crashy_device_memory_allocate.cold")]
    if not cold:
        pytest.fail(f"gcc {opt} did not move the abort path out (no .cold symbol): nothing to show\n{syms}")
    entry = [ln for ln in syms.splitlines() if ln.endswith(" crashy_device_memory_allocate")]
    assert int(cold[0].split()[0], 16) < int(entry[0].split()[0], 16)      # below the hook: the old rule's blind spot
    res = crash(run_python, so, f"cold{opt[2:]}", code=ABORT_IN_MALLOC, env={"PYTHONFAULTHANDLER": None})
    assert res.returncode == -signal.SIGABRT, res.stderr
    lines = LINE.findall(res.stderr)
    assert len(lines) == 1, res.stderr
    sig, plugin, path, hook, device = lines[0]
    assert (sig, plugin, hook) == ("SIGABRT", f"cold{opt[2:]}", "device_memory_allocate"), res.stderr


ENTRY_CRASH = """
import paddle_rt
paddle_rt.load_plugin({so!r})
d = paddle_rt.device("{name}:0")
print("before", flush=True)
paddle_rt.malloc(4096, device=d)         # crashy.c ENTRY_FAULT: the hook's first instruction faults
print("not reached", flush=True)
"""


@pytest.mark.parametrize("stripped", [False, True])
def test_fault_on_a_hooks_first_instruction_names_that_hook(build_plugin, run_python, tmp_path, stripped):
    """A hook that faults on its first instruction: the faulting frame's pc is the hook's entry point itself, not a
    return address, so looking one byte back (right for the callers' frames) landed in the function laid out before
    it (synchronize_event here) and named that hook. Both with the plugin's symbols and without (nearest entry)."""
    import shutil
    import subprocess

    so = build_plugin("crashy", {"DEVICE_TYPE": '"entry_fault"', "ENTRY_FAULT": None})
    if stripped:
        if shutil.which("strip") is None:
            pytest.skip("no strip(1) to remove the plugin's symbol table")
        so = shutil.copy(so, tmp_path / "libentry_fault_stripped.so")
        subprocess.run(["strip", "--strip-all", str(so)], check=True)
        for table in ([], ["-D"]):                      # neither .symtab nor .dynsym names the hooks' functions
            listed = subprocess.run(["nm", *table, str(so)], capture_output=True, text=True)
            assert "crashy_entry" not in listed.stdout, listed.stdout
    res = crash(run_python, so, "entry_fault", code=ENTRY_CRASH, env={"PYTHONFAULTHANDLER": None})
    assert res.returncode in (-signal.SIGSEGV, -signal.SIGILL), res.stderr
    assert "before" in res.stdout and "not reached" not in res.stdout
    lines = LINE.findall(res.stderr)
    assert len(lines) == 1, res.stderr
    sig, plugin, path, hook, device = lines[0]
    assert (plugin, hook, device) == ("entry_fault", "device_memory_allocate", "entry_fault:0 (physical id 0)"), \
        res.stderr
