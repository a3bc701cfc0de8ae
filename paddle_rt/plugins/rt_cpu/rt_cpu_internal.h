/*
 * rt_cpu_internal.h -- internals shared by the files of the rt_cpu reference plugin (not installed, not an API).
 *
 * The files call in one direction: fault injection (rt_cpu_faults.c) <- core (rt_cpu.c) <- collectives (rt_cpu_ccl.c)
 * <- MPI transport (rt_cpu_mpi.c).
 * A file calls only the sections of this header above its own. A lower file reaches a higher one only through a
 * table the higher one registers from a constructor when the library loads: the core runs every registered
 * rt_layer's fill and teardown; the collectives run the registered rt_ccl_transport. tests/test_structure.py checks
 * the direction on the compiled objects (nm).
 */
#ifndef RT_CPU_INTERNAL_H_
#define RT_CPU_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "paddle_rt/device_ext.h"

#define RT_EXPORT __attribute__((visibility("default")))
#define RT_CPU_MAX_DEVICES 64

/* Configuration, read once per process from the environment (see the comment block at the top of rt_cpu.c). */
typedef struct {
  size_t device_count;
  size_t memory_bytes;       /* capacity per device */
  size_t min_chunk;
  size_t extra_padding;
  size_t fail_alloc_every;   /* 0 = off */
  size_t fail_alloc_after;   /* 0 = off */
  size_t fail_host_alloc_every;
  int oom_null;
  uint64_t stream_delay_us;
  size_t max_streams;        /* per device, 0 = unlimited */
  uint64_t ccl_timeout_ms;
  int verbose;
  size_t alignment;          /* derived: alignment of device allocations */
} rt_config;

extern rt_config rt_cfg;

/* Fault injection (rt_cpu_faults.c, below the core: it calls nothing of the core and reads no core state): the kinds
 * of calls that can be made to fail or wait. rt_fault_init applies the configuration the core read (cfg) and the
 * environment; rt_fault_hit(kind) sleeps the kind's delay and returns 1 when this call fails. */
enum {
  RT_FAULT_ALLOC, RT_FAULT_HOST_ALLOC, RT_FAULT_MEMCPY, RT_FAULT_MEMSET, RT_FAULT_CREATE_STREAM, RT_FAULT_CREATE_EVENT,
  RT_FAULT_RECORD_EVENT, RT_FAULT_SYNCHRONIZE, RT_FAULT_FREE, RT_FAULT_UNMAP, RT_FAULT_RELEASE, RT_FAULT_FREE_RANGE,
  RT_FAULT_N
};
void rt_fault_init(const rt_config* cfg);
int rt_fault_hit(int kind);

/* A pointer -> size map (linear probing, backward-shift deletion). Not thread-safe: callers lock. */
typedef struct {
  uintptr_t* keys; /* 0 = empty */
  size_t* vals;
  size_t cap;      /* power of two or 0 */
  size_t count;
} ptrmap;
int ptrmap_put(ptrmap* m, const void* key, size_t val);  /* 0 or -1 (out of memory) */
int ptrmap_find(const ptrmap* m, const void* key, size_t* val);
int ptrmap_remove(ptrmap* m, const void* key);
/* A caller's handle made a counted reference: key when m holds it (looked up under mu), with the atomic_int at
 * key + refs_offset incremented under the same lock; NULL otherwise. */
void* ptrmap_ref(pthread_mutex_t* mu, const ptrmap* m, void* key, size_t refs_offset);
/* Teardown of a registry: m's contents are moved out under mu (m is left empty), then release is called on each key
 * outside the lock (the registry's references become the caller's). */
void ptrmap_drain(pthread_mutex_t* mu, ptrmap* m, void (*release)(void*));
/* A destroy hook's work: key removed from m under mu, then released (the registry's reference); C_ERROR, and nothing
 * done, when m does not hold key. */
int ptrmap_unregister(pthread_mutex_t* mu, ptrmap* m, void* key, void (*release)(void*));
void ptrmap_free(ptrmap* m);

/* ---- core (rt_cpu.c) ----------------------------------------------------------------------------------------- */

/* A layer above the core (collectives, ...): fill sets its hooks of the interface after the core's (InitPlugin);
 * teardown (may be NULL) frees its state when the last finalize has joined every stream; at_fork (may be NULL) keeps
 * its state whole across fork() and makes the child's its own. Registered from the
 * layer's constructor; layers run in registration order. l must stay valid for the life of the library. */
