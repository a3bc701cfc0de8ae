"""``paddle-rt capture -o TRACE.csv.gz -- python SCRIPT.py ARGS``: record the allocation log of a PyTorch CPU program.

The program runs under torch's profiler with memory profiling (``profile_memory=True``), which records every
allocation and free of torch's CPU allocator with its pointer, size and time. The log is written in RMM's CSV format
(``Thread,Time,Action,Pointer,Size,Stream``, gzip'd when the name ends in ``.gz``), the format ``python -m paddle_rt
replay`` reads: sizes are the bytes torch asked for; frees of memory allocated before the profiler started are left
out, and the log is checked before it is written (every free matches a live allocation). A program that fails, or
records no allocation, is one line on stderr and a non-zero exit; nothing is written.

torch is needed by the program's interpreter, not by paddle_rt:
``pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`` (its CPU wheel), or
``pip install "paddle_rt[capture]"``. The command after ``--`` is ``python SCRIPT.py ARGS``, ``python -m MODULE ARGS``,
``python -c CODE`` or just ``SCRIPT.py ARGS`` (run by this interpreter).
"""
import os
import subprocess
import sys
import tempfile

from paddle_rt._core import alloc_log
from paddle_rt.tools.cli import EXIT_FAILED, EXIT_USAGE, command_parser, error, output_path_problem, program

MiB = 1 << 20
TORCH_HINT = ('pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (the CPU wheel), '
              'or pip install "paddle_rt[capture]" after it')
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "capture_runner.py")


class CaptureError(Exception):
    """A capture that produced no log (the message is the one line the command prints)."""


class CaptureUsageError(CaptureError):
    """The command line names no Python program to run (exit status 2: nothing was run)."""


def _is_python(word):
    return os.path.basename(word).startswith("python")


def runner_command(command, raw_out):
    """The child's argv: the user's interpreter (and its own options) running capture_runner.py on the program."""
    if not command:
        raise CaptureUsageError("nothing to run: give the program after --, e.g. -- python script.py ARGS")
    if _is_python(command[0]):
        interp, rest = [command[0]], command[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
            interp.append(rest.pop(0))        # the interpreter's own options (-u, -X dev, -W ...)
            if interp[-1] in ("-X", "-W") and rest:
                interp.append(rest.pop(0))
        if not rest or rest[0] == "-" or (rest[0] in ("-m", "-c") and len(rest) < 2):
            raise CaptureUsageError(f"{' '.join(command)}: give a script, -m MODULE or -c CODE to run")
    elif command[0].endswith(".py"):
        interp, rest = [sys.executable], command
    else:
        raise CaptureUsageError(f"{command[0]!r} is not a Python program: capture runs `python SCRIPT.py ARGS` (torch's "
                           f"profiler records the allocations of a Python process)")
    if rest[0] not in ("-m", "-c") and not os.path.isfile(rest[0]):
        raise CaptureUsageError(f"{rest[0]}: no such script")
    return interp + [RUNNER, raw_out] + rest


def read_raw(raw_out, who):
    """The runner's events as alloc_log events (thread, time_ns, is_alloc, pointer, size, stream 0)."""
    with open(raw_out) as f:
        status = f.readline().strip()
        if status == "no-torch":
            raise CaptureError(f"torch is not installed for {who}: {TORCH_HINT}")
        if status != "ok":
            raise CaptureError(f"the capture of {who} was not completed")
        events = []
        for line in f:
            tid, ns, ptr, n = (int(x) for x in line.split())
            events.append((tid, ns, n > 0, ptr, abs(n), 0))
    return events


def capture(command, output, env=None):
    """Run ``command`` under the profiler and write its allocation log to ``output``. Returns (allocations, peak live
    bytes, events written); raises CaptureError with the one line to print."""
    who = " ".join(command[:3]) + (" ..." if len(command) > 3 else "")
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise CaptureError(f"{output}: the folder {folder} does not exist; nothing was run")
    with tempfile.TemporaryDirectory(prefix="paddle_rt_capture_") as tmp:
        raw = os.path.join(tmp, "events.txt")
        argv = runner_command(command, raw)
        try:
            rc = subprocess.run(argv, env=env).returncode
        except OSError as exc:
            raise CaptureError(f"cannot run {argv[0]}: {exc.strerror}") from None
        if not os.path.exists(raw):
            raise CaptureError(f"`{who}` failed (exit status {rc}); no trace written")
        events = read_raw(raw, argv[0])
    if not events:
        raise CaptureError(f"`{who}` allocated no CPU memory through torch while it ran; no trace written")
    try:
        log = alloc_log.from_recording(events, "capture")
        allocs, peak = alloc_log.write(output, log, "capture")
    except alloc_log.AllocationLogError as exc:
        raise CaptureError(f"{exc}; no trace written") from None
    except OSError as exc:
        raise CaptureError(f"cannot write {output}: {exc.strerror or exc}") from None
    return allocs, peak, len(log)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        own, command = argv[:i], argv[i + 1:]
    else:
        own, command = argv, []
    ap = command_parser("capture", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                        usage="%(prog)s -o TRACE.csv.gz -- python SCRIPT.py [ARGS...]",
                        epilog=f"The log replays with: {program()} replay TRACE.csv.gz --baselines")
    ap.add_argument("-o", "--output", required=True, help="the log to write (.csv, or .csv.gz for gzip)")
    args = ap.parse_args(own)
    problem = output_path_problem(args.output, "--output")
    if problem:                             # before the program runs, not after it
        return error("capture", problem)
    try:
        allocs, peak, n = capture(command, args.output)
    except CaptureError as exc:
        return error("capture", exc, EXIT_USAGE if isinstance(exc, CaptureUsageError) else EXIT_FAILED)
    print(f"{args.output}: {allocs} allocations, {n - allocs} frees, peak live {peak / MiB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
