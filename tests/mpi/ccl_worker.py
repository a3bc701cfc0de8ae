"""One rank of the cross-process collectives tests (tests/test_ccl_mpi.py runs it under mpiexec).

    mpiexec -n N python ccl_worker.py SCENARIO

Every rank prints "RANK <r> OK <scenario>" when all its checks passed; a failed check raises (non-zero exit). The
scenarios "absent" and "dies" end with os._exit; "exit_after_dead_peer" and "exit_after_timeout" leave Python
normally, to show that exit does not hang.
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import paddle_rt
from paddle_rt import ccl
from paddle_rt.streams import memcpy_async

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ccl_reference import ml_dtypes, np_dtype, make_input, reduce_ref  # noqa: E402

OPS = ["sum", "avg", "max", "min", "prod"]
TYPES = ["int8", "uint8", "int32", "uint64", "int64", "float32", "float64", "float16"] + \
    (["bfloat16"] if ml_dtypes is not None else [])


def check(got, want, name, what):
    if name in ("float16", "bfloat16"):   # MPI combines pairwise, rounding at each step
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0.02, atol=0.1,
                                   err_msg=what)
    elif name.startswith("float"):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


class Rank:
    def __init__(self, comm):
        self.comm = comm
        self.r, self.n = comm.rank, comm.nranks
        self.stream = paddle_rt.current_stream(comm.device)

    def buf(self, arr):
        b = paddle_rt.malloc(max(arr.nbytes, 1), device=self.comm.device)
        np.asarray(b)[: arr.nbytes] = arr.view(np.uint8)
        return b

    def empty(self, nbytes):
        b = paddle_rt.malloc(max(int(nbytes), 1), device=self.comm.device)
        np.asarray(b)[:] = 0xEE
        return b

    @staticmethod
    def read(b, name, count):
        dt = np_dtype(name)
        return np.asarray(b)[: count * dt.itemsize].view(dt).copy()


def scenario_ops(comm):
    k = Rank(comm)
    r, n = k.r, k.n
    count = 37
    for name in TYPES:
        xs = [make_input(name, count, 1000 * q + sum(name.encode())) for q in range(n)]
        for op in OPS:
            s = k.buf(xs[r])
            d = k.empty(count * xs[r].itemsize)
            ccl.all_reduce(s, d, op, comm=comm, dtype=name).wait()
            check(k.read(d, name, count), reduce_ref(op, xs, name), name, f"all_reduce {op} {name}")
            root = (1 + len(op)) % n
            d2 = k.empty(count * xs[r].itemsize)
            ccl.reduce(s, d2, op, root=root, comm=comm, dtype=name).wait()
            if r == root:
                check(k.read(d2, name, count), reduce_ref(op, xs, name), name, f"reduce {op} {name}")
            big = [make_input(name, count * n, 7 + q) for q in range(n)]
            sb = k.buf(big[r])
            rs = k.empty(count * xs[r].itemsize)
            ccl.reduce_scatter(sb, rs, op, comm=comm, dtype=name, count=count).wait()
            want = reduce_ref(op, big, name)[r * count:(r + 1) * count]
            check(k.read(rs, name, count), want, name, f"reduce_scatter {op} {name}")
        # in place
        s = k.buf(xs[r])
        ccl.all_reduce(s, s, "sum", comm=comm, dtype=name).wait()
        check(k.read(s, name, count), reduce_ref("sum", xs, name), name, f"in-place all_reduce {name}")
    for name in ["bool", "int16", "float32", "float16"]:
        xs = [make_input(name, count, 50 + q) for q in range(n)]
        root = n - 1
        b = k.buf(xs[r])
        ccl.broadcast(b, root=root, comm=comm, dtype=name).wait()
        check(k.read(b, name, count), xs[root], name, f"broadcast {name}")
        s = k.buf(xs[r])
        g = k.empty(count * n * xs[r].itemsize)
        ccl.all_gather(s, g, comm=comm, dtype=name).wait()
        check(k.read(g, name, count * n), np.concatenate(xs), name, f"all_gather {name}")
        big = [make_input(name, count * n, 90 + q) for q in range(n)]
        sb = k.buf(big[r])
        rb = k.empty(count * n * xs[r].itemsize)
        ccl.all_to_all(sb, rb, comm=comm, dtype=name).wait()
        want = np.concatenate([big[q][r * count:(r + 1) * count] for q in range(n)])
        check(k.read(rb, name, count * n), want, name, f"all_to_all {name}")
    # send/recv ring inside a group
    xs = [make_input("int32", count, 300 + q) for q in range(n)]
    s = k.buf(xs[r])
    d = k.empty(count * 4)
    with ccl.group():
        ccl.send(s, (r + 1) % n, comm=comm, dtype="int32")
        ccl.recv(d, (r - 1) % n, comm=comm, dtype="int32")
    k.stream.synchronize()
    check(k.read(d, "int32", count), xs[(r - 1) % n], "int32", "send/recv ring")
    # the V forms
    counts = [3 + 2 * q for q in range(n)]
    parts = [make_input("float32", counts[q], 400 + q) for q in range(n)]
    s = k.buf(parts[r])
    g = k.empty(sum(counts) * 4)
    for w in ccl.all_gather_v(s, g, counts, comm=comm, dtype="float32"):
        w.wait()
    check(k.read(g, "float32", sum(counts)), np.concatenate(parts), "float32", "all_gather_v")
    full = [make_input("int64", sum(counts), 500 + q) for q in range(n)]
    s = k.buf(full[r])
    d = k.empty(counts[r] * 8)
    for w in ccl.reduce_scatter_v(s, d, counts, "max", comm=comm, dtype="int64"):
        w.wait()
    off = sum(counts[:r])
    check(k.read(d, "int64", counts[r]), reduce_ref("max", full, "int64")[off:off + counts[r]], "int64",
          "reduce_scatter_v")
    # large enough for MPI's rendezvous protocols
    big = 1 << 20
    x = np.full(big, r + 1, np.float32)
    s = k.buf(x)
    ccl.all_reduce(s, s, "sum", comm=comm, dtype="float32").wait()
    check(k.read(s, "float32", big), np.full(big, n * (n + 1) / 2, np.float32), "float32", "all_reduce 4 MiB")


def scenario_order(comm):
    """H2D copy -> all_reduce -> D2H copy on one stream, many rounds, one synchronize at the end."""
    k = Rank(comm)
    r, n = k.r, k.n
    count, rounds = 4099, 16
    b = k.empty(count * 4)
    ins = [np.full(count, (r + 1) * (i + 1), np.float32) for i in range(rounds)]
    outs = [np.zeros(count, np.float32) for _ in range(rounds)]
    for i in range(rounds):
        memcpy_async(b, ins[i], count * 4, stream=k.stream)
        ccl.all_reduce(b, b, "sum", comm=comm, stream=k.stream, dtype="float32")
        memcpy_async(outs[i], b, count * 4, stream=k.stream)
    k.stream.synchronize()
    for i in range(rounds):
        np.testing.assert_array_equal(outs[i], np.full(count, (i + 1) * n * (n + 1) / 2, np.float32))
    # two streams of one communicator: collectives still pair up in issue order
    s2 = paddle_rt.Stream(comm.device)
    a1 = k.buf(np.full(8, r + 1, np.int32))
    a2 = k.buf(np.full(8, 10 * (r + 1), np.int32))
    w1 = ccl.all_reduce(a1, a1, "sum", comm=comm, stream=s2, dtype="int32")
    w2 = ccl.all_reduce(a2, a2, "sum", comm=comm, stream=k.stream, dtype="int32")
    w1.wait()
    w2.wait()
    np.testing.assert_array_equal(k.read(a1, "int32", 8), np.full(8, n * (n + 1) // 2, np.int32))
    np.testing.assert_array_equal(k.read(a2, "int32", 8), np.full(8, 10 * n * (n + 1) // 2, np.int32))


def expect_failure(fn, *, missing=None, text=None):
    try:
        fn()
    except ccl.CollectiveError as exc:
        msg = str(exc)
        if text is not None and text not in msg:
            raise AssertionError(f"expected {text!r} in {msg!r}") from exc
        if missing is not None and sorted(exc.missing_ranks or []) != sorted(missing):
            raise AssertionError(f"expected missing ranks {missing}, got {exc.missing_ranks}: {msg}") from exc
        print(f"RANK {MPI.COMM_WORLD.Get_rank()} raised: {msg}", flush=True)
        return exc
    raise AssertionError("expected a CollectiveError")


def survivor_names_last_rank(comm, b, scenario):
    """On a rank other than the last: an all_reduce of b raises a CollectiveError naming the last rank as missing;
    then this rank reports OK and leaves."""
    expect_failure(lambda: ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait(),
                   missing=[comm.nranks - 1], text="all_reduce")
    print(f"RANK {comm.rank} OK {scenario}", flush=True)
    os._exit(0)


def scenario_mismatch(comm):
    k = Rank(comm)
    r = k.r
    cnt = 8 if r == 0 else 16
    b = k.buf(np.ones(16, np.float32))
    t0 = time.monotonic()
    expect_failure(lambda: ccl.all_reduce(b, b, "sum", comm=comm, count=cnt, dtype="float32").wait(),
                   text="arguments differ")
    assert time.monotonic() - t0 < 20
    # the communicator is in error: later calls raise at once
    expect_failure(lambda: ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32"), text="in error")
    c2 = ccl.Communicator.from_mpi()
    b2 = k.buf(np.ones(16, np.float32))
    expect_failure(lambda: ccl.all_reduce(b2, b2, "sum", comm=c2, dtype="float32" if r == 0 else "int32").wait(),
                   text="dtype")
    c3 = ccl.Communicator.from_mpi()
    expect_failure(lambda: ccl.broadcast(b2, root=r % 2, comm=c3, dtype="float32").wait(), text="root")


def scenario_absent(comm):
    """The last rank never calls the collective (it waits, then leaves); the others name it."""
    k = Rank(comm)
    r, n = k.r, k.n
    b = k.buf(np.ones(4, np.float32))
    if r == n - 1:
        time.sleep(float(os.environ["RT_CPU_CCL_TIMEOUT_MS"]) / 1000 + 4)
        print(f"RANK {r} OK absent", flush=True)
        os._exit(0)
    survivor_names_last_rank(comm, b, "absent")


def scenario_dies(comm):
    """The last rank exits before the collective (a crash); the others name it, their Python keeps running."""
    k = Rank(comm)
    r, n = k.r, k.n
    b = k.buf(np.ones(4, np.float32))
    ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait()    # everyone alive once
    if r == n - 1:
        os._exit(3)
    time.sleep(0.5)
    survivor_names_last_rank(comm, b, "dies")


def scenario_groups(comm):
    """COMM_WORLD split into two groups (even and odd world ranks) running different collectives at the same time on
    tensors, next to a Dup and a Create_group communicator."""
    world = MPI.COMM_WORLD
    wr, wn = world.Get_rank(), world.Get_size()
    color = wr % 2
    sub = world.Split(color, wr)
    g = ccl.Communicator.from_mpi(comm=sub)
    assert (g.rank, g.nranks) == (sub.Get_rank(), sub.Get_size()), g
    assert g.device is paddle_rt.devices()[g.rank % len(paddle_rt.devices())]   # rank in the group % device_count
    members = list(range(color, wn, 2))
    n = len(members)
    for rounds in range(3):
        if color == 0:    # even world ranks: all_reduce of float32 tensors (dtype and count from the tensor)
            t = paddle_rt.tensor(np.arange(6, dtype=np.float32) * (wr + 1 + rounds), device=g.device)
            ccl.all_reduce(t, t, "sum", comm=g)
            want = np.arange(6, dtype=np.float32) * sum(m + 1 + rounds for m in members)
            np.testing.assert_array_equal(t.numpy(), want)       # numpy() waits for the collective writing t
        else:             # odd world ranks: all_gather, then a broadcast, of int64 tensors
            s = paddle_rt.tensor(np.full(3, wr * 10 + rounds, np.int64), device=g.device)
            out = paddle_rt.empty((n, 3), dtype="int64", device=g.device)
            ccl.all_gather(s, out, comm=g)
            np.testing.assert_array_equal(out.numpy(), np.array([[m * 10 + rounds] * 3 for m in members]))
            b = paddle_rt.tensor(np.full(4, wr, np.int64), device=g.device)
            ccl.broadcast(b, root=n - 1, comm=g)
            np.testing.assert_array_equal(b.numpy(), np.full(4, members[-1], np.int64))
    # a Dup of COMM_WORLD and a Create_group of its first and last rank
    d = ccl.Communicator.from_mpi(comm=world.Dup())
    x = paddle_rt.tensor(np.full(2, wr + 1, np.int32), device=d.device)
    ccl.all_reduce(x, x, "max", comm=d).wait()
    np.testing.assert_array_equal(x.numpy(), np.full(2, wn, np.int32))
    edge = world.Create_group(world.Get_group().Incl([0, wn - 1]))
    if edge != MPI.COMM_NULL:
        e = ccl.Communicator.from_mpi(comm=edge)
        y = paddle_rt.tensor(np.full(2, wr, np.float64), device=e.device)
        ccl.all_reduce(y, y, "sum", comm=e).wait()
        np.testing.assert_array_equal(y.numpy(), np.full(2, wn - 1, np.float64))
        e.destroy()
    # the world communicator still works after the others
    z = paddle_rt.tensor(np.ones(5, np.float32), device=comm.device)
    ccl.all_reduce(z, z, "sum", comm=comm).wait()
    np.testing.assert_array_equal(z.numpy(), np.full(5, wn, np.float32))
    g.destroy()
    d.destroy()


def scenario_wait_timeout(comm):
    """The last rank joins an all_reduce 4 s late: Work.wait(1) on the others names it (asking the peers), a second
    wait then completes."""
    k = Rank(comm)
    r, n = k.r, k.n
    b = k.buf(np.full(4, r + 1, np.float32))
    if r == n - 1:
        time.sleep(4)
        ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait()
    else:
        w = ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32")
        try:
            w.wait(1)
        except ccl.CollectiveTimeout as exc:
            assert exc.missing_ranks == [n - 1], exc
            assert "asked over MPI" in str(exc), exc
            print(f"RANK {r} raised: {exc}", flush=True)
        else:
            raise AssertionError("expected a CollectiveTimeout")
        w.wait()
    np.testing.assert_array_equal(k.read(b, "float32", 4), np.full(4, n * (n + 1) / 2, np.float32))


def scenario_exit_after_dead_peer(comm):
    """The last rank exits (os._exit: no MPI_Finalize) before the second all_reduce; the others raise CollectiveError
    naming it, then leave Python normally: MPI_Finalize must not wait for the dead rank."""
    k = Rank(comm)
    r, n = k.r, k.n
    b = k.buf(np.ones(4, np.float32))
    ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait()
    if r == n - 1:
        os._exit(3)
    time.sleep(0.5)
    expect_failure(lambda: ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait(), missing=[n - 1],
                   text="all_reduce")
    from paddle_rt._core import ccl_mpi
    assert ccl_mpi.finalizes_alone()


def scenario_killed(comm):
    """The last rank is killed by SIGKILL: MPICH's process manager ends the survivors too (no exception to catch)."""
    import signal
    k = Rank(comm)
    r, n = k.r, k.n
    b = k.buf(np.ones(4, np.float32))
    ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait()
    if r == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    try:
        ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait()
    except ccl.CollectiveError as exc:
        print(f"RANK {r} raised: {exc}", flush=True)


