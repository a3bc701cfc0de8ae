"""Giving cached memory back to the plugin never races with queued stream work (paddle_rt/_core/allocator.pyx with
stream.pyx's registry of live streams): empty_cache, the growth path, the out-of-memory ladders (allocator and
pool), ``release:free`` and pinned host memory, with work still pending on a stream that uses the memory. Each case
runs in a child process (the delays and capacities are plugin environment variables; a use after free would crash
the child). A slow host callback queued before the work keeps it pending for a while."""
import pytest

from conftest import run_python_code

MiB = 1 << 20

PRELUDE = """
import sys, time, threading
import numpy as np
import paddle_rt
from paddle_rt import plugins
from paddle_rt._core import allocator as A
MiB = 1 << 20
def busy(s):
    # everything queued on s after this waits until the returned gate is set (a window that lasts as long as the
    # test needs, whatever the machine's speed)
    gate = threading.Event()
    s.add_callback(gate.wait, 60)
    return gate
def open_soon(gate, secs=0.2):
    # open the gate from another thread while this one is in a call that waits for the stream (the call's result
    # does not depend on when: only that the call returns)
    threading.Timer(secs, gate.set).start()
def deferred(dev=None):
    return paddle_rt.memory_stats(dev)["num_release_deferred"]
def busy_fill(s, a, value, h=None):
    # s held busy (returns the gate), then a filled with value on s and copied into the host array h when given
    gate = busy(s)
    paddle_rt.memset_async(a, value, stream=s)
    if h is not None:
        paddle_rt.memcpy_async(h, a, stream=s)
    return gate
def stream_block(n):
    s = paddle_rt.Stream()
    with paddle_rt.stream(s):
        return s, paddle_rt.malloc(n)
"""


def run(code, timeout=60, **env):
    r = run_python_code(PRELUDE + code, env={k: str(v) for k, v in env.items()}, timeout=timeout)
    assert r.returncode == 0, f"child failed ({r.returncode}):\nstdout:{r.stdout}\nstderr:{r.stderr}"
    assert "OK" in r.stdout, r.stdout + r.stderr
    return r


@pytest.mark.smoke
def test_empty_cache_waits_for_pending_work_then_releases():
    run("""
s, a = stream_block(8 * MiB)             # a block that belongs to the new stream s
h = np.zeros(8 * MiB, np.uint8)
gate = busy_fill(s, a, 7, h)
a.free()                                      # stream-ordered: the block returns to s's cache at once
assert paddle_rt.memory_reserved() == 8 * MiB
assert not s.query()
open_soon(gate)
released = paddle_rt.empty_cache()            # waits for s, then really gives the chunk back
assert released == 8 * MiB, released
assert s.query()
assert paddle_rt.memory_reserved() == 0
assert plugins.rt_cpu_live_bytes(0) == 0
s.synchronize()                               # no plugin error, no callback error
assert (h == 7).all()
print("OK")
""")


def test_growth_keeps_idle_chunk_while_its_stream_is_busy():
    # growth_wait_ms:0: the growth does not wait for s (the rule alone; test_alloc_segment.py has the waits)
    run(PADDLE_RT_ALLOC_CONF="expandable_segments:0,growth_wait_ms:0", code="""
s = paddle_rt.Stream()
h = np.zeros(8 * MiB, np.uint8)
with paddle_rt.stream(s):
    a = paddle_rt.malloc(8 * MiB)
    gate = busy_fill(s, a, 3, h)
    a.free()                                  # the chunk is idle, the memset still pending
    n0 = plugins.rt_cpu_live_bytes(0)
    b = paddle_rt.malloc(32 * MiB)            # a miss: growth would consolidate (release) s's idle chunk
assert deferred() >= 1
assert not s.query()
assert plugins.rt_cpu_live_bytes(0) >= n0 + 32 * MiB     # the 8 MiB chunk is still held
gate.set()
s.synchronize()
assert (h == 3).all()
b.free()
paddle_rt.empty_cache()
assert paddle_rt.memory_reserved() == 0 and plugins.rt_cpu_live_bytes(0) == 0
print("OK")
""")


