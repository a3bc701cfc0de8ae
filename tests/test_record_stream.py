"""record_stream on blocks of paddle_rt.malloc (paddle_rt/_core/allocation.pyx, deferred_free.pyx): blocks belong to the thread's current
stream; a free after record_stream(s) returns the block only once s has passed the free."""
import ctypes
import gc
import threading

import numpy as np
import pytest

import paddle_rt
from paddle_rt import InvalidArgument
from paddle_rt import plugins
from paddle_rt._core.allocation import _deferred_frees_pending
from conftest import run_python_code
from memory_helpers import GatedReader, run_workers, two_streams

N = 1 << 16
ORIG = 0x5A
POISON = 0xEE


@pytest.fixture
def streams():
    yield from two_streams()


def test_malloc_belongs_to_the_current_stream(streams):
    a, _ = streams
    with paddle_rt.stream(a):
        x = paddle_rt.malloc(N)
    assert x.stream_tag != 0
    y = paddle_rt.malloc(N)                    # the default stream: tag 0, another chunk
    assert y.stream_tag == 0
    p = x.ptr
    x.free()
    z = paddle_rt.malloc(N)                    # not a's block: another stream's allocation never reuses it
    assert z.ptr != p
    with paddle_rt.stream(a):
        w = paddle_rt.malloc(N)                # a again: reused at once
    assert w.ptr == p
    assert paddle_rt.malloc(16, stream=a).stream_tag == w.stream_tag
    assert paddle_rt.malloc(16, stream=paddle_rt.default_stream()).stream_tag == 0
    tags = {seg["stream"] for seg in paddle_rt.memory_snapshot()}
    assert {0, w.stream_tag} <= tags
    for m in (y, z, w):
        m.free()


@pytest.mark.smoke
def test_record_stream_defers_reuse_until_the_stream_passed_the_free(streams):
    a, b = streams
    x = paddle_rt.malloc(N)
    ctypes.memset(x.ptr, ORIG, N)
    g = GatedReader(b, x.ptr, N)                      # b's pending work reads x
    x.record_stream(b)
    assert x.recorded == (b,)
    p = x.ptr
    x.free()
    assert _deferred_frees_pending() == 1
    y = paddle_rt.malloc(N)                    # same stream, same size: must not get x's memory yet
    assert y.ptr != p
    ctypes.memset(y.ptr, POISON, N)
    g.gate.set()
    b.synchronize()                            # b ran the reader, then the deferred free
    assert g.seen == bytes([ORIG]) * N
    assert _deferred_frees_pending() == 0
    z = paddle_rt.malloc(N)
    assert z.ptr == p                          # back in the allocator
    y.free()
    z.free()


def test_without_record_stream_the_block_is_reused_at_once(streams):
    """The control of the test above: the same sequence without record_stream hands out the same memory."""
    a, b = streams
    x = paddle_rt.malloc(N)
    g = GatedReader(b)
    p = x.ptr
    x.free()
    y = paddle_rt.malloc(N)
    assert y.ptr == p
    g.gate.set()
    y.free()


@pytest.mark.smoke
def test_deferred_free_through_garbage_collection(streams):
    a, b = streams
    x = paddle_rt.malloc(N)
    g = GatedReader(b)
    x.record_stream(b)
    p = x.ptr
    before = paddle_rt.memory_allocated()
    del x
    gc.collect()
    assert _deferred_frees_pending() == 1
    assert paddle_rt.memory_allocated() == before     # still held until b passes the free
    g.gate.set()
    b.synchronize()
    assert _deferred_frees_pending() == 0
    assert paddle_rt.memory_allocated() < before
    y = paddle_rt.malloc(N)
    assert y.ptr == p
    y.free()


