"""The operator layer in InfiniOP's shape: a :class:`Handle` per device, :class:`TensorDesc` layouts, and for every
operator a descriptor that checks the layouts once, says its ``workspace_size`` and, when called, enqueues the
operator on a stream::

    h = paddle_rt.op.Handle("rt_cpu:0")
    d = paddle_rt.op.AddDescriptor(h, out, a, b)     # TensorDescs or Tensors
    d(out, a, b, stream=s)                           # returns at once; workspace from the stream-ordered pool
    d.destroy()

Kernels: :func:`register_kernel` (run time), the plugin's ``paddle_rt_ext_register_kernels`` export
(``paddle_rt/extension.h``), the plugin's ``blas_axpby`` hook (``AxpbyDescriptor``), and paddle_rt's host kernels on
host-addressable devices; :func:`register_triton` makes a Triton kernel an operator's kernel (``paddle_rt.triton``).
See :mod:`paddle_rt.ops` for the functions on tensors.
"""
from paddle_rt._core.tensor import TensorDesc, DTYPE_NAMES  # noqa: F401
from paddle_rt._core.op import (  # noqa: F401
    Handle, OpDescriptor, register_kernel, unregister_kernel, kernels, blas_info, OP_IDS,
    get_num_threads, set_num_threads, host_threads_info,
)
from paddle_rt._core.op_descriptors import (  # noqa: F401
    AddDescriptor, SubDescriptor, MulDescriptor, SwiGLUDescriptor, ReluDescriptor, SiluDescriptor, GeluDescriptor,
    RearrangeDescriptor, AxpbyDescriptor, GemmDescriptor, RMSNormDescriptor, LayerNormDescriptor,
    CausalSoftmaxDescriptor, RoPEDescriptor, RandomSampleDescriptor,
    AddRMSNormDescriptor, SoftmaxDescriptor, SiluAndMulDescriptor, KVCachingDescriptor, AttentionDescriptor,
    EmbeddingDescriptor, BatchAttentionDescriptor,
)



def register_triton(op_name, device_type, dtype, kernel, grid_fn):
    """Make the ``@triton.jit`` ``kernel`` the kernel of operator ``op_name`` in ``dtype`` on devices of
    ``device_type`` (host-addressable: Triton's interpreter runs it), so ``paddle_rt.ops`` and the descriptors run
    it. Each call runs ``grid, args[, meta] = grid_fn(out, *inputs, attrs=attrs)`` then ``kernel[grid](*args,
    **meta)`` on torch views of the operands; precedence and removal as :func:`register_kernel`. Needs the
    ``triton`` extra; see :func:`paddle_rt.triton.register_op`."""
    from paddle_rt import triton as _triton
    _triton.register_op(op_name, device_type, dtype, kernel, grid_fn)


__all__ = [
    "Handle", "TensorDesc", "OpDescriptor", "register_kernel", "unregister_kernel", "register_triton", "kernels",
    "blas_info", "OP_IDS", "get_num_threads", "set_num_threads", "host_threads_info",
    "DTYPE_NAMES", "AddDescriptor", "SubDescriptor", "MulDescriptor", "SwiGLUDescriptor", "ReluDescriptor",
    "SiluDescriptor", "GeluDescriptor", "RearrangeDescriptor", "AxpbyDescriptor", "GemmDescriptor",
    "RMSNormDescriptor", "LayerNormDescriptor", "CausalSoftmaxDescriptor", "RoPEDescriptor",
    "RandomSampleDescriptor",
    "AddRMSNormDescriptor", "SoftmaxDescriptor", "SiluAndMulDescriptor", "KVCachingDescriptor",
    "AttentionDescriptor", "EmbeddingDescriptor", "BatchAttentionDescriptor",
]
