"""The size of a model from its shapes alone (no weights are allocated): what a capacity of
"the whole model" (`cache.capacity_of=model`, SpecMD's meaning) is a fraction of."""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from moejax.checkpoint import flat_params
from moejax.model_config import ModelConfig, dtype_bytes
from moejax.models.decoder import DecoderLayer, abstract_decoder


def _count(module) -> int:
    return sum(int(np.prod(v.shape)) for v in flat_params(module).values())


def dense_param_count(cfg: ModelConfig) -> int:
    """Parameters outside the routed experts (embeddings, attention, norms, routers, shared
    experts, dense MLPs, LM head), from abstract shapes: nothing is allocated. A decoder
    layer's parameters depend on its kind alone (MoE or dense: `DecoderLayer`), so one layer
    of each kind is traced, and the model's ends (embedding, final norm, LM head) as a
    one-layer model less its layer: tracing the whole decoder took about 30 ms a layer (a
    24-layer model 0.75 s, in every grid worker; `full_dense_param_count`, which the tests
    hold this to)."""
    moe = cfg.moe_layers[0] if cfg.moe_layers else None
    dense = next((i for i in range(cfg.num_layers) if not cfg.is_moe_layer(i)), None)
    one = dataclasses.replace(cfg, num_layers=1, moe_layers=(0,) if moe is not None else (),
                              sliding_window=(None,))
    model = abstract_decoder(one)
    total = _count(model) - _count(model.layers[0])
    for layer, n in ((moe, cfg.num_moe_layers), (dense, cfg.num_layers - cfg.num_moe_layers)):
        if layer is not None:
            total += n * _count(nnx.eval_shape(lambda i=layer: DecoderLayer(cfg, i, nnx.Rngs(0))))
    return total


def full_dense_param_count(cfg: ModelConfig) -> int:
    """`dense_param_count` from the whole decoder's abstract shapes (slower: the check)."""
    return _count(abstract_decoder(cfg))


def model_bytes(cfg: ModelConfig) -> int:
    """Bytes of the whole model at native precision: dense parameters plus routed experts."""
    return dense_param_count(cfg) * dtype_bytes(cfg.dtype) + cfg.total_expert_bytes
