"""Collectives: communicators over a plugin's xccl hooks, with InfiniCCL's ``comm_init_all`` on top.

Ordering. A collective is an operation of a paddle_rt :class:`Stream` (default: the current stream of the
communicator's device): the stream's worker thread makes the plugin call (``xccl_all_reduce(..., plugin stream)``)
after everything submitted to the stream before it, then waits for the plugin stream and checks the communicator,
so work submitted after it (copies, callbacks, events) sees its result. Because every rank's call is made by the
worker of that rank's stream, one Python thread may issue the calls of every rank (inside :class:`group` or not);
one thread per rank works the same way.

Across processes. ``Communicator.from_mpi()`` (ccl_mpi.py) makes a communicator whose ranks are the processes of an
MPI communicator (``mpiexec``). With a plugin that exports ``paddle_rt_ext_ccl_comm_init_rank_mpi`` (MPI as its
transport: rt_cpu), the worker calls the hooks with the NULL stream once the stream's earlier work is done, and the
plugin runs the collective to completion in that call; failures carry the plugin's reason and missing ranks
(``paddle_rt_ext_ccl_comm_failure``), since the other ranks' progress is not visible in this process; an expired
``Work.wait(timeout)`` asks the peers through the plugin (``paddle_rt_ext_ccl_comm_find_missing``).

Groups. ``with group():`` collects the calls made by this thread and, at the end of the block, gives each stream one
operation whose worker makes that stream's calls between ``xccl_group_start`` and ``xccl_group_end``. The ABI's
group hooks have no arguments; rt_cpu (like NCCL) keeps the open group per thread, so the brackets of different
workers do not mix. Calls inside one group must not depend on each other (a send and its recv may be in it).

Errors. Bad arguments raise at the call (typed, naming the collective, the device and the reason) and nothing is
queued. A failure found when the call ran (the plugin refused it, the ranks' arguments differ, peers did not join in
the plugin's time limit: ``RT_CPU_CCL_TIMEOUT_MS`` for rt_cpu) becomes a :class:`CollectiveError` naming the
collective, the device and the missing ranks; it is raised by :meth:`Work.wait` and, as a chained
:class:`StreamError`, by the stream's next ``synchronize()``; the communicator is then in error and later calls on
it raise at once. ``Work.wait(timeout=...)`` (default ``PADDLE_RT_CCL_TIMEOUT`` seconds, else no limit) raises
:class:`CollectiveTimeout` naming the ranks that never called the collective or had not reached it on their streams.

Reductions: "sum", "avg", "max", "min", "prod" over every integer and floating type (bfloat16 included). Integer
SUM and PRODUCT wrap around; integer AVG is the wrapped SUM divided by nranks, truncated toward zero (C division);
float16/bfloat16 are reduced in float32 and rounded once (rt_cpu). BOOL is only for data movement (broadcast,
all_gather, send/recv, all_to_all); complex types are refused.
"""
import os
import threading
import time
import weakref

import numpy as np

from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy, memset
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.exc cimport PyErr_CheckSignals

from paddle_rt._core.device_ext cimport (
    C_DeviceInterface, C_Device, C_Stream, C_Status, C_SUCCESS, C_WARNING, C_CCLComm, C_CCLRootId, C_DataType,
    C_CCLReduceOp, BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FLOAT16, FLOAT32, FLOAT64,
    BFLOAT16, COMPLEX64, COMPLEX128,
)
from paddle_rt._core.device cimport Device, resolve_device, check_status
from paddle_rt._core.plugin cimport Plugin
from paddle_rt._core.stream cimport (
    Stream, StreamCtx, current_stream, stream_ctx_plugin_sync, stream_reached, stream_current_worker, fork_generation,
)
from paddle_rt._core.includes.stream_support cimport (
    PRT_OP_NEEDS_IDLE, prt_op_kind, PRT_OPK_COLLECTIVE, prt_stream_core,
)
from paddle_rt._core.includes.ccl_support cimport (
    prt_ccl_store_u64, prt_ccl_load_u64, prt_ccl_comm_error_fn, prt_ccl_defer, prt_ccl_pop, prt_ccl_pending,
)
from paddle_rt._core.includes.ccl_ext cimport (
    PaddleRtCclError, paddle_rt_ext_ccl_comm_failure_fn, paddle_rt_ext_ccl_comm_init_rank_mpi_fn,
    paddle_rt_ext_ccl_comm_abort_fn, paddle_rt_ext_ccl_comm_find_missing_fn,
)
from paddle_rt._core.includes.dl cimport dlsym

from paddle_rt._core import errors
from paddle_rt._core import device as _device_mod
from paddle_rt._core import ccl_mpi      # from_mpi's MPI side (below ccl: it imports nothing of it)

__all__ = ["Communicator", "UniqueId", "Work", "comm_init_all", "get_unique_id", "group", "REDUCE_OPS", "DTYPES"]

_NAMES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "send", "recv", "all_to_all")
_HOOKS = tuple("xccl_" + n for n in _NAMES)

cdef long POLL_US = 20000
_RECORDS_KEPT = 512

REDUCE_OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3, "prod": 4, "product": 4}
_OP_NAMES = {0: "sum", 1: "avg", 2: "max", 3: "min", 4: "prod"}

# name -> (C_DataType, itemsize)
DTYPES = {
    "bool": (BOOL, 1), "uint8": (UINT8, 1), "uint16": (UINT16, 2), "uint32": (UINT32, 4), "uint64": (UINT64, 8),
    "int8": (INT8, 1), "int16": (INT16, 2), "int32": (INT32, 4), "int64": (INT64, 8), "float16": (FLOAT16, 2),
    "float32": (FLOAT32, 4), "float64": (FLOAT64, 8), "bfloat16": (BFLOAT16, 2), "complex64": (COMPLEX64, 8),
    "complex128": (COMPLEX128, 16),
}


