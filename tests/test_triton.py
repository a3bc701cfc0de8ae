"""paddle_rt.triton: Triton kernels (Triton's tutorial kernels, written here) and NineToothed kernels on paddle_rt
tensors in Triton's interpreter, in stream order; their errors at the next synchronize; argument checks; devices that
are not host-addressable; paddle_rt.op.register_triton. Small sizes: the interpreter runs the programs of a grid one
after another."""
import threading

import numpy as np
import pytest

import paddle_rt
from paddle_rt import op, ops

from stream_helpers import assert_operand_outlives_other_stream

pytestmark = pytest.mark.triton
# Bound by _triton_extra when the tests run: collecting this file imports neither torch nor triton.
torch = triton = prt = kernels = None


@pytest.fixture(scope="module", autouse=True)
def _triton_extra():
    global torch, triton, prt, kernels
    torch = pytest.importorskip("torch", reason="needs the triton extra (pip install torch==2.13.0+cpu, then "
                                                "'.[triton]')")
    triton = pytest.importorskip("triton", reason="needs the triton extra")
    prt = pytest.importorskip("paddle_rt.triton")
    import triton_kernels as kernels


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# -- Triton's tutorial kernels (tests/triton_kernels.py) ---------------------------------------------------------------
def grid_1d(n, block):
    return (triton.cdiv(n, block),)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_vector_add(rng, dtype):
    n = 1000                                              # not a multiple of the block: the mask matters
    x, y = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    tx, ty, out = paddle_rt.tensor(x), paddle_rt.tensor(y), paddle_rt.empty((n,), dtype)
    pos = prt.launch(kernels.add_kernel, grid_1d(n, 256), tx, ty, out, n, BLOCK_SIZE=256)
    assert isinstance(pos, int) and pos > 0
    np.testing.assert_array_equal(out.numpy(), x + y)      # numpy() waits for the kernel (recorded as a writer)


def test_grid_as_a_function_of_the_meta_parameters(rng):
    x = rng.standard_normal(300).astype(np.float32)
    tx, out = paddle_rt.tensor(x), paddle_rt.empty((300,), "float32")
    prt.launch(kernels.add_kernel, lambda meta: (triton.cdiv(300, meta["BLOCK_SIZE"]),), tx, tx, out, 300,
               BLOCK_SIZE=64,
               num_warps=4, num_stages=2)                 # Triton's launch options are accepted
    np.testing.assert_array_equal(out.numpy(), 2 * x)


def test_fused_softmax_on_strided_rows(rng):
    x = rng.standard_normal((7, 100)).astype(np.float32)
    tx = paddle_rt.tensor(np.pad(x, ((0, 0), (0, 28))))[:, :100]     # rows with a stride of 128 elements
    out = paddle_rt.empty((7, 100), "float32")
    assert tx.strides == (128, 1)
    prt.launch(kernels.softmax_kernel, (7,), out, tx, tx.strides[0], out.strides[0], 100,
               BLOCK_SIZE=triton.next_power_of_2(100))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_layer_norm_forward(rng):
    m, n, eps = 5, 300, 1e-5
    x = rng.standard_normal((m, n)).astype(np.float32)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    tx, tw, tb = paddle_rt.tensor(x), paddle_rt.tensor(w), paddle_rt.tensor(b)
    y, mean, rstd = paddle_rt.empty((m, n), "float32"), paddle_rt.empty((m,), "float32"), paddle_rt.empty((m,))
    prt.launch(kernels.layer_norm_fwd_kernel, (m,), tx, y, tw, tb, mean, rstd, n, n, eps, BLOCK_SIZE=128)
    mu = x.mean(axis=1)
    r = 1 / np.sqrt(x.var(axis=1) + eps)
    np.testing.assert_allclose(mean.numpy(), mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd.numpy(), r, rtol=1e-5)
    np.testing.assert_allclose(y.numpy(), (x - mu[:, None]) * r[:, None] * w + b, rtol=1e-4, atol=1e-5)
    # and the same as paddle_rt's own layer_norm operator
    np.testing.assert_allclose(y.numpy(), ops.layer_norm(tx, tw, tb, eps=eps).numpy(), rtol=1e-4, atol=1e-5)


