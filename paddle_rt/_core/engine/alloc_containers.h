/* The allocator's C++ containers: the best-fit free index, node recycling, the address map. Stateless at file
 * scope (every container is owned by an allocator), so safe to include in every extension module. */
#ifndef PADDLE_RT_ENGINE_ALLOC_CONTAINERS_H_
#define PADDLE_RT_ENGINE_ALLOC_CONTAINERS_H_

#include <stdint.h>
#include <stddef.h>
#include <mutex>
#include <atomic>
#include <sched.h>
#include <time.h>
#include <set>
#include <map>
#include <unordered_map>
#include <cstdlib>
#include <vector>

/* Append x to v: 0, or -1 when host memory runs out. The allocator's nogil code runs under its lock with no GIL:
   std::bad_alloc is caught here and reported as an error (it must never reach Python as "Exception ignored"). */
template <class T> static inline int prt_push(std::vector<T>& v, const T& x) noexcept {
    try {
        v.push_back(x);
        return 0;
    } catch (...) {
        return -1;
    }
}

/* A free block in the best-fit index: ordered by (stream, size, chunk, address); `block` is the payload. Among blocks
   of one size the oldest chunk comes first (its serial number, not its address): the placement of a sequence of
   requests does not depend on where the plugin's memory happens to lie, so a replay gives the same figures in any
   process. */
struct prt_free_key {
    uintptr_t stream;
    mutable size_t size;       /* mutable: prt_free_rekey changes them in place when the order is kept */
    mutable uint64_t chunk;    /* the serial number of the block's chunk */
    mutable uintptr_t addr;
    mutable void* block;
};
static inline bool operator<(const prt_free_key& a, const prt_free_key& b) {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    if (a.chunk != b.chunk) return a.chunk < b.chunk;
    return a.addr < b.addr;
}
/* Node recycling for the containers below: every container op happens under the allocator's mutex, so a
   plain free list per node size (owned by the allocator) replaces malloc/free on the hot path. */
struct prt_node_pool {
    enum { N = 6 };
    size_t sizes[N];
    void* heads[N];
    prt_node_pool() { for (int i = 0; i < N; ++i) { sizes[i] = 0; heads[i] = nullptr; } }
    ~prt_node_pool() {
        for (int i = 0; i < N; ++i) {
            void* h = heads[i];
            while (h) { void* n = *(void**)h; ::operator delete(h); h = n; }
        }
    }
    void* get(size_t size) {
        for (int i = 0; i < N; ++i) {
            if (sizes[i] == size) {
                void* h = heads[i];
                if (h) { heads[i] = *(void**)h; return h; }
                break;
            }
        }
        return ::operator new(size < sizeof(void*) ? sizeof(void*) : size);
    }
    void put(void* p, size_t size) {
        for (int i = 0; i < N; ++i) {
            if (sizes[i] == size || sizes[i] == 0) {
                sizes[i] = size;
                *(void**)p = heads[i];
                heads[i] = p;
                return;
            }
        }
        ::operator delete(p);
    }
};
template <class T>
struct prt_pool_alloc {
    typedef T value_type;
    prt_node_pool* pool;
    explicit prt_pool_alloc(prt_node_pool* p) noexcept : pool(p) {}
    template <class U> prt_pool_alloc(const prt_pool_alloc<U>& o) noexcept : pool(o.pool) {}
    T* allocate(size_t n) {
        if (n == 1) return static_cast<T*>(pool->get(sizeof(T)));
        return static_cast<T*>(::operator new(n * sizeof(T)));
    }
    void deallocate(T* p, size_t n) noexcept {
        if (n == 1) pool->put(p, sizeof(T)); else ::operator delete(p);
    }
    template <class U> bool operator==(const prt_pool_alloc<U>& o) const noexcept { return pool == o.pool; }
    template <class U> bool operator!=(const prt_pool_alloc<U>& o) const noexcept { return pool != o.pool; }
};
typedef std::set<prt_free_key, std::less<prt_free_key>, prt_pool_alloc<prt_free_key> > prt_free_set;

/* Address -> block: open addressing with linear probing and backward-shift deletion (no tombstones), a
   power-of-two table kept at most 3/4 full, Fibonacci hashing of the address. Key 0 marks an empty slot
   (a live block never starts at address 0). */
