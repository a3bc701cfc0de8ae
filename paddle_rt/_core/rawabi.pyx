"""Raw access to a plugin's hooks: one method per hook, the GIL released around the call, the plugin's ``C_Status``
returned as an int (never raised: judging statuses is the caller's business, e.g. :mod:`paddle_rt.tools.check`).

A hook the plugin does not implement raises :class:`paddle_rt.NotSupportedError` naming it. Pointers and handles are
plain ints; handles are never dereferenced. ``read_host``/``write_host`` touch memory at an int address: use them only
on memory the host may address (pinned host memory; device memory only when ``RawDevice.host_addressable``).

    raw = RawDevice(paddle_rt.device("rt_cpu:0"))
    st, ptr = raw.allocate(4096)
    st = raw.copy_h2d(ptr, host_ptr, 4096)
"""
import itertools
import os
import threading

from libc.stdint cimport uintptr_t
from libc.string cimport memcpy
from libc.stdlib cimport malloc, free

from paddle_rt._core.device_ext cimport (
    C_DeviceInterface, C_Device, C_Device_st, C_Status, C_Stream, C_Event, C_CCLComm, C_CCLRootId, C_DataType,
    C_CCLReduceOp, C_SUCCESS, C_ERROR,
)
from paddle_rt._core.device cimport Device, resolve_device, device_host_addressable

from paddle_rt._core import errors

__all__ = ["RawDevice", "CallbackTicket", "read_host", "write_host", "SIZE_HINTS",
           "HOOK_OF", "get_device_count", "get_device_list", "stray_callback_calls", "pending_callbacks"]

#: The size hooks ``RawDevice.size_hint`` knows, by short name.
SIZE_HINTS = ("min_chunk_size", "max_chunk_size", "max_alloc_size", "extra_padding_size", "init_alloc_size",
              "realloc_size")

#: The hook each RawDevice method calls, by method name (size_hint calls device_<name>).
HOOK_OF = {
    "set_device": "set_device", "get_device": "get_device", "get_device_count": "get_device_count",
    "get_device_list": "get_device_list", "synchronize_device": "synchronize_device",
    "allocate": "device_memory_allocate", "deallocate": "device_memory_deallocate", "memset": "device_memory_set",
    "host_allocate": "host_memory_allocate", "host_deallocate": "host_memory_deallocate",
    "unified_allocate": "unified_memory_allocate", "unified_deallocate": "unified_memory_deallocate",
    "memory_stats": "device_memory_stats", "size_hint": "device_<name>_size",
    "copy_h2d": "memory_copy_h2d", "copy_d2h": "memory_copy_d2h", "copy_d2d": "memory_copy_d2d",
    "copy_p2p": "memory_copy_p2p", "async_copy_h2d": "async_memory_copy_h2d",
    "async_copy_d2h": "async_memory_copy_d2h", "async_copy_d2d": "async_memory_copy_d2d",
    "async_copy_p2p": "async_memory_copy_p2p", "create_stream": "create_stream", "destroy_stream": "destroy_stream",
    "query_stream": "query_stream", "synchronize_stream": "synchronize_stream",
    "stream_wait_event": "stream_wait_event", "add_callback": "stream_add_callback", "create_event": "create_event",
    "record_event": "record_event", "query_event": "query_event", "synchronize_event": "synchronize_event",
    "destroy_event": "destroy_event", "xccl_get_unique_id_size": "xccl_get_unique_id_size",
    "xccl_get_unique_id": "xccl_get_unique_id", "xccl_comm_init_rank": "xccl_comm_init_rank",
    "xccl_destroy_comm": "xccl_destroy_comm", "xccl_all_reduce": "xccl_all_reduce",
}

_callback_counter = itertools.count(1)

ctypedef C_Status (*size_hook_t)(C_Device, size_t*) noexcept nogil


cdef inline void* _p(object addr) except? NULL:
    """An int (or None) as a pointer."""
    if addr is None:
        return NULL
    return <void*><uintptr_t>addr


