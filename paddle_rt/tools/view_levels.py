"""The memory viewer's timeline levels: a long series cut into buckets of equal event counts, each kept as its
minimum and maximum, so that a peak or a dip of a single event survives every zoom level (the page swaps in a finer
level as the user zooms). Pure numpy."""
import numpy as np

__all__ = ["LEVEL_BUCKETS", "minmax_levels"]

LEVEL_BUCKETS = (4096, 65536)   # timeline levels: min/max per bucket; a series of at most 2x a level's buckets is kept


def minmax_levels(t, series, levels=LEVEL_BUCKETS, fine=("allocated", "reserved")):
    """The timeline's levels: for each bucket count B of ``levels`` (coarse to fine), the series cut into B buckets
    of equal event counts, each bucket kept as two points at its first time: the minimum then the maximum of every
    series (so a peak or a dip of one event survives any level). A series of at most 2B points is kept whole at that
    level and the finer levels are dropped. Levels after the first hold only the series named in ``fine`` (the
    others stay at the first level's resolution). Returns [{"buckets": B or 0 (whole), "t": array, name: array}]."""
    t = np.asarray(t, dtype=np.float64)
    n = len(t)
    out = []
    for k_level, b in enumerate(levels):
        names = [k for k in series if k_level == 0 or k in fine]
        if n <= 2 * b:
            lvl = {"buckets": 0, "t": t}
            for k in names:
                lvl[k] = np.asarray(series[k], dtype=np.float64)
            out.append(lvl)
            return out
        starts = np.unique(np.linspace(0, n, b, endpoint=False).astype(np.int64))
        lvl = {"buckets": len(starts), "t": np.repeat(t[starts], 2)}
        for k in names:
            v = np.asarray(series[k], dtype=np.float64)
            pair = np.empty(2 * len(starts), dtype=np.float64)
            pair[0::2] = np.minimum.reduceat(v, starts)
            pair[1::2] = np.maximum.reduceat(v, starts)
            lvl[k] = pair
        out.append(lvl)
    return out
