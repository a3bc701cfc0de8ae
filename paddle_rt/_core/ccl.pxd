# Collectives (ccl.pyx): communicators over the plugin's xccl hooks, and collectives queued in order on paddle_rt
# streams. Every plugin call of a collective is made by the stream's worker thread (after it set the device),
# between the stream's other operations; inside `group()` a stream's share of the calls is made between one
# xccl_group_start / xccl_group_end pair on that worker.
from libc.stdint cimport uint64_t
from cpython.ref cimport PyObject
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_CCLComm, C_DataType, C_CCLReduceOp, C_Status
from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream
from paddle_rt._core.includes.ccl_support cimport prt_ccl_comm_error_fn

# One plugin call of a collective, as the worker makes it.
cdef enum:
    K_ALL_REDUCE = 0
    K_BROADCAST = 1
    K_REDUCE = 2
    K_ALL_GATHER = 3
    K_REDUCE_SCATTER = 4
    K_SEND = 5
    K_RECV = 6
    K_ALL_TO_ALL = 7

cdef struct CclCall:
    int kind                    # K_* in ccl.pyx (the order of rt_cpu's and the ABI's hooks)
    void* send
    void* recv
    size_t count
    C_DataType dtype
    C_CCLReduceOp op
    size_t peer                 # root (broadcast, reduce) or peer rank (send, recv)
    C_CCLComm comm
    size_t rank
    size_t nranks
    const void** a2a_send       # all_to_all: per-peer pointers, counts, types ([nranks] each, owned)
    void** a2a_recv
    size_t* a2a_count
    C_DataType* a2a_dtype
    uint64_t* started           # clique progress counter of this rank (collectives), or NULL
    uint64_t seq                # the communicator's n-th collective (0-based)
    C_Status status             # what the hook returned
    int comm_error              # 1: the plugin marked the communicator in error once the call had run

# What one stream operation runs: one call, or a stream's share of a group.
cdef struct CclBatch:
    C_DeviceInterface* iface
    C_Device cdev
    prt_ccl_comm_error_fn comm_error
    bint grouped
    bint host_calls             # call the hooks with the NULL stream once the plugin stream is idle (see ccl.pyx)
    size_t n
    CclCall* calls
    PyObject* works             # list of Work, one per call (owned reference; released on the worker)

# The ranks of one unique id in this process: progress counters to name missing ranks, argument records.
cdef class Clique:
    cdef readonly bytes uid
    cdef readonly size_t nranks
    cdef uint64_t* started      # [nranks]: collectives whose plugin call the rank's worker has started
    cdef list issued            # [nranks]: collectives issued at the Python call
    cdef dict records           # seq -> {rank: argument tuple}, the latest few hundred
    cdef dict p2p_issued        # (kind, src, dst) -> messages issued
    cdef object __weakref__
    cdef list missing(self, uint64_t seq)

cdef class Communicator:
    cdef C_CCLComm handle
    cdef readonly Device device
    cdef readonly size_t rank
    cdef readonly size_t nranks
    cdef readonly Clique clique
    cdef readonly bint destroyed
    cdef readonly bint across_processes  # made by from_mpi: the other ranks are in other processes
    cdef readonly object mpi_comm        # from_mpi: the mpi4py communicator it was made over
    cdef object _mpi_peers               # from_mpi: {rank: (host name, pid)} of its processes
    cdef bint _host_calls                # made by paddle_rt_ext_ccl_comm_init_rank_mpi: see CclBatch.host_calls
    cdef object _order_stream            # host calls: the stream of the latest collective (_order_after_other_streams)
    cdef object _error          # the first asynchronous failure (the communicator is then in error)
    cdef bint _gave_up          # a Work.wait(timeout) on it expired: destroy aborts what is still running
    cdef bint _aborted          # abort() ran
    cdef uint64_t _seq          # collectives issued
    cdef dict _last             # Stream -> last Work issued on it
    cdef int _fork_gen          # stream.fork_generation() when it was made: a child of fork() cannot use it
    cdef object __weakref__

    cdef int _check_usable(self, str call) except -1

# One issued collective (ccl.pyx documents it).
cdef class Work:
    cdef readonly str collective
    cdef readonly Communicator comm
    cdef readonly Stream stream
    cdef readonly uint64_t position      # the stream operation (0 while an open group holds it)
    cdef readonly object seq             # the communicator's n-th collective, or the n-th message to/from peer
    cdef int kind
    cdef object peer
    cdef object args                     # (count, dtype name, op, root) for mismatch reports
    cdef object _keep                    # buffers kept alive until the call ran
    cdef object _recorder                # callable(stream, position) recording its tensors there, or None
    cdef object _exc
    cdef bint _finished
    cdef int _wait_done(self, object timeout) except -1

# The common checks of a call of `kind` on `comm` and `stream` (None: current): a Work and, in *out, a zeroed CclCall
# (malloc'd) whose arguments the caller fills in; submit_call takes it over and enqueues it (or holds it in an open
# group). collectives.pyx builds every public collective from these two.
cdef Work prepare_call(int kind, Communicator comm, object stream, CclCall** out)
cdef object submit_call(Work w, CclCall* c)
# Free the all_to_all arrays of a call that will not be submitted.
cdef void free_call_arrays(CclCall* c) noexcept nogil
