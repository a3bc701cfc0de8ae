"""Collective benchmark (issue 6): all_reduce of float32 on rt_cpu, reported like nccl-tests.

    python bench/bench_ccl.py [--reps 5] [--max-mib 256] [--devices 2,4]

For each size: time per all_reduce (out of place, every rank issued from one thread; each rank's call runs on its
device's current stream), algbw = bytes / time, busbw = algbw * 2 * (n - 1) / n, against the memcpy bandwidth of the
same size measured in the same run (numpy.copyto of a host buffer). Figures are medians of --reps repetitions. The
4-device run happens in a child process (RT_CPU_DEVICE_COUNT=4) whose results are printed in the same table form.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

try:
    import paddle_rt
except ImportError:     # running from a checkout with an in-place build (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import paddle_rt

# The children import the same paddle_rt as this process.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))


def sizes(max_bytes):
    s = 1024
    while s <= max_bytes:
        yield s
        s *= 4 if s < (1 << 20) else 2


def iters_for(nbytes):
    return max(3, min(200, (256 << 20) // max(nbytes, 1)))


def run(n, max_bytes, reps):
    import paddle_rt
    from paddle_rt import ccl

    assert paddle_rt.device_count() >= n, f"need {n} devices"
    comms = ccl.comm_init_all([f"rt_cpu:{i}" for i in range(n)])
    rows = []
    for nbytes in sizes(max_bytes):
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
        rows.append({"n": n, "bytes": nbytes, "time_us": t * 1e6, "algbw": algbw, "busbw": busbw, "memcpy": cbw})
        del sends, recvs, once
    for c in comms:
        c.destroy()
    return rows


def show(rows):
    print(f"# all_reduce float32 sum, {rows[0]['n']} ranks (rt_cpu), out of place")
    print(f"{'size':>10} {'count':>11} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} "
          f"{'memcpy(GB/s)':>13} {'busbw/memcpy':>13}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['bytes'] // 4:>11} {r['time_us']:>10.1f} {r['algbw']:>12.2f} "
              f"{r['busbw']:>12.2f} {r['memcpy']:>13.2f} {r['busbw'] / r['memcpy']:>12.0%}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--devices", default="2,4")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    max_bytes = args.max_mib << 20
    if args.child:
        print("JSON" + json.dumps(run(args.child, max_bytes, args.reps)))
        return
    for n in (int(x) for x in args.devices.split(",")):
        if n == 2 and "RT_CPU_DEVICE_COUNT" not in os.environ:
            rows = run(2, max_bytes, args.reps)
        else:
            env = dict(os.environ, RT_CPU_DEVICE_COUNT=str(n), PYTHONPATH=PACKAGE_PARENT)
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(n), "--reps",
                                  str(args.reps), "--max-mib", str(args.max_mib)], env=env, capture_output=True,
                                 text=True)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                sys.exit(1)
            rows = json.loads(res.stdout.split("JSON", 1)[1])
        show(rows)
        print()


if __name__ == "__main__":
    main()
