"""Resolves `config.model` into a model, its host-resident experts and a tokenizer."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable

import jax
import ml_collections
import numpy as np

from moejax import bundled, checkpoint
from moejax.checkpoint.meta import hugging_face_message, is_hugging_face_dir
from moejax.errors import ConfigError
from moejax.families import FAMILIES, get_family, preset
from moejax.model_config import ModelConfig
from moejax.models.decoder import MoEDecoder
from moejax.models.experts import GMM_IMPLS
from moejax.models.random_init import random_model
from moejax.models.stepped import GATE_PATHS
from moejax.quant import formats
from moejax.quant.quantize import quantize
from moejax.tokenizer import Tokenizer, load_tokenizer


@dataclasses.dataclass
class LoadedModel:
    """A model, its experts in host memory, and its tokenizer.

    `host_gate_up` / `host_down` are the native experts; `experts_at(precision)` gives them at
    any precision the source has (a checkpoint's quantized copies, read on first use; a
    random-weight preset quantizes its experts in memory), and `precision_bytes()` the bytes of
    one expert at each of those precisions (without reading them)."""

    cfg: ModelConfig
    model: MoEDecoder
    # Per MoE layer, in host memory (pinned where possible); None until read, and once handed
    # over (`take_experts`): read them through `experts_at`.
    host_gate_up: dict[int, jax.Array] | None
    host_down: dict[int, jax.Array] | None
    tokenizer: Tokenizer
    source: str  # a checkpoint path (the embedded model's too), or "preset:<family>/<name>"
    # Quantized experts of a precision, (gate_up, down) per MoE layer in host memory.
    quantized: Callable[[str], tuple[dict, dict]] | None = None
    # Quantization group length per weight kind and precision: {"int4": {"gate_up": g, ...}}.
    groups: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # The checkpoint directory the experts are read from ("" for weights drawn in memory).
    path: str = ""
    # Drops the source's host copy of a precision's experts (None: it cannot read them again).
    forget: Callable[[str], None] | None = None
    # Other host-memory forms of its experts, built once by a consumer and shared by every
    # runtime built from this model (copy_stream's records: `moejax.serving.build`).
    shared: dict = dataclasses.field(default_factory=dict, repr=False)
    # The native experts as numpy arrays, where the source keeps them (weights drawn in
    # memory, `in_memory`).
    host_numpy: tuple[dict, dict] | None = dataclasses.field(default=None, repr=False)

    @property
    def precisions(self) -> tuple[str, ...]:
        return ("native", *(p for p in formats.QUANTIZED if p in self.groups))

    def experts_at(self, precision: str) -> tuple[dict, dict]:
        if precision == "native":
            if self.host_gate_up is None:  # loaded without them, or handed over: read them
                self.host_gate_up, self.host_down = self.quantized("native")
            return self.host_gate_up, self.host_down
        if precision not in self.groups or self.quantized is None:
            raise ConfigError(f"{self.source} has no {precision} experts (it has "
                              f"{list(self.precisions)}); add them with `python -m "
                              f"moejax.convert --out=CKPT --add_precisions "
                              f"--precisions={precision}`")
        return self.quantized(precision)

    def take_experts(self, precision: str) -> tuple[dict, dict]:
        """`experts_at(precision)`, handed over to a caller that keeps them in another form
        (copy_stream's per-expert records) and may empty the dicts as it goes: a source that
        can read them again (a checkpoint) forgets its copy, so the experts are held once,
        and a later `experts_at` reads them from disk; weights drawn in memory are kept, and
        the caller gets copies of the dicts (it frees nothing, and changes nothing here) — of
        the numpy arrays the native experts were drawn as, where they are kept: reading a
        bfloat16 host table with numpy leaves a host copy that JAX keeps with the table
        (DESIGN "Records")."""
        if self.forget is None:
            if precision == "native" and self.host_numpy is not None:
                return dict(self.host_numpy[0]), dict(self.host_numpy[1])
            return tuple(dict(t) for t in self.experts_at(precision))
        gate_up, down = self.experts_at(precision)
        if precision == "native":
            self.host_gate_up = self.host_down = None
        self.forget(precision)
        return gate_up, down

    def precision_bytes(self) -> dict[str, int]:
        """Bytes of one routed expert at each precision the source has."""
        h, i = self.cfg.hidden_size, self.cfg.expert_intermediate_size
        itemsize = np.dtype(self.cfg.dtype).itemsize
        out = {"native": self.cfg.expert_bytes}
        for p, g in self.groups.items():
            out[p] = (formats.matrix_bytes(h, 2 * i, p, g["gate_up"], itemsize) +
                      formats.matrix_bytes(i, h, p, g["down"], itemsize))
        return out


EMBEDDED = "embedded"
EMBEDDED_DIR = bundled.EMBEDDED_DIR


def embedded_config() -> ModelConfig:
    """The embedded model's shape, without loading its weights."""
    return checkpoint.read_config(EMBEDDED_DIR)


def validate_model_config(m: ml_collections.ConfigDict) -> None:
    if m.gmm_impl not in GMM_IMPLS:
        raise ConfigError(f"model.gmm_impl={m.gmm_impl!r} is not one of {GMM_IMPLS}")
    if m.lookahead < 0:
        raise ConfigError(f"model.lookahead={m.lookahead} must be >= 0")
    if m.gate_path not in GATE_PATHS:
        raise ConfigError(f"model.gate_path={m.gate_path!r} is not one of {GATE_PATHS}")
    width = m.get("width", 0)
    if width and m.checkpoint:
        raise ConfigError(f"model.width={width!r} draws a family preset at another width; "
                          f"model.checkpoint={m.checkpoint!r} has its own widths (leave one out)")
    if m.checkpoint:
        if not os.path.isdir(m.checkpoint):
            raise ConfigError(f"model.checkpoint={m.checkpoint!r} is not a directory")
        if is_hugging_face_dir(m.checkpoint):  # refused here, before a job loads anything
            raise ConfigError(f"model.checkpoint={hugging_face_message(m.checkpoint)}")
        return
    if width and m.preset == EMBEDDED:
        raise ConfigError(f"model.width={width!r} draws a family preset at another width, and "
                          f"model.preset={EMBEDDED!r} is trained at its own: name a preset "
                          "(e.g. model.preset=olmoe-1b-7b)")
    if m.preset == EMBEDDED:
        return
    if m.family not in FAMILIES:
        raise ConfigError(f"model.family={m.family!r} is not one of {sorted(FAMILIES)}")
    if m.preset not in get_family(m.family).presets:
        raise ConfigError(f"model.preset={m.preset!r} is not a preset of {m.family}; known: "
                          f"{sorted(get_family(m.family).presets)} (or {EMBEDDED!r})")


def load_model(m: ml_collections.ConfigDict, seed: int = 0,
               read_experts: bool = True) -> LoadedModel:
    """`read_experts=False`: a checkpoint's experts stay on storage (the disk tier reads them
    one by one); `experts_at` still reads a whole precision when a job asks for it."""
    validate_model_config(m)
    if m.checkpoint or m.preset == EMBEDDED:
        ck = checkpoint.load(m.checkpoint or EMBEDDED_DIR, read_experts=read_experts)
        tok = load_tokenizer(ck.tokenizer_dir, ck.cfg.vocab_size)
        groups = {p: dict(info["groups"]) for p, info in ck.precisions.items() if p != "native"}
        return LoadedModel(ck.cfg, ck.model, ck.host_gate_up, ck.host_down, tok, ck.path,
                           ck.experts_at, groups, ck.path, ck.forget_experts)
    width = m.get("width", 0)
    cfg = preset(m.family, m.preset, width)
    name = f"{m.family}/{m.preset}" + (f" at width {width}" if width else "")
    if cfg.total_expert_bytes > 2 ** 30:
        raise ConfigError(
            f"preset {name} has {cfg.total_expert_bytes / 2**30:.1f} GiB of experts; random "
            "weights are only drawn for CPU-sized presets: convert a checkpoint and pass "
            "--config.model.checkpoint, or narrow the preset with --config.model.width=N")
    model, gate_up, down = random_model(cfg, seed)
    return in_memory(cfg, model, gate_up, down, load_tokenizer(None, cfg.vocab_size),
                     f"preset:{m.family}/{m.preset}" + (f"@width={width}" if width else ""))


def load_model_for(config: ml_collections.ConfigDict) -> LoadedModel:
    """The job's model (`config.model`); with a host tier (`cache.host_capacity_frac` below
    1, or `cache.host_bytes`) its experts are not read at start."""
    from moejax.cache import host_tier_enabled

    disk_tier = config.cache.enabled and host_tier_enabled(config)
    return load_model(config.model, config.seed, read_experts=not disk_tier)


def in_memory(cfg: ModelConfig, model: MoEDecoder, gate_up: dict, down: dict,
              tokenizer: Tokenizer | None = None, source: str = "in-memory") -> LoadedModel:
    """A `LoadedModel` of weights already in memory (random presets, tests): the native
    experts go to host memory, and every quantized precision is available, quantized on first
    use with the default group size and calibration."""
    gate_up = {l: np.asarray(v) for l, v in gate_up.items()}
    down = {l: np.asarray(v) for l, v in down.items()}
    g = formats.DEFAULT_GROUP_SIZE
    groups = {p: {"gate_up": formats.group_size_for(cfg.hidden_size, g),
                  "down": formats.group_size_for(cfg.expert_intermediate_size, g)}
              for p in formats.QUANTIZED}

    @functools.cache
    def quantized(precision: str) -> tuple[dict, dict]:
        def at(tables):
            return {l: quantize(w, precision, g).map(checkpoint.to_host) for l, w in tables.items()}
        return at(gate_up), at(down)

    return LoadedModel(cfg, model, {l: checkpoint.to_host(v) for l, v in gate_up.items()},
                       {l: checkpoint.to_host(v) for l, v in down.items()},
                       tokenizer or load_tokenizer(None, cfg.vocab_size), source, quantized,
                       groups, host_numpy=(gate_up, down))
