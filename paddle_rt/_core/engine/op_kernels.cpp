/* Host kernels of the operator layer: the operators of paddle_rt_op (include/paddle_rt/extension.h) on memory the
 * host can address. Floating-point dtypes compute in float (float16 and bfloat16 are widened in blocks and rounded
 * back to nearest even) or in double (float64); integers wrap around. gemm calls numpy's BLAS (or SciPy's; the entry
 * points are found at the first gemm, op.pyx) with that library's own threads; the rest is one fused pass per row or
 * per block, split over paddle_rt's host thread pool (host_parallel.h) in ranges of whole rows or blocks, so every
 * element is computed by the same arithmetic whatever the thread count (results are bit-identical at 1 or N
 * threads). add, sub, mul, gelu, silu and swiglu on one float dtype with unit strides run vector_math.h's fused loop
 * (the widest instruction set the CPU has, float16/bfloat16 converted in registers); softmax's exp goes through
 * glibc's libmvec there too. Linked into the op extension only (setup.py ENGINE_SOURCES). */
#include "engine/op_kernels.h"
#include "engine/op_families.h"
#include "engine/host_float.h"
#include "engine/host_parallel.h"
#include "engine/vector_math.h"
#include "engine/checked_math.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <numeric>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

constexpr int kBlock = 512;           /* elements per block of the widened (float) paths: 2 KiB, stays in L1 */
/* Work per chunk of the thread pool: below it a call runs on its stream's worker alone (a pool thread's wake-up
   costs ~5-20 us; 32 K elements of a cheap op take about as long). */
constexpr int64_t kGrainElems = 32768;
constexpr int64_t kSpan = 16384;       /* a long row is split into spans of this many elements */

/* BLAS gemm with integer arguments of type I (int: LP64, int64_t: ILP64) */
template <typename T, typename I>
using gemm_fn = void (*)(const char* ta, const char* tb, const I* m, const I* n, const I* k, const T* alpha,
                         const T* a, const I* lda, const T* b, const I* ldb, const T* beta, T* c, const I* ldc);
/* BLAS gemv, for the products with one row or one column of output (a decode step's activations times a weight):
   OpenBLAS's gemm runs them through its blocked matrix path, several times slower than its gemv, which numpy and
   torch call for the same shapes. */
template <typename T, typename I>
using gemv_fn = void (*)(const char* t, const I* m, const I* n, const T* alpha, const T* a, const I* lda, const T* x,
                         const I* incx, const T* beta, T* y, const I* incy);
std::atomic<void*> g_sgemm{nullptr};
std::atomic<void*> g_dgemm{nullptr};
std::atomic<void*> g_sgemv{nullptr};
std::atomic<void*> g_dgemv{nullptr};
std::atomic<int> g_ilp64{0};

/* ---- conversions (engine/host_float.h) --------------------------------------------------------------------------- */
using prt_host::bf16_to_f32;
using prt_host::f32_to_bf16;
using prt_host::f16_to_f32;
using prt_host::f32_to_f16;

#if defined(__x86_64__)
const bool g_f16c = prt_host::has_f16c();
using prt_host::f16_row_to_f32_f16c;
using prt_host::f32_row_to_f16_f16c;
#endif

/* x[i] = exp(x[i]) */
inline void exp_inplace(float* x, int64_t n) { prt_vm_apply(PRT_VM_EXP, x, nullptr, x, n); }

inline void exp_inplace(double* x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = exp(x[i]);
}

/* ---- rows of any float dtype, widened to the compute type C (float or double) ---------------------------------- */
void load_row(const char* p, int dt, int64_t s, int64_t n, float* d) {
    switch (dt) {
    case FLOAT32: {
        const float* q = reinterpret_cast<const float*>(p);
        if (s == 1) memcpy(d, q, (size_t)n * 4);
        else for (int64_t i = 0; i < n; i++) d[i] = q[i * s];
        break;
    }
    case FLOAT16: {
        const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
#if defined(__x86_64__)
        if (s == 1 && g_f16c) { f16_row_to_f32_f16c(q, d, n); break; }
#endif
        for (int64_t i = 0; i < n; i++) d[i] = f16_to_f32(q[i * s]);
        break;
    }
    case BFLOAT16: {
        const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
        if (s == 1) for (int64_t i = 0; i < n; i++) d[i] = bf16_to_f32(q[i]);   /* vectorised (-O3) */
        else for (int64_t i = 0; i < n; i++) d[i] = bf16_to_f32(q[i * s]);
        break;
    }
    case FLOAT64: {
        const double* q = reinterpret_cast<const double*>(p);
        for (int64_t i = 0; i < n; i++) d[i] = (float)q[i * s];
        break;
    }
    default:
        break;
    }
}

void store_row(char* p, int dt, int64_t s, int64_t n, const float* v) {
    switch (dt) {
    case FLOAT32: {
        float* q = reinterpret_cast<float*>(p);
        if (s == 1) memcpy(q, v, (size_t)n * 4);
        else for (int64_t i = 0; i < n; i++) q[i * s] = v[i];
        break;
    }
    case FLOAT16: {
        uint16_t* q = reinterpret_cast<uint16_t*>(p);
#if defined(__x86_64__)
        if (s == 1 && g_f16c) { f32_row_to_f16_f16c(v, q, n); break; }
#endif
        for (int64_t i = 0; i < n; i++) q[i * s] = f32_to_f16(v[i]);
        break;
    }
    case BFLOAT16: {
        uint16_t* q = reinterpret_cast<uint16_t*>(p);
        if (s == 1) for (int64_t i = 0; i < n; i++) q[i] = f32_to_bf16(v[i]);   /* branch-free: vectorised (-O3) */
        else for (int64_t i = 0; i < n; i++) q[i * s] = f32_to_bf16(v[i]);
        break;
    }
    case FLOAT64: {
        double* q = reinterpret_cast<double*>(p);
        for (int64_t i = 0; i < n; i++) q[i * s] = v[i];
        break;
    }
    default:
        break;
    }
}

