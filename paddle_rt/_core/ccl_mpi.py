"""Bootstrap of a communicator whose ranks are MPI processes (``ccl.Communicator.from_mpi``).

Launch one process per device (``mpiexec -n 4 python train.py``); every process calls ``from_mpi()``. Rank 0 of the
MPI communicator asks the plugin for a unique id; every rank tells rank 0 it arrived, rank 0 sends the id to each
(or, when a rank has not arrived within PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT, the missing ranks, which every rank then
raises as a CollectiveTimeout), and every rank joins with it: through the
plugin's ``paddle_rt_xccl_comm_init_rank_mpi`` extension when it exports one (the plugin then uses MPI as its
transport: rt_cpu), else through ``xccl_comm_init_rank`` (plugins whose collective library connects processes
itself, as NCCL does). mpi4py comes with ``pip install "paddle_rt[mpi]"`` (with the ``mpich`` wheel).
"""
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

    def timed_out(missing, why):
        return errors.CollectiveTimeout(
            f"{where}: rank {rank} of {size}: {why} within {timeout:g} s (PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT): "
            f"rank(s) {missing} did not call from_mpi", "from_mpi", repr(device), rank, size, None, missing)

    if rank != 0:
        req = comm.isend(rank, dest=0, tag=TAG_ARRIVE)
        late = deadline + _verdict_grace(timeout)
        while not comm.Iprobe(source=0, tag=TAG_VERDICT):
            if time.monotonic() >= late:
                raise timed_out([0], "rank 0 did not answer (it never called from_mpi, or gave up waiting)")
            time.sleep(_BCAST_POLL_S)
        verdict = comm.recv(source=0, tag=TAG_VERDICT)
        req.wait()
    else:
        arrived = {0}
        while len(arrived) < size:
            while comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_ARRIVE):
                arrived.add(int(comm.recv(source=MPI.ANY_SOURCE, tag=TAG_ARRIVE)))
            if len(arrived) == size or time.monotonic() >= deadline:
                break
            time.sleep(_BCAST_POLL_S)
        missing = sorted(set(range(size)) - arrived)
        verdict = ("missing", missing) if missing else ("id", data)
        reqs = [comm.isend(verdict, dest=r, tag=TAG_VERDICT) for r in sorted(arrived) if r != 0]
        for q in reqs:
            q.wait()
    if verdict[0] == "missing":
        raise timed_out(verdict[1], "not every rank arrived")
    return verdict[1]


def bootstrap_timeout():
    """Seconds from_mpi waits for every process of the MPI communicator to call it: PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT,
    else 30."""
    import os
    v = os.environ.get("PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT", "")
    try:
        t = float(v) if v else 30.0
    except ValueError:
        raise errors.InvalidArgument(f"PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT={v!r} is not a number of seconds") from None
    if not t > 0:
        raise errors.InvalidArgument(f"PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT={v!r} must be a positive number of seconds")
    return t


def communicator_from_mpi(device=None, comm=None):
    from paddle_rt._core import ccl
    where = "ccl.Communicator.from_mpi"
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
            data = ccl.get_unique_id(dev).data
        except errors.PaddleRTError as exc:
            err, data = exc, b""
    data = meet(MPI, comm, data, timeout, where, dev)
    if err is not None:
        raise err
    if not data:
        raise errors.CollectiveError(f"{where}: rank 0 could not get a unique id from its plugin (see its error)",
                                     "from_mpi", repr(dev), rank, size)
    return ccl.comm_from_unique_id_mpi(size, ccl.UniqueId(data), rank, dev, comm)
