"""``python -m paddle_rt replay --corpus DIR [DIR...]``: replay every allocation log of the folders, each in a fresh
process, and print one table: paddle_rt's peak reserved and device allocations next to the two anchors (faithful
models of Paddle's auto-growth rules and of PyTorch's caching allocator on an unbounded device) and the allocator's
targets on each trace. Each log is judged by the targets of the mode it was replayed in (the allocator's
``expandable_active``; the report names it):

chunks (``--conf expandable_segments:0``; bench/RESULTS.md, "Default allocator policy"):

- device allocations at most PyTorch's;
- peak reserved at most ``LIMIT`` (1.15) times Paddle's on every trace;
- the full goal, peak reserved at most ``GOAL`` (1.02) times Paddle's, on at least ``GOAL_SHARE`` (80%) of the traces.

expandable segments (rt_cpu's default; bench/RESULTS.md, "Expandable segments"): a device allocation is a physical
page created, so PyTorch's chunk count is no bound for it:

- pages created at most ``SEG_CHURN`` (1.1) times the pages at peak (peak reserved / granularity): no churn;
- peak reserved at most ``SEG_LIMIT`` (1.03) times Paddle's on every trace;
- the full goal, peak reserved at most ``GOAL`` (1.02) times Paddle's, on at least ``SEG_GOAL_SHARE`` (90%) of the
  traces.
"""
import json
import os
import sys

MiB = 1 << 20
GOAL = 1.02          # peak reserved / Paddle's: the full goal (both modes)
LIMIT = 1.15         # chunks: peak reserved / Paddle's, the bound on every trace
GOAL_SHARE = 0.80    # chunks: the share of traces that meet the full goal
SEG_LIMIT = 1.03     # segments: peak reserved / Paddle's, the bound on every trace
SEG_GOAL_SHARE = 0.90  # segments: the share of traces that meet the full goal
SEG_CHURN = 1.1      # segments: pages created / pages at peak, the bound on every trace
CHUNKS, SEGMENTS = "chunks", "expandable segments"


def folder_problem(folder):
    """Why ``folder`` gives the corpus no log (no such folder, not a folder, no .csv/.csv.gz in it), or None."""
    if not os.path.exists(folder):
        return f"--corpus {folder}: no such folder"
    if not os.path.isdir(folder):
        return f"--corpus {folder}: not a folder"
    if not any(f.endswith((".csv", ".csv.gz")) for f in os.listdir(folder)):
        return f"--corpus {folder} holds no allocation log (.csv or .csv.gz)"
    return None


def corpus_files(folders, problems=None):
    """Every .csv / .csv.gz log of ``folders`` (sorted by name within each folder). A folder that gives no log (see
    :func:`folder_problem`) raises InvalidArgument, or, when ``problems`` is a list, is skipped with its reason
    appended there."""
    from paddle_rt._core.errors import InvalidArgument
    out = []
    for d in folders:
        problem = folder_problem(d)
        if problem:
            if problems is None:
                raise InvalidArgument(f"replay {problem}")
            problems.append(problem)
            continue
        out += [os.path.join(d, f) for f in sorted(f for f in os.listdir(d) if f.endswith((".csv", ".csv.gz")))]
    return out


def pick(paths, names=None):
    """The logs of ``paths`` whose name (:func:`trace_name`) is one of the comma-separated ``names``, in their order;
    all of them when ``names`` is empty or None."""
    if not names:
        return list(paths)
    keep = set(n.strip() for n in names.split(","))
    return [p for p in paths if trace_name(p) in keep]


def trace_name(path):
    name = os.path.basename(path)
    return name[:-7] if name.endswith(".csv.gz") else name[:-4]


def replay_fresh(path, conf_text="", device=None):
    """The figures of ``replay PATH --json --baselines --no-min-capacity`` run in a fresh process (on rt_cpu an
    unbounded device, like the anchors' models, unless RT_CPU_MEMORY_BYTES is set)."""
    env = dict(os.environ)
    env.setdefault("RT_CPU_MEMORY_BYTES", str(64 << 30))
    from paddle_rt.tools.replay_child import replay_child
    r = replay_child([os.path.abspath(path), "--json", "--baselines", "--no-min-capacity", "--no-progress"],
                            device, conf_text, env)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"replay of {path} failed: {last}")
    return json.loads(r.stdout)


