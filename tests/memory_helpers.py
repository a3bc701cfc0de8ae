"""Shared set-up of the allocator tests: a device with a clean caching allocator, caches given back after a module,
and worker threads whose failures reach the test."""
import ctypes
import gc
import threading

import paddle_rt
from paddle_rt._core import alloc_config


def clean_allocator(d):
    """A fixture body: d's allocator with nothing live, nothing cached and the default configuration, before and
    after the test (yields d)."""
    a = paddle_rt.get_allocator(d)
    gc.collect()
    paddle_rt.default_mem_pool(d).trim_to(0)     # blocks the stream-ordered pool caches (freed tensors of other tests)
    a.empty_cache()
    a.configure(**{k: None for k in alloc_config.CONF_KEYS})
    assert paddle_rt.memory_reserved(d) == 0, f"a previous test leaked memory on {d}"
    a.reset_accumulated_stats()
    a.reset_peak_stats()
    yield d
    gc.collect()
    a.empty_cache()
    a.configure(**{k: None for k in alloc_config.CONF_KEYS})


def give_memory_back():
    """Leave the devices' caches as found: other test modules measure the allocators from a clean state."""
    gc.collect()
    for d in ("rt_cpu:0", "rt_cpu:1"):
        paddle_rt.empty_cache(d)


def two_streams():
    """A fixture body: two new streams (a, b), synchronized and closed after the test unless it closed them."""
    a, b = paddle_rt.Stream(), paddle_rt.Stream()
    yield a, b
    for s in (a, b):
        if not s.closed:
            s.synchronize()
            s.close()
    # a later stream's queue may get a closed one's address, so its allocator tag and the memory cached under it
    # (harmless: nothing of the closed stream runs any more); give that memory back so each test starts clean
    paddle_rt.empty_cache()


class GatedReader:
    """A host callback on a stream that blocks the stream until `gate` is set, then reads `nbytes` at `ptr` into
    `seen` (the stream's pending work that uses a buffer); ptr 0 only blocks."""

    def __init__(self, stream, ptr=0, nbytes=0):
        self.gate = threading.Event()
        self.seen = None
        self.ptr, self.nbytes = ptr, nbytes
        stream.add_callback(self._run)

    def _run(self):
        assert self.gate.wait(20)
        if self.ptr:
            self.seen = ctypes.string_at(self.ptr, self.nbytes)


def run_workers(worker, n=4):
    """Run worker(k) for k = 1..n in n threads at once; returns the exceptions they raised (the test asserts none)."""
    errors = []

    def guarded(k):
        try:
            worker(k)
        except BaseException as e:   # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=guarded, args=(k + 1,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


def hold_stream(s):
    """Everything queued on s after this waits until the returned threading.Event is set (a host callback that
    blocks the stream's worker: the device "slowed" for as long as the test needs, whatever the machine's speed)."""
    gate = threading.Event()
    s.add_callback(gate.wait, 20)
    return gate


def run_past(s, pos, timeout=30):
    """Poll until s has run its first `pos` operations (its completed position), without any synchronize: the host
    never waits for the stream, it only looks (the allocator's own question, free_done)."""
    import time
    end = time.monotonic() + timeout
    while s.completed_position < pos:
        assert time.monotonic() < end, f"{s} did not reach position {pos}"
        time.sleep(0.0005)
