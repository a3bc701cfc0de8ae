"""The operator layer's InfiniOP shape (paddle_rt/_core/op.pyx, op_descriptors.pyx): handles, descriptors and their
checks, workspaces, destroy, the kernel registry, kernels from a plugin's paddle_rt_ext_register_kernels export and
from paddle_rt.op.register_kernel, and the plugin's blas_axpby hook."""
import ctypes

import numpy as np
import pytest

import paddle_rt
from paddle_rt import op


@pytest.fixture
def handle():
    with op.Handle() as h:
        yield h


def test_handle_and_descriptor_lifecycle(handle):
    out = op.TensorDesc((4, 8), "float32")
    d = op.AddDescriptor(handle, out, op.TensorDesc((4, 8)), op.TensorDesc((8,)))
    assert d.workspace_size == 0 and d.kernel_source == "host" and d.out_shape == (4, 8)
    a, b, o = paddle_rt.tensor(np.ones((4, 8), np.float32)), paddle_rt.tensor(np.arange(8, dtype=np.float32)), \
        paddle_rt.empty((4, 8))
    assert d(o, a, b) is o
    np.testing.assert_array_equal(o.numpy(), 1 + np.arange(8)[None, :].repeat(4, 0))
    d.destroy()
    with pytest.raises(paddle_rt.InvalidArgument, match="add: the descriptor was destroyed"):
        d(o, a, b)
    h2 = op.Handle()
    d2 = op.MulDescriptor(h2, o, a, a)
    h2.close()
    with pytest.raises(paddle_rt.InvalidArgument, match="handle is closed"):
        d2(o, a, a)
    with pytest.raises(paddle_rt.InvalidArgument, match="handle is closed"):
        op.MulDescriptor(h2, o, a, a)


@pytest.mark.smoke
def test_descriptor_errors_name_op_operand_and_shapes(handle):
    f32 = lambda *s: op.TensorDesc(s, "float32")  # noqa: E731
    cases = [
        (lambda: op.AddDescriptor(handle, f32(4, 8), f32(4, 8), f32(3, 8)), r"add: a \(4, 8\) and b \(3, 8\) do "
                                                                           r"not broadcast"),
        (lambda: op.AddDescriptor(handle, f32(4, 8), f32(3, 8), f32(3, 8)), r"add: a has shape \(3, 8\), which does "
                                                                           r"not broadcast to out \(4, 8\)"),
        (lambda: op.AddDescriptor(handle, f32(4, 8), op.TensorDesc((4, 8), "float16"), f32(4, 8)),
         "b has dtype float32, a float16"),
        (lambda: op.AddDescriptor(handle, op.TensorDesc((4, 8), strides=(0, 1)), f32(4, 8), f32(4, 8)),
         "out has stride 0"),
        (lambda: op.GemmDescriptor(handle, f32(2, 2), f32(2, 3), f32(4, 2)), r"a \(2, 3\) @ b \(4, 2\)"),
        (lambda: op.GemmDescriptor(handle, f32(3, 2, 2), f32(2, 2, 3), f32(3, 2)), "a has batch 2"),
        (lambda: op.RMSNormDescriptor(handle, f32(2, 8), f32(2, 8), f32(7)), r"weight has shape \(7,\); it must "
                                                                            r"be \(8,\)"),
        (lambda: op.RMSNormDescriptor(handle, f32(2, 8), f32(2, 8), f32(8), eps=-1.0), "eps"),
        (lambda: op.LayerNormDescriptor(handle, f32(2, 8), f32(2, 9), f32(8), f32(8)), r"x has shape \(2, 9\), out "
                                                                                      r"\(2, 8\)"),
        (lambda: op.CausalSoftmaxDescriptor(handle, f32(5), f32(5)), "needs"),
        (lambda: op.RoPEDescriptor(handle, f32(2, 1, 3), f32(2, 1, 3), op.TensorDesc((2,), "int32"), f32(4, 1),
                                   f32(4, 1)), "even dim"),
        (lambda: op.RoPEDescriptor(handle, f32(2, 1, 4), f32(2, 1, 4), f32(2), f32(4, 2), f32(4, 2)), "pos_ids"),
        (lambda: op.RoPEDescriptor(handle, f32(2, 1, 4), f32(2, 1, 4), op.TensorDesc((2,), "int64"), f32(4, 2),
                                   f32(4, 2), algo="llama"), "algo"),
        (lambda: op.RandomSampleDescriptor(handle, op.TensorDesc((), "float32"), f32(10)), "int32 or int64"),
        (lambda: op.AxpbyDescriptor(handle, f32(4, 4), op.TensorDesc((4, 4), strides=(1, 4))), "contiguous"),
        (lambda: op.GeluDescriptor(handle, f32(3), f32(3), approximate="fast"), "approximate"),
        (lambda: op.AddDescriptor(handle, f32(3), np.zeros(3), f32(3)), "a must be a TensorDesc or a Tensor"),
        (lambda: op.AddDescriptor(None, f32(3), f32(3), f32(3)), "Handle"),
    ]
    for make, match in cases:
        with pytest.raises((paddle_rt.InvalidArgument, TypeError), match=match):
            make()
    assert str(handle.device) in str(pytest.raises(paddle_rt.InvalidArgument, cases[0][0]).value)


