"""``python -m paddle_rt replay TRACE.csv[.gz] [--device D] [--conf K:V,...]``: replay an allocation log through
paddle_rt's allocator.

The log is RMM's CSV format (``Thread,Time,Action,Pointer,Size,Stream``; Action ``allocate``/``free``; Pointer hex;
Size bytes); only the order of events matters. Reports nanoseconds per event (a nogil loop over the public Cython
API), the peak reserved bytes, the peak live requested bytes, their ratio and the number of device allocations; on
rt_cpu also the smallest device capacity on which the trace still completes (bisected over ``RT_CPU_MEMORY_BYTES``,
each probe in a fresh process). ``--baselines`` adds the figures of faithful models of Paddle's auto-growth
allocator and of PyTorch's caching allocator on an unbounded device, for comparison.
When the ``Stream`` column names several streams, the log is also replayed stream-ordered (``malloc_async`` /
``free_async`` on that many paddle_rt streams, a fresh ``MemPool``) and the pool's figures are reported.

``--async`` adds the log replayed with the host waiting and running ahead of a lagging device, side by side
(:mod:`paddle_rt.tools.replay_async`); ``--loader`` runs the two-stream data-loader workload instead of a log
(:mod:`paddle_rt.tools.replay_loader`).

``--plot out.png`` draws the replay's memory timeline and the segment map at the end of the log (matplotlib, the
``plot`` extra). Long traces show a progress bar on stderr when it is a terminal (tqdm, the ``progress`` extra;
without it, no bar): ``--progress`` forces it, ``--no-progress`` turns it off.
"""
import argparse
import csv
import gzip
import io
import json
import os
import sys
import time

from paddle_rt._core.errors import InvalidArgument
from paddle_rt.tools.cli import EXIT_USAGE, command_parser, delay_us_arg, error, output_path_problem

MiB = 1 << 20
PROGRESS_EXTRA = 'pip install "paddle_rt[progress]"'


# What a user gives replay when a file is not a log (appended to "is not an RMM allocation log").
LOG_FORMAT = ("replay wants an RMM allocation log: a CSV file, gzip'd or not, with the header "
              "Thread,Time,Action,Pointer,Size,Stream (docs: tools, Trace files)")


class TraceFormatError(InvalidArgument):
    """The allocation log is not a well-formed RMM log (the message names the file and line)."""


def progress_factory(mode, stream=None):
    """A function making tqdm bars on ``stream`` (default stderr), or None for no bars. ``mode``: True (forced),
    False (off), None (automatic: only when ``stream`` is a terminal, and only for work lasting over half a second).
    Without tqdm there are no bars (forced: a one-line note on ``stream``)."""
    stream = sys.stderr if stream is None else stream
    if mode is False:
        return None
    if mode is None:
        try:
            if not stream.isatty():
                return None
        except (AttributeError, ValueError):
            return None
    try:
        from tqdm import tqdm
    except ImportError:
        if mode:
            print(f"paddle_rt: no progress bar: tqdm is not installed ({PROGRESS_EXTRA})", file=stream)
        return None

    def make(desc, total=None, unit="it", **kw):
        return tqdm(desc=desc, total=total, unit=unit, file=stream, delay=0 if mode else 0.5, leave=bool(mode),
                    dynamic_ncols=True, **kw)
    return make


def _open_text(raw):
    """A text stream over the binary file ``raw`` (an ``open(path, "rb")``), gzip-compressed or not (recognised by
    content). The caller closes ``raw``."""
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), newline="")
    return io.TextIOWrapper(raw, newline="")


