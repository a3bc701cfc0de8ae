"""How long a job takes to end after a peer died (issue 33): `mpiexec -disable-auto-cleanup -n 2`, rank 1 leaves with
os._exit(3) after a first all_reduce, rank 0's next all_reduce raises CollectiveError naming rank 1, and rank 0 then
leaves Python normally. Measured per run: seconds from rank 0's "raised" line to the end of the job (the part that
used to hang in MPI_Finalize), and whether the run ended at all within the limit.

    python bench/dead_peer_exit.py --runs 50            # needs the mpi extra: pip install ".[mpi]"
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(os.path.dirname(HERE), "tests", "mpi", "ccl_worker.py")


def one_run(mpiexec, ranks, limit):
    import paddle_rt
    parent = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
    env = dict(os.environ, RT_CPU_CCL_TIMEOUT_MS="3000", RT_CPU_DEVICE_COUNT="2",
               PYTHONPATH=os.pathsep.join(p for p in (parent, os.environ.get("PYTHONPATH", "")) if p))
    start = time.monotonic()
    p = subprocess.Popen([mpiexec, "-disable-auto-cleanup", "-n", str(ranks), sys.executable, WORKER,
                          "exit_after_dead_peer"], cwd=parent, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    raised_at = []
    lines = []

    def read():
        for line in p.stdout:
            lines.append(line)
            if " raised: " in line:
                raised_at.append(time.monotonic())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        p.wait(timeout=limit)
        hung = False
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        hung = True
    end = time.monotonic()
    t.join(5)
    ok = sum(1 for line in lines if "OK exit_after_dead_peer" in line)
    after = end - max(raised_at) if raised_at else None
    return {"total": end - start, "after_raise": after, "hung": hung, "ok_ranks": ok, "rc": p.returncode,
            "output": "".join(lines)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bound", type=float, default=5.0, help="seconds after the raise the job must end within")
    ap.add_argument("--limit", type=float, default=120.0, help="a run still going after this many seconds is hung")
    args = ap.parse_args(argv)
    mpiexec = shutil.which("mpiexec") or shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        sys.exit("dead_peer_exit: mpiexec is not on PATH (pip install \".[mpi]\")")
    afters, bad = [], []
    for i in range(args.runs):
        r = one_run(mpiexec, args.ranks, args.limit)
        good = not r["hung"] and r["after_raise"] is not None and r["after_raise"] <= args.bound \
            and r["ok_ranks"] == args.ranks - 1
        if r["after_raise"] is not None:
            afters.append(r["after_raise"])
        if not good:
            bad.append((i, r))
        print(f"run {i + 1:3d}: total {r['total']:6.2f} s, after the raise "
              f"{'-' if r['after_raise'] is None else format(r['after_raise'], '.2f')} s, rc {r['rc']}"
              f"{', HUNG' if r['hung'] else ''}{'' if good else ', FAILED'}", flush=True)
    print(f"\n{args.runs - len(bad)} of {args.runs} runs ended within {args.bound:g} s of the raise; after the raise: "
          f"median {statistics.median(afters):.2f} s, max {max(afters):.2f} s" if afters else "no run raised")
    for i, r in bad[:3]:
        print(f"--- run {i + 1} output:\n{r['output']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
