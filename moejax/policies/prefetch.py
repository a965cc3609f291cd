"""Prefetch policies: which experts of the next `lookahead` MoE layers to bring in, from this
layer's speculative scores (the later layers' gates applied to this layer's hidden state).

With several tokens in a pass (prefill), an expert's score is its mean over the tokens.
"""

from __future__ import annotations

import numpy as np

from moejax.config import ConfigError
from moejax.policies.base import LayerGate
from moejax.policies.registry import register


class _SpecPrefetch:
    lookahead = 1
    needs_spec = True

    def __init__(self, top_k: int, num_experts: int, lookahead: int):
        if not isinstance(lookahead, int) or isinstance(lookahead, bool) or lookahead < 1:
            raise ValueError(f"lookahead={lookahead} must be an integer >= 1")
        self.top_k, self.num_experts, self.lookahead = top_k, num_experts, lookahead

    def _scores(self, gate: LayerGate):
        if gate.spec is None:
            raise ConfigError(f"prefetch policy {self.name!r} needs speculative gate scores; "
                              "this source has none (an id-only trace?)")
        for a, layer in enumerate(gate.spec_layers[: self.lookahead]):
            rows = gate.spec[a]
            yield layer, (rows[0].astype(np.float64) if len(rows) == 1
                          else rows.astype(np.float64).mean(axis=0))

    def predict(self, gate: LayerGate) -> list[tuple[int, list[int]]]:
        return [(layer, self._choose(scores)) for layer, scores in self._scores(gate)]


@register("prefetch", "none")
class NoPrefetch:
    name = "none"
    lookahead = 0

    def predict(self, gate: LayerGate):
        return []


@register("prefetch", "topk")
class TopKPrefetch(_SpecPrefetch):
    """The round(top_k * overfetch) highest-scored experts of each layer ahead (SpecMD: 1.5
    gives 12 for OLMoE's top-8)."""

    name = "topk"

    def __init__(self, top_k: int, num_experts: int, overfetch: float = 1.0, lookahead: int = 1):
        super().__init__(top_k, num_experts, lookahead)
        if overfetch <= 0:
            raise ValueError(f"overfetch={overfetch} must be positive")
        self.count = min(num_experts, max(1, int(round(top_k * overfetch))))

    def _choose(self, scores: np.ndarray) -> list[int]:
        return np.argsort(-scores, kind="stable")[: self.count].tolist()


# Log-spaced score bins of the running score distribution (1e-9 .. 1, ~2.7% wide).
_EDGES = np.concatenate([[0.0], np.logspace(-9, 0, 768), [np.inf]])


@register("prefetch", "score_percentile")
class ScorePercentilePrefetch(_SpecPrefetch):
    """Every expert whose speculative score is above the p-th percentile of the scores seen
    so far for that layer (this pass included), best first (Zhu et al.; SpecMD's default
    p=80). The threshold is a score level, not a rank, so the count adapts: a peaked
    prediction prefetches few experts, a flat one many. (A percentile of the current pass's
    own scores alone would always pick (1 - p/100) x E experts.) The running distribution is
    a histogram with log-spaced bins, so the threshold is exact to a bin (~2.7%)."""

    name = "score_percentile"

    def __init__(self, top_k: int, num_experts: int, p: float = 80.0, lookahead: int = 1):
        super().__init__(top_k, num_experts, lookahead)
        if not 0 <= p < 100:
            raise ValueError(f"p={p} must be in [0, 100)")
        self.p = p
        self.hist: dict[int, np.ndarray] = {}

    def predict(self, gate: LayerGate) -> list[tuple[int, list[int]]]:
        out = []
        for layer, scores in self._scores(gate):
            hist = self.hist.setdefault(layer, np.zeros(len(_EDGES) - 1, np.int64))
            # Bin i holds scores in [_EDGES[i], _EDGES[i+1]).
            hist += np.bincount(np.searchsorted(_EDGES, scores, side="right") - 1,
                                minlength=len(hist))
            cum = np.cumsum(hist)
            b = int(np.searchsorted(cum, self.p / 100 * cum[-1], side="left"))
            threshold = _EDGES[b + 1] if b + 1 < len(_EDGES) - 1 else _EDGES[-2]
            above = np.flatnonzero(scores > threshold)
            out.append((layer, above[np.argsort(-scores[above], kind="stable")].tolist()))
        return out
