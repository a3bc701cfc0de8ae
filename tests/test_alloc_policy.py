"""The default allocator policy (issue 15): the growth parameters as configuration keys (parsing, validation, the
effective configuration), the growth rule of alloc_policy.chunk_for_miss on small sequences of requests, and the
targets on the corpus of bench/traces and ../shared/traces (issue 22: device allocations <= PyTorch's, peak reserved
<= 1.15 x Paddle's auto-growth, the full goal of 1.02 x on most)."""
import gc
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import paddle_rt
from paddle_rt._core import alloc_config
from paddle_rt.tools import replay

from conftest import TRACES, skip_without_traces

MiB = 1 << 20
KiB = 1 << 10
GROW_KEYS = ("grow_min", "grow_step", "grow_fraction", "grow_ratio", "grow_round", "consolidate")
ALL_KEYS = alloc_config.CONF_KEYS


def _clear(a):
    """The default configuration, with expandable segments off: this module tests the growth of chunks."""
    a.configure(**{k: None for k in ALL_KEYS})
    a.configure(expandable_segments=0)


_live = []


def m(n, d):
    """raw_malloc, remembered so that a failing test does not leave memory held for the next one."""
    p = paddle_rt.raw_malloc(n, d)
    _live.append(p)
    return p


def f(p, d):
    _live.remove(p)
    paddle_rt.raw_free(p, d)


@pytest.fixture
def d1():
    """rt_cpu:1 with a fresh allocator (nothing held, default configuration, counters zero) before and after."""
    d = paddle_rt.device("rt_cpu:1")
    a = paddle_rt.get_allocator(d)
    gc.collect()
    _clear(a)
    paddle_rt.reset_allocator(d)
    yield d
    while _live:
        paddle_rt.raw_free(_live.pop(), d)
    gc.collect()
    paddle_rt.reset_allocator(d)         # empty first: small_size may change only while nothing is held
    _clear(a)
    paddle_rt.reset_allocator(d)


def segments(d):
    """The sizes of the large pool's chunks, sorted (the snapshot orders chunks by address)."""
    return sorted(s["total_size"] for s in paddle_rt.memory_snapshot(d) if s["segment_type"] == "large")


# -- keys ----------------------------------------------------------------------------------------------------------
def test_defaults_are_the_documented_ones(d1):
    c = paddle_rt.allocator_config(d1)
    assert (c["grow_min"], c["grow_step"], c["grow_ratio"], c["grow_round"], c["consolidate"]) == \
        (4 * MiB, 12 * MiB, 0.5, "up", "fold")
    assert c["grow_fraction"] == pytest.approx(1 / 4)
    assert (c["small_size"], c["small_chunk"]) == (128 * KiB, 2 * MiB)
    assert (c["grow_base"], c["grow_exact_credit"], c["settle_after"], c["grow_requests"]) == ("grown", 8, 0, 32)
    assert (c["exact_above"], c["small_borrow"]) == (pytest.approx(0.95), True)
    assert c["growth"] == "adaptive"


@pytest.mark.parametrize("key,value,parsed", [
    ("grow_min", "8M", 8 * MiB), ("grow_min", 0, 0), ("grow_step", "48MiB", 48 * MiB),
    ("grow_step", 1 << 20, MiB), ("grow_fraction", "1/16", 1 / 16), ("grow_fraction", 0.25, 0.25),
    ("grow_fraction", "0", 0.0), ("grow_ratio", "0.5", 0.5), ("grow_ratio", 2, 2.0),
    ("grow_round", "Nearest", "nearest"), ("grow_round", "off", "off"), ("consolidate", "fold", "fold"),
    ("consolidate", "off", "off"), ("grow_base", "Reserved", "reserved"), ("grow_base", "grown", "grown"),
    ("grow_exact_credit", "8", 8), ("grow_exact_credit", 0, 0), ("settle_after", "500", 500), ("settle_after", 0, 0),
    ("grow_requests", "32", 32), ("grow_requests", 0, 0), ("exact_above", "0.95", 0.95), ("exact_above", 0, 0.0),
    ("small_borrow", "1", True), ("small_borrow", "off", False),
])
def test_keys_parse(d1, key, value, parsed):
    default = paddle_rt.allocator_config(d1)[key]
    paddle_rt.set_allocator_config(d1, **{key: value})
    got = paddle_rt.allocator_config(d1)[key]
    assert got == (pytest.approx(parsed) if isinstance(parsed, float) else parsed)
    paddle_rt.set_allocator_config(d1, **{key: None})               # the keyword removed: the default again
    assert paddle_rt.allocator_config(d1)[key] == default