def _default_wait_timeout():
    v = os.environ.get("PADDLE_RT_CCL_TIMEOUT", "")
    if not v:
        return None
    try:
        t = float(v)
    except ValueError:
        raise errors.InvalidArgument(f"PADDLE_RT_CCL_TIMEOUT={v!r} is not a number of seconds") from None
    return t if t > 0 else None


# -- unique ids, cliques ---------------------------------------------------------------------------------------------
class UniqueId:
    """The id that ties the ranks of one communicator together (``get_unique_id()``). ``bytes(uid)`` gives its
    bytes; ``UniqueId(data)`` rebuilds it."""

    __slots__ = ("data",)

    def __init__(self, data):
        if not isinstance(data, (bytes, bytearray)) or not data:
            raise errors.InvalidArgument(f"UniqueId needs non-empty bytes, not {type(data).__name__}")
        self.data = bytes(data)

    def __bytes__(self):
        return self.data

    def __eq__(self, other):
        return isinstance(other, UniqueId) and other.data == self.data

    def __hash__(self):
        return hash(self.data)

    def __repr__(self):
        return f"<paddle_rt.ccl.UniqueId {self.data[:16].hex()}...>"


def get_unique_id(device=None):
    """A new unique id from the plugin of ``device`` (default: the current device): ``xccl_get_unique_id``."""
    cdef Device dev = resolve_device(device)
    cdef C_DeviceInterface* f = dev.iface
    cdef size_t size = 0
    cdef C_CCLRootId rid
    cdef C_Status st = C_SUCCESS
    if f.xccl_get_unique_id == NULL or f.xccl_comm_init_rank == NULL:
        raise errors.NotSupportedError(f"{dev!r}: ccl.get_unique_id: the plugin has no collectives "
                                       f"(xccl_get_unique_id / xccl_comm_init_rank)")
    dev.activate()
    if f.xccl_get_unique_id_size != NULL:
        with nogil:
            st = f.xccl_get_unique_id_size(&size)
        check_status(dev, "xccl_get_unique_id_size", st)
    if size == 0:
        size = 128      # NCCL's id size, when the plugin does not say
    buf = bytearray(size)
    cdef unsigned char[::1] view = buf
    rid.sz = size
    rid.data = <void*>&view[0]
    with nogil:
        st = f.xccl_get_unique_id(&rid)
    check_status(dev, "xccl_get_unique_id", st)
    return UniqueId(bytes(buf))


_cliques = weakref.WeakValueDictionary()


cdef class Clique:
    def __cinit__(self, bytes uid, size_t nranks):
        self.uid = uid
        self.nranks = nranks
        self.started = <uint64_t*>calloc(nranks if nranks else 1, sizeof(uint64_t))
        if self.started == NULL:
            raise MemoryError()
        self.issued = [0] * nranks
        self.records = {}
        self.p2p_issued = {}

    def __dealloc__(self):
        free(self.started)

    cdef list missing(self, uint64_t seq):
        """(ranks that never called collective #seq, ranks that called it but whose stream had not started it)"""
        never = [r for r in range(self.nranks) if self.issued[r] <= seq]
        behind = [r for r in range(self.nranks)
                  if self.issued[r] > seq and prt_ccl_load_u64(&self.started[r]) <= seq]
        return [never, behind]


cdef Clique _clique_for(bytes uid, size_t nranks):
    c = _cliques.get(uid)
    if c is None or (<Clique>c).nranks != nranks:
        c = Clique(uid, nranks)
        _cliques[uid] = c
    return c


_live_comms = weakref.WeakSet()


cdef void* _plugin_ext(Device dev, const char* name):
    """An optional extension symbol of the plugin (paddle_rt_ccl_ext.h), or NULL."""
    cdef Plugin p = dev.plugin
    if p._dl == NULL:
        return NULL
    return dlsym(p._dl, name)


