"""Layout of paddle_rt/include/paddle_rt/device_ext.h, checked by compiling small C and C++ programs against it.

The tables below are the layout of PaddlePaddle 3.3.1's device_ext.h on x86-64, written out field by
field so that a slip in the header (a missing reserved slot, a reordered hook) is caught with the field's name.
"""
import os
import platform
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or sys.maxsize < 2**32,
    reason="the offset tables are those of x86-64 (LP64)",
)

# (field, offset, size) of CustomRuntimeParams, 96 bytes.
PARAMS_FIELDS = [
    ("size", 0, 8),
    ("interface", 8, 8),
    ("version", 16, 24),
    ("device_type", 40, 8),
    ("sub_device_type", 48, 8),
    ("pir_default_passes", 56, 8),
    ("reserved", 64, 32),
]
PARAMS_SIZE = 96

VERSION_FIELDS = [("major", 0, 8), ("minor", 8, 8), ("patch", 16, 8)]

# (field, offset, size) of C_DeviceInterface, 1128 bytes.
INTERFACE_FIELDS = [
    ("size", 0, 8),
    ("initialize", 8, 8),
    ("finalize", 16, 8),
    ("init_device", 24, 8),
    ("set_device", 32, 8),
    ("get_device", 40, 8),
    ("deinit_device", 48, 8),
    ("create_stream", 56, 8),
    ("destroy_stream", 64, 8),
    ("query_stream", 72, 8),
    ("stream_add_callback", 80, 8),
    ("create_event", 88, 8),
    ("record_event", 96, 8),
    ("destroy_event", 104, 8),
    ("query_event", 112, 8),
    ("synchronize_device", 120, 8),
    ("synchronize_stream", 128, 8),
    ("synchronize_event", 136, 8),
    ("stream_wait_event", 144, 8),
    ("reserved_dev_api", 152, 64),
    ("device_memory_allocate", 216, 8),
    ("device_memory_deallocate", 224, 8),
    ("device_memory_set", 232, 8),
    ("host_memory_allocate", 240, 8),
    ("host_memory_deallocate", 248, 8),
    ("unified_memory_allocate", 256, 8),
    ("unified_memory_deallocate", 264, 8),
    ("memory_copy_h2d", 272, 8),
    ("memory_copy_d2h", 280, 8),
    ("memory_copy_d2d", 288, 8),
    ("memory_copy_p2p", 296, 8),
    ("async_memory_copy_h2d", 304, 8),
    ("async_memory_copy_d2h", 312, 8),
    ("async_memory_copy_d2d", 320, 8),
    ("async_memory_copy_p2p", 328, 8),
    ("reserved_mem_api", 336, 64),
    ("get_device_count", 400, 8),
    ("get_device_list", 408, 8),
    ("device_memory_stats", 416, 8),
    ("device_min_chunk_size", 424, 8),
    ("device_max_chunk_size", 432, 8),
    ("device_max_alloc_size", 440, 8),
    ("device_extra_padding_size", 448, 8),
    ("device_init_alloc_size", 456, 8),
    ("device_realloc_size", 464, 8),
    ("get_compute_capability", 472, 8),
    ("get_device_properties", 480, 8),
    ("get_runtime_version", 488, 8),
    ("get_driver_version", 496, 8),
    ("get_multi_process", 504, 8),
    ("get_max_threads_per_mp", 512, 8),
    ("get_max_threads_per_block", 520, 8),
    ("get_max_grid_dim_size", 528, 8),
    ("is_float16_supported", 536, 8),
    ("is_bfloat16_supported", 544, 8),
    ("is_dnn_supported", 552, 8),
    ("init_eigen_device", 560, 8),
    ("destroy_eigen_device", 568, 8),
    ("reserved_info_api", 576, 64),
    ("xccl_get_comm_name", 640, 8),
    ("xccl_get_unique_id_size", 648, 8),
    ("xccl_get_unique_id", 656, 8),
    ("xccl_comm_init_rank", 664, 8),
    ("xccl_destroy_comm", 672, 8),
    ("xccl_all_reduce", 680, 8),
    ("xccl_broadcast", 688, 8),
    ("xccl_reduce", 696, 8),
    ("xccl_all_gather", 704, 8),
    ("xccl_reduce_scatter", 712, 8),
    ("xccl_group_start", 720, 8),
    ("xccl_group_end", 728, 8),
    ("xccl_send", 736, 8),
    ("xccl_recv", 744, 8),
    ("xccl_all_to_all", 752, 8),
    ("reserved_ccl_api", 760, 64),
    ("profiler_initialize", 824, 8),
    ("profiler_finalize", 832, 8),
    ("profiler_prepare_tracing", 840, 8),
    ("profiler_start_tracing", 848, 8),
    ("profiler_stop_tracing", 856, 8),
    ("profiler_collect_trace_data", 864, 8),
    ("reserved_profiler_api", 872, 64),
    # the graph / BLAS group, names as spelled by Paddle
    ("init_blas_handle", 936, 8),
    ("blas_set_math_mode", 944, 8),
    ("init_blaslt_handle", 952, 8),
    ("destroy_blas_handle", 960, 8),
    ("destroy_blaslt_handle", 968, 8),
    ("cuda_stream_begin_capture", 976, 8),
    ("cuda_stream_end_captrue", 984, 8),
    ("cuda_graph_launch", 992, 8),
    ("cuda_graph_destroy", 1000, 8),
    ("cuda_graph_exec_destroy", 1008, 8),
    ("cuda_graph_instantiate", 1016, 8),
    ("cuda_graph_get_nodes", 1024, 8),
    ("cuda_stream_capture_info", 1032, 8),
    ("get_parameter_setter_for_exec_graph", 1040, 8),
    ("cuda_graph_debug_dot_print", 1048, 8),
    ("cuda_thread_exchange_stream_capthure_mode", 1056, 8),
    ("blas_axpby", 1064, 8),
    ("reserved_other_api", 1072, 56),
]
INTERFACE_SIZE = 1128