@pytest.mark.parametrize("key,value", [
    ("grow_min", "-1"), ("grow_min", "lots"), ("grow_min", True), ("grow_step", "3 parsecs"), ("grow_step", -5),
    ("grow_fraction", "2"), ("grow_fraction", "-0.1"), ("grow_fraction", "x"), ("grow_fraction", "1/0"),
    ("grow_fraction", True), ("grow_ratio", "5"), ("grow_ratio", "fast"), ("grow_round", "sideways"),
    ("grow_round", 1), ("consolidate", "maybe"), ("grow_base", "everything"), ("grow_exact_credit", "-1"),
    ("grow_exact_credit", "many"), ("grow_exact_credit", True), ("grow_exact_credit", 1.5),
    ("settle_after", "-3"), ("settle_after", "soon"), ("grow_requests", "-1"), ("grow_requests", "x"),
    ("exact_above", "1.5"), ("exact_above", "-0.1"), ("exact_above", "big"), ("small_borrow", "maybe"),
    ("small_borrow", 2),
])
def test_bad_values_raise_naming_the_key(d1, key, value):
    before = paddle_rt.allocator_config(d1)
    with pytest.raises(paddle_rt.InvalidArgument, match=key):
        paddle_rt.set_allocator_config(d1, **{key: value})
    assert paddle_rt.allocator_config(d1) == before                 # nothing changed


def test_keys_from_the_environment():
    env = {"PADDLE_RT_ALLOC_CONF": "grow_min:1M,grow_step:64M,grow_fraction:1/8,grow_ratio:0.5,grow_round:down,"
                                   "consolidate:fold"}
    r = alloc_config.resolve(alloc_config.parse_env(env))
    assert (r["grow_min"], r["grow_step"], r["grow_fraction"], r["grow_ratio"]) == (MiB, 64 * MiB, 0.125, 0.5)
    assert alloc_config.ROUND_NAMES[r["grow_round"]] == "down"
    assert alloc_config.CONSOLIDATE_NAMES[r["consolidate"]] == "fold"
    with pytest.raises(paddle_rt.InvalidArgument, match="PADDLE_RT_ALLOC_CONF.*grow_ratio"):
        alloc_config.parse_env({"PADDLE_RT_ALLOC_CONF": "grow_ratio:9"})


