"""paddle_rt.Tensor and TensorDesc (paddle_rt/_core/tensor.pyx): factories, dtypes, views without copies, reshape,
numpy(), __array_interface__ and DLPack on host-addressable devices, and bad input."""
import numpy as np
import pytest

import paddle_rt


@pytest.mark.smoke
def test_factories_and_numpy():
    z = paddle_rt.zeros((3, 4), "int32")
    assert z.shape == (3, 4) and z.dtype == "int32" and z.strides == (4, 1) and z.is_contiguous()
    np.testing.assert_array_equal(z.numpy(), np.zeros((3, 4), np.int32))
    a = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    t = paddle_rt.tensor(a)
    assert t.nbytes == a.nbytes and t.itemsize == 8 and len(t) == 2 and t.device == paddle_rt.get_device()
    np.testing.assert_array_equal(t.numpy(), a)
    assert paddle_rt.tensor([1, 2, 3], dtype="float16").numpy().dtype == np.float16
    e = paddle_rt.empty((0, 5))
    assert e.numpy().shape == (0, 5)


def test_views_share_memory():
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = paddle_rt.tensor(a)
    for view, ref in [(t[1], a[1]), (t[:, 1:3], a[:, 1:3]), (t[..., ::2], a[..., ::2]), (t[::-1, 2], a[::-1, 2]),
                      (t.transpose(0, 2), a.transpose(2, 1, 0)), (t.permute(1, 2, 0), a.transpose(1, 2, 0)),
                      (t[None, 0], a[None, 0]), (t.T, a.T), (t.view(12, 5), a.reshape(12, 5)),
                      (t.view(-1), a.reshape(-1)), (t[:, :, 0].reshape(12), a[:, :, 0].reshape(12))]:
        assert view.shape == ref.shape
        np.testing.assert_array_equal(view.numpy(), ref)
    v = t[1:]
    assert v.storage is t.storage and v.data_ptr == t.data_ptr + 20 * 4
    with pytest.raises(paddle_rt.InvalidArgument, match="do not allow a view"):
        t.transpose(0, 2).view(60)
    r = t.transpose(0, 2).reshape(60)              # copies
    np.testing.assert_array_equal(r.numpy(), a.transpose(2, 1, 0).reshape(60))
    with pytest.raises(paddle_rt.InvalidArgument, match="has 59 elements"):
        t.view(59)
    with pytest.raises(IndexError, match="out of bounds"):
        t[3]
    with pytest.raises(paddle_rt.InvalidArgument, match="not a permutation"):
        t.permute(0, 0, 1)


def test_array_interface_and_dlpack_are_zero_copy():
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    t = paddle_rt.tensor(a)[:, 1::2]
    np.testing.assert_array_equal(np.asarray(t), a[:, 1::2])
    d = np.from_dlpack(t)
    np.testing.assert_array_equal(d, a[:, 1::2])
    assert d.__array_interface__["data"][0] == t.data_ptr
    assert t.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError, match="copy=True"):
        t.__dlpack__(copy=True)


def test_bfloat16_round_trip():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
    t = paddle_rt.tensor(a)
    assert t.dtype == "bfloat16" and t.itemsize == 2
    np.testing.assert_array_equal(t.numpy(), a)


def test_bad_input():
    with pytest.raises(paddle_rt.InvalidArgument, match="unsupported dtype"):
        paddle_rt.empty((2,), "complex64")
    with pytest.raises(paddle_rt.InvalidArgument, match="must be an int >= 0"):
        paddle_rt.empty((2, -1))
    with pytest.raises(paddle_rt.InvalidArgument, match="at most 8 dimensions"):
        paddle_rt.empty((1,) * 9)
    with pytest.raises(paddle_rt.InvalidArgument, match="3 strides"):
        paddle_rt.op.TensorDesc((2, 2), "float32", strides=(1, 2, 3))
    with pytest.raises(TypeError, match="paddle_rt.empty"):
        paddle_rt.Tensor()
    with pytest.raises(paddle_rt.InvalidArgument, match="Stream"):
        paddle_rt.empty((2,), stream="s")


