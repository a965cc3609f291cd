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

Host compute (Fiddler; `computes_on_host`, `MissDecision.host`; the host's model and the
planner are the cache's, `moejax/cache/host_path.py`):
* `host_compute`: every missing expert is computed on the host from its host-resident weights;
  nothing is loaded into a slot for it;
* `latency_aware(admit_after=0)`: per layer, fetch or compute on the host, whichever plan the
  model says ends the layer sooner (see the class); with `admit_after=N`, an expert computed
  on the host N times is fetched the next time it misses.

Gate score of an expert: its largest contribution weight over the pass's tokens (only
contributions that run). An id-only source (`LayerGate.weights` None) has no weights: its
router rank stands in (score `K - best rank`), which is faithful only when the trace keeps the
router's rank order (the bundled captures are sorted by id: their ranks say nothing).
"""

from __future__ import annotations

import math

import numpy as np

from moejax.errors import ConfigError
from moejax.policies.base import LayerGate, MissDecision, MissPolicy
from moejax.policies.declare import Choice, Floats, Ints, KernelForm, Levels
from moejax.policies.registry import register
from moejax.quant import formats
from moejax.seam import requests_in_rank_order


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
    """Fetch every missing expert and wait for it (the classic cache: nothing dropped)."""

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
    ARGS = {"tol": Floats(0.0, 1.0, at_least=0.0)}
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
    ARGS = {"levels": Levels(optional=True),
            "percentile": Floats(0.0, 100.0, at_least=0.0, at_most=100.0),
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
    ARGS = {"levels": Levels(optional=True),
            "percentile": Floats(0.0, 100.0, at_least=0.0, at_most=100.0),
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


# -- host compute (Fiddler) ------------------------------------------------------------------

def _all_active(cache: dict, shape: tuple) -> np.ndarray:
    """One shared read-only all-True mask per shape (as `Fetch`'s: nothing writes a
    decision's mask)."""
    active = cache.get(shape)
    if active is None:
        active = cache[shape] = np.ones(shape, bool)
        active.setflags(write=False)
    return active


@register("miss", "host_compute")
class HostCompute(MissPolicy):
    """Every missing expert is computed on the host from its host-resident weights (at the
    cache's plain precision), its tokens' hidden states sent down and its contributions sent
    back (`moejax/cache/host_path.py`); nothing is loaded into a slot for it. Resident and
    in-flight experts run on the device as with `fetch`, and prefetches still load slots."""

    name = "host_compute"
    computes_on_host = True

    def __init__(self, cache_precision: str = ""):
        self._set_levels(cache_precision)
        self._all: dict[tuple, np.ndarray] = {}

    def set_planner(self, planner) -> None:
        pass  # every miss goes to the host: no choice to model

    def handle(self, gate, ids, weights, resident):
        missing = frozenset(e for e in np.unique(ids).tolist() if e not in resident)
        return MissDecision(ids, weights, _all_active(self._all, ids.shape), host=missing)


@register("miss", "latency_aware")
class LatencyAware(MissPolicy):
    """Fiddler's choice, per layer: fetch a missing expert or compute it on the host, whichever
    the model says ends the layer sooner (the cache's planner,
    `moejax.cache.host_path.LayerPlanner`: the transfers already in flight on the copy
    engines and the link, the expert's bytes, the tokens routed to it, the host).

    The plans tried: for each `j` from 0 (every miss fetched) to all (every miss on the host),
    the `j` missing experts with the fewest tokens on the host and the others fetched; the
    plan with the earliest modelled end runs (the fewer host experts among equals: a fetch
    also makes the expert resident). Among host sets of one size the fewest-tokens ones make
    the shortest host path (its compute and activations grow with each expert's tokens) and
    leave the fetches' time unchanged (every expert has the same bytes), so only the device's
    experts step, which grows with the fetched experts' tokens, is not minimised by this
    order. A plan whose fetches need more waves than one is planned over the waves the cache
    would run (resident experts first); with several precision pools only one-wave plans are
    tried, and every miss on the host. So a layer's modelled end is at most that of fetching
    every miss (with one pool; with several, when they fit one wave) and at most that of
    computing every miss on the host, from the same state. A decode step (one token per
    expert) goes to the host where a prefill (many) fetches.

    `admit_after=N > 0`: a missing expert this policy has computed on the host N times since
    it last fetched it is fetched the next time it misses, whatever the plan (a hot expert
    earns its slot; the rent-or-buy rule); 0: never forced."""

    name = "latency_aware"
    computes_on_host = True
    ARGS = {"admit_after": Ints(0, None, fuzz_hi=4)}

    def __init__(self, admit_after: int = 0, cache_precision: str = ""):
        if isinstance(admit_after, bool) or not isinstance(admit_after, int) or admit_after < 0:
            raise ValueError(f"admit_after={admit_after!r} must be an integer >= 0 (0: never "
                             "forced to fetch)")
        self.admit_after = admit_after
        self._set_levels(cache_precision)
        self._all: dict[tuple, np.ndarray] = {}
        self.planner = None
        # (layer, expert) -> times computed on the host since this policy last fetched it.
        self.host_runs: dict[tuple[int, int], int] = {}

    def set_planner(self, planner) -> None:
        self.planner = planner

    def handle(self, gate, ids, weights, resident):
        active = _all_active(self._all, ids.shape)
        experts, counts = np.unique(ids, return_counts=True)
        tokens = dict(zip(experts.tolist(), counts.tolist()))
        order = requests_in_rank_order(ids)
        missing = [e for e in order if e not in resident]
        if not missing:
            return MissDecision(ids, weights, active)
        layer, runs, n = gate.layer, self.host_runs, self.admit_after
        forced = {e for e in missing if n and runs.get((layer, e), 0) >= n}
        # Fewest tokens first; among equals, rank order (`sorted` is stable).
        candidates = sorted((e for e in missing if e not in forced), key=tokens.__getitem__)
        plan = self.planner.plan(layer, ids, active)
        best, best_end = frozenset(candidates), math.inf
        for j in range(len(candidates) + 1):
            if not plan.fits(len(missing) - j) and j < len(candidates):
                continue  # its waves are not modelled (several precision pools)
            host = frozenset(candidates[:j])
            end = plan.end(host)
            if end < best_end:
                best, best_end = host, end
        for e in missing:
            if e in best:
                runs[(layer, e)] = runs.get((layer, e), 0) + 1
            else:
                runs.pop((layer, e), None)
        return MissDecision(ids, weights, active, host=best)
