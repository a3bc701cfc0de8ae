/* Vectorised float32 elementwise math (vector_math.h): glibc's libmvec in 8 lanes (AVX2) or 4 lanes (SSE), found
 * once at load. Linked into the op extension only (setup.py ENGINE_SOURCES). */
#include "engine/vector_math.h"

#include <dlfcn.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
/* libmvec's SSE expf (GLIBC_2.22, present wherever libmvec is): the fallback every x86-64 build links. */
extern "C" __m128 _ZGVbN4v_expf(__m128);
#endif

namespace {

struct Mvec {
    void* exp8 = nullptr;     /* __m256 (*)(__m256), AVX2 */
    void* erf8 = nullptr;
    void* erf4 = nullptr;     /* __m128 (*)(__m128), SSE */
    bool avx2 = false;
};

Mvec load_mvec() {
    Mvec m;
#if defined(__x86_64__)
    void* h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (!h) h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (h) {
        m.erf4 = dlsym(h, "_ZGVbN4v_erff");
        if (__builtin_cpu_supports("avx2")) {
            m.exp8 = dlsym(h, "_ZGVdN8v_expf");
            m.erf8 = dlsym(h, "_ZGVdN8v_erff");
            m.avx2 = m.exp8 != nullptr;
        }
        /* the handle stays open for the life of the process (its functions are in use) */
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

#if defined(__x86_64__)
typedef __m128 (*v4fn)(__m128);

void apply_sse(int op, const float* a, const float* b, float* o, int64_t n) {
    const v4fn erf4 = reinterpret_cast<v4fn>(g_mvec.erf4);
    if (op == PRT_VM_GELU_ERF && !erf4) {
        for (int64_t i = 0; i < n; i++) o[i] = scalar_op(op, a[i], 0.0f);
        return;
    }
    const __m128 one = _mm_set1_ps(1.0f), half = _mm_set1_ps(0.5f), rs2 = _mm_set1_ps(0.70710678118654752f),
                 k0 = _mm_set1_ps(0.7978845608028654f), k1 = _mm_set1_ps(0.044715f), m2 = _mm_set1_ps(-2.0f),
                 zero = _mm_setzero_ps();
    int64_t i = 0;
    for (; i < n; i += 4) {
        float ta[4] = {0, 0, 0, 0}, tb[4] = {0, 0, 0, 0};
        const int64_t m = n - i < 4 ? n - i : 4;
        __m128 x, y = zero, r;
        if (m == 4) {
            x = _mm_loadu_ps(a + i);
            if (op == PRT_VM_SWIGLU) y = _mm_loadu_ps(b + i);
        } else {
            memcpy(ta, a + i, (size_t)m * 4);
            if (op == PRT_VM_SWIGLU) memcpy(tb, b + i, (size_t)m * 4);
            x = _mm_loadu_ps(ta);
            y = _mm_loadu_ps(tb);
        }
        switch (op) {
        case PRT_VM_EXP: r = _ZGVbN4v_expf(x); break;
        case PRT_VM_GELU_ERF: r = _mm_mul_ps(_mm_mul_ps(half, x), _mm_add_ps(one, erf4(_mm_mul_ps(x, rs2)))); break;
        case PRT_VM_GELU_TANH: {
            __m128 u = _mm_mul_ps(k0, _mm_add_ps(x, _mm_mul_ps(k1, _mm_mul_ps(x, _mm_mul_ps(x, x)))));
            r = _mm_div_ps(x, _mm_add_ps(one, _ZGVbN4v_expf(_mm_mul_ps(m2, u))));
            break;
        }
        case PRT_VM_SILU: r = _mm_div_ps(x, _mm_add_ps(one, _ZGVbN4v_expf(_mm_sub_ps(zero, x)))); break;
        default: r = _mm_div_ps(_mm_mul_ps(x, y), _mm_add_ps(one, _ZGVbN4v_expf(_mm_sub_ps(zero, y)))); break;
        }
        if (m == 4) _mm_storeu_ps(o + i, r);
        else {
            _mm_storeu_ps(ta, r);
            memcpy(o + i, ta, (size_t)m * 4);
        }
    }
}

__attribute__((target("avx2"))) void apply_avx2(int op, const float* a, const float* b, float* o, int64_t n) {
    typedef __m256 (*v8fn)(__m256);
    const v8fn exp8 = reinterpret_cast<v8fn>(g_mvec.exp8);
    const v8fn erf8 = reinterpret_cast<v8fn>(g_mvec.erf8);
    if (op == PRT_VM_GELU_ERF && !erf8) {
        apply_sse(op, a, b, o, n);
        return;
    }
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f),
                 rs2 = _mm256_set1_ps(0.70710678118654752f), k0 = _mm256_set1_ps(0.7978845608028654f),
                 k1 = _mm256_set1_ps(0.044715f), m2 = _mm256_set1_ps(-2.0f), zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        float ta[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const int64_t m = n - i < 8 ? n - i : 8;
        __m256 x, y = zero, r;
        if (m == 8) {
            x = _mm256_loadu_ps(a + i);
            if (op == PRT_VM_SWIGLU) y = _mm256_loadu_ps(b + i);
        } else {
            memcpy(ta, a + i, (size_t)m * 4);
            if (op == PRT_VM_SWIGLU) memcpy(tb, b + i, (size_t)m * 4);
            x = _mm256_loadu_ps(ta);
            y = _mm256_loadu_ps(tb);
        }
        switch (op) {
        case PRT_VM_EXP: r = exp8(x); break;
        case PRT_VM_GELU_ERF:
            r = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, erf8(_mm256_mul_ps(x, rs2))));
            break;
        case PRT_VM_GELU_TANH: {
            __m256 u = _mm256_mul_ps(k0, _mm256_add_ps(x, _mm256_mul_ps(k1, _mm256_mul_ps(x, _mm256_mul_ps(x, x)))));
            r = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_mul_ps(m2, u))));
            break;
        }
        case PRT_VM_SILU: r = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x)))); break;
        default: r = _mm256_div_ps(_mm256_mul_ps(x, y), _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, y)))); break;
        }
        if (m == 8) _mm256_storeu_ps(o + i, r);
        else {
            _mm256_storeu_ps(ta, r);
            memcpy(o + i, ta, (size_t)m * 4);
        }
    }
}
#endif

}  // namespace

void prt_vm_apply(int op, const float* a, const float* b, float* o, int64_t n) {
#if defined(__x86_64__)
    if (g_mvec.avx2) apply_avx2(op, a, b, o, n);
    else apply_sse(op, a, b, o, n);
#else
    for (int64_t i = 0; i < n; i++) o[i] = scalar_op(op, a[i], b ? b[i] : 0.0f);
#endif
}

const char* prt_vm_isa(void) { return g_mvec.avx2 ? "avx2" : "sse"; }

int prt_vm_vector_erf(void) { return (g_mvec.avx2 ? g_mvec.erf8 : g_mvec.erf4) != nullptr; }
