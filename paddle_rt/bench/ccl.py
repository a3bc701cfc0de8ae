"""Collective benchmark (issue 6), run by ``python -m paddle_rt bench`` and by bench/bench_ccl.py: all_reduce of
float32 on rt_cpu, reported like nccl-tests.

For each size: time per all_reduce (out of place, every rank issued from one thread; each rank's call runs on its
device's current stream), algbw = bytes / time, busbw = algbw * 2 * (n - 1) / n, against the memcpy bandwidth of the
same size measured in the same run (numpy.copyto of a host buffer). Figures are medians of the repetitions. Runs on
more devices than this process has happen in a child process (``RT_CPU_DEVICE_COUNT``, read once per process).
Target: busbw >= 50% of memcpy at 64 MiB on 2 ranks.

Under mpiexec with more than one process (``mpiexec -n 2 python -m paddle_rt bench --only ccl``), the ranks are the
processes (``ccl.Communicator.from_mpi``, rt_cpu's MPI transport) and the table is nccl-tests' for all_reduce float32
from 8 B to 64 MiB, beside mpi4py's own ``Allreduce`` on numpy buffers of the same size, measured alternately in the
same run (each figure: the slowest rank's time, median of the repetitions). Rank 0 prints the table and reports the
figures. Targets: busbw >= 90% of raw MPI's at 64 MiB, latency <= 2x raw MPI's at 8 B.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import paddle_rt
from paddle_rt.bench import AreaSkipped, figure, result

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

            src = np.ones(nbytes, np.uint8)
            dst = np.empty(nbytes, np.uint8)
            np.copyto(dst, src)

            def copy_once(k):
                t0 = time.perf_counter()
                for _ in range(k):
                    np.copyto(dst, src)
                return (time.perf_counter() - t0) / k

            once(2)                                         # warm up (page faults, scratch buffers)
            ts, tcs = [], []
            for _ in range(reps):                           # alternate: both see the same machine load
                ts.append(once(it))
                tcs.append(copy_once(it))
            got = np.asarray(recvs[-1]).view(np.float32)
            assert got[0] == n * (n + 1) / 2 and got[-1] == got[0], "wrong all_reduce result"
            del got
            t, tc = statistics.median(ts), statistics.median(tcs)
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (n - 1) / n
            cbw = nbytes / tc / 1e9
            rows.append({"n": n, "bytes": nbytes, "time_us": t * 1e6, "algbw": algbw, "busbw": busbw,
                         "memcpy": cbw, "busbw_memcpy_pct": [100 * c * 2 * (n - 1) / n / a
                                                             for a, c in zip(ts, tcs)]})
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


MPI_BUSBW_PERCENT = 90.0
MPI_LATENCY_RATIO = 2.0


def mpi_world_size():
    """The number of processes mpiexec started (MPICH/Hydra, Open MPI, PMIx, Slurm), 1 when not under mpiexec."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 1


def mpi_sizes(max_bytes):
    s = 8
    while s <= max_bytes:
        yield s
        s *= 4 if s < max_bytes // 2 else 2


