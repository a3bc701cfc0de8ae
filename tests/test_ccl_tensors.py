"""Collectives on paddle_rt.Tensor (dtype and count from the tensor, recorded on the collective's stream), and the
end of a communicator after a failure: abort, destroy and interpreter exit return promptly."""

import numpy as np
import pytest

import paddle_rt
from paddle_rt import ccl
from test_ccl import comms  # noqa: F401  (the two-device communicators fixture)


def on(c, arr):
    return paddle_rt.tensor(np.ascontiguousarray(arr), device=c.device)


def run(comms, fn):
    """fn(rank, comm) -> Work or list of Works, for every rank; waits for all."""
    works = []
    with ccl.group():
        for r, c in enumerate(comms):
            w = fn(r, c)
            works.extend(w if isinstance(w, list) else [w])
    for w in works:
        w.wait(timeout=60)


@pytest.mark.parametrize("dtype", ["float32", "int64", "float16", "bfloat16", "uint8"])
def test_every_collective_takes_tensors_with_their_dtype_and_count(comms, dtype):
    n = len(comms)
    rng = np.random.default_rng(7)
    npdt = np.float32 if dtype == "bfloat16" else np.dtype(dtype)

    def data(shape, r):
        return (rng.integers(0, 5, size=shape) + r).astype(npdt)

    xs = [data((2, 3), r) for r in range(n)]
    send = [paddle_rt.tensor(xs[r], dtype=dtype, device=c.device) for r, c in enumerate(comms)]
    assert send[0].dtype == dtype
    out = [paddle_rt.empty((2, 3), dtype=dtype, device=c.device) for c in comms]
    run(comms, lambda r, c: ccl.all_reduce(send[r], out[r], "sum", comm=c))          # no dtype, no count
    want = sum(x.astype(np.float64) for x in xs)
    for o in out:
        np.testing.assert_allclose(o.numpy().astype(np.float64), want.astype(npdt).astype(np.float64), rtol=1e-2)
    gathered = [paddle_rt.empty((n, 2, 3), dtype=dtype, device=c.device) for c in comms]
    run(comms, lambda r, c: ccl.all_gather(send[r], gathered[r], comm=c))
    for g in gathered:
        np.testing.assert_array_equal(g.numpy().astype(np.float64), np.stack(xs).astype(np.float64))
    bc = [paddle_rt.empty((2, 3), dtype=dtype, device=c.device) for c in comms]
    run(comms, lambda r, c: ccl.broadcast(send[r] if r == 1 else bc[r], root=1, comm=c))
    np.testing.assert_array_equal(bc[0].numpy().astype(np.float64), xs[1].astype(np.float64))
    part = [paddle_rt.empty((1, 3), dtype=dtype, device=c.device) for c in comms]
    src = [paddle_rt.tensor(data((n, 3), r), dtype=dtype, device=c.device) for r, c in enumerate(comms)]
    run(comms, lambda r, c: ccl.reduce_scatter(src[r], part[r], "max", comm=c))
    full = np.maximum(src[0].numpy().astype(np.float64), src[1].numpy().astype(np.float64))
    for r in range(n):
        np.testing.assert_array_equal(part[r].numpy().astype(np.float64)[0], full[r])
    a2a = [paddle_rt.empty((n, 3), dtype=dtype, device=c.device) for c in comms]
    run(comms, lambda r, c: ccl.all_to_all(src[r], a2a[r], comm=c))
    for r in range(n):
        want = np.stack([src[p].numpy()[r] for p in range(n)])
        np.testing.assert_array_equal(a2a[r].numpy().astype(np.float64), want.astype(np.float64))
    got = paddle_rt.empty((2, 3), dtype=dtype, device=comms[1].device)
    run(comms, lambda r, c: ccl.send(send[0], 1, comm=c) if r == 0 else ccl.recv(got, 0, comm=c))
    np.testing.assert_array_equal(got.numpy().astype(np.float64), xs[0].astype(np.float64))
    red = paddle_rt.empty((2, 3), dtype=dtype, device=comms[0].device)
    run(comms, lambda r, c: ccl.reduce(send[r], red if r == 0 else None, "min", root=0, comm=c))
    np.testing.assert_array_equal(red.numpy().astype(np.float64),
                                  np.minimum(*[s.numpy().astype(np.float64) for s in send]))


