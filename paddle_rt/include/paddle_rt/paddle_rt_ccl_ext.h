/*
 * paddle_rt_ccl_ext.h -- optional extensions of the xccl_* hooks of device_ext.h that paddle_rt understands.
 *
 * A plugin MAY export these symbols (default visibility, C linkage); paddle_rt finds them with dlsym() in the
 * plugin's shared object and uses them when present. A plugin that exports none of them works as before: every
 * symbol here is optional and paddle_rt never requires it. The reference plugin rt_cpu exports all of them.
 */
#ifndef PADDLE_RT_CCL_EXT_H_
#define PADDLE_RT_CCL_EXT_H_

#include <stddef.h>
#include <stdint.h>

#include "paddle_rt/device_ext.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PADDLE_RT_CCL_EXT_VERSION 1

/* What went wrong on a communicator that is in error (see paddle_rt_xccl_comm_error). */
typedef struct {
  char text[480];        /* NUL-terminated reason, e.g. "all_reduce #3: rank(s) 1 did not join within 5000 ms" */
  size_t n_missing;      /* ranks that did not join the failed call (0: none named) */
  size_t missing[64];    /* the first min(n_missing, 64) of them */
} PaddleRtCclError;

/* Asynchronous failures. A collective enqueued on a stream that fails when it runs cannot return an error to its
 * caller; the plugin records it on the communicator. Returns 1 when the communicator is in error (and fills *why
 * with the first failure when why != NULL), 0 when it is fine, -1 when comm is not a live communicator.
 * paddle_rt calls it after every collective it ran, on the stream's worker thread. */
typedef int (*paddle_rt_xccl_comm_error_fn)(C_CCLComm comm, PaddleRtCclError* why);
int paddle_rt_xccl_comm_error(C_CCLComm comm, PaddleRtCclError* why);

/* Ranks in different processes joined by MPI. Like xccl_comm_init_rank, for a communicator whose ranks are the
 * processes of the MPI communicator `mpi_comm` (rank = the process's MPI rank, nranks = its size), for plugins whose
 * transport between processes is MPI. `mpi_comm` is the C handle (MPI_Comm) of the MPI library loaded in the
 * process, widened to int64_t, as mpi4py's MPI._handleof(comm) gives it; MPI must be initialized with
 * MPI_THREAD_MULTIPLE. Collective: every rank of mpi_comm calls it with the same unique id (the one rank 0 got from
 * xccl_get_unique_id). The plugin keeps its own duplicate of mpi_comm: the caller may free mpi_comm afterwards.
 * Plugins whose collective library has its own transport between processes do not need this: paddle_rt then
 * calls xccl_comm_init_rank with the broadcast id. */
typedef C_Status (*paddle_rt_xccl_comm_init_rank_mpi_fn)(size_t nranks, C_CCLRootId* unique_id, size_t rank,
                                                         C_CCLComm* comm, int64_t mpi_comm);
C_Status paddle_rt_xccl_comm_init_rank_mpi(size_t nranks, C_CCLRootId* unique_id, size_t rank, C_CCLComm* comm,
                                           int64_t mpi_comm);

#ifdef __cplusplus
}
#endif

#endif /* PADDLE_RT_CCL_EXT_H_ */
