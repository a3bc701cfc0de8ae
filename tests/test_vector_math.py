"""The vectorised elementwise loop (paddle_rt/_core/engine/vector_math.{h,cpp}, vector_math_lanes.inc): every
instruction-set variant the CPU runs (PADDLE_RT_VECTOR_ISA caps the choice in a child process, for tests only) against
float64 references, with the measured error bounds stated here; tails that are not a multiple of the vector width,
special values (inf, NaN, subnormals, signed zeros), float16/bfloat16 rounding to nearest even inside the loop, strided
and in-place operands."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import paddle_rt
from paddle_rt import ops
from conftest import package_parent

ml_dtypes = pytest.importorskip("ml_dtypes")
scipy_special = pytest.importorskip("scipy.special")
BF16 = ml_dtypes.bfloat16
ISAS = ("scalar", "sse", "avx2", "avx512")
UNARY = ("gelu", "gelu_tanh", "silu")
BINARY = ("add", "sub", "mul", "swiglu")
DTYPES = ("float32", "float16", "bfloat16")
FLT_MIN = float(np.finfo(np.float32).tiny)
SMALL = 1e-30   # results below it are checked in absolute terms (x / (1 + exp(-x)) and the like round them to 0 once
                # exp(-x) overflows, as torch's do; the absolute error stays below SMALL)

# Measured on an AVX-512 machine, every variant (scalar, sse, avx2, avx512); the bounds have a margin of about 2x:
# the largest relative error of the float32 results against float64 where |float64 value| >= SMALL, split by |x|
# (the float32 rounding of the argument, e.g. x / sqrt 2 in gelu, moves exp(-x^2 / 2) by up to x^2 ulp: any float32
# gelu has it).
#   gelu (erf)  |x| <= 4: 1.3e-6    all: 1.2e-5
#   gelu tanh   |x| <= 4: 1.3e-6    all: 9.9e-6
#   silu        1.4e-7 (about 1.2 ulp);  swiglu 1.7e-7
REL_BOUND = {"gelu": (2.5e-6, 3e-5), "gelu_tanh": (2.5e-6, 2e-5), "silu": (2.5e-7, 2.5e-7), "swiglu": (3e-7, 3e-7)}

_CHILD = r"""
import sys
import numpy as np
import ml_dtypes
import paddle_rt
from paddle_rt import ops
d = dict(np.load(sys.argv[1]))
out = {"isa": np.array(paddle_rt.op.host_threads_info()["vector_isa"])}
for dt in ("float32", "float16", "bfloat16"):
    np_dt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.dtype(dt)
    x, y = (paddle_rt.tensor(d[k].astype(np.float32).astype(np_dt)) for k in ("x", "y"))
    res = {"gelu": ops.gelu(x), "gelu_tanh": ops.gelu(x, approximate="tanh"), "silu": ops.silu(x),
           "add": ops.add(x, y), "sub": ops.sub(x, y), "mul": ops.mul(x, y), "swiglu": ops.swiglu(y, x)}
    for k, v in res.items():
        out[f"{k}_{dt}"] = v.numpy().astype(np.float32)
