"""Stream/event/copy benchmarks (issue 4). Run from the repository root after an in-place build:

    python bench/bench_stream.py [--reps 7]

Every figure is the median of --reps repetitions; baselines (numpy.copyto) are measured in the same run.
"""
import argparse
import statistics
import sys
import time

import os

import numpy as np

try:
    import paddle_rt
except ImportError:     # running from a checkout with an in-place build (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import paddle_rt
from paddle_rt._core import _bench_stream as cb


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
    enq, total, ran = cb.enqueue_host_funcs(s, n)
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
    cb.enqueue_busy_wait(s, int(busy_ms * 1e6))
    b.record(s)
    gate.set()
    b.synchronize()
    return abs(a.elapsed_time(b) - busy_ms) * 1000.0


def copy_bandwidth(s, nbytes=64 << 20, inner=5):
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    r = args.reps
    s = paddle_rt.Stream()
    rows = []
    rows.append(("Python callback: enqueue (add_callback)", f"{med(lambda: python_callback_enqueue_ns(s), r):.0f} ns"))
    rows.append(("Python callback: end-to-end throughput", f"{med(lambda: python_callback_throughput(s), r) / 1e6:.2f} M/s"))
    rows.append(("C host function enqueued from Python (Stream.add_host_func)", f"{med(lambda: c_host_func_from_python_ns(s), r):.0f} ns"))
    rows.append(("empty C op enqueued from Python (Stream._enqueue_nop)", f"{med(lambda: c_op_enqueue_from_python_ns(s), r):.0f} ns"))
    res = [c_op_from_cython(s) for _ in range(r)]
    rows.append(("C host function enqueued from Cython (stream_launch_host_func, nogil)",
                 f"{statistics.median(x[0] for x in res):.1f} ns"))
    thr = statistics.median(x[1] for x in res)
    rows.append(("empty C ops through one stream, enqueue to completion (target >= 1 M/s)", f"{thr / 1e6:.2f} M/s"))
    rows.append(("Event record+query from Python, idle stream (target <= 300 ns)",
                 f"{med(lambda: event_record_query_ns(s), r):.0f} ns"))
    rows.append(("Event record+query from Python, busy stream", f"{med(lambda: event_record_query_ns(s, 50_000, True), r):.0f} ns"))
    errs = [elapsed_time_error_us(s) for _ in range(max(r, 7))]
    rows.append(("elapsed_time vs a 10 ms busy-wait on the stream: |error| median / max (target <= 50 us)",
                 f"{statistics.median(errs):.1f} / {max(errs):.1f} us"))
    ours, base = copy_bandwidth(s)
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
    rows.append(("memcpy_async 64 MiB D2D on rt_cpu", f"{o / 1e9:.2f} GB/s"))
    rows.append(("numpy.copyto 64 MiB (same run)", f"{b / 1e9:.2f} GB/s"))
    rows.append(("median of per-pair ratios (target >= 90%)", f"{100 * statistics.median(ratios):.0f}%"))
    # Diagnostic: numpy madvise()s big arrays for transparent huge pages, rt_cpu's device memory is plain malloc.
    try:
        mad = np._core.multiarray._set_madvise_hugepage
    except AttributeError:
        mad = np.core.multiarray._set_madvise_hugepage
    old = mad(False)
    try:
        _, base_small_pages = copy_bandwidth(s)
        rows.append(("numpy.copyto 64 MiB without huge pages (like rt_cpu's memory)",
                     f"{statistics.median(base_small_pages() for _ in range(r)) / 1e9:.2f} GB/s"))
    finally:
        mad(old)
    s.close()
    w = max(len(k) for k, _ in rows)
    print(f"paddle_rt {paddle_rt.__version__}, python {sys.version.split()[0]}, reps={r} (medians)")
    for k, v in rows:
        print(f"| {k:<{w}} | {v:>16} |")


if __name__ == "__main__":
    main()
