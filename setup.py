"""Build script: the Cython core, the bundled rt_cpu plugin and the small host-symbol library.

Environment knobs (for development, not needed by users):
  PADDLE_RT_SANITIZE=address   build everything with AddressSanitizer (see .ci/sanitize)
  PADDLE_RT_DEBUG=1            -O0 -g, Cython line tracing off, asserts on
"""
import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

try:
    from setuptools.modified import newer_group
except ImportError:         # setuptools < 69
    from distutils.dep_util import newer_group

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = "."
INCLUDE = os.path.join(SRC, "paddle_rt", "include")

SANITIZE = os.environ.get("PADDLE_RT_SANITIZE", "")
# Development: PADDLE_RT_ONLY=plugin,device,librt_cpu builds only the named extensions (last name component).
ONLY = {n for n in os.environ.get("PADDLE_RT_ONLY", "").split(",") if n}


def wanted(name):
    return not ONLY or name.rsplit(".", 1)[-1] in ONLY
DEBUG = os.environ.get("PADDLE_RT_DEBUG", "") not in ("", "0")
# Parallel compiles (pip builds without -j): PADDLE_RT_BUILD_JOBS, else every CPU.
BUILD_JOBS = int(os.environ.get("PADDLE_RT_BUILD_JOBS", "0") or 0) or os.cpu_count() or 1

# Sanitizer builds use -O1 (what ASan and TSan recommend: usable stacks, and a build about twice as fast as -O2).
common_compile = ["-g0" if not DEBUG else "-g", "-O0" if DEBUG else ("-O1" if SANITIZE else "-O2"), "-pthread",
                  "-fno-strict-aliasing", "-Wno-unused-function"]
