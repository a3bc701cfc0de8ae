"""``python -m paddle_rt check PLUGIN.so [--json] [--strict] [--timeout S] [--only NAME,...] [--list]``: what a
vendor runs on a plugin written against the custom-device C ABI.

Two groups of checks. *Conformance* checks exercise the plugin the way Paddle (3.3.1) and paddle_rt use it: ``fail``
only where they would misbehave with this plugin, ``warn`` for hazards that still work (fixed memory figures,
blocks aligned below the min chunk size). *Misuse probes* make one call Paddle never makes on purpose each (a double
free, an out-of-range device id, an allocation beyond the capacity, NULL or zero-size arguments): a guarded plugin
answers with an error status (``pass``); an unguarded one is a ``warn`` ("not guarded: double free aborts
(SIGABRT)"), never a ``fail``. ``--list`` prints each check's rule.

Every check runs in its own child process (``sys.executable -m paddle_rt.tools.check --child NAME PLUGIN``) that
loads the plugin with :func:`paddle_rt.load_plugin` (the bundled rt_cpu is kept out with ``PADDLE_RT_NO_RT_CPU=1``
unless it is the plugin under test), so a crash (the signal is reported, with the hook it crashed in) or a hang (a
timeout, default 20 s per check) changes that check's verdict only, and the suite goes on. The checks call the hooks
directly through :mod:`paddle_rt._core.rawabi` and judge the raw statuses.

Results: ``pass``, ``warn``, ``skip`` (with the reason, e.g. the hooks the plugin lacks) and ``fail``. The exit
status is 1 when any check failed (with ``--strict``: or warned), 0 otherwise (2 for bad arguments).

Device memory is read or written at its address only on devices the host may address (``Device.host_addressable``:
the plugin exports paddle_rt_ext_host_addressable, or its type is listed in ``PADDLE_RT_HOST_ADDRESSABLE``);
otherwise contents are checked by round trips h2d -> d2d -> d2h.
"""
import argparse
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import time
from paddle_rt.tools.cli import command_parser

__all__ = ["CHECKS", "run_checks", "format_table", "main"]

_MARK = "@@paddle_rt-check-result@@ "
MiB = 1 << 20
C_SUCCESS, C_WARNING, C_FAILED, C_ERROR, C_INTERNAL_ERROR = range(5)
_STATUS_NAMES = {0: "C_SUCCESS", 1: "C_WARNING", 2: "C_FAILED", 3: "C_ERROR", 4: "C_INTERNAL_ERROR"}
FLOAT32, SUM = 11, 0


def _sname(st):
    return _STATUS_NAMES.get(st, f"status {st}")


def _ok(st):
    return st in (C_SUCCESS, C_WARNING)


# ---------------------------------------------------------------------------------------------------------------------
# Outcomes raised by checks (in the child)

class Skip(Exception):
    pass


class Fail(Exception):
    pass


class Ctx:
    """What a check works with: the plugin, RawDevice of device 0 (``raw``), the other devices, host buffers kept
    alive, cleanups run at the end, warnings and notes collected for the detail."""

    def __init__(self, plugin):
        import paddle_rt
        from paddle_rt._core import rawabi

        self.rawabi = rawabi
        self.plugin = plugin
        self.type = plugin.device_type
        self.ndev = plugin.device_count()
        self._raws = {}
        self._buffers = []
        self._cleanups = []
        self.warnings = []
        self.notes = []
        self.paddle_rt = paddle_rt
        # PADDLE_RT_CHECK_ROUND_TRIPS=1: never touch device memory at its address, even where allowed (tests the
        # path taken for device types that are not host-addressable).
        self.direct_ok = os.environ.get("PADDLE_RT_CHECK_ROUND_TRIPS", "") in ("", "0")

    # -- devices --
    def dev(self, index=0):
        if index >= self.ndev:
            raise Skip(f"the plugin reports {self.ndev} device(s)")
        if index not in self._raws:
            self._raws[index] = self.rawabi.RawDevice(self.paddle_rt.device(f"{self.type}:{index}"))
        return self._raws[index]

    @property
    def raw(self):
        return self.dev(0)

    def need(self, *hooks):
        missing = [h for h in hooks if not self.plugin.has_hook(h)]
        if missing:
            raise Skip("plugin lacks " + ", ".join(missing))

    def has(self, hook):
        return self.plugin.has_hook(hook)

    # -- bookkeeping --
    def defer(self, fn, *args):
        self._cleanups.append((fn, args))

    def cleanup(self):
        while self._cleanups:
            fn, args = self._cleanups.pop()
            try:
                fn(*args)
            except Exception:
                pass

    def warn(self, msg):
        self.warnings.append(msg)

    def note(self, msg):
        self.notes.append(msg)

    def expect(self, cond, msg):
        if not cond:
            raise Fail(msg)

    def status(self, st, call):
        """Fail unless ``st`` is C_SUCCESS or C_WARNING."""
        if not _ok(st):
            raise Fail(f"{call} returned {_sname(st)}")

    # -- memory --
    def host(self, size):
        """A plain (pageable) host buffer of ``size`` bytes, kept alive for the check -> address."""
        import ctypes

        buf = ctypes.create_string_buffer(max(size, 1))
        self._buffers.append(buf)
        return ctypes.addressof(buf)

    def host_with(self, data):
        addr = self.host(len(data))
        self.rawabi.write_host(addr, data)
        return addr

    def alloc(self, size, raw=None):
        """Device memory that must succeed (non-NULL), freed at the end of the check."""
        raw = raw or self.raw
        st, ptr = raw.allocate(size)
        self.status(st, f"device_memory_allocate({size})")
        self.expect(ptr != 0, f"device_memory_allocate({size}) returned success with a NULL pointer")
        self.defer(raw.deallocate, ptr, size)
        return ptr

    def direct(self, raw=None):
        """Whether device memory of ``raw`` may be touched at its address."""
        raw = raw or self.raw
        return raw.host_addressable and self.direct_ok

    def can_read(self, raw=None):
        return self.direct(raw) or self.has("memory_copy_d2h")

    def can_write(self, raw=None):
        return self.direct(raw) or self.has("memory_copy_h2d")

    def read(self, ptr, size, raw=None):
        """Device memory contents: at its address when host-addressable, else through memory_copy_d2h."""
        raw = raw or self.raw
        if self.direct(raw):
            return raw.read_device(ptr, size)
        if not self.has("memory_copy_d2h"):
            raise Skip("cannot read device memory: plugin lacks memory_copy_d2h and the device type is not "
                       "host-addressable")
        h = self.host(size)
        self.status(raw.copy_d2h(h, ptr, size), "memory_copy_d2h")
        return self.rawabi.read_host(h, size)

    def write(self, ptr, data, raw=None):
        raw = raw or self.raw
        if self.direct(raw):
            raw.write_device(ptr, data)
            return
        if not self.has("memory_copy_h2d"):
            raise Skip("cannot write device memory: plugin lacks memory_copy_h2d and the device type is not "
                       "host-addressable")
        self.status(raw.copy_h2d(ptr, self.host_with(data), len(data)), "memory_copy_h2d")

    def stream(self, raw=None):
        raw = raw or self.raw
        st, s = raw.create_stream()
        self.status(st, "create_stream")
        self.defer(raw.destroy_stream, s)
        return s

    def event(self, raw=None):
        raw = raw or self.raw
        st, e = raw.create_event()
        self.status(st, "create_event")
        self.defer(raw.destroy_event, e)
        return e

    def sync(self, s, raw=None):
        raw = raw or self.raw
        self.status(raw.synchronize_stream(s), "synchronize_stream")


