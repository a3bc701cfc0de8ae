"""The fork soak of issue 46 item 7 (run in a child process by tests/test_stress.py; also alone:
``python tests/fork_workload.py --seconds 20 --threads 2``).

The parent keeps ``--threads`` threads allocating and freeing (device memory, a stream-ordered pool, pinned host
memory, stream work) and one running all_reduce between rt_cpu:0 and rt_cpu:1, while the main thread forks children
one after another. Each child, under a watchdog:
- calls every public call of paddle_rt (memory, streams, events, pools, copies, collectives, operators, the
  devices) on objects the parent made and on fresh arguments: each must raise ForkError, at once (a lock a parent
  thread held at the fork must never be waited for);
- calls paddle_rt.reinitialize_after_fork(), then uses the parent's objects (its streams, pools, communicators raise
  ForkError; freeing its memory and reading its tensors do nothing harmful), then a working set (allocate, write,
  copy, stream, event, pool, empty_cache, an all_reduce, an operator): each must work, and the parent's memory is
  not touched by it.
A child that does not finish within ``--child-timeout`` seconds is killed and counted as hung. Prints one line of
JSON: forks, hung children, failed children, and the first failures (the call, what it raised)."""
import argparse
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import paddle_rt
from paddle_rt import ccl, ops


def parent_objects():
    """What the parent made before the fork: the child finds them all."""
    d0, d1 = paddle_rt.device("rt_cpu:0"), paddle_rt.device("rt_cpu:1")
    s = paddle_rt.Stream(d0)
    e = paddle_rt.Event()
    e.record(s)
    pool = paddle_rt.MemPool(d0)
    a = paddle_rt.malloc(1 << 20, device=d0)
    np.asarray(a).view(np.uint8)[:] = 0x5A
    t = paddle_rt.tensor(np.arange(16, dtype=np.float32), device=d0)
    comms = ccl.comm_init_all([d0, d1])
    bufs = [paddle_rt.tensor(np.ones(8, np.float32), device=d) for d in (d0, d1)]
    return dict(d0=d0, d1=d1, s=s, e=e, pool=pool, a=a, t=t, comms=comms, bufs=bufs, ptr=paddle_rt.raw_malloc(256))


def forked_calls(o):
    """(name, call) of every public call a child must refuse with ForkError before reinitialize_after_fork."""
    d0, s, e, pool, a, t = o["d0"], o["s"], o["e"], o["pool"], o["a"], o["t"]
    host = np.zeros(64, np.uint8)
    return [
        ("malloc", lambda: paddle_rt.malloc(64)),
        ("malloc(device)", lambda: paddle_rt.malloc(64, device=d0)),
        ("raw_malloc", lambda: paddle_rt.raw_malloc(64)),
        ("raw_free", lambda: paddle_rt.raw_free(o["ptr"])),
        ("free", lambda: paddle_rt.free(a)),
        ("Allocation.free", lambda: a.free()),
        ("Allocation.record_stream", lambda: a.record_stream(s)),
        ("malloc_host", lambda: paddle_rt.malloc_host(64)),
        ("empty_cache", lambda: paddle_rt.empty_cache()),
        ("empty_cache(device)", lambda: paddle_rt.empty_cache(d0)),
        ("memory_stats", lambda: paddle_rt.memory_stats()),
        ("memory_allocated", lambda: paddle_rt.memory_allocated(d0)),
        ("memory_reserved", lambda: paddle_rt.memory_reserved()),
        ("max_memory_allocated", lambda: paddle_rt.max_memory_allocated()),
        ("max_memory_reserved", lambda: paddle_rt.max_memory_reserved()),
        ("reset_peak_memory_stats", lambda: paddle_rt.reset_peak_memory_stats()),
        ("reset_accumulated_memory_stats", lambda: paddle_rt.reset_accumulated_memory_stats()),
        ("reset_allocator", lambda: paddle_rt.reset_allocator()),
        ("memory_snapshot", lambda: paddle_rt.memory_snapshot(d0)),
        ("set_allocator_config", lambda: paddle_rt.set_allocator_config(d0, max_split_size=None)),
        ("allocator_config", lambda: paddle_rt.allocator_config()),
        ("get_allocator", lambda: paddle_rt.get_allocator(d0)),
        ("reserve", lambda: paddle_rt.reserve(1 << 20)),
        ("Stream()", lambda: paddle_rt.Stream(d0)),
        ("Stream.synchronize", lambda: s.synchronize()),
        ("Stream.query", lambda: s.query()),
        ("current_stream", lambda: paddle_rt.current_stream()),
        ("default_stream", lambda: paddle_rt.default_stream(d0)),
        ("Event()", lambda: paddle_rt.Event()),
        ("Event.record", lambda: e.record(s)),
        ("Event.synchronize", lambda: e.synchronize()),
        ("Event.query", lambda: e.query()),
        ("memcpy", lambda: paddle_rt.memcpy(host, a, 64)),
        ("memcpy_async", lambda: paddle_rt.memcpy_async(host, a, 64, s)),
        ("memset", lambda: paddle_rt.memset(a, 0, 64)),
        ("memset_async", lambda: paddle_rt.memset_async(a, 0, 64, s)),
        ("MemPool()", lambda: paddle_rt.MemPool(d0)),
        ("MemPool.malloc_async", lambda: pool.malloc_async(64, s)),
        ("malloc_async", lambda: paddle_rt.malloc_async(64, s)),
        ("default_mem_pool", lambda: paddle_rt.default_mem_pool(d0)),
        ("all_reduce", lambda: ccl.all_reduce(o["bufs"][0], o["bufs"][0], comm=o["comms"][0])),
        ("comm_init_all", lambda: ccl.comm_init_all([o["d0"], o["d1"]])),
        ("tensor", lambda: paddle_rt.tensor(np.ones(4, np.float32), device=d0)),
        ("zeros", lambda: paddle_rt.zeros((4,))),
        ("ops.add", lambda: ops.add(t, t)),
        ("Tensor.numpy", lambda: t.numpy()),
        ("synchronize", lambda: paddle_rt.synchronize()),
        ("set_device", lambda: paddle_rt.set_device("rt_cpu:1")),
        ("get_device", lambda: paddle_rt.get_device()),
        ("device", lambda: paddle_rt.device("rt_cpu:0")),
        ("Device.synchronize", lambda: d0.synchronize()),
        ("Device.memory_info", lambda: d0.memory_info()),
        ("devices", lambda: paddle_rt.devices()),
        ("device_count", lambda: paddle_rt.device_count("rt_cpu")),
        ("Stream.wait_event", lambda: s.wait_event(e)),
        ("Event.elapsed_time", lambda: e.elapsed_time(e)),
        ("Stream.add_callback", lambda: s.add_callback(lambda: None)),
        ("allocator_functions", lambda: paddle_rt.allocator_functions(d0)),
        ("dump_trace", lambda: paddle_rt.dump_trace(os.devnull)),
        ("memory.record_history", lambda: paddle_rt.memory.record_history()),
        ("memory.history", lambda: paddle_rt.memory.history()),
        ("memory.dump_snapshot", lambda: paddle_rt.memory.dump_snapshot(os.devnull)),
    ]