def test_matmul(rng):
    M, N, K = 70, 40, 50
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    ta, tb, c = paddle_rt.tensor(a), paddle_rt.tensor(b), paddle_rt.empty((M, N), "float32")
    bm, bn = 32, 16
    prt.launch(kernels.matmul_kernel, (triton.cdiv(M, bm) * triton.cdiv(N, bn),), ta, tb, c, M, N, K, *ta.strides,
               *tb.strides, *c.strides, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=16, GROUP_M=2)
    np.testing.assert_allclose(c.numpy(), a.astype(np.float32) @ b.astype(np.float32), rtol=1e-4, atol=1e-4)


def test_autotuned_kernel_runs_the_config_with_fewest_programs(rng):
    configs = [triton.Config({"BLOCK_SIZE": 32}), triton.Config({"BLOCK_SIZE": 512})]
    tuned = triton.autotune(configs=configs, key=["n_elements"])(kernels.add_kernel)
    seen = []

    def grid(meta):
        seen.append(meta["BLOCK_SIZE"])
        return (triton.cdiv(1000, meta["BLOCK_SIZE"]),)
    x = rng.standard_normal(1000).astype(np.float32)
    tx, out = paddle_rt.tensor(x), paddle_rt.empty((1000,), "float32")
    prt.launch(tuned, grid, tx, tx, out, 1000)
    np.testing.assert_array_equal(out.numpy(), 2 * x)
    assert seen[-1] == 512


# -- stream order ------------------------------------------------------------------------------------------------------
def test_kernel_between_two_copies_on_one_stream(rng):
    dev = paddle_rt.get_device()
    s = paddle_rt.Stream(dev)
    gate = threading.Event()
    x = rng.standard_normal(4096).astype(np.float32)
    host = np.zeros_like(x)
    tx, out = paddle_rt.empty((4096,), "float32", stream=s), paddle_rt.empty((4096,), "float32", stream=s)
    s.add_callback(gate.wait, 10)                       # nothing below runs before the host has queued it all
    paddle_rt.memcpy_async(tx.data_ptr, x, x.nbytes, stream=s, kind="H2D")
    prt.launch(kernels.scale_kernel, grid_1d(4096, 1024), tx, out, 4096, 3.0, stream=s, BLOCK_SIZE=1024)
    paddle_rt.memcpy_async(host, out.data_ptr, host.nbytes, stream=s, kind="D2H")
    assert not host.any()
    gate.set()
    s.synchronize()
    np.testing.assert_array_equal(host, 3 * x)
    s.close()


def test_kernel_across_two_streams_with_an_event(rng):
    dev = paddle_rt.get_device()
    s1, s2 = paddle_rt.Stream(dev), paddle_rt.Stream(dev)
    gate = threading.Event()
    x = rng.standard_normal(2048).astype(np.float32)
    tx = paddle_rt.tensor(x, stream=s1)
    mid, out = paddle_rt.empty((2048,), "float32", stream=s1), paddle_rt.empty((2048,), "float32", stream=s1)
    s1.synchronize()
    s1.add_callback(gate.wait, 10)                      # s1's kernel waits for the gate
    prt.launch(kernels.scale_kernel, grid_1d(2048, 1024), tx, mid, 2048, 2.0, stream=s1, BLOCK_SIZE=1024)
    ev = paddle_rt.Event()
    ev.record(s1)
    ev.wait(s2)
    prt.launch(kernels.add_kernel, grid_1d(2048, 1024), mid, tx, out, 2048, stream=s2, BLOCK_SIZE=1024)
    gate.set()
    s2.synchronize()
    np.testing.assert_array_equal(out.numpy(), 3 * x)  # s2's kernel read what s1's wrote
    s1.close()
    s2.close()


