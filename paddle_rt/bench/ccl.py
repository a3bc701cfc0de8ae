"""Collective benchmark (issue 6), run by ``python -m paddle_rt bench`` and by bench/bench_ccl.py: all_reduce of
float32 on rt_cpu, reported like nccl-tests.

For each size: time per all_reduce (out of place, every rank issued from one thread; each rank's call runs on its
device's current stream), algbw = bytes / time, busbw = algbw * 2 * (n - 1) / n, against the memcpy bandwidth of the
same size measured in the same run (numpy.copyto of a host buffer). Figures are medians of the repetitions. Runs on
more devices than this process has happen in a child process (``RT_CPU_DEVICE_COUNT``, read once per process).
Target: busbw >= 50% of memcpy at 64 MiB on 2 ranks.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import paddle_rt
from paddle_rt.bench import AreaSkipped, result, at_least

AREA = "ccl"
BUSBW_PERCENT = 50.0
TARGET_BYTES = 64 << 20
# The children import the same paddle_rt as this process.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
_MARK = "JSON"


def sizes(max_bytes):
    s = 1024
    while s <= max_bytes:
        yield s
        s *= 4 if s < (1 << 20) else 2


def iters_for(nbytes):
    return max(3, min(200, (256 << 20) // max(nbytes, 1)))


def run(n, max_bytes, reps, only_sizes=None):
    """Rows {"n", "bytes", "time_us", "algbw", "busbw", "memcpy"} (GB/s) for every size up to ``max_bytes`` (or for
    ``only_sizes``), on rt_cpu:0..n-1 of this process."""
    from paddle_rt import ccl

    if paddle_rt.device_count("rt_cpu") < n:
        raise RuntimeError(f"ccl benchmark: needs {n} rt_cpu devices, this process has "
                           f"{paddle_rt.device_count('rt_cpu')} (RT_CPU_DEVICE_COUNT)")
    comms = ccl.comm_init_all([f"rt_cpu:{i}" for i in range(n)])
    rows = []
    try:
        for nbytes in (only_sizes or sizes(max_bytes)):
            count = nbytes // 4
            sends = [paddle_rt.malloc(nbytes, device=c.device) for c in comms]
            recvs = [paddle_rt.malloc(nbytes, device=c.device) for c in comms]
            for i, a in enumerate(sends):
                np.asarray(a).view(np.float32)[:] = i + 1
            it = iters_for(nbytes)

            def once(k):
                works = None
                t0 = time.perf_counter()
                for _ in range(k):
                    works = [ccl.all_reduce(s, r, "sum", comm=c, count=count, dtype="float32")
                             for s, r, c in zip(sends, recvs, comms)]
                for w in works:
                    w.wait()
                return (time.perf_counter() - t0) / k

            once(2)                                         # warm up (page faults, scratch buffers)
            t = statistics.median(once(it) for _ in range(reps))
            got = np.asarray(recvs[-1]).view(np.float32)
            assert got[0] == n * (n + 1) / 2 and got[-1] == got[0], "wrong all_reduce result"
            del got
            src = np.ones(nbytes, np.uint8)
            dst = np.empty(nbytes, np.uint8)
            np.copyto(dst, src)

            def copy_once(k):
                t0 = time.perf_counter()
                for _ in range(k):
                    np.copyto(dst, src)
                return (time.perf_counter() - t0) / k

            tc = statistics.median(copy_once(it) for _ in range(reps))
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (n - 1) / n
            cbw = nbytes / tc / 1e9
            rows.append({"n": n, "bytes": nbytes, "time_us": t * 1e6, "algbw": algbw, "busbw": busbw,
                         "memcpy": cbw})
            del sends, recvs, once
    finally:
        for c in comms:
            c.destroy()
    return rows


def run_in_child(n, max_bytes, reps, only_sizes=None):
    """run() in a child process with RT_CPU_DEVICE_COUNT=n (a process's device count is fixed at start)."""
    env = dict(os.environ, RT_CPU_DEVICE_COUNT=str(n), PYTHONPATH=PACKAGE_PARENT)
    cmd = [sys.executable, "-m", __name__, str(n), str(max_bytes), str(reps)]
    if only_sizes:
        cmd.append(",".join(str(s) for s in only_sizes))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=PACKAGE_PARENT)
    if res.returncode != 0 or _MARK not in res.stdout:
        raise RuntimeError(f"ccl benchmark on {n} devices failed in its child process:\n{res.stderr}")
    return json.loads(res.stdout.split(_MARK, 1)[1])


