"""The caching allocator's configuration: the keys, their names and values, parsing and validation, and how a
configuration becomes the allocator's policy settings. Pure Python; the allocator (allocator.pyx) copies the
resolved settings into its C struct.

Precedence: keyword arguments (``paddle_rt.set_allocator_config``) over ``PADDLE_RT_ALLOC_CONF="key:value,..."``
over the plugin's size hints (min chunk size, extra padding), which set the rounding and are not keys.

Configuration (keyword arguments of :func:`set_allocator_config` first, then ``PADDLE_RT_ALLOC_CONF="key:value,..."``,
then the plugin's hints). Sizes accept a suffix ``K``/``KB``/``KiB``, ``M``/``MB``/``MiB``, ``G``/``GB``/``GiB``
(all binary, 1K = 1024 bytes):

``paddle_compat``  ``0``/``1``: Paddle's auto-growth rules exactly (above). Default 0.
``growth``         ``adaptive`` (default), ``exact`` (a miss asks for the rounded request), ``fixed`` (a miss asks for
                   ``max(request, chunk_size)``).
``chunk_size``     bytes, the chunk size of ``growth:fixed`` and of ``paddle_compat`` (Paddle's chunk size flag);
                   setting it without ``growth`` selects ``fixed``. Default 0.
``max_split_size`` bytes or ``none``: free blocks larger than this are never split and never serve requests up to this
                   size (PyTorch's ``max_split_size_mb``, against fragmentation). Default none.
``limit``          bytes, or a fraction ``0 < f <= 1`` of the device's total memory (``device_memory_stats``): the
                   most memory the allocator holds at once; beyond it the OOM ladder runs. Default none.
``release``        ``empty_cache`` (default): idle chunks go back on ``empty_cache()`` and on the OOM ladder only;
                   ``free``: also as soon as a free makes a chunk idle (while the device's streams have
                   queued work, the chunk is kept and goes back with the next such free or ``empty_cache()``).
``small_size``     bytes, requests up to it use the small pool (0: one pool). Default 128 KiB (0 in paddle_compat).
``small_chunk``    bytes, the chunk size of the small pool. Default 2 MiB.

The growth rule of ``growth:adaptive`` (alloc_policy.chunk_for_miss): a miss in the large pool asks the plugin for a
target of ``grow_ratio * base``, at least ``grow_min``, at most ``max(grow_step, grow_fraction * base)`` and at most
``grow_requests`` requests of the missing size (``base``: what the allocator holds at the miss; with
``grow_base:grown`` its chunks made exactly for one request count for at most ``grow_exact_credit`` requests of the
missing size, so that a model's weights or one oversize tensor do not inflate later steps; once ``settle_after``
allocations were served from the cache since the last growth, the target is ``grow_min`` alone), made a whole number
of requests of the missing size (``grow_round``; a request of at least ``exact_above`` times the target gets a chunk
of exactly its size instead), at least the request. A small request that no free block of the small pool serves
first takes a free block of the large pool (``small_borrow``), before the small pool grows. Before it grows, ``consolidate`` decides what happens to the pool's idle
chunks. The defaults: chosen by family-held-out validation on the corpus of bench/traces and ../shared/traces
(bench/RESULTS.md, issue 22; ``python bench/policy_search.py heldout``).

``grow_min``       bytes, the smallest chunk adaptive growth asks for. Default 4 MiB.
``grow_step``      bytes, the fixed part of the cap on a chunk. Default 12 MiB.
``grow_fraction``  a number 0..1 (or a ratio such as ``1/32``), the proportional part of the cap. Default 1/4.
``grow_ratio``     a number 0..4, the target as a multiple of what is held (1: the pool doubles while it is small).
                   Default 0.5.
``grow_round``     ``up`` (default: the smallest whole number of requests of the missing size at or above the
                   target), ``nearest``, ``down`` (at least one request), ``within`` (as ``up``, but no more requests
                   than fit in the cap ``max(grow_step, grow_fraction * base)``, at least one) or ``off`` (the
                   target as it is).
``consolidate``    ``fold`` (default): the pool's idle chunks go back to the plugin and the new chunk is at least the
                   request plus what went back; ``release``: they go back and the new chunk is sized by the rule
                   alone; ``off``: they stay cached.
``grow_base``      ``grown`` (default): the growth base is what the allocator holds, its large-pool chunks made
                   exactly for one request (a chunk no larger than the request it was made for: a model's weights, one
                   oversize tensor) counted for at most ``grow_exact_credit`` requests of the missing size;
                   ``reserved``: everything it holds (the rule of issue 22's first default).
``grow_exact_credit``  a whole number (0: such chunks do not count at all). Default 8.
``settle_after``   a whole number: once this many allocations were served from the cache since the last large-pool
                   growth, the growth ramp is over and a miss asks for ``grow_min`` alone (in whole requests, at
                   least the request); 0: never. Default 0.
``grow_requests``  a whole number: the target is at most this many requests of the missing size (before the rounding
                   to whole requests; 0: no bound). Default 32.
``exact_above``    a number 0..1: a missing request of at least this fraction of the target (after grow_requests) gets
                   a chunk of exactly its size, not whole requests (0: never). Default 0.95.
``small_borrow``   ``0``/``1``: a small request that no free block of the small pool serves takes a free block of the
                   large pool before the small pool grows (off in paddle_compat, which has one pool). Default 1.

``expandable_segments``  ``auto``, ``1`` or ``0`` (default ``auto``: on when the plugin exports the virtual-memory
                   extension and its handshake passes): segments that grow in place (docs/expandable_segments.md).
                   With it on, each stream tag (the default stream's, each stream-ordered pool's) holds one reserved
                   virtual range, shared by requests of every size, into which the allocator maps physical memory of
                   the plugin's granularity as it grows, instead of asking ``device_memory_allocate`` for chunks; the
                   growth keys above and small_size then do not apply. It needs the
                   plugin's virtual-memory extension (paddle_rt/paddle_rt_vmm_ext.h): ``auto`` turns it on when the
                   plugin exports it and its granularity call succeeds, ``1`` requires it (InvalidArgument without),
                   ``0`` never uses it. Off in ``paddle_compat``. It can only change while the allocator holds no
                   memory.
``growth_wait_ms``  a whole number of milliseconds: how long one growth waits at most for the streams to run past
                   the frees of memory it could use instead (idle chunks it would consolidate, free pages it would
                   move, blocks whose ``record_stream`` frees are pending), as cudaFree and PyTorch's expandable
                   segments wait for the device; past it, or when the caller holds the GIL or is a stream's
                   callback, the allocator grows without them. 0: never wait (the device may then hold more while
                   the host runs ahead). Default 1000.
"""
import os

