/* Vectorised elementwise math for the host kernels (state in vector_math.cpp, linked into the op extension only;
 * setup.py ENGINE_SOURCES).
 *
 * What was chosen and why. One loop (vector_math_lanes.inc) written with GCC's vector types, compiled once per
 * instruction set and picked once at load from what the CPU runs (run-time dispatch: the package is built for
 * baseline x86-64 and still runs on any x86-64 CPU): 16 lanes with AVX-512F, 8 with AVX2+FMA+F16C, 4 with SSE2,
 * else 1 (and 4 generic lanes off x86). float16 and bfloat16 are converted in the loop (F16C / AVX-512 vcvtph2ps
 * and vcvtps2ph, round to nearest even; bfloat16 by shifts), with no intermediate float buffer.
 * - exp inside gelu, silu and swiglu: an inline polynomial (~1 ulp, see vexp; 2^k by vscalefps on AVX-512) rather
 *   than a call to glibc's libmvec, so the whole operator stays in registers (per element on this project's AVX-512
 *   machine: silu 0.49 -> 0.28 ns, swiglu 0.58 -> 0.28 ns, gelu tanh 0.55 -> 0.40 ns);
 * - erf (gelu): through erfc with an inline polynomial fitted for relative error (vgelu_erf), which keeps the tiny
 *   gelu values of large negative x accurate too; libmvec's erff: 0.70 ns per element, this 0.52 ns;
 * - SLEEF would give the same functions but is not a wheel a source build can assume; no other maintained library
 *   fits a C++ extension built by setuptools;
 * - PRT_VM_EXP (softmax) keeps glibc's libmvec expf (<= 4 ulp, maintained with glibc, found at load with dlsym) in
 *   the same widths, scalar expf where the C library lacks it.
 * Testing only: PADDLE_RT_VECTOR_ISA=scalar|sse|avx2|avx512, read once at load, caps the instruction set (never
 * raises it above what the CPU runs), so tests can compare every variant on one machine. */
#ifndef PADDLE_RT_ENGINE_VECTOR_MATH_H_
#define PADDLE_RT_ENGINE_VECTOR_MATH_H_

#include <stdint.h>

enum prt_vm_op {
    PRT_VM_EXP = 0,        /* o = exp(a) */
    PRT_VM_GELU_ERF,       /* o = 0.5 a (1 + erf(a / sqrt 2)) */
    PRT_VM_GELU_TANH,      /* o = 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))) = a / (1 + exp(-2 u)) */
    PRT_VM_SILU,           /* o = a / (1 + exp(-a)) */
    PRT_VM_SWIGLU,         /* o = a b / (1 + exp(-b)) */
    PRT_VM_ADD,            /* o = a + b */
    PRT_VM_SUB,            /* o = a - b */
    PRT_VM_MUL,            /* o = a * b */
};

enum prt_vm_dtype {
    PRT_VM_F32 = 0,
    PRT_VM_F16,
    PRT_VM_BF16,
};

/* o[i] = op(a[i], b[i]) for i < n, all three contiguous arrays of dtype dt (computed in float, rounded back to nearest
   even); b only for the binary ops; o may alias a or b exactly. stream != 0: write o with non-temporal stores (no read
   of each output line before it is written; for outputs too large to stay cached for the next operator). */
void prt_vm_apply_typed(int op, int dt, const void* a, const void* b, void* o, int64_t n, int stream);
/* The float32 form. */
void prt_vm_apply(int op, const float* a, const float* b, float* o, int64_t n);
/* Which loop is in use: "avx512", "avx2", "sse" (or "vector" off x86) or "scalar"; whether PRT_VM_EXP's vector
   form comes from libmvec (1) or scalar expf (0). */
const char* prt_vm_isa(void);
int prt_vm_vector_erf(void);

#endif /* PADDLE_RT_ENGINE_VECTOR_MATH_H_ */
