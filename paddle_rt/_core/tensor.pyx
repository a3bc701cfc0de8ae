# cython: wraparound=True, boundscheck=True
# Tensors on devices: memory from the stream-ordered pool (malloc_async on a stream of the tensor's device) with a
# shape, strides in elements (signed; 0 broadcasts) and a dtype. Views (slicing, transpose, permute, view/reshape
# where the strides allow) share their base's storage. Operators (op.pyx) note on the storage which stream positions
# write it; numpy(), __array_interface__ and __dlpack__ wait for those before the host reads.
cimport cython
from cpython.ref cimport Py_INCREF, Py_DECREF
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc as c_malloc, free as c_free
from libc.string cimport memset, memcpy

from paddle_rt._core.device cimport Device, resolve_device, device_host_addressable, raise_forked
from paddle_rt._core.plugin cimport process_forked
from paddle_rt._core.stream cimport Stream, stream_of_device
from paddle_rt._core.memcpy cimport upload_async
from paddle_rt._core.pool cimport pool_malloc, default_pool_of, AsyncAllocation
from paddle_rt._core.allocation cimport dl_capsule, dl_managed_new, Allocation
from paddle_rt._core.device_ext cimport (
    BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16,
)
from paddle_rt._core.includes.dlpack cimport prt_DLManagedTensor, kDLCPU
from paddle_rt._core.includes.op_support cimport paddle_rt_tensor, prt_dtype_size
from paddle_rt._core.checked cimport (
    PRT_MAX_BYTES, prt_numel, prt_nbytes, prt_extent, prt_span_bytes, checked_mul, checked_offset,
)

import numpy as np

from paddle_rt._core import errors

# C_DataType code -> (name, numpy typestr or None, DLPack (code, bits))
_DTYPES = {
    BOOL: ("bool", "|b1", (6, 8)),
    UINT8: ("uint8", "|u1", (1, 8)), UINT16: ("uint16", "<u2", (1, 16)), UINT32: ("uint32", "<u4", (1, 32)),
    UINT64: ("uint64", "<u8", (1, 64)),
    INT8: ("int8", "|i1", (0, 8)), INT16: ("int16", "<i2", (0, 16)), INT32: ("int32", "<i4", (0, 32)),
    INT64: ("int64", "<i8", (0, 64)),
    FLOAT16: ("float16", "<f2", (2, 16)), FLOAT32: ("float32", "<f4", (2, 32)), FLOAT64: ("float64", "<f8", (2, 64)),
    BFLOAT16: ("bfloat16", "<V2", (4, 16)),
}
_BY_NAME = {v[0]: k for k, v in _DTYPES.items()}
DTYPE_NAMES = tuple(v[0] for v in _DTYPES.values())


cdef dict _CODE_OF_NP_DTYPE = {}     # numpy dtype object -> code, filled as met (dtype.name is slow Python code)


cdef int32_t dtype_code_of(object dtype) except -1:
    cdef object cached
    if type(dtype) is np.dtype or isinstance(dtype, np.dtype):
        cached = _CODE_OF_NP_DTYPE.get(dtype)
        if cached is not None:
            return cached
        code = _code_of(dtype)
        _CODE_OF_NP_DTYPE[dtype] = code
        return code
    return _code_of(dtype)


cdef int32_t _code_of(object dtype) except -1:
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in _DTYPES:
            return dtype
        raise errors.InvalidArgument(f"unknown dtype code {dtype} (C_DataType): expected one of "
                                     f"{sorted(_DTYPES)}")
    if isinstance(dtype, str):
        name = dtype
    else:
        name = getattr(dtype, "name", None) if isinstance(dtype, np.dtype) else None
        if name is None:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = getattr(dtype, "__name__", repr(dtype))
    code = _BY_NAME.get(name)
    if code is None:
        try:
            code = _BY_NAME.get(np.dtype(name).name)
        except TypeError:
            code = None
    if code is None:
        raise errors.InvalidArgument(f"unsupported dtype {dtype!r}: paddle_rt tensors hold {', '.join(DTYPE_NAMES)}")
    return code


cdef str dtype_name(int32_t code):
    return _DTYPES[code][0]


def numpy_dtype(code):
    """The numpy dtype of a C_DataType code (bfloat16 needs ml_dtypes, imported here)."""
    if code == BFLOAT16:
        try:
            import ml_dtypes
        except ImportError:
            raise errors.NotSupportedError("bfloat16 tensors need ml_dtypes on the host side: pip install ml_dtypes") \
                from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_DTYPES[code][0])


