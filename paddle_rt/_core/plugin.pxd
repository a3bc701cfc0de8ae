# A loaded plugin: the dlopen handle, the filled interface table, what it reported in the handshake.
from paddle_rt._core.device_ext cimport C_DeviceInterface
from paddle_rt._core.includes.vmm_ext cimport prt_vmm_fns

cdef class Plugin:
    cdef void* _dl                    # dlopen handle; plugins are never unloaded (like Paddle)
    cdef C_DeviceInterface* iface     # owned, filled by InitPlugin; valid for the life of the process
    cdef readonly str path
    cdef readonly str device_type
    cdef readonly str sub_device_type
    cdef readonly tuple version       # (major, minor, patch)
    cdef readonly tuple capabilities  # names of the hooks it implements
    cdef readonly tuple missing       # names of the optional hooks it lacks
    cdef readonly bint bundled        # True for paddle_rt's own rt_cpu
    cdef int _state                   # 0: loaded, 1: initialize() called, 2: finalized
    cdef long _pid                    # process that called initialize()
    cdef object _lock                 # threading.RLock guarding initialisation
    cdef list _devices                # Device objects by logical index, created on first use
    cdef list _physical_ids           # from get_device_list
    cdef int _fault_slot              # its slot in the fatal-signal handler (fault_handler.c), -1 when not watched
    # paddle_rt's optional extensions (paddle_rt/extension.h), looked up once at load
    cdef readonly bint host_memory    # paddle_rt_ext_host_addressable() said 1: device memory is host memory
    cdef void* ext_ccl_comm_error     # paddle_rt_ext_ccl_comm_error, or NULL
    cdef prt_vmm_fns vmm              # the virtual-memory extension (paddle_rt_vmm_ext.h): all seven, or all NULL

    cdef int ensure_initialized(self) except -1
    cdef int check_process(self) except -1
    cdef bint has(self, str hook)


# 1 in a child of fork() until paddle_rt.reinitialize_after_fork() (set by an at-fork handler; nogil, no lock)
cdef int process_forked() noexcept nogil
