#!/usr/bin/env python
"""Generate tokens with a Llama-architecture checkpoint on a paddle_rt device.

    python examples/llama/generate.py --model DIR --prompt-ids 1,2,3 --max-new-tokens N [--device rt_cpu:0]
        [--dtype float32|bfloat16|float16] [--greedy | --temperature T --top-k K --top-p P --seed S] [--json]
        [--ignore-eos] [--profile trace.json] [--memory-plot memory.png] [--record-trace allocations.csv.gz]

DIR is a Hugging Face checkpoint folder (config.json + model.safetensors, e.g. from save_pretrained). Generation
stops after max-new-tokens or at the checkpoint's eos_token_id (unless --ignore-eos). Greedy by default. --json
prints one object: {"tokens", "prefill_ms", "decode_tokens_per_s", "peak_reserved_bytes", "peak_allocated_bytes",
...}. A bad checkpoint or argument is one error line and exit status 2.

Built on paddle_rt's public API only (the operators through llama_ops.py, the profiler, the memory history).
"""
import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import llama_checkpoint  # noqa: E402
from llama_checkpoint import CheckpointError  # noqa: E402

PROG = "generate.py"


class UsageError(Exception):
    """A bad command line (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    p = _Parser(prog=PROG, description="Generate tokens with a Llama checkpoint on a paddle_rt device.")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json + model.safetensors)")
    p.add_argument("--prompt-ids", required=True, help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=int, required=True, help="tokens to generate (at most)")
    p.add_argument("--device", default=None, help="paddle_rt device, e.g. rt_cpu:0 (default: the current device)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--greedy", action="store_true", help="the most likely token at each step (the default)")
    p.add_argument("--temperature", type=float, default=None, help="sample at this temperature (> 0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=None, help="sample within this probability mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler's random numbers")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the checkpoint's eos_token_id")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--profile", metavar="TRACE_JSON", help="write the profiler's Chrome trace of the run")
    p.add_argument("--memory-plot", metavar="PNG", help="draw the memory timeline of the run")
    p.add_argument("--record-trace", metavar="CSV_GZ",
                   help="write the run's allocations in the replay format (RMM's CSV, gzip'd if the name ends .gz)")
    a = p.parse_args(argv)
    sampling_args = [x for x in ("temperature", "top_k", "top_p", "seed") if getattr(a, x) is not None]
    if a.greedy and sampling_args:
        raise UsageError(f"--greedy excludes --{sampling_args[0].replace('_', '-')}")
    if a.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, not {a.max_new_tokens}")
    if a.temperature is not None and not a.temperature > 0:
        raise UsageError(f"--temperature must be > 0, not {a.temperature}")
    if a.top_k is not None and a.top_k < 0:
        raise UsageError(f"--top-k must be >= 0, not {a.top_k}")
    if a.top_p is not None and not 0 < a.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], not {a.top_p}")
    try:
        a.prompt = [int(t) for t in a.prompt_ids.split(",")]
    except ValueError:
        raise UsageError(f"--prompt-ids must be comma-separated integers, not {a.prompt_ids!r}") from None
    return a


def check_prompt(config, prompt, max_new_tokens):
    bad = [t for t in prompt if not 0 <= t < config.vocab_size]
    if bad:
        raise UsageError(f"prompt id {bad[0]} is outside the vocabulary (0..{config.vocab_size - 1})")
    if len(prompt) > config.max_position_embeddings:
        raise UsageError(f"the prompt has {len(prompt)} tokens, more than max_position_embeddings "
                         f"({config.max_position_embeddings})")
    if len(prompt) + max_new_tokens > config.max_position_embeddings:
        raise UsageError(f"prompt ({len(prompt)}) + max-new-tokens ({max_new_tokens}) exceeds "
                         f"max_position_embeddings ({config.max_position_embeddings})")


def write_replay_trace(history, device, path):
    """The allocator events of ``device`` in ``history`` (paddle_rt.memory.history()) as an RMM allocation log, the
    replay format of shared/traces: ``Thread,Time,Action,Pointer,Size,Stream`` with allocate/free rows, time in
    seconds from the first event, stream 0; frees of blocks allocated before the history started are left out."""
    import paddle_rt.memory as memory
    if hasattr(memory, "dump_trace"):
        return memory.dump_trace(path, device=device)
    events = history["devices"].get(str(device), {}).get("trace", [])
    live = set()
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    t0 = events[0]["time_ns"] if events else 0
    for e in events:
        if e["action"] == "alloc":
            live.add(e["addr"])
            act = "allocate"
        elif e["action"] == "free" and e["addr"] in live:
            live.discard(e["addr"])
            act = "free"
        else:
            continue
        rows.append(f"0,{(e['time_ns'] - t0) / 1e9:.9f},{act},0x{e['addr']:x},{e['size']},0")
    text = ("\n".join(rows) + "\n").encode()
    with (gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")) as f:
        f.write(text)
    return path


def _mib(n):
    return f"{n / 2**20:.2f} MiB"


def run(args):
    """Load, generate, and return the result dict (what --json prints)."""
    config = llama_checkpoint.read_config(args.model)
    check_prompt(config, args.prompt, args.max_new_tokens)
    if args.memory_plot:
        from paddle_rt.tools.plot import require_matplotlib, MissingExtraError
        try:
            require_matplotlib()
        except MissingExtraError as exc:
            raise UsageError(str(exc).splitlines()[0]) from None
    try:
        import paddle_rt
    except ImportError as exc:
        raise UsageError(f"paddle_rt does not import ({exc}): pip install paddle_rt") from None
    try:
        device = paddle_rt.device(args.device) if args.device else paddle_rt.get_device()
    except paddle_rt.PaddleRTError as exc:
        raise UsageError(f"--device {args.device}: {str(exc).splitlines()[0]}") from None
    weights = llama_checkpoint.read_weights(args.model, config)
    import llama_model
    sampling = llama_model.Sampling(temperature=args.temperature if args.temperature is not None else 0.0,
                                    top_k=args.top_k or 0, top_p=args.top_p if args.top_p is not None else 1.0,
                                    seed=args.seed)
    recording = bool(args.memory_plot or args.record_trace)
    if recording:
        paddle_rt.memory.record_history(True, max_entries=1_000_000, stacks=False)
    prof = paddle_rt.profiler.profile() if args.profile else None
    paddle_rt.reset_peak_memory_stats(device)
    pool = paddle_rt.default_mem_pool(device)
    pool.reset_peak()
    try:
        if prof:
            prof.start()
        model = llama_model.LlamaModel(config, weights, device=device, dtype=args.dtype)
        del weights
        tokens, t = llama_model.generate(model, args.prompt, args.max_new_tokens, sampling,
                                         () if args.ignore_eos else config.eos_token_ids)
        device.synchronize()
    finally:
        if prof and prof.running:
            prof.stop()
        if recording:
            paddle_rt.memory.record_history(False)
    stats = paddle_rt.memory_stats(device)
    result = {
        "tokens": tokens,
        "prefill_ms": t["prefill_s"] * 1e3,
        "decode_tokens_per_s": t["decode_tokens"] / t["decode_s"] if t["decode_tokens"] else None,
        "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
        "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
        "peak_live_bytes": pool.stats()["used_mem_high"],
        "weight_bytes": model.nbytes,
        "kv_cache_bytes": t["cache_bytes"],
        "prompt_tokens": len(args.prompt),
        "device": str(device),
        "dtype": args.dtype,
        "parameters": config.parameter_count(),
    }
    if prof:
        prof.export_chrome_trace(args.profile)
        result["profile"] = args.profile
    if args.memory_plot or args.record_trace:
        history = paddle_rt.memory.history()
        if args.memory_plot:
            from paddle_rt.tools.plot import plot_memory
            plot_memory(history, args.memory_plot, title=f"Llama generation on {device} ({args.dtype}, "
                        f"{config.parameter_count() / 1e6:.1f}M parameters)")
            result["memory_plot"] = args.memory_plot
        if args.record_trace:
            write_replay_trace(history, device, args.record_trace)
            result["record_trace"] = args.record_trace
    return result


def report(r):
    """The human-readable output."""
    lines = [f"tokens: {' '.join(map(str, r['tokens']))}",
             f"prefill: {r['prefill_ms']:.2f} ms for {r['prompt_tokens']} prompt tokens (to the first new token)"]
    if r["decode_tokens_per_s"] is not None:
        lines.append(f"decode: {r['decode_tokens_per_s']:.1f} tokens/s ({len(r['tokens']) - 1} tokens after the "
                     f"first, batch 1)")
    lines.append(f"memory on {r['device']}: peak reserved {_mib(r['peak_reserved_bytes'])}, peak live "
                 f"{_mib(r['peak_live_bytes'])} ({r['peak_reserved_bytes'] / max(r['peak_live_bytes'], 1):.3f}x); "
                 f"weights {_mib(r['weight_bytes'])}, KV cache {_mib(r['kv_cache_bytes'])}")
    for key, what in (("profile", "profile"), ("memory_plot", "memory plot"), ("record_trace", "allocation log")):
        if key in r:
            lines.append(f"{what}: {r[key]}")
    return "\n".join(lines)


def main(argv=None):
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        result = run(args)
    except (UsageError, CheckpointError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
