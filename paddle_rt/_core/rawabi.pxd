# Raw access to a plugin's hooks, one hook per method, statuses returned rather than raised (for the conformance
# checker, paddle_rt.tools.check, and for tests that judge a plugin's own behaviour).
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device, C_Status
from paddle_rt._core.device cimport Device

cdef class CallbackTicket:
    cdef readonly object fn           # the Python callable; released once it ran
    cdef readonly bint ran            # the plugin called the callback
    cdef readonly object exception    # what the callable raised (BaseException), or None
    cdef readonly int status_in       # the C_Status the plugin passed in (-1 if the pointer was NULL)
    cdef readonly long order          # position among all callbacks that ran in this process (from 1)
    cdef object _done                 # threading.Event, set when it ran

cdef class RawDevice:
    cdef readonly Device device
    cdef C_DeviceInterface* f         # the plugin's table (== device.iface)
    cdef C_Device cd                  # the device as the plugin sees it
    cdef readonly bint host_addressable   # device memory may be read/written by the host at its address

    cdef int _need(self, const void* hook, str name) except -1