ENUMS = {
    "C_Status": [("C_SUCCESS", 0), ("C_WARNING", 1), ("C_FAILED", 2), ("C_ERROR", 3), ("C_INTERNAL_ERROR", 4)],
    "C_DataType": [
        ("UNDEFINED", 0), ("BOOL", 1), ("UINT8", 2), ("UINT16", 3), ("UINT32", 4), ("UINT64", 5), ("INT8", 6),
        ("INT16", 7), ("INT32", 8), ("INT64", 9), ("FLOAT16", 10), ("FLOAT32", 11), ("FLOAT64", 12),
        ("BFLOAT16", 13), ("COMPLEX64", 14), ("COMPLEX128", 15),
    ],
    "C_CCLReduceOp": [("SUM", 0), ("AVG", 1), ("MAX", 2), ("MIN", 3), ("PRODUCT", 4)],
}

# Other sizes a plugin relies on.
OTHER_SIZES = {"C_Device_st": 4, "C_CCLRootId": 16, "C_GridDim3": 12}

HOST_VERSION = (0, 1, 1)


def include_dir():
    try:
        import paddle_rt

        return paddle_rt.get_include()
    except Exception:
        return os.path.join(REPO, "paddle_rt", "include")


def expected_lines():
    """What the generated program must print, line by line, in the same order as the tables."""
    lines = [f"sizeof CustomRuntimeParams {PARAMS_SIZE}", f"sizeof C_DeviceInterface {INTERFACE_SIZE}",
             "sizeof CustomRuntimeVersion 24"]
    lines += [f"field CustomRuntimeParams.{n} {o} {s}" for n, o, s in PARAMS_FIELDS]
    lines += [f"field CustomRuntimeVersion.{n} {o} {s}" for n, o, s in VERSION_FIELDS]
    lines += [f"field C_DeviceInterface.{n} {o} {s}" for n, o, s in INTERFACE_FIELDS]
    for enum, values in ENUMS.items():
        lines += [f"enum {enum}.{n} {v}" for n, v in values]
    lines += [f"sizeof {t} {s}" for t, s in OTHER_SIZES.items()]
    return lines


