"""paddle_rt._core.memcpy: copies of every kind, memset, stream order, concurrency, keep-alive, bad input."""
import threading
import weakref

import numpy as np
import pytest

import paddle_rt
from paddle_rt import Stream, InvalidArgument, StreamError

from memory_helpers import give_memory_back


@pytest.fixture(autouse=True)
def _give_memory_back():
    yield
    give_memory_back()


N = 4096


@pytest.fixture
def host():
    return np.arange(N, dtype=np.uint32).view(np.uint8)[:N].copy()


@pytest.mark.smoke
def test_sync_copies_every_kind(host):
    a, b = paddle_rt.malloc(N), paddle_rt.malloc(N)
    c = paddle_rt.malloc(N, device="rt_cpu:1")
    out = np.zeros(N, np.uint8)
    paddle_rt.memcpy(a, host)            # H2D
    paddle_rt.memcpy(b, a)               # D2D
    paddle_rt.memcpy(c, b)               # P2P
    paddle_rt.memcpy(out, c)             # D2H
    assert (out == host).all()
    out2 = bytearray(N)
    paddle_rt.memcpy(out2, out)          # H2H
    assert bytes(out2) == host.tobytes()


def test_raw_pointers_need_kind_and_use_device(host):
    a = paddle_rt.malloc(N, device="rt_cpu:1")
    with pytest.raises(InvalidArgument, match="explicit kind"):
        paddle_rt.memcpy(a.ptr, host)
    paddle_rt.memcpy(a.ptr, host, kind="H2D", device="rt_cpu:1")
    out = np.zeros(N, np.uint8)
    paddle_rt.memcpy(out, a.ptr, nbytes=N, kind=2, device="rt_cpu:1")   # InfiniRT's D2H = 2
    assert (out == host).all()


@pytest.mark.smoke
def test_raw_addresses_bounded_by_their_allocation(host):
    """A raw address is trusted no further than the live allocation holding it (issue 35: a raw address with an
    oversized nbytes wrote past its allocation, or segfaulted in the plugin). Nothing is copied or set when refused."""
    a = paddle_rt.malloc(64)
    paddle_rt.memset(a, 7)
    big = np.zeros(1 << 20, np.uint8)
    with pytest.raises(InvalidArgument, match=r"memcpy: nbytes=1048576 is larger than dst: \d+ bytes lie between "
                                              r"address 0x[0-9a-f]+ and the end of the allocation holding it "
                                              r"\(on rt_cpu:0\)"):
        paddle_rt.memcpy(a.ptr + 8, big, kind="H2D")
    with pytest.raises(InvalidArgument, match=r"larger than src"):
        paddle_rt.memcpy(big, a.ptr, nbytes=big.nbytes, kind="D2H")
    with pytest.raises(InvalidArgument, match=r"memset: nbytes=268435456 is larger than dst"):
        paddle_rt.memset(a.ptr, 0, 1 << 28)
    s = Stream()
    with pytest.raises(InvalidArgument, match=r"memset_async: nbytes=268435456 is larger than dst"):
        paddle_rt.memset_async(a.ptr, 0, 1 << 28, stream=s)
    with pytest.raises(InvalidArgument, match=r"rt_cpu:0: memcpy: dst address 0x1000 is not inside a live "
                                              r"allocation \(memory on rt_cpu:0\)"):
        paddle_rt.memcpy(0x1000, host, kind="H2D")
    with pytest.raises(InvalidArgument, match=r"memcpy: src address 0x1000 is not inside a live allocation "
                                              r"\(pinned host memory\)"):
        paddle_rt.memcpy(np.zeros(8, np.uint8), 0x1000, nbytes=8, kind="H2H")
    freed = paddle_rt.malloc(64)
    ptr = freed.ptr
    freed.free()
    with pytest.raises(InvalidArgument, match=r"memset: dst address 0x[0-9a-f]+ is not inside a live allocation"):
        paddle_rt.memset(ptr, 0, 8)
    if paddle_rt.device_count("rt_cpu") > 1:
        other = paddle_rt.malloc(64, device="rt_cpu:1")
        with pytest.raises(InvalidArgument, match=r"rt_cpu:0: memset: .* it lies in memory of rt_cpu:1"):
            paddle_rt.memset(other.ptr + 8, 0, 8, device="rt_cpu:0")
    out = np.zeros(64, np.uint8)
    paddle_rt.memcpy(out, a)
    assert (out == 7).all()                       # nothing was written by the refused calls
    # inside the allocation, up to its end: accepted (a tensor view's data_ptr is such an address)
    paddle_rt.memcpy(a.ptr + 8, host[:56], kind="H2D")
    paddle_rt.memcpy(out[:56], a.ptr + 8, nbytes=56, kind="D2H")
    assert (out[:56] == host[:56]).all()
    # pinned host memory may be given as a raw address too
    p = paddle_rt.malloc_host(32)
    paddle_rt.memcpy(p.ptr, host[:32], kind="H2H")
    assert bytes(memoryview(p)) == host[:32].tobytes()


