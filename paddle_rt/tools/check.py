"""``python -m paddle_rt check PLUGIN.so [--json] [--strict] [--timeout S] [--only NAME,...] [--list]``: what a
vendor runs on a plugin written against the custom-device C ABI.

Two groups of checks. *Conformance* checks exercise the plugin the way Paddle (3.3.1) and paddle_rt use it: ``fail``
only where they would misbehave with this plugin, ``warn`` for hazards that still work (fixed memory figures,
blocks aligned below the min chunk size). *Misuse probes* make one call Paddle never makes on purpose each (a double
free, an out-of-range device id, an allocation beyond the capacity, NULL or zero-size arguments): a guarded plugin
answers with an error status (``pass``); an unguarded one is a ``warn`` ("not guarded: double free aborts
(SIGABRT)"), never a ``fail``. ``--list`` prints each check's rule.

Every check runs in its own child process (``sys.executable -m paddle_rt.tools.check --child NAME PLUGIN``) that
loads the plugin with :func:`paddle_rt.load_plugin` (the bundled rt_cpu is kept out with ``PADDLE_RT_NO_RT_CPU=1``
unless it is the plugin under test), so a crash (the signal is reported, with the hook it crashed in) or a hang (a
timeout, default 20 s per check) changes that check's verdict only, and the suite goes on. The checks call the hooks
directly through :mod:`paddle_rt._core.rawabi` and judge the raw statuses.

Results: ``pass``, ``warn``, ``skip`` (with the reason, e.g. the hooks the plugin lacks) and ``fail``. The exit
status is 1 when any check failed (with ``--strict``: or warned), 0 otherwise (2 for bad arguments).

Device memory is read or written at its address only on devices the host may address (``Device.host_addressable``:
the plugin exports paddle_rt_ext_host_addressable, or its type is listed in ``PADDLE_RT_HOST_ADDRESSABLE``);
otherwise contents are checked by round trips h2d -> d2d -> d2h.
"""
import argparse
import importlib
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import time

from paddle_rt.tools.check_base import Check, Ctx, Fail, Skip
from paddle_rt.tools.cli import EXIT_USAGE, command_parser, error

__all__ = ["CHECKS", "FAMILIES", "run_checks", "format_table", "main"]

_MARK = "@@paddle_rt-check-result@@ "

#: The check families, in the order they run (conformance first, then the misuse probes): each is a module
#: ``paddle_rt.tools.<family>`` with a ``CHECKS`` list of :class:`~paddle_rt.tools.check_base.Check` entries. A new
#: family: a module ``check_<topic>.py`` that imports check_base only, and its name here (before ``check_probes``).
FAMILIES = ["check_memory", "check_streams", "check_vmm", "check_probes"]

_HANDSHAKE = Check("handshake", None, "dlopen, InitPlugin, version and validation (paddle_rt.load_plugin)",
      "fail when Paddle would refuse the plugin (no InitPlugin, old version, device_type NULL, a required hook "
      "missing)")

#: The checks, in the order they run.
CHECKS = [_HANDSHAKE] + [c for family in FAMILIES for c in importlib.import_module(f"paddle_rt.tools.{family}").CHECKS]
_BY_NAME = {c.name: c for c in CHECKS}


# ---------------------------------------------------------------------------------------------------------------------
# Child side

def _emit(result):
    sys.stdout.write("\n" + _MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


def _child(name, path, timeout):
    import faulthandler

    # A hang inside a hook: dump where we are (the parent names the hook from it) and leave.
    faulthandler.enable()
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True)
    import paddle_rt

    try:
        plugin = paddle_rt.load_plugin(path)
    except paddle_rt.PluginLoadError as exc:
        _emit({"result": "fail", "detail": str(exc.reason)})
        return 0
    except Exception as exc:
        _emit({"result": "fail", "detail": f"{type(exc).__name__}: {exc}"})
        return 0
    if name == "handshake":
        _emit({"result": "pass", "detail": f"{plugin.device_type} ({plugin.sub_device_type}) "
                                           f"v{'.'.join(map(str, plugin.version))}"})
        return 0
    check = _BY_NAME[name]
    fn = check.fn
    ctx = None
    try:
        ctx = Ctx(plugin)
        if ctx.ndev == 0 and name != "required_hooks":
            raise Skip("the plugin reports no devices")
        detail = fn(ctx) or ""
        result = "warn" if ctx.warnings else "pass"
        if ctx.warnings:
            detail = "; ".join(["warning: " + w for w in ctx.warnings] + ([detail] if detail else []))
    except Skip as exc:
        result, detail = "skip", str(exc)
    except Fail as exc:
        result, detail = "fail", str(exc)
    except Exception as exc:
        result, detail = "fail", f"{type(exc).__name__}: {exc}"
    finally:
        if check.group == "probe" and result == "fail":
            # a probe judges only the misuse; a plugin that cannot even set it up fails its conformance checks
            result, detail = "skip", f"could not set up the probe: {detail}"
        if ctx is not None:
            ctx.cleanup()
    _emit({"result": result, "detail": detail})
    if timeout > 0:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(timeout, exit=True)  # a fresh budget for teardown at exit
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Parent side

