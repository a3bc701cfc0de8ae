"""What every family of ``paddle-rt check`` works with: the raw statuses, the outcomes a check raises (Skip, Fail),
the context of a check (Ctx: the plugin's raw devices, buffers, cleanups, warnings), content patterns, and the Check
entry each family lists in its ``CHECKS``. A family module (check_memory, check_streams, check_probes, ...) imports
this module only; paddle_rt.tools.check runs them."""
import os

MiB = 1 << 20
BLOCK = 65536 + 13      # the size of the copy and memset checks: not a multiple of any vector width
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

    def _created(self, create, destroy, hook):
        """A handle made by create() (a failed status fails the check), destroyed by destroy at cleanup."""
        st, h = create()
        self.status(st, hook)
        self.defer(destroy, h)
        return h

    def stream(self, raw=None):
        raw = raw or self.raw
        return self._created(raw.create_stream, raw.destroy_stream, "create_stream")

    def event(self, raw=None):
        raw = raw or self.raw
        return self._created(raw.create_event, raw.destroy_event, "create_event")

    def sync(self, s, raw=None):
        raw = raw or self.raw
        self.status(raw.synchronize_stream(s), "synchronize_stream")


def churn(ctx, create, destroy, n, what):
    """Create ``n`` objects with ``create()`` (-> status, handle), then destroy them all with ``destroy(handle)``,
    each status checked (``what``: "stream", "event"); returns the detail part."""
    made = []
    for _ in range(n):
        st, h = create()
        ctx.status(st, f"create_{what} ({n} {what}s)")
        made.append(h)
    for h in made:
        ctx.status(destroy(h), f"destroy_{what} ({n} {what}s)")
    return f"{n} created and destroyed"


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



_NULL_SUCCESS = "gave C_SUCCESS with a NULL pointer (paddle_rt raises PluginError; out of memory is C_FAILED)"


class Check:
    """One entry of the suite: ``group`` is ``"conformance"`` (does the plugin work under Paddle and paddle_rt) or
    ``"probe"`` (a deliberate misuse: does the plugin guard against it); ``rule`` says when it fails and warns;
    ``misuse`` (probes) names the misuse for a crash or hang report."""

    def __init__(self, name, fn, what, rule, group="conformance", misuse=None):
        self.name, self.fn, self.what, self.rule, self.group, self.misuse = name, fn, what, rule, group, misuse


_PROBE_RULE = "never fails; warn when not guarded (success status, crash or hang)"

