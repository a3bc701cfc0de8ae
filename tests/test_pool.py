"""Stream-ordered memory (paddle_rt/_core/pool.pyx): malloc_async / free_async / MemPool policies / record_stream."""
import ctypes
import threading

import numpy as np
import pytest

import paddle_rt
from paddle_rt import MemPool, malloc_async, free_async, InvalidArgument, OutOfMemoryError

from memory_helpers import GatedReader, run_past, run_workers, two_streams

N = 4096
ORIG = 0x5A
POISON = 0xEE

ALL_OFF = dict(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
               reuse_allow_internal_dependencies=False)


def only(**on):
    kw = dict(ALL_OFF)
    kw.update(on)
    return kw


EXACT = dict(expandable_segments=0, growth="exact", small_size=0)


@pytest.fixture
def streams():
    """Two new streams on an allocator whose chunks are exactly the requests: a stream holds no free memory of its
    own beyond what it freed, so which freed block another stream may take is what the tests see."""
    paddle_rt.empty_cache()
    paddle_rt.set_allocator_config(**EXACT)
    try:
        yield from two_streams()
    finally:
        paddle_rt.set_allocator_config(**{k: None for k in EXACT})


def fill(a, value):
    ctypes.memset(a.ptr, value, a.size)


def test_same_stream_reuse_is_immediate(streams):
    a, _ = streams
    pool = MemPool(**ALL_OFF)
    x = pool.malloc_async(N, a)
    r = GatedReader(a, x.ptr, N)
    p = x.ptr
    pool.free_async(x, a)
    y = pool.malloc_async(N, a)          # ordered after the reader on a: same memory at once
    assert y.ptr == p
    r.gate.set()
    pool.free_async(y)
    a.synchronize()


def _race(pool, a, b, prepare_b=None):
    """a's pending work reads x (filled with ORIG); x is freed on a; b allocates and writes POISON ordered on b.
    Returns (same memory?, what a's pending work read)."""
    x = pool.malloc_async(N, a)
    fill(x, ORIG)
    r = GatedReader(a, x.ptr, N)
    p = x.ptr
    pool.free_async(x, a)
    if prepare_b is not None:
        prepare_b()
    y = pool.malloc_async(N, b)
    paddle_rt.memset_async(y, POISON, stream=b)
    r.gate.set()
    a.synchronize()
    b.synchronize()
    assert r.seen == bytes([ORIG]) * N, "b's writes reached a's pending work"
    assert bytes(np.asarray(y)) == bytes([POISON]) * N
    same = y.ptr == p
    pool.free_async(y, b)
    return same


def _free_after_work_then_malloc_on_other(pool, a, b):
    """Free a block on a behind work that may use it; once a completed (not synchronized by the host), allocate the
    same size on b. Returns the freed block's address and b's block."""
    x = pool.malloc_async(N, a)
    p = x.ptr
    a.add_callback(lambda: None)          # work on a that may use x
    pool.free_async(x, a)
    while not a.query():
        pass
    return p, pool.malloc_async(N, b)


def test_all_policies_off_no_cross_stream_reuse_until_host_sync(streams):
    a, b = streams
    pool = MemPool(**ALL_OFF)
    assert not _race(pool, a, b)
    paddle_rt.empty_cache()               # b's own freed block would serve it first
    # completed but not seen by the host: still not reusable by b
    p, y = _free_after_work_then_malloc_on_other(pool, a, b)
    assert y.ptr != p
    a.synchronize()                       # the host saw the free: now b may take it
    z = pool.malloc_async(N, b)
    assert z.ptr == p
    for m in (y, z):
        pool.free_async(m)


def test_internal_dependencies_on(streams):
    a, b = streams
    pool = MemPool(**only(reuse_allow_internal_dependencies=True))
    assert _race(pool, a, b)              # same memory, b ordered after a's reader by the inserted wait
    assert pool.stats()["reuse_internal_dependencies"] == 1


def test_internal_dependencies_off(streams):
    a, b = streams
    pool = MemPool(**only(reuse_follow_event_dependencies=True, reuse_allow_opportunistic=True))
    assert not _race(pool, a, b)
    assert pool.stats()["reuse_internal_dependencies"] == 0


def test_follow_event_dependencies_on(streams):
    a, b = streams
    pool = MemPool(**only(reuse_follow_event_dependencies=True))

    def b_waits():
        e = paddle_rt.Event()
        e.record(a)
        b.wait_event(e)

    assert _race(pool, a, b, b_waits)
    assert pool.stats()["reuse_follow_event_dependencies"] == 1


def test_follow_event_dependencies_off(streams):
    a, b = streams
    pool = MemPool(**ALL_OFF)

    def b_waits():
        e = paddle_rt.Event()
        e.record(a)
        b.wait_event(e)

    assert not _race(pool, a, b, b_waits)


def test_follow_event_needs_an_event_after_the_free(streams):
    a, b = streams
    pool = MemPool(**only(reuse_follow_event_dependencies=True))
    e = paddle_rt.Event()
    x = pool.malloc_async(N, a)
    e.record(a)                           # before the last use and the free
    b.wait_event(e)
    r = GatedReader(a, x.ptr, N)
    p = x.ptr
    pool.free_async(x, a)
    y = pool.malloc_async(N, b)
    assert y.ptr != p
    r.gate.set()
    pool.free_async(y)


