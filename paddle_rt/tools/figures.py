"""Drawing memory data with matplotlib (the ``plot`` extra): the timeline of allocated and reserved bytes and the
segment map. The data's form and the inputs it is read from are :mod:`paddle_rt.tools.plot`'s; ``replay --plot``
draws its own replay's data here too, so neither command imports the other."""
import os

__all__ = ["MissingExtraError", "require_matplotlib", "draw_memory", "segment_summary"]

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


def gunzip_if_gzip(raw, path, error):
    """raw, decompressed when it starts with gzip's magic bytes (a file is recognised by content, not by suffix);
    corrupt gzip data raises error(f"{path}: broken gzip data (...)")."""
    if raw[:2] != b"\x1f\x8b":
        return raw
    import gzip
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise error(f"{path}: broken gzip data ({exc})") from None


def snapshot_devices(obj, source, error):
    """The devices of a snapshot object (format version 1) as [(name, device dict)], and the first ``time_ns``
    recorded on any device (one clock for all; None when nothing was recorded). A malformed snapshot raises
    error(f"{source}: ...")."""
    if obj.get("version") != 1:
        raise error(f"{source}: snapshot version {obj.get('version')!r} is not supported (this paddle_rt "
                    f"reads version 1)")
    devices = obj.get("devices")
    if not isinstance(devices, dict):
        raise error(f"{source}: \"devices\" is not an object")
    for name, d in devices.items():
        if not isinstance(d, dict):
            raise error(f"{source}: device {name!r} is not an object")
    stamps = [ev["time_ns"] for d in devices.values() if isinstance(d.get("trace"), list)
              for ev in d["trace"] if isinstance(ev, dict) and isinstance(ev.get("time_ns"), (int, float))]
    return list(devices.items()), (min(stamps) if stamps else None)


def chrome_trace_events(obj, source, error):
    """The event objects of a Chrome trace (a dict with ``traceEvents`` or a bare list) and {pid: process name} from
    its ``process_name`` metadata; a trace whose events are not a list raises error(f"{source}: ...")."""
    events = obj["traceEvents"] if isinstance(obj, dict) else obj
    if not isinstance(events, list):
        raise error(f"{source}: \"traceEvents\" is not a list")
    events = [ev for ev in events if isinstance(ev, dict)]
    names = {ev.get("pid"): str((ev.get("args") or {}).get("name", ev.get("pid"))) for ev in events
             if ev.get("ph") == "M" and ev.get("name") == "process_name"}
    return events, names


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


def mapped_before(seg, maps):
    """An expandable segment of the final snapshot reserved before a history started: the bytes it had mapped then,
    its final ``mapped_size`` less the net bytes that the history's ``maps`` ((addr, +mapped / -unmapped bytes)
    pairs) mapped inside its range."""
    lo, hi = seg["address"], seg["address"] + seg.get("reserved_size", 0)
    return seg.get("mapped_size", 0) - sum(n for a, n in maps if lo <= a < hi)


def segment_summary(segments):
    """Totals over a list of segments: reserved, allocated, free bytes, number of free holes, largest hole. An
    expandable segment reserves its mapped bytes (its free blocks may lie over unmapped pages)."""
    reserved = allocated = free = holes = largest = 0
    for seg in segments:
        reserved += seg.get("mapped_size", seg["total_size"]) if seg.get("expandable") else seg["total_size"]
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


def draw_memory(data, path, title=None, dpi=110):
    """Draw memory data (the one form described in :mod:`paddle_rt.tools.plot`) to the image ``path`` (the format
    from its suffix: .png, .svg, .pdf...). For each device a timeline and, when the data has segments, a segment map.
    Returns ``path``."""
    _, Figure, FigureCanvasAgg = require_matplotlib()
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
