"""Tensor parallelism for the Llama example: the model split over ``degree`` devices (Megatron-LM's split, as
InfiniLM's model runner does it over InfiniCCL), in one process (a host thread and a stream per device, communicators
from ``ccl.comm_init_all``) or one process per rank under ``mpiexec`` (``ccl.Communicator.from_mpi``).

The split, rank r of d:
- q, k, v (and their biases) by output rows: the query heads [r H/d, (r+1) H/d) and the key/value heads
  [r KV/d, (r+1) KV/d) (grouped-query attention keeps its grouping inside a rank); gate and up by output rows
  (intermediate columns [r I/d, (r+1) I/d)); each rank's KV cache holds its own KV heads;
- o and down by input columns: each rank's product is a partial sum, summed over the ranks by an all_reduce on the
  device's stream (o's bias on rank 0 only);
- the embedding and the LM head by vocabulary rows [r V/d, (r+1) V/d): a rank's embedding gives zero rows for the
  ids of the other ranks (``ops.embedding(..., vocab_start=)``), summed by an all_reduce; the LM head's logits of the
  rank's rows are gathered on every device (all_gather, device to device: no host buffer), and every rank samples
  the same id from them with the same random numbers (so the ids stay on every device, as at degree 1);
- norms (and Qwen3's q/k norms) are whole on every rank.

Every collective is enqueued on the device's current stream in order with the operators; nothing waits on the
host per layer: the host waits only for each step's sampled ids (as at degree 1). Each rank reads only its own
ranges of the safetensors file (``llama_checkpoint.read_weights(parts=)``).
"""
import dataclasses
import threading

import numpy as np

import paddle_rt

import llama_checkpoint
import llama_model
import llama_ops as L


class SplitError(ValueError):
    """The checkpoint or the device list cannot be split at this degree (one line, exit status 2)."""


def check_split(config, degree):
    """Raises SplitError naming the first count of ``config`` that does not divide by ``degree``."""
    counts = (("num_attention_heads", config.num_attention_heads), ("num_key_value_heads", config.num_key_value_heads),
              ("vocab_size", config.vocab_size), ("intermediate_size", config.intermediate_size))
    for what, n in counts:
        if n % degree:
            raise SplitError(f"{what} ({n}) does not divide by the tensor-parallel degree {degree}: the heads, the "
                             f"vocabulary and the MLP are split evenly between the devices")


def parse_devices(spec):
    """The device names of ``--devices`` (comma-separated), checked for repeats and for existing; SplitError else."""
    names = [s.strip() for s in spec.split(",")]
    if not all(names):
        raise SplitError(f"--devices {spec}: an empty device name (give e.g. rt_cpu:0,rt_cpu:1)")
    devices = []
    for name in names:
        try:
            dev = paddle_rt.device(name)
        except (paddle_rt.PaddleRTError, ValueError, TypeError) as exc:
            raise SplitError(f"--devices {spec}: {name}: {str(exc).splitlines()[0]}") from None
        if any(d is dev for d in devices):
            raise SplitError(f"--devices {spec}: {dev} is listed twice (one rank per device)")
        devices.append(dev)
    return devices


def local_config(config, rank, degree):
    """The config of rank ``rank``'s part: its heads, its MLP columns, its vocabulary rows (o's bias on rank 0)."""
    return dataclasses.replace(
        config, num_attention_heads=config.num_attention_heads // degree,
        num_key_value_heads=config.num_key_value_heads // degree,
        intermediate_size=config.intermediate_size // degree, vocab_size=config.vocab_size // degree,
        o_bias=config.o_bias and rank == 0)


def shard_parts(config, rank, degree):
    """{checkpoint tensor name: (axis, start, stop) or None} of rank ``rank``: what it reads of the file."""
    c, hd = config, config.head_dim

    def part(axis, n):
        per = n // degree
        return (axis, rank * per, (rank + 1) * per)

    parts = {"model.embed_tokens.weight": part(0, c.vocab_size)}
    if not c.tie_word_embeddings:
        parts["lm_head.weight"] = part(0, c.vocab_size)
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        for kind in ("weight", "bias"):
            parts[p + f"self_attn.q_proj.{kind}"] = part(0, c.num_attention_heads * hd)
            parts[p + f"self_attn.k_proj.{kind}"] = part(0, c.num_key_value_heads * hd)
            parts[p + f"self_attn.v_proj.{kind}"] = part(0, c.num_key_value_heads * hd)
        parts[p + "self_attn.o_proj.weight"] = part(1, c.num_attention_heads * hd)
        parts[p + "self_attn.o_proj.bias"] = None if rank else (0, 0, c.hidden_size)
        parts[p + "mlp.gate_proj.weight"] = part(0, c.intermediate_size)
        parts[p + "mlp.up_proj.weight"] = part(0, c.intermediate_size)
        parts[p + "mlp.down_proj.weight"] = part(1, c.intermediate_size)
    return parts


