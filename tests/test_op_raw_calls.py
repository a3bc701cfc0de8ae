"""InfiniOP's calling shape on descriptors: ``desc(y_ptr, x_ptr, ..., workspace=, stream=)`` with Allocations
(bounds-checked against the descriptor's TensorDescs, record_stream'd) or raw device addresses (ints: bounded by the
live allocation they point into, untracked)."""
import numpy as np
import pytest

import paddle_rt
from paddle_rt import op


def _alloc_with(values):
    a = paddle_rt.malloc(values.nbytes)
    np.frombuffer(memoryview(a), dtype=values.dtype)[:] = values.ravel()     # rt_cpu memory is host-addressable
    return a


def _read(a, dtype, n):
    return np.frombuffer(memoryview(a), dtype=dtype)[:n].copy()


def test_allocations_as_operands():
    h = op.Handle()
    x, y = np.arange(6, dtype=np.float32), np.full(6, 2.0, np.float32)
    d = op.AddDescriptor(h, op.TensorDesc((2, 3)), op.TensorDesc((2, 3)), op.TensorDesc((2, 3)))
    ax, ay, aout = _alloc_with(x), _alloc_with(y), paddle_rt.malloc(24)
    d(aout, ax, ay)
    paddle_rt.synchronize()
    np.testing.assert_array_equal(_read(aout, np.float32, 6), x + y)


def test_raw_pointers_as_operands():
    h = op.Handle()
    x = paddle_rt.tensor(np.linspace(-1, 1, 8, dtype=np.float32))
    out = paddle_rt.zeros((8,), "float32")
    d = op.SiluDescriptor(h, op.TensorDesc((8,)), op.TensorDesc((8,)))
    d(out.data_ptr, x.data_ptr)
    paddle_rt.synchronize()
    v = np.linspace(-1, 1, 8)
    np.testing.assert_allclose(out.numpy(), v / (1 + np.exp(-v)), rtol=1e-6)


def test_mixed_and_new_ops_with_raw_operands():
    h = op.Handle()
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    tw = paddle_rt.tensor(w)
    ids = _alloc_with(np.array([3, 0], np.int64))
    out = paddle_rt.zeros((2, 3), "float32")
    d = op.EmbeddingDescriptor(h, out, op.TensorDesc((2,), "int64"), tw)
    d(out, ids, tw.data_ptr)
    np.testing.assert_array_equal(out.numpy(), w[[3, 0]])


def test_random_sample_with_raw_operands():
    h = op.Handle()
    logits = paddle_rt.tensor(np.array([0.1, 3.0, 0.2], np.float32))
    res = paddle_rt.malloc(8)
    d = op.RandomSampleDescriptor(h, op.TensorDesc((), "int64"), logits)
    d(res, logits.data_ptr, random_val=0.5, topk=1)
    paddle_rt.synchronize()
    assert _read(res, np.int64, 1)[0] == 1


@pytest.mark.parametrize("bad,match", [
    (lambda: paddle_rt.malloc(20), r"operator add: out laid out as shape \(2, 3\), strides \(3, 1\), float32 spans 24 "
                                   r"bytes from its start; the allocation has 20"),
    (lambda: 0, r"operator add: out is the address 0"),
    (lambda: "0x10", r"operator add: out must be a paddle_rt Tensor, an Allocation or a device address"),
    (lambda: True, r"operator add: out must be a paddle_rt Tensor, an Allocation or a device address"),
])
def test_bad_raw_operands_refused_and_nothing_written(bad, match):
    h = op.Handle()
    a = paddle_rt.tensor(np.ones((2, 3), np.float32))
    d = op.AddDescriptor(h, op.TensorDesc((2, 3)), a, a)
    with pytest.raises(paddle_rt.InvalidArgument, match=match):
        d(bad(), a, a)
    np.testing.assert_array_equal(a.numpy(), np.ones((2, 3), np.float32))


def test_allocation_on_another_device_refused():
    if paddle_rt.device_count("rt_cpu") < 2:
        pytest.skip("needs two rt_cpu devices")
    h = op.Handle("rt_cpu:0")
    d = op.ReluDescriptor(h, op.TensorDesc((4,)), op.TensorDesc((4,)))
    other = paddle_rt.malloc(16, device="rt_cpu:1")
    with pytest.raises(paddle_rt.InvalidArgument, match=r"operator relu: input 0 is an allocation on rt_cpu:1"):
        d(paddle_rt.malloc(16), other)


