"""paddle_rt/tools/replay_loader.py: the two-stream data-loader workload of issue 45 (a copy stream uploads batches
that a compute stream uses), run on a lagging device (rt_cpu's RT_CPU_STREAM_DELAY_US) so that the host runs ahead:
every batch's result is right, the check catches the bug of a batch freed without its use declared, and the pool's
peak with the host running ahead stays that of the host waiting."""
import json

import pytest

from paddle_rt.tools import replay_loader

CHILD = r"""
import json
from paddle_rt.tools import replay_loader
print(json.dumps(replay_loader.run({api!r}, wait={wait}, batches=16, batch_bytes=1 << 20, unsafe={unsafe})))
"""


def _run(run_python, api, mode, unsafe=False, delay="200"):
    code = CHILD.format(api=api, wait=mode == "waiting", unsafe=unsafe)
    res = run_python(code, env={"RT_CPU_STREAM_DELAY_US": delay})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("api", ["malloc", "pool"])
@pytest.mark.parametrize("mode", ["waiting", "ahead"])
def test_every_batch_arrives_intact(run_python, api, mode):
    r = _run(run_python, api, mode)
    assert (r["api"], r["mode"], r["batches"]) == (api, mode, 16)
    assert r["wrong"] == 0
    assert r["peak_reserved"] >= 3 * (1 << 20)          # the batch in use, the next one and the activation


@pytest.mark.parametrize("api", ["malloc", "pool"])
def test_the_check_catches_a_batch_freed_without_its_use(run_python, api):
    """Without record_stream / free_async on the compute stream and without the copy stream's wait, the next
    upload reuses a batch the lagging compute stream has not read yet: wrong results, and the check sees them."""
    r = _run(run_python, api, "ahead", unsafe=True)
    assert r["wrong"] > 0


def test_pool_running_ahead_keeps_the_waiting_peak(run_python):
    """free_async on the compute stream and the copy stream's wait on the compute stream's event: the copy stream
    reuses the batch two steps back in stream order, however far ahead the host is (target <= 1.05x)."""
    w = _run(run_python, "pool", "waiting")
    a = _run(run_python, "pool", "ahead")
    assert a["peak_reserved"] <= replay_loader.LOADER_LIMIT * w["peak_reserved"]


def test_batch_content_differs_between_batches():
    a, b = replay_loader.batch_content(0, 4096), replay_loader.batch_content(1, 4096)
    assert a.dtype.name == "uint8" and len(a) == 4096
    assert (a != b).mean() > 0.9 and len(set(a.tolist())) > 200


def test_report_lines():
    fig = {"peak_reserved": 4 << 20, "maps": 2, "unmaps": 0, "wrong": 0, "seconds": 0.5}
    res = {"delay_us": 20, "pool": {"waiting": fig, "ahead": dict(fig, peak_reserved=5 << 20), "ratio": 1.25}}
    lines = replay_loader.report(res)
    assert lines[0].startswith("two-stream loader: 48 batches of 1 MiB") and "20 us" in lines[0]
    assert "ahead/waiting 1.250 (OVER 1.05)" in lines[2] and "4.0 MiB" in lines[2] and "5.0 MiB" in lines[2]
    assert lines[4].split()[-2:] == ["0", "0"]
    assert not any(ln.split()[:1] == ["malloc"] for ln in lines)


def test_conf_reaches_the_loader_child(tmp_path):
    """``replay --loader --conf expandable_segments:0``: the children configure their allocator (no page mapped)."""
    res = replay_loader.run_fresh("pool", "waiting", conf_text="expandable_segments:0", delay_us=0)
    assert res["maps"] == 0 and res["wrong"] == 0
    res = replay_loader.run_fresh("pool", "waiting", delay_us=0)
    assert res["maps"] > 0
