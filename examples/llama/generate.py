#!/usr/bin/env python
"""Generate tokens with a checkpoint of the Llama family (Llama, Qwen2, Qwen3, Mistral) on a paddle_rt device.

    python examples/llama/generate.py --model DIR (--prompt-ids 1,2,3 | --prompts FILE [--tokenizer DIR])
        --max-new-tokens N [--device rt_cpu:0 | --devices rt_cpu:0,rt_cpu:1] [--dtype float32|bfloat16|float16]
        [--greedy | --temperature T --top-k K --top-p P --seed S] [--json] [--ignore-eos]
        [--profile trace.json] [--memory-plot memory.png] [--record-trace allocations.csv.gz]

DIR is a Hugging Face checkpoint folder (config.json + model.safetensors, e.g. from save_pretrained; make a random
one with make_checkpoint.py). Generation stops after max-new-tokens or at the checkpoint's eos_token_id (unless
--ignore-eos). Greedy by default. --json prints one object: {"tokens", "prefill_ms", "decode_tokens_per_s",
"peak_reserved_bytes", "peak_allocated_bytes", ...}; with --prompts, one line with a JSON list of such objects, one
per prompt in the file's order. --prompts FILE: one prompt a line (token ids separated by commas or spaces, or text
when a tokenizer is at hand: --tokenizer DIR or the model folder's tokenizer.json, and the ``tokenizers`` package),
blank lines skipped; the prompts run together as a batch (each its own positions and its own end). A bad
checkpoint, argument or prompts file is one error line and exit status 2, before any work.

--devices D0,D1,...: tensor parallelism over those devices in one process (llama_tp.py: a host thread and a stream
per device); under ``mpiexec -n N`` the same command runs one rank per process (rank r on device r of the list, or
rank r modulo the device count without --devices); rank 0 alone prints, with every rank's figures in "per_device".
With --devices, --profile also puts each device's share of stream time in collectives in "per_device".
A head, key/value head, vocabulary or intermediate count that does not divide by the degree, a repeated or unknown
device, a degree other than the MPI world size: one line and exit status 2 before any work. Out of device memory, or
a collective that fails (a rank that died): one line and exit status 1.

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
    p = _Parser(prog=PROG, description="Generate tokens with a Llama, Qwen2, Qwen3 or Mistral checkpoint on a "
                                       "paddle_rt device.")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json + model.safetensors)")
    p.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--prompts", metavar="FILE", help="one prompt a line (token ids separated by commas or spaces, or "
                   "text with a tokenizer), run together as a batch")
    p.add_argument("--tokenizer", metavar="DIR", help="folder with tokenizer.json for text prompts (default: the "
                   "model folder's, when it has one; needs the tokenizers package)")
    p.add_argument("--max-new-tokens", type=int, required=True, help="tokens to generate (at most)")
    p.add_argument("--device", default=None, help="paddle_rt device, e.g. rt_cpu:0 (default: the current device)")
    p.add_argument("--devices", default=None, help="tensor parallelism over these devices, comma-separated, e.g. "
                   "rt_cpu:0,rt_cpu:1 (one host thread each; under mpiexec: one process each)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="float32: greedy tokens identical to transformers' float32 generate. bfloat16/float16: the "
                   "kernels compute in float32 and round once per operator, transformers rounds after each step, "
                   "so the two part at the first near-tie: fed the same tokens, the same pick at ~97-100%% of the "
                   "steps on random checkpoints (docs/llama.md has the measured figures)")
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
    if a.device is not None and (a.devices is not None or mpi_world_size() > 1):
        raise UsageError("--device excludes --devices and mpiexec (give the devices of the split in --devices)")
    if a.devices is not None or mpi_world_size() > 1:
        for flag in ("memory_plot", "record_trace") + (("profile",) if mpi_world_size() > 1 else ()):
            if getattr(a, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} is for one device (not with --devices or mpiexec)")
    if (a.prompt_ids is None) == (a.prompts is None):
        raise UsageError("give --prompt-ids or --prompts FILE (one of them)")
    a.prompt = None
    if a.prompt_ids is not None:
        try:
            a.prompt = [int(t) for t in a.prompt_ids.split(",")]
        except ValueError:
            raise UsageError(f"--prompt-ids must be comma-separated integers, not {a.prompt_ids!r}") from None
    for flag, path in (("--profile", a.profile), ("--memory-plot", a.memory_plot), ("--record-trace", a.record_trace)):
        if path is not None:
            check_output_path(flag, path)
    return a


def check_output_path(flag, path):
    """An output file's folder must exist and be writable, and the path must not be a folder: checked before the
    run, so that a typo does not cost a whole generation."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder, not a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: no such folder {os.path.dirname(path) or '.'}")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{flag} {path}: folder {os.path.dirname(path) or '.'} is not writable")


