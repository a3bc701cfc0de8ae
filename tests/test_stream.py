"""paddle_rt._core.stream: ordering, callbacks, cross-stream waits, errors, lifetime, current stream."""
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

import paddle_rt
from paddle_rt import Stream, Event, StreamError, InvalidArgument

from memory_helpers import give_memory_back
from stream_helpers import assert_wait_orders_streams, run_with_held_stream


@pytest.fixture(autouse=True)
def _give_memory_back():
    yield
    give_memory_back()



@pytest.mark.smoke
def test_callbacks_run_in_submission_order():
    with Stream() as s:
        out = []
        for i in range(1000):
            s.add_callback(out.append, i)
        s.synchronize()
        assert out == list(range(1000))
        assert s.query()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=60))
def test_interleaved_streams_keep_each_order(which):
    a, b = Stream(), Stream()
    outs = ([], [])
    try:
        for i, w in enumerate(which):
            (a, b)[w].add_callback(outs[w].append, i)
        a.synchronize()
        b.synchronize()
        for w in (0, 1):
            assert outs[w] == [i for i, x in enumerate(which) if x == w]
    finally:
        a.close()
        b.close()


def test_callback_runs_on_a_paddle_rt_thread_not_the_caller():
    with Stream() as s:
        seen = []
        s.add_callback(lambda: seen.append(threading.get_ident()))
        s.synchronize()
        assert seen and seen[0] != threading.get_ident()


@pytest.mark.smoke
def test_wait_event_orders_streams():
    def join(a, b):
        e = Event()
        e.record(a)
        assert not e.query()
        b.wait_event(e)

    assert_wait_orders_streams(join)


def test_wait_stream_orders_streams():
    assert_wait_orders_streams(lambda a, b: b.wait_stream(a))


def assert_streams_run_concurrently(device=None):
    """Each stream's callback waits for the other's to have started: only concurrent streams finish."""
    a, b = Stream(device), Stream(device)
    started = [threading.Event(), threading.Event()]
    met = []

    def body(me, other):
        started[me].set()
        met.append(started[other].wait(30))

    a.add_callback(body, 0, 1)
    b.add_callback(body, 1, 0)
    a.synchronize()
    b.synchronize()
    assert met == [True, True]
    a.close()
    b.close()


def test_streams_run_concurrently():
    assert_streams_run_concurrently()


@pytest.mark.smoke
def test_exception_in_callback_is_reraised_once_chained_and_later_work_runs():
    s = Stream()
    out = []

    def bad():
        raise ValueError("boom")

    s.add_callback(out.append, 1)
    s.add_callback(bad)
    s.add_callback(out.append, 2)
    with pytest.raises(StreamError, match="boom") as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.__cause__.__traceback__ is not None
    assert out == [1, 2]        # not cancelled
    s.synchronize()             # raised once
    s.close()


def test_exception_surfaces_through_event_recorded_after_it():
    s = Stream()
    e_before, e_after = Event(), Event()
    gate = threading.Event()
    s.add_callback(gate.wait, 30)
    e_before.record(s)
    s.add_callback(lambda: 1 / 0)
    e_after.record(s)
    gate.set()
    e_before.synchronize()      # the error comes after this record
    with pytest.raises(StreamError) as info:
        e_after.synchronize()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    s.synchronize()             # already reported
    s.close()


def test_keyboard_interrupt_in_callback_is_kept_not_lost():
    s = Stream()

    def bad():
        raise KeyboardInterrupt

    s.add_callback(bad)
    with pytest.raises(StreamError) as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    s.close()


def test_synchronize_own_stream_from_callback_is_an_error_not_a_deadlock():
    s = Stream()
    caught = []

    def cb():
        try:
            s.synchronize()
        except StreamError as exc:
            caught.append(exc)

    s.add_callback(cb)
    s.synchronize()
    assert caught and "own callback" in str(caught[0])
    s.close()


def test_callback_may_enqueue_more_work_and_synchronize_another_stream():
    a, b = Stream(), Stream()
    out = []

    def cb():
        b.add_callback(out.append, "b")
        b.synchronize()
        a.add_callback(out.append, "a2")

    a.add_callback(cb)
    a.synchronize()   # a2 was enqueued before cb returned
    a.synchronize()
    assert out == ["b", "a2"]
    a.close()
    b.close()


