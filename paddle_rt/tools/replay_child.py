"""Replays in a fresh process (``python -m paddle_rt.tools.replay`` as a child): the corpus's rows and the
minimum-capacity bisection's probes, each in a process of its own so that no replay's allocator state leaks into the
next. Imported by replay and corpus; imports neither."""
import os
import subprocess
import sys


def replay_child(args, device, conf_text, env):
    """``python -m paddle_rt.tools.replay ARGS [--device D] [--conf C]`` in a fresh process with ``env`` (the
    CompletedProcess, text captured). The child runs in another folder: give it absolute paths."""
    cmd = [sys.executable, "-m", "paddle_rt.tools.replay", *args]
    if device:
        cmd += ["--device", device]
    if conf_text:
        cmd += ["--conf", conf_text]
    # cwd: the folder holding this paddle_rt, so that the child imports it (not sources in the caller's folder)
    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=parent)


def _probe(path, device, conf_text, capacity):
    env = dict(os.environ)
    env["RT_CPU_MEMORY_BYTES"] = str(capacity)
    r = replay_child([os.path.abspath(path), "--probe", "--no-min-capacity"], device, conf_text, env)
    if r.returncode not in (0, 3):
        raise SystemExit(f"replay: probe at {capacity} bytes failed unexpectedly:\n{r.stderr}")
    return r.returncode == 0


def min_capacity(path, device, conf_text, lo, hi, tol=None, progress=None):
    """Smallest RT_CPU_MEMORY_BYTES (to within ``tol``, default 0.25% of hi) on which the replay completes."""
    tol = tol or max(256 * 1024, hi // 400)
    while not _probe(path, device, conf_text, hi):
        lo, hi = hi, hi * 2
    probes = 0
    while hi - lo > tol:
        mid = (lo + hi) // 2
        if _probe(path, device, conf_text, mid):
            hi = mid
        else:
            lo = mid
        probes += 1
        if progress:
            progress(probes)
    return hi


def _bisection_steps(lo, hi, tol=None):
    tol = tol or max(256 * 1024, hi // 400)
    steps = 0
    while hi - lo > tol:
        hi -= (hi - lo) // 2
        steps += 1
    return steps
