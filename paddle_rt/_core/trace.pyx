"""The event recorder behind ``paddle_rt.profiler`` and ``paddle_rt.memory.record_history``.

Producers (the allocator, every stream's worker, the plugin trace sink) test the module-level C int ``trace_mask``
(trace.pxd) and, only when their bit is set, append a POD record (includes/trace_support.pxd) to one bounded buffer
behind a C++ mutex, without the GIL. With nothing recording the cost is one load and one predictable branch.

Python-side consumers (a profiler session, the memory history) subscribe with the bits they want; the recorder's
mask is the union of theirs. ``flush()`` drains the buffer into dicts and hands each consumer the events it asked
for that happened while it was subscribed. Plugin profiler hooks (``profiler_*`` in C_DeviceInterface) are driven
through :class:`PluginTracer`; what plugins report through ``profiler_add_runtime_trace_event`` /
``profiler_add_device_trace_event`` (exported by libpaddle_rt_host.so) reaches :func:`_plugin_sink` while a sink is
installed.
"""
import sys
import threading

from libc.stdint cimport uintptr_t, int64_t, uint64_t
from libcpp.vector cimport vector
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.exc cimport PyErr_Clear

from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Profiler, C_Status, C_SUCCESS, C_WARNING
from paddle_rt._core.plugin cimport Plugin
from paddle_rt._core.device cimport Device
from paddle_rt._core.includes.stream_support cimport prt_now_ns
from paddle_rt._core.includes.trace_support cimport (
    prt_trace_record, prt_plugin_record, prt_trace_buffer, prt_trace_push, prt_trace_push_plugin, prt_trace_take,
    prt_plugin_name, prt_trace_size, prt_trace_pending_frames, prt_trace_set_pending_frames, prt_capture_frames,
    prt_code_line,
    PRT_TRACE_MEMORY, PRT_TRACE_STREAMS, PRT_TRACE_STACKS, PRT_TRACE_PLUGIN,
    PRT_EV_ALLOC, PRT_EV_FREE, PRT_EV_SEGMENT_ALLOC, PRT_EV_SEGMENT_FREE, PRT_EV_OOM, PRT_EV_EMPTY_CACHE, PRT_EV_OP,
    PRT_EV_PLUGIN, PRT_EV_SEGMENT_MAP, PRT_EV_SEGMENT_UNMAP,
)
from paddle_rt._core.includes.stream_support cimport (
    PRT_OPK_OTHER, PRT_OPK_NOP, PRT_OPK_HOST_FUNC, PRT_OPK_PY_CALLBACK, PRT_OPK_MEMCPY_H2H, PRT_OPK_MEMCPY_H2D,
    PRT_OPK_MEMCPY_D2H, PRT_OPK_MEMCPY_D2D, PRT_OPK_MEMCPY_P2P, PRT_OPK_MEMSET, PRT_OPK_EVENT_RECORD,
    PRT_OPK_EVENT_WAIT, PRT_OPK_COLLECTIVE, PRT_OPK_OPERATOR,
)

cdef int trace_mask = 0
cdef prt_trace_buffer* _buf = new prt_trace_buffer()
_buf.capacity = 2_000_000

MEMORY = PRT_TRACE_MEMORY
STREAMS = PRT_TRACE_STREAMS
STACKS = PRT_TRACE_STACKS
PLUGIN = PRT_TRACE_PLUGIN

EVENT_KINDS = {
    PRT_EV_ALLOC: "alloc", PRT_EV_FREE: "free", PRT_EV_SEGMENT_ALLOC: "segment_alloc",
    PRT_EV_SEGMENT_FREE: "segment_free", PRT_EV_OOM: "oom", PRT_EV_EMPTY_CACHE: "empty_cache", PRT_EV_OP: "op",
    PRT_EV_PLUGIN: "plugin", PRT_EV_SEGMENT_MAP: "segment_map", PRT_EV_SEGMENT_UNMAP: "segment_unmap",
}
MEMORY_EVENTS = frozenset(("alloc", "free", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom",
                           "empty_cache"))