def read_host(addr, size_t size):
    """The ``size`` bytes at host address ``addr`` (an int), as bytes."""
    if addr is None or addr == 0:
        raise errors.InvalidArgument("read_host: NULL address")
    if size == 0:
        return b""
    return (<const char*><uintptr_t>addr)[:size]


def write_host(addr, data):
    """Copy the bytes-like ``data`` to host address ``addr`` (an int). Returns the number of bytes written."""
    cdef const unsigned char[::1] view
    if addr is None or addr == 0:
        raise errors.InvalidArgument("write_host: NULL address")
    view = memoryview(data).cast("B")
    if view.shape[0]:
        memcpy(<void*><uintptr_t>addr, &view[0], view.shape[0])
    return view.shape[0]


cdef class CallbackTicket:
    """What became of one ``add_callback``: ``ran``, ``exception`` (raised by the callable, kept here),
    ``status_in`` (the status the plugin passed), ``order`` (global run order), ``wait(timeout)``."""

    def __cinit__(self):
        self.ran = False
        self.exception = None
        self.status_in = -1
        self.order = 0
        self._done = threading.Event()

    def wait(self, timeout=None):
        """Block (GIL released, polling) until the callback ran or ``timeout`` seconds passed; True if it ran."""
        return self._done.wait(timeout)

    def __repr__(self):
        return f"<CallbackTicket ran={self.ran} order={self.order} exception={self.exception!r}>"


# Tickets waiting for their callback, by serial number. The plugin gets the serial as user_data, never a pointer to a
# Python object, so a plugin that calls a callback twice or with a wrong user_data cannot make us touch freed memory:
# such calls are only counted (stray_callback_calls).
_pending = {}
_serials = itertools.count(1)
_stray = [0]


def stray_callback_calls():
    """How many times a plugin called our callback with a user_data that named no pending callback (a second call of
    the same callback, or garbage)."""
    return _stray[0]


def pending_callbacks():
    """Number of callbacks handed to a plugin that have not run yet."""
    return len(_pending)


cdef void _run_callback(C_Device device, C_Stream stream, void* user_data, C_Status* status) noexcept with gil:
    cdef CallbackTicket t
    try:
        t = _pending.pop(<uintptr_t>user_data, None)
        if t is None:
            _stray[0] += 1
            return
    except BaseException:
        return
    try:
        t.status_in = int(status[0]) if status != NULL else -1
        t.order = next(_callback_counter)
        fn = t.fn
        t.fn = None
        try:
            fn()
        except BaseException as exc:  # kept for the caller, never lost
            t.exception = exc
            if status != NULL:
                status[0] = C_ERROR
        t.ran = True
        t._done.set()
    except BaseException as exc:
        t.exception = exc
        t.ran = True
        t._done.set()


def get_device_count(device):
    """``get_device_count`` of ``device``'s plugin -> (status, count)."""
    return RawDevice(device).get_device_count()


def get_device_list(device, count=None):
    """``get_device_list`` of ``device``'s plugin -> (status, [ids])."""
    return RawDevice(device).get_device_list(count)