cdef int _check_shape(object shape, int64_t* out) except -1:
    cdef int n
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(shape)
    n = len(shape)
    if n > MAX_NDIM:
        raise errors.InvalidArgument(f"a tensor has at most {MAX_NDIM} dimensions, not {n} (shape {shape})")
    for i in range(n):
        out[i] = _size_operand(shape[i], f"shape {shape}", f"dimension {i}")
    return n


cdef int64_t _size_operand(object v, str where, str what) except -1:
    """A dimension or stride from a user as an int64 >= 0 (Python or numpy int), else InvalidArgument naming it."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise errors.InvalidArgument(f"{where}: {what} must be an int >= 0, not {v!r}")
    if v > INT64_MAX_PY:
        raise errors.InvalidArgument(f"{where}: {what} ({v}) does not fit a 64-bit size")
    return v


INT64_MAX_PY = (1 << 63) - 1


cdef int check_layout(str what, int ndim, const int64_t* shape, const int64_t* strides, int32_t dtype) except -1:
    """The rule every tensor layout obeys (checked arithmetic, engine/checked_math.h): its element count times the
    item size, and the bytes from its lowest to its highest element, are at most PRT_MAX_BYTES. Then every element
    offset, byte size and bound computed from the layout is exact. InvalidArgument naming `what` otherwise."""
    cdef int64_t nbytes = 0, span = 0
    cdef int64_t es = prt_dtype_size(dtype)
    cdef bint bad = prt_nbytes(ndim, shape, es, &nbytes) or nbytes > PRT_MAX_BYTES
    if not bad and strides != NULL:
        bad = prt_span_bytes(ndim, shape, strides, es, &span) or span > PRT_MAX_BYTES
    if bad:
        sh = tuple([shape[i] for i in range(ndim)])
        n = 1
        for v in sh:
            n *= v
        if strides == NULL or n * es > PRT_MAX_BYTES:
            st = "" if strides == NULL else f", strides {tuple([strides[i] for i in range(ndim)])}"
            raise errors.InvalidArgument(f"{what}: shape {sh}{st} of {_DTYPES[dtype][0]} has {n} elements of {es} "
                                         f"bytes: {_too_many_bytes(n * es)}")
        sts = tuple([strides[i] for i in range(ndim)])          # Python ints: exact
        reach = 1
        for extent, stride in zip(sh, sts):
            reach += abs((extent - 1) * stride)
        raise errors.InvalidArgument(
            f"{what}: shape {sh} with strides {sts} spans {reach} elements of "
            f"{_DTYPES[dtype][0]} ({reach * es} bytes): the offsets overflow 64-bit arithmetic")
    return 0


cdef str _too_many_bytes(object nbytes):
    """Why a layout of `nbytes` (over PRT_MAX_BYTES) is refused: past 64 bits, or more than any memory holds."""
    if nbytes >= (1 << 64):
        return f"{nbytes} bytes overflow 64-bit sizes"
    return (f"{nbytes} bytes is more memory than any device holds (a layout describes at most {PRT_MAX_BYTES} "
            f"bytes)")


cdef int _check_fits_a_device(Device dev, int ndim, const int64_t* shape, int32_t dtype, str what) except -1:
    """A factory's contiguous tensor whose byte count fits 64 bits but is over PRT_MAX_BYTES: out of memory (as
    malloc says of such a size: allocation.check_nbytes), with the device's capacity. Larger ones, and layouts wrong
    otherwise, are check_layout's InvalidArgument."""
    cdef int64_t nbytes = 0
    cdef int64_t es = prt_dtype_size(dtype)
    cdef int i
    if ndim < 0 or ndim > MAX_NDIM or (not prt_nbytes(ndim, shape, es, &nbytes) and nbytes <= PRT_MAX_BYTES):
        return 0
    n = 1
    for i in range(ndim):
        n *= shape[i]
    if n * es >= (1 << 64):
        return 0
    try:
        free_, total = dev.memory_info()
    except BaseException:
        free_, total = 0, 0
    cap = f"{dev} has a total capacity of {total} bytes" if total else f"{dev} does not report its capacity"
    where = what if what.startswith(f"{dev}:") else f"{dev}: {what}"
    raise errors.OutOfMemoryError(
        f"{where}: out of memory: shape {tuple([shape[i] for i in range(ndim)])} of {_DTYPES[dtype][0]} needs "
        f"{n * es} bytes, more memory than any device holds ({cap})", device=str(dev), requested=n * es,
        capacity=int(total) if total else None, free=int(free_) if total else None, call=what)