def program_source(header, cxx, grid_dim_type="C_GridDim3"):
    """A C (or C++) program printing sizeof/offsetof of every field and the enum values."""
    out = []

    def emit(fmt_name, expr_a, expr_b=None):
        if expr_b is None:
            out.append(f'  printf("%s %zu\\n", "{fmt_name}", (size_t)({expr_a}));')
        else:
            out.append(f'  printf("%s %zu %zu\\n", "{fmt_name}", (size_t)({expr_a}), (size_t)({expr_b}));')

    emit("sizeof CustomRuntimeParams", "sizeof(CustomRuntimeParams)")
    emit("sizeof C_DeviceInterface", "sizeof(C_DeviceInterface)")
    emit("sizeof CustomRuntimeVersion", "sizeof(CustomRuntimeVersion)")
    for struct, fields in (("CustomRuntimeParams", PARAMS_FIELDS), ("CustomRuntimeVersion", VERSION_FIELDS),
                           ("C_DeviceInterface", INTERFACE_FIELDS)):
        for name, _, _ in fields:
            emit(f"field {struct}.{name}", f"offsetof({struct}, {name})", f"sizeof((({struct}*)0)->{name})")
    for enum, values in ENUMS.items():
        for name, _ in values:
            # assigning to a variable of the enum type checks that the constant belongs to it (C++ is strict)
            out.append(f'  {{ {enum} v = {name}; printf("%s %d\\n", "enum {enum}.{name}", (int)v); }}')
    emit("sizeof C_Device_st", "sizeof(struct C_Device_st)")
    emit("sizeof C_CCLRootId", "sizeof(C_CCLRootId)")
    emit("sizeof C_GridDim3", f"sizeof({grid_dim_type})")
    body = "\n".join(out)
    includes = "#include <cstdio>\n#include <cstddef>\nusing std::printf;\n" if cxx else \
        "#include <stdio.h>\n#include <stddef.h>\n"
    return f"""{includes}#include {header}

int main(void) {{
{body}
  printf("version %d %d %d\\n", PADDLE_CUSTOM_RUNTIME_MAJOR_VERSION, PADDLE_CUSTOM_RUNTIME_MINOR_VERSION,
         PADDLE_CUSTOM_RUNTIME_PATCH_VERSION);
  return 0;
}}
"""


def compile_and_run(tmp_path, compiler, flags, source, suffix, include):
    exe = shutil.which(compiler)
    if exe is None:
        pytest.skip(f"no {compiler} on PATH")
    src = tmp_path / f"layout{suffix}"
    src.write_text(source)
    binary = tmp_path / f"layout{suffix.replace('.', '_')}"
    cmd = [exe, *flags, f"-I{include}", str(src), "-o", str(binary)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stderr}"
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def check_output(lines):
    version = [ln for ln in lines if ln.startswith("version ")]
    lines = [ln for ln in lines if not ln.startswith("version ")]
    expected = expected_lines()
    # compare line by line so that a failure names the field
    mismatches = [(e, g) for e, g in zip(expected, lines) if e != g]
    assert not mismatches, "layout differs from paddlepaddle 3.3.1's (expected, got):\n" + "\n".join(
        f"  {e!r} != {g!r}" for e, g in mismatches)
    assert len(lines) == len(expected)
    return version


C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"]
CXX_FLAGS = ["-std=c++11", "-Wall", "-Wextra", "-Werror"]


def test_layout_from_c(tmp_path):
    lines = compile_and_run(tmp_path, "gcc", C_FLAGS, program_source("<paddle_rt/device_ext.h>", cxx=False), ".c",
                            include_dir())
    assert check_output(lines) == ["version %d %d %d" % HOST_VERSION]