def verdict(peak, allocs, paddle_peak, torch_allocs):
    """Chunks: (peak / Paddle's, allocations within PyTorch's, "goal" | "within 1.15" | "MISS")."""
    ratio = peak / paddle_peak if paddle_peak else float("inf")
    allocs_ok = allocs <= torch_allocs
    return ratio, allocs_ok, _grade(ratio, allocs_ok, LIMIT)


def segments_verdict(peak, creations, paddle_peak, granularity):
    """Expandable segments: (peak / Paddle's, pages created within ``SEG_CHURN`` x the pages at peak, "goal" |
    "within 1.03" | "MISS")."""
    ratio = peak / paddle_peak if paddle_peak else float("inf")
    creations_ok = creations <= creation_bound(peak, granularity)
    return ratio, creations_ok, _grade(ratio, creations_ok, SEG_LIMIT)


def creation_bound(peak, granularity):
    """The most pages a replay in segments mode may create: ``SEG_CHURN`` x the pages of its peak reserved."""
    return SEG_CHURN * max(1.0, peak / granularity)


def _grade(ratio, count_ok, limit):
    if count_ok and ratio <= GOAL:
        return "goal"
    if count_ok and ratio <= limit:
        return f"within {limit:g}"
    return "MISS"


def mode_of(res):
    """The mode a replay's figures were made in: ``SEGMENTS`` when the allocator used expandable segments."""
    cfg = res.get("config", {})
    return SEGMENTS if cfg.get("expandable_active") and cfg.get("granularity") else CHUNKS


def row(path, res):
    mode = mode_of(res)
    gran = res.get("config", {}).get("granularity")
    if mode == SEGMENTS:
        ratio, allocs_ok, v = segments_verdict(res["peak_reserved"], res["device_allocs"],
                                               res["paddle"]["peak_reserved"], gran)
        bound = creation_bound(res["peak_reserved"], gran)
    else:
        ratio, allocs_ok, v = verdict(res["peak_reserved"], res["device_allocs"], res["paddle"]["peak_reserved"],
                                      res["torch"]["device_allocs"])
        bound = res["torch"]["device_allocs"]
    return {"trace": trace_name(path), "path": path, "mode": mode, "peak_live": res["peak_live_requested"],
            "peak_reserved": res["peak_reserved"], "device_allocs": res["device_allocs"],
            "paddle_peak": res["paddle"]["peak_reserved"], "paddle_allocs": res["paddle"]["device_allocs"],
            "torch_peak": res["torch"]["peak_reserved"], "torch_allocs": res["torch"]["device_allocs"],
            "ratio": ratio, "allocs_ok": allocs_ok, "alloc_bound": bound, "verdict": v,
            "maps": res.get("maps", 0), "unmaps": res.get("unmaps", 0), "ns_per_event": res.get("ns_per_event"),
            "granularity": gran}


def targets(mode):
    """(full goal share, bound on every trace) of ``mode``."""
    return (SEG_GOAL_SHARE, SEG_LIMIT) if mode == SEGMENTS else (GOAL_SHARE, LIMIT)


def summary(rows):
    """{"traces", "mode", "goal", "goal_share", "within_limit", "targets_met", "misses": [(trace, ratio, allocs,
    bound)]}: each row judged by its mode's targets (``mode``: the rows' mode; both names joined if they differ);
    the full goal's share is met per mode."""
    n = len(rows)
    goal = sum(r["verdict"] == "goal" for r in rows)
    within = sum(r["verdict"] != "MISS" for r in rows)
    misses = [(r["trace"], round(r["ratio"], 3), r["device_allocs"], r.get("alloc_bound", r.get("torch_allocs")))
              for r in rows if r["verdict"] != "goal"]
    modes = sorted({r.get("mode", CHUNKS) for r in rows})
    shares_met = all(sum(r["verdict"] == "goal" for r in rows if r.get("mode", CHUNKS) == m)
                     >= targets(m)[0] * sum(r.get("mode", CHUNKS) == m for r in rows) for m in modes)
    return {"traces": n, "mode": " and ".join(modes) if modes else CHUNKS, "goal": goal,
            "goal_share": goal / n if n else 0.0, "within_limit": within,
            "targets_met": within == n and n > 0 and shares_met, "misses": misses}


