"""paddle_rt/_core/alloc_config.py: the allocator configuration's parsing, validation and defaults (pure Python, no
device). Each case names the rule it holds; the mutation run (docs/testing.md) checks that a change of any rule fails
here."""
import pytest

from paddle_rt._core import alloc_config as ac
from paddle_rt._core.errors import InvalidArgument

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("17", 17), (" 17 ", 17), ("17b", 17), ("1k", KiB), ("1KB", KiB), ("1 KiB", KiB), ("2m", 2 * MiB),
    ("2MB", 2 * MiB), ("2MiB", 2 * MiB), ("3g", 3 * GiB), ("3GB", 3 * GiB), ("3gib", 3 * GiB), ("1t", TiB),
    ("1tb", TiB), ("1TiB", TiB), ("1.5k", 1536), ("0.5MiB", MiB // 2), (4096, 4096), (0, 0),
])
def test_parse_size_units(text, expected):
    assert ac.parse_size("chunk_size", text) == expected


@pytest.mark.parametrize("bad", ["12 parsecs", "k", "", "1.2.3k", "-", "mb", "1kk", "x1"])
def test_parse_size_refuses_what_is_not_a_size(bad):
    with pytest.raises(InvalidArgument, match="chunk_size"):
        ac.parse_size("chunk_size", bad)


@pytest.mark.parametrize("bad", [-1, "-1", "-1k", True, False])
def test_parse_size_refuses_negative_sizes_and_bools(bad):
    with pytest.raises(InvalidArgument, match="grow_min"):
        ac.parse_size("grow_min", bad)


def test_parse_size_none_only_where_allowed():
    for off in (None, "none", "inf", "off", "", " None "):
        assert ac.parse_size("max_split_size", off, allow_none=True) is None
    for off in ("none", "inf", "off", ""):
        with pytest.raises(InvalidArgument):
            ac.parse_size("small_size", off)
    with pytest.raises(InvalidArgument):
        ac.parse_size("small_size", None)


@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (1, True), (0, False), ("1", True), ("true", True), ("Yes", True), (" on ", True),
    ("0", False), ("false", False), ("NO", False), ("off", False),
])
def test_parse_bool(value, expected):
    assert ac.parse_bool("paddle_compat", value) is expected


@pytest.mark.parametrize("bad", [2, -1, "2", "maybe", "", None])
def test_parse_bool_refuses(bad):
    with pytest.raises(InvalidArgument, match="paddle_compat"):
        ac.parse_bool("paddle_compat", bad)


@pytest.mark.parametrize("value, expected", [
    (None, None), ("none", None), (" OFF ", None), ("", None), ("64M", 64 * MiB), (1024, 1024), ("0", 0),
    (0.5, ("fraction", 0.5)), ("0.25", ("fraction", 0.25)), (1.0, ("fraction", 1.0)), ("1.0", ("fraction", 1.0)),
    ("1.5k", 1536),
])
def test_limit_bytes_or_fraction(value, expected):
    assert ac.normalize({"limit": value}, "test") == {"limit": expected}


@pytest.mark.parametrize("bad", [0.0, "0.0", "0.", -0.5, 1.5, "1.5", "2.0", float("nan")])
def test_limit_fraction_must_be_in_0_1(bad):
    # limit=0.0 would be a device of no memory at all: refused, not taken as "no limit" or as 0 bytes
    with pytest.raises(InvalidArgument, match=r"limit: a fraction must be in \(0, 1\]"):
        ac.normalize({"limit": bad}, "test")


@pytest.mark.parametrize("key, hi", [("grow_fraction", 1.0), ("grow_ratio", 4.0), ("exact_above", 1.0)])
def test_fractions_bounds(key, hi):
    assert ac.normalize({key: 0}, "s")[key] == 0.0
    assert ac.normalize({key: hi}, "s")[key] == hi
    assert ac.normalize({key: str(hi)}, "s")[key] == hi
    assert ac.normalize({key: "1/32"}, "s")[key] == 1 / 32
    for bad in (-0.01, hi + 0.01, "1/0", "x", True, None, "nan"):
        with pytest.raises(InvalidArgument, match=f"s: allocator config {key}"):
            ac.normalize({key: bad}, "s")


@pytest.mark.parametrize("key", ["grow_exact_credit", "settle_after", "grow_requests", "growth_wait_ms"])
def test_counts(key):
    assert ac.normalize({key: 0}, "s")[key] == 0
    assert ac.normalize({key: " 12 "}, "s")[key] == 12
    assert ac.normalize({key: 1 << 40}, "s")[key] == 1 << 40
    for bad in (-1, (1 << 40) + 1, "1.5", "x", True, False):
        with pytest.raises(InvalidArgument, match=f"s: allocator config {key}"):
            ac.normalize({key: bad}, "s")