def pattern(size, seed):
    """Deterministic bytes that differ for different seeds and offsets."""
    base = bytes(((i * 131 + seed * 17 + (i >> 8)) & 0xFF) for i in range(min(size, 4096)))
    reps, rest = divmod(size, len(base)) if base else (0, 0)
    return base * reps + base[:rest]


def _first_diff(got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"first difference at byte {i}: got {a:#04x}, expected {b:#04x}"
    return f"length {len(got)} != {len(want)}"


def _same(ctx, got, want, what):
    ctx.expect(got == want, f"{what}: contents differ ({_first_diff(got, want)})")


# ---------------------------------------------------------------------------------------------------------------------
# The checks (each runs in a child process; returns a detail string on success)

def check_required_hooks(ctx):
    import paddle_rt

    p = ctx.plugin
    missing = [h for h in paddle_rt.REQUIRED_HOOKS if not p.has_hook(h)]
    ctx.expect(not missing, "missing required hooks: " + ", ".join(missing))
    optional = [h for h in paddle_rt.ALL_HOOKS if h not in paddle_rt.REQUIRED_HOOKS]
    have = [h for h in optional if p.has_hook(h)]
    return f"all {len(paddle_rt.REQUIRED_HOOKS)} required hooks; {len(have)}/{len(optional)} optional hooks"


def check_device_enumeration(ctx):
    from paddle_rt._core.rawabi import RawDevice

    r = ctx.raw  # device 0 made ready and current (initialize, init_device, set_device)
    st, n = r.get_device_count()
    ctx.status(st, "get_device_count")
    ctx.expect(1 <= n <= 65536, f"get_device_count reported {n} devices")
    st, ids = r.get_device_list(n)
    ctx.status(st, "get_device_list")
    ctx.expect(len(set(ids)) == n, f"get_device_list gave duplicate ids: {ids}")
    ctx.expect(all(i < (1 << 31) for i in ids), f"get_device_list gave ids that are not valid C ints: {ids}")
    for index, pid in enumerate(ids):
        d = RawDevice(ctx.paddle_rt.device(f"{ctx.type}:{index}"))
        ctx.status(d.set_device(pid), f"set_device({pid})")
        st, got = d.get_device()
        ctx.status(st, "get_device")
        ctx.expect(got == pid, f"set_device({pid}) then get_device gave {got}")
    ctx.status(r.set_device(ids[0]), f"set_device({ids[0]})")
    return f"{n} device(s), ids {ids}; set/get round trip on each"


_NULL_SUCCESS = "gave C_SUCCESS with a NULL pointer (paddle_rt raises PluginError; out of memory is C_FAILED)"


def check_allocate_free(ctx):
    r = ctx.raw
    parts = []
    for size in (1, 256, 4096 + 3):
        st, p = r.allocate(size)
        ctx.status(st, f"device_memory_allocate({size})")
        ctx.expect(p != 0, f"device_memory_allocate({size}) {_NULL_SUCCESS}")
        if ctx.can_write() and ctx.can_read():
            data = pattern(size, size)
            ctx.write(p, data)
            _same(ctx, ctx.read(p, size), data, f"block of {size} bytes")
        ctx.status(r.deallocate(p, size), f"device_memory_deallocate({size})")
    # two live blocks must not overlap
    a, b = ctx.alloc(4096), ctx.alloc(4096)
    ctx.expect(a + 4096 <= b or b + 4096 <= a, "two live 4096-byte blocks overlap")
    # large: 64 MiB, or a quarter of a smaller device
    size = 64 * MiB
    if ctx.has("device_memory_stats"):
        st, total, _ = r.memory_stats()
        if _ok(st) and 0 < total < 256 * MiB:
            size = max(total // 4 // 4096 * 4096, 8192)
    label = f"{size // MiB} MiB" if size % MiB == 0 else f"{size} B"
    st, p = r.allocate(size)
    ctx.status(st, f"device_memory_allocate({label})")
    ctx.expect(p != 0, f"device_memory_allocate({label}) {_NULL_SUCCESS}")
    if ctx.can_write() and ctx.can_read():
        tail = pattern(4096, 7)
        ctx.write(p + size - 4096, tail)
        ctx.write(p, tail[::-1])
        _same(ctx, ctx.read(p + size - 4096, 4096), tail, f"last page of a {label} block")
        _same(ctx, ctx.read(p, 4096), tail[::-1], f"first page of a {label} block")
    ctx.status(r.deallocate(p, size), f"device_memory_deallocate({label})")
    parts.append(f"1 B, 256 B, 4099 B, {label}")
    return "; ".join(parts)


def _base_alignment(ptr):
    """The largest power of two dividing ``ptr`` (capped at 1 MiB)."""
    return min(ptr & -ptr, MiB) if ptr else MiB


def check_block_alignment(ctx):
    r = ctx.raw
    want = 256
    if ctx.has("device_min_chunk_size"):
        st, v = r.size_hint("min_chunk_size")
        if _ok(st) and v:
            want = v
    worst = None
    for size in (1, 24, 256, 4096 + 3, 65536 + 5):
        st, p = r.allocate(size)
        ctx.status(st, f"device_memory_allocate({size})")
        ctx.expect(p != 0, f"device_memory_allocate({size}) {_NULL_SUCCESS}")
        ctx.defer(r.deallocate, p, size)
        align = _base_alignment(p)
        if worst is None or align < worst[0]:
            worst = (align, size, p)
    align, size, p = worst
    ctx.expect(align >= 8, f"a block of {size} bytes at {p:#x} is only {align}-byte aligned: every block the "
                           f"allocator hands out is an offset from it, so 8-byte values in it would be misaligned")
    if align < want:
        ctx.warn(f"a block of {size} bytes at {p:#x} is {align}-byte aligned, less than "
                 f"{'the min chunk size' if want != 256 else 'the 256 bytes assumed without a min chunk size'} "
                 f"({want}): blocks carved from it are aligned to {align} only")
    return f"bases aligned to at least {align} bytes (wanted {want})"


def check_memory_stats(ctx):
    r = ctx.raw
    ctx.need("device_memory_stats")
    st, total, free = r.memory_stats()
    ctx.status(st, "device_memory_stats")
    if free > total:
        ctx.warn(f"free ({free}) > total ({total})")
    if total == 0:
        return "total = free = 0 (no stats, as Paddle's default)"
    size = min(64 * MiB, max(free // 4, 4096))
    p = ctx.alloc(size)
    st, total2, free2 = r.memory_stats()
    ctx.status(st, "device_memory_stats")
    if free2 > total2:
        ctx.warn(f"free ({free2}) > total ({total2}) after an allocation")
    if free2 >= free:
        ctx.warn(f"free did not decrease after allocating {size} bytes ({free} -> {free2}): fixed figures work "
                 f"(Paddle reads them to size its first chunk), but out-of-memory messages will report them")
    if total2 != total:
        ctx.warn(f"total changed after an allocation ({total} -> {total2})")
    ctx.cleanup()
    st, total3, free3 = r.memory_stats()
    ctx.status(st, "device_memory_stats")
    if free3 < free2:
        ctx.warn(f"free did not increase after freeing {size} bytes ({free2} -> {free3})")
    return f"total {total}, free {free} -> {free2} after {size} bytes -> {free3} after the free"


def check_copy_h2d(ctx):
    r = ctx.raw
    ctx.need("memory_copy_h2d")
    n = 65536 + 13
    d = ctx.alloc(n)
    data = pattern(n, 1)
    ctx.status(r.copy_h2d(d, ctx.host_with(data), n), "memory_copy_h2d")
    _same(ctx, ctx.read(d, n), data, "h2d")
    # a partial copy into the middle leaves the rest alone
    part = pattern(100, 2)
    ctx.status(r.copy_h2d(d + 7, ctx.host_with(part), 100), "memory_copy_h2d (offset 7, 100 bytes)")
    _same(ctx, ctx.read(d, n), data[:7] + part + data[107:], "partial h2d")
    ctx.status(r.copy_h2d(d, ctx.host(1), 0), "memory_copy_h2d of 0 bytes")
    return f"{n} bytes and a partial copy verified " + ("at the device address" if ctx.direct() else "by d2h")


def check_copy_d2h(ctx):
    r = ctx.raw
    ctx.need("memory_copy_d2h")
    n = 65536 + 13
    d = ctx.alloc(n)
    data = pattern(n, 3)
    ctx.write(d, data)
    h = ctx.host(n)
    ctx.status(r.copy_d2h(h, d, n), "memory_copy_d2h")
    _same(ctx, ctx.rawabi.read_host(h, n), data, "d2h")
    h2 = ctx.host_with(b"\x5a" * 200)
    ctx.status(r.copy_d2h(h2 + 50, d + 10, 100), "memory_copy_d2h (offset 10, 100 bytes)")
    _same(ctx, ctx.rawabi.read_host(h2, 200), b"\x5a" * 50 + data[10:110] + b"\x5a" * 50, "partial d2h")
    return f"{n} bytes and a partial copy"


def check_copy_d2d(ctx):
    r = ctx.raw
    ctx.need("memory_copy_d2d")
    n = 65536 + 13
    a, b = ctx.alloc(n), ctx.alloc(n)
    data, other = pattern(n, 4), pattern(n, 5)
    ctx.write(a, data)
    ctx.write(b, other)
    ctx.status(r.copy_d2d(b, a, n), "memory_copy_d2d")
    _same(ctx, ctx.read(b, n), data, "d2d")
    ctx.write(b, other)
    ctx.status(r.copy_d2d(b + 1000, a + 3, 500), "memory_copy_d2d (500 bytes at offsets)")
    _same(ctx, ctx.read(b, n), other[:1000] + data[3:503] + other[1500:], "partial d2d")
    how = "at the device addresses" if ctx.direct() else "by h2d -> d2d -> d2h round trips"
    return f"{n} bytes and a partial copy, verified {how}"


def check_copy_p2p(ctx):
    ctx.need("memory_copy_p2p")
    if ctx.ndev < 2:
        raise Skip(f"needs 2 devices, the plugin reports {ctx.ndev}")
    r0, r1 = ctx.dev(0), ctx.dev(1)
    n = 65536 + 13
    r1.activate()
    b = ctx.alloc(n, r1)
    ctx.write(b, pattern(n, 9), r1)
    r0.activate()
    a = ctx.alloc(n, r0)
    data = pattern(n, 6)
    ctx.write(a, data, r0)
    ctx.status(r0.copy_p2p(r1, b, a, n), "memory_copy_p2p (device 0 -> 1)")
    r1.activate()
    _same(ctx, ctx.read(b, n, r1), data, "p2p")
    r0.activate()
    return f"{n} bytes device 0 -> device 1"


def check_memset(ctx):
    r = ctx.raw
    ctx.need("device_memory_set")
    n = 65536 + 13
    d = ctx.alloc(n)
    ctx.status(r.memset(d, 0xAB, n), "device_memory_set")
    _same(ctx, ctx.read(d, n), b"\xab" * n, "memset 0xAB")
    ctx.status(r.memset(d + 5, 0, 100), "device_memory_set (offset 5, 100 bytes)")
    _same(ctx, ctx.read(d, n), b"\xab" * 5 + b"\0" * 100 + b"\xab" * (n - 105), "partial memset")
    return f"{n} bytes and a partial memset"


def check_host_memory(ctx):
    r = ctx.raw
    parts = []
    kinds = [("host_memory_allocate", "host_memory_deallocate", r.host_allocate, r.host_deallocate, "pinned"),
             ("unified_memory_allocate", "unified_memory_deallocate", r.unified_allocate, r.unified_deallocate,
              "unified")]
    present = [k for k in kinds if ctx.has(k[0]) and ctx.has(k[1])]
    if not present:
        raise Skip("plugin lacks " + ", ".join(h for k in kinds for h in k[:2] if not ctx.has(h)))
    for alloc_name, free_name, alloc, free, label in present:
        n = 1 << 20
        st, h = alloc(n)
        ctx.status(st, alloc_name)
        ctx.expect(h != 0, f"{alloc_name} gave success with NULL")
        data = pattern(n, 11)
        ctx.rawabi.write_host(h, data)  # pinned/unified memory is host memory
        _same(ctx, ctx.rawabi.read_host(h, n), data, f"{label} host memory")
        if ctx.has("memory_copy_h2d") and ctx.has("memory_copy_d2h"):
            d = ctx.alloc(n)
            ctx.status(r.copy_h2d(d, h, n), f"memory_copy_h2d from {label} memory")
            ctx.rawabi.write_host(h, b"\0" * n)
            ctx.status(r.copy_d2h(h, d, n), f"memory_copy_d2h to {label} memory")
            _same(ctx, ctx.rawabi.read_host(h, n), data, f"round trip through {label} memory")
        ctx.status(free(h, n), free_name)
        parts.append(label)
    missing = [k[0] for k in kinds if k not in present]
    return "; ".join(parts) + (f" (plugin lacks {', '.join(missing)})" if missing else "")


def check_size_hints(ctx):
    r = ctx.raw
    got = {}
    for name in ctx.rawabi.SIZE_HINTS:
        if not ctx.has("device_" + name):
            continue
        st, v = r.size_hint(name)
        ctx.status(st, "device_" + name)
        got[name] = v
    if not got:
        raise Skip("plugin lacks " + ", ".join("device_" + n for n in ctx.rawabi.SIZE_HINTS)
                   + " (Paddle then uses min chunk 1, padding 0)")
    if "min_chunk_size" in got:
        ctx.expect(got["min_chunk_size"] > 0, "device_min_chunk_size reported 0 (Paddle rounds to multiples of it)")
    if "max_alloc_size" in got and got["max_alloc_size"] == 0:
        ctx.warn("device_max_alloc_size reported 0")
    return ", ".join(f"{k} {v}" for k, v in got.items())


def _async_hooks(ctx):
    return [h for h in ("async_memory_copy_h2d", "async_memory_copy_d2h", "async_memory_copy_d2d")
            if ctx.has(h)]


def check_stream_lifecycle(ctx):
    r = ctx.raw
    ctx.need("create_stream", "destroy_stream")
    st, s = r.create_stream()
    ctx.status(st, "create_stream")
    parts = ["handle not written (NULL)" if s == 0 else "created"]
    if ctx.has("query_stream"):
        st = r.query_stream(s)
        ctx.expect(st == C_SUCCESS, f"query_stream on an idle stream returned {_sname(st)} (C_SUCCESS expected)")
        parts.append("idle query C_SUCCESS")
    if ctx.has("synchronize_stream"):
        ctx.status(r.synchronize_stream(s), "synchronize_stream (idle)")
        parts.append("synchronize")
    ctx.status(r.destroy_stream(s), "destroy_stream")
    streams = []
    for _ in range(8):
        st, s2 = r.create_stream()
        ctx.status(st, "create_stream (8 streams)")
        streams.append(s2)
    for s2 in streams:
        ctx.status(r.destroy_stream(s2), "destroy_stream (8 streams)")
    parts.append("8 more created and destroyed")
    return "; ".join(parts)


def check_async_copies(ctx):
    ctx.need("create_stream", "synchronize_stream")
    hooks = _async_hooks(ctx)
    if not hooks:
        raise Skip("plugin lacks async_memory_copy_h2d, _d2h and _d2d")
    r = ctx.raw
    s = ctx.stream()
    n = 65536 + 13
    a, b = ctx.alloc(n), ctx.alloc(n)
    data = pattern(n, 21)
    done = []
    if ctx.has("async_memory_copy_h2d"):
        ctx.status(r.async_copy_h2d(s, a, ctx.host_with(data), n), "async_memory_copy_h2d")
        ctx.sync(s)
        _same(ctx, ctx.read(a, n), data, "async h2d")
        done.append("h2d")
    else:
        ctx.write(a, data)
    if ctx.has("async_memory_copy_d2d"):
        ctx.write(b, pattern(n, 22))
        ctx.status(r.async_copy_d2d(s, b, a, n), "async_memory_copy_d2d")
        ctx.sync(s)
        _same(ctx, ctx.read(b, n), data, "async d2d")
        done.append("d2d")
    if ctx.has("async_memory_copy_d2h"):
        h = ctx.host(n)
        ctx.status(r.async_copy_d2h(s, h, a, n), "async_memory_copy_d2h")
        ctx.sync(s)
        _same(ctx, ctx.rawabi.read_host(h, n), data, "async d2h")
        done.append("d2h")
    if ctx.has("async_memory_copy_p2p") and ctx.ndev >= 2:
        r1 = ctx.dev(1)
        r1.activate()
        c = ctx.alloc(n, r1)
        ctx.write(c, pattern(n, 23), r1)
        r.activate()
        ctx.status(r.async_copy_p2p(r1, s, c, a, n), "async_memory_copy_p2p (device 0 -> 1)")
        ctx.sync(s)
        r1.activate()
        _same(ctx, ctx.read(c, n, r1), data, "async p2p")
        r.activate()
        done.append("p2p")
    missing = [h for h in ("async_memory_copy_h2d", "async_memory_copy_d2h", "async_memory_copy_d2d")
               if h not in hooks]
    return ", ".join(done) + (f" (plugin lacks {', '.join(missing)})" if missing else "")


def check_stream_ordering(ctx):
    ctx.need("create_stream", "synchronize_stream", "async_memory_copy_h2d", "async_memory_copy_d2d",
             "async_memory_copy_d2h")
    r = ctx.raw
    s = ctx.stream()
    n = 1 << 20
    steps = 16
    a, b = ctx.alloc(n), ctx.alloc(n)
    sources = [ctx.host_with(pattern(n, 100 + i)) for i in range(steps)]
    out = ctx.host(n)
    for i in range(steps):
        ctx.status(r.async_copy_h2d(s, a, sources[i], n), f"async_memory_copy_h2d #{i}")
        ctx.status(r.async_copy_d2d(s, b, a, n), f"async_memory_copy_d2d #{i}")
    ctx.status(r.async_copy_d2h(s, out, b, n), "async_memory_copy_d2h")
    ctx.sync(s)
    _same(ctx, ctx.rawabi.read_host(out, n), pattern(n, 100 + steps - 1),
          f"a chain of {steps} h2d+d2d copies then d2h (the last value is expected)")
    if ctx.has("query_stream"):
        st = r.query_stream(s)
        ctx.expect(st == C_SUCCESS, f"query_stream after synchronize_stream returned {_sname(st)}")
    return f"{2 * steps + 1} async copies of 1 MiB in order"


def check_events(ctx):
    r = ctx.raw
    s = 0
    where = "NULL stream"
    if ctx.has("create_stream"):
        s = ctx.stream()
        where = "a stream"
    st, e = r.create_event()
    ctx.status(st, "create_event")
    ctx.status(r.record_event(s, e), f"record_event on {where}")
    ctx.status(r.synchronize_event(e), "synchronize_event")
    parts = [f"record on {where}, synchronize"]
    if ctx.has("query_event"):
        st = r.query_event(e)
        ctx.expect(st == C_SUCCESS, f"query_event after synchronize_event returned {_sname(st)}")
        parts.append("query C_SUCCESS")
    # re-record after work
    if s and ctx.has("async_memory_copy_h2d"):
        n = 1 << 20
        d = ctx.alloc(n)
        ctx.status(r.async_copy_h2d(s, d, ctx.host_with(pattern(n, 31)), n), "async_memory_copy_h2d")
        ctx.status(r.record_event(s, e), "record_event (again, after work)")
        ctx.status(r.synchronize_event(e), "synchronize_event")
        if ctx.has("query_event"):
            st = r.query_event(e)
            ctx.expect(st == C_SUCCESS, f"query_event after the second synchronize_event returned {_sname(st)}")
        _same(ctx, ctx.read(d, n), pattern(n, 31), "work before a synchronised event")
        parts.append("work before the event is done after synchronize_event")
    ctx.status(r.destroy_event(e), "destroy_event")
    events = []
    for _ in range(16):
        st, e2 = r.create_event()
        ctx.status(st, "create_event (16 events)")
        events.append(e2)
    for e2 in events:
        ctx.status(r.destroy_event(e2), "destroy_event (16 events)")
    parts.append("16 created and destroyed")
    return "; ".join(parts)


def check_stream_wait_event(ctx):
    ctx.need("create_stream", "stream_wait_event", "synchronize_stream", "async_memory_copy_h2d",
             "async_memory_copy_d2h")
    r = ctx.raw
    s1, s2 = ctx.stream(), ctx.stream()
    e = ctx.event()
    n = 4 * MiB
    d = ctx.alloc(n)
    steps = 8
    sources = [ctx.host_with(pattern(n, 40 + i)) for i in range(steps)]
    for i in range(steps):
        ctx.status(r.async_copy_h2d(s1, d, sources[i], n), f"async_memory_copy_h2d #{i} on stream 1")
    ctx.status(r.record_event(s1, e), "record_event on stream 1")
    ctx.status(r.stream_wait_event(s2, e), "stream_wait_event (stream 2 waits for stream 1)")
    out = ctx.host(n)
    ctx.status(r.async_copy_d2h(s2, out, d, n), "async_memory_copy_d2h on stream 2")
    ctx.sync(s2)
    _same(ctx, ctx.rawabi.read_host(out, n), pattern(n, 40 + steps - 1),
          "stream 2 read after waiting on an event recorded after stream 1's copies")
    ctx.sync(s1)
    return f"d2h on stream 2 saw the last of {steps} copies on stream 1"


def check_callbacks(ctx):
    ctx.need("create_stream", "stream_add_callback", "synchronize_stream")
    r = ctx.raw
    s = ctx.stream()
    stray_before = ctx.rawabi.stray_callback_calls()
    seen = []
    st, t1 = r.add_callback(s, lambda: seen.append(1))
    ctx.status(st, "stream_add_callback")
    ctx.sync(s)
    ctx.expect(t1.wait(5.0), "a callback did not run within 5 s of synchronize_stream")
    ctx.expect(t1.exception is None, f"the callback raised {t1.exception!r}")
    ctx.expect(ctx.rawabi.stray_callback_calls() == stray_before,
               "the plugin called a callback more than once (or with a user_data it was not given)")
    ctx.expect(seen == [1], f"the callback's effect is missing ({seen})")
    parts = ["runs"]
    if ctx.has("async_memory_copy_h2d") and ctx.has("async_memory_copy_d2h"):
        n = 4 * MiB
        d = ctx.alloc(n)
        want = pattern(n, 51)
        h = ctx.host(n)
        later = ctx.host_with(pattern(n, 52))
        observed = {}
        ctx.status(r.async_copy_h2d(s, d, ctx.host_with(want), n), "async_memory_copy_h2d")
        ctx.status(r.async_copy_d2h(s, h, d, n), "async_memory_copy_d2h")
        st, t2 = r.add_callback(s, lambda: observed.setdefault("data", ctx.rawabi.read_host(h, n)))
        ctx.status(st, "stream_add_callback (after copies)")
        ctx.status(r.async_copy_h2d(s, d, later, n), "async_memory_copy_h2d (after the callback)")
        ctx.status(r.async_copy_d2h(s, h, d, n), "async_memory_copy_d2h (after the callback)")
        st, t3 = r.add_callback(s, lambda: seen.append(3))
        ctx.status(st, "stream_add_callback (third)")
        ctx.sync(s)
        ctx.expect(t2.wait(5.0) and t3.wait(5.0), "callbacks did not run within 5 s of synchronize_stream")
        ctx.expect(t1.order < t2.order < t3.order, f"callbacks ran out of order ({t1.order}, {t2.order}, {t3.order})")
        _same(ctx, observed.get("data", b""), want,
              "host data seen by a callback queued after an async d2h (it must run after prior work and "
              "before later work)")
        parts.append("in order after prior work and before later work")
    else:
        st, t2 = r.add_callback(s, lambda: seen.append(2))
        ctx.status(st, "stream_add_callback")
        ctx.sync(s)
        ctx.expect(t2.wait(5.0) and t1.order < t2.order, "two callbacks ran out of order or not at all")
        parts.append("two in order (no async copies to order against)")
    # an exception in the callable must not break the stream
    st, t4 = r.add_callback(s, lambda: 1 / 0)
    ctx.status(st, "stream_add_callback")
    ctx.sync(s)
    ctx.expect(t4.wait(5.0), "the raising callback did not run")
    ctx.expect(ctx.rawabi.stray_callback_calls() == stray_before,
               "the plugin called a callback more than once (or with a user_data it was not given)")
    return "; ".join(parts)


def check_synchronize_device(ctx):
    ctx.need("synchronize_device")
    r = ctx.raw
    ctx.status(r.synchronize_device(), "synchronize_device (idle)")
    if ctx.has("create_stream") and ctx.has("async_memory_copy_h2d"):
        s = ctx.stream()
        n = 4 * MiB
        d = ctx.alloc(n)
        ctx.status(r.async_copy_h2d(s, d, ctx.host_with(pattern(n, 61)), n), "async_memory_copy_h2d")
        ctx.status(r.synchronize_device(), "synchronize_device")
        _same(ctx, ctx.read(d, n), pattern(n, 61), "stream work after synchronize_device")
        return "idle; waits for stream work"
    return "idle"


def check_xccl(ctx):
    ctx.need("xccl_get_unique_id_size", "xccl_get_unique_id", "xccl_comm_init_rank", "xccl_destroy_comm",
             "xccl_all_reduce")
    import struct

    r = ctx.raw
    st, idsz = r.xccl_get_unique_id_size()
    ctx.status(st, "xccl_get_unique_id_size")
    ctx.expect(0 < idsz <= (1 << 20), f"xccl_get_unique_id_size reported {idsz}")
    st, uid = r.xccl_get_unique_id(idsz)
    ctx.status(st, "xccl_get_unique_id")
    st, comm = r.xccl_comm_init_rank(1, uid, 0)
    ctx.status(st, "xccl_comm_init_rank(nranks=1, rank=0)")
    values = [1.5, -2.0, 3.25, 1e6, 0.0]
    data = struct.pack(f"{len(values)}f", *values)
    n = len(data)
    send, recv = ctx.alloc(n), ctx.alloc(n)
    ctx.write(send, data)
    ctx.write(recv, b"\0" * n)
    s = ctx.stream() if ctx.has("create_stream") else 0
    ctx.status(r.xccl_all_reduce(send, recv, len(values), FLOAT32, SUM, comm, s), "xccl_all_reduce(SUM, 1 rank)")
    if s and ctx.has("synchronize_stream"):
        ctx.sync(s)
    got = ctx.read(recv, n)
    ctx.expect(got == data, f"all_reduce on 1 rank gave {struct.unpack(f'{len(values)}f', got)}, expected {values}")
    ctx.status(r.xccl_destroy_comm(comm), "xccl_destroy_comm")
    return f"1-rank communicator; all_reduce SUM of {len(values)} floats"


# ---------------------------------------------------------------------------------------------------------------------
# Misuse probes: calls Paddle never makes on purpose. A guarded plugin answers with an error status; an unguarded one
# is a hazard (a warning), never a failure. A crash or hang in a probe is reported under the probe's name only.

def _unguarded(ctx, what):
    ctx.warn(f"not guarded: {what}")


def probe_double_free(ctx):
    r = ctx.raw
    st, p = r.allocate(4096)
    ctx.status(st, "device_memory_allocate(4096)")
    ctx.expect(p != 0, f"device_memory_allocate(4096) {_NULL_SUCCESS}")
    ctx.status(r.deallocate(p, 4096), "device_memory_deallocate(4096)")
    st = r.deallocate(p, 4096)
    if _ok(st):
        _unguarded(ctx, f"double free returned {_sname(st)}")
        return ""
    return f"double free -> {_sname(st)}"


def probe_host_double_free(ctx):
    r = ctx.raw
    kinds = [("host_memory_allocate", "host_memory_deallocate", r.host_allocate, r.host_deallocate),
             ("unified_memory_allocate", "unified_memory_deallocate", r.unified_allocate, r.unified_deallocate)]
    present = [k for k in kinds if ctx.has(k[0]) and ctx.has(k[1])]
    if not present:
        raise Skip("plugin lacks " + ", ".join(h for k in kinds for h in k[:2] if not ctx.has(h)))
    parts = []
    for alloc_name, free_name, alloc, free in present:
        st, h = alloc(4096)
        ctx.status(st, alloc_name)
        ctx.expect(h != 0, f"{alloc_name} gave C_SUCCESS with a NULL pointer")
        ctx.status(free(h, 4096), free_name)
        st = free(h, 4096)
        if _ok(st):
            _unguarded(ctx, f"double {free_name} returned {_sname(st)}")
        else:
            parts.append(f"double {free_name} -> {_sname(st)}")
    return "; ".join(parts)


def probe_bad_device_id(ctx):
    r = ctx.raw
    st, ids = r.get_device_list(ctx.ndev)
    ctx.status(st, "get_device_list")
    bogus = max(ids) + 1000
    st = r.set_device(bogus)
    ctx.status(r.set_device(ids[0]), f"set_device({ids[0]})")
    if _ok(st):
        _unguarded(ctx, f"set_device({bogus}) (no such device) returned {_sname(st)}")
        return ""
    return f"set_device({bogus}) -> {_sname(st)}"


def probe_beyond_capacity(ctx):
    r = ctx.raw
    ctx.need("device_memory_stats")
    st, total, free = r.memory_stats()
    ctx.status(st, "device_memory_stats")
    if total == 0:
        raise Skip("device_memory_stats reports total = 0 (no capacity to exceed)")
    size = total + MiB
    st, p = r.allocate(size)
    if _ok(st) and p:
        r.deallocate(p, size)
        _unguarded(ctx, f"device_memory_allocate({size}) beyond the advertised capacity of {total} bytes "
                        f"succeeded (host-backed memory?); Paddle and paddle_rt still work, but the figure misleads")
        return ""
    if _ok(st):
        ctx.warn(f"device_memory_allocate({size}) beyond the capacity answered C_SUCCESS with a NULL pointer: "
                 f"paddle_rt raises PluginError for that (out of memory is C_FAILED; Paddle takes both)")
    how = "C_SUCCESS with a NULL pointer" if _ok(st) else _sname(st)
    st2, p2 = r.allocate(4096)
    ctx.status(st2, "device_memory_allocate(4096) after a refused allocation")
    ctx.expect(p2 != 0, f"device_memory_allocate(4096) after a refused allocation {_NULL_SUCCESS}")
    ctx.status(r.deallocate(p2, 4096), "device_memory_deallocate(4096)")
    return f"{size} bytes (capacity {total}) refused with {how}; the device works afterwards"


def probe_zero_size(ctx):
    r = ctx.raw
    st, p = r.allocate(0)
    if _ok(st) and p:
        ctx.status(r.deallocate(p, 0), "device_memory_deallocate of a size-0 block")
        return "allocate(0) -> a pointer that frees"
    return "allocate(0) -> NULL" if _ok(st) else f"allocate(0) -> {_sname(st)}"


def probe_null_free(ctx):
    st = ctx.raw.deallocate(0, 4096)
    if _ok(st):
        return f"deallocate(NULL) -> {_sname(st)} (a no-op, like free(NULL))"
    return f"deallocate(NULL) -> {_sname(st)}"


class Check:
    """One entry of the suite: ``group`` is ``"conformance"`` (does the plugin work under Paddle and paddle_rt) or
    ``"probe"`` (a deliberate misuse: does the plugin guard against it); ``rule`` says when it fails and warns;
    ``misuse`` (probes) names the misuse for a crash or hang report."""

    def __init__(self, name, fn, what, rule, group="conformance", misuse=None):
        self.name, self.fn, self.what, self.rule, self.group, self.misuse = name, fn, what, rule, group, misuse


_PROBE_RULE = "never fails; warn when not guarded (success status, crash or hang)"

#: The checks, in the order they run: conformance first, then the misuse probes.
CHECKS = [
    Check("handshake", None, "dlopen, InitPlugin, version and validation (paddle_rt.load_plugin)",
          "fail when Paddle would refuse the plugin (no InitPlugin, old version, device_type NULL, a required hook "
          "missing)"),
    Check("required_hooks", check_required_hooks, "the ten hooks Paddle requires", "fail when one is missing"),
    Check("device_enumeration", check_device_enumeration, "count, list, set/get device round trip",
          "fail on an error status, a count Paddle would not use, duplicate ids, or a set/get mismatch"),
    Check("allocate_free", check_allocate_free, "sizes 1 B to 64 MiB, contents, no overlap",
          "fail on an error status, success with a NULL pointer, wrong contents or overlapping blocks"),
    Check("block_alignment", check_block_alignment, "base pointers aligned for the blocks carved from them",
          "fail below 8-byte alignment; warn below the min chunk size (256 without one)"),
    Check("memory_stats", check_memory_stats, "free <= total; free falls after an allocation",
          "fail on an error status; warn on fixed or inconsistent figures (Paddle still works)"),
    Check("copy_h2d", check_copy_h2d, "memory_copy_h2d with content checks", "fail on an error status or wrong contents"),
    Check("copy_d2h", check_copy_d2h, "memory_copy_d2h with content checks", "fail on an error status or wrong contents"),
    Check("copy_d2d", check_copy_d2d, "memory_copy_d2d with content checks", "fail on an error status or wrong contents"),
    Check("copy_p2p", check_copy_p2p, "memory_copy_p2p between devices 0 and 1",
          "fail on an error status or wrong contents"),
    Check("memset", check_memset, "device_memory_set", "fail on an error status or wrong contents"),
    Check("host_memory", check_host_memory, "pinned and unified host memory",
          "fail on an error status, success with NULL or wrong contents"),
    Check("size_hints", check_size_hints, "device_*_size hooks",
          "fail on an error status or a min chunk size of 0; warn on a max alloc size of 0"),
    Check("stream_lifecycle", check_stream_lifecycle, "create, idle query, synchronize, destroy",
          "fail on an error status"),
    Check("async_copies", check_async_copies, "async_memory_copy_* with content checks",
          "fail on an error status or wrong contents"),
    Check("stream_ordering", check_stream_ordering, "a chain of async copies gives the last value",
          "fail when work on one stream runs out of order"),
    Check("events", check_events, "record, synchronize, query, destroy", "fail on an error status or a wrong query"),
    Check("stream_wait_event", check_stream_wait_event, "cross-stream ordering through an event",
          "fail when the wait does not order the streams"),
    Check("callbacks", check_callbacks, "stream_add_callback runs, in order",
          "fail when a callback is lost, runs twice or out of order"),
    Check("synchronize_device", check_synchronize_device, "synchronize_device waits for stream work",
          "fail when it returns before the work is done"),
    Check("xccl", check_xccl, "1-rank communicator and all_reduce", "fail on an error status or a wrong sum"),
    Check("probe_double_free", probe_double_free, "device_memory_deallocate twice on one block", _PROBE_RULE,
          "probe", "double free"),
    Check("probe_host_double_free", probe_host_double_free, "host/unified memory freed twice", _PROBE_RULE,
          "probe", "double free of host memory"),
    Check("probe_bad_device_id", probe_bad_device_id, "set_device with an id that is not in the device list",
          _PROBE_RULE, "probe", "set_device with an out-of-range id"),
    Check("probe_beyond_capacity", probe_beyond_capacity, "an allocation larger than the advertised capacity",
          _PROBE_RULE, "probe", "an allocation beyond the capacity"),
    Check("probe_zero_size", probe_zero_size, "device_memory_allocate of 0 bytes", _PROBE_RULE, "probe",
          "allocate(0)"),
    Check("probe_null_free", probe_null_free, "device_memory_deallocate(NULL)", _PROBE_RULE, "probe",
          "deallocate(NULL)"),
]
_BY_NAME = {c.name: c for c in CHECKS}


# ---------------------------------------------------------------------------------------------------------------------
# Child side

def _emit(result):
    sys.stdout.write("\n" + _MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


def _child(name, path, timeout):
    import faulthandler

    # A hang inside a hook: dump where we are (the parent names the hook from it) and leave.
    faulthandler.enable()
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True)
    import paddle_rt

    try:
        plugin = paddle_rt.load_plugin(path)
    except paddle_rt.PluginLoadError as exc:
        _emit({"result": "fail", "detail": str(exc.reason)})
        return 0
    except Exception as exc:
        _emit({"result": "fail", "detail": f"{type(exc).__name__}: {exc}"})
        return 0
    if name == "handshake":
        _emit({"result": "pass", "detail": f"{plugin.device_type} ({plugin.sub_device_type}) "
                                           f"v{'.'.join(map(str, plugin.version))}"})
        return 0
    check = _BY_NAME[name]
    fn = check.fn
    ctx = None
    try:
        ctx = Ctx(plugin)
        if ctx.ndev == 0 and name != "required_hooks":
            raise Skip("the plugin reports no devices")
        detail = fn(ctx) or ""
        result = "warn" if ctx.warnings else "pass"
        if ctx.warnings:
            detail = "; ".join(["warning: " + w for w in ctx.warnings] + ([detail] if detail else []))
    except Skip as exc:
        result, detail = "skip", str(exc)
    except Fail as exc:
        result, detail = "fail", str(exc)
    except Exception as exc:
        result, detail = "fail", f"{type(exc).__name__}: {exc}"
    finally:
        if check.group == "probe" and result == "fail":
            # a probe judges only the misuse; a plugin that cannot even set it up fails its conformance checks
            result, detail = "skip", f"could not set up the probe: {detail}"
        if ctx is not None:
            ctx.cleanup()
    _emit({"result": result, "detail": detail})
    if timeout > 0:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(timeout, exit=True)  # a fresh budget for teardown at exit
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# Parent side

def _package_parent():
    here = os.path.dirname(os.path.abspath(__file__))          # .../paddle_rt/tools
    return os.path.dirname(os.path.dirname(here))


def _bundled_path():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "librt_cpu.so")


def _child_env(path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_parent(), env.get("PYTHONPATH", "")) if p)
    for var in ("CUSTOM_DEVICE_ROOT", "PADDLE_RT_PLUGIN_PATH"):
        env.pop(var, None)
    if os.path.realpath(path) == os.path.realpath(_bundled_path()):
        env.pop("PADDLE_RT_NO_RT_CPU", None)
    else:
        env["PADDLE_RT_NO_RT_CPU"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


_FAULT_LINE = re.compile(r"paddle_rt: fatal signal \w+ inside plugin '[^']*' \(.*\), hook (\w+)")


def _where(stderr):
    """The hook a crash or hang happened in: from paddle_rt's fatal-signal line when there is one, else from a
    faulthandler dump (the innermost frame in this file, with its source line)."""
    m = _FAULT_LINE.search(stderr)
    if m:
        return f"in {m.group(1)}"
    here = os.path.abspath(__file__)
    # faulthandler dumps every thread; the check runs in the one whose stack holds _child
    sections, current = [], []
    for line in stderr.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) and current:
            sections.append(current)
            current = []
        current.append(line)
    sections.append(current)
    main = [sec for sec in sections if any("in _child" in line for line in sec)]
    for line in (main[0] if main else stderr.splitlines()):
        m = _FRAME.search(line)
        if not m:
            continue
        fname, lineno, func = m.group(1), int(m.group(2)), m.group(3)
        if os.path.abspath(fname) == here and func != "_child":
            src = linecache.getline(here, lineno).strip()
            hook = re.search(r"\b(?:r|r0|r1|raw|ctx\.raw)\.(\w+)\(", src)
            if hook:
                from paddle_rt._core.rawabi import HOOK_OF

                return f"in {HOOK_OF.get(hook.group(1), hook.group(1))} ({func}, line {lineno})"
            return f"in {func}, line {lineno}: {src}"
    return ""


def _tail(text, n=3):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])