cdef void _contiguous_strides(int ndim, const int64_t* shape, int64_t* strides) noexcept:
    # (only for layouts whose element count check_layout accepted, or where a wrapped product is never used: the
    # caller checks the layout before it is used)
    cdef int64_t s = 1
    cdef int i
    for i in range(ndim - 1, -1, -1):
        strides[i] = s
        if checked_mul(s, shape[i] if shape[i] > 0 else 1, &s):
            s = 0


cdef class TensorDesc:
    """A tensor's layout: ``TensorDesc(shape, dtype, strides=None)``; strides in elements (0 broadcasts), default
    C-contiguous. The operator layer's tensor descriptor (InfiniOP's ``infiniopTensorDescriptor_t``)."""

    def __init__(self, shape, dtype="float32", strides=None):
        self.ndim_ = _check_shape(shape, self.shape_)
        self.dtype_code = dtype_code_of(dtype)
        if strides is None:
            _contiguous_strides(self.ndim_, self.shape_, self.strides_)
        else:
            strides = tuple(strides)
            if len(strides) != self.ndim_:
                raise errors.InvalidArgument(f"TensorDesc: {len(strides)} strides {strides} for {self.ndim_} "
                                             f"dimensions (shape {self.shape})")
            for i in range(self.ndim_):
                if not isinstance(strides[i], int):
                    raise errors.InvalidArgument(f"TensorDesc: stride {i} must be an int, not {strides[i]!r}")
                if strides[i] > INT64_MAX_PY or strides[i] < -INT64_MAX_PY:
                    raise errors.InvalidArgument(f"TensorDesc: stride {i} ({strides[i]}) does not fit 64 bits")
                self.strides_[i] = strides[i]
        check_layout("TensorDesc", self.ndim_, self.shape_, self.strides_, self.dtype_code)

    @property
    def shape(self):
        return tuple([self.shape_[i] for i in range(self.ndim_)])

    @property
    def strides(self):
        """Strides in elements."""
        return tuple([self.strides_[i] for i in range(self.ndim_)])

    @property
    def ndim(self):
        return self.ndim_

    @property
    def dtype(self):
        """The dtype's name ('float32', 'bfloat16', ...)."""
        return _DTYPES[self.dtype_code][0]

    @property
    def itemsize(self):
        return prt_dtype_size(self.dtype_code)

    @property
    def size(self):
        return self.numel()

    @property
    def nbytes(self):
        return self.numel() * prt_dtype_size(self.dtype_code)     # exact: check_layout bounds it

    def is_contiguous(self):
        cdef int64_t s = 1
        cdef int i
        for i in range(self.ndim_ - 1, -1, -1):
            if self.shape_[i] != 1 and self.strides_[i] != s:
                return False
            s *= self.shape_[i]
        return True

    @property
    def desc(self):
        """The layout alone, as a TensorDesc."""
        return new_desc(self.ndim_, self.shape_, self.strides_, self.dtype_code)

    cdef void fill(self, paddle_rt_tensor* t) noexcept:
        t.ndim = self.ndim_
        t.dtype = self.dtype_code
        memcpy(t.shape, self.shape_, sizeof(int64_t) * MAX_NDIM)
        memcpy(t.strides, self.strides_, sizeof(int64_t) * MAX_NDIM)

    cdef int64_t numel(self) noexcept:
        cdef int64_t n = 0
        prt_numel(self.ndim_, self.shape_, &n)        # never overflows: check_layout accepted the layout
        return n

    cdef bint same_layout(self, TensorDesc o) noexcept:
        if o.ndim_ != self.ndim_ or o.dtype_code != self.dtype_code:
            return False
        for i in range(self.ndim_):
            if o.shape_[i] != self.shape_[i] or (o.strides_[i] != self.strides_[i] and o.shape_[i] != 1):
                return False
        return True

    def __repr__(self):
        return f"TensorDesc(shape={self.shape}, dtype={self.dtype!r}, strides={self.strides})"


cdef int _set_layout(TensorDesc d, int ndim, const int64_t* shape, const int64_t* strides, int32_t dtype,
                     str what) except -1:
    """Fill d's layout (strides NULL: C-contiguous), after check_layout."""
    if ndim < 0 or ndim > MAX_NDIM:
        raise errors.InvalidArgument(f"{what}: a tensor has at most {MAX_NDIM} dimensions, not {ndim}")
    check_layout(what, ndim, shape, strides, dtype)
    d.ndim_ = ndim
    d.dtype_code = dtype
    memset(d.shape_, 0, sizeof(d.shape_))
    memset(d.strides_, 0, sizeof(d.strides_))
    memcpy(d.shape_, shape, sizeof(int64_t) * ndim)
    if strides == NULL:
        _contiguous_strides(ndim, shape, d.strides_)
    else:
        memcpy(d.strides_, strides, sizeof(int64_t) * ndim)
    return 0