cdef object _comm_init(Communicator self, nranks, unique_id, rank, device, object mpi_comm):
    """Communicator.__init__, and from_mpi (mpi_comm: the mpi4py communicator the ranks are the processes of)."""
    cdef Device dev = resolve_device(device)
    cdef C_DeviceInterface* f = dev.iface
    cdef C_CCLRootId rid
    cdef C_CCLComm h = NULL
    cdef C_Status st = C_SUCCESS
    cdef size_t n, r
    cdef int64_t mpi_handle = 0
    cdef paddle_rt_ext_ccl_comm_init_rank_mpi_fn init_mpi = NULL
    where = f"{dev!r}: ccl.Communicator" + (".from_mpi" if mpi_comm is not None else "")
    if not isinstance(nranks, int) or isinstance(nranks, bool) or nranks < 1:
        raise errors.InvalidArgument(f"{where}: nranks must be a positive int, not {nranks!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < nranks:
        raise errors.InvalidArgument(f"{where}: rank {rank!r} is not in 0..{nranks - 1}")
    if isinstance(unique_id, (bytes, bytearray)):
        unique_id = UniqueId(unique_id)
    if not isinstance(unique_id, UniqueId):
        raise errors.InvalidArgument(f"{where}: unique_id must come from ccl.get_unique_id(), not "
                                     f"{type(unique_id).__name__}")
    if f.xccl_comm_init_rank == NULL or f.xccl_destroy_comm == NULL:
        raise errors.NotSupportedError(f"{where}: the plugin has no xccl_comm_init_rank / xccl_destroy_comm")
    data = bytearray(unique_id.data)
    cdef unsigned char[::1] view = data
    rid.sz = len(data)
    rid.data = <void*>&view[0]
    n = nranks
    r = rank
    if mpi_comm is not None:
        init_mpi = <paddle_rt_ext_ccl_comm_init_rank_mpi_fn>_plugin_ext(dev, b"paddle_rt_ext_ccl_comm_init_rank_mpi")
        mpi_handle = mpi_comm_handle(mpi_comm)
        clique = Clique(unique_id.data, nranks)      # this process holds one rank of it
    else:
        clique = _clique_for(unique_id.data, nranks)
    prev = _device_mod.get_device()
    dev.activate()      # the communicator's device is the plugin's current device at init
    try:
        with nogil:
            if init_mpi != NULL:
                st = init_mpi(n, &rid, r, &h, mpi_handle)
            else:
                st = f.xccl_comm_init_rank(n, &rid, r, &h)
    finally:
        if prev is not dev:
            (<Device>prev).activate()
    if st != C_SUCCESS and st != C_WARNING:
        if init_mpi != NULL:
            raise errors.PluginError(repr(dev), "paddle_rt_ext_ccl_comm_init_rank_mpi", st,
                                     f"rank {rank} of {nranks}: every rank arrived, but the plugin could not join "
                                     f"the MPI processes (its reason is on stderr: MPI not initialized with "
                                     f"MPI_THREAD_MULTIPLE, another MPI ABI, or a rank failed in the plugin)")
        raise errors.PluginError(repr(dev), "xccl_comm_init_rank", st,
                                 f"rank {rank} of {nranks}: the id is not from this process, the rank is "
                                 f"already taken, or another rank gave a different nranks")
    self.handle = h
    self.device = dev
    self.rank = rank
    self.nranks = nranks
    self.clique = clique
    self.destroyed = False
    self._fork_gen = fork_generation()
    self.across_processes = mpi_comm is not None
    self.mpi_comm = mpi_comm
    self._host_calls = init_mpi != NULL
    self._seq = 0
    _live_comms.add(self)
    return self


def mpi_comm_handle(comm):
    """The C handle (MPI_Comm) of an mpi4py communicator as the signed int64 the extension takes. mpi4py's
    ``MPI._handleof`` gives the handle widened to an unsigned pointer-sized int: MPICH's ``int`` handles of
    communicators made by Split/Dup/Create_group have the top bit set (0x84000002), so they arrive sign-extended
    (0xffffffff84000002). The handle is ``MPI._sizeof(comm)`` bytes wide: keep those bits and read them as a signed
    C integer of that width (an ``int`` for MPICH, a pointer for ABIs with pointer handles)."""
    from mpi4py import MPI
    bits = 8 * int(MPI._sizeof(comm))
    h = int(MPI._handleof(comm)) & ((1 << bits) - 1)
    if h >> (bits - 1):
        h -= 1 << bits
    return h


def _unique_id_bytes(device):
    """Rank 0's step of the MPI bootstrap (ccl_mpi.bootstrap): the plugin's unique id, as bytes."""
    return get_unique_id(device).data


def comm_from_unique_id_mpi(nranks, unique_id, rank, device, mpi_comm):
    """Rank ``rank`` of the communicator of ``unique_id`` over the processes of ``mpi_comm`` (ccl_mpi's last step)."""
    cdef Communicator c = Communicator.__new__(Communicator)
    return _comm_init(c, nranks, unique_id, rank, device, mpi_comm)




# -- communicators ---------------------------------------------------------------------------------------------------
cdef class Communicator:
    """Rank ``rank`` of ``nranks`` of the communicator named by ``unique_id``, on ``device`` (default: the current
    device): ``xccl_comm_init_rank``. The ranks of one id meet when they run collectives (rt_cpu's init does not
    block, so one thread may create every rank; see :func:`comm_init_all`)."""

    def __cinit__(self):
        self.handle = NULL
        self.destroyed = True
        self._last = {}

    def __init__(self, nranks, unique_id, rank, device=None):
        _comm_init(self, nranks, unique_id, rank, device, None)

    @classmethod
    def from_mpi(cls, device=None, comm=None):
        """Rank ``comm.Get_rank()`` of a communicator over the processes of the mpi4py communicator ``comm``
        (default ``MPI.COMM_WORLD``), on ``device`` (default: device ``rank % device_count`` of the current
        device's plugin); ``comm`` may be any intracommunicator (Split, Dup, Create_group). Rank 0 asks the plugin
        for a unique id (``xccl_get_unique_id``) and sends it to every rank once all arrived (else every rank that
        did raises CollectiveTimeout naming the missing ones after PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT seconds, default
        30); every rank calls ``xccl_comm_init_rank`` (InfiniCCL's ``infinicclCommInitRank``), or the plugin's
        ``paddle_rt_ext_ccl_comm_init_rank_mpi`` extension when it exports one (rt_cpu: MPI is then its transport).
        Collective over ``comm``: every process calls it. Needs ``pip install "paddle_rt[mpi]"``."""
        dev, comm, rank, size, data, peers = ccl_mpi.bootstrap(device, comm, _unique_id_bytes)
        c = comm_from_unique_id_mpi(size, UniqueId(data), rank, dev, comm)
        c._set_mpi_peers(peers)
        ccl_mpi.watch_peers_at_exit({r: p for r, p in peers.items() if r != rank})
        return c

    def __repr__(self):
        state = "destroyed" if self.destroyed else ("in error" if self._error is not None else "ready")
        return f"<paddle_rt.ccl.Communicator rank {self.rank}/{self.nranks} on {self.device!r} {state}>"

    @property
    def handle_int(self):
        """The plugin's communicator handle as an int (opaque)."""
        return <uintptr_t>self.handle

    @property
    def name(self):
        """The plugin's name of the communicator (``xccl_get_comm_name``), or None."""
        cdef char buf[256]
        cdef C_Status st
        self._check_usable("name")
        if self.device.iface.xccl_get_comm_name == NULL:
            return None
        memset(buf, 0, sizeof(buf))
        with nogil:
            st = self.device.iface.xccl_get_comm_name(self.handle, buf)
        check_status(self.device, "xccl_get_comm_name", st)
        return buf[:255].split(b"\0", 1)[0].decode(errors="replace")

    @property
    def error(self):
        """The CollectiveError that put the communicator in error, or None."""
        return self._error

    cdef int _check_usable(self, str call) except -1:
        if self._fork_gen != fork_generation():
            raise errors.ForkError(f"{self.device!r}: ccl.{call}: the communicator (rank {self.rank} of {self.nranks}) "
                                   f"belongs to the parent process (fork()); make new ones in the child after "
                                   f"paddle_rt.reinitialize_after_fork()")
        if self.destroyed or self.handle == NULL:
            raise errors.CollectiveError(f"{self.device!r}: ccl.{call}: the communicator (rank {self.rank} of "
                                         f"{self.nranks}) was destroyed", call, repr(self.device), self.rank,
                                         self.nranks)
        if self._error is not None:
            raise errors.CollectiveError(f"{self.device!r}: ccl.{call}: the communicator (rank {self.rank} of "
                                         f"{self.nranks}) is in error since: {self._error}", call,
                                         repr(self.device), self.rank, self.nranks) from self._error
        return 0

    def synchronize(self, timeout=None):
        """Wait for every collective issued on this communicator (see :meth:`Work.wait`)."""
        for w in list(self._last.values()):
            w.wait(timeout)

    def _set_mpi_peers(self, peers):
        self._mpi_peers = dict(peers)

    def _peers_missing(self, missing):
        """Collectives across processes: ranks named missing; when one is a dead process, leave MPI alone at exit
        (ccl_mpi.note_missing)."""
        if self.across_processes and missing and self._mpi_peers:
            ccl_mpi.note_missing(self._mpi_peers, missing)

    def abort(self):
        """Give up the collectives still running on this communicator, as ``ncclCommAbort``: with a plugin that
        exports ``paddle_rt_ext_ccl_comm_abort`` (rt_cpu does), the ranks of this process waiting in them fail at once
        (their Works raise CollectiveError "aborted") instead of waiting for the plugin's time limit; the
        communicator is then in error (only ``destroy`` is left). Returns True when the plugin aborted, False when it
        cannot (the collectives then end at its own time limit)."""
        if self.destroyed or self.handle == NULL:
            return False
        if self._error is None:
            self._error = errors.CollectiveError(
                f"{self.device!r}: the communicator (rank {self.rank} of {self.nranks}) was aborted", "abort",
                repr(self.device), self.rank, self.nranks)
        return self._abort_running()

    def _abort_running(self):
        cdef paddle_rt_ext_ccl_comm_abort_fn fn = <paddle_rt_ext_ccl_comm_abort_fn>_plugin_ext(
            self.device, b"paddle_rt_ext_ccl_comm_abort")
        cdef C_Status st = C_SUCCESS
        if fn == NULL or self.handle == NULL or not self.device.alive():
            return False
        self._aborted = True
        with nogil:
            st = fn(self.handle)
        return st == C_SUCCESS

    def destroy(self):
        """Wait for the collectives issued on it, then ``xccl_destroy_comm``. After a failed collective or an
        expired ``Work.wait(timeout)``, what still runs is aborted first (:meth:`abort`), so that destroy (and
        exit) return promptly instead of waiting for the plugin's time limit. Later calls raise; destroying twice
        does nothing."""
        cdef C_Status st = C_SUCCESS
        cdef C_CCLComm h = self.handle
        if self.destroyed:
            return
        if self._fork_gen != fork_generation():    # the parent's: forgotten, its plugin state is the parent's
            self.destroyed = True
            self.handle = NULL
            _live_comms.discard(self)
            return
        pending = list(self._last.values())
        self._last.clear()
        if (self._error is not None or self._gave_up) and any(not (<Work>w).done() for w in pending):
            self._abort_running()
        for w in pending:
            (<Work>w)._wait_done(None)
            if self._aborted:
                (<Work>w)._forget_error()     # the abort's own consequence: not an error left to report
        _drain()
        self.destroyed = True
        self.handle = NULL
        _live_comms.discard(self)
        if h != NULL and self.device.alive():
            self.device.activate()
            with nogil:
                st = self.device.iface.xccl_destroy_comm(h)
            check_status(self.device, "xccl_destroy_comm", st)

    def __dealloc__(self):
        # queued work holds a reference to its communicator: nothing can still use the handle here
        if self.handle != NULL and not self.destroyed and self.device is not None and self.device.alive() and \
                self._fork_gen == fork_generation():
            self.device.iface.set_device(self.device.cdev())
            self.device.iface.xccl_destroy_comm(self.handle)
        self.handle = NULL


def comm_init_all(devices=None):
    """One communicator per device, rank i on ``devices[i]`` (InfiniCCL's ``infinicclCommInitAll``). ``devices``:
    Devices, names ("rt_cpu:1") or indices; default every device of the current device's plugin."""
    if devices is None:
        cur = _device_mod.get_device()
        devs = [d for d in _device_mod.devices() if (<Device>d).plugin is (<Device>cur).plugin]
    else:
        devs = [resolve_device(d) for d in devices]
    if not devs:
        raise errors.InvalidArgument("ccl.comm_init_all: no devices")
    if len(set(id(d) for d in devs)) != len(devs):
        raise errors.InvalidArgument(f"ccl.comm_init_all: a device appears twice in {devs!r}")
    plugins = {id((<Device>d).plugin) for d in devs}
    if len(plugins) != 1:
        raise errors.InvalidArgument(f"ccl.comm_init_all: the devices {devs!r} belong to different plugins")
    uid = get_unique_id(devs[0])
    comms = []
    try:
        for i, d in enumerate(devs):
            comms.append(Communicator(len(devs), uid, i, d))
    except BaseException:
        for c in comms:
            try:
                c.destroy()
            except BaseException:
                pass
        raise
    return comms


def _teardown_comms():
    _drain()
    for c in list(_live_comms):
        try:
            c.destroy()
        except BaseException as exc:
            import sys
            print(f"paddle_rt: destroying {c!r} at exit: {exc}", file=sys.stderr)


_device_mod.register_teardown(_teardown_comms, 15)


# -- work ------------------------------------------------------------------------------------------------------------
cdef class Work:
    """One issued collective (returned by every collective call). :meth:`wait` blocks until it ran and raises its
    error; :meth:`done` does not block."""

    def __repr__(self):
        state = "pending" if not self.position else ("failed" if self._exc is not None else
                                                     ("done" if self.done() else "queued"))
        return (f"<paddle_rt.ccl.Work {self.collective} #{self.seq} rank {self.comm.rank} on "
                f"{self.comm.device!r} {state}>")

    @property
    def exception(self):
        return self._exc

    def done(self):
        """True once the call has run (successfully or not)."""
        if not self.position:
            return False
        if not self._finished:
            _drain()
        return self._finished or stream_reached(self.stream, self.position)

    cdef int _wait_done(self, object timeout) except -1:
        cdef Stream s = self.stream
        cdef bint ok = False
        cdef uint64_t pos = self.position
        if not pos:
            raise errors.InvalidArgument(f"{self.comm.device!r}: ccl.{self.collective}: cannot wait inside the "
                                         f"group that issued it (it is submitted when the group ends)")
        if self._finished or s.ctx == NULL or stream_reached(s, pos):
            _drain()
            return 0
        if stream_current_worker() == s.ctx.core:
            raise errors.StreamError(f"{s.name}: waiting for a collective from a callback of its own stream "
                                     f"would deadlock")
        deadline = None if timeout is None else time.monotonic() + timeout
        cdef prt_stream_core* core
        while not self._finished and s.ctx != NULL:
            core = s.ctx.core            # read with the GIL; kept alive by the pin (close() waits for pins)
            s._waiting += 1
            try:
                with nogil:
                    ok = core.wait_for(pos, POLL_US)
            finally:
                s._waiting -= 1
            if ok or self._finished:
                _drain()
                break
            PyErr_CheckSignals()
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timeout_error(timeout)
        return 0

    def wait(self, timeout=None):
        """Block until the collective ran (GIL released; Ctrl-C works). ``timeout`` seconds (default
        ``PADDLE_RT_CCL_TIMEOUT``, else none): raise :class:`CollectiveTimeout` naming the ranks that did not join.
        Raises the collective's :class:`CollectiveError` if it failed (and takes it off the stream's pending
        errors)."""
        if timeout is None:
            timeout = _default_wait_timeout()
        elif not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
            raise errors.InvalidArgument(f"ccl.Work.wait: timeout must be a number of seconds, not {timeout!r}")
        self._wait_done(timeout)
        if self._exc is not None:
            self._forget_error()
            raise self._exc

    def _forget_error(self):
        """Take this Work's failure off its stream's pending errors (it is reported another way)."""
        cdef Stream s = self.stream
        if self._exc is not None and s.ctx != NULL:
            errs = <list>s.ctx.errors
            errs[:] = [e for e in errs if e[1] is not self._exc]

    def _missing_text(self):
        """(missing ranks, text)"""
        cdef Clique q = self.comm.clique
        if self.comm.across_processes:
            return self._missing_across_processes()
        if self.kind in (K_SEND, K_RECV):
            other = K_RECV if self.kind == K_SEND else K_SEND
            src, dst = (self.comm.rank, self.peer) if self.kind == K_SEND else (self.peer, self.comm.rank)
            have = q.p2p_issued.get((other, src, dst), 0)
            if have <= self.seq:
                return [self.peer], (f"rank {self.peer} never called the matching "
                                     f"{_NAMES[other]} (message #{self.seq} between ranks {src} -> {dst})")
            return [], f"rank {self.peer} called the matching {_NAMES[other]}"
        never, behind = q.missing(self.seq)
        parts = []
        if never:
            parts.append(f"rank(s) {never} never called it")
        if behind:
            parts.append(f"rank(s) {behind} called it but their streams had not reached it")
        return never + behind, "; ".join(parts)

    def _missing_across_processes(self):
        """(missing ranks, text) of a collective whose other ranks are in other processes: this rank's own stream
        has not reached it, or the peers asked through the plugin (paddle_rt_ext_ccl_comm_find_missing)."""
        cdef Communicator c = self.comm
        cdef Clique q = c.clique
        cdef paddle_rt_ext_ccl_comm_find_missing_fn fn
        cdef PaddleRtCclError why
        cdef int e
        cdef size_t i
        if self.kind in (K_SEND, K_RECV):
            other = "recv" if self.kind == K_SEND else "send"
            return [self.peer], (f"rank {self.peer} has not completed the matching {other} (message #{self.seq})")
        if prt_ccl_load_u64(&q.started[c.rank]) <= self.seq:
            return [c.rank], (f"this rank's stream {self.stream.name} had not reached it (the work before it on "
                              f"that stream is still running)")
        fn = <paddle_rt_ext_ccl_comm_find_missing_fn>_plugin_ext(c.device, b"paddle_rt_ext_ccl_comm_find_missing")
        if fn == NULL or c.handle == NULL:
            return None, "the other ranks are in other processes and the plugin cannot ask them"
        memset(&why, 0, sizeof(why))
        with nogil:
            e = fn(c.handle, &why)
        why.text[sizeof(why.text) - 1] = 0
        if e != 1:
            return None, "the plugin runs no collective of this communicator now"
        missing = [why.missing[i] for i in range(min(why.n_missing, 64))]
        return missing, (<bytes>why.text).decode(errors="replace")

    def _timeout_error(self, timeout):
        self.comm._gave_up = True
        missing, text = self._missing_text()
        self.comm._peers_missing(missing)
        dev = repr(self.comm.device)
        msg = (f"{dev}: ccl.{self.collective} #{self.seq} (rank {self.comm.rank} of {self.comm.nranks}) did not "
               f"complete within {timeout:g} s: {text or 'every rank started it; the plugin has not finished'}")
        return errors.CollectiveTimeout(msg, self.collective, dev, self.comm.rank, self.comm.nranks, self.seq,
                                        missing)

    def _failure(self, int status, int group_status, int comm_error):
        """The CollectiveError of a call that failed when it ran (built on the worker, with the GIL)."""
        cdef Communicator c = self.comm
        dev = repr(c.device)
        head = f"{dev}: ccl.{self.collective} #{self.seq} (rank {c.rank} of {c.nranks}) failed"
        missing = None
        if c._aborted:
            why = "the communicator was aborted (comm.abort(), or destroy after a failure) before it completed"
            return errors.CollectiveError(f"{head}: {why}", self.collective, dev, c.rank, c.nranks, self.seq, None)
        plugin = _plugin_failure(c) if c.across_processes else None
        if plugin is not None and (comm_error or (status != C_SUCCESS and status != C_WARNING)):
            why, missing = plugin
            c._peers_missing(missing)
            if missing:
                why += f" (missing rank(s): {missing})"
            why += "; the communicator is now in error"
        elif status != C_SUCCESS and status != C_WARNING:
            sname = errors.STATUS_NAMES.get(status, str(status))
            why = f"the plugin refused xccl_{self.collective} with {sname}"
            if c._error is not None:
                why += f" (the communicator was already in error: {c._error})"
        elif group_status != C_SUCCESS and group_status != C_WARNING:
            why = f"xccl_group_start/xccl_group_end failed with {errors.STATUS_NAMES.get(group_status, group_status)}"
        else:
            rec = c.clique.records.get(self.seq) if self.kind not in (K_SEND, K_RECV) else None
            missing, text = self._missing_text()
            if missing:
                why = f"peers did not join within the plugin's time limit: {text}"
            elif rec is not None and len(set(rec.values())) > 1:
                shown = ", ".join(f"rank {r}: {_fmt_args(a)}" for r, a in sorted(rec.items()))
                why = f"the ranks' arguments differ ({shown})"
                missing = []
            else:
                why = ("the plugin failed it (its peers did not join in time, or the ranks' arguments or buffer "
                       "sizes differ)")
            why += "; the communicator is now in error"
        return errors.CollectiveError(f"{head}: {why}", self.collective, dev, c.rank, c.nranks, self.seq, missing)


def _fmt_args(a):
    name, count, dtype, op, root = a
    s = f"{name} count={count} {dtype}"
    if op is not None:
        s += f" op={_OP_NAMES.get(op, op)}"
    if root is not None:
        s += f" root={root}"
    return s


# -- the worker side -------------------------------------------------------------------------------------------------
cdef C_Status _call_hook(C_DeviceInterface* f, CclCall* c, C_Stream s) noexcept nogil:
    if c.kind == K_ALL_REDUCE:
        return f.xccl_all_reduce(c.send, c.recv, c.count, c.dtype, c.op, c.comm, s)
    if c.kind == K_BROADCAST:
        return f.xccl_broadcast(c.recv, c.count, c.dtype, c.peer, c.comm, s)
    if c.kind == K_REDUCE:
        return f.xccl_reduce(c.send, c.recv, c.count, c.dtype, c.op, c.peer, c.comm, s)
    if c.kind == K_ALL_GATHER:
        return f.xccl_all_gather(c.send, c.recv, c.count, c.dtype, c.comm, s)
    if c.kind == K_REDUCE_SCATTER:
        return f.xccl_reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op, c.comm, s)
    if c.kind == K_SEND:
        return f.xccl_send(c.send, c.count, c.dtype, c.peer, c.comm, s)
    if c.kind == K_RECV:
        return f.xccl_recv(c.recv, c.count, c.dtype, c.peer, c.comm, s)
    return f.xccl_all_to_all(c.a2a_send, c.a2a_count, c.a2a_dtype, c.a2a_recv, c.a2a_count, c.a2a_dtype,
                             c.rank, c.nranks, c.comm, s)