np.savez(sys.argv[2], **out)
"""


def _inputs():
    rng = np.random.default_rng(25)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3e-39, -3e-39, FLT_MIN, -FLT_MIN,
                        3.4e38, -3.4e38, 88.5, -88.5, 104.0, -104.0, 200.0, -200.0, 1e-30, -1e-30], np.float32)
    x = np.concatenate([special, rng.standard_normal(10007).astype(np.float32) * 4,
                        np.linspace(-12, 12, 4099, dtype=np.float32)])
    y = np.concatenate([rng.standard_normal(len(special)).astype(np.float32),
                        rng.standard_normal(len(x) - len(special)).astype(np.float32) * 4])
    # float16 ties: 1 + 2^-11 (to 1.0, even), 1 + 3 * 2^-11 (to 1 + 2^-9, even); bfloat16: 1 + 2^-8, 3 + 3 * 2^-7
    x[-8:] = [1.0, 1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 3.0]
    y[-8:] = [2.0 ** -11, 3 * 2.0 ** -11, 2.0 ** -8, 3 * 2.0 ** -7, 2.0 ** -11, 3 * 2.0 ** -11, 2.0 ** -8,
              3 * 2.0 ** -7]
    return x, y


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """{isa: results} for every instruction set this CPU runs, each computed in a child process."""
    d = tmp_path_factory.mktemp("vm")
    x, y = _inputs()
    np.savez(d / "in.npz", x=x, y=y)
    env = dict(os.environ)
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")   # the paddle_rt under test
    got = {}
    for isa in ISAS:
        env["PADDLE_RT_VECTOR_ISA"] = isa
        res = subprocess.run([sys.executable, "-c", _CHILD, str(d / "in.npz"), str(d / f"{isa}.npz")],
                             cwd=package_parent(), env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        r = dict(np.load(d / f"{isa}.npz"))
        if str(r["isa"]) == isa:             # a cap above what the CPU runs gives a lower set: tested under its name
            got[isa] = r
    assert "scalar" in got and "sse" in got or paddle_rt.op.host_threads_info()["vector_isa"] in ("scalar", "vector")
    return x, y, got


def _reference(name, x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "gelu":   # 0.5 x (1 + erf(x / sqrt 2)), through erfc for negative x (no cancellation)
            return np.where(x < 0, 0.5 * x * scipy_special.erfc(-x / math.sqrt(2)),
                            0.5 * x * (1 + scipy_special.erf(x / math.sqrt(2))))
        if name == "gelu_tanh":
            return x / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        if name == "silu":
            return x / (1 + np.exp(-x))
        if name == "swiglu":  # swiglu(a=y, b=x) = y * x * sigmoid(x)
            return y * x / (1 + np.exp(-x))
        return {"add": x + y, "sub": x - y, "mul": x * y}[name]


def _rel_error(got, want, mask):
    g, w = got.astype(np.float64)[mask], want[mask]
    return float(np.max(np.abs(g - w) / np.abs(w))) if w.size else 0.0


@pytest.mark.parametrize("name", UNARY + ("swiglu",))
def test_float32_error_bounds_every_isa(variants, name):
    x, y, got = variants
    want = _reference(name, x, y)
    normal = np.isfinite(want) & (np.abs(want) >= SMALL)
    small_x = np.abs(x) <= 4
    inner, outer = REL_BOUND[name]
    for isa, r in got.items():
        g = r[f"{name}_float32"]
        assert _rel_error(g, want, normal & small_x) <= inner, (isa, name)
        assert _rel_error(g, want, normal) <= outer, (isa, name)
        tiny = np.isfinite(want) & (np.abs(want) < SMALL)
        assert np.all(np.abs(g[tiny].astype(np.float64) - want[tiny]) < SMALL), (isa, name)
        # NaN exactly where float64 gives NaN, infinities where it gives them (same sign)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(want), err_msg=f"{isa} {name} NaN")
        np.testing.assert_array_equal(g[np.isinf(want)], want[np.isinf(want)], err_msg=f"{isa} {name} inf")


def test_specials_by_value(variants):
    """The special inputs at the start of _inputs(), by index."""
    _, _, got = variants
    for isa, r in got.items():
        gelu, silu = r["gelu_float32"], r["silu_float32"]
        assert gelu[2] == np.inf and silu[2] == np.inf, isa                       # +inf
        assert np.isnan(gelu[3]) and np.isnan(silu[3]), isa                       # -inf: -inf * 0
        assert np.isnan(gelu[4]) and np.isnan(silu[4]), isa                       # NaN
        assert gelu[1] == 0 and math.copysign(1, gelu[1]) == -1, isa              # gelu(-0) = -0
        assert gelu[5] == pytest.approx(0.5e-40, rel=0.02) and silu[5] == pytest.approx(0.5e-40, rel=0.02), isa
        assert gelu[11] == np.float32(3.4e38) and silu[11] == np.float32(3.4e38), isa
        assert gelu[13] == np.float32(88.5) and silu[13] == np.float32(88.5), isa
        assert gelu[14] == 0, isa
        assert silu[14] == pytest.approx(-88.5 * math.exp(-88.5), rel=1e-5), isa  # exp(88.5) is still finite
        assert silu[18] == 0 and gelu[18] == 0, isa                               # -200: exp(200) overflows


@pytest.mark.parametrize("dt", DTYPES)
def test_add_sub_mul_exact_every_isa(variants, dt):
    """Computed in float32 and rounded once to the dtype (nearest even): the same bits as numpy's float32 arithmetic
    followed by numpy's / ml_dtypes' cast, ties included (the inputs end with float16 and bfloat16 ties)."""
    x, y, got = variants
    np_dt = BF16 if dt == "bfloat16" else np.dtype(dt)
    with np.errstate(all="ignore"):
        xs, ys = x.astype(np_dt).astype(np.float32), y.astype(np_dt).astype(np.float32)
        want = {"add": xs + ys, "sub": xs - ys, "mul": xs * ys}
    for isa, r in got.items():
        for name, w in want.items():
            np.testing.assert_array_equal(r[f"{name}_{dt}"], w.astype(np_dt).astype(np.float32),
                                          err_msg=f"{isa} {name} {dt}")
    if dt == "float16":   # the explicit ties: 1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9
        assert got["scalar"]["add_float16"][-8:-6].tolist() == [1.0, 1.0 + 2.0 ** -9]


@pytest.mark.parametrize("dt", ("float16", "bfloat16"))
def test_half_activations_every_isa(variants, dt):
    """float16/bfloat16 activations: the float32 result rounded once, so within one unit of the dtype's last place
    (plus the float32 error) of float64."""
    x, y, got = variants
    np_dt = BF16 if dt == "bfloat16" else np.dtype(dt)
    ulp = 2.0 ** -10 if dt == "float16" else 2.0 ** -7
    with np.errstate(over="ignore"):
        xs = x.astype(np_dt).astype(np.float32)
    for name in UNARY:
        want = _reference(name, xs, y)
        smallest = 6.1e-5 if dt == "float16" else SMALL
        ok = np.isfinite(want) & (np.abs(want) >= smallest) & (np.abs(want) < 6e4)
        for isa, r in got.items():
            assert _rel_error(r[f"{name}_{dt}"], want, ok) <= ulp * 0.5 + 1e-4, (isa, name, dt)


@pytest.mark.smoke
@pytest.mark.parametrize("dt", DTYPES)
def test_tails_match_full_vectors(dt):
    """A length that is not a multiple of the vector width gives the bits the full vectors give: the fused loop's
    tails (64 elements and more: every tail length of a 16-lane vector) and the few-element path (below 64)."""
    np_dt = BF16 if dt == "bfloat16" else np.dtype(dt)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(131) * 3).astype(np_dt)
    y = (rng.standard_normal(131) * 3).astype(np_dt)
    full = {name: fn(paddle_rt.tensor(x), paddle_rt.tensor(y)).numpy() for name, fn in _FNS.items()}
    for n in list(range(1, 35)) + [47, 63] + list(range(64, 83)) + [127]:
        for name, fn in _FNS.items():
            part = fn(paddle_rt.tensor(x[:n]), paddle_rt.tensor(y[:n])).numpy()
            np.testing.assert_array_equal(part.view(np.uint8), full[name][:n].view(np.uint8), err_msg=f"{name} {n}")


_FNS = {"gelu": lambda a, b: ops.gelu(a), "gelu_tanh": lambda a, b: ops.gelu(a, approximate="tanh"),
        "silu": lambda a, b: ops.silu(a), "swiglu": ops.swiglu, "add": ops.add, "mul": ops.mul}


@pytest.mark.smoke
@pytest.mark.parametrize("dt", DTYPES)
def test_strided_and_in_place(dt):
    """Strided operands take the blocked path, in-place ones the vector loop: both give the contiguous results."""
    np_dt = BF16 if dt == "bfloat16" else np.dtype(dt)
    rng = np.random.default_rng(4)
    big = (rng.standard_normal((9, 2 * 131)) * 3).astype(np_dt)
    t = paddle_rt.tensor(big)
    view = t[:, ::2]                                  # last stride 2
    dense = paddle_rt.tensor(np.ascontiguousarray(big[:, ::2]))
    for name, fn in _FNS.items():
        np.testing.assert_array_equal(fn(view, view).numpy().view(np.uint8), fn(dense, dense).numpy().view(np.uint8),
                                      err_msg=name)
    a = paddle_rt.tensor(np.ascontiguousarray(big[:, :131]))
    want = ops.gelu(a).numpy()
    assert ops.gelu(a, out=a) is a
    np.testing.assert_array_equal(a.numpy().view(np.uint8), want.view(np.uint8))
    b = paddle_rt.tensor(np.ascontiguousarray(big[:, 131:]))
    want = ops.add(a, b).numpy()
    ops.add(a, b, out=b)
    np.testing.assert_array_equal(b.numpy().view(np.uint8), want.view(np.uint8))


def test_unknown_isa_cap_is_ignored():
    env = dict(os.environ)
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")
    code = "import paddle_rt; print(paddle_rt.op.host_threads_info()['vector_isa'])"
    default = subprocess.run([sys.executable, "-c", code], cwd=package_parent(), env=env, capture_output=True,
                             text=True, timeout=60).stdout.strip()
    env["PADDLE_RT_VECTOR_ISA"] = "neon9000"
    res = subprocess.run([sys.executable, "-c", code], cwd=package_parent(), env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == default


@pytest.mark.parametrize("dt,offset", [("float32", 0), ("float32", 3), ("float16", 5), ("bfloat16", 1)])
def test_large_outputs_streamed(dt, offset):
    """Outputs of 32 MiB or more are written with non-temporal stores from the first vector-aligned element (the
    head before it and the tail after the last full vector as usual): the same bits as numpy, whatever the offset."""
    np_dt = BF16 if dt == "bfloat16" else np.dtype(dt)
    n = (32 << 20) // np.dtype(np_dt).itemsize + 7
    rng = np.random.default_rng(5)
    x = rng.standard_normal(n + offset, dtype=np.float32).astype(np_dt)
    y = rng.standard_normal(n, dtype=np.float32).astype(np_dt)
    tx, ty = paddle_rt.tensor(x), paddle_rt.tensor(y)
    out = paddle_rt.tensor(np.zeros(n + offset, np_dt))
    view = out[offset:]                                   # offset elements past an aligned allocation
    ops.add(tx[offset:], ty, out=view)
    want = (x[offset:].astype(np.float32) + y.astype(np.float32)).astype(np_dt)
    got = out.numpy()
    np.testing.assert_array_equal(got[offset:].view(np.uint16 if dt != "float32" else np.uint32),
                                  want.view(np.uint16 if dt != "float32" else np.uint32))
    assert not got[:offset].astype(np.float32).any()      # nothing written before the view
    g = ops.gelu(ty).numpy().astype(np.float32)           # the activation path streams too
    want_g = _reference("gelu", y.astype(np.float32), y)
    assert np.max(np.abs(g - want_g)) <= (1e-5 if dt == "float32" else 2e-2)
