# Devices: one object per (plugin, index); the current device per thread; ordered teardown at exit.
from paddle_rt._core.device_ext cimport C_DeviceInterface, C_Device_st, C_Device, C_Status
from paddle_rt._core.plugin cimport Plugin

cdef class Device:
    cdef readonly Plugin plugin
    cdef readonly int index           # logical index within the plugin's device list
    cdef readonly str type            # the plugin's device_type
    cdef C_Device_st _cdev            # what the plugin sees: {id = physical id}
    cdef C_DeviceInterface* iface     # == plugin.iface, cached for nogil use
    cdef int _state                   # 0: new, 1: init_device done, 2: torn down
    cdef object __weakref__
    cdef dict layers                  # per-device state owned by higher layers (allocator, streams...), by name

    # Initialise the plugin and the device once (thread-safe); raise if torn down or after fork().
    cdef int ensure_ready(self) except -1
    # ensure_ready() + set_device: call before any plugin call made with the GIL held.
    cdef int activate(self) except -1
    # The raw C_Device to pass to hooks.
    cdef C_Device cdev(self) noexcept nogil
    # set_device only, for threads of paddle_rt (workers, callbacks); assumes ensure_ready() already succeeded.
    cdef C_Status set_current_nogil(self) noexcept nogil
    cdef bint alive(self) noexcept nogil

    @staticmethod
    cdef Device _new(Plugin plugin, int index, int physical_id)
    cdef object _size_hint(self, str name)
    cdef object _bool_hint(self, str name)

# A function fn(dev) that Device.synchronize() calls first (a layer above that drives work of its own: streams).
cdef int add_synchronize_hook(Device dev, object fn) except -1
# Whether the host may read and write the device's memory at its address (Device.host_addressable).
cdef bint device_host_addressable(Device dev)
# Raise PluginError naming the device and the call unless status is C_SUCCESS or C_WARNING.
cdef int check_status(Device dev, str call, C_Status status) except -1
# The current device of the calling thread, or the device named/given by `device` (None, str, int, Device).
cpdef Device resolve_device(object dev=*)
cdef int raise_forked(object dev) except -1   # ForkError: this process is a child of fork() not yet re-initialised