def parents_objects_after_reinit(o):
    """(name, call, raises ForkError) on the parent's objects in the child after reinitialize_after_fork: its
    streams, events recorded there, pools and communicators raise ForkError; freeing its memory and reading its
    tensors (the child's copy-on-write copies) do nothing harmful; none waits."""
    s, e, pool, t = o["s"], o["e"], o["pool"], o["t"]
    return [
        ("parent's Stream.synchronize", lambda: s.synchronize(), True),
        ("parent's Stream.query", lambda: s.query(), True),
        ("Event.record on the parent's stream", lambda: e.record(s), True),
        ("parent's MemPool.malloc_async", lambda: pool.malloc_async(64), True),
        ("all_reduce on the parent's communicator", lambda: ccl.all_reduce(o["bufs"][0], o["bufs"][0],
                                                                           comm=o["comms"][0]), True),
        ("parent's Communicator.destroy", lambda: o["comms"][1].destroy(), False),
        ("parent's Allocation.free", lambda: o["a"].free(), False),
        ("ops.add on the parent's tensor", lambda: ops.add(t, t).numpy(), False),
        ("synchronize", lambda: paddle_rt.synchronize(), False),
    ]


def working_calls(o):
    """(name, call) that must work in the child after reinitialize_after_fork."""
    def memory():
        b = paddle_rt.malloc(8 << 20)
        v = np.asarray(b).view(np.uint8)
        if (v == 0x5A).all():
            raise AssertionError("the child's new block holds the parent's bytes")
        v[:] = 0x22
        del v
        b.free()
        paddle_rt.empty_cache()
        st = paddle_rt.memory_stats()
        if st["reserved_bytes.all.current"] != 0 or st["allocated_bytes.all.current"] != 0:
            raise AssertionError(f"counters after empty_cache: {st['reserved_bytes.all.current']}")

    def streams():
        s = paddle_rt.Stream()
        e = paddle_rt.Event()
        b = paddle_rt.malloc(4096)
        host = np.zeros(4096, np.uint8)
        paddle_rt.memset_async(b, 7, 4096, s)
        paddle_rt.memcpy_async(host, b, 4096, s)
        e.record(s)
        e.synchronize()
        if not (host == 7).all():
            raise AssertionError("copy on a child's stream")
        b.free()

    def pool():
        s = paddle_rt.Stream()
        x = paddle_rt.malloc_async(1 << 16, s)
        paddle_rt.free_async(x, s)
        s.synchronize()

    def collectives():
        d0, d1 = paddle_rt.device("rt_cpu:0"), paddle_rt.device("rt_cpu:1")
        comms = ccl.comm_init_all([d0, d1])
        streams = [paddle_rt.Stream(c.device) for c in comms]
        xs = [paddle_rt.tensor(np.full(8, i + 1, np.float32), device=c.device, stream=s)
              for i, (c, s) in enumerate(zip(comms, streams))]
        works = [ccl.all_reduce(x, x, "sum", comm=c, stream=s) for x, c, s in zip(xs, comms, streams)]
        for w in works:
            w.wait(timeout=60)
        if not all((x.numpy() == 3).all() for x in xs):
            raise AssertionError("all_reduce in the child")

    def operators():
        x = paddle_rt.tensor(np.arange(8, dtype=np.float32))
        if not (ops.add(x, x).numpy() == 2 * np.arange(8)).all():
            raise AssertionError("ops.add in the child")

    return [("memory", memory), ("streams", streams), ("pool", pool), ("collectives", collectives),
            ("operators", operators)]