@pytest.mark.smoke
def test_raw_addresses_bounded_by_the_bytes_requested(host):
    """Issue 46 item 9: raw addresses were bounded by the rounded block (raw_malloc(60) accepted a 64-byte write);
    the bound is the bytes asked for, and a pool block reused for a larger request (same rounded size) is bounded by
    the new request."""
    p = paddle_rt.raw_malloc(60)
    try:
        with pytest.raises(InvalidArgument, match=r"memcpy: nbytes=64 is larger than dst: 60 bytes lie between"):
            paddle_rt.memcpy(p, host[:64], kind="H2D")
        with pytest.raises(InvalidArgument, match=r"memset: nbytes=61 is larger than dst: 4 bytes lie between"):
            paddle_rt.memset(p + 56, 0, 61)
        with pytest.raises(InvalidArgument, match=r"memset: dst address 0x[0-9a-f]+ is not inside a live alloc"):
            paddle_rt.memset(p + 64, 0, 4)            # in the block's rounding: no allocation's bytes
        paddle_rt.memcpy(p, host[:60], kind="H2D")    # exactly the bytes asked for
        paddle_rt.memset(p + 60, 0, 0)                # the end itself: an empty range
        out = np.zeros(60, np.uint8)
        paddle_rt.memcpy(out, p, nbytes=60, kind="D2H")
        assert (out == host[:60]).all()
    finally:
        paddle_rt.raw_free(p)
    z = paddle_rt.raw_malloc(0)                       # malloc(0): its address holds an empty range
    paddle_rt.memset(z, 0, 0)
    with pytest.raises(InvalidArgument, match=r"memset: nbytes=1 is larger than dst: 0 bytes"):
        paddle_rt.memset(z, 0, 1)
    paddle_rt.raw_free(z)
    s = Stream()
    small = paddle_rt.empty((4,), "uint8", stream=s)
    ptr = small.data_ptr
    del small                                         # its block waits in the pool for a request of its size
    s.synchronize()
    big = paddle_rt.empty((200,), "uint8", stream=s)
    assert big.data_ptr == ptr                        # the same block (one rounded size), reused
    paddle_rt.memcpy(big.data_ptr, host[:200], kind="H2D")      # bounded by 200, not by the 4 asked before
    with pytest.raises(InvalidArgument, match=r"nbytes=201 is larger than dst: 200 bytes"):
        paddle_rt.memcpy(big.data_ptr, host[:201], kind="H2D")
    s.synchronize()
    assert (big.numpy() == host[:200]).all()
    del big
    s.close()


class _LooksLikeAllocation:
    def __init__(self, ptr, size, device):
        self.ptr, self.size, self.device = ptr, size, device


def test_allocation_lookalike_is_bounded_too(host):
    """Any object with ptr, size and a paddle_rt device is accepted as memory, but only a real Allocation is trusted
    for its size: a look-alike is bounded by the allocation its ptr points into."""
    a = paddle_rt.malloc(64)
    fake = _LooksLikeAllocation(a.ptr, 1 << 30, a.device)
    with pytest.raises(InvalidArgument, match="larger than dst"):
        paddle_rt.memcpy(fake, np.zeros(1 << 20, np.uint8), nbytes=1 << 20)
    nowhere = _LooksLikeAllocation(0x1000, 64, a.device)
    with pytest.raises(InvalidArgument, match="not inside a live allocation"):
        paddle_rt.memcpy(nowhere, host[:64])
    paddle_rt.memcpy(_LooksLikeAllocation(a.ptr, 64, a.device), host[:64])
    out = np.zeros(64, np.uint8)
    paddle_rt.memcpy(out, a)
    assert (out == host[:64]).all()


