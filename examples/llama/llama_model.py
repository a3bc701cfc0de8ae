"""A Llama decoder on paddle_rt: the weights in one device allocation, a preallocated KV cache, and the forward pass
written against the operator layer of llama_ops.py.

Memory decisions:
- Weights: one arena tensor in the model's dtype holding every parameter (64-element aligned), each parameter a view
  of it. One allocation instead of ~9 per layer: the allocator holds exactly the weights (no chunk rounding per
  tensor), and loading is one stream-ordered host-to-device copy per parameter. The q/k/v projections of a layer are
  stored as one (q + k + v, hidden) matrix and gate/up as one (2 * intermediate, hidden) matrix, so a layer runs
  four gemms for the checkpoint's seven matrices.
- KV cache: preallocated for the whole generation (prompt + max_new_tokens positions), one (layers, kv_heads,
  capacity, head_dim) tensor each for keys and values. The capacity is known before the first step, so a growing
  cache would only add copies (each growth copies the whole cache) and leave freed blocks of every intermediate size
  behind; preallocated, peak reserved memory stays next to peak live memory and the attention operator writes a
  step's keys and values in place. The positions and the rotary tables for the same capacity live with the cache.
- Activations: allocated by the operators from the device's stream-ordered pool and freed when dropped; every step
  has the same shapes, so the pool hands the same blocks back on the same stream.
"""
import time

import numpy as np

import paddle_rt

import llama_ops as L

DTYPES = ("float32", "bfloat16", "float16")
ALIGN = 64        # elements: each parameter starts on a 256-byte (float32) boundary of the arena


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def rope_tables(config, capacity, dtype, prompt_len=None):
    """(sin, cos) of shape (capacity, head_dim / 2) as transformers' rotary embedding of the checkpoint's rope type
    computes them (rope_scaling.py: the frequencies and the angles in float32, then cast to the model's dtype).
    ``prompt_len``: the length of the prompt run at once (dynamic rope's frequencies depend on it)."""
    return config.rope.tables(capacity, capacity if prompt_len is None else prompt_len, dtype)


class KVCache:
    """Keys and values of every layer for ``capacity`` positions, the position ids 0..capacity-1 and the rotary
    tables, on the model's device; ``length`` positions are filled."""

    def __init__(self, model, capacity, prompt_len=None):
        c = model.config
        shape = (c.num_hidden_layers, c.num_key_value_heads, capacity, c.head_dim)
        dev = model.device
        self.capacity = capacity
        self.length = 0
        self.k = paddle_rt.empty(shape, model.dtype, device=dev)
        self.v = paddle_rt.empty(shape, model.dtype, device=dev)
        self.pos = paddle_rt.tensor(np.arange(capacity, dtype=np.int64), device=dev)
        sin, cos = rope_tables(c, capacity, numpy_dtype(model.dtype), prompt_len)
        self.sin = paddle_rt.tensor(sin, device=dev)
        self.cos = paddle_rt.tensor(cos, device=dev)

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class BatchCache:
    """The KV caches of a batch of sequences (one cache row per sequence, each starting at position 0: a sequence's
    keys sit where they would sit alone), with the positions of every decode step: sequence b of ``lengths[b]``
    prompt tokens feeds its step-s token at position lengths[b] + s - 1. The rotary tables are shared, or stacked
    one per sequence when they depend on the prompt's length (dynamic rope): sequence b then reads its rows at
    b * capacity + position."""

    def __init__(self, model, lengths, max_new_tokens):
        c = model.config
        dev = model.device
        b = len(lengths)
        self.lengths = list(lengths)
        self.capacity = cap = max(lengths) + max_new_tokens
        shape = (c.num_hidden_layers, b, c.num_key_value_heads, cap, c.head_dim)
        self.k = paddle_rt.empty(shape, model.dtype, device=dev)
        self.v = paddle_rt.empty(shape, model.dtype, device=dev)
        dt = numpy_dtype(model.dtype)
        per_sequence = c.rope.grows
        if per_sequence:
            tables = [rope_tables(c, cap, dt, n) for n in lengths]
            sin, cos = np.concatenate([t[0] for t in tables]), np.concatenate([t[1] for t in tables])
        else:
            sin, cos = rope_tables(c, cap, dt)
        self.sin, self.cos = paddle_rt.tensor(sin, device=dev), paddle_rt.tensor(cos, device=dev)
        self.offsets = [i * cap if per_sequence else 0 for i in range(b)]
        self.pos = paddle_rt.tensor(np.arange(b * cap if per_sequence else cap, dtype=np.int64), device=dev)
        steps = np.arange(max(max_new_tokens, 1), dtype=np.int64)[:, None] + np.asarray(lengths, np.int64)[None, :]
        self.step_pos = paddle_rt.tensor(steps, device=dev)                        # (steps, b): cache positions
        self.step_rope = paddle_rt.tensor(steps + np.asarray(self.offsets, np.int64)[None, :], device=dev)

    def step_positions(self, step):
        """(cache positions (b,), rotary positions (b, 1)) of decode step ``step`` >= 1."""
        b = len(self.lengths)
        return self.step_pos[step - 1], self.step_rope[step - 1].view(b, 1)

    def sequence(self, i):
        """Sequence i's cache as a KVCache-like view (for its prompt, run alone)."""
        return _SequenceCache(self, i)

    @property
    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