def child(o, wfd, timeout):
    import faulthandler
    faulthandler.dump_traceback_later(timeout, exit=True)   # a hang shows where it is, then the child exits (1)
    fails = []
    for name, call in forked_calls(o):
        try:
            call()
            fails.append([name, "no error"])
        except paddle_rt.ForkError:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            fails.append([name, f"{type(exc).__name__}: {exc}"[:200]])
    try:
        paddle_rt.reinitialize_after_fork()
        for name, call, forks in parents_objects_after_reinit(o):
            try:
                call()
                if forks:
                    fails.append(["after reinitialize: " + name, "no ForkError"])
            except paddle_rt.ForkError:
                if not forks:
                    fails.append(["after reinitialize: " + name, "ForkError"])
            except BaseException as exc:  # noqa: BLE001
                fails.append(["after reinitialize: " + name, f"{type(exc).__name__}: {exc}"[:200]])
        for name, call in working_calls(o):
            try:
                call()
            except BaseException as exc:  # noqa: BLE001
                fails.append(["after reinitialize: " + name, f"{type(exc).__name__}: {exc}"[:200]])
    except BaseException as exc:  # noqa: BLE001
        fails.append(["reinitialize_after_fork", f"{type(exc).__name__}: {exc}"[:200]])
    os.write(wfd, json.dumps(fails).encode())
    os._exit(0)


def allocator_thread(stop, seed, d0):
    rng = np.random.default_rng(seed)
    s = paddle_rt.Stream(d0)
    while not stop.is_set():
        held = [paddle_rt.malloc(int(n), device=d0) for n in rng.integers(1, 3 << 20, 4)]
        x = paddle_rt.malloc_async(int(rng.integers(1, 1 << 20)), s)
        h = paddle_rt.malloc_host(4096)
        paddle_rt.memset_async(held[0], 1, 1, s)
        paddle_rt.free_async(x, s)
        s.synchronize()
        for b in held:
            b.free()
        h.free()
        if rng.random() < 0.2:
            paddle_rt.empty_cache(d0)


def collectives_thread(stop):
    comms = ccl.comm_init_all(["rt_cpu:0", "rt_cpu:1"])
    streams = [paddle_rt.Stream(c.device) for c in comms]
    xs = [paddle_rt.tensor(np.ones(1024, np.float32), device=c.device, stream=s) for c, s in zip(comms, streams)]
    while not stop.is_set():
        for w in [ccl.all_reduce(x, x, "max", comm=c, stream=s) for x, c, s in zip(xs, comms, streams)]:
            w.wait(timeout=60)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child-timeout", type=float, default=30)
    args = ap.parse_args(argv)
    o = parent_objects()
    stop = threading.Event()
    threads = [threading.Thread(target=allocator_thread, args=(stop, i, o["d0"]), daemon=True)
               for i in range(args.threads)]
    threads.append(threading.Thread(target=collectives_thread, args=(stop,), daemon=True))
    for t in threads:
        t.start()
    forks = hung = failed = 0
    first = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end or forks < 2:
        time.sleep(0.01)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(o, w, args.child_timeout)
        os.close(w)
        forks += 1
        chunks, deadline = [], time.monotonic() + args.child_timeout + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = -1
                break
            time.sleep(0.01)
        while True:
            c = os.read(r, 65536)
            if not c:
                break
            chunks.append(c)
        os.close(r)
        text = b"".join(chunks).decode()
        if status == -1 or (status != 0 and not text):
            hung += 1
            first.append(["child", f"hung or died (status {status})"])
            continue
        fails = json.loads(text) if text else [["child", "no report"]]
        if fails:
            failed += 1
            first.extend(fails)
    stop.set()
    for t in threads:
        t.join()
    intact = bool((np.asarray(o["a"]).view(np.uint8) == 0x5A).all())
    print(json.dumps({"forks": forks, "hung": hung, "failed": failed, "parent_intact": intact,
                      "first": first[:20]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
