/* Atomic counters on plain integers (GCC builtins). Stateless. */
#ifndef PADDLE_RT_ENGINE_ATOMICS_H_
#define PADDLE_RT_ENGINE_ATOMICS_H_

#include <stdint.h>
static inline int64_t prt_atomic_add_i64(int64_t* p, int64_t d) {
    return __atomic_add_fetch(p, d, __ATOMIC_ACQ_REL);
}
static inline int64_t prt_atomic_load_i64(int64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline int prt_atomic_add_int(int* p, int d) { return __atomic_add_fetch(p, d, __ATOMIC_ACQ_REL); }

#endif /* PADDLE_RT_ENGINE_ATOMICS_H_ */