void load_row(const char* p, int dt, int64_t s, int64_t n, double* d) {
    if (dt == FLOAT64) {
        const double* q = reinterpret_cast<const double*>(p);
        for (int64_t i = 0; i < n; i++) d[i] = q[i * s];
    } else {
        prt_host::read_row<double>(p, dt, s, n, d);   /* float64 ops take weights of any float dtype */
    }
}

void store_row(char* p, int, int64_t s, int64_t n, const double* v) {
    double* q = reinterpret_cast<double*>(p);
    for (int64_t i = 0; i < n; i++) q[i * s] = v[i];
}

/* ---- iteration ---------------------------------------------------------------------------------------------------- */
constexpr int kMaxOperands = 1 + PADDLE_RT_OP_MAX_INPUTS;

/* A layout shared by K operands of one shape: strides per operand, in elements. */
struct Layout {
    int nd;
    int k;
    int64_t shape[PADDLE_RT_OP_MAX_NDIM];
    int64_t st[kMaxOperands][PADDLE_RT_OP_MAX_NDIM];
    char* base[kMaxOperands];
    int esize[kMaxOperands];
};

Layout layout_of(const paddle_rt_op_call* c, int k) {
    Layout L;
    L.nd = c->out.ndim;
    L.k = k;
    for (int d = 0; d < L.nd; d++) L.shape[d] = c->out.shape[d];
    for (int j = 0; j < k; j++) {
        /* axpby: y = alpha * x + beta * y reads out (y) as its second operand */
        const paddle_rt_tensor* t = j == 0 || (j == 2 && c->op == PADDLE_RT_OP_AXPBY) ? &c->out : &c->inputs[j - 1];
        L.base[j] = static_cast<char*>(t->data);
        L.esize[j] = prt_dtype_size(t->dtype);
        for (int d = 0; d < L.nd; d++) L.st[j][d] = t->strides[d];
    }
    return L;
}

int64_t numel(const Layout& L) {
    int64_t n = 1;
    for (int d = 0; d < L.nd; d++) n *= L.shape[d];
    return n;
}

/* Drops dimensions of extent 1 and merges neighbours that every operand walks as one (elementwise ops only). */
void coalesce(Layout& L) {
    int nd = 0;
    for (int d = 0; d < L.nd; d++) {
        if (L.shape[d] == 1) continue;
        if (nd > 0) {
            bool merge = true;
            for (int j = 0; j < L.k; j++)
                if (L.st[j][nd - 1] != L.st[j][d] * L.shape[d]) { merge = false; break; }
            if (merge) {
                L.shape[nd - 1] *= L.shape[d];
                for (int j = 0; j < L.k; j++) L.st[j][nd - 1] = L.st[j][d];
                continue;
            }
        }
        L.shape[nd] = L.shape[d];
        for (int j = 0; j < L.k; j++) L.st[j][nd] = L.st[j][d];
        nd++;
    }
    if (nd == 0) {
        L.shape[0] = 1;
        for (int j = 0; j < L.k; j++) L.st[j][0] = 1;
        nd = 1;
    }
    L.nd = nd;
}

/* Calls f(ptrs, row_index) for every row (all dimensions but the last), ptrs[j] the row's start in operand j. */
template <typename F>
void for_rows(const Layout& L, F&& f) {
    int64_t idx[PADDLE_RT_OP_MAX_NDIM] = {0};
    char* p[kMaxOperands];
    for (int j = 0; j < L.k; j++) p[j] = L.base[j];
    int64_t rows = 1;
    for (int d = 0; d + 1 < L.nd; d++) rows *= L.shape[d];
    for (int64_t r = 0; r < rows; r++) {
        f(p, r);
        for (int d = L.nd - 2; d >= 0; d--) {
            for (int j = 0; j < L.k; j++) p[j] += L.st[j][d] * L.esize[j];
            if (++idx[d] < L.shape[d]) break;
            for (int j = 0; j < L.k; j++) p[j] -= L.st[j][d] * L.shape[d] * L.esize[j];
            idx[d] = 0;
        }
    }
}

int64_t last(const Layout& L, int j) { return L.st[j][L.nd - 1]; }

int64_t rows_of(const Layout& L) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < L.nd; d++) rows *= L.shape[d];
    return rows;
}

/* p[j] = the start of row r (all dimensions but the last) in operand j. */
void row_start(const Layout& L, int64_t r, char** p) {
    for (int j = 0; j < L.k; j++) p[j] = L.base[j];
    for (int d = L.nd - 2; d >= 0; d--) {
        const int64_t i = r % L.shape[d];
        r /= L.shape[d];
        for (int j = 0; j < L.k; j++) p[j] += i * L.st[j][d] * L.esize[j];
    }
}

/* Calls f(ptrs, i0, i1) for the elements [i0, i1) of every row, rows cut into spans of kSpan, the spans split over
   the thread pool (elementwise ops and copies: each element on its own, so the split never changes a result). */
