"""The size of a model from its shapes alone (no weights are allocated): what a capacity of
"the whole model" (`cache.capacity_of=model`, SpecMD's meaning) is a fraction of."""

from __future__ import annotations

import numpy as np

from moejax.checkpoint import flat_params
from moejax.model_config import ModelConfig, dtype_bytes
from moejax.models.decoder import abstract_decoder


def dense_param_count(cfg: ModelConfig) -> int:
    """Parameters outside the routed experts (embeddings, attention, norms, routers, shared
    experts, dense MLPs, LM head), from the decoder's abstract shapes: nothing is allocated."""
    return sum(int(np.prod(v.shape)) for v in flat_params(abstract_decoder(cfg)).values())


def model_bytes(cfg: ModelConfig) -> int:
    """Bytes of the whole model at native precision: dense parameters plus routed experts."""
    return dense_param_count(cfg) * dtype_bytes(cfg.dtype) + cfg.total_expert_bytes
