"""``python -m paddle_rt bench [--quick] [--json] [--only AREA,...]``: run the benchmark suite of the installed
package (every module of :mod:`paddle_rt.bench` that defines ``measure``) and print one table: each
figure, its target and whether this run met it.

Figures are medians of several repetitions and ratios are measured within one run, but absolute figures follow the
machine's load: run it on a quiet machine. ``--quick`` takes fewer repetitions and smaller sizes (well under a minute
on two cores). The exit status is 0 when every area ran (targets missed or not), 1 when an area failed to run, 2 for
bad arguments.
"""
import json
import os
import platform
import sys
import time
import traceback
from paddle_rt.tools.cli import command_parser

__all__ = ["run_suite", "format_table", "main"]


def _fmt_value(v, unit):
    a = abs(v)
    text = f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}"
    return f"{text}{unit}" if unit in ("x", "%") else f"{text} {unit}"


def run_suite(quick=False, only=None, log=None):
    """Run the areas (all, or the names in ``only``); returns (results, errors, seconds per area). An area that
    raises is reported in ``errors`` ({"area", "error", "traceback"}; ``"skipped": True`` when it raised
    ``AreaSkipped``) and the others still run."""
    from paddle_rt import bench as benchmarks
    names = benchmarks.area_names()
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ValueError(f"unknown area(s) {', '.join(unknown)}; the areas are {', '.join(names)}")
        names = [n for n in names if n in only]
    results, errors, seconds = [], [], {}
    for name in names:
        t0 = time.perf_counter()
        try:
            mod = benchmarks.load_area(name)
            if mod is None:
                continue
            if log:
                log(f"bench: {name}...")
            rows = mod.measure(quick)
            for r in rows:
                missing = {"area", "name", "value", "unit", "target", "met", "note"} - set(r)
                if missing:
                    raise TypeError(f"{name}.measure() returned a figure without {sorted(missing)}: {r!r}")
            results.extend(rows)
        except benchmarks.AreaSkipped as exc:
            errors.append({"area": name, "error": str(exc), "traceback": "", "skipped": True})
        except Exception as exc:      # one broken area does not stop the suite
            errors.append({"area": name, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(), "skipped": False})
        seconds[name] = time.perf_counter() - t0
    return results, errors, seconds


def format_table(results, errors=()):
    """One plain-text table: area, figure, value, target, met / MISSED."""
    head = ("area", "figure", "value", "target", "result")
    rows = []
    for r in results:
        verdict = "" if r["met"] is None else ("met" if r["met"] else "MISSED")
        rows.append((r["area"], r["name"], _fmt_value(r["value"], r["unit"]), r["target"] or "", verdict))
    for e in errors:
        rows.append((e["area"], f"(skipped: {e['error']})" if e.get("skipped") else "(failed to run)", "", "",
                     "skipped" if e.get("skipped") else "ERROR"))
    widths = [max(len(h), *(len(x[i]) for x in rows)) if rows else len(h) for i, h in enumerate(head)]
    widths[1] = min(widths[1], 64)
    lines = ["  ".join(h.ljust(w) if i != 2 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))),
             "  ".join("-" * w for w in widths)]
    prev = None
    for row in rows:
        area = row[0] if row[0] != prev else ""
        prev = row[0]
        cells = (area,) + row[1:]
        lines.append("  ".join(c.rjust(w) if i == 2 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
                     .rstrip())
    with_target = [r for r in results if r["met"] is not None]
    missed = [r for r in with_target if not r["met"]]
    lines.append("")
    failed = [e for e in errors if not e.get("skipped")]
    skipped = [e for e in errors if e.get("skipped")]
    lines.append(f"{len(with_target)} figures with a target: {len(with_target) - len(missed)} met, "
                 f"{len(missed)} missed" + (f"; {len(failed)} area(s) failed to run" if failed else "")
                 + (f"; {len(skipped)} skipped" if skipped else ""))
    for e in failed:
        lines.append(f"  {e['area']}: {e['error']}")
    return "\n".join(lines)


def _device_name():
    import paddle_rt
    try:
        return str(paddle_rt.get_device())
    except Exception:           # no device at all: the areas say what they could not do
        return "no device"


def _machine():
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "loadavg_1min": load, "python": sys.version.split()[0],
            "platform": platform.platform()}


def main(argv=None):
    ap = command_parser(
        "bench",
        description="Run the benchmark suite (every module of paddle_rt.bench that defines measure) and "
                    "print one table: each figure, its target and whether this run met it. Exit status 1 when an "
                    "area failed to run (missed targets do not change it).")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes (under a minute)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--only", default=None, metavar="AREA[,AREA]", help="run only these areas")
    ap.add_argument("--list", action="store_true", help="list the areas and exit")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # idle BLAS threads would steal the measured CPU
    import paddle_rt
    from paddle_rt import bench as benchmarks
    if args.list:
        for name in benchmarks.area_names():
            print(name)
        return 0
    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only else None
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if not args.json and sys.stderr.isatty() else None
    t0 = time.perf_counter()
    try:
        results, errors, seconds = run_suite(args.quick, only, log)
    except ValueError as exc:
        print(f"paddle_rt bench: {exc}", file=sys.stderr)
        return 2
    total = time.perf_counter() - t0
    machine = _machine()
    if args.json:
        print(json.dumps({"paddle_rt": paddle_rt.__version__, "quick": args.quick, "device": _device_name(),
                          "machine": machine, "seconds": {"total": total, **seconds}, "results": results,
                          "errors": errors}, indent=1))
    else:
        load = f", load {machine['loadavg_1min']:.1f}" if machine["loadavg_1min"] is not None else ""
        print(f"paddle_rt {paddle_rt.__version__} benchmarks{' (quick)' if args.quick else ''} on "
              f"{_device_name()}, python {machine['python']}, {machine['cpus']} CPUs{load}; "
              f"medians; {total:.0f} s")
        print()
        print(format_table(results, errors))
        for e in errors:
            if not e.get("skipped"):
                print(f"\n{e['area']}:\n{e['traceback']}", file=sys.stderr)
    return 1 if any(not e.get("skipped") for e in errors) else 0


if __name__ == "__main__":
    sys.exit(main())