template <typename F>
void for_spans(const Layout& L, F&& f) {
    const int64_t n = L.shape[L.nd - 1];
    const int64_t span = n < kSpan ? n : kSpan;
    const int64_t per_row = (n + span - 1) / span;
    prt::parallel_for(rows_of(L) * per_row, std::max<int64_t>(1, kGrainElems / span), [&](int64_t u0, int64_t u1) {
        char* p[kMaxOperands];
        for (int64_t u = u0; u < u1; u++) {
            const int64_t i0 = (u % per_row) * span;
            if (u == u0 || i0 == 0) row_start(L, u / per_row, p);
            f(p, i0, std::min(n, i0 + span));
        }
    });
}

/* Calls f(ptrs, r) for every row r, ranges of rows split over the thread pool (row_elems: the work of one row).
   Each row is computed by one thread with the same arithmetic as at one thread. */
template <typename F>
void for_rows_parallel(const Layout& L, int64_t row_elems, F&& f) {
    prt::parallel_for(rows_of(L), std::max<int64_t>(1, kGrainElems / std::max<int64_t>(row_elems, 1)),
                      [&](int64_t r0, int64_t r1) {
        char* p[kMaxOperands];
        for (int64_t r = r0; r < r1; r++) {
            row_start(L, r, p);
            f(p, r);
        }
    });
}

/* ---- elementwise ---------------------------------------------------------------------------------------------- */
template <typename C>
inline void ew_block(int op, const C* a, const C* b, C* o, C* t, int64_t n, const double* attrs) {
    switch (op) {
    case PADDLE_RT_OP_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i]; break;
    case PADDLE_RT_OP_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i]; break;
    case PADDLE_RT_OP_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i]; break;
    case PADDLE_RT_OP_AXPBY: {      /* o aliases b (y); a is x */
        const C al = (C)attrs[0], be = (C)attrs[1];
        for (int64_t i = 0; i < n; i++) o[i] = al * a[i] + be * b[i];
        break;
    }
    case PADDLE_RT_OP_SWIGLU:       /* a * b * sigmoid(b) = a * b / (1 + exp(-b)) */
        if (std::is_same<C, float>::value) {
            prt_vm_apply(PRT_VM_SWIGLU, (const float*)a, (const float*)b, (float*)o, n);
            break;
        }
        for (int64_t i = 0; i < n; i++) t[i] = -b[i];
        exp_inplace(t, n);
        for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i] / ((C)1 + t[i]);
        break;
    case PADDLE_RT_OP_RELU: for (int64_t i = 0; i < n; i++) o[i] = a[i] > (C)0 ? a[i] : (a[i] == a[i] ? (C)0 : a[i]); break;
    case PADDLE_RT_OP_SILU:         /* x * sigmoid(x) */
        if (std::is_same<C, float>::value) {
            prt_vm_apply(PRT_VM_SILU, (const float*)a, nullptr, (float*)o, n);
            break;
        }
        for (int64_t i = 0; i < n; i++) t[i] = -a[i];
        exp_inplace(t, n);
        for (int64_t i = 0; i < n; i++) o[i] = a[i] / ((C)1 + t[i]);
        break;
    case PADDLE_RT_OP_GELU:
        if (std::is_same<C, float>::value) {
            prt_vm_apply(attrs[0] != 0 ? PRT_VM_GELU_TANH : PRT_VM_GELU_ERF, (const float*)a, nullptr, (float*)o, n);
            break;
        }
        if (attrs[0] != 0) {        /* tanh approximation */
            const C k0 = (C)0.7978845608028654, k1 = (C)0.044715;
            for (int64_t i = 0; i < n; i++) {
                C x = a[i];
                o[i] = (C)0.5 * x * ((C)1 + std::tanh(k0 * (x + k1 * x * x * x)));
            }
        } else {
            for (int64_t i = 0; i < n; i++) o[i] = (C)0.5 * a[i] * ((C)1 + std::erf(a[i] * (C)0.7071067811865476));
        }
        break;
    default:
        break;
    }
}

bool is_unary(int op) { return op == PADDLE_RT_OP_RELU || op == PADDLE_RT_OP_GELU || op == PADDLE_RT_OP_SILU; }

/* Below this many elements an elementwise call skips the fused loop's dispatch (the one-element ops.add: ~0.1 us of
   a 1.5 us call). */
constexpr int64_t kFusedMin = 64;

/* The operator as vector_math.h's loop runs it, or -1 (relu and axpby stay in ew_block). */
int vm_op(int op, const double* attrs) {
    switch (op) {
    case PADDLE_RT_OP_ADD: return PRT_VM_ADD;
    case PADDLE_RT_OP_SUB: return PRT_VM_SUB;
    case PADDLE_RT_OP_MUL: return PRT_VM_MUL;
    case PADDLE_RT_OP_SILU: return PRT_VM_SILU;
    case PADDLE_RT_OP_SWIGLU: return PRT_VM_SWIGLU;
    case PADDLE_RT_OP_GELU: return attrs[0] != 0 ? PRT_VM_GELU_TANH : PRT_VM_GELU_ERF;
    default: return -1;
    }
}

/* Whether an elementwise call writes its output around the caches (non-temporal stores): when the output is larger
   than a last-level cache (32 MiB here; 16-32 MiB on common CPUs) it cannot stay cached for the next operator anyway,
   and streaming it saves reading every output line before writing it: add 16 M float32 (64 MiB out) 7.6 -> 5.5 ms
   at one thread on this machine. */
constexpr int64_t kStreamBytes = 32 << 20;
bool stream_output(int64_t bytes) { return bytes >= kStreamBytes; }

