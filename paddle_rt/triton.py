"""Triton kernels (and NineToothed's) on paddle_rt tensors, in stream order.

``launch(kernel, grid, *args, stream=None, **meta)`` runs a ``@triton.jit`` kernel with paddle_rt :class:`Tensor`
arguments (ints, floats, bools and None pass through) as one operation of ``stream`` (default: the current stream of
the tensors' device): it runs after everything submitted to the stream before it and before everything after, and its
tensors are recorded on the stream as an operator's operands are (a tensor's ``numpy()``/``synchronize()`` waits for
the kernel; its memory is not reused before the kernel ran). ``launch`` returns at once; an exception the kernel raises
is re-raised as :class:`~paddle_rt.StreamError` by the stream's next ``synchronize()``, and the stream keeps working.

Where it runs: on host-addressable devices (rt_cpu) in Triton's interpreter, on zero-copy torch views of the tensors'
memory, whatever ``TRITON_INTERPRET`` says: a kernel decorated without it (a compiled-kernel ``JITFunction``) is run
through ``triton.runtime.interpreter.InterpretedFunction`` of its Python function. The interpreter runs the programs
of the grid one after another, each vectorised over its block with numpy: right for checking a kernel meant for a real
device, or for prototyping one, and hundreds of times slower than paddle_rt's own host kernels (``paddle-rt bench``).
On a device whose memory the host cannot address, ``launch`` needs a compiled Triton backend for the device type:
:func:`register_backend` is the seam for a vendor's; without one it raises :class:`~paddle_rt.NotSupportedError`.

:func:`make_ninetoothed` generates a NineToothed kernel here, without a GPU driver; ``launch(nt_kernel, None,
*tensors)`` runs it through the launcher NineToothed generated. ``paddle_rt.op.register_triton`` makes a Triton kernel
the kernel of one of paddle_rt's operators (:func:`register_op`).

Needs the ``triton`` extra: PyTorch's CPU wheel first (docs/installation.md, "PyTorch's CPU wheel", has the command),
then ``pip install 'paddle_rt[triton]'`` (triton, ninetoothed).
"""
import ast
import ctypes
import importlib.util
import inspect
import numbers
import threading

import numpy as np

from paddle_rt._core import errors
from paddle_rt._core import op as _op
from paddle_rt._core.tensor import Tensor
from paddle_rt._core.stream import Stream, current_stream
from paddle_rt._core.device import device as _device

try:
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.autotuner import Autotuner, Heuristics
except ImportError as _exc:        # the optional extra is missing
    raise ImportError(
        f"paddle_rt.triton needs triton and torch ({_exc}). Install the CPU build of torch first, then the extra: "
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && "
        "pip install 'paddle_rt[triton]'") from _exc

try:      # imported lazily by Triton's argument mangling; its import must see triton.language's own @jit functions
    import triton.experimental.gluon  # noqa: F401
except ImportError:
    pass

__all__ = ["launch", "register_backend", "unregister_backend", "backends", "register_op", "make_ninetoothed",
           "NineToothedKernel", "interpreted"]

# Triton's launch options: accepted by launch() like by kernel[grid](...), and meaningless to the interpreter.
LAUNCH_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "maxnreg", "launch_pdl",
                            "launch_cooperative_grid", "debug", "instrumentation_mode"})

# The interpreter patches triton.language process-wide while a kernel runs: one interpreted kernel at a time.
_INTERPRETER = threading.RLock()
_interpreted = {}         # id(JITFunction) -> (JITFunction, InterpretedFunction)
_backends = {}            # device type -> backend
_op_kernels = []          # the ctypes kernels of register_op (live as long as the process: descriptors keep them)


# ---- the kernel: what runs it ---------------------------------------------------------------------------------------
def interpreted(kernel):
    """The interpreter's version of ``kernel`` (a ``@triton.jit`` function): an ``InterpretedFunction`` of its Python
    function, made once per kernel. With ``TRITON_INTERPRET=1`` set before the decorator ran it is the kernel itself."""
    if not isinstance(kernel, (JITFunction, InterpretedFunction)):
        raise errors.InvalidArgument(f"paddle_rt.triton: kernel must be a @triton.jit function, not "
                                     f"{type(kernel).__name__}")
    entry = _interpreted.get(id(kernel))
    if entry is None or entry[0] is not kernel:
        fn = kernel if isinstance(kernel, InterpretedFunction) else InterpretedFunction(kernel.fn)
        _constexpr_annotations(fn.rewrite())
        entry = _interpreted[id(kernel)] = (kernel, fn)
    return entry[1]