def load_trace(path, progress=None):
    """(is_alloc int8 array, sizes int64, slots int64, number of slots, peak live requested bytes)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # idle BLAS threads would disturb the timing
    if not os.path.exists(path):
        raise TraceFormatError(f"replay: {path}: no such file")
    raw = open(path, "rb")
    bar = progress("reading", total=os.path.getsize(path), unit="B", unit_scale=True) if progress else None
    done_bytes = 0
    try:
        with _open_text(raw) as f:
            reader = csv.DictReader(f)
            try:
                fields = reader.fieldnames
            except (UnicodeDecodeError, OSError, EOFError) as exc:
                raise TraceFormatError(f"replay: {path} is not an RMM allocation log ({exc}); {LOG_FORMAT}") from None
            missing = {"Action", "Pointer", "Size"} - set(fields or ())
            if missing:
                raise TraceFormatError(f"replay: {path} is not an RMM allocation log (no column "
                                       f"{', '.join(sorted(missing))}); {LOG_FORMAT}")
            trace = TraceBuilder()
            for lineno, row in enumerate(reader, 2):
                if bar is not None and not lineno & 0x1fff:
                    pos = raw.tell()
                    bar.update(pos - done_bytes)
                    done_bytes = pos
                act = (row["Action"] or "").strip()
                ptr = (row["Pointer"] or "").strip()
                if act == "allocate":
                    try:
                        n = int(row["Size"])
                    except (TypeError, ValueError):
                        raise TraceFormatError(f"replay: {path}:{lineno}: size {row['Size']!r} is not an "
                                               f"integer") from None
                    if n < 0:
                        raise TraceFormatError(f"replay: {path}:{lineno}: negative size {n}")
                    if n >= 1 << 63:
                        raise TraceFormatError(f"replay: {path}:{lineno}: size {n} B is beyond any device "
                                               "(2^63 B or more)")
                    if not trace.allocate(ptr, n):
                        raise TraceFormatError(f"replay: {path}:{lineno}: {ptr} allocated twice without a free")
                elif act == "free":
                    if not trace.free(ptr):
                        raise TraceFormatError(f"replay: {path}:{lineno}: free of {ptr} which is not live")
                else:
                    raise TraceFormatError(f"replay: {path}:{lineno}: unknown action {act!r}")
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise TraceFormatError(f"replay: {path}: unreadable ({exc}); {LOG_FORMAT}") from None
    finally:
        if bar is not None:
            bar.update(max(0, os.path.getsize(path) - done_bytes))
            bar.close()
        raw.close()
    return trace.result()


class TraceBuilder:
    """Builds load_trace's form of a trace event by event: each live allocation gets a slot (a freed slot is reused
    first), and the peak of live requested bytes is kept."""

    def __init__(self):
        self.actions, self.sizes, self.slots = [], [], []
        self.slot_of, self.size_of, self.free_slots = {}, {}, []
        self.nslots = self.live = self.peak = 0

    def allocate(self, key, size):
        """Record an allocation of ``size`` bytes under ``key``; False (nothing recorded) when ``key`` is live."""
        if key in self.slot_of:
            return False
        if self.free_slots:
            s = self.free_slots.pop()
        else:
            s, self.nslots = self.nslots, self.nslots + 1
        self.slot_of[key] = s
        self.size_of[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        self.actions.append(1)
        self.sizes.append(size)
        self.slots.append(s)
        return True

    def free(self, key):
        """Record the free of ``key``; False (nothing recorded) when it is not live."""
        if key not in self.slot_of:
            return False
        s = self.slot_of.pop(key)
        self.live -= self.size_of.pop(key)
        self.free_slots.append(s)
        self.actions.append(0)
        self.sizes.append(0)
        self.slots.append(s)
        return True

    def result(self):
        """(is_alloc int8 array, sizes int64, slots int64, number of slots, peak live requested bytes)."""
        import numpy as np
        return (np.array(self.actions, dtype=np.int8), np.array(self.sizes, dtype=np.int64),
                np.array(self.slots, dtype=np.int64), max(self.nslots, 1), self.peak)


def live_requested(is_alloc, sizes, slots):
    """Live requested bytes after each event (int64 array): +size on an allocation, minus the size of the slot's
    allocation on a free."""
    import numpy as np
    n = len(is_alloc)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), slots))           # each slot's events in time order: alloc, free, alloc...
    s_sorted = sizes[order]
    prev = np.empty_like(s_sorted)
    prev[0] = 0
    prev[1:] = s_sorted[:-1]
    delta = np.empty(n, dtype=np.int64)
    delta[order] = np.where(is_alloc[order] != 0, s_sorted, -prev)
    return np.cumsum(delta)


def load_stream_trace(path):
    """[(is_alloc, size, slot, stream index)] and the stream names, in first-seen order, from the ``Stream`` column
    (None when the log has no such column or names a single stream)."""
    with open(path, "rb") as raw, _open_text(raw) as f:
        reader = csv.DictReader(f)
        if "Stream" not in (reader.fieldnames or ()):
            return None
        names, index, events, slot_of, free_slots = [], {}, [], {}, []
        for row in reader:
            name = row["Stream"].strip()
            k = index.get(name)
            if k is None:
                k = index[name] = len(names)
                names.append(name)
            ptr = row["Pointer"].strip()
            if row["Action"].strip() == "allocate":
                slot = free_slots.pop() if free_slots else len(slot_of) + len(free_slots)
                slot_of[ptr] = slot
                events.append((1, int(row["Size"]), slot, k))
            else:
                slot = slot_of.pop(ptr)
                free_slots.append(slot)
                events.append((0, 0, slot, k))
    return (events, names) if len(names) > 1 else None


def run_streams(events, names, device=None):
    """Replay a multi-stream log through stream-ordered memory: one paddle_rt stream per name, malloc_async on the
    allocating row's stream and free_async on the freeing row's stream (a fresh MemPool, default policies)."""
    import paddle_rt

    dev = paddle_rt.device(device) if device else paddle_rt.get_device()
    streams = [paddle_rt.Stream(dev) for _ in names]
    pool = paddle_rt.MemPool(dev)
    table = {}
    t0 = time.perf_counter_ns()
    try:
        for is_alloc, size, slot, k in events:
            if is_alloc:
                table[slot] = pool.malloc_async(size, streams[k])
            else:
                pool.free_async(table.pop(slot), streams[k])
        ns = time.perf_counter_ns() - t0
    finally:
        for a in table.values():
            pool.free_async(a)
        for st in streams:
            st.synchronize()
    res = {"streams": len(names), "events": len(events), "ns_per_event": ns / max(1, len(events))}
    res.update(pool.stats())
    pool.trim_to(0)
    for st in streams:
        st.close()
    return res


def _conf_dict(text):
    conf = {}
    for item in (text or "").split(","):
        item = item.strip()
        if item:
            if ":" not in item:
                raise InvalidArgument(f"replay: --conf item {item!r} is not key:value")
            k, _, v = item.partition(":")
            conf[k.strip()] = v.strip()
    return conf


def run_once(path, device, conf, trace=None, record=False, progress=None, samples=10_000, reserve=0):
    """Replay in this process. Returns a dict of figures, or raises OutOfMemoryError (its ``event`` attribute: the
    index of the allocation that did not fit).

    ``record``: also return ``"timeline"`` ({"event", "allocated", "reserved", "requested", "stride"}: the bytes
    after each event, or with more than ``samples`` events the maxima over every ``stride`` events, the first point
    being the level before the replay) and ``"segments"`` (the allocator's snapshot at the end of the log, before the
    replay gives its memory back). ``progress``: a bar factory (see :func:`progress_factory`)."""
    import numpy as np
    import paddle_rt
    from paddle_rt.bench import _alloc_kernels as _bench_alloc

    is_alloc, sizes, slots, nslots, peak_live = trace or load_trace(path, progress=progress)
    dev = paddle_rt.device(device) if device else paddle_rt.get_device()
    alloc = paddle_rt.get_allocator(dev)
    alloc.empty_cache()
    if conf:
        alloc.configure(**conf)
    alloc.reset_peak_stats()
    before = alloc.stats()
    if reserve:
        alloc.reserve(reserve)
    table = np.zeros(nslots, dtype=np.uintp)
    n = len(is_alloc)
    if record:
        stride = max(1, -(-n // samples))
    elif progress:
        stride = max(20_000, -(-n // 200))
    else:
        stride = max(1, n)              # one nogil loop over the whole log
    bar = progress("replay", total=n, unit="event", unit_scale=True) if progress else None
    if record:
        from paddle_rt.memory import (memory_allocated, memory_reserved, max_memory_allocated, max_memory_reserved,
                                      reset_peak_memory_stats)
        req = live_requested(is_alloc, sizes, slots)
        tl_event, tl_alloc, tl_res, tl_req = [0], [memory_allocated(dev)], [memory_reserved(dev)], [0]
    ns = 0
    i = 0
    segments = None
    try:
        while i < n:
            j = min(n, i + stride)
            if record and stride > 1:
                reset_peak_memory_stats(dev)       # read back below as the maxima over this interval
            try:
                k_ns, _ = _bench_alloc.replay(dev, is_alloc[i:j], sizes[i:j], slots[i:j], table)
            except paddle_rt.OutOfMemoryError as exc:
                exc.event = i + getattr(exc, "events_done", 0)
                raise
            ns += k_ns
            if record:
                if stride == 1:
                    tl_event.append(j)
                    tl_alloc.append(memory_allocated(dev))
                    tl_res.append(memory_reserved(dev))
                    tl_req.append(int(req[i]))
                else:
                    tl_event.append(i)
                    tl_alloc.append(max_memory_allocated(dev))
                    tl_res.append(max_memory_reserved(dev))
                    tl_req.append(max(int(req[i - 1]) if i else 0, int(req[i:j].max())))
            if bar is not None:
                bar.update(j - i)
            i = j
        if record:
            if stride > 1:
                tl_event.append(n)
                tl_alloc.append(memory_allocated(dev))
                tl_res.append(memory_reserved(dev))
                tl_req.append(int(req[-1]) if n else 0)
            segments = alloc.snapshot()
    finally:
        if bar is not None:
            bar.close()
        after = alloc.stats()
        for p in table[table != 0]:
            paddle_rt.raw_free(int(p), dev)
        alloc.empty_cache()
    peak_reserved = max(tl_res) if record else after["reserved_bytes.all.peak"]
    res = {
        "device": str(dev), "events": int(n), "ns_per_event": ns / max(1, n),
        "peak_reserved": peak_reserved, "peak_live_requested": int(peak_live),
        "ratio": peak_reserved / peak_live if peak_live else float("nan"),
        "device_allocs": after["num_device_alloc"] - before["num_device_alloc"],
        "device_frees": after["num_device_free"] - before["num_device_free"],
        "maps": after["num_maps"] - before["num_maps"], "unmaps": after["num_unmaps"] - before["num_unmaps"],
        "config": alloc.config(),
    }
    if record:
        res["timeline"] = {"event": tl_event, "allocated": tl_alloc, "reserved": tl_res, "requested": tl_req,
                           "stride": stride}
        res["segments"] = segments
    return res


# the children and the anchor models live in their own modules; these names stay importable from here
from paddle_rt.tools.replay_child import replay_child, min_capacity, _probe, _bisection_steps  # noqa: E402,F401
from paddle_rt.tools.anchor_models import PaddleAutoGrowthModel, TorchCachingModel, run_model  # noqa: E402,F401


def _mib(n):
    return f"{n / MiB:.1f} MiB"


def main(argv=None):
    ap = command_parser("replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", help="RMM-format CSV log (.csv or .csv.gz)")
    ap.add_argument("--corpus", nargs="+", metavar="DIR", default=None,
                    help="instead of one TRACE: every log of these folders, each replayed in a fresh process, in one "
                         "table with both anchors and the allocator's targets (paddle_rt/tools/corpus.py)")
    ap.add_argument("--device", default=None, help="device to replay on (default: the current device)")
    ap.add_argument("--conf", default="", help="allocator config key:value,... (as PADDLE_RT_ALLOC_CONF)")
    ap.add_argument("--baselines", action="store_true",
                    help="also model Paddle's auto-growth and PyTorch's caching allocator (unbounded device)")
    ap.add_argument("--no-min-capacity", action="store_true", help="skip the minimum-capacity bisection")
    ap.add_argument("--reserve", default="0", metavar="BYTES",
                    help="grow the pool by this many bytes (K/M/G suffixes) before the first event "
                         "(paddle_rt.memory.reserve)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--strict", action="store_true",
                    help="with --corpus: exit status 1 when the targets of the mode judged are missed (for CI)")
    ap.add_argument("--plot", metavar="OUT.png", default=None,
                    help="draw the memory timeline of the replay and the final segment map (matplotlib)")
    bar = ap.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="show progress bars on stderr even when it is not a terminal (tqdm)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    ap.add_argument("--async", dest="run_ahead", action="store_true",
                    help="also replay with each block used by a kernel on its stream, the host waiting "
                         "(synchronize() after every event) and running ahead, side by side (each in a fresh process; "
                         "paddle_rt/tools/replay_async.py)")
    ap.add_argument("--api", choices=("malloc", "pool", "both"), default=None,
                    help="with --async or --loader: the caching allocator (malloc/free), the stream-ordered pool "
                         "(malloc_async/free_async), or both (default: malloc with --async, both with --loader)")
    ap.add_argument("--delay-us", type=delay_us_arg, default=None, metavar="N",
                    help="with --async or --loader: rt_cpu's delay per stream operation in the replays "
                         "(RT_CPU_STREAM_DELAY_US) (default: 20)")
    ap.add_argument("--loader", action="store_true",
                    help="instead of a log: the two-stream data-loader workload (a copy stream uploads batches that a "
                         "compute stream uses), host waiting vs running ahead, results checked "
                         "(paddle_rt/tools/replay_loader.py)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loader-run", choices=("waiting", "ahead"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--async-run", choices=("waiting", "ahead"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.loader or args.loader_run:
        return _loader(ap, args)
    if (args.api is not None or args.delay_us is not None) and not (args.run_ahead or args.async_run):
        ap.error("--api and --delay-us go with --async or --loader")
    if args.async_run and args.api == "both":
        ap.error("--async-run replays one API")
    if args.run_ahead and args.plot:
        ap.error("--async and --plot: give one of them")
    if (args.trace is None) == (args.corpus is None):
        ap.error("give one TRACE or --corpus DIR [DIR...]")
    if args.strict and args.corpus is None:
        ap.error("--strict judges a corpus: give --corpus DIR [DIR...]")

    if args.plot:                           # checked before a long replay, not after it
        problem = output_path_problem(args.plot, "--plot")
        if problem:
            return error("replay", problem)
    if args.device:
        from paddle_rt._core.errors import PaddleRTError
        try:
            import paddle_rt
            paddle_rt.device(args.device)
        except PaddleRTError as exc:
            return error("replay", f"--device {args.device}: {exc}")
    try:
        if args.corpus is not None:
            from paddle_rt.tools import corpus
            return corpus.main(args.corpus, args.conf, args.device, args.json,
                               progress_factory(args.progress), strict=args.strict, ahead=_ahead_args(args))
        if args.async_run:
            from paddle_rt.tools import replay_async
            return replay_async.child_run(load_trace(args.trace), args.device, _conf_dict(args.conf),
                                          args.api or "malloc", args.async_run)
        return _main(args)
    except InvalidArgument as exc:          # a malformed log or --conf (OutOfMemoryError etc. propagate)
        return error("replay", exc)


def _loader(ap, args):
    """``replay --loader``: the two-stream workload, waiting vs ahead, for the APIs of ``--api`` (default both)."""
    if args.trace is not None or args.corpus is not None:
        ap.error("--loader runs its own workload: give no TRACE or --corpus")
    from paddle_rt.tools import replay_loader
    if args.loader_run:
        return replay_loader.child_run(args.api or "pool", args.loader_run, args.device, _conf_dict(args.conf))
    from paddle_rt.tools.replay_async import DELAY_US, api_list
    res = replay_loader.compare(api_list(args.api or "both"), args.device, args.conf,
                                DELAY_US if args.delay_us is None else args.delay_us)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print("\n".join(replay_loader.report(res)))
    wrong = sum(res[a][m]["wrong"] for a in ("malloc", "pool") if a in res for m in ("waiting", "ahead"))
    return 1 if wrong else 0


def _ahead_args(args):
    """(APIs, delay) of ``--async``, or None without it."""
    if not args.run_ahead:
        return None
    from paddle_rt.tools.replay_async import DELAY_US, api_list
    return api_list(args.api or "malloc"), DELAY_US if args.delay_us is None else args.delay_us


def plot_data(res, source):
    """The plotting form (:mod:`paddle_rt.tools.plot`) of ``run_once(..., record=True)``'s result."""
    tl = res["timeline"]
    return {"source": source, "kind": "rmm_trace", "devices": [{
        "device": res["device"], "time": tl["event"], "time_unit": "event", "allocated": tl["allocated"],
        "reserved": tl["reserved"], "requested": tl["requested"], "markers": [],
        "note": (f"maxima over every {tl['stride']} events" if tl["stride"] > 1 else None),
        "segments": res["segments"]}], "replay": {k: v for k, v in res.items() if k not in ("timeline", "segments")}}


