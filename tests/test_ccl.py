"""Collectives (paddle_rt._core.ccl, public paddle_rt.ccl) against numpy references.

The default test process has 2 rt_cpu devices; 3 and 4 devices run in one child process each (RT_CPU_DEVICE_COUNT),
and so do the cases that need a short plugin timeout (RT_CPU_CCL_TIMEOUT_MS) or a process exit.
"""
import os
import sys
import threading

import numpy as np
import pytest

import paddle_rt
from paddle_rt import ccl
from paddle_rt.streams import memcpy_async

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ccl_reference import np_dtype, make_input, reduce_ref  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")

INT_TYPES = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
FLOAT_TYPES = ["float16", "float32", "float64", "bfloat16"]
ALL_TYPES = INT_TYPES + FLOAT_TYPES
OPS = ["sum", "avg", "max", "min", "prod"]
HERE = os.path.dirname(os.path.abspath(__file__))


# -- helpers -----------------------------------------------------------------------------------------------------------
def alloc(comm, nbytes):
    return paddle_rt.malloc(max(int(nbytes), 1), device=comm.device)


def view(a, name, count):
    dt = np_dtype(name)
    return np.asarray(a)[: count * dt.itemsize].view(dt)


def put(a, arr):
    np.asarray(a)[: arr.nbytes] = arr.view(np.uint8)


def wait_all(works):
    for w in works:
        w.wait(timeout=60)


def check_matrix(comms, counts, dtypes=ALL_TYPES, ops=OPS, seed=0):
    """Every collective x dtype x op x count, issued for all ranks from this thread (each rank's call runs on its
    own stream's worker), in place and out of place in turn. Returns the number of checked results."""
    rng = np.random.default_rng(seed)
    n = len(comms)
    checked = 0
    flip = False
    for name in dtypes:
        isz = np_dtype(name).itemsize
        for count in counts:
            for op in ops:
                flip = not flip
                # all_reduce
                xs = [make_input(name, count, rng) for _ in range(n)]
                sends = [alloc(c, count * isz) for c in comms]
                recvs = sends if flip else [alloc(c, count * isz) for c in comms]
                for a, x in zip(sends, xs):
                    put(a, x)
                wait_all([ccl.all_reduce(s, r, op, comm=c, count=count, dtype=name)
                          for s, r, c in zip(sends, recvs, comms)])
                ref = reduce_ref(op, xs, name)
                for r in recvs:
                    np.testing.assert_array_equal(view(r, name, count), ref, err_msg=f"all_reduce {op} {name}")
                    checked += 1
                # reduce to the last rank
                root = n - 1
                recvs = [alloc(c, count * isz) for c in comms]
                for r in recvs:
                    np.asarray(r)[:] = 0xAB
                for a, x in zip(sends, xs):
                    put(a, x)
                wait_all([ccl.reduce(s, r if i == root else None, op, root=root, comm=c, count=count, dtype=name)
                          for i, (s, r, c) in enumerate(zip(sends, recvs, comms))])
                np.testing.assert_array_equal(view(recvs[root], name, count), ref, err_msg=f"reduce {op} {name}")
                assert all((np.asarray(r) == 0xAB).all() for i, r in enumerate(recvs) if i != root)
                checked += 1
                # reduce_scatter: count per rank
                big = [make_input(name, count * n, rng) for _ in range(n)]
                sends = [alloc(c, count * n * isz) for c in comms]
                for a, x in zip(sends, big):
                    put(a, x)
                ref = reduce_ref(op, big, name)
                if flip:   # in place: rank r's result lands in its own chunk of send
                    wait_all([ccl.reduce_scatter(s, s, op, comm=c, count=count, dtype=name)
                              for s, c in zip(sends, comms)])
                    outs = [view(s, name, count * n)[i * count:(i + 1) * count] for i, s in enumerate(sends)]
                else:
                    recvs = [alloc(c, count * isz) for c in comms]
                    wait_all([ccl.reduce_scatter(s, r, op, comm=c, count=count, dtype=name)
                              for s, r, c in zip(sends, recvs, comms)])
                    outs = [view(r, name, count) for r in recvs]
                for i, o in enumerate(outs):
                    np.testing.assert_array_equal(o, ref[i * count:(i + 1) * count],
                                                  err_msg=f"reduce_scatter {op} {name}")
                    checked += 1
        for count in counts:
            checked += check_movement(comms, name, count, rng)
    return checked


