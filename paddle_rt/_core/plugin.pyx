"""Loading plugins: dlopen, the InitPlugin handshake exactly as Paddle performs it, validation, and the registry.

Paddle's rules reproduced here (as measured on paddlepaddle 3.3.1; the layout is paddle_rt/device_ext.h's): the host zero-fills the parameter block and the interface table, sets
their sizes (96 and 1128), calls ``InitPlugin``; a plugin that leaves ``device_type`` NULL has refused; the reported
version must satisfy major*10000 + minor*100 + patch >= 101; the ten required hooks must be set, and the first missing
one is named. Plugins are never unloaded.
"""
import os
import threading
import warnings

from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport strlen, memset

from paddle_rt._core.device_ext cimport (
    C_DeviceInterface, CustomRuntimeParams, InitPluginFn, C_Status, C_SUCCESS, C_WARNING,
)
from paddle_rt._core.includes.vmm_ext cimport (
    prt_vmm_fns, paddle_rt_ext_vmm_granularity_fn, paddle_rt_ext_vmm_reserve_fn, paddle_rt_ext_vmm_free_range_fn,
    paddle_rt_ext_vmm_create_fn, paddle_rt_ext_vmm_release_fn, paddle_rt_ext_vmm_map_fn, paddle_rt_ext_vmm_unmap_fn,
    paddle_rt_ext_vmm_map_pages_fn, paddle_rt_ext_vmm_unmap_pages_fn,
)
from paddle_rt._core.includes.dl cimport dlopen, dlsym, dlerror, dlclose, RTLD_NOW, RTLD_LOCAL, RTLD_DEFAULT

from paddle_rt._core import errors

cdef extern from *:
    """
    #include <stddef.h>
    #include "paddle_rt/device_ext.h"
    typedef struct { const char* name; size_t offset; } prt_hook_entry;
    #define PRT_HOOK(n) {#n, offsetof(C_DeviceInterface, n)}
    static const prt_hook_entry prt_hooks[] = {
      PRT_HOOK(initialize), PRT_HOOK(finalize), PRT_HOOK(init_device), PRT_HOOK(set_device), PRT_HOOK(get_device),
      PRT_HOOK(deinit_device), PRT_HOOK(create_stream), PRT_HOOK(destroy_stream), PRT_HOOK(query_stream),
      PRT_HOOK(stream_add_callback), PRT_HOOK(create_event), PRT_HOOK(record_event), PRT_HOOK(destroy_event),
      PRT_HOOK(query_event), PRT_HOOK(synchronize_device), PRT_HOOK(synchronize_stream),
      PRT_HOOK(synchronize_event), PRT_HOOK(stream_wait_event),
      PRT_HOOK(device_memory_allocate), PRT_HOOK(device_memory_deallocate), PRT_HOOK(device_memory_set),
      PRT_HOOK(host_memory_allocate), PRT_HOOK(host_memory_deallocate), PRT_HOOK(unified_memory_allocate),
      PRT_HOOK(unified_memory_deallocate), PRT_HOOK(memory_copy_h2d), PRT_HOOK(memory_copy_d2h),
      PRT_HOOK(memory_copy_d2d), PRT_HOOK(memory_copy_p2p), PRT_HOOK(async_memory_copy_h2d),
      PRT_HOOK(async_memory_copy_d2h), PRT_HOOK(async_memory_copy_d2d), PRT_HOOK(async_memory_copy_p2p),
      PRT_HOOK(get_device_count), PRT_HOOK(get_device_list), PRT_HOOK(device_memory_stats),
      PRT_HOOK(device_min_chunk_size), PRT_HOOK(device_max_chunk_size), PRT_HOOK(device_max_alloc_size),
      PRT_HOOK(device_extra_padding_size), PRT_HOOK(device_init_alloc_size), PRT_HOOK(device_realloc_size),
      PRT_HOOK(get_compute_capability), PRT_HOOK(get_device_properties), PRT_HOOK(get_runtime_version),
      PRT_HOOK(get_driver_version), PRT_HOOK(get_multi_process), PRT_HOOK(get_max_threads_per_mp),
      PRT_HOOK(get_max_threads_per_block), PRT_HOOK(get_max_grid_dim_size), PRT_HOOK(is_float16_supported),
      PRT_HOOK(is_bfloat16_supported), PRT_HOOK(is_dnn_supported), PRT_HOOK(init_eigen_device),
      PRT_HOOK(destroy_eigen_device),
      PRT_HOOK(xccl_get_comm_name), PRT_HOOK(xccl_get_unique_id_size), PRT_HOOK(xccl_get_unique_id),
      PRT_HOOK(xccl_comm_init_rank), PRT_HOOK(xccl_destroy_comm), PRT_HOOK(xccl_all_reduce),
      PRT_HOOK(xccl_broadcast), PRT_HOOK(xccl_reduce), PRT_HOOK(xccl_all_gather), PRT_HOOK(xccl_reduce_scatter),
      PRT_HOOK(xccl_group_start), PRT_HOOK(xccl_group_end), PRT_HOOK(xccl_send), PRT_HOOK(xccl_recv),
      PRT_HOOK(xccl_all_to_all),
      PRT_HOOK(profiler_initialize), PRT_HOOK(profiler_finalize), PRT_HOOK(profiler_prepare_tracing),
      PRT_HOOK(profiler_start_tracing), PRT_HOOK(profiler_stop_tracing), PRT_HOOK(profiler_collect_trace_data),
      PRT_HOOK(init_blas_handle), PRT_HOOK(blas_set_math_mode), PRT_HOOK(init_blaslt_handle),
      PRT_HOOK(destroy_blas_handle), PRT_HOOK(destroy_blaslt_handle), PRT_HOOK(cuda_stream_begin_capture),
      PRT_HOOK(cuda_stream_end_captrue), PRT_HOOK(cuda_graph_launch), PRT_HOOK(cuda_graph_destroy),
      PRT_HOOK(cuda_graph_exec_destroy), PRT_HOOK(cuda_graph_instantiate), PRT_HOOK(cuda_graph_get_nodes),
      PRT_HOOK(cuda_stream_capture_info), PRT_HOOK(get_parameter_setter_for_exec_graph),
      PRT_HOOK(cuda_graph_debug_dot_print), PRT_HOOK(cuda_thread_exchange_stream_capthure_mode),
      PRT_HOOK(blas_axpby),
    };
    static const size_t prt_n_hooks = sizeof(prt_hooks) / sizeof(prt_hooks[0]);
    static void* prt_hook_at(const C_DeviceInterface* iface, size_t offset) {
      return *(void* const*)((const char*)iface + offset);
    }
    /* Slack around the blocks handed to InitPlugin, so that a plugin built for a larger (newer) layout cannot
       write past our allocation. */
    #define PRT_HANDSHAKE_BLOCK 4096
    """
    ctypedef struct prt_hook_entry:
        const char* name
        size_t offset
    const prt_hook_entry prt_hooks[]
    const size_t prt_n_hooks
    void* prt_hook_at(const C_DeviceInterface* iface, size_t offset) nogil
    size_t PRT_HANDSHAKE_BLOCK