def test_operand_memory_is_not_reused_before_the_kernel_ran():
    """A tensor launched on another stream stays allocated until that stream ran the kernel (as operators' operands:
    record_stream)."""
    def use(x, s1, s2):
        out = paddle_rt.empty((1024,), "float32", stream=s1)
        s1.synchronize()
        prt.launch(kernels.scale_kernel, grid_1d(1024, 1024), x, out, 1024, 2.0, stream=s2, BLOCK_SIZE=1024)
        return out

    assert_operand_outlives_other_stream(
        use, lambda s1: [paddle_rt.tensor(np.zeros(1024, np.float32), stream=s1) for _ in range(4)])


def test_default_stream_is_the_current_stream_of_the_tensors_device(rng):
    dev = paddle_rt.get_device()
    s = paddle_rt.Stream(dev)
    with paddle_rt.stream(s):
        x = paddle_rt.tensor(np.ones(64, np.float32))   # copied in order on s, the current stream
        out = paddle_rt.empty((64,), "float32")
        before = s.position
        prt.launch(kernels.scale_kernel, (1,), x, out, 64, 5.0, BLOCK_SIZE=64)
        assert s.position == before + 1
    np.testing.assert_array_equal(out.numpy(), np.full(64, 5.0))
    s.close()


def test_kernel_error_is_a_stream_error_at_the_next_synchronize_and_the_stream_goes_on():
    dev = paddle_rt.get_device()
    s = paddle_rt.Stream(dev)
    x = paddle_rt.tensor(np.ones(4, np.float32), stream=s)
    prt.launch(kernels.broken_kernel, (1,), x, stream=s, BLOCK_SIZE=3)        # returns: the error is on the stream
    with pytest.raises(paddle_rt.StreamError, match="broken_kernel") as e:
        s.synchronize()
    assert "power of 2" in str(e.value)
    s.synchronize()                                      # reported once
    out = paddle_rt.empty((4,), "float32", stream=s)
    prt.launch(kernels.scale_kernel, (1,), x, out, 4, 2.0, stream=s, BLOCK_SIZE=4)
    s.synchronize()
    np.testing.assert_array_equal(out.numpy(), np.full(4, 2.0))
    s.close()


# -- arguments of the wrong kind ---------------------------------------------------------------------------------------
def test_wrong_arguments_are_typed_errors_naming_the_argument():
    x = paddle_rt.tensor(np.ones(8, np.float32))
    out = paddle_rt.empty((8,), "float32")
    before = paddle_rt.current_stream().position
    add = kernels.add_kernel
    cases = [
        ((add, (1,), np.ones(8, np.float32), x, out, 8), {"BLOCK_SIZE": 8}, "'x_ptr' is a numpy.ndarray"),
        ((add, (1,), x, torch.ones(8), out, 8), {"BLOCK_SIZE": 8}, "'y_ptr' is a torch.Tensor"),
        ((add, (1,), x, x, out, "8"), {"BLOCK_SIZE": 8}, "'n_elements' is a builtins.str"),
        ((add, (1,), x, x, out, 8), {"BLOCK_SIZE": x}, "'BLOCK_SIZE' is a tl.constexpr parameter"),
        ((add, (1,), x, x, out), {"BLOCK_SIZE": 8}, "missing argument(s) 'n_elements'"),
        ((add, (1,), x, x, out, 8), {"BLOCK_SIZE": 8, "BLOCK": 2}, "unexpected keyword argument 'BLOCK'"),
        ((add, (1, 2, 3, 4), x, x, out, 8), {"BLOCK_SIZE": 8}, "grid must be a tuple of 1 to 3 ints"),
        ((add, (1,), x, x, out, 8), {"BLOCK_SIZE": 8, "stream": "s"}, "stream must be a paddle_rt Stream"),
        ((add.fn, (1,), x, x, out, 8), {"BLOCK_SIZE": 8}, "kernel must be a @triton.jit function"),
    ]
    for args, kwargs, msg in cases:
        with pytest.raises(paddle_rt.InvalidArgument) as e:
            prt.launch(*args, **kwargs)
        assert msg in str(e.value), (msg, str(e.value))
    assert paddle_rt.current_stream().position == before        # nothing was enqueued
    if paddle_rt.device_count() > 1:
        other = paddle_rt.tensor(np.ones(8, np.float32), device="rt_cpu:1")
        with pytest.raises(paddle_rt.InvalidArgument, match="tensors on several devices"):
            prt.launch(kernels.add_kernel, (1,), x, other, out, 8, BLOCK_SIZE=8)
        with pytest.raises(paddle_rt.InvalidArgument, match="is on rt_cpu:1"):
            prt.launch(kernels.add_kernel, (1,), x, x, out, 8, BLOCK_SIZE=8,
                       stream=paddle_rt.current_stream("rt_cpu:1"))