/* The dtype as vector_math.h's loop reads and writes it, or -1. */
int vm_dtype(int dt) {
    switch (dt) {
    case FLOAT32: return PRT_VM_F32;
    case FLOAT16: return PRT_VM_F16;
    case BFLOAT16: return PRT_VM_BF16;
    default: return -1;
    }
}

template <typename C>
C_Status ew_float(const paddle_rt_op_call* c) {
    const int op = c->op;
    const int k = is_unary(op) ? 2 : 3;
    Layout L = layout_of(c, k);
    if (numel(L) == 0) return C_SUCCESS;
    coalesce(L);
    /* axpby's second operand is out (y) itself: it has no inputs[1] */
    const int dt_o = c->out.dtype, dt_a = c->inputs[0].dtype,
              dt_b = k == 2 ? dt_a : op == PADDLE_RT_OP_AXPBY ? dt_o : c->inputs[1].dtype;
    const bool direct = sizeof(C) == 8 || (dt_o == FLOAT32 && dt_a == FLOAT32 && dt_b == FLOAT32);
    const int64_t so = last(L, 0), sa = last(L, 1), sb = k == 3 ? last(L, 2) : 0;
    /* one dtype throughout, unit strides: the fused vector loop (load, convert, compute, round, store per vector);
       a few elements stay in ew_block below (same results: its float ops call the same loop or are exact). */
    const int vop = sizeof(C) == 4 && numel(L) >= kFusedMin ? vm_op(op, c->attrs) : -1;
    const int vdt = dt_o == dt_a && dt_a == dt_b ? vm_dtype(dt_o) : -1;
    if (vop >= 0 && vdt >= 0 && so == 1 && sa == 1 && (k == 2 || sb == 1)) {
        const int64_t es = L.esize[0];
        const int stream = stream_output(numel(L) * es);
        for_spans(L, [vop, vdt, es, k, stream](char* const* p, int64_t j0, int64_t j1) {
            prt_vm_apply_typed(vop, vdt, p[1] + j0 * es, k == 3 ? p[2] + j0 * es : nullptr, p[0] + j0 * es, j1 - j0,
                               stream);
        });
        return C_SUCCESS;
    }
    for_spans(L, [&](char* const* p, int64_t j0, int64_t j1) {
        alignas(64) C ba[kBlock], bb[kBlock], bo[kBlock], bt[kBlock];
        if (direct && so == 1 && sa == 1 && (k == 2 || sb == 1)) {
            C* o = reinterpret_cast<C*>(p[0]);
            const C* a = reinterpret_cast<const C*>(p[1]);
            const C* b = k == 3 ? reinterpret_cast<const C*>(p[2]) : a;
            for (int64_t i0 = j0; i0 < j1; i0 += kBlock) {
                int64_t m = std::min<int64_t>(kBlock, j1 - i0);
                ew_block<C>(op, a + i0, b + i0, o + i0, bt, m, c->attrs);
            }
            return;
        }
        for (int64_t i0 = j0; i0 < j1; i0 += kBlock) {
            int64_t m = std::min<int64_t>(kBlock, j1 - i0);
            load_row(p[1] + i0 * sa * L.esize[1], dt_a, sa, m, ba);
            if (k == 3) {
                load_row(p[2] + i0 * sb * L.esize[2], dt_b, sb, m, bb);
            }
            ew_block<C>(op, ba, k == 3 ? bb : ba, bo, bt, m, c->attrs);
            store_row(p[0] + i0 * so * L.esize[0], dt_o, so, m, bo);
        }
    });
    return C_SUCCESS;
}

template <typename T>
C_Status ew_int(const paddle_rt_op_call* c) {
    typedef typename std::make_unsigned<T>::type U;   /* wrap-around arithmetic without signed overflow */
    Layout L = layout_of(c, 3);
    if (numel(L) == 0) return C_SUCCESS;
    coalesce(L);
    const int64_t n = L.shape[L.nd - 1];
    const int64_t so = last(L, 0), sa = last(L, 1), sb = last(L, 2);
    const int op = c->op;
    (void)n;
    for_spans(L, [&](char* const* p, int64_t i0, int64_t i1) {
        T* o = reinterpret_cast<T*>(p[0]);
        const T* a = reinterpret_cast<const T*>(p[1]);
        const T* b = reinterpret_cast<const T*>(p[2]);
        for (int64_t i = i0; i < i1; i++) {
            U x = (U)a[i * sa], y = (U)b[i * sb];
            U r = op == PADDLE_RT_OP_ADD ? (U)(x + y) : op == PADDLE_RT_OP_SUB ? (U)(x - y) : (U)(x * y);
            o[i * so] = (T)r;
        }
    });
    return C_SUCCESS;
}

C_Status ew_kernel(const paddle_rt_op_call* c) {
    switch (c->dtype) {
    case FLOAT64: return ew_float<double>(c);
    case FLOAT32: case FLOAT16: case BFLOAT16: return ew_float<float>(c);
    case INT8: return ew_int<int8_t>(c);
    case INT16: return ew_int<int16_t>(c);
    case INT32: return ew_int<int32_t>(c);
    case INT64: return ew_int<int64_t>(c);
    case UINT8: return ew_int<uint8_t>(c);
    case UINT16: return ew_int<uint16_t>(c);
    case UINT32: return ew_int<uint32_t>(c);
    case UINT64: return ew_int<uint64_t>(c);
    default: return C_ERROR;
    }
}