common_link = ["-pthread"]
if SANITIZE:
    common_compile += [f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer", "-g"]
    common_link += [f"-fsanitize={SANITIZE}"]

# Libraries that are not Python extension modules: they get plain file names (lib<name>.so) so that Paddle's
# plugin discovery (which loads every '*.so' in CUSTOM_DEVICE_ROOT) and dlopen() users find them as usual.
PLAIN_LIBRARIES = {
    "paddle_rt.plugins.librt_cpu",
    "paddle_rt._core.libpaddle_rt_host",
}


# C++ engine sources with process state, each linked into exactly one extension (the others reach that state through
# functions cimported from it). Compiled on their own with -Wall -Werror, unlike Cython's generated code.
ENGINE_SOURCES = {
    "paddle_rt._core.stream": [os.path.join(SRC, "paddle_rt", "_core", "engine", "stream_state.cpp")],
    "paddle_rt._core.ccl": [os.path.join(SRC, "paddle_rt", "_core", "engine", "ccl_state.cpp")],
    "paddle_rt._core.trace": [os.path.join(SRC, "paddle_rt", "_core", "engine", "trace_state.cpp")],
    "paddle_rt._core.pool": [os.path.join(SRC, "paddle_rt", "_core", "engine", "obj_freelist.cpp")],
    "paddle_rt._core.op": [os.path.join(SRC, "paddle_rt", "_core", "engine", f) for f in (
        "op_kernels.cpp",         # elementwise, rearrange, gemm, the dispatch
        "norm_kernels.cpp", "softmax_kernels.cpp", "activation_kernels.cpp", "rope_kernels.cpp",
        "attention_kernels.cpp", "embedding_kernels.cpp", "sampling_kernels.cpp",   # a file per operator family
        "host_parallel.cpp",      # the host kernels' thread pool (one per process)
        "vector_math.cpp",        # libmvec dispatch for the elementwise math
    )],
}
# The operator layer's host kernels are loops the compiler should vectorise (-O3); the rest keeps -O2.
ENGINE_EXTRA_FLAGS = {"paddle_rt._core.op": ["-O3"] if not (DEBUG or SANITIZE) else []}
ENGINE_FLAGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-fPIC"]


class build_ext(_build_ext):
    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:                    # pip builds without -j
            self.parallel = BUILD_JOBS

    def build_extension(self, ext):
        sources = ENGINE_SOURCES.get(ext.name)
        if not self.force and not newer_group(list(ext.sources) + list(ext.depends) + (sources or []),
                                              self.get_ext_fullpath(ext.name), "newer"):
            return      # built before and nothing it is made of changed since (its engine sources neither)
        if sources:
            objects = self.compiler.compile(
                sources, output_dir=self.build_temp, include_dirs=ext.include_dirs,
                extra_postargs=common_compile + ENGINE_FLAGS + ENGINE_EXTRA_FLAGS.get(ext.name, []),
                depends=ext.depends)
            ext.extra_objects = list(ext.extra_objects or []) + [o for o in objects if o not in ext.extra_objects]
        super().build_extension(ext)

    def get_ext_filename(self, fullname):
        # Called with the dotted name or, from get_ext_fullpath, with its last component only.
        last = fullname.rsplit(".", 1)[-1]
        if any(lib.rsplit(".", 1)[-1] == last for lib in PLAIN_LIBRARIES):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        if ext.name in PLAIN_LIBRARIES:
            return []
        return super().get_export_symbols(ext)


def _generated_is_current(pyx, cpp, version):
    """True when ``cpp`` was generated from ``pyx`` by this Cython version after the last change of the module and of
    every .pxd of the package. cythonize alone would also compare it with Cython's own .pxd files, which pip's
    isolated build environment installs afresh for every build: a second `pip install` would regenerate, and so
    recompile, every module although nothing changed."""
    if not os.path.exists(cpp):
        return False
    with open(cpp, encoding="utf-8", errors="replace") as f:
        if f"Generated by Cython {version} " not in f.readline():
            return False
    pxds = glob.glob(os.path.join(SRC, "paddle_rt", "**", "*.pxd"), recursive=True)
    return os.path.getmtime(cpp) > max(os.path.getmtime(x) for x in [pyx, *pxds])


def cython_extensions():
    import Cython
    from Cython.Build import cythonize

    exts, current = [], []
    pyx_files = (glob.glob(os.path.join(SRC, "paddle_rt", "_core", "*.pyx"))
                 + glob.glob(os.path.join(SRC, "paddle_rt", "bench", "*.pyx")))   # the benchmarks' C kernels
    for pyx in sorted(pyx_files):
        name = os.path.relpath(pyx, SRC)[:-4].replace(os.sep, ".")
        if not wanted(name):
            continue
        cpp = pyx[:-4] + ".cpp"
        fresh = _generated_is_current(pyx, cpp, Cython.__version__)
        (current if fresh else exts).append(Extension(
            name, [cpp if fresh else pyx],
            depends=sorted(glob.glob(os.path.join(SRC, "paddle_rt", "_core", "engine", "*"))
                           + glob.glob(os.path.join(INCLUDE, "paddle_rt", "*.h"))),
            include_dirs=[INCLUDE, os.path.join(SRC, "paddle_rt", "_core")],
            language="c++",
            extra_compile_args=common_compile + ["-std=c++17"],
            extra_link_args=common_link + ["-ldl", "-lm"],
        ))
    if not exts:
        return current
    return current + cythonize(
        exts, nthreads=BUILD_JOBS,
        compiler_directives={"language_level": "3", "embedsignature": True, "binding": False,
                             "boundscheck": False, "wraparound": False, "cdivision": True},
        include_path=[SRC],
    )


plain = [
    Extension(
        "paddle_rt.plugins.librt_cpu",
        sorted(glob.glob(os.path.join(SRC, "paddle_rt", "plugins", "rt_cpu", "*.c"))),
        include_dirs=[INCLUDE],
        extra_compile_args=common_compile + ["-std=gnu11", "-fvisibility=hidden", "-Wall"],
        extra_link_args=common_link,
        libraries=["m"],
    ),
    Extension(
        "paddle_rt._core.libpaddle_rt_host",
        [os.path.join(SRC, "paddle_rt", "_core", "host_symbols.c"),
         os.path.join(SRC, "paddle_rt", "_core", "fault_handler.c")],
        include_dirs=[INCLUDE],
        extra_compile_args=common_compile + ["-std=gnu11", "-Wall", "-Werror"],
        extra_link_args=common_link + ["-ldl"],
    ),
]

plain = [e for e in plain if wanted(e.name)]

setup(ext_modules=plain + cython_extensions(), cmdclass={"build_ext": build_ext})