def test_keywords_win_over_the_environment(run_python):
    r = run_python("import paddle_rt; paddle_rt.set_allocator_config(grow_step='8M'); "
                   "c = paddle_rt.allocator_config(); print(c['grow_step'], c['grow_min'])",
                   env={"PADDLE_RT_ALLOC_CONF": "grow_step:64M,grow_min:1M"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(8 * MiB), str(MiB)]


# -- the growth rule -------------------------------------------------------------------------------------------------
def _grow_conf(d, **kw):
    conf = dict(grow_min="4M", grow_step="32M", grow_fraction="1/32", grow_ratio=1, grow_round="up",
                consolidate="release", small_size="128K", small_chunk="2M", grow_base="reserved", grow_exact_credit=0, settle_after=0,
                grow_requests=0, exact_above=0, small_borrow=0)
    conf.update(kw)
    paddle_rt.set_allocator_config(d, **conf)


def test_first_miss_is_grow_min_in_whole_requests(d1):
    _grow_conf(d1)
    x = m(3 * MiB, d1)                   # target 4 MiB, rounded up to 2 requests of 3 MiB
    assert segments(d1) == [6 * MiB]
    y = m(3 * MiB, d1)                   # the second request of the chunk: no growth
    assert paddle_rt.memory_stats(d1)["num_device_alloc"] == 1
    for p in (x, y):
        f(p, d1)


def test_pool_doubles_then_steps(d1):
    _grow_conf(d1)
    ps = [m(4 * MiB, d1)]                # 4 (grow_min)
    ps.append(m(4 * MiB, d1))            # reserved 4 -> a chunk of 4
    ps += [m(4 * MiB, d1) for _ in range(2)]  # reserved 8 -> 8 (two requests)
    ps.append(m(4 * MiB, d1))            # reserved 16 -> 16
    for _ in range(3):
        ps.append(m(4 * MiB, d1))
    ps.append(m(4 * MiB, d1))            # reserved 32 -> capped at grow_step 32
    assert segments(d1) == sorted([4 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB])
    for p in ps:
        f(p, d1)


def test_target_rounds_up_to_whole_requests_and_large_requests_get_their_size(d1):
    _grow_conf(d1)
    a = m(10 * MiB, d1)                  # above grow_min: exactly one request
    b = m(3 * MiB, d1)                   # target = reserved 10 -> 4 requests of 3 = 12
    c = m(50 * MiB, d1)                  # above the cap (32): exactly its size
    assert segments(d1) == [10 * MiB, 12 * MiB, 50 * MiB]
    for p in (a, b, c):
        f(p, d1)


@pytest.mark.parametrize("mode,expect", [("nearest", 3 * 3 * MiB), ("down", 3 * 3 * MiB), ("off", 10 * MiB),
                                         ("up", 4 * 3 * MiB), ("within", 4 * 3 * MiB)])
def test_grow_round_modes(d1, mode, expect):
    _grow_conf(d1, grow_round=mode)
    a = m(10 * MiB, d1)
    b = m(3 * MiB, d1)                   # target 10 MiB: 10/3 = 3.33 requests
    assert segments(d1) == sorted([10 * MiB, expect])
    for p in (a, b):
        f(p, d1)


def test_within_keeps_the_chunk_under_the_cap(d1):
    _grow_conf(d1, grow_round="within")
    a = m(40 * MiB, d1)                  # above the cap: exactly its size
    b = m(20 * MiB, d1)                  # target 32 (the cap): up would be 2 x 20 = 40, within 1
    c = m(7 * MiB, d1)                   # target 32: up would be 5 x 7 = 35, within 4 x 7 = 28
    assert segments(d1) == [20 * MiB, 28 * MiB, 40 * MiB]
    paddle_rt.set_allocator_config(d1, grow_round="up")
    d = m(22 * MiB, d1)                  # the same kind of miss under up: two requests
    assert segments(d1) == [20 * MiB, 28 * MiB, 40 * MiB, 44 * MiB]
    for p in (a, b, c, d):
        f(p, d1)


def test_absurd_sizes_do_not_overflow(d1):
    """grow_min near SIZE_MAX: the plugin cannot give that; the ladder's retry with exactly the request serves."""
    _grow_conf(d1, grow_min=(1 << 64) - 1, grow_step=(1 << 64) - 1)
    a = m(3 * MiB, d1)
    assert segments(d1) == [3 * MiB]
    f(a, d1)


def test_cap_grows_with_what_is_held(d1):
    _grow_conf(d1, grow_step="8M", grow_fraction="1/4", grow_min="1M")
    a = m(64 * MiB, d1)                  # one exact chunk
    b = m(MiB, d1)                       # target min(64, max(8, 64/4 = 16)) = 16
    assert segments(d1) == [16 * MiB, 64 * MiB]
    paddle_rt.set_allocator_config(d1, grow_fraction=0)
    c = m(17 * MiB, d1)                  # cap back to grow_step 8: exactly the request
    assert segments(d1) == [16 * MiB, 17 * MiB, 64 * MiB]
    for p in (a, b, c):
        f(p, d1)


def test_grown_base_leaves_out_a_big_exact_chunk(d1):
    """grow_base:grown: the growth after a chunk made exactly for one big request (a model's weights) is sized as if
    that chunk were not there; under grow_base:reserved the same miss makes a chunk as large as the cap allows."""
    _grow_conf(d1, grow_base="grown", grow_min="2M", grow_fraction=0)
    a = m(64 * MiB, d1)                  # above the target: a chunk of exactly its size, left out of the base
    b = m(MiB, d1)                       # base 0: target grow_min 2 MiB (2 requests), not 32 MiB
    c = m(MiB, d1)                       # the chunk's second request
    assert segments(d1) == [2 * MiB, 64 * MiB]
    d = m(3 * MiB, d1)                   # base 2 MiB (the grown chunk counts): target 2 < 3, exactly the request
    e = m(MiB, d1)                       # base 66 + 3 - 64 - 3 = 2 MiB: target 2 MiB
    assert segments(d1) == [2 * MiB, 2 * MiB, 3 * MiB, 64 * MiB]
    for p in (a, b, c, d, e):
        f(p, d1)


def test_reserved_base_counts_the_big_exact_chunk(d1):
    _grow_conf(d1, grow_base="reserved", grow_min="2M", grow_fraction=0)
    a = m(64 * MiB, d1)
    b = m(MiB, d1)                       # base 64 MiB: target min(64, grow_step 32) = 32 requests
    assert segments(d1) == [32 * MiB, 64 * MiB]
    for p in (a, b):
        f(p, d1)


def test_grown_base_forgets_an_exact_chunk_given_back(d1):
    """A chunk made exactly for one request leaves the base's accounting when it goes back to the plugin: the base
    is then what is held, not less (the bookkeeping of Chunk.exact / exact_bytes)."""
    _grow_conf(d1, grow_base="grown", grow_min="2M", grow_fraction=0)
    a = m(64 * MiB, d1)
    big = m(10 * MiB, d1)                # base 0, exactly the request: held, left out of the base
    b = m(MiB, d1)                       # 2 MiB chunk
    f(a, d1)
    paddle_rt.empty_cache(d1)            # the 64 MiB chunk goes back
    assert segments(d1) == [2 * MiB, 10 * MiB]
    c = m(MiB, d1)                       # fits b's chunk
    e = m(3 * MiB, d1)                   # base 12 - 10 = 2 MiB: exactly 3 MiB (left out too)
    g = m(MiB, d1)                       # base 15 - 13 = 2 MiB: a 2 MiB chunk (with 64 MiB still counted as
    assert segments(d1) == [2 * MiB, 2 * MiB, 3 * MiB, 10 * MiB]  # exact, the base would be clamped to 15: 15 MiB)
    f(big, d1)
    paddle_rt.empty_cache(d1)
    h = m(2 * MiB, d1)                   # base 7 - 3 = 4 MiB: 2 requests (8 MiB if the 10 MiB chunk still counted)
    assert segments(d1) == [2 * MiB, 2 * MiB, 3 * MiB, 4 * MiB]
    for p in (b, c, e, g, h):
        f(p, d1)


def test_exact_credit_counts_exact_chunks_for_misses_of_their_size(d1):
    """grow_base:grown with grow_exact_credit N: the exact chunks count in the base for at most N requests of the
    missing size, so a small miss after a big exact chunk grows little, a big miss after it as under reserved."""
    _grow_conf(d1, grow_base="grown", grow_exact_credit=4, grow_min="1M", grow_fraction="1/2", grow_step="8M")
    a = m(64 * MiB, d1)                  # exact
    b = m(MiB, d1)                       # base 0 + min(64, 4 x 1) = 4 MiB: target 4 MiB (grow_ratio 1)
    assert segments(d1) == [4 * MiB, 64 * MiB]
    c = m(20 * MiB, d1)                  # base 4 + min(64, 80) = 68: target min(68, cap max(8, 34)) = 34: 2 requests
    assert segments(d1) == [4 * MiB, 40 * MiB, 64 * MiB]
    for p in (a, b, c):
        f(p, d1)


@pytest.mark.parametrize("settle,second,third", [(3, 9 * MiB, 30 * MiB), (0, 18 * MiB, 40 * MiB)])
def test_a_miss_after_a_steady_phase_grows_by_grow_min(d1, settle, second, third):
    """settle_after N: once N allocations were served from the cache since the last large-pool growth, the ramp is
    over and a miss grows by grow_min alone (here less than the request: exactly the request); the count restarts
    with that growth, so the next miss right after it is sized by the rule again."""
    _grow_conf(d1, grow_min="1M", settle_after=settle)
    a = m(8 * MiB, d1)                   # exactly its size
    b = m(MiB, d1)                       # target 8 MiB: 8 requests
    for _ in range(3):                   # three cache hits
        f(m(MiB, d1), d1)
    c = m(9 * MiB, d1)                   # settled: exactly 9 MiB; not (settle 0): target 16 MiB, 2 requests
    assert segments(d1) == sorted([8 * MiB, 8 * MiB, second])
    d = m(10 * MiB, d1)                  # no hit since: the rule's target, min(16 + c's chunk, cap 32), in requests
    assert segments(d1) == sorted([8 * MiB, 8 * MiB, second, third])
    for p in (a, b, c, d):
        f(p, d1)


def test_grow_requests_bounds_the_target(d1):
    """grow_requests N: the target is at most N requests of the missing size, so a small request after the pool
    has grown large makes a small chunk."""
    _grow_conf(d1, grow_requests=4)
    a = m(16 * MiB, d1)                  # exactly its size
    b = m(MiB, d1)                       # target 16 MiB, bounded to 4 requests of 1 MiB
    assert segments(d1) == [4 * MiB, 16 * MiB]
    paddle_rt.set_allocator_config(d1, grow_requests=0)
    c = m(4 * MiB, d1)                   # no bound: target 20 MiB, 5 requests of 4 MiB
    assert segments(d1) == [4 * MiB, 16 * MiB, 20 * MiB]
    for p in (a, b, c):
        f(p, d1)


def test_exact_above_gives_a_request_near_the_step_its_own_size(d1):
    """exact_above F: a missing request of at least F times the growth target gets a chunk of exactly its size (as
    Paddle and PyTorch serve large requests), not a step of whole requests ending in an unused one."""
    _grow_conf(d1, exact_above=0.5)
    a = m(10 * MiB, d1)                  # above grow_min: exactly its size
    b = m(6 * MiB, d1)                   # target 10 MiB; 6 >= 0.5 x 10: exactly 6 (up would make 2 x 6 = 12)
    c = m(4 * MiB, d1)                   # target 16 MiB; 4 < 0.5 x 16: whole requests, 4 x 4 = 16
    assert segments(d1) == [6 * MiB, 10 * MiB, 16 * MiB]
    paddle_rt.set_allocator_config(d1, exact_above=0)
    d = m(20 * MiB, d1)                  # off: target 32 MiB (the cap), rounded up to 2 requests of 20
    assert segments(d1) == [6 * MiB, 10 * MiB, 16 * MiB, 40 * MiB]
    for p in (a, b, c, d):
        f(p, d1)


def test_small_borrow_serves_small_requests_from_free_large_blocks(d1):
    """small_borrow 1: a small request that no free block of the small pool serves takes a free block of the large
    pool before the small pool grows; freed, it goes back to its large chunk. small_borrow 0: the small pool grows."""
    def kinds():
        return sorted((s["segment_type"], s["total_size"]) for s in paddle_rt.memory_snapshot(d1))
    _grow_conf(d1)                       # small_borrow 0
    a = m(3 * MiB, d1)                   # target 4 MiB: a chunk of 2 x 3 MiB, 3 MiB of it free
    x = m(64 * KiB, d1)                  # small: the small pool grows although the large chunk has a free block
    assert kinds() == [("large", 6 * MiB), ("small", 2 * MiB)]
    f(x, d1)
    f(a, d1)
    paddle_rt.get_allocator(d1).empty_cache()
    paddle_rt.set_allocator_config(d1, small_borrow=1)
    a = m(3 * MiB, d1)
    x = m(64 * KiB, d1)                  # the small pool is empty: the large chunk's free block serves it
    assert kinds() == [("large", 6 * MiB)]
    f(x, d1)
    b = m(3 * MiB, d1)                   # the borrowed block merged back: the second request fits, no growth
    assert kinds() == [("large", 6 * MiB)]
    y = m(64 * KiB, d1)                  # nothing free in the large pool: the small pool grows
    assert kinds() == [("large", 6 * MiB), ("small", 2 * MiB)]
    for p in (a, b, y):
        f(p, d1)


def _probe(d):
    """The large-pool chunks a fixed sequence makes (an exact chunk, a miss sized from the growth base, three cache
    hits, a miss after them), freed."""
    ps = [m(40 * MiB, d), m(MiB, d)]
    for _ in range(3):
        f(m(MiB, d), d)
    ps += [m(5 * MiB, d), m(MiB, d)]
    got = segments(d)
    for p in ps:
        f(p, d)
    return got


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from([200 * KiB, MiB, 3 * MiB, 9 * MiB, 24 * MiB, 70 * MiB]),
                              st.booleans()), max_size=30))
