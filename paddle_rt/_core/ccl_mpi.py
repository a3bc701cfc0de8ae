"""Bootstrap of a communicator whose ranks are MPI processes (``ccl.Communicator.from_mpi``): the MPI side (the
meeting, the missing ranks, the exit of a job whose peers died). It imports nothing of ccl: from_mpi calls it and
joins the communicator itself.

Launch one process per device (``mpiexec -n 4 python train.py``); every process calls ``from_mpi()``. Rank 0 of the
MPI communicator asks the plugin for a unique id; every rank tells rank 0 it arrived, rank 0 sends the id to each
(or, when a rank has not arrived within PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT, the missing ranks, which every rank then
raises as a CollectiveTimeout), and every rank joins with it: through the
plugin's ``paddle_rt_xccl_comm_init_rank_mpi`` extension when it exports one (the plugin then uses MPI as its
transport: rt_cpu), else through ``xccl_comm_init_rank`` (plugins whose collective library connects processes
itself, as NCCL does). mpi4py comes with ``pip install "paddle_rt[mpi]"`` (with the ``mpich`` wheel).
"""
import os
import socket
import time

from paddle_rt._core import errors
from paddle_rt._core import device as _device_mod

_BCAST_POLL_S = 0.001


def import_mpi(where):
    """mpi4py's MPI module, or a clear error naming the extra that brings it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise errors.NotSupportedError(f"{where}: needs mpi4py and an MPI library: pip install \"paddle_rt[mpi]\" "
                                       f"({exc})") from None
    return MPI


def default_device(rank, where):
    """Device ``rank % device_count`` of the current device's plugin."""
    cur = _device_mod.get_device()
    devs = [d for d in _device_mod.devices() if d.plugin is cur.plugin]
    if not devs:
        raise errors.InvalidArgument(f"{where}: no devices")
    return devs[rank % len(devs)]


# Point-to-point tags of the bootstrap on the user's communicator (below 32767, the least MPI_TAG_UB MPI allows)
TAG_ARRIVE = 32760
TAG_VERDICT = 32761


def _verdict_grace(timeout):
    """How much longer than rank 0 the other ranks wait for its verdict before naming rank 0 itself."""
    return min(max(1.0, timeout * 0.1), 10.0)


