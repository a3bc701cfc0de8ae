"""``paddle-rt bench [--quick] [--json] [--only AREA,...] [--strict]``: run the benchmark suite of the installed
package (every module of :mod:`paddle_rt.bench` that defines ``measure``) and print one table: each figure's median
with its spread over the repetitions (lowest .. highest), its target and the verdict.

Each ratio is measured within one run, alternately with its baseline, but absolute figures follow the machine's load:
the header gives the load average at the start and at the end. A target counts as missed (MISSED) only when the whole
spread misses it; a median that misses while some repetition meets it is "noise" (run again on a quiet machine).
``--quick`` takes fewer repetitions and smaller sizes. The exit status is 0 when every area ran, 1 when an area failed
to run or, with ``--strict``, when a target was missed; 2 for bad arguments.
"""
import json
import os
import platform
import sys
import time
import traceback
from paddle_rt.tools.cli import EXIT_USAGE, command_parser, error

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
            results.extend(benchmarks.normalized(r) for r in rows)
        except benchmarks.AreaSkipped as exc:
            errors.append({"area": name, "error": str(exc), "traceback": "", "skipped": True})
        except Exception as exc:      # one broken area does not stop the suite
            errors.append({"area": name, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(), "skipped": False})
        seconds[name] = time.perf_counter() - t0
    return results, errors, seconds


def _fmt_spread(r):
    if r.get("low") is None or r.get("high") is None:
        return ""
    return f"{_fmt_value(r['low'], r['unit'])} .. {_fmt_value(r['high'], r['unit'])}"


def format_table(results, errors=()):
    """One plain-text table: area, figure, median, spread (lowest .. highest repetition), target, verdict (met,
    noise: the median misses but the spread reaches the target, MISSED: the whole spread misses it)."""
    from paddle_rt.bench import normalized
    head = ("area", "figure", "median", "spread", "target", "result")
    rows = []
    results = [normalized(dict(r)) for r in results]
    for r in results:
        rows.append((r["area"], r["name"], _fmt_value(r["value"], r["unit"]), _fmt_spread(r), r["target"] or "",
                     r["verdict"] or ""))
    for e in errors:
        rows.append((e["area"], f"(skipped: {e['error']})" if e.get("skipped") else "(failed to run)", "", "", "",
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
    missed = [r for r in with_target if r["verdict"] == "MISSED"]
    noise = [r for r in with_target if r["verdict"] == "noise"]
    lines.append("")
    failed = [e for e in errors if not e.get("skipped")]
    skipped = [e for e in errors if e.get("skipped")]
    lines.append(f"{len(with_target)} figures with a target: {len(with_target) - len(missed) - len(noise)} met, "
                 + (f"{len(noise)} within noise (median misses, spread reaches), " if noise else "")
                 + f"{len(missed)} missed" + (f"; {len(failed)} area(s) failed to run" if failed else "")
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


def _load():
    """The 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _machine(load_start=None):
    load = _load()
    return {"cpus": os.cpu_count(), "loadavg_1min": load, "loadavg_1min_start": load_start,
            "loadavg_1min_end": load, "python": sys.version.split()[0], "platform": platform.platform()}


def _load_text(machine):
    start, end = machine["loadavg_1min_start"], machine["loadavg_1min_end"]
    if start is None or end is None:
        return ""
    busy = max(start, end) > 0.5 * (machine["cpus"] or 1)
    return (f", load {start:.1f} at the start and {end:.1f} at the end"
            + (" (a busy machine: absolute figures are noisy)" if busy else ""))


def main(argv=None):
    ap = command_parser(
        "bench",
        description=__doc__.split("\n\n", 1)[1].strip())
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--only", default=None, metavar="AREA[,AREA]", help="run only these areas (default: every area)")
    ap.add_argument("--list", action="store_true", help="list the areas and exit")
    ap.add_argument("--strict", action="store_true",
                    help="exit status 1 when a target is missed (its whole spread beyond it), for CI")
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
    load_start = _load()
    t0 = time.perf_counter()
    try:
        results, errors, seconds = run_suite(args.quick, only, log)
    except ValueError as exc:
        return error("bench", f"--only {args.only}: {exc}" if args.only else exc, EXIT_USAGE)
    total = time.perf_counter() - t0
    machine = _machine(load_start)
    if args.json:
        print(json.dumps({"paddle_rt": paddle_rt.__version__, "quick": args.quick, "device": _device_name(),
                          "machine": machine, "seconds": {"total": total, **seconds}, "results": results,
                          "errors": errors}, indent=1))
    else:
        print(f"paddle_rt {paddle_rt.__version__} benchmarks{' (quick)' if args.quick else ''} on "
              f"{_device_name()}, python {machine['python']}, {machine['cpus']} CPUs{_load_text(machine)}; "
              f"medians and spreads over the repetitions; {total:.0f} s")
        print()
        print(format_table(results, errors))
        for e in errors:
            if not e.get("skipped"):
                print(f"\n{e['area']}:\n{e['traceback']}", file=sys.stderr)
    if any(not e.get("skipped") for e in errors):
        return 1
    from paddle_rt.bench import normalized
    if args.strict and any(normalized(dict(r))["verdict"] == "MISSED" for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
