"""paddle_rt/tools/replay.py: trace loading, the replay figures, the minimum-capacity bisection and the reference
models of Paddle's and PyTorch's allocators (checked against the anchors of /work/shared/traces/README.md)."""
import gzip
import json
import os

import pytest

import paddle_rt
from paddle_rt.tools import replay

MiB = 1 << 20
# The workload traces live in shared/ beside the checkout (as on the developers' machines and in CI);
# PADDLE_RT_TRACES points elsewhere.
TRACES = os.environ.get("PADDLE_RT_TRACES", os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "traces")))


def write_trace(path, events, gz=False):
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i, (act, ptr, size) in enumerate(events):
        lines.append(f"0,{i * 0.001:.6f},{act},0x{ptr:x},{size},0")
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


SMALL = [("allocate", 0x1000, 3 * MiB), ("allocate", 0x2000, 100), ("free", 0x1000, 3 * MiB),
         ("allocate", 0x3000, 2 * MiB), ("allocate", 0x4000, 5 * MiB), ("free", 0x2000, 100),
         ("free", 0x3000, 2 * MiB)]


def test_load_trace(tmp_path):
    p = write_trace(tmp_path / "t.csv.gz", SMALL, gz=True)
    is_alloc, sizes, slots, nslots, peak = replay.load_trace(p)
    assert list(is_alloc) == [1, 1, 0, 1, 1, 0, 0]
    assert peak == 2 * MiB + 100 + 5 * MiB
    assert nslots == 3                          # slots are reused after frees
    assert slots[0] == slots[2]


@pytest.mark.parametrize("events,match", [
    ([("free", 0x10, 5)], "not live"),
    ([("allocate", 0x10, 5), ("allocate", 0x10, 5)], "allocated twice"),
    ([("resize", 0x10, 5)], "unknown action"),
])
def test_bad_traces(tmp_path, events, match):
    p = write_trace(tmp_path / "bad.csv", events)
    with pytest.raises(SystemExit, match=match):
        replay.load_trace(p)


def test_replay_json(tmp_path, capsys):
    p = write_trace(tmp_path / "t.csv", SMALL)
    before = paddle_rt.memory_reserved("rt_cpu:1")
    assert replay.main([p, "--device", "rt_cpu:1", "--json", "--no-min-capacity", "--conf", "growth:exact"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["peak_live_requested"] == 2 * MiB + 100 + 5 * MiB
    assert res["peak_reserved"] >= res["peak_live_requested"]
    assert res["device_allocs"] >= 3 and res["events"] == len(SMALL)
    assert res["config"]["growth"] == "exact"
    assert paddle_rt.memory_reserved("rt_cpu:1") == before == 0     # everything given back
    paddle_rt.get_allocator("rt_cpu:1").configure(growth=None)


def test_min_capacity_bisection(tmp_path):
    """The smallest capacity found lets the trace complete and a slightly smaller one does not."""
    p = write_trace(tmp_path / "t.csv", SMALL)
    cap = replay.min_capacity(p, None, "growth:exact", 5 * MiB, 16 * MiB, tol=64 * 1024)
    assert replay._probe(p, None, "growth:exact", cap)
    assert not replay._probe(p, None, "growth:exact", cap - 64 * 1024)
    assert 7 * MiB <= cap <= 8 * MiB + 64 * 1024


@pytest.mark.skipif(not os.path.exists(os.path.join(TRACES, "resnet18_train.csv.gz")), reason="traces missing")
@pytest.mark.parametrize("name,paddle,torch", [
    ("resnet18_train", (297.8, 169), (308.0, 27)),
    ("mlp_varbatch", (202.2, 38), (190.0, 15)),
])
def test_models_reproduce_the_anchors(name, paddle, torch):
    trace = replay.load_trace(os.path.join(TRACES, f"{name}.csv.gz"))
    p = replay.run_model(replay.PaddleAutoGrowthModel(256, 0), trace)
    t = replay.run_model(replay.TorchCachingModel(), trace)
    assert (round(p["peak_reserved"] / MiB, 1), p["device_allocs"]) == paddle
    assert (round(t["peak_reserved"] / MiB, 1), t["device_allocs"]) == torch


@pytest.mark.skipif(not os.path.exists(os.path.join(TRACES, "resnet18_train.csv.gz")), reason="traces missing")
@pytest.mark.parametrize("name", ["resnet18_train", "mlp_varbatch"])
def test_default_policy_beats_both_on_real_traces(name, capsys):
    """The issue's target: on rt_cpu's default hints and an unbounded device, peak reserved no higher than Paddle's
    rules and no more device allocations than PyTorch's."""
    path = os.path.join(TRACES, f"{name}.csv.gz")
    assert replay.main([path, "--device", "rt_cpu:1", "--json", "--no-min-capacity", "--baselines"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["peak_reserved"] <= res["paddle"]["peak_reserved"]
    assert res["device_allocs"] <= res["torch"]["device_allocs"]
