"""Miss policies: what to do about selected experts that are not in the cache (SpecMD §3).

`fetch` keeps the selection (the missing experts are demand-fetched); `drop` skips missing
experts that no token ranks among its top `keep`; `substitute` replaces a missing expert by
a resident one of the same layer whose router score is within `tol` of it. These three fetch
at the plain precision (`cache.precision`).

Precision-aware policies (`levels`: the precisions they may fetch, high to low; one slot pool
each, `moejax/cache/capacity.py`):
* `fetch_lowest_bit(levels)`: a miss is fetched at the lowest level (SpecMD:
  "fetches the lowest available precision to minimize latency"); prefetches move `levels[0]`.
  Default levels: int8:int4 when `cache.precision` is not given, else it and the next lower.
* `fetch_priority(levels, percentile=60, upgrade=False)`: the precision cascade (SpecMD,
  HOBBIT). Important experts at `levels[0]`; the range below the `percentile`-th percentile of
  the pass-layer's gate scores is split into `len(levels) - 1` equal percentile bands, each
  fetched one level lower (int8:int4:int2, p=60: >= p60 int8, p30-p60 int4, < p30 int2); and
  a capacity fallback: a wanted pool with no room left for the running wave falls to the next
  lower level with room.
* `drop_priority_cascade(levels, percentile=60, keep=1, upgrade=False)` (default levels as
  `fetch_lowest_bit`'s): named by SpecMD without a definition; our reading: the cascade of
  `fetch_priority` with one more band, dropped — below the percentile, `len(levels)` equal
  bands go to `levels[1:]` and then to *drop* (int8:int4, p=60: >= p60 int8, p30-p60 int4,
  < p30 dropped). Only a missing expert is dropped, never
  one some token ranks in its top `keep`; a resident one runs at its resident precision, a
  top-`keep` one in the drop band is fetched at the lowest level.

Gate score of an expert: its largest contribution weight over the pass's tokens (only
contributions that run). An id-only source (`LayerGate.weights` None) has no weights: its
router rank stands in (score `K - best rank`), which is faithful only when the trace keeps the
router's rank order (the bundled captures are sorted by id: their ranks say nothing).
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError
from moejax.policies.base import LayerGate, MissDecision, MissPolicy
from moejax.policies.declare import Choice, Floats, Ints, KernelForm, Levels
from moejax.policies.registry import register
from moejax.quant import formats


def _check_keep(keep) -> None:
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep={keep} must be an integer >= 1 (the top expert is always "
                         "fetched)")


def _check_percentile(percentile) -> float:
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or \
            not 0 <= percentile <= 100:
        raise ValueError(f"percentile={percentile} must be a number in [0, 100]")
    return float(percentile)


def gate_scores(gate: LayerGate, ids: np.ndarray, weights: np.ndarray,
                active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(experts, scores)`: the distinct experts of the selection that run, and each one's
    gate score — its largest contribution weight over the tokens, or with no router weights
    (`gate.weights` None: an id-only source) `K - its best router rank`."""
    flat = ids[active]
    if gate.weights is None:
        ranks = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)[active]
        values = (ids.shape[1] - ranks).astype(np.float64)
    else:
        values = np.asarray(weights, np.float64)[active]
    experts, inverse = np.unique(flat, return_inverse=True)
    scores = np.full(len(experts), -np.inf)
    np.maximum.at(scores, inverse.reshape(-1), values)
    return experts, scores


def bands(scores: np.ndarray, percentile: float, count: int) -> np.ndarray:
    """Band of each score: 0 at or above the `percentile`-th percentile of `scores`, and the
    range below it split into `count` equal percentile bands, 1..count (lowest)."""
    if count == 0 or len(scores) == 0:
        return np.zeros(len(scores), np.int64)
    cuts = np.percentile(scores, [percentile * (count - j) / count for j in range(count)])
    return (scores[:, None] < cuts[None, :]).sum(axis=1)


def cascade_below(precision: str) -> tuple[str, ...]:
    """`precision` and every lower one (native -> native:int8:int4:int2, int4 -> int4:int2);
    with no precision given, SpecMD's cascade int8:int4:int2."""
    if not precision:
        return formats.QUANTIZED
    return formats.PRECISIONS[formats.rank(precision):]


@register("miss", "fetch")
class Fetch(MissPolicy):
    name = "fetch"
    KERNEL = KernelForm("fetch")

    def __init__(self, cache_precision: str = ""):
        self._set_levels(cache_precision)
        self._all: dict[tuple, np.ndarray] = {}  # shape -> a read-only all-True mask

    def handle(self, gate, ids, weights, resident):
        # Every contribution runs: one shared read-only mask per shape (the live runtime asks
        # every layer of every pass, and nothing writes into a decision's mask).
        active = self._all.get(ids.shape)
        if active is None:
            active = self._all[ids.shape] = np.ones(ids.shape, bool)
            active.setflags(write=False)
        return MissDecision(ids, weights, active)


