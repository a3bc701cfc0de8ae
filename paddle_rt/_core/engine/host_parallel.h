/* paddle_rt's process-wide thread pool for host kernels (state in host_parallel.cpp, linked into the op extension
 * only; setup.py ENGINE_SOURCES). A host kernel splits its work with prt_parallel_for (or the C++ helper
 * prt::parallel_for below); every kernel of every stream shares the one pool.
 *
 * - Size: the CPUs the process may run on (sched_getaffinity, as os.sched_getaffinity), or PADDLE_RT_NUM_THREADS
 *   when set to a positive integer (1: no pool, every kernel runs on its stream's worker alone). Read once, at the
 *   first parallel call; prt_parallel_set_threads changes the limit at run time (paddle_rt.op.set_num_threads).
 * - Started lazily: no thread exists before the first call that splits work.
 * - No oversubscription: a thread that calls prt_parallel_for always works on its own call (the stream's worker is
 *   busy anyway); pool threads join only while fewer than `threads` threads run chunks, and give way at their next
 *   chunk boundary when a caller arrives above the limit (a pool thread's chunk in progress is the only overlap).
 *   Two streams submitting at once on a 2-thread limit therefore each run alone, and one stream alone gets the
 *   whole pool.
 * - Pool threads sleep on a condition variable between calls (no spinning), so numpy's OpenBLAS threads (gemm goes
 *   through them) have the cores to themselves during a gemm.
 * - Chunks are contiguous ranges [begin, end) of the index space; which thread runs which chunk varies, so a body
 *   must give results that do not depend on the split (each index computed alone, no shared accumulator).
 */
#ifndef PADDLE_RT_ENGINE_HOST_PARALLEL_H_
#define PADDLE_RT_ENGINE_HOST_PARALLEL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* body(ctx, begin, end): run the indices [begin, end). */
typedef void (*prt_parallel_body)(void* ctx, int64_t begin, int64_t end);

/* Runs body over [0, n) in chunks of at least `grain` indices, on the calling thread and the pool; returns when every
   chunk ran. n <= grain or a limit of 1 thread: one call body(ctx, 0, n) on the calling thread, nothing else. */
void prt_parallel_for(int64_t n, int64_t grain, prt_parallel_body body, void* ctx);
/* The current thread limit (the pool's threads plus the caller): >= 1. */
int prt_parallel_threads(void);
/* Sets the limit (clamped to 1..256); pool threads are started when a call needs them. Returns the previous limit. */
int prt_parallel_set_threads(int n);
/* Where the default came from: 1 PADDLE_RT_NUM_THREADS, 0 the CPU affinity; -1 PADDLE_RT_NUM_THREADS was set but is
   not a positive integer (ignored). */
int prt_parallel_source(void);
/* Pool threads started so far. */
int prt_parallel_started(void);
/* A scratch buffer of at least `bytes` owned by the calling thread (grown on demand, freed at the thread's exit);
   NULL when out of memory. For a kernel's per-chunk rows. */
void* prt_parallel_scratch(size_t bytes);

/* Test evidence (paddle_rt.op._pool_trace): when on, each chunk records (job, thread slot, its range, start and end
   ns) into a fixed buffer (16 K chunks). Slot 0 is the calling thread, 1.. the pool's threads. */
typedef struct {
    uint64_t job;
    int32_t slot;
    int32_t _pad;
    int64_t begin, end;
    int64_t t0, t1;
} prt_parallel_event;
void prt_parallel_trace(int on);
/* Copies up to cap recorded events into out, returns how many; clears the record. */
int64_t prt_parallel_trace_take(prt_parallel_event* out, int64_t cap);

#ifdef __cplusplus
}

namespace prt {
/* parallel_for(n, grain, f): f(begin, end) over [0, n), as prt_parallel_for. */
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, F&& f) {
    struct Tramp {
        static void run(void* c, int64_t b, int64_t e) { (*static_cast<F*>(c))(b, e); }
    };
    prt_parallel_for(n, grain, &Tramp::run, static_cast<void*>(&f));
}
}  // namespace prt
#endif

#endif /* PADDLE_RT_ENGINE_HOST_PARALLEL_H_ */