OP_KINDS = {
    PRT_OPK_OTHER: "other", PRT_OPK_NOP: "nop", PRT_OPK_HOST_FUNC: "host_func", PRT_OPK_PY_CALLBACK: "callback",
    PRT_OPK_MEMCPY_H2H: "memcpy_h2h", PRT_OPK_MEMCPY_H2D: "memcpy_h2d", PRT_OPK_MEMCPY_D2H: "memcpy_d2h",
    PRT_OPK_MEMCPY_D2D: "memcpy_d2d", PRT_OPK_MEMCPY_P2P: "memcpy_p2p", PRT_OPK_MEMSET: "memset",
    PRT_OPK_EVENT_RECORD: "event_record", PRT_OPK_EVENT_WAIT: "event_wait", PRT_OPK_COLLECTIVE: "collective",
    PRT_OPK_OPERATOR: "operator",
}
cdef int MAX_FRAMES = 64
# Operators' labels while streams are traced: (stream tag, position) -> {"name", "shapes", "dtype", "bytes"}; the
# operation's record (kind "operator") takes its name and arguments from here when it is collected.
cdef dict _op_labels = {}


cdef int trace_label_op(uintptr_t stream, uint64_t pos, dict label) except -1:
    _op_labels[(stream, pos)] = label
    return 0


# -- producers (no GIL) ------------------------------------------------------------------------------------------------
cdef void trace_emit(const prt_trace_record* r) noexcept nogil:
    prt_trace_push(_buf, r)


cdef void trace_memory_event(void* device, int memkind, int ev, uintptr_t addr, uint64_t size, uintptr_t stream,
                             uint64_t requested, int64_t allocated, int64_t reserved) noexcept nogil:
    cdef prt_trace_record r
    r.kind = ev
    r.op = memkind
    r.device = device
    r.stream = stream
    r.addr = addr
    r.size = size
    r.pos = requested                # a memory event has no queue position: the field holds the requested bytes
    r.t_ns = prt_now_ns()
    r.t_end_ns = 0
    r.t_enq_ns = 0
    r.allocated = allocated
    r.reserved = reserved
    r.frames = NULL
    if (ev == PRT_EV_ALLOC or ev == PRT_EV_OOM) and (trace_mask & PRT_TRACE_STACKS):
        r.frames = prt_trace_pending_frames()      # the reference moves into the record
        prt_trace_set_pending_frames(NULL)
    prt_trace_push(_buf, &r)


cdef void trace_note_caller() noexcept:
    cdef PyObject* frames = prt_capture_frames(MAX_FRAMES)     # new reference, or NULL with an exception set
    cdef PyObject* old
    if frames == NULL:
        PyErr_Clear()
        return
    old = <PyObject*>prt_trace_pending_frames()
    prt_trace_set_pending_frames(<void*>frames)
    Py_XDECREF(old)


cdef list _frames_as_dicts(tuple raw, dict lines):
    """(code, lasti, ...) from prt_capture_frames -> [{"filename", "line", "name"}], innermost first."""
    cdef Py_ssize_t i
    out = []
    for i in range(0, len(raw) - 1, 2):
        code = raw[i]
        lasti = raw[i + 1]
        key = (id(code), lasti)
        hit = lines.get(key)
        if hit is not None and hit[0] is code:     # the value keeps the code alive: its id is not reused meanwhile
            line = hit[1]
        else:
            line = prt_code_line(<PyObject*>code, <int>lasti)
            lines[key] = (code, line)
        out.append({"filename": code.co_filename, "line": line, "name": code.co_name})
    return out


cdef void _plugin_sink(C_Profiler prof, void* event, int is_device) noexcept nogil:
    prt_trace_push_plugin(_buf, <void*>prof, event, is_device, prt_now_ns())


