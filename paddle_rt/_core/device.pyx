"""Devices: one :class:`Device` per (plugin, index), the current device per thread, properties, and the ordered
teardown at interpreter exit (higher layers first, then ``deinit_device``, then ``finalize``)."""
import atexit
import os
import sys
import threading
import warnings

from libcpp cimport bool as cbool
from cpython.ref cimport PyObject

cdef extern from *:
    """
    /* The calling thread's current Device, borrowed: Device objects are owned by their Plugin's device list for the
       life of the process, so the pointer never dangles. Mirrors _thread_state.device for the hot path. */
    static thread_local PyObject* prt_current_device = NULL;
    """
    PyObject* prt_current_device

from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_Status, C_SUCCESS, C_WARNING, C_GridDim3
from paddle_rt._core.plugin cimport Plugin, process_forked

from paddle_rt._core import errors
from paddle_rt._core import plugin as _plugin_mod

_thread_state = threading.local()
_default_lock = threading.Lock()
_default_device = None
_teardown_hooks = []      # (order, seq, fn)
# Size hints that round every allocation, and the largest value that is taken for a real answer (a plugin that
# reports more returned garbage: rounding every request up to it would exhaust any device).
_ALLOCATION_HINTS = ("min_chunk_size", "extra_padding_size")
MAX_PLAUSIBLE_HINT = 1 << 30
_torn_down = False


cdef int add_synchronize_hook(Device dev, object fn) except -1:
    hooks = dev.layers.setdefault("synchronize", [])
    if fn not in hooks:
        hooks.append(fn)
    return 0


def host_addressable_types():
    """Device types listed in ``PADDLE_RT_HOST_ADDRESSABLE`` (comma separated): their device memory is taken for host
    memory even when the plugin does not say so (paddle_rt_ext_host_addressable, include/paddle_rt/extension.h)."""
    extra = os.environ.get("PADDLE_RT_HOST_ADDRESSABLE", "")
    return frozenset(t.strip() for t in extra.split(",") if t.strip())


cdef bint device_host_addressable(Device dev):
    return dev.plugin.host_memory or dev.type in host_addressable_types()


cdef int check_status(Device dev, str call, C_Status status) except -1:
    if status == C_SUCCESS or status == C_WARNING:
        return 0
    raise errors.PluginError(repr(dev), call, status)


cdef object _query_hint(Device dev, size_t addr, bint boolean):
    """The value a hint hook (at addr) answers: an int from a size_t hook, a bool from a bool hook; None when
    the plugin lacks the hook or it fails (the hints are optional)."""
    cdef size_t v = 0
    cdef cbool b = False
    cdef C_Status st
    cdef C_Status (*size_fn)(C_Device, size_t*) noexcept nogil
    cdef C_Status (*bool_fn)(C_Device, cbool*) noexcept nogil
    if addr == 0:
        return None
    if boolean:
        bool_fn = <C_Status (*)(C_Device, cbool*) noexcept nogil>addr
        with nogil:
            st = bool_fn(&dev._cdev, &b)
    else:
        size_fn = <C_Status (*)(C_Device, size_t*) noexcept nogil>addr
        with nogil:
            st = size_fn(&dev._cdev, &v)
    if st != C_SUCCESS and st != C_WARNING:
        return None
    return bool(b) if boolean else int(v)


