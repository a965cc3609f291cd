"""Resolves `config.model` into a model, its host-resident experts and a tokenizer."""

from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections
import numpy as np

from moejax import bundled
from moejax.checkpoint import layout
from moejax.config import ConfigError, ModelConfig
from moejax.families import FAMILIES, get_family, preset
from moejax.models.decoder import MoEDecoder
from moejax.models.experts import GMM_IMPLS
from moejax.models.random_init import random_model
from moejax.models.stepped import GATE_PATHS
from moejax.tokenizer import Tokenizer, load_tokenizer


@dataclasses.dataclass
class LoadedModel:
    cfg: ModelConfig
    model: MoEDecoder
    host_gate_up: dict[int, jax.Array]  # per MoE layer, in host memory (pinned where possible)
    host_down: dict[int, jax.Array]
    tokenizer: Tokenizer
    source: str  # a checkpoint path (the embedded model's too), or "preset:<family>/<name>"


EMBEDDED = "embedded"
EMBEDDED_DIR = bundled.EMBEDDED_DIR


def embedded_config() -> ModelConfig:
    """The embedded model's shape, without loading its weights."""
    return layout.read_config(EMBEDDED_DIR)


def validate_model_config(m: ml_collections.ConfigDict) -> None:
    if m.gmm_impl not in GMM_IMPLS:
        raise ConfigError(f"model.gmm_impl={m.gmm_impl!r} is not one of {GMM_IMPLS}")
    if m.lookahead < 0:
        raise ConfigError(f"model.lookahead={m.lookahead} must be >= 0")
    if m.gate_path not in GATE_PATHS:
        raise ConfigError(f"model.gate_path={m.gate_path!r} is not one of {GATE_PATHS}")
    if m.checkpoint:
        if not os.path.isdir(m.checkpoint):
            raise ConfigError(f"model.checkpoint={m.checkpoint!r} is not a directory")
        return
    if m.preset == EMBEDDED:
        return
    if m.family not in FAMILIES:
        raise ConfigError(f"model.family={m.family!r} is not one of {sorted(FAMILIES)}")
    if m.preset not in get_family(m.family).presets:
        raise ConfigError(f"model.preset={m.preset!r} is not a preset of {m.family}; known: "
                          f"{sorted(get_family(m.family).presets)} (or {EMBEDDED!r})")


def load_model(m: ml_collections.ConfigDict, seed: int = 0) -> LoadedModel:
    validate_model_config(m)
    if m.checkpoint or m.preset == EMBEDDED:
        ck = layout.load(m.checkpoint or EMBEDDED_DIR)
        tok = load_tokenizer(ck.tokenizer_dir, ck.cfg.vocab_size)
        return LoadedModel(ck.cfg, ck.model, ck.host_gate_up, ck.host_down, tok, ck.path)
    cfg = preset(m.family, m.preset)
    if cfg.total_expert_bytes > 2 ** 30:
        raise ConfigError(
            f"preset {m.family}/{m.preset} has {cfg.total_expert_bytes / 2**30:.1f} GiB of experts; "
            "random weights are only drawn for CPU-sized presets: convert a checkpoint and pass "
            "--config.model.checkpoint")
    model, gate_up, down = random_model(cfg, seed)
    tok = load_tokenizer(None, cfg.vocab_size)
    return LoadedModel(cfg, model, {l: layout.to_host(np.asarray(v)) for l, v in gate_up.items()},
                       {l: layout.to_host(np.asarray(v)) for l, v in down.items()}, tok,
                       f"preset:{m.family}/{m.preset}")