struct prt_ptr_entry { uintptr_t key; void* val; };
struct prt_ptr_table {
    prt_ptr_entry* e;
    size_t mask;
    unsigned shift;
    size_t n;
    prt_ptr_table() : e(nullptr), mask(0), shift(0), n(0) { rebuild(1024); }
    ~prt_ptr_table() { std::free(e); }
    inline size_t slot(uintptr_t k) const { return (size_t)(((uint64_t)k * 0x9E3779B97F4A7C15ULL) >> shift); }
    void rebuild(size_t cap) {
        prt_ptr_entry* old = e; size_t ocap = e ? mask + 1 : 0;
        prt_ptr_entry* ne = (prt_ptr_entry*)std::calloc(cap, sizeof(prt_ptr_entry));
        if (ne == nullptr) {
            if (old == nullptr || n + 1 > ocap - 1) std::abort();   /* out of host memory with a full table */
            return;                                                 /* keep the fuller table */
        }
        e = ne; mask = cap - 1;
        unsigned bits = 0; while (((size_t)1 << bits) < cap) ++bits;
        shift = 64 - bits;
        for (size_t i = 0; i < ocap; ++i) if (old[i].key) place(old[i].key, old[i].val);
        std::free(old);
    }
    inline void place(uintptr_t k, void* v) {
        size_t i = slot(k);
        while (e[i].key != 0) i = (i + 1) & mask;
        e[i].key = k; e[i].val = v;
    }
    inline void insert(uintptr_t k, void* v) {
        if ((n + 1) * 4 > (mask + 1) * 3) rebuild((mask + 1) * 2);
        place(k, v);
        ++n;
    }
    inline void* find(uintptr_t k) const {
        size_t i = slot(k);
        while (true) {
            uintptr_t x = e[i].key;
            if (x == k) return e[i].val;
            if (x == 0) return nullptr;
            i = (i + 1) & mask;
        }
    }
    /* Remove k; returns its value or NULL when absent. */
    inline void* erase(uintptr_t k) {
        size_t i = slot(k);
        while (true) {
            uintptr_t x = e[i].key;
            if (x == 0) return nullptr;
            if (x == k) break;
            i = (i + 1) & mask;
        }
        void* v = e[i].val;
        size_t j = i;
        while (true) {
            j = (j + 1) & mask;
            if (e[j].key == 0) break;
            size_t h = slot(e[j].key);
            /* move j into the hole i unless its home h lies cyclically in (i, j] */
            bool stay = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
            if (!stay) { e[i] = e[j]; i = j; }
        }
        e[i].key = 0; e[i].val = nullptr;
        --n;
        return v;
    }
    inline size_t size() const { return n; }
};
typedef std::map<uintptr_t, void*> prt_chunk_map;

/* Give the entry at `it` the key k (same stream): in place when k still sorts between the entry's neighbours
   (the common case of a big free block shrinking on a split or growing on a merge), else by moving the node. */
static inline void prt_free_rekey(prt_free_set& s, prt_free_set::iterator it, const prt_free_key& k) {
    prt_free_set::iterator nx = std::next(it);
    if ((it == s.begin() || *std::prev(it) < k) && (nx == s.end() || k < *nx)) {
        it->size = k.size; it->chunk = k.chunk; it->addr = k.addr; it->block = k.block;
        return;
    }
    auto nh = s.extract(it);
    nh.value().size = k.size; nh.value().chunk = k.chunk; nh.value().addr = k.addr; nh.value().block = k.block;
    s.insert(std::move(nh));
}

/* Move the entry at `it` of `from` into `to` with the key k (a free block whose size moved it to the other index):
   the node itself moves, nothing is allocated (both sets draw on one node pool, prt_alloc_containers). */
static inline void prt_free_move(prt_free_set& from, prt_free_set::iterator it, prt_free_set& to,
                                 const prt_free_key& k) {
    auto nh = from.extract(it);
    nh.value().size = k.size; nh.value().chunk = k.chunk; nh.value().addr = k.addr; nh.value().block = k.block;
    to.insert(std::move(nh));
}

/* The allocator's lock: one atomic exchange to take it, a release store to give it back (cheaper than a
   pthread mutex on the hot path). A waiter spins briefly, then yields, then sleeps in short steps, so a holder
   that is inside a slow plugin call does not burn a core. */
struct prt_lock {
    std::atomic<int> state;
    prt_lock() : state(0) {}
    inline bool try_lock() {
        return state.load(std::memory_order_relaxed) == 0 && state.exchange(1, std::memory_order_acquire) == 0;
    }
    void lock() {
        unsigned spins = 0;
        while (!try_lock()) {
            ++spins;
            if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            } else if (spins < 128) {
                sched_yield();
            } else {
                struct timespec ts = {0, 20000};   /* 20 us */
                nanosleep(&ts, nullptr);
            }
        }
    }
    inline void unlock() { state.store(0, std::memory_order_release); }
};

/* The C++ half of one allocator: its lock and its containers (the plain counters live in a Cython struct). */
struct prt_alloc_containers {
    prt_lock mu;
    prt_node_pool pool;              /* declared first: destroyed after the containers */
    prt_free_set free_blocks[2];     /* [0] small pool, [1] large pool */
    prt_ptr_table live;              /* address -> allocated block */
    prt_chunk_map chunks;            /* base address -> chunk */
    prt_alloc_containers()
        : free_blocks{prt_free_set(std::less<prt_free_key>(), prt_pool_alloc<prt_free_key>(&pool)),
                      prt_free_set(std::less<prt_free_key>(), prt_pool_alloc<prt_free_key>(&pool))},
          live() {}
};

#endif /* PADDLE_RT_ENGINE_ALLOC_CONTAINERS_H_ */
