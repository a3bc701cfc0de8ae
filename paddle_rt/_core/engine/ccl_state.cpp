/* The collectives layer's process state, linked into the ccl extension only (setup.py: ENGINE_SOURCES). */
#include "engine/ccl_support.h"

#include <mutex>
#include <new>

namespace {
struct prt_ccl_node {
    void* obj;
    prt_ccl_node* next;
};
std::mutex g_mu;
prt_ccl_node* g_head = nullptr;
}  // namespace

int prt_ccl_defer(void* obj) {
    prt_ccl_node* n = new (std::nothrow) prt_ccl_node;
    if (!n) return -1;
    n->obj = obj;
    std::lock_guard<std::mutex> lk(g_mu);
    n->next = g_head;
    // stored atomically: prt_ccl_pending reads g_head without the lock
    __atomic_store_n(&g_head, n, __ATOMIC_RELEASE);
    return 0;
}

void* prt_ccl_pop(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    prt_ccl_node* n = g_head;
    if (!n) return nullptr;
    __atomic_store_n(&g_head, n->next, __ATOMIC_RELEASE);
    void* o = n->obj;
    delete n;
    return o;
}

int prt_ccl_pending(void) { return __atomic_load_n(&g_head, __ATOMIC_ACQUIRE) != nullptr; }