def run_on(n, max_bytes, reps, only_sizes=None):
    """run() here when this process has exactly the default device count and n fits, else in a child."""
    if n == 2 and "RT_CPU_DEVICE_COUNT" not in os.environ:
        return run(n, max_bytes, reps, only_sizes)
    return run_in_child(n, max_bytes, reps, only_sizes)


def show(rows):
    print(f"# all_reduce float32 sum, {rows[0]['n']} ranks (rt_cpu), out of place")
    print(f"{'size':>10} {'count':>11} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} "
          f"{'memcpy(GB/s)':>13} {'busbw/memcpy':>13}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['bytes'] // 4:>11} {r['time_us']:>10.1f} {r['algbw']:>12.2f} "
              f"{r['busbw']:>12.2f} {r['memcpy']:>13.2f} {r['busbw'] / r['memcpy']:>12.0%}")


def _mib(n):
    return f"{n >> 20} MiB" if n >= (1 << 20) else f"{n >> 10} KiB"


def measure(quick=False):
    """all_reduce on 2 ranks at 1 MiB and 64 MiB (and, not quick, 4 ranks at 64 MiB in a child process)."""
    reps = 3 if quick else 5
    try:
        have = paddle_rt.device_count("rt_cpu")
    except Exception:             # rt_cpu not loaded (PADDLE_RT_NO_RT_CPU=1)
        have = 0
    if have < 2 and "RT_CPU_DEVICE_COUNT" not in os.environ:
        raise AreaSkipped(f"needs 2 rt_cpu devices, this process has {have}")
    out = []
    for r in run_on(2, TARGET_BYTES, reps, [1 << 20, TARGET_BYTES]):
        tag = f"all_reduce 2 ranks {_mib(r['bytes'])}"
        if r["bytes"] != TARGET_BYTES:
            out.append(result(AREA, f"{tag}: time", r["time_us"], "us",
                              note=f"busbw {r['busbw']:.2f} GB/s, memcpy {r['memcpy']:.2f} GB/s"))
            continue
        pct = 100 * r["busbw"] / r["memcpy"]
        out.append(result(AREA, f"{tag}: busbw", r["busbw"], "GB/s", note=f"{r['time_us'] / 1000:.1f} ms per call"))
        out.append(result(AREA, f"numpy.copyto {_mib(r['bytes'])}, same run", r["memcpy"], "GB/s"))
        out.append(result(AREA, f"  {tag}: busbw / memcpy", pct, "%", *at_least(pct, BUSBW_PERCENT, "%"),
                          note="needs both cores free"))
    if not quick:
        for r in run_in_child(4, TARGET_BYTES, reps, [TARGET_BYTES]):
            out.append(result(AREA, f"all_reduce 4 ranks {_mib(r['bytes'])}: busbw", r["busbw"], "GB/s",
                              note=f"{100 * r['busbw'] / r['memcpy']:.0f}% of memcpy; 4 ranks on 2 cores"))
    return out


if __name__ == "__main__":            # the child of run_in_child: N MAX_BYTES REPS [SIZE,...]
    _n, _max, _reps = (int(x) for x in sys.argv[1:4])
    _only = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
    print(_MARK + json.dumps(run(_n, _max, _reps, _only)))