from paddle_rt._core import errors

#: The keys, in the order the configuration table of docs/memory.md documents them.
CONF_KEYS = ("paddle_compat", "growth", "chunk_size", "max_split_size", "limit", "release", "small_size",
             "small_chunk", "grow_min", "grow_step", "grow_fraction", "grow_ratio", "grow_round", "consolidate",
             "grow_base", "grow_exact_credit", "settle_after", "grow_requests", "exact_above", "small_borrow",
             "expandable_segments", "growth_wait_ms")

#: Values of expandable_segments, indexed by the allocator's EXPANDABLE_* constants (allocator.pxd).
EXPANDABLE_NAMES = ("0", "1", "auto")
#: Names of the growth modes, indexed by the allocator's GROWTH_* constants (allocator.pxd).
GROWTH_NAMES = ("adaptive", "exact", "fixed")
#: Names of the release modes, indexed by the allocator's RELEASE_* constants (allocator.pxd).
RELEASE_NAMES = ("empty_cache", "free")
#: Names of the whole-request rounding of adaptive growth, indexed by the ROUND_* constants (allocator.pxd).
ROUND_NAMES = ("nearest", "up", "down", "off", "within")
#: Names of what adaptive growth does with idle chunks before it grows, indexed by CONSOLIDATE_* (allocator.pxd).
CONSOLIDATE_NAMES = ("fold", "release", "off")
#: Names of what adaptive growth is proportional to, indexed by the BASE_* constants (allocator.pxd).
BASE_NAMES = ("reserved", "grown")

KiB, MiB = 1 << 10, 1 << 20
DEFAULT_SMALL_SIZE = 128 * KiB    # requests up to it go to the small pool
DEFAULT_SMALL_CHUNK = 2 * MiB     # the small pool's chunk size
DEFAULT_GROW_MIN = 4 * MiB
DEFAULT_GROW_STEP = 12 * MiB
DEFAULT_GROW_FRACTION = 1 / 4
DEFAULT_GROW_RATIO = 0.5
DEFAULT_GROW_ROUND = "up"
DEFAULT_CONSOLIDATE = "fold"
DEFAULT_GROW_BASE = "grown"
DEFAULT_GROW_EXACT_CREDIT = 8
DEFAULT_SETTLE_AFTER = 0
DEFAULT_GROW_REQUESTS = 32
DEFAULT_EXACT_ABOVE = 0.95
DEFAULT_SMALL_BORROW = True
#: expandable_segments' default: on wherever the plugin exports the virtual-memory extension and its handshake
#: passes (rt_cpu does), chunks otherwise. paddle_compat forces 0 (Paddle's auto-growth chunks).
DEFAULT_EXPANDABLE = "auto"
DEFAULT_GROWTH_WAIT_MS = 1000

