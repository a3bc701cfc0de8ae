/* Element access for the host kernels of the operator families in their own files (norm_kernels.cpp,
 * rope_kernels.cpp, attention_kernels.cpp, ...): one element or one strided row of any float dtype widened to the
 * compute type (float for float32/float16/bfloat16, double for float64) and rounded back to nearest even, plus the
 * walk over the leading dimensions of a layout. Stateless (inline), so each translation unit may include it. */
#ifndef PADDLE_RT_ENGINE_HOST_FLOAT_H_
#define PADDLE_RT_ENGINE_HOST_FLOAT_H_

#include <stdint.h>
#include <string.h>

#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "paddle_rt/extension.h"

namespace prt_host {

inline float f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

inline uint16_t f32_to_f16(float f) {
    _Float16 x = (_Float16)f;            /* IEEE: round to nearest even */
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t nan = (uint16_t)((u >> 16) | 0x40);                        /* a NaN stays a quiet NaN */
    const uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);   /* round to nearest even */
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;                     /* a select, no branch: loops vectorise */
}

#if defined(__x86_64__)
/* Whether the CPU converts float16 in hardware (F16C with AVX); asked once per module. */
inline bool has_f16c() {
    static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    return yes;
}

__attribute__((target("avx,f16c"))) inline void f16_row_to_f32_f16c(const uint16_t* s, float* d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    for (; i < n; i++) d[i] = f16_to_f32(s[i]);
}

__attribute__((target("avx,f16c"))) inline void f32_row_to_f16_f16c(const float* s, uint16_t* d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) d[i] = f32_to_f16(s[i]);
}
#endif

/* Element i (in elements, strided) of a float array of dtype dt, as C. */
template <typename C>
inline C get(const void* p, int dt, int64_t i) {
    switch (dt) {
    case FLOAT32: return (C) static_cast<const float*>(p)[i];
    case FLOAT64: return (C) static_cast<const double*>(p)[i];
    case FLOAT16: return (C)f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case BFLOAT16: return (C)bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return (C)0;
    }
}

/* n elements at stride s (elements) into / out of a C row: one loop per dtype, float16 rows in hardware when the
   CPU can. */
template <typename C>
inline void read_row(const void* p, int dt, int64_t s, int64_t n, C* d) {
    switch (dt) {
    case FLOAT32: {
        const float* q = static_cast<const float*>(p);
        if (std::is_same<C, float>::value && s == 1) memcpy(d, q, (size_t)n * sizeof(float));
        else if (s == 1) for (int64_t i = 0; i < n; i++) d[i] = (C)q[i];  /* unit stride: vectorised */
        else for (int64_t i = 0; i < n; i++) d[i] = (C)q[i * s];
        break;
    }
    case FLOAT64: {
        const double* q = static_cast<const double*>(p);
        if (s == 1) for (int64_t i = 0; i < n; i++) d[i] = (C)q[i];
        else for (int64_t i = 0; i < n; i++) d[i] = (C)q[i * s];
        break;
    }
    case FLOAT16: {
        const uint16_t* q = static_cast<const uint16_t*>(p);
#if defined(__x86_64__)
        if (std::is_same<C, float>::value && s == 1 && has_f16c()) {
            f16_row_to_f32_f16c(q, reinterpret_cast<float*>(d), n);
            break;
        }
#endif
        for (int64_t i = 0; i < n; i++) d[i] = (C)f16_to_f32(q[i * s]);
        break;
    }
    case BFLOAT16: {
        const uint16_t* q = static_cast<const uint16_t*>(p);
        if (s == 1) for (int64_t i = 0; i < n; i++) d[i] = (C)bf16_to_f32(q[i]);
        else for (int64_t i = 0; i < n; i++) d[i] = (C)bf16_to_f32(q[i * s]);
        break;
    }
    default:
        break;
    }
}

