"""Randomly initialised models: presets run without a checkpoint, and tests build tiny ones."""

from __future__ import annotations

import numpy as np
from flax import nnx

from moejax.model_config import ModelConfig
from moejax.models.decoder import MoEDecoder


def random_experts(cfg: ModelConfig, seed: int = 0) -> tuple[dict[int, np.ndarray],
                                                              dict[int, np.ndarray]]:
    """Random routed experts `(gate_up [E, H, 2I], down [E, I, H])` per MoE layer."""
    rng = np.random.default_rng(seed)
    h, i, e = cfg.hidden_size, cfg.expert_intermediate_size, cfg.num_experts
    dtype = np.dtype(cfg.dtype)
    gate_up, down = {}, {}
    for layer in cfg.moe_layers:
        gate_up[layer] = (rng.standard_normal((e, h, 2 * i)) / np.sqrt(h)).astype(dtype)
        down[layer] = (rng.standard_normal((e, i, h)) / np.sqrt(i)).astype(dtype)
    return gate_up, down


def random_model(cfg: ModelConfig, seed: int = 0):
    """A randomly initialised model with its experts: `(model, gate_up, down)`."""
    model = MoEDecoder(cfg, nnx.Rngs(seed))
    gate_up, down = random_experts(cfg, seed)
    return model, gate_up, down
