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
 * of the cached values. The work is split over the host thread pool by (kv head, block of 16 queries); each unit
 * runs the group's query heads, so a kv head's cached rows are read from cache by all of them. */
#include <math.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "engine/host_float.h"
#include "engine/host_parallel.h"
#include "engine/op_families.h"
#include "engine/vector_math.h"

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

/* ---- attention's inner loops ------------------------------------------------------------------------------------
 * The keys a unit reads are first transposed into blocks of kKeys keys, dimension-major (Kt[(b * dim + e) * kKeys +
 * l] = K[b * kKeys + l][e], zeros past the last key): the scores of kKeys keys are then kKeys independent sums that
 * the compiler vectorises across keys (q[e] broadcast, one multiply-add per kKeys/width keys, no horizontal
 * reduction per key). scores: sc[j] = scale * q . K[j] for j < kept, returning their maximum; weighted_sum:
 * acc = sum_j p[j] * V[j] over contiguous value rows, kKeys output elements at a time kept in registers over all
 * j. The float versions are compiled
 * for AVX-512, AVX2+FMA and the x86-64 baseline (GCC's target_clones, chosen once at load by the CPU): these two loops
 * are all of attention's arithmetic. Each sum runs in a fixed order on one thread, whatever the thread count. */
constexpr int kKeys = 64;

template <typename C>
void transpose_keys(const C* __restrict row, int64_t j, int64_t dim, C* __restrict kt) {
    C* __restrict blk = kt + (j / kKeys) * dim * kKeys + j % kKeys;
    for (int64_t e = 0; e < dim; e++) blk[e * kKeys] = row[e];
}

template <typename C>
__attribute__((always_inline)) inline C scores_body(const C* __restrict q, const C* __restrict kt, int64_t dim,
                                                    int64_t kept, C scale, C* __restrict sc) {
    const int64_t blocks = (kept + kKeys - 1) / kKeys;
    for (int64_t b = 0; b < blocks; b++) {
        const C* __restrict k = kt + b * dim * kKeys;
        C acc[kKeys] = {};
        for (int64_t e = 0; e < dim; e++) {
            const C x = q[e];
            for (int l = 0; l < kKeys; l++) acc[l] += x * k[e * kKeys + l];
        }
        for (int l = 0; l < kKeys; l++) sc[b * kKeys + l] = acc[l] * scale;
    }
    C m = sc[0];
    for (int64_t i = 1; i < kept; i++) m = sc[i] > m ? sc[i] : m;
    return m;
}