/* ---- rearrange: a strided copy ---------------------------------------------------------------------------------- */
template <typename T>
void copy_row(char* o, int64_t so, const char* a, int64_t sa, int64_t n) {
    T* q = reinterpret_cast<T*>(o);
    const T* p = reinterpret_cast<const T*>(a);
    for (int64_t i = 0; i < n; i++) q[i * so] = p[i * sa];
}

C_Status rearrange_kernel(const paddle_rt_op_call* c) {
    Layout L = layout_of(c, 2);
    if (numel(L) == 0) return C_SUCCESS;
    coalesce(L);
    const int64_t n = L.shape[L.nd - 1], so = last(L, 0), sa = last(L, 1);
    const int es = L.esize[0];
    (void)n;
    /* An in-place or overlapping rearrange (memmove semantics) stays on one thread: spans would race. */
    const int64_t lo0 = (int64_t)(uintptr_t)L.base[0], lo1 = (int64_t)(uintptr_t)L.base[1];
    int64_t ext0 = es, ext1 = es;
    for (int d = 0; d < L.nd; d++) {
        ext0 += (L.shape[d] - 1) * std::abs(L.st[0][d]) * es;
        ext1 += (L.shape[d] - 1) * std::abs(L.st[1][d]) * es;
    }
    const bool overlap = lo0 < lo1 + ext1 && lo1 < lo0 + ext0;
    auto span = [&](char* const* p, int64_t i0, int64_t i1) {
        char* o = p[0] + i0 * so * es;
        const char* a = p[1] + i0 * sa * es;
        const int64_t m = i1 - i0;
        if (so == 1 && sa == 1) { memmove(o, a, (size_t)(m * es)); return; }
        switch (es) {
        case 1: copy_row<uint8_t>(o, so, a, sa, m); break;
        case 2: copy_row<uint16_t>(o, so, a, sa, m); break;
        case 4: copy_row<uint32_t>(o, so, a, sa, m); break;
        default: copy_row<uint64_t>(o, so, a, sa, m); break;
        }
    };
    if (overlap) for_rows(L, [&](char* const* p, int64_t) { span(p, 0, L.shape[L.nd - 1]); });
    else for_spans(L, span);
    return C_SUCCESS;
}

/* ---- row-wise normalisations and softmax ---------------------------------------------------------------------- */
/* Row reductions in kLanes interleaved partial results, combined in a fixed order at the end: the compiler vectorises
   them (a single running sum cannot be reordered without -ffast-math), and a row's result does not depend on the
   thread count (one thread computes a whole row). */
constexpr int kLanes = 16;

