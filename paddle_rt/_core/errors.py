"""Exception types of paddle_rt. Every error names the device (or plugin file), the call and the reason."""

__all__ = [
    "PaddleRTError", "PluginLoadError", "PluginNotFoundError", "NotASharedLibraryError", "MissingEntryPointError",
    "PluginVersionError", "PluginRefusedError", "MissingHookError", "DuplicateDeviceTypeError",
    "PluginError", "OutOfMemoryError", "InvalidArgument", "DeviceError", "NotSupportedError", "StreamError",
    "StreamInvalidArgument", "StreamOutOfMemoryError", "StreamNotSupportedError", "stream_error_type",
    "ForkError", "CollectiveError", "CollectiveTimeout", "STATUS_NAMES",
]

STATUS_NAMES = {0: "C_SUCCESS", 1: "C_WARNING", 2: "C_FAILED", 3: "C_ERROR", 4: "C_INTERNAL_ERROR"}


def _keep(exc, **details):
    """The details an error carries, as attributes users read (``exc.device``, ``exc.requested``, ...)."""
    for name, value in details.items():
        setattr(exc, name, value)


class PaddleRTError(RuntimeError):
    """Base class of every paddle_rt error."""


# -- loading plugins -------------------------------------------------------------------------------------------------
class PluginLoadError(PaddleRTError):
    """A plugin could not be loaded. ``path`` is the file, ``reason`` what went wrong; the message ends with what to
    do next (the class's ``next_step``)."""
    next_step = "`paddle-rt check FILE` runs each check of a plugin on its own and says which one fails"

    def __init__(self, path, reason):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot load plugin {self.path}: {reason}; {self.next_step}")


class PluginNotFoundError(PluginLoadError, FileNotFoundError):
    next_step = ("give the path of the plugin's shared library (the .so file its build produced; "
                 "paddle_rt.list_plugins() shows the plugins already loaded)")


class NotASharedLibraryError(PluginLoadError):
    next_step = ("give the plugin's compiled shared library (a .so built with -shared -fPIC for this machine), "
                 "not a source, archive or data file")


class MissingEntryPointError(PluginLoadError):
    next_step = ("a plugin exports `void InitPlugin(CustomRuntimeParams*)` as Paddle's device_ext.h declares "
                 "(paddle_rt.get_include()); check the library is the plugin and not one of its dependencies")


class PluginVersionError(PluginLoadError):
    def __init__(self, path, reason, plugin_version=None, host_version=None):
        self.plugin_version = plugin_version
        self.host_version = host_version
        super().__init__(path, reason)


class PluginRefusedError(PluginLoadError):
    pass


class MissingHookError(PluginLoadError):
    def __init__(self, path, reason, hook=None):
        self.hook = hook
        super().__init__(path, reason)


class DuplicateDeviceTypeError(PluginLoadError):
    def __init__(self, path, reason, device_type=None):
        self.device_type = device_type
        super().__init__(path, reason)


# -- using devices ---------------------------------------------------------------------------------------------------
class PluginError(PaddleRTError):
    """A plugin call returned a status other than success, or reported success but returned something unusable.
    ``device`` (e.g. ``"rt_cpu:0"``), ``call`` (the hook's name) and ``status`` (the C_Status value) say which;
    ``returned`` (e.g. ``"a NULL pointer"``) is set in the second case, with ``plugin`` (the plugin's name)."""

    def __init__(self, device, call, status, detail=None, returned=None, plugin=None):
        self.device = device
        self.call = call
        self.status = int(status) if status is not None else None
        self.status_name = STATUS_NAMES.get(self.status, str(self.status))
        self.returned = returned
        self.plugin = plugin
        if returned is not None:
            who = f"plugin {plugin!r} " if plugin else ""
            msg = f"{device}: {who}{call} reported {self.status_name} but returned {returned}"
        else:
            msg = f"{device}: {call} failed with {self.status_name}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class OutOfMemoryError(PaddleRTError, MemoryError):
    """The device could not satisfy an allocation. Carries ``device``, ``requested``, ``allocated``, ``reserved``,
    ``capacity`` and ``free`` (bytes; ``None`` where unknown)."""

    def __init__(self, message, device=None, requested=None, allocated=None, reserved=None, capacity=None,
                 free=None, call="malloc"):
        _keep(self, device=device, call=call, requested=requested, allocated=allocated, reserved=reserved,
              capacity=capacity, free=free)
        super().__init__(message)


class InvalidArgument(PaddleRTError, ValueError):
    """A call was given something it cannot use (a foreign pointer, a double free, a bad size, a wrong device...)."""


class DeviceError(PaddleRTError, ValueError):
    """A device string or index that names no device."""


class NotSupportedError(PaddleRTError, NotImplementedError):
    """The plugin lacks the hook a call needs and paddle_rt has no fallback for it."""


class StreamError(PaddleRTError):
    """Work on a stream failed (an exception in a host callback, a plugin error in asynchronous work). When the
    failure is one of paddle_rt's typed errors found on the stream (an operator's input checked only when it ran:
    an embedding id, a rope position, a kv_caching length), the exception raised is also an instance of that type
    (:func:`stream_error_type`): ``except InvalidArgument`` catches it as it would the synchronous error."""


class StreamInvalidArgument(StreamError, InvalidArgument):
    """An operator's input error found when it ran on the stream (raised at the next synchronize or numpy())."""


class StreamOutOfMemoryError(StreamError, OutOfMemoryError):
    """An allocation made by work on a stream failed (raised at the next synchronize)."""

    def __init__(self, message, **kwargs):
        OutOfMemoryError.__init__(self, message, **kwargs)


class StreamNotSupportedError(StreamError, NotSupportedError):
    """Work on a stream needed something the device does not support (raised at the next synchronize)."""


_STREAM_TYPES = {InvalidArgument: StreamInvalidArgument, OutOfMemoryError: StreamOutOfMemoryError,
                 NotSupportedError: StreamNotSupportedError}


def stream_error_type(cause):
    """The exception type a stream raises for `cause`, an error of asynchronous work: StreamError and, for
    InvalidArgument, OutOfMemoryError and NotSupportedError (and their subclasses), that type too."""
    for typ in type(cause).__mro__:
        if typ in _STREAM_TYPES:
            return _STREAM_TYPES[typ]
    return StreamError


class ForkError(PaddleRTError):
    """A device was used in a child process after fork() without re-initialisation."""


class CollectiveError(PaddleRTError):
    """A collective failed: the communicator was destroyed or is in error, the plugin refused the call, the ranks'
    arguments differ, or peers did not join in time. ``collective`` (e.g. ``"all_reduce"``), ``device``, ``rank``,
    ``nranks``, ``seq`` (the communicator's n-th collective) and ``missing_ranks`` (ranks that had not joined, or
    None when unknown) say which."""

    def __init__(self, message, collective=None, device=None, rank=None, nranks=None, seq=None, missing_ranks=None):
        _keep(self, collective=collective, device=device, rank=rank, nranks=nranks, seq=seq,
              missing_ranks=missing_ranks)
        super().__init__(message)


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A wait for a collective gave up before its peers joined (``missing_ranks`` names them)."""


class ProfilerError(PaddleRTError):
    """Misuse of paddle_rt.profiler: a second profiler while one runs, stop() or an export at the wrong time."""
