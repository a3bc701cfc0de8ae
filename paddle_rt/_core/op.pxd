# The operator layer (op.pyx): InfiniOP's shape. A Handle per device; for every operator a descriptor
# (op_descriptors.pyx) that checks the layouts once, picks the kernel and says its workspace; calling it enqueues the
# kernel on a stream. Kernels come from, in order: paddle_rt.op.register_kernel (run time), the plugin's
# paddle_rt_ext_register_kernels export, the plugin's blas_axpby hook (axpby), paddle_rt's host kernels
# (host-addressable devices).
#
# C API for Cython users (cimport paddle_rt._core.op):
#   op_register_kernel(op, device_type, dtype, fn, ws, source)   register a kernel (with the GIL)
#   OpDescriptor.launch(out, ins, workspace, stream, attrs)      enqueue one call (with the GIL; returns the position)
from libc.stdint cimport int32_t, uint64_t, uintptr_t
from paddle_rt._core.device cimport Device
from paddle_rt._core.stream cimport Stream
from paddle_rt._core.tensor cimport TensorDesc, Tensor
from paddle_rt._core.includes.op_support cimport paddle_rt_op_call, paddle_rt_kernel_fn, paddle_rt_workspace_fn

cdef enum:                       # what runs an operator call besides a kernel function
    HOOK_NONE = 0
    HOOK_AXPBY = 1               # the plugin's blas_axpby

cdef class Handle:
    cdef readonly Device device
    cdef readonly bint closed
    cdef int check_open(self) except -1


cdef class OpDescriptor:
    cdef readonly Handle handle
    cdef readonly str name
    cdef paddle_rt_op_call call          # the layouts and attributes (data pointers filled per call)
    cdef TensorDesc out_desc
    cdef tuple in_descs
    cdef paddle_rt_kernel_fn kernel
    cdef int hook
    cdef bint plugin_kernel              # may enqueue device work on the plugin stream (returns before it ran)
    cdef readonly size_t workspace_size
    cdef readonly str kernel_source      # "registered", "plugin", "hook", "host"
    cdef readonly bint destroyed
    cdef bytes _cname                    # the op's name for error records (nogil; module-lifetime bytes)
    cdef uint64_t _generation            # the kernel registry's generation when the kernel was picked

    # Fill call.op/dtype/n_inputs and the layouts (`out`, `ins`: what calls must pass; `layouts`, `out_layout`
    # (default: out): what the kernel sees, e.g. broadcast to out's dimensions), pick the kernel and compute the workspace. Raises NotSupportedError when no kernel serves (op, dtype, device type).
    cdef int setup(self, Handle h, int op, int32_t dtype, TensorDesc out, tuple ins, tuple layouts,
                   TensorDesc out_layout=*) except -1
    # Enqueue one call on `s`; attrs (or NULL) replaces call.attrs for this call. Returns the stream position.
    cdef uint64_t launch(self, Tensor out, tuple ins, object workspace, Stream s, const double* attrs) except 0
    cdef int _pick_kernel(self, Device dev, int op, int32_t dtype) except -1
    cdef int _check_operand(self, object t, TensorDesc want, int index, Device dev) except -1   # index -1: out
    cdef uintptr_t _user_workspace(self, object workspace, Device dev, Stream s) except? 0


cdef int op_register_kernel(int op, str device_type, int32_t dtype, paddle_rt_kernel_fn fn,
                            paddle_rt_workspace_fn ws, str source) except -1
cdef Stream op_stream(Device dev, object stream)
