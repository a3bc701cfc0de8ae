"""C-level loops for the allocator benchmarks and the replay tool (bench/bench_allocator.py, paddle_rt.tools.replay):
the public Cython API of paddle_rt._core.allocator in nogil loops, glibc malloc/free for comparison, and a trivial
cdef class (the floor of creating and dropping a Python object)."""
from libc.stdint cimport uintptr_t, int64_t, uint64_t
from libc.stdlib cimport malloc as c_malloc, free as c_free
from libc.string cimport memset
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


def hold_blocks_sizes(device, const int64_t[::1] sizes):
    """Allocate one block per entry of ``sizes`` and keep them; returns the list of pointers."""
    cdef AllocatorCore* core = get_core(device, KIND_DEVICE)
    cdef void* p = NULL
    cdef Py_ssize_t i
    out = []
    for i in range(sizes.shape[0]):
        with nogil:
            core_malloc(core, <size_t>sizes[i], 0, &p)
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


cdef inline uint64_t _xorshift(uint64_t* s) noexcept nogil:
    cdef uint64_t x = s[0]
    x ^= x << 13
    x ^= x >> 7
    x ^= x << 17
    s[0] = x
    return x


def stress_worker(device, int64_t iters, uint64_t seed, int tag):
    """A nogil loop of random core_malloc/core_free (up to 64 live blocks, sizes 1 B .. 4 MiB). Every block is
    filled with ``tag`` and checked before it is freed: an overlap with another thread's block shows up as a wrong
    byte. Runs without the GIL for its whole length (call it from several Python threads). Returns the number of
    corrupted blocks found."""
    cdef AllocatorCore* core = get_core(device, KIND_DEVICE)
    cdef void* live[64]
    cdef size_t sizes[64]
    cdef int n = 0, i, k
    cdef int64_t it
    cdef uint64_t s = seed * 2654435761ULL + 1
    cdef size_t sz, j
    cdef unsigned char* b
    cdef int64_t bad = 0
    cdef unsigned char t = <unsigned char>tag
    with nogil:
        for it in range(iters):
            if n > 0 and (n == 64 or _xorshift(&s) % 100 < 45):
                k = <int>(_xorshift(&s) % <uint64_t>n)
                b = <unsigned char*>live[k]
                for j in range(0, sizes[k], 61):
                    if b[j] != t:
                        bad += 1
                        break
                if sizes[k] and b[sizes[k] - 1] != t:
                    bad += 1
                core_free(core, live[k])
                n -= 1
                live[k] = live[n]
                sizes[k] = sizes[n]
            else:
                k = <int>(_xorshift(&s) % 4)
                if k == 0:
                    sz = 1 + _xorshift(&s) % 64
                elif k == 1:
                    sz = 1 + _xorshift(&s) % 70000
                elif k == 2:
                    sz = 1 + _xorshift(&s) % (1 << 20)
                else:
                    sz = 1 + _xorshift(&s) % (4 << 20)
                core_malloc(core, sz, 0, &live[n])
                sizes[n] = sz
                memset(live[n], t, sz)
                n += 1
        for i in range(n):
            b = <unsigned char*>live[i]
            for j in range(0, sizes[i], 61):
                if b[j] != t:
                    bad += 1
                    break
            core_free(core, live[i])
    return bad
