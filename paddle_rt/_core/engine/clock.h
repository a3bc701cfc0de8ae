/* Clock and spin helpers shared by the engines. Stateless: safe to include in every extension module. */
#ifndef PADDLE_RT_ENGINE_CLOCK_H_
#define PADDLE_RT_ENGINE_CLOCK_H_

#include <stdint.h>
#include <time.h>

static inline int64_t prt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#ifndef PRT_SPIN_NS
#define PRT_SPIN_NS 20000
#endif
static inline void prt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif /* PADDLE_RT_ENGINE_CLOCK_H_ */