@register("miss", "drop")
class Drop(MissPolicy):
    """Drop a missing expert's contribution unless some token ranks it in its top `keep`
    (ranks are 1-based; models are robust to losing rank 3+ experts, Skliar et al.). Dropped
    contributions are not renormalised."""

    name = "drop"
    ARGS = {"keep": Ints(1, None, fuzz_hi=4)}

    def __init__(self, keep: int = 2, cache_precision: str = ""):
        _check_keep(keep)
        self.keep = keep
        self._set_levels(cache_precision)

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
    ARGS = {"tol": Floats(0.0, 1.0)}
    needs_probs = True

    def __init__(self, tol: float = 0.05, cache_precision: str = ""):
        if tol < 0:
            raise ValueError(f"tol={tol} must be >= 0")
        self.tol = tol
        self._set_levels(cache_precision)

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



@register("miss", "fetch_lowest_bit")
class FetchLowestBit(MissPolicy):
    """Keep the selection; a missing expert is fetched at the lowest of `levels` (default
    int8:int4 when `cache.precision` is not given, else that precision and the next lower
    one). Prefetches move `levels[0]`; a resident copy at a higher precision serves as is."""

    name = "fetch_lowest_bit"
    ARGS = {"levels": Levels(optional=True)}

    def __init__(self, levels: str | None = None, cache_precision: str = ""):
        if levels is None:
            levels = cascade_below(cache_precision)[:2]
        self._set_levels(cache_precision, levels)

    def handle(self, gate, ids, weights, resident):
        active = np.ones(ids.shape, bool)
        low = self.levels[-1]
        wanted = None
        if low != self.levels[0]:
            wanted = dict.fromkeys(np.unique(ids).tolist(), low)
        return MissDecision(ids, weights, active, precision=wanted)


class _Cascade(MissPolicy):
    fallback = True
    drop_band = False

    def __init__(self, levels, percentile, upgrade, cache_precision):
        if levels is None:
            levels = cascade_below(cache_precision)
        self._set_levels(cache_precision, levels)
        self.percentile = _check_percentile(percentile)
        if not isinstance(upgrade, bool):
            raise ValueError(f"upgrade={upgrade!r} must be True or False")
        self.upgrade = upgrade

    def _levels_of(self, gate, ids, weights, active):
        experts, scores = gate_scores(gate, ids, weights, active)
        count = len(self.levels) - 1 + (1 if self.drop_band else 0)
        return experts.tolist(), bands(scores, self.percentile, count).tolist()


@register("miss", "fetch_priority")
class FetchPriority(_Cascade):
    """The precision cascade (module docstring): important experts at `levels[0]`, the ones
    below the `percentile`-th percentile of the pass-layer's gate scores degraded band by band;
    a full pool falls to the next lower level. `levels` default: `cache.precision` and every
    lower precision (int4 -> int4:int2); SpecMD's int8:int4:int2 when not given. `upgrade`: an
    expert wanted above its resident copy's precision is fetched again (see `MissPolicy`)."""

    name = "fetch_priority"
    ARGS = {"levels": Levels(optional=True), "percentile": Floats(0.0, 100.0),
            "upgrade": Choice((False, True))}

    def __init__(self, levels: str | None = None, percentile: float = 60,
                 upgrade: bool = False, cache_precision: str = ""):
        super().__init__(levels, percentile, upgrade, cache_precision)

    def handle(self, gate, ids, weights, resident):
        active = np.ones(ids.shape, bool)
        if len(self.levels) == 1:
            return MissDecision(ids, weights, active)
        experts, band = self._levels_of(gate, ids, weights, active)
        wanted = {e: self.levels[b] for e, b in zip(experts, band) if b}
        return MissDecision(ids, weights, active, precision=wanted or None)


@register("miss", "drop_priority_cascade")
class DropPriorityCascade(_Cascade):
    """`fetch_priority` with a last band dropped (module docstring): below the percentile,
    `len(levels)` equal bands go to `levels[1:]` and then to *drop*. A dropped expert is a
    missing one that no token ranks in its top `keep`; dropped contributions are not
    renormalised (as `drop`)."""

    name = "drop_priority_cascade"
    ARGS = {"levels": Levels(optional=True), "percentile": Floats(0.0, 100.0),
            "keep": Ints(1, None, fuzz_hi=4), "upgrade": Choice((False, True))}

    drop_band = True

    def __init__(self, levels: str | None = None, percentile: float = 60, keep: int = 1,
                 upgrade: bool = False, cache_precision: str = ""):
        _check_keep(keep)
        self.keep = keep
        if levels is None:  # as fetch_lowest_bit's
            levels = cascade_below(cache_precision)[:2]
        super().__init__(levels, percentile, upgrade, cache_precision)

    def handle(self, gate, ids, weights, resident):
        active = np.ones(ids.shape, bool)
        experts, band = self._levels_of(gate, ids, weights, active)
        last = len(self.levels)
        must = set(np.unique(ids[:, : self.keep]).tolist())
        wanted, dropped = {}, []
        for e, b in zip(experts, band):
            if b == last:
                if e in resident or e in must:
                    wanted[e] = self.levels[-1]
                else:
                    dropped.append(e)
            elif b:
                wanted[e] = self.levels[b]
        if dropped:
            active = ~np.isin(ids, dropped)
            weights = np.where(active, weights, 0.0)
        return MissDecision(ids, weights, active, dropped=len(dropped),
                            precision=wanted or None)