cdef class RawDevice:
    """One device's hooks, raw. ``RawDevice(device)`` takes a :class:`paddle_rt.Device` (or anything
    :func:`paddle_rt.device` accepts), makes it ready and current (``activate``)."""

    def __cinit__(self, device):
        cdef Device d = resolve_device(device)
        self.device = d
        self.f = d.iface
        self.cd = d.cdev()
        self.host_addressable = device_host_addressable(d)
        d.activate()

    def __repr__(self):
        return f"<RawDevice {self.device!r}>"

    cdef int _need(self, const void* hook, str name) except -1:
        if hook == NULL:
            raise errors.NotSupportedError(f"{self.device!r}: the plugin lacks {name}")
        return 0

    def has(self, name):
        """Whether the plugin implements hook ``name``."""
        return self.device.plugin.has_hook(name)

    # -- devices ---------------------------------------------------------------------------------------------------
    def activate(self):
        """Make the device ready and current in this thread (raises on failure, unlike the raw calls)."""
        self.device.activate()

    def set_device(self, physical_id=None):
        """``set_device`` with ``physical_id`` (default: this device's) -> status."""
        cdef C_Device_st tmp
        cdef C_Status st
        self._need(<const void*>self.f.set_device, "set_device")
        tmp.id = self.cd.id if physical_id is None else <int>physical_id
        with nogil:
            st = self.f.set_device(&tmp)
        return int(st)

    def get_device(self):
        """``get_device`` -> (status, physical id the plugin wrote)."""
        cdef C_Device_st tmp
        cdef C_Status st
        self._need(<const void*>self.f.get_device, "get_device")
        tmp.id = -1
        with nogil:
            st = self.f.get_device(&tmp)
        return int(st), int(tmp.id)

    def get_device_count(self):
        """``get_device_count`` -> (status, count)."""
        cdef size_t n = 0
        cdef C_Status st
        self._need(<const void*>self.f.get_device_count, "get_device_count")
        with nogil:
            st = self.f.get_device_count(&n)
        return int(st), int(n)

    def get_device_list(self, count=None):
        """``get_device_list`` into a buffer of ``count`` entries (default: get_device_count's) -> (status, ids)."""
        cdef size_t n
        cdef size_t* ids
        cdef C_Status st
        cdef size_t i
        self._need(<const void*>self.f.get_device_list, "get_device_list")
        if count is None:
            st, count = self.get_device_count()
            if st != C_SUCCESS and st != 1:
                return st, []
        if count < 0 or count > 65536:
            raise errors.InvalidArgument(f"{self.device!r}: get_device_list: implausible count {count}")
        n = count
        ids = <size_t*>malloc((n + 1) * sizeof(size_t))
        if ids == NULL:
            raise MemoryError()
        try:
            for i in range(n + 1):
                ids[i] = <size_t>-1
            with nogil:
                st = self.f.get_device_list(ids)
            return int(st), [int(ids[i]) for i in range(n)]
        finally:
            free(ids)

    def synchronize_device(self):
        cdef C_Status st
        self._need(<const void*>self.f.synchronize_device, "synchronize_device")
        with nogil:
            st = self.f.synchronize_device(self.cd)
        return int(st)

    # -- memory ----------------------------------------------------------------------------------------------------
    def allocate(self, size_t size):
        """``device_memory_allocate`` -> (status, pointer int; 0 for NULL)."""
        cdef void* p = NULL
        cdef C_Status st
        self._need(<const void*>self.f.device_memory_allocate, "device_memory_allocate")
        with nogil:
            st = self.f.device_memory_allocate(self.cd, &p, size)
        return int(st), <uintptr_t>p

    def deallocate(self, ptr, size_t size):
        cdef void* p = _p(ptr)
        cdef C_Status st
        self._need(<const void*>self.f.device_memory_deallocate, "device_memory_deallocate")
        with nogil:
            st = self.f.device_memory_deallocate(self.cd, p, size)
        return int(st)

    def memset(self, ptr, int value, size_t size):
        cdef void* p = _p(ptr)
        cdef unsigned char v = <unsigned char>(value & 0xff)
        cdef C_Status st
        self._need(<const void*>self.f.device_memory_set, "device_memory_set")
        with nogil:
            st = self.f.device_memory_set(self.cd, p, v, size)
        return int(st)

    def host_allocate(self, size_t size):
        """``host_memory_allocate`` (pinned host memory) -> (status, pointer)."""
        cdef void* p = NULL
        cdef C_Status st
        self._need(<const void*>self.f.host_memory_allocate, "host_memory_allocate")
        with nogil:
            st = self.f.host_memory_allocate(self.cd, &p, size)
        return int(st), <uintptr_t>p

    def host_deallocate(self, ptr, size_t size):
        cdef void* p = _p(ptr)
        cdef C_Status st
        self._need(<const void*>self.f.host_memory_deallocate, "host_memory_deallocate")
        with nogil:
            st = self.f.host_memory_deallocate(self.cd, p, size)
        return int(st)

    def unified_allocate(self, size_t size):
        cdef void* p = NULL
        cdef C_Status st
        self._need(<const void*>self.f.unified_memory_allocate, "unified_memory_allocate")
        with nogil:
            st = self.f.unified_memory_allocate(self.cd, &p, size)
        return int(st), <uintptr_t>p

    def unified_deallocate(self, ptr, size_t size):
        cdef void* p = _p(ptr)
        cdef C_Status st
        self._need(<const void*>self.f.unified_memory_deallocate, "unified_memory_deallocate")
        with nogil:
            st = self.f.unified_memory_deallocate(self.cd, p, size)
        return int(st)

    def memory_stats(self):
        """``device_memory_stats`` -> (status, total, free)."""
        cdef size_t total = 0, free_ = 0
        cdef C_Status st
        self._need(<const void*>self.f.device_memory_stats, "device_memory_stats")
        with nogil:
            st = self.f.device_memory_stats(self.cd, &total, &free_)
        return int(st), int(total), int(free_)

    def size_hint(self, str name):
        """One size hook (``min_chunk_size``, ``extra_padding_size``... see SIZE_HINTS) -> (status, value)."""
        cdef size_hook_t fn
        cdef size_t v = 0
        cdef C_Status st
        if name == "min_chunk_size":
            fn = self.f.device_min_chunk_size
        elif name == "max_chunk_size":
            fn = self.f.device_max_chunk_size
        elif name == "max_alloc_size":
            fn = self.f.device_max_alloc_size
        elif name == "extra_padding_size":
            fn = self.f.device_extra_padding_size
        elif name == "init_alloc_size":
            fn = self.f.device_init_alloc_size
        elif name == "realloc_size":
            fn = self.f.device_realloc_size
        else:
            raise errors.InvalidArgument(f"{self.device!r}: unknown size hint {name!r} (one of {', '.join(SIZE_HINTS)})")
        self._need(<const void*>fn, "device_" + name)
        with nogil:
            st = fn(self.cd, &v)
        return int(st), int(v)

    # -- copies ----------------------------------------------------------------------------------------------------
    def copy_h2d(self, dst, src, size_t size):
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Status st
        self._need(<const void*>self.f.memory_copy_h2d, "memory_copy_h2d")
        with nogil:
            st = self.f.memory_copy_h2d(self.cd, d, s, size)
        return int(st)

    def copy_d2h(self, dst, src, size_t size):
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Status st
        self._need(<const void*>self.f.memory_copy_d2h, "memory_copy_d2h")
        with nogil:
            st = self.f.memory_copy_d2h(self.cd, d, s, size)
        return int(st)

    def copy_d2d(self, dst, src, size_t size):
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Status st
        self._need(<const void*>self.f.memory_copy_d2d, "memory_copy_d2d")
        with nogil:
            st = self.f.memory_copy_d2d(self.cd, d, s, size)
        return int(st)

    def copy_p2p(self, RawDevice dst_device not None, dst, src, size_t size):
        """``memory_copy_p2p`` from this device (``src``) to ``dst_device`` (``dst``)."""
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Device dd = dst_device.cd
        cdef C_Status st
        self._need(<const void*>self.f.memory_copy_p2p, "memory_copy_p2p")
        with nogil:
            st = self.f.memory_copy_p2p(dd, self.cd, d, s, size)
        return int(st)

    def async_copy_h2d(self, stream, dst, src, size_t size):
        cdef C_Stream sh = <C_Stream>_p(stream)
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Status st
        self._need(<const void*>self.f.async_memory_copy_h2d, "async_memory_copy_h2d")
        with nogil:
            st = self.f.async_memory_copy_h2d(self.cd, sh, d, s, size)
        return int(st)

    def async_copy_d2h(self, stream, dst, src, size_t size):
        cdef C_Stream sh = <C_Stream>_p(stream)
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Status st
        self._need(<const void*>self.f.async_memory_copy_d2h, "async_memory_copy_d2h")
        with nogil:
            st = self.f.async_memory_copy_d2h(self.cd, sh, d, s, size)
        return int(st)

    def async_copy_d2d(self, stream, dst, src, size_t size):
        cdef C_Stream sh = <C_Stream>_p(stream)
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Status st
        self._need(<const void*>self.f.async_memory_copy_d2d, "async_memory_copy_d2d")
        with nogil:
            st = self.f.async_memory_copy_d2d(self.cd, sh, d, s, size)
        return int(st)

    def async_copy_p2p(self, RawDevice dst_device not None, stream, dst, src, size_t size):
        cdef C_Stream sh = <C_Stream>_p(stream)
        cdef void* d = _p(dst)
        cdef const void* s = _p(src)
        cdef C_Device dd = dst_device.cd
        cdef C_Status st
        self._need(<const void*>self.f.async_memory_copy_p2p, "async_memory_copy_p2p")
        with nogil:
            st = self.f.async_memory_copy_p2p(dd, self.cd, sh, d, s, size)
        return int(st)

    # -- streams ---------------------------------------------------------------------------------------------------
    def create_stream(self):
        """``create_stream`` -> (status, handle int; 0 if the plugin wrote nothing)."""
        cdef C_Stream s = NULL
        cdef C_Status st
        self._need(<const void*>self.f.create_stream, "create_stream")
        with nogil:
            st = self.f.create_stream(self.cd, &s)
        return int(st), <uintptr_t>s

    def destroy_stream(self, stream):
        cdef C_Stream s = <C_Stream>_p(stream)
        cdef C_Status st
        self._need(<const void*>self.f.destroy_stream, "destroy_stream")
        with nogil:
            st = self.f.destroy_stream(self.cd, s)
        return int(st)

    def query_stream(self, stream):
        cdef C_Stream s = <C_Stream>_p(stream)
        cdef C_Status st
        self._need(<const void*>self.f.query_stream, "query_stream")
        with nogil:
            st = self.f.query_stream(self.cd, s)
        return int(st)

    def synchronize_stream(self, stream):
        cdef C_Stream s = <C_Stream>_p(stream)
        cdef C_Status st
        self._need(<const void*>self.f.synchronize_stream, "synchronize_stream")
        with nogil:
            st = self.f.synchronize_stream(self.cd, s)
        return int(st)

    def stream_wait_event(self, stream, event):
        cdef C_Stream s = <C_Stream>_p(stream)
        cdef C_Event e = <C_Event>_p(event)
        cdef C_Status st
        self._need(<const void*>self.f.stream_wait_event, "stream_wait_event")
        with nogil:
            st = self.f.stream_wait_event(self.cd, s, e)
        return int(st)

    def add_callback(self, stream, fn):
        """``stream_add_callback`` with a Python callable -> (status, CallbackTicket). The callable runs in whatever
        thread the plugin chooses, with the GIL; an exception it raises is kept in ``ticket.exception``. When the
        status is not success the ticket stays pending anyway (the plugin might still call it)."""
        cdef C_Stream s = <C_Stream>_p(stream)
        cdef C_Status st
        cdef CallbackTicket t
        self._need(<const void*>self.f.stream_add_callback, "stream_add_callback")
        if not callable(fn):
            raise errors.InvalidArgument(f"{self.device!r}: add_callback needs a callable, not {fn!r}")
        cdef uintptr_t serial = next(_serials)
        t = CallbackTicket.__new__(CallbackTicket)
        t.fn = fn
        _pending[serial] = t  # kept alive until the callback ran
        with nogil:
            st = self.f.stream_add_callback(self.cd, s, _run_callback, <void*>serial)
        return int(st), t

    # -- events ----------------------------------------------------------------------------------------------------
    def create_event(self):
        """``create_event`` -> (status, handle int)."""
        cdef C_Event e = NULL
        cdef C_Status st
        self._need(<const void*>self.f.create_event, "create_event")
        with nogil:
            st = self.f.create_event(self.cd, &e)
        return int(st), <uintptr_t>e

    def record_event(self, stream, event):
        cdef C_Stream s = <C_Stream>_p(stream)
        cdef C_Event e = <C_Event>_p(event)
        cdef C_Status st
        self._need(<const void*>self.f.record_event, "record_event")
        with nogil:
            st = self.f.record_event(self.cd, s, e)
        return int(st)

    def query_event(self, event):
        cdef C_Event e = <C_Event>_p(event)
        cdef C_Status st
        self._need(<const void*>self.f.query_event, "query_event")
        with nogil:
            st = self.f.query_event(self.cd, e)
        return int(st)

    def synchronize_event(self, event):
        cdef C_Event e = <C_Event>_p(event)
        cdef C_Status st
        self._need(<const void*>self.f.synchronize_event, "synchronize_event")
        with nogil:
            st = self.f.synchronize_event(self.cd, e)
        return int(st)

    def destroy_event(self, event):
        cdef C_Event e = <C_Event>_p(event)
        cdef C_Status st
        self._need(<const void*>self.f.destroy_event, "destroy_event")
        with nogil:
            st = self.f.destroy_event(self.cd, e)
        return int(st)

    # -- collectives -----------------------------------------------------------------------------------------------
    def xccl_get_unique_id_size(self):
        cdef size_t n = 0
        cdef C_Status st
        self._need(<const void*>self.f.xccl_get_unique_id_size, "xccl_get_unique_id_size")
        with nogil:
            st = self.f.xccl_get_unique_id_size(&n)
        return int(st), int(n)

    def xccl_get_unique_id(self, size_t size):
        """``xccl_get_unique_id`` into a zeroed buffer of ``size`` bytes -> (status, bytes)."""
        cdef C_CCLRootId rid
        cdef C_Status st
        self._need(<const void*>self.f.xccl_get_unique_id, "xccl_get_unique_id")
        if size > (1 << 20):
            raise errors.InvalidArgument(f"{self.device!r}: xccl_get_unique_id: implausible id size {size}")
        buf = bytearray(size if size else 1)
        cdef unsigned char[::1] view = buf
        rid.sz = size
        rid.data = <void*>&view[0]
        with nogil:
            st = self.f.xccl_get_unique_id(&rid)
        return int(st), bytes(buf[:size])

    def xccl_comm_init_rank(self, size_t nranks, bytes unique_id, size_t rank):
        """``xccl_comm_init_rank`` -> (status, communicator handle int)."""
        cdef C_CCLRootId rid
        cdef C_CCLComm comm = NULL
        cdef C_Status st
        self._need(<const void*>self.f.xccl_comm_init_rank, "xccl_comm_init_rank")
        buf = bytearray(unique_id) if unique_id else bytearray(1)
        cdef unsigned char[::1] view = buf
        rid.sz = len(unique_id)
        rid.data = <void*>&view[0]
        with nogil:
            st = self.f.xccl_comm_init_rank(nranks, &rid, rank, &comm)
        return int(st), <uintptr_t>comm

    def xccl_destroy_comm(self, comm):
        cdef C_CCLComm c = <C_CCLComm>_p(comm)
        cdef C_Status st
        self._need(<const void*>self.f.xccl_destroy_comm, "xccl_destroy_comm")
        with nogil:
            st = self.f.xccl_destroy_comm(c)
        return int(st)

    def xccl_all_reduce(self, send, recv, size_t count, int dtype, int op, comm, stream):
        cdef void* s = _p(send)
        cdef void* r = _p(recv)
        cdef C_CCLComm c = <C_CCLComm>_p(comm)
        cdef C_Stream sh = <C_Stream>_p(stream)
        cdef C_Status st
        self._need(<const void*>self.f.xccl_all_reduce, "xccl_all_reduce")
        with nogil:
            st = self.f.xccl_all_reduce(s, r, count, <C_DataType>dtype, <C_CCLReduceOp>op, c, sh)
        return int(st)

    # -- content checks on device memory -----------------------------------------------------------------------------
    def read_device(self, ptr, size_t size):
        """Read device memory at its address (only for host-addressable device types) -> bytes."""
        if not self.host_addressable:
            raise errors.NotSupportedError(
                f"{self.device!r}: device memory of type {self.device.type!r} is not host-addressable "
                f"(list it in PADDLE_RT_HOST_ADDRESSABLE if it is)")
        return read_host(ptr, size)

    def write_device(self, ptr, data):
        """Write device memory at its address (only for host-addressable device types)."""
        if not self.host_addressable:
            raise errors.NotSupportedError(
                f"{self.device!r}: device memory of type {self.device.type!r} is not host-addressable "
                f"(list it in PADDLE_RT_HOST_ADDRESSABLE if it is)")
        return write_host(ptr, data)