def check_movement(comms, name, count, rng):
    n = len(comms)
    isz = np_dtype(name).itemsize
    checked = 0
    # broadcast from each root
    for root in range(n):
        xs = [make_input(name, count, rng) for _ in range(n)]
        bufs = [alloc(c, count * isz) for c in comms]
        for a, x in zip(bufs, xs):
            put(a, x)
        wait_all([ccl.broadcast(b, root=root, comm=c, count=count, dtype=name) for b, c in zip(bufs, comms)])
        for b in bufs:
            np.testing.assert_array_equal(view(b, name, count), xs[root], err_msg=f"broadcast {name}")
            checked += 1
    # all_gather, out of place then in place
    xs = [make_input(name, count, rng) for _ in range(n)]
    sends = [alloc(c, count * isz) for c in comms]
    recvs = [alloc(c, count * n * isz) for c in comms]
    for a, x in zip(sends, xs):
        put(a, x)
    wait_all([ccl.all_gather(s, r, comm=c, count=count, dtype=name) for s, r, c in zip(sends, recvs, comms)])
    ref = np.concatenate(xs) if count else np.zeros(0, np_dtype(name))
    for r in recvs:
        np.testing.assert_array_equal(view(r, name, count * n), ref, err_msg=f"all_gather {name}")
        checked += 1
    for i, r in enumerate(recvs):
        np.asarray(r)[:] = 0
        view(r, name, count * n)[i * count:(i + 1) * count] = xs[i]
    wait_all([ccl.all_gather(r, r, comm=c, count=count, dtype=name) for r, c in zip(recvs, comms)])
    for r in recvs:
        np.testing.assert_array_equal(view(r, name, count * n), ref, err_msg=f"all_gather in place {name}")
        checked += 1
    # all_to_all
    big = [make_input(name, count * n, rng) for _ in range(n)]
    sends = [alloc(c, count * n * isz) for c in comms]
    recvs = [alloc(c, count * n * isz) for c in comms]
    for a, x in zip(sends, big):
        put(a, x)
    with ccl.group():
        works = [ccl.all_to_all(s, r, comm=c, count=count, dtype=name) for s, r, c in zip(sends, recvs, comms)]
    wait_all(works)
    for p, r in enumerate(recvs):
        want = [big[q][p * count:(p + 1) * count] for q in range(n)]
        np.testing.assert_array_equal(view(r, name, count * n),
                                      np.concatenate(want) if count else np.zeros(0, np_dtype(name)),
                                      err_msg=f"all_to_all {name}")
        checked += 1
    # send/recv ring, one thread, in a group
    xs = [make_input(name, count, rng) for _ in range(n)]
    sends = [alloc(c, count * isz) for c in comms]
    recvs = [alloc(c, count * isz) for c in comms]
    for a, x in zip(sends, xs):
        put(a, x)
    with ccl.group():
        works = []
        for i, c in enumerate(comms):
            works.append(ccl.send(sends[i], (i + 1) % n, comm=c, count=count, dtype=name))
            works.append(ccl.recv(recvs[i], (i - 1) % n, comm=c, count=count, dtype=name))
    wait_all(works)
    for i, r in enumerate(recvs):
        np.testing.assert_array_equal(view(r, name, count), xs[(i - 1) % n], err_msg=f"send/recv {name}")
        checked += 1
    return checked


def check_v(comms, seed=3):
    """all_gather_v / reduce_scatter_v (InfiniCCL's V forms) with uneven, zero and odd counts."""
    rng = np.random.default_rng(seed)
    n = len(comms)
    checked = 0
    for name in ("float32", "int16", "bfloat16"):
        isz = np_dtype(name).itemsize
        for counts in ([3] * n, [0] + [5] * (n - 1), [2 * i + 1 for i in range(n)]):
            total = sum(counts)
            xs = [make_input(name, counts[i], rng) for i in range(n)]
            sends = [alloc(c, counts[i] * isz) for i, c in enumerate(comms)]
            recvs = [alloc(c, total * isz) for c in comms]
            for a, x in zip(sends, xs):
                put(a, x)
            works = []
            with ccl.group():
                for s, r, c in zip(sends, recvs, comms):
                    works += ccl.all_gather_v(s, r, counts, comm=c, dtype=name)
            wait_all(works)
            for r in recvs:
                np.testing.assert_array_equal(view(r, name, total), np.concatenate(xs),
                                              err_msg=f"all_gather_v {name}")
                checked += 1
            big = [make_input(name, total, rng) for _ in range(n)]
            sends = [alloc(c, total * isz) for c in comms]
            recvs = [alloc(c, counts[i] * isz) for i, c in enumerate(comms)]
            for a, x in zip(sends, big):
                put(a, x)
            works = []
            for s, r, c in zip(sends, recvs, comms):
                works += ccl.reduce_scatter_v(s, r, counts, "max", comm=c, dtype=name)
            wait_all(works)
            ref = reduce_ref("max", big, name)
            off = 0
            for i, r in enumerate(recvs):
                np.testing.assert_array_equal(view(r, name, counts[i]), ref[off:off + counts[i]],
                                              err_msg=f"reduce_scatter_v {name}")
                off += counts[i]
                checked += 1
    return checked


# -- fixtures ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def comms():
    cs = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
    yield cs
    for c in cs:
        c.destroy()


def fresh_comms():
    return ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])


# -- good paths --------------------------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_comm_init_all_ranks_devices_and_names(comms):
    assert [c.rank for c in comms] == [0, 1]
    assert [c.nranks for c in comms] == [2, 2]
    assert [repr(c.device) for c in comms] == ["rt_cpu:0", "rt_cpu:1"]
    assert comms[0].name != comms[1].name
    assert not comms[0].destroyed and comms[0].error is None