# -- the mask and the consumers ------------------------------------------------------------------------------------------
_lock = threading.RLock()
_subscribers = []          # objects with .mask, .start_ns, .stop_ns (None while running) and ._deliver(list)
stream_names = {}          # stream tag -> (device string, stream name) for streams created while recording
_tracers = {}              # C_Profiler handle (address) -> PluginTracer, while a profiler session drives plugins


def _after_fork_in_child():
    """A child of fork() starts with nothing recording and a fresh buffer (the parent's lock may have been held by
    another thread at the fork; the old buffer is abandoned, not freed)."""
    global _buf, _lock
    _set_mask(0)
    _buf = new prt_trace_buffer()
    prt_trace_set_pending_frames(NULL)
    _lock = threading.RLock()
    _subscribers.clear()
    if _tracers:
        _tracers.clear()
        try:
            install_sink(False)        # the parent's session installed it
        except Exception:
            pass
    stream_names.clear()


import os as _os
_os.register_at_fork(after_in_child=_after_fork_in_child)


def now_ns():
    """paddle_rt's clock (CLOCK_MONOTONIC, nanoseconds): the clock of every recorded time."""
    return prt_now_ns()


def mask():
    """The bits currently recorded (MEMORY | STREAMS | STACKS | PLUGIN)."""
    return trace_mask


cdef void _set_mask(int m) noexcept:
    global trace_mask
    trace_mask = m


DEFAULT_CAPACITY = 2_000_000


def _recompute():
    cdef int m = 0
    cap = 0
    for s in _subscribers:
        m |= s.mask
        cap = max(cap, getattr(s, "capacity", DEFAULT_CAPACITY))
    _buf.capacity = cap or DEFAULT_CAPACITY
    _set_mask(m)
    if not (m & PRT_TRACE_STACKS):
        _clear_pending()


def _clear_pending():
    cdef PyObject* old = <PyObject*>prt_trace_pending_frames()
    prt_trace_set_pending_frames(NULL)
    Py_XDECREF(old)


def subscribe(sub):
    """Start delivering events to ``sub`` (its .mask says which). Records made before are not delivered to it."""
    with _lock:
        if sub in _subscribers:
            raise RuntimeError("already subscribed")
        flush()
        if not _subscribers:
            _discard()
            stream_names.clear()
        _subscribers.append(sub)
        _recompute()


def unsubscribe(sub):
    """Deliver what is pending and stop recording for ``sub``."""
    with _lock:
        if sub not in _subscribers:
            return
        _subscribers.remove(sub)
        _recompute()
        _deliver_all(_take(), extra=[sub])
        if not _subscribers:
            _discard()


def update(sub):
    """Recompute the mask after ``sub.mask`` changed."""
    with _lock:
        flush()
        _recompute()


def subscribers():
    with _lock:
        return list(_subscribers)


def flush():
    """Drain the buffer and deliver the events to the subscribers."""
    with _lock:
        _deliver_all(_take())


def pending():
    """Records waiting in the buffer (not yet drained)."""
    return _pending_count()


cdef size_t _pending_count():
    return prt_trace_size(_buf)


def dropped():
    """Records dropped because the buffer was full (or host memory ran out) since the process started."""
    return _buf.dropped


def set_capacity(size_t n):
    """Most records held before the oldest are dropped (drained into Python by flush()). Subscribing or
    unsubscribing sets it again from the subscribers' ``capacity`` (the largest; DEFAULT_CAPACITY without one)."""
    if n < 1:
        raise ValueError("capacity must be at least 1")
    _buf.capacity = n


def capacity():
    return _buf.capacity


def _discard():
    _take()


def _deliver_all(events, extra=()):
    subs = list(_subscribers) + [s for s in extra if s not in _subscribers]
    if not events or not subs:
        return
    for s in subs:
        m = s.mask
        t0 = s.start_ns
        t1 = s.stop_ns
        mine = []
        for e in events:
            k = e["kind"]
            if k == "op":
                if not (m & PRT_TRACE_STREAMS) or e["enqueue_ns"] < t0:
                    continue
            elif k == "plugin":
                if not (m & PRT_TRACE_PLUGIN) or e.get("session") is not s:
                    continue
            else:
                if not (m & PRT_TRACE_MEMORY) or e["time_ns"] < t0:
                    continue
            if t1 is not None and e["time_ns"] > t1 and k != "plugin" and k != "op":
                continue
            mine.append(e)
        if mine:
            s._deliver(mine)


