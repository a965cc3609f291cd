"""Prefetch policies: which experts of the next `lookahead` MoE layers to bring in, from this
layer's speculative scores (the later layers' gates applied to this layer's hidden state).

With several tokens in a pass (prefill), an expert's score is its mean over the tokens.

Every policy here predicts from the gates (and, replay-only, the trace's future) and never from
what the cache holds, so the compiled replay engine takes its predictions from the policy
object itself, pass by pass, before its kernel runs: each declares the kernel form
`"predictions"` for any argument values. A prefetcher whose predictions read the cache must
not declare it.
"""

from __future__ import annotations

import numba
import numpy as np

from moejax.errors import ConfigError
from moejax.policies.base import LayerGate, PrefetchPolicy
from moejax.policies.declare import ANY, Floats, Ints, KernelForm
from moejax.policies.registry import register
from moejax.seam import requests_in_rank_order


class _SpecPrefetch(PrefetchPolicy):
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
class NoPrefetch(PrefetchPolicy):
    """No prefetch: every expert is fetched on demand, when its layer asks for it."""

    name = "none"
    KERNEL = KernelForm("predictions")
    lookahead = 0

    def predict(self, gate: LayerGate):
        return []


@register("prefetch", "topk")
class TopKPrefetch(_SpecPrefetch):
    """The round(top_k * overfetch) highest-scored experts of each layer ahead (SpecMD: 1.5
    gives 12 for OLMoE's top-8)."""

    name = "topk"
    ARGS = {"overfetch": Floats(0.25, 4.0, above=0.0), "lookahead": Ints(1, None, fuzz_hi=3)}
    KERNEL = KernelForm("predictions", {"overfetch": ANY, "lookahead": ANY})

    def __init__(self, top_k: int, num_experts: int, overfetch: float = 1.0, lookahead: int = 1):
        super().__init__(top_k, num_experts, lookahead)
        if overfetch <= 0:
            raise ValueError(f"overfetch={overfetch} must be positive")
        self.count = min(num_experts, max(1, int(round(top_k * overfetch))))

    def _choose(self, scores: np.ndarray) -> list[int]:
        return np.argsort(-scores, kind="stable")[: self.count].tolist()


# Log-spaced score bins of the running score distribution (1e-9 .. 1, ~2.7% wide).
SCORE_BINS = np.concatenate([[0.0], np.logspace(-9, 0, 768), [np.inf]])


@register("prefetch", "score_percentile")
class ScorePercentilePrefetch(_SpecPrefetch):
    """Every expert whose speculative score is above the p-th percentile of the scores seen
    so far for that layer (this pass included), best first (Zhu et al.; SpecMD's default
    p=80). The threshold is a score level, not a rank, so the count adapts: a peaked
    prediction prefetches few experts, a flat one many. (A percentile of the current pass's
    own scores alone would always pick (1 - p/100) x E experts.) The running distribution is
    a histogram with log-spaced bins, so the threshold is exact to a bin (~2.7%)."""

    name = "score_percentile"
    ARGS = {"p": Floats(0.0, 100.0, hi_open=True, at_least=0.0, below=100.0),
            "lookahead": Ints(1, None, fuzz_hi=3)}
    KERNEL = KernelForm("predictions", {"p": ANY, "lookahead": ANY})

    def __init__(self, top_k: int, num_experts: int, p: float = 80.0, lookahead: int = 1):
        super().__init__(top_k, num_experts, lookahead)
        if not 0 <= p < 100:
            raise ValueError(f"p={p} must be in [0, 100)")
        self.p = p
        self.hist: dict[int, np.ndarray] = {}

    def predict(self, gate: LayerGate) -> list[tuple[int, list[int]]]:
        out = []
        for layer, scores in self._scores(gate):
            hist = self.hist.get(layer)
            if hist is None:
                hist = self.hist[layer] = np.zeros(len(SCORE_BINS) - 1, np.int64)
            out.append((layer, above_percentile(hist, scores, self.p, SCORE_BINS).tolist()))
        return out


@numba.njit(cache=True)
def above_percentile(hist, scores, p, edges):
    """Adds `scores` to the running histogram `hist` (bin i holds scores in [edges[i],
    edges[i+1])), then returns the experts scored above the p-th percentile level of it, best
    first (ties: lower expert first). One compiled call: the live runtime decides every layer
    of every pass with it, and the numpy version (bincount, cumsum, two searchsorted, a sort)
    was half of a decision's time. The percentile bin is the first whose cumulative count
    reaches p / 100 of the total, as `np.searchsorted(np.cumsum(hist), ..., "left")`."""
    for s in scores:
        hist[np.searchsorted(edges, s, side="right") - 1] += 1
    target = p / 100 * hist.sum()
    b, run = 0, hist[0]
    while run < target and b + 1 < len(hist):
        b += 1
        run += hist[b]
    threshold = edges[b + 1] if b + 1 < len(edges) - 1 else edges[-2]
    above = np.flatnonzero(scores > threshold)
    return above[np.argsort(-scores[above], kind="mergesort")]


class _Lookahead(PrefetchPolicy):
    """Targets: the next `lookahead` MoE layers after the gate's layer."""

    def __init__(self, lookahead: int):
        if not isinstance(lookahead, int) or isinstance(lookahead, bool) or lookahead < 1:
            raise ValueError(f"lookahead={lookahead} must be an integer >= 1")
        self.lookahead = lookahead

    def targets(self, layer: int, layers: list[int]) -> list[int]:
        i = layers.index(layer)
        return layers[i + 1:i + 1 + self.lookahead]


