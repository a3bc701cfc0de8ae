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
 * of the cached values; attrs[1] = window (0: every earlier position; w: query i keeps the last w positions up to
 * i + pos, Mistral's sliding window). The work is split over the host thread pool by (kv head, block of 16
 * queries); each unit
 * runs the group's query heads, so a kv head's cached rows are read from cache by all of them. */
#include <math.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

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

/* A whole block of kKeys keys (rows ld apart) at once: 8 x 8 tiles, so that both sides touch few cache lines. */
template <typename C>
void transpose_key_block(const C* __restrict K, int64_t ld, int64_t dim, C* __restrict blk) {
    int64_t e0 = 0;
    for (; e0 + 8 <= dim; e0 += 8)
        for (int l0 = 0; l0 < kKeys; l0 += 8)
            for (int e = 0; e < 8; e++)
                for (int l = 0; l < 8; l++) blk[(e0 + e) * kKeys + l0 + l] = K[(l0 + l) * ld + e0 + e];
    for (; e0 < dim; e0++)
        for (int l = 0; l < kKeys; l++) blk[e0 * kKeys + l] = K[l * ld + e0];
}

/* sc[h][j0 + l] = scale * q[h] . K[j0 + l] for l < W and H query heads at once (one load of the keys for all of
   them); k: the keys' transposed block (row stride kKeys). */
template <int H, int W, typename C>
__attribute__((always_inline)) inline void block_scores(const C* const* q, const C* __restrict k, int64_t dim,
                                                        C scale, C* const* sc, int64_t j0) {
    C acc[H][W] = {};
    for (int64_t e = 0; e < dim; e++)
        for (int h = 0; h < H; h++) {
            const C x = q[h][e];
            for (int l = 0; l < W; l++) acc[h][l] += x * k[e * kKeys + l];
        }
    for (int h = 0; h < H; h++)
        for (int l = 0; l < W; l++) sc[h][j0 + l] = acc[h][l] * scale;
}

/* sc[h][j] for j < kept: whole blocks of kKeys keys; a last block of at most kKeys / 2 keys computes only its first
   half (zeros past the last key); sc[h] has room for kept rounded up to kKeys. */
template <int H, typename C>
__attribute__((always_inline)) inline void scores_body(const C* const* q, const C* __restrict kt, int64_t dim,
                                                       int64_t kept, C scale, C* const* sc) {
    const int64_t full = kept / kKeys, rest = kept - full * kKeys;
    for (int64_t b = 0; b < full; b++) block_scores<H, kKeys, C>(q, kt + b * dim * kKeys, dim, scale, sc, b * kKeys);
    if (rest > kKeys / 2) block_scores<H, kKeys, C>(q, kt + full * dim * kKeys, dim, scale, sc, full * kKeys);
    else if (rest > 0) block_scores<H, kKeys / 2, C>(q, kt + full * dim * kKeys, dim, scale, sc, full * kKeys);
}

/* acc[h] = sum_j p[h][j] * V[j] for H heads at once (one load of the values for all of them), kKeys output elements
   at a time held in registers over every j. */
template <int H, typename C>
__attribute__((always_inline)) inline void weighted_sum_body(const C* const* p, const C* __restrict V, int64_t ld,
                                                             int64_t dim, int64_t kept, C* const* acc) {
    int64_t e0 = 0;
    for (; e0 + kKeys <= dim; e0 += kKeys) {
        C a[H][kKeys] = {};
        for (int64_t j = 0; j < kept; j++) {
            const C* __restrict v = V + j * ld + e0;
            for (int h = 0; h < H; h++) {
                const C pj = p[h][j];
                for (int l = 0; l < kKeys; l++) a[h][l] += pj * v[l];
            }
        }
        for (int h = 0; h < H; h++)
            for (int l = 0; l < kKeys; l++) acc[h][e0 + l] = a[h][l];
    }
    if (e0 < dim)
        for (int h = 0; h < H; h++) {
            for (int64_t e = e0; e < dim; e++) acc[h][e] = 0;
            for (int64_t j = 0; j < kept; j++) {
                const C pj = p[h][j];
                const C* __restrict v = V + j * ld;
                for (int64_t e = e0; e < dim; e++) acc[h][e] += pj * v[e];
            }
        }
}

