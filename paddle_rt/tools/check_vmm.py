"""``paddle-rt check``'s virtual-memory family: the optional extension of paddle_rt/paddle_rt_vmm_ext.h (see
paddle_rt.tools.check and docs/expandable_segments.md). Every check is skipped when the plugin exports none of the
seven calls; exporting only some of them is a failure (paddle_rt then ignores the extension). The two optional
batched calls (map_pages, unmap_pages) are checked when the plugin exports them."""
import ctypes

from paddle_rt.tools.check_base import Check, Fail, Skip, _ok, _sname

NAMES = ("granularity", "reserve", "free_range", "create", "release", "map", "unmap")
BATCHED = ("map_pages", "unmap_pages")


class _Vmm:
    """The extension's calls through ctypes on the plugin's own handle, for device `index` of the plugin."""

    def __init__(self, ctx):
        self.ctx = ctx
        lib = ctypes.CDLL(ctx.plugin.path)
        found = {n: getattr(lib, "paddle_rt_ext_vmm_" + n, None) for n in NAMES}
        have = [n for n, f in found.items() if f is not None]
        if not have:
            raise Skip("the plugin does not export the virtual-memory extension (paddle_rt_vmm_ext.h)")
        if len(have) != len(NAMES):
            raise Fail("the plugin exports " + ", ".join(f"paddle_rt_ext_vmm_{n}" for n in have) + " but not "
                       + ", ".join(f"paddle_rt_ext_vmm_{n}" for n in NAMES if n not in have)
                       + ": paddle_rt ignores an incomplete extension")
        for f in found.values():
            f.restype = ctypes.c_int
        self.f = found
        self.lib = lib
        st, ids = ctx.raw.get_device_list(ctx.ndev)
        ctx.status(st, "get_device_list")

        class Dev(ctypes.Structure):
            _fields_ = [("id", ctypes.c_int)]
        self._dev = Dev(ids[0])
        self.dev = ctypes.byref(self._dev)
        g = ctypes.c_size_t()
        st = self.f["granularity"](self.dev, ctypes.byref(g))
        ctx.status(st, "paddle_rt_ext_vmm_granularity")
        self.g = g.value
        ctx.expect(self.g > 0 and self.g & (self.g - 1) == 0,
                   f"paddle_rt_ext_vmm_granularity gave {self.g}, not a power of two")

    def reserve(self, n):
        b = ctypes.c_void_p()
        st = self.f["reserve"](self.dev, ctypes.c_size_t(n), ctypes.byref(b))
        self.ctx.status(st, f"paddle_rt_ext_vmm_reserve({n})")
        self.ctx.expect(b.value, "paddle_rt_ext_vmm_reserve gave C_SUCCESS with a NULL base")
        self.ctx.defer(self.f["free_range"], self.dev, ctypes.c_void_p(b.value), ctypes.c_size_t(n))
        return b.value

    def create(self, n):
        h = ctypes.c_void_p()
        st = self.f["create"](self.dev, ctypes.c_size_t(n), ctypes.byref(h))
        self.ctx.status(st, f"paddle_rt_ext_vmm_create({n})")
        self.ctx.expect(h.value, "paddle_rt_ext_vmm_create gave C_SUCCESS with a NULL handle")
        return h.value

    def map(self, base, off, h, n):
        return self.f["map"](self.dev, ctypes.c_void_p(base), ctypes.c_size_t(off), ctypes.c_void_p(h),
                             ctypes.c_size_t(n))

    def unmap(self, base, off, n):
        return self.f["unmap"](self.dev, ctypes.c_void_p(base), ctypes.c_size_t(off), ctypes.c_size_t(n))

    def release(self, h):
        return self.f["release"](self.dev, ctypes.c_void_p(h))

    def free_range(self, base, n):
        return self.f["free_range"](self.dev, ctypes.c_void_p(base), ctypes.c_size_t(n))

    def batched(self):
        """Load the optional batched calls: Skip without them, Fail with only one."""
        found = {n: getattr(self.lib, "paddle_rt_ext_vmm_" + n, None) for n in BATCHED}
        have = [n for n, f in found.items() if f is not None]
        if not have:
            raise Skip("the plugin does not export the optional batched calls (paddle_rt_ext_vmm_map_pages / "
                       "_unmap_pages): paddle_rt makes one call per page")
        if len(have) != len(BATCHED):
            raise Fail(f"the plugin exports paddle_rt_ext_vmm_{have[0]} without its pair: paddle_rt ignores it")
        for f in found.values():
            f.restype = ctypes.c_int
        self.f.update(found)

    def map_pages(self, base, off, hs, page):
        arr = (ctypes.c_void_p * max(1, len(hs)))(*hs)
        return self.f["map_pages"](self.dev, ctypes.c_void_p(base), ctypes.c_size_t(off), arr,
                                   ctypes.c_size_t(len(hs)), ctypes.c_size_t(page))

    def unmap_pages(self, base, off, n, page):
        return self.f["unmap_pages"](self.dev, ctypes.c_void_p(base), ctypes.c_size_t(off), ctypes.c_size_t(n),
                                     ctypes.c_size_t(page))


