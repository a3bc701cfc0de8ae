"""Profiler: allocator events and stream work, exported as a Chrome trace::

    with paddle_rt.profiler.profile() as prof:
        ...
    prof.export_chrome_trace("trace.json")       # open in https://ui.perfetto.dev or chrome://tracing
    print(prof.key_averages().table(sort_by="total"))

While a profile runs, paddle_rt records (see :mod:`paddle_rt._core.trace`):

- allocator events of every device (``alloc``, ``free``, ``segment_alloc``, ``segment_free``, ``segment_map``,
  ``segment_unmap``, ``oom``, ``empty_cache``) with address, size, stream, time and the allocator's allocated/reserved bytes after the event;
- every operation enqueued on a paddle_rt stream (host functions, Python callbacks, copies of each kind, memsets,
  event records and waits, collectives) with its position, bytes, and enqueue, start and end times (an operation
  handed to the plugin's stream ends when the worker has synchronised that stream);
- what plugins with profiler hooks report (their ``profiler_*`` hooks are driven: initialize, prepare and start
  tracing at start; stop tracing, collect trace data and finalize at stop). A hook that fails gives a
  RuntimeWarning naming the device and the hook, and profiling continues without that plugin's records.

Times are CLOCK_MONOTONIC nanoseconds (``*_ns`` keys of :attr:`profile.events`); the Chrome trace uses microseconds
since the start of the profile. With no profile running nothing is recorded (one predictable branch per event).
Only one profile runs at a time in a process (:class:`ProfilerError` otherwise). Operations still running when the
profile stops are not included: synchronize the streams first.
"""
import json
import os
import threading
import warnings

from paddle_rt._core import trace as _trace
from paddle_rt._core import stream as _stream
from paddle_rt._core.errors import ProfilerError, InvalidArgument

__all__ = ["profile", "KeyAverages", "OpStats", "ProfilerError"]

_active_lock = threading.Lock()
_active = None


def _after_fork_in_child():
    global _active, _active_lock
    _active_lock = threading.Lock()
    if _active is not None:
        _active._state = 2         # the parent's session: nothing records in the child
        _active._tracers = []
        _active.stop_ns = _trace.now_ns()
    _active = None


os.register_at_fork(after_in_child=_after_fork_in_child)