cdef TensorDesc new_desc(int ndim, const int64_t* shape, const int64_t* strides, int32_t dtype, str what="layout"):
    cdef TensorDesc d = TensorDesc.__new__(TensorDesc)
    _set_layout(d, ndim, shape, strides, dtype, what)
    return d


@cython.final
@cython.no_gc          # holds no container a cycle could run through (memory, device, streams)
cdef class _Storage:
    cdef int note_writer(self, Stream s, uint64_t pos) except -1:
        if self.writer is None or self.writer is s:
            self.writer = s
            self.writer_pos = pos
        else:
            if self.more_writers is None:
                self.more_writers = {}
            self.more_writers[s] = pos
        return 0

    cdef int used_on(self, Stream s) except -1:
        if self.memory is None or (<AsyncAllocation>self.memory).stream is s:
            return 0
        if self.recorded is None:
            self.recorded = set()
        elif s in self.recorded:
            return 0
        self.memory.record_stream(s)
        self.recorded.add(s)
        return 0

    cdef int wait_writers(self) except -1:
        cdef Stream s
        if self.writer is None:
            return 0
        pending = [(self.writer, self.writer_pos)]
        if self.more_writers:
            pending.extend(self.more_writers.items())
        for s, pos in pending:
            if not s.closed:
                s._wait_position(pos)
                s.raise_errors(pos)
        self.writer = None
        self.more_writers = None
        return 0


cdef Tensor new_tensor(Device dev, Stream s, int ndim, const int64_t* shape, int32_t dtype, str what="tensor"):
    cdef Tensor t = Tensor.__new__(Tensor)
    cdef int64_t n = 0
    _check_fits_a_device(dev, ndim, shape, dtype, what)
    _set_layout(t, ndim, shape, NULL, dtype, what)       # checked: n * itemsize is exact below
    prt_numel(ndim, shape, &n)
    cdef _Storage st = _Storage.__new__(_Storage)
    st.device = dev
    if n > 0:
        mem = pool_malloc(default_pool_of(dev), <size_t>(n * prt_dtype_size(dtype)), s)
        st.memory = mem
        t.data = (<AsyncAllocation>mem).ptr
    t.storage = st
    return t


cdef Tensor tensor_at(Device dev, TensorDesc layout, uintptr_t ptr):
    cdef Tensor t = Tensor.__new__(Tensor)
    cdef _Storage st = _Storage.__new__(_Storage)
    st.device = dev
    _set_layout(t, layout.ndim_, layout.shape_, layout.strides_, layout.dtype_code, "tensor")
    t.storage = st
    t.data = ptr
    return t


cdef Tensor _view(Tensor base, int ndim, const int64_t* shape, const int64_t* strides, uintptr_t data,
                  str what="view"):
    cdef Tensor t = Tensor.__new__(Tensor)
    _set_layout(t, ndim, shape, strides, base.dtype_code, what)
    t.storage = base.storage
    t.data = data
    return t


