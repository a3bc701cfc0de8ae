"""Bootstrap of a communicator whose ranks are MPI processes (``ccl.Communicator.from_mpi``).

Launch one process per device (``mpiexec -n 4 python train.py``); every process calls ``from_mpi()``. Rank 0 of the
MPI communicator asks the plugin for a unique id, MPI broadcasts it, and every rank joins with it: through the
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


def broadcast_id(MPI, comm, data, timeout, where):
    """Rank 0's unique id bytes on every rank: a nonblocking broadcast polled until ``timeout`` seconds (a rank that
    never joins raises instead of hanging)."""
    size = [len(data) if data is not None else 0]
    n = bytearray(8)
    if comm.Get_rank() == 0:
        n[:] = size[0].to_bytes(8, "little")
    _poll(comm.Ibcast(n, root=0), timeout, where, "the size of the unique id")
    buf = bytearray(data) if comm.Get_rank() == 0 else bytearray(int.from_bytes(n, "little"))
    _poll(comm.Ibcast(buf, root=0), timeout, where, "the unique id")
    return bytes(buf)


def _poll(req, timeout, where, what):
    deadline = time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() >= deadline:
            raise errors.CollectiveTimeout(f"{where}: broadcasting {what} from rank 0 did not complete within "
                                           f"{timeout:g} s: a rank of the MPI communicator did not call from_mpi",
                                           "from_mpi", where, None, None, None, None)
        time.sleep(_BCAST_POLL_S)


def bootstrap_timeout():
    """Seconds the bootstrap's broadcast waits for the other processes: PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT, else 30."""
    import os
    v = os.environ.get("PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT", "")
    try:
        return float(v) if v else 30.0
    except ValueError:
        raise errors.InvalidArgument(f"PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT={v!r} is not a number of seconds") from None


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
    # rank 0 makes the id; a failure there must not leave the others waiting for it: broadcast an empty id instead
    data, err = None, None
    if rank == 0:
        try:
            data = ccl.get_unique_id(dev).data
        except errors.PaddleRTError as exc:
            err, data = exc, b""
    data = broadcast_id(MPI, comm, data, bootstrap_timeout(), where)
    if err is not None:
        raise err
    if not data:
        raise errors.CollectiveError(f"{where}: rank 0 could not get a unique id from its plugin (see its error)",
                                     "from_mpi", repr(dev), rank, size)
    return ccl.comm_from_unique_id_mpi(size, ccl.UniqueId(data), rank, dev, comm)
