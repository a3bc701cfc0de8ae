/* The host kernels' thread pool (host_parallel.h): its process state, linked into the op extension only (setup.py
 * ENGINE_SOURCES). One mutex guards the list of open calls and the count of threads running chunks; chunks are
 * claimed with an atomic counter per call, so the mutex is taken a few times per call, not per chunk. Plain pthreads
 * (not std::thread) so that a forked child can forget the parent's threads (pthread_atfork) and start its own. */
#include "engine/host_parallel.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "engine/clock.h"

namespace {

constexpr int kMaxThreads = 256;
constexpr int kChunksPerThread = 16;    /* several chunks per thread: a late, preempted or core-sharing thread costs little */

struct Job {
    prt_parallel_body body;
    void* ctx;
    int64_t n, chunk, nchunks;
    uint64_t id;
    std::atomic<int64_t> next{0};
    int64_t done = 0;                   /* chunks finished (under g_mu) */
    int attached = 0;                   /* pool threads holding this job (under g_mu) */
    Job* prev = nullptr;
    Job* after = nullptr;
};

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_work = PTHREAD_COND_INITIALIZER;   /* pool threads: a job arrived or a thread stopped running */
pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;   /* callers: chunks of their job finished */
Job* g_head = nullptr;                  /* open jobs, oldest first (under g_mu) */
Job* g_tail = nullptr;
std::atomic<int> g_running{0};          /* threads running chunks now (changed under g_mu, read without it) */
int g_started = 0;                      /* pool threads started (under g_mu) */
std::atomic<int> g_limit{0};            /* 0: not configured yet */
std::atomic<int> g_source{0};
std::atomic<uint64_t> g_next_id{1};
pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* test evidence */
constexpr int64_t kTraceCap = 1 << 14;
std::atomic<int> g_trace_on{0};
prt_parallel_event g_trace[kTraceCap];
std::atomic<int64_t> g_trace_n{0};

void record(uint64_t job, int slot, int64_t b, int64_t e, int64_t t0, int64_t t1) {
    int64_t i = g_trace_n.fetch_add(1);
    if (i < kTraceCap) g_trace[i] = prt_parallel_event{job, slot, 0, b, e, t0, t1};
}

int affinity_count() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    return 1;
}

void at_fork_child() {
    /* The parent's pool threads do not exist in the child: start afresh (the mutex may have been held at fork). */
    pthread_mutex_init(&g_mu, nullptr);
    pthread_cond_init(&g_work, nullptr);
    pthread_cond_init(&g_done, nullptr);
    g_head = g_tail = nullptr;
    g_running = 0;
    g_started = 0;
}

void configure() {
    int n = affinity_count(), src = 0;
    const char* env = getenv("PADDLE_RT_NUM_THREADS");
    if (env && *env) {
        char* end = nullptr;
        errno = 0;
        long v = strtol(env, &end, 10);
        if (errno == 0 && end != env && *end == '\0' && v >= 1) {
            n = v > kMaxThreads ? kMaxThreads : (int)v;
            src = 1;
        } else {
            src = -1;
        }
    }
    g_source.store(src);
    int expected = 0;
    g_limit.compare_exchange_strong(expected, n);   /* a set_threads before the first call wins */
    pthread_atfork(nullptr, nullptr, at_fork_child);
}

int limit() {
    int l = g_limit.load(std::memory_order_relaxed);
    if (l > 0) return l;
    pthread_once(&g_once, configure);
    return g_limit.load();
}

void unlink_job(Job* j) {
    if (j->prev) j->prev->after = j->after;
    else g_head = j->after;
    if (j->after) j->after->prev = j->prev;
    else g_tail = j->prev;
    j->prev = j->after = nullptr;
}

/* Runs chunks of j until none is left; returns how many this thread ran. */
int64_t run_chunks(Job* j, int slot) {
    int64_t ran = 0;
    const bool trace = g_trace_on.load(std::memory_order_relaxed) != 0;
    for (;;) {
        /* a pool thread gives way at a chunk boundary when a caller arrived above the limit (callers always run) */
        if (slot > 0 && g_running.load(std::memory_order_relaxed) > g_limit.load(std::memory_order_relaxed)) break;
        int64_t c = j->next.fetch_add(1, std::memory_order_relaxed);
        if (c >= j->nchunks) break;
        int64_t b = c * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
        int64_t t0 = trace ? prt_now_ns() : 0;
        j->body(j->ctx, b, e);
        if (trace) record(j->id, slot, b, e, t0, prt_now_ns());
        ran++;
    }
    return ran;
}

