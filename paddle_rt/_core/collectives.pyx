# cython: freethreading_compatible = False
"""The collective calls of ``paddle_rt.ccl`` (all_reduce, broadcast, reduce, all_gather, reduce_scatter, send, recv,
all_to_all and InfiniCCL's variable-count forms): argument, buffer and dtype checks, each a Work made and submitted
through ccl.pyx (``prepare_call``/``submit_call``), which owns communicators, ordering, groups and the run on the
stream worker."""
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free

from paddle_rt._core.allocation cimport Allocation
from paddle_rt._core.allocator cimport raw_live_extent, KIND_DEVICE
from paddle_rt._core.device_ext cimport (
    C_DataType, C_CCLReduceOp, BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FLOAT16, FLOAT32,
    FLOAT64, BFLOAT16, COMPLEX64, COMPLEX128,
)
from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream, current_stream
from paddle_rt._core.tensor cimport Tensor
from paddle_rt._core.ccl cimport (
    CclCall, Communicator, Work, prepare_call, submit_call, free_call_arrays, K_ALL_REDUCE, K_BROADCAST, K_REDUCE, K_ALL_GATHER,
    K_REDUCE_SCATTER, K_SEND, K_RECV, K_ALL_TO_ALL,
)

import numpy as np

from paddle_rt._core import errors
from paddle_rt._core.ccl import DTYPES, REDUCE_OPS, group, _NAMES

__all__ = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "send", "recv", "all_to_all",
           "all_gather_v", "reduce_scatter_v"]


# -- argument helpers ------------------------------------------------------------------------------------------------
def _dtype_info(dtype, where):
    """(name, C_DataType, itemsize) of a numpy dtype, a string ("float32", "bfloat16") or a type."""
    if dtype is None:
        raise errors.InvalidArgument(f"{where}: dtype is required (a numpy dtype or a name such as 'float32')")
    name = None
    if isinstance(dtype, str):
        name = dtype.lower()
        if name == "bfloat16" or name in DTYPES:
            pass
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = None
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name == "bool_":
        name = "bool"
    if name not in DTYPES:
        raise errors.NotSupportedError(f"{where}: unsupported dtype {dtype!r} (use one of {', '.join(DTYPES)})")
    cval, size = DTYPES[name]
    return name, cval, size


def _op_value(op, where):
    if isinstance(op, str) and op.lower() in REDUCE_OPS:
        return REDUCE_OPS[op.lower()]
    if isinstance(op, int) and not isinstance(op, bool) and 0 <= op <= 4:
        return op
    raise errors.NotSupportedError(f"{where}: unsupported reduction op {op!r} (use sum, avg, max, min or prod)")


def _count_value(count, where):
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise errors.InvalidArgument(f"{where}: count must be a non-negative int, not {count!r}")
    return count


def _rank_value(r, Communicator comm, what, where):
    if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < comm.nranks:
        raise errors.InvalidArgument(f"{where}: {what} {r!r} is not a rank of this communicator (0..{comm.nranks - 1})")
    return r


def _tensor_buffer(Tensor t, what, Communicator comm, where):
    """(ptr, size) of a contiguous Tensor of comm's device."""
    if t.device is not comm.device:
        raise errors.InvalidArgument(f"{where}: {what} is a Tensor of {t.device!r}, but the communicator (rank "
                                     f"{comm.rank}) is on {comm.device!r}")
    if not t.is_contiguous():
        raise errors.InvalidArgument(f"{where}: {what} is a non-contiguous Tensor (shape {t.shape}, strides "
                                     f"{t.strides} elements, {t.dtype}); collectives move one contiguous range: pass "
                                     f"{what}.contiguous()")
    return int(t.data_ptr), int(t.nbytes)