def read_shard(folder, config, rank, degree):
    """Rank ``rank``'s tensors of the checkpoint (only its ranges are read), named as in the file."""
    return llama_checkpoint.read_weights(folder, config, parts=shard_parts(config, rank, degree))


class TPLlamaModel(llama_model.LlamaModel):
    """Rank ``rank`` of a model split over ``comm.nranks`` devices: ``config`` is the whole model's, ``weights`` the
    rank's shard (read_shard). The forward pass is LlamaModel's on the rank's heads and columns; the embedding, the
    two row-split projections of each layer and the LM head add their collectives."""

    def __init__(self, config, weights, comm, device, dtype="float32"):
        self.full_config = config
        self.comm = comm
        self.rank, self.degree = comm.rank, comm.nranks
        self.vocab_start = self.rank * (config.vocab_size // self.degree)
        super().__init__(local_config(config, self.rank, self.degree), weights, device=device, dtype=dtype)

    def _embed(self, ids):
        return L.all_reduce_sum(L.embedding(ids, self.w["embed"], self.vocab_start), self.comm)

    def _reduce(self, partial):
        return L.all_reduce_sum(partial, self.comm)

    def _logits(self, h):
        local = super()._logits(h)                                       # (rows, vocab / d) of this rank's rows
        rows, part = local.shape
        gathered = paddle_rt.empty((self.degree, rows, part), self.dtype, device=self.device)
        L.all_gather(local, gathered, self.comm)
        out = paddle_rt.empty((rows, self.degree * part), self.dtype, device=self.device)
        L.rearrange(gathered.permute(1, 0, 2), out.view(rows, self.degree, part))
        return out


def shared_seed(seed):
    """The sampler's seed every rank uses (the same random numbers give the same ids on every rank): ``seed``, or
    one drawn here when it is None (under MPI, rank 0's, broadcast)."""
    return seed if seed is not None else int(np.random.SeedSequence().entropy % 2**63)


def run_ranks(fns, comms=()):
    """Runs fns[i]() on its own host thread (rank i), returns their results; the exception of the rank that failed
    first is raised after every thread ended. A failing rank aborts ``comms`` (``Communicator.abort``), so that the
    others' collectives fail at once instead of waiting for their peer until the plugin's time limit."""
    results, errors, order = [None] * len(fns), [None] * len(fns), []

    def body(i):
        try:
            results[i] = fns[i]()
        except BaseException as exc:          # re-raised in the calling thread below
            errors[i] = exc
            order.append(i)
            for c in comms:
                c.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"llama-tp-rank{i}") for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if order:
        raise errors[order[0]]
    return results


# ---- the command line's run (generate.py --devices, or under mpiexec) ----------------------------------------------
def _mpi_rank_device(args, devices, degree):
    """(mpi4py's COMM_WORLD, this rank's device) under mpiexec; SplitError when the degree is not the world size."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise SplitError("running under mpiexec needs mpi4py: pip install 'paddle_rt[mpi]'") from None
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    if degree != size:
        raise SplitError(f"--devices {args.devices} gives the degree {degree}, the MPI world has {size} processes "
                         f"(one rank per process: list {size} devices, or none)")
    if devices is not None:
        return world, devices[rank]
    devs = paddle_rt.devices()
    return world, devs[rank % len(devs)]


def _sampling(args, seed):
    return llama_model.Sampling(temperature=args.temperature if args.temperature is not None else 0.0,
                                top_k=args.top_k or 0, top_p=args.top_p if args.top_p is not None else 1.0, seed=seed)


def _generate(model, args, prompts, seed, eos):
    """One rank's generation: (outputs, per-prompt prefill seconds, the timing dict)."""
    sampling = _sampling(args, seed)
    if args.prompts is None:
        tokens, t = llama_model.generate(model, prompts[0], args.max_new_tokens, sampling, eos)
        return [tokens], [t["prefill_s"]], t
    outputs, t = llama_model.generate_batch(model, prompts, args.max_new_tokens, sampling, eos)
    return outputs, t["prefill_s"], t