_SUFFIX = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
           "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_OFF = ("none", "inf", "off", "")


def parse_size(key, value, allow_none=False):
    """Bytes from an int or a string with an optional binary suffix (K/KiB, M/MiB, G/GiB, T/TiB)."""
    if isinstance(value, bool):
        raise errors.InvalidArgument(f"allocator config {key}: expected a size in bytes, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise errors.InvalidArgument(f"allocator config {key}: the size must not be negative, got {value}")
        return value
    if value is None and allow_none:
        return None
    s = str(value).strip().lower()
    if allow_none and s in _OFF:
        return None
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    suf = s[len(num):].strip()
    num = num.strip()
    if suf not in _SUFFIX or not num:
        raise errors.InvalidArgument(f"allocator config {key}: {value!r} is not a size (bytes, optionally with a "
                                     f"K/M/G suffix)")
    try:
        v = float(num) if "." in num else int(num)
    except ValueError:
        raise errors.InvalidArgument(f"allocator config {key}: {value!r} is not a size") from None
    v = int(v * _SUFFIX[suf])
    if v < 0:
        raise errors.InvalidArgument(f"allocator config {key}: the size must not be negative, got {value!r}")
    return v


def parse_bool(key, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise errors.InvalidArgument(f"allocator config {key}: expected 0 or 1, got {value!r}")


def _parse_name(key, value, names, source):
    v = str(value).strip().lower()
    if v not in names:
        raise errors.InvalidArgument(f"{source}: allocator config {key}: expected {', '.join(names[:-1])} or "
                                     f"{names[-1]}, got {value!r}")
    return v


def _parse_limit(value, source):
    """None (no limit), bytes, or ("fraction", f) of the device's total memory."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "off", "")):
        return None
    if isinstance(value, float) or (isinstance(value, str) and "." in value and
                                    value.strip().rstrip("0123456789.") == ""):
        f = float(value)
        if not (0.0 < f <= 1.0):
            raise errors.InvalidArgument(f"{source}: allocator config limit: a fraction must be in (0, 1], "
                                         f"got {value!r}")
        return ("fraction", f)
    return parse_size("limit", value)


def _parse_fraction(key, value, source, hi):
    """A number 0 <= f <= hi (a float, an int or a decimal string; a string may also be a ratio "1/24")."""
    if isinstance(value, bool):
        raise errors.InvalidArgument(f"{source}: allocator config {key}: expected a number, got {value!r}")
    try:
        if isinstance(value, str) and "/" in value:
            num, _, den = value.partition("/")
            f = float(num) / float(den)
        else:
            f = float(value)
    except (TypeError, ValueError, ZeroDivisionError):
        raise errors.InvalidArgument(f"{source}: allocator config {key}: {value!r} is not a number") from None
    if not (0.0 <= f <= hi):
        raise errors.InvalidArgument(f"{source}: allocator config {key}: expected a number from 0 to {hi:g}, "
                                     f"got {value!r}")
    return f


def _parse_count(key, value, source):
    """A whole number >= 0 (an int or a decimal string)."""
    if isinstance(value, bool):
        raise errors.InvalidArgument(f"{source}: allocator config {key}: expected a whole number, got {value!r}")
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise errors.InvalidArgument(f"{source}: allocator config {key}: {value!r} is not a whole number") from None
    if n < 0 or n > 1 << 40:
        raise errors.InvalidArgument(f"{source}: allocator config {key}: expected 0 to {1 << 40}, got {value!r}")
    return n


def normalize(conf, source):
    """Validate a {key: value} mapping; return {key: parsed}. ``source`` names where it came from, for messages."""
    out = {}
    for key, value in conf.items():
        if key not in CONF_KEYS:
            raise errors.InvalidArgument(f"{source}: unknown allocator config key {key!r} "
                                         f"(known: {', '.join(CONF_KEYS)})")
        if key in ("paddle_compat", "small_borrow"):
            out[key] = parse_bool(key, value)
        elif key == "growth":
            out[key] = _parse_name(key, value, GROWTH_NAMES, source)
        elif key == "expandable_segments":
            v = str(int(value) if isinstance(value, bool) else value).strip().lower()
            v = {"true": "1", "on": "1", "yes": "1", "false": "0", "off": "0", "no": "0"}.get(v, v)
            out[key] = _parse_name(key, v, EXPANDABLE_NAMES, source)
        elif key == "release":
            out[key] = _parse_name(key, value, RELEASE_NAMES, source)
        elif key == "max_split_size":
            out[key] = parse_size(key, value, allow_none=True)
        elif key == "limit":
            out[key] = _parse_limit(value, source)
        elif key == "grow_fraction":
            out[key] = _parse_fraction(key, value, source, 1.0)
        elif key == "grow_ratio":
            out[key] = _parse_fraction(key, value, source, 4.0)
        elif key == "exact_above":
            out[key] = _parse_fraction(key, value, source, 1.0)
        elif key == "grow_round":
            out[key] = _parse_name(key, value, ROUND_NAMES, source)
        elif key == "consolidate":
            out[key] = _parse_name(key, value, CONSOLIDATE_NAMES, source)
        elif key == "grow_base":
            out[key] = _parse_name(key, value, BASE_NAMES, source)
        elif key in ("grow_exact_credit", "settle_after", "grow_requests", "growth_wait_ms"):
            out[key] = _parse_count(key, value, source)
        else:
            out[key] = parse_size(key, value)
    return out


def parse_env(environ=os.environ):
    """``PADDLE_RT_ALLOC_CONF="key:value,..."``, normalised."""
    text = environ.get("PADDLE_RT_ALLOC_CONF", "")
    conf = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if ":" not in item:
            raise errors.InvalidArgument(f"PADDLE_RT_ALLOC_CONF: {item!r} is not key:value")
        k, _, v = item.partition(":")
        conf[k.strip()] = v.strip()
    return normalize(conf, "PADDLE_RT_ALLOC_CONF")


def effective(keywords):
    """The environment's settings with ``keywords`` (already normalised) over them."""
    conf = dict(parse_env())
    conf.update(keywords)
    return conf


def resolve(conf):
    """The allocator's policy settings from a normalised configuration, defaults filled in:
    {paddle_compat, growth (index into GROWTH_NAMES), chunk_size, max_split_size (None: off), limit (None, bytes or
    ("fraction", f)), release (index into RELEASE_NAMES), small_size, small_chunk, remainder_low, ties_by_address,
    quick_reuse}.

    ``paddle_compat`` is a preset, not a branch of the mechanism: Paddle's auto-growth rules are one pool
    (small_size 0), fixed growth (a miss asks for max(request, chunk_size)), the free remainder of a split at the
    low end of the block, ties between free blocks of one size broken by address, and no quick-reuse slots."""
    compat = bool(conf.get("paddle_compat", False))
    chunk = conf.get("chunk_size", 0)
    growth = conf.get("growth")
    if compat:
        growth = "fixed"
    elif growth is None:
        growth = "fixed" if chunk else "adaptive"
    release = conf.get("release", "empty_cache")
    small_chunk = conf.get("small_chunk", DEFAULT_SMALL_CHUNK)
    if small_chunk == 0:
        raise errors.InvalidArgument("allocator config small_chunk must be positive")
    return {
        "paddle_compat": compat,
        "growth": GROWTH_NAMES.index(growth),
        "chunk_size": chunk,
        "max_split_size": conf.get("max_split_size"),
        "limit": conf.get("limit"),
        "release": RELEASE_NAMES.index(release),
        "small_size": 0 if compat else conf.get("small_size", DEFAULT_SMALL_SIZE),
        "small_chunk": small_chunk,
        "grow_min": conf.get("grow_min", DEFAULT_GROW_MIN),
        "grow_step": conf.get("grow_step", DEFAULT_GROW_STEP),
        "grow_fraction": conf.get("grow_fraction", DEFAULT_GROW_FRACTION),
        "grow_ratio": conf.get("grow_ratio", DEFAULT_GROW_RATIO),
        "grow_round": ROUND_NAMES.index(conf.get("grow_round", DEFAULT_GROW_ROUND)),
        "consolidate": CONSOLIDATE_NAMES.index(conf.get("consolidate", DEFAULT_CONSOLIDATE)),
        "grow_base": BASE_NAMES.index(conf.get("grow_base", DEFAULT_GROW_BASE)),
        "grow_exact_credit": conf.get("grow_exact_credit", DEFAULT_GROW_EXACT_CREDIT),
        "settle_after": conf.get("settle_after", DEFAULT_SETTLE_AFTER),
        "grow_requests": conf.get("grow_requests", DEFAULT_GROW_REQUESTS),
        "exact_above": conf.get("exact_above", DEFAULT_EXACT_ABOVE),
        "small_borrow": bool(conf.get("small_borrow", DEFAULT_SMALL_BORROW)) and not compat,
        "remainder_low": compat,
        "ties_by_address": compat,
        "quick_reuse": not compat and release != "free",
        "expandable_segments": 0 if compat else EXPANDABLE_NAMES.index(conf.get("expandable_segments",
                                                                                DEFAULT_EXPANDABLE)),
        "growth_wait_ms": conf.get("growth_wait_ms", DEFAULT_GROWTH_WAIT_MS),
    }
