"""LLM generation: examples/llama (a Llama decoder on paddle_rt's operators) against transformers'
``LlamaForCausalLM.generate`` on the same random checkpoint, run by ``python -m paddle_rt bench --only llm`` and
bench/bench_llm.py.

For each model size (~15M parameters: llama2.c's stories15M shape, 6 layers, d288, vocab 32000, tied embeddings;
~100M: d768, 12 layers, 12 query / 4 KV heads, vocab 32000, tied), float32, batch 1, a 64-token prompt, greedy:

``quick``: the 15M model only, 16 new tokens, 2 repetitions (else both, 48 new tokens, 5 repetitions).

Then per family of FAMILIES (Llama, Llama with llama3 rope, Qwen2, Qwen3, Mistral with a 32-position window) at
the first size, and per batch size (1, 4, 16; quick: 1, 4): decode tokens/s of examples/llama (``generate`` at batch
1, ``generate_batch`` above it: prompts of 32 to 64 tokens) against transformers' batched greedy ``generate`` with
left padding, alternating, medians (target >= 1.0x at each batch).

1. decode tokens/s (the new tokens after the first, divided by the time from the first to the last) of both, in the
   same process with the same thread count (``threads``, default: the CPUs this process may use; set for torch,
   for the BLAS and OpenMP libraries through threadpoolctl, and for paddle_rt's host kernels when they have a
   thread pool), the two runs alternating, medians (target: >= 1.0x transformers);
2. prefill: time from the call to the first new token (both include their cache set-up);
3. peak reserved memory against peak live memory (the bytes of live tensors, the pool's used high-water mark) over
   a whole run from an empty cache: model load, prefill and decode, default allocator configuration
   (target <= 1.10x).

The greedy tokens of both are compared as a check (notes say whether they were equal). transformers' per-token times
come from a streamer (its ``put`` is called once per new token). The area needs the checkout's examples/ folder (or
``PADDLE_RT_EXAMPLES``), torch and transformers (pip install "paddle_rt[examples]" after torch's CPU wheel);
without them it is skipped.
"""
import importlib
import os
import statistics
import sys
import tempfile
import time

import paddle_rt
from paddle_rt.bench import result, figure, at_most, AreaSkipped, format_rows as _format_rows

AREA = "llm"
PROMPT_LEN = 64
CONFIGS = {
    "15M": dict(hidden_size=288, intermediate_size=768, num_hidden_layers=6, num_attention_heads=6,
                num_key_value_heads=6, vocab_size=32000, tie_word_embeddings=True),
    "100M": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=True),
}


def example_dir():
    """examples/llama: from PADDLE_RT_EXAMPLES, beside the package (a checkout), or under the current folder."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for root in (os.environ.get("PADDLE_RT_EXAMPLES"), os.path.join(here, "examples"), os.path.join(os.getcwd(),
                                                                                                  "examples")):
        if root and os.path.isfile(os.path.join(root, "llama", "llama_model.py")):
            return os.path.join(root, "llama")
    raise AreaSkipped("examples/llama not found: run from the checkout or set PADDLE_RT_EXAMPLES to its examples/")


def _imports():
    try:
        import torch
        import transformers
        import safetensors  # noqa: F401
    except ImportError as exc:
        raise AreaSkipped("needs torch and transformers: pip install torch==2.13.0 --index-url "
                          f"https://download.pytorch.org/whl/cpu, then pip install 'paddle_rt[examples]' ({exc})")
    d = example_dir()
    if d not in sys.path:
        sys.path.insert(0, d)
    return torch, transformers, importlib.import_module("llama_checkpoint"), importlib.import_module("llama_model")


# family -> (transformers model class, config class, fields added to a size's): what examples/llama runs.
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "llama3": ("LlamaForCausalLM", "LlamaConfig", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"head_dim": None}),          # None: hidden / heads
    "mistral": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 32}),
}


def model_class(transformers, family):
    return getattr(transformers, FAMILIES[family][0])


def build_checkpoint(transformers, torch, path, fields, seed=0, family="llama"):
    """A random checkpoint of ``family`` (FAMILIES) with the size's ``fields``, saved by transformers'
    save_pretrained into ``path``."""
    cls_name, config_name, extra = FAMILIES[family]
    fields = dict({"max_position_embeddings": 2048}, **fields)
    for k, v in extra.items():
        fields[k] = fields["hidden_size"] // fields["num_attention_heads"] if (k == "head_dim" and v is None) else v
    config = getattr(transformers, config_name)(bos_token_id=None, eos_token_id=None, pad_token_id=None, **fields)
    torch.manual_seed(seed)
    getattr(transformers, cls_name)(config).save_pretrained(path)
    return path


class _TokenClock:
    """A generate() streamer: the time of each put (the first is the prompt, then one per new token)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def _hf_run(torch, model, prompt, n):
    clock = _TokenClock()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0, streamer=clock)
    new = clock.times[1:]
    return out[0, len(prompt):].tolist(), new[0] - t0, (new[-1] - new[0]) / (len(new) - 1)


