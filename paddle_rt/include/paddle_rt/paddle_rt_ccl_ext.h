/*
 * paddle_rt_ccl_ext.h -- optional extensions of the xccl_* hooks of device_ext.h that paddle_rt understands.
 *
 * A plugin may export these functions (C linkage, default visibility) next to InitPlugin, as those of
 * paddle_rt/extension.h; paddle_rt finds them with dlsym on the plugin's handle. A plugin that exports none of them
 * works as before. The reference plugin rt_cpu exports all of them.
 */
#ifndef PADDLE_RT_CCL_EXT_H_
#define PADDLE_RT_CCL_EXT_H_

#include <stddef.h>
#include <stdint.h>

#include "paddle_rt/device_ext.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What went wrong on a communicator that is in error (see paddle_rt_ext_ccl_comm_failure). */
typedef struct {
  char text[480];        /* NUL-terminated reason, e.g. "all_reduce #3 did not complete within 5000 ms: rank(s) 1
                          * did not join it" */
  size_t n_missing;      /* ranks that did not join the failed call (0: none named) */
  size_t missing[64];    /* the first min(n_missing, 64) of them */
} PaddleRtCclError;

/* The reason behind paddle_rt_ext_ccl_comm_error (paddle_rt/extension.h): returns what that returns (1 in error,
 * 0 fine, -1 unknown communicator) and, when 1 and why != NULL, fills *why with the communicator's first failure.
 * paddle_rt calls it (with the GIL, off the stream workers) to build the CollectiveError of a failed collective;
 * without it the error names the missing ranks only when they are in this process. */
int paddle_rt_ext_ccl_comm_failure(C_CCLComm comm, PaddleRtCclError* why);
typedef int (*paddle_rt_ext_ccl_comm_failure_fn)(C_CCLComm comm, PaddleRtCclError* why);

/* Abort, as ncclCommAbort: the collectives this rank is waiting in on `comm` give up at once (failing, with the
 * reason "aborted" recorded for paddle_rt_ext_ccl_comm_failure) instead of waiting for the plugin's time limit;
 * the communicator is then in error. paddle_rt calls it from comm.abort(), and from comm.destroy() (also at exit)
 * when a collective of the communicator failed or a wait for one timed out, so that they return promptly; then
 * xccl_destroy_comm. Without it, destroy waits for the plugin's own limit. */
C_Status paddle_rt_ext_ccl_comm_abort(C_CCLComm comm);
typedef C_Status (*paddle_rt_ext_ccl_comm_abort_fn)(C_CCLComm comm);

/* For a communicator whose other ranks are in other processes: ask the peers which of them have not reached the
 * collective this rank is running, as the plugin does when its own time limit expires. Returns 1 with *why filled
 * (text, missing ranks), 0 when this rank runs no collective, -1 for an unknown or in-process communicator. paddle_rt
 * calls it (with the GIL, off the stream workers) when Work.wait(timeout) expires, to name the missing ranks. */
int paddle_rt_ext_ccl_comm_find_missing(C_CCLComm comm, PaddleRtCclError* why);
typedef int (*paddle_rt_ext_ccl_comm_find_missing_fn)(C_CCLComm comm, PaddleRtCclError* why);

/* Ranks in different processes joined by MPI. Like xccl_comm_init_rank, for a communicator whose ranks are the
 * processes of the MPI communicator `mpi_comm` (rank = the process's MPI rank, nranks = its size), for plugins whose
 * transport between processes is MPI. `mpi_comm` is the C handle (MPI_Comm) of the MPI library loaded in the
 * process as a signed integer of its own width widened to int64_t (MPICH's int handles of derived communicators
 * are negative, e.g. (int)0x84000002; paddle_rt reads mpi4py's MPI._handleof at MPI._sizeof bits); MPI is initialized with
 * MPI_THREAD_MULTIPLE. Collective: every rank of mpi_comm calls it with the same unique id (the one rank 0 got from
 * xccl_get_unique_id, broadcast by paddle_rt). The plugin keeps its own duplicate of mpi_comm. Plugins whose
 * collective library connects processes itself do not export it: paddle_rt then calls xccl_comm_init_rank with the
 * broadcast id (ccl.Communicator.from_mpi).
 * Host-driven transport: paddle_rt calls the collectives of a communicator made this way with the NULL stream, from
 * the worker thread of the paddle_rt stream they were issued on, once every earlier operation of that stream
 * (plugin stream included) has completed; the hook runs the collective to completion (or failure, returning C_ERROR
 * and recording the reason for paddle_rt_ext_ccl_comm_failure) before it returns. */
C_Status paddle_rt_ext_ccl_comm_init_rank_mpi(size_t nranks, C_CCLRootId* unique_id, size_t rank, C_CCLComm* comm,
                                              int64_t mpi_comm);
typedef C_Status (*paddle_rt_ext_ccl_comm_init_rank_mpi_fn)(size_t nranks, C_CCLRootId* unique_id, size_t rank,
                                                            C_CCLComm* comm, int64_t mpi_comm);

#ifdef __cplusplus
}
#endif

#endif /* PADDLE_RT_CCL_EXT_H_ */
