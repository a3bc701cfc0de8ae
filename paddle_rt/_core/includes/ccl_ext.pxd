# Optional plugin extensions of the xccl hooks (paddle_rt/include/paddle_rt/paddle_rt_ccl_ext.h): symbols a plugin
# may export; ccl.pyx finds them with dlsym on the plugin's handle.
from libc.stdint cimport int64_t
from paddle_rt._core.device_ext cimport C_CCLComm, C_CCLRootId, C_Status

cdef extern from "paddle_rt/paddle_rt_ccl_ext.h" nogil:
    ctypedef struct PaddleRtCclError:
        char text[480]
        size_t n_missing
        size_t missing[64]
    ctypedef int (*paddle_rt_ext_ccl_comm_failure_fn)(C_CCLComm comm, PaddleRtCclError* why) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_ccl_comm_init_rank_mpi_fn)(size_t nranks, C_CCLRootId* unique_id, size_t rank,
                                                                 C_CCLComm* comm, int64_t mpi_comm) noexcept nogil
    ctypedef C_Status (*paddle_rt_ext_ccl_comm_abort_fn)(C_CCLComm comm) noexcept nogil
    ctypedef int (*paddle_rt_ext_ccl_comm_find_missing_fn)(C_CCLComm comm, PaddleRtCclError* why) noexcept nogil