def _buffer(obj, what, Communicator comm, where):
    """(ptr, size) of device memory of comm's device: an Allocation, or a contiguous Tensor."""
    if obj is None:
        raise errors.InvalidArgument(f"{where}: {what} is required (a Tensor or an Allocation of {comm.device!r})")
    if isinstance(obj, Tensor):
        return _tensor_buffer(obj, what, comm, where)
    dev = getattr(obj, "device", None)
    if not isinstance(dev, Device) or not hasattr(obj, "ptr") or not hasattr(obj, "size"):
        raise errors.InvalidArgument(f"{where}: {what} must be a paddle_rt.Tensor or an Allocation (paddle_rt.malloc) "
                                     f"of {comm.device!r}, not {type(obj).__name__}")
    if getattr(obj, "freed", False):
        raise errors.InvalidArgument(f"{where}: {what} {obj!r} was freed")
    if dev is not comm.device:
        raise errors.InvalidArgument(f"{where}: {what} is memory of {dev!r}, but the communicator (rank "
                                     f"{comm.rank}) is on {comm.device!r}")
    if getattr(obj, "pinned", False) or getattr(obj, "memory_kind", None) == "host":
        raise errors.InvalidArgument(f"{where}: {what} is pinned host memory; collectives need device memory")
    ptr, size = int(obj.ptr), int(obj.size)
    if not isinstance(obj, Allocation):
        # only a real Allocation is trusted for its size; a look-alike is bounded by the allocation it points into
        extent = raw_live_extent(dev, KIND_DEVICE, <uintptr_t>ptr) if 0 < ptr < (1 << 64) else -1
        if extent < 0:
            raise errors.InvalidArgument(f"{where}: {what} at {ptr:#x} is not inside a live allocation on {dev!r}")
        size = min(size, extent)
    return ptr, size


def _need(size, count, itemsize, what, dtype_name, where, times=1):
    need = count * itemsize * times
    if size < need:
        per = f"{times} x " if times != 1 else ""
        raise errors.InvalidArgument(f"{where}: {what} has {size} bytes, too small for {per}{count} {dtype_name} "
                                     f"({need} bytes)")


def _where(Communicator comm, name):
    if isinstance(comm, Communicator):
        return f"{comm.device!r}: ccl.{name}"
    return f"ccl.{name}"


def _reducing_dtype(dtype, where):
    name, cval, size = _dtype_info(dtype, where)
    if name in ("complex64", "complex128"):
        raise errors.NotSupportedError(f"{where}: complex types cannot be reduced or moved by xccl ({name})")
    if name == "bool":
        raise errors.NotSupportedError(f"{where}: bool cannot be reduced (only broadcast, all_gather, send/recv "
                                       f"and all_to_all move bool data)")
    return name, cval, size


def _moving_dtype(dtype, where):
    name, cval, size = _dtype_info(dtype, where)
    if name in ("complex64", "complex128"):
        raise errors.NotSupportedError(f"{where}: complex types are not supported by xccl ({name})")
    return name, cval, size


def _dtype_of(dtype, bufs, where):
    """The dtype of a call: the tensors' (they must agree with each other and with an explicit ``dtype``), else the
    explicit one (Allocations carry none)."""
    names = [(what, (<Tensor>b).dtype) for what, b in zip(("send", "recv"), bufs) if isinstance(b, Tensor)]
    if len(bufs) == 1 and names:
        names = [("buf", names[0][1])]
    if len({n for _, n in names}) > 1:
        raise errors.InvalidArgument(f"{where}: the tensors' dtypes differ ("
                                     f"{', '.join(f'{w} is {n}' for w, n in names)})")
    if dtype is None:
        return names[0][1] if names else None
    if names:
        want = _dtype_info(dtype, where)[0]
        if want != names[0][1]:
            raise errors.InvalidArgument(f"{where}: dtype={dtype!r} but {names[0][0]} is a {names[0][1]} Tensor "
                                         f"(leave dtype out for tensors)")
    return dtype