def _our_run(llama_model, model, prompt, n):
    tokens, t = llama_model.generate(model, prompt, n)
    return tokens, t["prefill_s"], t["decode_s"] / t["decode_tokens"]


def _idle(device):
    paddle_rt.default_mem_pool(device).trim_to(0)
    paddle_rt.empty_cache(device)


def _memory_run(llama_checkpoint, llama_model, folder, prompt, n, device):
    """Peak reserved and peak live bytes of one whole run (load + generate) from an idle cache."""
    config = llama_checkpoint.read_config(folder)
    weights = llama_checkpoint.read_weights(folder, config)
    _idle(device)
    pool = paddle_rt.default_mem_pool(device)
    paddle_rt.reset_peak_memory_stats(device)
    pool.reset_peak()
    model = llama_model.LlamaModel(config, weights, device=device)
    llama_model.generate(model, prompt, n)
    device.synchronize()
    peak_reserved = paddle_rt.memory_stats(device)["reserved_bytes.all.peak"]
    peak_live = pool.stats()["used_mem_high"]
    del model
    _idle(device)
    return peak_reserved, peak_live


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


BATCHES = (1, 4, 16)


def measure(quick=False, reps=None, sizes=None, threads=None, families=None, batches=None):
    torch, transformers, llama_checkpoint, llama_model = _imports()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError as exc:
        raise AreaSkipped(f"needs threadpoolctl to give both sides one thread count: pip install "
                          f"'paddle_rt[examples]' ({exc})")
    try:
        device = paddle_rt.get_device()
    except paddle_rt.PaddleRTError as e:
        raise AreaSkipped(str(e))
    reps = reps or (2 if quick else 5)
    n = 16 if quick else 48
    sizes = sizes or (("15M",) if quick else tuple(CONFIGS))
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    set_host_threads = getattr(paddle_rt.op, "set_num_threads", None)     # paddle_rt's host kernel pool, if any
    host_before = set_host_threads(threads) if set_host_threads else None
    rows = []
    limits = threadpool_limits(threads)       # numpy's OpenBLAS (paddle_rt's gemm), MKL and OpenMP (torch)
    try:
        with tempfile.TemporaryDirectory(prefix="paddle_rt_bench_llm_") as tmp:
            for name, fields in CONFIGS.items():
                if name not in sizes:
                    continue
                folder = build_checkpoint(transformers, torch, os.path.join(tmp, name), fields)
                rows.extend(_measure_one(name, folder, n, reps, threads, device, torch, transformers,
                                         llama_checkpoint, llama_model))
            size = sizes[0]
            for family in (tuple(FAMILIES) if families is None else families):
                folder = build_checkpoint(transformers, torch, os.path.join(tmp, f"{family}-{size}"), CONFIGS[size],
                                          family=family)
                rows.extend(_measure_family(family, size, folder, n, reps, threads, device, torch, transformers,
                                            llama_checkpoint, llama_model,
                                            batches or ((1, 4) if quick else BATCHES)))
    finally:
        limits.restore_original_limits()
        torch.set_num_threads(threads_before)
        if host_before is not None:
            set_host_threads(host_before)
    return rows