def test_negative_strides_are_refused_when_the_kernel_runs():
    x = paddle_rt.tensor(np.arange(8, dtype=np.float32))
    out = paddle_rt.empty((8,), "float32")
    prt.launch(kernels.add_kernel, (1,), x[::-1], x, out, 8, BLOCK_SIZE=8)
    with pytest.raises(paddle_rt.StreamError, match="negative strides"):
        paddle_rt.current_stream().synchronize()


# -- devices that are not host-addressable -----------------------------------------------------------------------------
def test_not_host_addressable_needs_a_backend(build_plugin):
    so = build_plugin("kernels", {"DEVICE_TYPE": '"tri_nh"'})
    paddle_rt.load_plugin(so)
    dev = paddle_rt.device("tri_nh:0")
    x = paddle_rt.tensor(np.ones(8, np.float32), device=dev)
    with pytest.raises(paddle_rt.NotSupportedError) as e:
        prt.launch(kernels.add_kernel, (1,), x, x, x, 8, BLOCK_SIZE=8)
    for part in ("tri_nh:0", "not host-addressable", "add_kernel", "register_backend('tri_nh'"):
        assert part in str(e.value)
    with pytest.raises(paddle_rt.NotSupportedError, match="not host-addressable"):
        op.register_triton("add", "tri_nh", "float32", kernels.add_kernel,
                           lambda out, a, b, attrs: ((1,), (a, b, out, 8)))
    with pytest.raises(paddle_rt.InvalidArgument, match="backend must be callable"):
        prt.register_backend("tri_nh", "not a backend")
    assert "tri_nh" not in prt.backends()


def test_a_registered_backend_is_called_in_stream_order_on_the_worker(build_plugin):
    """The seam's contract: register_backend's callable gets the kernel, the grid, the arguments (paddle_rt Tensors as
    they are) and the stream, on the stream's worker in stream order; its exception is the stream's error."""
    so = build_plugin("kernels", {"DEVICE_TYPE": '"tri_be"'})
    paddle_rt.load_plugin(so)
    dev = paddle_rt.device("tri_be:0")
    s = paddle_rt.Stream(dev)
    x = paddle_rt.tensor(np.ones(8, np.float32), device=dev, stream=s)
    calls, order = [], []

    def backend(kernel, grid, args, stream):
        calls.append((kernel, grid, args, stream, threading.get_ident()))
        if args["n_elements"] < 0:
            raise RuntimeError("the backend refused")
    prt.register_backend("tri_be", backend)
    try:
        s.add_callback(order.append, "before")
        pos = prt.launch(kernels.add_kernel, (1,), x, x, x, 8, stream=s, BLOCK_SIZE=8)
        s.add_callback(order.append, "after")
        s.synchronize()
        (kernel, grid, args, stream, tid), = calls
        assert kernel is kernels.add_kernel and grid == (1,) and stream is s and tid != threading.get_ident()
        assert args["x_ptr"] is x and args["BLOCK_SIZE"] == 8 and order == ["before", "after"]
        assert s.position == pos + 1
        prt.launch(kernels.add_kernel, (1,), x, x, x, -1, stream=s, BLOCK_SIZE=8)
        with pytest.raises(paddle_rt.StreamError, match="the backend refused"):
            s.synchronize()
    finally:
        prt.unregister_backend("tri_be")
    with pytest.raises(paddle_rt.NotSupportedError):
        prt.launch(kernels.add_kernel, (1,), x, x, x, 8, stream=s, BLOCK_SIZE=8)
    s.close()


