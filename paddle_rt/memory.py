"""Memory API: the caching allocator of each device (see :mod:`paddle_rt._core.allocator` for the policy and the
``PADDLE_RT_ALLOC_CONF`` keys), and its history::

    paddle_rt.memory.record_history()            # start recording allocator events (with Python stacks)
    ...
    paddle_rt.memory.dump_snapshot("mem.json")   # history + current segments; plot: python -m paddle_rt plot mem.json
    paddle_rt.memory.dump_trace("mem.csv.gz")    # the allocations and frees as an allocation log: python -m
                                                 # paddle_rt replay mem.csv.gz
    paddle_rt.memory.record_history(False)       # stop (what was recorded stays until the next start)
    paddle_rt.memory.view(output="mem.html")     # the interactive viewer page of the history (the `view` extra)
"""
import collections
import json
import os
import threading

from paddle_rt._core.allocator import DeviceAllocator, get_allocator, CONF_KEYS as ALLOC_CONF_KEYS
from paddle_rt._core.allocation import (
    Allocation, malloc, free, raw_malloc, raw_free, malloc_host, memory_stats, memory_allocated, memory_reserved,
    max_memory_allocated, max_memory_reserved, reset_peak_memory_stats, reset_accumulated_memory_stats,
    reset_allocator, empty_cache, memory_snapshot, set_allocator_config, allocator_config,
)
from paddle_rt._core import trace as _trace
from paddle_rt._core.device import refuse_in_child as _refuse_in_child
from paddle_rt._core.errors import InvalidArgument

__all__ = [
    "Allocation", "DeviceAllocator", "malloc", "free", "raw_malloc", "raw_free", "malloc_host", "memory_stats",
    "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "reset_allocator", "empty_cache", "memory_snapshot", "set_allocator_config",
    "allocator_config", "get_allocator", "ALLOC_CONF_KEYS", "dump_trace", "view", "reserve",
]


def reserve(nbytes, device=None):
    """Grow ``device``'s pool (default: the current device) by one step of ``nbytes`` before work starts, so that the
    allocations that follow are served from it (Paddle's initial-memory flag, ``FLAGS_initial_gpu_memory_in_mb``).
    With expandable segments the pool's range grows in place and the pages are mapped; without, one chunk of
    ``nbytes`` is made. The memory stays cached: ``empty_cache()`` gives back what is unused. Returns the bytes the
    pool grew by."""
    return get_allocator(device).reserve(nbytes)

SNAPSHOT_FORMAT = "paddle_rt.memory_snapshot"
SNAPSHOT_VERSION = 1
_TRACE_KEYS = ("addr", "size", "requested", "stream", "time_ns", "frames")


class _History:
    """A subscriber of the event recorder keeping the last ``max_entries`` allocator events."""

    def __init__(self, max_entries, stacks):
        self.mask = _trace.MEMORY | (_trace.STACKS if stacks else 0)
        self.start_ns = _trace.now_ns()
        self.stop_ns = None
        self.entries = collections.deque(maxlen=max_entries)
        self.capacity = max_entries      # the recorder never needs to hold more records than are kept

    def _deliver(self, events):
        self.entries.extend(events)


_lock = threading.Lock()
_history = None      # the recording (or last recorded) history


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()
    h = _history
    if h is not None and h.stop_ns is None:
        h.stop_ns = _trace.now_ns()       # the recorder is off in the child (trace.pyx)


os.register_at_fork(after_in_child=_after_fork_in_child)


def record_history(enabled=True, max_entries=100_000, stacks=True):
    """Start (``enabled=True``) or stop recording the allocator events of every device: alloc, free, segment_alloc,
    segment_free, segment_map, segment_unmap, oom and empty_cache, with address, size, stream and time, keeping the
    last ``max_entries``.
    ``stacks``: each allocation made through the Python API (``malloc``, ``raw_malloc``, ``malloc_host``) and each
    out-of-memory error also keeps the Python frames of its caller (allocations made by C code without the GIL keep
    none). Calling it while recording applies the new settings and keeps what was recorded; starting after a stop
    starts a new history. Cost while not recording: none measurable (one branch per allocator event)."""
    _refuse_in_child()
    global _history
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
        raise InvalidArgument(f"record_history: max_entries must be a positive int, not {max_entries!r}")
    with _lock:
        h = _history
        running = h is not None and h.stop_ns is None
        if not enabled:
            if running:
                _trace.unsubscribe(h)
                h.stop_ns = _trace.now_ns()
            return
        if running:
            _trace.flush()
            if h.entries.maxlen != max_entries:
                h.entries = collections.deque(h.entries, maxlen=max_entries)
                h.capacity = max_entries
            h.mask = _trace.MEMORY | (_trace.STACKS if stacks else 0)
            _trace.update(h)
            return
        h = _History(max_entries, stacks)
        _trace.subscribe(h)
        _history = h


def clear_history():
    """Forget what was recorded (recording, if on, goes on from now)."""
    _refuse_in_child()
    with _lock:
        h = _history
        if h is not None:
            if h.stop_ns is None:
                _trace.flush()
            h.entries.clear()


def is_recording_history():
    """True while :func:`record_history` records."""
    h = _history
    return h is not None and h.stop_ns is None


def _recorded_entries():
    """The recorded events so far (what the recorder still holds is delivered first)."""
    with _lock:
        h = _history
        if h is not None and h.stop_ns is None:
            _trace.flush()
        return list(h.entries) if h is not None else []


