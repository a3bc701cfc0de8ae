/*
 * rt_cpu collectives across processes: MPI as the transport of a communicator whose ranks are MPI processes.
 *
 * Finding MPI. rt_cpu is built without MPI headers and does not link libmpi: it must load where no MPI is
 * installed. The MPI library is looked up when such a communicator is created: $PADDLE_RT_MPI_LIBRARY (a path or
 * soname, dlopen'ed), else the MPI library already loaded in the process (mpi4py loaded it: libmpi.so.12,
 * libmpich.so.12 or libmpi.so, found with RTLD_NOLOAD). The functions are resolved with dlsym and called through
 * the MPICH ABI (MPI_Comm, MPI_Datatype, MPI_Op and MPI_Request are ints; the handle values of the predefined
 * objects below are that ABI's): MPICH >= 3.1, Intel MPI >= 5, MVAPICH2 and the `mpich` wheel of PyPI. Open MPI
 * (pointer handles) is refused with a clear message. MPI must be initialized with MPI_THREAD_MULTIPLE (mpi4py's
 * default): stream workers of several devices call MPI concurrently.
 *
 * Transport. A communicator keeps two duplicates of the user's MPI communicator (data and probes), with
 * MPI_ERRORS_RETURN so that no MPI error aborts the process. A batch (one call, or a stream's share of a group) runs
 * on the stream's worker: every collective first all-reduces a small header (kind, count, dtype, op, root, sequence
 * number; MAX of the values and of their negations, so one reduction gives min and max), and refuses the payload when
 * the ranks' headers differ. The payload moves with MPI's nonblocking collective on the device buffer itself (rt_cpu
 * device memory is host memory): MPI_Iallreduce, Ireduce, Ibcast, Iallgather, Ireduce_scatter_block; send/recv and
 * all_to_all are Isend/Irecv pairs, each with a header message (count, dtype) checked by the receiver. Every request
 * is completed by polling MPI_Test until the communicator's time limit (RT_CPU_CCL_TIMEOUT_MS). On a timeout or an
 * MPI error, the rank asks every peer (over the probe duplicate) how far it got; ranks that do not answer in a short
 * grace period, or answer with an earlier collective, are named as missing. Collectives of one communicator are
 * numbered when their hook is called and posted in that order; the caller must call the hooks in the order the
 * ranks agree on (paddle_rt does: a host-driven communicator's collectives reach the plugin in issue order, even
 * across streams).
 *
 * Reductions: MPI's SUM/PROD/MAX/MIN on the native types; AVG is SUM divided by nranks afterwards (integers:
 * truncating C division of the wrapped sum, as in-process); float16/bfloat16 use user-defined MPI ops that compute
 * in float (rounded at every combining step, unlike the in-process path which rounds once). MAX/MIN of NaN follow
 * the MPI library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_cpu_internal.h"

/* ---- the MPICH ABI, declared here (no MPI headers at build time) -------------------------------------------- */
typedef int mpi_comm_t;
typedef int mpi_type_t;
typedef int mpi_op_t;
typedef int mpi_req_t;
typedef struct {
  int count_lo, count_hi_and_cancelled, source, tag, error;
} mpi_status_t;
typedef void mpi_user_fn(void* in, void* inout, int* len, mpi_type_t* type);

#define M_SUCCESS 0
#define M_COMM_NULL 0x04000000
#define M_REQUEST_NULL 0x2c000000
#define M_BYTE 0x4c00010d
#define M_INT8 0x4c000137
#define M_INT16 0x4c000238
#define M_INT32 0x4c000439
#define M_INT64 0x4c00083a
#define M_UINT8 0x4c00013b
#define M_UINT16 0x4c00023c
#define M_UINT32 0x4c00043d
#define M_UINT64 0x4c00083e
#define M_FLOAT 0x4c00040a
#define M_DOUBLE 0x4c00080b
#define M_MAX 0x58000001
#define M_MIN 0x58000002
#define M_SUM 0x58000003
#define M_PROD 0x58000004
#define M_ERRORS_RETURN 0x54000001
#define M_IN_PLACE ((void*)-1)
#define M_STATUS_IGNORE ((mpi_status_t*)1)
#define M_THREAD_MULTIPLE 3

#define TAG_PROBE 1
#define TAG_REPLY 2
#define TAG_P2P_BASE 16 /* data: 16 + 2 * (seq mod 2^20), header: + 1 */

static struct {
  int (*Initialized)(int*);
  int (*Finalized)(int*);
  int (*Query_thread)(int*);
  int (*Get_library_version)(char*, int*);
  int (*Error_string)(int, char*, int*);
  int (*Comm_size)(mpi_comm_t, int*);
  int (*Comm_rank)(mpi_comm_t, int*);
  int (*Comm_idup)(mpi_comm_t, mpi_comm_t*, mpi_req_t*);
  int (*Comm_free)(mpi_comm_t*);
  int (*Comm_set_errhandler)(mpi_comm_t, int);
  int (*Test)(mpi_req_t*, int*, mpi_status_t*);
  int (*Cancel)(mpi_req_t*);
  int (*Request_free)(mpi_req_t*);
  int (*Get_count)(const mpi_status_t*, mpi_type_t, int*);
  int (*Op_create)(mpi_user_fn*, int, mpi_op_t*);
  int (*Type_contiguous)(int, mpi_type_t, mpi_type_t*);
  int (*Type_commit)(mpi_type_t*);
  int (*Iallreduce)(const void*, void*, int, mpi_type_t, mpi_op_t, mpi_comm_t, mpi_req_t*);
  int (*Ireduce)(const void*, void*, int, mpi_type_t, mpi_op_t, int, mpi_comm_t, mpi_req_t*);
  int (*Ibcast)(void*, int, mpi_type_t, int, mpi_comm_t, mpi_req_t*);
  int (*Iallgather)(const void*, int, mpi_type_t, void*, int, mpi_type_t, mpi_comm_t, mpi_req_t*);
  int (*Ireduce_scatter_block)(const void*, void*, int, mpi_type_t, mpi_op_t, mpi_comm_t, mpi_req_t*);
  int (*Isend)(const void*, int, mpi_type_t, int, int, mpi_comm_t, mpi_req_t*);
  int (*Irecv)(void*, int, mpi_type_t, int, int, mpi_comm_t, mpi_req_t*);
} mpi;

