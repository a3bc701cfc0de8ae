/* Overflow-checked size arithmetic: the one place where element counts, byte sizes, strides, offsets and bounds
 * that come from a user are computed. Every function returns 0 when the result is exact and 1 when it overflowed
 * (or an operand is out of its domain); the result is then unspecified and must not be used. Cython reaches these
 * through _core/checked.pxd. Header-only, no state. */
#ifndef PADDLE_RT_CHECKED_MATH_H
#define PADDLE_RT_CHECKED_MATH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest byte count a tensor or an allocation may describe: sizes stay valid int64_t/ptrdiff_t values with
 * room for alignment rounding. Larger but representable sizes are out of memory, not invalid. */
#define PRT_MAX_BYTES ((int64_t)0x7fffffffffff0000LL)

static inline int prt_mul_i64(int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); }
static inline int prt_add_i64(int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); }
static inline int prt_mul_size(size_t a, size_t b, size_t* r) { return __builtin_mul_overflow(a, b, r); }
static inline int prt_add_size(size_t a, size_t b, size_t* r) { return __builtin_add_overflow(a, b, r); }

/* x rounded up to a multiple of `align` (> 0). */
static inline int prt_round_up(size_t x, size_t align, size_t* r) {
    size_t t;
    if (align == 0 || __builtin_add_overflow(x, align - 1, &t)) return 1;
    *r = t - t % align;
    return 0;
}

/* The element count of a shape (every extent >= 0). */
static inline int prt_numel(int ndim, const int64_t* shape, int64_t* n) {
    int64_t v = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return 1;
        if (shape[i] == 0) zero = 1;
    }
    if (zero) { *n = 0; return 0; }   /* an empty shape holds nothing, whatever its other extents */
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(v, shape[i], &v)) return 1;
    *n = v;
    return 0;
}

/* numel * itemsize. */
static inline int prt_nbytes(int ndim, const int64_t* shape, int64_t itemsize, int64_t* bytes) {
    int64_t n;
    if (itemsize < 0 || prt_numel(ndim, shape, &n)) return 1;
    return __builtin_mul_overflow(n, itemsize, bytes);
}

/* The lowest and highest element offset a strided layout reaches (relative to element (0, ..., 0)); both 0 for an
 * empty layout. Fails when any partial sum overflows. */
static inline int prt_extent(int ndim, const int64_t* shape, const int64_t* strides, int64_t* lo, int64_t* hi) {
    int64_t l = 0, h = 0, step;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return 1;
        if (shape[i] == 0) { *lo = 0; *hi = 0; return 0; }
    }
    for (int i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(shape[i] - 1, strides[i], &step)) return 1;
        if (step >= 0) { if (__builtin_add_overflow(h, step, &h)) return 1; }
        else if (__builtin_add_overflow(l, step, &l)) return 1;
    }
    *lo = l;
    *hi = h;
    return 0;
}

/* The bytes a strided layout spans from its lowest to its highest element, inclusive: (hi - lo + 1) * itemsize
 * (0 for an empty layout). */
static inline int prt_span_bytes(int ndim, const int64_t* shape, const int64_t* strides, int64_t itemsize,
                                 int64_t* bytes) {
    int64_t lo, hi, n, e;
    if (prt_numel(ndim, shape, &n)) return 1;
    if (n == 0) { *bytes = 0; return 0; }
    if (prt_extent(ndim, shape, strides, &lo, &hi)) return 1;
    if (__builtin_sub_overflow(hi, lo, &e) || __builtin_add_overflow(e, (int64_t)1, &e)) return 1;
    return __builtin_mul_overflow(e, itemsize, bytes);
}

#ifdef __cplusplus
}
#endif
#endif
