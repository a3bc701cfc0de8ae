"""The operators the Llama model calls, in one small layer over ``paddle_rt.ops`` (the model never calls
``paddle_rt.ops`` itself). Each function enqueues work on the current stream of the operands' device and returns
at once; nothing here reads device memory from the host.

Layouts (all row-major unless a view says otherwise):
  hidden states (seq, hidden); a projection's weight W (out, in) as stored by Hugging Face, used through its
  transposed view; q head-major (heads, seq, head_dim); the KV cache of a layer (kv_heads, capacity, head_dim).
"""
import math

from paddle_rt import ops


def embedding(table, ids, out):
    """out[i] = table[ids[i]] for the host list ``ids`` (each row a device-side copy of a view of the table: the ids
    are known on the host, nothing is read back)."""
    for i, t in enumerate(ids):
        ops.rearrange(table[t], out=out[i])
    return out


def rms_norm(x, weight, eps):
    return ops.rms_norm(x, weight, eps)


def add_rms_norm(residual, x, weight, eps):
    """residual += x (in place); returns rms_norm(residual) * weight."""
    ops.add(residual, x, out=residual)
    return ops.rms_norm(residual, weight, eps)


def linear(x, weight):
    """x (seq, in) @ weight (out, in)^T -> (seq, out); the transposed view goes to BLAS as it is."""
    return ops.gemm(x, weight.T)


def rope(x, pos_ids, sin, cos, out):
    """Rotary embedding of x (seq, heads, head_dim) at pos_ids, written into ``out`` (any layout of that shape: a
    head-major buffer or the KV cache). Hugging Face's Llama rotates (i, i + head_dim/2): the GPT-NeoX pairing."""
    return ops.rope(x, pos_ids, sin, cos, algo="gpt_neox", out=out)


def store(x, out):
    """Copy x into ``out``'s layout (the values into the KV cache)."""
    return ops.rearrange(x, out=out)


def attention(q, k, v, n_rep):
    """Causal grouped-query attention of q (heads, seq, head_dim) over k, v (kv_heads, total, head_dim), the last
    ``seq`` of the ``total`` positions being q's. Query head h reads key/value head h // n_rep, so the query heads
    of one KV head are a contiguous (n_rep * seq, head_dim) block of q: one batched gemm per product. Returns the
    output as (seq, heads * head_dim)."""
    heads, seq, hd = q.shape
    kv_heads, total = k.shape[0], k.shape[1]
    qg = q.view(kv_heads, n_rep * seq, hd)
    scores = ops.gemm(qg, k.transpose(1, 2), alpha=1.0 / math.sqrt(hd))      # (kv_heads, n_rep * seq, total)
    s3 = scores.view(heads, seq, total)
    ops.causal_softmax(s3, out=s3)
    o = ops.gemm(scores, v)                                                  # (kv_heads, n_rep * seq, hd)
    if seq == 1:
        return o.view(1, heads * hd)
    return ops.rearrange(o.view(heads, seq, hd).permute(1, 0, 2)).view(seq, heads * hd)


def silu_and_mul(gate_up, inter):
    """silu(gate) * up for gate_up (seq, 2 * inter) holding [gate | up]; swiglu(a, b) is a * b * sigmoid(b)."""
    return ops.swiglu(gate_up[:, inter:], gate_up[:, :inter])


def sample(logits, out, random_val, temperature, top_k, top_p):
    """The next token id into ``out`` (a 0-d int64 tensor): greedy (the first largest logit) at temperature 0."""
    return ops.random_sample(logits, random_val=random_val, temperature=temperature, topk=top_k, topp=top_p,
                             out=out)