@pytest.mark.parametrize("key, names", [
    ("growth", ac.GROWTH_NAMES), ("release", ac.RELEASE_NAMES), ("grow_round", ac.ROUND_NAMES),
    ("consolidate", ac.CONSOLIDATE_NAMES), ("grow_base", ac.BASE_NAMES),
])
def test_names(key, names):
    for n in names:
        assert ac.normalize({key: f" {n.upper()} "}, "s") == {key: n}
    with pytest.raises(InvalidArgument) as e:
        ac.normalize({key: "bogus"}, "src")
    msg = str(e.value)
    assert msg.startswith(f"src: allocator config {key}: expected ")
    assert f"{names[-1]}, got 'bogus'" in msg and all(n in msg for n in names)


def test_normalize_every_key_and_unknown_keys():
    conf = {"paddle_compat": "1", "small_borrow": "0", "max_split_size": "none", "chunk_size": "2MiB",
            "small_size": "64k", "small_chunk": "4m", "grow_min": "1m", "grow_step": "8m"}
    out = ac.normalize(conf, "s")
    assert out == {"paddle_compat": True, "small_borrow": False, "max_split_size": None, "chunk_size": 2 * MiB,
                   "small_size": 64 * KiB, "small_chunk": 4 * MiB, "grow_min": MiB, "grow_step": 8 * MiB}
    with pytest.raises(InvalidArgument, match=r"src: unknown allocator config key 'bogus' \(known: paddle_compat, "):
        ac.normalize({"bogus": 1}, "src")
    assert set(ac.CONF_KEYS) >= set(conf) | {"growth", "release", "limit", "grow_fraction", "grow_ratio",
                                             "exact_above", "grow_round", "consolidate", "grow_base",
                                             "grow_exact_credit", "settle_after", "grow_requests"}


def test_parse_env():
    env = {"PADDLE_RT_ALLOC_CONF": " growth:exact , limit:64M,,release : free "}
    assert ac.parse_env(env) == {"growth": "exact", "limit": 64 * MiB, "release": "free"}
    assert ac.parse_env({}) == {}
    assert ac.parse_env({"PADDLE_RT_ALLOC_CONF": ""}) == {}
    assert ac.parse_env({"PADDLE_RT_ALLOC_CONF": "max_split_size:"}) == {"max_split_size": None}
    with pytest.raises(InvalidArgument, match="PADDLE_RT_ALLOC_CONF: 'growth' is not key:value"):
        ac.parse_env({"PADDLE_RT_ALLOC_CONF": "growth"})
    with pytest.raises(InvalidArgument, match="PADDLE_RT_ALLOC_CONF: unknown allocator config key 'nope'"):
        ac.parse_env({"PADDLE_RT_ALLOC_CONF": "nope:1"})


def test_effective_keywords_over_environment(monkeypatch):
    monkeypatch.setenv("PADDLE_RT_ALLOC_CONF", "growth:exact,release:free")
    assert ac.effective({"growth": "fixed"}) == {"growth": "fixed", "release": "free"}
    monkeypatch.delenv("PADDLE_RT_ALLOC_CONF")
    assert ac.effective({}) == {}


DEFAULTS = {
    "paddle_compat": False, "growth": ac.GROWTH_NAMES.index("adaptive"), "chunk_size": 0, "max_split_size": None,
    "limit": None, "release": ac.RELEASE_NAMES.index("empty_cache"), "small_size": 128 * KiB, "small_chunk": 2 * MiB,
    "grow_min": 4 * MiB, "grow_step": 12 * MiB, "grow_fraction": 0.25, "grow_ratio": 0.5,
    "grow_round": ac.ROUND_NAMES.index("up"), "consolidate": ac.CONSOLIDATE_NAMES.index("fold"),
    "grow_base": ac.BASE_NAMES.index("grown"), "grow_exact_credit": 8, "settle_after": 0, "grow_requests": 32,
    "exact_above": 0.95, "small_borrow": True, "remainder_low": False, "ties_by_address": False, "quick_reuse": True,
    "expandable_segments": 2,   # "auto" (alloc_config.DEFAULT_EXPANDABLE): on where the plugin has the extension
    "growth_wait_ms": 1000,
}


def test_resolve_defaults():
    assert ac.resolve({}) == DEFAULTS