def test_wrong_operand_count():
    h = op.Handle()
    d = op.ReluDescriptor(h, op.TensorDesc((4,)), op.TensorDesc((4,)))
    with pytest.raises(paddle_rt.InvalidArgument, match="operator relu takes 1 inputs after out, not 2"):
        d(paddle_rt.malloc(16), 1234, 5678)


def test_raw_operand_bounded_by_its_allocation():
    """A raw address is trusted no further than the live allocation holding it: a layout that runs past that
    allocation's end, an address in freed memory, in another device's memory or in no allocation at all is refused
    before anything runs, and nothing is written."""
    h = op.Handle("rt_cpu:0")
    a = paddle_rt.tensor(np.ones(8, np.float32))
    d = op.ReluDescriptor(h, op.TensorDesc((1 << 20,)), op.TensorDesc((1 << 20,)))
    with pytest.raises(paddle_rt.InvalidArgument,
                       match=r"rt_cpu:0: operator relu: out laid out as shape \(1048576,\).* spans 4194304 bytes.*"
                             r"between address 0x[0-9a-f]+ and the end of its allocation"):
        d(a.data_ptr, a.data_ptr)
    small = op.ReluDescriptor(h, op.TensorDesc((2,)), op.TensorDesc((2,)))
    freed = paddle_rt.malloc(64)
    ptr = freed.ptr
    freed.free()
    with pytest.raises(paddle_rt.InvalidArgument, match=r"out address 0x[0-9a-f]+ is not inside a live allocation"):
        small(ptr, a.data_ptr)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"input 0 address 0x1000 is not inside a live allocation"):
        small(a.data_ptr, 0x1000)
    if paddle_rt.device_count("rt_cpu") > 1:
        other = paddle_rt.malloc(64, device="rt_cpu:1")
        with pytest.raises(paddle_rt.InvalidArgument, match=r"not inside a live allocation on rt_cpu:0"):
            small(other.ptr, a.data_ptr)
    np.testing.assert_array_equal(a.numpy(), np.ones(8, np.float32))
    # an address inside an allocation, with the layout fitting before its end, runs
    small(a.data_ptr + 8, a.data_ptr)
    paddle_rt.synchronize()
    np.testing.assert_array_equal(a.numpy(), np.ones(8, np.float32))


def test_raw_operand_bounded_by_the_bytes_requested_not_the_rounded_block():
    """Issue 46 item 9: for A = malloc(64) (a block rounded up to the plugin's chunk: 512 bytes in the report, 256 by
    rt_cpu's default) a 16-float32 add at the block's last 64 bytes (A.ptr + 448 there) was accepted: inside the
    block but past the 64 bytes asked for."""
    h = op.Handle("rt_cpu:0")
    a = _alloc_with(np.ones(16, np.float32))
    block, = [b for seg in paddle_rt.memory_snapshot() for b in seg["blocks"] if b["address"] == a.ptr]
    assert block["size"] >= 128 and block["requested_size"] == 64
    tail = a.ptr + block["size"] - 64                 # the rounded block's last 64 bytes
    d = op.AddDescriptor(h, op.TensorDesc((16,)), op.TensorDesc((16,)), op.TensorDesc((16,)))
    with pytest.raises(paddle_rt.InvalidArgument, match=r"rt_cpu:0: operator add: out address 0x[0-9a-f]+ is not "
                                                        r"inside a live allocation"):
        d(tail, a.ptr, a.ptr)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"operator add: out laid out as shape \(16,\).* spans 64 "
                                                        r"bytes.*4 bytes lie between address"):
        d(a.ptr + 60, a.ptr, a.ptr)                   # inside the 64 bytes, the layout runs past them
    d(a.ptr, a.ptr, a.ptr)                            # exactly the bytes asked for: runs
    paddle_rt.synchronize()
    np.testing.assert_array_equal(_read(a, np.float32, 16), np.full(16, 2.0, np.float32))

