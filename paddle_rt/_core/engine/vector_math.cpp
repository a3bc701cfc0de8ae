/* Vectorised elementwise math (vector_math.h): the loop of vector_math_lanes.inc compiled for AVX-512F (16 lanes),
 * AVX2+FMA+F16C (8), SSE2 (4) and 1 lane, one of them chosen once at load; libmvec's expf for PRT_VM_EXP found at
 * load. This file is the one place that knows which instruction sets exist. Linked into the op extension only
 * (setup.py ENGINE_SOURCES). */
#include "engine/vector_math.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "engine/host_float.h"

/* The vector types are passed to libmvec in registers of their own width inside functions compiled for that width;
   GCC's note that such arguments change the ABI elsewhere does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define PRT_VM_NS lanes1
#define PRT_VM_W 1
#define PRT_VM_HALF 0
#define PRT_VM_STREAM 0
#include "engine/vector_math_lanes.inc"
#undef PRT_VM_NS
#undef PRT_VM_W
#undef PRT_VM_HALF
#undef PRT_VM_STREAM

#define PRT_VM_NS lanes4          /* SSE2 on x86-64 (its baseline), the generic 128-bit vectors elsewhere */
#define PRT_VM_W 4
#define PRT_VM_HALF 0
#if defined(__x86_64__)
#define PRT_VM_STREAM 1
#else
#define PRT_VM_STREAM 0
#endif
#include "engine/vector_math_lanes.inc"
#undef PRT_VM_NS
#undef PRT_VM_W
#undef PRT_VM_HALF
#undef PRT_VM_STREAM

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("fp-contract=fast")     /* a * b + c as one fused multiply-add (one rounding) */
#define PRT_VM_NS lanes8
#define PRT_VM_W 8
#define PRT_VM_HALF 256
#define PRT_VM_STREAM 1
#include "engine/vector_math_lanes.inc"
#undef PRT_VM_NS
#undef PRT_VM_W
#undef PRT_VM_HALF
#undef PRT_VM_STREAM
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#pragma GCC optimize("fp-contract=fast")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"   /* GCC 12's avx512fintrin.h: _mm512_undefined_ps */
#pragma GCC diagnostic ignored "-Wuninitialized"
#define PRT_VM_NS lanes16
#define PRT_VM_W 16
#define PRT_VM_HALF 512
#define PRT_VM_STREAM 1
#include "engine/vector_math_lanes.inc"
#undef PRT_VM_NS
#undef PRT_VM_W
#undef PRT_VM_HALF
#undef PRT_VM_STREAM
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace {

/* levels: 0 one lane, 1 four (SSE2), 2 eight (AVX2), 3 sixteen (AVX-512F) */
const char* const kNames[4] = {"scalar", "sse", "avx2", "avx512"};

struct Dispatch {
    int level = 0;
    void* exp = nullptr;        /* libmvec's expf for the level's width, or nullptr */
};

/* The widest level the CPU runs, capped by PADDLE_RT_VECTOR_ISA (testing only; an unknown value is ignored). */
int choose_level() {
#if defined(__x86_64__)
    int level = 1;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) level = 2;
    if (level == 2 && __builtin_cpu_supports("avx512f")) level = 3;
#else
    int level = 1;
#endif
    const char* cap = getenv("PADDLE_RT_VECTOR_ISA");
    if (cap && *cap)
        for (int l = 0; l < 4; l++)
            if (strcmp(cap, kNames[l]) == 0 && l < level) level = l;
    return level;
}

Dispatch load_dispatch() {
    Dispatch d;
    d.level = choose_level();
#if defined(__x86_64__)
    static const char* const kExp[4] = {nullptr, "_ZGVbN4v_expf", "_ZGVdN8v_expf", "_ZGVeN16v_expf"};
    if (d.level > 0) {
        void* h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        if (!h) h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (h) d.exp = dlsym(h, kExp[d.level]);   /* the handle stays open: its functions are in use */
    }
#endif
    return d;
}

const Dispatch g_vm = load_dispatch();

}  // namespace

void prt_vm_apply_typed(int op, int dt, const void* a, const void* b, void* o, int64_t n, int stream) {
    switch (g_vm.level) {
#if defined(__x86_64__)
    case 3: lanes16::apply(op, dt, a, b, o, n, g_vm.exp, stream != 0); return;
    case 2: lanes8::apply(op, dt, a, b, o, n, g_vm.exp, stream != 0); return;
#endif
    case 1: lanes4::apply(op, dt, a, b, o, n, g_vm.exp, stream != 0); return;
    default: lanes1::apply(op, dt, a, b, o, n, nullptr, false); return;
    }
}

void prt_vm_apply(int op, const float* a, const float* b, float* o, int64_t n) {
    prt_vm_apply_typed(op, PRT_VM_F32, a, b, o, n, 0);
}

const char* prt_vm_isa(void) {
#if defined(__x86_64__)
    return kNames[g_vm.level];
#else
    return g_vm.level ? "vector" : "scalar";
#endif
}

int prt_vm_vector_erf(void) { return g_vm.level > 0; }