def check_vmm_extension(ctx):
    v = _Vmm(ctx)
    return f"all seven calls exported; granularity {v.g} bytes"


def check_vmm_remap(ctx):
    v = _Vmm(ctx)
    g = v.g
    base = v.reserve(4 * g)
    other = v.reserve(2 * g)
    h = v.create(g)
    ctx.status(v.map(base, 0, h, g), "paddle_rt_ext_vmm_map at offset 0")
    data = bytes((i * 7 + 3) & 0xFF for i in range(4096))
    ctx.status(ctx.raw.copy_h2d(base + g - 4096, ctx.host_with(data), 4096), "memory_copy_h2d into a mapped page")
    ctx.status(v.unmap(base, 0, g), "paddle_rt_ext_vmm_unmap")
    ctx.status(v.map(base, 2 * g, h, g), "paddle_rt_ext_vmm_map of the same memory at offset 2 pages")
    if ctx.read(base + 3 * g - 4096, 4096) != data:
        raise Fail("the bytes of a physical allocation did not survive unmap and map at another offset")
    ctx.status(v.unmap(base, 2 * g, g), "paddle_rt_ext_vmm_unmap")
    ctx.status(v.map(other, g, h, g), "paddle_rt_ext_vmm_map into another range")
    if ctx.read(other + 2 * g - 4096, 4096) != data:
        raise Fail("the bytes of a physical allocation did not survive a map into another range")
    ctx.status(v.unmap(other, g, g), "paddle_rt_ext_vmm_unmap")
    ctx.status(v.release(h), "paddle_rt_ext_vmm_release")
    return "data survives unmap and map at another offset and in another range"


