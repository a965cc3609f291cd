"""The live cache's reference in its tests: a tiny random OLMoE in memory, and the resident
model's greedy generation of a random prompt (tokens and logits) to compare with."""

from __future__ import annotations

import numpy as np

from moejax.families import preset
from moejax.model_source import in_memory
from moejax.models.stepped import ResidentExperts, SteppedDecoder
from moejax.testing import random_model


def tiny_reference(seed: int, prompt_seed: int, prompt_len: int, tokens: int, max_len: int):
    """`(cfg, model, loaded, prompt, generation)`: the model of `seed`, a `[1, prompt_len]`
    prompt drawn with `prompt_seed`, and every expert resident generating `tokens` from it."""
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=seed)
    loaded = in_memory(cfg, model, gate_up, down)
    resident = SteppedDecoder(model, ResidentExperts.from_host(gate_up, down), max_len=max_len,
                              lookahead=2)
    prompt = np.random.default_rng(prompt_seed).integers(0, cfg.vocab_size, (1, prompt_len))
    return cfg, model, loaded, prompt, resident.generate(prompt, tokens, keep_logits=True)