@pytest.mark.smoke
def test_tensor_written_by_a_collective_is_waited_for_by_numpy(comms):
    """The collective is recorded as the tensor's writer, as operators are: numpy() waits for it (no Work.wait)."""
    ts = [on(c, np.full(1000, r + 1, np.float32)) for r, c in enumerate(comms)]
    side = paddle_rt.Stream(comms[0].device)            # another stream than the tensor's own
    w0 = ccl.all_reduce(ts[0], ts[0], "sum", comm=comms[0], stream=side)
    ccl.all_reduce(ts[1], ts[1], "sum", comm=comms[1])
    np.testing.assert_array_equal(ts[0].numpy(), np.full(1000, 3, np.float32))
    np.testing.assert_array_equal(ts[1].numpy(), np.full(1000, 3, np.float32))
    assert w0.done()


def test_in_place_tensor_and_explicit_matching_dtype(comms):
    ts = [on(c, np.arange(4, dtype=np.int32) * (r + 1)) for r, c in enumerate(comms)]
    run(comms, lambda r, c: ccl.all_reduce(ts[r], ts[r], "prod", comm=c, dtype="int32", count=3))
    assert ts[0].numpy().tolist() == [0, 2, 8, 3]       # count=3 of 4 elements: the last keeps its 3


def test_allocations_still_need_an_explicit_dtype(comms):
    a = paddle_rt.malloc(16, device=comms[0].device)
    with pytest.raises(paddle_rt.InvalidArgument, match="dtype is required"):
        ccl.all_reduce(a, a, comm=comms[0])


def test_non_contiguous_tensor_is_refused_naming_its_layout(comms):
    t = on(comms[0], np.zeros((4, 6), np.float32))
    col = t[:, 1]
    assert not col.is_contiguous()
    with pytest.raises(paddle_rt.InvalidArgument,
                       match=r"rt_cpu:0: ccl.all_reduce: send is a non-contiguous Tensor \(shape \(4,\), strides "
                             r"\(6,\) elements, float32\).*send.contiguous\(\)"):
        ccl.all_reduce(col, t, comm=comms[0])
    with pytest.raises(paddle_rt.InvalidArgument, match=r"ccl.broadcast: buf is a non-contiguous Tensor"):
        ccl.broadcast(t.T, comm=comms[0])


def test_tensor_dtype_conflicts_and_wrong_device_are_refused(comms):
    f = on(comms[0], np.zeros(4, np.float32))
    i = on(comms[0], np.zeros(4, np.int32))
    with pytest.raises(paddle_rt.InvalidArgument, match=r"the tensors' dtypes differ \(send is float32, recv is "
                                                        r"int32\)"):
        ccl.all_reduce(f, i, comm=comms[0])
    with pytest.raises(paddle_rt.InvalidArgument, match=r"dtype='int32' but send is a float32 Tensor"):
        ccl.all_reduce(f, f, comm=comms[0], dtype="int32")
    with pytest.raises(paddle_rt.InvalidArgument, match=r"send is a Tensor of rt_cpu:0, but the communicator "
                                                        r"\(rank 1\) is on rt_cpu:1"):
        ccl.all_reduce(f, f, comm=comms[1])
    with pytest.raises(paddle_rt.NotSupportedError, match="bool cannot be reduced"):
        b = paddle_rt.tensor(np.zeros(4, bool), device=comms[0].device)
        ccl.all_reduce(b, b, comm=comms[0])


class _LooksLikeAllocation:
    def __init__(self, ptr, size, device):
        self.ptr, self.size, self.device = ptr, size, device