# -- operators from Triton kernels -------------------------------------------------------------------------------------
def _add_grid(out, a, b, attrs):
    n = out.numel()
    return (triton.cdiv(n, 128),), (a.contiguous() if a.stride() != out.stride() else a,
                                    b.contiguous() if b.stride() != out.stride() else b, out, n), {"BLOCK_SIZE": 128}


def test_register_triton_makes_the_kernel_the_operators_kernel(rng):
    a = rng.standard_normal((6, 50)).astype(np.float32)
    b = rng.standard_normal((6, 50)).astype(np.float32)
    ta, tb = paddle_rt.tensor(a), paddle_rt.tensor(b)
    ran = []

    def grid_fn(out, x, y, attrs):
        ran.append(out.shape)
        return _add_grid(out, x, y, attrs)
    np.testing.assert_array_equal(ops.add(ta, tb).numpy(), a + b)          # a cached descriptor, host kernel
    op.register_triton("add", "rt_cpu", "float32", kernels.add_kernel, grid_fn)
    try:
        assert op.kernels("rt_cpu")[("rt_cpu", "add", "float32")] == "triton"
        assert op.AddDescriptor(op.Handle(), ta, ta, tb).kernel_source == "triton"
        np.testing.assert_array_equal(ops.add(ta, tb).numpy(), a + b)
        assert ran == [(6, 50)]
        # broadcasting: the descriptor gives the kernel b broadcast to out's shape (stride 0)
        row = paddle_rt.tensor(b[0])
        np.testing.assert_array_equal(ops.add(ta, row).numpy(), a + b[0])
        # the descriptor's rules still apply before any kernel runs
        with pytest.raises(paddle_rt.InvalidArgument):
            ops.add(ta, paddle_rt.tensor(np.ones((5, 50), np.float32)))
        # other dtypes keep their kernels
        assert op.AddDescriptor(op.Handle(), *[paddle_rt.tensor(a.astype(np.float64))] * 3).kernel_source == "host"
    finally:
        op.unregister_kernel("add", "rt_cpu", "float32")
    assert op.AddDescriptor(op.Handle(), ta, ta, tb).kernel_source == "host"
    np.testing.assert_array_equal(ops.add(ta, tb).numpy(), a + b)
    assert len(ran) == 2


def test_register_triton_errors_surface_at_synchronize():
    def bad_grid(out, a, b, attrs):
        raise ValueError("no grid for this shape")
    op.register_triton("sub", "rt_cpu", "float32", kernels.add_kernel, bad_grid)
    try:
        x = paddle_rt.tensor(np.ones(8, np.float32))
        y = ops.sub(x, x)
        with pytest.raises(paddle_rt.StreamError, match="no grid for this shape") as e:
            y.numpy()
        assert "sub kernel" in str(e.value)
        # the stream goes on
        np.testing.assert_array_equal(ops.add(x, x).numpy(), np.full(8, 2.0))
    finally:
        op.unregister_kernel("sub", "rt_cpu", "float32")
    with pytest.raises(paddle_rt.InvalidArgument, match="grid_fn must be callable"):
        op.register_triton("add", "rt_cpu", "float32", kernels.add_kernel, None)
    with pytest.raises(paddle_rt.InvalidArgument, match="kernel must be a @triton.jit"):
        op.register_triton("add", "rt_cpu", "float32", print, _add_grid)
    with pytest.raises(paddle_rt.InvalidArgument, match="unknown operator 'conv'"):
        op.register_triton("conv", "rt_cpu", "float32", kernels.add_kernel, _add_grid)
    assert ("rt_cpu", "add", "float32") not in op.kernels("rt_cpu")


