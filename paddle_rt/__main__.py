"""``python -m paddle_rt COMMAND``: demo, info, replay, capture, bench, check, plot."""
import argparse
import sys


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
    "bench": (_forward("bench"), "run the benchmark suite: each figure with its target, met or missed"),
}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m paddle_rt COMMAND [ARGS...]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    fn, _ = COMMANDS[argv[0]]
    try:
        return fn(argv[1:]) or 0
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("paddle_rt.tools."):
            print(f"paddle_rt: the command {argv[0]!r} is not available in this build ({exc.name} missing)",
                  file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
