"""``python -m paddle_rt plot INPUT -o out.png``: a memory timeline (allocated and reserved bytes over time) and a
segment map (each segment's blocks, the free holes highlighted), drawn with matplotlib (``pip install
"paddle_rt[plot]"``).

INPUT is recognised by its content (gzip-compressed or not):

- a memory snapshot written by ``paddle_rt.memory.dump_snapshot(path)`` (``"format": "paddle_rt.memory_snapshot"``):
  the timeline comes from its allocation history (``trace``), the segment map from its ``segments``;
- a Chrome trace (Trace Event Format) exported by the profiler: the timeline from its ``"memory"`` counter events, one
  per device (``pid``, named by the ``process_name`` metadata); no segment map;
- an allocation log in RMM's CSV format (``Thread,Time,Action,Pointer,Size,Stream``): replayed through paddle_rt's
  allocator (``--device``, ``--conf`` as for ``replay``); the timeline over the log's events plus the segment map at
  its end.

From Python: ``paddle_rt.tools.plot.plot_memory(data, "out.png")`` where ``data`` is a path, a snapshot or Chrome
trace object (as loaded from JSON), or what :func:`load_memory_data` returns.
"""
import argparse
import gzip
import io
import json
import os
import sys

__all__ = ["MissingExtraError", "load_memory_data", "from_snapshot", "from_chrome_trace", "from_rmm_trace",
           "from_replay",
           "plot_memory", "require_matplotlib", "main"]

MiB = 1 << 20
PLOT_EXTRA = 'pip install "paddle_rt[plot]"'
SNAPSHOT_FORMAT = "paddle_rt.memory_snapshot"
MAX_SEGMENT_ROWS = 40          # segments drawn per device; beyond, those with the most free bytes
MAX_TIMELINE_POINTS = 20_000   # longer series are reduced to per-bucket maxima (the peaks stay visible)

COLOR_ALLOCATED = "#3b6fb6"
COLOR_RESERVED = "#d9822b"
COLOR_REQUESTED = "#5aa469"
COLOR_FREE = "#f2b134"


class MissingExtraError(ImportError):
    """An optional dependency (an extra of the paddle_rt package) is not installed."""


def _error(msg):
    from paddle_rt._core.errors import InvalidArgument
    return InvalidArgument(msg)


