/* Vectorised float32 elementwise math for the host kernels (state in vector_math.cpp, linked into the op extension
 * only; setup.py ENGINE_SOURCES).
 *
 * What was chosen and why: glibc's vector math library (libmvec: expf, erff, tanhf in 4-, 8- and 16-lane forms, the
 * same accuracy as the scalar functions, <= 4 ulp) rather than a hand-written polynomial or a new dependency. It is
 * maintained with glibc, already in every build that links libm (the build used its SSE expf before), and needs no
 * package (SLEEF would be a system library that a pip install from source cannot assume). The widest forms the CPU
 * runs are taken (16 lanes with AVX-512, 8 with AVX2, else 4 with SSE; checked once at load); the functions are
 * looked up at load time (erff needs glibc >= 2.35) and a scalar loop is used where the C library lacks them. The
 * arithmetic around the calls is one loop written with GCC's vector types, compiled once per width. */
#ifndef PADDLE_RT_ENGINE_VECTOR_MATH_H_
#define PADDLE_RT_ENGINE_VECTOR_MATH_H_

#include <stdint.h>

enum prt_vm_op {
    PRT_VM_EXP = 0,        /* o = exp(a) */
    PRT_VM_GELU_ERF,       /* o = 0.5 a (1 + erf(a / sqrt 2)) */
    PRT_VM_GELU_TANH,      /* o = 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))) = a / (1 + exp(-2 u)) */
    PRT_VM_SILU,           /* o = a / (1 + exp(-a)) */
    PRT_VM_SWIGLU,         /* o = a b / (1 + exp(-b)) */
};

/* o[i] = op(a[i], b[i]) for i < n; b only for SWIGLU; o may alias a or b. */
void prt_vm_apply(int op, const float* a, const float* b, float* o, int64_t n);
/* Which forms are in use: "avx512", "avx2", "sse" or "scalar"; erf from libmvec (1) or scalar erff (0). */
const char* prt_vm_isa(void);
int prt_vm_vector_erf(void);

#endif /* PADDLE_RT_ENGINE_VECTOR_MATH_H_ */