def history():
    """The recorded history and the current state of every allocator, as the dict :func:`dump_snapshot` writes::

        {"format": "paddle_rt.memory_snapshot", "version": 1,
         "devices": {"rt_cpu:0": {"segments": [...memory_snapshot() of the device...],
                                  "trace": [{"action", "addr", "size", "requested", "stream", "time_ns",
                                             "frames"}, ...],
                                  "stats": {...memory_stats() of the device...}}}}

    ``action`` is alloc, free, segment_alloc, segment_free, segment_map, segment_unmap, oom or empty_cache (for
    empty_cache ``size`` is the bytes released). With expandable segments a segment is a virtual range:
    segment_alloc and segment_free (``size`` 0) reserve and give back the range, and segment_map / segment_unmap
    (``addr``, ``size`` = a run of pages) map and unmap physical memory inside it, so reserved bytes are the sum of
    segment_alloc and segment_map sizes less those of segment_free and segment_unmap, in both modes;
    ``requested`` is the bytes asked for (an alloc or oom; 0 for the others);
    ``frames`` are ``{"filename", "line", "name"}``, innermost first. Pinned host memory appears as a device named
    ``"<device>/pinned"``."""
    _refuse_in_child()
    from paddle_rt._core import allocator as _alloc
    entries = _recorded_entries()
    devices = {}
    for a in list(_alloc._allocators):
        key = str(a.device) if a.kind == "device" else f"{a.device}/pinned"
        try:
            segments = a.snapshot()
            stats = a.stats()
        except Exception:      # torn down (interpreter exit)
            segments, stats = [], {}
        devices[key] = {"segments": segments, "trace": [], "stats": stats}
    for e in entries:
        key = e["device"] if e.get("memory") != "pinned" else f"{e['device']}/pinned"
        d = devices.get(key)
        if d is None:
            d = devices[key] = {"segments": [], "trace": [], "stats": {}}
        item = {"action": e["kind"]}
        for k in _TRACE_KEYS:
            item[k] = e[k]
        d["trace"].append(item)
    return {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "devices": devices}


def dump_snapshot(path):
    """Write :func:`history` as JSON to ``path`` (works whether or not history is being recorded: without a history
    the traces are empty and the segments still show the current state)."""
    _refuse_in_child()
    text = json.dumps(history())
    with open(path, "w") as f:
        f.write(text)
    return path


def load_snapshot(path):
    """Read a snapshot written by :func:`dump_snapshot`; raises InvalidArgument when the file is not one."""
    with open(path) as f:
        try:
            doc = json.load(f)
        except ValueError as exc:
            raise InvalidArgument(f"load_snapshot: {path!r} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
        raise InvalidArgument(f"load_snapshot: {path!r} is not a paddle_rt memory snapshot")
    if doc.get("version") != SNAPSHOT_VERSION:
        raise InvalidArgument(f"load_snapshot: {path!r} has version {doc.get('version')!r}; this paddle_rt reads "
                              f"version {SNAPSHOT_VERSION}")
    return doc


def dump_trace(path, device=None):
    """Write the recorded allocations and frees of one device's allocator (:func:`record_history`) to ``path`` as an
    allocation log in RMM's CSV format (``Thread,Time,Action,Pointer,Size,Stream``, gzip'd when ``path`` ends in
    ``.gz``): the format ``python -m paddle_rt replay`` and ``paddle-rt capture`` use. Sizes are the bytes asked for
    (not the allocator's rounded blocks); frees of blocks allocated before the history started are left out, so every
    free matches a live allocation. ``device``: which device (default: the one device with recorded allocations).
    Raises InvalidArgument when nothing was recorded or several devices were and none is named. Returns
    ``(path, number of allocations, peak live requested bytes)``."""
    _refuse_in_child()
    from paddle_rt._core import alloc_log
    events = {}
    for e in _recorded_entries():
        if e.get("memory") == "device" and e["kind"] in ("alloc", "free"):
            events.setdefault(e["device"], []).append(
                (0, e["time_ns"], e["kind"] == "alloc", e["addr"], e["requested"], e["stream"]))
    if device is not None:
        name = str(device)
        if name not in events:
            raise InvalidArgument(f"dump_trace: no allocation on {name} was recorded "
                                  f"(record_history() before the work; recorded: {sorted(events) or 'nothing'})")
    elif not events:
        raise InvalidArgument("dump_trace: no allocation was recorded (call paddle_rt.memory.record_history() "
                              "before the work)")
    elif len(events) > 1:
        raise InvalidArgument(f"dump_trace: allocations on {len(events)} devices were recorded "
                              f"({', '.join(sorted(events))}); name one with device=")
    else:
        name = next(iter(events))
    log = alloc_log.from_recording(events[name], f"dump_trace({name})")
    allocs, peak = alloc_log.write(path, log, f"dump_trace({name})")
    return os.fspath(path), allocs, peak


def view(*sources, output=None, conf=None, baselines=False, device=None, labels=None, title=None):
    """The interactive memory viewer (``paddle-rt view``; needs plotly: ``pip install "paddle_rt[view]"``): a
    self-contained HTML page of ``sources`` (paths of snapshots, recorded histories, allocation logs or profiler
    traces, or :func:`history` dicts; with none, this process's current :func:`history`). Returns the page (its
    ``html``, ``save(path)``; Jupyter shows it inline); ``output``: also write it there. ``conf``: the allocator
    configurations an allocation log is replayed under (one run each, in a child process); ``baselines``: add
    Paddle's and PyTorch's allocator models' runs of a log. See the docs' viewer page."""
    from paddle_rt.tools.view import view as _view
    return _view(*(sources or (history(),)), output=output, conf=conf, baselines=baselines, device=device, labels=labels, title=title)