def test_growth_after_any_history_is_that_of_a_fresh_allocator(d1, ops):
    """Whatever was allocated and freed before (exact chunks made and given back, cache hits counted), once
    everything is freed and the allocator reset, the growth rule's state (the bytes of exact chunks, the hits since
    the last growth) is back to a fresh allocator's: the same sequence makes the same chunks."""
    paddle_rt.set_allocator_config(d1, settle_after=3)
    # fresh: 40 MiB exactly; 1 MiB: base min(40, 8 x 1) = 8, target 4 MiB; three hits in it: the ramp has ended
    # (settle_after 3), so the 5 MiB miss asks for grow_min 4 MiB, i.e. exactly 5 MiB; 1 MiB: fits the 4 MiB chunk.
    # (With the 40 MiB chunk still counted as exact after it went back, the 1 MiB miss would make a 12 MiB chunk;
    # without the three hits, the 5 MiB miss would make a 15 MiB one.)
    fresh = [4 * MiB, 5 * MiB, 40 * MiB]
    assert _probe(d1) == fresh
    paddle_rt.reset_allocator(d1)
    assert _probe(d1) == fresh
    paddle_rt.reset_allocator(d1)
    held = []
    for n, free_one in ops:
        held.append(m(n, d1))
        if free_one and held:
            f(held.pop(0), d1)
    for p in held:
        f(p, d1)
    paddle_rt.reset_allocator(d1)
    assert _probe(d1) == fresh