def require_matplotlib():
    """Import matplotlib (the ``plot`` extra) or raise :class:`MissingExtraError` saying how to install it."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise MissingExtraError(f"plotting needs matplotlib, which is not installed: {PLOT_EXTRA}") from exc
    return matplotlib, Figure, FigureCanvasAgg


# ---------------------------------------------------------------------------------------------------------------------
# Reading the inputs into one form:
#   {"source": str, "kind": "snapshot" | "chrome_trace" | "rmm_trace",
#    "devices": [{"device": str, "time": [float], "time_unit": "ms" | "event", "allocated": [int], "reserved": [int],
#                 "requested": [int] or None, "markers": [(time, "oom" | "empty_cache")], "note": str or None,
#                 "segments": [segment dicts as in a snapshot] or None}]}

def _read_bytes(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise _error(f"plot: {path}: broken gzip data ({exc})") from None
    return raw


def load_memory_data(path, device=None, conf=None, progress=None):
    """Read a snapshot, a Chrome trace or an RMM allocation log (recognised by content) into the plotting form.
    ``device`` keeps only that device (snapshot, Chrome trace) or replays the log on it; ``conf`` is the allocator
    configuration for a replay (dict or ``"key:value,..."``)."""
    if not os.path.exists(path):
        raise _error(f"plot: {path}: no such file")
    raw = _read_bytes(path)
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise _error(f"plot: {path}: not valid JSON ({exc})") from None
        if isinstance(obj, dict) and "format" in obj:
            data = from_snapshot(obj, source=path)
        elif isinstance(obj, list) or (isinstance(obj, dict) and "traceEvents" in obj):
            data = from_chrome_trace(obj, source=path)
        else:
            raise _error(f"plot: {path}: JSON that is neither a paddle_rt memory snapshot (no \"format\" key) nor a "
                         f"Chrome trace (no \"traceEvents\")")
        if device is not None:
            data["devices"] = [d for d in data["devices"] if d["device"] == str(device)]
            if not data["devices"]:
                raise _error(f"plot: {path} has no data for device {device}")
        return data
    first = raw.split(b"\n", 1)[0].decode("utf-8", "replace")
    cols = {c.strip() for c in first.split(",")}
    if {"Action", "Pointer", "Size"} <= cols:
        return from_rmm_trace(path, device=device, conf=conf, progress=progress)
    raise _error(f"plot: {path}: not a memory snapshot, a Chrome trace or an RMM allocation log "
                 f"(first line {first[:60]!r})")


def _int(v, what):
    if isinstance(v, bool) or not isinstance(v, int):
        raise _error(f"plot: {what} is not an integer ({v!r})")
    return v


def _history_series(device, trace, segments, t0=None):
    """Replay a snapshot's history into allocated/reserved series. History may start after memory was already in
    use: blocks and segments that are live at the end (or freed) without an alloc event in the history were there
    from the start, and are counted in the starting level."""
    events = []
    for i, ev in enumerate(trace):
        if not isinstance(ev, dict) or "action" not in ev:
            raise _error(f"plot: {device}: trace entry {i} has no \"action\"")
        events.append(ev)
    have_time = all(isinstance(ev.get("time_ns"), (int, float)) for ev in events)
    if have_time:
        events.sort(key=lambda ev: ev["time_ns"])
    live, segs = {}, {}
    alloc_unknown = seg_unknown = 0
    deltas = []           # (time, d_allocated, d_reserved)
    markers = []
    if t0 is None:
        t0 = events[0]["time_ns"] if have_time and events else 0
    for i, ev in enumerate(events):
        t = (ev["time_ns"] - t0) / 1e6 if have_time else float(i)
        act = ev["action"]
        addr = ev.get("addr")
        size = ev.get("size", 0) or 0
        if act == "alloc":
            live[addr] = _int(size, f"{device}: trace entry {i} size")
            deltas.append((t, size, 0))
        elif act == "free":
            n = live.pop(addr, None)
            if n is None:
                n = _int(size, f"{device}: trace entry {i} size")
                alloc_unknown += n
            deltas.append((t, -n, 0))
        elif act == "segment_alloc":
            segs[addr] = _int(size, f"{device}: trace entry {i} size")
            deltas.append((t, 0, size))
        elif act == "segment_free":
            n = segs.pop(addr, None)
            if n is None:
                n = _int(size, f"{device}: trace entry {i} size")
                seg_unknown += n
            deltas.append((t, 0, -n))
        elif act in ("oom", "empty_cache"):
            markers.append((t, act))
        else:
            raise _error(f"plot: {device}: trace entry {i} has unknown action {act!r}")
    # what the segments hold at the end but the history never allocated was there before it started
    for seg in segments or ():
        if seg["address"] not in segs:
            seg_unknown += seg["total_size"]
        for b in seg.get("blocks", ()):
            if b.get("state") == "active_allocated" and b["address"] not in live:
                alloc_unknown += b["size"]
    time, allocated, reserved = [], [], []
    a, r = alloc_unknown, seg_unknown
    if deltas:
        time.append(deltas[0][0])
        allocated.append(a)
        reserved.append(r)
    for t, da, dr in deltas:
        a += da
        r += dr
        time.append(t)
        allocated.append(a)
        reserved.append(r)
    last = markers[-1][0] if markers else None
    if time and last is not None and last > time[-1]:     # the timeline runs to the last event (e.g. an OOM)
        time.append(last)
        allocated.append(a)
        reserved.append(r)
    return time, allocated, reserved, markers, ("ms" if have_time else "event")


def _check_segments(device, segments):
    if not isinstance(segments, list):
        raise _error(f"plot: {device}: \"segments\" is not a list")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise _error(f"plot: {device}: segment {i} is not an object")
        for key in ("address", "total_size"):
            _int(seg.get(key), f"{device}: segment {i} {key}")
        for j, b in enumerate(seg.get("blocks", ())):
            for key in ("address", "size"):
                _int(b.get(key) if isinstance(b, dict) else None, f"{device}: segment {i} block {j} {key}")
    return segments


def from_snapshot(obj, source="<snapshot>"):
    """The plotting form of a ``paddle_rt.memory.dump_snapshot`` object (format version 1)."""
    if obj.get("format") != SNAPSHOT_FORMAT:
        raise _error(f"plot: {source}: format {obj.get('format')!r} is not {SNAPSHOT_FORMAT!r}")
    if obj.get("version") != 1:
        raise _error(f"plot: {source}: snapshot version {obj.get('version')!r} is not supported (this paddle_rt "
                     f"reads version 1)")
    devices = obj.get("devices")
    if not isinstance(devices, dict):
        raise _error(f"plot: {source}: \"devices\" is not an object")
    stamps = [ev["time_ns"] for d in devices.values() if isinstance(d, dict) and isinstance(d.get("trace"), list)
              for ev in d["trace"] if isinstance(ev, dict) and isinstance(ev.get("time_ns"), (int, float))]
    t0 = min(stamps) if stamps else None      # one clock for every device
    out = []
    for name, d in devices.items():
        if not isinstance(d, dict):
            raise _error(f"plot: {source}: device {name!r} is not an object")
        segments = _check_segments(name, d.get("segments") or [])
        trace = d.get("trace") or []
        if not isinstance(trace, list):
            raise _error(f"plot: {name}: \"trace\" is not a list")
        if not segments and not trace:
            continue
        time, allocated, reserved, markers, unit = _history_series(name, trace, segments, t0)
        note = None if trace else ("no allocation history in this snapshot: call paddle_rt.memory.record_history() "
                                   "before the work to get a timeline")
        out.append({"device": name, "time": time, "time_unit": unit, "allocated": allocated, "reserved": reserved,
                    "requested": None, "markers": markers, "note": note, "segments": segments})
    if not out:
        raise _error(f"plot: {source}: the snapshot holds no segments and no history on any device")
    return {"source": source, "kind": "snapshot", "devices": out}


def from_chrome_trace(obj, source="<trace>"):
    """The plotting form of a Chrome trace: the ``"C"`` (counter) events named ``memory`` (and ``memory (pinned
    host)``, drawn as a device of its own) with args ``allocated`` and ``reserved``, per ``pid`` (named by
    ``process_name`` metadata); ``ts`` in microseconds. Instant events ``oom`` and ``empty_cache`` (category
    ``memory``) become markers."""
    events = obj["traceEvents"] if isinstance(obj, dict) else obj
    if not isinstance(events, list):
        raise _error(f"plot: {source}: \"traceEvents\" is not a list")
    names, series, marks = {}, {}, {}
    for ev in events:
        if not isinstance(ev, dict):
            continue
        ph, name = ev.get("ph"), ev.get("name")
        if ph == "M" and name == "process_name":
            names[ev.get("pid")] = str((ev.get("args") or {}).get("name", ev.get("pid")))
        elif ph == "C" and name in ("memory", "memory (pinned host)"):
            args = ev.get("args") or {}
            ts = ev.get("ts")
            if not isinstance(ts, (int, float)):
                raise _error(f"plot: {source}: a memory counter event has no numeric \"ts\"")
            series.setdefault((ev.get("pid"), name), []).append((ts, args.get("allocated"), args.get("reserved")))
        elif ph == "i" and ev.get("cat") == "memory" and name in ("oom", "empty_cache") \
                and isinstance(ev.get("ts"), (int, float)):
            marks.setdefault(ev.get("pid"), []).append((ev["ts"], name))
    if not series:
        raise _error(f"plot: {source}: no memory counters in this trace (Chrome trace \"C\" events named "
                     f"\"memory\"): was memory recorded by the profiler?")
    t0 = min(p[0] for pts in series.values() for p in pts)
    out = []
    for (pid, name), pts in series.items():
        pts.sort(key=lambda p: p[0])
        time, allocated, reserved = [], [], []
        a = r = 0
        for ts, pa, pr in pts:
            a = pa if pa is not None else a          # a counter event may carry only one of the two
            r = pr if pr is not None else r
            time.append((ts - t0) / 1000.0)
            allocated.append(a)
            reserved.append(r)
        label = names.get(pid, f"pid {pid}") + (" pinned host" if name != "memory" else "")
        markers = sorted(((ts - t0) / 1000.0, k) for ts, k in marks.get(pid, ())) if name == "memory" else []
        out.append({"device": label, "time": time, "time_unit": "ms", "allocated": allocated,
                    "reserved": reserved, "requested": None, "markers": markers, "note": None, "segments": None})
    out.sort(key=lambda d: d["device"])
    return {"source": source, "kind": "chrome_trace", "devices": out}


def from_rmm_trace(path, device=None, conf=None, progress=None):
    """Replay an RMM allocation log through the allocator and return its timeline (per event, maxima of each
    sampling interval) and the segments at its end (before the replay gives its memory back)."""
    from paddle_rt.tools import replay
    if isinstance(conf, str):
        conf = replay._conf_dict(conf)
    return from_replay(replay.run_once(path, device, conf or {}, record=True, progress=progress), path)


def from_replay(res, source):
    """The plotting form of ``replay.run_once(..., record=True)``'s result."""
    tl = res["timeline"]
    return {"source": source, "kind": "rmm_trace", "devices": [{
        "device": res["device"], "time": tl["event"], "time_unit": "event", "allocated": tl["allocated"],
        "reserved": tl["reserved"], "requested": tl["requested"], "markers": [],
        "note": (f"maxima over every {tl['stride']} events" if tl["stride"] > 1 else None),
        "segments": res["segments"]}], "replay": {k: v for k, v in res.items() if k not in ("timeline", "segments")}}