def _constexpr_annotations(fn):
    """The interpreter re-executes a kernel's source with string annotations and knows a constexpr parameter only by
    ``constexpr``/``tl.constexpr``; spell ``triton.language.constexpr`` (NineToothed's generated kernels) its way."""
    notes = getattr(fn, "__annotations__", None) or {}
    for name, note in list(notes.items()):
        if isinstance(note, str) and note.split(".")[-1] == "constexpr":
            notes[name] = "constexpr"


class _Kernel:
    """A launchable kernel: the @triton.jit function under its autotune/heuristics wrappers."""

    def __init__(self, kernel):
        self.wrappers = []
        k = kernel
        while isinstance(k, (Autotuner, Heuristics)):
            self.wrappers.append(k)
            k = k.fn
        if not isinstance(k, (JITFunction, InterpretedFunction)):
            raise errors.InvalidArgument(
                f"paddle_rt.triton: kernel must be a @triton.jit function (optionally under @triton.autotune or "
                f"@triton.heuristics) or a NineToothedKernel, not {type(kernel).__name__}")
        self.jit = k
        self.fn = k.fn
        self.name = self.fn.__name__
        self.signature = inspect.signature(self.fn)
        notes = inspect.get_annotations(self.fn)
        self.constexprs = {n for n, a in notes.items()
                           if a is tl.constexpr or (isinstance(a, str) and a.split(".")[-1] == "constexpr")}

    def bind(self, args, meta):
        """{parameter: value} of a launch; meta's launch options are dropped, the wrappers' parameters may be left
        out (an autotuned kernel's configs give them). Raises InvalidArgument naming what is wrong."""
        meta = {k: v for k, v in meta.items() if k not in LAUNCH_OPTIONS}
        tuned = set()
        for w in self.wrappers:
            if isinstance(w, Autotuner):
                for c in w.configs:
                    tuned.update(c.kwargs)
            else:
                tuned.update(w.values)
        try:
            bound = self.signature.bind_partial(*args, **meta)
        except TypeError as exc:
            raise errors.InvalidArgument(f"paddle_rt.triton: kernel {self.name}: {exc}") from None
        missing = [p.name for p in self.signature.parameters.values()
                   if p.name not in bound.arguments and p.default is inspect.Parameter.empty and p.name not in tuned]
        if missing:
            raise errors.InvalidArgument(f"paddle_rt.triton: kernel {self.name}: missing argument(s) "
                                         f"{', '.join(repr(m) for m in missing)}")
        return dict(bound.arguments)

    def run(self, grid, values):
        """Run in the interpreter (on the stream's worker): values are the bound arguments, tensors as torch views."""
        values = dict(values)
        for w in reversed(self.wrappers):
            if isinstance(w, Heuristics):
                for name, fn in w.values.items():
                    if name not in values:
                        values[name] = fn(values)
            else:
                for name, v in _interpreter_config(w.configs, grid, values).kwargs.items():
                    values.setdefault(name, v)
        with _INTERPRETER, _device_functions_interpreted(self.fn):
            interpreted(self.jit).run(grid=grid, warmup=False, **values)


class _device_functions_interpreted:
    """While a kernel runs in the interpreter, the @triton.jit functions it may call are their interpreted versions, as
    if they had been decorated under TRITON_INTERPRET=1 (restored after): those named by the globals of its module,
    of the modules it names (``triton.language``'s own @jit functions: ``tl.zeros``, ``tl.sum``...), and of the
    modules of the functions found, transitively. Held under _INTERPRETER."""

    def __init__(self, fn):
        self.fn = fn
        self.swapped = []

    def __enter__(self):
        seen = set()
        todo = [self.fn.__globals__, vars(tl)]
        todo += [vars(m) for m in list(self.fn.__globals__.values()) if inspect.ismodule(m)]
        while todo:
            g = todo.pop()
            if id(g) in seen:
                continue
            seen.add(id(g))
            for key, value in list(g.items()):
                if isinstance(value, JITFunction):
                    self.swapped.append((g, key, value))
                    g[key] = interpreted(value)
                    todo.append(value.fn.__globals__)
        return self

    def __exit__(self, *exc):
        for g, key, value in reversed(self.swapped):
            g[key] = value
        self.swapped.clear()