def check_vmm_refusals(ctx):
    v = _Vmm(ctx)
    g = v.g
    base = v.reserve(4 * g)
    ctx.expect(base % g == 0, f"paddle_rt_ext_vmm_reserve gave a base 0x{base:x} not aligned to the granularity")
    h = v.create(2 * g)
    h2 = v.create(g)
    bad = []
    for what, st in (("map at a misaligned offset", v.map(base, g // 2, h, 2 * g)),
                     ("map leaving the range", v.map(base, 3 * g, h, 2 * g))):
        if _ok(st):
            bad.append(f"{what} returned {_sname(st)}")
            v.unmap(base, g // 2 if "misaligned" in what else 3 * g, 2 * g)
    ctx.status(v.map(base, 0, h, 2 * g), "paddle_rt_ext_vmm_map")
    checks = (("double map over a mapped page", lambda: v.map(base, g, h2, g)),
              ("unmap of an unmapped span", lambda: v.unmap(base, 2 * g, g)),
              ("release of a mapped allocation", lambda: v.release(h)),
              ("free_range with a mapping inside", lambda: v.free_range(base, 4 * g)))
    for what, call in checks:
        st = call()
        if _ok(st):
            bad.append(f"{what} returned {_sname(st)}")
    ctx.status(v.unmap(base, 0, 2 * g), "paddle_rt_ext_vmm_unmap")
    ctx.status(v.release(h), "paddle_rt_ext_vmm_release")
    ctx.status(v.release(h2), "paddle_rt_ext_vmm_release")
    if bad:
        raise Fail("the extension accepted misuse it must refuse with C_ERROR: " + "; ".join(bad))
    return "misaligned and out-of-range maps, double map, unmap of unmapped, release and free while mapped refused"


def check_vmm_capacity(ctx):
    v = _Vmm(ctx)
    ctx.need("device_memory_stats")
    st, total, free0 = ctx.raw.memory_stats()
    ctx.status(st, "device_memory_stats")
    h = v.create(v.g)
    st, _, free1 = ctx.raw.memory_stats()
    ctx.status(v.release(h), "paddle_rt_ext_vmm_release")
    st, _, free2 = ctx.raw.memory_stats()
    if free0 - free1 < v.g:
        ctx.warn(f"device_memory_stats' free memory fell by {free0 - free1} bytes, not the {v.g} bytes of a "
                 f"physical allocation: paddle_rt's limit fractions and OOM messages will be off")
    elif free2 != free0:
        ctx.warn(f"device_memory_stats' free memory is {free2} after a release, {free0} before the creation")
    return f"a physical allocation of {v.g} bytes counts against device_memory_stats"


def check_vmm_batched(ctx):
    v = _Vmm(ctx)
    v.batched()
    g = v.g
    base = v.reserve(4 * g)
    a, b = v.create(g), v.create(g)
    bad = []
    for what, call in (("a batch naming one handle twice", lambda: v.map_pages(base, 0, [a, a], g)),
                       ("a batch leaving the range", lambda: v.map_pages(base, 3 * g, [a, b], g))):
        st = call()
        if _ok(st):
            bad.append(f"{what} returned {_sname(st)}")
            v.unmap_pages(base, 0 if "twice" in what else 3 * g, 2, g)
    # the refusals must have mapped nothing: a single map of a must work
    ctx.status(v.map(base, 0, a, g), "paddle_rt_ext_vmm_map after refused batches (did a refused batch map a page?)")
    data = bytes((i * 13 + 5) & 0xFF for i in range(4096))
    ctx.status(ctx.raw.copy_h2d(base, ctx.host_with(data), 4096), "memory_copy_h2d into a mapped page")
    ctx.status(v.unmap(base, 0, g), "paddle_rt_ext_vmm_unmap")
    ctx.status(v.map_pages(base, 2 * g, [b, a], g), "paddle_rt_ext_vmm_map_pages of two pages")
    if ctx.read(base + 3 * g, 4096) != data:
        raise Fail("a page mapped by paddle_rt_ext_vmm_map_pages does not hold its physical allocation's bytes")
    st = v.unmap_pages(base, g, 2, g)
    if _ok(st):
        bad.append(f"an unmap batch over an unmapped page returned {_sname(st)}")
    ctx.status(v.unmap_pages(base, 2 * g, 2, g), "paddle_rt_ext_vmm_unmap_pages of two pages")
    ctx.status(v.release(a), "paddle_rt_ext_vmm_release")
    ctx.status(v.release(b), "paddle_rt_ext_vmm_release")
    if bad:
        raise Fail("the batched calls accepted misuse they must refuse with C_ERROR: " + "; ".join(bad))
    return "map_pages keeps each page's bytes; bad batches are refused whole"


CHECKS = [
    Check("vmm_extension", check_vmm_extension, "virtual-memory extension present and complete",
          "skip without it; fail when only some of the seven calls are exported or the granularity is not a power "
          "of two"),
    Check("vmm_remap", check_vmm_remap, "physical memory keeps its bytes across unmap and map elsewhere",
          "fail on an error status or lost bytes"),
    Check("vmm_refusals", check_vmm_refusals, "alignment, double map, unmap of unmapped, release while mapped",
          "fail when any of them returns success"),
    Check("vmm_batched", check_vmm_batched, "the optional batched map and unmap calls",
          "skip without them; fail when only one is exported, on lost bytes, or when a bad batch is accepted"),
    Check("vmm_capacity", check_vmm_capacity, "physical allocations count against device_memory_stats",
          "warn when free memory does not follow"),
]
