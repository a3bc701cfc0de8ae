"""The `stress` marker (issue 33): threads x streams x pools x record_stream x operators x collectives at small device
capacities, with rt_cpu's faults on and off, every result checked against numpy, memory back to 0 at the end.

The total time is PADDLE_RT_STRESS_SECONDS (default 60), split over the configurations below; `.ci/run` gives it 90 s.
Each configuration runs tests/stress_workload.py in a child process (the device capacity is read at load), and fails
on any wrong result, a hung thread, a crash, or memory not back to 0.

test_stress_ahead (issue 45): the workload's --ahead mode, the host running ahead of a device slowed by
RT_CPU_STREAM_DELAY_US (20-200 us per stream operation) at small capacities, so that donor pages, releases and
empty_cache(wait=False) happen while work is queued; each configuration gets the same share of the budget as one
above (PADDLE_RT_STRESS_SECONDS / len(CONFIGS))."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.stress, pytest.mark.slow]     # slow: not in the fast suite

MiB = 1 << 20
CONFIGS = [  # (victim threads, device capacity, faults)
    (4, 100 * MiB, False),
    (2, 32 * MiB, True),
    (6, 64 * MiB, False),
    (8, 1024 * MiB, True),
    (3, 48 * MiB, True),
    (4, 256 * MiB, False),
]


def _budget():
    return float(os.environ.get("PADDLE_RT_STRESS_SECONDS", "60"))


def _run_workload(args, seconds, cap, **env):
    import paddle_rt
    here = os.path.dirname(os.path.abspath(__file__))
    parent = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
    env = dict(os.environ, RT_CPU_MEMORY_BYTES=str(cap), PYTHONPATH=parent, RT_CPU_CCL_TIMEOUT_MS="60000", **env)
    cmd = [sys.executable, os.path.join(here, "stress_workload.py"), "--seconds", str(seconds)] + args
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=parent, timeout=seconds + 300)
    assert res.returncode == 0, (res.returncode, res.stdout[-2000:], res.stderr[-4000:])
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(out)
    assert out["wrong"] == 0, out["wrong_first"]
    assert not out["hung"]
    assert out["checks"] > 0
    assert out["live"] == [0, 0], out
    assert out["books_agree"], out["books"]          # the allocator's reserved bytes == the plugin's used bytes
    assert all(v == 0 for v in out["allocated"].values()), out
    return out


@pytest.mark.parametrize("threads,cap,faults", CONFIGS, ids=[f"t{t}-{c // MiB}M-{'faults' if f else 'clean'}"
                                                             for t, c, f in CONFIGS])
def test_stress(threads, cap, faults):
    seconds = max(3.0, _budget() / len(CONFIGS))
    args = ["--threads", str(threads), "--seed", str(threads * 7 + cap // MiB)] + (["--faults"] if faults else [])
    _run_workload(args, seconds, cap)


AHEAD = [  # (ahead threads, device capacity, device delay per stream operation in us)
    (3, 24 * MiB, 200),
    (4, 48 * MiB, 20),
    (2, 16 * MiB, 100),
]


@pytest.mark.parametrize("threads,cap,delay", AHEAD, ids=[f"t{t}-{c // MiB}M-{d}us" for t, c, d in AHEAD])
def test_stress_ahead(threads, cap, delay):
    """The host ahead of a slowed device: every byte read back right (a block reused too early is a wrong byte), the
    books agree, memory back to 0; with faults off the only errors are out-of-memory ones (the small capacity)."""
    seconds = max(3.0, _budget() / len(CONFIGS))
    args = ["--ahead", "--threads", str(threads), "--seed", str(threads * 11 + delay)]
    out = _run_workload(args, seconds, cap, RT_CPU_STREAM_DELAY_US=str(delay))
    assert out["ahead"] and out["delay_us"] == delay
    assert set(out["errors"]) <= {"OutOfMemoryError"}, out["errors"]