def scenario_exit_after_timeout(comm):
    """Work.wait(1) times out while the last rank stays away (alive) and then leaves; the others exit at once: the
    collective still waiting in the plugin (RT_CPU_CCL_TIMEOUT_MS is long here) is aborted at exit."""
    k = Rank(comm)
    r, n = k.r, k.n
    b = k.buf(np.ones(4, np.float32))
    if r == n - 1:
        time.sleep(3)
        return
    try:
        ccl.all_reduce(b, b, "sum", comm=comm, dtype="float32").wait(1)
    except ccl.CollectiveTimeout as exc:
        print(f"RANK {r} raised: {exc}", flush=True)
    else:
        raise AssertionError("expected a CollectiveTimeout")


def bootstrap_absent(absent):
    """Rank `absent` never calls from_mpi (it waits, then leaves); the others raise CollectiveTimeout naming it."""
    r = MPI.COMM_WORLD.Get_rank()
    if r == absent:
        time.sleep(float(os.environ["PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT"]) * 1.1 + 3)
        print(f"RANK {r} OK bootstrap_absent", flush=True)
        return
    t0 = time.monotonic()
    try:
        ccl.Communicator.from_mpi()
    except ccl.CollectiveTimeout as exc:
        assert exc.missing_ranks == [absent], exc
        assert "PADDLE_RT_CCL_BOOTSTRAP_TIMEOUT" in str(exc), exc
        print(f"RANK {r} raised after {time.monotonic() - t0:.1f} s: {exc}", flush=True)
    else:
        raise AssertionError("expected a CollectiveTimeout")
    print(f"RANK {r} OK bootstrap_absent", flush=True)


def main():
    scenario = sys.argv[1]
    if scenario == "bootstrap_absent":
        bootstrap_absent(int(sys.argv[2]))
        return
    comm = ccl.Communicator.from_mpi()
    assert comm.across_processes and comm.nranks == MPI.COMM_WORLD.Get_size()
    globals()["scenario_" + scenario](comm)
    if not scenario.startswith("exit_"):    # those leave a collective to the exit path
        paddle_rt.synchronize()
    print(f"RANK {comm.rank} OK {scenario}", flush=True)


if __name__ == "__main__":
    main()
