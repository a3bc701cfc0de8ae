"""paddle_rt.as_strided / Tensor.as_strided and Tensor.expand (torch's meanings): any strides >= 0 including 0 and
overlapping ones, checked against the storage's bounds; operators accept such views as inputs and refuse an output
whose elements overlap (stride 0 or overlapping strides), writing nothing."""
import numpy as np
import pytest

import paddle_rt
from paddle_rt import ops


def np_view(base, shape, strides, offset=0):
    return np.lib.stride_tricks.as_strided(base[offset:], shape, [s * base.itemsize for s in strides])


@pytest.mark.parametrize("shape,strides", [((2, 2, 4), (12, 8, 1)), ((3, 4), (0, 1)), ((3, 3), (1, 1)),
                                           ((2, 3), (1, 2)), ((4,), (0,)), ((2, 0, 3), (5, 1, 1))])
def test_as_strided_reads_like_numpy(shape, strides):
    base = np.arange(30, dtype=np.float32)
    t = paddle_rt.tensor(base)
    v = paddle_rt.as_strided(t, shape, strides)
    assert v.shape == shape and v.strides == strides
    np.testing.assert_array_equal(v.numpy(), np_view(base, shape, strides))


def test_as_strided_offset_counts_from_the_storage():
    base = np.arange(10, dtype=np.int64)
    t = paddle_rt.tensor(base)
    view = t[3:]
    np.testing.assert_array_equal(view.as_strided((2,), (2,)).numpy(), [3, 5])       # default: the view's own offset
    np.testing.assert_array_equal(view.as_strided((2,), (2,), 1).numpy(), [1, 3])    # torch: from the storage's start
    np.testing.assert_array_equal(t.as_strided((3,), (3,), offset=1).numpy(), [1, 4, 7])


@pytest.mark.parametrize("shape,strides,offset,match", [
    ((3,), (4,), 0, "reaches element 8 of the storage, which holds 8 elements"),
    ((2, 2), (4, 1), 4, "reaches element 9"),
    ((2,), (-1,), 0, "the stride of dimension 0 must be an int >= 0, not -1"),
    ((2,), (1, 1), 0, "1 dimensions but 2 strides"),
    ((2,), (1,), -1, "offset must be an int >= 0"),
])
def test_as_strided_bounds(shape, strides, offset, match):
    t = paddle_rt.tensor(np.zeros(8, np.float32))
    with pytest.raises(paddle_rt.InvalidArgument, match=match):
        t.as_strided(shape, strides, offset)


def test_as_strided_needs_a_tensor():
    with pytest.raises(paddle_rt.InvalidArgument, match="as_strided: t must be a paddle_rt Tensor"):
        paddle_rt.as_strided(np.zeros(3), (3,), (1,))


def test_expand():
    x = paddle_rt.tensor(np.array([[1.0], [2.0]], np.float32))
    e = x.expand(3, 2, 4)
    assert e.shape == (3, 2, 4) and e.strides == (0, 1, 0)
    np.testing.assert_array_equal(e.numpy(), np.broadcast_to(x.numpy(), (3, 2, 4)))
    assert x.expand(-1, 5).shape == (2, 5)
    with pytest.raises(paddle_rt.InvalidArgument, match=r"dimension 0 of shape \(2, 1\) has extent 2"):
        x.expand(3, 4)
    with pytest.raises(paddle_rt.InvalidArgument, match="more dimensions"):
        x.expand(4)
    with pytest.raises(paddle_rt.InvalidArgument, match="-1 is not allowed for a new dimension"):
        x.expand(-1, 2, 1)


def test_broadcast_views_as_operator_inputs():
    x = np.array([0.5, -1.0, 2.0], np.float32)
    e = paddle_rt.tensor(x).expand(4, 3)
    np.testing.assert_allclose(ops.relu(e).numpy(), np.maximum(np.broadcast_to(x, (4, 3)), 0))
    np.testing.assert_allclose(ops.rearrange(e).numpy(), np.broadcast_to(x, (4, 3)))
    np.testing.assert_allclose(ops.silu(e).numpy(), np.broadcast_to(x / (1 + np.exp(-x)), (4, 3)), rtol=1e-6)


@pytest.mark.parametrize("shape,strides,rule", [((3, 3), (0, 1), "stride 0 in dimension 0"),
                                               ((3, 3), (1, 1), "overlaps itself"),
                                               ((2, 3), (2, 1), "overlaps itself")])
def test_self_overlapping_output_refused_and_nothing_written(shape, strides, rule):
    base = paddle_rt.tensor(np.full(16, 7.0, np.float32))
    out = base.as_strided(shape, strides)
    x = paddle_rt.tensor(np.ones(shape, np.float32))
    with pytest.raises(paddle_rt.InvalidArgument, match=f"operator add: out .*{rule}"):
        ops.add(x, x, out=out)
    with pytest.raises(paddle_rt.InvalidArgument, match=f"operator rearrange: out .*{rule}"):
        ops.rearrange(x, out=out)
    np.testing.assert_array_equal(base.numpy(), np.full(16, 7.0, np.float32))


def test_non_overlapping_exotic_output_accepted():
    base = paddle_rt.tensor(np.zeros(24, np.float32))
    out = base.as_strided((2, 3), (1, 2))          # column-major: distinct elements
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ops.rearrange(paddle_rt.tensor(x), out=out)
    np.testing.assert_array_equal(out.numpy(), x)
    np.testing.assert_array_equal(base.numpy()[:6], x.T.ravel())