cdef void free_call_arrays(CclCall* c) noexcept nogil:
    free(<void*>c.a2a_send)
    free(c.a2a_recv)
    free(c.a2a_count)
    free(c.a2a_dtype)
    c.a2a_send = NULL
    c.a2a_recv = NULL
    c.a2a_count = NULL
    c.a2a_dtype = NULL


cdef void _free_batch(CclBatch* b) noexcept nogil:
    cdef size_t i
    if b == NULL:
        return
    if b.calls != NULL:
        for i in range(b.n):
            free_call_arrays(&b.calls[i])
        free(b.calls)
    free(b)


cdef inline bint _ok(C_Status st) noexcept nogil:
    return st == C_SUCCESS or st == C_WARNING


cdef int _ccl_run(void* p, void* arg, uint64_t aux, uint64_t pos) noexcept nogil:
    cdef StreamCtx* ctx = <StreamCtx*>p
    cdef CclBatch* b = <CclBatch*>arg
    cdef C_DeviceInterface* f = b.iface
    cdef C_Stream s = ctx.pstream if ctx.has_pstream and not b.host_calls else NULL
    cdef C_Status gs = C_SUCCESS
    cdef C_Status ge = C_SUCCESS
    cdef bint any_ok = False
    cdef size_t i
    cdef CclCall* c
    f.set_device(b.cdev)
    if b.grouped:
        gs = f.xccl_group_start()
    if _ok(gs):
        for i in range(b.n):
            c = &b.calls[i]
            if c.started != NULL:
                prt_ccl_store_u64(c.started, c.seq + 1)
            c.status = _call_hook(f, c, s)
            if _ok(c.status):
                any_ok = True
        if b.grouped:
            ge = f.xccl_group_end()
    if any_ok and s != NULL:
        stream_ctx_plugin_sync(ctx)      # the collective has run (or failed) when this returns
    cdef bint failed = not _ok(gs) or not _ok(ge)
    for i in range(b.n):
        c = &b.calls[i]
        if _ok(c.status) and b.comm_error != NULL and b.comm_error(<void*>c.comm) == 1:
            c.comm_error = 1
        if not _ok(c.status) or c.comm_error:
            failed = True
    # success: no GIL here; the Works' references are dropped by the next thread that holds it (_drain)
    if failed or prt_ccl_defer(b.works) != 0:
        _finish_batch(ctx, b, pos, gs, ge)
    else:
        b.works = NULL
    _free_batch(b)
    return 0