def test_call_checks_operands_against_the_descriptor(handle):
    d = op.AddDescriptor(handle, op.TensorDesc((4,)), op.TensorDesc((4,)), op.TensorDesc((4,)))
    a = paddle_rt.tensor(np.ones(4, np.float32))
    with pytest.raises(paddle_rt.InvalidArgument, match=r"input 1 has shape \(5,\)"):
        d(a, a, paddle_rt.empty((5,)))
    with pytest.raises(paddle_rt.InvalidArgument, match="takes 2 inputs"):
        d(a, a)
    with pytest.raises(paddle_rt.InvalidArgument, match="must be a paddle_rt Tensor"):
        d(a, a, np.ones(4, np.float32))
    with pytest.raises(paddle_rt.InvalidArgument, match="stream must be a paddle_rt Stream"):
        d(a, a, a, stream=3)


def test_workspace_from_the_pool_or_given(handle):
    x = paddle_rt.tensor(np.random.default_rng(0).random((4, 64), dtype=np.float32))
    w = paddle_rt.tensor(np.ones(64, np.float32))
    out = paddle_rt.empty((4, 64))
    d = op.RMSNormDescriptor(handle, out, x, w)
    assert d.workspace_size == 2 * 64 * 4
    with pytest.raises(paddle_rt.InvalidArgument, match=f"workspace has 16 bytes, the descriptor needs "
                                                        f"workspace_size = {d.workspace_size}"):
        d(out, x, w, workspace=paddle_rt.malloc(16))
    ws = paddle_rt.malloc(d.workspace_size)
    d(out, x, w, workspace=ws)
    ref = x.numpy() / np.sqrt((x.numpy() ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5)
    d(out, x, w)                                  # the pool's workspace goes back (ordered on the stream)
    out.synchronize()
    allocated = paddle_rt.memory_allocated()
    for _ in range(5):
        d(out, x, w)                              # ... and is reused by the next call on the stream
    out.synchronize()
    assert paddle_rt.memory_allocated() == allocated


def test_no_kernel_is_not_supported_with_how_to_provide_one(build_plugin):
    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern_nk"'})
    paddle_rt.load_plugin(so)
    h = op.Handle("kern_nk:0")
    with pytest.raises(paddle_rt.NotSupportedError) as e:
        op.SubDescriptor(h, op.TensorDesc((4,)), op.TensorDesc((4,)), op.TensorDesc((4,)))
    msg = str(e.value)
    for part in ("operator sub", "dtype float32", "'kern_nk'", "register_kernel", "paddle_rt_ext_register_kernels"):
        assert part in msg


@pytest.mark.smoke
def test_plugin_kernels_from_its_export(build_plugin):
    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern"'})
    paddle_rt.load_plugin(so)
    lib = ctypes.CDLL(str(so))
    dev = paddle_rt.device("kern:0")
    a = paddle_rt.tensor(np.arange(10, dtype=np.float32), device=dev)
    b = paddle_rt.tensor(np.full(10, 0.5, np.float32), device=dev)
    c = paddle_rt.ops.add(a, b)
    np.testing.assert_array_equal(c.numpy(), np.arange(10) + 0.5)
    assert lib.kt_add_calls() >= 1 and lib.kt_bad_workspace() == 0
    assert op.kernels("kern") == {("kern", "add", "float32"): "plugin", ("kern", "mul", "float32"): "plugin"}
    d = op.AddDescriptor(op.Handle(dev), c, a, b)
    assert d.kernel_source == "plugin" and d.workspace_size == 64
    # a failing kernel surfaces at the synchronize, naming the op
    bad = paddle_rt.ops.mul(a, b)
    with pytest.raises(paddle_rt.StreamError, match="mul kernel failed with C_ERROR"):
        bad.numpy()
    # axpby through the plugin's blas_axpby hook
    y = paddle_rt.tensor(np.ones(10, np.float32), device=dev)
    paddle_rt.ops.axpby(a, y, alpha=2.0, beta=3.0)
    np.testing.assert_array_equal(y.numpy(), 2 * np.arange(10) + 3)
    assert lib.kt_axpby_calls() == 1
    # host views of non-host-addressable memory are refused with a clear error
    with pytest.raises(paddle_rt.NotSupportedError, match="not host-addressable"):
        np.asarray(c)


def test_plugin_registration_failure_is_a_plugin_error(build_plugin):
    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern_bad"', "REGISTER_FAILS": None})
    paddle_rt.load_plugin(so)
    for _ in range(2):          # refused again, not forgotten after the first time
        with pytest.raises(paddle_rt.PluginError, match="paddle_rt_ext_register_kernels"):
            op.Handle("kern_bad:0")
    assert op.kernels("kern_bad") == {}


KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def test_register_kernel_takes_precedence_and_runs_on_the_stream():
    calls = []

    @KERNEL
    def fake_add(call):
        calls.append(call)
        return 0

    paddle_rt.op.register_kernel("add", "rt_cpu", "float64", fake_add)
    try:
        a = paddle_rt.tensor(np.ones(3))
        d = op.AddDescriptor(op.Handle(), a, a, a)
        assert d.kernel_source == "registered"
        d(a, a, a)
        a.synchronize()
        assert len(calls) == 1
        assert op.kernels("rt_cpu")[("rt_cpu", "add", "float64")] == "registered"
    finally:
        paddle_rt.op.unregister_kernel("add", "rt_cpu", "float64")
    assert op.AddDescriptor(op.Handle(), a, a, a).kernel_source == "host"
    with pytest.raises(paddle_rt.InvalidArgument, match="unknown operator 'conv'"):
        paddle_rt.op.register_kernel("conv", "rt_cpu", "float32", fake_add)
    with pytest.raises(paddle_rt.InvalidArgument, match="C function"):
        paddle_rt.op.register_kernel("add", "rt_cpu", "float32", "not a function")


def test_register_and_unregister_take_effect_on_cached_and_held_descriptors():
    """Issue 27: a kernel registered after ops.relu(x) ran (its descriptor cached) runs at the next ops.relu(x), and
    in a descriptor held from before; unregistered, the host kernel runs again in both."""
    calls = []

    @KERNEL
    def k(call):                   # leaves out untouched, so the sentinel shows which kernel ran
        calls.append(call)
        return 0

    x = paddle_rt.tensor(np.array([-1.0, 2.0, -3.0], np.float32))
    out, held_out = paddle_rt.empty((3,)), paddle_rt.empty((3,))
    np.testing.assert_array_equal(paddle_rt.ops.relu(x, out=out).numpy(), [0, 2, 0])
    held = op.ReluDescriptor(op.Handle(), held_out, x)
    assert held.kernel_source == "host"
    paddle_rt.op.register_kernel("relu", "rt_cpu", "float32", k)
    try:
        sentinel = np.full(3, 7.0, np.float32)
        out, held_out = paddle_rt.tensor(sentinel), paddle_rt.tensor(sentinel)      # same layouts
        paddle_rt.ops.relu(x, out=out)
        held(held_out, x)
        np.testing.assert_array_equal(out.numpy(), sentinel)
        np.testing.assert_array_equal(held_out.numpy(), sentinel)
        assert len(calls) == 2 and held.kernel_source == "registered"
    finally:
        assert paddle_rt.op.unregister_kernel("relu", "rt_cpu", "float32") is True
    np.testing.assert_array_equal(paddle_rt.ops.relu(x, out=out).numpy(), [0, 2, 0])
    np.testing.assert_array_equal(held(held_out, x).numpy(), [0, 2, 0])
    assert len(calls) == 2 and held.kernel_source == "host"
    assert paddle_rt.op.unregister_kernel("relu", "rt_cpu", "float32") is False     # nothing registered
    for args, match in [(("conv", "rt_cpu", "float32"), "unknown operator 'conv'"),
                        (("relu", None, "float32"), "device_type must be a device type name"),
                        (("relu", "", "float32"), "device_type must be a device type name"),
                        (("relu", "rt_cpu", "float128"), "float128")]:
        for fn in (paddle_rt.op.unregister_kernel, lambda *a: paddle_rt.op.register_kernel(*a, k)):
            with pytest.raises(paddle_rt.InvalidArgument, match=match):
                fn(*args)


def test_unregistering_the_only_kernel_fails_at_the_next_call_not_on_the_stream(build_plugin):
    """On a device with no host kernels, a descriptor whose registered kernel went away raises NotSupportedError at
    its next call (no NULL kernel reaches the stream); registered again, it runs again."""
    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern_unreg"'})
    paddle_rt.load_plugin(so)
    dev = paddle_rt.device("kern_unreg:0")
    calls = []

    @KERNEL
    def k(call):
        calls.append(call)
        return 0

    a = paddle_rt.tensor(np.ones(4, np.float32), device=dev)
    paddle_rt.op.register_kernel("sub", "kern_unreg", "float32", k)
    d = op.SubDescriptor(op.Handle(dev), a, a, a)
    d(a, a, a).synchronize()
    paddle_rt.op.unregister_kernel("sub", "kern_unreg", "float32")
    for _ in range(2):
        with pytest.raises(paddle_rt.NotSupportedError, match="operator sub has no kernel for dtype float32"):
            d(a, a, a)
    paddle_rt.op.register_kernel("sub", "kern_unreg", "float32", k)
    try:
        d(a, a, a).synchronize()
        assert len(calls) == 2
    finally:
        paddle_rt.op.unregister_kernel("sub", "kern_unreg", "float32")


def test_axpby_hook_dtype_rule_on_a_device_without_host_kernels(build_plugin):
    """Issue 27: a plugin's blas_axpby is not chosen for a dtype it cannot serve (Paddle calls it with float32 and
    float64 only): without host kernels that is NotSupportedError at the descriptor, naming op, dtype and device
    type, and y is untouched. float64 keeps the hook there, its alpha and beta rounded to float (the README limit)."""
    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern_axdt"'})
    paddle_rt.load_plugin(so)
    dev = paddle_rt.device("kern_axdt:0")
    h = op.Handle(dev)
    for dtype in ("float16", "bfloat16"):
        y = paddle_rt.zeros((8,), dtype, device=dev)
        with pytest.raises(paddle_rt.NotSupportedError) as e:
            op.AxpbyDescriptor(h, y, y)
        for part in ("operator axpby", f"dtype {dtype}", "'kern_axdt'", "blas_axpby serves float32 and float64"):
            assert part in str(e.value)
        with pytest.raises(paddle_rt.NotSupportedError, match=f"axpby has no kernel for dtype {dtype}"):
            paddle_rt.ops.axpby(y, y, alpha=2.0)
    y64 = op.TensorDesc((8,), "float64")
    assert op.AxpbyDescriptor(h, y64, y64, 0.1, 1 + 1e-12).kernel_source == "hook"


def test_host_axpby_float32_on_a_plugin_without_blas_axpby(build_plugin):
    """The host kernel reads y (out) as axpby's second operand in every float dtype, not only float64."""
    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern_host32"', "HOST_ADDRESSABLE": None, "NO_AXPBY": None})
    paddle_rt.load_plugin(so)
    dev = paddle_rt.device("kern_host32:0")
    for dtype in ("float32", "float16"):
        x = paddle_rt.tensor(np.arange(6, dtype=dtype), device=dev)
        y = paddle_rt.tensor(np.ones(6, dtype), device=dev)
        paddle_rt.ops.axpby(x, y, alpha=2.0, beta=-3.0)
        np.testing.assert_array_equal(y.numpy(), 2 * np.arange(6) - 3)


def test_host_kernels_serve_any_host_addressable_plugin(build_plugin):
    """Without blas_axpby, axpby on a host-addressable device runs paddle_rt's host kernel (y is read as well as
    written); the other operators too."""
    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern_host"', "HOST_ADDRESSABLE": None, "NO_AXPBY": None})
    paddle_rt.load_plugin(so)
    dev = paddle_rt.device("kern_host:0")
    x = paddle_rt.tensor(np.arange(6, dtype=np.float64), device=dev)
    y = paddle_rt.tensor(np.ones(6), device=dev)
    assert op.AxpbyDescriptor(op.Handle(dev), y, x).kernel_source == "host"
    paddle_rt.ops.axpby(x, y, alpha=2.0, beta=-3.0)
    np.testing.assert_array_equal(y.numpy(), 2 * np.arange(6) - 3)
    np.testing.assert_array_equal(paddle_rt.ops.sub(x, x).numpy(), np.zeros(6))
    np.testing.assert_array_equal(np.asarray(x), np.arange(6))       # host-addressable: zero-copy view


def test_random_sample_ignores_nan_logits():
    t = paddle_rt.tensor(np.array([np.nan, 1.0, 3.0, np.nan], np.float32))
    for r in (0.0, 0.5, 0.99):
        got = int(paddle_rt.ops.random_sample(t, random_val=r, temperature=1.0).numpy())
        assert got in (1, 2)
    assert int(paddle_rt.ops.random_sample(t, random_val=0.3, temperature=0.0).numpy()) == 2
    inf = paddle_rt.tensor(np.array([0.0, np.inf, 1.0], np.float32))
    assert int(paddle_rt.ops.random_sample(inf, random_val=0.3).numpy()) == 1


def test_an_operation_outlives_its_descriptor(build_plugin):
    """The stream's record of a failed kernel names the op even when the descriptor is gone by then."""
    import gc
    import threading

    so = build_plugin("kernels", {"DEVICE_TYPE": '"kern"'})
    paddle_rt.load_plugin(so)
    dev = paddle_rt.device("kern:0")
    s = paddle_rt.Stream(dev)
    a = paddle_rt.tensor(np.ones(4, np.float32), device=dev, stream=s)
    gate = threading.Event()
    s.add_callback(gate.wait, 10)
    d = op.MulDescriptor(op.Handle(dev), a, a, a)
    d(a, a, a, stream=s)
    del d
    gc.collect()
    gate.set()
    with pytest.raises(paddle_rt.StreamError, match="mul kernel failed"):
        s.synchronize()
    s.close()
