"""paddle_rt._core.event: record/query/synchronize/wait, host-clock timing, errors."""
import threading
import time

import pytest

import paddle_rt
from paddle_rt import Stream, Event, StreamError, InvalidArgument

from stream_helpers import assert_wait_orders_streams, run_with_held_stream


def test_unrecorded_event_is_complete_and_has_no_handle():
    e = Event()
    assert e.query()
    e.synchronize()
    assert e.handle == 0


def test_record_query_synchronize():
    with Stream() as s:
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        e = Event()
        e.record(s)
        assert e.handle != 0
        assert not e.query()
        gate.set()
        e.synchronize()
        assert e.query()


def test_record_on_idle_stream_completes_at_once():
    with Stream() as s:
        e = Event()
        e.record(s)
        assert e.query()


def test_record_default_uses_current_stream():
    s = Stream()
    gate = threading.Event()
    s.add_callback(gate.wait, 30)
    e = Event()
    with paddle_rt.stream(s):
        e.record()
    assert not e.query()
    gate.set()
    e.synchronize()
    s.close()


def test_rerecord_tracks_latest_record():
    with Stream() as s:
        e = Event()
        e.record(s)
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        e.record(s)
        assert not e.query()
        gate.set()
        e.synchronize()
        assert e.query()


def test_event_wait_orders_streams():
    def join(a, b):
        e = Event()
        e.record(a)
        e.wait(b)

    assert_wait_orders_streams(join)


@pytest.mark.smoke
def test_elapsed_time_measures_stream_time():
    with Stream() as s:
        start, end = Event(enable_timing=True), Event(enable_timing=True)
        gate = threading.Event()
        s.add_callback(gate.wait, 30)     # so that both records are stamped by the stream, not at once
        start.record(s)
        s.add_callback(time.sleep, 0.02)
        end.record(s)
        gate.set()
        end.synchronize()
        ms = start.elapsed_time(end)
        assert isinstance(ms, float)
        assert ms >= 20.0                 # sleep() sleeps at least that long
        assert end.elapsed_time(start) == -ms


def test_elapsed_time_errors():
    with Stream() as s:
        plain = Event()
        t1, t2 = Event(enable_timing=True), Event(enable_timing=True)
        plain.record(s)
        t1.record(s)
        with pytest.raises(InvalidArgument, match="without timing"):
            t1.elapsed_time(plain)
        with pytest.raises(InvalidArgument, match="never recorded"):
            t1.elapsed_time(t2)
        gate = threading.Event()
        s.add_callback(gate.wait, 30)
        t2.record(s)
        with pytest.raises(StreamError, match="not completed"):
            t1.elapsed_time(t2)
        gate.set()
        t2.synchronize()
        assert t1.elapsed_time(t2) >= 0.0
        with pytest.raises(TypeError):
            t1.elapsed_time(None)


def test_event_belongs_to_first_device():
    e = Event()
    with Stream(paddle_rt.device("rt_cpu:0")) as s0, Stream(paddle_rt.device("rt_cpu:1")) as s1:
        e.record(s0)
        with pytest.raises(InvalidArgument, match="rt_cpu:0"):
            e.record(s1)
        # a stream of another device may still wait for it
        e.wait(s1)
        s1.synchronize()


def test_record_on_closed_stream_raises():
    s = Stream()
    s.close()
    e = Event()
    with pytest.raises(StreamError, match="closed"):
        e.record(s)
    assert e.query()


@pytest.mark.smoke
def test_event_outlives_streams_and_queued_waits():
    a, b = Stream(), Stream()
    gate = threading.Event()
    order = []
    a.add_callback(lambda: (gate.wait(30), order.append("a")))
    e = Event()
    e.record(a)
    e.wait(b)
    b.add_callback(order.append, "b")
    del e               # queued operations keep the event's state alive
    gate.set()
    b.synchronize()
    # b's work after the wait ran after a's work before the record: the wait held though the Event object was gone
    assert order == ["a", "b"]
    a.close()
    b.close()


def test_ctrl_c_interrupts_event_synchronize():
    res = run_with_held_stream("""
        e = paddle_rt.Event(blocking=True)
        e.record(s)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            e.synchronize()
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            print("INTERRUPTED", e.query())
        gate.set()
        s.close()
    """)
    assert res.returncode == 0, res.stderr
    assert "INTERRUPTED False" in res.stdout


def test_event_synchronize_from_its_streams_callback_is_an_error_not_a_deadlock(run_python):
    """A callback on stream s that waits for an event recorded after it on s would wait forever: StreamError. In a
    child with a timeout, so that a missing guard fails the test instead of hanging the suite."""
    res = run_python("""
        import threading, paddle_rt
        s = paddle_rt.Stream()
        ev = paddle_rt.Event()
        caught = []
        recorded = threading.Event()     # the callback waits until the host has recorded the event behind it
        def cb():
            recorded.wait(30)
            try:
                ev.synchronize()
                caught.append("returned")
            except paddle_rt.StreamError as exc:
                caught.append(str(exc))
        s.add_callback(cb)
        ev.record(s)                     # recorded after the callback: done only once the callback returned
        recorded.set()
        s.synchronize()
        ev.synchronize()                 # from the host: fine
        print("CAUGHT", caught)
    """, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "would deadlock" in res.stdout and "returned" not in res.stdout, res.stdout
