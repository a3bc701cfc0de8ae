# C++ support for streams and events: the library-side ordered queue of one stream with its worker thread, and the
# completion state of an event. Only declarations and small inline helpers live here; the logic that talks to
# plugins and to Python is in paddle_rt/_core/stream.pyx and event.pyx.
from libc.stdint cimport uint64_t, int64_t

cdef extern from * nogil:
    """
    #include <stdint.h>
    #include <atomic>
    #include <mutex>
    #include <condition_variable>
    #include <chrono>
    #include <thread>
    #include <vector>
    #include <utility>
    #include <time.h>

    static inline int64_t prt_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }

    #ifndef PRT_SPIN_NS
    #define PRT_SPIN_NS 20000
    #endif
    static inline void prt_cpu_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }

    /* One queued operation: fn(ctx, arg, aux, pos) runs on the stream's worker and returns 1 when it handed work to
       the plugin's stream (it completes later: the worker synchronises the plugin stream before the next operation
       flagged PRT_OP_NEEDS_IDLE and whenever it runs out of work), 0 when it is done, -1 after recording an error. */
    enum { PRT_OP_PLUGIN_ASYNC = 1, PRT_OP_NEEDS_IDLE = 2 };
    /* What an operation is, for the profiler: flags | prt_op_kind(PRT_OPK_...). */
    enum {
        PRT_OPK_OTHER = 0, PRT_OPK_NOP = 1, PRT_OPK_HOST_FUNC = 2, PRT_OPK_PY_CALLBACK = 3, PRT_OPK_MEMCPY_H2H = 4,
        PRT_OPK_MEMCPY_H2D = 5, PRT_OPK_MEMCPY_D2H = 6, PRT_OPK_MEMCPY_D2D = 7, PRT_OPK_MEMCPY_P2P = 8,
        PRT_OPK_MEMSET = 9, PRT_OPK_EVENT_RECORD = 10, PRT_OPK_EVENT_WAIT = 11, PRT_OPK_COLLECTIVE = 12
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
    };
    /* A traced operation handed to the plugin's stream: it ends when the worker has synchronised that stream. */
    struct prt_traced_op {
        int kind;
        uint64_t pos, nbytes;
        int64_t enq_ns, start_ns;
    };
    static const int prt_trace_off = 0;
    typedef void (*prt_trace_op_fn)(void* ctx, int kind, uint64_t pos, uint64_t nbytes, int64_t enq_ns,
                                    int64_t start_ns, int64_t end_ns);

    struct prt_stream_core;
    static thread_local prt_stream_core* prt_t_worker = nullptr;   /* the stream whose worker this thread is */

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
        std::atomic<uint64_t> completed{0};
        bool stopping = false;
        bool sleeping = false;
        int waiters = 0;
        bool started = false;
        /* set (for good) before the stream's first operation that touches another device's memory (a P2P copy):
           from then on prt_streams_idle counts the stream for every device */
        std::atomic<int> cross_device{0};
        /* callbacks into stream.pyx */
        void* ctx = nullptr;
        void (*thread_init)(void* ctx) = nullptr;          /* on the worker, once: set the device */
        void (*thread_exit)(void* ctx) = nullptr;          /* on the worker, last */
        int (*plugin_sync)(void* ctx) = nullptr;           /* wait for the plugin stream; 0 ok */
        std::thread worker;
        bool dirty = false;                                /* worker only: plugin work handed off, not yet waited */
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
            o->pos = ++submitted;
            submitted_pub.store(submitted, std::memory_order_release);
            if (tail) tail->next = o; else head = o;
            tail = o;
            if (sleeping) { sleeping = false; work_cv.notify_one(); }
            return o->pos;
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

        void finish(uint64_t pos) {
            completed.store(pos, std::memory_order_release);
        }

        void run() {
            prt_t_worker = this;
            if (thread_init) thread_init(ctx);
            std::unique_lock<std::mutex> lk(mu);
            uint64_t last = 0;
            bool spun = false;
            for (;;) {
                if (!head) {
                    if (dirty) {
                        lk.unlock();
                        sync_plugin();
                        finish(last);
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
                    if (o->flags & PRT_OP_NEEDS_IDLE) sync_plugin();
                    int64_t t0 = __builtin_expect(o->enq_ns != 0, 0) ? prt_now_ns() : 0;
                    int r = o->fn(ctx, o->arg, o->aux, o->pos);
                    if (__builtin_expect(t0 != 0, 0)) traced(o, r, t0);
                    last = o->pos;
                    if (r == 1) dirty = true;
                    else if (!dirty) finish(o->pos);
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

    static inline prt_stream_core* prt_current_worker(void) { return prt_t_worker; }
    /* The stream a thread selected with `with paddle_rt.stream(s)` (its core) and that stream's Device object. */
    static thread_local void* prt_t_stream_tag = nullptr;
    static thread_local void* prt_t_stream_dev = nullptr;
    static inline prt_stream_core* prt_stream_core_new(void) { return new (std::nothrow) prt_stream_core(); }
    static inline void prt_stream_core_delete(prt_stream_core* c) { delete c; }

    /* The live stream cores of the process with their Device objects, for the allocator's question "may memory of
       this device go back to the plugin now?" (prt_streams_idle). Used by stream.pyx only (every module that
       cimports this file has its own copy of the accessor; only stream.pyx's is ever set). Never freed: the
       registry must outlive every stream, and a child of fork() starts a new one (prt_streams_reset), because a
       thread of the parent may have held the old mutex at the fork. Lock order: an allocator's lock may be held
       while taking `mu`, never the reverse. */
    struct prt_stream_registry {
        std::mutex mu;
        std::vector<std::pair<void*, prt_stream_core*>> live;
    };
    static inline prt_stream_registry*& prt_streams_ref(void) {
        static prt_stream_registry* r = nullptr;
        return r;
    }
    /* 0, or -1 when out of memory. */
    static inline int prt_streams_reset(void) {
        prt_stream_registry* r = new (std::nothrow) prt_stream_registry();
        if (!r) return -1;
        prt_streams_ref() = r;
        return 0;
    }
    /* 0, or -1 when out of memory (the core is then not registered). */
    static inline int prt_streams_add(void* device, prt_stream_core* c) {
        prt_stream_registry* r = prt_streams_ref();
        if (!r) return -1;
        std::lock_guard<std::mutex> lk(r->mu);
        try { r->live.emplace_back(device, c); }
        catch (...) { return -1; }
        return 0;
    }
    static inline void prt_streams_remove(prt_stream_core* c) {
        prt_stream_registry* r = prt_streams_ref();
        if (!r) return;
        std::lock_guard<std::mutex> lk(r->mu);
        for (size_t i = 0; i < r->live.size(); ++i) {
            if (r->live[i].second == c) {
                r->live[i] = r->live.back();
                r->live.pop_back();
                return;
            }
        }
    }
    static inline size_t prt_streams_count(void* device) {
        prt_stream_registry* r = prt_streams_ref();
        if (!r) return 0;
        std::lock_guard<std::mutex> lk(r->mu);
        size_t n = 0;
        for (const auto& e : r->live) if (!device || e.first == device) ++n;
        return n;
    }
    /* True when every live stream of `device` (NULL: of every device) has completed everything submitted to it so
       far, plugin work included. Never blocks beyond the registry's mutex. */
    static inline bool prt_streams_idle(void* device) {
        prt_stream_registry* r = prt_streams_ref();
        if (!r) return true;
        std::lock_guard<std::mutex> lk(r->mu);
        for (const auto& e : r->live) {
            prt_stream_core* c = e.second;
            if (device && e.first != device && !c->cross_device.load(std::memory_order_acquire)) continue;
            if (!c->reached(c->submitted_pub.load(std::memory_order_acquire))) return false;
        }
        return true;
    }

    /* The completion state of an event: records are numbered (gen); a record completes when the stream reaches it.
       Refcounted: the Event object and every queued operation that names it hold a reference. */
    struct prt_event_core {
        std::atomic<int> refs{1};
        std::atomic<uint64_t> gen{0};        /* records made */
        std::atomic<uint64_t> done_gen{0};   /* highest record completed */
        std::atomic<int64_t> stamp_ns{0};    /* host time the stream reached the latest record (timing events) */
        std::mutex mu;
        std::condition_variable cv;
        int waiters = 0;
        void* plugin_event = nullptr;
        int timing = 0;
        void* owner = nullptr;               /* the event.pyx state to release plugin resources */
        void (*on_free)(prt_event_core*) = nullptr;

        void complete(uint64_t g) {
            if (timing && g == gen.load(std::memory_order_acquire)) stamp_ns.store(prt_now_ns(), std::memory_order_release);
            uint64_t d = done_gen.load(std::memory_order_acquire);
            while (d < g && !done_gen.compare_exchange_weak(d, g)) {}
            std::lock_guard<std::mutex> lk(mu);
            if (waiters) cv.notify_all();
        }
        bool is_done(uint64_t g) const { return done_gen.load(std::memory_order_acquire) >= g; }
        bool wait_for(uint64_t g, long timeout_us) {
            if (is_done(g)) return true;
            std::unique_lock<std::mutex> lk(mu);
            ++waiters;
            bool ok;
            if (timeout_us < 0) { cv.wait(lk, [&] { return is_done(g); }); ok = true; }
            else ok = cv.wait_for(lk, std::chrono::microseconds(timeout_us), [&] { return is_done(g); });
            --waiters;
            return ok;
        }
        void incref() { refs.fetch_add(1); }
        void decref() {
            if (refs.fetch_sub(1) == 1) {
                if (on_free) on_free(this);
                delete this;
            }
        }
    };
    static inline prt_event_core* prt_event_core_new(void) { return new (std::nothrow) prt_event_core(); }

    /* A worker's own Python thread state (Python.h is included first by Cython). */
    static inline void* prt_save_thread(void) { return (void*)PyEval_SaveThread(); }
    static inline void prt_restore_thread(void* t) { PyEval_RestoreThread((PyThreadState*)t); }
    static inline int prt_gil_ensure(void) { return (int)PyGILState_Ensure(); }
    static inline void prt_gil_release(int g) { PyGILState_Release((PyGILState_STATE)g); }
    """
    int64_t prt_now_ns()
    enum:
        PRT_OP_PLUGIN_ASYNC
        PRT_OP_NEEDS_IDLE
    enum:
        PRT_OPK_OTHER
        PRT_OPK_NOP
        PRT_OPK_HOST_FUNC
        PRT_OPK_PY_CALLBACK
        PRT_OPK_MEMCPY_H2H
        PRT_OPK_MEMCPY_H2D
        PRT_OPK_MEMCPY_D2H
        PRT_OPK_MEMCPY_D2D
        PRT_OPK_MEMCPY_P2P
        PRT_OPK_MEMSET
        PRT_OPK_EVENT_RECORD
        PRT_OPK_EVENT_WAIT
        PRT_OPK_COLLECTIVE
    int prt_op_kind(int k)
    ctypedef int (*prt_op_fn)(void* ctx, void* arg, uint64_t aux, uint64_t pos) noexcept nogil
    ctypedef void (*prt_trace_op_fn)(void* ctx, int kind, uint64_t pos, uint64_t nbytes, int64_t enq_ns,
                                     int64_t start_ns, int64_t end_ns) noexcept nogil

    cppclass prt_stream_core:
        void* ctx
        void (*thread_init)(void* ctx) noexcept nogil
        void (*thread_exit)(void* ctx) noexcept nogil
        int (*plugin_sync)(void* ctx) noexcept nogil
        bint stopping
        const int* trace_mask
        int trace_bit
        prt_trace_op_fn trace_op
        uint64_t enqueue(prt_op_fn fn, void* arg, uint64_t aux, int flags)
        uint64_t enqueue(prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes)
        void start() except +
        bint idle()
        bint reached(uint64_t pos)
        bint wait_for(uint64_t pos, long timeout_us)
        void stop_and_join()
        uint64_t submitted_now "submitted_pub.load"()
        uint64_t completed_now "completed.load"()
        void set_cross_device "cross_device.store"(int)
        int cross_device_now "cross_device.load"()

    prt_stream_core* prt_current_worker()
    void* prt_t_stream_tag
    void* prt_t_stream_dev
    prt_stream_core* prt_stream_core_new()
    void prt_stream_core_delete(prt_stream_core* c)
    int prt_streams_reset()
    int prt_streams_add(void* device, prt_stream_core* c)
    void prt_streams_remove(prt_stream_core* c)
    bint prt_streams_idle(void* device)
    size_t prt_streams_count(void* device)

    cppclass prt_event_core:
        void* plugin_event
        int timing
        void* owner
        void (*on_free)(prt_event_core*) noexcept nogil
        uint64_t gen_now "gen.load"()
        uint64_t gen_next "gen.fetch_add"(uint64_t)
        uint64_t done_now "done_gen.load"()
        int64_t stamp_now "stamp_ns.load"()
        void complete(uint64_t g)
        bint is_done(uint64_t g)
        bint wait_for(uint64_t g, long timeout_us)
        void incref()
        void decref()

    prt_event_core* prt_event_core_new()
    void* prt_save_thread()
    void prt_restore_thread(void* t)
    int prt_gil_ensure()
    void prt_gil_release(int g)
