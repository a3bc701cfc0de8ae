"""No call or import circle between paddle_rt's files (the graphs: tests/structure_graph.py).

- rt_cpu's C files call in one direction, core <- collectives <- MPI transport, read from the compiled objects' symbol
  tables (a file's undefined symbols against the others' defined ones);
- paddle_rt's Python and Cython modules import (and cimport) one another without a circle, lazy imports included,
  except the circles listed in KNOWN_CIRCLES (each must still exist: once broken it leaves the list).
"""
import shutil

import pytest

import structure_graph as graph

# Circles in files other work owns today; each entry is checked to be exactly a circle that still exists, so none can
# grow unnoticed and a broken one must leave the list.
KNOWN_CIRCLES = [
    # allocator's DeviceAllocator.malloc imports allocation (Python only); allocation and deferred_free cimport
    # allocator. (The allocator's helper modules cimport its types from alloc_types.pxd, outside the circle.)
    ["paddle_rt._core.allocation", "paddle_rt._core.allocator", "paddle_rt._core.deferred_free"],
    # Communicator.from_mpi and the missing-peer note import ccl_mpi (Python only); ccl_mpi builds the communicator
    # with ccl's functions.
    ["paddle_rt._core.ccl", "paddle_rt._core.ccl_mpi"],
    # Stream.wait_event/wait_stream import event (Python only); event cimports stream.
    ["paddle_rt._core.event", "paddle_rt._core.stream"],
    # Tensor.contiguous imports ops (Python only); ops, op_descriptors and op cimport tensor.
    ["paddle_rt._core.op", "paddle_rt._core.op_descriptors", "paddle_rt._core.ops", "paddle_rt._core.tensor"],
]


def test_rt_cpu_calls_in_one_direction():
    if not shutil.which("cc") and not shutil.which("gcc"):
        pytest.fail("no C compiler: rt_cpu is built with one, so its absence is a broken set-up")
    g = graph.c_call_graph()
    assert graph.circles(g) == []
    # the direction itself: fault injection below the core calls nothing; the core calls only it; the collectives the
    # core; the transport the collectives (and the core)
    below = {"rt_cpu_faults.c"}
    assert all(g[f] == set() for f in below)
    assert g["rt_cpu.c"] <= below
    assert g["rt_cpu_ccl.c"] <= {"rt_cpu.c"} | below and "rt_cpu.c" in g["rt_cpu_ccl.c"]
    assert g["rt_cpu_mpi.c"] <= {"rt_cpu.c", "rt_cpu_ccl.c"} | below and "rt_cpu_ccl.c" in g["rt_cpu_mpi.c"]


def test_circle_finder_finds_a_circle():
    assert graph.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert graph.circles({"a": {"b"}, "b": set()}) == []


def test_import_graph_sees_lazy_imports_and_cimports():
    g = graph.import_graph()
    assert "paddle_rt._core.device" in g["paddle_rt._core.stream"]        # a cimport in a .pyx
    assert "paddle_rt._core.errors" in g["paddle_rt.tools.replay"]         # a module-level from-import
    assert "paddle_rt.tools.figures" in g["paddle_rt.tools.replay"]        # an import inside a function


def test_no_import_circle_in_tools():
    g = graph.import_graph()
    tools = {m: {t for t in g[m] if t.startswith("paddle_rt.tools")} for m in g if m.startswith("paddle_rt.tools")}
    assert graph.circles(tools) == []


def test_no_import_circle_in_paddle_rt_but_the_known_ones():
    assert graph.circles(graph.import_graph()) == sorted(KNOWN_CIRCLES)
