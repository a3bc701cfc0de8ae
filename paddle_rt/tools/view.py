"""``paddle-rt view FILE... -o page.html``: an interactive memory viewer in one self-contained HTML file (it works
offline: plotly.js and the data are inside). Needs plotly: ``pip install "paddle_rt[view]"``.

Each FILE is recognised by its content (gzip'd or not): a memory snapshot (``paddle_rt.memory.dump_snapshot``), a
recorded history (the same after ``record_history()``), an allocation log in RMM's CSV format (``dump_trace``,
``paddle-rt capture``: replayed through the allocator, once per ``--conf``), or a profiler trace
(``Profiler.export_chrome_trace``). Every run is drawn on one time axis, with the difference of each run's peak from
the first's.

    paddle-rt view snap.json -o snap.html
    paddle-rt view log.csv.gz --conf growth:fixed --conf growth:adaptive --baselines -o compare.html
    paddle-rt view log.csv.gz --async -o ahead.html
"""
import sys

__all__ = ["view", "main"]


def _conf_list(conf):
    if conf is None:
        return [""]
    if isinstance(conf, (str, dict)):
        conf = [conf]
    out = []
    for c in conf:
        if isinstance(c, dict):
            c = ",".join(f"{k}:{v}" for k, v in c.items())
        out.append(c or "")
    return out or [""]


def view(*sources, output=None, conf=None, baselines=False, device=None, labels=None, title=None, ahead=False,
         delay_us=None):
    """Build the viewer page of ``sources`` (paths, or snapshot dicts as ``paddle_rt.memory.history()`` returns) and return it as a :class:`~paddle_rt.tools.view_page.Page` (shown
    inline in Jupyter); ``output``: also write it there. ``conf``: allocator configurations (``"key:value,..."`` or
    dicts) an allocation log is replayed under, one run each; ``baselines``: add Paddle's and PyTorch's allocator
    models' runs of a log; ``device``: only that device (replays run on it); ``labels``: a name per source;
    ``ahead``: also replay each log with the host waiting and running ahead of a lagging device (both APIs,
    :mod:`paddle_rt.tools.replay_async`; ``delay_us`` per device operation, default 20), shown side by side in a
    table of the page."""
    from paddle_rt.tools import view_data, view_page
    view_page.require_plotly()
    if not sources:
        raise ValueError("view: give at least one source (paddle_rt.memory.view() views the current history)")
    runs = []
    for k, src in enumerate(sources):
        label = labels[k] if labels is not None and k < len(labels) else None
        if isinstance(src, dict):
            name = label or "history"
            for dev, ev in view_data.events_from_history(src, name).items():
                if device is None or dev == str(device):
                    runs.append(view_data.build_run(ev, label=f"{name} {dev}", source="(in memory)",
                                                    kind="history" if len(ev) else "snapshot"))
            continue
        import os
        path = os.fspath(src)
        kind, _ = view_data.detect_kind(path)
        if kind == "alloc_log":
            confs = _conf_list(conf)
            for j, c in enumerate(confs):
                log_runs = view_data.load_source(path, c, device, label=label, baselines=baselines and j == 0)
                if ahead and log_runs:
                    log_runs[0]["ahead"] = _ahead(path, c, device, delay_us)
                runs += log_runs
        else:
            runs += view_data.load_source(path, "", device, label=label)
    page = view_page.build_page(runs, title=title)
    if output is not None:
        page.save(output)
    return page


def _ahead(path, conf_text, device, delay_us):
    """The figures of ``paddle-rt replay PATH --async --api both`` (paddle_rt/tools/replay_async.py), run as a child
    by module name (this module is imported by paddle_rt.memory: it imports no replay module)."""
    import json
    import os
    from paddle_rt.tools.replay_child import replay_child
    from paddle_rt.tools.view_data import ViewInputError
    args = [os.path.abspath(path), "--async", "--api", "both", "--json", "--no-min-capacity", "--no-progress"]
    if delay_us is not None:
        args += ["--delay-us", str(delay_us)]
    r = replay_child(args, device, conf_text, dict(os.environ))
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        raise ViewInputError(f"{path}: --async: " + (lines[-1] if lines else f"status {r.returncode}"))
    return json.loads(r.stdout)["async"]


def main(argv=None):
    from paddle_rt.tools.cli import EXIT_OK, EXIT_USAGE, command_parser, delay_us_arg, error, output_path_problem
    ap = command_parser("view", description=__doc__.split("\n\n")[0].replace("``", ""),
                        epilog="\n\n".join(__doc__.split("\n\n")[1:]).replace("``", ""))
    ap.add_argument("files", nargs="+", metavar="FILE",
                    help="snapshot or history JSON, allocation log CSV, profiler trace JSON (.gz too)")
    ap.add_argument("-o", "--output", required=True, help="the HTML page to write")
    ap.add_argument("--conf", action="append", default=None, metavar="K:V,...",
                    help="replay allocation logs under this allocator configuration; repeat for one run each "
                         "(default: the allocator's own)")
    ap.add_argument("--baselines", action="store_true",
                    help="add Paddle's auto-growth and PyTorch's caching allocator models' runs of each log")
    ap.add_argument("--device", default=None, help="only this device (replays run on it)")
    ap.add_argument("--title", default=None, help="the page's title")
    ap.add_argument("--async", dest="run_ahead", action="store_true",
                    help="also replay each allocation log with the host waiting and running ahead of a lagging "
                         "device (both APIs), side by side in a table (as paddle-rt replay --async)")
    ap.add_argument("--delay-us", type=delay_us_arg, default=None, metavar="N",
                    help="with --async: rt_cpu's delay per stream operation (default: 20)")
    args = ap.parse_args(argv)
    if args.delay_us is not None and not args.run_ahead:
        ap.error("--delay-us goes with --async")
    problem = output_path_problem(args.output, "--output")      # before a long replay, not after it
    if problem:
        return error("view", problem)
    from paddle_rt.tools.figures import MissingExtraError
    from paddle_rt.tools.view_data import ViewInputError
    from paddle_rt._core.errors import PaddleRTError
    try:
        page = view(*args.files, output=args.output, conf=args.conf, baselines=args.baselines, device=args.device,
                    title=args.title, ahead=args.run_ahead, delay_us=args.delay_us)
    except (MissingExtraError, ViewInputError, PaddleRTError) as exc:
        return error("view", str(exc), EXIT_USAGE)
    except OSError as exc:
        return error("view", f"--output {args.output}: cannot write ({exc.strerror or exc})", EXIT_USAGE)
    n = len(page.runs)
    print(f"wrote {args.output} ({n} run{'s' if n != 1 else ''}, {len(page.html) / (1 << 20):.1f} MiB)")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
