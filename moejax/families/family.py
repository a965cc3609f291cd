"""What distinguishes one MoE family: its Hugging Face config keys and tensor names.

A family is a small declarative object. Adding a family means one new module here that builds a
`Family` and registers it in `moejax.families.__init__` (see CONTRIBUTING.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from moejax.errors import ConfigError
from moejax.model_config import ModelConfig, RopeConfig


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    # Hugging Face `model_type` values this family converts.
    hf_model_types: tuple[str, ...]
    # Module holding the router and experts in HF tensor names ("mlp" or "block_sparse_moe").
    moe_prefix: str
    # HF per-expert projection names for (gate, up, down).
    expert_proj_names: tuple[str, str, str]
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    # Published dimensions (HF config dicts) by preset name; "tiny" is a CPU-sized stand-in.
    presets: dict[str, dict[str, Any]]


def hf_int(hf: dict[str, Any], key: str, default: Any = None) -> int:
    value = hf.get(key, default)
    if value is None:
        raise ConfigError(f"Hugging Face config is missing {key!r}")
    return int(value)


def head_dim(hf: dict[str, Any]) -> int:
    hd = hf.get("head_dim")
    return int(hd) if hd else hf_int(hf, "hidden_size") // hf_int(hf, "num_attention_heads")


def rope_from_hf(hf: dict[str, Any], default_theta: float = 10000.0,
                 long_factor_frequencies: bool = True) -> RopeConfig:
    """Reads `rope_parameters` (transformers 5) or the legacy `rope_scaling` / `rope_theta`."""
    rp = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rp.get("rope_theta", hf.get("rope_theta", default_theta)))
    kind = rp.get("rope_type", rp.get("type", "default")) or "default"
    kind = {"su": "longrope"}.get(kind, kind)
    if float(rp.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ConfigError("partial_rotary_factor != 1 is not supported")
    if kind == "default":
        return RopeConfig(type="default", theta=theta)
    if kind == "linear":
        return RopeConfig(type="linear", theta=theta, factor=float(rp["factor"]))
    if kind == "longrope":
        original = rp.get("original_max_position_embeddings",
                          hf.get("original_max_position_embeddings"))
        if original is None:
            raise ConfigError("longrope rope parameters need original_max_position_embeddings")
        return RopeConfig(
            type="longrope", theta=theta,
            short_factor=tuple(float(v) for v in rp["short_factor"]),
            long_factor=tuple(float(v) for v in rp["long_factor"]),
            short_mscale=float(rp.get("short_mscale", 1.0)),
            long_mscale=float(rp.get("long_mscale", 1.0)),
            original_max_position_embeddings=int(original),
            long_factor_frequencies=long_factor_frequencies)
    raise ConfigError(f"rope type {kind!r} is not supported; supported: default, linear, longrope")


def token_id(hf: dict[str, Any], key: str) -> int | None:
    v = hf.get(key)
    if isinstance(v, list):  # several eos ids: generation stops at the first listed
        v = v[0] if v else None
    return None if v is None else int(v)


def common_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """Fields every family reads the same way."""
    dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    return dict(
        vocab_size=hf_int(hf, "vocab_size"),
        hidden_size=hf_int(hf, "hidden_size"),
        num_layers=hf_int(hf, "num_hidden_layers"),
        num_heads=hf_int(hf, "num_attention_heads"),
        num_kv_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
        head_dim=head_dim(hf),
        hidden_act=hf.get("hidden_act", "silu"),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        dtype=str(dtype).replace("torch.", ""),
        bos_token_id=token_id(hf, "bos_token_id"),
        eos_token_id=token_id(hf, "eos_token_id"),
        pad_token_id=token_id(hf, "pad_token_id"),
    )


def uniform_window(hf: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    w = hf.get("sliding_window")
    return (int(w) if w else None,) * num_layers


# `model.width=N` (`at_width`): N is a multiple of this, at least this. A head keeps at least 8
# dimensions (rope rotates pairs; N // 8 heads of exactly 8 tile N), and int4 / int2 codes,
# packed two / four to a byte along a weight's contraction axis (the hidden width N for
# gate_up, the expert width N for down), fill whole bytes.
WIDTH_STEP = 8


def at_width(hf: dict[str, Any], width: int) -> dict[str, Any]:
    """A preset's Hugging Face config at width N (`model.width`): its depth, layer kinds (dense
    and MoE), expert count, top-k, router, vocabulary and positions as they are; the hidden
    width and every MLP width (routed expert, dense layer, shared expert) N. Heads: `h`, the
    largest count up to min(the preset's heads, N / 8) that divides N into even head
    dimensions, each `N / h` wide (at the preset's own width, its own heads: OLMoE-1B-7B at
    2048 is 16 of 128); key/value heads keep the preset's grouping (`h · kv / heads`, at least
    one, a divisor of `h`); longrope factor lists are resampled to the new `head_dim / 2`
    entries (the presets' lists are uniform placeholders). N must be a positive multiple of
    `WIDTH_STEP` (the caller checks and says so)."""
    heads, kv = hf_int(hf, "num_attention_heads"), int(
        hf.get("num_key_value_heads") or hf["num_attention_heads"])
    h = next(d for d in range(min(heads, width // WIDTH_STEP), 0, -1)
             if width % d == 0 and (width // d) % 2 == 0)
    kv_heads = max(1, h * kv // heads)
    while h % kv_heads:
        kv_heads -= 1
    out = {**hf, "hidden_size": width, "num_attention_heads": h,
           "num_key_value_heads": kv_heads, "head_dim": width // h}
    for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        if hf.get(key):  # (a width of 0, no shared expert, stays 0)
            out[key] = width
    for key in ("rope_parameters", "rope_scaling"):
        rope = hf.get(key)
        if rope and isinstance(rope.get("short_factor"), list):
            half = width // h // 2
            out[key] = {**rope, **{f: [rope[f][i * len(rope[f]) // half] for i in range(half)]
                                   for f in ("short_factor", "long_factor")}}
    return out