def test_kind_contradicting_arguments_is_rejected(host):
    a = paddle_rt.malloc(N)
    with pytest.raises(InvalidArgument, match="contradicts"):
        paddle_rt.memcpy(a, host, kind="D2H")
    with pytest.raises(InvalidArgument, match="unknown kind"):
        paddle_rt.memcpy(a, host, kind="X2Y")


def test_sizes_are_checked(host):
    a = paddle_rt.malloc(N)
    small = paddle_rt.malloc(16)
    with pytest.raises(InvalidArgument, match="give nbytes"):
        paddle_rt.memcpy(small, a)
    with pytest.raises(InvalidArgument, match="larger than dst"):
        paddle_rt.memcpy(small, a, nbytes=17)
    paddle_rt.memcpy(small, a, nbytes=16)
    with pytest.raises(InvalidArgument, match="non-negative"):
        paddle_rt.memcpy(a, host, nbytes=-1)


def test_bad_endpoints(host):
    a = paddle_rt.malloc(N)
    with pytest.raises(InvalidArgument, match="host buffer"):
        paddle_rt.memcpy(bytes(N), a)          # read-only destination
    with pytest.raises(InvalidArgument):
        paddle_rt.memcpy(a, "text")
    with pytest.raises(InvalidArgument, match="not a valid pointer"):
        paddle_rt.memcpy(0, host, kind="H2D")
    a.free()
    with pytest.raises(InvalidArgument, match="freed"):
        paddle_rt.memcpy(a, host)


def test_memset_sync_and_async():
    a = paddle_rt.malloc(N)
    out = np.zeros(N, np.uint8)
    paddle_rt.memset(a, 0xAB)
    paddle_rt.memcpy(out, a)
    assert (out == 0xAB).all()
    with Stream() as s:
        paddle_rt.memset_async(a, 5, nbytes=10, stream=s)
        paddle_rt.memcpy_async(out, a, stream=s)
        s.synchronize()
    assert (out[:10] == 5).all() and (out[10:] == 0xAB).all()
    with pytest.raises(InvalidArgument, match="byte"):
        paddle_rt.memset(a, 256)
    h = bytearray(8)
    paddle_rt.memset(h, 1)
    assert h == b"\x01" * 8


def test_async_copies_keep_stream_order_under_delay(run_python):
    res = run_python("""
        import numpy as np, paddle_rt
        n = 1 << 16
        s = paddle_rt.Stream()
        a, b, c = (paddle_rt.malloc(n) for _ in range(3))
        outb, outc = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        for _ in range(3):
            paddle_rt.memset_async(a, 1, stream=s)
            paddle_rt.memcpy_async(b, a, stream=s)
            paddle_rt.memset_async(a, 2, stream=s)
            paddle_rt.memcpy_async(c, a, stream=s)
            paddle_rt.memcpy_async(outb, b, stream=s)
            paddle_rt.memcpy_async(outc, c, stream=s)
            s.synchronize()
            assert (outb == 1).all() and (outc == 2).all(), (outb[:4], outc[:4])
        print("ORDER OK")
    """, env={"RT_CPU_STREAM_DELAY_US": "3000"})
    assert res.returncode == 0, res.stderr
    assert "ORDER OK" in res.stdout


def test_delayed_streams_are_busy_at_the_same_time(run_python):
    res = run_python("""
        import time, paddle_rt
        n = 1 << 12
        spans = {}
        streams = [paddle_rt.Stream(), paddle_rt.Stream()]
        for i, s in enumerate(streams):
            x, y = paddle_rt.malloc(n), paddle_rt.malloc(n)
            s.add_callback(lambda i=i: spans.setdefault(i, [time.monotonic_ns()]))
            for _ in range(4):
                paddle_rt.memcpy_async(y, x, stream=s)
            s.add_callback(lambda i=i: spans[i].append(time.monotonic_ns()))
        for s in streams:
            s.synchronize()
        (a0, a1), (b0, b1) = spans[0], spans[1]
        print("OVERLAP" if a0 < b1 and b0 < a1 else f"SERIAL {spans}")
    """, env={"RT_CPU_STREAM_DELAY_US": "20000"})
    assert res.returncode == 0, res.stderr
    assert "OVERLAP" in res.stdout, res.stdout


