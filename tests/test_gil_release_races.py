"""Regression tests of issue 33: what another thread may change while the allocator, the pools and the streams have
released the GIL (docs/concurrency.md). Each test forces its interleaving (gated callbacks, rt_cpu's run-time fault
delays) instead of relying on luck."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

MiB = 1 << 20


@pytest.fixture
def package_parent_dir():
    import paddle_rt
    return os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))

OOM_LADDER_CHILD = r"""
import threading, time, numpy as np, paddle_rt
from paddle_rt import MemPool, OutOfMemoryError
MiB = 1 << 20
pool = MemPool(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
               reuse_allow_internal_dependencies=False)
a, b, c, d, t = (paddle_rt.Stream() for _ in range(5))
x = pool.malloc_async(32 * MiB, a)
gate_a, gate_t = threading.Event(), threading.Event()
a.add_callback(gate_a.wait, 30)
pool.free_async(x, a)                     # pending on a (a is held by its gate)
res = {}
def pressure():                           # out of memory: the pool's OOM ladder waits for a, GIL released
    try:
        res["y"] = pool.malloc_async(40 * MiB, b)
    except OutOfMemoryError as e:
        res["y"] = e
th = threading.Thread(target=pressure)
th.start()
time.sleep(0.5)
assert th.is_alive() and "y" not in res       # the pressure thread waits inside the ladder (snapshot taken)
# meanwhile: a block freed with a pending record_stream use (t's copy has not run: t is held by its gate)
v = pool.malloc_async(4 * MiB, c)
paddle_rt.memset_async(v, 0x11, stream=c)
e = paddle_rt.Event(); e.record(c); t.wait_event(e)
t.add_callback(gate_t.wait, 30)
h = np.zeros(4 * MiB, np.uint8)
paddle_rt.memcpy_async(h, v, stream=t)
v.record_stream(t)
pool.free_async(v, c)
gate_a.set()                              # the ladder goes on: it gives back its snapshot, then waits for t
deadline = time.time() + 20
while pool.stats()["cached"] > 4 * MiB and time.time() < deadline:
    time.sleep(0.01)
# v's block must still be the pool's: another allocation may not get it before t's copy ran
w = pool.malloc_async(4 * MiB, d)
paddle_rt.memset_async(w, 0x22, stream=d)
d.synchronize()
print("cached", pool.stats()["cached"])
gate_t.set()
t.synchronize()
th.join(30)
assert not th.is_alive()
print("copy", "ok" if (h == 0x11).all() else f"WRONG {np.unique(h)}")
pool.free_async(w, d); d.synchronize()
if not isinstance(res["y"], Exception):
    pool.free_async(res["y"], b)
for s in (a, b, c, d, t):
    s.synchronize()
pool.trim_to(0)
print("used", pool.stats()["used_mem_current"])
"""


@pytest.mark.smoke
def test_oom_ladder_keeps_blocks_freed_during_its_wait(run_python):
    """Cause (a): the OOM ladder waited (GIL released) for a snapshot of the streams, then gave back every cached block,
    including one freed meanwhile whose record_stream use had not run: another allocation got that memory and the
    pending copy read the new owner's bytes."""
    res = run_python(OOM_LADDER_CHILD, env={"RT_CPU_MEMORY_BYTES": str(64 * MiB)})
    assert res.returncode == 0, res.stderr
    out = dict(line.split(None, 1) for line in res.stdout.splitlines() if line)
    assert out["copy"] == "ok"
    assert int(out["cached"]) == 4 * MiB          # v still held (its use on t pending)
    assert out["used"] == "0"