def test_grow_ratio_scales_the_target(d1):
    _grow_conf(d1, grow_ratio=0.5, grow_min="1M")
    a = m(16 * MiB, d1)
    b = m(MiB, d1)                       # target 0.5 * 16 = 8 requests of 1 MiB
    assert segments(d1) == [8 * MiB, 16 * MiB]
    for p in (a, b):
        f(p, d1)


@pytest.mark.parametrize("mode,reserved_after,frees", [("release", 6 + 12, 3), ("fold", 6 + 21, 3),
                                                       ("off", 6 + 15 + 12, 0)])
def test_consolidate_modes(d1, mode, reserved_after, frees):
    """Three idle 5 MiB chunks and a miss of 6 MiB (reserved 21 MiB; grow_step 8 MiB: the rule's chunk is 8 MiB
    rounded up to 2 requests, 12 MiB): release gives the idle chunks back and grows by the rule alone, fold grows by
    at least request + released (6 + 15), off keeps them and grows by the rule."""
    paddle_rt.set_allocator_config(d1, growth="exact")
    keep = m(6 * MiB, d1)
    xs = [m(5 * MiB, d1) for _ in range(3)]
    for x in xs:
        f(x, d1)
    _grow_conf(d1, consolidate=mode, grow_step="8M", growth="adaptive")
    before = paddle_rt.memory_stats(d1)
    y = m(6 * MiB, d1)                   # fits none of the idle 5 MiB chunks
    after = paddle_rt.memory_stats(d1)
    assert after["num_device_free"] - before["num_device_free"] == frees
    assert after["num_device_alloc"] - before["num_device_alloc"] == 1
    assert after["reserved_bytes.all.current"] == reserved_after * MiB
    for p in (keep, y):
        f(p, d1)