#: The hooks Paddle requires, in the order it checks them.
REQUIRED_HOOKS = (
    "set_device", "get_device", "create_event", "record_event", "destroy_event", "synchronize_event",
    "device_memory_allocate", "device_memory_deallocate", "get_device_count", "get_device_list",
)
#: Every hook of the ABI, in table order.
ALL_HOOKS = tuple(prt_hooks[i].name.decode() for i in range(prt_n_hooks))
cdef dict _HOOK_OFFSETS = {prt_hooks[i].name.decode(): prt_hooks[i].offset for i in range(prt_n_hooks)}

#: The host's ABI version number (Paddle's formula).
HOST_VERSION = (0, 1, 1)
cdef size_t _HOST_VERSION_NUMBER = 101

_registry_lock = threading.RLock()
_by_type = {}        # device_type -> Plugin, in load order
_by_path = {}        # realpath -> Plugin
_discovered = []     # the plugins found by discover(), in order (they decide the default device)
_host_symbols = None

cdef int _forked = 0


# More devices than this from get_device_count is garbage (an uninitialised count), not hardware.
MAX_PLAUSIBLE_DEVICES = 65536


def is_forked():
    """True in a child of fork() until :func:`paddle_rt.reinitialize_after_fork`."""
    return _forked != 0


cdef int process_forked() noexcept nogil:
    return _forked


def _after_fork_in_child():
    global _forked
    _forked = 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def _package_dir():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bundled_plugin_path():
    """Path of the bundled rt_cpu plugin library."""
    return os.path.join(_package_dir(), "plugins", "librt_cpu.so")


