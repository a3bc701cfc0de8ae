"""The memory viewer's data (``paddle-rt view``, ``paddle_rt.memory.view``): every input read into one form, a *run*,
from which the page is drawn. Pure Python and numpy (no plotting library here).

Inputs, recognised by content (gzip'd or not), :func:`detect_kind`:

- ``snapshot``: ``paddle_rt.memory.dump_snapshot`` JSON without an allocation history (segments only);
- ``history``: the same with a recorded history (``record_history`` before the work): every alloc, free, segment
  event, out-of-memory and ``empty_cache`` with its time, stream and Python stack;
- ``alloc_log``: an allocation log in RMM's CSV format (``dump_trace``, ``paddle-rt capture``): replayed through
  paddle_rt's allocator in a child process (``conf``, ``device``), its history recorded; the time axis is the log's
  event number, so that replays of one log under several configurations share it;
- ``chrome_trace``: the profiler's Chrome trace (``Profiler.export_chrome_trace``): its memory instant events when it
  has them (alloc, free, segments), else its ``memory`` counters (timeline only).

A run (:func:`build_run`) per device: the timeline of allocated and reserved bytes of the device, of each pool and of
each stream; the marked events (oom, empty_cache, growth = a new segment or pages mapped into an expandable one); block and segment lifetimes for the
segment map at any moment; the peak and the top allocation sites live at it. Long timelines are reduced to
min/max per bucket (:func:`paddle_rt.tools.view_levels.minmax_levels`), so that peaks survive any reduction.
"""
import bisect
import json
import os

import numpy as np

from paddle_rt.tools.figures import _error, chrome_trace_events, gunzip_if_gzip, mapped_before, snapshot_devices

__all__ = ["KINDS", "ViewInputError", "detect_kind", "load_source", "events_from_history", "build_run",
           "live_at", "baseline_runs", "replay_in_child"]

KINDS = ("snapshot", "history", "alloc_log", "chrome_trace")
SNAPSHOT_FORMAT = "paddle_rt.memory_snapshot"

# event kinds (the ``kind`` column)
ALLOC, FREE, SEG_ALLOC, SEG_FREE, OOM, EMPTY_CACHE, SEG_MAP, SEG_UNMAP = range(8)
ACTIONS = {"alloc": ALLOC, "free": FREE, "segment_alloc": SEG_ALLOC, "segment_free": SEG_FREE, "oom": OOM,
           "empty_cache": EMPTY_CACHE, "segment_map": SEG_MAP, "segment_unmap": SEG_UNMAP}

BLOCK_BUDGET = 60_000           # blocks kept for the segment map; beyond, only those live at MOMENTS moments
MOMENTS = 160
MARKER_BUDGET = 2_000           # marked events per kind kept on the timeline (beyond: the largest)
TOP_SITES = 12
DEFAULT_SMALL_SIZE = 128 << 10  # the allocator's default small_size: a segment is "small" when its first block fits


class ViewInputError(Exception):
    """A file the viewer cannot read (the message is the one line the CLI prints)."""