Job* runnable_job() {
    for (Job* j = g_head; j; j = j->after)
        if (j->next.load(std::memory_order_relaxed) < j->nchunks) return j;
    return nullptr;
}

void* pool_main(void* arg) {
    const int slot = (int)(intptr_t)arg;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        Job* j;
        while (slot >= g_limit.load() || g_running >= g_limit.load() || (j = runnable_job()) == nullptr)
            pthread_cond_wait(&g_work, &g_mu);
        j->attached++;
        g_running++;
        pthread_mutex_unlock(&g_mu);
        int64_t ran = run_chunks(j, slot);
        pthread_mutex_lock(&g_mu);
        g_running--;
        j->done += ran;
        j->attached--;
        if (j->done == j->nchunks && j->attached == 0) pthread_cond_broadcast(&g_done);
    }
    return nullptr;
}

/* Starts pool threads up to want - 1 (under g_mu). A thread that cannot be started leaves the pool smaller. */
void ensure_started(int want) {
    while (g_started < want - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, pool_main, (void*)(intptr_t)(g_started + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        g_started++;
    }
}

struct Scratch {
    void* p = nullptr;
    size_t cap = 0;
    ~Scratch() { free(p); }
};
thread_local Scratch t_scratch;

}  // namespace

extern "C" {

void prt_parallel_for(int64_t n, int64_t grain, prt_parallel_body body, void* ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    const int threads = n > grain ? limit() : 1;
    if (threads <= 1) {
        if (__builtin_expect(g_trace_on.load(std::memory_order_relaxed) != 0, 0) && n > grain) {
            int64_t t0 = prt_now_ns();
            body(ctx, 0, n);
            record(g_next_id.fetch_add(1), 0, 0, n, t0, prt_now_ns());
            return;
        }
        body(ctx, 0, n);
        return;
    }
    int64_t nchunks = (n + grain - 1) / grain;
    if (nchunks > (int64_t)threads * kChunksPerThread) nchunks = (int64_t)threads * kChunksPerThread;
    Job j;
    j.body = body;
    j.ctx = ctx;
    j.n = n;
    j.chunk = (n + nchunks - 1) / nchunks;
    j.nchunks = (n + j.chunk - 1) / j.chunk;
    j.id = g_next_id.fetch_add(1, std::memory_order_relaxed);
    pthread_mutex_lock(&g_mu);
    ensure_started(threads);
    j.prev = g_tail;
    if (g_tail) g_tail->after = &j;
    else g_head = &j;
    g_tail = &j;
    g_running++;                       /* the caller always runs its own job */
    if (g_running < threads) pthread_cond_broadcast(&g_work);
    pthread_mutex_unlock(&g_mu);
    int64_t ran = run_chunks(&j, 0);
    pthread_mutex_lock(&g_mu);
    g_running--;
    unlink_job(&j);
    j.done += ran;
    if (g_head) pthread_cond_signal(&g_work);   /* a pool thread may take this thread's place on another job */
    while (j.done < j.nchunks || j.attached > 0) pthread_cond_wait(&g_done, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

int prt_parallel_threads(void) { return limit(); }

int prt_parallel_set_threads(int n) {
    if (n < 1) n = 1;
    if (n > kMaxThreads) n = kMaxThreads;
    int old = limit();
    g_limit.store(n);
    pthread_mutex_lock(&g_mu);
    pthread_cond_broadcast(&g_work);
    pthread_mutex_unlock(&g_mu);
    return old;
}

int prt_parallel_source(void) {
    limit();
    return g_source.load();
}

int prt_parallel_started(void) {
    pthread_mutex_lock(&g_mu);
    int s = g_started;
    pthread_mutex_unlock(&g_mu);
    return s;
}

void* prt_parallel_scratch(size_t bytes) {
    Scratch& s = t_scratch;
    if (s.cap >= bytes && s.p) return s.p;
    size_t cap = bytes < 4096 ? 4096 : bytes;
    void* p = nullptr;
    if (posix_memalign(&p, 64, cap) != 0) return nullptr;
    free(s.p);
    s.p = p;
    s.cap = cap;
    return p;
}

void prt_parallel_trace(int on) {
    if (on) g_trace_n.store(0);    /* turning it on starts a new record; off keeps it for prt_parallel_trace_take */
    g_trace_on.store(on ? 1 : 0);
}

int64_t prt_parallel_trace_take(prt_parallel_event* out, int64_t cap) {
    int64_t n = g_trace_n.load();
    if (n > kTraceCap) n = kTraceCap;
    if (n > cap) n = cap;
    memcpy(out, g_trace, (size_t)n * sizeof(prt_parallel_event));
    g_trace_n.store(0);
    return n;
}

}  // extern "C"
