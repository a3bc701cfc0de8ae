"""``paddle-rt check``'s conformance checks of devices and memory: the required hooks, enumeration,
allocation, alignment, memory figures, copies, memset, host memory and size hints (see paddle_rt.tools.check)."""

from paddle_rt.tools.check_base import BLOCK, Check, MiB, Skip, _NULL_SUCCESS, _ok, _same, pattern


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


def _block_for(ctx, hook):
    """A device block of BLOCK bytes to try hook on (Skip when the plugin lacks the hook)."""
    ctx.need(hook)
    return ctx.alloc(BLOCK)


def check_copy_h2d(ctx):
    r, n = ctx.raw, BLOCK
    d = _block_for(ctx, "memory_copy_h2d")
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
    r, n = ctx.raw, BLOCK
    d = _block_for(ctx, "memory_copy_d2h")
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
    r, n = ctx.raw, BLOCK
    a, b = _block_for(ctx, "memory_copy_d2d"), ctx.alloc(n)
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
    n = BLOCK
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
    r, n = ctx.raw, BLOCK
    d = _block_for(ctx, "device_memory_set")
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



#: This family's checks, in the order they run (paddle_rt.tools.check.FAMILIES lists the families).
CHECKS = [
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
]
