"""Miss policies: what to do about selected experts that are not in the cache (SpecMD §3).

`fetch` keeps the selection (the missing experts are demand-fetched); `drop` skips missing
experts that no token ranks among its top `keep`; `substitute` replaces a missing expert by
a resident one of the same layer whose router score is within `tol` of it. Precision-aware
policies (fetch-lowest-bit, fetch-priority cascade) need quantized tiers: not yet built.
"""

from __future__ import annotations

import numpy as np

from moejax.config import ConfigError
from moejax.policies.base import LayerGate, MissDecision, MissPolicy
from moejax.policies.registry import register


@register("miss", "fetch")
class Fetch(MissPolicy):
    name = "fetch"

    def handle(self, gate, ids, weights, resident):
        return MissDecision(ids, weights, np.ones(ids.shape, bool))


@register("miss", "drop")
class Drop(MissPolicy):
    """Drop a missing expert's contribution unless some token ranks it in its top `keep`
    (ranks are 1-based; models are robust to losing rank 3+ experts, Skliar et al.). Dropped
    contributions are not renormalised."""

    name = "drop"

    def __init__(self, keep: int = 2):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep={keep} must be an integer >= 1 (the top expert is always "
                             "fetched)")
        self.keep = keep

    def handle(self, gate, ids, weights, resident):
        must = set(np.unique(ids[:, : self.keep]).tolist())
        missing = np.vectorize(lambda e: e not in resident and e not in must, otypes=[bool])(ids)
        active = ~missing
        return MissDecision(ids, np.where(active, weights, 0.0), active,
                            dropped=len(set(ids[missing].tolist())))


@register("miss", "substitute")
class Substitute(MissPolicy):
    """Replace each missing (token, expert) by the resident expert of the same layer with the
    highest router probability for that token, if it is within `tol` (absolute probability)
    of the missing one's and not already selected by the token; the contribution keeps the
    original weight. Otherwise the expert is fetched."""

    name = "substitute"
    needs_probs = True

    def __init__(self, tol: float = 0.05):
        if tol < 0:
            raise ValueError(f"tol={tol} must be >= 0")
        self.tol = tol

    def handle(self, gate: LayerGate, ids, weights, resident):
        if gate.probs is None:
            raise ConfigError("miss policy 'substitute' needs router probabilities; this source "
                              "has none (an id-only trace?)")
        ids = ids.copy()
        cached = np.asarray(sorted(resident), np.int64)
        substituted = set()
        if len(cached):
            for n, k in zip(*np.nonzero(~np.isin(ids, cached))):
                p = gate.probs[n]
                taken = set(ids[n].tolist())
                choices = [e for e in cached.tolist() if e not in taken]
                if not choices:
                    continue
                best = max(choices, key=lambda e: (p[e], -e))
                if p[ids[n, k]] - p[best] <= self.tol:
                    substituted.add(int(ids[n, k]))
                    ids[n, k] = best
        return MissDecision(ids, weights, np.ones(ids.shape, bool),
                            substituted=len(substituted))

