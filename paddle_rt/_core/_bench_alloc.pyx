"""C-level loops for the allocator benchmarks and the replay tool (bench/bench_allocator.py, paddle_rt.tools.replay):
the public Cython API of paddle_rt._core.allocator in nogil loops, glibc malloc/free for comparison, and a trivial
cdef class (the floor of creating and dropping a Python object)."""
from libc.stdint cimport uintptr_t, int64_t, uint64_t
from libc.stdlib cimport malloc as c_malloc, free as c_free
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from paddle_rt._core.allocator cimport AllocatorCore, get_core, core_malloc, core_free, KIND_DEVICE


cdef uintptr_t _sink = 0


cdef class Trivial:
    """The floor: an empty cdef class."""
    pass


cdef inline uint64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000ULL + <uint64_t>ts.tv_nsec


def core_pairs(device, const int64_t[::1] sizes, int64_t rounds):
    """alloc+free pairs through core_malloc/core_free in a nogil loop over ``sizes`` (repeated ``rounds`` times).
    Returns nanoseconds per pair."""
    cdef AllocatorCore* core = get_core(device, KIND_DEVICE)
    cdef void* p = NULL
    cdef Py_ssize_t i, n = sizes.shape[0]
    cdef int64_t r
    cdef uint64_t t0, t1
    with nogil:
        t0 = _now_ns()
        for r in range(rounds):
            for i in range(n):
                core_malloc(core, <size_t>sizes[i], 0, &p)
                core_free(core, p)
        t1 = _now_ns()
    return (t1 - t0) / float(rounds * n)


def glibc_pairs(const int64_t[::1] sizes, int64_t rounds):
    """The same loop with glibc malloc/free. Nanoseconds per pair."""
    global _sink
    cdef void* p = NULL
    cdef Py_ssize_t i, n = sizes.shape[0]
    cdef int64_t r
    cdef uint64_t t0, t1
    with nogil:
        t0 = _now_ns()
        for r in range(rounds):
            for i in range(n):
                p = c_malloc(<size_t>sizes[i])
                _sink ^= <uintptr_t>p      # the pointer escapes: the compiler cannot elide the pair
                c_free(p)
        t1 = _now_ns()
    return (t1 - t0) / float(rounds * n)


def hold_blocks(device, int64_t count, int64_t size):
    """Allocate ``count`` blocks of ``size`` bytes and keep them; returns the list of pointers (for the
    many-live-blocks benchmark). Free them with release_blocks."""
    cdef AllocatorCore* core = get_core(device, KIND_DEVICE)
    cdef void* p = NULL
    out = []
    for _ in range(count):
        with nogil:
            core_malloc(core, <size_t>size, 0, &p)
        out.append(<uintptr_t>p)
    return out


def release_blocks(device, ptrs):
    cdef AllocatorCore* core = get_core(device, KIND_DEVICE)
    cdef uintptr_t p
    for x in ptrs:
        p = x
        with nogil:
            core_free(core, <void*>p)


def replay(device, const signed char[::1] is_alloc, const int64_t[::1] sizes, const int64_t[::1] slots,
           uintptr_t[::1] table):
    """Replay a trace through the allocator of ``device`` in a nogil loop: event i allocates ``sizes[i]`` bytes into
    ``table[slots[i]]`` or frees ``table[slots[i]]``. Returns (elapsed_ns, events_done); an allocation error stops
    the loop and is raised after the pointers taken so far have been recorded in ``table``."""
    cdef AllocatorCore* core = get_core(device, KIND_DEVICE)
    cdef Py_ssize_t i, n = is_alloc.shape[0]
    cdef void* p = NULL
    cdef uint64_t t0, t1
    cdef int rc = 0
    i = 0
    try:
        with nogil:
            t0 = _now_ns()
            while i < n:
                if is_alloc[i]:
                    core_malloc(core, <size_t>sizes[i], 0, &p)
                    table[slots[i]] = <uintptr_t>p
                else:
                    core_free(core, <void*>table[slots[i]])
                    table[slots[i]] = 0
                i += 1
            t1 = _now_ns()
    except BaseException as exc:
        exc.events_done = i
        raise
    return (t1 - t0), i