CLOSE_DURING_RECORD_CHILD = r"""
import threading, time, paddle_rt
from paddle_rt import MemPool, StreamError
from paddle_rt.plugins import rt_cpu_set_fault, rt_cpu_clear_faults
# 1. Event.record: the plugin's create_event releases the GIL; the stream is closed meanwhile by another thread
s = paddle_rt.Stream()
rt_cpu_set_fault("create_event", delay_us=600_000)
out = {}
def record():
    try:
        paddle_rt.Event().record(s)
        out["record"] = "recorded"
    except StreamError as e:
        out["record"] = "StreamError" if "clos" in str(e) else repr(e)
th = threading.Thread(target=record); th.start()
time.sleep(0.2)
s.close()                                   # while the other thread is inside create_event
th.join()
rt_cpu_clear_faults()
print("record", out["record"])
# 2. the pool's internal-dependency path (malloc_async of another thread records an event on the freeing stream)
pool = MemPool(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False)
a, b = paddle_rt.Stream(), paddle_rt.Stream()
gate = threading.Event()
x = pool.malloc_async(1 << 20, a)
a.add_callback(gate.wait, 30)
pool.free_async(x, a)                       # pending on a: b may take it only with an internal dependency
rt_cpu_set_fault("create_event", delay_us=600_000)
def take():
    try:
        y = pool.malloc_async(1 << 20, b)
        out["malloc"] = "ok"
        pool.free_async(y, b)
    except BaseException as e:
        out["malloc"] = repr(e)
th = threading.Thread(target=take); th.start()
time.sleep(0.2)
gate.set()
a.close()                                   # while the other thread's malloc_async is inside create_event
th.join()
rt_cpu_clear_faults()
b.synchronize()
print("malloc", out["malloc"])
pool.trim_to(0)
print("used", pool.stats()["used_mem_current"], pool.stats()["cached"])
"""


@pytest.mark.smoke
def test_close_while_another_thread_records_an_event(run_python):
    """Cause (b): Event.record_on checked the stream open, released the GIL (create_event), then used the stream's
    freed context (SIGSEGV). Now: StreamError for a plain record; the pool's internal-dependency path skips a stream
    closed meanwhile."""
    res = run_python(CLOSE_DURING_RECORD_CHILD)
    assert res.returncode == 0, (res.returncode, res.stderr)
    out = dict(line.split(None, 1) for line in res.stdout.splitlines() if line)
    assert out["record"] == "StreamError"
    assert out["malloc"] == "ok"
    assert out["used"] == "0 0"


FORK_CHILD = r"""
import os, paddle_rt
from paddle_rt import ForkError
s = paddle_rt.Stream()
a = paddle_rt.malloc_async(1024, s)
pid = os.fork()
if pid == 0:
    ok = 0
    for name, call in [("malloc_async", lambda: paddle_rt.malloc_async(1024, s)),
                       ("malloc_async default", lambda: paddle_rt.malloc_async(1024)),
                       ("MemPool.malloc_async", lambda: __import__("paddle_rt.pool").pool.default_mem_pool().malloc_async(64)),
                       ("malloc", lambda: paddle_rt.malloc(1024))]:
        try:
            call()
            print("no error", name, flush=True)
        except ForkError:
            ok += 1
        except BaseException as e:
            print("wrong", name, repr(e), flush=True)
    os._exit(0 if ok == 4 else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
paddle_rt.free_async(a); s.synchronize()
"""


def test_forked_child_gets_fork_error_from_malloc_async(run_python):
    """Cause (c): the pool reported the parent's allocator (marked forked) as torn down at exit: DeviceError."""
    res = run_python(FORK_CHILD)
    assert res.returncode == 0, res.stderr
    assert "child 0" in res.stdout, res.stdout


