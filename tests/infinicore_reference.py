"""float64 numpy references of InfiniCore's operator definitions (test/infiniop/*.py in InfiniTensor/InfiniCore,
re-expressed in numpy: the facts, not their code), shared by tests/test_ops_llm.py and tests/test_infiniop_cases.py."""
import numpy as np

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:       # the tests that need it skip
    BF16 = None


def np_dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def f64(x):
    return np.asarray(x, dtype=np.float64)


def silu(x):
    return x / (1.0 + np.exp(-x))


def rms_norm(x, w, eps):
    x = f64(x)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * f64(w)


def add_rms_norm(a, b, w, eps):
    """(y, residual): y from the unrounded sum (InfiniCore's reference sums in float32 and normalises that)."""
    s = f64(a) + f64(b)
    return rms_norm(s, w, eps), s


def layer_norm(x, w, b, eps):
    x = f64(x)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    y = (x - m) / np.sqrt(v + eps) * f64(w)
    return y if b is None else y + f64(b)


def softmax(x, axis):
    x = f64(x)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def causal_softmax(x):
    """Softmax over the last axis of (..., n, total), position j of row i kept iff j <= i + total - n."""
    x = f64(x).copy()
    n, total = x.shape[-2], x.shape[-1]
    mask = np.arange(total)[None, :] > (np.arange(n)[:, None] + total - n)
    x[..., mask] = -np.inf
    return softmax(x, -1)


def silu_and_mul(x):
    x = f64(x)
    d = x.shape[-1] // 2
    return silu(x[..., :d]) * x[..., d:]


def rope_tables(pos, dim, theta=1e5):
    """InfiniCore's rope test tables: angle = pos * theta ** (-2i / dim), i < dim / 2."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2)[: dim // 2] / dim)
    ang = np.outer(np.asarray(pos, np.float64), freqs)
    return np.sin(ang), np.cos(ang)


def rope(x, pos, sin, cos, algo):
    """x (seq, heads, dim) or (batch, seq, heads, dim); pos (seq,) or (batch, seq); tables (max_pos, dim/2)."""
    x = f64(x)
    s, c = f64(sin)[np.asarray(pos)], f64(cos)[np.asarray(pos)]     # (..., seq, half)
    s, c = s[..., None, :], c[..., None, :]                          # broadcast over heads
    half = x.shape[-1] // 2
    if algo == "gpt_j":
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :half], x[..., half:]
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    y = np.empty_like(x)
    if algo == "gpt_j":
        y[..., 0::2], y[..., 1::2] = y1, y2
    else:
        y[..., :half], y[..., half:] = y1, y2
    return y


def kv_caching(k_cache, v_cache, k, v, past):
    kc, vc = np.array(k_cache), np.array(v_cache)
    seq = k.shape[2]
    for b, p in enumerate(np.asarray(past)):
        kc[b, :, p:p + seq] = k[b]
        vc[b, :, p:p + seq] = v[b]
    return kc, vc


def attention(q, k, v, k_cache, v_cache, pos, window=0):
    """InfiniCore's attention: k, v appended to the first pos cached positions; causal grouped-query attention with
    scale 1/sqrt(dim); out (seq, q_heads, dim). window > 0: query i keeps only positions > i + pos - window
    (transformers' sliding_window_overlay)."""
    nq, seq, dim = q.shape
    nkv = k.shape[0]
    K = np.concatenate([f64(k_cache)[:, :pos], f64(k)], axis=1)
    V = np.concatenate([f64(v_cache)[:, :pos], f64(v)], axis=1)
    total = pos + seq
    group = nq // nkv
    out = np.empty((seq, nq, dim))
    mask = np.arange(total)[None, :] > (np.arange(seq)[:, None] + pos)
    if window:
        mask |= np.arange(total)[None, :] <= (np.arange(seq)[:, None] + pos - window)
    for h in range(nq):
        sc = f64(q[h]) @ K[h // group].T / np.sqrt(dim)
        sc[mask] = -np.inf
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, h] = p @ V[h // group]
    return out


def random_sample(logits, random_val, topp, topk, temperature):
    """InfiniCore's random_sample: with topp > 0 and topk > 1, sort descending (stable), probabilities of
    (l - max) / temperature over the whole vocabulary, cumulative sums, threshold = min(cum[min(topk, vocab) - 1],
    topp) * random_val, the first sorted index whose cumulative sum reaches it; otherwise the argmax."""
    x = f64(logits)
    if topp > 0 and topk > 1:
        order = np.argsort(-x, kind="stable")
        sv = x[order]
        p = np.exp((sv - sv[0]) / temperature)
        p /= p.sum()
        cum = np.cumsum(p)
        threshold = min(cum[min(topk, len(x)) - 1], topp) * random_val
        i = int(np.searchsorted(cum, threshold, side="left"))
        return int(order[min(i, len(x) - 1)])
    return int(np.argmax(x))