def _programs(grid, values):
    g = grid(values) if callable(grid) else grid
    n = 1
    for x in g:
        n *= int(x)
    return n


def _interpreter_config(configs, grid, values):
    """Which of an autotuned kernel's configs the interpreter runs (it has no timings to tune by): the one with the
    fewest programs, since the interpreter runs them one after another, each vectorised over its block."""
    def programs(c):
        try:
            return _programs(grid, {**c.kwargs, **values})
        except Exception:
            return float("inf")
    return min(configs, key=programs)


# ---- the arguments -------------------------------------------------------------------------------------------------
def _check_value(kernel_name, name, value, constexpr):
    """InvalidArgument naming the argument when it is of a kind a launch cannot pass."""
    if isinstance(value, Tensor):
        if constexpr:
            raise errors.InvalidArgument(f"paddle_rt.triton: kernel {kernel_name}: argument {name!r} is a "
                                         f"tl.constexpr parameter; a Tensor cannot be one")
        return
    if value is None or isinstance(value, (bool, numbers.Integral, numbers.Real, tl.dtype, tl.constexpr)):
        return
    if constexpr and isinstance(value, (str, tuple)):
        return
    if isinstance(value, torch.Tensor) or isinstance(value, np.ndarray):
        hint = ("pass a paddle_rt Tensor (paddle_rt.tensor(array)): the kernel works on memory ordered on paddle_rt "
                "streams")
    else:
        hint = "pass paddle_rt Tensors, ints, floats, bools or None"
    raise errors.InvalidArgument(f"paddle_rt.triton: kernel {kernel_name}: argument {name!r} is a "
                                 f"{type(value).__module__}.{type(value).__qualname__}; {hint}")


def _check_grid(kernel_name, grid):
    if callable(grid):
        return
    if isinstance(grid, (tuple, list)) and 1 <= len(grid) <= 3 and all(
            isinstance(g, numbers.Integral) and not isinstance(g, bool) and g >= 0 for g in grid):
        return
    raise errors.InvalidArgument(f"paddle_rt.triton: kernel {kernel_name}: grid must be a tuple of 1 to 3 ints >= 0 "
                                 f"or a callable of the meta-parameters, not {grid!r}")


def _layout(t):
    """What the worker needs of a Tensor to view it (no reference to the Tensor: its memory is kept by the stream
    order, as an operator's operands are)."""
    return (t.data_ptr, t.shape, t.strides, t.dtype)


def _torch_view(data, shape, strides, dtype, what):
    """A torch tensor over paddle_rt memory without a copy (host-addressable devices)."""
    if any(s < 0 for s in strides):
        raise errors.InvalidArgument(f"paddle_rt.triton: {what} has negative strides {strides}; torch views cannot "
                                     f"represent them (pass a contiguous() copy)")
    bf16 = dtype == "bfloat16"
    np_dtype = np.dtype("<u2" if bf16 else dtype)
    if 0 in shape:
        arr = np.empty(shape, np_dtype)
    else:
        holder = _Memory({"data": (data, False), "shape": tuple(shape), "typestr": np_dtype.str, "version": 3,
                          "strides": tuple(s * np_dtype.itemsize for s in strides)})
        arr = np.asarray(holder)
    view = torch.from_dlpack(arr) if arr.flags.writeable else torch.from_numpy(arr)
    return view.view(torch.bfloat16) if bf16 else view


class _Memory:
    """Raw memory with numpy's array interface (the view's owner: owns nothing)."""
    __slots__ = ("__array_interface__",)

    def __init__(self, iface):
        self.__array_interface__ = iface


# ---- launching -----------------------------------------------------------------------------------------------------
def _device_of(tensors, stream, kernel_name):
    devices = {t.device for _, t in tensors}
    if len(devices) > 1:
        where = ", ".join(f"{n!r} on {t.device}" for n, t in tensors)
        raise errors.InvalidArgument(f"paddle_rt.triton: kernel {kernel_name}: tensors on several devices ({where})")
    if stream is not None and not isinstance(stream, Stream):
        raise errors.InvalidArgument(f"paddle_rt.triton: kernel {kernel_name}: stream must be a paddle_rt Stream, not "
                                     f"{type(stream).__name__}")
    if devices:
        dev = devices.pop()
        if stream is not None and stream.device is not dev:
            raise errors.InvalidArgument(f"paddle_rt.triton: kernel {kernel_name}: stream {stream.name} is on "
                                         f"{stream.device}, the tensors on {dev}")
        return dev
    return stream.device if stream is not None else current_stream().device


