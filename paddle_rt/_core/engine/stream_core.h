/* The library-side ordered queue of one paddle_rt stream with its worker thread.
 *
 * Mutable process state (the calling thread's worker and selected stream, the registry of live streams) is declared
 * here and defined once, in stream_state.cpp, which only the stream extension links; every other extension reaches
 * it through functions cimported from paddle_rt._core.stream. The logic that talks to plugins and to Python is in
 * stream.pyx. */
#ifndef PADDLE_RT_ENGINE_STREAM_CORE_H_
#define PADDLE_RT_ENGINE_STREAM_CORE_H_

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "engine/clock.h"

/* One queued operation: fn(ctx, arg, aux, pos) runs on the stream's worker and returns 1 when it handed work to
   the plugin's stream (it completes later: the worker synchronises the plugin stream before the next operation
   flagged PRT_OP_NEEDS_IDLE and whenever it runs out of work), 0 when it is done, -1 after recording an error. */
enum { PRT_OP_PLUGIN_ASYNC = 1, PRT_OP_NEEDS_IDLE = 2, PRT_OP_DROPPABLE = 4 };
/* An operation flagged PRT_OP_DROPPABLE that the worker reaches after drop_queued() is not run: its fn is called with
   pos | PRT_POS_DROPPED and must only release what it holds (and complete what others may wait for) and return 0.
   Operations without the flag (bookkeeping such as deferred frees, collectives) always run. */
#define PRT_POS_DROPPED (1ull << 63)
/* What an operation is, for the profiler: flags | prt_op_kind(PRT_OPK_...). */
enum {
    PRT_OPK_OTHER = 0, PRT_OPK_NOP = 1, PRT_OPK_HOST_FUNC = 2, PRT_OPK_PY_CALLBACK = 3, PRT_OPK_MEMCPY_H2H = 4,
    PRT_OPK_MEMCPY_H2D = 5, PRT_OPK_MEMCPY_D2H = 6, PRT_OPK_MEMCPY_D2D = 7, PRT_OPK_MEMCPY_P2P = 8,
    PRT_OPK_MEMSET = 9, PRT_OPK_EVENT_RECORD = 10, PRT_OPK_EVENT_WAIT = 11, PRT_OPK_COLLECTIVE = 12,
    PRT_OPK_OPERATOR = 13
};
static inline int prt_op_kind(int k) { return k << 8; }
typedef int (*prt_op_fn)(void* ctx, void* arg, uint64_t aux, uint64_t pos);
struct prt_op {
    prt_op* next;
    prt_op_fn fn;
    void* arg;
    uint64_t aux;
    uint64_t pos;
    int flags;
    int64_t enq_ns;       /* enqueue time while streams are traced, else 0 */
    uint64_t nbytes;      /* bytes the operation moves (for the profiler) */
    uint64_t seq;         /* the process's order number at its enqueue (prt_stream_core::order) */
};
/* A traced operation handed to the plugin's stream: it ends when the worker has synchronised that stream. */
struct prt_traced_op {
    int kind;
    uint64_t pos, nbytes;
    int64_t enq_ns, start_ns;
};
inline constexpr int prt_trace_off = 0;
typedef void (*prt_trace_op_fn)(void* ctx, int kind, uint64_t pos, uint64_t nbytes, int64_t enq_ns,
                                int64_t start_ns, int64_t end_ns);

struct prt_stream_core;
/* The stream whose worker the calling thread is (NULL on other threads). Defined in stream_state.cpp, which only the
   stream extension links: other modules ask stream.pyx (stream_current_worker, cimported), so there is one per
   thread in the process, not one per extension module. */
extern thread_local prt_stream_core* prt_t_worker;

/* The ordered queue of one paddle_rt stream. Positions: the n-th operation submitted has position n (from 1);
   `completed` is the highest position known complete (everything up to it has run, plugin work included). */