def _as_data(data):
    if isinstance(data, (str, os.PathLike)):
        return load_memory_data(os.fspath(data))
    if isinstance(data, dict) and "devices" in data and isinstance(data["devices"], list):
        return data
    if isinstance(data, dict) and "format" in data:
        return from_snapshot(data)
    if isinstance(data, list) or (isinstance(data, dict) and "traceEvents" in data):
        return from_chrome_trace(data)
    raise _error("plot_memory: data must be a path, a memory snapshot, a Chrome trace or load_memory_data()'s result")


# ---------------------------------------------------------------------------------------------------------------------
# Drawing

def _reduce(time, *series, limit=MAX_TIMELINE_POINTS):
    """At most ``limit`` points: each bucket keeps its first time and the maxima of the series."""
    import numpy as np
    n = len(time)
    if n <= limit:
        return (list(time),) + tuple(list(s) for s in series)
    starts = np.linspace(0, n, limit, endpoint=False).astype(np.int64)
    t = np.asarray(time, dtype=np.float64)[starts]
    return (t,) + tuple(np.maximum.reduceat(np.asarray(s, dtype=np.float64), starts) for s in series)


def _fmt_mib(n):
    return f"{n / MiB:,.1f} MiB"


def _fmt_size(n):
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} B"


def _draw_timeline(ax, d):
    import numpy as np
    unit = "time (ms)" if d["time_unit"] == "ms" else "event"
    if not d["time"]:
        ax.text(0.5, 0.5, d["note"] or "no timeline", ha="center", va="center", transform=ax.transAxes, wrap=True)
        ax.set_title(f"{d['device']}: memory over time", loc="left", fontweight="bold")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    series = [d["reserved"], d["allocated"]] + ([d["requested"]] if d["requested"] is not None else [])
    reduced = _reduce(d["time"], *series)
    t = reduced[0]
    labels = [("reserved", COLOR_RESERVED, "-", 1.6), ("allocated", COLOR_ALLOCATED, "-", 1.6),
              ("live requested", COLOR_REQUESTED, "--", 1.0)]
    for values, full, (label, color, style, width) in zip(reduced[1:], series, labels):
        v = np.asarray(values, dtype=np.float64) / MiB
        ax.step(t, v, where="post", color=color, linestyle=style, linewidth=width,
                label=f"{label} (peak {_fmt_mib(max(full))}, end {_fmt_mib(full[-1])})")
        if label == "allocated":
            ax.fill_between(t, v, step="post", color=color, alpha=0.15)
    seen = set()
    for tm, kind in d["markers"]:
        style = dict(color="#c0392b", linestyle="--", linewidth=1.0) if kind == "oom" else \
            dict(color="#7f7f7f", linestyle=":", linewidth=1.0)
        label = {"oom": "out of memory", "empty_cache": "empty_cache"}[kind]
        ax.axvline(tm, label=None if kind in seen else label, **style)
        seen.add(kind)
    ax.set_xlabel(unit)
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    title = f"{d['device']}: memory over time"
    if d.get("note"):
        title += f" ({d['note']})"
    ax.set_title(title, loc="left", fontweight="bold")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small", framealpha=0.9)


