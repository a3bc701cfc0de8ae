"""Stream, event and copy benchmarks (paddle_rt/_core/stream.pyx, event.pyx, memcpy.pyx), run by
``python -m paddle_rt bench`` and by bench/bench_stream.py. Every figure is the median of the repetitions; the
baselines (numpy.copyto) are measured in the same run, the two sides interleaved.

Targets: empty C ops through one stream >= 1 M/s (enqueue to completion); event record + query from Python
<= 300 ns; ``Event.elapsed_time`` within 50 us of a 10 ms busy-wait run on the stream; ``memcpy_async`` of 64 MiB
(D2D on rt_cpu) >= 90% of numpy.copyto's bandwidth.
"""
import statistics
import sys
import time

import numpy as np

import paddle_rt
from paddle_rt.bench import result, figure

AREA = "streams"
OPS_PER_S, RECORD_QUERY_NS, ELAPSED_ERROR_US, COPY_PERCENT = 1e6, 300.0, 50.0, 90.0


def _cb():
    from paddle_rt.bench import _stream_kernels as _bench_stream
    return _bench_stream


def med(fn, reps):
    return statistics.median(fn() for _ in range(reps))


def python_callback_enqueue_ns(s, n=100_000):
    f = (lambda: None)
    s.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        s.add_callback(f)
    t1 = time.perf_counter_ns()
    s.synchronize()
    return (t1 - t0) / n


def python_callback_throughput(s, n=100_000):
    f = (lambda: None)
    s.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        s.add_callback(f)
    s.synchronize()
    return n / ((time.perf_counter_ns() - t0) / 1e9)


def c_op_enqueue_from_python_ns(s, n=200_000):
    nop = s._enqueue_nop
    s.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        nop()
    t1 = time.perf_counter_ns()
    s.synchronize()
    return (t1 - t0) / n


def c_host_func_from_python_ns(s, n=200_000):
    import ctypes
    free_addr = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p).value   # free(NULL): a no-op void f(void*)
    add = s.add_host_func
    s.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        add(free_addr, 0)
    t1 = time.perf_counter_ns()
    s.synchronize()
    return (t1 - t0) / n


def c_op_from_cython(s, n=1_000_000):
    enq, total, ran = _cb().enqueue_host_funcs(s, n)
    assert ran == n
    return enq / n, n / (total / 1e9)


def event_record_query_ns(s, n=200_000, busy=False):
    e = paddle_rt.Event()
    s.synchronize()
    if busy:
        import threading
        gate = threading.Event()
        s.add_callback(gate.wait, 60)
    rec, q = e.record, e.query
    t0 = time.perf_counter_ns()
    for _ in range(n):
        rec(s)
        q()
    t1 = time.perf_counter_ns()
    if busy:
        gate.set()
    s.synchronize()
    return (t1 - t0) / n


def elapsed_time_error_us(s, busy_ms=10.0):
    a, b = paddle_rt.Event(enable_timing=True), paddle_rt.Event(enable_timing=True)
    import threading
    s.synchronize()
    gate = threading.Event()
    s.add_callback(gate.wait, 60)     # hold the stream so that the three operations run back to back
    a.record(s)
    _cb().enqueue_busy_wait(s, int(busy_ms * 1e6))
    b.record(s)
    gate.set()
    b.synchronize()
    return abs(a.elapsed_time(b) - busy_ms) * 1000.0


def copy_bandwidth(s, nbytes=64 << 20, inner=5):
    """(ours, numpy_): functions returning the bytes per second of ``inner`` 64 MiB copies each."""
    x, y = paddle_rt.malloc(nbytes), paddle_rt.malloc(nbytes)
    paddle_rt.memset(x, 1)
    paddle_rt.memset(y, 2)
    hx, hy = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    np.copyto(hy, hx)

    def ours():
        s.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            paddle_rt.memcpy_async(y, x, stream=s)
        s.synchronize()
        return inner * nbytes / ((time.perf_counter_ns() - t0) / 1e9)

    def numpy_():
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            np.copyto(hy, hx)
        return inner * nbytes / ((time.perf_counter_ns() - t0) / 1e9)

    return ours, numpy_


