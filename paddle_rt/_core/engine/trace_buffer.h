/* The recorder's C++ side: trace records, the bounded buffer, Python frame capture. The per-thread pending frames
 * live in trace_state.cpp, linked into the trace extension only. */
#ifndef PADDLE_RT_ENGINE_TRACE_BUFFER_H_
#define PADDLE_RT_ENGINE_TRACE_BUFFER_H_

#include <stdint.h>
#include <string.h>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

/* The producers' test: rarely true, so the compiler keeps the recording call out of the hot path's layout. */
static inline int prt_tracing(int mask, int bits) { return __builtin_expect((mask & bits) != 0, 0); }

/* Bits of trace_mask (trace.pxd): what is being recorded. */
enum { PRT_TRACE_MEMORY = 1, PRT_TRACE_STREAMS = 2, PRT_TRACE_STACKS = 4, PRT_TRACE_PLUGIN = 8 };

/* Kinds of records. */
enum {
    PRT_EV_ALLOC = 1, PRT_EV_FREE = 2, PRT_EV_SEGMENT_ALLOC = 3, PRT_EV_SEGMENT_FREE = 4, PRT_EV_OOM = 5,
    PRT_EV_EMPTY_CACHE = 6, PRT_EV_OP = 7, PRT_EV_PLUGIN = 8,
    /* expandable segments: a run of pages of a range mapped / unmapped (addr, size = the run) */
    PRT_EV_SEGMENT_MAP = 9, PRT_EV_SEGMENT_UNMAP = 10
};

/* One event. Memory events: addr, size, stream (the allocator's stream tag), allocated/reserved = the allocator's
   counters right after the event, op = memory kind (0 device, 1 pinned host). Stream operations: op = operation
   kind (stream_support.pxd), stream = the stream's tag, pos = position, size = bytes, t_enq_ns/t_ns/t_end_ns =
   enqueued/started/ended. Plugin records: see prt_plugin_record. */
struct prt_trace_record {
    int32_t kind;
    int32_t op;
    void* device;        /* borrowed PyObject* of the Device (devices live as long as the process) */
    uintptr_t stream;
    uintptr_t addr;
    uint64_t size;
    uint64_t pos;
    int64_t t_ns;
    int64_t t_end_ns;
    int64_t t_enq_ns;
    int64_t allocated;
    int64_t reserved;
    void* frames;        /* owned PyObject* (a tuple of frames) or NULL */
};

/* What a plugin handed to profiler_add_{runtime,device}_trace_event, copied while the pointer was valid. */
struct prt_plugin_record {
    void* prof;          /* the C_Profiler handle paddle_rt gave the plugin */
    int is_device;
    int known;           /* 1: an rt_cpu record (magic RTCP) decoded below; 0: opaque */
    std::string name;
    uint64_t start_ns, end_ns, stream_ops, collect_start_ns;
    int64_t t_ns;        /* when it arrived */
    uintptr_t raw;       /* the pointer (for opaque records) */
};

struct prt_trace_buffer {
    std::mutex mu;
    std::deque<prt_trace_record> recs;
    std::vector<prt_plugin_record> plugin;
    std::vector<void*> orphans;   /* frames of dropped records, released (with the GIL) at the next drain */
    size_t capacity = 4000000;
    uint64_t dropped = 0;
};

static inline void prt_trace_push(prt_trace_buffer* b, const prt_trace_record* r) {
    std::lock_guard<std::mutex> g(b->mu);
    try {
        if (b->recs.size() >= b->capacity) {
            if (b->recs.front().frames) b->orphans.push_back(b->recs.front().frames);
            b->recs.pop_front();
            b->dropped++;
        }
        b->recs.push_back(*r);
    } catch (...) {
        b->dropped++;
        if (r->frames) { try { b->orphans.push_back(r->frames); } catch (...) {} }
    }
}