def _segment_ranges(seg):
    """(allocated ranges, free ranges) in MiB from the segment start, adjacent blocks of one state merged."""
    base = seg["address"]
    alloc, free = [], []
    blocks = sorted(seg.get("blocks", ()), key=lambda b: b["address"])
    for b in blocks:
        dst = alloc if b.get("state") == "active_allocated" else free
        start = (b["address"] - base) / MiB
        width = b["size"] / MiB
        if dst and abs(dst[-1][0] + dst[-1][1] - start) < 1e-12:
            dst[-1] = (dst[-1][0], dst[-1][1] + width)
        else:
            dst.append((start, width))
    return alloc, free


def segment_summary(segments):
    """Totals over a list of segments: reserved, allocated, free bytes, number of free holes, largest hole."""
    reserved = allocated = free = holes = largest = 0
    for seg in segments:
        reserved += seg["total_size"]
        for b in seg.get("blocks", ()):
            if b.get("state") == "active_allocated":
                allocated += b["size"]
            else:
                free += b["size"]
                holes += 1
                largest = max(largest, b["size"])
    return {"segments": len(segments), "reserved": reserved, "allocated": allocated, "free": free, "holes": holes,
            "largest_hole": largest}


def _draw_segments(ax, d):
    segments = sorted(d["segments"], key=lambda s: s["address"])
    s = segment_summary(segments)
    shown = segments
    if len(segments) > MAX_SEGMENT_ROWS:
        def free_bytes(seg):
            return sum(b["size"] for b in seg.get("blocks", ()) if b.get("state") != "active_allocated")
        keep = sorted(segments, key=free_bytes, reverse=True)[:MAX_SEGMENT_ROWS]
        keep_ids = {id(x) for x in keep}
        shown = [x for x in segments if id(x) in keep_ids]
    labels = []
    for row, seg in enumerate(shown):
        alloc, free = _segment_ranges(seg)
        y = (row - 0.4, 0.8)
        ax.broken_barh([(0, seg["total_size"] / MiB)], y, facecolors="none", edgecolors="#444444", linewidth=0.6)
        if alloc:
            ax.broken_barh(alloc, y, facecolors=COLOR_ALLOCATED, edgecolors="white", linewidth=0.3)
        if free:
            ax.broken_barh(free, y, facecolors=COLOR_FREE, edgecolors="#b5651d", linewidth=0.3, hatch="//")
        kind = seg.get("segment_type", "")
        labels.append(f"0x{seg['address']:x} {kind} {_fmt_size(seg['total_size'])}")
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels(labels, fontsize=7 if len(shown) > 16 else 8, family="monospace")
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(left=0)
    ax.set_xlabel("offset in segment (MiB)")
    ax.grid(True, axis="x", alpha=0.3)
    more = f", showing the {len(shown)} with the most free bytes" if len(shown) < len(segments) else ""
    ax.set_title(f"{d['device']}: segments ({s['segments']}{more})\n"
                 f"reserved {_fmt_size(s['reserved'])}, allocated {_fmt_size(s['allocated'])}, free "
                 f"{_fmt_size(s['free'])} in {s['holes']} hole{'' if s['holes'] == 1 else 's'}, largest hole "
                 f"{_fmt_size(s['largest_hole'])}", loc="left", fontweight="bold", fontsize="medium")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(facecolor=COLOR_ALLOCATED, label="allocated block"),
                       Patch(facecolor=COLOR_FREE, edgecolor="#b5651d", hatch="//", label="free hole (cached)")],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small", framealpha=0.9)


