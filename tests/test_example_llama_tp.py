"""examples/llama's tensor parallelism (llama_tp.py, ``generate.py --devices``) against Hugging Face transformers:
greedy float32 tokens at degree 2 and 4 equal transformers' and degree 1's for every family and rope type (one
process: a host thread per device), batches and sampling equal at every degree, the ``--json`` per-device figures,
each device's share of the memory, out of memory at degree 1 but not 2, and the bad inputs (one line, exit status 2).
The tests marked ``mpi`` run the same command under ``mpiexec -n 2`` and ``-n 4`` (one rank per process; needs the
mpi extra too): the same tokens, a degree that is not the world size, a rank that dies mid-generation. Needs the
examples extra."""
import json
import os
import subprocess
import sys
import time

import pytest

from llama_example_helpers import EXAMPLE_DIR, torch, transformers  # noqa: F401 (skips without the examples extra)

from conftest import mpiexec_or_skip, package_parent  # noqa: E402
from test_example_llama_families import BATCH, CASES, PROMPT, build, reference  # noqa: E402

pytestmark = pytest.mark.examples

import generate as cli  # noqa: E402
import llama_checkpoint  # noqa: E402
import llama_tp  # noqa: E402

GENERATE = os.path.join(EXAMPLE_DIR, "generate.py")
NEW = 48
# The families' checkpoints with key/value heads that divide by 4 (their multi-query cases cannot be split by heads)
SPLIT = {name: {"num_key_value_heads": 4} for name in CASES}
SPLIT["qwen2_untied_mqa_sliding"] = {"num_attention_heads": 8, "num_key_value_heads": 4}
DEVICES = {1: "rt_cpu:0", 2: "rt_cpu:0,rt_cpu:1", 4: "rt_cpu:0,rt_cpu:1,rt_cpu:2,rt_cpu:3"}


