/* The attention family.
 *
 * kv_caching (InfiniCore's KVCaching): k_cache, v_cache (batch, kv_heads, max_seq, dim); k, v (batch, kv_heads,
 * seq, dim); past_kv_lengths (batch,) int32/int64. For every b: cache[b, :, past[b] : past[b] + seq] = new[b]. Every
 * past length is checked first (0 <= past, past + seq <= max_seq); a bad one leaves (b, past) as the failure detail
 * and nothing is written.
 *
 * attention (InfiniCore's Attention): q (q_heads, seq, dim); k, v (kv_heads, seq, dim); k_cache, v_cache (kv_heads,
 * >= pos + seq, dim); out (seq, q_heads, dim); attrs[0] = pos. k and v are written to the caches at [pos, pos + seq);
 * query head h reads kv head h / (q_heads / kv_heads) (grouped-query); scores q.k / sqrt(dim) over the first
 * total = pos + seq cached positions, position j kept for query i iff j <= i + pos (causal); softmax; weighted sum
 * of the cached values. */
#include <math.h>
#include <string.h>

#include "engine/host_float.h"
#include "engine/op_families.h"

using namespace prt_host;

namespace {

/* dst[.., off + i, ..] = src[.., i, ..] for a (seq, dim) slab of one head: element-size copies, any strides. */
void copy_slab(const paddle_rt_tensor& dst, char* dbase, int64_t off, const paddle_rt_tensor& src,
               const char* sbase, int sd, int64_t seq, int64_t dim) {
    const int es = esize(dst.dtype);
    const int64_t ds = dst.strides[sd], dd = dst.strides[sd + 1], ss = src.strides[sd], sdd = src.strides[sd + 1];
    for (int64_t i = 0; i < seq; i++) {
        char* o = dbase + (off + i) * ds * es;
        const char* p = sbase + i * ss * es;
        if (dd == 1 && sdd == 1) {
            memmove(o, p, (size_t)(dim * es));
            continue;
        }
        for (int64_t j = 0; j < dim; j++) memcpy(o + j * dd * es, p + j * sdd * es, (size_t)es);
    }
}

template <typename C>
C_Status attention(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &out = c->out, &q = c->inputs[0], &k = c->inputs[1], &v = c->inputs[2],
                           &kc = c->inputs[3], &vc = c->inputs[4];
    const int64_t nq = q.shape[0], seq = q.shape[1], dim = q.shape[2], nkv = k.shape[0];
    const int64_t pos = (int64_t)c->attrs[0], total = pos + seq, group = nq / nkv;
    const int es = esize(out.dtype);
    for (int64_t g = 0; g < nkv; g++) {
        copy_slab(kc, static_cast<char*>(kc.data) + g * kc.strides[0] * es, pos, k,
                  static_cast<const char*>(k.data) + g * k.strides[0] * es, 1, seq, dim);
        copy_slab(vc, static_cast<char*>(vc.data) + g * vc.strides[0] * es, pos, v,
                  static_cast<const char*>(v.data) + g * v.strides[0] * es, 1, seq, dim);
    }
    C* K = static_cast<C*>(c->workspace);
    C* V = K + total * dim;
    C* qr = V + total * dim;
    C* acc = qr + dim;
    C* sc = acc + dim;
    const C scale = (C)1 / std::sqrt((C)dim);
    for (int64_t g = 0; g < nkv; g++) {
        for (int64_t j = 0; j < total; j++) {
            read_row<C>(static_cast<const char*>(kc.data) + (g * kc.strides[0] + j * kc.strides[1]) * es, kc.dtype,
                        kc.strides[2], dim, K + j * dim);
            read_row<C>(static_cast<const char*>(vc.data) + (g * vc.strides[0] + j * vc.strides[1]) * es, vc.dtype,
                        vc.strides[2], dim, V + j * dim);
        }
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t i = 0; i < seq; i++) {
                read_row<C>(static_cast<const char*>(q.data) + (h * q.strides[0] + i * q.strides[1]) * es, q.dtype,
                            q.strides[2], dim, qr);
                const int64_t kept = i + pos + 1;
                C m = -INFINITY;
                for (int64_t j = 0; j < kept; j++) {
                    const C* kr = K + j * dim;
                    C s = 0;
                    for (int64_t e = 0; e < dim; e++) s += qr[e] * kr[e];
                    sc[j] = s * scale;
                    m = sc[j] > m ? sc[j] : m;
                }
                C sum = 0;
                for (int64_t j = 0; j < kept; j++) {
                    sc[j] = std::exp(sc[j] - m);
                    sum += sc[j];
                }
                for (int64_t e = 0; e < dim; e++) acc[e] = 0;
                for (int64_t j = 0; j < kept; j++) {
                    const C p = sc[j] / sum;
                    const C* vr = V + j * dim;
                    for (int64_t e = 0; e < dim; e++) acc[e] += p * vr[e];
                }
                write_row<C>(static_cast<char*>(out.data) + (i * out.strides[0] + h * out.strides[1]) * es,
                             out.dtype, out.strides[2], dim, acc);
            }
    }
    return C_SUCCESS;
}

}  // namespace

C_Status prt_kv_caching_kernel(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &kc = c->out, &vc = c->inputs[0], &k = c->inputs[1], &v = c->inputs[2],
                           &past = c->inputs[3];
    const int64_t batch = kc.shape[0], heads = kc.shape[1], max_seq = kc.shape[2], dim = kc.shape[3];
    const int64_t seq = k.shape[2];
    for (int64_t b = 0; b < batch; b++) {
        const int64_t p = get_index(past.data, past.dtype, b * past.strides[0]);
        if (p < 0 || p + seq > max_seq) {
            set_detail(c, b, p);
            return C_ERROR;
        }
    }
    if (seq == 0 || dim == 0) return C_SUCCESS;
    const int es = esize(kc.dtype);
    for (int64_t b = 0; b < batch; b++) {
        const int64_t p = get_index(past.data, past.dtype, b * past.strides[0]);
        for (int64_t h = 0; h < heads; h++) {
            copy_slab(kc, static_cast<char*>(kc.data) + (b * kc.strides[0] + h * kc.strides[1]) * es, p, k,
                      static_cast<const char*>(k.data) + (b * k.strides[0] + h * k.strides[1]) * es, 2, seq, dim);
            copy_slab(vc, static_cast<char*>(vc.data) + (b * vc.strides[0] + h * vc.strides[1]) * es, p, v,
                      static_cast<const char*>(v.data) + (b * v.strides[0] + h * v.strides[1]) * es, 2, seq, dim);
        }
    }
    return C_SUCCESS;
}

size_t prt_kv_caching_workspace(const paddle_rt_op_call*) { return kDetailBytes; }

C_Status prt_attention_kernel(const paddle_rt_op_call* c) {
    if (c->inputs[0].shape[0] == 0 || c->inputs[0].shape[1] == 0 || c->inputs[0].shape[2] == 0) return C_SUCCESS;
    return c->dtype == FLOAT64 ? attention<double>(c) : attention<float>(c);
}

size_t prt_attention_workspace(const paddle_rt_op_call* c) {
    const int64_t seq = c->inputs[0].shape[1], dim = c->inputs[0].shape[2], total = (int64_t)c->attrs[0] + seq;
    return (size_t)(2 * total * dim + 2 * dim + total) * compute_size(c);
}