def _tensor_recorder(list used, list written):
    """What an operator does with its operands, for a collective: once it has a stream position, the tensors it
    writes note it as their pending writer (Tensor.numpy and friends wait for it), and every tensor used on a stream
    other than its own is record_stream'd there (its memory is not reused before the collective ran)."""
    used = [b for b in used if isinstance(b, Tensor)]
    written = [b for b in written if isinstance(b, Tensor)]
    if not used:
        return None

    def record(Stream s, pos):
        for t in written:
            (<Tensor>t).storage.note_writer(s, pos)
        for t in used:
            (<Tensor>t).storage.used_on(s)
    return record


cdef object _check_comm(object comm, str name):
    if not isinstance(comm, Communicator):
        raise errors.InvalidArgument(f"ccl.{name}: comm must be a Communicator, not {type(comm).__name__}")
    (<Communicator>comm)._check_usable(name)


cdef tuple _checked_start(comm, str name, send, recv, dtype, bint reducing):
    """The first checks of a two-buffer collective, in this order: the communicator, then the dtype (a reducible one
    for reductions). Returns (communicator, where, dtype name, C_DataType value, itemsize)."""
    _check_comm(comm, name)
    cdef Communicator cm = comm
    where = _where(cm, name)
    dt = _dtype_of(dtype, (send, recv), where)
    return (cm, where) + (_reducing_dtype(dt, where) if reducing else _moving_dtype(dt, where))


def all_reduce(send, recv, op="sum", comm=None, stream=None, count=None, dtype=None):
    """recv[i] = op over ranks of send[i], i < count, on every rank (``xccl_all_reduce``). In place when send is
    recv. count defaults to send.size // itemsize. Returns a :class:`Work`."""
    return _reduction(K_ALL_REDUCE, send, recv, op, comm, stream, count, dtype, None)


def reduce(send, recv, op="sum", root=0, comm=None, stream=None, count=None, dtype=None):
    """Like all_reduce, but only ``root`` receives (recv may be None on the other ranks) (``xccl_reduce``)."""
    return _reduction(K_REDUCE, send, recv, op, comm, stream, count, dtype, root)


def reduce_scatter(send, recv, op="sum", comm=None, stream=None, count=None, dtype=None):
    """Rank r receives op over ranks of ``send[r*count:(r+1)*count]`` (``xccl_reduce_scatter``); count (per rank)
    defaults to recv.size // itemsize; send holds ``nranks*count`` elements."""
    return _reduction(K_REDUCE_SCATTER, send, recv, op, comm, stream, count, dtype, None)


cdef Work _prepare_filled(int kind, Communicator cm, object stream, CclCall** out, uintptr_t sp, uintptr_t rp,
                          size_t count, int cval, int opv, size_t peer):
    """prepare_call, then the call's buffers, count, dtype, reduction and peer filled in (0: unused)."""
    cdef Work w = prepare_call(kind, cm, stream, out)
    cdef CclCall* c = out[0]
    c.send = <void*>sp
    c.recv = <void*>rp
    c.count = count
    c.dtype = <C_DataType>cval
    c.op = <C_CCLReduceOp>opv
    c.peer = peer
    return w


cdef object _submit(Work w, CclCall* c, tuple args, tuple keep, list written):
    """Submit a prepared call with its arguments (for messages and the profiler), the buffers it keeps alive until
    it ran, and those of them it writes."""
    w.args = args
    w._keep = keep
    w._recorder = _tensor_recorder(list(keep), written)
    return submit_call(w, c)