@cython.no_gc          # holds only its storage
cdef class Tensor(TensorDesc):
    """Device memory with a shape, strides (elements) and dtype. Create with :func:`paddle_rt.empty`,
    :func:`paddle_rt.zeros` or :func:`paddle_rt.tensor`; operators in :mod:`paddle_rt.ops` return new ones."""

    def __init__(self, *args, **kwargs):
        raise TypeError("create tensors with paddle_rt.empty(), paddle_rt.zeros() or paddle_rt.tensor()")

    @property
    def device(self):
        return self.storage.device

    @property
    def data_ptr(self):
        """The address of element (0, ..., 0)."""
        return self.data

    def _check_host(self, what):
        if not device_host_addressable(self.storage.device):
            raise errors.NotSupportedError(f"{self.storage.device}: {what}: the device's memory is not host-"
                                           f"addressable; use Tensor.numpy() to copy it to the host")

    # ---- the host's view --------------------------------------------------------------------------------------
    def synchronize(self):
        """Wait until the operators writing this tensor's memory have run (raises their errors)."""
        self.storage.wait_writers()

    def numpy(self):
        """A numpy copy of the tensor, after the work that produces it has run."""
        if process_forked():
            raise_forked(self.storage.device)
        self.storage.wait_writers()
        dt = numpy_dtype(self.dtype_code)
        cdef int64_t n = self.numel()
        if n == 0:
            try:
                return np.empty(self.shape, dtype=dt)
            except ValueError as exc:      # numpy refuses shapes whose other extents overflow its sizes
                raise errors.InvalidArgument(f"numpy() of {self!r}: numpy cannot hold this shape ({exc})") from None
        try:
            if device_host_addressable(self.storage.device):
                if self.dtype_code == BFLOAT16:       # numpy knows bfloat16 only as ml_dtypes' type: copy the bits
                    return np.array(_HostView(self, "<u2"), copy=True).view(dt)
                return np.array(_HostView(self, _DTYPES[self.dtype_code][1]), copy=True)
            out = np.empty(self.shape, dtype=dt)
        except MemoryError:
            raise errors.OutOfMemoryError(f"host: numpy() of {self!r}: {n * prt_dtype_size(self.dtype_code)} bytes do "
                                          f"not fit in host memory", device="host",
                                          requested=n * prt_dtype_size(self.dtype_code), call="numpy") from None
        src = self if self.is_contiguous() else self.contiguous()
        (<Tensor>src).storage.wait_writers()
        from paddle_rt._core.memcpy import memcpy
        memcpy(out, (<Tensor>src).data, out.nbytes, kind="D2H", device=self.storage.device)
        return out

    @property
    def __array_interface__(self):
        self._check_host("__array_interface__")
        self.storage.wait_writers()
        return _array_interface(self, _DTYPES[self.dtype_code][1])

    def __dlpack_device__(self):
        self._check_host("__dlpack_device__")
        return (kDLCPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self._check_host("__dlpack__")
        if copy:
            raise BufferError(f"{self.storage.device}: __dlpack__(copy=True) is not supported (zero-copy export)")
        if dl_device is not None and tuple(dl_device) != (kDLCPU, 0):
            raise BufferError(f"{self.storage.device}: __dlpack__ exports to the CPU device (1, 0) only, not "
                              f"{tuple(dl_device)}")
        self.storage.wait_writers()
        return _dlpack_capsule(self)

    # ---- views ------------------------------------------------------------------------------------------------
    def __getitem__(self, key):
        cdef int64_t shape[8]
        cdef int64_t strides[8]
        cdef int nd = 0, d = 0
        cdef int64_t off = 0
        if not isinstance(key, tuple):
            key = (key,)
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        if n_real > self.ndim_:
            raise IndexError(f"{n_real} indices for a tensor of {self.ndim_} dimensions (shape {self.shape})")
        expanded = []
        for k in key:
            if k is Ellipsis:
                expanded.extend([slice(None)] * (self.ndim_ - n_real))
                n_real = self.ndim_
            else:
                expanded.append(k)
        while sum(1 for k in expanded if k is not None) < self.ndim_:
            expanded.append(slice(None))
        for k in expanded:
            if k is None:
                if nd >= MAX_NDIM:
                    raise IndexError(f"a tensor has at most {MAX_NDIM} dimensions")
                shape[nd] = 1
                strides[nd] = 0
                nd += 1
                continue
            if isinstance(k, slice):
                start, stop, step = k.indices(self.shape_[d])
                length = len(range(start, stop, step))
                if length > 0:
                    off += start * self.strides_[d]     # inside the checked extent of this layout
                shape[nd] = length
                # one element: the step is never taken (a huge step must not overflow the stride)
                strides[nd] = self.strides_[d] * step if length > 1 else self.strides_[d]
                nd += 1
            else:
                try:
                    i = k.__index__()
                except AttributeError:
                    raise IndexError(f"tensor index must be an int, a slice, None or ..., not {type(k).__name__}") \
                        from None
                extent = <object>self.shape_[d]          # compared as Python ints: any index is exact
                if i < 0:
                    i += extent
                if not 0 <= i < extent:
                    raise IndexError(f"index {k} is out of bounds for dimension {d} of size {self.shape_[d]}")
                off += i * self.strides_[d]
            d += 1
        return _view(self, nd, shape, strides, self.data + off * prt_dtype_size(self.dtype_code),
                     f"tensor[{key!r}]")

    def permute(self, *dims):
        """A view with the dimensions in the order ``dims``."""
        cdef int64_t shape[8]
        cdef int64_t strides[8]
        if len(dims) == 1 and not isinstance(dims[0], int):
            dims = tuple(dims[0])
        if sorted(dims) != list(range(self.ndim_)):
            raise errors.InvalidArgument(f"permute{tuple(dims)}: not a permutation of the {self.ndim_} dimensions "
                                         f"of shape {self.shape}")
        for i, d in enumerate(dims):
            shape[i] = self.shape_[d]
            strides[i] = self.strides_[d]
        return _view(self, self.ndim_, shape, strides, self.data)

    def transpose(self, int dim0=-2, int dim1=-1):
        """A view with dimensions ``dim0`` and ``dim1`` swapped (default: the last two)."""
        if self.ndim_ < 2 and (dim0, dim1) == (-2, -1):
            return self
        n = self.ndim_
        d0 = dim0 + n if dim0 < 0 else dim0
        d1 = dim1 + n if dim1 < 0 else dim1
        if not (0 <= d0 < n and 0 <= d1 < n):
            raise errors.InvalidArgument(f"transpose({dim0}, {dim1}): out of range for shape {self.shape}")
        dims = list(range(n))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return self.permute(*dims)

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim_)))

    def as_strided(self, shape, strides, offset=None):
        """A view of this tensor's memory with any ``shape`` and ``strides`` (in elements, >= 0; 0 and overlapping
        strides allowed), torch's ``as_strided``: ``offset`` counts elements from the start of the storage (the
        allocation this tensor and its views share; default: this tensor's own offset). Every element must lie
        inside the storage (InvalidArgument otherwise). Operators refuse an output whose elements overlap."""
        cdef int64_t sh[8]
        cdef int64_t st[8]
        cdef int64_t es = prt_dtype_size(self.dtype_code), lo = 0, hi = 0, base_ptr = 0, size = 0, off, end, numel = 0
        cdef int nd = _check_shape(shape, sh), i
        strides = tuple(strides)
        where = f"as_strided(shape={tuple(shape)}, strides={strides}, offset={offset})"
        if len(strides) != nd:
            raise errors.InvalidArgument(f"{where}: {nd} dimensions but {len(strides)} strides")
        for i in range(nd):
            st[i] = _size_operand(strides[i], where, f"the stride of dimension {i}")
        mem = self.storage.memory
        if mem is not None:
            base_ptr = (<Allocation>mem).ptr
            size = (<Allocation>mem).size
        else:
            base_ptr = self.data
        if offset is None:
            off = (<int64_t>self.data - base_ptr) // es
        elif isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
            raise errors.InvalidArgument(f"{where}: offset must be an int >= 0 (elements from the storage's start)")
        elif offset > INT64_MAX_PY:
            raise errors.InvalidArgument(f"{where}: offset {offset} is beyond the storage ({size // es} elements)")
        else:
            off = offset
        check_layout(where, nd, sh, st, self.dtype_code)
        prt_numel(nd, sh, &numel)
        if numel > 0:
            prt_extent(nd, sh, st, &lo, &hi)         # exact: check_layout bounded the span
            # the last element reached, off + hi, must lie inside the storage: (off + hi + 1) * es <= size
            if checked_offset(off, 1, hi + 1, &end) or end > size // es:
                raise errors.InvalidArgument(
                    f"{where}: the view reaches element {off + hi} of the storage, which holds {size // es} "
                    f"elements of {self.dtype} ({size} bytes): out of bounds")
        elif off > size // es:
            raise errors.InvalidArgument(f"{where}: offset {off} is beyond the storage ({size // es} elements)")
        return _view(self, nd, sh, st, <uintptr_t>(base_ptr + off * es), where)

    def expand(self, *sizes):
        """A view broadcast to ``sizes`` (torch's ``expand``): dimensions of extent 1 (and new leading ones) get
        stride 0; -1 keeps a dimension. No memory is copied; operators refuse such a view as an output."""
        cdef int64_t sh[8]
        cdef int64_t st[8]
        cdef int i, j
        if len(sizes) == 1 and not isinstance(sizes[0], (int, np.integer)):
            sizes = tuple(sizes[0])
        cdef int nd = len(sizes), lead = len(sizes) - self.ndim_
        if lead < 0 or nd > MAX_NDIM:
            raise errors.InvalidArgument(f"expand{tuple(sizes)}: shape {self.shape} has more dimensions than that"
                                         if lead < 0 else f"expand{tuple(sizes)}: at most {MAX_NDIM} dimensions")
        for i in range(nd):
            want = sizes[i]
            j = i - lead
            if isinstance(want, (int, np.integer)) and not -1 <= want <= INT64_MAX_PY:
                raise errors.InvalidArgument(f"expand{tuple(sizes)}: extent {want} of dimension {i} does not fit "
                                             f"64 bits" if want > 0 else f"expand{tuple(sizes)}: extent {want} of "
                                             f"dimension {i} is negative")
            if j < 0:
                if want < 0:
                    raise errors.InvalidArgument(f"expand{tuple(sizes)}: -1 is not allowed for a new dimension ({i})")
                if want > INT64_MAX_PY:
                    raise errors.InvalidArgument(f"expand{tuple(sizes)}: extent {want} does not fit 64 bits")
                sh[i], st[i] = want, 0
            elif want == -1 or want == self.shape_[j]:
                sh[i], st[i] = self.shape_[j], self.strides_[j]
            elif self.shape_[j] == 1 and 0 <= want <= INT64_MAX_PY:
                sh[i], st[i] = want, 0
            else:
                raise errors.InvalidArgument(f"expand{tuple(sizes)}: dimension {j} of shape {self.shape} has extent "
                                             f"{self.shape_[j]}, which expands only from 1 (to {want})")
        return _view(self, nd, sh, st, self.data, f"expand{tuple(sizes)}")

    def view(self, *shape):
        """A view with another shape over the same memory; raises InvalidArgument when the strides do not allow
        it (use :meth:`reshape`, which copies then)."""
        r = self._view_or_none(shape)
        if r is None:
            raise errors.InvalidArgument(f"view{self._shape_arg(shape)}: the strides {self.strides} of shape "
                                         f"{self.shape} do not allow a view; use reshape() (it copies)")
        return r

    def reshape(self, *shape):
        """A view when the strides allow it, else a contiguous copy with the new shape."""
        r = self._view_or_none(shape)
        return r if r is not None else self.contiguous()._view_or_none(shape)

    def _shape_arg(self, shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        shape = list(shape)
        n = self.numel()
        if shape.count(-1) > 1:
            raise errors.InvalidArgument(f"view/reshape: at most one -1 in {tuple(shape)}")
        if -1 in shape:
            rest = 1
            for s in shape:
                if s != -1:
                    rest *= s
            shape[shape.index(-1)] = n // rest if rest else 0
        total = 1
        for s in shape:
            total *= s
        if total != n:
            raise errors.InvalidArgument(f"view/reshape: shape {tuple(shape)} has {total} elements, the tensor "
                                         f"{n} (shape {self.shape})")
        return tuple(shape)

    def _view_or_none(self, shape):
        """The view with `shape` over this memory, or None when the strides do not allow one (the rule of
        PyTorch's computeStride: each run of old dimensions that is contiguous in itself maps onto new ones)."""
        cdef int64_t nshape[8]
        cdef int64_t nstr[8]
        shape = self._shape_arg(shape)
        cdef int nd = _check_shape(shape, nshape)
        if self.numel() == 0:
            _contiguous_strides(nd, nshape, nstr)
            return _view(self, nd, nshape, nstr, self.data)
        old_shape = list(self.shape) or [1]
        old_str = list(self.strides) or [1]
        view_d = nd - 1
        base = old_str[-1]
        t_numel = 1
        v_numel = 1
        for td in range(len(old_shape) - 1, -1, -1):
            t_numel *= old_shape[td]
            if td == 0 or (old_shape[td - 1] != 1 and old_str[td - 1] != t_numel * base):
                while view_d >= 0 and (v_numel < t_numel or nshape[view_d] == 1):
                    nstr[view_d] = v_numel * base
                    v_numel *= nshape[view_d]
                    view_d -= 1
                if v_numel != t_numel:
                    return None
                if td > 0:
                    base = old_str[td - 1]
                    t_numel = 1
                    v_numel = 1
        if view_d != -1:
            return None
        return _view(self, nd, nshape, nstr, self.data)

    def contiguous(self):
        """This tensor when it is C-contiguous, else a contiguous copy (rearrange on the current stream)."""
        if self.is_contiguous():
            return self
        if _contiguous_copy is None:
            raise errors.NotSupportedError(f"{self.storage.device}: Tensor.contiguous: the operators "
                                           f"(paddle_rt._core.ops) are not loaded; import paddle_rt first")
        return _contiguous_copy(self)

    def to(self, device):
        """The tensor on ``device`` (this one when it is there already)."""
        dev = resolve_device(device)
        if dev is self.storage.device:
            return self
        return tensor(self.numpy(), device=dev)

    def __len__(self):
        if self.ndim_ == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape_[0]

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype!r}, device={self.storage.device})"