@pytest.mark.smoke
def test_close_without_wait_drops_queued_work():
    """close(wait=False): the running operation finishes, queued callbacks/copies/memsets never run, events recorded
    after them complete (nobody waits forever), memory freed on the stream goes back."""
    import threading
    import numpy as np
    import paddle_rt
    from paddle_rt import StreamError
    s = paddle_rt.Stream()
    pool = paddle_rt.MemPool()
    gate = threading.Event()
    ran = []
    s.add_callback(gate.wait, 30)
    a = pool.malloc_async(1 << 16, s)
    host = np.zeros(1 << 16, np.uint8)
    for i in range(50):
        s.add_callback(ran.append, i)
        paddle_rt.memset_async(a, i + 1, stream=s)
    paddle_rt.memcpy_async(host, a, stream=s)
    ev = paddle_rt.Event()
    ev.record(s)
    pool.free_async(a, s)
    threading.Timer(0.2, gate.set).start()
    s.close(wait=False)
    assert s.closed
    assert ran == []
    assert not host.any()                      # the copy was dropped
    assert ev.query()                          # the event completes: nothing waits for it forever
    ev.synchronize()
    with pytest.raises(StreamError):
        s.add_callback(ran.append, 0)
    assert pool.stats()["used_mem_current"] == 0
    pool.trim_to(0)
    assert pool.stats()["reserved_mem_current"] == 0


@pytest.mark.smoke
def test_close_races_close_and_synchronize():
    """Two threads close one stream while a third synchronizes it: one close does the work, the other returns once
    the stream is closed; synchronize returns or raises StreamError (never a crash)."""
    import threading
    import paddle_rt
    from paddle_rt import StreamError
    for _ in range(20):
        s = paddle_rt.Stream()
        for i in range(20):
            s.add_callback(lambda: None)
        errs = []

        def run(fn):
            try:
                fn()
            except StreamError:
                pass
            except BaseException as e:        # pragma: no cover - what the test is for
                errs.append(e)
        ths = [threading.Thread(target=run, args=(f,)) for f in (s.close, s.close, s.synchronize)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        assert not errs and s.closed


EXIT_CHILD = r"""
import os, sys, time, paddle_rt
import numpy as np
counter = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def tick():
    os.write(counter, b"x")
    time.sleep(0.1)
streams = [paddle_rt.Stream() for _ in range(4)]
bufs = [paddle_rt.malloc_async(1 << 20, s) for s in streams]
for s, b in zip(streams, bufs):
    for i in range(150):                       # 4 streams x 150 x (0.1 s + a 0.1 s memset) = 60 s each
        s.add_callback(tick)
        paddle_rt.memset_async(b, i & 0xFF, stream=s)
print("ready", flush=True)
streams[0].synchronize()                        # Ctrl-C arrives here: KeyboardInterrupt, unhandled
"""


def test_exit_after_ctrl_c_abandons_queued_work(tmp_path, package_parent_dir):
    """Exit after an unhandled KeyboardInterrupt does not wait for queued work (as a CUDA process exit): the child
    with 60 s of queued work per stream ends well within the generous limit and most of that work never ran."""
    script = tmp_path / "child.py"
    script.write_text(EXIT_CHILD)
    count = tmp_path / "count"
    env = dict(os.environ, PYTHONPATH=package_parent_dir, RT_CPU_FAULTS="memset:0:0:100000")
    p = subprocess.Popen([sys.executable, str(script), str(count)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=package_parent_dir, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)      # a hang (teardown waiting for the 60 s) fails here
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "KeyboardInterrupt" in err
    ran = count.read_bytes().count(b"x") if count.exists() else 0
    assert ran < 100, ran                       # of 600 queued callbacks


NORMAL_EXIT_CHILD = r"""
import os, sys, time, paddle_rt
counter = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
s = paddle_rt.Stream()
for i in range(20):
    s.add_callback(lambda: (os.write(counter, b"x"), time.sleep(0.01)))
"""


def test_normal_exit_still_waits_for_queued_work(tmp_path, package_parent_dir):
    """The end of the program (no unhandled exception) keeps the documented wait: every queued callback runs."""
    script = tmp_path / "child.py"
    script.write_text(NORMAL_EXIT_CHILD)
    count = tmp_path / "count"
    res = subprocess.run([sys.executable, str(script), str(count)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=package_parent_dir), cwd=package_parent_dir)
    assert res.returncode == 0, res.stderr
    assert count.read_bytes().count(b"x") == 20
