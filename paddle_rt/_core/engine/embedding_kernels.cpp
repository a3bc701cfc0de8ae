/* embedding (InfiniCore's Embedding, torch's embedding): out[i..., :] = weight[ids[i...], :] for ids of any shape
 * (int32/int64), weight (vocab, dim), out (ids' shape..., dim). Every id is checked before a row is written; one
 * outside [0, vocab) leaves (its flat index, the id) as the failure detail and the call fails.
 * A vocabulary shard (attrs[0] != 0, Megatron's VocabParallelEmbedding): weight holds rows [start, start + vocab) of
 * a larger table, start = attrs[1]; an id in that range reads row id - start, any other id >= 0 gives a zero row
 * (the sum over the shards is the whole table's lookup); a negative id fails as above. */
#include <string.h>

#include "engine/host_float.h"
#include "engine/op_families.h"

using namespace prt_host;

namespace {

template <typename T>
void zero_strided(char* o, int64_t so, int64_t n) {
    T* q = reinterpret_cast<T*>(o);
    for (int64_t i = 0; i < n; i++) q[i * so] = 0;
}

template <typename T>
void copy_strided(char* o, int64_t so, const char* w, int64_t sw, int64_t n) {
    T* q = reinterpret_cast<T*>(o);
    const T* p = reinterpret_cast<const T*>(w);
    for (int64_t i = 0; i < n; i++) q[i * so] = p[i * sw];
}

}  // namespace

C_Status prt_embedding_kernel(const paddle_rt_op_call* c) {
    const paddle_rt_tensor &y = c->out, &ids = c->inputs[0], &w = c->inputs[1];
    const int nd = ids.ndim;
    const int64_t vocab = w.shape[0], dim = w.shape[1];
    const bool shard = c->attrs[0] != 0;
    const int64_t start = shard ? (int64_t)c->attrs[1] : 0;
    for (int d = 0; d < y.ndim; d++)
        if (y.shape[d] == 0) return C_SUCCESS;
    int64_t flat = 0;
    bool ok = true;
    for_each_index(ids.shape, nd, [&](const int64_t* idx) {
        if (!ok) return;
        const int64_t id = get_index(at(ids, idx, nd), ids.dtype, 0);
        if (id < 0 || (!shard && id >= vocab)) {
            set_detail(c, flat, id);
            ok = false;
        }
        flat++;
    });
    if (!ok) return C_ERROR;
    const int es = esize(w.dtype);
    const int64_t so = y.strides[nd], sw = w.strides[1];
    for_each_index(ids.shape, nd, [&](const int64_t* idx) {
        const int64_t id = get_index(at(ids, idx, nd), ids.dtype, 0) - start;
        char* o = at(y, idx, nd);
        if (id < 0 || id >= vocab) {            /* a shard's id held by another shard */
            if (so == 1) {
                memset(o, 0, (size_t)(dim * es));
                return;
            }
            switch (es) {
            case 2: zero_strided<uint16_t>(o, so, dim); break;
            case 4: zero_strided<uint32_t>(o, so, dim); break;
            default: zero_strided<uint64_t>(o, so, dim); break;
            }
            return;
        }
        const char* src = static_cast<const char*>(w.data) + id * w.strides[0] * es;
        if (so == 1 && sw == 1) {
            memmove(o, src, (size_t)(dim * es));
            return;
        }
        switch (es) {
        case 2: copy_strided<uint16_t>(o, so, src, sw, dim); break;
        case 4: copy_strided<uint32_t>(o, so, src, sw, dim); break;
        default: copy_strided<uint64_t>(o, so, src, sw, dim); break;
        }
    });
    return C_SUCCESS;
}

size_t prt_embedding_workspace(const paddle_rt_op_call*) { return kDetailBytes; }