class _SequenceCache:
    def __init__(self, batch, i):
        c = batch.k.shape[0]
        self.k = [batch.k[n][i] for n in range(c)]
        self.v = [batch.v[n][i] for n in range(c)]
        self.capacity = batch.capacity
        self.length = 0
        off = batch.offsets[i]
        self.pos = batch.pos[off:off + batch.capacity]
        self.sin, self.cos = batch.sin, batch.cos


class LlamaModel:
    """``LlamaModel(config, weights, device=None, dtype="float32")``: ``weights`` as read by
    llama_checkpoint.read_weights (numpy arrays, Hugging Face's names)."""

    def __init__(self, config, weights, device=None, dtype="float32"):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        self.config = config
        self.dtype = dtype
        self.device = paddle_rt.device(device) if device is not None else paddle_rt.get_device()
        self._load(weights)

    # ---- weights -----------------------------------------------------------------------------------------------
    def _parameters(self, w):
        """(name, host array) of every parameter as the model uses it (q/k/v and gate/up fused)."""
        c = self.config
        yield "embed", w["model.embed_tokens.weight"]
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            yield f"{n}.in_norm", w[p + "input_layernorm.weight"]
            yield f"{n}.qkv", np.concatenate([w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"],
                                              w[p + "self_attn.v_proj.weight"]])
            if c.qkv_bias:
                yield f"{n}.qkv_bias", np.concatenate([w[p + "self_attn.q_proj.bias"], w[p + "self_attn.k_proj.bias"],
                                                       w[p + "self_attn.v_proj.bias"]])
            if c.qk_norm:
                yield f"{n}.q_norm", w[p + "self_attn.q_norm.weight"]
                yield f"{n}.k_norm", w[p + "self_attn.k_norm.weight"]
            yield f"{n}.o", w[p + "self_attn.o_proj.weight"]
            if c.o_bias:
                yield f"{n}.o_bias", w[p + "self_attn.o_proj.bias"]
            yield f"{n}.post_norm", w[p + "post_attention_layernorm.weight"]
            yield f"{n}.gate_up", np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            yield f"{n}.down", w[p + "mlp.down_proj.weight"]
        yield "norm", w["model.norm.weight"]
        if not c.tie_word_embeddings:
            yield "lm_head", w["lm_head.weight"]

    def _load(self, weights):
        dt = numpy_dtype(self.dtype)
        params = [(name, np.ascontiguousarray(a.astype(dt, copy=False))) for name, a in self._parameters(weights)]
        offsets, total = [], 0
        for _, a in params:
            offsets.append(total)
            total += -(-a.size // ALIGN) * ALIGN
        self.arena = paddle_rt.empty((total,), self.dtype, device=self.device)
        stream = paddle_rt.current_stream(self.device)
        self.w = {}
        for (name, a), off in zip(params, offsets):
            view = self.arena[off:off + a.size].view(a.shape)
            paddle_rt.memcpy_async(view.data_ptr, a, a.nbytes, stream=stream, kind="H2D")
            self.w[name] = view
        if self.config.tie_word_embeddings:
            self.w["lm_head"] = self.w["embed"]
        stream.synchronize()

    @property
    def nbytes(self):
        """Bytes of the weight arena."""
        return self.arena.nbytes

    # ---- the forward pass --------------------------------------------------------------------------------------
    def new_cache(self, capacity, prompt_len=None):
        return KVCache(self, capacity, prompt_len)

    def _qkv(self, n, h, rows, pos, sin, cos):
        """The layer's q, k (rotated; normalised per head first for Qwen3) and v of the hidden states h (rows,
        hidden): q (rows, heads, hd), k and v (rows, kv_heads, hd); pos (rows,) or (rows, 1) for a batch step."""
        c, w = self.config, self.w
        hd, heads, kv_heads = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        q_end, k_end = heads * hd, (heads + kv_heads) * hd
        qkv = L.linear(h, w[f"{n}.qkv"], w.get(f"{n}.qkv_bias"))                 # (rows, (heads + 2 kv) * hd)
        q, k = qkv[:, :q_end].view(rows, heads, hd), qkv[:, q_end:k_end].view(rows, kv_heads, hd)
        if c.qk_norm:
            q = L.head_rms_norm(q, w[f"{n}.q_norm"], c.rms_norm_eps)
            k = L.head_rms_norm(k, w[f"{n}.k_norm"], c.rms_norm_eps)
        if len(pos.shape) == 2:          # a batch step: one token of each sequence, each at its own position
            q = L.rope(q.view(rows, 1, heads, hd), pos, sin, cos).view(rows, heads, hd)
            k = L.rope(k.view(rows, 1, kv_heads, hd), pos, sin, cos).view(rows, kv_heads, hd)
        else:
            q, k = L.rope(q, pos, sin, cos), L.rope(k, pos, sin, cos)
        return q, k, qkv[:, k_end:].view(rows, kv_heads, hd)

    def _mlp_and_norms(self, n, x, a):
        """The rest of layer n after attention: x += a @ o; h = norm(x); x += mlp(h); returns the next layer's
        normalised input (the final norm's after the last layer)."""
        c, w = self.config, self.w
        o = self._reduce(L.linear(a, w[f"{n}.o"], w.get(f"{n}.o_bias")))
        h = L.add_rms_norm(x, o, w[f"{n}.post_norm"], c.rms_norm_eps)
        act = L.silu_and_mul(L.linear(h, w[f"{n}.gate_up"]))
        nxt = w[f"{n + 1}.in_norm"] if n + 1 < c.num_hidden_layers else w["norm"]
        return L.add_rms_norm(x, self._reduce(L.linear(act, w[f"{n}.down"])), nxt, c.rms_norm_eps)

    # ---- what tensor parallelism (llama_tp.py) replaces: one device holds the whole model here -------------------
    def _embed(self, ids):
        """The residual stream's first value: the embedding rows of ``ids``."""
        return L.embedding(ids, self.w["embed"])

    def _reduce(self, partial):
        """The output of a projection whose input dimension is split between devices, summed over them (here:
        nothing is split)."""
        return partial

    def _logits(self, h):
        """The logits (rows, vocab) of the normalised hidden states h (rows, hidden)."""
        return L.linear(h, self.w["lm_head"])

    def forward(self, ids, cache):
        """Run the tokens ``ids`` (an int64 tensor (seq,) on the device) at the next positions of ``cache``; returns
        the logits of the last one, a (vocab,) tensor (on the device, not yet computed when this returns)."""
        c = self.config
        seq, start = ids.shape[0], cache.length
        if start + seq > cache.capacity:
            raise ValueError(f"the KV cache holds {cache.capacity} positions; {start} + {seq} do not fit")
        pos = cache.pos[start:start + seq]
        x = self._embed(ids)                                                         # the residual stream
        h = L.rms_norm(x, self.w["0.in_norm"], c.rms_norm_eps)
        for n in range(c.num_hidden_layers):
            q, k, v = self._qkv(n, h, seq, pos, cache.sin, cache.cos)
            a = L.attention(q, k, v, cache.k[n], cache.v[n], start, c.window(n))
            h = self._mlp_and_norms(n, x, a)
        cache.length = start + seq
        return self._logits(h[seq - 1:seq])[0]

    def forward_batch(self, ids, batch, step):
        """One decode step of ``batch`` (a BatchCache): the tokens ``ids`` (an int64 tensor (b,) on the device), one
        per sequence, each at its own next position; returns the logits (b, vocab) (on the device, not yet
        computed when this returns)."""
        c = self.config
        b = ids.shape[0]
        pos, rope_pos = batch.step_positions(step)
        x = self._embed(ids)
        h = L.rms_norm(x, self.w["0.in_norm"], c.rms_norm_eps)
        for n in range(c.num_hidden_layers):
            q, k, v = self._qkv(n, h, b, rope_pos, batch.sin, batch.cos)
            a = L.batch_attention(q, k, v, batch.k[n], batch.v[n], pos, c.window(n))
            h = self._mlp_and_norms(n, x, a)
        return self._logits(h)

    def token_ids(self, ids):
        """Host token ids as the (seq,) int64 device tensor forward() takes."""
        return paddle_rt.tensor(np.asarray(ids, dtype=np.int64).reshape(-1), device=self.device)


class Sampling:
    """Greedy (``temperature=0``) or sampled with temperature, top-k (0: all), top-p, from ``seed``."""

    def __init__(self, temperature=0.0, top_k=0, top_p=1.0, seed=None):
        self.temperature, self.top_k, self.top_p = float(temperature), int(top_k), float(top_p)
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self):
        return self.temperature == 0 or self.top_k == 1

    def random_val(self):
        return 0.0 if self.greedy else float(self.rng.random())