cdef list _take():
    cdef vector[prt_trace_record] recs
    cdef vector[prt_plugin_record] plugin
    cdef vector[void*] orphans
    cdef size_t i
    cdef prt_trace_record* r
    cdef prt_plugin_record* p
    with nogil:
        prt_trace_take(_buf, &recs, &plugin, &orphans)
    for i in range(orphans.size()):
        Py_XDECREF(<PyObject*>orphans[i])
    out = []
    names = {}
    lines = {}
    for i in range(recs.size()):
        r = &recs[i]
        frames = ()
        if r.frames != NULL:
            frames = <object>r.frames
            Py_XDECREF(<PyObject*>r.frames)   # `frames` holds it now
            r.frames = NULL
        if r.device != NULL:
            key = <uintptr_t>r.device
            dev = names.get(key)
            if dev is None:
                dev = names[key] = str(<object>r.device)
        else:
            dev = None
        kind = EVENT_KINDS.get(r.kind, "unknown")
        if r.kind == PRT_EV_OP:
            e = {"kind": "op", "op": OP_KINDS.get(r.op, "other"), "device": dev, "stream": r.stream,
                 "position": r.pos, "bytes": r.size, "enqueue_ns": r.t_enq_ns, "start_ns": r.t_ns,
                 "end_ns": r.t_end_ns, "time_ns": r.t_ns}
            if r.op == PRT_OPK_OPERATOR:
                label = _op_labels.pop((r.stream, r.pos), None)
                if label is not None:
                    e["op"] = label["name"]
                    e["args"] = {"shapes": label["shapes"], "dtype": label["dtype"]}
            out.append(e)
        else:
            out.append({"kind": kind, "device": dev, "memory": "pinned" if r.op == 1 else "device",
                        "addr": r.addr, "size": r.size, "requested": r.pos, "stream": r.stream,
                        "time_ns": r.t_ns, "allocated": r.allocated, "reserved": r.reserved,
                        "frames": _frames_as_dicts(frames, lines) if frames else []})
    for i in range(plugin.size()):
        p = &plugin[i]
        tracer = _tracers.get(<uintptr_t>p.prof)
        e = {"kind": "plugin", "device_type": tracer.device_type if tracer is not None else None,
             "device": tracer.device if tracer is not None else None,
             "session": tracer.session if tracer is not None else None,
             "is_device": bool(p.is_device), "time_ns": p.t_ns}
        if p.known:
            e.update(name=prt_plugin_name(p).decode("utf-8", "replace"), start_ns=p.start_ns, end_ns=p.end_ns,
                     stream_ops=p.stream_ops, collect_start_ns=p.collect_start_ns)
        else:
            e.update(name="plugin trace event", address=p.raw)
        out.append(e)
    return out


def note_stream(uintptr_t tag, device, name):
    """Remember the name of a stream created while recording (called by stream.pyx)."""
    stream_names[tag] = (str(device), name)


# -- plugin profiler hooks ---------------------------------------------------------------------------------------------
def install_sink(bint on):
    """Install (on) or remove paddle_rt's sink for plugin trace records in libpaddle_rt_host.so. Returns True when a
    sink was installed before the call."""
    import ctypes
    from paddle_rt._core.plugin import load_host_symbols
    lib = load_host_symbols()
    fn = lib.paddle_rt_set_trace_sink
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p]
    prev = fn(<uintptr_t>_plugin_sink if on else None)
    return bool(prev)


def sink_installed():
    """True when a plugin trace sink is installed (checked by exchanging it and putting it back)."""
    import ctypes
    from paddle_rt._core.plugin import load_host_symbols
    fn = load_host_symbols().paddle_rt_set_trace_sink
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p]
    prev = fn(None)
    if prev:
        fn(prev)
    return bool(prev)