struct prt_stream_core {
    std::mutex mu;
    std::condition_variable work_cv;
    std::condition_variable done_cv;
    prt_op* head = nullptr;
    prt_op* tail = nullptr;
    prt_op* free_ops = nullptr;
    uint64_t submitted = 0;                    /* under mu */
    std::atomic<uint64_t> submitted_pub{0};    /* copy of submitted readable without the lock */
    /* The process-wide order of enqueues (stream_state.cpp's counter, shared by every stream; set before the first
       enqueue): each operation takes the next number under `mu`, so one stream's numbers rise with its positions.
       `completed_seq` is the number of the operation at `completed`. A free of memory last used by this stream's
       work, made when the counter read S (prt_order_now), has completed once completed_seq >= S, or the first
       unfinished operation is numbered above S (first_unfinished_seq), or the stream is idle: every operation
       submitted before the free has a number <= S (the allocator's "has this free run?",
       without knowing the stream at the free: prt_streams_done). */
    std::atomic<uint64_t>* order = nullptr;
    /* The stream's tag in allocator blocks and recorded events: unique in the process, never reused (a queue's
       address may be, by a later stream, which must not inherit the memory cached under the old one). */
    uintptr_t tag = 0;
    bool stopping = false;
    std::atomic<int> dropping{0};              /* drop_queued(): droppable operations not yet started are dropped */
    bool sleeping = false;
    int waiters = 0;
    bool started = false;
    /* set (for good) before the stream's first operation that touches another device's memory (a P2P copy):
       from then on prt_streams_idle counts the stream for every device */
    std::atomic<int> cross_device{0};
    /* What the worker writes after each operation, on cache lines of their own: the queue's side above (head, tail,
       stopping, sleeping: read and written by every enqueue) would otherwise move between the two cores with each
       operation run. `completed`: the highest position complete. */
    alignas(64) std::atomic<uint64_t> completed{0};
    std::atomic<uint64_t> completed_seq{0};
    /* The order number of the stream's first unfinished operation when the worker last started one with nothing
       unfinished before it (plugin work included): every operation of this stream numbered below it has completed.
       It only grows, so a stale value errs on the safe side. done_by uses it when another stream's operations were
       numbered between this stream's last operation and a free (completed_seq then stays below the free's number
       until this stream completes an operation submitted after the free). */
    std::atomic<uint64_t> first_unfinished_seq{0};
    bool dirty = false;                                /* worker only: plugin work handed off, not yet waited */
    /* callbacks into stream.pyx (from here on: nothing else on the worker's lines) */
    alignas(64) void* ctx = nullptr;
    void (*thread_init)(void* ctx) = nullptr;          /* on the worker, once: set the device */
    void (*thread_exit)(void* ctx) = nullptr;          /* on the worker, last */
    int (*plugin_sync)(void* ctx) = nullptr;           /* wait for the plugin stream; 0 ok */
    std::thread worker;
    /* tracing (trace.pyx): operations enqueued while (*trace_mask & trace_bit) are timed and reported */
    const int* trace_mask = &prt_trace_off;
    int trace_bit = 0;
    prt_trace_op_fn trace_op = nullptr;
    std::vector<prt_traced_op> traced_async;           /* worker only */

    ~prt_stream_core() {
        prt_op* o = free_ops;
        while (o) { prt_op* n = o->next; delete o; o = n; }
    }

    /* Returns the position, 0 when out of memory, UINT64_MAX when the stream is stopping. */
    uint64_t enqueue(prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes = 0) {
        int64_t t = __builtin_expect((*trace_mask & trace_bit) != 0, 0) ? prt_now_ns() : 0;
        std::unique_lock<std::mutex> lk(mu);
        if (stopping) return UINT64_MAX;
        prt_op* o = free_ops;
        if (o) free_ops = o->next;
        else {
            o = new (std::nothrow) prt_op;
            if (!o) return 0;
        }
        o->next = nullptr; o->fn = fn; o->arg = arg; o->aux = aux; o->flags = flags;
        o->enq_ns = t; o->nbytes = nbytes;
        o->seq = order->fetch_add(1, std::memory_order_acq_rel) + 1;
        o->pos = ++submitted;
        submitted_pub.store(submitted, std::memory_order_release);
        if (tail) tail->next = o; else head = o;
        tail = o;
        if (sleeping) { sleeping = false; work_cv.notify_one(); }
        return o->pos;
    }