def test_opportunistic_on(streams):
    a, b = streams
    pool = MemPool(**only(reuse_allow_opportunistic=True))
    assert not _race(pool, a, b)          # the free had not completed when b allocated
    paddle_rt.empty_cache()               # b's own freed block would serve it first
    p, y = _free_after_work_then_malloc_on_other(pool, a, b)
    assert y.ptr == p
    assert pool.stats()["reuse_opportunistic"] >= 1
    pool.free_async(y)


def test_opportunistic_off(streams):
    a, b = streams
    pool = MemPool(**only(reuse_follow_event_dependencies=True))
    p, y = _free_after_work_then_malloc_on_other(pool, a, b)
    assert y.ptr != p
    pool.free_async(y)


def _reused_once_ran(pool, r, ran, stream, p, y):
    """Release the reader r and synchronize its stream `ran`: the block at p is handed out again on `stream`. Frees
    that block and y."""
    r.gate.set()
    ran.synchronize()
    z = pool.malloc_async(N, stream)
    assert z.ptr == p
    pool.free_async(y)
    pool.free_async(z)


def test_record_stream_defers_reuse_even_on_the_same_stream(streams):
    a, c = streams
    pool = MemPool(**ALL_OFF)
    x = pool.malloc_async(N, a)
    fill(x, ORIG)
    r = GatedReader(c, x.ptr, N)                  # c uses x
    x.record_stream(c)
    p = x.ptr
    pool.free_async(x, a)
    y = pool.malloc_async(N, a)
    assert y.ptr != p                     # c has not passed the free yet
    paddle_rt.memset_async(y, POISON, stream=a)
    _reused_once_ran(pool, r, c, a, p, y)
    assert r.seen == bytes([ORIG]) * N


def test_free_on_another_stream_waits_for_the_allocating_stream(streams):
    a, b = streams
    pool = MemPool(**only(reuse_allow_opportunistic=True))
    x = pool.malloc_async(N, a)
    r = GatedReader(a, x.ptr, N)
    p = x.ptr
    pool.free_async(x, b)                 # ordered on b, but a's pending work still uses it
    y = pool.malloc_async(N, b)
    assert y.ptr != p
    _reused_once_ran(pool, r, a, b, p, y)


def test_errors(streams):
    a, b = streams
    pool = MemPool()
    x = pool.malloc_async(N, a)
    if paddle_rt.device_count() > 1:
        other = paddle_rt.Stream(paddle_rt.device(1) if hasattr(paddle_rt, "device") else 1)
        with pytest.raises(InvalidArgument, match="rt_cpu:1"):
            pool.free_async(x, other)
        with pytest.raises(InvalidArgument, match="belongs to"):
            pool.malloc_async(N, other)
        other.close()
    assert not x.freed
    view = np.asarray(x)
    with pytest.raises(BufferError):
        free_async(x, a)
    del view
    free_async(x, a)
    with pytest.raises(InvalidArgument, match="double free"):
        free_async(x, a)
    with pytest.raises(InvalidArgument, match="double free"):
        x.free()
    with pytest.raises(BufferError, match="freed"):
        np.asarray(x)
    with pytest.raises(InvalidArgument):
        free_async(paddle_rt.malloc(16), a)
    with pytest.raises(InvalidArgument):
        malloc_async(-1, a)
    with pytest.raises(InvalidArgument):
        malloc_async(16, "stream")
    with pytest.raises(InvalidArgument):
        MemPool(release_threshold=-1)
    with pytest.raises(InvalidArgument):
        x.record_stream(b)
    assert pool.stats()["used_mem_current"] == 0


def _held(pool, a, b, n):
    """A block of n bytes allocated on a and freed on b: the pool holds it back (a's queued work may still use it)."""
    x = pool.malloc_async(n, a)
    pool.free_async(x, b)
    return x.ptr


def test_stats_trim_and_threshold(streams):
    a, b = streams
    pool = MemPool(release_threshold=1 << 30)
    xs = [pool.malloc_async(N * (i + 1), a) for i in range(4)]
    st = pool.stats()
    total = sum(x.size for x in xs)
    assert st["used_mem_current"] >= total and st["used_mem_current"] == st["reserved_mem_current"]
    high = st["used_mem_high"]
    for x in xs[:2]:
        pool.free_async(x, a)             # on its own stream: back to the allocator at once
    for x in xs[2:]:
        pool.free_async(x, b)             # on another stream: held back
    held = xs[2].block_size + xs[3].block_size
    st = pool.stats()
    assert st["used_mem_current"] == 0 and st["cached"] == held and st["reserved_mem_current"] == held
    assert st["used_mem_high"] == high
    a.synchronize()
    b.synchronize()                       # below the threshold: kept
    assert pool.stats()["cached"] == held
    pool.reset_peak()
    assert pool.stats()["used_mem_high"] == 0
    assert pool.trim_to(0) == 0 and pool.stats()["reserved_mem_current"] == 0
    g = threading.Event()
    b.add_callback(lambda: g.wait(20))
    _held(pool, a, b, N)                  # its free on b has not completed: trim_to never touches it
    left = pool.trim_to(0)
    assert left == pool.stats()["cached"] and left >= N
    g.set()
    b.synchronize()
    assert pool.trim_to(0) == 0
    assert pool.stats()["reserved_mem_current"] == 0
    # threshold 0: given back at the next synchronize
    p0 = MemPool(release_threshold=0)
    b.add_callback(lambda: None)
    _held(p0, a, b, N)
    assert p0.stats()["cached"] > 0
    b.synchronize()
    assert p0.stats()["cached"] == 0


