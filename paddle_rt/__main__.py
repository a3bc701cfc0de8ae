"""``paddle-rt COMMAND`` (or ``python -m paddle_rt COMMAND``): demo, info, replay, capture, bench, check, plot, view."""
import sys

from paddle_rt.tools.cli import EXIT_USAGE, program, run_command, run_program


def _info(args):
    from paddle_rt.tools.info import main
    return main(args)


def _demo(args):
    from paddle_rt.tools.demo import main
    return main(args)


def _forward(module):
    def run(args):
        mod = __import__(f"paddle_rt.tools.{module}", fromlist=["main"])
        return mod.main(args)
    return run


COMMANDS = {
    "demo": (_demo, "walk through what paddle_rt does on the bundled rt_cpu plugin"),
    "info": (_info, "plugins, device types, devices with properties and memory, implemented and missing hooks"),
    "replay": (_forward("replay"), "replay an RMM-format allocation log through the allocator"),
    "capture": (_forward("capture"), "record the allocation log of a PyTorch CPU program (torch's profiler)"),
    "check": (_forward("check"), "conformance checks for a plugin .so (each check in a child process)"),
    "plot": (_forward("plot"), "memory timeline and segment map of a snapshot, a profiler trace or an allocation log"),
    "view": (_forward("view"), "an interactive memory viewer page (HTML, offline) of snapshots, histories, logs, traces"),
    "bench": (_forward("bench"), "run the benchmark suite: each figure with its target, met or missed"),
}


def usage(prog):
    """The text of ``paddle-rt --help``: every command with one line."""
    lines = [f"usage: {prog} COMMAND [OPTIONS...]", "",
             "paddle_rt: a device runtime for PaddlePaddle custom-device plugins (bundled: rt_cpu).", "", "commands:"]
    lines += [f"  {name:8s} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", f"`{prog} COMMAND --help` lists the command's options and their defaults; `{prog} --version` "
                  "prints the version.", "Exit statuses: 0 done, 1 a reported failure (check, bench, capture), 2 "
                  "nothing done (a wrong argument or input), 3 replay: does not fit (docs/cli.md)."]
    return "\n".join(lines)


def main(argv=None):
    """The program (the console script ``paddle-rt`` and ``python -m paddle_rt``); its exit status (docs/cli.md)."""
    return run_program(_main, list(sys.argv[1:] if argv is None else argv))


def _main(argv):
    prog = program()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog))
        return 0
    if argv[0] == "--version":
        from paddle_rt import __version__
        print(f"{prog} {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        what = "option" if argv[0].startswith("-") else "command"
        print(f"{prog}: unknown {what} {argv[0]!r}; the commands are {', '.join(COMMANDS)} (see `{prog} --help`)",
              file=sys.stderr)
        return EXIT_USAGE
    fn, _ = COMMANDS[argv[0]]
    try:
        return run_command(argv[0], fn, argv[1:])
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("paddle_rt.tools."):
            print(f"{prog}: the command {argv[0]!r} is not available in this build ({exc.name} missing)",
                  file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())
