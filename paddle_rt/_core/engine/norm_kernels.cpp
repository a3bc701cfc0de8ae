/* The norm family's kernels in their own file: layer_norm and add_rms_norm (InfiniCore's AddRMSNorm). rms_norm
 * stays with the row ops in op_kernels.cpp.
 *
 * layer_norm: out = (x - mean) / sqrt(var + eps) * w (+ b) over the last axis, var the biased variance.
 * add_rms_norm: residual_out = a + b rounded to its dtype; y = (a + b) / sqrt(mean((a + b)^2) + eps) * weight from
 * the unrounded sum, over the last axis. A row is read whole before anything of it is written, so y or residual_out
 * may be a or b themselves (in place).
 *
 * Both split their rows over the host thread pool (engine/host_parallel.h); one thread computes a whole row with the
 * same arithmetic at any thread count, so results do not depend on it. A float32 row with unit stride is read and
 * written where it is; other dtypes and strides go through a per-thread row of the compute type (float for
 * float32/float16/bfloat16, double for float64).
 *
 * Row reductions (sum, sum of squares) accumulate in kLanes interleaved partial sums of the compute type, added
 * pairwise at the end: the compiler vectorises the loop (one running sum cannot be reordered without -ffast-math).
 * Each lane sums about n / kLanes terms in order, so the rounding error of a sum of n terms t is at most about
 * (n / kLanes + log2(kLanes)) * u * sum|t| (u = 2^-24 for float, 2^-53 for double).
 *
 * layer_norm's statistics take two passes over the row, the second one from cache (a row of up to ~8 K floats stays
 * in L1/L2 after the first): the mean, kept as s + m with s = x[0] and m = mean(x - s), then the sum of squared
 * deviations (x - s) - m; the output is ((x - s) - m) * r * w + b. x - s is exact (Sterbenz) for values within a
 * factor of 2 of s, so the error bound above applies to sum|x - s|, not to sum|x|, and the mean is never rounded
 * to the precision of |x| (a float32 row 1e4 + N(0, 1) gets its deviations to ~1e-6, not to ulp(1e4) ~ 1e-3).
 * Unlike a one-pass
 * sum-and-sum-of-squares it does not cancel when |mean| >> the spread (x = 1e4 + N(0, 1) in float32 loses every
 * digit of the variance with E[x^2] - E[x]^2, none here); the normalise pass is fused with the weight and the bias.
 * Loops read locals and __restrict pointers: with -fno-strict-aliasing (Python's CFLAGS) a store through a float
 * pointer could otherwise alias a captured reference, and the loop would reload it and not vectorise. */
#include <math.h>

#include <atomic>

#include "engine/host_float.h"
#include "engine/host_parallel.h"
#include "engine/op_families.h"

using namespace prt_host;

namespace {

constexpr int kLanes = 16;
/* Elements of work per chunk of the pool: below it a call runs on its stream's worker alone. */
constexpr int64_t kGrainElems = 32768;

/* sum of (x[i] - m) */
template <typename C>
inline C lane_sum(const C* __restrict x, int64_t n, C m) {
    C acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; j++) acc[j] += x[i + j] - m;
    for (int j = 0; i < n; i++, j++) acc[j] += x[i] - m;
    for (int w = kLanes / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* sum of ((x[i] - s) - m)^2 */
template <typename C>
inline C lane_sq_sum(const C* __restrict x, int64_t n, C s, C m) {
    C acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; j++) {
            const C t = (x[i + j] - s) - m;
            acc[j] += t * t;
        }
    for (int j = 0; i < n; i++, j++) {
        const C t = (x[i] - s) - m;
        acc[j] += t * t;
    }
    for (int w = kLanes / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* The element offset of row r (every dimension but the last, row-major) of t. */
inline int64_t row_offset(const paddle_rt_tensor& t, const int64_t* shape, int nd, int64_t r) {
    int64_t off = 0;
    for (int d = nd - 2; d >= 0; d--) {
        off += (r % shape[d]) * t.strides[d];
        r /= shape[d];
    }
    return off;
}

inline int64_t rows_of(const paddle_rt_tensor& t) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < t.ndim; d++) rows *= t.shape[d];
    return rows;
}

inline char* row_ptr(const paddle_rt_tensor& t, const int64_t* shape, int nd, int64_t r) {
    return static_cast<char*>(t.data) + row_offset(t, shape, nd, r) * esize(t.dtype);
}

/* y = (x - mean) * r * w + b */
template <typename C>
inline void ln_row(const C* __restrict x, C* __restrict y, const C* __restrict w, const C* __restrict b, int64_t n,
                   C eps) {
    const C s = x[0];                              /* the mean is s + m, never rounded as one number */
    const C m = lane_sum(x, n, s) / (C)n;
    const C r = (C)1 / std::sqrt(lane_sq_sum(x, n, s, m) / (C)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - s) - m) * r * w[i] + b[i];
}