def _measure_one(name, folder, n, reps, threads, device, torch, transformers, llama_checkpoint, llama_model):
    import numpy as np
    config = llama_checkpoint.read_config(folder)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, config.vocab_size, PROMPT_LEN)]
    peak_reserved, peak_live = _memory_run(llama_checkpoint, llama_model, folder, prompt, n, device)
    ours_model = llama_model.LlamaModel(config, llama_checkpoint.read_weights(folder, config), device=device)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    hf_model.eval()
    _our_run(llama_model, ours_model, prompt, 4)            # warm-up: descriptors, pool blocks, torch's kernels
    _hf_run(torch, hf_model, prompt, 4)
    ours, theirs = [], []
    for _ in range(reps):
        ours.append(_our_run(llama_model, ours_model, prompt, n))
        theirs.append(_hf_run(torch, hf_model, prompt, n))
    diff = _first_difference(ours[0][0], theirs[0][0])
    same = "greedy tokens equal" if diff is None else f"greedy tokens differ from token {diff}"
    o_step, t_step = statistics.median(r[2] for r in ours), statistics.median(r[2] for r in theirs)
    o_pre, t_pre = statistics.median(r[1] for r in ours), statistics.median(r[1] for r in theirs)
    params = f"{config.parameter_count() / 1e6:.1f}M parameters"
    where = f"{name} ({params}), float32, batch 1, prompt {PROMPT_LEN}, {n} new tokens"
    ratios = [t[2] / o[2] for o, t in zip(ours, theirs)]          # per repetition, the two runs side by side
    rows = [
        result(AREA, f"decode tokens/s, {where}", 1 / o_step, "tok/s",
               note=f"transformers {1 / t_step:.1f} tok/s; {threads} threads each; medians of {reps}"),
        figure(AREA, f"decode speed vs transformers generate, {name}", ratios, "x", at_least=1.0,
               note=f"{o_step * 1e3:.2f} ms vs {t_step * 1e3:.2f} ms per token; {same}"),
        result(AREA, f"prefill (call to first token), {name}, prompt {PROMPT_LEN}", o_pre * 1e3, "ms",
               note=f"transformers {t_pre * 1e3:.2f} ms ({t_pre / o_pre:.2f}x ours)"),
    ]
    r = peak_reserved / peak_live
    rows.append(result(AREA, f"peak reserved / peak live, {name} (load + generate)", r, "x", *at_most(r, 1.10, "x"),
                       note=f"{peak_reserved / 2**20:.1f} MiB reserved, {peak_live / 2**20:.1f} MiB live"))
    return rows


def _batch_prompts(vocab, batch):
    """``batch`` prompts of different lengths (PROMPT_LEN / 2 to PROMPT_LEN tokens), seed 1."""
    import numpy as np
    rng = np.random.default_rng(1)
    lengths = [PROMPT_LEN - (i * PROMPT_LEN // 2) // max(batch - 1, 1) for i in range(batch)]
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in lengths]


def _hf_batch_run(torch, model, prompts, n):
    """transformers' batched greedy generate with left padding: (tokens per prompt, seconds per decode step)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    clock = _TokenClock()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0, streamer=clock)
    new = clock.times[1:]
    return out[:, width:].tolist(), (new[-1] - new[0]) / (len(new) - 1)


def _our_batch_run(llama_model, model, prompts, n):
    if len(prompts) == 1:
        tokens, t = llama_model.generate(model, prompts[0], n)
        return [tokens], t["decode_s"] / t["decode_tokens"]
    tokens, t = llama_model.generate_batch(model, prompts, n)
    return tokens, t["decode_s"] / (n - 1)


def _measure_family(family, size, folder, n, reps, threads, device, torch, transformers, llama_checkpoint,
                    llama_model, batches):
    """Decode tokens/s of one family at each batch size against transformers' batched generate, alternating."""
    config = llama_checkpoint.read_config(folder)
    ours_model = llama_model.LlamaModel(config, llama_checkpoint.read_weights(folder, config), device=device)
    hf_model = model_class(transformers, family).from_pretrained(folder, dtype=torch.float32)
    hf_model.eval()
    rows = []
    for batch in batches:
        prompts = _batch_prompts(config.vocab_size, batch)
        _our_batch_run(llama_model, ours_model, prompts, 4)           # warm-up
        _hf_batch_run(torch, hf_model, prompts, 4)
        ours, theirs = [], []
        for _ in range(reps):
            ours.append(_our_batch_run(llama_model, ours_model, prompts, n))
            theirs.append(_hf_batch_run(torch, hf_model, prompts, n))
        same = ("greedy tokens equal" if ours[0][0] == theirs[0][0] else
                f"greedy tokens differ ({sum(a != b for a, b in zip(ours[0][0], theirs[0][0]))} of {batch} "
                f"sequences)")
        o_step, t_step = statistics.median(r[1] for r in ours), statistics.median(r[1] for r in theirs)
        lengths = f"prompts {min(map(len, prompts))}-{max(map(len, prompts))}" if batch > 1 else f"prompt {PROMPT_LEN}"
        rows.append(figure(AREA, f"decode vs transformers, {family} {size}, batch {batch}",
                           [t[1] / o[1] for o, t in zip(ours, theirs)], "x", at_least=1.0,
                           note=f"{batch / o_step:.1f} vs {batch / t_step:.1f} tok/s ({config.architecture}, "
                                f"{lengths}, {n} new tokens, {threads} threads, medians of {reps}); {same}"))
    return rows


def format_rows(rows):
    return _format_rows(rows, 78)