cdef object _reduction(int kind, send, recv, op, comm, stream, count, dtype, root):
    name = _NAMES[kind]
    cdef Communicator cm
    cm, where, dname, cval, isz = _checked_start(comm, name, send, recv, dtype, True)
    opv = _op_value(op, where)
    if kind == K_REDUCE:
        root = _rank_value(root, cm, "root", where)
    sp, ssize = _buffer(send, "send", cm, where)
    need_recv = kind != K_REDUCE or cm.rank == root
    rp, rsize = (0, 0)
    if need_recv:
        rp, rsize = _buffer(recv, "recv", cm, where)
    elif recv is not None:
        rp, rsize = _buffer(recv, "recv", cm, where)
    if count is None:
        if kind == K_REDUCE_SCATTER:
            count = (ssize // cm.nranks if send is recv else rsize) // isz
        else:
            count = ssize // isz
    count = _count_value(count, where)
    if kind == K_REDUCE_SCATTER:
        _need(ssize, count, isz, "send", dname, where, cm.nranks)
        if send is recv:
            rp = sp + cm.rank * count * isz      # in place: this rank's chunk of send
        else:
            _need(rsize, count, isz, "recv", dname, where)
    else:
        _need(ssize, count, isz, "send", dname, where)
        if need_recv:
            _need(rsize, count, isz, "recv", dname, where)
    cdef CclCall* c
    cdef Work w = _prepare_filled(kind, cm, stream, &c, sp, rp, count, cval, opv, root if root is not None else 0)
    return _submit(w, c, (name, count, dname, opv, root), (send, recv), [recv])


cdef tuple _single_buffer_args(buf, rank, str rank_name, Communicator cm, count, dtype, str where):
    """Validate the arguments of a one-buffer collective (broadcast, send, recv), in this order: the dtype (data
    movement: any non-complex type), the root/peer rank, the buffer, the count (default buf.size // itemsize) and that
    the buffer holds count elements. Returns (dtype name, C_DataType value, rank, buffer address, count)."""
    dname, cval, isz = _moving_dtype(_dtype_of(dtype, (buf,), where), where)
    rank = _rank_value(rank, cm, rank_name, where)
    bp, bsize = _buffer(buf, "buf", cm, where)
    if count is None:
        count = bsize // isz
    count = _count_value(count, where)
    _need(bsize, count, isz, "buf", dname, where)
    return dname, cval, rank, bp, count


def broadcast(buf, root=0, comm=None, stream=None, count=None, dtype=None):
    """Copy root's ``buf`` into every other rank's ``buf`` (``xccl_broadcast``, in place). count defaults to
    buf.size // itemsize."""
    _check_comm(comm, "broadcast")
    cdef Communicator cm = comm
    where = _where(cm, "broadcast")
    dname, cval, root, bp, count = _single_buffer_args(buf, root, "root", cm, count, dtype, where)
    cdef CclCall* c
    cdef Work w = _prepare_filled(K_BROADCAST, cm, stream, &c, bp, bp, count, cval, 0, root)
    return _submit(w, c, ("broadcast", count, dname, None, root), (buf,), [buf])


def all_gather(send, recv, comm=None, stream=None, count=None, dtype=None):
    """``recv[r*count:(r+1)*count]`` = rank r's ``send[:count]`` on every rank (``xccl_all_gather``); count (per rank)
    defaults to send.size // itemsize; recv holds ``nranks*count`` elements. In place when send is recv's chunk of
    this rank."""
    cdef Communicator cm
    cm, where, dname, cval, isz = _checked_start(comm, "all_gather", send, recv, dtype, False)
    sp, ssize = _buffer(send, "send", cm, where)
    rp, rsize = _buffer(recv, "recv", cm, where)
    if count is None:
        count = ssize // isz if send is not recv else rsize // isz // cm.nranks
    count = _count_value(count, where)
    _need(rsize, count, isz, "recv", dname, where, cm.nranks)
    if send is recv:
        sp = rp + cm.rank * count * isz      # in place: this rank's chunk of recv
    else:
        _need(ssize, count, isz, "send", dname, where)
    cdef CclCall* c
    cdef Work w = _prepare_filled(K_ALL_GATHER, cm, stream, &c, sp, rp, count, cval, 0, 0)
    return _submit(w, c, ("all_gather", count, dname, None, None), (send, recv), [recv])


def send(buf, peer, comm=None, stream=None, count=None, dtype=None):
    """Send count elements of ``buf`` to rank ``peer`` (``xccl_send``); matched with peer's n-th recv from this
    rank. A send and its recv issued by one thread must be in one :class:`group`."""
    return _p2p(K_SEND, buf, peer, comm, stream, count, dtype)


def recv(buf, peer, comm=None, stream=None, count=None, dtype=None):
    """Receive count elements into ``buf`` from rank ``peer`` (``xccl_recv``)."""
    return _p2p(K_RECV, buf, peer, comm, stream, count, dtype)


cdef object _p2p(int kind, buf, peer, comm, stream, count, dtype):
    name = _NAMES[kind]
    _check_comm(comm, name)
    cdef Communicator cm = comm
    where = _where(cm, name)
    dname, cval, peer, bp, count = _single_buffer_args(buf, peer, "peer", cm, count, dtype, where)
    cdef CclCall* c
    cdef Work w = _prepare_filled(kind, cm, stream, &c, bp if kind == K_SEND else 0, bp if kind == K_RECV else 0,
                                  count, cval, 0, peer)
    w.peer = peer
    return _submit(w, c, (name, count, dname, None, peer), (buf,), [buf] if kind == K_RECV else [])


def all_to_all(send, recv, comm=None, stream=None, count=None, dtype=None):
    """Rank r's send chunk p (count elements) lands in rank p's recv chunk r (``xccl_all_to_all``); count (per
    peer) defaults to send.size // itemsize // nranks; send and recv hold ``nranks*count`` elements each."""
    cdef Communicator cm
    cm, where, dname, cval, isz = _checked_start(comm, "all_to_all", send, recv, dtype, False)
    sp, ssize = _buffer(send, "send", cm, where)
    rp, rsize = _buffer(recv, "recv", cm, where)
    if send is recv:
        raise errors.InvalidArgument(f"{where}: all_to_all cannot run in place (send is recv)")
    if count is None:
        count = ssize // isz // cm.nranks
    count = _count_value(count, where)
    _need(ssize, count, isz, "send", dname, where, cm.nranks)
    _need(rsize, count, isz, "recv", dname, where, cm.nranks)
    cdef CclCall* c
    cdef Work w = prepare_call(K_ALL_TO_ALL, cm, stream, &c)
    cdef size_t n = cm.nranks
    cdef size_t k
    c.a2a_send = <const void**>malloc(n * sizeof(void*))
    c.a2a_recv = <void**>malloc(n * sizeof(void*))
    c.a2a_count = <size_t*>malloc(n * sizeof(size_t))
    c.a2a_dtype = <C_DataType*>malloc(n * sizeof(C_DataType))
    if c.a2a_send == NULL or c.a2a_recv == NULL or c.a2a_count == NULL or c.a2a_dtype == NULL:
        free_call_arrays(c)
        free(c)
        raise MemoryError()
    for k in range(n):
        c.a2a_send[k] = <const void*><uintptr_t>(sp + k * count * isz)
        c.a2a_recv[k] = <void*><uintptr_t>(rp + k * count * isz)
        c.a2a_count[k] = count
        c.a2a_dtype[k] = <C_DataType>cval
    c.count = count
    c.dtype = <C_DataType>cval
    return _submit(w, c, ("all_to_all", count, dname, None, None), (send, recv), [recv])


# -- InfiniCCL's variable-count collectives, composed from grouped plugin calls ---------------------------------------
cdef Work _raw_call(int kind, Communicator cm, object stream, uintptr_t sp, uintptr_t rp, size_t count, int cval,
                    int opv, size_t peer, object keep, object args):
    cdef CclCall* c
    cdef Work w = _prepare_filled(kind, cm, stream, &c, sp, rp, count, cval, opv, peer)
    _submit(w, c, args, keep, [keep[1]])
    return w


def _counts_value(counts, Communicator cm, what, where):
    try:
        counts = [int(x) if not isinstance(x, bool) else -1 for x in counts]
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"{where}: {what} must be a sequence of {cm.nranks} counts") from None
    if len(counts) != cm.nranks or any(x < 0 for x in counts):
        raise errors.InvalidArgument(f"{where}: {what} must hold {cm.nranks} non-negative counts, not {counts!r}")
    return counts


