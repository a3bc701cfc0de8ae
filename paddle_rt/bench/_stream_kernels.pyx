"""Benchmark helpers for bench/bench_stream.py: enqueue C host functions from Cython through the stream C API."""
from libc.stdint cimport uint64_t, int64_t
from paddle_rt._core.stream cimport Stream, stream_launch_host_func
from paddle_rt._core.includes.stream_support cimport prt_now_ns


cdef void _count(void* arg) noexcept nogil:
    (<uint64_t*>arg)[0] += 1


cdef void _busy(void* arg) noexcept nogil:
    cdef int64_t until = prt_now_ns() + (<int64_t*>arg)[0]
    while prt_now_ns() < until:
        pass


cdef uint64_t _counter = 0
cdef int64_t _busy_ns = 0


def enqueue_host_funcs(Stream s, Py_ssize_t n):
    """Enqueue n C host functions (a counter increment) from Cython without the GIL; returns (enqueue_ns,
    total_ns_until_all_ran, count_ran)."""
    global _counter
    cdef Py_ssize_t i
    cdef int64_t t0, t1
    _counter = 0
    s.synchronize()
    with nogil:
        t0 = prt_now_ns()
        for i in range(n):
            stream_launch_host_func(s, _count, &_counter)
        t1 = prt_now_ns()
    s.synchronize()
    return t1 - t0, prt_now_ns() - t0, _counter


def enqueue_busy_wait(Stream s, int64_t ns):
    """Enqueue a C host function that busy-waits ns nanoseconds on the stream."""
    global _busy_ns
    _busy_ns = ns
    stream_launch_host_func(s, _busy, &_busy_ns)