cdef void _finish_batch(StreamCtx* ctx, CclBatch* b, uint64_t pos, C_Status gs, C_Status ge) noexcept with gil:
    cdef size_t i
    cdef CclCall* c
    cdef Work w
    cdef int g = <int>(gs if not _ok(gs) else ge)
    works = <list>b.works
    Py_DECREF(works)               # the batch's reference; `works` keeps the list until we return
    b.works = NULL
    for i in range(b.n):
        c = &b.calls[i]
        w = <Work>works[i]
        try:
            if not _ok(c.status) or not _ok(<C_Status>g) or c.comm_error:
                exc = w._failure(<int>c.status if _ok(gs) else <int>gs, g, c.comm_error)
                w._exc = exc
                if w.comm._error is None and (c.comm_error or not _ok(c.status)):
                    w.comm._error = exc
                (<list>ctx.errors).append((pos, exc, f"ccl.{w.collective}"))
        except BaseException as e:
            try:
                (<list>ctx.errors).append((pos, e, f"ccl.{w.collective}"))
            except BaseException:
                pass
        w._keep = None
        w._finished = True
    ctx.iface.set_device(ctx.cdev)


cdef int _drain() except -1:
    """Drop the references of successfully finished batches (see _ccl_run)."""
    cdef void* o
    cdef Work w
    while prt_ccl_pending():
        o = prt_ccl_pop()
        if o == NULL:
            break
        works = <list>o
        Py_DECREF(works)          # the batch's reference; `works` keeps the list for this iteration
        for x in works:
            w = <Work>x
            w._keep = None
            w._finished = True
        works = None
    return 0