class profile:
    """A profiling session. ``memory``: allocator events; ``streams``: stream operations; ``plugin``: drive the
    plugins' profiler hooks; ``max_events``: most events held before the oldest are dropped (a warning at stop says
    how many). Use it as a context manager or call :meth:`start` and :meth:`stop`."""

    def __init__(self, memory=True, streams=True, plugin=True, max_events=2_000_000):
        if not isinstance(max_events, int) or isinstance(max_events, bool) or max_events < 1:
            raise InvalidArgument(f"profile: max_events must be a positive int, not {max_events!r}")
        self.capacity = max_events
        self._dropped0 = 0
        self.dropped = 0
        self.mask = ((_trace.MEMORY if memory else 0) | (_trace.STREAMS if streams else 0) |
                     (_trace.PLUGIN if plugin else 0))
        self.memory, self.streams, self.plugin = bool(memory), bool(streams), bool(plugin)
        self.start_ns = None
        self.stop_ns = None
        self._events = []
        self._tracers = []
        self._stream_names = {}
        self._initial_memory = {}
        self._state = 0            # 0 new, 1 running, 2 stopped

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def start(self):
        global _active
        if self._state != 0:
            raise ProfilerError("profile.start(): this profile was already started; create a new profile()")
        with _active_lock:
            if _active is not None:
                raise ProfilerError("profile.start(): another paddle_rt profiler is already running in this process "
                                    "(profiles cannot be nested or concurrent); stop it first")
            _active = self
        try:
            self._stream_names = _stream.trace_stream_names()
            self._initial_memory = _memory_now()
            self.start_ns = _trace.now_ns()
            self._dropped0 = _trace.dropped()
            if self.plugin:
                self._start_plugins()
            _trace.subscribe(self)
        except BaseException:
            try:
                self._stop_plugins(collect=False)
            finally:
                self._release_plugins()
                with _active_lock:
                    _active = None
            raise
        self._state = 1
        return self

    def stop(self):
        global _active
        if self._state != 1:
            raise ProfilerError("profile.stop(): the profile is not running"
                                if self._state == 0 else "profile.stop(): the profile was already stopped")
        try:
            self._stop_plugins(collect=True)
            self.stop_ns = _trace.now_ns()
            _trace.unsubscribe(self)
            self.dropped = _trace.dropped() - self._dropped0
            if self.dropped:
                warnings.warn(f"paddle_rt.profiler: {self.dropped} events were dropped (more than max_events="
                              f"{self.capacity} waited at once); the oldest are missing", RuntimeWarning,
                              stacklevel=2)
            self._stream_names.update(_stream.trace_stream_names())
            for tag, (dev, name) in list(_trace.stream_names.items()):
                self._stream_names.setdefault(tag, (dev, name, False))
            self._events.sort(key=lambda e: e["time_ns"])
        finally:
            self._release_plugins()
            self._state = 2
            with _active_lock:
                _active = None
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self._state == 1:
            self.stop()
        return False

    @property
    def running(self):
        return self._state == 1

    # -- plugins -----------------------------------------------------------------------------------------------------
    def _warn(self, tracer, hook, st):
        warnings.warn(f"paddle_rt.profiler: {tracer.device}: the plugin's {hook} returned status {st}; profiling "
                      f"continues without {tracer.device_type}'s trace records", RuntimeWarning, stacklevel=4)

    def _start_plugins(self):
        try:
            # the current device's plugin is the one the profiled code uses: make sure it is initialised
            _trace.ready_current_device()
        except Exception:
            pass
        for plugin, dev in _trace.profiled_plugins():
            t = _trace.PluginTracer(plugin, dev, self)
            t.register()
            ok = True
            for hook, call in (("profiler_initialize", t.initialize), ("profiler_prepare_tracing", t.prepare),
                               ("profiler_start_tracing", t.start)):
                st = call()
                if not _trace.status_ok(st):
                    self._warn(t, hook, st)
                    ok = False
                    break
            if not ok:
                st = t.finalize()
                if not _trace.status_ok(st):
                    self._warn(t, "profiler_finalize", st)
                t.unregister()
                continue
            if not self._tracers:
                _trace.install_sink(True)
            self._tracers.append(t)

    def _stop_plugins(self, collect):
        for t in self._tracers:
            hooks = [("profiler_stop_tracing", t.stop)]
            if collect:
                hooks.append(("profiler_collect_trace_data", lambda t=t: t.collect(self.start_ns)))
            for hook, call in hooks:
                st = call()
                if not _trace.status_ok(st):
                    self._warn(t, hook, st)
                    break
            st = t.finalize()
            if not _trace.status_ok(st):
                self._warn(t, "profiler_finalize", st)

    def _release_plugins(self):
        if self._tracers:
            _trace.install_sink(False)
        for t in self._tracers:
            t.unregister()
        self._tracers = []

    def _deliver(self, events):
        self._events.extend(events)

    # -- results -----------------------------------------------------------------------------------------------------
    def _check_done(self, call):
        if self._state == 0:
            raise ProfilerError(f"profile.{call}: the profile was never started")
        if self._state == 1:
            raise ProfilerError(f"profile.{call}: the profile is still running; call stop() (or leave the with "
                                f"block) first")

    @property
    def events(self):
        """The recorded events (dicts, by time). Memory events: kind, device, memory ("device" or "pinned"), addr,
        size, stream, time_ns, allocated, reserved, frames. Operations: kind "op", op, device, stream, position,
        bytes, enqueue_ns, start_ns, end_ns; an operator of paddle_rt.ops/paddle_rt.op has its name as ``op`` and
        ``args`` {shapes, dtype}. Plugin records: kind "plugin", device_type, device, name, ..."""
        self._check_done("events")
        return [{k: v for k, v in e.items() if k != "session"} for e in self._events]

    def stream_name(self, device, tag):
        """The name of the stream with this tag on ``device`` (tag 0: the default stream)."""
        if tag == 0:
            return "default stream"
        dev_name = self._stream_names.get(tag)
        if dev_name is None or dev_name[0] != device:
            return f"stream 0x{tag:x}"
        return f"{dev_name[1]} (default)" if dev_name[2] else dev_name[1]

    def key_averages(self):
        """Counts and times of the stream operations, one row per operation kind (a :class:`KeyAverages`)."""
        self._check_done("key_averages()")
        rows = {}
        for e in self._events:
            if e["kind"] != "op":
                continue
            r = rows.get(e["op"])
            if r is None:
                r = rows[e["op"]] = OpStats(e["op"])
            r._add(e)
        return KeyAverages(rows.values())

    def export_chrome_trace(self, path):
        """Write the profile as Trace Event Format JSON (Perfetto, chrome://tracing): one process per device, one
        track per stream with an "X" slice per operation, allocator events as instant events on the stream's track,
        "memory" counters (allocated and reserved bytes) per device, plugin records on their own track."""
        self._check_done("export_chrome_trace()")
        doc = self._chrome_trace()
        text = json.dumps(doc)
        with open(path, "w") as f:
            f.write(text)
        return path

    def _chrome_trace(self):
        t0 = self.start_ns
        out = []
        pids = {}
        tids = {}

        def us(t):
            return (t - t0) / 1000.0

        def pid_of(dev):
            p = pids.get(dev)
            if p is None:
                p = pids[dev] = len(pids) + 1
                out.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": dev}})
                out.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0, "args": {"sort_index": p}})
            return p

        default_tag = {}
        for tag, (dev, name, is_default) in self._stream_names.items():
            if is_default:
                default_tag[dev] = tag

        def tid_of(dev, key, name):
            p = pid_of(dev)
            k = (dev, key)
            t = tids.get(k)
            if t is None:
                t = tids[k] = sum(1 for d, _ in tids if d == dev) + 1
                out.append({"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": name}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": p, "tid": t, "args": {"sort_index": t}})
            return t

        def stream_track(dev, tag):
            if tag == 0 or default_tag.get(dev) == tag:
                tag = default_tag.get(dev, 0)
                return tid_of(dev, ("stream", tag), self.stream_name(dev, tag) if tag else "default stream")
            return tid_of(dev, ("stream", tag), self.stream_name(dev, tag))

        for dev, (alloc, res) in sorted(self._initial_memory.items()):
            out.append({"ph": "C", "name": "memory", "pid": pid_of(dev), "ts": 0.0,
                        "args": {"allocated": alloc, "reserved": res}})
        for e in self._events:
            k = e["kind"]
            dev = e.get("device") or "host"
            if k == "op":
                tid = stream_track(dev, e["stream"])
                out.append({"ph": "X", "name": e["op"], "cat": "stream", "pid": pid_of(dev), "tid": tid,
                            "ts": us(e["start_ns"]), "dur": max(0.0, (e["end_ns"] - e["start_ns"]) / 1000.0),
                            "args": {"position": e["position"], "bytes": e["bytes"],
                                     "enqueue_us": us(e["enqueue_ns"]),
                                     "queue_delay_us": (e["start_ns"] - e["enqueue_ns"]) / 1000.0,
                                     **e.get("args", {})}})
            elif k == "plugin":
                pdev = e.get("device") or "plugin"
                tid = tid_of(pdev, ("plugin", e.get("device_type")), f"plugin {e.get('device_type')} trace")
                args = {key: e[key] for key in ("is_device", "stream_ops", "collect_start_ns", "address") if key in e}
                if "start_ns" in e and e["end_ns"] >= e["start_ns"] > 0:
                    out.append({"ph": "X", "name": e["name"], "cat": "plugin", "pid": pid_of(pdev), "tid": tid,
                                "ts": us(e["start_ns"]), "dur": (e["end_ns"] - e["start_ns"]) / 1000.0,
                                "args": args})
                else:
                    out.append({"ph": "i", "s": "t", "name": e["name"], "cat": "plugin", "pid": pid_of(pdev),
                                "tid": tid, "ts": us(e["time_ns"]), "args": args})
            else:
                pinned = e.get("memory") == "pinned"
                if pinned:
                    tid = tid_of(dev, ("pinned",), "pinned host memory")
                else:
                    tid = stream_track(dev, e["stream"])
                p = pid_of(dev)
                out.append({"ph": "i", "s": "p" if k == "oom" else "t", "name": k, "cat": "memory", "pid": p,
                            "tid": tid, "ts": us(e["time_ns"]),
                            "args": {"addr": hex(e["addr"]), "size": e["size"], "stream": e["stream"],
                                     "allocated": e["allocated"], "reserved": e["reserved"]}})
                out.append({"ph": "C", "name": "memory (pinned host)" if pinned else "memory", "pid": p,
                            "ts": us(e["time_ns"]), "args": {"allocated": e["allocated"], "reserved": e["reserved"]}})
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"producer": "paddle_rt.profiler", "start_ns": self.start_ns, "stop_ns": self.stop_ns,
                              "dropped_records": self.dropped}}


