"""Rotary embedding frequencies of a checkpoint, computed as Hugging Face transformers computes them
(``transformers/modeling_rope_utils.py``): the one place of this example where the rope types live.

Types: ``default``, ``linear``, ``dynamic`` (NTK-aware, recomputed as the sequence grows past
``max_position_embeddings``), ``yarn`` and ``llama3``. transformers computes the inverse frequencies in float32 torch
tensors with Python floats as scalars (cast to float32 where they meet a tensor), the correction ranges of yarn and
the wavelength limits of llama3 in Python (double) arithmetic; this module does the same in numpy float32, so that
the tables are the same numbers and float32 generation stays token-identical. The rotary tables are
``cos(position * inv_freq) * attention_factor`` (and sin), float32, cast to the model's dtype.
"""
import math

import numpy as np

F32 = np.float32
TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


class RopeError(ValueError):
    """A rope configuration this module cannot compute (the message names the field)."""


def _need(params, key, kind=(int, float)):
    v = params.get(key)
    if v is None or isinstance(v, bool) or not isinstance(v, kind):
        raise RopeError(f"rope {key} must be a number, not {v!r}")
    return v


class Rope:
    """The rope of a checkpoint: ``Rope(params, head_dim, max_position_embeddings)`` with ``params`` the merged
    ``rope_parameters`` / ``rope_scaling`` object of config.json (``rope_type``, ``rope_theta``, ``factor``...)."""

    def __init__(self, params, head_dim, max_position_embeddings):
        self.type = params.get("rope_type", params.get("type", "default"))
        if self.type not in TYPES:
            raise RopeError(f"rope type {self.type!r} is not supported by this example (supported: "
                            f"{', '.join(TYPES)})")
        prf = params.get("partial_rotary_factor", 1.0)
        if prf not in (None, 1, 1.0):
            raise RopeError(f"partial_rotary_factor {prf!r} is not supported by this example (only 1.0)")
        self.theta = float(_need(params, "rope_theta"))
        if not self.theta > 0:
            raise RopeError(f"rope_theta must be > 0, not {self.theta!r}")
        self.dim = head_dim
        self.max_pos = max_position_embeddings
        self.params = dict(params)
        if self.type in ("linear", "dynamic", "llama3"):
            self.factor = float(_need(params, "factor"))
        elif self.type == "yarn":
            f = params.get("factor")
            self.factor = None if f is None else float(_need(params, "factor"))
        if self.type in ("yarn", "llama3"):
            self.original_max = int(_need(params, "original_max_position_embeddings", int)
                                    if "original_max_position_embeddings" in params else max_position_embeddings)
        if self.type == "llama3":
            for k in ("low_freq_factor", "high_freq_factor"):
                _need(params, k)
        self.attention_factor = 1.0
        self.base_inv_freq = self._inv_freq(None)

    @property
    def grows(self):
        """True when the frequencies depend on the sequence length (dynamic: past max_position_embeddings)."""
        return self.type == "dynamic"

    def _exponent(self):
        return np.arange(0, self.dim, 2, dtype=np.int64).astype(F32) / F32(self.dim)

    def _inv_freq(self, seq_len):
        t, base = self.type, self.theta
        if t == "dynamic" and seq_len is not None:
            # transformers at run time: seq_len a tensor, every step in float32
            s = F32(max(seq_len, self.max_pos))
            b = F32(base) * ((F32(self.factor) * s / F32(self.max_pos) - F32(self.factor - 1))
                             ** F32(self.dim / (self.dim - 2)))
            return (F32(1.0) / (F32(b) ** self._exponent())).astype(F32)
        inv = (F32(1.0) / (F32(base) ** self._exponent())).astype(F32)
        if t == "linear":
            inv = (inv / F32(self.factor)).astype(F32)
        elif t == "llama3":
            inv = self._llama3(inv)
        elif t == "yarn":
            inv = self._yarn()
        return inv

    def _llama3(self, inv):
        p = self.params
        factor, low, high, old = self.factor, p["low_freq_factor"], p["high_freq_factor"], self.original_max
        low_wavelen, high_wavelen = old / low, old / high          # Python floats
        wavelen = (F32(2 * math.pi) / inv).astype(F32)
        scaled = np.where(wavelen > F32(low_wavelen), (inv / F32(factor)).astype(F32), inv).astype(F32)
        smooth = ((F32(old) / wavelen - F32(low)) / F32(high - low)).astype(F32)
        smoothed = ((F32(1) - smooth) * scaled / F32(factor) + smooth * scaled).astype(F32)
        medium = ~(wavelen < F32(high_wavelen)) & ~(wavelen > F32(low_wavelen))
        return np.where(medium, smoothed, scaled).astype(F32)

    def _yarn(self):
        p, dim, base = self.params, self.dim, self.theta
        factor = self.factor if self.factor is not None else self.max_pos / self.original_max
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        af = p.get("attention_factor")
        if af is None:
            af = (float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)) if mscale and mscale_all_dim
                  else get_mscale(factor))
        self.attention_factor = float(af)
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

        def correction_dim(rotations):
            return (dim * math.log(self.original_max / (rotations * 2 * math.pi))) / (2 * math.log(base))

        lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
        if p.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        pos_freqs = (F32(base) ** (np.arange(0, dim, 2).astype(F32) / F32(dim))).astype(F32)
        extrapolation = (F32(1.0) / pos_freqs).astype(F32)
        interpolation = (F32(1.0) / (F32(factor) * pos_freqs)).astype(F32)
        ramp = np.clip((np.arange(dim // 2, dtype=F32) - F32(lo)) / F32(hi - lo), 0, 1).astype(F32)
        extra_factor = (F32(1) - ramp).astype(F32)
        return (interpolation * (F32(1) - extra_factor) + extrapolation * extra_factor).astype(F32)

    def inv_freq_rows(self, capacity, prompt_len):
        """(capacity, dim / 2) float32: the inverse frequencies each position is rotated with, when a sequence of
        ``prompt_len`` tokens is run at once and then one token a step (transformers' generate). Only dynamic rope
        gives positions different rows: the prompt's positions the frequencies of its length, a later position p
        those of length p + 1, once longer than max_position_embeddings."""
        rows = np.broadcast_to(self.base_inv_freq, (capacity, self.dim // 2)).copy()
        if not self.grows:
            return rows
        if prompt_len > self.max_pos:
            rows[:prompt_len] = self._inv_freq(prompt_len)
        for p in range(max(prompt_len, self.max_pos), capacity):
            rows[p] = self._inv_freq(p + 1)
        return rows

    def tables(self, capacity, prompt_len, dtype):
        """(sin, cos) of shape (capacity, dim / 2) in ``dtype``: angles position * inv_freq in float32, their sine and
        cosine times the attention factor in float32, then cast."""
        inv = self.inv_freq_rows(capacity, prompt_len)
        angles = (np.arange(capacity, dtype=F32)[:, None] * inv).astype(F32)
        sin, cos = np.sin(angles), np.cos(angles)
        if self.attention_factor != 1.0:
            sin, cos = sin * F32(self.attention_factor), cos * F32(self.attention_factor)
        return sin.astype(dtype), cos.astype(dtype)