@pytest.mark.smoke
def test_several_recorded_streams_and_closed_ones(streams):
    a, b = streams
    c = paddle_rt.Stream()
    x = paddle_rt.malloc(N)
    ga, gc_ = GatedReader(a), GatedReader(c)
    x.record_stream(a)
    x.record_stream(c)
    x.record_stream(a)                         # recorded once
    assert x.recorded == (a, c)
    p = x.ptr
    x.free()
    ga.gate.set()
    a.synchronize()
    assert _deferred_frees_pending() == 1       # c has not passed it
    y = paddle_rt.malloc(N)
    assert y.ptr != p
    gc_.gate.set()
    c.synchronize()
    assert _deferred_frees_pending() == 0
    z = paddle_rt.malloc(N)
    assert z.ptr == p
    # a stream closed before the free has nothing left to run: the free is immediate
    z.record_stream(c)
    c.close()
    z.free()
    assert _deferred_frees_pending() == 0
    w = paddle_rt.malloc(N)
    assert w.ptr == p
    # recording a closed stream does nothing
    w.record_stream(c)
    assert w.recorded == ()
    w.free()
    y.free()


def test_recording_the_own_stream_is_a_no_op(streams):
    a, b = streams
    with paddle_rt.stream(a):
        x = paddle_rt.malloc(N)
        x.record_stream(a)
        assert x.recorded == ()
    y = paddle_rt.malloc(N)
    y.record_stream(paddle_rt.default_stream())
    assert y.recorded == ()
    x.free()
    y.free()
    assert _deferred_frees_pending() == 0


@pytest.mark.smoke
def test_bad_paths(streams):
    a, b = streams
    x = paddle_rt.malloc(N)
    with pytest.raises(InvalidArgument, match=r"rt_cpu:0: record_stream .*expected a paddle_rt Stream"):
        x.record_stream("b")
    if paddle_rt.device_count() > 1:
        other = paddle_rt.Stream(paddle_rt.device("rt_cpu:1"))
        with pytest.raises(InvalidArgument, match=r"rt_cpu:0: record_stream .*belongs to rt_cpu:1"):
            x.record_stream(other)
        with pytest.raises(InvalidArgument, match=r"rt_cpu:0: malloc: .*belongs to rt_cpu:1"):
            paddle_rt.malloc(16, stream=other)
        other.close()
    assert x.recorded == ()
    with pytest.raises(InvalidArgument, match="rt_cpu:0: malloc: stream must be"):
        paddle_rt.malloc(16, stream="s")
    with pytest.raises(InvalidArgument, match="stream must be"):
        paddle_rt.malloc(16, stream=-1)
    x.record_stream(b)
    x.free()
    with pytest.raises(InvalidArgument, match=r"rt_cpu:0: record_stream of 0x[0-9a-f]+: the allocation was freed"):
        x.record_stream(b)
    with pytest.raises(InvalidArgument, match="already freed"):
        x.free()
    closed = paddle_rt.Stream()
    closed.close()
    with pytest.raises(paddle_rt.StreamError, match="closed"):
        paddle_rt.malloc(16, stream=closed)
    b.synchronize()
    assert _deferred_frees_pending() == 0


def test_views_block_the_free_and_the_state_is_unchanged(streams):
    a, b = streams
    x = paddle_rt.malloc(N)
    x.record_stream(b)
    v = np.asarray(x)
    with pytest.raises(BufferError):
        x.free()
    assert not x.freed and x.recorded == (b,) and _deferred_frees_pending() == 0
    del v
    x.free()
    b.synchronize()
    assert _deferred_frees_pending() == 0


