"""No call or import circle between paddle_rt's files (the graphs: tests/structure_graph.py).

- rt_cpu's C files call in one direction, core <- collectives <- MPI transport, read from the compiled objects' symbol
  tables (a file's undefined symbols against the others' defined ones);
- paddle_rt's Python and Cython modules import (and cimport) one another without a circle, lazy imports (inside
  functions and methods) included. Where a lower module must reach a higher one (DeviceAllocator.malloc ->
  allocation, Tensor.contiguous -> ops) the higher one registers a function at its import; the lower one fails with
  a clear error without it (the modules' own tests check both).
"""
import shutil

import pytest

import structure_graph as graph

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
    assert "paddle_rt._core.stream" in g["paddle_rt._core.event"]          # a cimport in a .pxd
    assert "paddle_rt._core.ccl_mpi" in g["paddle_rt._core.ccl"]           # an import followed by a comment with "("


def test_cython_reader_sees_every_import_form(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name in ("__init__.py", "low.py", "mid.pyx", "other.pyx"):
        (pkg / name).write_text("")
    (pkg / "low.pxd").write_text("from pkg.mid cimport (\n    A,   # (a comment)\n    B,\n)\n")
    (pkg / "high.pyx").write_text(
        "from pkg import low   # the lower one (not a list)\nX = 1\n"
        "cdef class C:\n    def f(self):\n        from pkg.other import g\n        return g\n"
        "def h():\n    cimport pkg.mid as M\n    import pkg.low\n")
    g = graph.import_graph(str(pkg))
    assert g["pkg.low"] == {"pkg.mid"}                                   # a parenthesised cimport list in a .pxd
    assert g["pkg.high"] == {"pkg.low", "pkg.other", "pkg.mid"}          # module level, in a method, in a function
    assert graph.circles(g) == []
    (pkg / "other.pyx").write_text("def late():\n    from pkg.high import C\n")   # a lazy import going up
    assert graph.circles(graph.import_graph(str(pkg))) == [["pkg.high", "pkg.other"]]


def test_no_import_circle_in_tools():
    g = graph.import_graph()
    tools = {m: {t for t in g[m] if t.startswith("paddle_rt.tools")} for m in g if m.startswith("paddle_rt.tools")}
    assert graph.circles(tools) == []


def test_no_import_circle_in_paddle_rt():
    g = graph.import_graph()
    assert len(g) > 50 and sum(map(len, g.values())) > 200               # the graph was read at all
    assert graph.circles(g) == []


def test_core_layers_call_down():
    """The four former circles stay broken in the direction docs/design.md gives."""
    g = graph.import_graph()
    core = "paddle_rt._core."
    for low, high in (("allocator", "allocation"), ("allocator", "deferred_free"), ("stream", "event"),
                      ("tensor", "ops"), ("tensor", "op"), ("tensor", "op_descriptors"), ("ccl_mpi", "ccl")):
        assert core + low in g[core + high], f"{high} no longer imports {low}"
        assert core + high not in g[core + low], f"{low} imports {high}"


def test_allocator_modules_stay_readable():
    """Issue 34's structure rule: no module of the caching allocator (allocator.pyx and its alloc_* helpers) exceeds
    1,000 lines; segments, the snapshot and the growth rules live in their own modules (docs/design.md)."""
    import glob
    import os
    core = os.path.join(graph.ROOT, "paddle_rt", "_core")
    files = [f for pat in ("allocator.p*", "alloc_*.p*") for f in glob.glob(os.path.join(core, pat))]
    assert len(files) >= 10                       # allocator.pyx/.pxd, alloc_segment, alloc_snapshot, alloc_policy...
    lengths = {os.path.basename(f): sum(1 for _ in open(f)) for f in files}
    assert {name: n for name, n in lengths.items() if n > 1000} == {}
