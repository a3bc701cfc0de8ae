# Overflow-checked size arithmetic for Cython (engine/checked_math.h): the functions return 1 when the result
# overflowed (then unusable), 0 when it is exact. Every size, count, stride, offset and bound that comes from a user
# is computed through these; the policy (which exception, naming which operand) stays with the caller, see
# tensor.pyx check_layout and allocation.pyx _check_nbytes.
from libc.stdint cimport int64_t

cdef extern from "engine/checked_math.h" nogil:
    const int64_t PRT_MAX_BYTES     # the largest byte count a tensor or allocation may describe
    bint prt_mul_i64(int64_t a, int64_t b, int64_t* r) noexcept
    bint prt_add_i64(int64_t a, int64_t b, int64_t* r) noexcept
    bint prt_mul_size(size_t a, size_t b, size_t* r) noexcept
    bint prt_add_size(size_t a, size_t b, size_t* r) noexcept
    bint prt_round_up(size_t x, size_t align, size_t* r) noexcept
    bint prt_numel(int ndim, const int64_t* shape, int64_t* n) noexcept
    bint prt_nbytes(int ndim, const int64_t* shape, int64_t itemsize, int64_t* nbytes) noexcept
    bint prt_extent(int ndim, const int64_t* shape, const int64_t* strides, int64_t* lo, int64_t* hi) noexcept
    bint prt_span_bytes(int ndim, const int64_t* shape, const int64_t* strides, int64_t itemsize,
                        int64_t* nbytes) noexcept


cdef inline bint checked_mul(int64_t a, int64_t b, int64_t* r) noexcept nogil:
    return prt_mul_i64(a, b, r)


cdef inline bint checked_add(int64_t a, int64_t b, int64_t* r) noexcept nogil:
    return prt_add_i64(a, b, r)


# The element offset of an index into one dimension (start * stride + off), checked.
cdef inline bint checked_offset(int64_t off, int64_t index, int64_t stride, int64_t* r) noexcept nogil:
    cdef int64_t step
    if prt_mul_i64(index, stride, &step):
        return 1
    return prt_add_i64(off, step, r)
