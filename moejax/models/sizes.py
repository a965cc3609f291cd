"""The decoder's parameter count from its own abstract shapes (no weights are allocated): the
check `ModelConfig.dense_param_count`'s arithmetic is held to (`tests/test_precision_cache.py`),
so the count a capacity of "the whole model" (`cache.capacity_of=model`, SpecMD's meaning) is a
share of is the decoder's, and a replay computes it without JAX."""

from __future__ import annotations

import numpy as np

from moejax.checkpoint import flat_params
from moejax.model_config import ModelConfig
from moejax.models.decoder import abstract_decoder


def abstract_dense_param_count(cfg: ModelConfig) -> int:
    """Parameters outside the routed experts, summed over the whole decoder's abstract
    shapes."""
    return sum(int(np.prod(v.shape)) for v in flat_params(abstract_decoder(cfg)).values())