RACE_CHILD = r"""
import ctypes, paddle_rt, numpy as np
from paddle_rt._core.allocation import _deferred_frees_pending
N = 1 << 16
a, b = paddle_rt.Stream(), paddle_rt.Stream()
for record in (True, False):
    with paddle_rt.stream(a):
        x = paddle_rt.malloc(N)
    ctypes.memset(x.ptr, 0x5A, N)
    dst = paddle_rt.malloc(N)
    paddle_rt.memcpy_async(dst, x, stream=b)     # b's pending (delayed) work reads x
    if record:
        x.record_stream(b)
    p = x.ptr
    x.free()
    with paddle_rt.stream(a):
        y = paddle_rt.malloc(N)                  # a's next allocation of the same size
        paddle_rt.memset_async(y, 0xEE, stream=a)
    same = y.ptr == p
    a.synchronize(); b.synchronize()
    if record:
        assert bytes(np.asarray(dst)) == b"\x5a" * N     # what a wrote never reached b's read
        with paddle_rt.stream(a):
            z = paddle_rt.malloc(N)              # b passed the free: now it is reused
        print("after", z.ptr == p)
        z.free()
    print("record" if record else "plain", same)
    y.free(); dst.free()
print("pending", _deferred_frees_pending())
"""


def test_poison_race_under_stream_delay():
    res = run_python_code(RACE_CHILD, env={"RT_CPU_STREAM_DELAY_US": "20000"})
    assert res.returncode == 0, res.stderr
    out = dict(line.split() for line in res.stdout.split("\n") if line)
    assert out == {"record": "False", "after": "True", "plain": "True", "pending": "0"}


# The start of the OOM children: a 40 MiB block freed after record_stream(b) while b is held by a gate, so that its
# free stays deferred until the gate opens.
DEFERRED_40MIB = r"""
import threading, paddle_rt
from paddle_rt import plugins, MemPool, OutOfMemoryError
from paddle_rt._core.allocation import _deferred_frees_pending
MiB = 1 << 20
b = paddle_rt.Stream()
x = paddle_rt.malloc(40 * MiB)
gate = threading.Event()
b.add_callback(lambda: gate.wait(20))
x.record_stream(b)
x.free()
"""

OOM_CHILD = DEFERRED_40MIB + r"""
assert _deferred_frees_pending() == 1
assert paddle_rt.memory_allocated() >= 40 * MiB
paddle_rt.set_allocator_config(growth_wait_ms=0)    # the growth does not wait first: the OOM ladder's own wait
threading.Timer(0.3, gate.set).start()
y = paddle_rt.malloc(48 * MiB)     # does not fit beside the deferred 40 MiB: the ladder waits for b, then retries
assert gate.is_set() and _deferred_frees_pending() == 0
st = paddle_rt.memory_stats()
print("retries", st["num_alloc_retries"] >= 1)
try:
    paddle_rt.malloc(80 * MiB)
except OutOfMemoryError as e:
    print("OOM", e.device)
y.free()
b.synchronize()
paddle_rt.empty_cache()
print("live", plugins.rt_cpu_live_bytes(0))
"""