def _package_parent():
    here = os.path.dirname(os.path.abspath(__file__))          # .../paddle_rt/tools
    return os.path.dirname(os.path.dirname(here))


def _bundled_path():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "librt_cpu.so")


def _child_env(path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_parent(), env.get("PYTHONPATH", "")) if p)
    for var in ("CUSTOM_DEVICE_ROOT", "PADDLE_RT_PLUGIN_PATH"):
        env.pop(var, None)
    if os.path.realpath(path) == os.path.realpath(_bundled_path()):
        env.pop("PADDLE_RT_NO_RT_CPU", None)
    else:
        env["PADDLE_RT_NO_RT_CPU"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


_FAULT_LINE = re.compile(r"paddle_rt: fatal signal \w+ inside plugin '[^']*' \(.*\), hook (\w+)")


def _where(stderr):
    """The hook a crash or hang happened in: from paddle_rt's fatal-signal line when there is one, else from a
    faulthandler dump (the innermost frame in a check family's file, with its source line)."""
    m = _FAULT_LINE.search(stderr)
    if m:
        return f"in {m.group(1)}"
    families = {os.path.abspath(sys.modules[f"paddle_rt.tools.{f}"].__file__) for f in FAMILIES}
    # faulthandler dumps every thread; the check runs in the one whose stack holds _child
    sections, current = [], []
    for line in stderr.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) and current:
            sections.append(current)
            current = []
        current.append(line)
    sections.append(current)
    main = [sec for sec in sections if any("in _child" in line for line in sec)]
    for line in (main[0] if main else stderr.splitlines()):
        m = _FRAME.search(line)
        if not m:
            continue
        fname, lineno, func = m.group(1), int(m.group(2)), m.group(3)
        if os.path.abspath(fname) in families:
            src = linecache.getline(fname, lineno).strip()
            hook = re.search(r"\b(?:r|r0|r1|raw|ctx\.raw)\.(\w+)\(", src)
            if hook:
                from paddle_rt._core.rawabi import HOOK_OF

                return f"in {HOOK_OF.get(hook.group(1), hook.group(1))} ({func}, line {lineno})"
            return f"in {func}, line {lineno}: {src}"
    return ""


def _tail(text, n=3):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])


_CRASH_VERB = {signal.SIGABRT: "aborts", signal.SIGSEGV: "crashes", signal.SIGBUS: "crashes"}


