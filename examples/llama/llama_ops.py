"""The operators the Llama model calls, in one small layer over ``paddle_rt.ops`` (the model never calls
``paddle_rt.ops`` itself). Each function enqueues work on the current stream of the operands' device and returns
at once; nothing here reads device memory from the host.

Layouts (row-major unless a view says otherwise): token ids (seq,) int64 on the device; hidden states
(seq, hidden); a projection's weight W (out, in) as Hugging Face stores it, used through its transposed view; the KV
cache of a layer (kv_heads, capacity, head_dim).
"""
from paddle_rt import ops


def embedding(ids, table):
    """table[ids] for ids (seq,) on the device -> (seq, hidden)."""
    return ops.embedding(ids, table)


def rms_norm(x, weight, eps):
    return ops.rms_norm(x, weight, eps)


def add_rms_norm(residual, x, weight, eps):
    """residual += x (in place); returns rms_norm(residual) * weight, normalised from the unrounded sum."""
    y, _ = ops.add_rms_norm(residual, x, weight, eps, residual_out=residual)
    return y


def linear(x, weight):
    """x (seq, in) @ weight (out, in)^T -> (seq, out); the transposed view goes to BLAS as it is."""
    return ops.gemm(x, weight.T)


def rope(x, pos_ids, sin, cos):
    """Rotary embedding of x (seq, heads, head_dim) at pos_ids -> a new (seq, heads, head_dim) tensor. Hugging
    Face's Llama rotates (i, i + head_dim/2) (rotate_half): the GPT-NeoX pairing."""
    return ops.rope(x, pos_ids, sin, cos, algo="gpt_neox")


def attention(q, k, v, k_cache, v_cache, pos):
    """Stores k, v (seq, kv_heads, head_dim) in the caches at [pos, pos + seq), then causal grouped-query attention
    of q (seq, heads, head_dim) over the first pos + seq cached positions (query head h reads KV head
    h // (heads / kv_heads)), in float32 inside the kernel. Returns (seq, heads * head_dim)."""
    seq, heads, hd = q.shape
    out = ops.attention(q.permute(1, 0, 2), k.permute(1, 0, 2), v.permute(1, 0, 2), k_cache, v_cache, pos)
    return out.view(seq, heads * hd)


def silu_and_mul(gate_up):
    """silu(gate) * up for gate_up (seq, 2 * intermediate) holding [gate | up]."""
    return ops.silu_and_mul(gate_up)


def sample(logits, out, random_val, temperature, top_k, top_p):
    """The next token id into ``out`` (a 0-d int64 tensor): greedy (the first largest logit) at temperature 0."""
    return ops.random_sample(logits, random_val=random_val, temperature=temperature, topk=top_k, topp=top_p,
                             out=out)