def load_host_symbols():
    """Load paddle_rt's host-symbol library with global visibility (once), so that plugins referencing
    ``profiler_add_runtime_trace_event``/``profiler_add_device_trace_event`` resolve them."""
    global _host_symbols
    if _host_symbols is None:
        import ctypes
        path = os.path.join(_package_dir(), "_core", "libpaddle_rt_host.so")
        _host_symbols = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return _host_symbols


def _version_number(v):
    return v[0] * 10000 + v[1] * 100 + v[2]


cdef class Plugin:
    """A loaded plugin. Created by :func:`load_plugin`; never unloaded."""

    def __cinit__(self):
        self._dl = NULL
        self.iface = NULL
        self._state = 0
        self._pid = 0
        self._lock = threading.RLock()
        self._devices = []
        self._physical_ids = []
        self._fault_slot = -1
        self.bundled = False

    def __init__(self):
        raise TypeError("use paddle_rt.load_plugin(path) to load a plugin")

    def __repr__(self):
        return (f"<paddle_rt.Plugin {self.device_type!r} ({self.sub_device_type}) "
                f"v{'.'.join(map(str, self.version))} from {self.path}>")

    cdef bint has(self, str hook):
        return prt_hook_at(self.iface, _HOOK_OFFSETS[hook]) != NULL

    def has_hook(self, name):
        """Whether the plugin implements the hook ``name`` (a field name of C_DeviceInterface)."""
        if name not in _HOOK_OFFSETS:
            raise errors.InvalidArgument(f"{name!r} is not a hook of the plugin ABI")
        return self.has(name)

    cdef int check_process(self) except -1:
        if _forked:
            raise errors.ForkError(
                f"{self.device_type}: plugins are not fork-safe; this process is a child of fork() "
                f"(call paddle_rt.reinitialize_after_fork() to start the devices afresh in the child)")
        return 0

    cdef int ensure_initialized(self) except -1:
        cdef C_Status st
        cdef size_t count = 0
        cdef size_t* ids
        if self._state == 1:
            return self.check_process()
        with self._lock:
            self.check_process()
            if self._state == 1:
                return 0
            if self._state == 2:
                raise errors.DeviceError(f"{self.device_type}: the plugin was finalized (interpreter shutting down)")
            if self.iface.initialize != NULL:
                with nogil:
                    st = self.iface.initialize()
                if st != C_SUCCESS and st != C_WARNING:
                    raise errors.PluginError(self.device_type, "initialize", st)
            with nogil:
                st = self.iface.get_device_count(&count)
            if st != C_SUCCESS and st != C_WARNING:
                raise errors.PluginError(self.device_type, "get_device_count", st)
            if count > MAX_PLAUSIBLE_DEVICES:
                raise errors.PluginError(self.device_type, "get_device_count", st, returned=f"{count} devices",
                                         detail=f"more than {MAX_PLAUSIBLE_DEVICES} is not a real device count",
                                         plugin=self.device_type)
            ids = <size_t*>calloc(count + 1, sizeof(size_t))
            if ids == NULL:
                raise MemoryError()
            try:
                if count:
                    with nogil:
                        st = self.iface.get_device_list(ids)
                    if st != C_SUCCESS and st != C_WARNING:
                        raise errors.PluginError(self.device_type, "get_device_list", st)
                self._physical_ids = [int(ids[i]) for i in range(count)]
                _tell_fault_handler_devices(self, ids, count)
            finally:
                free(ids)
            self._devices = [None] * count
            self._state = 1
            self._pid = os.getpid()
        return 0

    def device_count(self):
        """Number of devices the plugin reports (initialises the plugin on first use)."""
        self.ensure_initialized()
        return len(self._physical_ids)

    def physical_ids(self):
        self.ensure_initialized()
        return list(self._physical_ids)

    @property
    def initialized(self):
        return self._state == 1

    @property
    def vmm_extension(self):
        """True when the plugin exports the virtual-memory extension (all seven calls of paddle_rt_vmm_ext.h)."""
        return self.vmm.map != NULL

    @property
    def vmm_batched(self):
        """True when the allocator maps and unmaps runs of pages with the extension's optional batched calls
        (paddle_rt_ext_vmm_map_pages / _unmap_pages); otherwise it makes one call per page."""
        return self.vmm.map_pages != NULL

    def _set_vmm_batched(self, bint on):
        """Tests: use (``on``, when exported) or ignore the batched calls, in allocators configured after this."""
        self.vmm.map_pages = NULL
        self.vmm.unmap_pages = NULL
        if on and self.vmm.map != NULL:
            self.vmm.map_pages = <paddle_rt_ext_vmm_map_pages_fn>dlsym(self._dl, b"paddle_rt_ext_vmm_map_pages")
            self.vmm.unmap_pages = <paddle_rt_ext_vmm_unmap_pages_fn>dlsym(self._dl, b"paddle_rt_ext_vmm_unmap_pages")
            if self.vmm.map_pages == NULL or self.vmm.unmap_pages == NULL:
                self.vmm.map_pages = NULL
                self.vmm.unmap_pages = NULL

    def _finalize(self):
        """Call the plugin's finalize (at interpreter exit, after every device was torn down)."""
        cdef C_Status st = C_SUCCESS
        with self._lock:
            if self._state != 1 or _forked:
                self._state = 2
                return
            self._state = 2
            if self.iface.finalize != NULL:
                with nogil:
                    st = self.iface.finalize()
        if st != C_SUCCESS and st != C_WARNING:
            raise errors.PluginError(self.device_type, "finalize", st)

    def _reset_after_fork(self):
        self._state = 0
        self._devices = []
        self._physical_ids = []


