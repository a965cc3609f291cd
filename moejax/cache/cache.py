"""The expert cache: which experts occupy the device slots, and the policies that decide it.

One code path for the live runtime and for trace replay (DESIGN.md): both feed `LayerGate`s
to `ExpertCache.run_layer` pass by pass; only the source of the gates and what a slot load
does differ (`SlotSink`: the live runtime copies real bytes, replay does nothing). Time comes
from a clock (`moejax.sim.clock`): virtual (cost model) or wall.

Per MoE layer of a pass, in the order of SpecMD's gate hook (Algorithm 1):
routing policy -> miss policy -> requests (hit / late hit / miss; misses demand-fetched, the
eviction policy choosing victims among unpinned slots) -> prefetch for the layers ahead ->
the layer's experts run (in waves of at most `num_slots` experts when a prefill layer needs
more experts than there are slots).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator, Protocol

import numpy as np

from moejax.cache.metrics import CacheMetrics, PassTiming, WaveOutcome
from moejax.config import ConfigError
from moejax.policies.base import EvictionPolicy, MissPolicy, PrefetchPolicy, RoutingPolicy
from moejax.seam import Key, LayerGate, Wave, requests_in_rank_order
from moejax.sim.cost import CostModel


@dataclasses.dataclass(frozen=True)
class CacheShape:
    layers: tuple[int, ...]  # MoE layer indices in pass order
    num_layers: int  # all decoder layers (dense ones included), for the cost model
    num_experts: int
    top_k: int
    expert_bytes: int
    num_slots: int

    @property
    def total_experts(self) -> int:
        return self.num_experts * len(self.layers)


def slots_for(shape_experts: int, top_k: int, expert_bytes: int, capacity_frac: float | None,
              slots: int | None) -> int:
    """Slot count from `cache.capacity_frac` (of all routed-expert bytes) or `cache.slots`."""
    if (capacity_frac is None) == (slots is None):
        raise ConfigError("set exactly one of cache.capacity_frac and cache.slots")
    if slots is not None:
        n = int(slots)
        what = f"cache.slots={slots}"
    else:
        if not 0 < capacity_frac <= 1:
            raise ConfigError(f"cache.capacity_frac={capacity_frac} must be in (0, 1]")
        n = int(math.floor(capacity_frac * shape_experts + 1e-9))  # no slot lost to rounding
        what = (f"cache.capacity_frac={capacity_frac} ({n} slots of {expert_bytes} bytes out of "
                f"{shape_experts} experts)")
    if n < top_k:
        raise ConfigError(f"{what} is below what one decode layer needs: top-k = {top_k} "
                          f"experts at once")
    return min(n, shape_experts)


# What a demand fetch may not evict. "layer": any expert the running layer (wave) requests —
# its experts run as one grouped matmul, so they must be resident together (moejax's live
# runtime). "request": only the expert being fetched — experts run one at a time, an earlier
# one of the same layer may go once used (SpecMD's per-expert execution; replay only).
PIN_SCOPES = ("layer", "request")


class SlotSink(Protocol):
    def load(self, key: Key, slot: int, prefetch: bool) -> None:
        """Start copying expert `key` into `slot` (asynchronously)."""


@dataclasses.dataclass(slots=True)
class PassState:
    """The pass being run: what the cost model needs and how far it has got."""

    kind: str  # "prefill" or "decode"
    tokens: int
    context: int  # context length at the end of the pass
    start: float  # clock time the pass started
    next_layer: int = 0  # first decoder layer whose compute is not charged yet
    stall: float = 0.0


class ExpertCache:
    """Residency of experts in `num_slots` device slots, decided by four policies.

    State: `residency` maps each resident or in-flight `Key` to its slot; `slot_key`,
    `slot_ready` (when the slot's last transfer lands) and `free` describe the slots. Deciding
    (`run_layer`, `_serve`, `_prefetch`) is kept apart from counting (`CacheMetrics.count_*`).
    """

    def __init__(self, shape: CacheShape, eviction: EvictionPolicy, prefetch: PrefetchPolicy,
                 miss: MissPolicy, routing: RoutingPolicy, clock, cost: CostModel | None = None,
                 sink: SlotSink | None = None, lookahead_scores: int = 0,
                 pin_scope: str = "layer"):
        if pin_scope not in PIN_SCOPES:
            raise ConfigError(f"cache.pin_scope={pin_scope!r} is not one of {PIN_SCOPES}")
        self.shape, self.pin_scope = shape, pin_scope
        self.eviction, self.prefetch, self.miss, self.routing = eviction, prefetch, miss, routing
        self.clock, self.cost, self.sink = clock, cost, sink
        self.lookahead_scores = lookahead_scores
        self.pos_of = {l: p for p, l in enumerate(shape.layers)}
        eviction.set_layer_positions(self.pos_of)
        self.metrics = CacheMetrics(list(shape.layers))
        s = shape.num_slots
        self.residency: dict[Key, int] = {}
        self.slot_key: list[Key | None] = [None] * s
        self.slot_ready = [0.0] * s
        self.free = list(range(s - 1, -1, -1))  # pop() gives slot 0 first
        self.in_cache: dict[int, set[int]] = {l: set() for l in shape.layers}
        # Prefetched and not yet used: key -> (pass, layer) it was fetched for.
        self.prefetch_origin: dict[Key, tuple[int, int]] = {}
        self.predicted: set[tuple[int, int]] = set()  # (pass, layer) with a prediction
        self.seen_this_pass: set[Key] = set()  # resident at the pass start or admitted since
        self.pass_id = -1
        self._pass: PassState | None = None
        # Profiler annotation around host work (`jax.profiler.TraceAnnotation` when tracing).
        self.annotate = lambda name: contextlib.nullcontext()

    def policies(self) -> tuple[EvictionPolicy, PrefetchPolicy, MissPolicy, RoutingPolicy]:
        return self.eviction, self.prefetch, self.miss, self.routing

    def needs_scores(self) -> tuple[bool, bool]:
        """Whether the policies read router probabilities, and speculative scores."""
        return (any(p.needs_probs for p in self.policies()),
                any(p.needs_spec for p in self.policies()))

    # -- passes --------------------------------------------------------------------------------
    def begin_pass(self, kind: str, tokens: int, context_end: int) -> None:
        """A forward pass of `tokens` tokens ending at position `context_end` starts."""
        self.pass_id += 1
        self.eviction.on_pass_start(self.pass_id)
        self.seen_this_pass = set(self.residency)
        self.predicted = {x for x in self.predicted if x[0] >= self.pass_id}
        start = self.clock.now()
        if self.cost is not None:
            self.clock.compute(self.cost.embed_and_logits(tokens) / 2)
        self._pass = PassState(kind, tokens, context_end, start)

    def end_pass(self) -> PassTiming:
        p = self._pass
        self._charge_dense_layers(self.shape.num_layers)
        if self.cost is not None:
            self.clock.compute(self.cost.embed_and_logits(p.tokens) / 2)
        timing = PassTiming(p.kind, p.tokens, p.start, self.clock.now(), p.stall)
        self.metrics.passes.append(timing)
        self.metrics.snapshot()
        self._pass = None
        return timing

    def finish(self) -> None:
        """End of the run: prefetched experts never used are wasted bytes."""
        for key in self.prefetch_origin:
            self.metrics.count_wasted_prefetch(self.pos_of[key[0]], self.shape.expert_bytes)
        self.prefetch_origin.clear()

    def _charge_dense_layers(self, upto: int) -> None:
        """Charge the dense layers before layer `upto` that this pass has not run yet."""
        p = self._pass
        while p.next_layer < upto:
            if p.next_layer not in self.pos_of and self.cost is not None:
                self.clock.compute(self.cost.dense_layer(p.tokens, p.context))
            p.next_layer += 1

    # -- residency -----------------------------------------------------------------------------
    def resident_keys(self) -> set[Key]:
        return set(self.residency)

    def _evict(self, key: Key) -> int:
        with self.annotate("cache/evict"):
            slot = self.residency.pop(key)
            self.slot_key[slot] = None
            self.in_cache[key[0]].discard(key[1])
            self.eviction.on_evict(key)
            wasted = self.prefetch_origin.pop(key, None) is not None
            self.metrics.count_eviction(self.pos_of[key[0]],
                                        self.shape.expert_bytes if wasted else 0)
            return slot

    def _allocate(self, pos: int, protected: set[Key], incoming: Key) -> int | None:
        """A slot for `incoming`: a free one, or a victim's that is not in `protected`."""
        if self.free:
            return self.free.pop()
        victim = self.eviction.victim(pos, lambda k: k not in protected, incoming)
        if victim is None:
            return None
        if victim in protected or victim not in self.residency:
            raise AssertionError(f"eviction policy {self.eviction.name} chose {victim}, which is "
                                 "protected or not resident")
        return self._evict(victim)

    def _admit(self, key: Key, slot: int, issue_at: float, prefetch: bool, pos: int) -> float:
        # A slot still being filled by an earlier transfer is reused only after it lands.
        ready = max(self.clock.transfer(self.shape.expert_bytes, issue_at), self.slot_ready[slot])
        self.residency[key] = slot
        self.slot_key[slot] = key
        self.slot_ready[slot] = ready
        self.in_cache[key[0]].add(key[1])
        self.seen_this_pass.add(key)
        self.eviction.on_admit(key, pos, prefetch)
        if self.sink is not None:
            self.sink.load(key, slot, prefetch)
        return ready

    # -- one MoE layer -------------------------------------------------------------------------
    def run_layer(self, gate: LayerGate) -> Iterator[Wave]:
        """Processes one layer's gate outputs; yields the waves to compute, each with its
        experts resident (in order: the consumer runs a wave before asking for the next)."""
        layer, p = gate.layer, self._pass
        pos = self.pos_of[layer]
        tokens = gate.ids.shape[0]
        self._charge_dense_layers(layer)
        if self.cost is not None:
            self.clock.compute(self.cost.attention_router(tokens, p.context,
                                                          self.lookahead_scores))
        p.next_layer = layer + 1
        if gate.probs is not None and self.eviction.needs_probs:
            self.eviction.on_scores(layer, gate.probs)

        # Decide what runs: routing, then the miss policy, then the requests it makes.
        ids, weights = self.routing.select(gate, self.in_cache[layer])
        if weights is None:  # id-only traces: the experts step is not run
            weights = np.ones(ids.shape, np.float32)
        decision = self.miss.handle(gate, ids, weights, self.in_cache[layer])
        ids, weights, active = decision.ids, decision.weights, decision.active
        if decision.dropped or decision.substituted:
            self.metrics.count_decision(pos, decision.dropped, decision.substituted)
        requests = self._requests(layer, ids, active)
        here = (self.pass_id, layer)
        had_prediction = here in self.predicted
        self.predicted.discard(here)

        s = self.shape.num_slots
        waves = [requests[i:i + s] for i in range(0, len(requests), s)] or [[]]
        for w, chunk in enumerate(waves):
            now = self.clock.now()
            pinned = {(layer, e) for e in chunk}
            outcome = self._serve(layer, pos, chunk, pinned, now, here)
            if w == 0:
                self._prefetch(gate, pos, pinned, now)
            outcome.stall = self.clock.wait(outcome.ready)
            p.stall += outcome.stall
            self.metrics.count_wave(pos, len(chunk), outcome, had_prediction,
                                    self.shape.expert_bytes)
            wave_active = active if len(waves) == 1 else active & np.isin(ids, chunk)
            residency = self.residency
            # (With pin_scope="request" an expert of the wave may already be gone again.)
            yield Wave(layer, {e: residency[(layer, e)] for e in chunk if (layer, e) in residency},
                       ids, weights, wave_active, first=(w == 0))
            if self.cost is not None:
                pairs = int(wave_active.sum())
                self.clock.compute(self.cost.experts(pairs, len(chunk), tokens, shared=(w == 0)))

    def _requests(self, layer: int, ids: np.ndarray, active: np.ndarray) -> list[int]:
        """The layer's distinct experts in router-rank order (rank-major over tokens, first
        occurrence wins). When they need more than one wave, the resident ones go first, so no
        wave evicts an expert a later wave of the layer needs only because of ordering."""
        if ids.shape[0] == 1:
            requests = [int(e) for e, a in zip(ids[0].tolist(), active[0].tolist()) if a]
        else:
            requests = requests_in_rank_order(ids, active)
        if len(requests) > self.shape.num_slots:
            here = self.in_cache[layer]
            requests = ([e for e in requests if e in here] +
                        [e for e in requests if e not in here])
        return requests

    def _serve(self, layer: int, pos: int, chunk: list[int], pinned: set[Key], now: float,
               here: tuple[int, int]) -> WaveOutcome:
        """Makes `chunk` resident: hits, late hits, and demand fetches of the misses."""
        out = WaveOutcome(ready=now)
        residency, slot_ready, origins = self.residency, self.slot_ready, self.prefetch_origin
        on_access = self.eviction.on_access
        by_layer = self.pin_scope == "layer"
        for e in chunk:
            key = (layer, e)
            slot = residency.get(key)
            if slot is not None:
                at = slot_ready[slot]
                if at > now:
                    out.late_hits += 1
                    out.ready = max(out.ready, at)
                else:
                    out.hits += 1
                if origins and origins.pop(key, None) == here:
                    out.prefetch_used += 1
            else:
                out.collisions += key in self.seen_this_pass
                slot = self._allocate(pos, pinned if by_layer else {key}, key)
                if slot is None:
                    raise AssertionError("no slot for a demand fetch although the wave "
                                         "fits the cache")
                out.ready = max(out.ready, self._admit(key, slot, now, False, pos))
                out.misses += 1
            on_access(key, pos)
        return out

    def _prefetch(self, gate: LayerGate, pos: int, pinned: set[Key], issue_at: float) -> None:
        """Admits the prefetch policy's predictions while a slot is free or evictable. What
        this call selected — admitted, or found already resident — is never a victim of the
        same call: a later (lower-priority) prediction must not push out an earlier one."""
        protected = set(pinned)
        for target, experts in self.prefetch.predict(gate):
            if target not in self.pos_of:
                continue
            self.predicted.add((self.pass_id, target))
            tpos = self.pos_of[target]
            for e in experts:
                key = (target, int(e))
                if key in self.residency:
                    self.eviction.on_touch(key, pos)
                    protected.add(key)
                    continue
                slot = self._allocate(pos, protected, key)
                if slot is None:
                    return  # no room: prefetch never blocks
                protected.add(key)
                self._admit(key, slot, issue_at, True, pos)
                self.prefetch_origin[key] = (self.pass_id, target)
                self.metrics.count_prefetch(tpos, self.shape.expert_bytes)

    # -- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Budget and bookkeeping consistency (used by the property tests)."""
        s = self.shape.num_slots
        assert len(self.residency) + len(self.free) == s, "slots leaked"
        assert len(self.residency) <= s, "budget exceeded"
        for key, slot in self.residency.items():
            assert self.slot_key[slot] == key
        assert sum(len(v) for v in self.in_cache.values()) == len(self.residency)
