"""Reading a checkpoint of the Llama family in Hugging Face's folder layout, without torch: ``config.json`` and
``model.safetensors`` (or the shards listed by ``model.safetensors.index.json``), read with the ``safetensors``
package's numpy API. Everything that is wrong with the folder, or that this example does not run, raises
:class:`CheckpointError` with one line naming the file, the key or the tensor, and the reason.

The families (``architectures`` of config.json) and how they differ from Llama, as transformers builds them:

- ``LlamaForCausalLM``: ``attention_bias`` puts a bias on q, k, v and o; every rope type of rope_scaling.py;
- ``Qwen2ForCausalLM``: a bias on q, k and v (always), none on o; sliding-window layers from ``layer_types``;
- ``Qwen3ForCausalLM``: an RMSNorm over head_dim of every q and k head (``q_norm``/``k_norm``) before the rotary
  embedding; ``attention_bias`` as Llama's; sliding-window layers from ``layer_types``;
- ``MistralForCausalLM``: ``sliding_window`` (when not null) on every layer: a query attends to the last
  sliding_window positions, itself included.
"""
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from rope_scaling import Rope, RopeError

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "mistral": "MistralForCausalLM"}


class CheckpointError(Exception):
    """The checkpoint folder cannot be used (missing, malformed, or an architecture this example does not run)."""


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple = ()
    architecture: str = "LlamaForCausalLM"
    qkv_bias: bool = False                  # q, k and v projections have a bias
    o_bias: bool = False                    # the output projection has a bias
    qk_norm: bool = False                   # Qwen3: per-head RMSNorm of q and k
    windows: tuple = ()                     # per layer: the sliding window (0: none); () = none anywhere
    rope: object = field(default=None, compare=False, repr=False)    # rope_scaling.Rope

    def window(self, layer):
        return self.windows[layer] if self.windows else 0

    @property
    def context_limit(self):
        """The most positions a sequence may reach: max_position_embeddings, or factor times it for dynamic rope
        (which rescales its frequencies past max_position_embeddings)."""
        if self.rope is not None and self.rope.grows:
            return int(self.max_position_embeddings * math.ceil(max(self.rope.factor, 1.0)))
        return self.max_position_embeddings

    @property
    def n_rep(self):
        """Query heads per key/value head (grouped-query attention; 1 for multi-head attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    def parameter_count(self):
        h, i, hd = self.hidden_size, self.intermediate_size, self.head_dim
        per_layer = (h * hd * (self.num_attention_heads * 2 + self.num_key_value_heads * 2) + 3 * h * i + 2 * h)
        per_layer += (self.num_attention_heads + 2 * self.num_key_value_heads) * hd if self.qkv_bias else 0
        per_layer += h if self.o_bias else 0
        per_layer += 2 * hd if self.qk_norm else 0
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * per_layer + h + head


def _field(cfg, key, kind, path, minimum=None):
    if key not in cfg:
        raise CheckpointError(f"{path}: missing key {key!r}")
    v = cfg[key]
    ok = (isinstance(v, bool) if kind is bool else
          isinstance(v, int) and not isinstance(v, bool) if kind is int else
          isinstance(v, (int, float)) and not isinstance(v, bool))
    if not ok:
        raise CheckpointError(f"{path}: {key} must be {kind.__name__}, not {v!r}")
    if minimum is not None and v < minimum:
        raise CheckpointError(f"{path}: {key} must be >= {minimum}, not {v!r}")
    return kind(v)


def _rope(cfg, path, head_dim, max_pos):
    """The rope of config.json: rope_parameters (transformers 5) merged with rope_scaling and the top-level
    rope_theta (transformers 4)."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    if not isinstance(params, dict) or not (scaling is None or isinstance(scaling, dict)):
        raise CheckpointError(f"{path}: rope_parameters / rope_scaling must be objects")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise CheckpointError(f"{path}: rope_parameters per layer type ({', '.join(params)}) are not supported by "
                              f"this example")
    merged = dict(params)
    merged.update(scaling or {})             # rope_scaling (transformers 4) over rope_parameters' defaults
    if scaling and "type" in scaling and "rope_type" not in scaling:
        merged["rope_type"] = scaling["type"]
    if "rope_theta" not in merged:
        if "rope_theta" not in cfg:
            raise CheckpointError(f"{path}: missing key 'rope_theta' (top level or in rope_parameters)")
        merged["rope_theta"] = cfg["rope_theta"]
    if "original_max_position_embeddings" in cfg and "original_max_position_embeddings" not in merged:
        merged["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    try:
        return Rope(merged, head_dim, max_pos)
    except RopeError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def _windows(cfg, path, arch, layers):
    """Per layer: the sliding window (0: full attention), as transformers' layer_types / sliding_window say."""
    sw = cfg.get("sliding_window")
    if arch == "MistralForCausalLM":
        if sw is None:
            return ()
        sw = _field(cfg, "sliding_window", int, path, 1)
        return (sw,) * layers
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        types = cfg.get("layer_types")
        if types is None:           # transformers 4: use_sliding_window from max_window_layers on
            on = cfg.get("use_sliding_window") and sw is not None
            first = cfg.get("max_window_layers", layers)
            types = ["sliding_attention" if on and i >= first else "full_attention" for i in range(layers)]
        if not isinstance(types, list) or len(types) != layers:
            raise CheckpointError(f"{path}: layer_types must list the {layers} layers, not {types!r}")
        bad = [t for t in types if t not in ("full_attention", "sliding_attention")]
        if bad:
            raise CheckpointError(f"{path}: layer type {bad[0]!r} is not supported by this example")
        if "sliding_attention" not in types:
            return ()
        sw = _field(cfg, "sliding_window", int, path, 1)
        return tuple(sw if t == "sliding_attention" else 0 for t in types)
    return ()


def _eos_ids(value):
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def read_config(folder):
    """The :class:`LlamaConfig` of ``folder/config.json`` (eos ids from generation_config.json when it has them)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (a Hugging Face checkpoint folder has config.json and "
                              f"model.safetensors)")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    arch = next((a for a in archs if a in ARCHITECTURES), None) if archs else MODEL_TYPES.get(model_type)
    if arch is None:
        what = ", ".join(map(str, archs)) if archs else f"model_type {model_type!r}"
        raise CheckpointError(f"{path}: unknown architecture {what}: this example runs {', '.join(ARCHITECTURES)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act {cfg['hidden_act']!r} is not supported (this family uses "
                              f"'silu')")
    if cfg.get("mlp_bias"):
        raise CheckpointError(f"{path}: mlp_bias = true is not supported by this example")
    if arch in ("Qwen2ForCausalLM", "MistralForCausalLM") and cfg.get("attention_bias"):
        raise CheckpointError(f"{path}: attention_bias = true is not supported for {arch}")
    attention_bias = bool(cfg.get("attention_bias")) if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") else False
    hidden = _field(cfg, "hidden_size", int, path, 1)
    heads = _field(cfg, "num_attention_heads", int, path, 1)
    kv_heads = _field(cfg, "num_key_value_heads", int, path, 1) if "num_key_value_heads" in cfg else heads
    if heads % kv_heads:
        raise CheckpointError(f"{path}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                              f"({kv_heads})")
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise CheckpointError(f"{path}: hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})")
        head_dim = hidden // heads
    head_dim = _field({"head_dim": head_dim}, "head_dim", int, path, 2)
    if head_dim % 2:
        raise CheckpointError(f"{path}: head_dim ({head_dim}) must be even for rotary embeddings")
    eos = _eos_ids(cfg.get("eos_token_id"))
    gen_path = os.path.join(folder, "generation_config.json")
    if os.path.isfile(gen_path):
        try:
            with open(gen_path) as f:
                gen = json.load(f)
            if isinstance(gen, dict) and "eos_token_id" in gen:
                eos = _eos_ids(gen["eos_token_id"])
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{gen_path}: not JSON ({exc})") from None
    if eos is None:
        raise CheckpointError(f"{path}: eos_token_id must be an int or a list of ints")
    layers = _field(cfg, "num_hidden_layers", int, path, 1)
    max_pos = _field(cfg, "max_position_embeddings", int, path, 1)
    rope = _rope(cfg, path, head_dim, max_pos)
    return LlamaConfig(
        architecture=arch,
        qkv_bias=attention_bias or arch == "Qwen2ForCausalLM",
        o_bias=attention_bias,
        qk_norm=arch == "Qwen3ForCausalLM",
        windows=_windows(cfg, path, arch, layers),
        rope=rope,
        hidden_size=hidden,
        intermediate_size=_field(cfg, "intermediate_size", int, path, 1),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_field(cfg, "rms_norm_eps", float, path, 0),
        rope_theta=rope.theta,
        vocab_size=_field(cfg, "vocab_size", int, path, 1),
        max_position_embeddings=max_pos,
        tie_word_embeddings=_field(cfg, "tie_word_embeddings", bool, path) if "tie_word_embeddings" in cfg else False,
        eos_token_ids=eos,
    )


def expected_shapes(c):
    """{tensor name: shape} of the checkpoint (Hugging Face's names; lm_head only when not tied)."""
    h, i, hd = c.hidden_size, c.intermediate_size, c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (c.num_attention_heads * hd, h),
            p + "self_attn.k_proj.weight": (c.num_key_value_heads * hd, h),
            p + "self_attn.v_proj.weight": (c.num_key_value_heads * hd, h),
            p + "self_attn.o_proj.weight": (h, c.num_attention_heads * hd),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
        })
        if c.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (c.num_attention_heads * hd,),
                           p + "self_attn.k_proj.bias": (c.num_key_value_heads * hd,),
                           p + "self_attn.v_proj.bias": (c.num_key_value_heads * hd,)})
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if c.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    return shapes