def generate(model, prompt, max_new_tokens, sampling=None, eos_token_ids=(), on_token=None):
    """Generate up to ``max_new_tokens`` after the host list ``prompt`` (stops after a token of ``eos_token_ids``).
    Returns (new tokens, {"prefill_s": prompt to first token, "decode_s": the other tokens, "decode_tokens": their
    number, "cache_bytes"}).

    A sampled id stays on the device: the next step's embedding reads it there, so step t + 1 is enqueued before the
    host reads token t (the one copy to the host per step, 8 bytes), and the host's Python work for a step overlaps
    the device's work on the previous one. Two id buffers alternate: step s writes buffer s % 2, which the host has
    read before it enqueues step s. After an eos token the one step enqueued beyond it is discarded."""
    sampling = sampling or Sampling()
    cache = model.new_cache(len(prompt) + max_new_tokens, len(prompt))
    ids = [paddle_rt.empty((1,), "int64", device=model.device) for _ in range(2)]
    eos = set(eos_token_ids)

    def enqueue(s, inputs):
        L.sample(model.forward(inputs, cache), ids[s % 2][0], sampling.random_val(), sampling.temperature,
                 sampling.top_k, sampling.top_p)

    def read(s):
        t = int(ids[s % 2].numpy()[0])
        if on_token:
            on_token(t)
        return t

    t0 = time.perf_counter()
    enqueue(0, model.token_ids(prompt))
    tokens = [read(0)]
    t1 = time.perf_counter()
    steps = 1
    while len(tokens) < max_new_tokens and tokens[-1] not in eos:
        while steps < max_new_tokens and steps <= len(tokens) + 1:
            enqueue(steps, ids[(steps - 1) % 2])
            steps += 1
        tokens.append(read(len(tokens)))
    t2 = time.perf_counter()
    model.device.synchronize()
    return tokens, {"prefill_s": t1 - t0, "decode_s": t2 - t1, "decode_tokens": len(tokens) - 1,
                    "cache_bytes": cache.nbytes}


