"""How long a process takes to exit after Ctrl-C with 60 s of work queued on each of four streams (issue 33):
the child of tests/test_gil_release_races.py's exit test, SIGINT half a second after it is ready, timed from the
signal to the process's end.

    python bench/exit_after_interrupt.py --runs 10
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from test_gil_release_races import EXIT_CHILD  # noqa: E402


def one_run(parent, work):
    script = os.path.join(work, "child.py")
    with open(script, "w") as f:
        f.write(EXIT_CHILD)
    count = os.path.join(work, "count")
    env = dict(os.environ, PYTHONPATH=parent, RT_CPU_FAULTS="memset:0:0:100000")
    p = subprocess.Popen([sys.executable, script, count], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         cwd=parent, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    took = time.monotonic() - t0
    ran = open(count, "rb").read().count(b"x") if os.path.exists(count) else 0
    os.remove(count) if os.path.exists(count) else None
    return took, ran, "KeyboardInterrupt" in err


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    import paddle_rt
    parent = os.path.dirname(os.path.dirname(os.path.abspath(paddle_rt.__file__)))
    times = []
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.runs):
            took, ran, interrupted = one_run(parent, work)
            times.append(took)
            print(f"run {i + 1:2d}: exit {took:.2f} s after SIGINT, {ran} of 600 callbacks ran, "
                  f"KeyboardInterrupt {'raised' if interrupted else 'MISSING'}", flush=True)
    print(f"\n{sum(t <= 2 for t in times)} of {len(times)} exited within 2 s; median {statistics.median(times):.2f} s, "
          f"max {max(times):.2f} s")


if __name__ == "__main__":
    main()