@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_collective_op_dtype_two_devices(comms, name):
    assert check_matrix(comms, [0, 1, 7, 1001], dtypes=[name]) > 0


def test_variable_count_collectives(comms):
    assert check_v(comms) > 0
    a = alloc(comms[0], 64)
    with pytest.raises(paddle_rt.InvalidArgument, match="recv_counts must hold 2 non-negative counts"):
        ccl.all_gather_v(a, a, [1, 2, 3], comm=comms[0], dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="send has 64 bytes, too small for 20 float32"):
        ccl.reduce_scatter_v(a, a, [10, 10], comm=comms[0], dtype="float32")


def test_bool_data_movement(comms):
    rng = np.random.default_rng(1)
    for count in (0, 1, 9):
        assert check_movement(comms, "bool", count, rng) > 0


def test_large_count_all_reduce_in_and_out_of_place(comms):
    count = (1 << 22) + 3                        # 16 MiB + odd tail of float32
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in comms]
    bufs = [alloc(c, count * 4) for c in comms]
    outs = [alloc(c, count * 4) for c in comms]
    for b, x in zip(bufs, xs):
        put(b, x)
    wait_all([ccl.all_reduce(b, o, comm=c, dtype=np.float32) for b, o, c in zip(bufs, outs, comms)])
    wait_all([ccl.all_reduce(b, b, "max", comm=c, dtype="float32") for b, c in zip(bufs, comms)])
    for b, o in zip(bufs, outs):
        np.testing.assert_array_equal(view(o, "float32", count), xs[0] + xs[1])
        np.testing.assert_array_equal(view(b, "float32", count), np.maximum(xs[0], xs[1]))


def test_count_defaults_from_buffer_size_and_dtype(comms):
    bufs = [alloc(c, 40) for c in comms]                 # 10 float32
    for i, b in enumerate(bufs):
        view(b, "float32", 10)[:] = np.arange(10) * (i + 1)
    wait_all([ccl.all_reduce(b, b, comm=c, dtype="float32") for b, c in zip(bufs, comms)])
    for b in bufs:
        np.testing.assert_array_equal(view(b, "float32", 10), np.arange(10) * 3)


def test_interleaved_with_copies_on_the_same_streams(comms):
    """H2D copy -> all_reduce -> D2H copy on each rank's stream, many rounds, no synchronisation in between: the
    collective must see the copy before it and the copy after it must see its result."""
    streams = [paddle_rt.Stream(c.device) for c in comms]
    count = 4099
    bufs = [alloc(c, count * 4) for c in comms]
    rounds = 12
    hosts_in = [[np.full(count, (r + 1) * (i + 1), np.float32) for i in range(len(comms))] for r in range(rounds)]
    hosts_out = [[np.zeros(count, np.float32) for _ in comms] for _ in range(rounds)]
    for r in range(rounds):
        for i, c in enumerate(comms):
            memcpy_async(bufs[i], hosts_in[r][i], count * 4, stream=streams[i])
            ccl.all_reduce(bufs[i], bufs[i], "sum", comm=c, stream=streams[i], dtype="float32")
            memcpy_async(hosts_out[r][i], bufs[i], count * 4, stream=streams[i])
    for s in streams:
        s.synchronize()
    for r in range(rounds):
        for i in range(len(comms)):
            np.testing.assert_array_equal(hosts_out[r][i], np.full(count, 3 * (r + 1), np.float32))
    for s in streams:
        s.close()


@pytest.mark.smoke
def test_default_stream_is_current_stream_of_the_device(comms):
    bufs = [alloc(c, 16) for c in comms]
    for b in bufs:
        view(b, "int32", 4)[:] = 2
    works = [ccl.all_reduce(b, b, "prod", comm=c, dtype="int32") for b, c in zip(bufs, comms)]
    assert all(w.stream is paddle_rt.current_stream(c.device) for w, c in zip(works, comms))
    for c in comms:
        paddle_rt.current_stream(c.device).synchronize()
    assert all(w.done() for w in works)
    for b in bufs:
        np.testing.assert_array_equal(view(b, "int32", 4), [4, 4, 4, 4])