# The copy behind Tensor.contiguous (ops.rearrange), registered by paddle_rt._core.ops at its import: the operator
# layer lives above this module, which imports nothing of it.
_contiguous_copy = None


def register_contiguous_copy(fn):
    """Called once by paddle_rt._core.ops at its import: ``fn(tensor)`` returns a C-contiguous copy."""
    global _contiguous_copy
    _contiguous_copy = fn


@cython.final
cdef class _HostView:
    """The tensor's memory as a numpy-readable object (host-addressable devices)."""
    cdef readonly dict __array_interface__
    cdef Tensor owner

    def __cinit__(self, Tensor t, str typestr):
        self.owner = t
        self.__array_interface__ = _array_interface(t, typestr)


cdef dict _array_interface(Tensor t, str typestr):
    cdef int es = prt_dtype_size(t.dtype_code)
    return {"shape": t.shape, "typestr": typestr, "data": (t.data, False), "version": 3,
            "strides": tuple([t.strides_[i] * es for i in range(t.ndim_)])}


# ---- DLPack --------------------------------------------------------------------------------------------------------
cdef object _dlpack_capsule(Tensor t):
    code, bits = _DTYPES[t.dtype_code][2]
    return dl_capsule(dl_managed_new(<void*>t.data, t.ndim_, t.shape_, t.strides_, code, bits, t, _dl_deleter))