@pytest.mark.parametrize("how", ["paddle_rt.synchronize", "Device.synchronize"])
def test_device_synchronize_is_a_synchronize_point(streams, how):
    """After a device synchronize every stream of the device has passed the frees before it: with every policy off,
    another stream reuses them, and cached bytes above the release threshold are given back."""
    a, b = streams
    sync = paddle_rt.synchronize if how == "paddle_rt.synchronize" else paddle_rt.device(0).synchronize
    pool = MemPool(release_threshold=1 << 30, **ALL_OFF)
    x = pool.malloc_async(N, a)
    g = threading.Event()
    a.add_callback(lambda: g.wait(20))    # a has work pending at the free
    p = x.ptr
    pool.free_async(x, a)
    y = pool.malloc_async(N, b)
    assert y.ptr != p                     # no policy allows it and the host has not synchronized with a
    g.set()
    sync()
    z = pool.malloc_async(N, b)
    assert z.ptr == p
    assert pool.stats()["reuse_after_host_sync"] == 1
    pool.free_async(y)
    pool.free_async(z)
    # the release threshold applies at the device synchronize
    p0 = MemPool(release_threshold=N)
    ws = [p0.malloc_async(N, a) for _ in range(3)]
    b.add_callback(lambda: None)
    for w in ws:
        p0.free_async(w, b)               # held back: a's queued work may use them
    assert p0.stats()["cached"] == 3 * N
    sync()
    assert p0.stats()["cached"] == N and p0.stats()["reserved_mem_current"] == N


@pytest.mark.smoke
def test_same_stream_frees_go_back_at_once_for_any_size():
    """A block freed on its own stream goes back to the allocator at once (issue 45): it merges with its free
    neighbours and serves a later request on that stream of another size while the stream's work that may use it is
    still queued; another stream does not get it while that work is pending."""
    # growth_wait_ms=0: b's growth does not first wait for a's queued frees (a is held by the test itself)
    paddle_rt.set_allocator_config(growth_wait_ms=0)
    try:
        for a, b in two_streams():
            _same_stream_frees(a, b)
    finally:
        paddle_rt.set_allocator_config(growth_wait_ms=None)


def _same_stream_frees(a, b):
    pool = MemPool(release_threshold=1 << 30, **ALL_OFF)
    before = paddle_rt.memory_allocated()
    xs = [pool.malloc_async(N, a) for _ in range(20)]
    g = threading.Event()
    a.add_callback(lambda: g.wait(20))
    ptrs = [x.ptr for x in xs]
    for x in xs:
        pool.free_async(x, a)
    assert pool.stats()["cached"] == 0 and pool.stats()["used_mem_current"] == 0
    assert pool.stats()["reserved_mem_current"] == 0 and pool.pending_frees() == []
    assert paddle_rt.memory_allocated() == before
    y = pool.malloc_async(N, b)
    assert not min(ptrs) <= y.ptr <= max(ptrs)  # every free is pending on a
    big = pool.malloc_async(20 * N, a)     # a itself: the merged memory, another size, at once
    assert min(ptrs) <= big.ptr <= max(ptrs) and not g.is_set()
    pool.free_async(big)
    assert pool.trim_to(0) == 0           # nothing held; the allocator keeps a's memory (its free is queued)
    g.set()
    pool.free_async(y)
    a.synchronize()
    b.synchronize()
    assert pool.trim_to(0) == 0 and pool.stats()["reserved_mem_current"] == 0


@pytest.mark.smoke
def test_held_blocks_given_back_when_the_pool_goes():
    s, t = paddle_rt.Stream(), paddle_rt.Stream()
    before = paddle_rt.memory_allocated()
    pool = MemPool()
    for _ in range(3):
        pool.free_async(pool.malloc_async(N, s), s)
    assert paddle_rt.memory_allocated() == before      # same-stream frees: back at once
    t.add_callback(lambda: None)
    for _ in range(3):
        pool.free_async(pool.malloc_async(N, s), t)    # held back by the pool
    assert paddle_rt.memory_allocated() > before
    t.synchronize()                                    # their frees have run: back at once
    del pool
    import gc
    gc.collect()
    assert paddle_rt.memory_allocated() == before
    s.close()
    t.close()


