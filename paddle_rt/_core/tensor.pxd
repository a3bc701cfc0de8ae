# Tensors on devices (tensor.pyx): memory from the stream-ordered pool plus shape, strides (in elements) and dtype.
# TensorDesc is the layout alone (the operator layer's tensor descriptor). Views share the _Storage of their base.
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream
from paddle_rt._core.includes.op_support cimport paddle_rt_tensor

cdef enum:
    MAX_NDIM = 8

cdef class TensorDesc:
    cdef int32_t dtype_code          # a C_DataType
    cdef int ndim_
    cdef int64_t shape_[8]
    cdef int64_t strides_[8]
    cdef void fill(self, paddle_rt_tensor* t) noexcept
    cdef int64_t numel(self) noexcept
    cdef bint same_layout(self, TensorDesc other) noexcept


# The memory of a tensor and its views, with the stream operations that write it still in flight.
cdef class _Storage:
    cdef readonly object memory       # the Allocation (None for zero bytes)
    cdef readonly Device device
    cdef Stream writer                # the stream of the latest op writing this memory (None: none pending)
    cdef uint64_t writer_pos          # ... and its position there
    cdef dict more_writers            # {Stream: position} of writers on further streams (None: none)
    cdef set recorded                 # streams other than its own that operators used it on (record_stream'd)
    cdef int note_writer(self, Stream s, uint64_t pos) except -1
    cdef int wait_writers(self) except -1
    # The memory is used by work on `s`: when `s` is not the stream it was allocated on, its free waits for the
    # work `s` has been given so far (record_stream).
    cdef int used_on(self, Stream s) except -1


cdef class Tensor(TensorDesc):
    cdef readonly _Storage storage
    cdef uintptr_t data               # address of element (0, ..., 0)
    cdef object __weakref__


# dtype helpers (numpy dtypes, names and C_DataType codes)
cdef int32_t dtype_code_of(object dtype) except -1
cdef str dtype_name(int32_t code)
# A new contiguous tensor allocated on stream `s` (its device).
# Every layout passes check_layout (its byte size and span fit 64-bit arithmetic; InvalidArgument naming `what`).
cdef Tensor new_tensor(Device dev, Stream s, int ndim, const int64_t* shape, int32_t dtype, str what=*)
cdef TensorDesc new_desc(int ndim, const int64_t* shape, const int64_t* strides, int32_t dtype, str what=*)
cdef int check_layout(str what, int ndim, const int64_t* shape, const int64_t* strides, int32_t dtype) except -1
# A tensor with `layout`'s shape, strides and dtype at address `ptr` on `dev`, owning no memory (InfiniOP's calling
# shape: raw device pointers laid out as a descriptor's TensorDesc).
cdef Tensor tensor_at(Device dev, TensorDesc layout, uintptr_t ptr)