@pytest.mark.smoke
def test_host_buffer_is_kept_alive_until_the_copy_ran():
    """A host-to-device source larger than STAGE_MAX_BYTES is read in place: it stays referenced (and exported)
    until the copy ran."""
    from paddle_rt._core.memcpy import STAGE_MAX_BYTES
    n = STAGE_MAX_BYTES + 1
    a = paddle_rt.malloc(n)
    with Stream() as s:
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        src = np.full(n, 9, np.uint8)
        ref = weakref.ref(src)
        paddle_rt.memcpy_async(a, src, stream=s)
        del src
        assert ref() is not None
        gate.set()
        s.synchronize()
        assert ref() is None
    out = np.zeros(n, np.uint8)
    paddle_rt.memcpy(out, a)
    assert (out == 9).all()


@pytest.mark.smoke
@pytest.mark.parametrize("n", [1, 1024, "max"])
def test_small_host_source_is_staged_at_enqueue(n):
    """A small host-to-device source is copied at enqueue (as CUDA stages pageable memory): changing it right after
    memcpy_async does not change what lands on the device, even while the stream has not reached the copy yet, and
    its buffer is released before memcpy_async returns (a bytearray may be resized at once)."""
    from paddle_rt._core.memcpy import STAGE_MAX_BYTES
    n = STAGE_MAX_BYTES if n == "max" else n
    a = paddle_rt.malloc(n)
    with Stream() as s:
        gate = threading.Event()
        s.add_callback(gate.wait, 30)            # the stream reaches the copy only after the changes below
        src = np.full(n, 7, np.uint8)
        ref = weakref.ref(src)
        paddle_rt.memcpy_async(a, src, stream=s)
        src[:] = 1                               # the caller reuses its array at once
        del src
        assert ref() is None                     # not referenced by the queued copy
        raw = bytearray(b"\x05" * n)
        paddle_rt.memcpy_async(a, raw, stream=s, nbytes=n)
        raw.extend(b"more")                      # would raise BufferError if the copy still held the buffer
        raw[:n] = b"\x06" * n
        assert s.position == 3 and not s.query()
        gate.set()
        s.synchronize()
    out = np.zeros(n, np.uint8)
    paddle_rt.memcpy(out, a)
    assert (out == 5).all()


def test_staged_copy_runs_in_stream_order():
    """Staged copies keep their place among other work: device-to-host reads between them see each value."""
    a = paddle_rt.malloc(64)
    outs = [np.zeros(64, np.uint8) for _ in range(3)]
    with Stream() as s:
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        for i, out in enumerate(outs):
            paddle_rt.memcpy_async(a, np.full(64, i + 1, np.uint8), stream=s)
            paddle_rt.memcpy_async(out, a, stream=s)
        gate.set()
        s.synchronize()
    assert [int(o[0]) for o in outs] == [1, 2, 3] and all((o == o[0]).all() for o in outs)


def test_large_host_source_keeps_its_buffer_exported_until_the_copy_ran():
    from paddle_rt._core.memcpy import STAGE_MAX_BYTES
    n = STAGE_MAX_BYTES + 1
    a = paddle_rt.malloc(n)
    with Stream() as s:
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        raw = bytearray(b"\x03" * n)
        paddle_rt.memcpy_async(a, raw, stream=s)
        with pytest.raises(BufferError):
            raw.extend(b"x")                     # still exported: the worker reads it in place
        gate.set()
        s.synchronize()
        raw.extend(b"x")                         # released once the copy ran
    out = np.zeros(n, np.uint8)
    paddle_rt.memcpy(out, a)
    assert (out == 3).all()


def test_async_copy_checks_devices():
    a = paddle_rt.malloc(N, device="rt_cpu:1")
    b = paddle_rt.malloc(N, device="rt_cpu:1")
    with Stream(paddle_rt.device("rt_cpu:0")) as s:
        with pytest.raises(InvalidArgument, match="another device"):
            paddle_rt.memcpy_async(b, a, stream=s)
        assert s.position == 0
    s2 = Stream()
    s2.close()
    with pytest.raises(StreamError, match="closed"):
        paddle_rt.memcpy_async(b, a, stream=s2)


