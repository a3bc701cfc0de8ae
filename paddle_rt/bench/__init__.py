"""The benchmark suite of paddle_rt, in one place: run by ``python -m paddle_rt bench`` and by the scripts in the
checkout's bench/ (thin wrappers over these modules); the C-level loops they time are this package's Cython kernels
(``_alloc_kernels``, ``_stream_kernels``; the replay tool uses ``_alloc_kernels.replay`` too).

Every module of this package that defines ``measure(quick: bool) -> list[dict]`` is one area (its module name, e.g.
``allocator``); each dict is one figure::

    {"area": str, "name": str, "value": float, "unit": str, "target": str or None, "met": bool or None, "note": str}

``target`` is the figure's goal as text (e.g. ``"<= 100 ns"``) and ``met`` whether this run reached it (None for
figures without a target). ``quick=True`` uses fewer repetitions and smaller sizes (the whole suite in well under a
minute on two cores). Ratios are measured within one run, both sides interleaved; figures are medians.
"""
import importlib
import pkgutil

__all__ = ["ORDER", "AreaSkipped", "area_names", "load_area", "result", "at_most", "at_least", "format_rows"]

ORDER = ("allocator", "streams", "pool", "ccl")     # the others follow, by name


class AreaSkipped(Exception):
    """Raised by ``measure`` when the area cannot run here (e.g. the devices it needs are missing): the suite
    reports it as skipped, with the reason, not as a failure."""


def area_names():
    """The modules of this package, in the suite's order (whether they define ``measure`` is known on import)."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def load_area(name):
    """The module of area ``name``, or None when it defines no ``measure``."""
    mod = importlib.import_module(f"{__name__}.{name}")
    return mod if callable(getattr(mod, "measure", None)) else None


def result(area, name, value, unit, target=None, met=None, note=""):
    """One figure in the suite's form."""
    return {"area": area, "name": name, "value": float(value), "unit": unit, "target": target,
            "met": None if met is None else bool(met), "note": note}


def _bound(bound, unit):
    return f"{bound:g}{unit}" if unit in ("x", "%", "") else f"{bound:g} {unit}"


def at_most(value, bound, unit):
    """(target text, met) for a figure that must not exceed ``bound`` (in ``unit``)."""
    return f"<= {_bound(bound, unit)}", value <= bound


def at_least(value, bound, unit):
    """(target text, met) for a figure that must reach ``bound`` (in ``unit``)."""
    return f">= {_bound(bound, unit)}", value >= bound


def format_rows(rows, width=62):
    """A plain-text table of an area's rows: name, value, unit, the target and whether it was met, the note."""
    out = []
    for r in rows:
        tgt = f"  target {r['target']}: {'met' if r['met'] else 'missed'}" if r["target"] else ""
        out.append(f"  {r['name']:{width}s} {r['value']:10.2f} {r['unit']:3s}{tgt}  ({r['note']})")
    return "\n".join(out)
