"""The torch column of ``python -m paddle_rt bench --only ops`` (paddle_rt/bench/_torch_ops.py): the add_rms_norm
and attention rows time the same computation on both sides (the bench checks it when it builds them, and stops with
an AssertionError otherwise) and each row's two callables run."""
import numpy as np
import pytest

import paddle_rt

torch = pytest.importorskip("torch")
from paddle_rt.bench import _torch_ops  # noqa: E402


def _data(n, rng):
    x, y = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal(n, dtype=np.float32)
    P = {"x": paddle_rt.tensor(x), "y": paddle_rt.tensor(y), "w": paddle_rt.tensor(w)}
    T = {"x": torch.from_numpy(x), "y": torch.from_numpy(y), "w": torch.from_numpy(w)}
    return P, T


def test_fused_llm_rows_compare_like_with_like():
    rng = np.random.default_rng(3)
    P, T = _data(256, rng)
    cases = _torch_ops._fused_llm_cases(torch, 256, rng, P, T, 1e-6)   # checks both sides agree as it builds
    assert [c[0].split()[0] for c in cases] == ["add_rms_norm", "attention", "attention"]
    assert all(c[0].split()[0] in _torch_ops.FUSED for c in cases)       # judged against the 2x target
    for _, ours, theirs in cases:
        ours()
        theirs()


def test_a_row_that_computes_something_else_stops_the_bench():
    with pytest.raises(AssertionError, match="bench ops: attention differs from torch's"):
        _torch_ops._same("attention", np.zeros(4, np.float32), np.full(4, 1e-3, np.float32))