template <typename C>
C_Status layer_norm(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &y = c->out, &x = c->inputs[0], &wt = c->inputs[1];
    const int nd = y.ndim;
    const int64_t d = y.shape[nd - 1];
    C* w = static_cast<C*>(c->workspace);     /* the weight and bias rows, read by every thread */
    C* b = w + d;
    read_row<C>(wt.data, wt.dtype, wt.strides[0], d, w);
    if (c->n_inputs > 2) read_row<C>(c->inputs[2].data, c->inputs[2].dtype, c->inputs[2].strides[0], d, b);
    else for (int64_t i = 0; i < d; i++) b[i] = 0;   /* no bias */
    const C eps = (C)c->attrs[0];
    const bool direct = std::is_same<C, float>::value && x.dtype == FLOAT32 && y.dtype == FLOAT32 &&
                        x.strides[nd - 1] == 1 && y.strides[nd - 1] == 1;
    std::atomic<int> failed{0};
    prt::parallel_for(rows_of(y), std::max<int64_t>(1, kGrainElems / std::max<int64_t>(d, 1)),
                      [&](int64_t r0, int64_t r1) {
        const C* __restrict wl = w;
        const C* __restrict bl = b;
        const int64_t n = d;
        const C e = eps;
        if (direct) {
            for (int64_t r = r0; r < r1; r++)
                ln_row<C>(reinterpret_cast<const C*>(row_ptr(x, y.shape, nd, r)),
                          reinterpret_cast<C*>(row_ptr(y, y.shape, nd, r)), wl, bl, n, e);
            return;
        }
        C* t = static_cast<C*>(prt_parallel_scratch((size_t)(2 * n) * sizeof(C)));   /* this thread's rows */
        if (!t) {
            failed.store(1);
            return;
        }
        for (int64_t r = r0; r < r1; r++) {
            read_row<C>(row_ptr(x, y.shape, nd, r), x.dtype, x.strides[nd - 1], n, t);
            ln_row<C>(t, t + n, wl, bl, n, e);
            write_row<C>(row_ptr(y, y.shape, nd, r), y.dtype, y.strides[nd - 1], n, t + n);
        }
    });
    return failed.load() ? C_ERROR : C_SUCCESS;
}

template <typename C>
C_Status add_rms_norm(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &y = c->out, &res = c->inputs[0], &a = c->inputs[1], &b = c->inputs[2],
                           &wt = c->inputs[3];
    const int nd = y.ndim;
    const int64_t d = y.shape[nd - 1];
    C* w = static_cast<C*>(c->workspace);
    read_row<C>(wt.data, wt.dtype, wt.strides[0], d, w);
    const C eps = (C)c->attrs[0];
    const bool f32 = std::is_same<C, float>::value;
    const bool direct_in = f32 && a.dtype == FLOAT32 && b.dtype == FLOAT32 && a.strides[nd - 1] == 1 &&
                           b.strides[nd - 1] == 1;
    const bool direct_y = f32 && y.dtype == FLOAT32 && y.strides[nd - 1] == 1;
    std::atomic<int> failed{0};
    prt::parallel_for(rows_of(y), std::max<int64_t>(1, kGrainElems / std::max<int64_t>(d, 1)),
                      [&](int64_t r0, int64_t r1) {
        const C* __restrict wl = w;
        const int64_t n = d;
        const C e = eps;
        C* s = static_cast<C*>(prt_parallel_scratch((size_t)(2 * n) * sizeof(C)));   /* the sum, a scratch row */
        if (!s) {
            failed.store(1);
            return;
        }
        C* __restrict sl = s;
        C* __restrict tl = s + n;
        for (int64_t r = r0; r < r1; r++) {
            if (direct_in) {
                const C* __restrict pa = reinterpret_cast<const C*>(row_ptr(a, y.shape, nd, r));
                const C* __restrict pb = reinterpret_cast<const C*>(row_ptr(b, y.shape, nd, r));
                for (int64_t i = 0; i < n; i++) sl[i] = pa[i] + pb[i];
            } else {
                read_row<C>(row_ptr(a, y.shape, nd, r), a.dtype, a.strides[nd - 1], n, sl);
                read_row<C>(row_ptr(b, y.shape, nd, r), b.dtype, b.strides[nd - 1], n, tl);
                for (int64_t i = 0; i < n; i++) sl[i] += tl[i];
            }
            /* the whole row is read: a and b may be written now */
            write_row<C>(row_ptr(res, y.shape, nd, r), res.dtype, res.strides[nd - 1], n, sl);
            const C rr = (C)1 / std::sqrt(lane_sq_sum(sl, n, (C)0, (C)0) / (C)n + e);
            C* __restrict out = direct_y ? reinterpret_cast<C*>(row_ptr(y, y.shape, nd, r)) : tl;
            for (int64_t i = 0; i < n; i++) out[i] = sl[i] * rr * wl[i];
            if (!direct_y) write_row<C>(row_ptr(y, y.shape, nd, r), y.dtype, y.strides[nd - 1], n, tl);
        }
    });
    return failed.load() ? C_ERROR : C_SUCCESS;
}

}  // namespace

C_Status prt_layer_norm_kernel(const paddle_rt_op_call* c) {
    return by_compute_type(c, [c](auto t) { return layer_norm<decltype(t)>(c); });
}

size_t prt_layer_norm_workspace(const paddle_rt_op_call* c) {
    return last_dim_rows_workspace(c, 2);
}

C_Status prt_add_rms_norm_kernel(const paddle_rt_op_call* c) {
    return by_compute_type(c, [c](auto t) { return add_rms_norm<decltype(t)>(c); });
}

size_t prt_add_rms_norm_workspace(const paddle_rt_op_call* c) {
    return last_dim_rows_workspace(c, 1);
}