/* A unit of a single query (a decode step) reads each key once: its scores come straight from the contiguous key
   rows (no transpose, which would cost as much as the scores). sc[h][j] = scale * q[h] . K[j] for j < kept, H heads
   and 4 keys at a time sharing the loads, each dot product in kLanes partial sums over the dimension (a fixed order),
   added pairwise, then the dimension's tail. */
constexpr int kDotLanes = 16;

template <int H, int T, typename C>
__attribute__((always_inline)) inline void row_scores(const C* const* q, const C* __restrict K, int64_t ld,
                                                      int64_t dim, int64_t j, C scale, C* const* sc) {
    const int64_t dv = dim / kDotLanes * kDotLanes;
    C acc[H][T][kDotLanes] = {};
    for (int64_t e0 = 0; e0 < dv; e0 += kDotLanes)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const C* __restrict kr = K + (j + t) * ld + e0;
                const C* __restrict qh = q[h] + e0;
                for (int l = 0; l < kDotLanes; l++) acc[h][t][l] += qh[l] * kr[l];
            }
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            C* a = acc[h][t];
            for (int w = kDotLanes / 2; w > 0; w /= 2)
                for (int l = 0; l < w; l++) a[l] += a[l + w];
            C s = a[0];
            for (int64_t e = dv; e < dim; e++) s += q[h][e] * K[(j + t) * ld + e];
            sc[h][j + t] = s * scale;
        }
}

