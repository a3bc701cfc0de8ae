/* Helpers of the collectives layer: per-rank progress counters written by stream workers without the GIL, and the
 * list of finished batches whose Python references are dropped later by a thread holding the GIL (the list itself
 * is in ccl_state.cpp, linked into the ccl extension only). */
#ifndef PADDLE_RT_ENGINE_CCL_SUPPORT_H_
#define PADDLE_RT_ENGINE_CCL_SUPPORT_H_

#include <stdint.h>
static inline void prt_ccl_store_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline uint64_t prt_ccl_load_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
/* Finished batches whose Python references (a list of Work) are dropped later by a thread that holds the GIL,
   so that a stream worker never waits for the GIL when a collective succeeded. */
/* 0, or -1 when out of memory: keep `obj` (a Python object reference) for prt_ccl_pop. */
int prt_ccl_defer(void* obj);
/* Pop one deferred object (NULL when none). */
void* prt_ccl_pop(void);
int prt_ccl_pending(void);
/* paddle_rt_ext_ccl_comm_error (include/paddle_rt/extension.h): 1 in error, 0 fine, -1 unknown comm */
typedef int (*prt_ccl_comm_error_fn)(void* comm);

#endif /* PADDLE_RT_ENGINE_CCL_SUPPORT_H_ */