def _drain_finished():
    _drain()


# -- submission ------------------------------------------------------------------------------------------------------
_tls = threading.local()


cdef prt_ccl_comm_error_fn _comm_error_fn(Device dev):
    """The plugin's paddle_rt_ext_ccl_comm_error (include/paddle_rt/extension.h), or NULL."""
    return <prt_ccl_comm_error_fn>(<Plugin>dev.plugin).ext_ccl_comm_error


def _plugin_failure(Communicator c):
    """(reason, missing ranks) recorded by the plugin for a communicator in error (paddle_rt_ext_ccl_comm_failure),
    or None when the plugin does not export it or recorded nothing."""
    cdef paddle_rt_ext_ccl_comm_failure_fn fn = <paddle_rt_ext_ccl_comm_failure_fn>_plugin_ext(
        c.device, b"paddle_rt_ext_ccl_comm_failure")
    cdef PaddleRtCclError why
    cdef int e
    cdef size_t i
    if fn == NULL or c.handle == NULL:
        return None
    memset(&why, 0, sizeof(why))
    with nogil:
        e = fn(c.handle, &why)
    why.text[sizeof(why.text) - 1] = 0
    text = (<bytes>why.text).decode(errors="replace")
    if e != 1 or not text:
        return None
    return text, [why.missing[i] for i in range(min(why.n_missing, 64))]