def table(rows):
    seg = bool(rows) and all(r.get("mode") == SEGMENTS for r in rows)
    count, bound = (("page creations", f"creations <= {SEG_CHURN:g} x pages at peak") if seg
                    else ("allocs", "allocs <= PyTorch"))
    lines = [f"| trace | peak live MiB | Paddle: peak MiB / allocs | PyTorch: peak MiB / allocs | paddle_rt: peak MiB "
             f"/ {count} | peak / Paddle | {bound} | target |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['peak_live'] / MiB:.1f} | {r['paddle_peak'] / MiB:.1f} / "
                     f"{r['paddle_allocs']} | {r['torch_peak'] / MiB:.1f} / {r['torch_allocs']} | "
                     f"{r['peak_reserved'] / MiB:.1f} / {r['device_allocs']} | {r['ratio']:.3f} | "
                     f"{'yes' if r['allocs_ok'] else 'NO'} | {r['verdict']} |")
    return "\n".join(lines)


def _mode_line(mode, rows):
    """Which mode was judged, with which targets, and how to judge the other one."""
    if mode == SEGMENTS:
        gran = next((r["granularity"] for r in rows if r.get("granularity")), None)
        page = f"{gran / MiB:g} MiB pages" if gran else "pages"
        return (f"judged: expandable segments ({page}; the allocator's mode on this device) by their targets: pages "
                f"created <= {SEG_CHURN:g} x the pages at peak, peak <= {SEG_LIMIT:g} x Paddle's on every trace, "
                f"<= {GOAL:g} x on {100 * SEG_GOAL_SHARE:.0f}% (--conf expandable_segments:0 judges the chunks)")
    if mode == CHUNKS:
        return (f"judged: chunks by their targets: device allocations <= PyTorch's, peak <= {LIMIT:g} x Paddle's "
                f"on every trace, <= {GOAL:g} x on {100 * GOAL_SHARE:.0f}%")
    return f"judged: each log by its own mode's targets ({mode})"


def summary_text(s, rows=()):
    seg = s.get("mode") == SEGMENTS
    share, limit = targets(s.get("mode", CHUNKS))
    count = f"page creations <= {SEG_CHURN:g} x the pages at peak" if seg else "allocations <= PyTorch's"
    out = [_mode_line(s.get("mode", CHUNKS), rows),
           f"{s['traces']} traces: full goal (peak <= {GOAL:g} x Paddle's, {count}) on {s['goal']} "
           f"({100 * s['goal_share']:.0f}%, target {100 * share:.0f}%); peak <= {limit:g} x Paddle's with "
           f"{count} on {s['within_limit']} of {s['traces']}: targets "
           f"{'met' if s['targets_met'] else 'MISSED'}"]
    if s["misses"]:
        over = "page creations >" if seg else "allocations >"
        out.append("not at the full goal: " + ", ".join(
            f"{t} ({ratio:.3f}x{'' if a <= ta else f', {a} {over} {ta:g}'})" for t, ratio, a, ta in s["misses"]))
    return "\n".join(out)


def main(folders, conf_text="", device=None, as_json=False, progress=None, strict=False, ahead=None):
    """Replay the corpus of ``folders`` and print its table (and whether the targets are met). A folder that gives no
    log is reported on stderr and the others still run; the status is then 2, else 1 when ``strict`` and the targets
    are missed, else 0. ``ahead``: (APIs, delay in µs) of ``--async``: each log is also replayed with the host waiting
    and running ahead (:mod:`paddle_rt.tools.replay_async`), in a second table; ``strict`` then judges its targets
    too."""
    from paddle_rt.tools.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, error
    problems = []
    paths = corpus_files(folders, problems)
    for p in problems:
        error("replay", p + " (skipped; the other folders run)" if len(problems) < len(folders) else p)
    if not paths:
        return EXIT_USAGE
    bar = progress("corpus", total=len(paths), unit="trace") if progress else None
    rows = []
    try:
        for p in paths:
            rows.append(row(p, replay_fresh(p, conf_text, device)))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    s = summary(rows)
    met = s["targets_met"]
    out = {"rows": rows, "summary": s}
    if ahead is not None:
        from paddle_rt.tools import replay_async
        logs = [(trace_name(p), p) for p in paths]
        out["async_rows"] = replay_async.corpus_rows(logs, device, conf_text, ahead[0], ahead[1], progress)
        out["async_summary"] = replay_async.corpus_summary(out["async_rows"])
        met = met and out["async_summary"]["met"]
    if as_json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print(table(rows))
        print()
        print(summary_text(s, rows))
        if ahead is not None:
            print()
            print(f"host waiting vs running ahead (device lag {ahead[1]} us per operation):")
            print(replay_async.corpus_table(out["async_rows"]))
            print()
            print(replay_async.corpus_summary_text(out["async_summary"]))
    if problems:
        return EXIT_USAGE
    return EXIT_FAILED if strict and not met else EXIT_OK