def test_one_thread_per_rank(comms):
    """Each thread issues its rank's sequence of collectives (and p2p in a group) and waits for them."""
    n = len(comms)
    results, failures = {}, []

    def rank_main(i):
        try:
            c = comms[i]
            s = paddle_rt.Stream(c.device)
            a = alloc(c, 64 * 8)
            g = alloc(c, 64 * 8 * n)
            p = alloc(c, 64 * 8)
            out = []
            for step in range(20):
                view(a, "int64", 64)[:] = np.arange(64) + 100 * i + step
                ccl.all_reduce(a, a, "sum", comm=c, stream=s, dtype="int64").wait(timeout=60)
                out.append(view(a, "int64", 64).copy())
                ccl.all_gather(a, g, comm=c, stream=s, dtype="int64").wait(timeout=60)
                out.append(view(g, "int64", 64 * n).copy())
                with ccl.group():
                    w1 = ccl.send(a, (i + 1) % n, comm=c, stream=s, dtype="int64")
                    w2 = ccl.recv(p, (i - 1) % n, comm=c, stream=s, dtype="int64")
                w1.wait(timeout=60)
                w2.wait(timeout=60)
                out.append(view(p, "int64", 64).copy())
            s.synchronize()
            s.close()
            results[i] = out
        except BaseException as exc:   # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=rank_main, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    for step in range(20):
        s = sum(np.arange(64) + 100 * i + step for i in range(n))
        for i in range(n):
            np.testing.assert_array_equal(results[i][3 * step], s)
            np.testing.assert_array_equal(results[i][3 * step + 1], np.concatenate([s] * n))
            np.testing.assert_array_equal(results[i][3 * step + 2], s)


def test_group_of_many_collectives_from_one_thread(comms):
    """Several collectives of every rank inside one group: each stream's share is one group on its worker."""
    n = len(comms)
    a = [alloc(c, 32) for c in comms]
    b = [alloc(c, 32) for c in comms]
    for i in range(n):
        view(a[i], "float32", 8)[:] = i + 1
        view(b[i], "float32", 8)[:] = 10 * (i + 1)
    with ccl.group():
        with ccl.group():       # nested groups join the outer one
            works = [ccl.all_reduce(a[i], a[i], "sum", comm=comms[i], dtype="float32") for i in range(n)]
        works += [ccl.all_reduce(b[i], b[i], "max", comm=comms[i], dtype="float32") for i in range(n)]
        assert all(w.position == 0 for w in works)
        with pytest.raises(paddle_rt.InvalidArgument, match="inside the group"):
            works[0].wait()
    wait_all(works)
    for i in range(n):
        np.testing.assert_array_equal(view(a[i], "float32", 8), np.full(8, 3.0, np.float32))
        np.testing.assert_array_equal(view(b[i], "float32", 8), np.full(8, 20.0, np.float32))


def test_group_that_raises_submits_nothing(comms):
    a = [alloc(c, 16) for c in comms]
    for x in a:
        view(x, "int32", 4)[:] = 1
    with pytest.raises(KeyError):
        with ccl.group():
            ccl.all_reduce(a[0], a[0], comm=comms[0], dtype="int32")
            raise KeyError("stop")
    # the sequences of both ranks still agree: a full round works
    wait_all([ccl.all_reduce(x, x, comm=c, dtype="int32") for x, c in zip(a, comms)])
    for x in a:
        np.testing.assert_array_equal(view(x, "int32", 4), [2, 2, 2, 2])


def test_communicator_from_unique_id_in_two_threads():
    uid = ccl.get_unique_id("rt_cpu:0")
    assert isinstance(bytes(uid), bytes) and len(bytes(uid)) > 0
    comms = [None, None]

    def make(r):
        comms[r] = ccl.Communicator(2, ccl.UniqueId(bytes(uid)), r, f"rt_cpu:{r}")

    ts = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bufs = [alloc(c, 8) for c in comms]
    for i, b in enumerate(bufs):
        view(b, "float64", 1)[:] = i + 0.5
    wait_all([ccl.all_reduce(b, b, "avg", comm=c, dtype="float64") for b, c in zip(bufs, comms)])
    assert [view(b, "float64", 1)[0] for b in bufs] == [1.0, 1.0]
    for c in comms:
        c.destroy()


def test_integer_avg_truncates_toward_zero(comms):
    bufs = [alloc(c, 4 * 4) for c in comms]
    view(bufs[0], "int32", 4)[:] = [3, -3, 4, -8]
    view(bufs[1], "int32", 4)[:] = [0, 0, 1, 1]
    wait_all([ccl.all_reduce(b, b, "avg", comm=c, dtype="int32") for b, c in zip(bufs, comms)])
    for b in bufs:
        np.testing.assert_array_equal(view(b, "int32", 4), [1, -1, 2, -3])


# -- bad paths ---------------------------------------------------------------------------------------------------------
def test_unsupported_dtypes_and_ops_raise_before_queueing(comms):
    a = alloc(comms[0], 64)
    pos = paddle_rt.current_stream(comms[0].device).position
    with pytest.raises(paddle_rt.NotSupportedError, match=r"rt_cpu:0: ccl.all_reduce: complex"):
        ccl.all_reduce(a, a, comm=comms[0], dtype=np.complex64)
    with pytest.raises(paddle_rt.NotSupportedError, match="complex"):
        ccl.broadcast(a, comm=comms[0], dtype="complex128")
    with pytest.raises(paddle_rt.NotSupportedError, match="bool cannot be reduced"):
        ccl.all_reduce(a, a, comm=comms[0], dtype=bool)
    with pytest.raises(paddle_rt.NotSupportedError, match="reduction op 'mean'"):
        ccl.all_reduce(a, a, "mean", comm=comms[0], dtype="float32")
    with pytest.raises(paddle_rt.NotSupportedError, match="unsupported dtype"):
        ccl.all_reduce(a, a, comm=comms[0], dtype="float8")
    with pytest.raises(paddle_rt.InvalidArgument, match="dtype is required"):
        ccl.all_reduce(a, a, comm=comms[0])
    assert paddle_rt.current_stream(comms[0].device).position == pos      # nothing was queued


