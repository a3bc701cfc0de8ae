"""The operators the Llama model calls, in one small layer over ``paddle_rt.ops`` (the model never calls
``paddle_rt.ops`` itself). Each function enqueues work on the current stream of the operands' device and returns
at once; nothing here reads device memory from the host.

Layouts (row-major unless a view says otherwise): token ids (seq,) int64 on the device; hidden states
(seq, hidden); a projection's weight W (out, in) as Hugging Face stores it, used through its transposed view; the KV
cache of a layer (kv_heads, capacity, head_dim).
"""
from paddle_rt import ccl, ops


def embedding(ids, table, vocab_start=None):
    """table[ids] for ids (seq,) on the device -> (seq, hidden). ``vocab_start``: table holds the rows
    [vocab_start, vocab_start + len(table)) of the vocabulary, other ids give zero rows (a vocabulary shard)."""
    return ops.embedding(ids, table, vocab_start=vocab_start)


def all_reduce_sum(x, comm):
    """x (contiguous) summed over the ranks of ``comm``, in place, enqueued on the device's current stream in order
    with the operators (nothing waits on the host)."""
    ccl.all_reduce(x, x, "sum", comm=comm)
    return x


def all_gather(x, out, comm):
    """out (ranks, *x.shape) = every rank's x, enqueued on the device's current stream."""
    ccl.all_gather(x, out, comm=comm)
    return out


def rearrange(x, out):
    """out = x (a strided view copied into the contiguous ``out``)."""
    return ops.rearrange(x, out=out)


def rms_norm(x, weight, eps):
    return ops.rms_norm(x, weight, eps)


def add_rms_norm(residual, x, weight, eps):
    """residual += x (in place); returns rms_norm(residual) * weight, normalised from the unrounded sum."""
    y, _ = ops.add_rms_norm(residual, x, weight, eps, residual_out=residual)
    return y


def linear(x, weight, bias=None):
    """x (seq, in) @ weight (out, in)^T (+ bias (out,)) -> (seq, out); the transposed view goes to BLAS as it is."""
    return ops.linear(x, weight, bias)


def head_rms_norm(x, weight, eps):
    """RMSNorm of every head of x (seq, heads, head_dim) over head_dim with weight (head_dim,) (Qwen3's q_norm and
    k_norm) -> a new (seq, heads, head_dim) tensor."""
    return ops.rms_norm(x, weight, eps)


def rope(x, pos_ids, sin, cos):
    """Rotary embedding of x (seq, heads, head_dim) at pos_ids (seq,), or x (batch, 1, heads, head_dim) at pos_ids
    (batch, 1) -> a new tensor of x's shape. Hugging
    Face's Llama rotates (i, i + head_dim/2) (rotate_half): the GPT-NeoX pairing."""
    return ops.rope(x, pos_ids, sin, cos, algo="gpt_neox")


def attention(q, k, v, k_cache, v_cache, pos, window=0):
    """Stores k, v (seq, kv_heads, head_dim) in the caches at [pos, pos + seq), then causal grouped-query attention
    of q (seq, heads, head_dim) over the first pos + seq cached positions (query head h reads KV head
    h // (heads / kv_heads)); with ``window`` > 0 each query reads only the last ``window`` positions up to its own
    (Mistral's sliding window). In float32 inside the kernel. Returns (seq, heads * head_dim)."""
    seq, heads, hd = q.shape
    out = ops.attention(q.permute(1, 0, 2), k.permute(1, 0, 2), v.permute(1, 0, 2), k_cache, v_cache, pos,
                        window=window)
    return out.view(seq, heads * hd)


def batch_attention(q, k, v, k_cache, v_cache, pos, window=0):
    """One decode step of a batch: stores k, v (batch, kv_heads, head_dim) in each sequence's cache (batch, kv_heads,
    capacity, head_dim) at its own position pos[b] (pos (batch,) int64 on the device), then each sequence's query
    q (batch, heads, head_dim) attends to its own cache up to there. Returns (batch, heads * head_dim)."""
    b, heads, hd = q.shape
    kv = k.shape[1]
    ops.kv_caching(k_cache, v_cache, k.view(b, kv, 1, hd), v.view(b, kv, 1, hd), pos)
    out = ops.batch_attention(q.view(b, heads, 1, hd), k_cache, v_cache, pos, window=window)
    return out.view(b, heads * hd)


def silu_and_mul(gate_up):
    """silu(gate) * up for gate_up (seq, 2 * intermediate) holding [gate | up]."""
    return ops.silu_and_mul(gate_up)


def sample(logits, out, random_val, temperature, top_k, top_p):
    """The next token id into ``out`` (a 0-d int64 tensor): greedy (the first largest logit) at temperature 0."""
    return ops.random_sample(logits, random_val=random_val, temperature=temperature, topk=top_k, topp=top_p,
                             out=out)