def _shard_files(folder):
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.isfile(index):
        raise CheckpointError(f"{single}: missing (nor is there a model.safetensors.index.json)")
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index ({type(exc).__name__}: {exc})") from None
    return [os.path.join(folder, os.path.basename(str(f))) for f in files]


def read_weights(folder, config, parts=None):
    """{name: numpy array} of every tensor the model needs, checked against the config's shapes (bfloat16 tensors
    come as ml_dtypes.bfloat16 arrays). ``parts`` (tensor parallelism): {name: (axis, start, stop)} reads only that
    range of the tensor along the axis (the rest is never read from the file), {name: None} skips the tensor."""
    parts = parts or {}
    try:
        import ml_dtypes  # noqa: F401  (lets safetensors' numpy API read BF16 tensors)
        from safetensors import safe_open
    except ImportError as exc:
        raise CheckpointError(f"reading model.safetensors needs the examples extra: pip install "
                              f"'paddle_rt[examples]' ({exc})") from None
    want = expected_shapes(config)
    out = {}
    for path in _shard_files(folder):
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: missing (listed in model.safetensors.index.json)")
        try:
            with safe_open(path, framework="np") as f:
                for name in f.keys():
                    if name in want and name in parts:
                        if parts[name] is not None:
                            out[name] = _read_part(f, name, want[name], parts[name], folder)
                    elif name in want:
                        out[name] = f.get_tensor(name)
        except CheckpointError:
            raise
        except Exception as exc:      # safetensors raises its own error types (SafetensorError, TypeError...)
            raise CheckpointError(f"{path}: not a readable safetensors file ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    for name, shape in want.items():
        if name in parts:
            if parts[name] is None:
                continue
            axis, start, stop = parts[name]
            shape = shape[:axis] + (stop - start,) + shape[axis + 1:]
        if name not in out:
            raise CheckpointError(f"{folder}: tensor {name} is missing from the checkpoint")
        a = out[name]
        if tuple(a.shape) != shape:
            raise CheckpointError(f"{folder}: tensor {name} has shape {tuple(a.shape)}, the config says {shape}")
        if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
            raise CheckpointError(f"{folder}: tensor {name} has dtype {a.dtype}, not a floating-point type")
    return out


def _read_part(f, name, shape, part, folder):
    """The range ``part`` = (axis, start, stop) of tensor ``name`` of the open safetensors file ``f``, after checking
    the whole tensor's shape against the config's ``shape`` (a wrong shape would otherwise slice silently)."""
    sl = f.get_slice(name)
    full = tuple(sl.get_shape())
    if full != shape:
        raise CheckpointError(f"{folder}: tensor {name} has shape {full}, the config says {shape}")
    axis, start, stop = part
    index = tuple(slice(start, stop) if d == axis else slice(None) for d in range(len(shape)))
    return sl[index]
