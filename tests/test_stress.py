"""The `stress` marker (issue 33): threads x streams x pools x record_stream x operators x collectives at small device
capacities, with rt_cpu's faults on and off, every result checked against numpy, memory back to 0 at the end.

The total time is PADDLE_RT_STRESS_SECONDS (default 60), split over the configurations below; `.ci/run` gives it 75 s.
The fork soak (tests/fork_workload.py, issue 46) and the reset race take a share of it on top (a tenth and a twentieth per
allocator mode).
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


# -- fork soak (issue 46 item 7) ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("expandable", ["1", "0"])
def test_fork_soak(expandable):
    """Parent threads allocate while the main thread forks children one after another (tests/fork_workload.py): every
    public call in a child raises ForkError at once before reinitialize_after_fork (none hangs on a lock a parent
    thread held at the fork), works after it, and the parent's memory is never touched. A share of
    PADDLE_RT_STRESS_SECONDS (a tenth, at least 3 s) per allocator mode."""
    import paddle_rt
    seconds = max(3.0, _budget() / 10)
    here = os.path.dirname(os.path.abspath(__file__))
    parent = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
    env = dict(os.environ, PYTHONPATH=parent, PADDLE_RT_ALLOC_CONF=f"expandable_segments:{expandable}")
    cmd = [sys.executable, os.path.join(here, "fork_workload.py"), "--seconds", str(seconds), "--threads", "2",
           "--child-timeout", "30"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=parent, timeout=seconds + 300)
    assert res.returncode == 0, (res.returncode, res.stdout[-2000:], res.stderr[-4000:])
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print({k: v for k, v in out.items() if k != "first"})
    assert out["forks"] >= 2
    assert out["hung"] == 0 and out["failed"] == 0, out["first"]
    assert out["parent_intact"]


# -- reset_allocator racing allocating threads (issue 46 item 4) --------------------------------------------------------
RESET_RACE = r"""
import json, sys, threading, time
import paddle_rt
seconds = float(sys.argv[1])
d = paddle_rt.device("rt_cpu:1")

def check(tag):
    s = paddle_rt.memory_stats(d)
    snap = paddle_rt.memory_snapshot(d)
    reserved = sum(seg["mapped_size"] if seg.get("expandable") else seg["total_size"] for seg in snap)
    allocated = sum(b["size"] for seg in snap for b in seg["blocks"] if b["state"] == "active_allocated")
    got = (s["reserved_bytes.all.current"], s["segment.all.current"], s["allocated_bytes.all.current"])
    want = (reserved, len(snap), allocated)
    if got != want or min(v for k, v in s.items() if k.endswith(".current")) < 0:
        print(json.dumps({"bad": tag, "stats": got, "snapshot": want}))
        sys.exit(1)

rounds = resets = refused = 0
end = time.monotonic() + seconds
while time.monotonic() < end or rounds < 3:
    stop = threading.Event()
    held = [[] for _ in range(2)]
    def work(mine, n):
        while not stop.is_set():
            mine.append(paddle_rt.malloc(n, device=d))
            if len(mine) > 3:
                mine.pop(0).free()
    threads = [threading.Thread(target=work, args=(held[i], n)) for i, n in enumerate((70144, 3 << 20))]
    for t in threads:
        t.start()
    for _ in range(20):
        try:
            paddle_rt.reset_allocator(d)
            resets += 1
        except paddle_rt.InvalidArgument:
            refused += 1
    stop.set()
    for t in threads:
        t.join()
    check("with blocks held")
    for mine in held:
        for a in mine:
            a.free()
    paddle_rt.empty_cache(d)
    check("after the frees and empty_cache")
    s = paddle_rt.memory_stats(d)
    assert (s["reserved_bytes.all.current"], s["segment.all.current"], s["allocated_bytes.all.current"]) == (0, 0, 0)
    rounds += 1
print(json.dumps({"rounds": rounds, "resets": resets, "refused": refused}))
"""


@pytest.mark.parametrize("expandable", ["1", "0"])
def test_reset_allocator_racing_threads_keeps_the_counters_true(expandable):
    """reset_allocator called again and again while two threads allocate and free: after each round the counters
    agree with the snapshot and return to 0 once everything is freed (they went to reserved -2 MiB, segments -1).
    A twentieth of PADDLE_RT_STRESS_SECONDS (at least 2 s) per allocator mode."""
    import paddle_rt
    seconds = max(2.0, _budget() / 20)
    parent = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
    env = dict(os.environ, PYTHONPATH=parent, PADDLE_RT_ALLOC_CONF=f"expandable_segments:{expandable}")
    res = subprocess.run([sys.executable, "-c", RESET_RACE, str(seconds)], capture_output=True, text=True, env=env,
                         cwd=parent, timeout=seconds + 120)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-4000:])
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(out)
    assert out["rounds"] >= 3 and out["resets"] + out["refused"] == 20 * out["rounds"]