def run_cli(args, env=None, timeout=300):
    """generate.py as a user runs it, in a child with 4 rt_cpu devices; the CompletedProcess."""
    child = dict(os.environ)
    child["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
    child["RT_CPU_DEVICE_COUNT"] = "4"
    child.update(env or {})
    return subprocess.run([sys.executable, GENERATE, *map(str, args)], env=child, capture_output=True, text=True,
                          timeout=timeout)


# One child runs every case at degree 1, 2 and 4 (a child: degree 4 needs RT_CPU_DEVICE_COUNT=4 at start-up).
_DEGREES_CHILD = r"""
import json, sys
sys.path.insert(0, {example!r})
import generate as cli
out = {{}}
for name, path in {paths!r}.items():
    for degree, devices in {devices!r}.items():
        flag = ["--device", devices] if degree == "1" else ["--devices", devices]
        r = cli.run(cli.parse_args(["--model", path, "--prompt-ids", {prompt!r}, "--max-new-tokens", "{new}",
                                    "--json", *flag]))
        out[name + "/" + degree] = r["tokens"]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    return {name: build(root / name, name, seed=i, **SPLIT[name]) for i, name in enumerate(CASES)}


@pytest.fixture(scope="module")
def degree_tokens(checkpoints):
    code = _DEGREES_CHILD.format(example=EXAMPLE_DIR, paths=checkpoints, devices={str(k): v for k, v in DEVICES.items()},
                                 prompt=",".join(map(str, PROMPT)), new=NEW)
    child = dict(os.environ, RT_CPU_DEVICE_COUNT="4")
    child["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
    p = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=600,
                       cwd=package_parent())
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_at_degree_2_and_4_equals_transformers(checkpoints, degree_tokens, name):
    """Every family and rope type (llama3, linear, dynamic, yarn with attention bias; Qwen2 tied and untied with a
    sliding-window layer; Qwen3's q/k norm; Mistral's window), float32: the tokens at degree 2 and 4 are
    transformers' greedy tokens, and degree 1's."""
    want = reference(name, checkpoints[name], [PROMPT], NEW)[0]
    assert len(set(want)) > 8, f"the reference run is degenerate: {want}"
    for degree in (1, 2, 4):
        assert degree_tokens[f"{name}/{degree}"] == want, f"{name} at degree {degree}"


def test_batch_and_sampling_equal_at_every_degree(checkpoints, tmp_path):
    """A batch of four prompts (greedy), and sampling with temperature, top-k and top-p from one seed: the same
    tokens at degree 1, 2 and 4."""
    path = checkpoints["qwen2_tied_gqa"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(",".join(map(str, p)) for p in BATCH) + "\n")
    runs = {}
    for degree, devices in DEVICES.items():
        flag = ["--device", devices] if degree == 1 else ["--devices", devices]
        batch = run_cli(["--model", path, "--prompts", prompts, "--max-new-tokens", 24, "--json", *flag])
        assert batch.returncode == 0, batch.stderr
        sampled = run_cli(["--model", path, "--prompt-ids", "3,14,15", "--max-new-tokens", 24, "--temperature", 0.8,
                           "--top-k", 40, "--top-p", 0.9, "--seed", 7, "--json", *flag])
        assert sampled.returncode == 0, sampled.stderr
        runs[degree] = ([r["tokens"] for r in json.loads(batch.stdout)], json.loads(sampled.stdout)["tokens"])
    assert runs[1][0] == reference("qwen2_tied_gqa", path, BATCH, 24)
    assert runs[1] == runs[2] == runs[4]
    assert len(set(runs[1][1])) > 4


def test_json_tells_the_split(checkpoints, tmp_path):
    """--json: degree and per_device (device, rank, peak_reserved_bytes, weight_bytes); each device holds 1/d of
    the split weights (norms whole); with --profile, each device's share of stream time in collectives."""
    path = checkpoints["llama_linear_mha"]
    one = json.loads(run_cli(["--model", path, "--prompt-ids", "1,2,3", "--max-new-tokens", 4, "--json"]).stdout)
    p = run_cli(["--model", path, "--prompt-ids", "1,2,3", "--max-new-tokens", 4, "--json", "--devices",
                 DEVICES[4], "--profile", tmp_path / "trace.json"])
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["degree"] == 4 and len(r["per_device"]) == 4
    assert [(d["device"], d["rank"]) for d in r["per_device"]] == [(f"rt_cpu:{i}", i) for i in range(4)]
    for d in r["per_device"]:
        assert {"peak_reserved_bytes", "weight_bytes"} <= set(d)
        assert one["weight_bytes"] / 4 <= d["weight_bytes"] < one["weight_bytes"] / 4 * 1.1
        assert 0 < d["collective_share"] < 1
    assert os.path.isfile(tmp_path / "trace.json") and r["profile"] == str(tmp_path / "trace.json")
    assert "degree" not in one


def _big(tmp_path):
    """A checkpoint of ~37 MB of float32 weights (untied vocabulary 16384, d256), big enough for the allocator's
    2 MiB pages not to hide the split."""
    return build(tmp_path / "big", "llama_linear_mha", hidden_size=256, intermediate_size=512, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=16384, tie_word_embeddings=False)


def test_each_device_holds_about_half_at_degree_2(tmp_path):
    path = _big(tmp_path)
    args = ["--model", path, "--prompt-ids", "1,2,3,4", "--max-new-tokens", 8, "--json"]
    one = json.loads(run_cli(args).stdout)
    two = json.loads(run_cli(args + ["--devices", DEVICES[2]]).stdout)
    assert one["tokens"] == two["tokens"]
    for d in two["per_device"]:
        assert d["peak_reserved_bytes"] <= 0.55 * one["peak_reserved_bytes"], (d, one["peak_reserved_bytes"])


def test_out_of_memory_at_degree_1_runs_at_degree_2(tmp_path):
    """RT_CPU_MEMORY_BYTES below the whole model's weights: degree 1 is one line naming out of memory (exit status
    1), degree 2 runs, each device holding half."""
    path = _big(tmp_path)
    args = ["--model", path, "--prompt-ids", "1,2,3,4", "--max-new-tokens", 8, "--json"]
    weights = json.loads(run_cli(args).stdout)["weight_bytes"]
    env = {"RT_CPU_MEMORY_BYTES": str(int(weights * 0.9))}
    one = run_cli(args, env=env)
    assert one.returncode == 1 and one.stdout == ""
    assert one.stderr.count("\n") == 1 and "OutOfMemoryError" in one.stderr, one.stderr
    two = run_cli(args + ["--devices", DEVICES[2]], env=env)
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout)["degree"] == 2


@pytest.fixture(scope="module")
def mqa(tmp_path_factory):
    return build(tmp_path_factory.mktemp("mqa") / "mqa", "qwen3_mqa")           # 4 query heads, 1 KV head