def test_empty_cache_is_a_synchronize_point_for_pools(streams):
    # a block stream b took from a's memory is held by the pool when b frees it (it belongs to a's range);
    # empty_cache() waits for the device's streams: the pool gives it back and the allocator releases it
    a, b = streams
    before = paddle_rt.memory_allocated()
    pool = MemPool(**ALL_OFF)
    x = pool.malloc_async(N, a)
    pool.free_async(x, a)
    a.synchronize()
    y = pool.malloc_async(N, b)                        # a's memory, after the host saw a's free run
    assert pool.stats()["reuse_after_host_sync"] == 1
    pool.free_async(y, b)
    b.add_callback(lambda: None)
    assert pool.stats()["cached"] == N                 # held: b's work may still use it
    paddle_rt.empty_cache()
    assert pool.stats()["cached"] == 0
    assert paddle_rt.memory_allocated() == before


def test_held_blocks_wait_for_their_streams_when_the_pool_goes(streams):
    # a block freed on t while t's queued work still reads it: dropping the pool must not hand it to its owner s
    # (nor to anyone) before t ran that work (the stress workload's TSan run: a second default pool, created by a
    # racing thread, dropped its held blocks into their owners' ranges)
    import gc
    s, t = streams
    before = paddle_rt.memory_allocated()
    pool = MemPool(**ALL_OFF)
    x = pool.malloc_async(N, s)
    p = x.ptr
    fill(x, ORIG)
    r = GatedReader(t, p, N)
    pool.free_async(x, t)
    del x, pool
    gc.collect()
    assert paddle_rt.memory_allocated() > before       # still held: t has not run past the free
    y = paddle_rt.malloc(N, stream=s)
    assert y.ptr != p                                  # s's range does not have it back yet
    fill(y, POISON)
    r.gate.set()
    t.synchronize()
    assert r.seen == bytes([ORIG]) * N
    y.free()
    assert paddle_rt.memory_allocated() == before      # back once t ran past it
    z = paddle_rt.malloc(N, stream=s)
    assert z.ptr == p                                  # and in s's range again
    z.free()


DEFAULT_POOL_RACE = '''
import threading
import paddle_rt
go = threading.Barrier(8)
got = []
def first_use():
    go.wait()
    got.append(paddle_rt.default_mem_pool())
ts = [threading.Thread(target=first_use) for _ in range(8)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(len(got), len({id(p) for p in got}), paddle_rt.default_mem_pool() is got[0])
'''


FORK_WITH_LOCKS_HELD = '''
import os, signal, threading
import paddle_rt
from paddle_rt._core import allocator, pool, stream
paddle_rt.malloc(16).free()
held, done = threading.Event(), threading.Event()
def holder():
    with pool._default_pool_lock, stream._default_lock, allocator._registry_lock:
        held.set()
        done.wait(30)
t = threading.Thread(target=holder)
t.start()
held.wait(30)
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGALRM, lambda *a: os._exit(3))    # a lock of the parent's thread: a hang
    signal.alarm(20)
    paddle_rt.reinitialize_after_fork()
    s = paddle_rt.default_stream()
    a = paddle_rt.malloc_async(64, s)
    paddle_rt.free_async(a, s)
    s.synchronize()
    os._exit(0 if paddle_rt.default_mem_pool() is a.pool else 4)
done.set()
t.join()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
'''


def test_child_of_fork_creates_its_defaults_while_a_parent_thread_held_their_locks(run_python):
    # the default pool's, default stream's and allocator registry's locks, held by another thread at the fork
    res = run_python(FORK_WITH_LOCKS_HELD)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0"]


def test_one_default_pool_when_threads_race_to_create_it(run_python):
    for _ in range(3):
        res = run_python(DEFAULT_POOL_RACE)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["8", "1", "True"]


POLICIES = {"none": ALL_OFF, "opportunistic": only(reuse_allow_opportunistic=True),
            "event": only(reuse_follow_event_dependencies=True),
            "internal": only(reuse_allow_internal_dependencies=True)}


@pytest.mark.smoke
@pytest.mark.parametrize("policy", list(POLICIES))
def test_cross_stream_policies_on_the_allocators_memory(streams, policy):
    """Issue 45: a block freed on its own stream a is the allocator's free memory at once (the pool holds nothing);
    another stream b takes part of it (another size) only as the pool's policies allow: opportunistic once a has run
    past the free (polled, no synchronize), event dependency once b waits on an event recorded on a after the free,
    internal dependency at once with b made to wait on the device (the host never waits); with none, once the host
    synchronized with a. Whatever b got, a's pending work reads its own data."""
    a, b = streams
    pool = MemPool(**POLICIES[policy])
    x = pool.malloc_async(4 * N, a)
    fill(x, ORIG)
    p = x.ptr
    r = GatedReader(a, x.ptr, 4 * N)
    at_free = a.position
    pool.free_async(x, a)
    assert pool.stats()["cached"] == 0             # same stream: the allocator's, merged, at once
    if policy == "event":
        e = paddle_rt.Event()
        e.record(a)
        b.wait_event(e)
    y = pool.malloc_async(2 * N, b)
    ours = p <= y.ptr < p + 4 * N
    assert ours == (policy in ("event", "internal")), (policy, ours)
    assert not r.gate.is_set() and not a.query()   # the host did not wait for a
    paddle_rt.memset_async(y, POISON, stream=b)
    r.gate.set()
    keep = [y]                                     # kept: b's own freed memory would serve b first
    if policy in ("opportunistic", "none"):
        run_past(a, at_free)                       # a ran past the free; the host has not synchronized with a
        keep.append(pool.malloc_async(2 * N, b))
        assert (p <= keep[-1].ptr < p + 4 * N) == (policy == "opportunistic")
        if policy == "none":
            a.synchronize()                        # now the host saw it: reused with every policy off
            keep.append(pool.malloc_async(2 * N, b))
            assert p <= keep[-1].ptr < p + 4 * N
    for z in keep:
        pool.free_async(z, b)
    a.synchronize()
    b.synchronize()
    assert r.seen == bytes([ORIG]) * 4 * N, "b's writes reached a's pending work"
    st = pool.stats()
    key = {"none": "reuse_after_host_sync", "opportunistic": "reuse_opportunistic",
           "event": "reuse_follow_event_dependencies", "internal": "reuse_internal_dependencies"}[policy]
    assert st[key] >= 1, st
    assert st["used_mem_current"] == 0 and pool.trim_to(0) == 0