def plot_memory(data, path, title=None, dpi=110):
    """Draw ``data`` (a path, a snapshot or Chrome trace object, or :func:`load_memory_data`'s result) to the image
    ``path`` (the format from its suffix: .png, .svg, .pdf...). For each device a timeline and, when the input has
    segments, a segment map. Returns ``path``."""
    _, Figure, FigureCanvasAgg = require_matplotlib()
    data = _as_data(data)
    panels = []
    for d in data["devices"]:
        panels.append(("timeline", d, 3.2 if d["time"] else 0.9))
        if d.get("segments"):
            rows = min(len(d["segments"]), MAX_SEGMENT_ROWS)
            panels.append(("segments", d, max(1.8, 0.95 + 0.24 * rows)))
    if not panels:
        raise _error(f"plot: {data.get('source')}: nothing to plot")
    fig = Figure(figsize=(13, sum(h for _, _, h in panels) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, gridspec_kw={"height_ratios": [h for _, _, h in panels]}, squeeze=False)
    for ax, (what, d, _) in zip(axes[:, 0], panels):
        (_draw_timeline if what == "timeline" else _draw_segments)(ax, d)
    timed = [(ax, d) for ax, (what, d, _) in zip(axes[:, 0], panels)
             if what == "timeline" and d["time"] and d["time_unit"] == "ms"]
    if len(timed) > 1:                  # devices of one trace or snapshot share the clock: same time axis
        lo = min(d["time"][0] for _, d in timed)
        hi = max(d["time"][-1] for _, d in timed)
        pad = (hi - lo) * 0.02 or 1.0
        for ax, _ in timed:
            ax.set_xlim(lo - pad, hi + pad)
    kind = {"snapshot": "memory snapshot", "chrome_trace": "profiler trace", "rmm_trace": "replayed allocation log"}
    fig.suptitle(title or f"paddle_rt memory: {os.path.basename(str(data.get('source')))} "
                          f"({kind.get(data.get('kind'), data.get('kind'))})", fontsize="large")
    fig.savefig(path, dpi=dpi)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m paddle_rt plot", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Draw a memory timeline (allocated and reserved bytes over time) and a segment map (each\n"
                    "segment's blocks, free holes highlighted). Needs matplotlib: " + PLOT_EXTRA,
        epilog="\n\n".join(__doc__.split("\n\n")[1:3]).replace("``", ""))
    ap.add_argument("input", help="memory snapshot JSON, Chrome trace JSON or RMM allocation log CSV (.gz too)")
    ap.add_argument("-o", "--output", required=True, help="image to write (.png, .svg, .pdf)")
    ap.add_argument("--device", default=None, help="only this device (snapshot, trace) / replay on it (log)")
    ap.add_argument("--conf", default="", help="allocator config key:value,... for replaying a log")
    ap.add_argument("--title", default=None)
    bar = ap.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="progress bars while replaying a log, even when stderr is not a terminal (tqdm)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    args = ap.parse_args(argv)
    from paddle_rt._core.errors import PaddleRTError
    try:
        require_matplotlib()
        from paddle_rt.tools.replay import progress_factory
        data = load_memory_data(args.input, device=args.device, conf=args.conf,
                                progress=progress_factory(args.progress))
        plot_memory(data, args.output, title=args.title)
    except MissingExtraError as exc:
        print(f"paddle_rt plot: {exc}", file=sys.stderr)
        return 2
    except (PaddleRTError, OSError) as exc:
        print(f"paddle_rt plot: {exc}", file=sys.stderr)
        return 2
    n = len(data["devices"])
    print(f"wrote {args.output} ({n} device{'s' if n != 1 else ''}, from a "
          f"{data['kind'].replace('_', ' ')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
