/* The norm family's fused op: add_rms_norm (InfiniCore's AddRMSNorm). residual_out = a + b rounded to its dtype;
 * y = (a + b) / sqrt(mean((a + b)^2) + eps) * weight from the unrounded sum, over the last axis. A row is read
 * whole before anything of it is written, so y or residual_out may be a or b themselves (in place). */
#include <math.h>

#include "engine/host_float.h"
#include "engine/op_families.h"

using namespace prt_host;

namespace {

template <typename C>
C_Status add_rms_norm(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &y = c->out, &res = c->inputs[0], &a = c->inputs[1], &b = c->inputs[2],
                           &w = c->inputs[3];
    const int nd = y.ndim;
    const int64_t d = y.shape[nd - 1];
    C* s = static_cast<C*>(c->workspace);
    C* t = s + d;
    C* wr = t + d;
    const C eps = (C)c->attrs[0];
    read_row<C>(w.data, w.dtype, w.strides[0], d, wr);
    for_each_index(y.shape, nd - 1, [&](const int64_t* idx) {
        read_row<C>(at(a, idx, nd - 1), a.dtype, a.strides[nd - 1], d, s);
        read_row<C>(at(b, idx, nd - 1), b.dtype, b.strides[nd - 1], d, t);
        C ss = 0;
        for (int64_t i = 0; i < d; i++) {
            s[i] += t[i];
            ss += s[i] * s[i];
        }
        write_row<C>(at(res, idx, nd - 1), res.dtype, res.strides[nd - 1], d, s);
        const C r = (C)1 / std::sqrt(ss / (C)d + eps);
        for (int64_t i = 0; i < d; i++) t[i] = s[i] * r * wr[i];
        write_row<C>(at(y, idx, nd - 1), y.dtype, y.strides[nd - 1], d, t);
    });
    return C_SUCCESS;
}

}  // namespace

C_Status prt_add_rms_norm_kernel(const paddle_rt_op_call* c) {
    return c->dtype == FLOAT64 ? add_rms_norm<double>(c) : add_rms_norm<float>(c);
}

size_t prt_add_rms_norm_workspace(const paddle_rt_op_call* c) {
    return (size_t)(3 * c->out.shape[c->out.ndim - 1]) * compute_size(c);
}
