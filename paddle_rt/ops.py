"""Operators on :class:`paddle_rt.Tensor`: one function per operator, each returning its output tensor
(allocated on the op's stream when ``out`` is None) after enqueueing the operator on ``stream`` (default: the current
stream of the operands' device). Descriptors are cached by (op, shapes, strides, dtypes, attributes)."""
from paddle_rt._core.ops import (  # noqa: F401
    add, sub, mul, gemm, rms_norm, layer_norm, causal_softmax, swiglu, rope, rearrange, relu, gelu, silu,
    random_sample, axpby, cache_info, clear_cache, CACHE_LIMIT,
    add_rms_norm, softmax, silu_and_mul, kv_caching, attention, embedding, batch_attention, linear,
)

__all__ = [
    "add", "sub", "mul", "gemm", "rms_norm", "layer_norm", "causal_softmax", "swiglu", "rope", "rearrange", "relu",
    "gelu", "silu", "random_sample", "axpby", "cache_info", "clear_cache",
    "add_rms_norm", "softmax", "silu_and_mul", "kv_caching", "attention", "embedding", "batch_attention",
    "linear",
]
