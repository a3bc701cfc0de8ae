/* The stream engine's process state, linked into the stream extension only (setup.py: ENGINE_SOURCES), so each item
 * exists once per process: the calling thread's worker and selected stream, and the registry of live streams. Other
 * extensions reach it through functions cimported from paddle_rt._core.stream. */
#include "engine/stream_core.h"

thread_local prt_stream_core* prt_t_worker = nullptr;
thread_local void* prt_t_stream_tag = nullptr;
thread_local void* prt_t_stream_dev = nullptr;

namespace {

struct prt_stream_registry {
    std::mutex mu;
    std::vector<std::pair<void*, prt_stream_core*>> live;
    std::vector<prt_stream_core*> defaults;     /* the devices' default streams among `live` (allocator tag 0) */
};

prt_stream_registry* g_registry = nullptr;

/* Shared by every stream core of the process (a child of fork() keeps counting from the parent's value). */
/* On a cache line of its own: every enqueue of every stream increments it (a locked add), and a neighbour read by
   another core (the module's other globals) would move the line back and forth with each operation. */
struct alignas(64) prt_order_line {
    std::atomic<uint64_t> value{0};
    char pad[64 - sizeof(std::atomic<uint64_t>)];
};
prt_order_line g_order;

}  // namespace

int prt_streams_reset(void) {
    prt_stream_registry* r = new (std::nothrow) prt_stream_registry();
    if (!r) return -1;
    g_registry = r;  // the old one is abandoned, never freed (a parent's thread may have held its mutex at fork)
    return 0;
}

int prt_streams_add(void* device, prt_stream_core* c) {
    prt_stream_registry* r = g_registry;
    if (!r) return -1;
    std::lock_guard<std::mutex> lk(r->mu);
    try {
        r->live.emplace_back(device, c);
    } catch (...) {
        return -1;
    }
    return 0;
}

void prt_streams_remove(prt_stream_core* c) {
    prt_stream_registry* r = g_registry;
    if (!r) return;
    std::lock_guard<std::mutex> lk(r->mu);
    for (size_t i = 0; i < r->live.size(); ++i) {
        if (r->live[i].second == c) {
            r->live[i] = r->live.back();
            r->live.pop_back();
            for (size_t k = 0; k < r->defaults.size(); ++k) {
                if (r->defaults[k] == c) {
                    r->defaults[k] = r->defaults.back();
                    r->defaults.pop_back();
                    break;
                }
            }
            return;
        }
    }
}

size_t prt_streams_count(void* device) {
    prt_stream_registry* r = g_registry;
    if (!r) return 0;
    std::lock_guard<std::mutex> lk(r->mu);
    size_t n = 0;
    for (const auto& e : r->live)
        if (!device || e.first == device) ++n;
    return n;
}

bool prt_streams_idle(void* device) {
    prt_stream_registry* r = g_registry;
    if (!r) return true;
    std::lock_guard<std::mutex> lk(r->mu);
    for (const auto& e : r->live) {
        prt_stream_core* c = e.second;
        if (device && e.first != device && !c->cross_device.load(std::memory_order_acquire)) continue;
        if (!c->reached(c->submitted_pub.load(std::memory_order_acquire))) return false;
    }
    return true;
}

std::atomic<uint64_t>* prt_order_counter(void) { return &g_order.value; }

uintptr_t prt_next_stream_tag(void) {
    static std::atomic<uintptr_t> next{0};
    return next.fetch_add(1, std::memory_order_relaxed) + 1;
}

void prt_streams_set_default(prt_stream_core* c) {
    prt_stream_registry* r = g_registry;
    if (!r) return;
    std::lock_guard<std::mutex> lk(r->mu);
    try {
        r->defaults.push_back(c);
    } catch (...) {
        /* not marked: frees of the default stream's blocks then count as done only once it is idle */
    }
}

bool prt_streams_done(void* device, uintptr_t tag, uint64_t seq) {
    prt_stream_registry* r = g_registry;
    if (!r) return true;
    std::lock_guard<std::mutex> lk(r->mu);
    if (tag) {
        for (const auto& e : r->live)
            if (e.second->tag == tag) return e.second->done_by(seq);
        return true;
    }
    for (const auto& e : r->live) {
        if (e.first != device) continue;
        for (prt_stream_core* d : r->defaults)
            if (d == e.second && !d->done_by(seq)) return false;
    }
    return true;
}

bool prt_streams_wait_done(void* device, uintptr_t tag, uint64_t seq, int64_t timeout_ns) {
    /* Polled: the stream may close (and its core go) while we wait, and prt_streams_done finds it again each time
       under the registry's mutex. A few yields first (a short lag), then sleeps of 20 us. */
    int64_t deadline = prt_now_ns() + timeout_ns;
    for (int i = 0;; ++i) {
        if (prt_streams_done(device, tag, seq)) return true;
        if (prt_now_ns() >= deadline) return false;
        if (i < 64) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}