@pytest.mark.smoke
def test_buffer_too_small_wrong_device_and_bad_arguments(comms):
    small = alloc(comms[0], 10)
    other = alloc(comms[1], 64)
    big = alloc(comms[0], 64)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"rt_cpu:0: ccl.all_reduce: recv has 10 bytes, too small "
                                                        r"for 4 float32 \(16 bytes\)"):
        ccl.all_reduce(big, small, comm=comms[0], count=4, dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="send is memory of rt_cpu:1, but the communicator"):
        ccl.all_reduce(other, big, comm=comms[0], dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match=r"recv has 64 bytes, too small for 2 x 16 float32"):
        ccl.all_gather(big, big, comm=comms[0], count=16, dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="stream .* is on rt_cpu:1"):
        ccl.all_reduce(big, big, comm=comms[0], dtype="float32", stream=paddle_rt.current_stream("rt_cpu:1"))
    with pytest.raises(paddle_rt.InvalidArgument, match="root 2 is not a rank"):
        ccl.broadcast(big, root=2, comm=comms[0], dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="peer -1 is not a rank"):
        ccl.send(big, -1, comm=comms[0], dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="count must be a non-negative int"):
        ccl.all_reduce(big, big, comm=comms[0], count=-1, dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="must be a paddle_rt.Tensor or an Allocation"):
        ccl.all_reduce(np.zeros(4, np.float32), big, comm=comms[0], dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="comm must be a Communicator"):
        ccl.all_reduce(big, big, comm=None, dtype="float32")
    freed = alloc(comms[0], 64)
    freed.free()
    with pytest.raises(paddle_rt.InvalidArgument, match="was freed"):
        ccl.all_reduce(freed, big, comm=comms[0], dtype="float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="in place"):
        ccl.all_to_all(big, big, comm=comms[0], dtype="float32")
    # the communicators still work
    bufs = [alloc(c, 4) for c in comms]
    for b in bufs:
        view(b, "int32", 1)[:] = 5
    wait_all([ccl.all_reduce(b, b, comm=c, dtype="int32") for b, c in zip(bufs, comms)])
    assert [int(view(b, "int32", 1)[0]) for b in bufs] == [10, 10]


def test_comm_init_arguments():
    uid = ccl.get_unique_id()
    with pytest.raises(paddle_rt.InvalidArgument, match="rank 2 is not in 0..1"):
        ccl.Communicator(2, uid, 2, "rt_cpu:0")
    with pytest.raises(paddle_rt.InvalidArgument, match="nranks must be a positive int"):
        ccl.Communicator(0, uid, 0, "rt_cpu:0")
    with pytest.raises(paddle_rt.InvalidArgument, match="unique_id must come from"):
        ccl.Communicator(2, "abc", 0, "rt_cpu:0")
    with pytest.raises(paddle_rt.PluginError, match=r"rt_cpu:0: xccl_comm_init_rank failed with C_ERROR"):
        ccl.Communicator(2, b"\x01" * 32, 0, "rt_cpu:0")      # not an id of this process
    c0 = ccl.Communicator(2, uid, 0, "rt_cpu:0")
    with pytest.raises(paddle_rt.PluginError, match="already taken"):
        ccl.Communicator(2, uid, 0, "rt_cpu:1")
    c0.destroy()
    with pytest.raises(paddle_rt.InvalidArgument, match="appears twice"):
        ccl.comm_init_all(["rt_cpu:0", "rt_cpu:0"])


def test_destroyed_communicator_raises(comms):
    cs = fresh_comms()
    bufs = [alloc(c, 4) for c in cs]
    works = [ccl.all_reduce(b, b, comm=c, dtype="int32") for b, c in zip(bufs, cs)]
    for c in cs:
        c.destroy()                  # waits for the queued collectives first
    assert all(w.done() and w.exception is None for w in works)
    cs[0].destroy()                  # twice: nothing
    with pytest.raises(ccl.CollectiveError, match=r"rt_cpu:0: ccl.all_reduce: the communicator \(rank 0 of 2\) "
                                                  r"was destroyed"):
        ccl.all_reduce(bufs[0], bufs[0], comm=cs[0], dtype="int32")
    with pytest.raises(ccl.CollectiveError, match="destroyed"):
        cs[1].name


def test_mismatched_counts_surface_the_plugin_error_and_put_the_comm_in_error():
    cs = fresh_comms()
    bufs = [alloc(c, 64) for c in cs]
    w0 = ccl.all_reduce(bufs[0], bufs[0], comm=cs[0], count=4, dtype="float32")
    w1 = ccl.all_reduce(bufs[1], bufs[1], comm=cs[1], count=5, dtype="float32")
    for w in (w0, w1):
        with pytest.raises(ccl.CollectiveError) as ei:
            w.wait(timeout=60)
        msg = str(ei.value)
        assert "all_reduce #0" in msg and "arguments differ" in msg
        assert "rank 0: all_reduce count=4 float32" in msg and "rank 1: all_reduce count=5 float32" in msg
        assert ei.value.collective == "all_reduce"
    # the error is also pending on the stream (taken off by wait): synchronize is clean now
    paddle_rt.current_stream(cs[0].device).synchronize()
    assert cs[0].error is not None
    with pytest.raises(ccl.CollectiveError, match="is in error since"):
        ccl.all_reduce(bufs[0], bufs[0], comm=cs[0], dtype="float32")
    for c in cs:
        c.destroy()


def test_mismatched_dtypes_reported_by_stream_synchronize():
    cs = fresh_comms()
    bufs = [alloc(c, 64) for c in cs]
    ccl.all_reduce(bufs[0], bufs[0], comm=cs[0], count=4, dtype="float32")
    ccl.all_reduce(bufs[1], bufs[1], comm=cs[1], count=4, dtype="int32")
    with pytest.raises(paddle_rt.StreamError, match="arguments differ") as ei:
        paddle_rt.current_stream(cs[1].device).synchronize()
    assert isinstance(ei.value.__cause__, ccl.CollectiveError)
    with pytest.raises(paddle_rt.StreamError):
        paddle_rt.current_stream(cs[0].device).synchronize()
    for c in cs:
        c.destroy()


def test_python_timeout_names_the_missing_rank_then_completes_when_it_joins():
    cs = fresh_comms()
    bufs = [alloc(c, 8) for c in cs]
    for b in bufs:
        view(b, "int32", 2)[:] = 7
    w0 = ccl.all_reduce(bufs[0], bufs[0], comm=cs[0], dtype="int32")
    with pytest.raises(ccl.CollectiveTimeout, match=r"rt_cpu:0: ccl.all_reduce #0 \(rank 0 of 2\) did not complete "
                                                    r"within 0.2 s: rank\(s\) \[1\] never called it") as ei:
        w0.wait(timeout=0.2)
    assert ei.value.missing_ranks == [1]
    assert isinstance(ei.value, TimeoutError)
    w1 = ccl.all_reduce(bufs[1], bufs[1], comm=cs[1], dtype="int32")
    wait_all([w0, w1])
    assert [view(b, "int32", 2).tolist() for b in bufs] == [[14, 14], [14, 14]]
    for c in cs:
        c.destroy()


def test_python_timeout_names_a_rank_whose_stream_is_behind():
    cs = fresh_comms()
    bufs = [alloc(c, 8) for c in cs]
    gate = threading.Event()
    s1 = paddle_rt.Stream(cs[1].device)
    s1.add_callback(gate.wait, 30)                 # rank 1's stream is busy
    w0 = ccl.all_reduce(bufs[0], bufs[0], comm=cs[0], dtype="int32")
    w1 = ccl.all_reduce(bufs[1], bufs[1], comm=cs[1], dtype="int32", stream=s1)
    with pytest.raises(ccl.CollectiveTimeout, match=r"rank\(s\) \[1\] called it but their streams had not"):
        w0.wait(timeout=0.2)
    gate.set()
    wait_all([w0, w1])
    s1.close()
    for c in cs:
        c.destroy()


def test_p2p_timeout_names_the_peer():
    cs = fresh_comms()
    b = alloc(cs[0], 8)
    w = ccl.send(b, 1, comm=cs[0], dtype="int32")
    with pytest.raises(ccl.CollectiveTimeout, match=r"rank 1 never called the matching recv"):
        w.wait(timeout=0.1)
    r = alloc(cs[1], 8)
    wr = ccl.recv(r, 0, comm=cs[1], dtype="int32")
    wait_all([w, wr])
    for c in cs:
        c.destroy()


# -- other device counts and process-level behaviour (child processes) ------------------------------------------------
_MATRIX_CHILD = """
import sys
sys.path.insert(0, {here!r})
import paddle_rt
from paddle_rt import ccl
import test_ccl as T
n = paddle_rt.device_count()
assert n == {n}, n
comms = ccl.comm_init_all([f"rt_cpu:{{i}}" for i in range(n)])
checked = T.check_matrix(comms, [0, 1, 5, 257]) + T.check_v(comms)
for c in comms:
    c.destroy()
print("CHECKED", checked)
"""


@pytest.mark.parametrize("n", [3, 4])
def test_every_collective_op_dtype_on_more_devices(run_python, n):
    res = run_python(_MATRIX_CHILD.format(here=HERE, n=n), env={"RT_CPU_DEVICE_COUNT": n}, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "CHECKED" in res.stdout and int(res.stdout.split("CHECKED")[1]) > 1000


def test_plugin_timeout_marks_the_comm_in_error_and_names_missing_ranks(run_python):
    code = """
    import numpy as np, paddle_rt
    from paddle_rt import ccl
    comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1", "rt_cpu:2"])
    bufs = [paddle_rt.malloc(16, device=c.device) for c in comms]
    ws = [ccl.all_reduce(bufs[i], bufs[i], comm=comms[i], dtype="float32") for i in (0, 1)]   # rank 2 never joins
    for w in ws:
        try:
            w.wait()
        except ccl.CollectiveError as e:
            print("ERR", type(e).__name__, e.missing_ranks, "|", e)
    try:
        ccl.all_reduce(bufs[0], bufs[0], comm=comms[0], dtype="float32")
    except ccl.CollectiveError as e:
        print("LATER", e)
    for c in comms:
        c.destroy()
    print("DONE")
    """
    res = run_python(code, env={"RT_CPU_DEVICE_COUNT": 3, "RT_CPU_CCL_TIMEOUT_MS": 300}, timeout=120)
    assert res.returncode == 0, res.stderr[-4000:]
    errs = [line for line in res.stdout.splitlines() if line.startswith("ERR")]
    assert len(errs) == 2, res.stdout
    for line in errs:
        assert "ERR CollectiveError [2]" in line
        assert "ccl.all_reduce #0" in line and "rank(s) [2] never called it" in line
        assert "peers did not join within the plugin's time limit" in line
    assert "LATER rt_cpu:0: ccl.all_reduce: the communicator (rank 0 of 3) is in error since" in res.stdout
    assert "DONE" in res.stdout


def test_live_communicators_and_pending_work_at_exit(run_python):
    code = """
    import numpy as np, paddle_rt
    from paddle_rt import ccl
    comms = ccl.comm_init_all()
    bufs = [paddle_rt.malloc(1 << 20, device=c.device) for c in comms]
    for _ in range(5):
        for b, c in zip(bufs, comms):
            ccl.all_reduce(b, b, comm=c, dtype="float32")
    print("EXIT")
    """
    res = run_python(code, timeout=120)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "EXIT" in res.stdout
    assert "paddle_rt:" not in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("name", ["bfloat16", "float16", "int64", "uint8"])
def test_large_reductions_span_many_chunks(comms, name):
    """Counts far above rt_cpu's reduction chunk (64 KiB), odd tails, in place and out of place, all_reduce and
    reduce."""
    check_matrix(comms, [100_003], dtypes=[name], ops=["sum", "avg", "max"], seed=7)


# From 256 KiB per rank, rt_cpu's ranks compute an all_reduce/reduce together (each worker thread reduces slices of
# the element range and writes them to every output); these counts take that path for every dtype (odd tails).
SHARED_COUNT = (1 << 18) + 2053


@pytest.mark.parametrize("name", ALL_TYPES)
def test_shared_large_reductions_every_dtype_and_op(comms, name):
    """Same results as the reference for every op, in place and out of place, all_reduce and reduce to a root."""
    assert check_matrix(comms, [SHARED_COUNT], dtypes=[name], seed=11) > 0


def test_shared_large_reductions_on_three_devices(run_python):
    code = f"""
    import sys
    sys.path.insert(0, {HERE!r})
    import paddle_rt
    from paddle_rt import ccl
    import test_ccl as T
    comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1", "rt_cpu:2"])
    checked = T.check_matrix(comms, [T.SHARED_COUNT], dtypes=["float32", "bfloat16", "int8", "float64"])
    for c in comms:
        c.destroy()
    print("CHECKED", checked)
    """
    res = run_python(code, env={"RT_CPU_DEVICE_COUNT": 3}, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert int(res.stdout.split("CHECKED")[1]) > 100


def test_group_of_large_reductions_from_one_thread(comms):
    """Two large all_reduces per rank in one group (one stream operation per rank holding both): every rank's
    worker helps with whichever of them it waits for, and both complete."""
    n = len(comms)
    count = 3 << 18
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in comms]
    a = [alloc(c, count * 4) for c in comms]
    b = [alloc(c, count * 4) for c in comms]
    for i in range(n):
        put(a[i], xs[i])
        put(b[i], xs[i])
    with ccl.group():
        works = [ccl.all_reduce(a[i], a[i], "sum", comm=comms[i], dtype="float32") for i in range(n)]
        works += [ccl.all_reduce(b[i], b[i], "min", comm=comms[i], dtype="float32") for i in range(n)]
    wait_all(works)
    for i in range(n):
        np.testing.assert_array_equal(view(a[i], "float32", count), reduce_ref("sum", xs, "float32"))
        np.testing.assert_array_equal(view(b[i], "float32", count), reduce_ref("min", xs, "float32"))


def test_large_mismatched_counts_fail_and_leave_outputs_untouched():
    cs = fresh_comms()
    count = 1 << 20
    sends = [alloc(c, (count + 1) * 4) for c in cs]
    recvs = [alloc(c, (count + 1) * 4) for c in cs]
    for s, r in zip(sends, recvs):
        np.asarray(s)[:] = 1
        np.asarray(r)[:] = 0x5A
    works = [ccl.all_reduce(sends[i], recvs[i], comm=cs[i], count=count + i, dtype="float32") for i in range(2)]
    for w in works:
        with pytest.raises(ccl.CollectiveError, match="arguments differ"):
            w.wait(timeout=60)
    assert all((np.asarray(r) == 0x5A).all() for r in recvs)
    for c in cs:
        c.destroy()


def test_buffers_are_kept_alive_until_the_collective_ran_then_released(comms):
    import gc
    import weakref

    gate = threading.Event()
    s0 = paddle_rt.Stream(comms[0].device)
    s0.add_callback(gate.wait, 30)                  # rank 0's collective cannot run yet
    a = [alloc(c, 4096) for c in comms]
    for i in range(2):
        view(a[i], "float32", 1024)[:] = 1
    refs = [weakref.ref(a[i]) for i in range(2)]
    works = [ccl.all_reduce(a[0], a[0], comm=comms[0], stream=s0, dtype="float32"),
             ccl.all_reduce(a[1], a[1], comm=comms[1], dtype="float32")]
    out = [view(x, "float32", 1024) for x in a]      # views keep the memory readable for the check below
    del a
    gc.collect()
    assert all(r() is not None for r in refs)       # held by the queued work
    gate.set()
    wait_all(works)
    assert all((o == 2).all() for o in out)
    del out
    gc.collect()
    assert all(r() is None for r in refs)           # released once it ran
    s0.close()


def test_work_wait_from_its_streams_callback_is_an_error_not_a_deadlock(run_python):
    """The issue-13 repro: a callback on rank 0's stream waits for an all_reduce queued after it on the same stream.
    The guard must see the stream module's worker identity (it used to read a never-set copy of its own): StreamError
    at once, for the default timeout=None (which used to hang) and for timeout=3 (which used to time out)."""
    res = run_python("""
        import threading, numpy as np, paddle_rt
        from paddle_rt import ccl
        comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
        bufs = [paddle_rt.malloc(64, device=c.device) for c in comms]
        streams = [paddle_rt.Stream(c.device) for c in comms]
        works, caught = [], []
        queued = threading.Event()       # the callback waits until the host has queued the collective behind it
        def cb(timeout):
            queued.wait(30)
            try:
                works[0].wait(timeout=timeout) if timeout else works[0].wait()
                caught.append("returned")
            except paddle_rt.StreamError as exc:
                caught.append("StreamError: " + str(exc))
            except Exception as exc:
                caught.append(type(exc).__name__)
        for timeout in (None, 3):
            works.clear()
            queued.clear()
            streams[0].add_callback(cb, timeout)
            works.extend(ccl.all_reduce(b, b, "sum", comm=c, stream=s, dtype="float32")
                         for b, c, s in zip(bufs, comms, streams))
            queued.set()
            for w in works:
                w.wait(timeout=30)
        print("CAUGHT", caught)
        del bufs
        for c in comms:
            c.destroy()
    """, timeout=60)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.count("StreamError:") == 2 and "would deadlock" in out, out
    assert "returned" not in out and "CollectiveTimeout" not in out


def test_fork_child_refuses_the_parents_communicators(run_python):
    """Issue 46 item 7: in a child of fork() a collective on the parent's communicator raises ForkError, before and
    after reinitialize_after_fork (it used to be queued after reinitialize and wait for a peer rank that is in the
    parent, then the child's synchronize waited with it); destroying it forgets it; new communicators work."""
    code = r"""
import os, numpy as np, paddle_rt
from paddle_rt import ccl
comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
x = paddle_rt.tensor(np.ones(4, np.float32), device="rt_cpu:0")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    import faulthandler
    faulthandler.dump_traceback_later(20, exit=True)
    out = []
    for phase in ("before", "after"):
        try:
            ccl.all_reduce(x, x, comm=comms[0])
            out.append(phase + ":ran")
        except paddle_rt.ForkError:
            out.append(phase + ":ForkError")
        if phase == "before":
            paddle_rt.reinitialize_after_fork()
    comms[0].destroy()
    paddle_rt.synchronize()
    mine = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
    streams = [paddle_rt.Stream(c.device) for c in mine]
    ys = [paddle_rt.tensor(np.full(4, i + 1, np.float32), device=c.device, stream=s)
          for i, (c, s) in enumerate(zip(mine, streams))]
    for wk in [ccl.all_reduce(y, y, comm=c, stream=s) for y, c, s in zip(ys, mine, streams)]:
        wk.wait(timeout=30)
    out.append("mine:%d" % ys[0].numpy()[0])
    os.write(w, " ".join(out).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print("CHILD", os.read(r, 200).decode())
"""
    res = run_python(code, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "CHILD before:ForkError after:ForkError mine:3" in res.stdout, (res.stdout, res.stderr)
