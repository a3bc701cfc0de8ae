"""The host kernels' thread pool (paddle_rt/_core/engine/host_parallel.{h,cpp}, paddle_rt.op.set_num_threads):
its size and PADDLE_RT_NUM_THREADS, lazy start, results independent of the thread count, two streams sharing it
without oversubscription (evidence from the pool's chunk record, never wall time), and the operator tests rerun with
one thread."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import paddle_rt
from paddle_rt import ops, Stream, InvalidArgument
from paddle_rt.op import get_num_threads, set_num_threads, host_threads_info
from paddle_rt._core import op as _op
from conftest import package_parent

ml_dtypes = pytest.importorskip("ml_dtypes")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def threads():
    """Restores the thread limit after the test."""
    old = get_num_threads()
    yield
    set_num_threads(old)


def _run(code, env_threads):
    env = dict(os.environ)
    env.pop("PADDLE_RT_NUM_THREADS", None)
    if env_threads is not None:
        env["PADDLE_RT_NUM_THREADS"] = env_threads
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")   # the paddle_rt under test
    res = subprocess.run([sys.executable, "-c", code], cwd=package_parent(), env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


_INFO = """
import numpy as np, paddle_rt
from paddle_rt import ops
info = paddle_rt.op.host_threads_info()
ops.add(paddle_rt.tensor(np.ones(4, np.float32)), paddle_rt.tensor(np.ones(4, np.float32))).synchronize()
small = paddle_rt.op.host_threads_info()["started"]
x = paddle_rt.tensor(np.ones(1 << 20, np.float32))
ops.add(x, x).synchronize()
print(info["threads"], info["source"].split()[0], info["started"], small, paddle_rt.op.host_threads_info()["started"])
"""


def test_default_is_the_cpu_affinity_and_the_pool_starts_lazily():
    n = len(os.sched_getaffinity(0))
    threads, source, at_import, after_small, after_big = _run(_INFO, None).split()
    assert (int(threads), source) == (n, "affinity")
    assert int(at_import) == 0 and int(after_small) == 0       # nothing started before work worth splitting
    assert int(after_big) == n - 1                             # the caller is the n-th thread


@pytest.mark.parametrize("value, threads, started", [("1", 1, 0), ("3", 3, 2)])
def test_environment_variable_sets_the_size(value, threads, started):
    got = _run(_INFO, value).split()
    assert (int(got[0]), got[1], int(got[4])) == (threads, "PADDLE_RT_NUM_THREADS", started)


def test_invalid_environment_variable_is_ignored_and_reported():
    code = "import paddle_rt; i = paddle_rt.op.host_threads_info(); print(i['threads']); print(i['source'])"
    threads, source = _run(code, "lots").splitlines()
    assert int(threads) == len(os.sched_getaffinity(0))
    assert "PADDLE_RT_NUM_THREADS='lots' ignored" in source


def test_set_num_threads_checks_and_returns_the_previous(threads):
    old = get_num_threads()
    assert set_num_threads(1) == old
    assert get_num_threads() == 1
    for bad in (0, -2, 1.5, "2", True, 10 ** 6):
        with pytest.raises(InvalidArgument, match="set_num_threads"):
            set_num_threads(bad)
    assert get_num_threads() == 1
    info = host_threads_info()
    assert info["vector_isa"] in ("avx512", "avx2", "sse", "scalar") and isinstance(info["vector_erf"], bool)


def _all_ops(rng):
    """(name, thunk) of every host kernel on shapes large enough to be split."""
    x = rng.standard_normal((512, 1024), dtype=np.float32)
    y = rng.standard_normal((512, 1024), dtype=np.float32)
    w = rng.standard_normal(1024, dtype=np.float32)
    heads, dim = 8, 64
    seq = x.size // (heads * dim)
    ang = np.arange(seq)[:, None] / 10000 ** (np.arange(dim // 2)[None, :] * 2 / dim)
    sin, cos = np.sin(ang).astype(np.float32), np.cos(ang).astype(np.float32)
    pos = rng.permutation(seq).astype(np.int64)
    cases = []
    for dt in ("float32", "float16", "bfloat16", "float64"):
        tx, ty = paddle_rt.tensor(x, dtype=dt), paddle_rt.tensor(y, dtype=dt)
        tw = paddle_rt.tensor(w, dtype=dt if dt != "float64" else "float32")
        t3 = paddle_rt.tensor(x.reshape(seq, heads, dim), dtype=dt)
        ts, tc = paddle_rt.tensor(sin, dtype=dt), paddle_rt.tensor(cos, dtype=dt)
        tp = paddle_rt.tensor(pos)
        cases += [
            (f"add {dt}", lambda tx=tx, ty=ty: ops.add(tx, ty)),
            (f"mul {dt} strided", lambda tx=tx, ty=ty: ops.mul(tx[:, ::2], ty[:, 1::2])),
            (f"swiglu {dt}", lambda tx=tx, ty=ty: ops.swiglu(tx, ty)),
            (f"gelu {dt}", lambda tx=tx: ops.gelu(tx)),
            (f"gelu tanh {dt}", lambda tx=tx: ops.gelu(tx, approximate="tanh")),
            (f"silu {dt}", lambda tx=tx: ops.silu(tx)),
            (f"rms_norm {dt}", lambda tx=tx, tw=tw: ops.rms_norm(tx, tw)),
            (f"layer_norm {dt}", lambda tx=tx, tw=tw: ops.layer_norm(tx, tw, tw)),
            (f"causal_softmax {dt}", lambda tx=tx: ops.causal_softmax(tx)),
            (f"rope {dt}", lambda t3=t3, tp=tp, ts=ts, tc=tc: ops.rope(t3, tp, ts, tc)),
            (f"rope gpt_j {dt}", lambda t3=t3, tp=tp, ts=ts, tc=tc: ops.rope(t3, tp, ts, tc, algo="gpt_j")),
            (f"rearrange {dt}", lambda tx=tx: ops.rearrange(tx.T)),
        ]
    xi = paddle_rt.tensor(rng.integers(-1000, 1000, (512, 1024)).astype(np.int32))
    cases.append(("add int32", lambda: ops.add(xi, xi)))
    return cases


def test_results_do_not_depend_on_the_thread_count(threads):
    """Every kernel splits its work into whole rows or spans of elements, each computed by one thread with the same
    arithmetic as at one thread, and none reduces across threads: the documented bound is exact equality (0 ulp)
    for every operator, dtype and thread count."""
    cases = _all_ops(np.random.default_rng(0))
    results = {}
    for n in (1, 2, 3, 4):
        set_num_threads(n)
        for name, fn in cases:
            got = fn().numpy()
            if n == 1:
                results[name] = got
            else:
                np.testing.assert_array_equal(got.view(np.uint8), results[name].view(np.uint8),
                                              err_msg=f"{name} at {n} threads")


def _chunks(run):
    _op._pool_trace(True)
    try:
        run()
    finally:
        _op._pool_trace(False)
    return _op._pool_trace_take()


def _pool_chunks_started_above_limit(events, limit, window_ns=200_000):
    """Chunks of pool threads (slot > 0) that started while `limit` other chunks were already running: a pool thread
    joins only below the limit and gives way at its next chunk boundary when a caller arrives. (A chunk that another
    began less than window_ns before counts as concurrent arrival: the pool thread checked the count just before.)"""
    bad = []
    for e in events:
        if e[1] > 0 and sum(1 for o in events if o is not e and o[4] + window_ns < e[4] < o[5]) >= limit:
            bad.append(e)
    return bad


def _max_running(events):
    edges = sorted([(e[4], 1) for e in events] + [(e[5], -1) for e in events], key=lambda t: (t[0], t[1]))
    run = best = 0
    for _, d in edges:
        run += d
        best = max(best, run)
    return best


def _tiles(events):
    """True when the chunks' ranges (in the kernel's units: rows or spans of a row) cover [0, end) exactly once,
    in more than one chunk."""
    spans = sorted((e[2], e[3]) for e in events)
    return (len(spans) > 1 and spans[0][0] == 0 and all(a[0] < a[1] for a in spans)
            and all(a[1] == b[0] for a, b in zip(spans, spans[1:])))


def test_one_stream_gets_the_pool(threads):
    """With a limit of 2, a large elementwise op is cut into chunks that tile its range once; the pool's thread
    takes part (looked for over a few calls: a loaded machine may let the caller finish alone)."""
    set_num_threads(2)
    x = paddle_rt.tensor(np.ones(1 << 22, np.float32))
    slots = set()
    for _ in range(10):
        events = _chunks(lambda: ops.add(x, x).synchronize())
        jobs = {e[0] for e in events}
        assert len(jobs) == 1
        assert _tiles(events)
        assert _max_running(events) <= 2
        slots |= {e[1] for e in events}
        if 1 in slots:
            break
    assert 1 in slots and slots <= {0, 1}       # the pool's thread took chunks (the caller may have been preempted)


def test_two_streams_share_the_pool_without_oversubscription(threads):
    """Two streams launch large ops at the same moment (each held by a gate until both are queued): each call's
    chunks tile its range once, no pool thread starts a chunk while the limit's worth of chunks run (the callers
    always run their own calls; a pool thread gives way at its next chunk boundary), and the two calls ran at the
    same time (their chunk intervals overlap; looked for over a few rounds)."""
    limit = 2
    set_num_threads(limit)
    n = 1 << 22
    a = paddle_rt.tensor(np.full(n, 1.5, np.float32))
    b = paddle_rt.tensor(np.full(n, 2.5, np.float32))
    paddle_rt.current_stream().synchronize()     # uploaded on the current stream, read on two others
    overlapped = False
    with Stream() as s1, Stream() as s2:
        for _ in range(20):
            gate = threading.Event()
            outs = []

            def run():
                for s in (s1, s2):
                    s.add_callback(gate.wait, 30)
                outs.append(ops.mul(a, b, stream=s1))
                outs.append(ops.gelu(b, stream=s2))
                gate.set()
                s1.synchronize()
                s2.synchronize()

            events = _chunks(run)
            jobs = sorted({e[0] for e in events})
            assert len(jobs) == 2
            for j in jobs:
                assert _tiles([e for e in events if e[0] == j])
            assert _pool_chunks_started_above_limit(events, limit) == [], events
            assert _max_running(events) <= limit + (limit - 1), events   # at most a pool thread's chunk in progress
            assert (outs[0].numpy() == 3.75).all()
            first = [e for e in events if e[0] == jobs[0]]
            second = [e for e in events if e[0] == jobs[1]]
            if min(e[4] for e in second) < max(e[5] for e in first):
                overlapped = True
                break
    assert overlapped


def test_gemm_keeps_the_blas_threads_and_the_pool_idle(threads):
    """gemm goes through the BLAS (its own threads): the pool records no chunk for it."""
    set_num_threads(2)
    a = paddle_rt.tensor(np.ones((256, 256), np.float32))
    events = _chunks(lambda: ops.gemm(a, a).synchronize())
    assert events == []


@pytest.mark.parametrize("files", [["tests/test_ops.py", "tests/test_op.py"]])
def test_operator_tests_pass_with_one_thread(files, tmp_path):
    """The operator tests again in a fresh process with PADDLE_RT_NUM_THREADS=1 (this run has the default)."""
    env = dict(os.environ, PADDLE_RT_NUM_THREADS="1")
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")   # the paddle_rt under test
    # from a folder of its own: `python -m pytest` puts the cwd on sys.path, and the checkout's unbuilt sources there
    # would shadow an installed package
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *(os.path.join(ROOT, f) for f in files)],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert " passed" in res.stdout