def test_segments_take_no_donor_page_while_a_stream_is_busy():
    """With expandable segments, a page under a freed block is not unmapped for use elsewhere (a donor page) while
    work queued before the free may still write it: the range creates new pages instead. (The memset used to land
    on an unmapped page: SIGSEGV in device_memory_set.) growth_wait_ms:0: the growth does not wait for s first."""
    run(PADDLE_RT_ALLOC_CONF="expandable_segments:1,growth_wait_ms:0", code="""
assert paddle_rt.allocator_config()["expandable_active"]
s = paddle_rt.Stream()
h = np.zeros(8 * MiB, np.uint8)
with paddle_rt.stream(s):
    a = paddle_rt.malloc(8 * MiB)
    pin = paddle_rt.malloc(MiB)               # after a: a's block is not the range's free end
    gate = busy_fill(s, a, 3, h)
    a.free()                                  # four whole free pages, the memset still pending
    st0 = paddle_rt.memory_stats()
    b = paddle_rt.malloc(32 * MiB)            # a miss: the range grows; no donor while s is busy
st1 = paddle_rt.memory_stats()
assert not s.query()
assert st1["num_unmaps"] == st0["num_unmaps"]
assert st1["num_device_alloc"] - st0["num_device_alloc"] == 16
gate.set()
s.synchronize()
assert (h == 3).all()
st2 = paddle_rt.memory_stats()
c = paddle_rt.malloc(40 * MiB)                # idle now: a's pages may be given to the range's end
assert paddle_rt.memory_stats()["num_unmaps"] > st2["num_unmaps"]
for x in (b, c, pin):
    x.free()
paddle_rt.empty_cache()
assert paddle_rt.memory_reserved() == 0 and plugins.rt_cpu_live_bytes(0) == 0
print("OK")
""")


def test_release_on_free_keeps_chunk_until_streams_finish():
    run("""
assert paddle_rt.allocator_config()["release"] == "free"
s = paddle_rt.Stream()
h = np.zeros(8 * MiB, np.uint8)
with paddle_rt.stream(s):
    a = paddle_rt.malloc(8 * MiB)
gate = busy_fill(s, a, 5, h)
frees = paddle_rt.memory_stats()["num_device_free"]
a.free()                                      # release:free would give the chunk back now: kept instead
assert paddle_rt.memory_stats()["num_device_free"] == frees
assert deferred() == 1
assert paddle_rt.memory_reserved() == 8 * MiB and plugins.rt_cpu_live_bytes(0) == 8 * MiB
gate.set()
s.synchronize()
assert (h == 5).all()
# kept chunks are released by the next free that makes a chunk idle while the streams are idle ...
c = paddle_rt.malloc(1 * MiB, stream=12345)
c.free()
assert paddle_rt.memory_reserved() == 0 and plugins.rt_cpu_live_bytes(0) == 0
# ... or by empty_cache
with paddle_rt.stream(s):
    a = paddle_rt.malloc(8 * MiB)
gate = busy_fill(s, a, 1)
a.free()
assert paddle_rt.memory_reserved() == 8 * MiB
open_soon(gate)
assert paddle_rt.empty_cache() == 8 * MiB
assert paddle_rt.memory_reserved() == 0 and plugins.rt_cpu_live_bytes(0) == 0
s.synchronize()
print("OK")
""", PADDLE_RT_ALLOC_CONF="release:free")


def test_oom_ladder_waits_for_streams_then_releases():
    run("""
s = paddle_rt.Stream()
h = np.zeros(40 * MiB, np.uint8)
for alloc in ("malloc", "raw"):
    with paddle_rt.stream(s):
        a = paddle_rt.malloc(40 * MiB)
    gate = busy_fill(s, a, 9, h)
    a.free()
    open_soon(gate)
    # another stream cannot reuse s's block: the ladder must give s's chunk back, after s finished with it
    if alloc == "malloc":
        b = paddle_rt.malloc(40 * MiB)
        assert s.query()
        assert (h == 9).all()
        b.free()
    else:
        p = paddle_rt.raw_malloc(40 * MiB)
        assert s.query()
        assert (h == 9).all()
        paddle_rt.raw_free(p)
    h[:] = 0
    s.synchronize()
    paddle_rt.empty_cache()
# each time the growth first waited (growth_wait_ms) for s to run past its free, then moved s's free pages
assert paddle_rt.memory_stats()["num_free_waits"] >= 2
print("OK")
""", RT_CPU_MEMORY_BYTES=64 * MiB)


def test_pool_oom_ladder_waits_for_other_streams():
    run("""
s = paddle_rt.Stream()
t = paddle_rt.Stream()
h = np.zeros(40 * MiB, np.uint8)
for internal in (False, True):
    pool = paddle_rt.MemPool(reuse_allow_internal_dependencies=internal)
    with paddle_rt.stream(s):
        a = paddle_rt.malloc(40 * MiB)
    gate = busy_fill(s, a, 4, h)
    a.free()
    open_soon(gate)
    b = pool.malloc_async(40 * MiB, stream=t)
    if not internal:
        assert s.query()                      # the ladder waited for s before s's memory went to t
    # with internal dependencies t takes s's memory at once and waits for s on the device instead
    paddle_rt.memset_async(b, 5, stream=t)
    t.synchronize()
    s.synchronize()
    assert (h == 4).all()                     # s's pending work read its own data, not t's
    pool.free_async(b)
    t.synchronize()
    del pool
    paddle_rt.empty_cache()
print("OK")
""", RT_CPU_MEMORY_BYTES=64 * MiB)