_CRASH_VERB = {signal.SIGABRT: "aborts", signal.SIGSEGV: "crashes", signal.SIGBUS: "crashes"}


def _signame(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _run_one(name, path, timeout):
    cmd = [sys.executable, "-m", "paddle_rt.tools.check", "--child", name, "--timeout", str(timeout), path]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8",
                            errors="replace", env=_child_env(path),
                            cwd=_package_parent(), start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        out, err = proc.communicate()
    seconds = round(time.monotonic() - t0, 2)
    rc = proc.returncode
    reported = None
    for line in out.splitlines():
        if line.startswith(_MARK):
            try:
                reported = json.loads(line[len(_MARK):])
            except ValueError:
                pass
    hung = timed_out or "Timeout (" in err
    check = _BY_NAME[name]
    if reported is not None and rc == 0 and not timed_out:
        return dict(name=name, group=check.group, result=reported["result"], detail=reported["detail"],
                    seconds=seconds)
    if check.group == "probe" and (reported is None or reported["result"] != "fail"):
        # the misuse took the process down: that is the probe's answer, and only this probe's
        if hung:
            how = f"hangs (no answer within {timeout:g} s)"
        elif rc < 0:
            how = f"{_CRASH_VERB.get(-rc, 'crashes with')} ({_signame(-rc)})"
        else:
            how = f"ends the process (exit status {rc})"
        where = _where(err)
        return dict(name=name, group=check.group, result="warn",
                    detail=f"not guarded: {check.misuse} {how}" + (f" {where}" if where else ""), seconds=seconds)
    if hung:
        what = f"hung: no result within {timeout:g} s"
        if reported is not None:
            what = f"{reported['result']} ({reported['detail']}), then hung at exit (deinit_device/finalize)"
    elif rc < 0:
        signame = _signame(-rc)
        what = f"crashed with {signame}"
        if reported is not None:
            what = f"{reported['result']} ({reported['detail']}), then crashed with {signame} at exit"
    else:
        what = f"the check process exited with status {rc}"
        if reported is not None:
            what = f"{reported['result']} ({reported['detail']}), then exited with status {rc}"
        elif err.strip():
            what += f": {_tail(err)}"
    where = _where(err)
    if where:
        what += f" {where}"
    return dict(name=name, group=check.group, result="fail", detail=what, seconds=seconds)


def run_checks(path, timeout=20.0, only=None, progress=None):
    """Run the suite on the plugin at ``path``; returns a list of dicts (name, result, detail, seconds)."""
    path = os.path.abspath(path)
    results = []
    names = [c.name for c in CHECKS if only is None or c.name in only or c.name == "handshake"]
    loaded = True
    for name in names:
        if not loaded:
            res = dict(name=name, group=_BY_NAME[name].group, result="skip", detail="the plugin did not load",
                       seconds=0.0)
        else:
            res = _run_one(name, path, timeout)
            if name == "handshake" and res["result"] == "fail":
                loaded = False
        results.append(res)
        if progress:
            progress(res)
    return results


def format_table(results):
    w = max([len(r["name"]) for r in results] + [5])
    lines = [f"{'check':{w}}  {'result':6}  detail", f"{'-' * w}  ------  ------"]
    in_probes = False
    for r in results:
        if r.get("group") == "probe" and not in_probes:
            in_probes = True
            lines.append(f"-- misuse probes (calls Paddle never makes; warn: the plugin does not guard against it)")
        lines.append(f"{r['name']:{w}}  {r['result']:6}  {r['detail']}")
    counts = {k: sum(1 for r in results if r["result"] == k) for k in ("pass", "warn", "skip", "fail")}
    lines.append("")
    lines.append(", ".join(f"{v} {k}" for k, v in counts.items()))
    return "\n".join(lines)


def not_a_library(path):
    """Why ``path`` cannot be a plugin at all (no such file, a folder, not an ELF shared object), or None."""
    if not os.path.exists(path):
        return f"no such file: {path}"
    if os.path.isdir(path):
        return f"{path} is a folder"
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror})"
    if magic != b"\x7fELF":
        return f"{path} is not a shared library (no ELF header)"
    return None