@register("prefetch", "oracle")
class OraclePrefetch(_Lookahead):
    """The true future routing of the next layers (replay only): the prefetch ceiling."""

    name = "oracle"
    ARGS = {"lookahead": Ints(1, None, fuzz_hi=3)}
    KERNEL = KernelForm("predictions", {"lookahead": ANY})
    needs_future = True
    replay_only = True

    def __init__(self, lookahead: int = 1):
        super().__init__(lookahead)
        self.future = None

    def set_future(self, future, cache) -> None:
        self.future, self.cache = future, cache

    def _true(self, target: int) -> list[int]:
        return list(self.future.requests(self.cache.pass_id, target))

    def predict(self, gate: LayerGate):
        if self.future is None:
            raise ConfigError(f"prefetch policy {self.name!r} needs the future: replay only")
        return [(t, self._true(t)) for t in self.targets(gate.layer, self.future.layers)]


@register("prefetch", "noisy_oracle")
class NoisyOraclePrefetch(OraclePrefetch):
    """The oracle with each true expert kept with probability `precision` and otherwise
    replaced by a random wrong expert of the layer (seeded): prediction quality as a knob."""

    name = "noisy_oracle"
    ARGS = {"precision": Floats(0.0, 1.0, at_least=0.0, at_most=1.0),
            "lookahead": Ints(1, None, fuzz_hi=3)}
    KERNEL = KernelForm("predictions", {"precision": ANY, "lookahead": ANY})

    def __init__(self, num_experts: int, precision: float = 0.8, lookahead: int = 1,
                 seed: int = 0):
        super().__init__(lookahead)
        if not 0 <= precision <= 1:
            raise ValueError(f"precision={precision} must be in [0, 1]")
        self.num_experts, self.precision, self.seed = num_experts, precision, seed

    def _true(self, target: int) -> list[int]:
        return self.perturbed(self.cache.pass_id, target, super()._true(target))

    def perturbed(self, pass_id: int, target: int, true: list[int]) -> list[int]:
        """What this policy predicts for layer `target` in pass `pass_id` when the truth is
        `true`: a pure function of its key (the replay's whole-stream predictions call it
        directly, `moejax/replay/stream_predictions.py`)."""
        # A grid replays one trace under many cache settings, and seeding a generator per
        # call is most of a replay's time on the compiled engine.
        memo = (self.num_experts, self.precision, self.seed, pass_id, target, tuple(true))
        out = NOISY_MEMO.get(memo)
        if out is None:
            if len(NOISY_MEMO) >= NOISY_MEMO_SIZE:
                NOISY_MEMO.clear()
            out = NOISY_MEMO[memo] = self._perturb(true, target, pass_id)
        return list(out)

    def perturbed_groups(self, pass_ids: np.ndarray, targets: np.ndarray, experts: np.ndarray,
                         bounds: np.ndarray) -> np.ndarray:
        """`perturbed(pass_ids[g], targets[g], experts[bounds[g]:bounds[g + 1]])` for every
        group `g`, concatenated: the whole stream's at once, compiled
        (`moejax/policies/seeded_draws.py`, numpy's draws written out), where every seed word
        is one 32-bit word; one group at a time otherwise."""
        from moejax.policies import seeded_draws

        if (len(pass_ids) and seeded_draws.fits(self.seed, pass_ids.min(), pass_ids.max(),
                                                targets.min(), targets.max())
                and (experts.size == 0
                     or (0 <= experts.min() and experts.max() < self.num_experts))):
            return seeded_draws.perturb_groups(self.seed, float(self.precision),
                                               self.num_experts, pass_ids, targets, experts,
                                               bounds)
        flat, at = experts.tolist(), bounds.tolist()
        out = []
        for g, (pass_id, target) in enumerate(zip(pass_ids.tolist(), targets.tolist())):
            out.extend(self.perturbed(pass_id, target, flat[at[g]:at[g + 1]]))
        return np.asarray(out, np.int64).reshape(-1)

    def _perturb(self, true: list[int], target: int, pass_id: int) -> tuple[int, ...]:
        rng = np.random.default_rng([self.seed, pass_id, target])
        truth = set(true)
        wrong = [e for e in range(self.num_experts) if e not in truth]
        out = []
        for e in true:
            if rng.random() < self.precision or not wrong:
                out.append(e)
            else:
                out.append(wrong.pop(int(rng.integers(len(wrong)))))
        return tuple(out)


# noisy_oracle's predictions by (experts, precision, seed, pass, target, true experts).
NOISY_MEMO: dict[tuple, tuple[int, ...]] = {}
NOISY_MEMO_SIZE = 1 << 18


@register("prefetch", "temporal")
class TemporalPrefetch(_Lookahead):
    """The experts the target layer used in the previous pass (no scores needed: works on
    id-only traces and live)."""

    name = "temporal"
    ARGS = {"lookahead": Ints(1, None, fuzz_hi=3)}
    KERNEL = KernelForm("predictions", {"lookahead": ANY})

    def __init__(self, lookahead: int = 1):
        super().__init__(lookahead)
        self.last: dict[int, list[int]] = {}
        self.order: list[int] = []

    def predict(self, gate: LayerGate):
        if gate.layer not in self.order:
            self.order.append(gate.layer)
            self.order.sort()
        self.last[gate.layer] = requests_in_rank_order(gate.ids)
        known = self.order
        i = known.index(gate.layer)
        targets = known[i + 1:i + 1 + self.lookahead]
        return [(t, self.last[t]) for t in targets if t in self.last]
