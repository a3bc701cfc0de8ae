"""The benchmark suite of paddle_rt, in one place: run by ``python -m paddle_rt bench`` and by the scripts in the
checkout's bench/ (thin wrappers over these modules); the C-level loops they time are this package's Cython kernels
(``_alloc_kernels``, ``_stream_kernels``; the replay tool uses ``_alloc_kernels.replay`` too).

Every module of this package that defines ``measure(quick: bool) -> list[dict]`` is one area (its module name, e.g.
``allocator``); each dict is one figure::

    {"area": str, "name": str, "value": float, "unit": str, "target": str or None, "met": bool or None, "note": str,
     "low": float or None, "high": float or None, "verdict": "met" | "noise" | "MISSED" | None}

``value`` is the median over the repetitions and ``low``/``high`` the spread (the lowest and highest repetition; None
for a figure measured once). ``target`` is the figure's goal as text (e.g. ``"<= 100 ns"``). A target counts as
missed only when the whole spread misses it: ``verdict`` is ``"met"`` when the median meets it, ``"noise"`` when the
median misses it but some repetition meets it (noise cannot be told from a regression: run again on a quiet
machine), ``"MISSED"`` when every repetition misses it; ``met`` is False only for ``"MISSED"`` (None for figures
without a target). Build figures with :func:`figure` (repetitions) or :func:`result` (one value). ``quick=True`` uses fewer repetitions and smaller sizes (the whole suite in well under a
minute on two cores). Ratios are measured within one run, both sides interleaved; figures are medians.
"""
import importlib
import pkgutil

import statistics

__all__ = ["ORDER", "AreaSkipped", "area_names", "load_area", "result", "figure", "normalized", "at_most", "at_least",
           "format_rows"]

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
    """One figure in the suite's form, measured once (no spread): its verdict is its value's."""
    return normalized({"area": area, "name": name, "value": float(value), "unit": unit, "target": target,
                       "met": None if met is None else bool(met), "note": note})


def normalized(row):
    """``row`` with the keys a figure made without :func:`figure` may lack (``low``, ``high``: None; ``verdict``
    from ``met``)."""
    row.setdefault("low", None)
    row.setdefault("high", None)
    if "verdict" not in row:
        row["verdict"] = None if row["met"] is None else ("met" if row["met"] else "MISSED")
    return row


def figure(area, name, samples, unit, at_most=None, at_least=None, note=""):
    """A figure measured over repetitions (``samples``, one value per repetition, each taken alternately with its
    baseline where it has one): its median with its spread, judged against ``at_most`` or ``at_least`` (a bound in
    ``unit``) so that only a spread wholly beyond the bound is a miss."""
    samples = [float(x) for x in samples]
    if not samples:
        raise ValueError(f"figure {name!r}: no samples")
    value, low, high = statistics.median(samples), min(samples), max(samples)
    row = {"area": area, "name": name, "value": value, "unit": unit, "target": None, "met": None, "note": note,
           "low": low if len(samples) > 1 else None, "high": high if len(samples) > 1 else None, "verdict": None}
    if at_most is not None or at_least is not None:
        if at_most is not None:
            row["target"] = f"<= {_bound(at_most, unit)}"
            median_met, best_met = value <= at_most, low <= at_most
        else:
            row["target"] = f">= {_bound(at_least, unit)}"
            median_met, best_met = value >= at_least, high >= at_least
        row["verdict"] = "met" if median_met else ("noise" if best_met else "MISSED")
        row["met"] = row["verdict"] != "MISSED"
    return row


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
        verdict = normalized(dict(r))["verdict"]
        tgt = f"  target {r['target']}: {'missed' if verdict == 'MISSED' else verdict}" if r["target"] else ""
        out.append(f"  {r['name']:{width}s} {r['value']:10.2f} {r['unit']:3s}{tgt}  ({r['note']})")
    return "\n".join(out)
