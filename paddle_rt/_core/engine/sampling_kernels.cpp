/* random_sample with InfiniCore's rule (test/infiniop/random_sample.py's reference): logits (vocab,) of a float dtype,
 * out a 0-d int32/int64 index. attrs: random value r in [0, 1), top-p, top-k (0: the whole vocabulary),
 * temperature T.
 *   Greedy (the first index of the largest logit) when top-p == 0, top-k == 1, T == 0 or the largest logit is
 *   infinite. Otherwise: indices ordered by logit, descending (ties: lower index first); probabilities
 *   p = softmax((l - max) / T) over the whole vocabulary; cum = their running sums in that order;
 *   threshold = min(cum[min(top-k, vocab) - 1], top-p) * r; the first index in that order with cum >= threshold.
 * NaN logits count as -inf. The workspace holds the probabilities (double) and the order (int64). */
#include <math.h>

#include <algorithm>
#include <numeric>

#include "engine/host_float.h"
#include "engine/op_families.h"

using namespace prt_host;

C_Status prt_random_sample_kernel(const paddle_rt_op_call* c) {
    const paddle_rt_tensor& lg = c->inputs[0];
    const int64_t v = lg.shape[0];
    const double rnd = c->attrs[0], topp = c->attrs[1], temp = c->attrs[3];
    const int64_t topk = (int64_t)c->attrs[2];
    double* p = static_cast<double*>(c->workspace);
    int64_t* idx = reinterpret_cast<int64_t*>(p + v);
    for (int64_t j = 0; j < v; j++) {
        const double x = get<double>(lg.data, lg.dtype, j * lg.strides[0]);
        p[j] = x != x ? -INFINITY : x;
    }
    int64_t best = 0;
    for (int64_t j = 1; j < v; j++)
        if (p[j] > p[best]) best = j;
    int64_t pick = best;
    if (topp > 0 && topk != 1 && temp > 0 && std::isfinite(p[best])) {
        const double mx = p[best];
        double total = 0;
        for (int64_t j = 0; j < v; j++) {
            p[j] = exp((p[j] - mx) / temp);
            total += p[j];
        }
        const int64_t k = topk > 0 && topk < v ? topk : v;
        std::iota(idx, idx + v, (int64_t)0);
        auto by_p = [p](int64_t x, int64_t y) { return p[x] > p[y] || (p[x] == p[y] && x < y); };
        if (k < v) std::partial_sort(idx, idx + k, idx + v, by_p);
        else std::sort(idx, idx + v, by_p);
        double cum_k = 0;
        for (int64_t r = 0; r < k; r++) cum_k += p[idx[r]] / total;
        const double threshold = std::min(cum_k, topp) * rnd;
        double cum = 0;
        pick = idx[k - 1];
        for (int64_t r = 0; r < k; r++) {
            cum += p[idx[r]] / total;
            if (cum >= threshold) { pick = idx[r]; break; }
        }
    }
    if (c->out.dtype == INT64) *static_cast<int64_t*>(c->out.data) = pick;
    else *static_cast<int32_t*>(c->out.data) = (int32_t)pick;
    return C_SUCCESS;
}

size_t prt_random_sample_workspace(const paddle_rt_op_call* c) {
    return (size_t)c->inputs[0].shape[0] * (sizeof(double) + sizeof(int64_t));
}
