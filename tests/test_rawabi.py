"""paddle_rt._core.rawabi: one hook per method, raw statuses returned (never raised), NotSupportedError naming a
missing hook, content helpers, callbacks that keep exceptions."""
import gc
import struct
import threading
import weakref

import pytest

import paddle_rt
from paddle_rt._core import rawabi
from paddle_rt._core.rawabi import RawDevice, read_host, write_host

C_SUCCESS, C_WARNING, C_FAILED, C_ERROR = 0, 1, 2, 3


@pytest.fixture(scope="module")
def raw():
    return RawDevice(paddle_rt.device("rt_cpu:0"))


@pytest.fixture(scope="module")
def raw1():
    if paddle_rt.device_count("rt_cpu") < 2:
        pytest.skip("needs 2 rt_cpu devices")
    return RawDevice(paddle_rt.device("rt_cpu:1"))


@pytest.fixture(scope="module")
def minimal_raw(build_plugin):
    so = build_plugin("minimal", {"DEVICE_TYPE": '"rawabi_min"'})
    plugin = paddle_rt.load_plugin(so)
    r = RawDevice(paddle_rt.device("rawabi_min:0"))
    yield r


def _host(raw, size):
    st, h = raw.host_allocate(size)
    assert st == C_SUCCESS and h
    return h


@pytest.mark.smoke
def test_device_queries(raw):
    st, n = raw.get_device_count()
    assert st == C_SUCCESS and n == paddle_rt.device_count("rt_cpu")
    st, ids = raw.get_device_list()
    assert st == C_SUCCESS and ids == list(range(n))
    assert raw.set_device(0) == C_SUCCESS
    assert raw.get_device() == (C_SUCCESS, 0)
    assert raw.set_device(10_000) == C_ERROR          # a raw status, not an exception
    assert raw.set_device() == C_SUCCESS
    assert raw.has("create_stream") and not raw.has("blas_set_math_mode")
    assert rawabi.get_device_count(paddle_rt.device("rt_cpu:0")) == (C_SUCCESS, n)
    assert rawabi.get_device_list(paddle_rt.device("rt_cpu:0")) == (C_SUCCESS, ids)


@pytest.mark.smoke
def test_allocate_deallocate_statuses(raw):
    st, p = raw.allocate(4096)
    assert st == C_SUCCESS and p != 0 and p % 256 == 0
    assert raw.deallocate(p, 4096) == C_SUCCESS
    assert raw.deallocate(p, 4096) == C_ERROR          # double free: rt_cpu reports it, nothing raised
    st, p = raw.allocate(0)
    assert st == C_ERROR and p == 0                    # rt_cpu's documented size-0 behaviour
    st, total, free = raw.memory_stats()
    assert st == C_SUCCESS and 0 < free <= total
    st, p = raw.allocate(total + 1)
    assert st == C_FAILED and p == 0
    assert raw.deallocate(0x1000, 16) == C_ERROR      # a foreign pointer: status, no crash


def test_memset_and_device_access(raw):
    st, p = raw.allocate(1000)
    assert st == C_SUCCESS
    try:
        assert raw.memset(p, 0x1AB, 1000) == C_SUCCESS  # the value is truncated to a byte, as the ABI's uchar
        assert raw.read_device(p, 1000) == b"\xab" * 1000
        raw.write_device(p + 10, b"xyz")
        assert raw.read_device(p + 8, 6) == b"\xab\xabxyz\xab"
    finally:
        assert raw.deallocate(p, 1000) == C_SUCCESS


def test_host_and_unified_memory(raw):
    for alloc, free in ((raw.host_allocate, raw.host_deallocate), (raw.unified_allocate, raw.unified_deallocate)):
        st, h = alloc(4096)
        assert st == C_SUCCESS and h
        assert write_host(h, b"hello" * 10) == 50
        assert read_host(h, 5) == b"hello"
        assert read_host(h, 0) == b""
        assert free(h, 4096) == C_SUCCESS
        assert free(h, 4096) == C_ERROR


def test_host_helpers_refuse_null():
    with pytest.raises(paddle_rt.InvalidArgument):
        read_host(0, 4)
    with pytest.raises(paddle_rt.InvalidArgument):
        write_host(0, b"x")