def _is_ids(line):
    parts = line.replace(",", " ").split()
    return bool(parts) and all(p.lstrip("-").isdigit() for p in parts), parts


def _tokenizer(args):
    """The tokenizers.Tokenizer of --tokenizer (or of the model folder), or None when there is none."""
    folder = args.tokenizer or args.model
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        if args.tokenizer:
            raise UsageError(f"--tokenizer {args.tokenizer}: no tokenizer.json in it")
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("text prompts need the tokenizers package: pip install tokenizers") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:          # tokenizers raises its own Exception type for a malformed file
        raise UsageError(f"{path}: not a readable tokenizer ({str(exc).splitlines()[0] if str(exc) else ''})") \
            from None


def read_prompts(args):
    """The prompts of --prompts FILE as lists of token ids, their line numbers in the file, and the tokenizer when a
    line was text (else None)."""
    try:
        with open(args.prompts, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise UsageError(f"--prompts {args.prompts}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompts {args.prompts}: cannot read it ({exc})") from None
    prompts, numbers, tok = [], [], None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        ids, parts = _is_ids(line)
        numbers.append(n)
        if ids:
            prompts.append([int(p) for p in parts])
            continue
        if tok is None:
            if args.tokenizer is None and not os.path.isfile(os.path.join(args.model, "tokenizer.json")):
                raise UsageError(f"--prompts {args.prompts}: line {n} is not token ids (integers separated by commas "
                                 f"or spaces); text prompts need --tokenizer DIR: {line[:40]!r}")
            tok = _tokenizer(args)
        ids = tok.encode(line).ids
        if not ids:
            raise UsageError(f"--prompts {args.prompts}: line {n} encodes to no tokens: {line[:40]!r}")
        prompts.append(list(ids))
    if not prompts:
        raise UsageError(f"--prompts {args.prompts}: no prompt in it")
    return prompts, numbers, tok


def check_prompt(config, prompt, max_new_tokens, where="the prompt"):
    bad = [t for t in prompt if not 0 <= t < config.vocab_size]
    if bad:
        raise UsageError(f"{where.replace('the prompt', 'prompt')} id {bad[0]} is outside the vocabulary "
                         f"(0..{config.vocab_size - 1})")
    limit = config.context_limit
    what = "max_position_embeddings" if limit == config.max_position_embeddings else "the dynamic rope's context"
    if len(prompt) > limit:
        raise UsageError(f"{where} has {len(prompt)} tokens, more than {what} ({limit})")
    if len(prompt) + max_new_tokens > limit:
        raise UsageError(f"{where} ({len(prompt)}) + max-new-tokens ({max_new_tokens}) exceeds {what} ({limit})")


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


def mpi_world_size():
    """The number of processes of the mpiexec job this process belongs to (1 when not under mpiexec): MPICH's
    PMI_SIZE, Open MPI's OMPI_COMM_WORLD_SIZE."""
    for key in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def mpi_rank():
    """This process's rank in its mpiexec job (0 when not under mpiexec)."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def _mib(n):
    return f"{n / 2**20:.2f} MiB"


def run(args):
    """Load, generate, and return the result dict (what --json prints)."""
    if not os.path.isdir(args.model):
        script = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_checkpoint.py"))
        raise UsageError(f"{args.model}: no such checkpoint folder (a random one: python {script} {args.model})")
    config = llama_checkpoint.read_config(args.model)
    tok = None
    if args.prompts is not None:
        prompts, numbers, tok = read_prompts(args)
        for n, prompt in zip(numbers, prompts):
            check_prompt(config, prompt, args.max_new_tokens, where=f"--prompts line {n}'s prompt")
    else:
        prompts = [args.prompt]
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
    if args.devices is not None or mpi_world_size() > 1:
        import llama_tp
        try:
            return llama_tp.run_split(args, config, prompts, tok, mpi_world_size())
        except llama_tp.SplitError as exc:
            raise UsageError(str(exc)) from None
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
        eos = () if args.ignore_eos else config.eos_token_ids
        if args.prompts is None:
            tokens, t = llama_model.generate(model, args.prompt, args.max_new_tokens, sampling, eos)
            outputs, prefill = [tokens], [t["prefill_s"]]
        else:
            outputs, t = llama_model.generate_batch(model, prompts, args.max_new_tokens, sampling, eos)
            prefill = t["prefill_s"]
        device.synchronize()
    finally:
        if prof and prof.running:
            prof.stop()
        if recording:
            paddle_rt.memory.record_history(False)
    stats = paddle_rt.memory_stats(device)
    results = llama_model.result_rows(args, config, prompts, tok, outputs, prefill, t, {
        "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
        "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
        "peak_live_bytes": pool.stats()["used_mem_high"],
        "weight_bytes": model.nbytes,
        "device": str(device),
    })
    result = results[0]
    if prof:
        prof.export_chrome_trace(args.profile)
        result["profile"] = args.profile
    if args.memory_plot or args.record_trace:
        history = paddle_rt.memory.history()
        if args.memory_plot:
            from paddle_rt.tools.plot import plot_memory
            plot_memory(history, args.memory_plot, title=f"{config.architecture} generation on {device} "
                        f"({args.dtype}, {config.parameter_count() / 1e6:.1f}M parameters, batch {len(prompts)})")
            result["memory_plot"] = args.memory_plot
        if args.record_trace:
            write_replay_trace(history, device, args.record_trace)
            result["record_trace"] = args.record_trace
    for r in results[1:]:
        r.update({k: result[k] for k in ("profile", "memory_plot", "record_trace") if k in result})
    return results if args.prompts is not None else result


def report(r):
    """The human-readable output (of one result, or of a batch's list of them)."""
    if isinstance(r, list):
        lines = [f"tokens[{i}]: {' '.join(map(str, x['tokens']))}" + (f"  ({x['text']!r})" if "text" in x else "")
                 for i, x in enumerate(r)]
        lines.append(f"prefill: {sum(x['prefill_ms'] for x in r):.2f} ms for {len(r)} prompts of "
                     f"{', '.join(str(x['prompt_tokens']) for x in r)} tokens (each alone, to its first new token)")
        lines.append(f"decode: {r[0]['decode_tokens_per_s'] or 0:.1f} tokens/s ({sum(len(x['tokens']) - 1 for x in r)}"
                     f" tokens after the first ones, batch {len(r)})")
        return "\n".join(lines + report(dict(r[0], decode_tokens_per_s=None)).splitlines()[2:])
    lines = [f"tokens: {' '.join(map(str, r['tokens']))}",
             f"prefill: {r['prefill_ms']:.2f} ms for {r['prompt_tokens']} prompt tokens (to the first new token)"]
    if r["decode_tokens_per_s"] is not None:
        lines.append(f"decode: {r['decode_tokens_per_s']:.1f} tokens/s ({len(r['tokens']) - 1} tokens after the "
                     f"first, batch 1)")
    lines.append(f"memory on {r['device']}: peak reserved {_mib(r['peak_reserved_bytes'])}, peak live "
                 f"{_mib(r['peak_live_bytes'])} ({r['peak_reserved_bytes'] / max(r['peak_live_bytes'], 1):.3f}x); "
                 f"weights {_mib(r['weight_bytes'])}, KV cache {_mib(r['kv_cache_bytes'])}")
    if "per_device" in r:
        lines[-1] = lines[-1].replace(f"memory on {r['device']}:", f"memory, the largest of {r['degree']} devices:")
        for d in r["per_device"]:
            share = d.get("collective_share")
            lines.append(f"  rank {d['rank']} on {d['device']}: peak reserved {_mib(d['peak_reserved_bytes'])}, "
                         f"weights {_mib(d['weight_bytes'])}"
                         + (f", {100 * share:.0f}% of stream time in collectives" if share is not None else ""))
    for key, what in (("profile", "profile"), ("memory_plot", "memory plot"), ("record_trace", "allocation log")):
        if key in r:
            lines.append(f"{what}: {r[key]}")
    return "\n".join(lines)


EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as paddle-rt's commands


def main(argv=None):
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        result = run(args)
    except (UsageError, CheckpointError) as exc:
        if mpi_rank() == 0:             # every MPI rank finds the same fault: one line for the job
            print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:           # Ctrl-C: one line, not the traceback of wherever generation was
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        line = _runtime_failure(exc)
        if line is None:
            raise
        print(f"{PROG}: error: {line}", file=sys.stderr)
        return 1
    if result is not None:          # None: an MPI rank other than 0 (rank 0 prints every rank's figures)
        print(json.dumps(result) if args.json else report(result))
    return 0


def _runtime_failure(exc):
    """The one line of a failure of the run (out of device memory, a collective that failed: a rank died), or None
    for anything else (a bug: its traceback is worth more)."""
    import paddle_rt
    if isinstance(exc, (paddle_rt.OutOfMemoryError, paddle_rt.ccl.CollectiveError)):
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, paddle_rt.PaddleRTError) and isinstance(cause, paddle_rt.ccl.CollectiveError):
        return f"{type(cause).__name__}: {str(cause).splitlines()[0]}"
    return None


if __name__ == "__main__":
    sys.exit(main())