def _device_figures(model):
    stats = paddle_rt.memory_stats(model.device)
    return {"device": str(model.device), "rank": model.rank, "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
            "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
            "peak_live_bytes": paddle_rt.default_mem_pool(model.device).stats()["used_mem_high"],
            "weight_bytes": model.nbytes}


def _reset_peaks(device):
    paddle_rt.reset_peak_memory_stats(device)
    paddle_rt.default_mem_pool(device).reset_peak()


def run_split(args, config, prompts, tok, world_size=1):
    """generate.py's run at degree len(--devices) (one process) or the MPI world size ``world_size`` (one process
    per rank, under mpiexec). Returns the result (or list of results) rank 0 prints; None on the other MPI ranks."""
    devices = parse_devices(args.devices) if args.devices is not None else None
    degree = len(devices) if devices is not None else world_size
    check_split(config, degree)
    eos = () if args.ignore_eos else config.eos_token_ids
    if world_size > 1:
        world, device = _mpi_rank_device(args, devices, degree)
        comm = paddle_rt.ccl.Communicator.from_mpi(device=device)     # first: it times out on an absent rank
        seed = world.bcast(shared_seed(args.seed), root=0)
        _reset_peaks(device)
        model = TPLlamaModel(config, read_shard(args.model, config, comm.rank, degree), comm, device, args.dtype)
        outputs, prefill, t = _generate(model, args, prompts, seed, eos)
        figures = world.gather(_device_figures(model), root=0)
        comm.destroy()
        if comm.rank:
            return None
        return _results(args, config, prompts, tok, outputs, prefill, t, figures, degree)
    seed = shared_seed(args.seed)
    comms = paddle_rt.ccl.comm_init_all(devices)
    for d in devices:
        _reset_peaks(d)
    models = []
    for comm, dev in zip(comms, devices):          # every rank loaded before the first collective
        models.append(TPLlamaModel(config, read_shard(args.model, config, comm.rank, degree), comm, dev, args.dtype))
    prof = paddle_rt.profiler.profile() if args.profile else None
    if prof:
        prof.start()
    try:
        ranks = run_ranks([lambda m=m: _generate(m, args, prompts, seed, eos) for m in models], comms)
    finally:
        if prof and prof.running:
            prof.stop()
    outputs, prefill, t = ranks[0]
    for r, (other, _, _) in enumerate(ranks[1:], 1):
        if other != outputs:                       # every rank sampled from the same logits with the same numbers
            raise RuntimeError(f"rank {r} generated other tokens than rank 0: {other} != {outputs}")
    figures = [_device_figures(m) for m in models]
    for comm in comms:
        comm.destroy()
    if prof:
        prof.export_chrome_trace(args.profile)
        shares = collective_shares(args.profile)
        for f in figures:
            f["collective_share"] = shares.get(f["device"])
    results = _results(args, config, prompts, tok, outputs, prefill, t, figures, degree)
    for r in results if isinstance(results, list) else [results]:
        if prof:
            r["profile"] = args.profile
    return results


def collective_shares(trace_path):
    """{device name: the share of its streams' operation time spent in collectives (waiting for the peers
    included)} of a profiler Chrome trace."""
    import json
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    total, coll = {}, {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "stream" and e.get("pid") in names:
            dev = names[e["pid"]]
            total[dev] = total.get(dev, 0) + e["dur"]
            if e["name"] == "collective":
                coll[dev] = coll.get(dev, 0) + e["dur"]
    return {d: coll.get(d, 0) / total[d] for d in total if total[d]}


def _results(args, config, prompts, tok, outputs, prefill, t, figures, degree):
    """generate.py's result objects (as at degree 1, the memory figures the largest device's) + degree, per_device."""
    results = llama_model.result_rows(args, config, prompts, tok, outputs, prefill, t, {
        **{k: max(f[k] for f in figures) for k in ("peak_reserved_bytes", "peak_allocated_bytes", "peak_live_bytes",
                                                   "weight_bytes")},
        "device": ",".join(f["device"] for f in figures),
    })
    for r in results:
        r["degree"] = degree
        r["per_device"] = figures
    return results if args.prompts is not None else results[0]
