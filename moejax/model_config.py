"""The model's shape and numerics, independent of where its weights come from.

A `ModelConfig` is what a moejax checkpoint's `config.json` holds and what every model,
converter and runtime component reads. Family modules (`moejax.families`) build it from a
Hugging Face config; each family's `PRESETS` (`moejax.families.preset`) build it from published
dimensions.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from moejax.errors import ConfigError

ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")
NORMS = ("rms", "layer")
ROUTERS = ("softmax_topk", "sparsemixer")
ROPE_TYPES = ("default", "linear", "longrope")
DTYPES = ("float32", "bfloat16", "float16")
# How the decoder runs (`model.gmm_impl`, `model.gate_path`): named here, JAX-free, so a
# config is checked before JAX loads (`moejax.jobs.specs.check_model`).
GMM_IMPLS = ("tiled", "ragged_dot")  # the grouped matmul (moejax/models/experts.py)
GATE_PATHS = ("returned", "io_callback")  # how gates reach the host (moejax/models/stepped.py)


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding settings (Hugging Face `rope_parameters` semantics)."""

    type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0  # linear: positions are divided by it
    # longrope (Phi-3.5-MoE): per-frequency factors, chosen by the length of the current call.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    short_mscale: float = 1.0
    long_mscale: float = 1.0
    original_max_position_embeddings: int = 0
    # transformers' PhiMoE recomputes its frequencies without the sequence length, so it always
    # uses `short_factor` and switches only the mscale; LongRoPE proper (and transformers' Phi-3)
    # switches the factors too. Converted PhiMoE checkpoints set this False to match transformers.
    long_factor_frequencies: bool = True


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Dimensions and numerics of one MoE decoder."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    # Layers whose MLP is a routed MoE block; the others run a dense MLP of `dense_intermediate_size`.
    moe_layers: tuple[int, ...]
    dense_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen-MoE: a shared expert with a sigmoid gate
    norm: str = "rms"
    norm_eps: float = 1e-5
    qk_norm: bool = False  # OLMoE: RMSNorm over the projected q and k
    clip_qkv: float | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    lm_head_bias: bool = False
    tie_word_embeddings: bool = False
    router: str = "softmax_topk"
    norm_topk_prob: bool = False
    router_jitter_eps: float = 0.01  # sparsemixer's relative masking threshold is 2 * eps
    hidden_act: str = "silu"
    rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
    # Per layer: None for full causal attention, else the sliding window length.
    sliding_window: tuple[int | None, ...] = ()
    max_position_embeddings: int = 4096
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if not self.sliding_window:
            object.__setattr__(self, "sliding_window", (None,) * self.num_layers)
        object.__setattr__(self, "moe_layers", tuple(int(i) for i in self.moe_layers))
        self.validate()

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def expert_param_count(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def expert_bytes(self) -> int:
        return self.expert_param_count * dtype_bytes(self.dtype)

    @property
    def total_expert_bytes(self) -> int:
        """All routed-expert bytes at the stored precision: the base of `cache.capacity_frac`
        with `cache.capacity_of="experts"`."""
        return self.expert_bytes * self.num_experts * self.num_moe_layers

    @property
    def dense_param_count(self) -> int:
        """Parameters outside the routed experts (embeddings, attention, norms, routers, shared
        experts, dense MLPs, LM head), counted from the layout `moejax/models/decoder.py` builds:
        arithmetic, so a replay's capacity of "the whole model" needs no JAX.
        `tests/test_precision_cache.py` holds it to the decoder's own abstract shapes."""
        h = self.hidden_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        norm = h * (2 if self.norm == "layer" else 1)  # a LayerNorm has a bias, RMSNorm none
        attention = (h * q + 2 * h * kv + q * h + (q + 2 * kv) * self.qkv_bias
                     + h * self.o_bias + (q + kv) * self.qk_norm)
        layer = 2 * norm + attention  # the input and post-attention norms
        moe = h * self.num_experts  # the router
        if self.shared_expert_intermediate_size:  # a gated MLP and its one-output gate
            moe += 3 * h * self.shared_expert_intermediate_size + h
        dense = 3 * h * self.dense_intermediate_size
        n_moe = self.num_moe_layers
        ends = self.vocab_size * h + norm  # the embedding and the final norm
        if not self.tie_word_embeddings:
            ends += h * self.vocab_size + self.vocab_size * self.lm_head_bias
        return (ends + self.num_layers * layer + n_moe * moe
                + (self.num_layers - n_moe) * dense)

    @property
    def model_bytes(self) -> int:
        """Bytes of the whole model at its stored precision: dense parameters plus routed
        experts (what `cache.capacity_of="model"`, SpecMD's meaning, is a share of)."""
        return self.dense_param_count * dtype_bytes(self.dtype) + self.total_expert_bytes

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self._moe_set

    @property
    def _moe_set(self) -> frozenset[int]:
        return frozenset(self.moe_layers)

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        def need(cond: bool, msg: str):
            if not cond:
                raise ConfigError(f"ModelConfig({self.family}): {msg}")

        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim"):
            need(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")
        need(self.num_heads % self.num_kv_heads == 0,
             f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        need(self.norm in NORMS, f"norm={self.norm!r} is not one of {NORMS}")
        need(self.router in ROUTERS, f"router={self.router!r} is not one of {ROUTERS}")
        need(self.hidden_act in ACTIVATIONS,
             f"hidden_act={self.hidden_act!r} is not one of {ACTIVATIONS}")
        need(self.dtype in DTYPES, f"dtype={self.dtype!r} is not one of {DTYPES}")
        need(self.rope.type in ROPE_TYPES,
             f"rope type {self.rope.type!r} is not supported; supported: {ROPE_TYPES}")
        if self.rope.type == "longrope":
            half = self.head_dim // 2
            need(len(self.rope.short_factor) == half and len(self.rope.long_factor) == half,
                 f"longrope short_factor/long_factor need head_dim/2={half} entries, got "
                 f"{len(self.rope.short_factor)}/{len(self.rope.long_factor)}")
            need(self.rope.original_max_position_embeddings > 0,
                 "longrope needs original_max_position_embeddings")
        need(len(self.sliding_window) == self.num_layers,
             f"sliding_window has {len(self.sliding_window)} entries for {self.num_layers} layers")
        need(all(0 <= i < self.num_layers for i in self.moe_layers),
             f"moe_layers {self.moe_layers} out of range for {self.num_layers} layers")
        if self.moe_layers:
            need(self.num_experts > 0 and 0 < self.top_k <= self.num_experts,
                 f"top_k={self.top_k} must be in 1..num_experts={self.num_experts}")
            need(self.expert_intermediate_size > 0, "expert_intermediate_size must be positive")
        if self.router == "sparsemixer":
            need(self.top_k == 2, f"sparsemixer routing picks exactly 2 experts, top_k={self.top_k}")
        if len(self.moe_layers) < self.num_layers:
            need(self.dense_intermediate_size > 0,
                 "dense layers present but dense_intermediate_size is 0")

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields {unknown}; known: {sorted(known)}")
        rope = d.pop("rope", {}) or {}
        rope_known = {f.name for f in dataclasses.fields(RopeConfig)}
        bad = sorted(set(rope) - rope_known)
        if bad:
            raise ConfigError(f"unknown rope fields {bad}; known: {sorted(rope_known)}")
        for key in ("short_factor", "long_factor"):
            if key in rope:
                rope[key] = tuple(float(v) for v in rope[key])
        d["moe_layers"] = tuple(d.get("moe_layers", ()))
        d["sliding_window"] = tuple(d.get("sliding_window", ()))
        return cls(rope=RopeConfig(**rope), **d)


def dtype_bytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
