/* The completion state of an event (a refcounted C++ object shared by event.pyx and the stream operations that
 * name it). Stateless at file scope: safe to include in every extension module. */
#ifndef PADDLE_RT_ENGINE_EVENT_CORE_H_
#define PADDLE_RT_ENGINE_EVENT_CORE_H_

#include <stdint.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>

#include "engine/clock.h"

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

#endif /* PADDLE_RT_ENGINE_EVENT_CORE_H_ */