cdef class Device:
    """A device of a plugin. Obtain with :func:`paddle_rt.device`; one object per device (compare with ``is``)."""

    def __cinit__(self):
        self._state = 0
        self.layers = {}
        self.iface = NULL

    def __init__(self):
        raise TypeError("use paddle_rt.device('type:index') to get a Device")

    @staticmethod
    cdef Device _new(Plugin plugin, int index, int physical_id):
        cdef Device d = Device.__new__(Device)
        d.plugin = plugin
        d.index = index
        d.type = plugin.device_type
        d._cdev.id = physical_id
        d.iface = plugin.iface
        return d

    def __repr__(self):
        return f"{self.type}:{self.index}"

    def __str__(self):
        return f"{self.type}:{self.index}"

    def __reduce__(self):
        return (device, (f"{self.type}:{self.index}",))

    @property
    def host_addressable(self):
        """Whether the host may read and write this device's memory at its address (zero-copy buffer, array
        interface and DLPack exports of its allocations): the plugin says so through paddle_rt's extension
        ``paddle_rt_ext_host_addressable``, or the device type is listed in ``PADDLE_RT_HOST_ADDRESSABLE``."""
        return device_host_addressable(self)

    @property
    def id(self):
        """The physical id the plugin sees (from its device list)."""
        return self._cdev.id

    cdef C_Device cdev(self) noexcept nogil:
        return &self._cdev

    cdef bint alive(self) noexcept nogil:
        return self._state == 1

    cdef int ensure_ready(self) except -1:
        cdef C_Status st
        if self._state == 1:
            return self.plugin.check_process()
        with self.plugin._lock:
            self.plugin.ensure_initialized()
            if self._state == 1:
                return 0
            if self._state == 2:
                raise errors.DeviceError(f"{self!r}: the device was torn down (interpreter shutting down)")
            if self.iface.init_device != NULL:
                with nogil:
                    st = self.iface.init_device(&self._cdev)
                check_status(self, "init_device", st)
            self._state = 1
        return 0

    cdef int activate(self) except -1:
        cdef C_Status st
        self.ensure_ready()
        with nogil:
            st = self.iface.set_device(&self._cdev)
        if st != C_SUCCESS and st != C_WARNING:
            raise errors.PluginError(repr(self), "set_device", st)
        return 0

    cdef C_Status set_current_nogil(self) noexcept nogil:
        return self.iface.set_device(&self._cdev)

    def synchronize(self):
        """Wait until all work on the device is done (``synchronize_device``; streams paddle_rt drives itself are
        synchronised by their own layer first)."""
        cdef C_Status st = C_SUCCESS
        self.activate()
        for fn in list(self.layers.get("synchronize", ())):
            fn(self)
        if self.iface.synchronize_device != NULL:
            with nogil:
                st = self.iface.synchronize_device(&self._cdev)
            check_status(self, "synchronize_device", st)

    def memory_info(self):
        """``(free, total)`` bytes from ``device_memory_stats``; ``(0, 0)`` when the plugin lacks it (as Paddle)."""
        cdef size_t total = 0, free_ = 0
        cdef C_Status st
        if self.iface.device_memory_stats == NULL:
            return (0, 0)
        self.activate()
        with nogil:
            st = self.iface.device_memory_stats(&self._cdev, &total, &free_)
        check_status(self, "device_memory_stats", st)
        return (int(free_), int(total))

    cdef object _size_hint(self, str name):
        cdef C_DeviceInterface* f = self.iface
        table = {
            "compute_capability": <size_t>f.get_compute_capability,
            "runtime_version": <size_t>f.get_runtime_version,
            "driver_version": <size_t>f.get_driver_version,
            "multi_process": <size_t>f.get_multi_process,
            "max_threads_per_mp": <size_t>f.get_max_threads_per_mp,
            "max_threads_per_block": <size_t>f.get_max_threads_per_block,
            "min_chunk_size": <size_t>f.device_min_chunk_size,
            "max_chunk_size": <size_t>f.device_max_chunk_size,
            "max_alloc_size": <size_t>f.device_max_alloc_size,
            "extra_padding_size": <size_t>f.device_extra_padding_size,
            "init_alloc_size": <size_t>f.device_init_alloc_size,
            "realloc_size": <size_t>f.device_realloc_size,
        }
        return _query_hint(self, table[name], False)

    cdef object _bool_hint(self, str name):
        table = {
            "float16_supported": <size_t>self.iface.is_float16_supported,
            "bfloat16_supported": <size_t>self.iface.is_bfloat16_supported,
            "dnn_supported": <size_t>self.iface.is_dnn_supported,
        }
        return _query_hint(self, table[name], True)

    def size_hint(self, name):
        """One size hook's value (``min_chunk_size``, ``extra_padding_size``, ...), or None when not implemented.
        The two that shape every allocation (min chunk, extra padding) raise PluginError when absurd."""
        self.activate()
        v = self._size_hint(name)
        if name in _ALLOCATION_HINTS and v is not None and v > MAX_PLAUSIBLE_HINT:
            raise errors.PluginError(
                repr(self), "device_" + name, C_SUCCESS, returned=f"{v} bytes",
                detail=f"more than {MAX_PLAUSIBLE_HINT >> 30} GiB; every allocation is rounded with it",
                plugin=self.plugin.device_type)
        return v

    @property
    def properties(self):
        """What the plugin reports about the device, for the hooks it implements."""
        cdef unsigned int dims[3]
        cdef C_Status st
        self.activate()
        props = {"device_type": self.type, "sub_device_type": self.plugin.sub_device_type, "index": self.index,
                 "physical_id": self._cdev.id}
        for name in ("compute_capability", "runtime_version", "driver_version", "multi_process",
                     "max_threads_per_mp", "max_threads_per_block", "min_chunk_size", "extra_padding_size",
                     "max_chunk_size", "max_alloc_size", "init_alloc_size", "realloc_size"):
            v = self._size_hint(name)
            if v is not None:
                props[name] = v
        for name in ("float16_supported", "bfloat16_supported", "dnn_supported"):
            v = self._bool_hint(name)
            if v is not None:
                props[name] = v
        if self.iface.get_max_grid_dim_size != NULL:
            dims[0] = dims[1] = dims[2] = 0
            with nogil:
                st = self.iface.get_max_grid_dim_size(&self._cdev, <C_GridDim3*>dims)
            if st == C_SUCCESS or st == C_WARNING:
                props["max_grid_dim_size"] = (dims[0], dims[1], dims[2])
        _, total = self.memory_info()
        props["total_memory"] = total
        return props

    def _teardown(self):
        """deinit_device (at exit, after the layers above released everything)."""
        cdef C_Status st = C_SUCCESS
        if self._state != 1:
            self._state = 2
            return
        self._state = 2
        if self.iface.deinit_device != NULL:
            with nogil:
                st = self.iface.set_device(&self._cdev)
                st = self.iface.deinit_device(&self._cdev)
        if st != C_SUCCESS and st != C_WARNING:
            raise errors.PluginError(repr(self), "deinit_device", st)

    def _reset_after_fork(self):
        self._state = 0
        self.layers = {}