def meet(MPI, comm, data, timeout, where, device):
    """The bootstrap's meeting: every rank tells rank 0 it arrived; rank 0 waits until all did (or ``timeout``
    seconds passed), then sends each rank that arrived its verdict: the unique id bytes (``data``), or the ranks that
    never arrived. Point-to-point only, so one missing rank holds up nobody but rank 0's wait and is named on every
    rank that arrived. Returns the id bytes (b"" when rank 0 could not make one); raises CollectiveTimeout naming the
    missing ranks (rank 0 itself when its verdict does not come)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    deadline = time.monotonic() + timeout
    me = (rank, socket.gethostname(), os.getpid())

    def timed_out(missing, why, peers=None):
        note_missing(peers, missing)
        return errors.CollectiveTimeout(
            f"{where}: rank {rank} of {size}: {why} within {timeout:g} s (PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT): "
            f"rank(s) {missing} did not call from_mpi", "from_mpi", repr(device), rank, size, None, missing)

    if rank != 0:
        req = comm.isend(me, dest=0, tag=TAG_ARRIVE)
        late = deadline + _verdict_grace(timeout)
        while not comm.Iprobe(source=0, tag=TAG_VERDICT):
            if time.monotonic() >= late:
                raise timed_out([0], "rank 0 did not answer (it never called from_mpi, or gave up waiting)")
            time.sleep(_BCAST_POLL_S)
        verdict = comm.recv(source=0, tag=TAG_VERDICT)
        req.wait()
    else:
        peers = {0: me[1:]}
        while len(peers) < size:
            while comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_ARRIVE):
                r, host, pid = comm.recv(source=MPI.ANY_SOURCE, tag=TAG_ARRIVE)
                peers[int(r)] = (host, pid)
            if len(peers) == size or time.monotonic() >= deadline:
                break
            time.sleep(_BCAST_POLL_S)
        missing = sorted(set(range(size)) - set(peers))
        verdict = ("missing", missing, peers) if missing else ("id", data, peers)
        reqs = [comm.isend(verdict, dest=r, tag=TAG_VERDICT) for r in sorted(peers) if r != 0]
        for q in reqs:
            q.wait()
    if verdict[0] == "missing":
        raise timed_out(verdict[1], "not every rank arrived", verdict[2])
    return verdict[1], verdict[2]


# -- leaving a job whose peers are gone -------------------------------------------------------------------------------
_finalize_alone = False


def _process_gone(pid):
    """True when process `pid` of this machine has exited (or is a zombie waiting for its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def dead_peers(peers, ranks):
    """The ranks among ``ranks`` known to be dead: processes of this machine that have exited. Peers on other
    machines cannot be checked from here (they count as alive)."""
    host = socket.gethostname()
    return [r for r in ranks if r in peers and peers[r][0] == host and _process_gone(peers[r][1])]


def note_missing(peers, ranks, remember=True):
    """A collective (or the bootstrap) named ``ranks`` as missing. When one of them is dead, the MPI job is broken:
    MPICH's MPI_Finalize (mpi4py calls it at exit) would wait for ever for the dead process in its collective step,
    so this process asks MPICH to skip that step (the control variable MPIR_CVAR_NO_COLLECTIVE_FINALIZE, through
    the MPI tool interface) and exits normally, with its own exit status. Only for dead peers: a live peer still
    runs the collective finalize and would then wait for this process instead. Returns True when it applied."""
    global _finalize_alone
    if remember and ranks and peers:
        _named_missing.append((peers, list(ranks)))
    if not ranks or not peers or _finalize_alone or not dead_peers(peers, ranks):
        return False
    _finalize_alone = _write_cvar_int(b"MPIR_CVAR_NO_COLLECTIVE_FINALIZE", 1)
    return _finalize_alone


_exit_peers = []                 # the peers ({rank: (host, pid)}) of every communicator from_mpi made here
_named_missing = []              # (peers, ranks) a failure named missing (note_missing)
EXIT_DEATH_GRACE_S = 2.0         # how long the exit waits for a rank named missing to be seen dead


def _check_peers_at_exit():
    """At exit (before mpi4py's MPI_Finalize): if any peer process of a from_mpi communicator is dead, skip
    MPI_Finalize's collective step, whether or not a collective of this process noticed it (a failure may name no
    rank, or the peer may have died after the last collective): the collective finalize would wait for ever. A rank
    that a failure named missing but that is still exiting (not yet gone when the failure was seen) gets a short
    grace to be seen dead."""
    deadline = time.monotonic() + EXIT_DEATH_GRACE_S
    while True:
        for peers in _exit_peers:
            if note_missing(peers, sorted(peers), remember=False):
                return
        if not _named_missing or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def watch_peers_at_exit(peers):
    """Remember ``peers`` for the exit check (the check is registered once, after mpi4py, so it runs before it)."""
    import atexit
    if not _exit_peers:
        atexit.register(_check_peers_at_exit)
    _exit_peers.append(dict(peers))


def finalizes_alone():
    """True once note_missing made this process skip MPI_Finalize's collective step."""
    return _finalize_alone


def _mpi_library():
    """The MPI library mpi4py loaded (ctypes), or None."""
    import ctypes
    names = [os.environ.get("PADDLE_RT_MPI_LIBRARY", "")] + ["libmpi.so.12", "libmpich.so.12", "libmpi.so"]
    for name in names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
    return None


def _write_cvar_int(name, value):
    """Set an integer control variable of the MPI library through MPI_T (MPI 3.0's tool interface). False when
    the library has no such variable or refuses."""
    import ctypes
    lib = _mpi_library()
    if lib is None or not hasattr(lib, "MPI_T_init_thread") or not hasattr(lib, "MPI_T_cvar_get_index"):
        return False
    provided, index, count = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    handle = ctypes.c_void_p()
    v = ctypes.c_int(value)
    if lib.MPI_T_init_thread(3, ctypes.byref(provided)) != 0:       # 3: MPI_THREAD_MULTIPLE (MPICH ABI)
        return False
    try:
        if lib.MPI_T_cvar_get_index(ctypes.c_char_p(name), ctypes.byref(index)) != 0:
            return False
        if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            return False
        try:
            return lib.MPI_T_cvar_write(handle, ctypes.byref(v)) == 0
        finally:
            lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
    finally:
        lib.MPI_T_finalize()


def bootstrap_timeout():
    """Seconds from_mpi waits for every process of the MPI communicator to call it: PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT,
    else 30."""
    v = os.environ.get("PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT", "")
    try:
        t = float(v) if v else 30.0
    except ValueError:
        raise errors.InvalidArgument(f"PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT={v!r} is not a number of seconds") from None
    if not t > 0:
        raise errors.InvalidArgument(f"PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT={v!r} must be a positive number of seconds")
    return t


def bootstrap(device, comm, unique_id_bytes, where="ccl.Communicator.from_mpi"):
    """The MPI side of ``Communicator.from_mpi`` (ccl.pyx, which then joins the communicator): checks MPI and
    ``comm`` (default ``MPI.COMM_WORLD``), picks the device, and runs the meeting. Rank 0 makes the id with
    ``unique_id_bytes(device)`` (ccl's get_unique_id; passed in so that this module stays below ccl). Returns
    ``(device, comm, rank, size, id bytes, peers)``; a failure of rank 0's plugin is raised on rank 0 and, as a
    CollectiveError, on the others."""
    MPI = import_mpi(where)
    if not MPI.Is_initialized() or MPI.Is_finalized():
        raise errors.InvalidArgument(f"{where}: MPI is not initialized (or already finalized)")
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise errors.InvalidArgument(f"{where}: comm must be an mpi4py intracommunicator, not {comm!r}")
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise errors.NotSupportedError(f"{where}: MPI was initialized with thread level {MPI.Query_thread()}; "
                                       f"paddle_rt's stream workers call MPI, which needs MPI_THREAD_MULTIPLE "
                                       f"(mpi4py's default)")
    rank, size = comm.Get_rank(), comm.Get_size()
    dev = default_device(rank, where) if device is None else _device_mod.resolve_device(device)
    timeout = bootstrap_timeout()
    # rank 0 makes the id; a failure there must not leave the others waiting for it: send an empty id instead
    data, err = None, None
    if rank == 0:
        try:
            data = unique_id_bytes(dev)
        except errors.PaddleRTError as exc:
            err, data = exc, b""
    data, peers = meet(MPI, comm, data, timeout, where, dev)
    if err is not None:
        raise err
    if not data:
        raise errors.CollectiveError(f"{where}: rank 0 could not get a unique id from its plugin (see its error)",
                                     "from_mpi", repr(dev), rank, size)
    return dev, comm, rank, size, data, peers