cdef object _assign(Work w, CclCall* c):
    """Number the call (the communicator's collective sequence or the pair's message count) and record it."""
    cdef Communicator comm = w.comm
    cdef Clique q = comm.clique
    if w.kind in (K_SEND, K_RECV):
        key = (w.kind, comm.rank, w.peer) if w.kind == K_SEND else (w.kind, w.peer, comm.rank)
        n = q.p2p_issued.get(key, 0)
        q.p2p_issued[key] = n + 1
        w.seq = n
        c.started = NULL
        c.seq = n
        return None
    w.seq = comm._seq
    c.seq = comm._seq
    comm._seq += 1
    q.issued[comm.rank] = comm._seq
    c.started = &q.started[comm.rank]
    rec = q.records.get(w.seq)
    if rec is None:
        rec = q.records[w.seq] = {}
        q.records.pop(w.seq - _RECORDS_KEPT, None)
    rec[comm.rank] = w.args
    return None


cdef int _order_after_other_streams(Stream s, list works) except -1:
    """Host-driven communicators (CclBatch.host_calls) run each collective inside the hook, on the worker of its
    stream, and the ranks of another process pair their calls in the order they arrive. So the collectives of one
    such communicator must reach the plugin in issue order even across streams: when the previous one was issued on
    another stream, `s` first waits for everything issued on that stream so far (an event; it names only work already
    issued, so it cannot close a cycle)."""
    from paddle_rt._core.event import Event
    cdef Communicator c
    for w in works:
        c = (<Work>w).comm
        prev = c._order_stream
        c._order_stream = s
        if prev is None or prev is s or (<Stream>prev).closed:
            continue
        ev = Event()
        ev.record(prev)
        ev.wait(s)
    return 0


