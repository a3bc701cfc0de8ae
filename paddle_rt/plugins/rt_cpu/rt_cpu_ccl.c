/*
 * rt_cpu collectives: the xccl_* hooks across rt_cpu's devices inside one process.
 *
 * Model (like NCCL with one thread or one stream per rank):
 *   - xccl_get_unique_id writes a process-local id (magic, serial, pid). Every rank calls xccl_comm_init_rank with
 *     that id, nranks and its rank, from any thread; the communicator's device is the caller's current device.
 *     comm_init_rank does not block (ranks may be initialised one after another from a single thread, as
 *     InfiniCCL's comm_init_all does); the ranks meet when they run collectives.
 *   - Every collective is validated at the call, then enqueued on the given stream as one operation, in order with
 *     the stream's other work (NULL stream: it runs in the calling thread). When it runs it "arrives" at a
 *     rendezvous slot of its clique (matched by a per-communicator sequence number: ranks must issue the same
 *     collectives in the same order); the last rank to arrive computes the whole result into temporary buffers and
 *     writes every rank's output while the others wait on a condition variable (no spinning), so in-place calls
 *     (send == recv) are safe. A large all_reduce or reduce (>= RT_CCL_PAR_MIN_BYTES per rank, outputs not
 *     partially overlapping the inputs) is instead cut into slices of whole chunks that every arrived rank's thread
 *     claims and computes (reduce of the slice from all sends, written to every output: a reduce-scatter and an
 *     all-gather in one pass), and no rank returns before every slice is written.
 *   - send/recv are matched per (sender, receiver, n-th message between them). Between xccl_group_start and
 *     xccl_group_end, a thread's calls are deferred and each stream's share is enqueued as one operation at
 *     group_end that first arrives at all its slots and then waits for all of them, so a send and a recv between
 *     the same ranks (or an all_to_all) cannot deadlock. Operations inside one group must not depend on each other.
 *   - A rank that waits longer than RT_CPU_CCL_TIMEOUT_MS (default 30000) for its peers gives up: the call returns
 *     C_ERROR (NULL stream) or, when it ran on a stream, the communicator records the error, reports it on stderr,
 *     and every later xccl call on it returns C_ERROR. Mismatched arguments between ranks (count, type, op, root,
 *     send/recv sizes) are reported the same way and leave the outputs untouched.
 *   - fork(): a child forgets the parent's communicators (they return C_ERROR there); it makes its own.
 *   - Reductions SUM/AVG/MAX/MIN/PRODUCT over every integer and floating C_DataType (FLOAT16 and BFLOAT16 are
 *     computed in float); BOOL, complex and UNDEFINED are refused with C_ERROR (BOOL is accepted by the data
 *     movement collectives: broadcast, all_gather, send/recv, all_to_all). Integer SUM/PRODUCT wrap around; integer
 *     AVG divides the sum by nranks, truncating.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "paddle_rt/paddle_rt_ccl_ext.h"
#include "rt_cpu_internal.h"

#define RT_CCL_ID_SIZE 32
#define RT_COMM_MAGIC 0x434f4d4du

static const uint64_t k_id_magic = (uint64_t)0x52544350554343ULL; /* "RTCPUCC" */

typedef struct {
  uint64_t magic;
  uint64_t serial;
  uint64_t pid;
  uint64_t reserved;
} rt_ccl_id;

/* ------------------------------------------------------------------------------------------------------------ */
/* Element types.                                                                                                 */

static size_t dtype_size(C_DataType t) {
  switch (t) {
    case BOOL: case UINT8: case INT8: return 1;
    case UINT16: case INT16: case FLOAT16: case BFLOAT16: return 2;
    case UINT32: case INT32: case FLOAT32: return 4;
    case UINT64: case INT64: case FLOAT64: return 8;
    default: return 0; /* UNDEFINED, complex: refused */
  }
}

static int dtype_reducible(C_DataType t) { return t != BOOL && dtype_size(t) != 0; }