def collect(reps, quick=False):
    """[(label, display text, result dict)] for every figure, in bench/bench_stream.py's order."""
    r = reps
    k = 5 if quick else 1            # quick: a fifth of the iterations
    s = paddle_rt.Stream()
    rows = []

    def add(label, display, name, value, unit, target=None, met=None, note=""):
        rows.append((label, display, result(AREA, name, value, unit, target, met, note)))

    def add_samples(label, display, name, samples, unit, note="", **bound):
        rows.append((label, display, figure(AREA, name, samples, unit, note=note, **bound)))

    try:
        v = med(lambda: python_callback_enqueue_ns(s, 100_000 // k), r)
        add("Python callback: enqueue (add_callback)", f"{v:.0f} ns", "Python callback enqueue (add_callback)",
            v, "ns")
        v = med(lambda: python_callback_throughput(s, 100_000 // k), r)
        add("Python callback: end-to-end throughput", f"{v / 1e6:.2f} M/s", "Python callbacks run end to end",
            v / 1e6, "M/s")
        v = med(lambda: c_host_func_from_python_ns(s, 200_000 // k), r)
        add("C host function enqueued from Python (Stream.add_host_func)", f"{v:.0f} ns",
            "C host function enqueued from Python (add_host_func)", v, "ns")
        v = med(lambda: c_op_enqueue_from_python_ns(s, 200_000 // k), r)
        add("empty C op enqueued from Python (Stream._enqueue_nop)", f"{v:.0f} ns",
            "empty C op enqueued from Python", v, "ns")
        res = [c_op_from_cython(s, 1_000_000 // k) for _ in range(r)]
        v = statistics.median(x[0] for x in res)
        add("C host function enqueued from Cython (stream_launch_host_func, nogil)", f"{v:.1f} ns",
            "C host function enqueued from Cython (nogil)", v, "ns")
        thr = [x[1] / 1e6 for x in res]
        add_samples("empty C ops through one stream, enqueue to completion (target >= 1 M/s)",
                    f"{statistics.median(thr):.2f} M/s", "empty C ops through one stream, enqueue to completion", thr,
                    "M/s", at_least=OPS_PER_S / 1e6)
        v = [event_record_query_ns(s, 200_000 // k) for _ in range(r)]
        add_samples("Event record+query from Python, idle stream (target <= 300 ns)", f"{statistics.median(v):.0f} ns",
                    "Event record + query from Python, idle stream", v, "ns", at_most=RECORD_QUERY_NS)
        v = med(lambda: event_record_query_ns(s, 50_000 // k, True), r)
        add("Event record+query from Python, busy stream", f"{v:.0f} ns",
            "Event record + query from Python, busy stream", v, "ns")
        errs = [elapsed_time_error_us(s) for _ in range(max(r, 7))]
        e = statistics.median(errs)
        add_samples("elapsed_time vs a 10 ms busy-wait on the stream: |error| median / max (target <= 50 us)",
                    f"{e:.1f} / {max(errs):.1f} us", "elapsed_time error vs a 10 ms busy-wait (median)", errs, "us",
                    at_most=ELAPSED_ERROR_US, note=f"max {max(errs):.1f} us over {len(errs)}")
        ours, base = copy_bandwidth(s, inner=2 if quick else 5)
        ours_bw, base_bw, ratios = [], [], []
        for i in range(2 * r + 1):          # back-to-back pairs, alternating which goes first
            if i % 2:
                b_, o_ = base(), ours()
            else:
                o_, b_ = ours(), base()
            ours_bw.append(o_)
            base_bw.append(b_)
            ratios.append(o_ / b_)
        o, b = statistics.median(ours_bw), statistics.median(base_bw)
        add("memcpy_async 64 MiB D2D on rt_cpu", f"{o / 1e9:.2f} GB/s", "memcpy_async 64 MiB D2D", o / 1e9, "GB/s")
        add("numpy.copyto 64 MiB (same run)", f"{b / 1e9:.2f} GB/s", "numpy.copyto 64 MiB, same run", b / 1e9, "GB/s")
        pct = 100 * statistics.median(ratios)
        add_samples("median of per-pair ratios (target >= 90%)", f"{pct:.0f}%", "  memcpy_async / numpy.copyto",
                    [100 * x for x in ratios], "%", at_least=COPY_PERCENT, note="median of per-pair ratios")
        # Diagnostic: numpy madvise()s big arrays for transparent huge pages, rt_cpu's device memory is plain malloc.
        try:
            mad = np._core.multiarray._set_madvise_hugepage
        except AttributeError:
            mad = np.core.multiarray._set_madvise_hugepage
        old = mad(False)
        try:
            _, base_small_pages = copy_bandwidth(s, inner=2 if quick else 5)
            v = statistics.median(base_small_pages() for _ in range(r)) / 1e9
            add("numpy.copyto 64 MiB without huge pages (like rt_cpu's memory)", f"{v:.2f} GB/s",
                "numpy.copyto 64 MiB without huge pages", v, "GB/s", note="like rt_cpu's memory (diagnostic)")
        finally:
            mad(old)
    finally:
        s.close()
    return rows


def measure(quick=False):
    """The stream, event and copy figures (on the current device)."""
    return [d for _, _, d in collect(3 if quick else 7, quick)]
