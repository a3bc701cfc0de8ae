"""The stress workload of issue 33 (run in a child process by tests/test_stress.py; also alone:
``python tests/stress_workload.py --seconds 60 --threads 4 [--faults] [--ahead]`` with RT_CPU_MEMORY_BYTES set).

Thread roles, all on rt_cpu:0 unless said, every result checked against numpy:
- victim: ``a = malloc_async(n, s)``, memset v1 on s, event s -> t, a callback on t, copy a -> host on t,
  ``a.record_stream(t)``, ``free_async(a, s)``, ``b = malloc_async(n, s)``, memset v2 on s, synchronize: host == v1
  (n log-uniform up to capacity/3);
- small: many small blocks allocated and freed on its own stream (churn of the pool);
- pressure: holds most of the device and asks for more (the pools' and the allocator's OOM ladders);
- churn: a new stream per iteration: malloc_async, memset, copy to host, free_async, synchronize, close (sometimes
  close(wait=False) with nothing pending) -- while other threads' pools still hold blocks freed on it;
- ops: tensors a + b, a * b on a stream of its own against numpy;
- ccl: all_reduce between rt_cpu:0 and rt_cpu:1 (two threads' worth of ranks, one per device) against numpy;
- ahead (``--ahead``: --threads threads of it, with small, pressure and churn; run with RT_CPU_STREAM_DELAY_US=20-200
  so the device lags): the host runs ahead of the device (issue 45). Blocks of every size from malloc and malloc_async
  on three streams, each filled by a memset on its stream and sometimes a prefix copied from another block (after an
  event, with record_stream), read back to the host on its own or another stream, freed on its stream or another
  without synchronizing; events order the streams; empty_cache(wait=False). Every 48 steps the thread synchronizes
  its streams and checks every byte read back (a block reused too early, or given back while queued work still used
  it, shows as a wrong byte or a crash). At a small RT_CPU_MEMORY_BYTES donor pages, releases and the OOM ladders
  happen while work is queued (the JSON's release_rt_cpu0 counts them).
With --faults, rt_cpu's fault injection (allocations, copies, memsets, event and stream creation, synchronize, and the
release side: device frees, unmap, release and free_range of the virtual-memory extension) is switched on and off at
run time; an iteration that raised a typed paddle_rt error is counted as an error (and cleaned up), never as a check;
a release point that met a refusal warns (RuntimeWarning, counted with the errors). Prints one line of JSON:
operations, checks, wrong, errors by type, used bytes at the end (must be 0), and the books: per device the
allocator's reserved bytes against what the plugin says it uses (device_memory_stats), after the threads stopped and
again after empty_cache (must agree both times)."""
import argparse
import json
import math
import os
import random
import sys
import threading
import time
import warnings

import numpy as np

import paddle_rt
from paddle_rt._core import errors as E
from paddle_rt import ccl, ops
from paddle_rt.plugins import rt_cpu_set_fault, rt_cpu_clear_faults, rt_cpu_live_bytes

FAULTS = [("alloc", 25), ("memcpy", 97), ("memset", 89), ("create_event", 53), ("create_stream", 31),
          ("synchronize", 211), ("record_event", 73), ("free", 7), ("unmap", 5), ("release", 11), ("free_range", 3)]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ops = 0
        self.checks = 0
        self.wrong = []
        self.errors = {}

    def add(self, ops=0, checks=0):
        with self.lock:
            self.ops += ops
            self.checks += checks

    def error(self, e):
        with self.lock:
            k = type(e).__name__
            self.errors[k] = self.errors.get(k, 0) + 1

    def bad(self, what):
        with self.lock:
            self.wrong.append(what)

    def check_filled(self, what, ops, h, v):
        """Count ops operations and one check: every byte of the host copy h is v (else a wrong result)."""
        self.add(ops=ops, checks=1)
        if not (h == v).all():
            self.bad(f"{what} read {np.unique(h)[:4]} not {v}")


def _drain(*streams):
    """Wait for the streams, whatever state a failure left them in."""
    for s in streams:
        try:
            s.synchronize()
        except E.PaddleRTError:
            pass


def _sync_all(*streams):
    err = None
    for s in streams:
        try:
            s.synchronize()
        except E.PaddleRTError as e:
            err = err or e
    if err is not None:
        raise err


