"""The model, in Flax NNX: the MoE decoder's dense parameters (`decoder.py`, `attention.py`,
`layers.py`, `rope.py`), its routers (`router.py`), the grouped-matmul expert compute over a
slot pool (`experts.py`), and the layer-stepped execution that asks an `ExpertSource` for each
MoE layer's experts (`stepped.py`: `SteppedDecoder`, and `ResidentExperts`, every expert on the
device — the reference a cached run must reproduce). `random_init.py` draws random weights;
`sizes.py` counts the decoder's parameters from its abstract shapes (the check of
`ModelConfig.dense_param_count`). Code outside the package imports through
this face (the steps included: benchmarks time them one by one)."""

from moejax.models.attention import KVCache
from moejax.models.decoder import MoEDecoder, abstract_decoder
from moejax.models.experts import (
    ExpertPool,
    as_pools,
    expert_outputs,
    grouped_matmul,
    moe_ffn,
)
from moejax.models.layers import activation, jnp_dtype
from moejax.models.random_init import random_experts, random_model
from moejax.models.router import route
from moejax.models.stepped import (
    GATE_PATHS,
    Generation,
    ResidentExperts,
    SteppedDecoder,
    attention_router_step,
    dense_layer_step,
    embed_step,
    experts_step,
    logits_next_step,
    logits_step,
)

__all__ = ["GATE_PATHS", "ExpertPool", "Generation", "KVCache", "MoEDecoder", "ResidentExperts",
           "SteppedDecoder", "abstract_decoder", "activation", "as_pools",
           "attention_router_step", "dense_layer_step", "embed_step", "expert_outputs",
           "experts_step", "grouped_matmul", "jnp_dtype", "logits_next_step", "logits_step",
           "moe_ffn", "random_experts", "random_model", "route"]
