"""Interfaces of the four policy kinds (SpecMD §3). Each policy is a small class registered
under a name in `registry`; the cache calls them in this order for every MoE layer of a pass:

routing (may change the selection) -> miss (drop / substitute / fetch) -> eviction (victims
for demand fetches) -> prefetch (experts for the next layers, admitted when a slot is free
or evictable).

Keys are `(layer, expert)`. Layer *positions* (0..L-1 over the MoE layers) order the pass.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

Key = tuple[int, int]


def requests_in_rank_order(ids: np.ndarray, active: np.ndarray | None = None) -> list[int]:
    """The distinct experts of a pass-layer's `[N, K]` selection in router-rank order:
    rank-major over the tokens, first occurrence wins (only `active` contributions)."""
    order = ids.T.reshape(-1)
    if active is not None:
        order = order[active.T.reshape(-1)]
    _, first = np.unique(order, return_index=True)
    return order[np.sort(first)].tolist()


@dataclasses.dataclass
class LayerGate:
    """One MoE layer's gate outputs for one pass, on the host (numpy).

    `ids`/`weights` are the router's own choice in router-rank order; `probs` the full softmax
    (None for id-only traces); `spec` the speculative scores `[A, N, E]` of the next A MoE
    layers (`spec_layers` names them), None when unavailable."""

    layer: int
    ids: np.ndarray  # [N, K]
    weights: np.ndarray | None  # [N, K]
    probs: np.ndarray | None  # [N, E]
    spec: np.ndarray | None = None  # [A, N, E]
    spec_layers: tuple[int, ...] = ()


class EvictionPolicy(Protocol):
    name: str

    def on_pass_start(self, pass_id: int) -> None: ...

    def on_admit(self, key: Key, pos: int, prefetch: bool) -> None:
        """`key` took a slot (a demand fetch or a prefetch) while the pass is at `pos`."""

    def on_access(self, key: Key, pos: int) -> None:
        """`key` was requested (hit, late hit, or just fetched) by the layer at `pos`."""

    def on_touch(self, key: Key, pos: int) -> None:
        """`key`, already resident, was selected by the prefetcher."""

    def on_evict(self, key: Key) -> None: ...

    def on_scores(self, layer: int, probs: np.ndarray) -> None:
        """Router probabilities `[N, E]` of `layer` in this pass (score-based policies)."""

    def victim(self, pos: int, evictable, incoming: Key | None = None) -> Key | None:
        """A resident key to evict, while the layer at `pos` runs, to make room for `incoming`;
        `evictable(key)` says whether a key may go (not pinned by the running layer's wave, nor
        prefetched by the same prefetch call; an in-flight key may go, its slot being reused
        once its transfer lands). None if nothing may."""


class PrefetchPolicy(Protocol):
    name: str
    lookahead: int

    def predict(self, gate: LayerGate) -> list[tuple[int, list[int]]]:
        """`[(layer, experts in priority order), ...]` to prefetch for the layers ahead."""


@dataclasses.dataclass
class MissDecision:
    """What the miss policy made of a layer's selection: the (possibly edited) ids and weights
    the experts step runs, and the experts dropped or substituted."""

    ids: np.ndarray  # [N, K]
    weights: np.ndarray  # [N, K]
    active: np.ndarray  # [N, K] bool: contributions that run (dropped ones do not)
    dropped: int = 0  # distinct experts dropped
    substituted: int = 0  # distinct experts replaced


class MissPolicy(Protocol):
    name: str

    def handle(self, gate: LayerGate, ids: np.ndarray, weights: np.ndarray,
               resident: set[int]) -> MissDecision:
        """`resident`: experts of this layer resident or in flight now."""


class RoutingPolicy(Protocol):
    name: str

    def select(self, gate: LayerGate, cached: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """`(ids, weights)` the layer runs, given the experts of this layer in the cache."""