typedef struct rt_layer {
  const char* name;
  void (*fill)(C_DeviceInterface* iface);
  void (*teardown)(void);
  /* fork() (may be NULL): called by the core's pthread_atfork handlers with RT_FORK_PREPARE (before the core takes
   * its locks: take the layer's), RT_FORK_PARENT (release them) and RT_FORK_CHILD (after the core made its locks
   * usable in the child: forget the parent's state; the layer's locks were held by the forking thread) */
  void (*at_fork)(int phase);
  struct rt_layer* next; /* the core's list */
} rt_layer;
enum { RT_FORK_PREPARE, RT_FORK_PARENT, RT_FORK_CHILD };
void rt_layer_register(rt_layer* l);

/* Plugin-wide state. */
int rt_is_initialized(void);
/* The calling thread's current device (set_device; a stream worker's is its stream's device). */
int rt_current_device(void);
/* Validates a device handle: non-NULL and id in range. Returns the id or -1. */
int rt_device_id(const C_Device device);

/* Streams. A stream handle is validated against the registry; rt_stream_get returns a referenced stream or NULL. */
typedef struct rt_stream rt_stream;
rt_stream* rt_stream_get(C_Stream handle);
void rt_stream_put(rt_stream* s);
int rt_stream_device(const rt_stream* s);

/* Enqueue a generic operation on a stream: fn(arg) runs on the stream's worker in submission order; cleanup(arg)
 * (may be NULL) runs after fn, or instead of fn when the stream is torn down without running it (never happens
 * today: destroy drains). Returns C_SUCCESS or C_ERROR (stream being destroyed). */
C_Status rt_stream_enqueue_fn(rt_stream* s, void (*fn)(void* arg), void (*cleanup)(void* arg), void* arg);

/* Monotonic clock in nanoseconds. */
uint64_t rt_now_ns(void);

/* Device memory accounting, for the virtual-memory layer: charge `size` bytes against device `id`'s capacity (0, or
 * -1 when it would exceed RT_CPU_MEMORY_BYTES), give them back. */
int rt_device_charge(int id, size_t size);
void rt_device_uncharge(int id, size_t size);

/* ---- virtual memory (rt_cpu_vmm.c): a layer of the core; exports paddle_rt_vmm_ext.h, calls only the core ------ */

/* ---- collectives (rt_cpu_ccl.c): a layer of the core; fills the xccl_* hooks ----------------------------------- */

/* The collectives (the order of the ABI's hooks). */
enum { K_ALL_REDUCE, K_BROADCAST, K_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_SEND, K_RECV, K_ALL_TO_ALL };
/* dst[i] = op over the n sources (rt_cpu's reduction semantics); scale float16/bfloat16 values in place. */
int rt_ccl_reduce(void* dst, const void* const* srcs, size_t n, size_t count, C_DataType t, C_CCLReduceOp op);
void rt_ccl_scale_half(void* p, size_t count, int bf16, float factor);

/* A transport across processes, registered by the MPI transport (rt_cpu_mpi.c): a communicator whose ranks are the
 * processes of an MPI communicator. */
typedef struct rt_mpi_comm rt_mpi_comm;
typedef struct {
  int kind;           /* K_*; all_to_all comes as send/recv pairs */
  const void* send;
  void* recv;
  size_t count;
  C_DataType dtype;
  C_CCLReduceOp op;
  size_t peer;        /* root (broadcast, reduce) or peer (send, recv) */
  uint64_t seq;       /* collectives: the communicator's n-th; p2p: the n-th message between the pair */
} rt_mpi_op;
typedef struct {
  char text[400];
  size_t n_missing;
  size_t missing[64];
} rt_mpi_failure;
typedef struct {
  /* 0, or -1 with a reason in err. Collective over the MPI communicator; bounded by RT_CPU_CCL_TIMEOUT_MS. */
  int (*comm_create)(int64_t mpi_comm, size_t nranks, size_t rank, const void* id, size_t id_size,
                     rt_mpi_comm** out, char* err, size_t errsz);
  void (*comm_free)(rt_mpi_comm* m);
  /* Run one batch in order, on this thread; 0, or -1 with *f filled (the communicator is then unusable). */
  int (*run)(rt_mpi_comm* m, const rt_mpi_op* ops, size_t n, rt_mpi_failure* f);
  /* Make the batch running on m (and later ones) give up at once. */
  void (*abort)(rt_mpi_comm* m);
  /* Ask the peers which of them have not reached the collective this rank is running: 1 with *f filled (text and
   * missing ranks), 0 when this rank runs no collective. */
  int (*find_missing)(rt_mpi_comm* m, rt_mpi_failure* f);
} rt_ccl_transport;
/* Called from the transport's constructor; t must stay valid for the life of the library. */
void rt_ccl_register_mpi_transport(const rt_ccl_transport* t);

/* ---- MPI transport (rt_cpu_mpi.c): registers its rt_ccl_transport; nothing calls into it by name ----------------- */

#endif /* RT_CPU_INTERNAL_H_ */