def test_resolve_paddle_compat_is_a_preset():
    r = ac.resolve({"paddle_compat": True, "growth": "adaptive", "small_size": 4096, "small_borrow": True})
    assert r["growth"] == ac.GROWTH_NAMES.index("fixed")
    assert r["small_size"] == 0 and r["small_borrow"] is False
    assert r["remainder_low"] is True and r["ties_by_address"] is True and r["quick_reuse"] is False
    assert r["paddle_compat"] is True


def test_resolve_growth_rules_and_keys():
    assert ac.resolve({"chunk_size": MiB})["growth"] == ac.GROWTH_NAMES.index("fixed")
    assert ac.resolve({"chunk_size": MiB, "growth": "exact"})["growth"] == ac.GROWTH_NAMES.index("exact")
    assert ac.resolve({"growth": "exact"})["growth"] == ac.GROWTH_NAMES.index("exact")
    r = ac.resolve({"release": "free"})
    assert r["release"] == ac.RELEASE_NAMES.index("free") and r["quick_reuse"] is False
    given = {"max_split_size": MiB, "limit": ("fraction", 0.5), "small_size": 1, "small_chunk": 3, "grow_min": 5,
             "grow_step": 6, "grow_fraction": 0.1, "grow_ratio": 2.0, "grow_round": "within",
             "consolidate": "off", "grow_base": "reserved", "grow_exact_credit": 0, "settle_after": 9,
             "grow_requests": 0, "exact_above": 0.0, "small_borrow": False, "chunk_size": 7}
    r = ac.resolve(given)
    for k in ("max_split_size", "limit", "small_size", "small_chunk", "grow_min", "grow_step", "grow_fraction",
              "grow_ratio", "grow_exact_credit", "settle_after", "grow_requests", "exact_above", "chunk_size"):
        assert r[k] == given[k], k
    assert r["grow_round"] == ac.ROUND_NAMES.index("within")
    assert r["consolidate"] == ac.CONSOLIDATE_NAMES.index("off")
    assert r["grow_base"] == ac.BASE_NAMES.index("reserved")
    assert r["small_borrow"] is False


def test_resolve_refuses_a_zero_small_chunk():
    with pytest.raises(InvalidArgument, match="small_chunk must be positive"):
        ac.resolve({"small_chunk": 0})


# -- what the mutation run (docs/testing.md) found untested ------------------------------------------------------------
def test_booleans_are_bools_not_sizes():
    out = ac.normalize({"paddle_compat": "1", "small_borrow": "0"}, "s")
    assert out["paddle_compat"] is True and out["small_borrow"] is False      # 1 == True: `is` tells them apart
    with pytest.raises(InvalidArgument) as e:
        ac.normalize({"small_borrow": "2"}, "s")
    assert str(e.value) == "allocator config small_borrow: expected 0 or 1, got '2'"


def test_max_split_size_takes_a_size():
    assert ac.normalize({"max_split_size": "1m"}, "s") == {"max_split_size": MiB}
    assert ac.normalize({"max_split_size": 4096}, "s") == {"max_split_size": 4096}
    with pytest.raises(InvalidArgument) as e:
        ac.normalize({"max_split_size": "x"}, "s")
    assert str(e.value).startswith("allocator config max_split_size: 'x' is not a size")


def test_messages_name_the_key_and_the_source():
    cases = [({"limit": "12 parsecs"}, "allocator config limit: '12 parsecs' is not a size"),
             ({"chunk_size": "x"}, "allocator config chunk_size: 'x' is not a size"),
             ({"limit": 1.5}, "src: allocator config limit: a fraction must be in (0, 1], got 1.5"),
             ({"grow_requests": -1}, f"src: allocator config grow_requests: expected 0 to {1 << 40}, got -1"),
             ({"growth": "x"}, "src: allocator config growth: expected adaptive, exact or fixed, got 'x'")]
    for conf, start in cases:
        with pytest.raises(InvalidArgument) as e:
            ac.normalize(conf, "src")
        assert str(e.value).startswith(start), str(e.value)
    with pytest.raises(InvalidArgument) as e:
        ac.parse_env({"PADDLE_RT_ALLOC_CONF": "limit:1:2"})
    assert str(e.value).startswith("allocator config limit: '1:2' is not a size")
    with pytest.raises(InvalidArgument) as e:
        ac.resolve({"small_chunk": 0})
    assert str(e.value) == "allocator config small_chunk must be positive"


def test_whole_sizes_are_exact_beyond_float_precision():
    assert ac.parse_size("chunk_size", "9007199254740993") == 9007199254740993     # 2**53 + 1
