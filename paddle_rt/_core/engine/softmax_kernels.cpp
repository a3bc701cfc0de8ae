/* softmax over one axis (InfiniCore's Softmax). The descriptor hands the kernel layouts with that axis moved last
 * (attrs[0] keeps the caller's axis), so this is a softmax of each row; a row is read whole before it is written
 * (in place allowed). */
#include <math.h>

#include "engine/host_float.h"
#include "engine/op_families.h"

using namespace prt_host;

namespace {

template <typename C>
C_Status softmax(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &y = c->out, &x = c->inputs[0];
    const int nd = y.ndim;
    const int64_t n = y.shape[nd - 1];
    C* r = static_cast<C*>(c->workspace);
    for_each_index(y.shape, nd - 1, [&](const int64_t* idx) {
        read_row<C>(at(x, idx, nd - 1), x.dtype, x.strides[nd - 1], n, r);
        C m = r[0];
        for (int64_t i = 1; i < n; i++) m = r[i] > m ? r[i] : m;
        C s = 0;
        for (int64_t i = 0; i < n; i++) {
            r[i] = std::exp(r[i] - m);
            s += r[i];
        }
        const C inv = (C)1 / s;
        for (int64_t i = 0; i < n; i++) r[i] *= inv;
        write_row<C>(at(y, idx, nd - 1), y.dtype, y.strides[nd - 1], n, r);
    });
    return C_SUCCESS;
}

}  // namespace

C_Status prt_softmax_kernel(const paddle_rt_op_call* c) {
    return by_compute_type(c, [c](auto t) { return softmax<decltype(t)>(c); });
}

size_t prt_softmax_workspace(const paddle_rt_op_call* c) {
    return last_dim_rows_workspace(c, 1);
}