def _where(dev, kernel_name):
    """The backend for dev's type, None for the interpreter; NotSupportedError when there is neither."""
    backend = _backends.get(dev.type)
    if backend is not None:
        return backend
    if dev.host_addressable:
        return None
    raise errors.NotSupportedError(
        f"{dev}: paddle_rt.triton: kernel {kernel_name}: the device's memory is not host-addressable, so Triton's "
        f"interpreter cannot run on it, and no compiled Triton backend is registered for device type {dev.type!r} "
        f"(paddle_rt.triton.register_backend({dev.type!r}, backend))")


class _Run:
    """One launch, run on the stream's worker (a stream callback: its exception is the stream's error)."""

    def __init__(self, label, fn):
        self.label = label
        self.fn = fn

    def __call__(self):
        self.fn()

    def __str__(self):
        return self.label


def launch(kernel, grid, *args, stream=None, **meta):
    """Enqueue ``kernel[grid](*args, **meta)`` on ``stream`` (default: the current stream of the tensors' device)
    with paddle_rt Tensor arguments; returns the operation's position on the stream. ``kernel``: a ``@triton.jit``
    function (also under ``@triton.autotune``, whose config with the fewest programs the interpreter runs, or
    ``@triton.heuristics``), or a :class:`NineToothedKernel` (``grid`` None: its launcher computes it). ``meta``:
    the kernel's ``tl.constexpr`` values; Triton's launch options (``num_warps``...) are accepted and ignored by the
    interpreter."""
    if isinstance(kernel, NineToothedKernel):
        return kernel._launch(grid, args, stream, meta)
    k = _Kernel(kernel)
    _check_grid(k.name, grid)
    values = k.bind(args, meta)
    tensors = []
    for name, value in values.items():
        _check_value(k.name, name, value, name in k.constexprs)
        if isinstance(value, Tensor):
            tensors.append((name, value))
    dev = _device_of(tensors, stream, k.name)
    s = stream if stream is not None else current_stream(dev)
    backend = _where(dev, k.name)
    if backend is not None:
        def run():
            backend(kernel, grid, values, s)
    else:
        layouts = {name: _layout(t) for name, t in tensors}
        plain = {name: v for name, v in values.items() if name not in layouts}   # no Tensor kept by the closure

        def run():
            views = {name: _torch_view(*layouts[name], f"kernel {k.name}: argument {name!r}") for name in layouts}
            k.run(grid, {**plain, **views})
    return _enqueue(s, _Run(f"Triton kernel {k.name}", run), [t for _, t in tensors], k.name)


def _enqueue(s, run, tensors, name):
    pos = s.add_callback(run)
    _op._record_python_launch(s, pos, tensors, f"triton:{name}")
    return pos


# ---- backends ------------------------------------------------------------------------------------------------------
def register_backend(device_type, backend):
    """Make ``backend`` run :func:`launch`'s kernels on devices of ``device_type`` (the seam for a vendor's compiled
    Triton backend; paddle_rt ships none). It is called on the stream's worker, in stream order, as
    ``backend(kernel, grid, args, stream)``: ``kernel`` as given to launch, ``args`` {parameter: value} with
    paddle_rt Tensors as they are (``data_ptr`` is the device address), ``stream`` the paddle_rt Stream (its
    ``handle`` is the plugin's stream). paddle_rt counts the operation complete when the call returns, so a backend
    that launches asynchronously on the plugin's stream synchronizes it before returning. An exception it raises is
    the stream's error (StreamError at the next synchronize). A backend takes precedence over the interpreter."""
    if not isinstance(device_type, str) or not device_type:
        raise errors.InvalidArgument(f"register_backend: device_type must be a device type name (str), not "
                                     f"{device_type!r}")
    if not callable(backend):
        raise errors.InvalidArgument(f"register_backend({device_type!r}): backend must be callable as "
                                     f"backend(kernel, grid, args, stream), not {type(backend).__name__}")
    _backends[device_type] = backend


def unregister_backend(device_type):
    """Remove the backend of ``device_type`` (no error when there is none)."""
    _backends.pop(device_type, None)


def backends():
    """{device type: backend} registered with :func:`register_backend`."""
    return dict(_backends)


