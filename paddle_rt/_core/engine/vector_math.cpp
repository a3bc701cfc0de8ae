/* Vectorised float32 elementwise math (vector_math.h): glibc's libmvec in 16 lanes (AVX-512), 8 (AVX2) or 4 (SSE),
 * found once at load; the arithmetic around the calls is one loop body written with GCC's vector types, compiled
 * once per width. Linked into the op extension only (setup.py ENGINE_SOURCES). */
#include "engine/vector_math.h"

#include <dlfcn.h>
#include <math.h>
#include <string.h>

/* The vector types below are passed to libmvec in registers of their own width inside functions compiled for that
   width; GCC's note that such arguments change the ABI elsewhere does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

struct Mvec {
    void* exp[3] = {nullptr, nullptr, nullptr};     /* 4, 8, 16 lanes: vf (*)(vf) */
    void* erf[3] = {nullptr, nullptr, nullptr};
    int width = 0;                                  /* 0: scalar loop, 1: SSE, 2: AVX2, 3: AVX-512 */
};

Mvec load_mvec() {
    Mvec m;
#if defined(__x86_64__)
    void* h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (!h) h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return m;   /* the handle stays open for the life of the process (its functions are in use) */
    static const char* const kExp[3] = {"_ZGVbN4v_expf", "_ZGVdN8v_expf", "_ZGVeN16v_expf"};
    static const char* const kErf[3] = {"_ZGVbN4v_erff", "_ZGVdN8v_erff", "_ZGVeN16v_erff"};
    const bool isa[3] = {true, __builtin_cpu_supports("avx2") != 0, __builtin_cpu_supports("avx512f") != 0};
    for (int w = 0; w < 3; w++) {
        if (!isa[w]) continue;
        m.exp[w] = dlsym(h, kExp[w]);
        m.erf[w] = dlsym(h, kErf[w]);
        if (m.exp[w]) m.width = w + 1;
    }
#endif
    return m;
}

const Mvec g_mvec = load_mvec();

inline float scalar_op(int op, float a, float b) {
    switch (op) {
    case PRT_VM_EXP: return expf(a);
    case PRT_VM_GELU_ERF: return 0.5f * a * (1.0f + erff(a * 0.70710678118654752f));
    case PRT_VM_GELU_TANH: {
        float u = 0.7978845608028654f * (a + 0.044715f * a * a * a);
        return a / (1.0f + expf(-2.0f * u));
    }
    case PRT_VM_SILU: return a / (1.0f + expf(-a));
    default: return a * b / (1.0f + expf(-b));
    }
}

void apply_scalar(int op, const float* a, const float* b, float* o, int64_t n) {
    for (int64_t i = 0; i < n; i++) o[i] = scalar_op(op, a[i], b ? b[i] : 0.0f);
}

#if defined(__x86_64__)
typedef float vf4 __attribute__((vector_size(16)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));

/* The loop, for a vector type V of W lanes; inlined into one function per instruction set below. */
template <typename V, int W>
__attribute__((always_inline)) inline void apply_lanes(int op, const float* a, const float* b, float* o, int64_t n,
                                                       void* expv, void* erfv) {
    typedef V (*vfn)(V);
    const vfn vexp = reinterpret_cast<vfn>(expv);
    const vfn verf = reinterpret_cast<vfn>(erfv);
    if (op == PRT_VM_GELU_ERF && !verf) {
        apply_scalar(op, a, b, o, n);
        return;
    }
    const V zero = {};
    for (int64_t i = 0; i < n; i += W) {
        const int64_t m = n - i < W ? n - i : W;
        V x = zero, y = zero, r;
        if (m == W) {                              /* one unaligned load each */
            memcpy(&x, a + i, sizeof(V));
            if (op == PRT_VM_SWIGLU) memcpy(&y, b + i, sizeof(V));
        } else {                                   /* the tail, zero-padded */
            memcpy(&x, a + i, (size_t)m * 4);
            if (op == PRT_VM_SWIGLU) memcpy(&y, b + i, (size_t)m * 4);
        }
        switch (op) {
        case PRT_VM_EXP: r = vexp(x); break;
        case PRT_VM_GELU_ERF: r = 0.5f * x * (1.0f + verf(x * 0.70710678118654752f)); break;
        case PRT_VM_GELU_TANH: {
            const V u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            r = x / (1.0f + vexp(-2.0f * u));
            break;
        }
        case PRT_VM_SILU: r = x / (1.0f + vexp(zero - x)); break;
        default: r = x * y / (1.0f + vexp(zero - y)); break;
        }
        if (m == W) memcpy(o + i, &r, sizeof(V));
        else memcpy(o + i, &r, (size_t)m * 4);
    }
}

void apply_sse(int op, const float* a, const float* b, float* o, int64_t n) {
    apply_lanes<vf4, 4>(op, a, b, o, n, g_mvec.exp[0], g_mvec.erf[0]);
}

__attribute__((target("avx2"))) void apply_avx2(int op, const float* a, const float* b, float* o, int64_t n) {
    apply_lanes<vf8, 8>(op, a, b, o, n, g_mvec.exp[1], g_mvec.erf[1]);
}

__attribute__((target("avx512f"))) void apply_avx512(int op, const float* a, const float* b, float* o, int64_t n) {
    apply_lanes<vf16, 16>(op, a, b, o, n, g_mvec.exp[2], g_mvec.erf[2]);
}
#endif

}  // namespace

void prt_vm_apply(int op, const float* a, const float* b, float* o, int64_t n) {
#if defined(__x86_64__)
    switch (g_mvec.width) {
    case 3: apply_avx512(op, a, b, o, n); return;
    case 2: apply_avx2(op, a, b, o, n); return;
    case 1: apply_sse(op, a, b, o, n); return;
    default: break;
    }
#endif
    apply_scalar(op, a, b, o, n);
}

const char* prt_vm_isa(void) {
    static const char* const kNames[4] = {"scalar", "sse", "avx2", "avx512"};
    return kNames[g_mvec.width];
}

int prt_vm_vector_erf(void) { return g_mvec.width > 0 && g_mvec.erf[g_mvec.width - 1] != nullptr; }