/* The bits of a float and back (memcpy: no aliasing rule broken). */
static uint32_t bits_of_float(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

static float float_of_bits(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return float_of_bits(bits);
}

static uint16_t float_to_half(float f) {
  uint32_t x = bits_of_float(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0); /* inf / nan */
  if (absx >= 0x477ff000u) return sign | 0x7c00;                                   /* overflow -> inf */
  if (absx < 0x38800000u) {                                                        /* subnormal or zero */
    if (absx < 0x33000000u) return sign;
    uint32_t e = absx >> 23;                     /* 102..112 */
    uint32_t m = (absx & 0x7fffff) | 0x800000;   /* value = m * 2^(e - 150) = (m >> (126 - e)) * 2^-24 */
    uint32_t shift = 126 - e;                    /* 14..24 */
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    uint16_t r = (uint16_t)(m >> shift);
    if (rem > half || (rem == half && (r & 1))) r++;
    return sign | r;
  }
  uint32_t e = (absx >> 23) - 127 + 15;
  uint32_t m = absx & 0x7fffff;
  uint16_t r = (uint16_t)((e << 10) | (m >> 13));
  uint32_t rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return sign | r;
}

static float bf16_to_float(uint16_t h) { return float_of_bits((uint32_t)h << 16); }

static uint16_t float_to_bf16(float f) {
  uint32_t x = bits_of_float(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
  uint32_t lsb = (x >> 16) & 1;
  x += 0x7fff + lsb;
  return (uint16_t)(x >> 16);
}

/* dst[i] = op over k of srcs[k][i], i < count; n = number of sources. Sources are combined in rank order; the op
 * switch is outside the element loops so that they vectorise. dst may alias no source. */
#define REDUCE_NATIVE(T, ACC_ADD, ACC_MUL)                                                \
  do {                                                                                    \
    T* d = (T*)dst;                                                                       \
    memcpy(d, srcs[0], count * sizeof(T));                                                \
    for (size_t k = 1; k < n; k++) {                                                      \
      const T* v = (const T*)srcs[k];                                                     \
      switch (op) {                                                                       \
        case SUM: case AVG: for (size_t i = 0; i < count; i++) d[i] = ACC_ADD(d[i], v[i]); break; \
        case PRODUCT: for (size_t i = 0; i < count; i++) d[i] = ACC_MUL(d[i], v[i]); break;       \
        case MAX: for (size_t i = 0; i < count; i++) d[i] = MAX_OF(d[i], v[i]); break;            \
        case MIN: for (size_t i = 0; i < count; i++) d[i] = MIN_OF(d[i], v[i]); break;            \
      }                                                                                   \
    }                                                                                     \
    if (op == AVG)                                                                        \
      for (size_t i = 0; i < count; i++) d[i] = (T)(d[i] / (T)n);                         \
  } while (0)

/* integers wrap around (through the unsigned type, no undefined overflow); floats propagate NaN in MAX/MIN */
#define MAX_OF(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))
#define MIN_OF(a, b) ((b) < (a) || (b) != (b) ? (b) : (a))
#define PLAIN_ADD(a, b) ((a) + (b))
#define PLAIN_MUL(a, b) ((a) * (b))
#define WRAP_ADD_8(a, b) ((int8_t)(uint8_t)((uint8_t)(a) + (uint8_t)(b)))
#define WRAP_MUL_8(a, b) ((int8_t)(uint8_t)((unsigned)(uint8_t)(a) * (unsigned)(uint8_t)(b)))
#define WRAP_ADD_16(a, b) ((int16_t)(uint16_t)((uint16_t)(a) + (uint16_t)(b)))
#define WRAP_MUL_16(a, b) ((int16_t)(uint16_t)((unsigned)(uint16_t)(a) * (unsigned)(uint16_t)(b)))
#define WRAP_ADD_32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define WRAP_MUL_32(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define WRAP_ADD_64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define WRAP_MUL_64(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))
#define UADD_8(a, b) ((uint8_t)((a) + (b)))
#define UMUL_8(a, b) ((uint8_t)((unsigned)(a) * (unsigned)(b)))
#define UADD_16(a, b) ((uint16_t)((a) + (b)))
#define UMUL_16(a, b) ((uint16_t)((unsigned)(a) * (unsigned)(b)))

/* float16 / bfloat16: accumulate in float, convert once at the end */
static int reduce_half(void* dst, const void* const* srcs, size_t n, size_t count, int bf16, C_CCLReduceOp op) {
  float* acc = malloc((count ? count : 1) * sizeof(float));
  if (!acc) return -1;
  const uint16_t* s0 = srcs[0];
  for (size_t i = 0; i < count; i++) acc[i] = bf16 ? bf16_to_float(s0[i]) : half_to_float(s0[i]);
  for (size_t k = 1; k < n; k++) {
    const uint16_t* sk = srcs[k];
    for (size_t i = 0; i < count; i++) {
      float v = bf16 ? bf16_to_float(sk[i]) : half_to_float(sk[i]);
      switch (op) {
        case SUM: case AVG: acc[i] += v; break;
        case PRODUCT: acc[i] *= v; break;
        case MAX: acc[i] = MAX_OF(acc[i], v); break;
        case MIN: acc[i] = MIN_OF(acc[i], v); break;
      }
    }
  }
  uint16_t* d = dst;
  for (size_t i = 0; i < count; i++) {
    float v = op == AVG ? acc[i] / (float)n : acc[i];
    d[i] = bf16 ? float_to_bf16(v) : float_to_half(v);
  }
  free(acc);
  return 0;
}

static int reduce(void* dst, const void* const* srcs, size_t n, size_t count, C_DataType t, C_CCLReduceOp op) {
  switch (t) {
    case UINT8: REDUCE_NATIVE(uint8_t, UADD_8, UMUL_8); break;
    case INT8: REDUCE_NATIVE(int8_t, WRAP_ADD_8, WRAP_MUL_8); break;
    case UINT16: REDUCE_NATIVE(uint16_t, UADD_16, UMUL_16); break;
    case INT16: REDUCE_NATIVE(int16_t, WRAP_ADD_16, WRAP_MUL_16); break;
    case UINT32: REDUCE_NATIVE(uint32_t, PLAIN_ADD, PLAIN_MUL); break;
    case INT32: REDUCE_NATIVE(int32_t, WRAP_ADD_32, WRAP_MUL_32); break;
    case UINT64: REDUCE_NATIVE(uint64_t, PLAIN_ADD, PLAIN_MUL); break;
    case INT64: REDUCE_NATIVE(int64_t, WRAP_ADD_64, WRAP_MUL_64); break;
    case FLOAT32: REDUCE_NATIVE(float, PLAIN_ADD, PLAIN_MUL); break;
    case FLOAT64: REDUCE_NATIVE(double, PLAIN_ADD, PLAIN_MUL); break;
    case FLOAT16: return reduce_half(dst, srcs, n, count, 0, op);
    case BFLOAT16: return reduce_half(dst, srcs, n, count, 1, op);
    default: return -1;
  }
  return 0;
}

int rt_ccl_reduce(void* dst, const void* const* srcs, size_t n, size_t count, C_DataType t, C_CCLReduceOp op) {
  return reduce(dst, srcs, n, count, t, op);
}

void rt_ccl_scale_half(void* p, size_t count, int bf16, float factor) {
  uint16_t* d = p;
  for (size_t i = 0; i < count; i++) {
    float v = (bf16 ? bf16_to_float(d[i]) : half_to_float(d[i])) * factor;
    d[i] = bf16 ? float_to_bf16(v) : float_to_half(v);
  }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Cliques, communicators, rendezvous slots.                                                                      */

typedef struct {
  int kind;
  const void* send;
  void* recv;
  size_t count;
  C_DataType dtype;
  C_CCLReduceOp op;
  size_t root;
} part_args;

typedef struct rt_slot {
  struct rt_slot* next;
  int p2p;
  uint64_t seq;       /* collectives: sequence number; p2p: n-th message from src to dst */
  size_t src, dst;    /* p2p only */
  size_t expect;      /* participants */
  size_t arrived, departed;
  int done, failed, abandoned;
  part_args** args;   /* [nranks] for collectives, [2] (send, recv) for p2p */
  /* A large all_reduce/reduce is computed by the participants together once all have arrived: its element range is
   * cut into par_slices slices of par_unit elements that they claim one at a time (q->mu held) and compute outside
   * the lock; the last one to finish a slice marks the slot done. */
  int par;
  size_t par_unit, par_slices, par_next, par_finished;
} rt_slot;

typedef struct rt_clique {
  struct rt_clique* next;
  uint64_t serial;
  size_t nranks;
  size_t joined;    /* ranks that called comm_init_rank */
  size_t refs;      /* communicators alive */
  unsigned char* taken;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  rt_slot* slots;
  void* scratch;     /* reused by slot_execute (q->mu held): no page faults on every large collective */
  size_t scratch_size;
} rt_clique;

typedef struct rt_comm {
  uint32_t magic;
  rt_clique* clique;      /* in-process ranks (NULL for a communicator across MPI processes) */
  rt_mpi_comm* mpi;       /* ranks in different processes: MPI is the transport (rt_cpu_mpi.c) */
  uint64_t serial;        /* of the unique id */
  PaddleRtCclError why;   /* the first failure (written under mu before error is set) */
  size_t rank, nranks;
  int device;
  atomic_int refs;
  atomic_int error;       /* sticky: an asynchronous collective failed */
  atomic_int aborted;     /* paddle_rt_ext_ccl_comm_abort: waits give up at once */
  pthread_mutex_t mu;     /* guards the counters below */
  uint64_t coll_seq;
  uint64_t* send_seq;     /* [nranks] */
  uint64_t* recv_seq;     /* [nranks] */
} rt_comm;

static pthread_mutex_t g_ccl_mu = PTHREAD_MUTEX_INITIALIZER; /* cliques list, comms registry, id serials */
/* The transport across processes (rt_cpu_mpi.c registers it from its constructor, before any hook runs); c->mpi is
 * set only when it is there. */
static const rt_ccl_transport* g_transport;

void rt_ccl_register_mpi_transport(const rt_ccl_transport* t) { g_transport = t; }
static rt_clique* g_cliques;
static ptrmap g_comms;
static uint64_t g_next_serial = 1;

static void clique_unref_locked(rt_clique* c) {
  /* g_ccl_mu held */
  if (--c->refs) return;
  for (rt_clique** pp = &g_cliques; *pp; pp = &(*pp)->next) {
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  }
  while (c->slots) { /* none should be left: every participant departs before its communicator dies */
    rt_slot* s = c->slots;
    c->slots = s->next;
    free(s->args);
    free(s);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c->scratch);
  free(c->taken);
  free(c);
}

static rt_comm* comm_get(C_CCLComm h) { return ptrmap_ref(&g_ccl_mu, &g_comms, h, offsetof(rt_comm, refs)); }

static void comm_put(rt_comm* c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  if (c->clique) {
    pthread_mutex_lock(&g_ccl_mu);
    rt_clique* q = c->clique;
    q->taken[c->rank] = 0;
    clique_unref_locked(q);
    pthread_mutex_unlock(&g_ccl_mu);
  }
  if (c->mpi) g_transport->comm_free(c->mpi);
  pthread_mutex_destroy(&c->mu);
  free(c->send_seq);
  free(c->recv_seq);
  c->magic = 0;
  free(c);
}

static rt_slot* slot_find_or_create(rt_clique* q, int p2p, uint64_t seq, size_t src, size_t dst) {
  /* q->mu held */
  for (rt_slot* s = q->slots; s; s = s->next)
    if (s->p2p == p2p && s->seq == seq && (!p2p || (s->src == src && s->dst == dst)) && !s->abandoned) return s;
  rt_slot* s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  size_t n = p2p ? 2 : q->nranks;
  s->args = calloc(n, sizeof(part_args*));
  if (!s->args) {
    free(s);
    return NULL;
  }
  s->p2p = p2p;
  s->seq = seq;
  s->src = src;
  s->dst = dst;
  s->expect = n;
  s->next = q->slots;
  q->slots = s;
  return s;
}

static void slot_depart(rt_clique* q, rt_slot* s) {
  /* q->mu held */
  s->departed++;
  if (s->departed < s->arrived || (!s->done && !s->abandoned)) return;
  for (rt_slot** pp = &q->slots; *pp; pp = &(*pp)->next) {
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  }
  free(s->args);
  free(s);
}

/* The clique's scratch buffer of at least `bytes` (q->mu held), NULL when out of memory. */
static void* scratch(rt_clique* q, size_t bytes) {
  if (bytes > q->scratch_size) {
    free(q->scratch);
    q->scratch = malloc(bytes);
    q->scratch_size = q->scratch ? bytes : 0;
  }
  return q->scratch;
}

/* Large reductions go through a chunk of this size (fits in L2 with the sources' chunks). */
#define RT_CCL_CHUNK_BYTES ((size_t)64 * 1024)

/* Copy a reduced chunk (in cache) to an output that is not read again soon: non-temporal stores on x86-64 skip
 * the read-for-ownership of the destination lines, which halves the memory traffic of large reductions. The
 * caller issues the store fence (nt_fence) before the outputs are published. */
#if defined(__SSE2__)
#include <emmintrin.h>
static void nt_copy(void* dst, const void* src, size_t n) {
  char* d = dst;
  const char* s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_stream_si128((__m128i*)(d + i), a);
    _mm_stream_si128((__m128i*)(d + i + 16), b);
    _mm_stream_si128((__m128i*)(d + i + 32), c);
    _mm_stream_si128((__m128i*)(d + i + 48), e);
  }
  memcpy(d + body, s + body, n - body);
}
static void nt_fence(void) { _mm_sfence(); }
#else
static void nt_copy(void* dst, const void* src, size_t n) { memcpy(dst, src, n); }
static void nt_fence(void) {}
#endif

/* 1 when an output buffer overlaps a send buffer other than exactly (same start: in place), in which case a
 * chunked reduction could read data it already overwrote. root < 0: every rank's recv is an output. */
static int partial_overlap(rt_slot* s, size_t n, size_t bytes, long root) {
  for (size_t r = 0; r < n; r++) {
    if (root >= 0 && (long)r != root) continue;
    const char* o = s->args[r]->recv;
    for (size_t k = 0; k < n; k++) {
      const char* i = s->args[k]->send;
      if (o == i) continue;
      if (o < i + bytes && i < o + bytes) return 1;
    }
  }
  return 0;
}

/* Reduce elements [begin, end) of an all_reduce/reduce chunk by chunk through tmp (chunk elements) and write each
 * chunk to the output(s) with non-temporal stores (fenced before returning): every byte is read from the sends and
 * written to the outputs once; exact in-place aliasing is safe chunk by chunk and disjoint ranges may run
 * concurrently. srcs has room for n pointers. Returns 0 or -1 (out of memory in a half-precision reduction). */
static int reduce_range(rt_slot* s, size_t n, size_t begin, size_t end, void* tmp, size_t chunk, const void** srcs) {
  part_args* a0 = s->args[0];
  size_t es = dtype_size(a0->dtype);
  int rc = 0;
  for (size_t off = begin; off < end && rc == 0; off += chunk) {
    size_t m = end - off < chunk ? end - off : chunk;
    for (size_t r = 0; r < n; r++) srcs[r] = (const char*)s->args[r]->send + off * es;
    if (reduce(tmp, srcs, n, m, a0->dtype, a0->op) != 0) {
      rc = -1;
      break;
    }
    if (a0->kind == K_ALL_REDUCE) {
      for (size_t r = 0; r < n; r++) nt_copy((char*)s->args[r]->recv + off * es, tmp, m * es);
    } else {
      nt_copy((char*)s->args[a0->root]->recv + off * es, tmp, m * es);
    }
  }
  nt_fence();
  return rc;
}

/* From this size on (bytes per rank) an all_reduce/reduce is shared out between the participants (slot->par); below
 * it, waking the sleeping ranks costs more than it saves. */
#define RT_CCL_PAR_MIN_BYTES ((size_t)256 * 1024)
/* Largest slice a participant claims at once: small enough to balance the work between threads that start late. */
#define RT_CCL_PAR_MAX_SLICE_BYTES ((size_t)1024 * 1024)

/* Compute slice i of a shared reduction (no lock held). work: a chunk buffer followed by room for n pointers, or
 * NULL when it could not be allocated (the slice then fails). Returns 0 or -1. */
static int par_slice(rt_slot* s, size_t n, size_t i, void* work) {
  if (!work) return -1;
  size_t es = dtype_size(s->args[0]->dtype), count = s->args[0]->count;
  size_t begin = i * s->par_unit, end = begin + s->par_unit < count ? begin + s->par_unit : count;
  return reduce_range(s, n, begin, end, work, RT_CCL_CHUNK_BYTES / es,
                      (const void**)((char*)work + RT_CCL_CHUNK_BYTES));
}

/* The last participant runs the operation for everyone (q->mu held), or, for a large all_reduce/reduce, sets the
 * slot up to be computed by all participants (s->par; the slot is not done yet). Returns 0, or -1 on mismatched
 * arguments. */
static int slot_execute(rt_clique* q, rt_slot* s) {
  if (s->p2p) {
    part_args* snd = s->args[0];
    part_args* rcv = s->args[1];
    size_t sb = snd->count * dtype_size(snd->dtype), rb = rcv->count * dtype_size(rcv->dtype);
    if (sb != rb) return -1;
    if (sb) memmove(rcv->recv, snd->send, sb);
    return 0;
  }
  size_t n = q->nranks;
  part_args* a0 = s->args[0];
  for (size_t r = 1; r < n; r++) {
    part_args* a = s->args[r];
    if (a->kind != a0->kind || a->count != a0->count || a->dtype != a0->dtype) return -1;
    if ((a0->kind == K_ALL_REDUCE || a0->kind == K_REDUCE || a0->kind == K_REDUCE_SCATTER) && a->op != a0->op)
      return -1;
    if ((a0->kind == K_BROADCAST || a0->kind == K_REDUCE) && a->root != a0->root) return -1;
  }
  size_t es = dtype_size(a0->dtype), count = a0->count, bytes = es * count;
  if (!count) return 0;
  const void** srcs = calloc(n, sizeof(void*));
  void* tmp = NULL;
  int rc = 0;
  if (!srcs) return -1;
  switch (a0->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE:
      if (bytes > RT_CCL_CHUNK_BYTES && !partial_overlap(s, n, bytes, a0->kind == K_ALL_REDUCE ? -1 : (long)a0->root)) {
        if (n > 1 && bytes >= RT_CCL_PAR_MIN_BYTES) {
          /* slices of whole chunks, about four per rank, at most RT_CCL_PAR_MAX_SLICE_BYTES */
          size_t chunk = RT_CCL_CHUNK_BYTES / es;
          size_t chunks = (count + chunk - 1) / chunk;
          size_t per = (chunks + 4 * n - 1) / (4 * n);
          size_t max_per = RT_CCL_PAR_MAX_SLICE_BYTES / RT_CCL_CHUNK_BYTES;
          if (per > max_per) per = max_per;
          if (per < 1) per = 1;
          s->par_unit = per * chunk;
          s->par_slices = (count + s->par_unit - 1) / s->par_unit;
          s->par_next = s->par_finished = 0;
          s->par = 1;
          break;
        }
        /* reduce chunk by chunk into a cache-sized buffer and write each chunk out at once */
        size_t chunk = RT_CCL_CHUNK_BYTES / es;
        tmp = scratch(q, chunk * es);
        if (!tmp) { rc = -1; break; }
        rc = reduce_range(s, n, 0, count, tmp, chunk, srcs);
        break;
      }
      tmp = scratch(q, bytes);
      if (!tmp) { rc = -1; break; }
      for (size_t r = 0; r < n; r++) srcs[r] = s->args[r]->send;
      if (reduce(tmp, srcs, n, count, a0->dtype, a0->op) != 0) {
        rc = -1;
        break;
      }
      if (a0->kind == K_ALL_REDUCE) {
        for (size_t r = 0; r < n; r++) memmove(s->args[r]->recv, tmp, bytes);
      } else {
        memmove(s->args[a0->root]->recv, tmp, bytes);
      }
      break;
    case K_BROADCAST:
      tmp = scratch(q, bytes);
      if (!tmp) { rc = -1; break; }
      memcpy(tmp, s->args[a0->root]->send, bytes);
      for (size_t r = 0; r < n; r++)
        if (r != a0->root) memmove(s->args[r]->recv, tmp, bytes);
      break;
    case K_ALL_GATHER:
      tmp = scratch(q, bytes * n);
      if (!tmp) { rc = -1; break; }
      for (size_t r = 0; r < n; r++) memcpy((char*)tmp + r * bytes, s->args[r]->send, bytes);
      for (size_t r = 0; r < n; r++) memmove(s->args[r]->recv, tmp, bytes * n);
      break;
    case K_REDUCE_SCATTER:
      tmp = scratch(q, bytes * n);
      if (!tmp) { rc = -1; break; }
      for (size_t seg = 0; seg < n; seg++) {
        for (size_t r = 0; r < n; r++) srcs[r] = (const char*)s->args[r]->send + seg * bytes;
        if (reduce((char*)tmp + seg * bytes, srcs, n, count, a0->dtype, a0->op) != 0) rc = -1;
      }
      if (rc == 0)
        for (size_t r = 0; r < n; r++) memmove(s->args[r]->recv, (char*)tmp + r * bytes, bytes);
      break;
    default:
      rc = -1;
  }
  free(srcs);
  return rc;
}

/* One participation of a rank in a slot. */
typedef struct {
  rt_clique* q;
  rt_slot* slot;
  part_args args;
  int p2p;
  uint64_t seq;
  size_t src, dst;
  int side;    /* collectives: rank; p2p: 0 = send, 1 = recv */
  size_t item; /* index of the item it belongs to */
  rt_comm* comm;
  int failed;
} rt_part;

/* Fill a part (calloc'ed: the rest stays zero) of item x of a batch on clique q. */
static void set_part(rt_part* p, rt_clique* q, size_t x, int p2p, part_args args, uint64_t seq, size_t src,
                     size_t dst, int side) {
  p->q = q;
  p->item = x;
  p->p2p = p2p;
  p->args = args;
  p->seq = seq;
  p->src = src;
  p->dst = dst;
  p->side = side;
}

/* Arrive at every part's slot (clique by clique, each under its own lock), then wait, bounded by one deadline, until
 * all are done, then depart. Nothing is waited for before everything is posted, so a batch that spans several
 * communicators or pairs send and recv cannot deadlock against another rank's batch. */
static void run_parts(rt_part* parts, size_t np) {
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  uint64_t ms = rt_cfg.ccl_timeout_ms;
  deadline.tv_sec += (time_t)(ms / 1000);
  deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  for (size_t i = 0; i < np; i++) {
    rt_part* p = &parts[i];
    rt_clique* q = p->q;
    pthread_mutex_lock(&q->mu);
    rt_slot* s = slot_find_or_create(q, p->p2p, p->seq, p->src, p->dst);
    if (!s || s->args[p->side]) { /* out of memory, or the same rank twice in one slot (a usage error) */
      p->slot = NULL;
      p->failed = 1;
    } else {
      p->slot = s;
      s->args[p->side] = &p->args;
      s->arrived++;
      if (s->arrived == s->expect) {
        if (slot_execute(q, s) != 0) s->failed = 1;
        if (!s->par) s->done = 1; /* else the participants compute it in their wait below */
        pthread_cond_broadcast(&q->cv);
      }
    }
    pthread_mutex_unlock(&q->mu);
  }
  void* work = NULL; /* chunk buffer for the slices of shared reductions this thread computes */
  for (size_t i = 0; i < np; i++) {
    rt_part* p = &parts[i];
    rt_slot* s = p->slot;
    if (!s) continue;
    rt_clique* q = p->q;
    pthread_mutex_lock(&q->mu);
    while (!s->done && !s->abandoned) {
      if (s->par) {
        /* everyone has arrived: help compute it, then sleep until the slices others took are finished (no
         * timeout: they are pure computation) */
        if (s->par_next < s->par_slices) {
          size_t slice = s->par_next++;
          size_t n = q->nranks;
          pthread_mutex_unlock(&q->mu);
          if (!work) work = malloc(RT_CCL_CHUNK_BYTES + n * sizeof(void*));
          int rc = par_slice(s, n, slice, work);
          pthread_mutex_lock(&q->mu);
          if (rc != 0) s->failed = 1;
          if (++s->par_finished == s->par_slices) {
            s->done = 1;
            pthread_cond_broadcast(&q->cv);
          }
        } else {
          pthread_cond_wait(&q->cv, &q->mu);
        }
        continue;
      }
      if (atomic_load(&p->comm->aborted)) { /* this rank gave up: so does the collective */
        s->abandoned = 1;
        pthread_cond_broadcast(&q->cv);
        continue;
      }
      int w = pthread_cond_timedwait(&q->cv, &q->mu, &deadline);
      if (w == ETIMEDOUT && !s->done && !s->par) {
        s->abandoned = 1;
        pthread_cond_broadcast(&q->cv);
      }
    }
    if (s->failed || s->abandoned) p->failed = 1;
    pthread_mutex_unlock(&q->mu);
  }
  free(work);
  for (size_t i = 0; i < np; i++) {
    rt_part* p = &parts[i];
    if (!p->slot) continue;
    pthread_mutex_lock(&p->q->mu);
    p->slot->args[p->side] = NULL;
    slot_depart(p->q, p->slot);
    pthread_mutex_unlock(&p->q->mu);
    p->slot = NULL;
  }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Work items (one call) and batches (what one stream operation runs).                                            */

typedef struct {
  rt_comm* comm; /* referenced */
  int kind;
  part_args a;
  uint64_t seq;       /* collectives */
  size_t peer;        /* send: dest, recv: src */
  /* all_to_all: per-peer buffers (copied at the call) */
  const void** a2a_send;
  size_t* a2a_send_count;
  C_DataType* a2a_send_dtype;
  void** a2a_recv;
  size_t* a2a_recv_count;
  C_DataType* a2a_recv_dtype;
  uint64_t* a2a_send_seq;
  uint64_t* a2a_recv_seq;
} rt_item;

typedef struct {
  rt_item* items;
  size_t n;
  C_Status status; /* result when run synchronously */
} rt_batch;

static void item_release(rt_item* it) {
  free(it->a2a_send);
  free(it->a2a_send_count);
  free(it->a2a_send_dtype);
  free(it->a2a_recv);
  free(it->a2a_recv_count);
  free(it->a2a_recv_dtype);
  free(it->a2a_send_seq);
  free(it->a2a_recv_seq);
  if (it->comm) comm_put(it->comm);
}

static void batch_free(void* arg) {
  rt_batch* b = arg;
  for (size_t i = 0; i < b->n; i++) item_release(&b->items[i]);
  free(b->items);
  free(b);
}

static const char* kind_name(int k) {
  static const char* names[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                "send", "recv", "all_to_all"};
  return (k >= 0 && k <= K_ALL_TO_ALL) ? names[k] : "?";
}

static void comm_record_failure(rt_comm* c, const char* text, const size_t* missing, size_t n_missing) {
  pthread_mutex_lock(&c->mu);
  if (!c->why.text[0]) {
    snprintf(c->why.text, sizeof(c->why.text), "%s", text);
    c->why.n_missing = n_missing;
    for (size_t i = 0; i < n_missing && i < sizeof(c->why.missing) / sizeof(c->why.missing[0]); i++)
      c->why.missing[i] = missing[i];
  }
  pthread_mutex_unlock(&c->mu);
}

static void item_failed(rt_item* it) {
  char t[200];
  snprintf(t, sizeof(t), "%s: peers did not join within %llu ms, or the ranks' arguments differ",
           kind_name(it->kind), (unsigned long long)rt_cfg.ccl_timeout_ms);
  comm_record_failure(it->comm, t, NULL, 0); /* keeps a reason recorded before */
  if (!atomic_exchange(&it->comm->error, 1)) {
    pthread_mutex_lock(&it->comm->mu);
    fprintf(stderr, "rt_cpu: xccl %s on rank %zu of %zu failed (%s); the communicator is now in error\n",
            kind_name(it->kind), it->comm->rank, it->comm->nranks, it->comm->why.text);
    pthread_mutex_unlock(&it->comm->mu);
  }
}

/* An all_to_all item's half towards rank p: what it sends to p (K_SEND) or receives from p (K_RECV). */
static part_args a2a_half(const rt_item* it, size_t p, int kind) {
  if (kind == K_SEND)
    return (part_args){.kind = K_SEND, .send = it->a2a_send[p], .count = it->a2a_send_count[p],
                       .dtype = it->a2a_send_dtype[p]};
  return (part_args){.kind = K_RECV, .recv = it->a2a_recv[p], .count = it->a2a_recv_count[p],
                     .dtype = it->a2a_recv_dtype[p]};
}

/* A participation in the MPI transport's form: the arguments, the root or peer, the sequence number. */
static rt_mpi_op mpi_op_of(part_args a, size_t peer, uint64_t seq) {
  return (rt_mpi_op){.kind = a.kind, .send = a.send, .recv = a.recv, .count = a.count, .dtype = a.dtype,
                     .op = a.op, .peer = peer, .seq = seq};
}

/* A batch of a communicator across processes: its items as MPI operations (all_to_all as send/recv pairs). */
static void batch_run_mpi(rt_batch* b) {
  rt_comm* c = b->items[0].comm;
  size_t nops = 0;
  for (size_t i = 0; i < b->n; i++) nops += b->items[i].kind == K_ALL_TO_ALL ? 2 * c->nranks : 1;
  rt_mpi_op* ops = calloc(nops ? nops : 1, sizeof(rt_mpi_op));
  rt_mpi_failure* f = calloc(1, sizeof(*f));
  const char* refuse = !ops || !f ? "out of host memory" : NULL;
  size_t k = 0;
  for (size_t x = 0; x < b->n && !refuse; x++) {
    rt_item* it = &b->items[x];
    if (it->comm != c) {
      refuse = "a group mixes a communicator across processes with other communicators on one stream";
      break;
    }
    if (it->kind != K_ALL_TO_ALL) {
      ops[k++] = mpi_op_of(it->a, it->kind == K_SEND || it->kind == K_RECV ? it->peer : it->a.root, it->seq);
      continue;
    }
    size_t me = c->rank;
    size_t sb = it->a2a_send_count[me] * dtype_size(it->a2a_send_dtype[me]);
    size_t rb = it->a2a_recv_count[me] * dtype_size(it->a2a_recv_dtype[me]);
    if (sb != rb) {
      refuse = "all_to_all: this rank's own send and recv blocks differ in size";
      break;
    }
    if (sb) memmove(it->a2a_recv[me], it->a2a_send[me], sb);
    for (size_t p = 0; p < c->nranks; p++) {
      if (p == me) continue;
      ops[k++] = mpi_op_of(a2a_half(it, p, K_SEND), p, it->a2a_send_seq[p]);
      ops[k++] = mpi_op_of(a2a_half(it, p, K_RECV), p, it->a2a_recv_seq[p]);
    }
  }
  int failed = 1;
  if (refuse) comm_record_failure(c, refuse, NULL, 0);
  else if (g_transport->run(c->mpi, ops, k, f) == 0) failed = 0;
  else comm_record_failure(c, f->text, f->missing, f->n_missing);
  if (failed) {
    b->status = C_ERROR;
    for (size_t x = 0; x < b->n; x++) item_failed(&b->items[x]);
  }
  free(ops);
  free(f);
}

/* Expand the batch's items into participations, run them all together, report failures per item. */
static void batch_run(void* arg) {
  rt_batch* b = arg;
  b->status = C_SUCCESS;
  if (b->n && b->items[0].comm->mpi) {
    batch_run_mpi(b);
    return;
  }
  for (size_t i = 0; i < b->n; i++)
    if (b->items[i].comm->mpi) { /* an in-process communicator grouped with one across processes */
      b->status = C_ERROR;
      for (size_t x = 0; x < b->n; x++) {
        comm_record_failure(b->items[x].comm, "a group mixes a communicator across processes with other "
                            "communicators on one stream", NULL, 0);
        item_failed(&b->items[x]);
      }
      return;
    }
  size_t np = 0;
  for (size_t i = 0; i < b->n; i++) np += b->items[i].kind == K_ALL_TO_ALL ? 2 * b->items[i].comm->nranks : 1;
  rt_part* parts = calloc(np ? np : 1, sizeof(rt_part));
  unsigned char* bad = calloc(b->n ? b->n : 1, 1);
  if (!parts || !bad) {
    free(parts);
    free(bad);
    b->status = C_FAILED;
    for (size_t i = 0; i < b->n; i++) item_failed(&b->items[i]);
    return;
  }
  size_t k = 0;
  for (size_t x = 0; x < b->n; x++) {
    rt_item* it = &b->items[x];
    rt_clique* q = it->comm->clique;
    size_t me = it->comm->rank;
    if (it->kind == K_SEND || it->kind == K_RECV) {
      int recv = it->kind == K_RECV;
      set_part(&parts[k++], q, x, 1, it->a, it->seq, recv ? it->peer : me, recv ? me : it->peer, recv);
    } else if (it->kind == K_ALL_TO_ALL) {
      for (size_t peer = 0; peer < it->comm->nranks; peer++) {
        if (peer == me) { /* the local block */
          size_t sb = it->a2a_send_count[me] * dtype_size(it->a2a_send_dtype[me]);
          size_t rb = it->a2a_recv_count[me] * dtype_size(it->a2a_recv_dtype[me]);
          if (sb != rb) bad[x] = 1;
          else if (sb) memmove(it->a2a_recv[me], it->a2a_send[me], sb);
          continue;
        }
        set_part(&parts[k++], q, x, 1, a2a_half(it, peer, K_SEND), it->a2a_send_seq[peer], me, peer, 0);
        set_part(&parts[k++], q, x, 1, a2a_half(it, peer, K_RECV), it->a2a_recv_seq[peer], peer, me, 1);
      }
    } else {
      set_part(&parts[k++], q, x, 0, it->a, it->seq, 0, 0, (int)me);
    }
  }
  for (size_t i = 0; i < k; i++) parts[i].comm = b->items[parts[i].item].comm;
  run_parts(parts, k);
  for (size_t i = 0; i < k; i++)
    if (parts[i].failed) bad[parts[i].item] = 1;
  for (size_t x = 0; x < b->n; x++) {
    if (!bad[x]) continue;
    b->status = C_ERROR;
    item_failed(&b->items[x]);
  }
  free(parts);
  free(bad);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Groups (per thread).                                                                                           */

typedef struct {
  C_Stream stream; /* as given (validated at the call) */
  rt_item item;
} rt_deferred;

/* A thread's open group. Kept behind a pthread key rather than __thread: LeakSanitizer (gcc 12, glibc 2.36)
 * crashes scanning the dynamic TLS of dlopened libraries with several thread-locals. Freed at the outermost
 * group_end (or at thread exit, releasing whatever was deferred). */
typedef struct {
  int depth;
  rt_deferred* items;
  size_t n, cap;
} rt_group_state;

static pthread_key_t g_group_key;
static pthread_once_t g_group_once = PTHREAD_ONCE_INIT;


static void group_state_free(void* p) {
  rt_group_state* g = p;
  if (!g) return;
  for (size_t i = 0; i < g->n; i++) item_release(&g->items[i].item);
  free(g->items);
  free(g);
}

static void group_key_init(void) { pthread_key_create(&g_group_key, group_state_free); }

static rt_group_state* group_state(int create) {
  pthread_once(&g_group_once, group_key_init);
  rt_group_state* g = pthread_getspecific(g_group_key);
  if (!g && create) {
    g = calloc(1, sizeof(*g));
    if (g && pthread_setspecific(g_group_key, g) != 0) {
      free(g);
      g = NULL;
    }
  }
  return g;
}

/* Runs or enqueues a batch for `stream`. Takes ownership of b. */
static C_Status submit_batch(C_Stream stream, rt_batch* b) {
  if (!stream) {
    batch_run(b);
    C_Status st = b->status;
    batch_free(b);
    return st;
  }
  rt_stream* s = rt_stream_get(stream);
  if (!s) {
    batch_free(b);
    return C_ERROR;
  }
  C_Status st = rt_stream_enqueue_fn(s, batch_run, batch_free, b);
  rt_stream_put(s);
  if (st == C_FAILED) batch_free(b); /* not enqueued (out of memory) */
  return st;
}

/* Takes ownership of *it (its comm reference). */
static C_Status submit_item(C_Stream stream, rt_item* it) {
  rt_group_state* gs = group_state(0);
  if (gs && gs->depth > 0) {
    if (gs->n == gs->cap) {
      size_t ncap = gs->cap ? 2 * gs->cap : 16;
      rt_deferred* g = realloc(gs->items, ncap * sizeof(*g));
      if (!g) {
        item_release(it);
        return C_FAILED;
      }
      gs->items = g;
      gs->cap = ncap;
    }
    gs->items[gs->n].stream = stream;
    gs->items[gs->n].item = *it;
    gs->n++;
    return C_SUCCESS;
  }
  rt_batch* b = calloc(1, sizeof(*b));
  rt_item* items = calloc(1, sizeof(*items));
  if (!b || !items) {
    free(b);
    free(items);
    item_release(it);
    return C_FAILED;
  }
  items[0] = *it;
  b->items = items;
  b->n = 1;
  return submit_batch(stream, b);
}

static C_Status h_group_start(void) {
  rt_group_state* gs = group_state(1);
  if (!gs) return C_FAILED;
  gs->depth++;
  return C_SUCCESS;
}

static C_Status h_group_end(void) {
  rt_group_state* gs = group_state(0);
  if (!gs || gs->depth <= 0) return C_ERROR;
  if (--gs->depth > 0) return C_SUCCESS;
  rt_deferred* g = gs->items;
  size_t n = gs->n;
  pthread_setspecific(g_group_key, NULL);
  free(gs);
  C_Status result = C_SUCCESS;
  /* one batch per stream, items in call order; NULL-stream work runs last, in this thread, after every stream's
   * share has been enqueued (so that this thread's synchronous ranks can meet the asynchronous ones) */
  unsigned char* used = calloc(n ? n : 1, 1);
  if (!used) {
    for (size_t i = 0; i < n; i++) item_release(&g[i].item);
    free(g);
    return C_FAILED;
  }
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      if (used[i] || (pass == 0) != (g[i].stream != NULL)) continue;
      size_t m = 0;
      for (size_t j = i; j < n; j++) m += !used[j] && g[j].stream == g[i].stream;
      rt_batch* b = calloc(1, sizeof(*b));
      rt_item* items = calloc(m, sizeof(*items));
      if (!b || !items) {
        free(b);
        free(items);
        result = C_FAILED;
        for (size_t j = i; j < n; j++)
          if (!used[j] && g[j].stream == g[i].stream) {
            item_release(&g[j].item);
            used[j] = 1;
          }
        continue;
      }
      C_Stream st = g[i].stream;
      size_t k = 0;
      for (size_t j = i; j < n; j++)
        if (!used[j] && g[j].stream == st) {
          items[k++] = g[j].item;
          used[j] = 1;
        }
      b->items = items;
      b->n = k;
      C_Status r = submit_batch(st, b);
      if (r != C_SUCCESS && result == C_SUCCESS) result = r;
    }
  }
  free(used);
  free(g);
  return result;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Hooks.                                                                                                         */

static C_Status h_get_unique_id_size(size_t* size) {
  if (!size) return C_ERROR;
  *size = RT_CCL_ID_SIZE;
  return C_SUCCESS;
}

static C_Status h_get_unique_id(C_CCLRootId* id) {
  if (!id || !id->data || id->sz < sizeof(rt_ccl_id)) return C_ERROR;
  rt_ccl_id v;
  memset(&v, 0, sizeof(v));
  v.magic = k_id_magic;
  pthread_mutex_lock(&g_ccl_mu);
  v.serial = g_next_serial++;
  pthread_mutex_unlock(&g_ccl_mu);
  v.pid = (uint64_t)getpid();
  memset(id->data, 0, id->sz);
  memcpy(id->data, &v, sizeof(v));
  return C_SUCCESS;
}

/* The root id a rank joins with, checked against its rank and size (C_ERROR when any is off). */
static C_Status read_root_id(const C_CCLRootId* id, size_t nranks, size_t rank, const C_CCLComm* out, rt_ccl_id* v) {
  if (!out || !id || !id->data || id->sz < sizeof(rt_ccl_id)) return C_ERROR;
  if (!rt_is_initialized()) return C_ERROR;
  if (nranks == 0 || nranks > 4096 || rank >= nranks) return C_ERROR;
  memcpy(v, id->data, sizeof(*v));
  if (v->magic != k_id_magic || v->serial == 0) return C_ERROR;
  return C_SUCCESS;
}

/* A zeroed communicator with its per-peer message counters (NULL when out of memory). */
static rt_comm* comm_alloc(size_t nranks) {
  rt_comm* c = calloc(1, sizeof(*c));
  uint64_t* ss = calloc(nranks, sizeof(uint64_t));
  uint64_t* rs = calloc(nranks, sizeof(uint64_t));
  if (!c || !ss || !rs) {
    free(c);
    free(ss);
    free(rs);
    return NULL;
  }
  c->send_seq = ss;
  c->recv_seq = rs;
  return c;
}

/* Frees a communicator of comm_alloc that was never published. */
static void comm_free_unpublished(rt_comm* c) {
  free(c->send_seq);
  free(c->recv_seq);
  free(c);
}

/* The fields every new communicator starts with, on the current device. */
static void comm_setup(rt_comm* c, uint64_t serial, size_t rank, size_t nranks) {
  c->magic = RT_COMM_MAGIC;
  c->serial = serial;
  c->rank = rank;
  c->nranks = nranks;
  c->device = rt_current_device();
  atomic_init(&c->refs, 1);
  atomic_init(&c->error, 0);
  atomic_init(&c->aborted, 0);
  pthread_mutex_init(&c->mu, NULL);
}

static C_Status h_comm_init_rank(size_t nranks, C_CCLRootId* id, size_t rank, C_CCLComm* out) {
  rt_ccl_id v;
  if (read_root_id(id, nranks, rank, out, &v) != C_SUCCESS || v.pid != (uint64_t)getpid()) return C_ERROR;
  rt_comm* c = comm_alloc(nranks);
  if (!c) return C_FAILED;
  pthread_mutex_lock(&g_ccl_mu);
  rt_clique* q = g_cliques;
  while (q && q->serial != v.serial) q = q->next;
  if (q && (q->nranks != nranks || q->taken[rank])) {
    pthread_mutex_unlock(&g_ccl_mu);
    comm_free_unpublished(c);
    return C_ERROR;
  }
  if (!q) {
    q = calloc(1, sizeof(*q));
    unsigned char* taken = calloc(nranks, 1);
    if (!q || !taken) {
      pthread_mutex_unlock(&g_ccl_mu);
      free(q);
      free(taken);
      comm_free_unpublished(c);
      return C_FAILED;
    }
    q->serial = v.serial;
    q->nranks = nranks;
    q->taken = taken;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    q->next = g_cliques;
    g_cliques = q;
  }
  q->taken[rank] = 1;
  q->joined++;
  q->refs++;
  comm_setup(c, v.serial, rank, nranks);
  c->clique = q;
  if (ptrmap_put(&g_comms, c, 0) != 0) {
    q->taken[rank] = 0;
    clique_unref_locked(q);
    pthread_mutex_unlock(&g_ccl_mu);
    pthread_mutex_destroy(&c->mu);
    comm_free_unpublished(c);
    return C_FAILED;
  }
  pthread_mutex_unlock(&g_ccl_mu);
  *out = (C_CCLComm)c;
  return C_SUCCESS;
}

static void release_comm(void* c) { comm_put(c); } /* queued collectives keep it alive until they have run */

static C_Status h_destroy_comm(C_CCLComm comm) { return ptrmap_unregister(&g_ccl_mu, &g_comms, comm, release_comm); }

static C_Status h_get_comm_name(C_CCLComm comm, char* name) {
  if (!name) return C_ERROR;
  rt_comm* c = comm_get(comm);
  if (!c) return C_ERROR;
  /* short: hosts hand in small buffers */
  snprintf(name, 32, "rt_cpu_ccl_%s%llu_%zu", c->mpi ? "mpi_" : "", (unsigned long long)c->serial, c->rank);
  comm_put(c);
  return C_SUCCESS;
}

/* Common validation: a live communicator without a recorded error, and a stream of its device (or NULL). */
static C_Status begin_call(C_CCLComm comm, C_Stream stream, rt_comm** out) {
  rt_comm* c = comm_get(comm);
  if (!c) return C_ERROR;
  if (atomic_load(&c->error)) {
    comm_put(c);
    return C_ERROR;
  }
  if (stream) {
    rt_stream* s = rt_stream_get(stream);
    if (!s) {
      comm_put(c);
      return C_ERROR;
    }
    int dev = rt_stream_device(s);
    rt_stream_put(s);
    if (dev != c->device) {
      comm_put(c);
      return C_ERROR;
    }
  }
  *out = c;
  return C_SUCCESS;
}

static C_Status collective(int kind, const void* send, void* recv, size_t count, C_DataType dtype, C_CCLReduceOp op,
                           size_t root, C_CCLComm comm, C_Stream stream) {
  int reducing = kind == K_ALL_REDUCE || kind == K_REDUCE || kind == K_REDUCE_SCATTER;
  if (reducing ? !dtype_reducible(dtype) : dtype_size(dtype) == 0) return C_ERROR;
  if (reducing && (op < SUM || op > PRODUCT)) return C_ERROR;
  rt_comm* c;
  if (begin_call(comm, stream, &c) != C_SUCCESS) return C_ERROR;
  if ((kind == K_BROADCAST || kind == K_REDUCE) && root >= c->nranks) goto bad;
  if (count) {
    int need_send = kind != K_BROADCAST || c->rank == root;
    int need_recv = kind != K_REDUCE || c->rank == root;
    if (kind == K_BROADCAST) need_recv = c->rank != root;
    if ((need_send && !send) || (need_recv && !recv)) goto bad;
  }
  rt_item it;
  memset(&it, 0, sizeof(it));
  it.comm = c;
  it.kind = kind;
  it.a.kind = kind;
  it.a.send = send;
  it.a.recv = recv;
  it.a.count = count;
  it.a.dtype = dtype;
  it.a.op = op;
  it.a.root = root;
  pthread_mutex_lock(&c->mu);
  it.seq = c->coll_seq++;
  pthread_mutex_unlock(&c->mu);
  return submit_item(stream, &it);
bad:
  comm_put(c);
  return C_ERROR;
}

static C_Status h_all_reduce(void* send, void* recv, size_t count, C_DataType dtype, C_CCLReduceOp op, C_CCLComm comm,
                             C_Stream stream) {
  return collective(K_ALL_REDUCE, send, recv, count, dtype, op, 0, comm, stream);
}

static C_Status h_broadcast(void* buf, size_t count, C_DataType dtype, size_t root, C_CCLComm comm, C_Stream stream) {
  return collective(K_BROADCAST, buf, buf, count, dtype, SUM, root, comm, stream);
}

static C_Status h_reduce(void* send, void* recv, size_t count, C_DataType dtype, C_CCLReduceOp op, size_t root,
                         C_CCLComm comm, C_Stream stream) {
  return collective(K_REDUCE, send, recv, count, dtype, op, root, comm, stream);
}

static C_Status h_all_gather(void* send, void* recv, size_t count, C_DataType dtype, C_CCLComm comm,
                             C_Stream stream) {
  return collective(K_ALL_GATHER, send, recv, count, dtype, SUM, 0, comm, stream);
}

static C_Status h_reduce_scatter(void* send, void* recv, size_t count, C_DataType dtype, C_CCLReduceOp op,
                                 C_CCLComm comm, C_Stream stream) {
  return collective(K_REDUCE_SCATTER, send, recv, count, dtype, op, 0, comm, stream);
}

static C_Status p2p(int kind, void* buf, size_t count, C_DataType dtype, size_t peer, C_CCLComm comm,
                    C_Stream stream) {
  if (dtype_size(dtype) == 0) return C_ERROR;
  rt_comm* c;
  if (begin_call(comm, stream, &c) != C_SUCCESS) return C_ERROR;
  if (peer >= c->nranks || (count && !buf)) {
    comm_put(c);
    return C_ERROR;
  }
  rt_item it;
  memset(&it, 0, sizeof(it));
  it.comm = c;
  it.kind = kind;
  it.a.kind = kind;
  it.a.send = kind == K_SEND ? buf : NULL;
  it.a.recv = kind == K_RECV ? buf : NULL;
  it.a.count = count;
  it.a.dtype = dtype;
  it.peer = peer;
  pthread_mutex_lock(&c->mu);
  it.seq = kind == K_SEND ? c->send_seq[peer]++ : c->recv_seq[peer]++;
  pthread_mutex_unlock(&c->mu);
  return submit_item(stream, &it);
}

static C_Status h_send(void* send, size_t count, C_DataType dtype, size_t dest, C_CCLComm comm, C_Stream stream) {
  return p2p(K_SEND, send, count, dtype, dest, comm, stream);
}

static C_Status h_recv(void* recv, size_t count, C_DataType dtype, size_t src, C_CCLComm comm, C_Stream stream) {
  return p2p(K_RECV, recv, count, dtype, src, comm, stream);
}

static C_Status h_all_to_all(const void** send, const size_t* send_count, const C_DataType* send_dtype, void** recv,
                             const size_t* recv_count, const C_DataType* recv_dtype, size_t rank, size_t nranks,
                             C_CCLComm comm, C_Stream stream) {
  if (!send || !send_count || !send_dtype || !recv || !recv_count || !recv_dtype) return C_ERROR;
  rt_comm* c;
  if (begin_call(comm, stream, &c) != C_SUCCESS) return C_ERROR;
  if (rank != c->rank || nranks != c->nranks) goto bad;
  for (size_t k = 0; k < nranks; k++) {
    if (dtype_size(send_dtype[k]) == 0 || dtype_size(recv_dtype[k]) == 0) goto bad;
    if ((send_count[k] && !send[k]) || (recv_count[k] && !recv[k])) goto bad;
  }
  rt_item it;
  memset(&it, 0, sizeof(it));
  it.comm = c;
  it.kind = K_ALL_TO_ALL;
  it.a.kind = K_ALL_TO_ALL;
  it.a2a_send = malloc(nranks * sizeof(void*));
  it.a2a_send_count = malloc(nranks * sizeof(size_t));
  it.a2a_send_dtype = malloc(nranks * sizeof(C_DataType));
  it.a2a_recv = malloc(nranks * sizeof(void*));
  it.a2a_recv_count = malloc(nranks * sizeof(size_t));
  it.a2a_recv_dtype = malloc(nranks * sizeof(C_DataType));
  it.a2a_send_seq = malloc(nranks * sizeof(uint64_t));
  it.a2a_recv_seq = malloc(nranks * sizeof(uint64_t));
  if (!it.a2a_send || !it.a2a_send_count || !it.a2a_send_dtype || !it.a2a_recv || !it.a2a_recv_count ||
      !it.a2a_recv_dtype || !it.a2a_send_seq || !it.a2a_recv_seq) {
    item_release(&it);
    return C_FAILED;
  }
  memcpy(it.a2a_send, send, nranks * sizeof(void*));
  memcpy(it.a2a_send_count, send_count, nranks * sizeof(size_t));
  memcpy(it.a2a_send_dtype, send_dtype, nranks * sizeof(C_DataType));
  memcpy(it.a2a_recv, recv, nranks * sizeof(void*));
  memcpy(it.a2a_recv_count, recv_count, nranks * sizeof(size_t));
  memcpy(it.a2a_recv_dtype, recv_dtype, nranks * sizeof(C_DataType));
  pthread_mutex_lock(&c->mu);
  for (size_t k = 0; k < nranks; k++) {
    if (k == rank) {
      it.a2a_send_seq[k] = it.a2a_recv_seq[k] = 0;
      continue;
    }
    it.a2a_send_seq[k] = c->send_seq[k]++;
    it.a2a_recv_seq[k] = c->recv_seq[k]++;
  }
  pthread_mutex_unlock(&c->mu);
  return submit_item(stream, &it);
bad:
  comm_put(c);
  return C_ERROR;
}

static void ccl_fill(C_DeviceInterface* f) {
  f->xccl_get_comm_name = h_get_comm_name;
  f->xccl_get_unique_id_size = h_get_unique_id_size;
  f->xccl_get_unique_id = h_get_unique_id;
  f->xccl_comm_init_rank = h_comm_init_rank;
  f->xccl_destroy_comm = h_destroy_comm;
  f->xccl_all_reduce = h_all_reduce;
  f->xccl_broadcast = h_broadcast;
  f->xccl_reduce = h_reduce;
  f->xccl_all_gather = h_all_gather;
  f->xccl_reduce_scatter = h_reduce_scatter;
  f->xccl_group_start = h_group_start;
  f->xccl_group_end = h_group_end;
  f->xccl_send = h_send;
  f->xccl_recv = h_recv;
  f->xccl_all_to_all = h_all_to_all;
}

static void ccl_teardown(void) { ptrmap_drain(&g_ccl_mu, &g_comms, release_comm); }

/* fork() (rt_layer.at_fork): the registry's lock is held across it; the child forgets the parent's communicators and
 * cliques (not freed: their ranks' threads and peers are the parent's), so its own start afresh. */
static void ccl_at_fork(int phase) {
  if (phase == RT_FORK_PREPARE) {
    pthread_mutex_lock(&g_ccl_mu);
  } else if (phase == RT_FORK_PARENT) {
    pthread_mutex_unlock(&g_ccl_mu);
  } else {
    pthread_mutex_init(&g_ccl_mu, NULL);
    ptrmap_free(&g_comms);
    g_cliques = NULL;
  }
}

static rt_layer g_ccl_layer = {"collectives", ccl_fill, ccl_teardown, ccl_at_fork, NULL};

__attribute__((constructor)) static void ccl_register(void) { rt_layer_register(&g_ccl_layer); }

/* paddle_rt's optional extensions (paddle_rt/extension.h, paddle_rt/paddle_rt_ccl_ext.h). */
RT_EXPORT int paddle_rt_ext_ccl_comm_failure(C_CCLComm comm, PaddleRtCclError* why) {
  rt_comm* c = comm_get(comm);
  if (!c) return -1;
  int e = atomic_load(&c->error);
  if (e && why) {
    pthread_mutex_lock(&c->mu);
    *why = c->why;
    pthread_mutex_unlock(&c->mu);
  }
  comm_put(c);
  return e;
}

/* Abort (paddle_rt_ccl_ext.h): the collectives this rank is waiting in give up at once, later ones fail. */
RT_EXPORT C_Status paddle_rt_ext_ccl_comm_abort(C_CCLComm comm) {
  rt_comm* c = comm_get(comm);
  if (!c) return C_ERROR;
  comm_record_failure(c, "the communicator was aborted", NULL, 0); /* keeps a reason recorded before */
  atomic_store(&c->aborted, 1);
  atomic_store(&c->error, 1);
  if (c->clique) { /* wake this rank's waits (run_parts checks the flag) */
    pthread_mutex_lock(&c->clique->mu);
    pthread_cond_broadcast(&c->clique->cv);
    pthread_mutex_unlock(&c->clique->mu);
  }
  if (c->mpi) g_transport->abort(c->mpi);
  comm_put(c);
  return C_SUCCESS;
}

/* Which peers have not reached the collective this rank runs (paddle_rt_ccl_ext.h): across processes only. */
RT_EXPORT int paddle_rt_ext_ccl_comm_find_missing(C_CCLComm comm, PaddleRtCclError* why) {
  rt_comm* c = comm_get(comm);
  if (!c) return -1;
  int r = -1;
  if (c->mpi && why) {
    rt_mpi_failure f;
    memset(&f, 0, sizeof(f));
    r = g_transport->find_missing(c->mpi, &f);
    if (r == 1) {
      memset(why, 0, sizeof(*why));
      snprintf(why->text, sizeof(why->text), "%s", f.text);
      why->n_missing = f.n_missing;
      for (size_t i = 0; i < f.n_missing && i < sizeof(why->missing) / sizeof(why->missing[0]); i++)
        why->missing[i] = f.missing[i];
    }
  }
  comm_put(c);
  return r;
}

/* 1 when an asynchronous collective on this communicator failed, 0 if not, -1 unknown. */
RT_EXPORT int paddle_rt_ext_ccl_comm_error(C_CCLComm comm) {
  return paddle_rt_ext_ccl_comm_failure(comm, NULL);
}

/* A communicator over the processes of an MPI communicator (MPI is the transport: rt_cpu_mpi.c). */
RT_EXPORT C_Status paddle_rt_ext_ccl_comm_init_rank_mpi(size_t nranks, C_CCLRootId* id, size_t rank, C_CCLComm* out,
                                                     int64_t mpi_comm) {
  rt_ccl_id v;
  if (read_root_id(id, nranks, rank, out, &v) != C_SUCCESS) return C_ERROR;
  rt_comm* c = comm_alloc(nranks);
  if (!c) return C_FAILED;
  char err[400] = "";
  if (!g_transport) {
    fprintf(stderr, "rt_cpu: paddle_rt_ext_ccl_comm_init_rank_mpi: this build has no MPI transport\n");
    comm_free_unpublished(c);
    return C_ERROR;
  }
  if (g_transport->comm_create(mpi_comm, nranks, rank, id->data, id->sz, &c->mpi, err, sizeof(err)) != 0) {
    fprintf(stderr, "rt_cpu: paddle_rt_ext_ccl_comm_init_rank_mpi (rank %zu of %zu): %s\n", rank, nranks, err);
    comm_free_unpublished(c);
    return C_ERROR;
  }
  comm_setup(c, v.serial, rank, nranks);
  pthread_mutex_lock(&g_ccl_mu);
  int put = ptrmap_put(&g_comms, c, 0);
  pthread_mutex_unlock(&g_ccl_mu);
  if (put != 0) {
    g_transport->comm_free(c->mpi);
    pthread_mutex_destroy(&c->mu);
    comm_free_unpublished(c);
    return C_FAILED;
  }
  *out = (C_CCLComm)c;
  return C_SUCCESS;
}
