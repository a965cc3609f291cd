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

from moejax.cache.metrics import CacheMetrics, PassTiming
from moejax.config import ConfigError
from moejax.policies.base import Key, LayerGate, requests_in_rank_order
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


@dataclasses.dataclass
class Wave:
    """Experts of one layer resident together, and the contributions computed with them."""

    layer: int
    slot_of: dict[int, int]  # expert -> slot, for the experts of this wave
    ids: np.ndarray  # [N, K] after routing and miss policies
    weights: np.ndarray  # [N, K]
    active: np.ndarray  # [N, K] bool: contributions computed in this wave
    first: bool  # the first wave of its layer (adds the shared expert)


class ExpertCache:
    def __init__(self, shape: CacheShape, eviction, prefetch, miss, routing, clock,
                 cost: CostModel | None = None, sink: SlotSink | None = None,
                 lookahead_scores: int = 0, pin_scope: str = "layer"):
        if pin_scope not in PIN_SCOPES:
            raise ConfigError(f"cache.pin_scope={pin_scope!r} is not one of {PIN_SCOPES}")
        self.shape, self.pin_scope = shape, pin_scope
        self.eviction, self.prefetch, self.miss, self.routing = eviction, prefetch, miss, routing
        self.clock, self.cost, self.sink = clock, cost, sink
        self.lookahead_scores = lookahead_scores
        self.pos_of = {l: p for p, l in enumerate(shape.layers)}
        self._eviction_reads_scores = getattr(eviction, "needs_probs", False)
        if hasattr(eviction, "set_layer_positions"):
            eviction.set_layer_positions(self.pos_of)
        self.metrics = CacheMetrics(list(shape.layers))
        s = shape.num_slots
        self.slot_of: dict[Key, int] = {}
        self.slot_key: list[Key | None] = [None] * s
        self.slot_ready = [0.0] * s
        self.free = list(range(s - 1, -1, -1))  # pop() gives slot 0 first
        self.in_cache: dict[int, set[int]] = {l: set() for l in shape.layers}
        self.prefetch_origin: dict[Key, tuple[int, int]] = {}
        self.predicted: set[tuple[int, int]] = set()
        self.seen_this_pass: set[Key] = set()
        self.pass_id = -1
        self._pass: dict | None = None
        # Profiler annotation around host work (`jax.profiler.TraceAnnotation` when tracing).
        self.annotate = lambda name: contextlib.nullcontext()

    def needs_scores(self) -> tuple[bool, bool]:
        """Whether the policies read router probabilities, and speculative scores."""
        probs = any(getattr(p, "needs_probs", False)
                    for p in (self.eviction, self.prefetch, self.miss, self.routing))
        return probs, getattr(self.prefetch, "needs_spec", False)

    # -- passes --------------------------------------------------------------------------------
    def begin_pass(self, kind: str, tokens: int, context_end: int) -> None:
        """A forward pass of `tokens` tokens ending at position `context_end` starts."""
        self.pass_id += 1
        self.eviction.on_pass_start(self.pass_id)
        self.seen_this_pass = set(self.slot_of)
        self.predicted = {x for x in self.predicted if x[0] >= self.pass_id}
        start = self.clock.now()
        if self.cost is not None:
            self.clock.compute(self.cost.embed_and_logits(tokens) / 2)
        self._pass = dict(kind=kind, tokens=tokens, context=context_end, start=start,
                          next_layer=0, stall=0.0)

    def end_pass(self) -> PassTiming:
        p = self._pass
        self._advance_dense(self.shape.num_layers)
        if self.cost is not None:
            self.clock.compute(self.cost.embed_and_logits(p["tokens"]) / 2)
        timing = PassTiming(p["kind"], p["tokens"], p["start"], self.clock.now(), p["stall"])
        self.metrics.passes.append(timing)
        self.metrics.snapshot()
        self._pass = None
        return timing

    def finish(self) -> None:
        """End of the run: prefetched experts never used are wasted bytes."""
        for key in list(self.prefetch_origin):
            self.metrics.add(self.pos_of[key[0]], wasted_prefetch_bytes=self.shape.expert_bytes)
        self.prefetch_origin.clear()

    def _advance_dense(self, upto: int) -> None:
        """Charge the dense layers before layer `upto` that this pass has not run yet."""
        p = self._pass
        while p["next_layer"] < upto:
            if p["next_layer"] not in self.pos_of and self.cost is not None:
                self.clock.compute(self.cost.dense_layer(p["tokens"], p["context"]))
            p["next_layer"] += 1

    # -- residency -----------------------------------------------------------------------------
    def resident_keys(self) -> set[Key]:
        return set(self.slot_of)

    def _evict(self, key: Key) -> int:
        with self.annotate("cache/evict"):
            return self._evict_now(key)

    def _evict_now(self, key: Key) -> int:
        slot = self.slot_of.pop(key)
        self.slot_key[slot] = None
        self.in_cache[key[0]].discard(key[1])
        self.eviction.on_evict(key)
        pos = self.pos_of[key[0]]
        c = self.metrics.c
        c["evictions"][pos] += 1
        if self.prefetch_origin.pop(key, None) is not None:
            c["wasted_prefetch_bytes"][pos] += self.shape.expert_bytes
        return slot

    def _allocate(self, pos: int, pinned: set[Key], incoming: Key) -> int | None:
        if self.free:
            return self.free.pop()
        victim = self.eviction.victim(pos, lambda k: k not in pinned, incoming)
        if victim is None:
            return None
        if victim in pinned or victim not in self.slot_of:
            raise AssertionError(f"eviction policy {self.eviction.name} chose {victim}, which is "
                                 "pinned or not resident")
        return self._evict(victim)

    def _admit(self, key: Key, slot: int, issue_at: float, prefetch: bool, pos: int) -> float:
        # A slot still being filled by an earlier transfer is reused only after it lands.
        ready = max(self.clock.transfer(self.shape.expert_bytes, issue_at), self.slot_ready[slot])
        self.slot_of[key] = slot
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
        self._advance_dense(layer)
        if self.cost is not None:
            self.clock.compute(self.cost.attention_router(tokens, p["context"],
                                                          self.lookahead_scores))
        p["next_layer"] = layer + 1
        if gate.probs is not None and self._eviction_reads_scores:
            self.eviction.on_scores(layer, gate.probs)

        cached = self.in_cache[layer]
        ids, weights = self.routing.select(gate, cached)
        if weights is None:  # id-only traces: the experts step is not run
            weights = np.ones(ids.shape, np.float32)
        decision = self.miss.handle(gate, ids, weights, cached)
        ids, weights, active = decision.ids, decision.weights, decision.active
        c = self.metrics.c
        if decision.dropped or decision.substituted:
            c["dropped"][pos] += decision.dropped
            c["substituted"][pos] += decision.substituted
        # Requests in router-rank order: rank-major over tokens, first occurrence wins.
        if tokens == 1:
            requests = [int(e) for e, a in zip(ids[0].tolist(), active[0].tolist()) if a]
        else:
            requests = requests_in_rank_order(ids, active)
        here = (self.pass_id, layer)
        had_prediction = here in self.predicted
        self.predicted.discard(here)

        s = self.shape.num_slots
        slot_of, slot_ready, origins = self.slot_of, self.slot_ready, self.prefetch_origin
        on_access = self.eviction.on_access
        by_layer = self.pin_scope == "layer"
        if len(requests) > s:  # waves: resident experts first, so no wave evicts them
            requests = ([e for e in requests if (layer, e) in slot_of] +
                        [e for e in requests if (layer, e) not in slot_of])
        chunks = [requests[i:i + s] for i in range(0, len(requests), s)] or [[]]
        for w, chunk in enumerate(chunks):
            now = self.clock.now()
            pinned = {(layer, e) for e in chunk}
            ready = now
            hits = late_hits = misses = collisions = used = 0
            for e in chunk:
                key = (layer, e)
                slot = slot_of.get(key)
                if slot is not None:
                    at = slot_ready[slot]
                    if at > now:
                        late_hits += 1
                        ready = max(ready, at)
                    else:
                        hits += 1
                    if origins and origins.pop(key, None) == here:
                        used += 1
                else:
                    collisions += key in self.seen_this_pass
                    slot = self._allocate(pos, pinned if by_layer else {key}, key)
                    if slot is None:
                        raise AssertionError("no slot for a demand fetch although the wave "
                                             "fits the cache")
                    ready = max(ready, self._admit(key, slot, now, False, pos))
                    misses += 1
                on_access(key, pos)
            c["requests"][pos] += len(chunk)
            c["hits"][pos] += hits
            c["late_hits"][pos] += late_hits
            c["misses"][pos] += misses
            c["collision_misses"][pos] += collisions
            c["demand_bytes"][pos] += misses * self.shape.expert_bytes
            c["prefetch_used"][pos] += used
            if had_prediction:
                c["recall_served"][pos] += used
                c["recall_requests"][pos] += len(chunk)
            if w == 0:
                self._prefetch(gate, pos, pinned, now)
            stall = self.clock.wait(ready)
            p["stall"] += stall
            c["stall_s"][pos] += stall
            c["waves"][pos] += 1
            wave_active = active if len(chunks) == 1 else active & np.isin(ids, chunk)
            # (With pin_scope="request" an expert of the wave may already be gone again.)
            yield Wave(layer, {e: slot_of[(layer, e)] for e in chunk if (layer, e) in slot_of},
                       ids, weights, wave_active, first=(w == 0))
            if self.cost is not None:
                pairs = int(wave_active.sum())
                self.clock.compute(self.cost.experts(pairs, len(chunk), tokens, shared=(w == 0)))

    def _prefetch(self, gate: LayerGate, pos: int, pinned: set[Key], issue_at: float) -> None:
        batch: set[Key] = set()  # this call's prefetches: never victims of each other
        for target, experts in self.prefetch.predict(gate):
            if target not in self.pos_of:
                continue
            self.predicted.add((self.pass_id, target))
            tpos = self.pos_of[target]
            for e in experts:
                key = (target, int(e))
                if key in self.slot_of:
                    self.eviction.on_touch(key, pos)
                    continue
                slot = self._allocate(pos, pinned | batch, key)
                if slot is None:
                    return  # no room: prefetch never blocks
                batch.add(key)
                self._admit(key, slot, issue_at, True, pos)
                self.prefetch_origin[key] = (self.pass_id, target)
                c = self.metrics.c
                c["prefetch_issued"][tpos] += 1
                c["prefetch_bytes"][tpos] += self.shape.expert_bytes

    # -- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Budget and bookkeeping consistency (used by the property tests)."""
        s = self.shape.num_slots
        assert len(self.slot_of) + len(self.free) == s, "slots leaked"
        assert len(self.slot_of) <= s, "budget exceeded"
        for key, slot in self.slot_of.items():
            assert self.slot_key[slot] == key
        assert sum(len(v) for v in self.in_cache.values()) == len(self.slot_of)