cdef Plugin _open_plugin(str path, bint bundled):
    """dlopen + handshake + validation. Raises a PluginLoadError subclass; returns an unregistered Plugin."""
    cdef bytes bpath = os.fsencode(path)
    cdef const char* cpath = bpath
    cdef void* dl
    cdef void* sym
    cdef InitPluginFn init_fn
    cdef CustomRuntimeParams* params
    cdef C_DeviceInterface* iface
    cdef Plugin p
    cdef const char* err
    if not os.path.exists(path):
        raise errors.PluginNotFoundError(path, "no such file")
    if os.path.isdir(path):
        raise errors.NotASharedLibraryError(path, "is a directory, not a shared library")
    load_host_symbols()
    with nogil:
        dl = dlopen(cpath, RTLD_NOW | RTLD_LOCAL)
    if dl == NULL:
        err = dlerror()
        raise errors.NotASharedLibraryError(
            path, "not a loadable shared library: " + (err.decode(errors="replace") if err != NULL else "dlopen failed"))
    dlerror()
    sym = dlsym(dl, b"InitPlugin")
    if sym == NULL:
        dlclose(dl)
        raise errors.MissingEntryPointError(path, "the library does not export InitPlugin")
    init_fn = <InitPluginFn>sym
    params = <CustomRuntimeParams*>calloc(1, PRT_HANDSHAKE_BLOCK)
    iface = <C_DeviceInterface*>calloc(1, PRT_HANDSHAKE_BLOCK)
    if params == NULL or iface == NULL:
        free(params)
        free(iface)
        raise MemoryError()
    params.size = sizeof(CustomRuntimeParams)
    params.interface = iface
    iface.size = sizeof(C_DeviceInterface)
    with nogil:
        init_fn(params)
    try:
        if params.device_type == NULL:
            raise errors.PluginRefusedError(
                path, "InitPlugin did not set device_type (the plugin refused the handshake; check that it was built "
                      "for this ABI version)")
        version = (int(params.version.major), int(params.version.minor), int(params.version.patch))
        number = _version_number(version)
        if number < _HOST_VERSION_NUMBER:
            raise errors.PluginVersionError(
                path,
                f"plugin ABI version {'.'.join(map(str, version))} ({number}) is older than the host's "
                f"{'.'.join(map(str, HOST_VERSION))} ({_HOST_VERSION_NUMBER})",
                plugin_version=version, host_version=HOST_VERSION)
        device_type = params.device_type[:strlen(params.device_type)].decode("utf-8", "replace")
        if not device_type:
            raise errors.PluginRefusedError(path, "InitPlugin set an empty device_type")
        sub = ""
        if params.sub_device_type != NULL:
            sub = params.sub_device_type[:strlen(params.sub_device_type)].decode("utf-8", "replace")
        for name in REQUIRED_HOOKS:
            if prt_hook_at(iface, _HOOK_OFFSETS[name]) == NULL:
                raise errors.MissingHookError(
                    path, f"plugin {device_type!r} does not set the required hook {name}", hook=name)
    except BaseException:
        # The library stays loaded (its InitPlugin ran and may have started threads); only our blocks are freed.
        free(params)
        free(iface)
        raise
    free(params)
    p = Plugin.__new__(Plugin)
    p._dl = dl
    p.iface = iface
    p.path = os.path.realpath(path)
    p.device_type = device_type
    p.sub_device_type = sub
    p.version = version
    p.bundled = bundled
    p.capabilities = tuple(n for n in ALL_HOOKS if prt_hook_at(iface, _HOOK_OFFSETS[n]) != NULL)
    p.missing = tuple(n for n in ALL_HOOKS if prt_hook_at(iface, _HOOK_OFFSETS[n]) == NULL)
    _read_extensions(p)
    return p


