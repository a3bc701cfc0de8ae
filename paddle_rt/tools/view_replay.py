"""``python -m paddle_rt.tools.view_replay LOG OUT [CONF [DEVICE]]``: the viewer's replay of an allocation log in a
fresh process (:func:`replay_events`), its result pickled to OUT. A malformed log or
configuration: one line on stderr, exit status 2."""
import pickle
import sys

import numpy as np

from paddle_rt.tools import replay
from paddle_rt.tools.view_data import ACTIONS, ALLOC, FREE, OOM


def replay_events(path, conf=None, device=None, chunk=200_000):
    """Replay the allocation log ``path`` through this process's allocator (``conf``: dict of allocator keys) with the
    history recorded, and return a plain dict of columns: the time axis is the log's event number (the segment
    events of an allocation get its number). An out-of-memory stops the replay and is marked."""
    import paddle_rt
    from paddle_rt import memory
    from paddle_rt.bench import _alloc_kernels

    is_alloc, sizes, slots, nslots, _ = replay.load_trace(path)
    streams = _log_streams(path, len(is_alloc))
    dev = paddle_rt.device(device) if device else paddle_rt.get_device()
    alloc = paddle_rt.get_allocator(dev)
    alloc.empty_cache()
    if conf:
        alloc.configure(**conf)
    config = alloc.config()
    table = np.zeros(nslots, dtype=np.uintp)
    cols = {k: [] for k in ("kind", "t", "addr", "size", "req", "stream")}
    n = len(is_alloc)
    done = 0
    oom = None
    name = str(dev)
    memory.record_history(max_entries=max(4 * chunk, 1000), stacks=False)
    try:
        i = 0
        while i < n and oom is None:
            j = min(n, i + chunk)
            try:
                _alloc_kernels.replay(dev, is_alloc[i:j], sizes[i:j], slots[i:j], table)
            except paddle_rt.OutOfMemoryError as exc:
                j = i + getattr(exc, "events_done", 0)
                oom = (j, int(sizes[j]) if j < n else 0, streams[j] if j < n else "0")
            entries = memory._recorded_entries()
            memory.clear_history()
            k = i
            for e in entries:
                if e.get("device") != name or e.get("memory") != "device":
                    continue
                kind = ACTIONS.get(e["kind"])
                if kind is None:
                    continue
                if kind == OOM:
                    continue                      # marked once below, with the log's event number
                ev = min(k, n - 1)
                cols["kind"].append(kind)
                cols["t"].append(float(ev))
                cols["addr"].append(e["addr"])
                cols["size"].append(e["size"])
                cols["req"].append(e["requested"] if kind == ALLOC else -1)
                cols["stream"].append(streams[ev] if kind in (ALLOC, FREE) else "0")
                if kind in (ALLOC, FREE):
                    k += 1
            done = j
            i = j
        if oom is not None:
            cols["kind"].append(OOM)
            cols["t"].append(float(oom[0]))
            cols["addr"].append(0)
            cols["size"].append(oom[1])
            cols["req"].append(oom[1])
            cols["stream"].append(oom[2])
    finally:
        memory.record_history(False)
        memory.clear_history()
        for p in table[table != 0]:
            paddle_rt.raw_free(int(p), dev)
        alloc.empty_cache()
    return {"device": name, "events": n, "done": done, "config": config, "columns": cols,
            "trace": (is_alloc, sizes, slots, nslots)}


def _log_streams(path, n):
    """The ``Stream`` column of the log (a string per event; "0" throughout when it has none)."""
    import csv
    from paddle_rt.tools.replay import _open_text
    with open(path, "rb") as raw, _open_text(raw) as f:
        reader = csv.reader(f)
        header = [c.strip() for c in next(reader, [])]
        if "Stream" not in header:
            return ["0"] * n
        k = header.index("Stream")
        out = [row[k].strip() if len(row) > k else "0" for row in reader if row]
    return out if len(out) == n else (out + ["0"] * n)[:n]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path, out = argv[0], argv[1]
    conf_text = argv[2] if len(argv) > 2 else ""
    device = argv[3] if len(argv) > 3 else None
    from paddle_rt._core.errors import PaddleRTError
    try:
        res = replay_events(path, replay._conf_dict(conf_text), device)
    except PaddleRTError as exc:
        msg = str(exc)
        print(msg[len("replay: "):] if msg.startswith("replay: ") else msg, file=sys.stderr)
        return 2
    with open(out, "wb") as f:
        pickle.dump(res, f, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