def test_oom_ladder_waits_for_deferred_frees():
    res = run_python_code(OOM_CHILD, env={"RT_CPU_MEMORY_BYTES": str(64 << 20)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:3] == ["retries True", "OOM rt_cpu:0", "live 0"]


GROWTH_WAIT_CHILD = DEFERRED_40MIB + r"""
assert _deferred_frees_pending() == 1
threading.Timer(0.3, gate.set).start()
st0 = paddle_rt.memory_stats()
y = paddle_rt.malloc(48 * MiB)     # a growth while a record_stream free is pending: it waits for that free first
assert gate.is_set() and _deferred_frees_pending() == 0
st = paddle_rt.memory_stats()
d = {k: st[k] - st0[k] for k in ("num_free_waits", "num_alloc_retries", "num_ooms")}
print("waits", d["num_free_waits"], "retries", d["num_alloc_retries"], "ooms", d["num_ooms"])
y.free()
b.synchronize()
paddle_rt.empty_cache()
print("live", plugins.rt_cpu_live_bytes(0))
"""


def test_a_growth_waits_for_pending_record_stream_frees():
    """A growth while a record_stream free is pending waits (growth_wait_ms) until it has finished and then serves
    the request from that memory: no out-of-memory ladder, no retry; the 40 MiB went back before the 48 MiB."""
    res = run_python_code(GROWTH_WAIT_CHILD, env={"RT_CPU_MEMORY_BYTES": str(64 << 20)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["waits 1 retries 0 ooms 0", "live 0"], res.stdout


POOL_OOM_CHILD = DEFERRED_40MIB + r"""
threading.Timer(0.3, gate.set).start()
pool = MemPool()
y = pool.malloc_async(48 * MiB, b)  # the pool's ladder also waits for the allocator's deferred frees
assert gate.is_set() and _deferred_frees_pending() == 0
pool.free_async(y)
print("OK")
"""


def test_pool_oom_ladder_waits_for_deferred_frees():
    res = run_python_code(POOL_OOM_CHILD, env={"RT_CPU_MEMORY_BYTES": str(64 << 20)})
    assert res.returncode == 0, res.stderr
    assert "OK" in res.stdout


EXIT_CHILD = r"""
import atexit
def check():
    from paddle_rt import plugins
    print("live after exit", plugins.rt_cpu_live_bytes(0), flush=True)
atexit.register(check)             # registered first: runs after paddle_rt's teardown
import time, paddle_rt
b = paddle_rt.Stream()
x = paddle_rt.malloc(1 << 20)
b.add_callback(time.sleep, 0.3)
x.record_stream(b)
x.free()                           # still pending at exit: the streams' teardown runs it, then the allocator's
y = paddle_rt.malloc(1 << 20)
y.record_stream(b)                 # never freed: returned by the allocator's teardown
print("exiting")
"""


def test_pending_deferred_free_at_exit():
    res = run_python_code(EXIT_CHILD)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["exiting", "live", "after", "exit", "0"]
    assert "teardown" not in res.stderr and "Error" not in res.stderr, res.stderr


def test_nothing_leaked(streams):
    a, b = streams
    allocated = paddle_rt.memory_allocated()
    for i in range(50):
        with paddle_rt.stream(a if i % 2 else None):
            x = paddle_rt.malloc(N + i * 512)
        x.record_stream(b if i % 3 else a)
        if i % 5 == 0:
            b.add_callback(lambda: None)
        x.free()
    a.synchronize()
    b.synchronize()
    assert _deferred_frees_pending() == 0
    assert paddle_rt.memory_allocated() == allocated
    paddle_rt.empty_cache()
    assert plugins.rt_cpu_live_bytes(0) == paddle_rt.memory_reserved()


# ----------------------------------------------------------------------------------------------------------------------
# A state machine: malloc on random current streams, record_stream, free, busy streams, synchronize; no block is handed
# out again before every recorded stream passed its free, and never to another stream's allocation.
# ----------------------------------------------------------------------------------------------------------------------
from hypothesis import settings, strategies as st                                       # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, rule, precondition, initialize     # noqa: E402

SIZES = [256, 512, 4096, 3 * 4096]


class RecordStreamMachine(RuleBasedStateMachine):

    @initialize()
    def setup(self):
        self.base_allocated = paddle_rt.memory_allocated()
        self.streams = [paddle_rt.Stream() for _ in range(3)]
        self.live = []            # (Allocation, stream index or None for the default stream)
        self.freed = []           # [lo, hi, stream tag, [(stream index, position before the free)]]

    def _guarded_ok(self, lo, hi, tag):
        for f in self.freed:
            if f[0] < hi and lo < f[1]:
                assert f[2] == tag, "a block freed on one stream went to another stream's allocation"
                for j, pos in f[3]:
                    assert self.streams[j].completed_position >= pos, \
                        f"reused before stream {j} passed the free (completed {self.streams[j].completed_position} " \
                        f"< {pos})"
        self.freed = [f for f in self.freed if not (f[0] < hi and lo < f[1])]

    @rule(size=st.sampled_from(SIZES), i=st.sampled_from([None, 0, 1, 2]))
    def malloc(self, size, i):
        with paddle_rt.stream(None if i is None else self.streams[i]):
            a = paddle_rt.malloc(size)
        self._guarded_ok(a.ptr, a.ptr + size, a.stream_tag)
        self.live.append((a, i))

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 100), j=st.integers(0, 2))
    def record(self, k, j):
        a, _ = self.live[k % len(self.live)]
        self.streams[j].add_callback(lambda: None)          # a use of the memory on j
        a.record_stream(self.streams[j])

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 100))
    def free(self, k):
        a, i = self.live.pop(k % len(self.live))
        rec = [(self.streams.index(y), y.position) for y in a.recorded]
        self.freed.append([a.ptr, a.ptr + a.size, a.stream_tag, rec])
        a.free()

    @rule(j=st.integers(0, 2), ms=st.sampled_from([0.0005, 0.002]))
    def busy(self, j, ms):
        import time
        self.streams[j].add_callback(time.sleep, ms)

    @rule(j=st.integers(0, 2))
    def sync(self, j):
        self.streams[j].synchronize()

    def teardown(self):
        if not hasattr(self, "streams"):
            return
        for a, _ in self.live:
            a.free()
        for s in self.streams:
            s.synchronize()
        assert _deferred_frees_pending() == 0
        assert paddle_rt.memory_allocated() == self.base_allocated
        for s in self.streams:
            s.close()


RecordStreamMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
test_record_stream_state_machine = RecordStreamMachine.TestCase


def test_closing_the_recorded_stream_runs_the_pending_free():
    b = paddle_rt.Stream()
    x = paddle_rt.malloc(N)
    g = GatedReader(b)
    x.record_stream(b)
    p = x.ptr
    x.free()
    assert _deferred_frees_pending() == 1
    threading.Timer(0.1, g.gate.set).start()
    b.close()                                  # waits for b's work, the deferred free included
    assert _deferred_frees_pending() == 0
    y = paddle_rt.malloc(N)
    assert y.ptr == p
    y.free()


FORK_CHILD = r"""
import os, paddle_rt
b = paddle_rt.Stream()
x = paddle_rt.malloc(4096)
y = paddle_rt.malloc(4096)
x.record_stream(b)
y.record_stream(b)
pid = os.fork()
if pid == 0:
    # the child: the parent's allocator and streams are not usable; free() raises ForkError (issue 46 item 7),
    # dropping an Allocation (garbage collection) does nothing
    try:
        try:
            x.free()
            code = 2
        except paddle_rt.ForkError:
            code = 0
        del y
    except BaseException as e:
        print("child error", repr(e), flush=True)
        code = 1
    os._exit(code)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
x.free(); y.free(); b.synchronize()
from paddle_rt._core.allocation import _deferred_frees_pending
print("pending", _deferred_frees_pending())
"""


def test_fork_child_frees_recorded_blocks_harmlessly():
    res = run_python_code(FORK_CHILD)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["child", "0", "pending", "0"]


def test_threads_free_recorded_blocks_concurrently():
    """Several threads allocate on their own streams, record a shared stream and free, while that stream's worker
    returns the deferred blocks under the allocator's lock: nothing is lost, no block is handed out twice."""
    shared = paddle_rt.Stream()
    allocated = paddle_rt.memory_allocated()

    def worker(k):
        own = paddle_rt.Stream()
        held = []
        for i in range(300):
            with paddle_rt.stream(own if i % 2 else None):
                x = paddle_rt.malloc(256 * (1 + (i + k) % 4))
            ctypes.memset(x.ptr, k, x.size)
            held.append(x)
            if i % 7 == 0:
                shared.add_callback(lambda: None)
            x.record_stream(shared)
            if len(held) > 4:
                y = held.pop(0)
                assert ctypes.string_at(y.ptr, y.size) == bytes([k]) * y.size   # nobody else got it
                y.free()
        for y in held:
            y.free()
        own.synchronize()
        own.close()

    errors = run_workers(worker)
    shared.synchronize()
    assert not errors, errors
    assert _deferred_frees_pending() == 0
    assert paddle_rt.memory_allocated() == allocated
    shared.close()