def test_async_copy_uses_current_stream(host):
    a = paddle_rt.malloc(N)
    s = Stream()
    with paddle_rt.stream(s):
        paddle_rt.memcpy_async(a, host)
    assert s.position == 1
    s.synchronize()
    s.close()


from hypothesis import given, settings, strategies as st

_op = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 2), st.integers(0, 255)),
    st.tuples(st.just("copy"), st.integers(0, 2), st.integers(0, 2)).filter(lambda t: t[1] != t[2]),
    st.tuples(st.just("h2d"), st.integers(0, 2), st.integers(0, 255)),
)


@settings(max_examples=30, deadline=None)
@given(st.lists(_op, min_size=1, max_size=25), st.booleans())
def test_queued_copies_match_a_sequential_model(ops, on_two_devices):
    n = 256
    devs = ["rt_cpu:0", "rt_cpu:1" if on_two_devices else "rt_cpu:0", "rt_cpu:0"]
    bufs = [paddle_rt.malloc(n, device=d) for d in devs]
    model = [np.zeros(n, np.uint8) for _ in range(3)]
    s = Stream(paddle_rt.device("rt_cpu:0"))
    for i in range(3):
        if bufs[i].device is s.device:
            paddle_rt.memset_async(bufs[i], 0, stream=s)
        else:
            paddle_rt.memset(bufs[i], 0)
    gate = threading.Event()
    s.add_callback(gate.wait, 30)       # queue everything before anything runs
    for kind, i, x in ops:
        if kind == "set" and bufs[i].device is s.device:
            paddle_rt.memset_async(bufs[i], x, stream=s)
            model[i][:] = x
        elif kind == "h2d" and bufs[i].device is s.device:
            paddle_rt.memcpy_async(bufs[i], np.full(n, x, np.uint8), stream=s)   # temporary host buffer
            model[i][:] = x
        elif kind == "copy":
            paddle_rt.memcpy_async(bufs[i], bufs[x], stream=s)
            model[i][:] = model[x]
    outs = [np.full(n, 77, np.uint8) for _ in range(3)]
    for i in range(3):
        src = bufs[i]
        if src.device is not s.device:    # P2P into the stream's device first
            src = paddle_rt.malloc(n, device=s.device)
            paddle_rt.memcpy_async(src, bufs[i], stream=s)
        paddle_rt.memcpy_async(outs[i], src, stream=s)
    gate.set()
    s.synchronize()
    s.close()
    for i in range(3):
        assert (outs[i] == model[i]).all(), (i, ops)


def test_pinned_host_allocation_is_host_memory_for_copies():
    """An Allocation from malloc_host is host memory: the inferred kind is H2D/D2H, and D2D contradicts it."""
    import numpy as np

    h = paddle_rt.malloc_host(4096)
    d = paddle_rt.malloc(4096)
    assert h.pinned and h.memory_kind == "host"
    assert not d.pinned and d.memory_kind == "device"
    np.asarray(h)[:] = np.arange(4096, dtype=np.uint64).astype(np.uint8)
    with pytest.raises(paddle_rt.InvalidArgument, match="D2D contradicts"):
        paddle_rt.memcpy(d, h, kind="D2D")
    paddle_rt.memcpy(d, h)
    out = np.zeros(4096, np.uint8)
    paddle_rt.memcpy(out, d)
    assert np.array_equal(out, np.asarray(h))
    h.free()
    d.free()


def test_small_upload_to_an_idle_stream_completes_before_returning():
    """On an idle stream a staged copy runs at once on the calling thread (no round trip through the worker): the
    stream's completed position has reached it when memcpy_async returns; paddle_rt.tensor() uploads the same way."""
    a = paddle_rt.malloc(1024)
    with Stream() as s:
        s.synchronize()
        src = np.arange(1024, dtype=np.uint8)
        paddle_rt.memcpy_async(a, src, stream=s)
        assert s.position == 1 and s.completed_position == 1
        t = paddle_rt.tensor(np.arange(256, dtype=np.float32), stream=s)
        assert s.completed_position == s.position
        assert (t.numpy() == np.arange(256)).all()
    out = np.zeros(1024, np.uint8)
    paddle_rt.memcpy(out, a)
    assert (out == src).all()