def _read(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ViewInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ViewInputError(f"{path}: is a folder, not a file") from None
    except OSError as exc:
        raise ViewInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return gunzip_if_gzip(raw, path, ViewInputError)


def detect_kind(path, raw=None):
    """(kind, parsed JSON object or None) of the file ``path``: one of :data:`KINDS`, or ViewInputError saying what
    the file is not."""
    raw = _read(path) if raw is None else raw
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ViewInputError(f"{path}: not valid JSON ({exc})") from None
        if isinstance(obj, dict) and obj.get("format") == SNAPSHOT_FORMAT:
            devices = obj.get("devices")
            if not isinstance(devices, dict):
                raise ViewInputError(f"{path}: a memory snapshot without a \"devices\" object")
            has_trace = any(isinstance(d, dict) and d.get("trace") for d in devices.values())
            return ("history" if has_trace else "snapshot"), obj
        if isinstance(obj, list) or (isinstance(obj, dict) and "traceEvents" in obj):
            return "chrome_trace", obj
        raise ViewInputError(f"{path}: JSON that is neither a paddle_rt memory snapshot nor a Chrome trace")
    try:
        first = raw.split(b"\n", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        first = None
    if first is not None and {"Action", "Pointer", "Size"} <= {c.strip() for c in first.split(",")}:
        return "alloc_log", None
    raise ViewInputError(f"{path}: not a memory snapshot, a recorded history, an allocation log or a profiler trace")


# ---------------------------------------------------------------------------------------------------------------------
# Events: per device, columns (kind, t, addr, size, requested, stream, stack) as lists; stacks deduplicated.

class Events:
    """One device's events in time order plus what was live before the first (from a snapshot's end state)."""

    def __init__(self, device):
        self.device = device
        self.kind, self.t, self.addr, self.size, self.req, self.stream, self.stack = [], [], [], [], [], [], []
        self.stacks, self._stack_ids = [], {}
        self.final_segments = None       # the snapshot's segments at the end (blocks live before the history)
        self.small_size = DEFAULT_SMALL_SIZE

    def stack_id(self, frames):
        if not frames:
            return -1
        text = "\n".join(f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}" for f in frames
                         if isinstance(f, dict))
        i = self._stack_ids.get(text)
        if i is None:
            i = self._stack_ids[text] = len(self.stacks)
            self.stacks.append(text)
        return i

    def add(self, kind, t, addr, size, req, stream, stack=-1):
        self.kind.append(kind)
        self.t.append(t)
        self.addr.append(addr)
        self.size.append(size)
        self.req.append(req)
        self.stream.append(stream)
        self.stack.append(stack)

    def __len__(self):
        return len(self.kind)


def _int(v, what, path):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ViewInputError(f"{path}: {what} is not a byte count or address ({v!r})")
    return v


def events_from_history(obj, path="<snapshot>"):
    """{device: Events} of a snapshot object (``dump_snapshot`` / ``memory.history()``); times in ms from the first
    recorded event of any device."""
    devices, t0 = snapshot_devices(obj, path, ViewInputError)
    t0 = t0 or 0
    out = {}
    for name, d in devices:
        segments = d.get("segments") or []
        trace = d.get("trace") or []
        if not isinstance(segments, list) or not isinstance(trace, list):
            raise ViewInputError(f"{path}: device {name!r}: \"segments\" and \"trace\" must be lists")
        if not segments and not trace:
            continue
        ev = Events(name)
        for i, seg in enumerate(segments):
            if not isinstance(seg, dict):
                raise ViewInputError(f"{path}: {name}: segment {i} is not an object")
            _int(seg.get("address"), f"{name}: segment {i} address", path)
            _int(seg.get("total_size"), f"{name}: segment {i} total_size", path)
            for j, b in enumerate(seg.get("blocks") or ()):
                if not isinstance(b, dict):
                    raise ViewInputError(f"{path}: {name}: segment {i} block {j} is not an object")
                _int(b.get("address"), f"{name}: segment {i} block {j} address", path)
                _int(b.get("size"), f"{name}: segment {i} block {j} size", path)
        ev.final_segments = segments
        items = []
        for i, e in enumerate(trace):
            if not isinstance(e, dict) or e.get("action") not in ACTIONS:
                raise ViewInputError(f"{path}: {name}: trace entry {i} has no known \"action\" "
                                     f"({e.get('action') if isinstance(e, dict) else e!r})")
            t = e.get("time_ns")
            if not isinstance(t, (int, float)):
                raise ViewInputError(f"{path}: {name}: trace entry {i} has no numeric \"time_ns\"")
            items.append((t, i, e))
        items.sort(key=lambda x: (x[0], x[1]))
        for t, i, e in items:
            kind = ACTIONS[e["action"]]
            size = e.get("size", 0) or 0
            addr = e.get("addr", 0) or 0
            _int(size, f"{name}: trace entry {i} size", path)
            _int(addr, f"{name}: trace entry {i} addr", path)
            req = e.get("requested")
            req = req if isinstance(req, int) and not isinstance(req, bool) and req >= 0 else -1
            ev.add(kind, (t - t0) / 1e6, addr, size, req, str(e.get("stream", 0)),
                   ev.stack_id(e.get("frames") if isinstance(e.get("frames"), list) else None))
        out[name] = ev
    if not out:
        raise ViewInputError(f"{path}: the snapshot holds no segments and no history on any device")
    return out


def events_from_chrome_trace(obj, path="<trace>"):
    """({device: Events} or None, {device: counter series}) of a Chrome trace: its memory instant events (the
    profiler's alloc/free/segment events, args addr/size/stream) when it has them, else its ``memory`` counters."""
    events, names = chrome_trace_events(obj, path, ViewInputError)
    inst, counters = [], {}
    for ev in events:
        ph, name = ev.get("ph"), ev.get("name")
        if ph == "i" and ev.get("cat") == "memory" and name in ACTIONS and isinstance(ev.get("ts"), (int, float)):
            inst.append(ev)
        elif ph == "C" and name == "memory" and isinstance(ev.get("ts"), (int, float)):
            a = ev.get("args") or {}
            counters.setdefault(ev.get("pid"), []).append((ev["ts"], a.get("allocated"), a.get("reserved")))
    stamps = [e["ts"] for e in inst] + [p[0] for pts in counters.values() for p in pts]
    if not stamps:
        raise ViewInputError(f"{path}: a Chrome trace without memory events (was memory recorded by the profiler?)")
    t0 = min(stamps)
    if any(e.get("name") in ("alloc", "free") for e in inst):
        out = {}
        inst.sort(key=lambda e: e["ts"])
        for e in inst:
            dev = names.get(e.get("pid"), f"pid {e.get('pid')}")
            d = out.get(dev)
            if d is None:
                d = out[dev] = Events(dev)
            a = e.get("args") or {}
            try:
                addr = int(a.get("addr", "0"), 16) if isinstance(a.get("addr"), str) else int(a.get("addr") or 0)
                size = int(a.get("size") or 0)
            except (TypeError, ValueError):
                raise ViewInputError(f"{path}: a memory event with a malformed addr or size ({a!r})") from None
            d.add(ACTIONS[e["name"]], (e["ts"] - t0) / 1000.0, addr, size, -1, str(a.get("stream", 0)))
        return out, None
    series = {}
    for pid, pts in counters.items():
        pts.sort(key=lambda p: p[0])
        t, al, re_ = [], [], []
        a = r = 0
        for ts, pa, pr in pts:
            a = pa if isinstance(pa, (int, float)) else a
            r = pr if isinstance(pr, (int, float)) else r
            t.append((ts - t0) / 1000.0)
            al.append(a)
            re_.append(r)
        series[names.get(pid, f"pid {pid}")] = (t, al, re_)
    marks = {}
    for e in inst:
        if e["name"] in ("oom", "empty_cache"):
            marks.setdefault(names.get(e.get("pid"), f"pid {e.get('pid')}"), []).append(
                ((e["ts"] - t0) / 1000.0, e["name"], (e.get("args") or {})))
    return None, (series, marks)


# ---------------------------------------------------------------------------------------------------------------------
# Allocation logs: replayed through the allocator with the history recorded, in a child process
# (paddle_rt/tools/view_replay.py)

def events_from_replay(res):
    ev = Events(res["device"])
    c = res["columns"]
    ev.kind, ev.t, ev.addr, ev.size, ev.req, ev.stream = c["kind"], c["t"], c["addr"], c["size"], c["req"], c["stream"]
    ev.stack = [-1] * len(ev.kind)
    ev.small_size = res["config"].get("small_size", DEFAULT_SMALL_SIZE)
    return ev


def replay_in_child(path, conf_text="", device=None):
    """``view_replay.replay_events`` in a fresh process (the caller's allocator and its configuration stay untouched)."""
    import pickle
    import subprocess
    import sys
    import tempfile
    fd, out = tempfile.mkstemp(suffix=".pickle", prefix="paddle_rt_view_")
    os.close(fd)
    try:
        cmd = [sys.executable, "-m", "paddle_rt.tools.view_replay", os.path.abspath(path), out, conf_text or ""]
        if device:
            cmd.append(str(device))
        parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # cwd: the folder holding this paddle_rt (`-m` puts the cwd first on sys.path, before PYTHONPATH)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=parent)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
            msg = lines[-1].replace(os.path.abspath(path), path) if lines else None
            raise ViewInputError(msg or f"{path}: the replay failed (status {r.returncode})")
        with open(out, "rb") as f:
            return pickle.load(f)
    finally:
        os.unlink(out)


# ---------------------------------------------------------------------------------------------------------------------
# Baselines: reserved bytes of the reference models per log event

def baseline_runs(trace, alignment=256, padding=0):
    """[(label, event numbers, reserved bytes, device allocations)] of Paddle's auto-growth and PyTorch's caching
    allocator models (``replay --baselines``) over the log ``trace`` (is_alloc, sizes, slots, nslots)."""
    from paddle_rt.tools.anchor_models import PaddleAutoGrowthModel, TorchCachingModel
    is_alloc, sizes, slots, nslots = trace[:4]
    out = []
    for label, model in (("Paddle auto-growth", PaddleAutoGrowthModel(alignment, padding)),
                         ("PyTorch caching", TorchCachingModel())):
        table = [0] * nslots
        res = np.empty(len(is_alloc), dtype=np.float64)
        for i, (a, n, s) in enumerate(zip(is_alloc.tolist(), sizes.tolist(), slots.tolist())):
            if a:
                table[s] = model.malloc(n)
            else:
                model.release(table[s])
            res[i] = model.reserved
        out.append((label, np.arange(len(is_alloc), dtype=np.float64), res, model.device_allocs))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Runs

def live_at(blocks, t):
    """Indices of the blocks live at time ``t`` (allocated at or before it, freed after it)."""
    return [i for i, b in enumerate(blocks) if b["t_alloc"] <= t < b["t_free"]]


def _pool_of(size, small_size):
    return "small" if small_size and size <= small_size else "large"


def build_run(ev, label=None, source=None, kind=None, time_unit="ms"):
    """The run of one device's Events: {"label", "device", "time_unit", "series" (name -> (t, values)), "markers",
    "blocks", "segments", "stacks", "peak", "sites", "moments", "exact"} (see the module's documentation)."""
    n = len(ev)
    kind_a = np.asarray(ev.kind, dtype=np.int8)
    t_a = np.asarray(ev.t, dtype=np.float64)
    d_alloc = np.zeros(n, dtype=np.int64)
    d_res = np.zeros(n, dtype=np.int64)
    ev_pool = [None] * n                   # segment id per event (its pool resolved at the end)
    ev_stream = ev.stream
    segs, live_segs, seg_starts = [], {}, []
    blocks, live_blocks = [], {}
    t_start = float(t_a[0]) if n else 0.0
    t_end = float(t_a[-1]) if n else 0.0
    final = ev.final_segments or []
    final_types = {s["address"]: s.get("segment_type") for s in final}
    final_extra = {s["address"]: s for s in final}
    # what the snapshot holds at the end but the history never allocated was there before it started
    seen_alloc = {a for k, a in zip(ev.kind, ev.addr) if k == ALLOC}
    seen_seg = {a for k, a in zip(ev.kind, ev.addr) if k == SEG_ALLOC}
    pre_alloc = pre_res = 0

    def new_segment(addr, size, t):
        sid = len(segs)
        segs.append({"addr": addr, "size": size, "t_alloc": t, "t_free": float("inf"), "pool": final_types.get(addr),
                     "stream": None})
        live_segs[addr] = sid
        bisect.insort(seg_starts, addr)
        return sid

    def segment_of(addr):
        i = bisect.bisect_right(seg_starts, addr) - 1
        if i >= 0:
            sid = live_segs[seg_starts[i]]
            s = segs[sid]
            if s["addr"] <= addr < s["addr"] + s["size"]:
                return sid
        return None

    def new_block(addr, size, req, stream, stack, t, sid):
        blocks.append({"addr": addr, "size": size, "req": req, "stream": stream, "stack": stack, "t_alloc": t,
                       "t_free": float("inf"), "seg": sid})
        live_blocks[addr] = len(blocks) - 1

    maps = None              # (addr, +mapped / -unmapped bytes) of the history, read once if a range needs them
    for s in final:
        if s["address"] not in seen_seg:
            sid = new_segment(s["address"], s["total_size"], t_start)
            segs[sid]["before"] = True
            if s.get("expandable"):              # a range reserved before the history: what it had mapped then
                if maps is None:
                    maps = [(ev.addr[i], ev.size[i] if ev.kind[i] == SEG_MAP else -ev.size[i]) for i in range(n)
                            if ev.kind[i] in (SEG_MAP, SEG_UNMAP)]
                segs[sid]["expandable"] = True
                segs[sid]["mapped_before"] = mapped_before(s, maps)
                pre_res += segs[sid]["mapped_before"]
            else:
                pre_res += s["total_size"]
    for s in final:
        for b in s.get("blocks") or ():
            if b.get("state") == "active_allocated" and b["address"] not in seen_alloc:
                new_block(b["address"], b["size"], b.get("requested_size", -1), str(s.get("stream", 0)), -1,
                          t_start, segment_of(b["address"]))
                blocks[-1]["before"] = True
                pre_alloc += b["size"]
    freed_before = []                      # events freeing a block allocated before the history started
    markers = []
    for i in range(n):
        k = ev.kind[i]
        addr = ev.addr[i]
        t = ev.t[i]
        if k == ALLOC:
            sid = segment_of(addr)
            ev_pool[i] = sid
            if sid is not None and segs[sid]["pool"] is None:
                segs[sid]["pool"] = _pool_of(ev.size[i], ev.small_size)
            if addr in live_blocks:          # a free the history lost: end the old block here
                blocks[live_blocks.pop(addr)]["t_free"] = t
            new_block(addr, ev.size[i], ev.req[i], ev_stream[i], ev.stack[i], t, sid)
            d_alloc[i] = ev.size[i]
        elif k == FREE:
            bi = live_blocks.pop(addr, None)
            if bi is not None:
                b = blocks[bi]
                b["t_free"] = t
                d_alloc[i] = -b["size"]
                ev_pool[i] = b["seg"]
                ev_stream[i] = b["stream"]
            else:                            # allocated before the history started
                d_alloc[i] = -ev.size[i]
                pre_alloc += ev.size[i]
                ev_pool[i] = segment_of(addr)
                freed_before.append(i)
        elif k == SEG_ALLOC:
            sid = new_segment(addr, ev.size[i], t)
            ev_pool[i] = sid
            d_res[i] = ev.size[i]
            if ev.size[i] == 0:              # an expandable segment's range: its pages come with segment_map
                segs[sid]["expandable"] = True
            else:
                markers.append({"kind": "growth", "t": t, "size": ev.size[i], "stream": ev_stream[i],
                                "stack": ev.stack[i], "seg": sid})
        elif k == SEG_FREE:
            sid = live_segs.pop(addr, None)
            if sid is not None:
                seg_starts.remove(addr)
                segs[sid]["t_free"] = t
                d_res[i] = 0 if segs[sid].get("expandable") else -segs[sid]["size"]
                ev_pool[i] = sid
            else:
                d_res[i] = -ev.size[i]
                pre_res += ev.size[i]
        elif k in (SEG_MAP, SEG_UNMAP):
            # pages mapped (growth in place) or unmapped inside a range; the range's extent follows its maps
            i_seg = bisect.bisect_right(seg_starts, addr) - 1
            sid = live_segs[seg_starts[i_seg]] if i_seg >= 0 else None
            if sid is not None and not segs[sid].get("expandable"):
                sid = None
            ev_pool[i] = sid
            if k == SEG_MAP:
                d_res[i] = ev.size[i]
                if sid is not None:
                    segs[sid]["size"] = max(segs[sid]["size"], addr + ev.size[i] - segs[sid]["addr"])
                markers.append({"kind": "growth", "t": t, "size": ev.size[i], "stream": ev_stream[i],
                                "stack": ev.stack[i], "seg": sid})
            else:
                d_res[i] = -ev.size[i]
        elif k in (OOM, EMPTY_CACHE):
            markers.append({"kind": "oom" if k == OOM else "empty_cache", "t": t, "size": ev.size[i],
                            "req": ev.req[i], "stream": ev_stream[i], "stack": ev.stack[i]})
    for s in segs:
        if s["pool"] is None:
            s["pool"] = "large"
        extra = final_extra.get(s["addr"])
        if extra is not None and s["t_free"] == float("inf"):
            for key in ("mapped_ranges", "mapped_pages", "page_size", "mapped_size"):   # expandable segments
                if key in extra:
                    s[key] = extra[key]
    # series
    alloc_all = pre_alloc + np.cumsum(d_alloc)
    res_all = pre_res + np.cumsum(d_res)
    series = {"allocated": alloc_all, "reserved": res_all}
    pools = np.array([segs[p]["pool"] if p is not None else "large" for p in ev_pool], dtype=object)
    seg_pre = {}
    for s in segs:
        if s.get("before"):
            seg_pre[s["pool"]] = seg_pre.get(s["pool"], 0) + s.get("mapped_before", s["size"])
    blk_pre_pool, blk_pre_stream = {}, {}
    # the pools' and streams' levels at the start: blocks live before the history started, in the final snapshot
    # or freed during the history
    pre_blocks = [(segs[b["seg"]]["pool"] if b["seg"] is not None else "large", b["stream"], b["size"])
                  for b in blocks if b.get("before")]
    pre_blocks += [(pools[i], ev_stream[i], ev.size[i]) for i in freed_before]
    for p, st, size in pre_blocks:
        blk_pre_pool[p] = blk_pre_pool.get(p, 0) + size
        blk_pre_stream[st] = blk_pre_stream.get(st, 0) + size
    names = sorted(set(pools.tolist()) | set(seg_pre))
    if len(names) > 1:
        for p in names:
            m = pools == p
            series[f"allocated {p} pool"] = blk_pre_pool.get(p, 0) + np.cumsum(np.where(m, d_alloc, 0))
            series[f"reserved {p} pool"] = seg_pre.get(p, 0) + np.cumsum(np.where(m, d_res, 0))
    stream_a = np.array(ev_stream, dtype=object)
    stream_names = sorted({s for k, s in zip(ev.kind, ev_stream) if k == ALLOC})
    if len(stream_names) > 1:
        for s in stream_names:
            series[f"allocated stream {s}"] = blk_pre_stream.get(s, 0) + np.cumsum(
                np.where(stream_a == s, d_alloc, 0))
    # peak (of allocated bytes; reserved's own peak is reported beside it)
    ia = int(np.argmax(alloc_all)) if n else 0
    ir = int(np.argmax(res_all)) if n else 0
    peak = {"allocated": int(alloc_all[ia]) if n else pre_alloc, "t": float(t_a[ia]) if n else t_start,
            "reserved": int(res_all[ir]) if n else pre_res, "t_reserved": float(t_a[ir]) if n else t_start}
    # top sites live at the peak
    at_peak = [b for b in blocks if b["t_alloc"] <= peak["t"] < b["t_free"]]
    sites = {}
    for b in at_peak:
        key = (b["stack"], None if b["stack"] >= 0 else b["stream"])
        s = sites.get(key)
        if s is None:
            s = sites[key] = {"stack": b["stack"], "stream": b["stream"], "bytes": 0, "requested": 0, "blocks": 0}
        s["bytes"] += b["size"]
        s["requested"] += max(b["req"], 0)
        s["blocks"] += 1
    top = sorted(sites.values(), key=lambda s: -s["bytes"])[:TOP_SITES]
    # markers: at most MARKER_BUDGET per kind (the largest)
    kept = []
    for kname in ("oom", "empty_cache", "growth"):
        ms = [m for m in markers if m["kind"] == kname]
        if len(ms) > MARKER_BUDGET:
            ms = sorted(sorted(ms, key=lambda m: -m["size"])[:MARKER_BUDGET], key=lambda m: m["t"])
        kept += ms
    # blocks for the segment map
    exact = len(blocks) <= BLOCK_BUDGET
    moments = None
    if not exact:
        times = np.unique(t_a)
        ta = np.array([b["t_alloc"] for b in blocks])
        tf = np.array([b["t_free"] for b in blocks])
        must = sorted({peak["t"], peak["t_reserved"]} | {m["t"] for m in kept if m["kind"] != "growth"})[:64]
        count = MOMENTS
        while True:      # fewer moments until the blocks live at them fit the budget (the peaks always stay)
            picks = set(np.linspace(0, len(times) - 1, count).astype(np.int64).tolist())
            moments = sorted({float(times[i]) for i in picks} | set(must))
            keep = np.zeros(len(blocks), dtype=bool)
            for m in moments:
                keep |= (ta <= m) & (m < tf)
            if keep.sum() <= BLOCK_BUDGET or count <= 2:
                break
            count //= 2
        blocks = [b for b, k in zip(blocks, keep) if k]
    return {"label": label or ev.device, "device": ev.device, "source": source, "kind": kind, "time_unit": time_unit,
            "t": t_a, "series": series, "markers": kept, "blocks": blocks, "segments": segs, "stacks": ev.stacks,
            "peak": peak, "sites": top, "moments": moments, "exact": exact, "t_range": (t_start, t_end),
            "events": n, "baseline": False}


def counter_run(device, t, allocated, reserved, marks, label=None, source=None):
    """A run of a Chrome trace that has only memory counters (no blocks: timeline only)."""
    t = np.asarray(t, dtype=np.float64)
    a = np.asarray(allocated, dtype=np.float64)
    r = np.asarray(reserved, dtype=np.float64)
    ia, ir = int(np.argmax(a)), int(np.argmax(r))
    markers = [{"kind": k, "t": tm, "size": int(args.get("size") or 0), "stream": str(args.get("stream", 0)),
                "stack": -1, "req": -1} for tm, k, args in marks]
    return {"label": label or device, "device": device, "source": source, "kind": "chrome_trace", "time_unit": "ms",
            "t": t, "series": {"allocated": a, "reserved": r}, "markers": markers, "blocks": [], "segments": [],
            "stacks": [], "peak": {"allocated": int(a[ia]), "t": float(t[ia]), "reserved": int(r[ir]),
                                   "t_reserved": float(t[ir])},
            "sites": [], "moments": None, "exact": True, "t_range": (float(t[0]), float(t[-1])), "events": len(t),
            "baseline": False, "note": "a Chrome trace with memory counters only: no segment map"}


def load_source(path, conf_text="", device=None, label=None, baselines=False):
    """The runs of one input file (one per device; an allocation log: one replay, plus the baselines' runs when
    asked). Raises ViewInputError with a one-line message for a file that is not one of :data:`KINDS`."""
    from paddle_rt._core.errors import PaddleRTError
    raw = _read(path)
    kind, obj = detect_kind(path, raw)
    name = label or os.path.basename(path)
    runs = []
    if kind in ("snapshot", "history"):
        for dev, ev in events_from_history(obj, path).items():
            if device is None or dev == str(device):
                runs.append(build_run(ev, label=f"{name} {dev}", source=path, kind=kind))
    elif kind == "chrome_trace":
        evs, counters = events_from_chrome_trace(obj, path)
        if evs is not None:
            for dev, ev in evs.items():
                if device is None or dev == str(device):
                    runs.append(build_run(ev, label=f"{name} {dev}", source=path, kind=kind))
        else:
            series, marks = counters
            for dev, (t, a, r) in sorted(series.items()):
                if device is None or dev == str(device):
                    runs.append(counter_run(dev, t, a, r, marks.get(dev, ()), label=f"{name} {dev}", source=path))
    else:
        try:
            res = replay_in_child(path, conf_text, device)
        except PaddleRTError as exc:
            raise ViewInputError(str(exc)) from None
        conf_label = f" --conf {conf_text}" if conf_text else ""
        run = build_run(events_from_replay(res), label=f"{name}{conf_label}", source=path, kind=kind,
                        time_unit="event")
        run["config"] = res["config"]
        runs.append(run)
        if baselines:
            for blabel, t, r, allocs in baseline_runs(res["trace"], res["config"].get("alignment", 256),
                                                       res["config"].get("padding", 0)):
                ir = int(np.argmax(r)) if len(r) else 0
                runs.append({"label": f"{name} {blabel}", "device": "model", "source": path, "kind": "baseline",
                             "time_unit": "event", "t": t, "series": {"reserved": r}, "markers": [], "blocks": [],
                             "segments": [], "stacks": [], "sites": [], "moments": None, "exact": True,
                             "peak": {"allocated": None, "t": float(t[ir]) if len(t) else 0.0,
                                      "reserved": int(r[ir]) if len(r) else 0,
                                      "t_reserved": float(t[ir]) if len(t) else 0.0},
                             "t_range": (0.0, float(len(t))), "events": len(t), "baseline": True,
                             "note": f"a model on an unbounded device: reserved bytes only ({allocs} device "
                                     f"allocations)"})
    if not runs:
        raise ViewInputError(f"{path}: no data for device {device}")
    return runs