def test_many_threads_waiting_while_others_hold_the_gil():
    s = Stream()
    for _ in range(50):
        s.add_callback(time.sleep, 0.001)
    errs = []

    def waiter():
        try:
            s.synchronize()
        except BaseException as exc:  # pragma: no cover - reported below
            errs.append(exc)

    ts = [threading.Thread(target=waiter) for _ in range(4)]
    for t in ts:
        t.start()
    x = 0
    for i in range(200000):   # this thread keeps taking the GIL
        x += i
    for t in ts:
        t.join(60)
    assert not errs and not any(t.is_alive() for t in ts)
    s.close()


def test_close_waits_for_pending_work_and_then_refuses_work():
    s = Stream()
    out = []
    s.add_callback(time.sleep, 0.05)
    s.add_callback(out.append, 1)
    s.close()
    assert out == [1]
    assert s.closed
    s.close()   # twice is fine
    with pytest.raises(StreamError, match="closed"):
        s.add_callback(out.append, 2)
    with pytest.raises(StreamError, match="closed"):
        s.synchronize()


def test_close_reports_pending_errors():
    s = Stream()
    s.add_callback(lambda: [][1])
    with pytest.raises(StreamError, match="IndexError"):
        s.close()
    assert s.closed


def test_context_manager_closes():
    with Stream() as s:
        s.add_callback(lambda: None)
    assert s.closed


def test_add_callback_rejects_non_callables():
    with Stream() as s:
        with pytest.raises(InvalidArgument, match="not callable"):
            s.add_callback(42)
        assert s.position == 0


def test_positions_count_operations():
    with Stream() as s:
        gate = threading.Event()
        p1 = s.add_callback(gate.wait, 30)
        p2 = s.add_callback(lambda: None)
        assert (p1, p2) == (1, 2) and s.position == 2
        assert s.completed_position < 2
        gate.set()
        s.synchronize()
        assert s.completed_position == 2


def test_plugin_work_counts_as_complete_once_a_later_callback_runs():
    # a copy handed to the plugin's stream, then a host callback that blocks: the worker waited for the plugin's
    # stream before running the callback, so the copy counts as complete while the callback runs (memory freed after
    # the copy may leave the stream then, without waiting for the callback)
    with Stream() as s:
        a = paddle_rt.malloc(1 << 20, stream=s)
        b = paddle_rt.malloc(1 << 20, stream=s)
        first, gate, running = threading.Event(), threading.Event(), threading.Event()
        s.add_callback(first.wait, 30)              # the copies and the callback below then run as one batch
        paddle_rt.memcpy_async(b, a, stream=s)
        paddle_rt.memcpy_async(a, b, stream=s)
        copied = s.position
        s.add_callback(lambda: (running.set(), gate.wait(30)))
        try:
            first.set()
            assert running.wait(30)
            assert s.completed_position == copied
        finally:
            first.set()
            gate.set()
        s.synchronize()
        a.free()
        b.free()


def test_handle_and_from_handle_do_not_own():
    s = Stream()
    assert isinstance(s.handle, int) and s.owned
    w = Stream.from_handle(s.device, s.handle)
    assert not w.owned and w.handle == s.handle
    out = []
    w.add_callback(out.append, 1)
    w.close()
    # the plugin stream is still alive: wrapping it again works, and the owner closes it
    w2 = Stream.from_handle(s.device, s.handle)
    w2.add_callback(out.append, 2)
    w2.synchronize()
    w2.close()
    s.close()
    assert out == [1, 2]
    with pytest.raises(InvalidArgument):
        Stream.from_handle(s.device, "nope")


def test_current_stream_default_and_with_stream():
    d = paddle_rt.current_stream()
    assert d is paddle_rt.current_stream()
    assert d is paddle_rt.default_stream()
    s = Stream()
    other = []
    with paddle_rt.stream(s) as got:
        assert got is s
        assert paddle_rt.current_stream() is s
        t = threading.Thread(target=lambda: other.append(paddle_rt.current_stream()))
        t.start()
        t.join()
        with paddle_rt.stream(None):
            assert paddle_rt.current_stream() is s
    assert paddle_rt.current_stream() is d
    assert other == [d]    # the default stream is shared by threads; the selection is per thread
    s.close()


def test_stream_on_second_device():
    dev1 = paddle_rt.device("rt_cpu:1")
    with Stream(dev1) as s:
        assert s.device is dev1
        assert paddle_rt.current_stream(dev1).device is dev1
        out = []
        s.add_callback(out.append, 1)
        s.synchronize()
        assert out == [1]


