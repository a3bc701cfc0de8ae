# C++ support for the event recorder (paddle_rt/_core/trace.pyx): the POD record every producer (allocator, stream
# workers, the plugin trace sink) appends, and the bounded buffer behind a mutex that holds the records until Python
# drains them. Declarations and small inline helpers only.
from libc.stdint cimport uint64_t, int64_t, int32_t, uint32_t, uintptr_t
from libcpp.vector cimport vector
from cpython.ref cimport PyObject

cdef extern from "engine/trace_buffer.h" nogil:
    bint prt_tracing(int mask, int bits)
    enum:
        PRT_TRACE_MEMORY
        PRT_TRACE_STREAMS
        PRT_TRACE_STACKS
        PRT_TRACE_PLUGIN
    enum:
        PRT_EV_ALLOC
        PRT_EV_FREE
        PRT_EV_SEGMENT_ALLOC
        PRT_EV_SEGMENT_FREE
        PRT_EV_OOM
        PRT_EV_EMPTY_CACHE
        PRT_EV_OP
        PRT_EV_PLUGIN
        PRT_EV_SEGMENT_MAP
        PRT_EV_SEGMENT_UNMAP

    cdef struct prt_trace_record:
        int32_t kind
        int32_t op
        void* device
        uintptr_t stream
        uintptr_t addr
        uint64_t size
        uint64_t pos
        int64_t t_ns
        int64_t t_end_ns
        int64_t t_enq_ns
        int64_t allocated
        int64_t reserved
        void* frames

    cppclass prt_plugin_record:
        void* prof
        int is_device
        int known
        uint64_t start_ns, end_ns, stream_ops, collect_start_ns
        int64_t t_ns
        uintptr_t raw

    cppclass prt_trace_buffer:
        size_t capacity
        uint64_t dropped

    void prt_trace_push(prt_trace_buffer* b, const prt_trace_record* r)
    void prt_trace_push_plugin(prt_trace_buffer* b, void* prof, void* event, int is_device, int64_t now)
    const char* prt_plugin_name(const prt_plugin_record* p)
    size_t prt_trace_size(prt_trace_buffer* b)
    void* prt_trace_pending_frames()
    PyObject* prt_capture_frames(int max_frames)
    int prt_code_line(PyObject* code, int lasti)
    void prt_trace_set_pending_frames(void* f)
    void prt_trace_take(prt_trace_buffer* b, vector[prt_trace_record]* recs, vector[prt_plugin_record]* plugin,
                        vector[void*]* orphans)
