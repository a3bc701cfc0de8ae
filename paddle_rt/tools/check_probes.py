"""``paddle-rt check``'s misuse probes (see paddle_rt.tools.check)."""

from paddle_rt.tools.check_base import Check, MiB, Skip, _NULL_SUCCESS, _PROBE_RULE, _ok, _sname


# ---------------------------------------------------------------------------------------------------------------------
# Misuse probes: calls Paddle never makes on purpose. A guarded plugin answers with an error status; an unguarded one
# is a hazard (a warning), never a failure. A crash or hang in a probe is reported under the probe's name only.

def _unguarded(ctx, what):
    ctx.warn(f"not guarded: {what}")


def _refused(ctx, st, call):
    """The detail of a misuse ``call`` that answered ``st``: an error status is the guard (``call -> status``); a
    success status is not guarded (a warning, empty detail)."""
    if _ok(st):
        _unguarded(ctx, f"{call} returned {_sname(st)}")
        return ""
    return f"{call} -> {_sname(st)}"


def probe_double_free(ctx):
    r = ctx.raw
    st, p = r.allocate(4096)
    ctx.status(st, "device_memory_allocate(4096)")
    ctx.expect(p != 0, f"device_memory_allocate(4096) {_NULL_SUCCESS}")
    ctx.status(r.deallocate(p, 4096), "device_memory_deallocate(4096)")
    return _refused(ctx, r.deallocate(p, 4096), "double free")


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
        parts.append(_refused(ctx, free(h, 4096), f"double {free_name}"))
    return "; ".join(p for p in parts if p)


def probe_bad_device_id(ctx):
    r = ctx.raw
    st, ids = r.get_device_list(ctx.ndev)
    ctx.status(st, "get_device_list")
    bogus = max(ids) + 1000
    st = r.set_device(bogus)
    ctx.status(r.set_device(ids[0]), f"set_device({ids[0]})")
    return _refused(ctx, st, f"set_device({bogus}) (no such device)")


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
    """allocate(0): refused with an error status is the guard; a pointer (plain malloc's answer) or a NULL pointer
    with C_SUCCESS is not guarded (nothing was refused)."""
    r = ctx.raw
    st, p = r.allocate(0)
    if _ok(st) and p:
        ctx.status(r.deallocate(p, 0), "device_memory_deallocate of a size-0 block")
        _unguarded(ctx, f"allocate(0) returned {_sname(st)} with a pointer (a block of 0 bytes, as plain malloc gives)")
        return ""
    if _ok(st):
        _unguarded(ctx, f"allocate(0) returned {_sname(st)} with a NULL pointer")
        return ""
    return f"allocate(0) -> {_sname(st)}"


def probe_null_free(ctx):
    """deallocate(NULL): refused with an error status is the guard; success (free(NULL)'s no-op) is not guarded."""
    return _refused(ctx, ctx.raw.deallocate(0, 4096), "deallocate(NULL)")


#: This family's checks, in the order they run (paddle_rt.tools.check.FAMILIES lists the families).
CHECKS = [
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
