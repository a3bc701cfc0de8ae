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
import io
import json
import os
import sys

__all__ = ["MissingExtraError", "load_memory_data", "from_snapshot", "from_chrome_trace", "from_rmm_trace",
           "plot_memory", "require_matplotlib", "main"]

from paddle_rt.tools.cli import command_parser, error, output_path_problem
from paddle_rt.tools.figures import (  # noqa: F401  (re-exported: the plotting API of paddle_rt.tools.plot)
    MAX_SEGMENT_ROWS, MAX_TIMELINE_POINTS, MissingExtraError, PLOT_EXTRA, _error, _reduce, draw_memory,
    chrome_trace_events, gunzip_if_gzip, mapped_before, require_matplotlib, segment_summary, snapshot_devices,
)

SNAPSHOT_FORMAT = "paddle_rt.memory_snapshot"


# ---------------------------------------------------------------------------------------------------------------------
# Reading the inputs into one form:
#   {"source": str, "kind": "snapshot" | "chrome_trace" | "rmm_trace",
#    "devices": [{"device": str, "time": [float], "time_unit": "ms" | "event", "allocated": [int], "reserved": [int],
#                 "requested": [int] or None, "markers": [(time, "oom" | "empty_cache")], "note": str or None,
#                 "segments": [segment dicts as in a snapshot] or None}]}

def _read_bytes(path):
    with open(path, "rb") as f:
        raw = f.read()
    return gunzip_if_gzip(raw, path, lambda msg: _error(f"plot: {msg}"))


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
    mapped = []           # (addr, +bytes mapped / -bytes unmapped) of expandable segments
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
        elif act in ("segment_map", "segment_unmap"):      # expandable segments: pages (un)mapped inside a range
            n = _int(size, f"{device}: trace entry {i} size") * (1 if act == "segment_map" else -1)
            mapped.append((_int(addr, f"{device}: trace entry {i} addr"), n))
            deltas.append((t, 0, n))
        elif act in ("oom", "empty_cache"):
            markers.append((t, act))
        else:
            raise _error(f"plot: {device}: trace entry {i} has unknown action {act!r}")
    # what the segments hold at the end but the history never allocated was there before it started
    for seg in segments or ():
        if seg.get("expandable"):
            if seg["address"] not in segs:       # a range reserved before the history: what it mapped before
                seg_unknown += mapped_before(seg, mapped)
        elif seg["address"] not in segs:
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
        if seg.get("expandable"):
            for key in ("reserved_size", "mapped_size"):
                _int(seg.get(key), f"{device}: segment {i} {key}")
        for j, b in enumerate(seg.get("blocks", ())):
            for key in ("address", "size"):
                _int(b.get(key) if isinstance(b, dict) else None, f"{device}: segment {i} block {j} {key}")
    return segments


def from_snapshot(obj, source="<snapshot>"):
    """The plotting form of a ``paddle_rt.memory.dump_snapshot`` object (format version 1)."""
    if obj.get("format") != SNAPSHOT_FORMAT:
        raise _error(f"plot: {source}: format {obj.get('format')!r} is not {SNAPSHOT_FORMAT!r}")
    devices, t0 = snapshot_devices(obj, source, lambda msg: _error(f"plot: {msg}"))
    out = []
    for name, d in devices:
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
    events, names = chrome_trace_events(obj, source, lambda msg: _error(f"plot: {msg}"))
    series, marks = {}, {}
    for ev in events:
        ph, name = ev.get("ph"), ev.get("name")
        if ph == "C" and name in ("memory", "memory (pinned host)"):
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
    return replay.plot_data(replay.run_once(path, device, conf or {}, record=True, progress=progress), path)


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


def plot_memory(data, path, title=None, dpi=110):
    """Draw ``data`` (a path, a snapshot or Chrome trace object, or :func:`load_memory_data`'s result) to the image
    ``path`` (the format from its suffix: .png, .svg, .pdf...). For each device a timeline and, when the input has
    segments, a segment map. Returns ``path``."""
    require_matplotlib()
    return draw_memory(_as_data(data), path, title=title, dpi=dpi)


def main(argv=None):
    ap = command_parser(
        "plot",
        description="Draw a memory timeline (allocated and reserved bytes over time) and a segment map (each\n"
                    "segment's blocks, free holes highlighted). Needs matplotlib: " + PLOT_EXTRA,
        epilog="\n\n".join(__doc__.split("\n\n")[1:3]).replace("``", ""))
    ap.add_argument("input", help="memory snapshot JSON, Chrome trace JSON or RMM allocation log CSV (.gz too)")
    ap.add_argument("-o", "--output", required=True, help="image to write (.png, .svg, .pdf)")
    ap.add_argument("--device", default=None, help="only this device (snapshot, trace) / replay on it (log)")
    ap.add_argument("--conf", default="", help="allocator config key:value,... for replaying a log")
    ap.add_argument("--title", default=None, help="title above the figures")
    bar = ap.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="progress bars while replaying a log, even when stderr is not a terminal (tqdm)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    args = ap.parse_args(argv)
    from paddle_rt._core.errors import PaddleRTError
    problem = output_path_problem(args.output, "--output")
    if problem:                             # before a replay of a log, not after it
        return error("plot", problem)
    try:
        require_matplotlib()
        from paddle_rt.tools.replay import progress_factory
        data = load_memory_data(args.input, device=args.device, conf=args.conf,
                                progress=progress_factory(args.progress))
        plot_memory(data, args.output, title=args.title)
    except (MissingExtraError, PaddleRTError) as exc:
        return error("plot", exc)
    except OSError as exc:
        return error("plot", f"{exc.filename or args.output}: {exc.strerror or exc}")
    n = len(data["devices"])
    print(f"wrote {args.output} ({n} device{'s' if n != 1 else ''}, from a "
          f"{data['kind'].replace('_', ' ')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