static pthread_once_t g_mpi_once = PTHREAD_ONCE_INIT;
static char g_mpi_error[400]; /* why MPI could not be loaded ("" once loaded) */
static int g_mpi_loaded;
static mpi_op_t g_half_ops[2][5]; /* [bf16][C_CCLReduceOp] user-defined ops */

/* The header every collective all-reduces first, as one element of a contiguous MPI type with a user-defined op: the
 * maximum of the header's values and of their negations (equal ranks: max == -max(-x)), and, for an all_reduce of at
 * most FUSED_PAYLOAD bytes, the payload itself reduced with rt_cpu's own reduction (one MPI call instead of two). */
#define HDR 6
#define FUSED_PAYLOAD 256
typedef struct {
  int64_t hdr[2 * HDR];
  int64_t payload_present; /* 1: every rank sent its payload (and the headers so far agree) */
  int64_t pad;
  unsigned char payload[FUSED_PAYLOAD];
} fused_t;
static mpi_type_t g_fused_type;
static mpi_op_t g_fused_op;

static size_t dtype_bytes(C_DataType t);

static void fused_combine(void* in, void* inout, int* len, mpi_type_t* type) {
  (void)type;
  for (int e = 0; e < *len; e++) {
    fused_t* a = (fused_t*)in + e;
    fused_t* b = (fused_t*)inout + e;
    int same = memcmp(a->hdr, b->hdr, sizeof(a->hdr)) == 0 && a->payload_present && b->payload_present;
    for (int k = 0; k < 2 * HDR; k++)
      if (a->hdr[k] > b->hdr[k]) b->hdr[k] = a->hdr[k];
    if (!same) {
      b->payload_present = 0;
      continue;
    }
    size_t count = (size_t)b->hdr[1];
    C_DataType t = (C_DataType)b->hdr[2];
    C_CCLReduceOp op = (C_CCLReduceOp)b->hdr[3];
    size_t es = dtype_bytes(t);
    if (!es || count * es > FUSED_PAYLOAD || op < SUM || op > PRODUCT) {
      b->payload_present = 0;
      continue;
    }
    unsigned char mine[FUSED_PAYLOAD];
    memcpy(mine, b->payload, count * es);
    const void* srcs[2] = {mine, a->payload};
    if (rt_ccl_reduce(b->payload, srcs, 2, count, t, op == AVG ? SUM : op) != 0) b->payload_present = 0;
  }
}

static void half_op(void* in, void* inout, int* len, mpi_type_t* type, int bf16, C_CCLReduceOp op) {
  (void)type;
  const void* srcs[2] = {in, inout};
  rt_ccl_reduce(inout, srcs, 2, (size_t)*len, bf16 ? BFLOAT16 : FLOAT16, op == AVG ? SUM : op);
}
#define HALF_OP(name, bf, op) \
  static void name(void* in, void* inout, int* len, mpi_type_t* t) { half_op(in, inout, len, t, bf, op); }
HALF_OP(f16_sum, 0, SUM)
HALF_OP(f16_max, 0, MAX)
HALF_OP(f16_min, 0, MIN)
HALF_OP(f16_prod, 0, PRODUCT)
HALF_OP(bf16_sum, 1, SUM)
HALF_OP(bf16_max, 1, MAX)
HALF_OP(bf16_min, 1, MIN)
HALF_OP(bf16_prod, 1, PRODUCT)