cdef void _dl_deleter(prt_DLManagedTensor* m) noexcept with gil:
    Py_DECREF(<object>m.manager_ctx)
    c_free(m)


# ---- factories -----------------------------------------------------------------------------------------------------
cdef Stream _stream_for(object device, object stream):
    if stream is not None:
        if not isinstance(stream, Stream):
            raise errors.InvalidArgument(f"stream must be a paddle_rt Stream, not {type(stream).__name__}")
        if device is not None and resolve_device(device) is not (<Stream>stream).device:
            raise errors.InvalidArgument(f"stream {(<Stream>stream).name} is not a stream of {device}")
        return stream
    return stream_of_device(resolve_device(device))


def empty(shape, dtype="float32", device=None, stream=None):
    """An uninitialised contiguous tensor on ``device`` (default: the current device), allocated ordered on
    ``stream`` (default: the device's current stream)."""
    cdef int64_t sh[8]
    cdef int nd = _check_shape(shape, sh)
    cdef int32_t code = dtype_code_of(dtype)
    cdef Stream s = _stream_for(device, stream)
    return new_tensor(s.device, s, nd, sh, code, "empty")


def zeros(shape, dtype="float32", device=None, stream=None):
    """A contiguous tensor of zeros (memset ordered on ``stream``)."""
    cdef Tensor t = empty(shape, dtype, device, stream)
    cdef Stream s = _stream_for(device, stream)
    if t.storage.memory is not None:
        from paddle_rt._core.memcpy import memset_async
        memset_async(t.data, 0, t.numel() * prt_dtype_size(t.dtype_code), stream=s)
        t.storage.note_writer(s, s.position)
    return t