template <typename C, typename F>
inline C row_sum(int64_t n, F&& term) {
    C acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; j++) acc[j] += term(i + j);
    for (; i < n; i++) acc[i % kLanes] += term(i);
    for (int w = kLanes / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

template <typename C>
inline C row_max(const C* x, int64_t n) {      /* n >= 1; the sequential loop's result, NaN handling included */
    C acc[kLanes];
    for (int j = 0; j < kLanes; j++) acc[j] = x[0];
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (; i < n; i++) acc[i % kLanes] = x[i] > acc[i % kLanes] ? x[i] : acc[i % kLanes];
    C m = acc[0];
    for (int j = 1; j < kLanes; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}
/* rms_norm (layer_norm: norm_kernels.cpp) */
template <typename C>
C_Status norm_kernel(const paddle_rt_op_call* c) {
    Layout L = layout_of(c, 2);
    if (numel(L) == 0) return C_SUCCESS;
    const int64_t d = L.shape[L.nd - 1], so = last(L, 0), sx = last(L, 1);
    C* w = static_cast<C*>(c->workspace) + d;      /* the weights, read by every thread */
    load_row(static_cast<const char*>(c->inputs[1].data), c->inputs[1].dtype, c->inputs[1].strides[0], d, w);
    const C eps = (C)c->attrs[0];
    std::atomic<int> failed{0};
    for_rows_parallel(L, d, [&](char* const* p, int64_t) {
        C* x = static_cast<C*>(prt_parallel_scratch((size_t)d * sizeof(C)));   /* this thread's row */
        if (!x) { failed.store(1); return; }
        load_row(p[1], c->inputs[0].dtype, sx, d, x);
        const C s = row_sum<C>(d, [x](int64_t i) { return x[i] * x[i]; });
        const C r = (C)1 / std::sqrt(s / (C)d + eps);
        for (int64_t i = 0; i < d; i++) x[i] = x[i] * r * w[i];
        store_row(p[0], c->out.dtype, so, d, x);
    });
    return failed.load() ? C_ERROR : C_SUCCESS;
}

template <typename C>
C_Status causal_softmax_kernel(const paddle_rt_op_call* c) {
    Layout L = layout_of(c, 2);
    if (numel(L) == 0) return C_SUCCESS;
    const int64_t total = L.shape[L.nd - 1], n = L.shape[L.nd - 2];
    const int64_t so = last(L, 0), sx = last(L, 1);
    std::atomic<int> failed{0};
    for_rows_parallel(L, total, [&](char* const* p, int64_t r) {
        C* x = static_cast<C*>(prt_parallel_scratch((size_t)total * sizeof(C)));   /* this thread's row */
        if (!x) { failed.store(1); return; }
        const int64_t i = r % n;
        const int64_t kept = std::min<int64_t>(total, i + total - n + 1);
        load_row(p[1], c->inputs[0].dtype, sx, kept, x);
        const C m = row_max(x, kept);
        for (int64_t j = 0; j < kept; j++) x[j] -= m;
        exp_inplace(x, kept);
        const C s = row_sum<C>(kept, [x](int64_t j) { return x[j]; });
        const C inv = (C)1 / s;
        for (int64_t j = 0; j < kept; j++) x[j] *= inv;
        for (int64_t j = kept; j < total; j++) x[j] = 0;
        store_row(p[0], c->out.dtype, so, total, x);
    });
    return failed.load() ? C_ERROR : C_SUCCESS;
}

/* ---- gemm ------------------------------------------------------------------------------------------------------- */
/* How BLAS can take a (r x c) matrix with strides (rs, cs): 'R' row-major, 'C' column-major (leading dimension *ld),
   or 0 when it must be copied. Extent-1 dimensions take whichever stride suits. */
char blas_layout(int64_t r, int64_t c, int64_t rs, int64_t cs, int64_t* ld) {
    if (r == 1) {
        if (cs == 1) { *ld = std::max<int64_t>(c, 1); return 'R'; }
        if (cs >= 1 && cs <= INT_MAX) { *ld = cs; return 'C'; }
        return 0;
    }
    if (c == 1) {
        if (rs == 1) { *ld = std::max<int64_t>(r, 1); return 'C'; }
        if (rs >= 1 && rs <= INT_MAX) { *ld = rs; return 'R'; }
        return 0;
    }
    if (cs == 1 && rs >= c && rs <= INT_MAX) { *ld = rs; return 'R'; }
    if (rs == 1 && cs >= r && cs <= INT_MAX) { *ld = cs; return 'C'; }
    return 0;
}

struct GemmPlan {
    int64_t batch, m, n, k;
    char la, lb, lc;                  /* layouts (0: copied into the workspace, row-major) */
    int64_t lda, ldb, ldc;
    size_t esize;                     /* the compute type's size: 4 (float32, float16, bfloat16) or 8 */
    size_t ws_a, ws_b, ws_c;          /* workspace bytes for each copied operand */
};

GemmPlan gemm_plan(const paddle_rt_op_call* c) {
    GemmPlan g;
    const paddle_rt_tensor &o = c->out, &a = c->inputs[0], &b = c->inputs[1];
    g.batch = o.shape[0];
    g.m = o.shape[1];
    g.n = o.shape[2];
    g.k = a.shape[2];
    const bool widen = c->dtype == FLOAT16 || c->dtype == BFLOAT16;
    g.esize = c->dtype == FLOAT64 ? 8 : 4;
    g.la = widen ? 0 : blas_layout(g.m, g.k, a.strides[1], a.strides[2], &g.lda);
    g.lb = widen ? 0 : blas_layout(g.k, g.n, b.strides[1], b.strides[2], &g.ldb);
    g.lc = widen ? 0 : blas_layout(g.m, g.n, o.strides[1], o.strides[2], &g.ldc);
    if (!g.la) g.lda = std::max<int64_t>(g.k, 1), g.la = 'R';
    else g.la |= 0x20;                /* lower case: in place */
    if (!g.lb) g.ldb = std::max<int64_t>(g.n, 1), g.lb = 'R';
    else g.lb |= 0x20;
    if (!g.lc) g.ldc = std::max<int64_t>(g.n, 1), g.lc = 'R';
    else g.lc |= 0x20;
    g.ws_a = (g.la & 0x20) ? 0 : (size_t)(g.m * g.k) * g.esize;
    g.ws_b = (g.lb & 0x20) ? 0 : (size_t)(g.k * g.n) * g.esize;
    g.ws_c = (g.lc & 0x20) ? 0 : (size_t)(g.m * g.n) * g.esize;
    return g;
}

template <typename C>
void copy_in(const char* p, int dt, int64_t r, int64_t cols, int64_t rs, int64_t cs, int es, C* dst) {
    for (int64_t i = 0; i < r; i++) load_row(p + i * rs * es, dt, cs, cols, dst + i * cols);
}

template <typename C>
void copy_out(char* p, int dt, int64_t r, int64_t cols, int64_t rs, int64_t cs, int es, const C* src) {
    for (int64_t i = 0; i < r; i++) store_row(p + i * rs * es, dt, cs, cols, src + i * cols);
}

template <typename C, typename I>
void blas_gemm_as(char ta, char tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, int64_t lda, const C* b,
                  int64_t ldb, C beta, C* c, int64_t ldc) {
    const I im = (I)m, in = (I)n, ik = (I)k, ila = (I)lda, ilb = (I)ldb, ilc = (I)ldc;
    auto fn = reinterpret_cast<gemm_fn<C, I>>(sizeof(C) == 4 ? g_sgemm.load() : g_dgemm.load());
    fn(&ta, &tb, &im, &in, &ik, &alpha, a, &ila, b, &ilb, &beta, c, &ilc);
}

template <typename C, typename I>
void blas_gemv_as(char t, int64_t rows, int64_t cols, C alpha, const C* a, int64_t lda, const C* x, int64_t incx,
                  C beta, C* y, int64_t incy) {
    const I ir = (I)rows, ic = (I)cols, ila = (I)lda, ix = (I)incx, iy = (I)incy;
    auto fn = reinterpret_cast<gemv_fn<C, I>>(sizeof(C) == 4 ? g_sgemv.load() : g_dgemv.load());
    fn(&t, &ir, &ic, &alpha, a, &ila, x, &ix, &beta, y, &iy);
}

/* A column-major gemm (BLAS's meaning of ta, tb, m, n, k and the leading dimensions) with k > 0; one output column
   or row goes through gemv when the library gave one. */
template <typename C, typename I>
void blas_product_as(char ta, char tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, int64_t lda,
                     const C* b, int64_t ldb, C beta, C* c, int64_t ldc) {
    const bool have_gemv = (sizeof(C) == 4 ? g_sgemv.load() : g_dgemv.load()) != nullptr;
    const bool a_n = (ta | 0x20) == 'n', b_n = (tb | 0x20) == 'n';
    if (have_gemv && n == 1) {          /* c[:, 0] = op(A) op(B)[:, 0] */
        blas_gemv_as<C, I>(a_n ? 'N' : 'T', a_n ? m : k, a_n ? k : m, alpha, a, lda, b, b_n ? 1 : ldb, beta, c, 1);
    } else if (have_gemv && m == 1) {   /* c[0, :] = op(B)^T op(A)[0, :] */
        blas_gemv_as<C, I>(b_n ? 'T' : 'N', b_n ? k : n, b_n ? n : k, alpha, b, ldb, a, a_n ? lda : 1, beta, c, ldc);
    } else {
        blas_gemm_as<C, I>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
}

template <typename C>
void blas_gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, C alpha, const C* a, int64_t lda, const C* b,
               int64_t ldb, C beta, C* c, int64_t ldc) {
    if (g_ilp64.load()) blas_product_as<C, int64_t>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else blas_product_as<C, int>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename C>
C_Status gemm_kernel_t(const paddle_rt_op_call* c) {
    if ((sizeof(C) == 4 && !g_sgemm.load()) || (sizeof(C) == 8 && !g_dgemm.load())) return C_ERROR;
    const GemmPlan g = gemm_plan(c);
    const paddle_rt_tensor &o = c->out, &a = c->inputs[0], &b = c->inputs[1];
    if (g.m == 0 || g.n == 0) return C_SUCCESS;
    const C alpha = (C)c->attrs[0], beta = (C)c->attrs[1];
    const int eo = prt_dtype_size(o.dtype), ea = prt_dtype_size(a.dtype), eb = prt_dtype_size(b.dtype);
    C* wa = static_cast<C*>(c->workspace);
    C* wb = reinterpret_cast<C*>(reinterpret_cast<char*>(wa) + g.ws_a);
    C* wc = reinterpret_cast<C*>(reinterpret_cast<char*>(wb) + g.ws_b);
    for (int64_t bi = 0; bi < g.batch; bi++) {
        const char* pa = static_cast<const char*>(a.data) + bi * a.strides[0] * ea;
        const char* pb = static_cast<const char*>(b.data) + bi * b.strides[0] * eb;
        char* pc = static_cast<char*>(o.data) + bi * o.strides[0] * eo;
        const C* A = (g.la & 0x20) ? reinterpret_cast<const C*>(pa) : wa;
        const C* B = (g.lb & 0x20) ? reinterpret_cast<const C*>(pb) : wb;
        C* Cm = (g.lc & 0x20) ? reinterpret_cast<C*>(pc) : wc;
        if (!(g.la & 0x20)) copy_in(pa, a.dtype, g.m, g.k, a.strides[1], a.strides[2], ea, wa);
        if (!(g.lb & 0x20)) copy_in(pb, b.dtype, g.k, g.n, b.strides[1], b.strides[2], eb, wb);
        if (!(g.lc & 0x20)) {
            if (beta != (C)0) copy_in(pc, o.dtype, g.m, g.n, o.strides[1], o.strides[2], eo, wc);
            else std::fill(wc, wc + g.m * g.n, (C)0);
        }
        if (g.k == 0) {     /* out = beta * out */
            for (int64_t i = 0; i < g.m; i++)
                for (int64_t j = 0; j < g.n; j++) {
                    C* e = (g.lc | 0x20) == 'c' ? &Cm[i + j * g.ldc] : &Cm[i * g.ldc + j];
                    *e = beta == (C)0 ? (C)0 : beta * *e;
                }
        } else if ((g.lc | 0x20) == 'r') {    /* C^T = B^T A^T, column-major */
            blas_gemm<C>((g.lb | 0x20) == 'r' ? 'N' : 'T', (g.la | 0x20) == 'r' ? 'N' : 'T', g.n, g.m, g.k, alpha, B,
                         g.ldb, A, g.lda, beta, Cm, g.ldc);
        } else {
            blas_gemm<C>((g.la | 0x20) == 'c' ? 'N' : 'T', (g.lb | 0x20) == 'c' ? 'N' : 'T', g.m, g.n, g.k, alpha, A,
                         g.lda, B, g.ldb, beta, Cm, g.ldc);
        }
        if (!(g.lc & 0x20)) copy_out(pc, o.dtype, g.m, g.n, o.strides[1], o.strides[2], eo, wc);
    }
    return C_SUCCESS;
}

C_Status gemm_kernel(const paddle_rt_op_call* c) {
    return c->dtype == FLOAT64 ? gemm_kernel_t<double>(c) : gemm_kernel_t<float>(c);
}

bool is_float(int dt) { return dt == FLOAT32 || dt == FLOAT64 || dt == FLOAT16 || dt == BFLOAT16; }
bool is_int(int dt) { return dt >= UINT8 && dt <= INT64; }

C_Status norm_dispatch(const paddle_rt_op_call* c) {
    return c->dtype == FLOAT64 ? norm_kernel<double>(c) : norm_kernel<float>(c);
}
C_Status softmax_dispatch(const paddle_rt_op_call* c) {
    return c->dtype == FLOAT64 ? causal_softmax_kernel<double>(c) : causal_softmax_kernel<float>(c);
}

}  // namespace

paddle_rt_kernel_fn prt_host_kernel(int op, int dtype) {
    switch (op) {
    case PADDLE_RT_OP_ADD: case PADDLE_RT_OP_SUB: case PADDLE_RT_OP_MUL:
        return is_float(dtype) || is_int(dtype) ? ew_kernel : nullptr;
    case PADDLE_RT_OP_SWIGLU: case PADDLE_RT_OP_RELU: case PADDLE_RT_OP_GELU: case PADDLE_RT_OP_SILU:
    case PADDLE_RT_OP_AXPBY:
        return is_float(dtype) ? ew_kernel : nullptr;
    case PADDLE_RT_OP_GEMM: return is_float(dtype) ? gemm_kernel : nullptr;
    case PADDLE_RT_OP_RMS_NORM: return is_float(dtype) ? norm_dispatch : nullptr;
    case PADDLE_RT_OP_LAYER_NORM: return is_float(dtype) ? prt_layer_norm_kernel : nullptr;
    case PADDLE_RT_OP_CAUSAL_SOFTMAX: return is_float(dtype) ? softmax_dispatch : nullptr;
    case PADDLE_RT_OP_ROPE: return is_float(dtype) ? prt_rope_kernel : nullptr;
    case PADDLE_RT_OP_ADD_RMS_NORM: return is_float(dtype) ? prt_add_rms_norm_kernel : nullptr;
    case PADDLE_RT_OP_SOFTMAX: return is_float(dtype) ? prt_softmax_kernel : nullptr;
    case PADDLE_RT_OP_SILU_AND_MUL: return is_float(dtype) ? prt_silu_and_mul_kernel : nullptr;
    case PADDLE_RT_OP_KV_CACHING: return is_float(dtype) ? prt_kv_caching_kernel : nullptr;
    case PADDLE_RT_OP_ATTENTION: return is_float(dtype) ? prt_attention_kernel : nullptr;
    case PADDLE_RT_OP_EMBEDDING: return is_float(dtype) ? prt_embedding_kernel : nullptr;
    case PADDLE_RT_OP_BATCH_ATTENTION: return is_float(dtype) ? prt_batch_attention_kernel : nullptr;
    case PADDLE_RT_OP_REARRANGE: return prt_dtype_size(dtype) > 0 && prt_dtype_size(dtype) <= 8 ? rearrange_kernel
                                                                                                : nullptr;
    case PADDLE_RT_OP_RANDOM_SAMPLE: return is_float(dtype) ? prt_random_sample_kernel : nullptr;
    default: return nullptr;
    }
}

static size_t host_workspace(const paddle_rt_op_call* c);

/* The host kernels' workspace, or PRT_MAX_BYTES (then out of memory at the descriptor's first call) when an operand is so
 * large that a kernel's workspace arithmetic could overflow: every operand's elements fit PRT_MAX_BYTES (tensor.pyx
 * check_layout), and a workspace is a few rows/copies of them in at most 8-byte elements, so operands of up to
 * 2**56 elements keep every sum below 2**63. */
size_t prt_host_workspace(const paddle_rt_op_call* c) {
    const int64_t limit = (int64_t)1 << 56;
    int64_t n;
    if (prt_numel(c->out.ndim, c->out.shape, &n) || n > limit) return (size_t)PRT_MAX_BYTES;
    for (int i = 0; i < c->n_inputs && i < PADDLE_RT_OP_MAX_INPUTS; i++)
        if (prt_numel(c->inputs[i].ndim, c->inputs[i].shape, &n) || n > limit) return (size_t)PRT_MAX_BYTES;
    return host_workspace(c);
}

static size_t host_workspace(const paddle_rt_op_call* c) {
    const size_t cs = c->dtype == FLOAT64 ? 8 : 4;
    const int64_t d = c->out.ndim > 0 ? c->out.shape[c->out.ndim - 1] : 1;
    switch (c->op) {
    case PADDLE_RT_OP_GEMM: {
        GemmPlan g = gemm_plan(c);
        return g.ws_a + g.ws_b + g.ws_c;
    }
    case PADDLE_RT_OP_RMS_NORM: return (size_t)(2 * d) * cs;
    case PADDLE_RT_OP_LAYER_NORM: return prt_layer_norm_workspace(c);
    case PADDLE_RT_OP_CAUSAL_SOFTMAX: return (size_t)d * cs;
    case PADDLE_RT_OP_ROPE: return prt_rope_workspace(c);
    case PADDLE_RT_OP_ADD_RMS_NORM: return prt_add_rms_norm_workspace(c);
    case PADDLE_RT_OP_SOFTMAX: return prt_softmax_workspace(c);
    case PADDLE_RT_OP_SILU_AND_MUL: return prt_silu_and_mul_workspace(c);
    case PADDLE_RT_OP_KV_CACHING: return prt_kv_caching_workspace(c);
    case PADDLE_RT_OP_ATTENTION: return prt_attention_workspace(c);
    case PADDLE_RT_OP_EMBEDDING: return prt_embedding_workspace(c);
    case PADDLE_RT_OP_BATCH_ATTENTION: return prt_batch_attention_workspace(c);
    case PADDLE_RT_OP_RANDOM_SAMPLE: return prt_random_sample_workspace(c);
    default: return 0;
    }
}

void prt_set_blas(void* sgemm, void* dgemm, void* sgemv, void* dgemv, int ilp64) {
    g_ilp64.store(ilp64);
    g_sgemm.store(sgemm);
    g_dgemm.store(dgemm);
    g_sgemv.store(sgemv);
    g_dgemv.store(dgemv);
}