def test_small_requests_use_the_small_pool(d1):
    _grow_conf(d1)
    xs = [m(128 * KiB, d1) for _ in range(16)]  # 16 fit one 2 MiB small chunk
    snap = paddle_rt.memory_snapshot(d1)
    assert [(s["segment_type"], s["total_size"]) for s in snap] == [("small", 2 * MiB)]
    y = m(128 * KiB + 1, d1)                     # above small_size: the large pool
    assert sorted(s["segment_type"] for s in paddle_rt.memory_snapshot(d1)) == ["large", "small"]
    for p in xs + [y]:
        f(p, d1)


# -- the targets on the corpus ------------------------------------------------------------------------------------------
CORPUS = (os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "traces"), TRACES)
# The traces where the default misses a target (bench/RESULTS.md, issue 22; the README states them): peak reserved over
# 1.15 x Paddle's, or device allocations over PyTorch's.
KNOWN_MISSES = set()
# The full goal's target is the corpus tool's own (corpus.GOAL_SHARE of the traces, 80%), not a count taken from one
# run. Today's default misses it (21 of 27, 78%: bench/RESULTS.md), so that assertion is a strict xfail: it turns into
# a failure the day the target is met, and the mark must then go.
GOAL_SHARE_MISSED = True


def _corpus_verdicts(d1):
    """[(trace name, corpus verdict, ratio, device allocations, PyTorch's)] of the default on every log of CORPUS
    (reset_allocator between replays gives fresh-process figures, see below)."""
    from paddle_rt.tools import corpus
    out = []
    for path in corpus.corpus_files(CORPUS):
        trace = replay.load_trace(path)
        paddle = replay.run_model(replay.PaddleAutoGrowthModel(256, 0), trace)
        torch = replay.run_model(replay.TorchCachingModel(), trace)
        paddle_rt.reset_allocator(d1)
        r = replay.run_once(None, "rt_cpu:1", {}, trace)
        ratio, _, verdict = corpus.verdict(r["peak_reserved"], r["device_allocs"], paddle["peak_reserved"],
                                           torch["device_allocs"])
        out.append((corpus.trace_name(path), verdict, round(ratio, 3), r["device_allocs"], torch["device_allocs"]))
    return out


