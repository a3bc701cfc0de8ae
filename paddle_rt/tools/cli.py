"""The command line's common parts: the program's one name, the argument parser every command uses (its ``--help``
lists each option with its default; a wrong option or value is one line and exit status 2), the exit statuses
(docs/cli.md), one-line error reports, the check of an output path before the work starts, and the run of a command
that turns a paddle_rt error into one line, a closed output pipe into a quiet end."""
import argparse
import os
import sys

__all__ = ["program", "command_parser", "CommandParser", "usage_error", "error", "output_path_problem",
           "run_command", "run_program", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_DOES_NOT_FIT", "EXIT_INTERRUPTED",
           "EXIT_BROKEN_PIPE"]

#: Exit statuses of every command (docs/cli.md).
EXIT_OK = 0             # done (check, bench: every check passed / no figure errored)
EXIT_FAILED = 1         # the command ran and reports a failure: a check failed, a benchmark errored, the captured
                        # program failed
EXIT_USAGE = 2          # nothing was done: a wrong option, a missing or malformed input, an unknown device, an
                        # output path that cannot be written, a missing extra
EXIT_DOES_NOT_FIT = 3   # replay: the trace needs more memory than the device has (a result line)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_BROKEN_PIPE = 141  # the reader of the output went away (`paddle-rt demo | head -2`): 128 + SIGPIPE, silently

PROGRAM = "paddle-rt"


def program():
    """The program's name in every message and usage line: ``paddle-rt`` (the installed command), however it was
    started (``python -m paddle_rt`` runs the same program)."""
    return PROGRAM


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option that has a default says it, unless its help already does."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default is argparse.SUPPRESS or default == ""
                or action.nargs == 0 or "default" in text or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the command, then exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")

    # argparse's own printing drops an OSError of the write: a closed output pipe would end `COMMAND --help` with
    # status 0. Written here, the BrokenPipeError reaches run_command / run_program: status 141 (docs/cli.md).
    def print_help(self, file=None):
        (file or sys.stdout).write(self.format_help())

    def print_usage(self, file=None):
        (file or sys.stdout).write(self.format_usage())


def command_parser(command, description=None, **kw):
    """The parser of ``paddle-rt COMMAND`` (its usage line names the program as the user invoked it)."""
    kw.setdefault("formatter_class", HelpFormatter)
    if description:
        description = description.replace("``", "").replace("python -m paddle_rt", program())
    return CommandParser(prog=f"{program()} {command}", description=description, **kw)


def usage_error(command, message):
    """Print a usage error of ``command`` as the parsers do (one line on stderr); returns exit status 2."""
    prog = f"{program()} {command}"
    print(f"{prog}: {message} (see `{prog} --help`)", file=sys.stderr)
    return 2


def _strip_own_prefix(command, text):
    """A paddle_rt error's text without the "replay: "/"plot: " it starts with (the report puts the program and the
    command first)."""
    for prefix in (f"paddle_rt {command}: ", f"{PROGRAM} {command}: ", f"{command}: "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def error(command, message, status=EXIT_USAGE):
    """Print ``paddle-rt COMMAND: message`` (one line on stderr); returns ``status``."""
    text = _strip_own_prefix(command, " ".join(str(message).split("\n")[0].split()) if message else "failed")
    print(f"{PROGRAM} {command}: {text}", file=sys.stderr)
    return status


def output_path_problem(path, what="the output"):
    """Why ``path`` cannot be written as a new or replaced file (its folder missing or not writable, or it is a
    folder), or None. Checked before a command starts its work, so a long run does not end in a traceback."""
    path = os.fspath(path)
    if not path:
        return f"{what}: an empty path"
    if os.path.isdir(path):
        return f"{what} {path} is a folder; give a file name"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return f"{what} {path}: no such folder {folder} (create it first)"
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{what} {path}: not writable"
    return None


def _quiet_stdout():
    """After a closed pipe: point stdout at /dev/null so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def run_program(fn, argv):
    """Run the whole program (``paddle-rt``'s main, ``fn(argv)``) so that a closed output pipe ends it quietly with
    EXIT_BROKEN_PIPE whatever wrote last: a command, the program's own ``--help``/``--version``, or argparse's
    ``COMMAND --help`` (which leaves through SystemExit). Standard output is flushed here, inside the guard: output
    still buffered would otherwise meet the closed pipe at the interpreter's exit (a traceback-like report, status
    120)."""
    try:
        try:
            status = fn(argv)
        except SystemExit:
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def run_command(command, fn, argv):
    """Run ``fn(argv)`` (a command's main) as the CLI does: its status; a paddle_rt error that escapes it is one line
    (EXIT_USAGE); a closed output pipe ends quietly (EXIT_BROKEN_PIPE); Ctrl-C is EXIT_INTERRUPTED."""
    from paddle_rt._core.errors import PaddleRTError
    try:
        status = fn(argv)
        sys.stdout.flush()
        return status or EXIT_OK
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return error(command, "interrupted", EXIT_INTERRUPTED)
    except PaddleRTError as exc:
        return error(command, str(exc))


def delay_us_arg(text):
    """``--delay-us`` (replay, view): an integer of microseconds, 0 to 10 s (rt_cpu's bounds of
    RT_CPU_STREAM_DELAY_US)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer number of microseconds") from None
    if not 0 <= n <= 10_000_000:
        raise argparse.ArgumentTypeError(f"{n} is outside 0..10000000 microseconds")
    return n