def test_device_synchronize_waits_for_streams():
    s = Stream()
    out = []
    paddle_rt.default_stream()   # registers the device hook
    s.add_callback(time.sleep, 0.05)
    s.add_callback(out.append, 1)
    paddle_rt.synchronize()
    assert out == [1]
    s.close()


def test_ctrl_c_interrupts_synchronize():
    res = run_with_held_stream("""
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            s.synchronize()
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            print("INTERRUPTED busy" if not s.query() else "INTERRUPTED idle")
        gate.set()
        s.synchronize()
        s.close()
    """)
    assert res.returncode == 0, res.stderr
    assert "INTERRUPTED busy" in res.stdout


def test_exit_with_pending_work_runs_it(run_python):
    res = run_python("""
        import time, paddle_rt
        s = paddle_rt.Stream()
        s.add_callback(time.sleep, 0.1)
        s.add_callback(print, "ran at exit")
    """)
    assert res.returncode == 0, res.stderr
    assert "ran at exit" in res.stdout


# -- plugins without streams / with quirky async hooks ------------------------------------------------------------
import ctypes
import os
import shutil
import subprocess

from paddle_rt import NotSupportedError, PluginError

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def streamless(build_plugin):
    """A plugin with only the ten required hooks (no streams, callbacks, copies or query hooks)."""
    so = build_plugin("minimal", {"DEVICE_TYPE": '"mini_streams"', "NDEV": "1"})
    paddle_rt.load_plugin(str(so))
    return paddle_rt.device("mini_streams:0")