def mpi_iters(nbytes):
    return max(3, min(1000, (64 << 20) // max(nbytes, 1) // 4))


def run_mpi(max_bytes, reps):
    """Rows {"n", "bytes", "time_us", "algbw", "busbw", "mpi_time_us", "mpi_algbw", "mpi_busbw"} on this rank (the
    times are the slowest rank's): paddle_rt's all_reduce over the processes, and mpi4py's Allreduce."""
    from mpi4py import MPI
    from paddle_rt import ccl

    world = MPI.COMM_WORLD
    comm = ccl.Communicator.from_mpi()
    n = comm.nranks
    stream = paddle_rt.current_stream(comm.device)
    rows = []
    try:
        for nbytes in mpi_sizes(max_bytes):
            count = nbytes // 4
            send = paddle_rt.malloc(nbytes, device=comm.device)
            recv = paddle_rt.malloc(nbytes, device=comm.device)
            np.asarray(send).view(np.float32)[:] = comm.rank + 1
            a = np.full(count, comm.rank + 1, np.float32)
            b = np.empty(count, np.float32)
            it = mpi_iters(nbytes)

            def ours(k):
                world.Barrier()
                t0 = time.perf_counter()
                for _ in range(k):
                    ccl.all_reduce(send, recv, "sum", comm=comm, stream=stream, count=count, dtype="float32")
                stream.synchronize()
                return world.allreduce((time.perf_counter() - t0) / k, op=MPI.MAX)

            def raw(k):
                world.Barrier()
                t0 = time.perf_counter()
                for _ in range(k):
                    world.Allreduce(a, b, op=MPI.SUM)
                return world.allreduce((time.perf_counter() - t0) / k, op=MPI.MAX)

            warm = 200 if not rows else 2       # the first size also warms both paths up (lazy MPI setup)
            ours(warm)
            raw(warm)
            t_ours, t_raw = [], []
            for _ in range(reps * (3 if nbytes <= 8192 else 1)):   # alternate: both see the same machine load
                t_ours.append(ours(it))
                t_raw.append(raw(it))
            got = np.asarray(recv).view(np.float32)
            assert got[0] == n * (n + 1) / 2 and got[-1] == got[0], "wrong all_reduce result"
            assert b[0] == got[0], "wrong MPI_Allreduce result"
            del got
            t, tm = statistics.median(t_ours), statistics.median(t_raw)
            factor = 2 * (n - 1) / n
            rows.append({"n": n, "bytes": nbytes, "time_us": t * 1e6, "algbw": nbytes / t / 1e9,
                         "busbw": nbytes / t / 1e9 * factor, "mpi_time_us": tm * 1e6,
                         "mpi_algbw": nbytes / tm / 1e9, "mpi_busbw": nbytes / tm / 1e9 * factor,
                         "time_ratios": [a / b for a, b in zip(t_ours, t_raw)]})
            del send, recv
    finally:
        comm.destroy()
    return rows


def show_mpi(rows):
    print(f"# all_reduce float32 sum, {rows[0]['n']} processes (ccl.Communicator.from_mpi, rt_cpu over MPI), out "
          f"of place, beside mpi4py Allreduce on numpy buffers")
    print(f"{'size':>10} {'count':>10} {'time(us)':>10} {'algbw':>8} {'busbw':>8}   {'MPI time':>10} {'algbw':>8} "
          f"{'busbw':>8}   {'time/MPI':>8}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['bytes'] // 4:>10} {r['time_us']:>10.1f} {r['algbw']:>8.3f} {r['busbw']:>8.3f}   "
              f"{r['mpi_time_us']:>10.1f} {r['mpi_algbw']:>8.3f} {r['mpi_busbw']:>8.3f}   "
              f"{r['time_us'] / r['mpi_time_us']:>8.2f}")
    print("(algbw, busbw in GB/s; busbw = algbw * 2 * (n - 1) / n; times: the slowest rank's, medians)")


def measure_mpi(quick=False):
    try:
        from mpi4py import MPI
    except ImportError:
        raise AreaSkipped("started by mpiexec, but mpi4py is missing (pip install \".[mpi]\")") from None
    rows = run_mpi(TARGET_BYTES, 3 if quick else 7)
    rank = MPI.COMM_WORLD.Get_rank()
    if rank != 0:
        raise AreaSkipped(f"rank {rank} of {rows[0]['n']}: rank 0 prints the figures")
    show_mpi(rows)
    small, big = rows[0], rows[-1]
    n = big["n"]
    pct = 100 * big["busbw"] / big["mpi_busbw"]
    lat = small["time_us"] / small["mpi_time_us"]
    return [
        result(AREA, f"all_reduce {n} processes {_mib(big['bytes'])}: busbw", big["busbw"], "GB/s",
               note=f"{big['time_us'] / 1000:.1f} ms per call"),
        result(AREA, f"mpi4py Allreduce {_mib(big['bytes'])}, same run: busbw", big["mpi_busbw"], "GB/s"),
        figure(AREA, f"  busbw / MPI's at {_mib(big['bytes'])}", [100 / x for x in big["time_ratios"]], "%",
               at_least=MPI_BUSBW_PERCENT, note=f"median of the alternated pairs; ratio of medians {pct:.0f}%"),
        result(AREA, f"all_reduce {n} processes {small['bytes']} B: time", small["time_us"], "us"),
        result(AREA, f"mpi4py Allreduce {small['bytes']} B, same run: time", small["mpi_time_us"], "us"),
        figure(AREA, f"  time / MPI's at {small['bytes']} B", small["time_ratios"], "x", at_most=MPI_LATENCY_RATIO,
               note=f"median of the alternated pairs; ratio of medians {lat:.2f}x"),
    ]


def measure(quick=False):
    """all_reduce on 2 ranks at 1 MiB and 64 MiB (and, not quick, 4 ranks at 64 MiB in a child process)."""
    if mpi_world_size() > 1:
        return measure_mpi(quick)
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
        out.append(figure(AREA, f"  {tag}: busbw / memcpy", r["busbw_memcpy_pct"], "%", at_least=BUSBW_PERCENT,
                          note=f"needs both cores free; ratio of medians {pct:.0f}%"))
    if not quick:
        for r in run_in_child(4, TARGET_BYTES, reps, [TARGET_BYTES]):
            out.append(result(AREA, f"all_reduce 4 ranks {_mib(r['bytes'])}: busbw", r["busbw"], "GB/s",
                              note=f"{100 * r['busbw'] / r['memcpy']:.0f}% of memcpy; 4 ranks on 2 cores"))
    return out


if __name__ == "__main__":            # the child of run_in_child: N MAX_BYTES REPS [SIZE,...]
    _n, _max, _reps = (int(x) for x in sys.argv[1:4])
    _only = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
    print(_MARK + json.dumps(run(_n, _max, _reps, _only)))