# ---- kernels of operators ------------------------------------------------------------------------------------------
_KERNEL_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_C_ERROR = 3


def register_op(op_name, device_type, dtype, kernel, grid_fn):
    """``paddle_rt.op.register_triton``: make the Triton ``kernel`` the kernel of operator ``op_name`` for
    ``dtype`` on devices of ``device_type`` (host-addressable: it runs in the interpreter). The operator's descriptors
    check their operands as always; then each call runs, on the stream in order, ``grid, args[, meta] =
    grid_fn(out, *inputs, attrs=attrs)`` and ``kernel[grid](*args, **meta)``, with ``out`` and ``inputs`` torch views
    of the operands in the layouts the descriptor gives the kernel (e.g. inputs broadcast to out's shape: stride 0)
    and ``attrs`` the operator's attributes (a tuple of floats, e.g. layer_norm's eps first). It takes precedence
    like ``paddle_rt.op.register_kernel`` (over the plugin's and paddle_rt's host kernels; existing descriptors, ops'
    cached ones included, pick it at their next call); ``paddle_rt.op.unregister_kernel`` removes it. An exception in
    grid_fn or the kernel is re-raised as StreamError by the stream's next synchronize."""
    k = _Kernel(kernel)
    if not callable(grid_fn):
        raise errors.InvalidArgument(f"register_triton({op_name!r}): grid_fn must be callable as "
                                     f"grid_fn(out, *inputs, attrs=attrs), not {type(grid_fn).__name__}")
    try:
        dev = _device(f"{device_type}:0")
    except errors.PaddleRTError as exc:
        raise errors.InvalidArgument(f"register_triton({op_name!r}, {device_type!r}): no device of that type is "
                                     f"loaded ({exc})") from None
    if not dev.host_addressable:
        raise errors.NotSupportedError(
            f"{dev}: register_triton({op_name!r}): the device type's memory is not host-addressable, so Triton's "
            f"interpreter cannot run its operators; a vendor's compiled kernels go in through "
            f"paddle_rt.op.register_kernel or the plugin's paddle_rt_ext_register_kernels")

    def run(address):
        try:
            _, _, out, inputs, attrs = _op._python_kernel_call(address)
            out_v = _torch_view(*out, f"operator {op_name}: out")
            in_v = [_torch_view(*x, f"operator {op_name}: input {i}") for i, x in enumerate(inputs)]
            grid, args, meta = _grid_fn_result(op_name, grid_fn(out_v, *in_v, attrs=attrs))
            _check_grid(k.name, grid)
            k.run(grid, k.bind(args, meta))
            return 0
        except BaseException as exc:
            _op._python_kernel_raised(exc)
            return _C_ERROR

    fn = _KERNEL_FN(run)
    _op.register_kernel(op_name, device_type, dtype, fn, _source="triton")
    _op_kernels.append(fn)


def _grid_fn_result(op_name, r):
    if isinstance(r, tuple) and len(r) in (2, 3) and isinstance(r[1], (tuple, list)):
        meta = r[2] if len(r) == 3 else {}
        if isinstance(meta, dict):
            return r[0], tuple(r[1]), meta
    raise errors.InvalidArgument(f"register_triton({op_name!r}): grid_fn must return (grid, args) or (grid, args, "
                                 f"meta), not {r!r}")