def test_sync_copies(raw, raw1):
    n = 8192
    h = _host(raw, n)
    a, b = raw.allocate(n)[1], raw.allocate(n)[1]
    data = bytes(range(256)) * (n // 256)
    try:
        write_host(h, data)
        assert raw.copy_h2d(a, h, n) == C_SUCCESS
        assert raw.read_device(a, n) == data
        assert raw.copy_d2d(b, a, n) == C_SUCCESS
        write_host(h, b"\0" * n)
        assert raw.copy_d2h(h, b, n) == C_SUCCESS
        assert read_host(h, n) == data
        st, c = raw1.allocate(n)
        assert st == C_SUCCESS
        assert raw.copy_p2p(raw1, c, a, n) == C_SUCCESS
        assert raw1.read_device(c, n) == data
        assert raw1.deallocate(c, n) == C_SUCCESS
        raw.activate()
    finally:
        raw.deallocate(a, n)
        raw.deallocate(b, n)
        raw.host_deallocate(h, n)


def test_streams_async_copies_and_events(raw, raw1):
    n = 1 << 20
    st, s = raw.create_stream()
    assert st == C_SUCCESS and s
    st, s2 = raw.create_stream()
    assert st == C_SUCCESS
    h = _host(raw, n)
    a, b = raw.allocate(n)[1], raw.allocate(n)[1]
    st, e = raw.create_event()
    assert st == C_SUCCESS and e
    try:
        write_host(h, b"\x07" * n)
        assert raw.async_copy_h2d(s, a, h, n) == C_SUCCESS
        assert raw.async_copy_d2d(s, b, a, n) == C_SUCCESS
        assert raw.record_event(s, e) == C_SUCCESS
        assert raw.stream_wait_event(s2, e) == C_SUCCESS
        out = _host(raw, n)
        assert raw.async_copy_d2h(s2, out, b, n) == C_SUCCESS
        assert raw.synchronize_stream(s2) == C_SUCCESS
        assert read_host(out, n) == b"\x07" * n
        assert raw.synchronize_event(e) == C_SUCCESS
        assert raw.query_event(e) == C_SUCCESS
        assert raw.query_stream(s) in (C_SUCCESS, C_FAILED)
        assert raw.synchronize_stream(s) == C_SUCCESS
        assert raw.query_stream(s) == C_SUCCESS
        assert raw.synchronize_device() == C_SUCCESS
        st, c = raw1.allocate(n)
        assert raw.async_copy_p2p(raw1, s, c, a, n) == C_SUCCESS
        assert raw.synchronize_stream(s) == C_SUCCESS
        assert raw1.read_device(c, 16) == b"\x07" * 16
        assert raw1.deallocate(c, n) == C_SUCCESS
        raw.activate()
        assert raw.host_deallocate(out, n) == C_SUCCESS
    finally:
        assert raw.destroy_event(e) == C_SUCCESS
        assert raw.destroy_event(e) == C_ERROR         # a dead handle: status, never dereferenced by us
        assert raw.destroy_stream(s) == C_SUCCESS
        assert raw.destroy_stream(s2) == C_SUCCESS
        assert raw.query_stream(s) == C_ERROR
        raw.deallocate(a, n)
        raw.deallocate(b, n)
        raw.host_deallocate(h, n)


@pytest.mark.smoke
def test_callbacks_run_in_order_keep_exceptions_and_release_the_callable(raw):
    st, s = raw.create_stream()
    assert st == C_SUCCESS
    seen = []
    try:
        class Fn:
            def __call__(self):
                seen.append(threading.get_ident())

        fn = Fn()
        ref = weakref.ref(fn)
        st, t1 = raw.add_callback(s, fn)
        del fn
        assert st == C_SUCCESS
        st, t2 = raw.add_callback(s, lambda: 1 / 0)
        assert st == C_SUCCESS
        # synchronize_stream releases the GIL: the callbacks need it on the plugin's worker thread
        assert raw.synchronize_stream(s) == C_SUCCESS
        assert t1.wait(5) and t2.wait(5)
        assert t1.ran and t1.exception is None and t1.status_in == C_SUCCESS
        assert t2.ran and isinstance(t2.exception, ZeroDivisionError)
        assert t1.order < t2.order
        assert seen and seen[0] != threading.get_ident()   # ran on the stream's worker
        gc.collect()
        assert ref() is None                              # the callable is released once it ran
        assert rawabi.stray_callback_calls() == 0
        # a bad stream handle: a status, and the ticket never runs (it stays pending: the plugin might call it)
        pending = rawabi.pending_callbacks()
        st, t3 = raw.add_callback(0xDEAD0, lambda: None)
        assert st == C_ERROR and not t3.ran
        assert rawabi.pending_callbacks() == pending + 1
        with pytest.raises(paddle_rt.InvalidArgument):
            raw.add_callback(s, 42)
    finally:
        assert raw.destroy_stream(s) == C_SUCCESS


def test_size_hints(raw):
    assert raw.size_hint("min_chunk_size") == (C_SUCCESS, paddle_rt.device("rt_cpu:0").size_hint("min_chunk_size"))
    for name in rawabi.SIZE_HINTS:
        st, v = raw.size_hint(name)
        assert st == C_SUCCESS
    with pytest.raises(paddle_rt.InvalidArgument):
        raw.size_hint("nonsense")


def test_xccl_one_rank_all_reduce(raw):
    st, size = raw.xccl_get_unique_id_size()
    assert st == C_SUCCESS and size > 0
    st, uid = raw.xccl_get_unique_id(size)
    assert st == C_SUCCESS and len(uid) == size and any(uid)
    st, comm = raw.xccl_comm_init_rank(1, uid, 0)
    assert st == C_SUCCESS and comm
    data = struct.pack("4f", 1.0, 2.5, -3.0, 4.0)
    st, a = raw.allocate(16)
    st, b = raw.allocate(16)
    try:
        raw.write_device(a, data)
        assert raw.xccl_all_reduce(a, b, 4, 11, 0, comm, 0) == C_SUCCESS   # FLOAT32, SUM, NULL stream
        assert raw.read_device(b, 16) == data
        assert raw.xccl_all_reduce(a, b, 4, 0, 0, comm, 0) == C_ERROR      # UNDEFINED type: a status
    finally:
        assert raw.xccl_destroy_comm(comm) == C_SUCCESS
        raw.deallocate(a, 16)
        raw.deallocate(b, 16)


def test_missing_hooks_raise_not_supported_naming_the_hook(minimal_raw):
    r = minimal_raw
    calls = {
        "memory_copy_h2d": lambda: r.copy_h2d(1, 1, 1),
        "memory_copy_d2h": lambda: r.copy_d2h(1, 1, 1),
        "memory_copy_d2d": lambda: r.copy_d2d(1, 1, 1),
        "memory_copy_p2p": lambda: r.copy_p2p(r, 1, 1, 1),
        "async_memory_copy_h2d": lambda: r.async_copy_h2d(0, 1, 1, 1),
        "async_memory_copy_d2h": lambda: r.async_copy_d2h(0, 1, 1, 1),
        "async_memory_copy_d2d": lambda: r.async_copy_d2d(0, 1, 1, 1),
        "async_memory_copy_p2p": lambda: r.async_copy_p2p(r, 0, 1, 1, 1),
        "device_memory_set": lambda: r.memset(1, 0, 1),
        "host_memory_allocate": lambda: r.host_allocate(16),
        "host_memory_deallocate": lambda: r.host_deallocate(1, 16),
        "unified_memory_allocate": lambda: r.unified_allocate(16),
        "unified_memory_deallocate": lambda: r.unified_deallocate(1, 16),
        "create_stream": r.create_stream,
        "destroy_stream": lambda: r.destroy_stream(0),
        "query_stream": lambda: r.query_stream(0),
        "synchronize_stream": lambda: r.synchronize_stream(0),
        "stream_wait_event": lambda: r.stream_wait_event(0, 0),
        "stream_add_callback": lambda: r.add_callback(0, lambda: None),
        "query_event": lambda: r.query_event(0),
        "synchronize_device": r.synchronize_device,
        "device_memory_stats": r.memory_stats,
        "device_min_chunk_size": lambda: r.size_hint("min_chunk_size"),
        "xccl_get_unique_id_size": r.xccl_get_unique_id_size,
        "xccl_comm_init_rank": lambda: r.xccl_comm_init_rank(1, b"x", 0),
        "xccl_all_reduce": lambda: r.xccl_all_reduce(0, 0, 1, 11, 0, 0, 0),
    }
    for hook, call in calls.items():
        with pytest.raises(paddle_rt.NotSupportedError, match=hook) as info:
            call()
        assert "rawabi_min:0" in str(info.value)
    # the required hooks work
    st, p = r.allocate(64)
    assert st == C_SUCCESS and p
    assert r.deallocate(p, 64) == C_SUCCESS
    st, e = r.create_event()
    assert st == C_SUCCESS
    assert r.record_event(0, e) == C_SUCCESS
    assert r.synchronize_event(e) == C_SUCCESS
    assert r.destroy_event(e) == C_SUCCESS
    assert r.get_device_list() == (C_SUCCESS, [0])


def test_device_memory_access_only_when_host_addressable(minimal_raw, monkeypatch):
    assert not minimal_raw.host_addressable
    with pytest.raises(paddle_rt.NotSupportedError, match="PADDLE_RT_HOST_ADDRESSABLE"):
        minimal_raw.read_device(1, 1)
    with pytest.raises(paddle_rt.NotSupportedError):
        minimal_raw.write_device(1, b"x")
    monkeypatch.setenv("PADDLE_RT_HOST_ADDRESSABLE", "other, rawabi_min")
    r = RawDevice(paddle_rt.device("rawabi_min:0"))
    assert r.host_addressable
    st, p = r.allocate(8)
    r.write_device(p, b"12345678")
    assert r.read_device(p, 8) == b"12345678"
    assert r.deallocate(p, 8) == C_SUCCESS


def test_callback_called_twice_is_counted_not_a_crash(build_plugin, run_python):
    """user_data is a serial number, never an object pointer: a plugin calling a callback twice cannot make us touch
    freed memory; the second call is counted."""
    so = build_plugin("crashy", {"DEVICE_TYPE": '"cb_twice"', "CALLBACK_TWICE": None, "ABORT_ABOVE": 0})
    res = run_python(f"""
        import paddle_rt
        from paddle_rt._core import rawabi
        paddle_rt.load_plugin({str(so)!r})
        r = rawabi.RawDevice(paddle_rt.device("cb_twice:0"))
        st, s = r.create_stream()
        runs = []
        st, t = r.add_callback(s, lambda: runs.append(1))
        assert st == 0 and t.ran and runs == [1], (st, t, runs)
        assert rawabi.stray_callback_calls() == 1
        assert rawabi.pending_callbacks() == 0
        print("ok")
    """, env={"PADDLE_RT_NO_RT_CPU": "1"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
