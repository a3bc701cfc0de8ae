"""paddle_rt: a fast, safe device runtime for any PaddlePaddle custom-device plugin.

Load a plugin written against Paddle's custom-device C ABI (``device_ext.h``) and get a best-fit caching allocator,
ordered streams with host callbacks, timed events, stream-ordered memory, copies and collectives. The bundled
``rt_cpu`` plugin is a virtual accelerator, so everything runs on a plain CPU machine.
"""
import os as _os

from paddle_rt._core.errors import (
    PaddleRTError, PluginLoadError, PluginNotFoundError, NotASharedLibraryError, MissingEntryPointError,
    PluginVersionError, PluginRefusedError, MissingHookError, DuplicateDeviceTypeError, PluginError,
    OutOfMemoryError, InvalidArgument, DeviceError, NotSupportedError, StreamError, ForkError, CollectiveError,
    CollectiveTimeout, ProfilerError, StreamInvalidArgument, StreamOutOfMemoryError, StreamNotSupportedError,
)


def _unbuilt_run_as_main(folder, missing):
    """``python -m paddle_rt ...`` from a checkout that was never built: one line on stderr naming the command that
    works (the installed ``paddle-rt`` with the same arguments) and exit status 2, not an import traceback."""
    import sys
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" not in argv[:-1] or argv[argv.index("-m") + 1] not in ("paddle_rt", "paddle_rt.__main__"):
        return
    args = " ".join(argv[argv.index("-m") + 2:])
    sys.stderr.write(f"python -m paddle_rt: {folder} is paddle_rt's source folder without its compiled core "
                     f"({missing}), found first because -m puts the current folder on sys.path: run the installed "
                     f"command `paddle-rt{' ' + args if args else ''}` here, or build the checkout in place first "
                     f"(`python setup.py build_ext --inplace`)\n")
    raise SystemExit(2)


try:
    from paddle_rt._core.plugin import (
        Plugin, load_plugin, list_plugins, device_types, REQUIRED_HOOKS, ALL_HOOKS,
    )
except ModuleNotFoundError as _exc:
    if not (_exc.name or "").startswith("paddle_rt._core"):
        raise
    # The compiled core is missing: this is a source checkout that was never built, found before the installed
    # package (``python -m`` puts the current folder first on sys.path).
    _unbuilt_run_as_main(_os.path.dirname(_os.path.abspath(__file__)), _exc.name)
    raise ImportError(
        f"paddle_rt was imported from {_os.path.dirname(_os.path.abspath(__file__))}, a source folder whose "
        f"compiled core is missing ({_exc.name}). Run the installed package from another folder, use the "
        "`paddle-rt` command (`paddle-rt demo`), or build the checkout in place first "
        "(`python setup.py build_ext --inplace`).") from None
from paddle_rt._core.device import (
    Device, device, devices, device_count, get_device, set_device, synchronize, reinitialize_after_fork,
)
from paddle_rt._core import plugin as _plugin

__version__ = "0.1.0"


def get_include():
    """The folder holding ``paddle_rt/device_ext.h`` (add it to a plugin's or a C extension's include path). A C++
    extension that cimports paddle_rt's ``.pxd`` files needs every folder of :func:`get_include_dirs` (this one
    included) and the package's parent on Cython's include path (:func:`get_cython_include`)."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "include")


def get_include_dirs():
    """Every folder a C++ extension that cimports paddle_rt's ``.pxd`` files needs on its include path: the folder of
    ``get_include()`` and the package's ``_core`` folder (the ``engine/`` headers the ``.pxd`` files include)."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    return [get_include(), _os.path.join(here, "_core")]


def get_cython_include():
    """The folder to put on Cython's include path to ``cimport paddle_rt._core...``."""
    return _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))


_plugin.discover()

from paddle_rt.memory import *  # noqa: E402,F401,F403
from paddle_rt.streams import *  # noqa: E402,F401,F403
from paddle_rt.pool import *  # noqa: E402,F401,F403
from paddle_rt import memory as _memory, streams as _streams, pool as _pool  # noqa: E402
from paddle_rt import ccl  # noqa: E402,F401  (paddle_rt.ccl: communicators and collectives)
from paddle_rt import profiler  # noqa: E402,F401  (paddle_rt.profiler.profile(): Chrome traces, key averages)
from paddle_rt._core.tensor import Tensor, empty, zeros, tensor, as_strided  # noqa: E402,F401
from paddle_rt import op, ops  # noqa: E402,F401  (the operator layer and the ops on tensors)
from paddle_rt import plugins  # noqa: E402,F401  (paddle_rt.plugins.rt_cpu_path() and rt_cpu's bookkeeping)

__all__ = [
    "PaddleRTError", "PluginLoadError", "PluginNotFoundError", "NotASharedLibraryError", "MissingEntryPointError",
    "PluginVersionError", "PluginRefusedError", "MissingHookError", "DuplicateDeviceTypeError", "PluginError",
    "OutOfMemoryError", "InvalidArgument", "DeviceError", "NotSupportedError", "StreamError", "ForkError",
    "CollectiveError", "CollectiveTimeout", "ProfilerError",
    "StreamInvalidArgument", "StreamOutOfMemoryError", "StreamNotSupportedError",
    "Plugin", "load_plugin", "list_plugins", "device_types", "REQUIRED_HOOKS", "ALL_HOOKS",
    "Device", "device", "devices", "device_count", "get_device", "set_device", "synchronize",
    "reinitialize_after_fork", "get_include", "get_include_dirs", "get_cython_include", "ccl", "profiler",
    "Tensor", "empty", "zeros", "tensor", "as_strided", "op", "ops", "plugins",
] + list(_memory.__all__) + list(_streams.__all__) + list(_pool.__all__)
