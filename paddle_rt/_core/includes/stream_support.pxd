# Declarations of the stream and event engines (C++ headers in paddle_rt/_core/engine/). Only the stream extension
# links the engine's process state (engine/stream_state.cpp): the names marked "stream.pyx only" below resolve in that
# module alone; every other module asks stream.pyx through the functions cimported from paddle_rt._core.stream.
from libc.stdint cimport uint64_t, int64_t, uintptr_t

cdef extern from "engine/clock.h" nogil:
    int64_t prt_now_ns()

cdef extern from "engine/python_thread.h" nogil:
    void* prt_save_thread()
    void prt_restore_thread(void* t)
    int prt_gil_ensure()
    void prt_gil_release(int g)

cdef extern from "engine/event_core.h" nogil:
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

cdef extern from "engine/stream_core.h" nogil:
    enum:
        PRT_OP_PLUGIN_ASYNC
        PRT_OP_NEEDS_IDLE
        PRT_OP_DROPPABLE
    const uint64_t PRT_POS_DROPPED
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
        PRT_OPK_OPERATOR
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
        uint64_t run_now_if_idle(prt_op_fn fn, void* arg, uint64_t aux, int flags, uint64_t nbytes)
        void start() except +
        bint idle()
        bint reached(uint64_t pos)
        bint wait_for(uint64_t pos, long timeout_us)
        void stop_and_join()
        void drop_queued()
        uint64_t submitted_now "submitted_pub.load"()
        uint64_t completed_now "completed.load"()
        uint64_t completed_seq_now "completed_seq.load"()
        prt_order_atomic* order
        uintptr_t tag
        void set_cross_device "cross_device.store"(int)
        int cross_device_now "cross_device.load"()

    # stream.pyx only (engine/stream_state.cpp): other modules use stream_current_worker() and current_stream_tag()
    prt_stream_core* prt_t_worker
    void* prt_t_stream_tag
    void* prt_t_stream_dev
    prt_stream_core* prt_stream_core_new()
    void prt_stream_core_delete(prt_stream_core* c)
    # stream.pyx only (engine/stream_state.cpp): other modules use the functions of paddle_rt._core.stream
    int prt_streams_reset()
    int prt_streams_add(void* device, prt_stream_core* c)
    void prt_streams_remove(prt_stream_core* c)
    bint prt_streams_idle(void* device)
    size_t prt_streams_count(void* device)
    cppclass prt_order_atomic "std::atomic<uint64_t>":
        uint64_t load()
    prt_order_atomic* prt_order_counter()
    uintptr_t prt_next_stream_tag()
    bint prt_streams_done(void* device, uintptr_t tag, uint64_t seq)
    bint prt_streams_wait_done(void* device, uintptr_t tag, uint64_t seq, int64_t timeout_ns)
    void prt_streams_set_default(prt_stream_core* c)
