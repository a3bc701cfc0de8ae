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


def assert_operand_outlives_other_stream(use, churn):
    """A tensor x (1024 float32 threes) made on stream s1 is used on stream s2 by use(x, s1, s2), which returns a
    tensor that holds 2 * x once s2 ran; s2 is held meanwhile, x is dropped and s1 allocates churn(s1): x's memory
    must not be handed out before s2 ran the work (record_stream), so the result is all sixes."""
    import threading
    import numpy as np
    import paddle_rt
    dev = paddle_rt.get_device()
    s1, s2 = paddle_rt.Stream(dev), paddle_rt.Stream(dev)
    gate = threading.Event()
    s2.add_callback(gate.wait, 10)                       # s2 is blocked
    x = paddle_rt.tensor(np.full(1024, 3.0, np.float32), stream=s1)
    out = use(x, s1, s2)
    del x                                                # freed on s1 while s2 has not run the work yet
    junk = churn(s1)
    s1.synchronize()
    gate.set()
    s2.synchronize()
    np.testing.assert_array_equal(out.numpy(), np.full(1024, 6.0))
    del junk
    s1.close()
    s2.close()