@pytest.mark.parametrize("extra,message", [
    (["--devices", "rt_cpu:0,rt_cpu:1"], "num_key_value_heads (1) does not divide by the tensor-parallel degree 2"),
    (["--devices", "rt_cpu:0,rt_cpu:0"], "rt_cpu:0 is listed twice"),
    (["--devices", "rt_cpu:0,rt_cpu:7"], "rt_cpu:7"),
    (["--devices", "rt_cpu:0,,"], "an empty device name"),
    (["--devices", "rt_cpu:0,rt_cpu:1", "--device", "rt_cpu:0"], "--device excludes --devices and mpiexec"),
    (["--devices", "rt_cpu:0,rt_cpu:1", "--memory-plot", "m.png"], "--memory-plot is for one device"),
])
def test_bad_split_is_one_line_and_status_2(checkpoints, mqa, extra, message, capsys):
    path = mqa if "does not divide" in message else checkpoints["llama_linear_mha"]
    assert cli.main(["--model", path, "--prompt-ids", "1,2", "--max-new-tokens", "4", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("generate.py: error: "), err


def test_vocabulary_and_heads_that_do_not_divide(checkpoints):
    config = llama_checkpoint.read_config(checkpoints["qwen2_untied_mqa_sliding"])        # vocab 300, heads 8
    llama_tp.check_split(config, 4)
    with pytest.raises(llama_tp.SplitError, match=r"num_attention_heads \(8\) does not divide by .* degree 3"):
        llama_tp.check_split(config, 3)
    import dataclasses
    with pytest.raises(llama_tp.SplitError, match=r"vocab_size \(301\)"):
        llama_tp.check_split(dataclasses.replace(config, vocab_size=301), 2)


def test_each_rank_reads_only_its_ranges(checkpoints):
    """read_shard: rank r's rows of q/k/v, gate/up, the vocabulary; its columns of o and down; o's bias on rank 0
    only; equal to the whole tensors' slices."""
    path = checkpoints["llama_yarn_bias"]
    config = llama_checkpoint.read_config(path)
    whole = llama_checkpoint.read_weights(path, config)
    import numpy as np
    for rank in range(2):
        part = llama_tp.read_shard(path, config, rank, 2)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert np.array_equal(part[q], np.split(whole[q], 2)[rank])
        o = "model.layers.1.mlp.down_proj.weight"
        assert np.array_equal(part[o], np.split(whole[o], 2, axis=1)[rank])
        e = "model.embed_tokens.weight"
        assert np.array_equal(part[e], np.split(whole[e], 2)[rank])
        assert ("model.layers.0.self_attn.o_proj.bias" in part) == (rank == 0)


def test_forward_enqueues_every_layer_without_waiting(checkpoints):
    """No host synchronization per layer: with both devices' streams held by a gate, each rank's thread enqueues a
    whole forward pass (every layer's all_reduce, the embedding's and the logits' all_gather) and returns while
    nothing ran yet; released, the logits equal degree 1's."""
    import threading
    import numpy as np
    import paddle_rt
    import llama_model
    path = checkpoints["qwen3_mqa"]
    config = llama_checkpoint.read_config(path)
    devices = [paddle_rt.device("rt_cpu:0"), paddle_rt.device("rt_cpu:1")]
    comms = paddle_rt.ccl.comm_init_all(devices)
    try:
        models = [llama_tp.TPLlamaModel(config, llama_tp.read_shard(path, config, c.rank, 2), c, d)
                  for c, d in zip(comms, devices)]
        whole = llama_model.LlamaModel(config, llama_checkpoint.read_weights(path, config), device=devices[0])
        want = whole.forward(whole.token_ids(PROMPT), whole.new_cache(len(PROMPT) + 1)).numpy()
        gate = threading.Event()
        for d in devices:
            paddle_rt.current_stream(d).add_callback(gate.wait, 60)
        caches = [m.new_cache(len(PROMPT) + 1) for m in models]
        ids = [m.token_ids(PROMPT) for m in models]
        logits = [None, None]

        def enqueue(i):
            logits[i] = models[i].forward(ids[i], caches[i])

        threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        try:
            assert not any(t.is_alive() for t in threads), "a rank's forward waited for its device"
            assert not any(paddle_rt.current_stream(d).query() for d in devices)      # nothing ran yet
        finally:
            gate.set()
        for out in logits:
            np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
            assert int(out.numpy().argmax()) == int(want.argmax())
    finally:
        for c in comms:
            c.destroy()


def test_a_failing_rank_thread_aborts_the_others():
    """One process: rank 1's thread fails before its collective while rank 0 waits in an all_reduce; rank 1's
    error is raised at once (its abort ends rank 0's wait), not after the plugin's 30 s time limit."""
    import numpy as np
    import paddle_rt
    devices = [paddle_rt.device("rt_cpu:0"), paddle_rt.device("rt_cpu:1")]
    comms = paddle_rt.ccl.comm_init_all(devices)
    x = paddle_rt.tensor(np.ones(8, np.float32), device=devices[0])

    def rank0():
        paddle_rt.ccl.all_reduce(x, x, "sum", comm=comms[0])
        return x.numpy()

    def rank1():
        time.sleep(0.2)
        raise MemoryError("rank 1 failed")

    t0 = time.monotonic()
    with pytest.raises(MemoryError, match="rank 1 failed"):
        llama_tp.run_ranks([rank0, rank1], comms)
    assert time.monotonic() - t0 < 10
    for c in comms:
        c.destroy()


# ---- under mpiexec: one rank per process ---------------------------------------------------------------------------
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi", "llama_tp_worker.py")


def run_mpi(n, args=(), env=None, runs=None, keep_going=False, timeout=300):
    """``mpiexec -n n`` of the worker (generate.py's command line ``args``, or the list ``runs`` of them)."""
    exe = mpiexec_or_skip()
    child = dict(os.environ, RT_CPU_DEVICE_COUNT="4")
    child["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
    if runs is not None:
        child["LLAMA_TP_RUNS"] = json.dumps([[str(a) for a in r] for r in runs])
    child.update(env or {})
    cmd = [exe] + (["-disable-auto-cleanup"] if keep_going else []) + ["-n", str(n), sys.executable, WORKER,
                                                                        *map(str, args)]
    return subprocess.run(cmd, env=child, capture_output=True, text=True, timeout=timeout)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_mpi_greedy_equals_transformers(checkpoints, n):
    """Every family under ``mpiexec -n 2`` and ``-n 4``: rank 0 alone prints, its tokens are transformers' greedy
    tokens, and per_device holds every rank's figures."""
    names = list(CASES)
    runs = [["--model", checkpoints[name], "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", NEW,
             "--json"] for name in names]
    p = run_mpi(n, runs=runs)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [x for x in p.stdout.splitlines() if x.strip()]
    assert len(lines) == 2 * len(names), p.stdout             # one result and one status per run: rank 0's
    for name, line, status in zip(names, lines[0::2], lines[1::2]):
        r = json.loads(line)
        assert status == "exit 0"
        assert r["tokens"] == reference(name, checkpoints[name], [PROMPT], NEW)[0], name
        assert r["degree"] == n and [d["rank"] for d in r["per_device"]] == list(range(n))
        assert [d["device"] for d in r["per_device"]] == [f"rt_cpu:{i}" for i in range(n)]


@pytest.mark.mpi
@pytest.mark.parametrize("extra,message", [
    (["--devices", DEVICES[4]], "--devices rt_cpu:0,rt_cpu:1,rt_cpu:2,rt_cpu:3 gives the degree 4, the MPI world "
                                "has 2 processes"),
    (["--device", "rt_cpu:0"], "--device excludes --devices and mpiexec"),
])
def test_mpi_bad_split_is_one_line(checkpoints, extra, message):
    p = run_mpi(2, ["--model", checkpoints["llama_linear_mha"], "--prompt-ids", "1,2", "--max-new-tokens", 4, *extra])
    assert p.returncode == 2
    assert p.stderr.count("generate.py: error:") == 1, p.stderr
    assert message in p.stderr


@pytest.mark.mpi
def test_mpi_rank_that_dies_mid_generation_is_named(checkpoints):
    """Rank 1 leaves (os._exit, no MPI_Finalize) at its fifth step: rank 0's next collective fails after
    RT_CPU_CCL_TIMEOUT_MS (+ up to 2 s of asking the peers) with a CollectiveError naming rank 1, in one line
    (exit status 1), and rank 0 exits (docs/collectives.md, "When a rank fails")."""
    t0 = time.monotonic()
    p = run_mpi(2, ["--model", checkpoints["llama_linear_mha"], "--prompt-ids", "1,2,3", "--max-new-tokens", 32],
                env={"RT_CPU_CCL_TIMEOUT_MS": "3000", "LLAMA_TP_DIE_RANK": "1", "LLAMA_TP_DIE_STEP": "5"},
                keep_going=True, timeout=120)
    elapsed = time.monotonic() - t0
    errors = [x for x in p.stderr.splitlines() if x.startswith("generate.py: error:")]
    assert len(errors) == 1 and "CollectiveError" in errors[0] and "missing rank(s): [1]" in errors[0], p.stderr
    assert "tokens:" not in p.stdout
    assert p.returncode != 0 and elapsed < 3 + 2 + 25, elapsed