def test_allocation_lookalike_is_bounded_by_the_allocation_it_points_into(comms):
    """Only a real Allocation is trusted for its size: an object with ptr/size/device whose size overstates the
    memory, or whose ptr is in no live allocation, is refused before any rank runs (issue 35)."""
    a = paddle_rt.malloc(64, device=comms[0].device)
    fake = _LooksLikeAllocation(a.ptr, 1 << 30, a.device)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"ccl.all_reduce: .*send"):
        ccl.all_reduce(fake, fake, count=1 << 20, dtype="float32", comm=comms[0])
    nowhere = _LooksLikeAllocation(0x1000, 64, a.device)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"send at 0x1000 is not inside a live allocation on rt_cpu:0"):
        ccl.all_reduce(nowhere, a, count=16, dtype="float32", comm=comms[0])


# -- the end of a communicator after a failure (issue 27, item 5) -------------------------------------------------------
def test_destroy_after_a_timed_out_wait_aborts_instead_of_waiting_for_the_plugin():
    cs = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
    b = paddle_rt.malloc(16, device=cs[0].device)
    w = ccl.all_reduce(b, b, comm=cs[0], dtype="float32")     # rank 1 never joins
    with pytest.raises(ccl.CollectiveTimeout) as ei:
        w.wait(timeout=0.3)
    assert ei.value.missing_ranks == [1]
    cs[0].destroy()                                           # RT_CPU_CCL_TIMEOUT_MS is 30 s by default
    # the order of events, not the time taken: when destroy returns, the collective is over, and it ended by the abort
    # destroy made (its reason), not by the plugin's time limit
    assert w.done()
    with pytest.raises(ccl.CollectiveError) as ei:
        w.wait()
    assert "aborted" in str(ei.value) and "time" not in str(ei.value).split("aborted")[0], str(ei.value)
    cs[1].destroy()


@pytest.mark.smoke
def test_abort_fails_the_waiting_collective_and_puts_the_comm_in_error():
    cs = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
    b = paddle_rt.malloc(16, device=cs[0].device)
    w = ccl.all_reduce(b, b, comm=cs[0], dtype="float32")
    assert cs[0].abort() is True
    with pytest.raises(ccl.CollectiveError, match=r"ccl.all_reduce #0 \(rank 0 of 2\) failed: the communicator was "
                                                  r"aborted"):
        w.wait(timeout=10)
    with pytest.raises(ccl.CollectiveError, match="was aborted"):
        ccl.all_reduce(b, b, comm=cs[0], dtype="float32")
    for c in cs:
        c.destroy()
    assert cs[0].abort() is False                             # destroyed: nothing to abort


def test_exit_after_a_timed_out_collective_is_prompt_and_quiet(run_python):
    """A process that caught CollectiveTimeout exits without waiting for the plugin's limit (an hour here: waiting
    would end in run_python's TimeoutExpired), without an error at exit (before: it waited for the limit, then printed
    the collective's failure)."""
    res = run_python("""
        import paddle_rt
        from paddle_rt import ccl
        comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
        b = paddle_rt.malloc(16, device=comms[0].device)
        try:
            ccl.all_reduce(b, b, comm=comms[0], dtype="float32").wait(1)
        except ccl.CollectiveTimeout as e:
            print("TIMEOUT", e.missing_ranks)
    """, env={"RT_CPU_CCL_TIMEOUT_MS": 3600000}, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "TIMEOUT [1]" in res.stdout
    assert "at exit" not in res.stderr, res.stderr


def test_variable_count_collectives_take_tensors(comms):
    counts = [2, 3]
    parts = [on(c, np.arange(counts[r], dtype=np.float64) + 10 * r) for r, c in enumerate(comms)]
    outs = [paddle_rt.empty(sum(counts), dtype="float64", device=c.device) for c in comms]
    run(comms, lambda r, c: ccl.all_gather_v(parts[r], outs[r], counts, comm=c))
    for o in outs:
        assert o.numpy().tolist() == [0.0, 1.0, 10.0, 11.0, 12.0]
    full = [on(c, np.arange(5, dtype=np.int32) * (r + 1)) for r, c in enumerate(comms)]
    mine = [paddle_rt.empty(counts[r], dtype="int32", device=c.device) for r, c in enumerate(comms)]
    run(comms, lambda r, c: ccl.reduce_scatter_v(full[r], mine[r], counts, "sum", comm=c))
    assert mine[0].numpy().tolist() == [0, 3] and mine[1].numpy().tolist() == [6, 9, 12]
