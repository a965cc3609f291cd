"""`cooccur`: prefetch by cross-layer co-occurrence, learned online from the stream itself.

The idea is mlx-flash 0.9.2's (`smart_eviction.RoutingPredictor`) and bigrig's `coact`: the
experts a token is routed to at one MoE layer say much about those it is routed to at the next.
For each pair of consecutive MoE layers the policy counts, over every token seen so far, how
often expert `a` at the first layer and expert `b` at the second were chosen for the same token.
While a layer runs, the next layer's experts are scored by the counts of the experts this layer
chose (summed over this pass's tokens), and the `round(top_k * overfetch)` best are prefetched,
best first, ties to the lower id; an expert never seen after this layer's choice scores 0 and is
not prefetched. Nothing looks into the future: the counts are of passes already routed, updated
with this pass's layer pair as soon as the second layer's gate is seen. It reads ids only, so it
runs on id-only captures and live.

Written through the public policy API, as a user would write it (`examples/policies/`).
"""

from __future__ import annotations

import numpy as np

from moejax.policies.base import LayerGate, PrefetchPolicy
from moejax.policies.declare import Floats
from moejax.policies.registry import register


@register("prefetch", "cooccur")
class CooccurrencePrefetch(PrefetchPolicy):
    """The next MoE layer's experts most often chosen with this layer's, counted online."""

    ARGS = {"overfetch": Floats(0.25, 4.0, above=0.0)}
    lookahead = 1

    def __init__(self, top_k: int, num_experts: int, overfetch: float = 1.0):
        if not overfetch > 0:
            raise ValueError(f"overfetch={overfetch} must be positive")
        self.num_experts = num_experts
        self.count = min(num_experts, max(1, int(round(top_k * overfetch))))
        self.layers: list[int] = []  # the MoE layers seen, in order
        self.counts: dict[int, np.ndarray] = {}  # layer -> [E, E]: (its expert, the next's)
        self.previous: tuple[int, np.ndarray] | None = None  # the last gate: (layer, ids)

    def _learn(self, layer: int, ids: np.ndarray) -> None:
        """Counts this gate's pairs with the previous MoE layer's, token by token, when that
        gate was the layer just before it in the same pass."""
        if self.previous is not None:
            before, before_ids = self.previous
            i = self.layers.index(layer)
            if i > 0 and self.layers[i - 1] == before and len(before_ids) == len(ids):
                counts = self.counts.setdefault(
                    before, np.zeros((self.num_experts, self.num_experts), np.int64))
                valid = (before_ids[:, :, None] >= 0) & (ids[:, None, :] >= 0)
                a = np.broadcast_to(before_ids[:, :, None], valid.shape)[valid]
                b = np.broadcast_to(ids[:, None, :], valid.shape)[valid]
                np.add.at(counts, (a, b), 1)
        self.previous = (layer, ids)

    def predict(self, gate: LayerGate) -> list[tuple[int, list[int]]]:
        ids = np.asarray(gate.ids, np.int64)
        if gate.layer not in self.layers:
            self.layers = sorted([*self.layers, gate.layer])
        self._learn(gate.layer, ids)
        i = self.layers.index(gate.layer)
        counts = self.counts.get(gate.layer)
        if i + 1 >= len(self.layers) or counts is None:
            return []
        chosen = ids[ids >= 0]
        scores = counts[chosen].sum(axis=0)
        order = np.argsort(-scores, kind="stable")[:self.count]
        best = [int(e) for e in order if scores[e] > 0]
        return [(self.layers[i + 1], best)] if best else []