cdef object _enqueue(Stream s, list items, bint grouped):
    """items: [(Work, address of a malloc'd CclCall)] of one stream; takes ownership of the calls."""
    cdef CclBatch* b = <CclBatch*>calloc(1, sizeof(CclBatch))
    cdef size_t i
    cdef Work w
    cdef Device dev = s.device
    if b == NULL:
        for w, addr in items:
            free_call_arrays(<CclCall*><uintptr_t>addr)
            free(<void*><uintptr_t>addr)
        raise MemoryError()
    b.calls = <CclCall*>calloc(len(items), sizeof(CclCall))
    b.n = len(items)
    for i in range(b.n):
        w, addr = items[i]
        if b.calls != NULL:
            memcpy(&b.calls[i], <CclCall*><uintptr_t>addr, sizeof(CclCall))
        else:
            free_call_arrays(<CclCall*><uintptr_t>addr)
        free(<void*><uintptr_t>addr)
    if b.calls == NULL:
        b.n = 0
        _free_batch(b)
        raise MemoryError()
    b.iface = dev.iface
    b.cdev = dev.cdev()
    b.comm_error = _comm_error_fn(dev)
    b.grouped = grouped
    works = [it[0] for it in items]
    b.host_calls = any((<Work>w).comm._host_calls for w in works)
    for i in range(b.n):
        _assign(<Work>works[i], &b.calls[i])
    b.works = <PyObject*>works
    Py_INCREF(works)
    if b.host_calls:
        try:
            _order_after_other_streams(s, works)
        except BaseException:
            Py_DECREF(works)
            b.works = NULL
            _free_batch(b)
            raise
    try:
        pos = s.enqueue(_ccl_run, b, 0, (0 if s.ctx.has_pstream and not b.host_calls else PRT_OP_NEEDS_IDLE) |
                        prt_op_kind(PRT_OPK_COLLECTIVE))
    except BaseException:
        Py_DECREF(works)
        b.works = NULL
        _free_batch(b)
        raise
    for w in works:
        w.position = pos
        w.comm._last[s] = w
        rec = (<Work>w)._recorder
        if rec is not None:
            (<Work>w)._recorder = None
            rec(s, pos)
    return pos


cdef object submit_call(Work w, CclCall* c):
    """Queue the call now, or hold it in this thread's open group. Takes ownership of c (malloc'd)."""
    pending = getattr(_tls, "group", None)
    if pending is not None:
        pending.append((w, <uintptr_t>c))
        return w
    _enqueue(w.stream, [(w, <uintptr_t>c)], False)
    return w


class group:
    """``with paddle_rt.ccl.group():`` — calls made by this thread inside the block are submitted together at its
    end: each stream gets one operation whose worker makes its calls between ``xccl_group_start`` and
    ``xccl_group_end``. Needed when one thread issues blocking pairs (send + recv, all_to_all) for several ranks.
    Nested groups join the outermost. If the block raises, nothing of it is submitted."""

    def __enter__(self):
        depth = getattr(_tls, "depth", 0)
        if depth == 0:
            _tls.group = []
        _tls.depth = depth + 1
        return self

    def __exit__(self, et, ev, tb):
        cdef CclCall* c
        _tls.depth -= 1
        if _tls.depth > 0:
            return False
        items = _tls.group
        _tls.group = None
        if et is not None:
            for w, addr in items:
                c = <CclCall*><uintptr_t>addr
                free_call_arrays(c)
                free(c)
            return False
        by_stream = {}
        order = []
        for w, addr in items:
            s = (<Work>w).stream
            if s not in by_stream:
                by_stream[s] = []
                order.append(s)
            by_stream[s].append((w, addr))
        try:
            while order:
                s = order.pop(0)
                _enqueue(s, by_stream.pop(s), True)
        except BaseException:
            for rest in by_stream.values():
                for w, addr in rest:
                    c = <CclCall*><uintptr_t>addr
                    free_call_arrays(c)
                    free(c)
            raise
        return False


cdef Work prepare_call(int kind, Communicator comm, object stream, CclCall** out):
    """Common checks; a Work and a zeroed CclCall for the call."""
    cdef Stream s
    name = _NAMES[kind]
    _drain()
    if not isinstance(comm, Communicator):
        raise errors.InvalidArgument(f"ccl.{name}: comm must be a Communicator, not {type(comm).__name__}")
    comm._check_usable(name)
    where = f"{comm.device!r}: ccl.{name}"
    if stream is None:
        s = current_stream(comm.device)
    elif isinstance(stream, Stream):
        s = stream
    else:
        raise errors.InvalidArgument(f"{where}: stream must be a paddle_rt Stream or None, not "
                                     f"{type(stream).__name__}")
    s._check_open()
    if s.device is not comm.device:
        raise errors.InvalidArgument(f"{where}: the stream {s.name} is on {s.device!r}, the communicator (rank "
                                     f"{comm.rank}) on {comm.device!r}")
    if not comm.device.plugin.has(_HOOKS[kind]):
        raise errors.NotSupportedError(f"{where}: the plugin has no {_HOOKS[kind]}")
    cdef Work w = Work.__new__(Work)
    w.collective = name
    w.comm = comm
    w.stream = s
    w.kind = kind
    w.position = 0
    cdef CclCall* c = <CclCall*>calloc(1, sizeof(CclCall))
    if c == NULL:
        raise MemoryError()
    c.kind = kind
    c.comm = comm.handle
    c.rank = comm.rank
    c.nranks = comm.nranks
    out[0] = c
    return w