def _memory_now():
    """{device string: (allocated, reserved)} of every device allocator that exists (device memory only)."""
    from paddle_rt._core import allocator as _alloc
    out = {}
    for a in list(_alloc._allocators):
        if a.kind != "device":
            continue
        try:
            s = a.stats()
            out[str(a.device)] = (s["allocated_bytes.all.current"], s["reserved_bytes.all.current"])
        except Exception:
            pass
    return out


class OpStats:
    """One row of :meth:`profile.key_averages`: an operation kind with its count and times in microseconds."""
    __slots__ = ("kind", "count", "total_us", "min_us", "max_us", "queue_total_us", "bytes")

    def __init__(self, kind):
        self.kind = kind
        self.count = 0
        self.total_us = 0.0
        self.min_us = float("inf")
        self.max_us = 0.0
        self.queue_total_us = 0.0
        self.bytes = 0

    def _add(self, e):
        d = (e["end_ns"] - e["start_ns"]) / 1000.0
        self.count += 1
        self.total_us += d
        self.min_us = min(self.min_us, d)
        self.max_us = max(self.max_us, d)
        self.queue_total_us += (e["start_ns"] - e["enqueue_ns"]) / 1000.0
        self.bytes += e["bytes"]

    @property
    def mean_us(self):
        return self.total_us / self.count if self.count else 0.0

    @property
    def queue_mean_us(self):
        """Mean time from enqueue to start."""
        return self.queue_total_us / self.count if self.count else 0.0

    def __repr__(self):
        return (f"OpStats({self.kind!r}, count={self.count}, total_us={self.total_us:.1f}, "
                f"mean_us={self.mean_us:.1f})")