_CORPUS_CACHE = {}


@pytest.fixture
def corpus_verdicts(d1):
    if "v" not in _CORPUS_CACHE:
        _CORPUS_CACHE["v"] = _corpus_verdicts(d1)
    return _CORPUS_CACHE["v"]


@pytest.mark.slow
@pytest.mark.skipif(not all(os.path.isdir(d) for d in CORPUS), reason="bench/traces or ../shared/traces missing")
def test_default_policy_on_the_corpus(corpus_verdicts):
    """Issue 22: with the default configuration, on each log of bench/traces and ../shared/traces: device allocations
    <= PyTorch's caching allocator model and peak reserved <= 1.15 x Paddle's auto-growth model everywhere but the
    known misses."""
    assert len(corpus_verdicts) >= 27
    beyond = [v for v in corpus_verdicts if v[1] == "MISS"]
    assert {b[0] for b in beyond} <= KNOWN_MISSES, beyond


@pytest.mark.slow
@pytest.mark.skipif(not all(os.path.isdir(d) for d in CORPUS), reason="bench/traces or ../shared/traces missing")
@pytest.mark.xfail(GOAL_SHARE_MISSED, strict=True, reason="the default reaches the full goal on 21 of 27 traces (78%) "
                                                          "against the 80% target (bench/RESULTS.md)")
def test_default_policy_meets_the_full_goal_share(corpus_verdicts):
    """The full goal (peak <= 1.02 x Paddle's, allocations <= PyTorch's) on at least corpus.GOAL_SHARE of the traces:
    the bound the corpus tool's verdict ("targets met") uses."""
    from paddle_rt.tools import corpus
    goal = sum(v[1] == "goal" for v in corpus_verdicts)
    assert goal >= math.ceil(corpus.GOAL_SHARE * len(corpus_verdicts)), \
        [v for v in corpus_verdicts if v[1] != "goal"]


@skip_without_traces
def test_reset_allocator_gives_fresh_process_figures(d1, run_python):
    """The in-process figures above are those of a fresh process (the replay command)."""
    path = os.path.join(TRACES, "lstm_lm_train.csv.gz")
    trace = replay.load_trace(path)
    chunks = {"expandable_segments": 0}
    replay.run_once(None, "rt_cpu:1", chunks, replay.load_trace(os.path.join(TRACES, "vit_infer_varbatch.csv.gz")))
    paddle_rt.reset_allocator(d1)
    r = replay.run_once(None, "rt_cpu:1", chunks, trace)
    child = run_python("from paddle_rt.tools import replay; "
                       f"r = replay.run_once({path!r}, 'rt_cpu:1', {chunks!r}); "
                       "print(r['peak_reserved'], r['device_allocs'])")
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == [str(r["peak_reserved"]), str(r["device_allocs"])]
