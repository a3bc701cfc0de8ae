/* A worker thread's own Python thread state and the GIL, for the stream and event engines. Python.h is included
 * first by Cython-generated code. Stateless. */
#ifndef PADDLE_RT_ENGINE_PYTHON_THREAD_H_
#define PADDLE_RT_ENGINE_PYTHON_THREAD_H_

static inline void* prt_save_thread(void) { return (void*)PyEval_SaveThread(); }
static inline void prt_restore_thread(void* t) { PyEval_RestoreThread((PyThreadState*)t); }
static inline int prt_gil_ensure(void) { return (int)PyGILState_Ensure(); }
static inline void prt_gil_release(int g) { PyGILState_Release((PyGILState_STATE)g); }

#endif /* PADDLE_RT_ENGINE_PYTHON_THREAD_H_ */