_SORT_KEYS = {"total": "total_us", "count": "count", "mean": "mean_us", "min": "min_us", "max": "max_us",
              "queue": "queue_mean_us", "bytes": "bytes", "kind": "kind"}


class KeyAverages(list):
    """A list of :class:`OpStats` rows (most total time first); :meth:`table` formats it."""

    def __init__(self, rows=()):
        super().__init__(sorted(rows, key=lambda r: -r.total_us))

    def by_kind(self):
        return {r.kind: r for r in self}

    def table(self, sort_by="total", row_limit=None):
        """A text table sorted by ``sort_by`` (total, count, mean, min, max, queue, bytes or kind; descending except
        kind), at most ``row_limit`` rows."""
        attr = _SORT_KEYS.get(sort_by)
        if attr is None:
            raise InvalidArgument(f"key_averages().table: sort_by={sort_by!r} is not one of {sorted(_SORT_KEYS)}")
        rows = sorted(self, key=lambda r: getattr(r, attr), reverse=(sort_by != "kind"))
        if row_limit is not None:
            rows = rows[:row_limit]
        head = ("operation", "count", "total us", "mean us", "min us", "max us", "queue us", "bytes")
        body = [(r.kind, str(r.count), f"{r.total_us:.1f}", f"{r.mean_us:.2f}", f"{r.min_us:.2f}",
                 f"{r.max_us:.2f}", f"{r.queue_mean_us:.2f}", str(r.bytes)) for r in rows]
        widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
        line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths)))
        sep = "-" * len(line)
        lines = [sep, line, sep]
        for b in body:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))))
        lines.append(sep)
        total = sum(r.total_us for r in self)
        lines.append(f"{sum(r.count for r in self)} operations, {total:.1f} us of stream time")
        return "\n".join(lines)

    def __str__(self):
        return self.table()