def tensor(data, dtype=None, device=None, stream=None):
    """A tensor holding a copy of ``data`` (anything numpy.asarray takes; bfloat16 through ml_dtypes), copied
    ordered on ``stream`` (data up to memcpy.STAGE_MAX_BYTES is staged at once; larger host data stays referenced
    until the copy ran)."""
    cdef int32_t code
    cdef int64_t sh[8]
    if isinstance(data, Tensor):
        data = (<Tensor>data).numpy()
    arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=numpy_dtype(dtype_code_of(dtype)))
    code = dtype_code_of(arr.dtype)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")      # (np.ascontiguousarray would turn a 0-d array into 1-d)
    cdef int nd = _check_shape(arr.shape, sh)
    cdef Stream s = _stream_for(device, stream)
    cdef Tensor t = new_tensor(s.device, s, nd, sh, code)
    if t.storage.memory is not None:
        upload_async(s, t.data, arr, arr.nbytes)
        t.storage.note_writer(s, s.position)
    return t


def as_strided(t, shape, strides, offset=None):
    """``paddle_rt.as_strided(t, shape, strides, offset=None)``: :meth:`Tensor.as_strided` (torch's meaning: any
    strides >= 0 including 0 and overlapping ones; ``offset`` in elements from the start of t's storage, default
    t's own; checked against the storage's bounds)."""
    if not isinstance(t, Tensor):
        raise errors.InvalidArgument(f"as_strided: t must be a paddle_rt Tensor, not {type(t).__name__}")
    return t.as_strided(shape, strides, offset)
