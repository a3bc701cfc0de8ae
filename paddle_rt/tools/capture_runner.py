"""The child side of ``paddle-rt capture``: run a Python program under torch's profiler with memory profiling and write
every CPU allocation and free it saw to a raw file. Runs by path in the interpreter the user named (imports torch,
never paddle_rt, so that interpreter needs only torch).

    python capture_runner.py RAW_OUT (SCRIPT | -m MODULE | -c CODE) [ARGS...]

RAW_OUT gets, only when the program succeeded, the line ``ok`` then one line per event
``thread time_ns pointer size`` (size negative for a free); or ``no-torch`` when torch cannot be imported. The
program's own exit status is this process's exit status.
"""
import os
import runpy
import sys
import traceback


def _events(prof):
    """(thread, time_ns, pointer, signed size) of every CPU allocation event of the profile, in tree order."""
    from torch._C._profiler import _EventType
    out = []
    stack = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
    while stack:
        e = stack.pop()
        kind, fields = e.typed
        if kind == _EventType.Allocation and fields.device.type == "cpu" and fields.ptr:
            out.append((e.start_tid, e.start_time_ns, fields.ptr, fields.alloc_size))
        stack.extend(reversed(e.children))
    return out


def _run(target, args):
    """Run the program as ``python TARGET ARGS`` would; its exit status (0 on success)."""
    mode, what = target
    try:
        if mode == "-m":
            sys.argv = [what] + args
            sys.path.insert(0, os.getcwd())
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        elif mode == "-c":
            sys.argv = ["-c"] + args
            sys.path.insert(0, "")
            exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [what] + args
            sys.path.insert(0, os.path.dirname(os.path.abspath(what)))
            runpy.run_path(what, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None or code == 0:
            return 0
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            return 1
        return code
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv):
    out, rest = argv[0], argv[1:]
    if rest[0] in ("-m", "-c"):
        target, args = (rest[0], rest[1]), rest[2:]
    else:
        target, args = ("script", rest[0]), rest[1:]
    try:
        import torch
        from torch.profiler import profile, ProfilerActivity
    except ImportError:
        with open(out, "w") as f:
            f.write("no-torch\n")
        return 3
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        rc = _run(target, args)
    if rc != 0:
        return rc
    events = _events(prof)
    with open(out, "w") as f:
        f.write("ok\n")
        f.writelines(f"{t} {ns} {p} {n}\n" for t, ns, p, n in events)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
