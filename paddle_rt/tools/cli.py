"""The command line's common parts: the program's name as the user typed it, and the argument parser every command
uses (its ``--help`` lists each option with its default; a wrong option or value is one line and exit status 2)."""
import argparse
import os
import sys

__all__ = ["program", "command_parser", "CommandParser", "usage_error"]


def program():
    """How the user started paddle_rt: the installed command's name (``paddle-rt``), or ``python -m paddle_rt``
    when Python ran the package (``sys.argv[0]`` is then the package's ``__main__.py``)."""
    arg0 = sys.argv[0] if sys.argv else ""
    base = os.path.basename(arg0)
    if not base or base in ("-c", "-m") or base.endswith(".py"):
        return "python -m paddle_rt"
    return base


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