template <typename C>
__attribute__((always_inline)) inline void weighted_sum_body(const C* __restrict p, const C* __restrict V, int64_t ld,
                                                             int64_t dim, int64_t kept, C* __restrict acc) {
    int64_t e0 = 0;
    for (; e0 + kKeys <= dim; e0 += kKeys) {       /* kKeys output elements held in registers over every j */
        C a[kKeys] = {};
        for (int64_t j = 0; j < kept; j++) {
            const C pj = p[j];
            const C* __restrict v = V + j * ld + e0;
            for (int l = 0; l < kKeys; l++) a[l] += pj * v[l];
        }
        for (int l = 0; l < kKeys; l++) acc[e0 + l] = a[l];
    }
    if (e0 < dim) {
        for (int64_t e = e0; e < dim; e++) acc[e] = 0;
        for (int64_t j = 0; j < kept; j++) {
            const C pj = p[j];
            const C* __restrict v = V + j * ld;
            for (int64_t e = e0; e < dim; e++) acc[e] += pj * v[e];
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define PRT_ATTENTION_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PRT_ATTENTION_CLONES
#endif

PRT_ATTENTION_CLONES float scores(const float* q, const float* kt, int64_t dim, int64_t kept, float scale, float* sc) {
    return scores_body<float>(q, kt, dim, kept, scale, sc);
}
PRT_ATTENTION_CLONES void weighted_sum(const float* p, const float* V, int64_t ld, int64_t dim, int64_t kept,
                                       float* acc) {
    weighted_sum_body<float>(p, V, ld, dim, kept, acc);
}
double scores(const double* q, const double* kt, int64_t dim, int64_t kept, double scale, double* sc) {
    return scores_body<double>(q, kt, dim, kept, scale, sc);
}
void weighted_sum(const double* p, const double* V, int64_t ld, int64_t dim, int64_t kept, double* acc) {
    weighted_sum_body<double>(p, V, ld, dim, kept, acc);
}

/* x[i] = exp(x[i] - m), returning their sum */
inline float exp_shifted(float* x, int64_t n, float m) {
    for (int64_t i = 0; i < n; i++) x[i] -= m;
    prt_vm_apply(PRT_VM_EXP, x, nullptr, x, n);
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}
inline double exp_shifted(double* x, int64_t n, double m) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (x[i] = std::exp(x[i] - m));
    return s;
}

/* Queries per unit of work of a prefill: a unit is (kv head, block of queries), all the group's query heads. */
constexpr int64_t kQueryBlock = 16;

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
    /* float32 caches with contiguous rows are read where they are; the rest is widened per unit into scratch */
    const bool f32 = std::is_same<C, float>::value;
    const bool direct_kv = f32 && kc.dtype == FLOAT32 && kc.strides[2] == 1 && vc.strides[2] == 1;
    const bool direct_q = f32 && q.dtype == FLOAT32 && q.strides[2] == 1;
    const C scale = (C)1 / std::sqrt((C)dim);
    const int64_t blocks = (seq + kQueryBlock - 1) / kQueryBlock;
    std::atomic<int> failed{0};
    const int64_t key_blocks = (total + kKeys - 1) / kKeys;
    prt::parallel_for(nkv * blocks, 1, [&](int64_t u0, int64_t u1) {
        const int64_t D = dim, P = pos;
        /* this thread's rows: the transposed keys, the values when widened, the scores, a query, a key, the output */
        const size_t kt_elems = (size_t)(key_blocks * kKeys * D), v_elems = direct_kv ? 0 : (size_t)(total * D);
        C* scratch = static_cast<C*>(prt_parallel_scratch(
            (kt_elems + v_elems + (size_t)(key_blocks * kKeys + 3 * D)) * sizeof(C)));
        if (!scratch) {
            failed.store(1);
            return;
        }
        C* kt = scratch;
        C* Vw = kt + kt_elems;
        C* sc = Vw + v_elems;
        C* qr = sc + key_blocks * kKeys;
        C* kr = qr + D;
        C* acc = kr + D;
        for (int64_t u = u0; u < u1; u++) {
            const int64_t g = u / blocks, i0 = (u % blocks) * kQueryBlock, i1 = std::min(seq, i0 + kQueryBlock);
            const int64_t need = i1 + P;                   /* the cached positions this block reads */
            const char* kbase = static_cast<const char*>(kc.data) + g * kc.strides[0] * es;
            const char* vbase = static_cast<const char*>(vc.data) + g * vc.strides[0] * es;
            const int64_t padded = (need + kKeys - 1) / kKeys * kKeys;
            for (int64_t j = 0; j < need; j++) {
                const char* p = kbase + j * kc.strides[1] * es;
                if (direct_kv) {
                    transpose_keys<C>(reinterpret_cast<const C*>(p), j, D, kt);
                } else {
                    read_row<C>(p, kc.dtype, kc.strides[2], D, kr);
                    transpose_keys<C>(kr, j, D, kt);
                }
            }
            for (int64_t j = need; j < padded; j++)
                for (int64_t e = 0; e < D; e++) kt[(j / kKeys) * D * kKeys + e * kKeys + j % kKeys] = 0;
            const C* V = reinterpret_cast<const C*>(vbase);
            int64_t ldv = vc.strides[1];
            if (!direct_kv) {
                for (int64_t j = 0; j < need; j++)
                    read_row<C>(vbase + j * vc.strides[1] * es, vc.dtype, vc.strides[2], D, Vw + j * D);
                V = Vw;
                ldv = D;
            }
            for (int64_t h = g * group; h < (g + 1) * group; h++)
                for (int64_t i = i0; i < i1; i++) {
                    const char* qp = static_cast<const char*>(q.data) + (h * q.strides[0] + i * q.strides[1]) * es;
                    const C* qv = reinterpret_cast<const C*>(qp);
                    if (!direct_q) {
                        read_row<C>(qp, q.dtype, q.strides[2], D, qr);
                        qv = qr;
                    }
                    const int64_t kept = i + P + 1;
                    const C m = scores(qv, kt, D, kept, scale, sc);
                    const C inv = (C)1 / exp_shifted(sc, kept, m);
                    for (int64_t j = 0; j < kept; j++) sc[j] *= inv;
                    weighted_sum(sc, V, ldv, D, kept, acc);
                    write_row<C>(static_cast<char*>(out.data) + (i * out.strides[0] + h * out.strides[1]) * es,
                                 out.dtype, out.strides[2], D, acc);
                }
        }
    });
    return failed.load() ? C_ERROR : C_SUCCESS;
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

size_t prt_attention_workspace(const paddle_rt_op_call*) { return 0; }   /* per-thread scratch rows instead */
