/* Rotary position embedding (InfiniCore's RoPE): x and out (seq, heads, dim) or (batch, seq, heads, dim); pos_ids
 * (seq,) shared by every batch entry, or (batch, seq); sin and cos tables (max_pos, dim / 2). Element pairs are
 * (2i, 2i + 1) for GPT-J (attrs[0] == 0) or (i, i + dim / 2) for GPT-NeoX; each pair rotates by the angle of row
 * pos of the tables. Every position is checked against max_pos before anything is written; one outside leaves
 * (position, max_pos) as the failure detail. A row is read whole before it is written (in place allowed). */
#include "engine/host_float.h"
#include "engine/host_parallel.h"
#include "engine/op_families.h"

#include <algorithm>
#include <atomic>

using namespace prt_host;

namespace {

constexpr int64_t kRopeGrainElems = 32768;   /* elements per pool chunk at least (op_kernels.cpp's kGrainElems) */

struct RopeShape {
    int64_t batch, seq, heads, dim;
    int lead;                         /* 1 when the operands have a batch axis */
    int64_t pos_sb, pos_ss;           /* pos_ids strides (batch: 0 when shared) */
};

RopeShape rope_shape(const paddle_rt_op_call* c) {
    RopeShape r;
    const paddle_rt_tensor &y = c->out, &pos = c->inputs[1];
    r.lead = y.ndim == 4 ? 1 : 0;
    r.batch = r.lead ? y.shape[0] : 1;
    r.seq = y.shape[r.lead];
    r.heads = y.shape[r.lead + 1];
    r.dim = y.shape[r.lead + 2];
    r.pos_sb = pos.ndim == 2 ? pos.strides[0] : 0;
    r.pos_ss = pos.strides[pos.ndim - 1];
    return r;
}

template <typename C>
C_Status rope(const paddle_rt_op_call* c) {
    const RopeShape r = rope_shape(c);
    const paddle_rt_tensor &y = c->out, &x = c->inputs[0], &pos = c->inputs[1], &sn = c->inputs[2],
                           &cs = c->inputs[3];
    const int64_t half = r.dim / 2, max_pos = sn.shape[0];
    const bool neox = c->attrs[0] != 0;
    for (int64_t b = 0; b < r.batch; b++)
        for (int64_t s = 0; s < r.seq; s++) {
            const int64_t p = get_index(pos.data, pos.dtype, b * r.pos_sb + s * r.pos_ss);
            if (p < 0 || p >= max_pos) {
                set_detail(c, p, max_pos);
                return C_ERROR;
            }
        }
    const int ex = esize(x.dtype), ey = esize(y.dtype);
    const int64_t* xs = x.strides;
    const int64_t* ys = y.strides;
    const int L = r.lead;
    /* (batch, seq) rows split over the host thread pool (host_parallel.h); each (token, head) row is computed alone,
       so the result does not depend on the split. */
    std::atomic<int> failed{0};
    const int64_t grain = std::max<int64_t>(1, kRopeGrainElems / std::max<int64_t>(r.heads * r.dim, 1));
    prt::parallel_for(r.batch * r.seq, grain, [&](int64_t t0, int64_t t1) {
        /* locals, not the captured references: stores through the float rows could otherwise alias them (the build
           has -fno-strict-aliasing), and the compiler would reload them in the inner loops instead of vectorising */
        const int64_t dim = r.dim, hf = half, heads = r.heads, seq = r.seq;
        C* const scratch = static_cast<C*>(prt_parallel_scratch((size_t)(3 * dim) * sizeof(C)));   /* this thread's */
        if (!scratch) { failed.store(1); return; }
        C* __restrict xr = scratch;
        C* __restrict yr = scratch + dim;
        C* __restrict sv = yr + dim;
        C* __restrict cv = sv + hf;
        for (int64_t t = t0; t < t1; t++) {
            const int64_t b = t / seq, si = t % seq;
            const int64_t p = get_index(pos.data, pos.dtype, b * r.pos_sb + si * r.pos_ss);
            read_row<C>(static_cast<const char*>(sn.data) + p * sn.strides[0] * esize(sn.dtype), sn.dtype,
                        sn.strides[1], hf, sv);
            read_row<C>(static_cast<const char*>(cs.data) + p * cs.strides[0] * esize(cs.dtype), cs.dtype,
                        cs.strides[1], hf, cv);
            for (int64_t h = 0; h < heads; h++) {
                const int64_t xo = (L ? b * xs[0] : 0) + si * xs[L] + h * xs[L + 1];
                const int64_t yo = (L ? b * ys[0] : 0) + si * ys[L] + h * ys[L + 1];
                read_row<C>(static_cast<const char*>(x.data) + xo * ex, x.dtype, xs[L + 2], dim, xr);
                if (neox) {             /* halves: contiguous, vectorised */
                    for (int64_t i = 0; i < hf; i++) {
                        yr[i] = xr[i] * cv[i] - xr[i + hf] * sv[i];
                        yr[i + hf] = xr[i] * sv[i] + xr[i + hf] * cv[i];
                    }
                } else {                /* interleaved pairs */
                    for (int64_t i = 0; i < hf; i++) {
                        yr[2 * i] = xr[2 * i] * cv[i] - xr[2 * i + 1] * sv[i];
                        yr[2 * i + 1] = xr[2 * i] * sv[i] + xr[2 * i + 1] * cv[i];
                    }
                }
                write_row<C>(static_cast<char*>(y.data) + yo * ey, y.dtype, ys[L + 2], dim, yr);
            }
        }
    });
    return failed.load() ? C_ERROR : C_SUCCESS;
}

}  // namespace

C_Status prt_rope_kernel(const paddle_rt_op_call* c) {
    return by_compute_type(c, [c](auto t) { return rope<decltype(t)>(c); });
}

size_t prt_rope_workspace(const paddle_rt_op_call* c) {
    (void)c;
    return kDetailBytes;     /* the failure detail; the rows are each pool thread's scratch */
}
