/* The recorder's per-thread state, linked into the trace extension only (setup.py: ENGINE_SOURCES). */
namespace {
thread_local void* t_pending_frames = nullptr;
}  // namespace

void* prt_trace_pending_frames(void) { return t_pending_frames; }
void prt_trace_set_pending_frames(void* f) { t_pending_frames = f; }