@pytest.mark.smoke
@pytest.mark.parametrize("free_on", ["same", "other"])
def test_closed_stream_leaves_nothing_behind(free_on):
    """Issue 46 item 5: malloc_async(1 MiB, s), free_async, s.close(), synchronize(), empty_cache(): nothing
    allocated, nothing cached by the pool, nothing reserved (also with the free on another stream: held back)."""
    import gc
    gc.collect()
    paddle_rt.empty_cache()
    pool = paddle_rt.default_mem_pool(0)
    base = paddle_rt.memory_allocated()           # 0 unless an earlier test left memory live
    s, t = paddle_rt.Stream(), paddle_rt.Stream()
    x = malloc_async(1 << 20, s)
    t.add_callback(lambda: None)
    free_async(x, s if free_on == "same" else t)
    s.close()
    paddle_rt.synchronize()
    paddle_rt.empty_cache()
    assert paddle_rt.memory_allocated() == base
    assert pool.stats()["cached"] == 0
    assert paddle_rt.memory_reserved() == base
    t.close()


OOM_CHILD = r"""
import threading, paddle_rt
from paddle_rt import MemPool, OutOfMemoryError
MiB = 1 << 20
a, b = paddle_rt.Stream(), paddle_rt.Stream()
pool = MemPool(reuse_follow_event_dependencies=False, reuse_allow_opportunistic=False,
               reuse_allow_internal_dependencies=False)
x = pool.malloc_async(40 * MiB, a)
gate = threading.Event()
a.add_callback(lambda: gate.wait(20))
threading.Timer(0.3, gate.set).start()
pool.free_async(x, a)
y = pool.malloc_async(48 * MiB, b)      # does not fit beside the pending 40 MiB: the ladder synchronizes a
assert gate.is_set()
assert pool.stats()["cached"] == 0
try:
    pool.malloc_async(80 * MiB, b)
except OutOfMemoryError as e:
    print("OOM", e.device)
pool.free_async(y)
print("OK")
"""


def test_oom_ladder_synchronizes_pending_frees(run_python):
    res = run_python(OOM_CHILD, env={"RT_CPU_MEMORY_BYTES": str(64 << 20)})
    assert res.returncode == 0, res.stderr
    assert "OOM rt_cpu:0" in res.stdout and "OK" in res.stdout


DELAY_CHILD = r"""
import ctypes, paddle_rt, numpy as np
from paddle_rt import MemPool
N = 1 << 16
for policy in ("none", "internal", "follow", "opportunistic"):
    kw = dict(reuse_follow_event_dependencies=policy == "follow", reuse_allow_opportunistic=policy == "opportunistic",
              reuse_allow_internal_dependencies=policy == "internal")
    pool = MemPool(**kw)
    a, b = paddle_rt.Stream(), paddle_rt.Stream()
    x = pool.malloc_async(N, a)
    src = paddle_rt.malloc(N)
    ctypes.memset(x.ptr, 0x5A, N)
    paddle_rt.memcpy_async(src, x, stream=a)      # a's pending (delayed) work reads x
    p = x.ptr
    pool.free_async(x, a)
    if policy == "follow":
        e = paddle_rt.Event(); e.record(a); b.wait_event(e)
    y = pool.malloc_async(N, b)
    paddle_rt.memset_async(y, 0xEE, stream=b)
    a.synchronize(); b.synchronize()
    assert bytes(np.asarray(src)) == b"\x5a" * N, policy
    print(policy, y.ptr == p)
    pool.free_async(y); src.free(); a.close(); b.close()
"""


def test_races_under_stream_delay(run_python):
    res = run_python(DELAY_CHILD, env={"RT_CPU_STREAM_DELAY_US": "20000"})
    assert res.returncode == 0, res.stderr
    out = dict(line.split() for line in res.stdout.split("\n") if line)
    assert out == {"none": "False", "internal": "True", "follow": "True", "opportunistic": "False"}