cdef Device _device_of(Plugin p, int index):
    cdef int n = p.device_count()
    if index < 0 or index >= n:
        raise errors.DeviceError(
            f"device index {index} is out of range for {p.device_type!r}: it has {n} device(s) (0..{n - 1}); "
            + (f"use {p.device_type}:0 to {p.device_type}:{n - 1}" if n else "the plugin reports no device")
            + " (paddle_rt.devices() lists every device)")
    d = p._devices[index]
    if d is None:
        with p._lock:
            d = p._devices[index]
            if d is None:
                d = Device._new(p, index, p._physical_ids[index])
                p._devices[index] = d
    return d


def _parse(spec):
    # The index is parsed digit by digit rather than with int(): CPython 3.11 builds int("0") through a long whose
    # digit slot it never writes, and memcheck then flags every later use of the value (tests run under valgrind).
    cdef long long i = 0
    s = spec.strip()
    if ":" in s:
        t, _, idx = s.rpartition(":")
        text = idx.strip()
        if text.startswith("-") and text[1:].isdecimal():
            raise errors.DeviceError(f"bad device string {spec!r}: the index must not be negative")
        if not text.isascii() or not text.isdecimal():
            raise errors.DeviceError(f"bad device string {spec!r}: the index {idx!r} is not an integer")
        if len(text) > 9:
            raise errors.DeviceError(f"bad device string {spec!r}: the index {idx!r} is too large")
        for ch in text:
            i = i * 10 + (ord(ch) - 48)
        return t, i
    return s, None