def event_line(path, event):
    """The line of ``path`` (1 = the header) holding event number ``event`` (0-based) of the log, as load_trace
    counts them (csv skips blank lines), or None."""
    with open(path, "rb") as raw, _open_text(raw) as f:
        reader = csv.reader(f)
        next(reader, None)
        for i, _ in enumerate(row for row in reader if row):
            if i == event:
                return reader.line_num
    return None


def does_not_fit_line(exc, path=None):
    """The result line of a replay of ``path`` that stopped at an allocation the device could not serve (``exc``:
    the OutOfMemoryError that :func:`run_once` raised, with the event's index)."""
    event = getattr(exc, "event", None)
    line = event_line(path, event) if path is not None and event is not None else None
    where = f"line {line}" if line is not None else "an allocation"
    free = f"{exc.free} B free" if exc.free is not None else "the free memory unknown"
    cap = f" (capacity {exc.capacity} B)" if exc.capacity is not None else ""
    return f"does not fit: {where} asks for {exc.requested} B with {free}{cap}"


def _does_not_fit(args, exc):
    """Report a replay that ran out of device memory: one result line (or JSON), exit status 3."""
    line = event_line(args.trace, exc.event) if getattr(exc, "event", None) is not None else None
    text = does_not_fit_line(exc, args.trace)
    if args.json:
        print(json.dumps({"trace": args.trace, "device": exc.device, "fits": False, "result": text, "line": line,
                          "requested": exc.requested, "free": exc.free, "capacity": exc.capacity}, indent=1))
    else:
        print(f"{os.path.basename(args.trace)} on {exc.device}: {text}")
    return 3


