"""Allocation logs in RMM's CSV format (``Thread,Time,Action,Pointer,Size,Stream``), the format of the replay tool and
of ``../shared/traces``: building one from recorded events, validating it, writing it (gzip'd when the path ends in
``.gz``). Pure Python; used by ``paddle_rt.memory.dump_trace`` and ``python -m paddle_rt capture``.

An event is ``(thread, time_ns, is_alloc, pointer, size, stream)``; ``size`` is the requested bytes (for a free: the
bytes of the allocation it ends). A valid log: every free matches an earlier live allocation of the same pointer and
size, no pointer is allocated twice while live, times do not go backwards.
"""
import gzip
import os

from paddle_rt._core.errors import InvalidArgument

HEADER = "Thread,Time,Action,Pointer,Size,Stream"


class AllocationLogError(InvalidArgument):
    """A log that breaks the format's rules (the message names the event and the rule)."""


def from_recording(events, who):
    """A valid log from events recorded by a tool that started watching while memory was already live: frees of
    pointers the log never allocated (allocated before the recording started) are dropped; any other broken rule
    (a pointer allocated twice, freed twice, freed with another size) raises AllocationLogError naming ``who``.
    ``events`` are sorted by time (stable: equal times keep their order)."""
    events = sorted(events, key=lambda e: e[1])
    live = {}
    seen = set()
    out = []
    for i, (thread, t, is_alloc, ptr, size, stream) in enumerate(events):
        if is_alloc:
            if ptr in live:
                raise AllocationLogError(f"{who}: event {i}: {ptr:#x} allocated again while live (a free was not "
                                         f"recorded)")
            live[ptr] = size
            seen.add(ptr)
        else:
            if ptr not in live:
                if ptr in seen:
                    raise AllocationLogError(f"{who}: event {i}: {ptr:#x} freed twice")
                continue                            # allocated before the recording started
            n = live.pop(ptr)
            if size is None:
                size = n
            elif size != n:
                raise AllocationLogError(f"{who}: event {i}: free of {ptr:#x} with {size} bytes, allocated with {n}")
        out.append((thread, t, bool(is_alloc), ptr, size, stream))
    return out


def validate(events, who):
    """Check the format's rules on ``events`` (as :func:`from_recording` returns them); raise AllocationLogError on
    the first one broken. Returns (allocations, peak live bytes)."""
    live = {}
    cur = peak = allocs = 0
    last = None
    for i, (thread, t, is_alloc, ptr, size, stream) in enumerate(events):
        if last is not None and t < last:
            raise AllocationLogError(f"{who}: event {i}: time goes backwards")
        last = t
        if not isinstance(size, int) or size < 0:
            raise AllocationLogError(f"{who}: event {i}: size {size!r} is not a byte count")
        if is_alloc:
            if ptr in live:
                raise AllocationLogError(f"{who}: event {i}: {ptr:#x} allocated again while live")
            live[ptr] = size
            cur += size
            peak = max(peak, cur)
            allocs += 1
        else:
            if live.get(ptr) != size:
                raise AllocationLogError(f"{who}: event {i}: free of {ptr:#x} which is not a live allocation of "
                                         f"{size} bytes")
            cur -= live.pop(ptr)
    return allocs, peak


def write(path, events, who):
    """Validate ``events`` and write them to ``path`` (gzip'd when it ends in ``.gz``); nothing is written when the
    log is invalid or empty. Streams are numbered 0, 1, ... in order of appearance; times are seconds from the first
    event. Returns (allocations, peak live bytes)."""
    allocs, peak = validate(events, who)
    if not allocs:
        raise AllocationLogError(f"{who}: no allocation was recorded; nothing written")
    path = os.fspath(path)
    t0 = events[0][1]
    streams, threads = {}, {}
    lines = [HEADER]
    for thread, t, is_alloc, ptr, size, stream in events:
        s = streams.setdefault(stream, len(streams))
        th = threads.setdefault(thread, len(threads))
        lines.append(f"{th},{(t - t0) / 1e9:.9f},{'allocate' if is_alloc else 'free'},{ptr:#x},{size},{s}")
    data = ("\n".join(lines) + "\n").encode()
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        if path.endswith(".gz"):
            with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
                f.write(data)
        else:
            with open(tmp, "wb") as f:
                f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return allocs, peak