ctypedef int (*_ext_host_addressable_fn)() noexcept nogil


cdef int _read_extensions(Plugin p) except -1:
    """paddle_rt's optional plugin extensions (include/paddle_rt/extension.h), from the plugin's own symbols."""
    cdef _ext_host_addressable_fn host = <_ext_host_addressable_fn>dlsym(p._dl, b"paddle_rt_ext_host_addressable")
    cdef int answer = 0
    if host != NULL:
        with nogil:
            answer = host()
    p.host_memory = answer == 1
    p.ext_ccl_comm_error = dlsym(p._dl, b"paddle_rt_ext_ccl_comm_error")
    # the virtual-memory extension (paddle_rt/paddle_rt_vmm_ext.h): used only when all seven calls are exported
    cdef prt_vmm_fns v
    v.granularity = <paddle_rt_ext_vmm_granularity_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_granularity")
    v.reserve = <paddle_rt_ext_vmm_reserve_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_reserve")
    v.free_range = <paddle_rt_ext_vmm_free_range_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_free_range")
    v.create = <paddle_rt_ext_vmm_create_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_create")
    v.release = <paddle_rt_ext_vmm_release_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_release")
    v.map = <paddle_rt_ext_vmm_map_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_map")
    v.unmap = <paddle_rt_ext_vmm_unmap_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_unmap")
    if (v.granularity == NULL or v.reserve == NULL or v.free_range == NULL or v.create == NULL or
            v.release == NULL or v.map == NULL or v.unmap == NULL):
        memset(&v, 0, sizeof(v))
    else:
        # the optional batched calls: both or neither
        v.map_pages = <paddle_rt_ext_vmm_map_pages_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_map_pages")
        v.unmap_pages = <paddle_rt_ext_vmm_unmap_pages_fn>dlsym(p._dl, b"paddle_rt_ext_vmm_unmap_pages")
        if v.map_pages == NULL or v.unmap_pages == NULL:
            v.map_pages = NULL
            v.unmap_pages = NULL
    p.vmm = v
    return 0


def load_plugin(path, *, _bundled=False):
    """Load the plugin at ``path`` and register its device type.

    Loading the same file again returns the same :class:`Plugin`. Raises a :class:`PluginLoadError` subclass naming
    the file and the reason: :class:`PluginNotFoundError`, :class:`NotASharedLibraryError`,
    :class:`MissingEntryPointError`, :class:`PluginVersionError`, :class:`PluginRefusedError`,
    :class:`MissingHookError`, :class:`DuplicateDeviceTypeError`.
    """
    path = os.fspath(path)
    real = os.path.realpath(path)
    with _registry_lock:
        if real in _by_path:
            return _by_path[real]
        p = _open_plugin(path, _bundled)
        other = _by_type.get(p.device_type)
        if other is not None:
            raise errors.DuplicateDeviceTypeError(
                path, f"device type {p.device_type!r} is already registered by {other.path}",
                device_type=p.device_type)
        _by_type[p.device_type] = p
        _by_path[real] = p
        _watch_for_faults(p)
        return p


# ---------------------------------------------------------------------------------------------------------------------
# Fatal signals inside hooks (fault_handler.c, in libpaddle_rt_host.so: one copy per process)

ctypedef int (*_fault_install_fn)() noexcept nogil
ctypedef int (*_fault_register_fn)(const char* name, const char* path, C_DeviceInterface* iface,
                                   const char* const* names, const size_t* offsets, size_t n) noexcept nogil
ctypedef void (*_fault_set_devices_fn)(int slot, const int64_t* ids, size_t n) noexcept nogil


def fault_handler_enabled():
    """Whether paddle_rt names the plugin, hook and device of a fatal signal (``PADDLE_RT_FAULT_HANDLER=0``: no)."""
    return os.environ.get("PADDLE_RT_FAULT_HANDLER", "1").strip() not in ("0", "off", "false", "no")


