"""The seam between the model and the expert cache: every type that crosses it, in one place.

One MoE layer of one forward pass crosses it twice (docs/DESIGN.md, data flow):

    router step [jit] ──GateOutputs──▶ ExpertSource.experts_for ──(host)──▶ LayerGate
                                            │   policies + cache decide          │
    experts step [jit] ◀──ExpertWave── ◀────┘◀──────────── Wave ◀────────────────┘

* `GateOutputs`: what the router step returned, device arrays.
* `LayerGate`: the part of it the policies read, on the host (numpy). Trace replay builds the
  same objects from a recorded trace, so live runs and replay share one policy code path.
* `Wave`: what the cache decided for one wave of a layer — where each expert sits and which
  contributions run with it — on the host.
* `ExpertWave`: that decision as the experts step reads it, device arrays.
* `ExpertSource`: the protocol a model runs its experts through (`ResidentExperts`, the
  reference with every expert on the device, or the cache runtime).

Vocabulary, the same everywhere:
* `Key` = `(layer, expert)`; a layer *position* is its index among the MoE layers;
* `spec`: speculative scores `[A, N, E]` — the gates of the next A MoE layers applied to this
  layer's hidden state; `spec_layers` names which layers its rows predict;
* `slot_of`: for one layer's wave, expert -> slot in the device pool (a dict on the host, an
  `[E]` int32 array on the device). The cache's own map of every resident `Key` to its slot is
  its `residency`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:  # the device-side types are annotations only: the cache side stays numpy
    import jax

Key = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class GateOutputs:
    """What the router of one MoE layer decided for one pass (prefill chunk or decode step),
    as device arrays."""

    layer: int
    ids: jax.Array  # [N, K] int32, in router-rank order
    weights: jax.Array  # [N, K] float32 contribution weights
    probs: jax.Array  # [N, E] float32 softmax of the router logits
    spec: jax.Array  # [lookahead, N, E] next MoE layers' gates on this hidden state
    spec_layers: tuple[int, ...]  # which layers the first rows of `spec` predict
    # Host copies of ids and weights when the gate hook already delivered them (io_callback).
    host_ids: np.ndarray | None = None
    host_weights: np.ndarray | None = None


@dataclasses.dataclass
class LayerGate:
    """One MoE layer's gate outputs for one pass, on the host (numpy): what policies read.

    `ids`/`weights` are the router's own choice in router-rank order (`weights` is None for
    id-only traces); `probs` the full softmax (None when no policy reads it or the trace lacks
    it); `spec` the speculative scores of the layers in `spec_layers` (None when unavailable)."""

    layer: int
    ids: np.ndarray  # [N, K]
    weights: np.ndarray | None  # [N, K]
    probs: np.ndarray | None  # [N, E]
    spec: np.ndarray | None = None  # [A, N, E]
    spec_layers: tuple[int, ...] = ()


def requests_in_rank_order(ids: np.ndarray, active: np.ndarray | None = None) -> list[int]:
    """The distinct experts of a pass-layer's `[N, K]` selection in router-rank order:
    rank-major over the tokens, first occurrence wins (only `active` contributions)."""
    order = ids.T.reshape(-1)
    if active is not None:
        order = order[active.T.reshape(-1)]
    _, first = np.unique(order, return_index=True)
    return order[np.sort(first)].tolist()


@dataclasses.dataclass
class Wave:
    """Experts of one layer resident together, and the contributions computed with them.

    Host compute (`policies.miss=host_compute|latency_aware`, `cache.host_compute_layers`):
    the layer's first wave also names the experts computed on the host, `host_experts`, and
    their contributions, `host_active`; `active` never covers them (a host contribution is
    computed by the host, never by the device). What the consumer computes, so that the
    layer's output is the resident model's: for each `(n, k)` where `host_active`, the
    contribution `weights[n, k] * expert_{ids[n, k]}(x_n)` from the host's copy of that
    expert (at the cache's plain precision), in float32, placed at `(n, k)` of the layer's
    per-contribution outputs exactly as a wave's partial outputs are; the device computes
    the contributions where `active`, wave by wave; after the last wave the sum over k (and
    the shared expert) as always. `host_active` and every wave's `active` are disjoint, and
    together they are the contributions that run."""

    layer: int
    slot_of: dict[int, int]  # expert -> slot, for the experts of this wave
    ids: np.ndarray  # [N, K] after routing and miss policies
    weights: np.ndarray  # [N, K]
    active: np.ndarray  # [N, K] bool: contributions the device computes in this wave
    first: bool  # the first wave of its layer (adds the shared expert)
    last: bool = True  # the last wave of its layer (the layer's output is complete after it)
    host_experts: tuple[int, ...] = ()  # experts computed on the host (first wave only)
    host_active: np.ndarray | None = None  # [N, K] bool: their contributions (None: none)


class ExpertWave(NamedTuple):
    """What one experts step reads: the slot pool, where each expert sits, and the (possibly
    edited) selection. Contributions with weight 0 are not computed into the output.

    The pool is one native array, or a tuple of per-precision pools (native arrays or packed
    `QuantizedWeights`, `moejax/quant/weights.py`) whose slots are numbered consecutively:
    `slot_of` indexes that global numbering (`moejax.models.experts.ExpertPools`)."""

    gate_up: Any  # [S, H, 2I] or a tuple of pools
    down: Any  # [S, I, H] or a tuple of pools
    slot_of: jax.Array  # [E] int32 (only experts with a nonzero weight are read)
    ids: jax.Array  # [N, K]
    weights: jax.Array  # [N, K]
    # The layer's last wave. A layer served in several waves carries its per-contribution
    # outputs from wave to wave in float32 and sums them once, after the last, exactly as one
    # wave does (so waves do not round a sum the resident model does not round).
    last: bool = True


class ExpertSource(Protocol):
    """Provides the expert weights a layer's routed compute reads."""

    def begin_pass(self, tokens: int, position: int) -> None:
        """A forward pass of `tokens` tokens starting at `position` begins."""

    def experts_for(self, gate: GateOutputs) -> Iterator[ExpertWave]:
        """The waves of `gate.layer`'s experts step; each wave's experts are resident when it
        is yielded. The consumer dispatches a wave's step before asking for the next. It may
        raise `Rewind` instead: an earlier MoE layer of the pass must run again from its
        experts step (as `end_pass` returning that layer)."""
        ...

    def end_pass(self) -> int | None:
        """The pass's logits are computed. None, or an MoE layer from which the decoder must
        run the pass again (a speculative pass whose check failed there: the layers before it
        stand; the decoder re-runs that layer's experts step with the gate it already has, and
        everything after), then call `end_pass` again."""


class Rewind(Exception):
    """Raised by `ExpertSource.experts_for` in the middle of a pass: MoE layer `layer` of the
    pass (the running layer or an earlier one) must run again from its experts step, with the
    gate the decoder already has, and everything after it — what `end_pass` returning `layer`
    asks, found before the rest of the pass was dispatched in vain."""

    def __init__(self, layer: int):
        super().__init__(f"re-run the pass from MoE layer {layer}'s experts step")
        self.layer = layer
