"""The model, in Flax NNX: the MoE decoder's dense parameters (`decoder.py`, `attention.py`,
`layers.py`, `rope.py`), its routers (`router.py`), the grouped-matmul expert compute over a
slot pool (`experts.py`), and the layer-stepped execution that asks an `ExpertSource` for each
MoE layer's experts (`stepped.py`: `SteppedDecoder`, and `ResidentExperts`, every expert on the
device — the reference a cached run must reproduce). `random_init.py` draws random weights;
`sizes.py` counts a model's bytes from its shapes."""

from moejax.models.decoder import MoEDecoder, abstract_decoder
from moejax.models.random_init import random_experts, random_model
from moejax.models.stepped import GATE_PATHS, Generation, ResidentExperts, SteppedDecoder

__all__ = ["GATE_PATHS", "Generation", "MoEDecoder", "ResidentExperts", "SteppedDecoder",
           "abstract_decoder", "random_experts", "random_model"]