def test_pinned_host_memory_waits_for_pending_copy():
    run("""
s, d = stream_block(8 * MiB)             # a block that belongs to the new stream s
hb = paddle_rt.malloc_host(8 * MiB)
np.frombuffer(hb, np.uint8)[:] = 6
out = np.zeros(8 * MiB, np.uint8)
host0 = plugins.rt_cpu_host_live_bytes()
gate = busy(s)
paddle_rt.memcpy_async(d, hb, stream=s)       # H2D from pinned memory, pending
paddle_rt.memcpy_async(out, d, stream=s)
hb.free()
open_soon(gate)
assert paddle_rt.empty_cache() >= 8 * MiB     # waits for s, then the pinned chunk goes back too
assert plugins.rt_cpu_host_live_bytes() == host0 - 8 * MiB
s.synchronize()
assert (out == 6).all()
# release:free on the host allocator: kept while busy
A.get_allocator(kind="host").configure(release="free")
hb = paddle_rt.malloc_host(8 * MiB)
np.frombuffer(hb, np.uint8)[:] = 2
gate = busy(s)
paddle_rt.memcpy_async(d, hb, stream=s)
paddle_rt.memcpy_async(out, d, stream=s)
hb.free()
assert A.get_allocator(kind="host").stats()["num_release_deferred"] == 1
gate.set()
s.synchronize()
assert (out == 2).all()
assert paddle_rt.empty_cache() >= 8 * MiB
print("OK")
""")


def test_free_inside_callback_with_release_on_free_does_not_deadlock():
    run("""
s, a = stream_block(8 * MiB)             # a block that belongs to the new stream s
h = np.zeros(8 * MiB, np.uint8)
gate = busy_fill(s, a, 8)
s.add_callback(a.free)                        # on s's worker: s itself is busy -> the chunk is kept
gate.set()
s.synchronize()
assert deferred() == 1
assert paddle_rt.memory_reserved() == 8 * MiB
assert paddle_rt.empty_cache() == 8 * MiB
assert plugins.rt_cpu_live_bytes(0) == 0
print("OK")
""", timeout=30, PADDLE_RT_ALLOC_CONF="release:free")


def test_empty_cache_inside_callback_does_not_wait_for_its_own_stream():
    run("""
s = paddle_rt.Stream()
t = paddle_rt.Stream()
with paddle_rt.stream(t):
    a = paddle_rt.malloc(8 * MiB)
a.free()
out = []
def cb():
    out.append(paddle_rt.empty_cache())
gate = busy(s)
s.add_callback(cb)
gate.set()
s.synchronize()                               # no StreamError, no deadlock
# s (running the callback) is busy, t is not: t's memory, whose free has run, goes back; nothing waits
assert out == [8 * MiB], out
assert paddle_rt.memory_reserved() == 0
with paddle_rt.stream(s):
    c = paddle_rt.malloc(8 * MiB)
gate = busy(s)
s.add_callback(cb)
paddle_rt.memset_async(c, 1, stream=s)        # queued after the callback: it still uses c when the callback runs
c.free()
gate.set()
s.synchronize()
assert out[1] == 0, out                       # c's free has not run when the callback does: kept, not lost
assert paddle_rt.memory_reserved() == 8 * MiB
assert paddle_rt.empty_cache() == 8 * MiB
print("OK")
""", timeout=30)


def test_registry_forgets_closed_streams():
    run("""
for i in range(3):
    s = paddle_rt.Stream()
    with paddle_rt.stream(s):
        a = paddle_rt.malloc(8 * MiB)
    gate = busy_fill(s, a, 1)
    a.free()
    open_soon(gate, 0.05)
    s.close()                                 # waits for its work; the stream leaves the registry
    del s
    # release:free: the next free that makes a chunk idle releases at once (no stale busy stream)
    c = paddle_rt.malloc(1 * MiB, stream=777)
    c.free()
    assert paddle_rt.memory_reserved() == 0, paddle_rt.memory_reserved()
    assert plugins.rt_cpu_live_bytes(0) == 0
# a stream dropped without close() leaves the registry too
s = paddle_rt.Stream()
open_soon(busy(s), 0.05)
del s
import gc; gc.collect()
c = paddle_rt.malloc(1 * MiB)
c.free()
assert paddle_rt.memory_reserved() == 0
print("OK")
""", timeout=30, PADDLE_RT_ALLOC_CONF="release:free")