cdef int _watch_for_faults(Plugin p) except -1:
    """Install the fatal-signal handler (once) and register ``p``'s hooks with it."""
    cdef const char** names
    cdef size_t* offsets
    cdef size_t i
    cdef _fault_install_fn install
    cdef _fault_register_fn register
    p._fault_slot = -1
    if not fault_handler_enabled():
        return 0
    load_host_symbols()
    install = <_fault_install_fn>dlsym(RTLD_DEFAULT, b"paddle_rt_fault_install")
    register = <_fault_register_fn>dlsym(RTLD_DEFAULT, b"paddle_rt_fault_register")
    if install == NULL or register == NULL:
        return 0
    names = <const char**>calloc(prt_n_hooks, sizeof(char*))
    offsets = <size_t*>calloc(prt_n_hooks, sizeof(size_t))
    if names == NULL or offsets == NULL:
        free(names)
        free(offsets)
        raise MemoryError()
    for i in range(prt_n_hooks):
        names[i] = prt_hooks[i].name
        offsets[i] = prt_hooks[i].offset
    bname = p.device_type.encode()
    bpath = os.fsencode(p.path)
    install()
    p._fault_slot = register(bname, bpath, p.iface, names, offsets, prt_n_hooks)
    free(names)
    free(offsets)
    return 0


cdef int _tell_fault_handler_devices(Plugin p, size_t* ids, size_t count) except -1:
    cdef _fault_set_devices_fn set_devices
    cdef int64_t* ids64
    cdef size_t i
    if p._fault_slot < 0:
        return 0
    set_devices = <_fault_set_devices_fn>dlsym(RTLD_DEFAULT, b"paddle_rt_fault_set_devices")
    if set_devices == NULL:
        return 0
    ids64 = <int64_t*>calloc(count + 1, sizeof(int64_t))
    if ids64 == NULL:
        raise MemoryError()
    for i in range(count):
        ids64[i] = <int64_t>ids[i]
    set_devices(p._fault_slot, ids64, count)
    free(ids64)
    return 0


def list_plugins():
    """The loaded plugins, in load order."""
    with _registry_lock:
        return list(_by_type.values())


def device_types():
    """The registered device types, in load order."""
    with _registry_lock:
        return list(_by_type)


def get_plugin(device_type):
    try:
        return _by_type[device_type]
    except KeyError:
        raise errors.DeviceError(
            f"unknown device type {device_type!r} (registered: {', '.join(_by_type) or 'none'})") from None


def _candidates_in_folder(folder):
    """Paddle's discovery rule: every regular file directly in ``folder`` whose name ends in '.so'."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        warnings.warn(f"paddle_rt: cannot list plugin folder {folder}: {exc}", RuntimeWarning, stacklevel=3)
        return []
    return [os.path.join(folder, n) for n in names
            if n.endswith(".so") and os.path.isfile(os.path.join(folder, n))]


def discover(environ=None):
    """Load the bundled rt_cpu (unless PADDLE_RT_NO_RT_CPU=1), every ``*.so`` in $CUSTOM_DEVICE_ROOT, then the files
    or folders in $PADDLE_RT_PLUGIN_PATH. A plugin that fails warns and is skipped. Returns the plugins loaded."""
    env = os.environ if environ is None else environ
    found = []
    candidates = []
    if env.get("PADDLE_RT_NO_RT_CPU", "") in ("", "0"):
        candidates.append((bundled_plugin_path(), True))
    root = env.get("CUSTOM_DEVICE_ROOT", "")
    if root:
        candidates += [(c, False) for c in _candidates_in_folder(root)]
    for entry in filter(None, env.get("PADDLE_RT_PLUGIN_PATH", "").split(os.pathsep)):
        if os.path.isdir(entry):
            candidates += [(c, False) for c in _candidates_in_folder(entry)]
        else:
            candidates.append((entry, False))
    for path, bundled in candidates:
        try:
            p = load_plugin(path, _bundled=bundled)
        except errors.PluginLoadError as exc:
            warnings.warn(f"paddle_rt: skipped plugin {path}: {exc.reason}", RuntimeWarning, stacklevel=2)
            continue
        if p not in found:
            found.append(p)
    with _registry_lock:
        _discovered.extend(p for p in found if p not in _discovered)
    return found


def discovered_plugins():
    """The plugins found by discovery at import (not those loaded later with :func:`load_plugin`)."""
    with _registry_lock:
        return list(_discovered)


def _reset_after_fork():
    global _forked
    for p in list_plugins():
        p._reset_after_fork()
    _forked = 0