def main(argv=None):
    ap = command_parser("check",
                        description="Conformance checks for a custom-device plugin (each in a child process).")
    ap.add_argument("plugin", nargs="?", help="path of the plugin shared library")
    ap.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds allowed per check")
    ap.add_argument("--only", default=None, help="comma-separated check names (handshake always runs)")
    ap.add_argument("--list", action="store_true", help="list the checks with their rules and exit")
    ap.add_argument("--strict", action="store_true", help="warnings fail too (exit status 1), for a vendor's CI")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.child:
        if args.child not in _BY_NAME:
            print(f"unknown check {args.child!r}", file=sys.stderr)
            return 2
        return _child(args.child, args.plugin, args.timeout)
    if args.list:
        w = max(len(c.name) for c in CHECKS)
        for c in CHECKS:
            print(f"{c.name:{w}}  {c.group:11}  {c.what}")
            print(f"{'':{w}}  {'':11}  rule: {c.rule}")
        return 0
    if args.plugin is None:
        print("python -m paddle_rt check: the plugin's path is required (or --list)", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("--timeout must be positive", file=sys.stderr)
        return 2
    only = None
    if args.only:
        only = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = only - set(_BY_NAME)
        if unknown:
            print(f"unknown check(s): {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
            return 2
    problem = not_a_library(args.plugin)
    if problem:
        print(f"{ap.prog}: {problem}; give the plugin's shared library (the .so its build produced), e.g. "
              f"`{ap.prog} build/libmy_device.so`", file=sys.stderr)
        return 2
    progress = None
    if not args.json and sys.stderr.isatty():
        def progress(res):
            print(f"  {res['name']}: {res['result']} ({res['seconds']} s)", file=sys.stderr)
    results = run_checks(args.plugin, timeout=args.timeout, only=only, progress=progress)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"paddle_rt check {os.path.abspath(args.plugin)}")
        print(format_table(results))
    bad = ("fail", "warn") if args.strict else ("fail",)
    return 1 if any(r["result"] in bad for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
