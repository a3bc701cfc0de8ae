"""Child scripts of the stream and event tests that start from a stream held busy by the host."""
import textwrap

from conftest import run_python_code

HELD_STREAM = """
import os, signal, threading, time, paddle_rt
s = paddle_rt.Stream()
gate = threading.Event()
s.add_callback(gate.wait, 60)         # s runs nothing more until the script sets gate
"""


def run_with_held_stream(body):
    """Run body (dedented) in a child after HELD_STREAM: ``s`` is a stream held busy until ``gate`` is set."""
    return run_python_code(HELD_STREAM + textwrap.dedent(body))


def assert_wait_orders_streams(join):
    """Stream b waits for stream a through join(a, b) while a's work is held by a gate: b's later work stays blocked
    until a's ran, then runs after it."""
    import threading
    from paddle_rt import Stream
    a, b = Stream(), Stream()
    out = []
    gate = threading.Event()
    a.add_callback(gate.wait, 30)
    a.add_callback(out.append, "a")
    join(a, b)
    b.add_callback(out.append, "b")
    assert not b.query()   # b is blocked behind a's gate
    gate.set()
    b.synchronize()
    assert out == ["a", "b"]
    a.close()
    b.close()