# -- NineToothed -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ntk():
    pytest.importorskip("ninetoothed", reason="needs the triton extra")
    import ninetoothed_kernels
    return ninetoothed_kernels


def test_ninetoothed_add(ntk, rng):
    add = prt.make_ninetoothed(ntk.add_arrangement, ntk.add_application, ntk.ADD_TENSORS, kernel_name="nt_add")
    assert add.source.endswith(".py") and "@triton.jit" in open(add.source).read()
    x, y = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    tx, ty, out = paddle_rt.tensor(x), paddle_rt.tensor(y), paddle_rt.empty((1000,), "float32")
    prt.launch(add, None, tx, ty, out)
    np.testing.assert_array_equal(out.numpy(), x + y)
    with pytest.raises(paddle_rt.InvalidArgument, match="grid must be None"):
        prt.launch(add, (1,), tx, ty, out)
    with pytest.raises(paddle_rt.InvalidArgument, match="takes 3 tensors"):
        prt.launch(add, None, tx, ty)


def test_ninetoothed_matmul(ntk, rng):
    mm = prt.make_ninetoothed(ntk.matmul_arrangement, ntk.matmul_application, ntk.MATMUL_TENSORS,
                              kernel_name="nt_mm")
    a = rng.standard_normal((48, 40)).astype(np.float32)
    b = rng.standard_normal((40, 24)).astype(np.float32)
    s = paddle_rt.Stream(paddle_rt.get_device())
    ta, tb = paddle_rt.tensor(a, stream=s), paddle_rt.tensor(b, stream=s)
    c = paddle_rt.empty((48, 24), "float32", stream=s)
    prt.launch(mm, None, ta, tb, c, stream=s)
    s.synchronize()
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    s.close()


def test_docs_triton_example_runs(run_python, tmp_path):
    """docs/triton.md's example runs as written, from a file (Triton reads a kernel's source), and prints its result
    (tests/test_docs.py runs it alone too; this one checks what it prints)."""
    import os
    import re
    page = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "triton.md")
    with open(page, encoding="utf-8") as f:
        blocks = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "paddle_rt.triton" in b]
    assert len(blocks) == 1
    script = tmp_path / "example.py"
    script.write_text(blocks[0], encoding="utf-8")
    res = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                     env={"PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert "[ 0.  4. 16. 36.]" in res.stdout


def test_heuristics_give_meta_parameters(rng):
    heur = triton.heuristics(values={"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["n_elements"])})(
        kernels.add_kernel)
    x = rng.standard_normal(100).astype(np.float32)
    tx, out = paddle_rt.tensor(x), paddle_rt.empty((100,), "float32")
    prt.launch(heur, (1,), tx, tx, out, 100)               # one program of 128: covers all 100 only if it was used
    np.testing.assert_array_equal(out.numpy(), 2 * x)


def test_kernels_decorated_under_triton_interpret_run_too(run_python, tmp_path):
    script = tmp_path / "interp.py"
    script.write_text(
        "import numpy as np, paddle_rt, triton, triton.language as tl\n"
        "import paddle_rt.triton as prt\n"
        "@triton.jit\n"
        "def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n"
        "    tl.store(out_ptr + offs, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0), mask=offs < n)\n"
        "assert type(k).__name__ == 'InterpretedFunction'\n"
        "x = paddle_rt.tensor(np.arange(5, dtype=np.float32)); out = paddle_rt.empty((5,), 'float32')\n"
        "prt.launch(k, (1,), x, out, 5, BLOCK=8)\n"
        "print(out.numpy().tolist())\n", encoding="utf-8")
    res = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                     env={"TRITON_INTERPRET": "1", "PADDLE_RT_DEFAULT_DEVICE": None})
    assert res.returncode == 0, res.stderr
    assert "[10.0, 10.0, 10.0, 10.0, 10.0]" in res.stdout