def _signame(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _run_one(name, path, timeout):
    cmd = [sys.executable, "-m", "paddle_rt.tools.check", "--child", name, "--timeout", str(timeout), path]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8",
                            errors="replace", env=_child_env(path),
                            cwd=_package_parent(), start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        out, err = proc.communicate()
    seconds = round(time.monotonic() - t0, 2)
    rc = proc.returncode
    reported = None
    for line in out.splitlines():
        if line.startswith(_MARK):
            try:
                reported = json.loads(line[len(_MARK):])
            except ValueError:
                pass
    hung = timed_out or "Timeout (" in err
    check = _BY_NAME[name]
    if reported is not None and rc == 0 and not timed_out:
        return dict(name=name, group=check.group, result=reported["result"], detail=reported["detail"],
                    seconds=seconds)
    if check.group == "probe" and (reported is None or reported["result"] != "fail"):
        # the misuse took the process down: that is the probe's answer, and only this probe's
        if hung:
            how = f"hangs (no answer within {timeout:g} s)"
        elif rc < 0:
            how = f"{_CRASH_VERB.get(-rc, 'crashes with')} ({_signame(-rc)})"
        else:
            how = f"ends the process (exit status {rc})"
        where = _where(err)
        return dict(name=name, group=check.group, result="warn",
                    detail=f"not guarded: {check.misuse} {how}" + (f" {where}" if where else ""), seconds=seconds)
    if hung:
        what = f"hung: no result within {timeout:g} s"
        if reported is not None:
            what = f"{reported['result']} ({reported['detail']}), then hung at exit (deinit_device/finalize)"
    elif rc < 0:
        signame = _signame(-rc)
        what = f"crashed with {signame}"
        if reported is not None:
            what = f"{reported['result']} ({reported['detail']}), then crashed with {signame} at exit"
    else:
        what = f"the check process exited with status {rc}"
        if reported is not None:
            what = f"{reported['result']} ({reported['detail']}), then exited with status {rc}"
        elif err.strip():
            what += f": {_tail(err)}"
    where = _where(err)
    if where:
        what += f" {where}"
    return dict(name=name, group=check.group, result="fail", detail=what, seconds=seconds)


def run_checks(path, timeout=20.0, only=None, progress=None):
    """Run the suite on the plugin at ``path``; returns a list of dicts (name, result, detail, seconds)."""
    path = os.path.abspath(path)
    results = []
    names = [c.name for c in CHECKS if only is None or c.name in only or c.name == "handshake"]
    loaded = True
    for name in names:
        if not loaded:
            res = dict(name=name, group=_BY_NAME[name].group, result="skip", detail="the plugin did not load",
                       seconds=0.0)
        else:
            res = _run_one(name, path, timeout)
            if name == "handshake" and res["result"] == "fail":
                loaded = False
        results.append(res)
        if progress:
            progress(res)
    return results


def format_table(results):
    w = max([len(r["name"]) for r in results] + [5])
    lines = [f"{'check':{w}}  {'result':6}  detail", f"{'-' * w}  ------  ------"]
    in_probes = False
    for r in results:
        if r.get("group") == "probe" and not in_probes:
            in_probes = True
            lines.append(f"-- misuse probes (calls Paddle never makes; warn: the plugin does not guard against it)")
        lines.append(f"{r['name']:{w}}  {r['result']:6}  {r['detail']}")
    counts = {k: sum(1 for r in results if r["result"] == k) for k in ("pass", "warn", "skip", "fail")}
    lines.append("")
    lines.append(", ".join(f"{v} {k}" for k, v in counts.items()))
    return "\n".join(lines)


def not_a_library(path):
    """Why ``path`` cannot be a plugin at all (no such file, a folder, not an ELF shared object), or None."""
    if not os.path.exists(path):
        return f"no such file: {path}"
    if os.path.isdir(path):
        return f"{path} is a folder"
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror})"
    if magic != b"\x7fELF":
        return f"{path} is not a shared library (no ELF header)"
    return None


def library_hint(path):
    """What to give instead of ``path``: the shared libraries beside it when there are some, else how to get one (never
    ``path`` itself, which was just reported unusable)."""
    folder = os.path.dirname(path) or "."
    try:
        found = sorted(f for f in os.listdir(folder) if f.endswith(".so") or ".so." in f)
    except OSError:
        found = []
    found = [os.path.join(os.path.dirname(path), f) for f in found if os.path.join(folder, f) != os.path.join(
        folder, os.path.basename(path))]
    if found:
        return "shared libraries beside it: " + ", ".join(found[:5]) + (" ..." if len(found) > 5 else "")
    return ("give the plugin's shared library (the .so its build produced; build the plugin first if it has no .so "
            "yet)")


def main(argv=None):
    ap = command_parser("check",
                        description="Conformance checks for a custom-device plugin (each in a child process).")
    ap.add_argument("plugin", nargs="?", help="path of the plugin shared library")
    ap.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds allowed per check")
    ap.add_argument("--only", default=None, help="comma-separated check names (handshake always runs)")
    ap.add_argument("--list", action="store_true", help="list the checks with their rules and exit")
    ap.add_argument("--strict", action="store_true", help="warnings fail too (exit status 1), for a vendor's CI")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.child:
        if args.child not in _BY_NAME:
            return error("check", f"--child {args.child}: no such check (see --list)")
        return _child(args.child, args.plugin, args.timeout)
    if args.list:
        w = max(len(c.name) for c in CHECKS)
        for c in CHECKS:
            print(f"{c.name:{w}}  {c.group:11}  {c.what}")
            print(f"{'':{w}}  {'':11}  rule: {c.rule}")
        return 0
    if args.plugin is None:
        return error("check", "the plugin's path is required (or --list)")
    if not args.timeout > 0:
        return error("check", f"--timeout {args.timeout:g}: must be a positive number of seconds")
    only = None
    if args.only:
        only = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = only - set(_BY_NAME)
        if unknown:
            return error("check", f"--only {args.only}: no check named {', '.join(sorted(unknown))} (see --list)")
    problem = not_a_library(args.plugin)
    if problem:
        return error("check", f"{problem}; {library_hint(args.plugin)}", EXIT_USAGE)
    progress = None
    if not args.json and sys.stderr.isatty():
        def progress(res):
            print(f"  {res['name']}: {res['result']} ({res['seconds']} s)", file=sys.stderr)
    results = run_checks(args.plugin, timeout=args.timeout, only=only, progress=progress)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"paddle_rt check {os.path.abspath(args.plugin)}")
        print(format_table(results))
    bad = ("fail", "warn") if args.strict else ("fail",)
    return 1 if any(r["result"] in bad for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