/* rt_cpu's collect-time record (plugins/rt_cpu/rt_cpu.c). */
#define PRT_RT_CPU_TRACE_MAGIC 0x52544350u
struct prt_rt_cpu_trace_record {
    uint32_t magic;
    uint32_t version;
    const char* name;
    uint64_t start_ns;
    uint64_t end_ns;
    uint64_t stream_ops;
    uint64_t collect_start_ns;
};

static inline void prt_trace_push_plugin(prt_trace_buffer* b, void* prof, void* event, int is_device,
                                         int64_t now) {
    prt_plugin_record p;
    p.prof = prof; p.is_device = is_device; p.known = 0; p.start_ns = p.end_ns = p.stream_ops = 0;
    p.collect_start_ns = 0; p.t_ns = now; p.raw = (uintptr_t)event;
    try {
        if (event) {
            const prt_rt_cpu_trace_record* r = (const prt_rt_cpu_trace_record*)event;
            if (r->magic == PRT_RT_CPU_TRACE_MAGIC && r->version >= 1) {
                p.known = 1;
                if (r->name) p.name.assign(r->name, strnlen(r->name, 256));
                p.start_ns = r->start_ns; p.end_ns = r->end_ns; p.stream_ops = r->stream_ops;
                p.collect_start_ns = r->collect_start_ns;
            }
        }
        std::lock_guard<std::mutex> g(b->mu);
        b->plugin.push_back(p);
    } catch (...) {
        std::lock_guard<std::mutex> g(b->mu);
        b->dropped++;
    }
}

/* Move everything out under the lock (the caller converts it with the GIL). */
static inline void prt_trace_take(prt_trace_buffer* b, std::vector<prt_trace_record>* recs,
                                  std::vector<prt_plugin_record>* plugin, std::vector<void*>* orphans) {
    std::lock_guard<std::mutex> g(b->mu);
    recs->assign(b->recs.begin(), b->recs.end());
    b->recs.clear();
    plugin->swap(b->plugin);
    orphans->swap(b->orphans);
}
static inline size_t prt_trace_size(prt_trace_buffer* b) {
    std::lock_guard<std::mutex> g(b->mu);
    return b->recs.size() + b->plugin.size();
}
static inline const char* prt_plugin_name(const prt_plugin_record* p) { return p->name.c_str(); }

/* The calling thread's Python frames, innermost first, as a flat tuple (code, lasti, code, lasti, ...) of at most
   max_frames frames; lines are looked up later (prt_code_line). NULL with an exception set on failure. With the
   GIL. */
static inline PyObject* prt_capture_frames(int max_frames) {
    PyObject* codes[64];
    int lastis[64];
    int n = 0;
    if (max_frames > 64) max_frames = 64;
    PyFrameObject* f = PyEval_GetFrame();
    Py_XINCREF(f);
    while (f && n < max_frames) {
        codes[n] = (PyObject*)PyFrame_GetCode(f);
        lastis[n] = PyFrame_GetLasti(f);
        n++;
        PyFrameObject* back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    PyObject* t = PyTuple_New(2 * n);
    if (!t) {
        for (int i = 0; i < n; i++) Py_DECREF(codes[i]);
        return NULL;
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        PyTuple_SET_ITEM(t, 2 * i, codes[i]);
        PyObject* l = failed ? NULL : PyLong_FromLong(lastis[i]);
        if (!l) { failed = 1; Py_INCREF(Py_None); l = Py_None; }
        PyTuple_SET_ITEM(t, 2 * i + 1, l);
    }
    if (failed) { Py_DECREF(t); return NULL; }
    return t;
}
static inline int prt_code_line(PyObject* code, int lasti) {
    return lasti < 0 ? ((PyCodeObject*)code)->co_firstlineno : PyCode_Addr2Line((PyCodeObject*)code, lasti);
}

/* Python frames noted at the entry of a Python-API allocation, taken by the allocation's event (trace.pyx only:
   defined in trace_state.cpp). */
void* prt_trace_pending_frames(void);
void prt_trace_set_pending_frames(void* f);

#endif /* PADDLE_RT_ENGINE_TRACE_BUFFER_H_ */