static void mpi_load(void) {
  const char* env = getenv("PADDLE_RT_MPI_LIBRARY");
  void* h = NULL;
  if (env && *env) {
    h = dlopen(env, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      snprintf(g_mpi_error, sizeof(g_mpi_error), "PADDLE_RT_MPI_LIBRARY=%s cannot be loaded: %s", env, dlerror());
      return;
    }
  } else {
    static const char* names[] = {"libmpi.so.12", "libmpich.so.12", "libmpi.so", "libmpich.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
      snprintf(g_mpi_error, sizeof(g_mpi_error),
               "no MPI library is loaded in this process (initialize MPI first, e.g. `from mpi4py import MPI`, or "
               "set PADDLE_RT_MPI_LIBRARY)");
      return;
    }
  }
#define SYM(name)                                                                                              \
  do {                                                                                                         \
    *(void**)(&mpi.name) = dlsym(h, "MPI_" #name);                                                             \
    if (!mpi.name) {                                                                                           \
      snprintf(g_mpi_error, sizeof(g_mpi_error), "the MPI library has no MPI_" #name);                        \
      return;                                                                                                  \
    }                                                                                                          \
  } while (0)
  SYM(Initialized); SYM(Finalized); SYM(Query_thread); SYM(Get_library_version); SYM(Error_string);
  SYM(Comm_size); SYM(Comm_rank); SYM(Comm_idup); SYM(Comm_free); SYM(Comm_set_errhandler); SYM(Test);
  SYM(Cancel); SYM(Request_free); SYM(Get_count); SYM(Op_create); SYM(Type_contiguous); SYM(Type_commit); SYM(Iallreduce); SYM(Ireduce); SYM(Ibcast);
  SYM(Iallgather); SYM(Ireduce_scatter_block); SYM(Isend); SYM(Irecv);
#undef SYM
  char ver[8192];
  int len = 0;
  if (mpi.Get_library_version(ver, &len) != M_SUCCESS) ver[0] = 0;
  ver[sizeof(ver) - 1] = 0;
  if (strstr(ver, "Open MPI")) {
    snprintf(g_mpi_error, sizeof(g_mpi_error),
             "the loaded MPI is Open MPI; rt_cpu speaks the MPICH ABI (MPICH, Intel MPI, MVAPICH)");
    return;
  }
  g_mpi_loaded = 1;
}

/* 0 when MPI is usable (loaded, initialized with MPI_THREAD_MULTIPLE, not finalized); else -1 with a reason. */
static int mpi_ready(char* err, size_t errsz) {
  pthread_once(&g_mpi_once, mpi_load);
  if (!g_mpi_loaded) {
    snprintf(err, errsz, "%s", g_mpi_error);
    return -1;
  }
  int flag = 0, fin = 0, level = 0;
  mpi.Initialized(&flag);
  mpi.Finalized(&fin);
  if (!flag || fin) {
    snprintf(err, errsz, "MPI is %s", fin ? "finalized" : "not initialized");
    return -1;
  }
  mpi.Query_thread(&level);
  if (level != M_THREAD_MULTIPLE) {
    snprintf(err, errsz, "MPI was initialized with thread level %d, not MPI_THREAD_MULTIPLE (3)", level);
    return -1;
  }
  static pthread_mutex_t ops_mu = PTHREAD_MUTEX_INITIALIZER;
  static int ops_made;
  pthread_mutex_lock(&ops_mu);
  if (!ops_made) {
    int okf = mpi.Type_contiguous((int)sizeof(fused_t), M_BYTE, &g_fused_type) == M_SUCCESS &&
              mpi.Type_commit(&g_fused_type) == M_SUCCESS && mpi.Op_create(fused_combine, 1, &g_fused_op) == M_SUCCESS;
    mpi_user_fn* fns[2][5] = {{f16_sum, f16_sum, f16_max, f16_min, f16_prod},
                              {bf16_sum, bf16_sum, bf16_max, bf16_min, bf16_prod}};
    int ok = 1;
    for (int b = 0; b < 2; b++)
      for (int o = 0; o < 5; o++) ok &= mpi.Op_create(fns[b][o], 1, &g_half_ops[b][o]) == M_SUCCESS;
    ops_made = ok && okf;
  }
  pthread_mutex_unlock(&ops_mu);
  if (!ops_made) {
    snprintf(err, errsz, "MPI_Op_create failed");
    return -1;
  }
  return 0;
}

static void mpi_errtext(int code, char* out, size_t n) {
  char s[512];
  int len = 0;
  if (mpi.Error_string(code, s, &len) != M_SUCCESS) snprintf(s, sizeof(s), "code %d", code);
  s[sizeof(s) - 1] = 0;
  size_t i = 0;
  for (; n && i + 1 < n && s[i]; i++) out[i] = s[i];
  if (n) out[i] = 0;
}

/* ---- communicators ------------------------------------------------------------------------------------------ */
struct rt_mpi_comm {
  mpi_comm_t data, probe;
  int rank, nranks;
  pthread_mutex_t order_mu; /* collectives are posted in sequence order */
  pthread_cond_t order_cv;
  uint64_t next_coll;
  pthread_mutex_t probe_mu; /* answering probes (one thread at a time) */
  mpi_req_t probe_req;
  uint64_t probe_in;
  atomic_ullong entered;    /* collectives this rank has entered (answers to probes) */
  uint64_t* reply_val;      /* [nranks] */
  mpi_req_t* reply_req;     /* [nranks] */
  int broken;               /* a request may still be pending: never free the MPI communicators */
  atomic_int aborted;       /* rt_mpi_abort: waits give up at once */
  pthread_mutex_t find_mu;  /* one find_missing at a time (the worker's failure, a Work.wait timeout) */
};

/* Answer the probes that arrived (non-blocking; skipped when another thread does it). */
static void serve_probes(rt_mpi_comm* m) {
  if (pthread_mutex_trylock(&m->probe_mu) != 0) return;
  for (;;) {
    int done = 0;
    mpi_status_t st;
    if (m->probe_req == M_REQUEST_NULL || mpi.Test(&m->probe_req, &done, &st) != M_SUCCESS || !done) break;
    int src = st.source;
    if (src >= 0 && src < m->nranks) {
      int rdone = 1;
      if (m->reply_req[src] != M_REQUEST_NULL) mpi.Test(&m->reply_req[src], &rdone, M_STATUS_IGNORE);
      if (rdone) {
        m->reply_val[src] = atomic_load(&m->entered);
        mpi.Isend(&m->reply_val[src], 8, M_BYTE, src, TAG_REPLY, m->probe, &m->reply_req[src]);
      }
    }
    if (mpi.Irecv(&m->probe_in, 8, M_BYTE, -2 /* ANY_SOURCE */, TAG_PROBE, m->probe, &m->probe_req) != M_SUCCESS)
      m->probe_req = M_REQUEST_NULL;
  }
  pthread_mutex_unlock(&m->probe_mu);
}

/* Wait for n requests until the deadline; polls MPI_Test (yielding the CPU between rounds) and answers probes.
 * Returns 0 (all done), 1 (timed out), -1 (aborted), or an MPI error code (> 1); `bad` = index of the failed
 * request. */
static int wait_all(rt_mpi_comm* m, mpi_req_t* reqs, mpi_status_t* sts, size_t n, uint64_t deadline_ns, size_t* bad) {
  unsigned spins = 0;
  for (;;) {
    int all = 1;
    for (size_t i = 0; i < n; i++) {
      if (reqs[i] == M_REQUEST_NULL) continue;
      int done = 0;
      int rc = mpi.Test(&reqs[i], &done, sts ? &sts[i] : M_STATUS_IGNORE);
      if (rc != M_SUCCESS) {
        *bad = i;
        return rc > 1 ? rc : 2;
      }
      if (!done) all = 0;
    }
    if (all) return 0;
    if ((++spins & 63) == 0) {
      if (m && atomic_load(&m->aborted)) return -1;
      if (m) serve_probes(m);
      if (rt_now_ns() >= deadline_ns) return 1;
      if ((spins & 1023) == 0) sched_yield(); /* MPI progresses only inside MPI_Test: yield rarely */
    }
  }
}

static int idup(mpi_comm_t comm, mpi_comm_t* out, uint64_t deadline, char* err, size_t errsz) {
  mpi_req_t r = M_REQUEST_NULL;
  *out = M_COMM_NULL;
  int rc = mpi.Comm_idup(comm, out, &r);
  size_t bad = 0;
  if (rc == M_SUCCESS) rc = wait_all(NULL, &r, NULL, 1, deadline, &bad);
  if (rc == 1) {
    snprintf(err, errsz, "duplicating the MPI communicator timed out: not every rank joined");
    return -1;
  }
  if (rc != M_SUCCESS) {
    char t[300];
    mpi_errtext(rc, t, sizeof(t));
    snprintf(err, errsz, "MPI_Comm_idup failed: %s", t);
    return -1;
  }
  mpi.Comm_set_errhandler(*out, M_ERRORS_RETURN);
  return 0;
}

static void rt_mpi_comm_free(rt_mpi_comm* m);

static int rt_mpi_comm_create(int64_t user_comm, size_t nranks, size_t rank, const void* id, size_t id_size,
                       rt_mpi_comm** out, char* err, size_t errsz) {
  if (mpi_ready(err, errsz) != 0) return -1;
  mpi_comm_t uc = (mpi_comm_t)user_comm;
  if ((int64_t)uc != user_comm || uc == M_COMM_NULL) {
    snprintf(err, errsz, "%lld is not an MPI_Comm handle of the MPICH ABI", (long long)user_comm);
    return -1;
  }
  int size = 0, me = -1;
  if (mpi.Comm_size(uc, &size) != M_SUCCESS || mpi.Comm_rank(uc, &me) != M_SUCCESS) {
    snprintf(err, errsz, "the MPI communicator handle %d is not valid", uc);
    return -1;
  }
  if ((size_t)size != nranks || (size_t)me != rank) {
    snprintf(err, errsz, "rank %zu of %zu does not match the MPI communicator (rank %d of %d)", rank, nranks, me,
             size);
    return -1;
  }
  uint64_t deadline = rt_now_ns() + rt_cfg.ccl_timeout_ms * 1000000ull;
  rt_mpi_comm* m = calloc(1, sizeof(*m));
  if (!m || !(m->reply_val = calloc(nranks, sizeof(uint64_t))) || !(m->reply_req = malloc(nranks * sizeof(mpi_req_t)))) {
    if (m) free(m->reply_val);
    free(m);
    snprintf(err, errsz, "out of host memory");
    return -1;
  }
  for (size_t i = 0; i < nranks; i++) m->reply_req[i] = M_REQUEST_NULL;
  m->rank = me;
  m->nranks = size;
  m->probe_req = M_REQUEST_NULL;
  pthread_mutex_init(&m->order_mu, NULL);
  pthread_cond_init(&m->order_cv, NULL);
  pthread_mutex_init(&m->probe_mu, NULL);
  pthread_mutex_init(&m->find_mu, NULL);
  atomic_init(&m->entered, 0);
  atomic_init(&m->aborted, 0);
  if (idup(uc, &m->data, deadline, err, errsz) != 0 || idup(uc, &m->probe, deadline, err, errsz) != 0) {
    m->broken = 1;
    rt_mpi_comm_free(m);
    return -1;
  }
  /* every rank must have been given the same unique id */
  int64_t h[2] = {0, 0};
  uint64_t fnv = 1469598103934665603ull;
  for (size_t i = 0; i < id_size; i++) fnv = (fnv ^ ((const unsigned char*)id)[i]) * 1099511628211ull;
  h[0] = (int64_t)(fnv >> 1);
  h[1] = -h[0];
  mpi_req_t r = M_REQUEST_NULL;
  size_t bad = 0;
  int rc = mpi.Iallreduce(M_IN_PLACE, h, 2, M_INT64, M_MAX, m->data, &r);
  if (rc == M_SUCCESS) rc = wait_all(NULL, &r, NULL, 1, deadline, &bad);
  if (rc != M_SUCCESS || h[0] != -h[1]) {
    snprintf(err, errsz, rc == 1 ? "checking the unique id timed out" :
             rc ? "checking the unique id failed in MPI" : "the ranks were given different unique ids");
    m->broken = rc != 0;
    rt_mpi_comm_free(m);
    return -1;
  }
  if (mpi.Irecv(&m->probe_in, 8, M_BYTE, -2, TAG_PROBE, m->probe, &m->probe_req) != M_SUCCESS)
    m->probe_req = M_REQUEST_NULL;
  *out = m;
  return 0;
}

static void rt_mpi_comm_free(rt_mpi_comm* m) {
  if (!m) return;
  int fin = 1;
  if (g_mpi_loaded) mpi.Finalized(&fin);
  if (!fin && !m->broken) {
    if (m->probe_req != M_REQUEST_NULL) {
      mpi.Cancel(&m->probe_req);
      mpi.Request_free(&m->probe_req);
    }
    for (int i = 0; i < m->nranks; i++)
      if (m->reply_req[i] != M_REQUEST_NULL) mpi.Request_free(&m->reply_req[i]);
    if (m->data != M_COMM_NULL) mpi.Comm_free(&m->data);
    if (m->probe != M_COMM_NULL) mpi.Comm_free(&m->probe);
  }
  if (m->broken) return; /* pending requests may still write into it: leak it on purpose */
  pthread_mutex_destroy(&m->order_mu);
  pthread_cond_destroy(&m->order_cv);
  pthread_mutex_destroy(&m->probe_mu);
  pthread_mutex_destroy(&m->find_mu);
  free(m->reply_val);
  free(m->reply_req);
  free(m);
}

/* ---- running a batch ---------------------------------------------------------------------------------------- */
static size_t elem_size(C_DataType t, mpi_type_t* mt) {
  switch (t) {
    case BOOL: *mt = M_UINT8; return 1;
    case UINT8: *mt = M_UINT8; return 1;
    case INT8: *mt = M_INT8; return 1;
    case UINT16: *mt = M_UINT16; return 2;
    case INT16: *mt = M_INT16; return 2;
    case FLOAT16: case BFLOAT16: *mt = M_UINT16; return 2;
    case UINT32: *mt = M_UINT32; return 4;
    case INT32: *mt = M_INT32; return 4;
    case FLOAT32: *mt = M_FLOAT; return 4;
    case UINT64: *mt = M_UINT64; return 8;
    case INT64: *mt = M_INT64; return 8;
    case FLOAT64: *mt = M_DOUBLE; return 8;
    default: *mt = M_BYTE; return 0;
  }
}

static mpi_op_t mpi_op(C_DataType t, C_CCLReduceOp op) {
  if (t == FLOAT16 || t == BFLOAT16) return g_half_ops[t == BFLOAT16][op];
  switch (op) {
    case MAX: return M_MAX;
    case MIN: return M_MIN;
    case PRODUCT: return M_PROD;
    default: return M_SUM;
  }
}

static size_t dtype_bytes(C_DataType t) {
  mpi_type_t mt;
  return elem_size(t, &mt);
}

#define DIV_BY_N(T) do { T* d = p; for (size_t i = 0; i < count; i++) d[i] = (T)(d[i] / (T)n); } while (0)
static void divide_by_n(void* p, size_t count, C_DataType t, size_t n) {
  switch (t) {
    case UINT8: DIV_BY_N(uint8_t); break;
    case INT8: DIV_BY_N(int8_t); break;
    case UINT16: DIV_BY_N(uint16_t); break;
    case INT16: DIV_BY_N(int16_t); break;
    case UINT32: DIV_BY_N(uint32_t); break;
    case INT32: DIV_BY_N(int32_t); break;
    case UINT64: DIV_BY_N(uint64_t); break;
    case INT64: DIV_BY_N(int64_t); break;
    case FLOAT32: DIV_BY_N(float); break;
    case FLOAT64: DIV_BY_N(double); break;
    case FLOAT16: case BFLOAT16: rt_ccl_scale_half(p, count, t == BFLOAT16, 1.0f / (float)n); break;
    default: break;
  }
}

static const char* op_name(int kind) {
  static const char* names[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                "send", "recv", "all_to_all"};
  return (kind >= 0 && kind <= K_ALL_TO_ALL) ? names[kind] : "?";
}

static const char* dtype_name(int64_t t) {
  static const char* names[] = {"undefined", "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16",
                                "int32", "int64", "float16", "float32", "float64", "bfloat16", "complex64",
                                "complex128"};
  return (t >= 0 && t <= COMPLEX128) ? names[t] : "an unknown dtype";
}

static const char* reduce_op_name(int64_t op) {
  static const char* names[] = {"sum", "avg", "max", "min", "prod"};
  return (op >= SUM && op <= PRODUCT) ? names[op] : "none";
}

/* A header field's value as a user reads it: collectives, dtypes and ops by name, counts and ranks as numbers. */
static void field_text(int field, int64_t v, char* out, size_t n) {
  if (field == 0)
    snprintf(out, n, "%s", (v >= 0 && v <= K_ALL_TO_ALL) ? op_name((int)v) : "?");
  else if (field == 2)
    snprintf(out, n, "%s", dtype_name(v));
  else if (field == 3)
    snprintf(out, n, "%s", reduce_op_name(v));
  else if (field == 4 && v < 0)
    snprintf(out, n, "none");
  else
    snprintf(out, n, "%lld", (long long)v);
}

static int overlaps(const void* a, size_t na, const void* b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return na && nb && x < y + nb && y < x + na;
}

typedef struct {
  fused_t h;                 /* collectives: the header (and a small all_reduce's payload) */
  int64_t p2p_hdr[2];        /* p2p: (count, dtype) sent / expected */
  int64_t p2p_got[2];
  void* tmp;                 /* a copy of send when MPI may not alias it */
} op_state;

static void fail(rt_mpi_failure* f, const char* fmt, ...) {
  if (f->text[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->text, sizeof(f->text), fmt, ap);
  va_end(ap);
}

static void missing_text(rt_mpi_failure* f, char* out, size_t n);

/* Which ranks did not reach collective `seq`: ask every peer over the probe communicator. Requests to peers that do
 * not answer stay pending: the communicator is then marked broken (never freed). find_mu held. */
static void find_missing_locked(rt_mpi_comm* m, uint64_t seq, rt_mpi_failure* f) {
  int n = m->nranks;
  uint64_t* got = calloc((size_t)n + 1, sizeof(uint64_t)); /* replies, then what this rank sends */
  mpi_req_t* rq = malloc(2 * (size_t)n * sizeof(mpi_req_t));
  if (!got || !rq) {
    free(got);
    free(rq);
    return;
  }
  for (int p = 0; p < 2 * n; p++) rq[p] = M_REQUEST_NULL;
  uint64_t* mine = &got[n];
  *mine = seq + 1;
  for (int p = 0; p < n; p++) {
    if (p == m->rank) continue;
    mpi.Isend(mine, 8, M_BYTE, p, TAG_PROBE, m->probe, &rq[p]);
    mpi.Irecv(&got[p], 8, M_BYTE, p, TAG_REPLY, m->probe, &rq[n + p]);
  }
  uint64_t grace = rt_cfg.ccl_timeout_ms / 4;
  if (grace < 200) grace = 200;
  if (grace > 2000) grace = 2000;
  uint64_t deadline = rt_now_ns() + grace * 1000000ull;
  int answered_any = 1;
  while (answered_any && rt_now_ns() < deadline) {
    serve_probes(m);
    answered_any = 0;
    for (int p = 0; p < n; p++) {
      if (rq[n + p] == M_REQUEST_NULL) continue;
      int done = 0;
      if (mpi.Test(&rq[n + p], &done, M_STATUS_IGNORE) != M_SUCCESS) done = 0;
      if (!done) answered_any = 1; /* still waiting for someone */
    }
    sched_yield();
  }
  f->n_missing = 0;
  for (int p = 0; p < n; p++) {
    if (p == m->rank) continue;
    int answered = rq[n + p] == M_REQUEST_NULL;
    if (!answered || got[p] <= seq) {
      if (f->n_missing < sizeof(f->missing) / sizeof(f->missing[0])) f->missing[f->n_missing] = (size_t)p;
      f->n_missing++;
    }
  }
  int pending = 0;
  for (int p = 0; p < 2 * n; p++) {
    int done = 1;
    if (rq[p] != M_REQUEST_NULL && (mpi.Test(&rq[p], &done, M_STATUS_IGNORE) != M_SUCCESS || !done)) pending = 1;
  }
  /* requests to ranks that never answered stay pending: the communicator is broken and never freed */
  free(rq);
  if (pending) m->broken = 1;
  else free(got);
}

static void find_missing(rt_mpi_comm* m, uint64_t seq, rt_mpi_failure* f) {
  pthread_mutex_lock(&m->find_mu);
  find_missing_locked(m, seq, f);
  pthread_mutex_unlock(&m->find_mu);
}

static void rt_mpi_abort(rt_mpi_comm* m) {
  if (m) atomic_store(&m->aborted, 1);
}

static int rt_mpi_find_missing(rt_mpi_comm* m, rt_mpi_failure* f) {
  uint64_t entered = atomic_load(&m->entered);
  memset(f, 0, sizeof(*f));
  if (entered == 0 || atomic_load(&m->aborted)) return 0;
  find_missing(m, entered - 1, f);
  char who[300];
  missing_text(f, who, sizeof(who));
  if (f->n_missing)
    snprintf(f->text, sizeof(f->text), "asked over MPI: rank(s) %s had not reached collective #%llu", who,
             (unsigned long long)(entered - 1));
  else
    snprintf(f->text, sizeof(f->text), "asked over MPI: every rank has reached collective #%llu",
             (unsigned long long)(entered - 1));
  return 1;
}

static void missing_text(rt_mpi_failure* f, char* out, size_t n) {
  size_t k = 0;
  out[0] = 0;
  size_t shown = f->n_missing < 64 ? f->n_missing : 64;
  for (size_t i = 0; i < shown && k + 24 < n; i++)
    k += (size_t)snprintf(out + k, n - k, "%s%zu", i ? ", " : "", f->missing[i]);
}

static int rt_mpi_run(rt_mpi_comm* m, const rt_mpi_op* ops, size_t n, rt_mpi_failure* f) {
  memset(f, 0, sizeof(*f));
  uint64_t timeout_ms = rt_cfg.ccl_timeout_ms;
  uint64_t deadline = rt_now_ns() + timeout_ms * 1000000ull;
  op_state* st = calloc(n ? n : 1, sizeof(op_state));
  mpi_req_t* req = malloc(2 * (n ? n : 1) * sizeof(mpi_req_t));
  mpi_status_t* sts = calloc(2 * (n ? n : 1), sizeof(mpi_status_t));
  if (!st || !req || !sts) {
    free(st);
    free(req);
    free(sts);
    fail(f, "out of host memory");
    return -1;
  }
  for (size_t i = 0; i < 2 * n; i++) req[i] = M_REQUEST_NULL;
  int rc = 0, result = 0;
  size_t bad = 0;
  int have_coll = 0;
  uint64_t first_coll = 0, last_coll = 0;
  for (size_t i = 0; i < n; i++) {
    if (ops[i].kind == K_SEND || ops[i].kind == K_RECV) continue;
    if (!have_coll) first_coll = ops[i].seq;
    have_coll = 1;
    last_coll = ops[i].seq;
  }
  /* validate sizes (MPI counts are ints) */
  for (size_t i = 0; i < n; i++) {
    mpi_type_t mt;
    size_t es = elem_size(ops[i].dtype, &mt);
    size_t total = ops[i].count * (ops[i].kind == K_ALL_GATHER ? (size_t)m->nranks : 1);
    if (!es || total > 0x7fffffffu || ops[i].count * es > 0x7fffffffu) {
      fail(f, "%s: count %zu of this dtype is too large for MPI (at most 2^31-1 elements and bytes per call)",
           op_name(ops[i].kind), ops[i].count);
      result = -1;
      goto out;
    }
  }
  /* collectives are posted in sequence order on the MPI communicator */
  if (have_coll) {
    pthread_mutex_lock(&m->order_mu);
    while (m->next_coll != first_coll && rt_now_ns() < deadline && !atomic_load(&m->aborted)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 2000000;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&m->order_cv, &m->order_mu, &ts);
    }
    int ok = m->next_coll == first_coll;
    pthread_mutex_unlock(&m->order_mu);
    if (!ok) {
      fail(f, "collective #%llu: an earlier collective of this communicator, issued on another stream, did not "
           "run within %llu ms", (unsigned long long)first_coll, (unsigned long long)timeout_ms);
      result = -1;
      goto out;
    }
    atomic_store(&m->entered, last_coll + 1);
  }
  /* phase 1: headers (collectives: one all-reduce each; p2p: a header message beside the data) */
  for (size_t i = 0; i < n && rc == 0; i++) {
    const rt_mpi_op* o = &ops[i];
    op_state* s = &st[i];
    if (o->kind == K_SEND || o->kind == K_RECV) {
      int tag = TAG_P2P_BASE + 2 * (int)(o->seq & 0xfffff) + 1;
      s->p2p_hdr[0] = (int64_t)o->count;
      s->p2p_hdr[1] = (int64_t)o->dtype;
      if (o->kind == K_SEND)
        rc = mpi.Isend(s->p2p_hdr, 16, M_BYTE, (int)o->peer, tag, m->data, &req[i]);
      else
        rc = mpi.Irecv(s->p2p_got, 16, M_BYTE, (int)o->peer, tag, m->data, &req[i]);
      continue;
    }
    int reducing = o->kind == K_ALL_REDUCE || o->kind == K_REDUCE || o->kind == K_REDUCE_SCATTER;
    int rooted = o->kind == K_REDUCE || o->kind == K_BROADCAST;
    int64_t v[HDR] = {o->kind, (int64_t)o->count, o->dtype, reducing ? (int64_t)o->op : -1,
                      rooted ? (int64_t)o->peer : -1, (int64_t)o->seq};
    for (int k = 0; k < HDR; k++) {
      s->h.hdr[k] = v[k];
      s->h.hdr[HDR + k] = -v[k];
    }
    size_t bytes = o->count * dtype_bytes(o->dtype);
    s->h.payload_present = o->kind == K_ALL_REDUCE && bytes <= FUSED_PAYLOAD;
    if (s->h.payload_present && bytes) memcpy(s->h.payload, o->send, bytes);
    rc = mpi.Iallreduce(M_IN_PLACE, &s->h, 1, g_fused_type, g_fused_op, m->data, &req[i]);
  }
  if (rc == 0) rc = wait_all(m, req, sts, n, deadline, &bad);
  if (rc != 0) goto mpi_failed;
  for (size_t i = 0; i < n; i++) {
    const rt_mpi_op* o = &ops[i];
    op_state* s = &st[i];
    if (o->kind == K_RECV) {
      if (s->p2p_got[0] != (int64_t)o->count || s->p2p_got[1] != (int64_t)o->dtype) {
        fail(f, "recv #%llu from rank %zu: the ranks' arguments differ (rank %zu sends count=%lld %s, this "
             "rank receives count=%zu %s)", (unsigned long long)o->seq, o->peer, o->peer,
             (long long)s->p2p_got[0], dtype_name(s->p2p_got[1]), o->count, dtype_name(o->dtype));
        result = -1;
      }
    } else if (o->kind != K_SEND) {
      static const char* field[HDR] = {"collective", "count", "dtype", "op", "root", "sequence number"};
      for (int k = 0; k < HDR; k++)
        if (s->h.hdr[k] != -s->h.hdr[HDR + k]) {
          char lo[32], hi[32];
          field_text(k, -s->h.hdr[HDR + k], lo, sizeof(lo));
          field_text(k, s->h.hdr[k], hi, sizeof(hi));
          if (k == 1 || k == 4 || k == 5)
            fail(f, "%s #%llu: the ranks' arguments differ (%s ranges from %s to %s across ranks)",
                 op_name(o->kind), (unsigned long long)o->seq, field[k], lo, hi);
          else
            fail(f, "%s #%llu: the ranks' arguments differ (%s: %s on some ranks, %s on others)",
                 op_name(o->kind), (unsigned long long)o->seq, field[k], lo, hi);
          result = -1;
          break;
        }
    }
  }
  if (result != 0) {
    /* a sender whose receiver refused: its data message is never received; the peer fails too */
    goto release_order;
  }
  /* phase 2: payloads, directly on the device buffers */
  for (size_t i = 0; i < n; i++) req[i] = M_REQUEST_NULL;
  for (size_t i = 0; i < n && rc == 0; i++) {
    const rt_mpi_op* o = &ops[i];
    op_state* s = &st[i];
    mpi_type_t mt;
    size_t es = elem_size(o->dtype, &mt);
    int cnt = (int)o->count;
    size_t bytes = o->count * es;
    int me = m->rank, nr = m->nranks;
    if (o->count == 0) continue;
    if (o->kind == K_ALL_REDUCE && s->h.payload_present) { /* reduced with the header */
      memcpy(o->recv, s->h.payload, bytes);
      continue;
    }
    switch (o->kind) {
      case K_SEND:
        rc = mpi.Isend(o->send, (int)bytes, M_BYTE, (int)o->peer, TAG_P2P_BASE + 2 * (int)(o->seq & 0xfffff),
                       m->data, &req[i]);
        break;
      case K_RECV:
        rc = mpi.Irecv(o->recv, (int)bytes, M_BYTE, (int)o->peer, TAG_P2P_BASE + 2 * (int)(o->seq & 0xfffff),
                       m->data, &req[i]);
        break;
      case K_BROADCAST:
        rc = mpi.Ibcast(o->recv, (int)bytes, M_BYTE, (int)o->peer, m->data, &req[i]);
        break;
      case K_ALL_REDUCE: {
        const void* src = o->send;
        if (o->send == o->recv) src = M_IN_PLACE;
        else if (overlaps(o->send, bytes, o->recv, bytes)) {
          if (!(s->tmp = malloc(bytes))) { fail(f, "out of host memory"); result = -1; goto release_order; }
          memcpy(s->tmp, o->send, bytes);
          src = s->tmp;
        }
        rc = mpi.Iallreduce(src, o->recv, cnt, mt, mpi_op(o->dtype, o->op), m->data, &req[i]);
        break;
      }
      case K_REDUCE: {
        int root = me == (int)o->peer;
        const void* src = o->send;
        if (root && o->send == o->recv) src = M_IN_PLACE;
        else if (root && overlaps(o->send, bytes, o->recv, bytes)) {
          if (!(s->tmp = malloc(bytes))) { fail(f, "out of host memory"); result = -1; goto release_order; }
          memcpy(s->tmp, o->send, bytes);
          src = s->tmp;
        }
        rc = mpi.Ireduce(src, root ? o->recv : NULL, cnt, mt, mpi_op(o->dtype, o->op), (int)o->peer, m->data,
                         &req[i]);
        break;
      }
      case K_ALL_GATHER: {
        const void* src = o->send;
        char* mine = (char*)o->recv + (size_t)me * bytes;
        if (o->send == mine) src = M_IN_PLACE;
        else if (overlaps(o->send, bytes, o->recv, bytes * (size_t)nr)) {
          if (!(s->tmp = malloc(bytes))) { fail(f, "out of host memory"); result = -1; goto release_order; }
          memcpy(s->tmp, o->send, bytes);
          src = s->tmp;
        }
        rc = mpi.Iallgather(src, (int)bytes, M_BYTE, o->recv, (int)bytes, M_BYTE, m->data, &req[i]);
        break;
      }
      case K_REDUCE_SCATTER: {
        /* in place (recv is this rank's block of send) or overlapping: reduce from a copy of send */
        const void* src = o->send;
        if (overlaps(o->send, bytes * (size_t)nr, o->recv, bytes)) {
          if (!(s->tmp = malloc(bytes * (size_t)nr))) { fail(f, "out of host memory"); result = -1; goto release_order; }
          memcpy(s->tmp, o->send, bytes * (size_t)nr);
          src = s->tmp;
        }
        rc = mpi.Ireduce_scatter_block(src, o->recv, cnt, mt, mpi_op(o->dtype, o->op), m->data, &req[i]);
        break;
      }
      default:
        fail(f, "unknown collective %d", o->kind);
        result = -1;
        goto release_order;
    }
  }
  if (have_coll) { /* every collective of the batch is posted: the next batch may post its own */
    pthread_mutex_lock(&m->order_mu);
    m->next_coll = last_coll + 1;
    pthread_cond_broadcast(&m->order_cv);
    pthread_mutex_unlock(&m->order_mu);
    have_coll = 0;
  }
  if (rc == 0) rc = wait_all(m, req, sts, n, deadline, &bad);
  if (rc != 0) goto mpi_failed;
  for (size_t i = 0; i < n; i++) {
    const rt_mpi_op* o = &ops[i];
    if (o->op != AVG || o->count == 0) continue;
    if (o->kind == K_ALL_REDUCE || o->kind == K_REDUCE_SCATTER || (o->kind == K_REDUCE && (int)o->peer == m->rank))
      divide_by_n(o->recv, o->count, o->dtype, (size_t)m->nranks);
  }
  goto release_order;

mpi_failed: {
    const rt_mpi_op* o = &ops[bad < n ? bad : 0];
    int p2p = o->kind == K_SEND || o->kind == K_RECV;
    m->broken = 1;
    if (rc == -1) {
      fail(f, "%s #%llu was aborted on this rank (the communicator was aborted or destroyed after a failure)",
           op_name(o->kind), (unsigned long long)o->seq);
      result = -1;
      goto release_order;
    }
    if (p2p) {
      f->n_missing = 1;
      f->missing[0] = o->peer;
    } else {
      find_missing(m, o->seq, f);
    }
    char who[400];
    missing_text(f, who, sizeof(who));
    char why[300];
    if (rc == 1)
      snprintf(why, sizeof(why), "did not complete within %llu ms", (unsigned long long)timeout_ms);
    else {
      char t[260];
      mpi_errtext(rc, t, sizeof(t));
      snprintf(why, sizeof(why), "failed in MPI (%s)", t);
    }
    if (p2p)
      fail(f, "%s #%llu %s rank %zu %s: rank(s) %s missing", op_name(o->kind), (unsigned long long)o->seq,
           o->kind == K_SEND ? "to" : "from", o->peer, why, who);
    else if (f->n_missing)
      fail(f, "%s #%llu %s: rank(s) %s did not join it", op_name(o->kind), (unsigned long long)o->seq, why, who);
    else
      fail(f, "%s #%llu %s (every rank answered)", op_name(o->kind), (unsigned long long)o->seq, why);
    result = -1;
  }
release_order:
  if (have_coll) {
    pthread_mutex_lock(&m->order_mu);
    if (m->next_coll <= last_coll) m->next_coll = last_coll + 1;
    pthread_cond_broadcast(&m->order_cv);
    pthread_mutex_unlock(&m->order_mu);
  }
out:
  if (!m->broken)
    for (size_t i = 0; i < n; i++) free(st[i].tmp);
  if (!m->broken) free(st); /* a broken communicator's pending requests may still use the headers */
  free(req);
  free(sts);
  return result;
}

static const rt_ccl_transport g_mpi_transport = {rt_mpi_comm_create, rt_mpi_comm_free, rt_mpi_run, rt_mpi_abort,
                                                 rt_mpi_find_missing};

__attribute__((constructor)) static void mpi_register(void) { rt_ccl_register_mpi_transport(&g_mpi_transport); }
