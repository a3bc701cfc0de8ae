/* Gated activations: silu_and_mul (InfiniCore's SiluAndMul, vLLM's): out[..., i] = silu(x[..., i]) * x[..., d + i]
 * for x (..., 2d), out (..., d). A row of x is read whole before out's row is written. */
#include <math.h>

#include "engine/host_float.h"
#include "engine/op_families.h"

using namespace prt_host;

namespace {

template <typename C>
C_Status silu_and_mul(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &y = c->out, &x = c->inputs[0];
    const int nd = y.ndim;
    const int64_t d = y.shape[nd - 1], sx = x.strides[nd - 1];
    C* g = static_cast<C*>(c->workspace);
    C* u = g + d;
    for_each_index(y.shape, nd - 1, [&](const int64_t* idx) {
        const char* row = at(x, idx, nd - 1);
        read_row<C>(row, x.dtype, sx, d, g);
        read_row<C>(row + d * sx * esize(x.dtype), x.dtype, sx, d, u);
        for (int64_t i = 0; i < d; i++) g[i] = g[i] / ((C)1 + std::exp(-g[i])) * u[i];
        write_row<C>(at(y, idx, nd - 1), y.dtype, y.strides[nd - 1], d, g);
    });
    return C_SUCCESS;
}

}  // namespace

C_Status prt_silu_and_mul_kernel(const paddle_rt_op_call* c) {
    return by_compute_type(c, [c](auto t) { return silu_and_mul<decltype(t)>(c); });
}

size_t prt_silu_and_mul_workspace(const paddle_rt_op_call* c) {
    return last_dim_rows_workspace(c, 2);
}