PROFILER_HOOKS = ("profiler_initialize", "profiler_prepare_tracing", "profiler_start_tracing",
                  "profiler_stop_tracing", "profiler_collect_trace_data", "profiler_finalize")


def ready_current_device():
    """Initialise the calling thread's current device (and its plugin), so that its profiler hooks can be driven."""
    from paddle_rt._core.device import get_device
    cdef Device d = get_device()
    d.ensure_ready()


def profiled_plugins():
    """(plugin, device name) for every initialised plugin with a profiler_collect_trace_data hook; the name is its
    first initialised device (for messages)."""
    from paddle_rt._core.plugin import list_plugins
    out = []
    cdef Plugin p
    for p in list_plugins():
        if p.iface == NULL or p.iface.profiler_collect_trace_data == NULL or p._state != 1:
            continue
        try:
            p.check_process()          # a child of fork() leaves the parent's plugins alone
        except Exception:
            continue
        first = None
        for d in list(p._devices):
            if d is not None and (<Device>d).alive():
                first = d
                break
        out.append((p, str(first) if first is not None else f"{p.device_type}:0"))
    return out


cdef class PluginTracer:
    """One profiler session of one plugin (its profiler_* hooks). The C_Profiler handle the plugin sees is this
    object's address. Each method returns the hook's C_Status, or None when the plugin lacks the hook."""
    cdef Plugin plugin
    cdef C_DeviceInterface* iface
    cdef void* user_data
    cdef readonly str device          # the plugin's first initialised device ("rt_cpu:0"), for messages
    cdef readonly str device_type
    cdef readonly object session      # the profiler session it reports to
    cdef readonly int state           # 0 new, 1 initialised, 2 finalised

    def __cinit__(self, Plugin plugin, device, session):
        self.plugin = plugin
        self.iface = plugin.iface
        self.user_data = NULL
        self.device = str(device)
        self.device_type = plugin.device_type
        self.session = session
        self.state = 0

    @property
    def handle(self):
        return <uintptr_t><void*>self

    def register(self):
        _tracers[<uintptr_t><void*>self] = self

    def unregister(self):
        _tracers.pop(<uintptr_t><void*>self, None)

    def initialize(self):
        cdef C_Status st
        cdef void* ud = NULL
        if self.iface.profiler_initialize == NULL:
            self.state = 1
            return None
        with nogil:
            st = self.iface.profiler_initialize(<C_Profiler><void*>self, &ud)
        if st == C_SUCCESS or st == C_WARNING:
            self.user_data = ud
            self.state = 1
        return st

    cdef object _session_call(self, C_Status (*hook)(C_Profiler, void*) noexcept nogil):
        """One of the profiler_*_tracing hooks on this session (None when the plugin lacks it)."""
        cdef C_Status st
        if hook == NULL:
            return None
        with nogil:
            st = hook(<C_Profiler><void*>self, self.user_data)
        return st

    def prepare(self):
        return self._session_call(self.iface.profiler_prepare_tracing)

    def start(self):
        return self._session_call(self.iface.profiler_start_tracing)

    def stop(self):
        return self._session_call(self.iface.profiler_stop_tracing)

    def collect(self, uint64_t start_ns):
        cdef C_Status st
        if self.iface.profiler_collect_trace_data == NULL:
            return None
        with nogil:
            st = self.iface.profiler_collect_trace_data(<C_Profiler><void*>self, start_ns, self.user_data)
        return st

    def finalize(self):
        cdef C_Status st
        if self.state != 1:
            return None
        self.state = 2
        if self.iface.profiler_finalize == NULL:
            return None
        with nogil:
            st = self.iface.profiler_finalize(<C_Profiler><void*>self, self.user_data)
        self.user_data = NULL
        return st


def status_ok(st):
    return st is None or st == C_SUCCESS or st == C_WARNING