def device(spec=None, index=None):
    """The :class:`Device` named by ``spec``: ``"rt_cpu:1"``, ``("rt_cpu", 1)``, an int (that index of the current
    device's type), a Device, or None (the current device of this thread)."""
    if process_forked():
        raise_forked(spec)
    if spec is None and index is None:
        return get_device()
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        if index is not None:
            raise errors.DeviceError(f"device({spec!r}, {index!r}): give a type with an index")
        return _device_of(get_device().plugin, spec)
    if not isinstance(spec, str):
        raise errors.DeviceError(f"cannot make a device from {spec!r} (give 'type:index', a type and an index, "
                                 f"an int or a Device)")
    if index is None:
        d = _by_spec.get(spec)
        if d is not None and _still_listed(<Device>d):
            return d
    t, i = _parse(spec)
    if index is not None:
        if i is not None:
            raise errors.DeviceError(f"device({spec!r}, {index!r}): the index is given twice")
        if not isinstance(index, int) or index < 0:
            raise errors.DeviceError(f"device({spec!r}, {index!r}): the index must be a non-negative int")
        i = index
    if t not in _plugin_mod._by_type:
        raise errors.DeviceError(
            f"bad device string {spec!r}: unknown device type {t!r} "
            f"(registered: {', '.join(_plugin_mod._by_type) or 'none'}); write 'type:index' with a registered type, "
            f"e.g. '{next(iter(_plugin_mod._by_type), 'rt_cpu')}:0' (paddle_rt.devices() lists every device), or "
            f"load the plugin of {t!r} first (paddle_rt.load_plugin(path), or its folder in CUSTOM_DEVICE_ROOT)")
    d = _device_of(_plugin_mod._by_type[t], 0 if i is None else i)
    if index is None and len(_by_spec) < 1024:
        _by_spec[spec] = d
    return d


# "rt_cpu:1" -> its Device, so that a call naming its device by string (malloc(n, device="rt_cpu:1")) does not parse
# it again (~0.85 us of a 1.1 us pair). A hit is used only while the plugin still lists that Device: after fork() the
# plugin makes new ones. Bounded: strings beyond the first 1,024 distinct ones are parsed every time.
_by_spec = {}


cdef inline bint _still_listed(Device d):
    cdef list devs = d.plugin._devices
    return d.index < len(devs) and devs[d.index] is d


cpdef Device resolve_device(object dev=None):
    if process_forked():
        raise_forked(dev)
    if dev is None:
        if prt_current_device != NULL:
            return <Device>prt_current_device
        return get_device()
    if isinstance(dev, Device):
        return dev
    return device(dev)


def refuse_in_child(what=None):
    """ForkError in a child of fork() before reinitialize_after_fork (for the Python layers: the memory history)."""
    if process_forked():
        raise_forked(what)


cdef int raise_forked(object dev) except -1:
    """Every call that names or implies a device, in a child of fork() before reinitialize_after_fork: ForkError
    (never a wait: a lock of the parent's state may have been held by one of its threads at the fork)."""
    what = "the current device" if dev is None else repr(str(dev))
    raise errors.ForkError(f"{what}: this process is a child of fork(); the devices, their memory, streams, events, "
                           f"pools and communicators are the parent's. Call paddle_rt.reinitialize_after_fork() "
                           f"before using paddle_rt in the child")