def generate_batch(model, prompts, max_new_tokens, sampling=None, eos_token_ids=()):
    """Generate up to ``max_new_tokens`` after each host list of ``prompts`` (of any lengths), together: each
    prompt runs alone into its own cache row (its prefill), then every decode step runs all the sequences at once
    (one token each, each at its own position: gemms of ``len(prompts)`` rows, batch_attention over each sequence's
    own cache). A sequence ends at its own eos token (later steps still compute it; their tokens are dropped); the
    loop ends when every sequence ended or after max_new_tokens. Greedy outputs equal each prompt's alone.

    Returns (a list of new-token lists in the order of ``prompts``, {"prefill_s": [per prompt], "decode_s",
    "decode_tokens": tokens after each sequence's first, summed, "cache_bytes"}). The sampled ids stay on the
    device: step t + 1 is enqueued before the host reads step t's ids (two buffers alternate, as in generate)."""
    sampling = sampling or Sampling()
    b = len(prompts)
    batch = BatchCache(model, [len(p) for p in prompts], max_new_tokens)
    ids = [paddle_rt.empty((b,), "int64", device=model.device) for _ in range(2)]
    eos = set(eos_token_ids)

    def sample_rows(logits, buf):
        for i in range(b):
            L.sample(logits[i], buf[i], sampling.random_val(), sampling.temperature, sampling.top_k, sampling.top_p)

    prefill_s = []
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        logits = model.forward(model.token_ids(prompt), batch.sequence(i))
        L.sample(logits, ids[0][i], sampling.random_val(), sampling.temperature, sampling.top_k, sampling.top_p)
        ids[0][i].numpy()
        prefill_s.append(time.perf_counter() - t0)
    first = ids[0].numpy().tolist()
    tokens = [[t] for t in first]
    done = [t in eos for t in first]
    t1 = time.perf_counter()
    steps, count = 1, 1
    while count < max_new_tokens and not all(done):
        while steps < max_new_tokens and steps <= count + 1:
            sample_rows(model.forward_batch(ids[(steps - 1) % 2], batch, steps), ids[steps % 2])
            steps += 1
        row = ids[count % 2].numpy().tolist()
        count += 1
        for i, t in enumerate(row):
            if not done[i]:
                tokens[i].append(t)
                done[i] = t in eos
    t2 = time.perf_counter()
    model.device.synchronize()
    return tokens, {"prefill_s": prefill_s, "decode_s": t2 - t1, "decode_tokens": sum(len(t) - 1 for t in tokens),
                    "cache_bytes": batch.nbytes}


def result_rows(args, config, prompts, tok, outputs, prefill, t, memory):
    """generate.py's result object per prompt: the tokens, the timings of ``t``, the figures of ``memory`` (a dict:
    peak_reserved_bytes, peak_allocated_bytes, peak_live_bytes, weight_bytes, device), the checkpoint's facts."""
    rows = []
    for i, (prompt, tokens) in enumerate(zip(prompts, outputs)):
        r = {
            "tokens": tokens,
            "prefill_ms": prefill[i] * 1e3,
            "decode_tokens_per_s": t["decode_tokens"] / t["decode_s"] if t["decode_tokens"] and t["decode_s"] > 0
            else None,
            **{k: memory[k] for k in ("peak_reserved_bytes", "peak_allocated_bytes", "peak_live_bytes",
                                      "weight_bytes")},
            "kv_cache_bytes": t["cache_bytes"],
            "prompt_tokens": len(prompt),
            "batch": len(prompts),
            "device": memory["device"],
            "dtype": args.dtype,
            "architecture": config.architecture,
            "parameters": config.parameter_count(),
        }
        if tok is not None:
            r["text"] = tok.decode(tokens)
        rows.append(r)
    return rows