def test_busy_stream_of_another_device_does_not_block_release():
    run("""
s1 = paddle_rt.Stream("rt_cpu:1")
gate = busy(s1)                               # closed until the end: empty_cache would hang if it waited for s1
a = paddle_rt.malloc(8 * MiB, device="rt_cpu:0")
a.free()
assert paddle_rt.empty_cache("rt_cpu:0") == 8 * MiB   # rt_cpu:0 has no busy stream: no waiting for rt_cpu:1
assert not s1.query()
gate.set()
s1.synchronize()
print("OK")
""", timeout=30)


def test_registry_tracks_open_streams_only():
    run("""
from paddle_rt._core import stream as S
d0 = paddle_rt.device("rt_cpu:0")
n0, idle0 = S._registry_count(d0)
assert idle0
s = paddle_rt.Stream(d0)
t = paddle_rt.Stream(d0)
assert S._registry_count(d0)[0] == n0 + 2
gate = busy(s)
assert S._registry_count(d0) == (n0 + 2, False)
assert S._registry_count("rt_cpu:1")[1]             # another device's streams are not s
gate.set()
s.close()
assert S._registry_count(d0) == (n0 + 1, True)
del t
import gc; gc.collect()
assert S._registry_count(d0)[0] == n0
print("OK")
""", timeout=30)


def test_fork_child_starts_with_an_empty_registry():
    run("""
import os
from paddle_rt._core import stream as S
s = paddle_rt.Stream()
gate = busy(s)                                # the parent's stream is busy at the fork
pid = os.fork()
if pid == 0:
    ok = S._registry_count() == (0, True)     # the parent's (worker-less) streams are forgotten
    paddle_rt.reinitialize_after_fork()
    a = paddle_rt.malloc(8 * MiB)
    a.free()
    ok = ok and paddle_rt.empty_cache() == 8 * MiB and paddle_rt.memory_reserved() == 0
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.WEXITSTATUS(status) == 0, status
gate.set()
s.synchronize()
print("OK")
""", timeout=30)


@pytest.mark.parametrize("conf", ["", "release:free"])
def test_threads_with_streams_and_empty_cache(conf):
    # four threads each reuse memory on their own stream (stream-ordered frees while work is pending) while a fifth
    # empties the cache and a callback frees; every copy must see its own memset, nothing may crash or hang
    run("""
errors = []
def worker(k):
    try:
        s = paddle_rt.Stream()
        outs = []
        for i in range(30):
            with paddle_rt.stream(s):
                a = paddle_rt.malloc((1 + (i % 5)) * MiB)
            h = np.zeros(a.size, np.uint8)
            v = (k * 31 + i) % 251 + 1
            if i % 7 == 0:
                open_soon(busy(s), 0.01)
            paddle_rt.memset_async(a, v, stream=s)
            paddle_rt.memcpy_async(h, a, stream=s)
            if i % 3 == 0:
                s.add_callback(a.free)
            else:
                a.free()
            outs.append((h, v))
        s.synchronize()
        for h, v in outs:
            if not (h == v).all():
                errors.append(("content", k))
        s.close()
    except BaseException as e:
        errors.append(repr(e))
stop = []
def emptier():
    while not stop:
        paddle_rt.empty_cache()
        time.sleep(0.002)
ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
e = threading.Thread(target=emptier)
e.start()
for t in ts: t.start()
for t in ts: t.join()
stop.append(1)
e.join()
assert not errors, errors
assert paddle_rt.memory_allocated() == 0
paddle_rt.empty_cache()
assert paddle_rt.memory_reserved() == 0 and plugins.rt_cpu_live_bytes(0) == 0
print("OK")
""", timeout=120, **({"PADDLE_RT_ALLOC_CONF": conf} if conf else {}))


def test_p2p_copy_stream_counts_for_both_devices():
    # a P2P copy on a stream of rt_cpu:1 reads rt_cpu:0's memory: releasing rt_cpu:0's chunk must wait for it
    run("""
from paddle_rt._core import stream as S
s1 = paddle_rt.Stream("rt_cpu:1")
a = paddle_rt.malloc(8 * MiB, device="rt_cpu:0")
paddle_rt.memset(a, 4)
b = paddle_rt.malloc(8 * MiB, device="rt_cpu:1", stream=s1)
h = np.zeros(8 * MiB, np.uint8)
gate = busy(s1)
paddle_rt.memcpy_async(b, a, stream=s1)       # P2P: s1 reads rt_cpu:0's memory
paddle_rt.memcpy_async(h, b, stream=s1)
a.free()
assert not S._registry_count("rt_cpu:0")[1]   # s1 now counts for rt_cpu:0 too
open_soon(gate)
assert paddle_rt.empty_cache("rt_cpu:0") == 8 * MiB    # waited for s1
assert s1.query() and (h == 4).all()
s1.synchronize()
print("OK")
""", timeout=30)