template <typename C>
inline void write_row(void* p, int dt, int64_t s, int64_t n, const C* v) {
    switch (dt) {
    case FLOAT32: {
        float* q = static_cast<float*>(p);
        if (std::is_same<C, float>::value && s == 1) memcpy(q, v, (size_t)n * sizeof(float));
        else if (s == 1) for (int64_t i = 0; i < n; i++) q[i] = (float)v[i];
        else for (int64_t i = 0; i < n; i++) q[i * s] = (float)v[i];
        break;
    }
    case FLOAT64: {
        double* q = static_cast<double*>(p);
        if (s == 1) for (int64_t i = 0; i < n; i++) q[i] = (double)v[i];
        else for (int64_t i = 0; i < n; i++) q[i * s] = (double)v[i];
        break;
    }
    case FLOAT16: {
        uint16_t* q = static_cast<uint16_t*>(p);
#if defined(__x86_64__)
        if (std::is_same<C, float>::value && s == 1 && has_f16c()) {
            f32_row_to_f16_f16c(reinterpret_cast<const float*>(v), q, n);
            break;
        }
#endif
        for (int64_t i = 0; i < n; i++) q[i * s] = f32_to_f16((float)v[i]);
        break;
    }
    case BFLOAT16: {
        uint16_t* q = static_cast<uint16_t*>(p);
        if (s == 1) for (int64_t i = 0; i < n; i++) q[i] = f32_to_bf16((float)v[i]);
        else for (int64_t i = 0; i < n; i++) q[i * s] = f32_to_bf16((float)v[i]);
        break;
    }
    default:
        break;
    }
}

/* An integer (int32/int64/uint32/uint64) element i of an id or position array. */
inline int64_t get_index(const void* p, int dt, int64_t i) {
    switch (dt) {
    case INT32: return static_cast<const int32_t*>(p)[i];
    case INT64: return static_cast<const int64_t*>(p)[i];
    case UINT32: return (int64_t) static_cast<const uint32_t*>(p)[i];
    case UINT64: return (int64_t) static_cast<const uint64_t*>(p)[i];
    default: return -1;
    }
}

inline int esize(int dt) {
    switch (dt) {
    case FLOAT16: case BFLOAT16: return 2;
    case FLOAT32: case INT32: case UINT32: return 4;
    case FLOAT64: case INT64: case UINT64: return 8;
    default: return 1;
    }
}

/* The address of element (idx[0], ..., idx[nd-1]) of t. */
inline char* at(const paddle_rt_tensor& t, const int64_t* idx, int nd) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += idx[d] * t.strides[d];
    return static_cast<char*>(t.data) + off * esize(t.dtype);
}

/* Calls f(idx) for every index of the first nd dimensions of `shape` (row-major order); nothing when one is 0. */
template <typename F>
inline void for_each_index(const int64_t* shape, int nd, F&& f) {
    int64_t idx[PADDLE_RT_OP_MAX_NDIM] = {0};
    for (int d = 0; d < nd; d++)
        if (shape[d] == 0) return;
    for (;;) {
        f(static_cast<const int64_t*>(idx));
        int d = nd - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

/* Whether the call's output has no element (every family kernel returns C_SUCCESS at once then). */
inline bool output_empty(const paddle_rt_op_call* c) {
    for (int d = 0; d < c->out.ndim; d++)
        if (c->out.shape[d] == 0) return true;
    return false;
}

/* Bytes of one element of the compute type: double for float64, float for the rest (float16/bfloat16 widen). */
inline size_t compute_size(const paddle_rt_op_call* c) { return c->dtype == FLOAT64 ? 8 : 4; }

/* A family kernel's entry point: nothing to do for an empty output, else kernel(T()) with T the compute type (double
 * for float64, float for the rest). kernel: a generic lambda that runs the family's template for its argument's type. */
template <class Kernel>
inline C_Status by_compute_type(const paddle_rt_op_call* c, Kernel kernel) {
    if (output_empty(c)) return C_SUCCESS;
    return c->dtype == FLOAT64 ? kernel(double()) : kernel(float());
}

/* Workspace of `rows` rows of the output's last dimension in the compute type. */
inline size_t last_dim_rows_workspace(const paddle_rt_op_call* c, int64_t rows) {
    return (size_t)(rows * c->out.shape[c->out.ndim - 1]) * compute_size(c);
}

/* Failure details a host kernel leaves at the start of its workspace (two int64: what, which) for the error the next
   synchronize raises (op.pyx reads them); every family that can fail at run time reserves kDetailBytes. */
constexpr size_t kDetailBytes = 64;   /* 64: the rows after it stay cache-line aligned */

inline void set_detail(const paddle_rt_op_call* c, int64_t a, int64_t b) {
    if (c->workspace && c->workspace_size >= kDetailBytes) {
        int64_t v[2] = {a, b};
        memcpy(c->workspace, v, sizeof(v));
    }
}

}  // namespace prt_host

#endif /* PADDLE_RT_ENGINE_HOST_FLOAT_H_ */