def _v_parts(counts, str counts_name, send, recv, Communicator cm, where, dname, isz, str whole):
    """The parts of a variable-count collective: the checked counts, both buffers' addresses and the parts' byte
    offsets in the `whole` buffer ("send" or "recv"), which must hold every part; the other holds this rank's."""
    counts = _counts_value(counts, cm, counts_name, where)
    sp, ssize = _buffer(send, "send", cm, where)
    rp, rsize = _buffer(recv, "recv", cm, where)
    part = "send" if whole == "recv" else "recv"
    _need(ssize if whole == "send" else rsize, sum(counts), isz, whole, dname, where)
    _need(ssize if part == "send" else rsize, counts[cm.rank], isz, part, dname, where)
    return counts, sp, rp, [sum(counts[:r]) * isz for r in range(cm.nranks)]


def all_gather_v(send, recv, recv_counts, comm=None, stream=None, dtype=None):
    """InfiniCCL's AllGatherV: rank r contributes ``recv_counts[r]`` elements (from the start of its ``send``);
    every rank's ``recv`` gets all parts one after another. Runs as this rank's part copied into place, then one
    broadcast per rank inside a group. Returns the list of Works (one per part)."""
    cdef Communicator cm
    cm, where, dname, cval, isz = _checked_start(comm, "all_gather_v", send, recv, dtype, False)
    counts, sp, rp, offs = _v_parts(recv_counts, "recv_counts", send, recv, cm, where, dname, isz, "recv")
    s = current_stream(cm.device) if stream is None else stream
    if counts[cm.rank] and rp + offs[cm.rank] != sp:
        from paddle_rt._core.memcpy import memcpy_async
        if not isinstance(s, Stream):
            raise errors.InvalidArgument(f"{where}: stream must be a paddle_rt Stream or None, not "
                                         f"{type(s).__name__}")
        if (<Stream>s).device is not cm.device:
            raise errors.InvalidArgument(f"{where}: the stream {(<Stream>s).name} is on {(<Stream>s).device!r}, "
                                         f"the communicator (rank {cm.rank}) on {cm.device!r}")
        memcpy_async(rp + offs[cm.rank], sp, counts[cm.rank] * isz, stream=s, kind="D2D")
    works = []
    with group():
        for r in range(cm.nranks):
            works.append(_raw_call(K_BROADCAST, cm, s, rp + offs[r], rp + offs[r], counts[r], cval, 0, r,
                                   (send, recv), ("all_gather_v", counts[r], dname, None, r)))
    return works


def reduce_scatter_v(send, recv, send_counts, op="sum", comm=None, stream=None, dtype=None):
    """InfiniCCL's ReduceScatterV: rank r receives op over ranks of ``send``'s r-th part (``send_counts[r]``
    elements, parts one after another) in ``recv``. Runs as one reduce per rank (root r) inside a group. Returns
    the list of Works."""
    cdef Communicator cm
    cm, where, dname, cval, isz = _checked_start(comm, "reduce_scatter_v", send, recv, dtype, True)
    opv = _op_value(op, where)
    counts, sp, rp, offs = _v_parts(send_counts, "send_counts", send, recv, cm, where, dname, isz, "send")
    works = []
    with group():
        for r in range(cm.nranks):
            works.append(_raw_call(K_REDUCE, cm, stream, sp + offs[r], rp if r == cm.rank else 0, counts[r], cval,
                                   opv, r, (send, recv), ("reduce_scatter_v", counts[r], dname, opv, r)))
    return works
