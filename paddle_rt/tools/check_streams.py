"""``paddle-rt check``'s conformance checks of streams, events, callbacks and collectives (see
paddle_rt.tools.check)."""

from paddle_rt.tools.check_base import (BLOCK, C_SUCCESS, churn, FLOAT32, SUM, Check, MiB, Skip, _same, _sname,
                                         pattern)


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
    parts.append(churn(ctx, r.create_stream, r.destroy_stream, 8, "stream").replace("created", "more created", 1))
    return "; ".join(parts)


def check_async_copies(ctx):
    ctx.need("create_stream", "synchronize_stream")
    hooks = _async_hooks(ctx)
    if not hooks:
        raise Skip("plugin lacks async_memory_copy_h2d, _d2h and _d2d")
    r = ctx.raw
    s = ctx.stream()
    n = BLOCK
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
    parts.append(churn(ctx, r.create_event, r.destroy_event, 16, "event"))
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



#: This family's checks, in the order they run (paddle_rt.tools.check.FAMILIES lists the families).
CHECKS = [
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
]