# ---- NineToothed ---------------------------------------------------------------------------------------------------
class NineToothedKernel:
    """A kernel NineToothed generated (:func:`make_ninetoothed`): ``launch(k, None, *tensors, stream=s)`` runs its
    generated launcher, which computes the grid and the Triton kernel's arguments from the tensors. ``source``: the
    generated Triton source file; ``kernel``: its ``@triton.jit`` function."""

    def __init__(self, name, source, kernel, launcher):
        self.name = name
        self.source = source
        self.kernel = kernel
        self._launcher = launcher

    def __repr__(self):
        return f"<NineToothedKernel {self.name} ({self.source})>"

    def _launch(self, grid, args, stream, meta):
        if grid is not None:
            raise errors.InvalidArgument(f"paddle_rt.triton: NineToothed kernel {self.name}: grid must be None (its "
                                         f"generated launcher computes the grid)")
        if meta:
            raise errors.InvalidArgument(f"paddle_rt.triton: NineToothed kernel {self.name}: takes no meta-parameters "
                                         f"(got {', '.join(meta)})")
        params = list(inspect.signature(self._launcher).parameters)
        if len(args) != len(params):
            raise errors.InvalidArgument(f"paddle_rt.triton: NineToothed kernel {self.name} takes {len(params)} "
                                         f"tensors, not {len(args)}")
        for name, value in zip(params, args):
            if not isinstance(value, Tensor):
                _check_value(self.name, name, value, False)
        tensors = [(n, a) for n, a in zip(params, args) if isinstance(a, Tensor)]
        dev = _device_of(tensors, stream, self.name)
        s = stream if stream is not None else current_stream(dev)
        if _where(dev, self.name) is not None:
            raise errors.NotSupportedError(f"{dev}: NineToothed kernel {self.name}: a compiled backend runs "
                                           f"@triton.jit kernels only; launch the generated kernel "
                                           f"(NineToothedKernel.kernel) with its arguments")
        layouts = [_layout(a) if isinstance(a, Tensor) else None for a in args]
        plain = [None if isinstance(a, Tensor) else a for a in args]              # no Tensor kept by the closure

        def run():
            views = [a if lay is None else _torch_view(*lay, f"kernel {self.name}: argument {n!r}")
                     for n, a, lay in zip(params, plain, layouts)]
            with _INTERPRETER:
                self._launcher(*views)
        return _enqueue(s, _Run(f"NineToothed kernel {self.name}", run), [t for _, t in tensors], self.name)


class _InterpretedLauncher:
    """Stands for a Triton kernel in a NineToothed launcher's module: ``kernel[grid](*args, **meta)`` runs it in the
    interpreter."""

    def __init__(self, kernel):
        self.kernel = _Kernel(kernel)

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.kernel.run(grid, self.kernel.bind(args, meta))
        return run


# What NineToothed's code generator assumes of a device whose properties name no register or NRAM size (its own
# default): the innermost block holds at most 2**18 // 8 elements.
NINETOOTHED_MAX_INNERMOST = 2 ** 18


def make_ninetoothed(arrangement, application, tensors, *, kernel_name=None, num_warps=4, num_stages=1,
                     max_num_configs=None):
    """Generate a NineToothed kernel (like ``ninetoothed.make(arrangement, application, tensors)``) without a GPU
    driver, for :func:`launch`. NineToothed's ``make`` and ``jit`` ask Triton for the active GPU driver's device
    properties before generating anything ("0 active drivers" on a machine without one); this runs its code generator
    with the limits it assumes for a device that reports none (``NINETOOTHED_MAX_INNERMOST``), then loads the
    generated launcher with its Triton kernels run by the interpreter. Symbolic block sizes
    (``ninetoothed.block_size()``) become an autotuned kernel, of which the interpreter runs the config with the
    fewest programs."""
    try:
        import ninetoothed  # noqa: F401
        from ninetoothed.generation import CodeGenerator
    except ImportError as exc:
        raise ImportError(f"make_ninetoothed needs ninetoothed ({exc}): pip install 'paddle_rt[triton]'") from exc
    params = inspect.signature(application).parameters
    types = arrangement(*tensors)
    types = types if isinstance(types, tuple) else (types,)
    application.__annotations__ = {p: t for p, t in zip(params, types)}
    name = kernel_name or application.__name__
    gen = CodeGenerator.__new__(CodeGenerator)          # its __init__ is where the driver is asked
    ast.NodeTransformer.__init__(gen)
    gen._min_num_elements = 1
    gen._max_num_elements = NINETOOTHED_MAX_INNERMOST // 8
    try:
        source = gen(application, "torch", name, num_warps, num_stages, max_num_configs, False)
        launcher_name = gen.launch_func_name
    except AttributeError as exc:
        raise errors.NotSupportedError(f"make_ninetoothed: this ninetoothed's code generator needs more than the "
                                       f"device limits paddle_rt gives it ({exc}); paddle_rt.triton was written "
                                       f"against ninetoothed 0.26") from exc
    spec = importlib.util.spec_from_file_location(f"paddle_rt_ninetoothed_{name}", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ns = vars(module)
    kernel = ns[name]
    for key, value in list(ns.items()):     # what the launcher calls as kernel[grid](...); device functions stay
        if key == name or isinstance(value, (Autotuner, Heuristics)):
            ns[key] = _InterpretedLauncher(value)
    return NineToothedKernel(name, source, kernel, ns[launcher_name])