template <int H, typename C>
__attribute__((always_inline)) inline void direct_scores_body(const C* const* q, const C* __restrict K, int64_t ld,
                                                              int64_t dim, int64_t kept, C scale, C* const* sc) {
    int64_t j = 0;
    for (; j + 4 <= kept; j += 4) row_scores<H, 4, C>(q, K, ld, dim, j, scale, sc);
    for (; j < kept; j++) row_scores<H, 1, C>(q, K, ld, dim, j, scale, sc);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PRT_ATTENTION_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PRT_ATTENTION_CLONES
#endif

/* nh = 4 heads (a GQA group of 4, 8, ...) or 1 at a time. */
template <typename C>
__attribute__((always_inline)) inline void scores_heads(int nh, const C* const* q, const C* kt, int64_t dim,
                                                        int64_t kept, C scale, C* const* sc) {
    if (nh == 4) scores_body<4, C>(q, kt, dim, kept, scale, sc);
    else scores_body<1, C>(q, kt, dim, kept, scale, sc);
}
template <typename C>
__attribute__((always_inline)) inline void weighted_sum_heads(int nh, const C* const* p, const C* V, int64_t ld,
                                                              int64_t dim, int64_t kept, C* const* acc) {
    if (nh == 4) weighted_sum_body<4, C>(p, V, ld, dim, kept, acc);
    else weighted_sum_body<1, C>(p, V, ld, dim, kept, acc);
}
PRT_ATTENTION_CLONES void scores(int nh, const float* const* q, const float* kt, int64_t dim, int64_t kept,
                                 float scale, float* const* sc) {
    scores_heads<float>(nh, q, kt, dim, kept, scale, sc);
}
PRT_ATTENTION_CLONES void weighted_sum(int nh, const float* const* p, const float* V, int64_t ld, int64_t dim,
                                       int64_t kept, float* const* acc) {
    weighted_sum_heads<float>(nh, p, V, ld, dim, kept, acc);
}
PRT_ATTENTION_CLONES void direct_scores(int nh, const float* const* q, const float* K, int64_t ld, int64_t dim,
                                        int64_t kept, float scale, float* const* sc) {
    if (nh == 4) direct_scores_body<4, float>(q, K, ld, dim, kept, scale, sc);
    else direct_scores_body<1, float>(q, K, ld, dim, kept, scale, sc);
}
void scores(int nh, const double* const* q, const double* kt, int64_t dim, int64_t kept, double scale,
            double* const* sc) {
    scores_heads<double>(nh, q, kt, dim, kept, scale, sc);
}
void weighted_sum(int nh, const double* const* p, const double* V, int64_t ld, int64_t dim, int64_t kept,
                  double* const* acc) {
    weighted_sum_heads<double>(nh, p, V, ld, dim, kept, acc);
}

/* x[i] = exp(x[i] - max) / sum over i < n; the max and the sum in 16 interleaved partial results (vectorised, a fixed
   order). */
constexpr int kLanes = 16;

template <typename C>
inline C lane_max(const C* __restrict x, int64_t n) {       /* n >= 1 */
    C acc[kLanes];
    for (int l = 0; l < kLanes; l++) acc[l] = x[0];
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
    for (int l = 0; i < n; i++, l++) acc[l] = x[i] > acc[l] ? x[i] : acc[l];
    C m = acc[0];
    for (int l = 1; l < kLanes; l++) m = acc[l] > m ? acc[l] : m;
    return m;
}

template <typename C>
inline C lane_sum(const C* __restrict x, int64_t n) {
    C acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; l++) acc[l] += x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += x[i];
    for (int w = kLanes / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

inline void exp_rows(float* x, int64_t n) { prt_vm_apply(PRT_VM_EXP, x, nullptr, x, n); }
inline void exp_rows(double* x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = std::exp(x[i]);
}

/* x[i] = exp(x[i] - max) for i < n, returning 1 / their sum: the caller scales the weighted sum of the values by it
   (dim products instead of n). */
template <typename C>
inline C softmax_row(C* __restrict x, int64_t n) {
    const C m = lane_max(x, n);
    for (int64_t i = 0; i < n; i++) x[i] -= m;
    exp_rows(x, n);
    return (C)1 / lane_sum(x, n);
}

/* Queries per unit of work of a prefill: a unit is (kv head, block of queries), all the group's query heads. */
constexpr int64_t kQueryBlock = 16;

/* The operands of one attention call as (batch, ...) views: the unbatched op is batch 1 (lead 0); batch_attention
   has a leading batch axis (lead 1). pos[b]: the cache position of sequence b's first query; window: keys kept per
   query (0: all). */
struct AttnCall {
    const paddle_rt_tensor *q, *kc, *vc, *out;
    int lead;
    int64_t batch, nq, seq, dim, nkv, window;
    const int64_t* pos;
};

/* The first cached key query position qp (0-based) keeps: every key up to qp, or the last `window` of them. */
inline int64_t first_key(int64_t qp, int64_t window) { return window > 0 && qp + 1 > window ? qp + 1 - window : 0; }

template <typename C>
C_Status attend(const paddle_rt_op_call* c, const AttnCall& a) {
    const paddle_rt_tensor &out = *a.out, &q = *a.q, &kc = *a.kc, &vc = *a.vc;
    const int L = a.lead;
    const int64_t seq = a.seq, dim = a.dim, nkv = a.nkv, group = a.nq / a.nkv, window = a.window;
    const int es = esize(out.dtype);
    int64_t max_total = 0;
    for (int64_t b = 0; b < a.batch; b++) max_total = std::max(max_total, a.pos[b] + seq);
    /* float32 caches with contiguous rows are read where they are; the rest is widened per unit into scratch */
    const bool f32 = std::is_same<C, float>::value;
    const bool direct_kv = f32 && kc.dtype == FLOAT32 && kc.strides[L + 2] == 1 && vc.strides[L + 2] == 1;
    const bool direct_q = f32 && q.dtype == FLOAT32 && q.strides[L + 2] == 1;
    const C scale = (C)1 / std::sqrt((C)dim);
    const int64_t blocks = (seq + kQueryBlock - 1) / kQueryBlock;
    std::atomic<int> failed{0};
    const int64_t key_blocks = (max_total + kKeys - 1) / kKeys;
    (void)c;
    prt::parallel_for(a.batch * nkv * blocks, 1, [&](int64_t u0, int64_t u1) {
        const int64_t D = dim;
        /* this thread's rows: the transposed keys, the values when widened, the scores, a query, a key, the output */
        const size_t kt_elems = direct_kv && seq == 1 ? 0 : (size_t)(key_blocks * kKeys * D),
                     v_elems = direct_kv ? 0 : (size_t)(max_total * D);
        C* scratch = static_cast<C*>(prt_parallel_scratch(
            (kt_elems + v_elems + (size_t)(4 * key_blocks * kKeys + 9 * D)) * sizeof(C)));
        if (!scratch) {
            failed.store(1);
            return;
        }
        C* kt = scratch;
        C* Vw = kt + kt_elems;
        C* sc = Vw + v_elems;                          /* 4 rows of scores, 4 query rows, a key row, 4 output rows */
        C* qr = sc + 4 * key_blocks * kKeys;
        C* kr = qr + 4 * D;
        C* acc = kr + D;
        int64_t nh = 4;
        int64_t cur_g = -1, have = 0;     /* the (sequence, kv head) whose first `have` keys are in kt (and Vw) */
        for (int64_t u = u0; u < u1; u++) {
            const int64_t bg = u / blocks, b = bg / nkv, g = bg % nkv;
            const int64_t i0 = (u % blocks) * kQueryBlock, i1 = std::min(seq, i0 + kQueryBlock);
            const int64_t P = a.pos[b];
            const int64_t need = i1 + P;                   /* the cached positions this block reads */
            const int64_t qb = L ? b * q.strides[0] : 0, ob = L ? b * out.strides[0] : 0;
            const char* kbase =
                static_cast<const char*>(kc.data) + ((L ? b * kc.strides[0] : 0) + g * kc.strides[L]) * es;
            const char* vbase =
                static_cast<const char*>(vc.data) + ((L ? b * vc.strides[0] : 0) + g * vc.strides[L]) * es;
            const int64_t padded = (need + kKeys - 1) / kKeys * kKeys;
            /* one query (a decode step; a prefill's last block of one): scores from the key rows where they are */
            const bool rows = direct_kv && i1 - i0 == 1;
            if (rows) cur_g = -1;                          /* kt is not filled for this unit */
            else if (bg != cur_g) {                        /* a chunk's units ascend: (g, block 0), (g, block 1), ... */
                cur_g = bg;
                have = 0;
            }
            for (int64_t j = rows ? need : have; j < need; j++) {   /* keys earlier blocks of this kv head lacked */
                const char* p = kbase + j * kc.strides[L + 1] * es;
                if (direct_kv && j % kKeys == 0 && j + kKeys <= need) {
                    transpose_key_block<C>(reinterpret_cast<const C*>(p), kc.strides[L + 1], D, kt + j * D);
                    j += kKeys - 1;
                } else if (direct_kv) {
                    transpose_keys<C>(reinterpret_cast<const C*>(p), j, D, kt);
                } else {
                    read_row<C>(p, kc.dtype, kc.strides[L + 2], D, kr);
                    transpose_keys<C>(kr, j, D, kt);
                }
            }
            if (!rows && padded > need) {                   /* zeros after the last key: runs of each dim's row */
                C* blk = kt + (need / kKeys) * D * kKeys;
                const int64_t r = need % kKeys;
                for (int64_t e = 0; e < D; e++)
                    for (int64_t l = r; l < kKeys; l++) blk[e * kKeys + l] = 0;
            }
            const C* V = reinterpret_cast<const C*>(vbase);
            int64_t ldv = vc.strides[L + 1];
            if (!direct_kv) {
                for (int64_t j = have; j < need; j++)
                    read_row<C>(vbase + j * vc.strides[L + 1] * es, vc.dtype, vc.strides[L + 2], D, Vw + j * D);
                V = Vw;
                ldv = D;
            }
            if (!rows) have = need;
            for (int64_t i = i0; i < i1; i++) {
                const int64_t kept = i + P + 1, first = first_key(i + P, window);
                for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += nh) {
                    nh = (g + 1) * group - h0 >= 4 ? 4 : 1;
                    const C* qs[4];
                    C* scs[4];
                    C* accs[4];
                    for (int t = 0; t < nh; t++) {
                        const char* qp = static_cast<const char*>(q.data) +
                                         (qb + (h0 + t) * q.strides[L] + i * q.strides[L + 1]) * es;
                        qs[t] = reinterpret_cast<const C*>(qp);
                        if (!direct_q) {
                            read_row<C>(qp, q.dtype, q.strides[L + 2], D, qr + t * D);
                            qs[t] = qr + t * D;
                        }
                        scs[t] = sc + t * key_blocks * kKeys;
                        accs[t] = acc + t * D;
                    }
                    if (rows)
                        direct_scores((int)nh, reinterpret_cast<const float* const*>(qs),
                                      reinterpret_cast<const float*>(kbase), kc.strides[L + 1], D, kept, (float)scale,
                                      reinterpret_cast<float* const*>(scs));
                    else
                        scores((int)nh, qs, kt, D, kept, scale, scs);
                    /* keys before the window: weight exactly 0 (exp(-inf)), so the sums are those of the window */
                    for (int t = 0; t < nh; t++)
                        for (int64_t j = 0; j < first; j++) scs[t][j] = -INFINITY;
                    C inv[4];
                    for (int t = 0; t < nh; t++) inv[t] = softmax_row(scs[t], kept);
                    for (int t = 0; t < nh; t++)
                        for (int64_t j = 0; j < first; j++) scs[t][j] = 0;
                    weighted_sum((int)nh, const_cast<const C* const*>(scs), V, ldv, D, kept, accs);
                    for (int t = 0; t < nh; t++) {
                        for (int64_t e = 0; e < D; e++) accs[t][e] *= inv[t];
                        char* o = static_cast<char*>(out.data) +
                                  (ob + i * out.strides[L] + (h0 + t) * out.strides[L + 1]) * es;
                        write_row<C>(o, out.dtype, out.strides[L + 2], D, accs[t]);
                    }
                }
            }
        }
    });
    return failed.load() ? C_ERROR : C_SUCCESS;
}

template <typename C>
C_Status attention(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &q = c->inputs[0], &k = c->inputs[1], &v = c->inputs[2], &kc = c->inputs[3],
                           &vc = c->inputs[4];
    const int64_t pos = (int64_t)c->attrs[0], seq = q.shape[1], dim = q.shape[2], nkv = k.shape[0];
    const int es = esize(c->out.dtype);
    for (int64_t g = 0; g < nkv; g++) {
        copy_slab(kc, static_cast<char*>(kc.data) + g * kc.strides[0] * es, pos, k,
                  static_cast<const char*>(k.data) + g * k.strides[0] * es, 1, seq, dim);
        copy_slab(vc, static_cast<char*>(vc.data) + g * vc.strides[0] * es, pos, v,
                  static_cast<const char*>(v.data) + g * v.strides[0] * es, 1, seq, dim);
    }
    const AttnCall a{&q, &kc, &vc, &c->out, 0, 1, q.shape[0], seq, dim, nkv, (int64_t)c->attrs[1], &pos};
    return attend<C>(c, a);
}

/* batch_attention: q (batch, q_heads, seq, d); k_cache, v_cache (batch, kv_heads, max_seq, d), already holding the
   new keys and values; pos (batch,) int32/int64; out (batch, seq, q_heads, d). Every position is checked first
   (0 <= pos, pos + seq <= max_seq); a bad one leaves (b, pos) as the failure detail and nothing is written. */
template <typename C>
C_Status batch_attention(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &q = c->inputs[0], &kc = c->inputs[1], &vc = c->inputs[2], &pt = c->inputs[3];
    const int64_t batch = q.shape[0], seq = q.shape[2], max_seq = kc.shape[2];
    std::vector<int64_t> owned;
    try {
        owned.resize((size_t)batch);
    } catch (...) {
        return C_ERROR;
    }
    for (int64_t b = 0; b < batch; b++) {
        const int64_t p = get_index(pt.data, pt.dtype, b * pt.strides[0]);
        if (p < 0 || p > max_seq - seq) {
            set_detail(c, b, p);
            return C_ERROR;
        }
        owned[(size_t)b] = p;
    }
    const AttnCall a{&q, &kc, &vc, &c->out, 1, batch, q.shape[1], seq, q.shape[3], kc.shape[1],
                     (int64_t)c->attrs[0], owned.data()};
    return attend<C>(c, a);
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

C_Status prt_batch_attention_kernel(const paddle_rt_op_call* c) {
    const paddle_rt_tensor& q = c->inputs[0];
    if (q.shape[0] == 0 || q.shape[1] == 0 || q.shape[2] == 0 || q.shape[3] == 0) return C_SUCCESS;
    return c->dtype == FLOAT64 ? batch_attention<double>(c) : batch_attention<float>(c);
}

size_t prt_batch_attention_workspace(const paddle_rt_op_call*) { return kDetailBytes; }