def test_allocator_functions_via_ctypes(streams):
    a, _ = streams
    alloc_addr, free_addr = paddle_rt.allocator_functions()
    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(alloc_addr)
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(free_addr)
    pool = paddle_rt.default_mem_pool(0)
    used = pool.stats()["used_mem_current"]
    p = alloc(1000, 0, a.handle)
    assert p
    ctypes.memset(p, 7, 1000)
    assert pool.stats()["used_mem_current"] == used + 1024
    free(p, 1000, 0, a.handle)
    assert pool.stats()["used_mem_current"] == used
    q = alloc(1000, 0, a.handle)          # same stream: same memory at once
    assert q == p
    free(q, 1000, 0, None)
    # errors: NULL / nothing, the exception kept
    free(q, 1000, 0, None)
    assert isinstance(paddle_rt.allocator_functions_error(), InvalidArgument)
    assert not alloc(16, 99, None)
    assert paddle_rt.allocator_functions_error() is not None
    assert not alloc(16, 0, 12345)
    assert "not a live paddle_rt stream" in str(paddle_rt.allocator_functions_error())
    assert paddle_rt.allocator_functions_error() is None


# -- a hypothesis state machine over several streams -------------------------------------------------------------------
from hypothesis import settings, strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, rule, initialize, invariant, precondition  # noqa: E402

SIZES = [256, 512, 1024, 4096]


class PoolMachine(RuleBasedStateMachine):
    """Random malloc_async / free_async / record_stream / wait_event / synchronize on 3 streams, with an oracle of
    the byte ranges freed but still touchable by their streams; a reuse must be justified by an ordering the pool was
    allowed to use."""

    @initialize(follow=st.booleans(), opp=st.booleans(), internal=st.booleans())
    def setup(self, follow, opp, internal):
        paddle_rt.empty_cache()
        self.base_reserved = paddle_rt.memory_reserved()
        self.pool = MemPool(reuse_follow_event_dependencies=follow, reuse_allow_opportunistic=opp,
                            reuse_allow_internal_dependencies=internal)
        self.policies = (follow, opp, internal)
        self.streams = [paddle_rt.Stream() for _ in range(3)]
        self.live = []             # (alloc, stream index)
        self.freed = []            # [ptr, end, stream index, pos, [(stream index, pos)]] still guarded
        self.waits = {}            # (waiter, recorded) -> position
        self.synced = {}           # stream index -> position the host waited for

    def _done(self, i, pos):
        return self.streams[i].completed_position >= pos

    @rule(size=st.sampled_from(SIZES), i=st.integers(0, 2))
    def malloc(self, size, i):
        before = self.pool.stats()["reuse_internal_dependencies"]
        a = self.pool.malloc_async(size, self.streams[i])
        internal = self.pool.stats()["reuse_internal_dependencies"] > before
        follow, opp, allow_internal = self.policies
        lo, hi = a.ptr, a.ptr + size
        for f in self.freed:
            if f[0] < hi and lo < f[1]:
                _, _, j, pos, rec, dropped = f
                if dropped and self._done(j, pos) and all(self._done(y, yp) for y, yp in rec):
                    continue      # its pool went away; it came back once every stream that could use it ran past
                for y, yp in rec:
                    # a recorded use is passed, or ordered before the reuse: on the reusing stream itself, or (event
                    # dependencies) the reusing stream waits on an event recorded on it after the use
                    assert (self._done(y, yp) or self.synced.get(y, 0) >= yp or y == i or
                            (follow and self.waits.get((i, y), 0) >= yp)), "reuse before a recorded stream passed"
                ok = (j == i or self.synced.get(j, 0) >= pos or
                      (follow and self.waits.get((i, j), 0) >= pos) or
                      (opp and self._done(j, pos)) or (allow_internal and internal))
                assert ok, f"stream {i} reused memory freed on {j} at {pos} without an allowed ordering"
                if internal and j != i:
                    # the pool made stream i wait for an event recorded on j now: later reuses may follow it
                    self.waits[(i, j)] = max(self.waits.get((i, j), 0), self.streams[j].position)
        self.freed = [f for f in self.freed if not (f[0] < hi and lo < f[1])]
        self.live.append((a, i))
        self._use(a, i)

    def _use(self, a, i):
        self.streams[i].add_callback(lambda: None)          # a use of the memory on its stream

    def _use_on(self, a, i, j):
        self.streams[j].add_callback(lambda: None)          # a use on stream j (recorded below)

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 100), j=st.integers(0, 2), busy=st.booleans())
    def free(self, k, j, busy):
        a, i = self.live.pop(k % len(self.live))
        if busy:
            import time
            self.streams[j].add_callback(time.sleep, 0.002)
        rec = [(self.streams.index(y), y.position) for y in (a.recorded or []) if y is not self.streams[j]]
        if i != j:
            rec.append((i, self.streams[i].position))
        # a block of a dropped pool: that pool goes away with its last allocation, and its held blocks with it
        self.freed.append([a.ptr, a.ptr + a.block_size, j, self.streams[j].position, rec, a.pool is not self.pool])
        free_async(a, self.streams[j])          # on the allocation's own pool (a dropped one's too)

    @rule()
    def drop_pool(self):
        # the pool goes away with frees pending (a held block goes back to the allocator once the streams that may
        # still use it ran past it); a new one with the same policies takes over, live blocks keep their pool
        for f in self.freed:
            f[5] = True
        follow, opp, internal = self.policies
        self.pool = MemPool(reuse_follow_event_dependencies=follow, reuse_allow_opportunistic=opp,
                            reuse_allow_internal_dependencies=internal)

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 100), j=st.integers(0, 2))
    def record(self, k, j):
        a, i = self.live[k % len(self.live)]
        self._use_on(a, i, j)
        a.record_stream(self.streams[j])

    @rule(i=st.integers(0, 2), j=st.integers(0, 2))
    def wait(self, i, j):
        if i == j:
            return
        e = paddle_rt.Event()
        e.record(self.streams[j])
        self.streams[i].wait_event(e)
        self.waits[(i, j)] = max(self.waits.get((i, j), 0), self.streams[j].position)

    @rule(i=st.integers(0, 2))
    def sync(self, i):
        self.streams[i].synchronize()
        self.synced[i] = self.streams[i].position

    @invariant()
    def stats_add_up(self):
        if hasattr(self, "pool"):
            s = self.pool.stats()
            assert s["reserved_mem_current"] == s["used_mem_current"] + s["cached"]

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for s in self.streams:
            s.synchronize()
        for a, i in self.live:
            free_async(a, self.streams[i])
        self.live = []
        for s in self.streams:
            s.synchronize()
        assert self.pool.trim_to(0) == 0
        st_ = self.pool.stats()
        assert st_["reserved_mem_current"] == 0 and st_["used_mem_current"] == 0
        assert paddle_rt.memory_reserved() == self.base_reserved, "memory not returned to the plugin"
        for s in self.streams:
            s.close()


PoolMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_pool_state_machine = PoolMachine.TestCase


class SlowPoolMachine(PoolMachine):
    """PoolMachine with the device slowed (issue 45): rt_cpu's memsets and copies wait 200 us each on the stream
    (rt_cpu_set_fault's run-time delay) and streams are held busy by host callbacks that later rules release, so the
    host runs ahead; the allocator's chunks are exactly the requests, so a miss on one stream looks at the memory the
    others freed (the pool's cross-stream policies on the allocator's memory). Every block is filled with its own byte by a memset on its stream and read back to the host by
    each use (its stream, or another after an event); a read whose stream has run is checked at once, every other at
    a synchronize and at the end: a block reused too early shows as a wrong byte."""

    @initialize(follow=st.booleans(), opp=st.booleans(), internal=st.booleans())
    def setup(self, follow, opp, internal):
        from paddle_rt.plugins import rt_cpu_set_fault
        for kind in ("memset", "memcpy"):
            rt_cpu_set_fault(kind, delay_us=200)
        paddle_rt.empty_cache()
        paddle_rt.set_allocator_config(**EXACT)   # a stream has no spare memory: misses take other streams' frees
        super().setup(follow, opp, internal)
        self.gates = {}          # stream index -> the gate holding it
        self.reads = []          # (host array, byte, stream index, its position once queued)
        self.values = {}         # live block address -> its byte
        self.next_value = 0

    def _use(self, a, i):
        self.next_value = self.next_value % 255 + 1
        self.values[a.ptr] = self.next_value      # live blocks do not overlap
        paddle_rt.memset_async(a, self.next_value, stream=self.streams[i])
        self._read(a, i)

    def _read(self, a, j):
        h = np.empty(a.size, np.uint8)
        paddle_rt.memcpy_async(h, a, stream=self.streams[j])
        self.reads.append((h, self.values[a.ptr], j, self.streams[j].position))

    def _use_on(self, a, i, j):
        self.wait(j, i)           # ordered after the block's memset on i: the read sees its byte
        self._read(a, j)

    @rule(i=st.integers(0, 2))
    def hold(self, i):
        if i not in self.gates:
            self.gates[i] = GatedReader(self.streams[i]).gate

    @rule(i=st.integers(0, 2))
    def release(self, i):
        g = self.gates.pop(i, None)
        if g is not None:
            g.set()

    def _release_all(self):
        for g in self.gates.values():
            g.set()
        self.gates.clear()

    @rule(i=st.integers(0, 2))
    def sync(self, i):
        self._release_all()       # the stream may wait (events) for any other
        super().sync(i)
        self._check(all_done=False)

    def _check(self, all_done):
        left = []
        for h, v, j, pos in self.reads:
            if all_done or self.streams[j].completed_position >= pos:
                assert (h == v).all(), f"a read on stream {j} saw {np.unique(h)[:4]}, not its block's {v}"
            else:
                left.append((h, v, j, pos))
        self.reads = left

    @invariant()
    def reads_done_are_right(self):
        if hasattr(self, "reads"):
            self._check(all_done=False)

    def teardown(self):
        from paddle_rt.plugins import rt_cpu_clear_faults
        try:
            if hasattr(self, "gates"):
                self._release_all()
                for s in self.streams:
                    s.synchronize()
                self._check(all_done=True)
        finally:
            rt_cpu_clear_faults()
            try:
                super().teardown()
            finally:
                paddle_rt.set_allocator_config(**{k: None for k in EXACT})


SlowPoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
test_pool_state_machine_device_slowed = SlowPoolMachine.TestCase


def test_replay_multi_stream_trace(tmp_path):
    import json
    import contextlib
    import io
    from paddle_rt.tools import replay
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    ptrs = []
    for i in range(60):
        s = ["0x0", "0x1", "0x2"][i % 3]
        rows.append(f"0,{i},allocate,0x{1000 + i:x},{256 * (1 + i % 5)},{s}")
        ptrs.append((f"0x{1000 + i:x}", s))
        if i % 2:
            p, _ = ptrs.pop(0)
            rows.append(f"0,{i},free,{p},0,{['0x0', '0x1', '0x2'][(i + 1) % 3]}")
    for p, s in ptrs:
        rows.append(f"0,99,free,{p},0,{s}")
    path = tmp_path / "multi.csv"
    path.write_text("\n".join(rows) + "\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert replay.main([str(path), "--json", "--no-min-capacity"]) == 0
    res = json.loads(out.getvalue())
    so = res["stream_ordered"]
    assert so["streams"] == 3 and so["events"] == 120
    assert so["used_mem_current"] == 0 and so["used_mem_high"] > 0
    assert so["reserved_mem_high"] >= so["used_mem_high"]
    # a single-stream log has no stream-ordered section
    single = tmp_path / "single.csv"
    single.write_text("Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x1,256,0x0\n0,1,free,0x1,0,0x0\n")
    assert replay.load_stream_trace(str(single)) is None


def test_pool_does_not_keep_dropped_streams_alive():
    import gc
    import weakref
    pool = MemPool()
    a, b = paddle_rt.Stream(), paddle_rt.Stream()
    x = pool.malloc_async(N, a)
    a.add_callback(lambda: None)
    pool.free_async(x, a)
    e = paddle_rt.Event()
    e.record(a)
    b.wait_event(e)
    a.synchronize()                       # threshold 0: the freed block goes back to the allocator
    del x
    assert pool.stats()["cached"] == 0
    wa, wb = weakref.ref(a), weakref.ref(b)
    b.synchronize()
    a.close()
    b.close()
    del a, b, e
    gc.collect()
    assert wa() is None and wb() is None


def test_threads_share_a_pool():
    pool = MemPool()

    def worker(k):
        s = paddle_rt.Stream()
        other = []
        for i in range(300):
            a = pool.malloc_async(256 * (1 + (i + k) % 4), s)
            fill(a, k)
            other.append(a)
            if len(other) > 3:
                b = other.pop(0)
                assert ctypes.string_at(b.ptr, b.size) == bytes([k]) * b.size
                pool.free_async(b, s)
            if i % 50 == 0:
                s.synchronize()
        for b in other:
            pool.free_async(b, s)
        s.synchronize()
        s.close()

    errors = run_workers(worker)
    assert not errors, errors
    assert pool.stats()["used_mem_current"] == 0
    assert pool.trim_to(0) == 0 and pool.stats()["reserved_mem_current"] == 0


FOLLOW_BACK_CHILD = r"""
import paddle_rt
N = 1 << 20
pool = paddle_rt.MemPool()
c, k, z = paddle_rt.Stream(), paddle_rt.Stream(), paddle_rt.Stream()
out = paddle_rt.malloc(256, stream=c)
b = pool.malloc_async(N, c)
p = b.ptr
paddle_rt.memcpy_async(out, b, 256, stream=c)          # c's (delayed) work reads b
up = paddle_rt.Event(); up.record(c); k.wait_event(up)
paddle_rt.memcpy_async(out, b, 256, stream=k)          # k uses b after c's work, then frees it
pool.free_async(b, k)
done = paddle_rt.Event(); done.record(k)
z.wait_event(done)                                      # z follows k past the free, but not c directly
other = pool.malloc_async(N, z)
c.wait_event(done)                                      # c follows k past the free
again = pool.malloc_async(N, c)
print(again.ptr == p, other.ptr != p, c.query(), pool.stats()["reuse_follow_event_dependencies"])
pool.free_async(again); pool.free_async(other); out.free()
for s in (c, k, z):
    s.synchronize(); s.close()
"""


def test_allocating_stream_reuses_what_another_stream_freed_once_it_waited_for_it(run_python):
    """Issue 45, the data loader's pattern with the host running ahead: a block allocated on c, used and freed on k
    (ordered after c's work), and c then waiting on an event recorded on k after the free: c reuses it at once,
    though c's own earlier work has not run (the recorded use of the allocating stream is ordered by c's own
    order). Before, the pool waited for c to actually run past its use, and the host running ahead grew the pool
    by a block per batch. z, which waited only for k, still does not get it (c's use is not ordered before z)."""
    res = run_python(FOLLOW_BACK_CHILD, env={"RT_CPU_STREAM_DELAY_US": "20000"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "True", "False", "1"]