def test_to_another_device():
    if paddle_rt.device_count() < 2:
        pytest.skip("needs two rt_cpu devices")
    t = paddle_rt.tensor(np.arange(5, dtype=np.float32), device="rt_cpu:0")
    u = t.to("rt_cpu:1")
    assert str(u.device) == "rt_cpu:1" and t.to("rt_cpu:0") is t
    np.testing.assert_array_equal(u.numpy(), np.arange(5))
    del t, u
    paddle_rt.synchronize()
    paddle_rt.default_mem_pool("rt_cpu:1").trim_to(0)
    paddle_rt.empty_cache("rt_cpu:1")


def test_torch_from_dlpack_shares_the_memory():
    torch = pytest.importorskip("torch")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = paddle_rt.tensor(a)
    v = torch.from_dlpack(t[:, ::2])
    assert tuple(v.shape) == (3, 2) and v.stride() == (4, 2)
    np.testing.assert_array_equal(v.numpy(), a[:, ::2])
    assert v.data_ptr() == t.data_ptr
    b = torch.from_dlpack(paddle_rt.tensor(np.array([1.5, -2.0], np.float16)))
    assert b.dtype == torch.float16 and b.tolist() == [1.5, -2.0]


def test_contiguous_copies_with_the_rearrange_ops_registered(monkeypatch):
    """Tensor.contiguous copies through ops.rearrange, which paddle_rt._core.ops registers at its import (the
    tensor module imports nothing of the operators); without it a strided tensor's contiguous() says what is
    missing, and a contiguous one is still returned as it is."""
    from paddle_rt._core import tensor as tensor_mod
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = paddle_rt.tensor(a)
    v = t.T
    c = v.contiguous()
    assert c is not v and c.is_contiguous() and c.shape == (4, 3)
    np.testing.assert_array_equal(c.numpy(), a.T)
    assert t.contiguous() is t
    monkeypatch.setattr(tensor_mod, "_contiguous_copy", None)
    assert t.contiguous() is t
    with pytest.raises(paddle_rt.NotSupportedError, match=r"Tensor.contiguous: .*paddle_rt._core.ops"):
        v.contiguous()


@pytest.mark.smoke
def test_a_size_that_fits_64_bits_but_no_device_is_out_of_memory():
    """Issue 46 item 11: empty((2**63 - 1,), uint8) said its bytes "overflow 64-bit sizes", which they do not: the
    factories say it is more memory than any device holds (OutOfMemoryError with the device's capacity, as malloc of
    such a size); a layout past 64 bits still says so, and TensorDesc says what is wrong without an allocation."""
    with pytest.raises(paddle_rt.OutOfMemoryError,
                       match=r"^rt_cpu:0: empty: out of memory: shape \(9223372036854775807,\) of uint8 needs "
                             r"9223372036854775807 bytes, more memory than any device holds \(rt_cpu:0 has a total "
                             r"capacity of \d+ bytes\)$") as ei:
        paddle_rt.empty((2**63 - 1,), "uint8", device="rt_cpu:0")
    e = ei.value
    assert (e.device, e.requested, e.call) == ("rt_cpu:0", 2**63 - 1, "empty") and e.capacity > 0
    with pytest.raises(paddle_rt.OutOfMemoryError, match=r"needs 13835058055282163712 bytes"):
        paddle_rt.zeros((2**62, 3), "uint8", device="rt_cpu:0")
    with pytest.raises(paddle_rt.InvalidArgument, match=r"18446744073709551616 bytes overflow 64-bit sizes"):
        paddle_rt.empty((2**62, 4), "uint8")                       # 2**64 bytes: really past 64 bits
    with pytest.raises(paddle_rt.InvalidArgument,
                       match=r"TensorDesc: .* 9223372036854775807 bytes is more memory than any device holds"):
        paddle_rt.op.TensorDesc((2**63 - 1,), "uint8")
    assert paddle_rt.empty((3,), "uint8").nbytes == 3