def _main(args):
    if args.plot:
        from paddle_rt.tools import figures
        try:
            figures.require_matplotlib()         # fail before a long replay, not after it
        except figures.MissingExtraError as exc:
            return error("replay", f"--plot: {exc}", EXIT_USAGE)
    progress = None if args.probe else progress_factory(args.progress)
    trace = load_trace(args.trace, progress=progress)
    conf = _conf_dict(args.conf)
    from paddle_rt._core.alloc_config import parse_size
    reserve = parse_size("--reserve", args.reserve)
    import paddle_rt

    if args.probe:
        try:
            run_once(args.trace, args.device, conf, trace, reserve=reserve)
        except paddle_rt.OutOfMemoryError:
            return 3
        return 0

    try:
        res = run_once(args.trace, args.device, conf, trace, record=bool(args.plot), progress=progress,
                       reserve=reserve)
    except paddle_rt.OutOfMemoryError as exc:
        return _does_not_fit(args, exc)
    drawing = None
    if args.plot:
        drawing = plot_data(res, args.trace)
        del res["timeline"], res["segments"]
    multi = load_stream_trace(args.trace)
    if multi is not None:
        res["stream_ordered"] = run_streams(multi[0], multi[1], args.device)
    dev = paddle_rt.device(res["device"])
    if dev.plugin.bundled and not args.no_min_capacity:   # the probe sets rt_cpu's RT_CPU_MEMORY_BYTES
        lo = trace[4]
        hi = max(res["peak_reserved"], lo + 1)
        bar = progress("min capacity", total=_bisection_steps(lo, hi), unit="probe") if progress else None
        try:
            res["min_capacity"] = min_capacity(args.trace, args.device, args.conf, lo, hi,
                                               progress=(lambda k: bar.update(1)) if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
    if args.baselines:
        res["paddle"] = run_model(PaddleAutoGrowthModel(res["config"]["alignment"], res["config"]["padding"]), trace)
        res["torch"] = run_model(TorchCachingModel(), trace)
    if drawing is not None:
        from paddle_rt.tools import figures
        figures.draw_memory(drawing, args.plot)
        res["plot"] = args.plot
    ahead = _ahead_args(args)
    if ahead is not None:
        from paddle_rt.tools import replay_async
        res["async"] = replay_async.compare(args.trace, args.device, args.conf, ahead[0], ahead[1])
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return 0
    name = os.path.basename(args.trace)
    mode = "paddle_compat" if res["config"]["paddle_compat"] else f"default ({res['config']['growth']})"
    gran = res["config"].get("granularity") if res["config"].get("expandable_active") else None
    layout = f"expandable segments ({gran / MiB:g} MiB pages)" if gran else "chunks"
    print(f"{name} on {res['device']}, {mode}, {layout}, {res['events']} events")
    print(f"  ns per event          {res['ns_per_event']:.0f}"
          + ("  (replayed in pieces for --plot: not comparable)" if args.plot else ""))
    print(f"  peak reserved         {_mib(res['peak_reserved'])} ({res['peak_reserved']} B)")
    print(f"  peak live requested   {_mib(res['peak_live_requested'])} ({res['peak_live_requested']} B)")
    print(f"  ratio                 {res['ratio']:.3f}")
    if gran:        # a device allocation is a physical page created, a device free one released
        print(f"  pages created         {res['device_allocs']} (released {res['device_frees']}; maps {res['maps']}, "
              f"unmaps {res['unmaps']})")
    else:
        print(f"  device allocations    {res['device_allocs']} (frees {res['device_frees']})")
    if "stream_ordered" in res:
        so = res["stream_ordered"]
        print(f"  stream-ordered on {so['streams']} streams: {so['ns_per_event']:.0f} ns per event, peak reserved "
              f"{_mib(so['reserved_mem_high'])}, peak used {_mib(so['used_mem_high'])}")
    if "plot" in res:
        print(f"  plot                  {res['plot']}")
    if "min_capacity" in res:
        print(f"  min device capacity   {_mib(res['min_capacity'])} ({res['min_capacity']} B)")
    if args.baselines:
        for k, label in (("paddle", "Paddle auto-growth"), ("torch", "PyTorch caching")):
            print(f"  {label:21s} peak reserved {_mib(res[k]['peak_reserved'])}, "
                  f"device allocations {res[k]['device_allocs']}")
    if "async" in res:
        from paddle_rt.tools.replay_async import side_by_side
        print("\n".join(side_by_side(res["async"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