    /* Runs fn on the calling thread as the stream's next operation when the stream is idle (nothing queued or
       running, plugin work included) and returns its position; 0 when it is not (or its lock is busy: enqueue the
       operation instead), UINT64_MAX when the stream is stopping. The queue's lock is held while fn runs, so nothing
       enqueued meanwhile can overtake it: for short operations that finish on the host (a staged small copy through
       the plugin's synchronous hook), never for one that hands work to the plugin's stream (returns 1). */
    uint64_t run_now_if_idle(prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes = 0) {
        std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
        if (!lk.owns_lock()) return 0;
        if (stopping) return UINT64_MAX;
        if (head || completed.load(std::memory_order_acquire) != submitted) return 0;
        int64_t t = __builtin_expect((*trace_mask & trace_bit) != 0, 0) ? prt_now_ns() : 0;
        uint64_t seq = order->fetch_add(1, std::memory_order_acq_rel) + 1;
        uint64_t pos = ++submitted;
        submitted_pub.store(submitted, std::memory_order_release);
        fn(ctx, arg, aux, pos);
        if (__builtin_expect(t != 0, 0) && trace_op) trace_op(ctx, flags >> 8, pos, nbytes, t, t, prt_now_ns());
        finish(pos, seq);
        if (waiters) done_cv.notify_all();
        return pos;
    }

    void sync_plugin() {
        if (dirty) {
            if (plugin_sync) plugin_sync(ctx);
            dirty = false;
            if (!traced_async.empty()) {
                int64_t end = prt_now_ns();
                for (const prt_traced_op& t : traced_async)
                    if (trace_op) trace_op(ctx, t.kind, t.pos, t.nbytes, t.enq_ns, t.start_ns, end);
                traced_async.clear();
            }
        }
    }

    /* A traced operation ran (r: what its fn returned); report it, or keep it until the plugin stream is synced. */
    void traced(const prt_op* o, int r, int64_t start) {
        if (!trace_op) return;
        if (r == 1) {
            try { traced_async.push_back(prt_traced_op{o->flags >> 8, o->pos, o->nbytes, o->enq_ns, start}); }
            catch (...) {}
        } else {
            trace_op(ctx, o->flags >> 8, o->pos, o->nbytes, o->enq_ns, start, prt_now_ns());
        }
    }

    void finish(uint64_t pos, uint64_t seq) {
        completed_seq.store(seq, std::memory_order_release);     /* first: a reader of both sees no later seq */
        completed.store(pos, std::memory_order_release);
    }

    /* Plugin work handed off is pending: wait for the plugin's stream, then publish everything up to the last
       operation run (position `pos`, order number `seq`) as complete (worker only). */
    void settle(uint64_t pos, uint64_t seq) {
        sync_plugin();
        finish(pos, seq);
    }

    /* Whether the work submitted before order number `seq` has completed (see `order`). */
    bool done_by(uint64_t seq) const {
        return completed_seq.load(std::memory_order_acquire) >= seq ||
               first_unfinished_seq.load(std::memory_order_acquire) > seq || idle();
    }

    void run() {
        prt_t_worker = this;
        if (thread_init) thread_init(ctx);
        std::unique_lock<std::mutex> lk(mu);
        uint64_t last = 0, last_seq = 0;
        bool spun = false;
        for (;;) {
            if (!head) {
                if (dirty) {
                    lk.unlock();
                    settle(last, last_seq);
                    lk.lock();
                    continue;
                }
                if (waiters) done_cv.notify_all();
                if (stopping) break;
                if (!spun) {
                    /* Out of work: watch for more for a few microseconds before sleeping, so that a steady
                       producer does not pay a futex wake-up per operation. */
                    spun = true;
                    uint64_t seen = submitted;
                    lk.unlock();
                    int64_t until = prt_now_ns() + PRT_SPIN_NS;
                    for (unsigned i = 1;; ++i) {
                        if (submitted_pub.load(std::memory_order_relaxed) != seen) break;
                        prt_cpu_relax();
                        if ((i & 63) == 0 && prt_now_ns() > until) break;
                    }
                    lk.lock();
                    continue;
                }
                spun = false;
                sleeping = true;
                work_cv.wait(lk, [this] { return head != nullptr || stopping; });
                sleeping = false;
                continue;
            }
            spun = false;
            prt_op* batch = head;
            head = tail = nullptr;
            lk.unlock();
            prt_op* o = batch;
            prt_op* end = nullptr;
            while (o) {
                int r;
                if ((o->flags & PRT_OP_DROPPABLE) && dropping.load(std::memory_order_acquire)) {
                    r = o->fn(ctx, o->arg, o->aux, o->pos | PRT_POS_DROPPED);
                } else {
                    if ((o->flags & PRT_OP_NEEDS_IDLE) && dirty) settle(last, last_seq);   /* before o runs */
                    if (!dirty) first_unfinished_seq.store(o->seq, std::memory_order_release);
                    int64_t t0 = __builtin_expect(o->enq_ns != 0, 0) ? prt_now_ns() : 0;
                    r = o->fn(ctx, o->arg, o->aux, o->pos);
                    if (__builtin_expect(t0 != 0, 0)) traced(o, r, t0);
                }
                last = o->pos;
                last_seq = o->seq;
                if (r == 1) dirty = true;
                else if (!dirty) finish(o->pos, o->seq);
                end = o;
                o = o->next;
            }
            lk.lock();
            end->next = free_ops;
            free_ops = batch;
            if (waiters && !dirty) done_cv.notify_all();
        }
        lk.unlock();
        if (thread_exit) thread_exit(ctx);
    }