def test_layout_from_cxx(tmp_path):
    lines = compile_and_run(tmp_path, "g++", CXX_FLAGS, program_source("<paddle_rt/device_ext.h>", cxx=True), ".cc",
                            include_dir())
    assert check_output(lines) == ["version %d %d %d" % HOST_VERSION]


def test_table_is_contiguous():
    """The tables themselves: every field starts where the previous one ended and the last ends at sizeof."""
    for fields, total in ((PARAMS_FIELDS, PARAMS_SIZE), (INTERFACE_FIELDS, INTERFACE_SIZE)):
        end = 0
        for name, offset, size in fields:
            assert offset == end, name
            end = offset + size
        assert end == total


def test_header_is_valid_c99_and_gnu(tmp_path):
    """Plugins are often built with -std=gnu99 / gnu11; the header must compile there too (static asserts included)."""
    src = "#include <paddle_rt/device_ext.h>\nint main(void) { return (int)sizeof(C_DeviceInterface) != 1128; }\n"
    # (in -std=c99 the header's _Static_assert is a gcc extension, accepted without -pedantic)
    for std in ("-std=c99", "-std=gnu11", "-std=gnu17"):
        flags = [std, "-Wall", "-Werror"]
        out = compile_and_run(tmp_path, "gcc", flags, src, f"{std[5:]}.c", include_dir())
        assert out == []


CHECK_VERSION_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <paddle_rt/device_ext.h>

/* A plugin's first lines, exercised by a host that passes the given sizes. */
static void fake_init(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  params->device_type = (char*)"checked";
}

static void run(size_t params_size, size_t iface_size) {
  CustomRuntimeParams params;
  C_DeviceInterface iface;
  memset(&params, 0, sizeof params);
  memset(&iface, 0, sizeof iface);
  params.size = params_size;
  params.interface = &iface;
  iface.size = iface_size;
  fake_init(&params);
  printf("%zu %zu -> %s %zu.%zu.%zu\n", params_size, iface_size, params.device_type ? params.device_type : "refused",
         params.version.major, params.version.minor, params.version.patch);
}

int main(void) {
  run(sizeof(CustomRuntimeParams), sizeof(C_DeviceInterface));
  run(sizeof(CustomRuntimeParams), 8);
  run(8, sizeof(C_DeviceInterface));
  run(8, 8);
  return 0;
}
"""


def test_check_version_macro_gives_up_only_when_both_sizes_differ(tmp_path):
    """Paddle's check uses `&&`: a host with one wrong size is still accepted (paddlepaddle 3.3.1's handshake)."""
    lines = compile_and_run(tmp_path, "gcc", C_FLAGS, CHECK_VERSION_PROGRAM, ".c", include_dir())
    assert lines == [
        "96 1128 -> checked 0.1.1",
        "96 8 -> checked 0.1.1",
        "8 1128 -> checked 0.1.1",
        "8 8 -> refused 0.0.0",
    ]


def paddle_header_dir():
    import importlib.util

    spec = importlib.util.find_spec("paddle")  # without importing it (slow, noisy)
    if spec is None or not spec.submodule_search_locations:
        return None
    inc = os.path.join(list(spec.submodule_search_locations)[0], "include")
    if os.path.exists(os.path.join(inc, "paddle", "phi", "backends", "device_ext.h")):
        return inc
    return None


@pytest.mark.interop
def test_tables_match_paddles_own_header(tmp_path):
    """The same program compiled against the header shipped in the paddlepaddle wheel prints the same table, so the
    tables above (and hence our header) are Paddle's layout, field names included."""
    inc = paddle_header_dir()
    if inc is None:
        pytest.skip("paddlepaddle (with its include folder) is not installed")
    # Paddle's header has no name for the grid-dimension type (it spells std::array<unsigned int, 3>)
    src = program_source('"paddle/phi/backends/device_ext.h"', cxx=True,
                         grid_dim_type="std::array<unsigned int, 3>")
    lines = compile_and_run(tmp_path, "g++", ["-std=c++14", "-w"], src, ".cc", inc)
    check_output(lines)
