"""Plugins shipped with paddle_rt: the reference virtual accelerator ``rt_cpu``.

The helpers below read rt_cpu's own bookkeeping through ctypes. ``ctypes.CDLL`` on the same path returns the library
that paddle_rt (or Paddle) already loaded, so the numbers are those of the plugin instance in use.
"""
import ctypes
import os

__all__ = [
    "rt_cpu_path",
    "rt_cpu_source_dir",
    "rt_cpu_live_bytes",
    "rt_cpu_live_count",
    "rt_cpu_alloc_calls",
    "rt_cpu_host_live_bytes",
    "rt_cpu_initialize_refcount",
    "RT_CPU_FAULT_KINDS",
    "rt_cpu_set_fault",
    "rt_cpu_clear_faults",
]

#: The kinds of rt_cpu calls that fault injection can make fail or wait (rt_cpu_faults.c).
RT_CPU_FAULT_KINDS = ("alloc", "host_alloc", "memcpy", "memset", "create_stream", "create_event", "record_event",
                      "synchronize", "free", "unmap", "release", "free_range")

_HERE = os.path.dirname(os.path.abspath(__file__))
_lib = None


def rt_cpu_path():
    """Absolute path of the bundled rt_cpu plugin library (``librt_cpu.so`` next to this module)."""
    return os.path.join(_HERE, "librt_cpu.so")


def rt_cpu_source_dir():
    """Absolute path of the folder holding rt_cpu's C sources."""
    return os.path.join(_HERE, "rt_cpu")


def _rt_cpu():
    global _lib
    if _lib is None:
        path = rt_cpu_path()
        if not os.path.exists(path):
            raise FileNotFoundError(f"rt_cpu plugin not built: {path} does not exist")
        lib = ctypes.CDLL(path)
        for name in ("rt_cpu_live_bytes", "rt_cpu_live_count", "rt_cpu_alloc_calls"):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_size_t
        lib.rt_cpu_host_live_bytes.argtypes = []
        lib.rt_cpu_host_live_bytes.restype = ctypes.c_size_t
        lib.rt_cpu_initialize_refcount.argtypes = []
        lib.rt_cpu_initialize_refcount.restype = ctypes.c_int
        lib.rt_cpu_set_fault.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
        lib.rt_cpu_set_fault.restype = ctypes.c_int
        lib.rt_cpu_clear_faults.argtypes = []
        lib.rt_cpu_clear_faults.restype = None
        _lib = lib
    return _lib


def _index(device_index):
    i = int(device_index)
    if i < 0:
        raise ValueError(f"rt_cpu device index must be >= 0, got {device_index!r}")
    return i


def rt_cpu_live_bytes(device_index):
    """Bytes of live device allocations on rt_cpu device ``device_index`` (0 for an out-of-range index)."""
    return _rt_cpu().rt_cpu_live_bytes(_index(device_index))


def rt_cpu_live_count(device_index):
    """Number of live device allocations on rt_cpu device ``device_index``."""
    return _rt_cpu().rt_cpu_live_count(_index(device_index))


def rt_cpu_alloc_calls(device_index):
    """How many ``device_memory_allocate`` calls rt_cpu saw for the device (including failed ones) in this process."""
    return _rt_cpu().rt_cpu_alloc_calls(_index(device_index))


def rt_cpu_host_live_bytes():
    """Bytes of live pinned-host and unified allocations."""
    return _rt_cpu().rt_cpu_host_live_bytes()


def rt_cpu_initialize_refcount():
    """How many ``initialize`` calls are not yet matched by ``finalize``."""
    return _rt_cpu().rt_cpu_initialize_refcount()


def rt_cpu_set_fault(kind, every=0, after=0, delay_us=0):
    """Change rt_cpu's fault injection for one kind of call at run time (tests; the environment sets it at load:
    ``RT_CPU_FAULTS``, ``RT_CPU_FAIL_ALLOC_EVERY``...). ``kind`` is one of :data:`RT_CPU_FAULT_KINDS`: ``alloc``
    (device allocations fail as out of memory), ``host_alloc``, ``memcpy`` (every copy hook), ``memset``,
    ``create_stream``, ``create_event``, ``record_event``, ``synchronize`` (device, stream and event synchronize); the
    release side: ``free`` (``device_memory_deallocate``), ``unmap`` (the virtual-memory extension's unmap and
    unmap_pages), ``release`` (its release of a physical allocation), ``free_range`` (these fail with ``C_ERROR``).
    ``every=N``: the Nth, 2Nth... call of that kind from now on fails (``C_FAILED``); ``after=N``: every call after
    the Nth fails; ``delay_us``: each call of that kind first sleeps that long in the calling thread (paddle_rt's
    stream worker for work on a stream, the caller's thread for creation) -- the tool to force an interleaving.
    0 turns each off. Applies to every rt_cpu device of the process."""
    if kind not in RT_CPU_FAULT_KINDS:
        raise ValueError(f"rt_cpu_set_fault: unknown kind {kind!r}; one of {', '.join(RT_CPU_FAULT_KINDS)}")
    for name, v in (("every", every), ("after", after), ("delay_us", delay_us)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << 64):
            raise ValueError(f"rt_cpu_set_fault: {name} must be an int in [0, 2**64), not {v!r}")
    if _rt_cpu().rt_cpu_set_fault(kind.encode(), every, after, delay_us) != 0:
        raise ValueError(f"rt_cpu_set_fault: rt_cpu does not know the kind {kind!r} (an older build?)")


def rt_cpu_clear_faults():
    """Turn every fault injection of rt_cpu off (including the ones set from the environment at load)."""
    _rt_cpu().rt_cpu_clear_faults()