    void start() {
        worker = std::thread([this] { this->run(); });
        started = true;
    }

    bool idle() const {
        return completed.load(std::memory_order_acquire) >= submitted_pub.load(std::memory_order_acquire);
    }
    bool reached(uint64_t pos) const { return completed.load(std::memory_order_acquire) >= pos; }

    /* Wait up to timeout_us for `pos` to complete; true when it did. */
    bool wait_for(uint64_t pos, long timeout_us) {
        if (reached(pos)) return true;
        std::unique_lock<std::mutex> lk(mu);
        ++waiters;
        bool ok = done_cv.wait_for(lk, std::chrono::microseconds(timeout_us), [&] { return reached(pos); });
        --waiters;
        return ok;
    }

    /* From now on the worker drops the droppable operations it has not started (close(wait=False), exit after an
       unhandled exception); the one running finishes. */
    void drop_queued() {
        dropping.store(1, std::memory_order_release);
        std::lock_guard<std::mutex> lk(mu);
        if (sleeping) { sleeping = false; work_cv.notify_one(); }
    }

    /* Stop the worker after it drained the queue and join it (or detach when called from the worker). */
    void stop_and_join() {
        {
            std::lock_guard<std::mutex> lk(mu);
            stopping = true;
            work_cv.notify_one();
        }
        if (started) {
            if (std::this_thread::get_id() == worker.get_id()) worker.detach();
            else worker.join();
            started = false;
        }
    }
};


static inline prt_stream_core* prt_stream_core_new(void) { return new (std::nothrow) prt_stream_core(); }
static inline void prt_stream_core_delete(prt_stream_core* c) { delete c; }

/* -- defined in stream_state.cpp (the stream extension only) -- */
/* The stream a thread selected with `with paddle_rt.stream(s)` (its core) and that stream's Device object. */
extern thread_local void* prt_t_stream_tag;
extern thread_local void* prt_t_stream_dev;
/* The live stream cores of the process with their Device objects, for the allocator's question "may memory of
   this device go back to the plugin now?" (prt_streams_idle). Never freed: the registry must outlive every stream,
   and a child of fork() starts a new one (prt_streams_reset), because a thread of the parent may have held the old
   mutex at the fork. Lock order: an allocator's lock may be held while taking its mutex, never the reverse. */
int prt_streams_reset(void);                                   /* 0, or -1 when out of memory */
int prt_streams_add(void* device, prt_stream_core* c);         /* 0, or -1 when out of memory (not registered) */
void prt_streams_remove(prt_stream_core* c);
size_t prt_streams_count(void* device);                        /* of `device`, or of all with NULL */
/* True when every live stream of `device` (NULL: of every device) has completed everything submitted to it so far,
   plugin work included. Never blocks beyond the registry's mutex. */
bool prt_streams_idle(void* device);
/* The process's order counter (prt_stream_core::order): every stream core points at it. */
std::atomic<uint64_t>* prt_order_counter(void);
/* A new stream tag (prt_stream_core::tag): 1, 2, 3, ... */
uintptr_t prt_next_stream_tag(void);
/* The stream core that allocator tag `tag` names on `device` (tag 0: the device's default stream) has completed
   the work submitted before order number `seq`; true as well when no live stream has that tag (a closed stream:
   nothing of it runs any more). Never blocks beyond the registry's mutex. */
bool prt_streams_done(void* device, uintptr_t tag, uint64_t seq);
/* Wait (polling; no lock held between polls) until prt_streams_done(device, tag, seq), at most timeout_ns: whether it
   became true. */
bool prt_streams_wait_done(void* device, uintptr_t tag, uint64_t seq, int64_t timeout_ns);
/* Mark `c` as the default stream of its device (allocator tag 0) in the registry. */
void prt_streams_set_default(prt_stream_core* c);

#endif /* PADDLE_RT_ENGINE_STREAM_CORE_H_ */
