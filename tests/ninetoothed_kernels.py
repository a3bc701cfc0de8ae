"""NineToothed add and matmul (arrangement + application) for tests/test_triton.py. A module of their own: NineToothed
copies every @triton.jit function of an application's module into the source it generates."""
import ninetoothed
import ninetoothed.language as ntl
from ninetoothed import Tensor

ADD_TENSORS = (Tensor(1), Tensor(1), Tensor(1))
MATMUL_TENSORS = (Tensor(2), Tensor(2), Tensor(2))


def add_arrangement(input, other, output, BLOCK_SIZE=ninetoothed.block_size()):
    return input.tile((BLOCK_SIZE,)), other.tile((BLOCK_SIZE,)), output.tile((BLOCK_SIZE,))


def add_application(input, other, output):
    output = input + other  # noqa: F841  (assigning the output parameter stores it)


def matmul_arrangement(lhs, rhs, output, BLOCK_SIZE_M=ninetoothed.block_size(), BLOCK_SIZE_N=ninetoothed.block_size(),
                       BLOCK_SIZE_K=ninetoothed.block_size()):
    output_tiled = output.tile((BLOCK_SIZE_M, BLOCK_SIZE_N))
    lhs_tiled = lhs.tile((BLOCK_SIZE_M, BLOCK_SIZE_K)).tile((1, -1)).expand((-1, output_tiled.shape[1]))
    lhs_tiled.dtype = lhs_tiled.dtype.squeeze(0)
    rhs_tiled = rhs.tile((BLOCK_SIZE_K, BLOCK_SIZE_N)).tile((-1, 1)).expand((output_tiled.shape[0], -1))
    rhs_tiled.dtype = rhs_tiled.dtype.squeeze(1)
    return lhs_tiled, rhs_tiled, output_tiled


def matmul_application(lhs, rhs, output):
    acc = ntl.zeros(output.shape, dtype=ntl.float32)
    for k in range(lhs.shape[0]):
        acc += ntl.dot(lhs[k], rhs[k])
    output = acc  # noqa: F841