def victim(st, stop, rng, cap):
    s, t = paddle_rt.Stream(), paddle_rt.Stream()
    hmax = max(1 << 12, cap // 3)
    while not stop.is_set():
        n = int(math.exp(rng.uniform(math.log(256), math.log(hmax))))
        v1, v2 = rng.randrange(1, 128), rng.randrange(128, 256)
        h = np.zeros(n, np.uint8)
        a = b = None
        try:
            a = paddle_rt.malloc_async(n, s)
            paddle_rt.memset_async(a, v1, stream=s)
            e = paddle_rt.Event()
            e.record(s)
            t.wait_event(e)
            t.add_callback(lambda: None)
            paddle_rt.memcpy_async(h, a, stream=t)
            a.record_stream(t)
            paddle_rt.free_async(a, s)
            a = None
            b = paddle_rt.malloc_async(n, s)
            paddle_rt.memset_async(b, v2, stream=s)
            _sync_all(s, t)
            st.check_filled(f"victim n={n}: copy", 10, h, v1)
        except (E.PaddleRTError, MemoryError) as exc:
            st.error(exc)
        finally:
            for x in (a, b):
                if x is not None:
                    try:
                        paddle_rt.free_async(x, s)
                    except E.PaddleRTError as exc:
                        st.error(exc)
            try:
                _sync_all(s, t)
            except E.PaddleRTError as exc:
                st.error(exc)
    s.close()
    t.close()


def small(st, stop, rng, cap):
    s = paddle_rt.Stream()
    held = []
    while not stop.is_set():
        try:
            if len(held) < 64 and rng.random() < 0.6:
                n = rng.randrange(1, 1 << 14)
                a = paddle_rt.malloc_async(n, s)
                v = rng.randrange(256)
                paddle_rt.memset_async(a, v, stream=s)
                held.append((a, n, v))
            elif held:
                a, n, v = held.pop(rng.randrange(len(held)))
                h = np.empty(n, np.uint8)
                paddle_rt.memcpy_async(h, a, stream=s)
                paddle_rt.free_async(a, s)
                s.synchronize()
                st.check_filled(f"small n={n}:", 3, h, v)
            st.add(ops=2)
        except (E.PaddleRTError, MemoryError) as exc:
            st.error(exc)
            _drain(s)
            # a failed memset/copy: the values of the held blocks are unknown now; free them all
            for a, _, _ in held:
                paddle_rt.free_async(a, s)
            held.clear()
    for a, _, _ in held:
        paddle_rt.free_async(a, s)
    try:
        s.synchronize()
    except E.PaddleRTError:
        pass
    s.close()


def pressure(st, stop, rng, cap):
    s = paddle_rt.Stream()
    while not stop.is_set():
        got = []
        try:
            got.append(paddle_rt.malloc_async(int(cap * rng.uniform(0.4, 0.7)), s))
            got.append(paddle_rt.malloc_async(int(cap * rng.uniform(0.2, 0.5)), s))   # often out of memory
            st.add(ops=2)
        except (E.PaddleRTError, MemoryError) as exc:
            st.error(exc)
        time.sleep(rng.uniform(0, 0.01))
        for a in got:
            paddle_rt.free_async(a, s)
        try:
            s.synchronize()
            if rng.random() < 0.2:
                paddle_rt.memory.empty_cache()       # a release point that raises what the plugin refused
        except E.PaddleRTError as exc:
            st.error(exc)
    s.close()


def churn(st, stop, rng, cap):
    while not stop.is_set():
        try:
            s = paddle_rt.Stream()
        except E.PaddleRTError as exc:
            st.error(exc)
            continue
        try:
            n = rng.randrange(1, 1 << 16)
            v = rng.randrange(256)
            a = paddle_rt.malloc_async(n, s)
            h = np.zeros(n, np.uint8)
            try:
                paddle_rt.memset_async(a, v, stream=s)
                paddle_rt.memcpy_async(h, a, stream=s)
            finally:
                paddle_rt.free_async(a, s)
            s.synchronize()
            st.check_filled(f"churn n={n}:", 5, h, v)
        except (E.PaddleRTError, MemoryError) as exc:
            st.error(exc)
        finally:
            try:
                s.close(wait=rng.random() < 0.8)
            except E.PaddleRTError as exc:
                st.error(exc)


def operators(st, stop, rng, cap):
    s = paddle_rt.Stream()
    while not stop.is_set():
        n = rng.randrange(1, 1 << 12)
        x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(n).astype(np.float32)
        y = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(n).astype(np.float32)
        try:
            with paddle_rt.stream(s):
                a = paddle_rt.tensor(x)
                b = paddle_rt.tensor(y)
                c = ops.add(a, b)
                d = ops.mul(c, b)
                got = d.numpy()
            st.add(ops=5, checks=1)
            if not np.allclose(got, (x + y) * y, rtol=1e-6, atol=1e-6):
                st.bad(f"ops n={n}: mismatch")
        except (E.PaddleRTError, MemoryError) as exc:
            st.error(exc)
            _drain(s)
    s.close()


def _drop_comms(comms, streams):
    """Destroy the communicators and drain their streams, whatever state a failed collective left them in."""
    for c in comms:
        try:
            c.destroy()
        except E.PaddleRTError:
            pass
    _drain(*streams)


def collectives(st, stop, rng, cap):
    try:
        comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
    except E.PaddleRTError as exc:
        st.error(exc)
        return
    streams = [paddle_rt.Stream(c.device) for c in comms]
    while not stop.is_set():
        n = rng.randrange(1, 1 << 12)
        xs = [np.random.default_rng(rng.randrange(1 << 30)).integers(-1000, 1000, n).astype(np.int32) for _ in comms]
        bufs = []
        try:
            for c, s, x in zip(comms, streams, xs):
                bufs.append(paddle_rt.tensor(x, device=c.device, stream=s))
            works = [ccl.all_reduce(b, b, "sum", comm=c, stream=s, dtype="int32")
                     for b, c, s in zip(bufs, comms, streams)]
            for w in works:
                w.wait(timeout=120)
            outs = [b.numpy() for b in bufs]
            st.add(ops=2 + 2 * len(comms), checks=len(comms))
            for o in outs:
                if not (o == xs[0] + xs[1]).all():
                    st.bad(f"ccl n={n}: all_reduce mismatch")
        except (E.PaddleRTError, MemoryError) as exc:
            st.error(exc)
            if isinstance(exc, E.CollectiveError):       # the communicators are in error: start afresh
                _drop_comms(comms, streams)
                try:
                    comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
                except E.PaddleRTError as exc2:
                    st.error(exc2)
                    break
        finally:
            del bufs
    _drop_comms(comms, streams)
    for s in streams:
        s.close()


# -- the host ahead of a slowed device (--ahead; run with RT_CPU_STREAM_DELAY_US) --------------------------------------
def _overlay(pat, lo, hi, v):
    """The pattern pat (sorted [(start, end, byte)]) with [lo, hi) overwritten by v."""
    out = [(a, min(b, lo), x) for a, b, x in pat if a < lo]
    out.append((lo, hi, v))
    out += [(max(a, hi), b, x) for a, b, x in pat if b > hi]
    return out


def _clip(pat, m):
    return [(a, min(b, m), x) for a, b, x in pat if a < m]


class _Live:
    """A live block of the ahead role: its allocation, size, stream index, byte pattern (fixed once written: later
    work only reads it), and whether it came from malloc_async."""
    __slots__ = ("a", "n", "si", "pat", "is_async")

    def __init__(self, a, n, si, pat, is_async):
        self.a, self.n, self.si, self.pat, self.is_async = a, n, si, pat, is_async


def _after(streams, i, j):
    """Stream j waits (on the device) for everything queued on stream i so far."""
    if i != j:
        e = paddle_rt.Event()
        e.record(streams[i])
        streams[j].wait_event(e)


def _ahead_alloc(rng, streams, live, hmax):
    """A block on a random stream (malloc_async or malloc), filled by a memset on its stream and, sometimes, a prefix
    copied from another live block (on the new block's stream, after an event of the source's stream; the source
    records that stream, so its free waits for the copy)."""
    n = int(math.exp(rng.uniform(0, math.log(hmax))))
    si = rng.randrange(len(streams))
    s = streams[si]
    is_async = rng.random() < 0.6
    a = paddle_rt.malloc_async(n, s) if is_async else paddle_rt.malloc(n, stream=s)
    v = rng.randrange(256)
    paddle_rt.memset_async(a, v, stream=s)
    pat = [(0, n, v)]
    if live and rng.random() < 0.3:
        b = live[rng.randrange(len(live))]
        m = min(n, b.n)
        _after(streams, b.si, si)
        if b.si != si:
            b.a.record_stream(s)
        paddle_rt.memcpy_async(a, b.a, nbytes=m, stream=s)
        for lo, hi, x in _clip(b.pat, m):
            pat = _overlay(pat, lo, hi, x)
    live.append(_Live(a, n, si, pat, is_async))
    return 2


def _ahead_read(rng, streams, live, reads):
    """Copy a live block to the host on its stream or, after an event, on another one (record_stream): checked at
    the next verification; a block reused too early shows as a wrong byte."""
    b = live[rng.randrange(len(live))]
    j = b.si if rng.random() < 0.6 else rng.randrange(len(streams))
    _after(streams, b.si, j)
    if j != b.si:
        b.a.record_stream(streams[j])
    h = np.empty(b.n, np.uint8)
    paddle_rt.memcpy_async(h, b.a, stream=streams[j])
    reads.append((h, b.pat, b.n))
    return 1


def _ahead_free(rng, streams, live):
    """Free a live block without synchronizing: on its own stream, or (malloc_async) on another stream."""
    b = live.pop(rng.randrange(len(live)))
    if b.is_async:
        j = b.si if rng.random() < 0.7 else rng.randrange(len(streams))
        paddle_rt.free_async(b.a, streams[j])
    else:
        b.a.free()
    return 1


def _ahead_verify(st, streams, reads):
    """Synchronize the role's streams and check every pending host copy against its block's pattern."""
    _sync_all(*streams)
    for h, pat, n in reads:
        st.add(checks=1)
        for lo, hi, v in pat:
            if not (h[lo:hi] == v).all():
                st.bad(f"ahead n={n}: bytes [{lo}, {hi}) read {np.unique(h[lo:hi])[:4]} not {v}")
                break
    reads.clear()


def ahead(st, stop, rng, cap):
    """The host runs ahead of the device (slowed by RT_CPU_STREAM_DELAY_US): blocks of every size allocated with
    malloc and malloc_async on three streams, filled and copied on their streams, read back on their own or another
    stream, freed (on their stream or another) without synchronizing, while events order the streams and
    empty_cache(wait=False) gives back what has completed; every 48 steps (and at the end) the host synchronizes and
    checks every byte read back."""
    streams = [paddle_rt.Stream() for _ in range(3)]
    live, reads = [], []
    hmax = max(1 << 12, cap // 8)
    k = 0
    while not stop.is_set():
        k += 1
        r = rng.random()
        try:
            if r < 0.35 or not live:
                st.add(ops=_ahead_alloc(rng, streams, live, hmax))
            elif r < 0.6:
                st.add(ops=_ahead_read(rng, streams, live, reads))
            elif r < 0.9:
                st.add(ops=_ahead_free(rng, streams, live))
            elif r < 0.96:
                i, j = rng.randrange(3), rng.randrange(3)
                _after(streams, i, j)
                st.add(ops=2)
            elif r < 0.98:
                streams[rng.randrange(3)].add_callback(time.sleep, 0.001)    # a slower kernel
            else:
                paddle_rt.memory.empty_cache(wait=False)
                st.add(ops=1)
        except (E.PaddleRTError, MemoryError) as exc:
            st.error(exc)
            for _ in range(len(live) // 2):         # out of memory: give half back, still without synchronizing
                _ahead_free(rng, streams, live)
        if k % 48 == 0 or len(reads) > 32:
            try:
                _ahead_verify(st, streams, reads)
            except E.PaddleRTError as exc:
                st.error(exc)
                reads.clear()
    try:
        while live:
            _ahead_free(rng, streams, live)
        _ahead_verify(st, streams, reads)
    except E.PaddleRTError as exc:
        st.error(exc)
    for s in streams:
        s.close()


ROLES = {"victim": victim, "small": small, "pressure": pressure, "churn": churn, "ops": operators,
         "ccl": collectives, "ahead": ahead}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--threads", type=int, default=4, help="victim threads (plus one of every other role)")
    p.add_argument("--faults", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--roles", default=None, help="default: victim,small,pressure,churn,ops,ccl; with --ahead: "
                   "ahead,small,pressure,churn")
    p.add_argument("--ahead", action="store_true",
                   help="the host runs ahead: --threads threads of the ahead role (set RT_CPU_STREAM_DELAY_US)")
    a = p.parse_args(argv)
    if a.roles is None:
        a.roles = "ahead,small,pressure,churn" if a.ahead else "victim,small,pressure,churn,ops,ccl"
    raw = os.environ.get("RT_CPU_MEMORY_BYTES", "1G").strip().upper().rstrip("IB")
    cap = int(raw[:-1]) << {"K": 10, "M": 20, "G": 30}[raw[-1]] if raw[-1] in "KMG" else int(raw)
    st = Stats()
    warnings.simplefilter("always", RuntimeWarning)
    warnings.showwarning = lambda message, *rest, **kw: st.error(message)   # refusals met at release points
    stop = threading.Event()
    roles = [r for r in a.roles.split(",") if r]
    many = "ahead" if a.ahead else "victim"        # the role that gets --threads threads
    plan = [(many, i) for i in range(a.threads if many in roles else 0)]
    plan += [(r, 0) for r in roles if r != many]
    threads = []
    for k, (role, i) in enumerate(plan):
        rng = random.Random(a.seed * 1000 + k)
        th = threading.Thread(target=ROLES[role], args=(st, stop, rng, cap), name=f"{role}{i}", daemon=True)
        threads.append(th)
    t0 = time.monotonic()
    for th in threads:
        th.start()
    frng = random.Random(a.seed)
    while time.monotonic() - t0 < a.seconds:
        if a.faults:
            rt_cpu_clear_faults()
            for kind, every in FAULTS:
                if frng.random() < 0.6:
                    rt_cpu_set_fault(kind, every=every)
        time.sleep(min(1.0, max(0.0, a.seconds - (time.monotonic() - t0))))
    rt_cpu_clear_faults()
    stop.set()
    hung = []
    for th in threads:
        th.join(120)
        if th.is_alive():
            hung.append(th.name)
    paddle_rt.synchronize()
    books = {"stopped": _books(), "emptied": None}
    for d in ("rt_cpu:0", "rt_cpu:1"):
        try:
            from paddle_rt.pool import default_mem_pool
            default_mem_pool(d).trim_to(0)
        except E.PaddleRTError:
            pass
        paddle_rt.memory.empty_cache(d)         # faults are off: what was refused before goes back now
    books["emptied"] = _books()
    used = {d: paddle_rt.memory.memory_allocated(d) for d in ("rt_cpu:0", "rt_cpu:1")}
    ms = paddle_rt.memory_stats("rt_cpu:0")
    release = {k: ms[k] for k in ("num_release_deferred", "num_unmaps", "num_device_free", "num_alloc_retries",
                                  "num_free_waits")}
    out = {"seconds": round(time.monotonic() - t0, 1), "threads": len(threads), "cap": cap, "faults": a.faults,
           "ahead": a.ahead, "delay_us": int(os.environ.get("RT_CPU_STREAM_DELAY_US", "0") or 0),
           "ops": st.ops, "checks": st.checks, "wrong": len(st.wrong), "wrong_first": st.wrong[:5],
           "errors": st.errors, "hung": hung, "allocated": used,
           "live": [rt_cpu_live_bytes(0), rt_cpu_live_bytes(1)], "books": books, "release_rt_cpu0": release,
           "books_agree": all(r == u for b in books.values() for r, u in b.values())}
    print(json.dumps(out), flush=True)
    return 1 if (st.wrong or hung or not out["books_agree"]) else 0


def _books():
    """Per device: [the allocator's reserved bytes, the bytes the plugin says are in use (device_memory_stats:
    total - free)]. Nothing but the allocator takes device memory here, so the two must agree."""
    out = {}
    for d in ("rt_cpu:0", "rt_cpu:1"):
        free, total = paddle_rt.device(d).memory_info()
        out[d] = [paddle_rt.memory.memory_reserved(d), total - free]
    return out


if __name__ == "__main__":
    sys.exit(main())
