"""numpy references for the collectives, shared by tests/test_ccl.py (ranks in one process) and
tests/mpi/ccl_worker.py (ranks in MPI processes)."""
import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the test extra brings it
    ml_dtypes = None

_COMBINE = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def make_input(name, count, rng):
    """Small values (`rng`: a numpy Generator or a seed): integer sums stay in range, products of up to 4 ranks
    wrap only for the 8-bit types."""
    rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    dt = np_dtype(name)
    if name == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if name.startswith("uint"):
        return rng.integers(0, 6, count).astype(dt)
    if name.startswith("int"):
        return rng.integers(-5, 6, count).astype(dt)
    return rng.uniform(-4, 4, count).astype(np.float32).astype(dt)


def reduce_ref(op, xs, name):
    """What rt_cpu computes: ranks combined in rank order; float16/bfloat16 in float32 rounded once; integer SUM
    and PRODUCT wrap; integer AVG = wrapped sum / nranks truncated toward zero."""
    n = len(xs)
    dt = np_dtype(name)
    fn = _COMBINE[op]
    if name.startswith("float") or name == "bfloat16":
        acc_t = np.float64 if name == "float64" else np.float32
        acc = xs[0].astype(acc_t)
        for x in xs[1:]:
            acc = fn(acc, x.astype(acc_t))
        if op == "avg":
            acc = acc / acc_t(n)
        return acc.astype(dt)
    acc = xs[0].copy()
    with np.errstate(over="ignore"):
        for x in xs[1:]:
            acc = fn(acc, x).astype(dt)
    if op == "avg":
        acc = np.fix(acc.astype(np.float64) / n).astype(dt)
    return acc