def devices(device_type=None):
    """All devices, or those of ``device_type``, in plugin load order."""
    if process_forked():
        raise_forked(device_type)
    if device_type is not None:
        p = _plugin_mod.get_plugin(device_type)
        return [_device_of(p, i) for i in range(p.device_count())]
    # All plugins: one that cannot initialise is left out with a warning rather than hiding every other device
    # (asking for its type explicitly raises the PluginError).
    out = []
    for p in _plugin_mod.list_plugins():
        try:
            n = p.device_count()
        except errors.PaddleRTError as exc:
            warnings.warn(f"paddle_rt: devices(): left out {p.device_type}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        out += [_device_of(p, i) for i in range(n)]
    return out


def device_count(device_type=None):
    """Number of devices of ``device_type`` (default: the current device's type)."""
    if process_forked():
        raise_forked(device_type)
    if device_type is None:
        return get_device().plugin.device_count()
    return _plugin_mod.get_plugin(device_type).device_count()


def _initial_device():
    global _default_device
    if _default_device is not None:
        return _default_device
    with _default_lock:
        if _default_device is not None:
            return _default_device
        spec = os.environ.get("PADDLE_RT_DEFAULT_DEVICE", "")
        if spec:
            try:
                d = device(spec)
            except errors.DeviceError as exc:
                raise errors.DeviceError(f"PADDLE_RT_DEFAULT_DEVICE={spec!r}: {exc}") from None
        else:
            plugins = _plugin_mod.discovered_plugins() or _plugin_mod.list_plugins()
            if not plugins:
                raise errors.DeviceError("no plugin is loaded (the bundled rt_cpu is disabled by "
                                         "PADDLE_RT_NO_RT_CPU and none was found)")
            # The first third-party plugin that initialises and has a device (later ones are not initialised);
            # a plugin whose initialisation fails is skipped with a warning; else the first plugin (rt_cpu).
            chosen = None
            for p in plugins:
                if p.bundled:
                    continue
                try:
                    if p.device_count() > 0:
                        chosen = p
                        break
                except errors.PaddleRTError as exc:
                    warnings.warn(f"paddle_rt: {p.device_type} cannot be the default device: {exc}",
                                  RuntimeWarning, stacklevel=3)
            if chosen is None:
                chosen = plugins[0]
            d = _device_of(chosen, 0)
        _default_device = d
        return d


def get_device():
    """The current device of the calling thread (a new thread starts on the default device)."""
    global prt_current_device
    if process_forked():
        raise_forked(None)
    d = getattr(_thread_state, "device", None)
    if d is None:
        d = _initial_device()
        _thread_state.device = d
        prt_current_device = <PyObject*>d
    return d


def set_device(dev):
    """Make ``dev`` the current device of the calling thread and the plugin's current device."""
    global prt_current_device
    cdef Device d = resolve_device(dev)
    d.activate()
    _thread_state.device = d
    prt_current_device = <PyObject*>d
    return d


def synchronize(dev=None):
    """Wait for all work on ``dev`` (default: the current device)."""
    resolve_device(dev).synchronize()


def register_teardown(fn, int order):
    """Run ``fn()`` at interpreter exit, before devices are de-initialised; lower ``order`` runs first
    (pool 10, streams 20, allocator 30)."""
    _teardown_hooks.append((order, len(_teardown_hooks), fn))


def _teardown_all():
    """Ordered shutdown: layer hooks, then deinit_device of every device, then finalize of every plugin."""
    global _torn_down
    cdef Plugin p
    if _torn_down or _plugin_mod.is_forked():
        return
    _torn_down = True
    for _, _, fn in sorted(_teardown_hooks, key=lambda t: (t[0], t[1])):
        try:
            fn()
        except BaseException as exc:  # never let one layer stop the others from returning memory
            print(f"paddle_rt: teardown step {getattr(fn, '__qualname__', fn)} failed: {exc!r}", file=sys.stderr)
    for p in _plugin_mod.list_plugins():
        for d in list(p._devices):
            if d is not None:
                try:
                    d._teardown()
                except BaseException as exc:
                    print(f"paddle_rt: {exc}", file=sys.stderr)
        try:
            p._finalize()
        except BaseException as exc:
            print(f"paddle_rt: {exc}", file=sys.stderr)


atexit.register(_teardown_all)


def reinitialize_after_fork():
    """In a child of fork(): forget the parent's device state and start the plugins afresh. Memory and streams of
    the parent are not touched (they belong to the parent). Layers register their own reset via
    ``register_fork_reset``."""
    global _default_device
    cdef Plugin p
    if not _plugin_mod.is_forked():
        return
    for fn in list(_fork_resets):
        fn()
    for p in _plugin_mod.list_plugins():
        for d in list(p._devices):
            if d is not None:
                d._reset_after_fork()
    _plugin_mod._reset_after_fork()
    global prt_current_device
    _default_device = None
    _thread_state.__dict__.clear()
    prt_current_device = NULL


_fork_resets = []


def register_fork_reset(fn):
    _fork_resets.append(fn)