def _build_quirks(tmp_path_factory, name, define):
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("no gcc")
    out = tmp_path_factory.mktemp("quirks") / f"{name}.so"
    cmd = [cc, "-std=gnu11", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-pthread",
           f"-I{paddle_rt.get_include()}", f"-I{os.path.join(HERE, 'plugins')}", f'-DDEVICE_TYPE="{name}"',
           f"-D{define}", os.path.join(HERE, "c", "stream_quirks.c"), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    paddle_rt.load_plugin(str(out))
    return paddle_rt.device(f"{name}:0"), ctypes.CDLL(str(out))


@pytest.fixture(scope="module")
def warning_plugin(tmp_path_factory):
    return _build_quirks(tmp_path_factory, "sq_warning", "ASYNC_WARNING")


@pytest.fixture(scope="module")
def failing_plugin(tmp_path_factory):
    return _build_quirks(tmp_path_factory, "sq_fail", "ASYNC_FAIL")


def test_streamless_plugin_gets_ordered_asynchronous_streams(streamless):
    s = Stream(streamless)
    assert s.handle == 0
    out = []
    gate = threading.Event()
    s.add_callback(gate.wait, 30)
    for i in range(100):
        s.add_callback(out.append, i)
    assert not s.query() and out == []      # asynchronous: nothing ran behind the gate
    gate.set()
    s.synchronize()
    assert out == list(range(100))
    s.close()


def test_streamless_plugin_streams_run_concurrently(streamless):
    assert_streams_run_concurrently(streamless)


def test_streamless_plugin_events_order_and_time(streamless):
    a, b = Stream(streamless), Stream(streamless)
    out = []
    gate = threading.Event()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    a.add_callback(gate.wait, 30)
    start.record(a)
    a.add_callback(time.sleep, 0.01)
    a.add_callback(out.append, "a")
    end.record(a)
    assert not end.query()
    b.wait_event(end)
    b.add_callback(out.append, "b")
    gate.set()
    b.synchronize()
    assert out == ["a", "b"]
    assert end.query() and end.handle != 0
    assert start.elapsed_time(end) >= 10.0
    a.close()
    b.close()


def test_streamless_plugin_without_copy_hooks_refuses_copies(streamless):
    x = paddle_rt.malloc(64, device=streamless)
    with pytest.raises(NotSupportedError, match="memory_copy_h2d"):
        paddle_rt.memcpy(x, bytearray(64))
    with Stream(streamless) as s:
        with pytest.raises(NotSupportedError):
            paddle_rt.memcpy_async(x, bytearray(64), stream=s)
        assert s.position == 0
    x.free()


def test_async_hooks_returning_warning_are_done_synchronously(warning_plugin):
    dev, lib = warning_plugin
    lib.sq_async_calls.restype = ctypes.c_long
    x, y = paddle_rt.malloc(256, device=dev), paddle_rt.malloc(256, device=dev)
    src = bytes(range(256))
    out = bytearray(256)
    before = lib.sq_async_calls()
    with Stream(dev) as s:
        assert s.handle == 0                   # the plugin never wrote the handle
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        paddle_rt.memcpy_async(x, src, stream=s)
        paddle_rt.memcpy_async(y, x, stream=s)
        paddle_rt.memcpy_async(out, y, stream=s)
        assert out == bytearray(256)           # still queued behind the gate
        gate.set()
        s.synchronize()
    assert bytes(out) == src
    assert lib.sq_async_calls() - before == 3


def test_plugin_error_in_async_work_surfaces_on_synchronize(failing_plugin):
    dev, _ = failing_plugin
    x, y = paddle_rt.malloc(64, device=dev), paddle_rt.malloc(64, device=dev)
    out = []
    s = Stream(dev)
    paddle_rt.memcpy_async(y, x, stream=s)       # async d2d fails with C_ERROR on the worker
    s.add_callback(out.append, "after")
    with pytest.raises(StreamError, match="sq_fail:0") as info:
        s.synchronize()
    cause = info.value.__cause__
    assert isinstance(cause, PluginError)
    assert cause.call == "async_memory_copy_d2d" and cause.status_name == "C_ERROR"
    assert out == ["after"]
    s.synchronize()
    s.close()


def test_parent_streams_raise_fork_error_in_child():
    res = run_with_held_stream("""
        e = paddle_rt.Event()
        e.record(s)
        pid = os.fork()
        if pid == 0:
            codes = []
            for fn in (s.synchronize, lambda: s.add_callback(print), e.synchronize):
                try:
                    fn()
                    codes.append("none")
                except paddle_rt.ForkError:
                    codes.append("fork")
            os._exit(0 if codes == ["fork"] * 3 else 1)
        _, status = os.waitpid(pid, 0)
        gate.set()
        s.synchronize()
        s.close()
        print("CHILD", os.waitstatus_to_exitcode(status))
    """)
    assert res.returncode == 0, res.stderr
    assert "CHILD 0" in res.stdout


def test_garbage_collected_stream_runs_its_pending_work_first():
    import gc
    s = Stream()
    out = []
    gate = threading.Event()
    s.add_callback(gate.wait, 0.05)
    for i in range(10):
        s.add_callback(out.append, i)
    del s
    gc.collect()
    assert out == list(range(10))


def test_stream_dropped_inside_its_own_callback_does_not_hang():
    holder = {"s": Stream()}
    done = threading.Event()

    def cb():
        holder.pop("s")           # the last reference dies on the stream's own worker
        done.set()

    holder["s"].add_callback(cb)
    assert done.wait(30)


@pytest.mark.smoke
def test_many_threads_enqueue_concurrently_each_in_order():
    s = Stream()
    out = []
    n_threads, n = 4, 2000

    def producer(t):
        for i in range(n):
            s.add_callback(out.append, (t, i))

    ts = [threading.Thread(target=producer, args=(t,)) for t in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    s.synchronize()
    assert len(out) == n_threads * n
    for t in range(n_threads):
        assert [i for (tt, i) in out if tt == t] == list(range(n))
    s.close()


def test_close_while_other_threads_synchronize():
    for _ in range(20):
        s = Stream()
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        errs = []

        def waiter():
            try:
                s.synchronize()
            except StreamError as exc:    # closed before this thread got to wait: also fine
                errs.append(exc)

        ts = [threading.Thread(target=waiter) for _ in range(3)]
        for t in ts:
            t.start()
        gate.set()
        s.close()
        for t in ts:
            t.join(30)
        assert not any(t.is_alive() for t in ts)
        assert all("closed" in str(e) for e in errs)


def test_stream_init_twice_is_refused():
    with Stream() as s:
        with pytest.raises(StreamError, match="already"):
            s.__init__()


def test_add_host_func_runs_a_c_function_pointer_in_order():
    out = []
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    fn = proto(lambda arg: out.append(arg))
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    with Stream() as s:
        s.add_callback(out.append, "py")
        s.add_host_func(addr, 7)
        s.add_host_func(addr)
        s.synchronize()
    assert out == ["py", 7, None]
    with Stream() as s:
        for bad in (0, -1, "f", True):
            with pytest.raises(InvalidArgument):
                s.add_host_func(bad)
        with pytest.raises(InvalidArgument):
            s.add_host_func(addr, -5)
        assert s.position == 0


@pytest.mark.slow
def test_cython_extension_can_cimport_the_stream_c_api(tmp_path, run_python):
    cython = shutil.which("cython")
    if cython is None:
        pytest.skip("no cython")
    import sysconfig
    src = tmp_path / "ext_host_func.pyx"
    src.write_text(
        "# cython: language_level=3\n"
        "from paddle_rt._core.stream cimport Stream, stream_launch_host_func, stream_position, stream_reached\n"
        "cdef long hits = 0\n"
        "cdef void bump(void* arg) noexcept nogil:\n"
        "    global hits\n"
        "    hits += <long>arg\n"
        "def run(Stream s, long n):\n"
        "    cdef long i\n"
        "    cdef unsigned long long last = 0\n"
        "    with nogil:\n"
        "        for i in range(n):\n"
        "            last = stream_launch_host_func(s, bump, <void*>2)\n"
        "    s.synchronize()\n"
        "    return hits, last == stream_position(s), stream_reached(s, last)\n"
        "from paddle_rt._core.stream cimport current_stream_tag\n"
        "from paddle_rt._core.device cimport Device\n"
        "def tag(Device d):\n"
        "    return current_stream_tag(d)\n")
    cpp = tmp_path / "ext_host_func.cpp"
    res = subprocess.run([cython, "--cplus", "-3", "-I", paddle_rt.get_cython_include(), str(src), "-o", str(cpp)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    so = tmp_path / ("ext_host_func" + sysconfig.get_config_var("EXT_SUFFIX"))
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread",
                          f"-I{sysconfig.get_paths()['include']}", f"-I{paddle_rt.get_include()}",
                          f"-I{os.path.join(paddle_rt.get_cython_include(), 'paddle_rt', '_core')}",
                          str(cpp), "-o", str(so)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    res = run_python(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import paddle_rt, ext_host_func
        s = paddle_rt.Stream()
        print("RESULT", ext_host_func.run(s, 100000))
        outside = ext_host_func.tag(s.device)
        with paddle_rt.stream(s):
            inside = ext_host_func.tag(s.device)
            other = ext_host_func.tag(paddle_rt.device("rt_cpu:1"))
        print("TAGS", outside == 0, inside != 0, other == 0, ext_host_func.tag(s.device) == 0)
        s.close()
    """)
    assert res.returncode == 0, res.stderr
    assert "RESULT (200000, True, True)" in res.stdout
    assert "TAGS True True True True" in res.stdout


def test_create_stream_failure_is_a_plugin_error_and_changes_nothing(run_python):
    res = run_python("""
        import paddle_rt
        s = paddle_rt.Stream("rt_cpu:0")
        try:
            paddle_rt.Stream("rt_cpu:0")
            print("NO ERROR")
        except paddle_rt.PluginError as exc:
            print("ERR", exc.device, exc.call, exc.status_name)
        out = []
        s.add_callback(out.append, 1)
        s.synchronize()
        s.close()
        t = paddle_rt.Stream("rt_cpu:0")     # the slot is free again
        t.close()
        print("OK", out)
    """, env={"RT_CPU_MAX_STREAMS": "1"})
    assert res.returncode == 0, res.stderr
    assert "ERR rt_cpu:0 create_stream C_FAILED" in res.stdout
    assert "OK [1]" in res.stdout


def test_wait_stream_and_wait_event_check_their_arguments():
    """wait_stream orders through stream.pyx's own mark (StreamMark: no Event, nothing of event.pyx); wait_event
    takes an Event only; a closed stream on either side raises StreamError and queues nothing."""
    a, b, c = Stream(), Stream(), Stream()
    with pytest.raises(InvalidArgument, match="wait_event needs an Event, not object"):
        b.wait_event(object())
    b.wait_stream(b)                      # itself: nothing to wait for
    a.wait_stream(b)                      # both idle: completes at once
    c.close()
    with pytest.raises(StreamError):
        b.wait_stream(c)
    with pytest.raises(StreamError):
        c.wait_stream(b)
    with pytest.raises(TypeError):
        b.wait_stream(None)
    out = []
    gate = threading.Event()
    a.add_callback(gate.wait, 30)
    a.add_callback(out.append, "a")
    for _ in range(3):                    # repeated waits on the same busy stream
        b.wait_stream(a)
    b.add_callback(out.append, "b")
    assert not b.query()
    gate.set()
    b.synchronize()
    assert out == ["a", "b"]
    a.close()
    b.close()
