"""The expert cache: which experts occupy the device slots, and the policies that decide it.

One code path for the live runtime and for trace replay (DESIGN.md): both feed `LayerGate`s
to `ExpertCache.run_layer` pass by pass; only the source of the gates and what a slot load
does differ (`SlotSink`: the live runtime copies real bytes, replay does nothing). Time comes
from a clock (`moejax.timing.clock`): virtual (cost model) or wall.

`ExpertCache` holds the slot state (which key is in which slot, when each slot's transfer
lands, the free lists) and its primitives (`allocate`, `admit`, `evict`); a layer runs as a
pipeline of stages, each its own module, in the order of SpecMD's gate hook (Algorithm 1):

1. the layer's own step is charged and the watchdog queue worked (`watchdog_queue.py`);
2. decide: routing policy -> miss policy (or the whole layer on the host, `host_stage.py`);
3. the host compute path starts beside the device's (`host_stage.py`);
4. the requests are planned into waves (`waves.py`; by pool with several precision pools,
   `precision_pools.py`);
5. per wave: hits / late hits / demand fetches (`admission.serve`, the eviction policy choosing
   victims among unpinned slots), then, after the first wave's, the prefetch for the layers
   ahead (`admission.prefetch_now`, or queued for the watchdog); the wave is yielded to run;
6. the layer ends at the later of the device's waves and the host path.

The host tier (`host`, `host_tier.py`) sits in front of storage: a transfer is issued when the
expert's bytes are in host memory, which it decides (a host hit, or a storage read first).
Placement before the first pass (`placement.py`): ds4's full layers and a seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Protocol

import numpy as np

from moejax.cache import admission, placement, waves
from moejax.cache.cache_options import CacheOptions
from moejax.cache.capacity import CacheShape
from moejax.cache.host_stage import HostCompute, HostRun
from moejax.cache.metrics import CacheMetrics, PassTiming
from moejax.cache.precision_pools import PrecisionPools
from moejax.cache.staging import Staging
from moejax.cache.watchdog_queue import WatchdogQueue
from moejax.errors import ConfigError
from moejax.policies.base import (
    EvictionPolicy,
    MissDecision,
    MissPolicy,
    PrefetchPolicy,
    RoutingPolicy,
)
from moejax.seam import Key, LayerGate, Wave
from moejax.timing import timeline


class SlotSink(Protocol):
    """What moves experts into slots (the live runtime; replay has none). A sink whose
    consumer computes a wave's host experts (`Wave.host_experts`) says so with a true
    `computes_host_experts` attribute; the cache refuses to hand host work to one that does
    not (its consumer would skip those contributions)."""

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
    storage_stall: float = 0.0  # of the stall, the part waiting for storage reads
    host_wait: float = 0.0  # layers' ends waiting for the host compute path
    host_work_start: float = 0.0  # the clock's host work when the pass started (`timing`)


class ExpertCache:
    """Residency of experts in `num_slots` device slots, decided by four policies.

    State: `residency` maps each resident or in-flight `Key` to its (global) slot; `slot_key`,
    `slot_ready` (when the slot's last transfer lands), `slot_pool` and `free_lists` (one per
    pool; `free` is the first pool's) describe the slots. Deciding (the stages) is kept apart
    from counting (`CacheMetrics.count_*`). `options` (`CacheOptions`) is what it was built
    with; its parts are also attributes of their own names (`clock`, `sink`, `host`, ...).
    """

    def __init__(self, shape: CacheShape, eviction: EvictionPolicy, prefetch: PrefetchPolicy,
                 miss: MissPolicy, routing: RoutingPolicy, options: CacheOptions):
        if not isinstance(options, CacheOptions):
            raise TypeError(f"options must be a CacheOptions, not {type(options).__name__}")
        self.options = options
        self.shape, self.pin_scope = shape, options.pin_scope
        self.eviction, self.prefetch, self.miss, self.routing = eviction, prefetch, miss, routing
        self.clock, self.cost, self.sink = options.clock, options.cost, options.sink
        # How a pass's time is charged: None, the cost model's device steps on the virtual
        # clock (`cost`); or the live runtime's host work and steps (`RuntimeTiming`, a
        # calibrated profile's `host_work`) on a `HostDeviceClock`.
        self.timing = options.timing
        self.lookahead_scores = options.lookahead_scores
        # Transfers booked so far: demand fetches, prefetches (what `timing` dispatches).
        self.booked = [0, 0]
        self.pos_of = {l: p for p, l in enumerate(shape.layers)}
        eviction.set_layer_positions(self.pos_of)
        pools = shape.pools
        self.pool_index = {p.precision: i for i, p in enumerate(pools)}
        levels = tuple(getattr(miss, "levels", ("native",)))
        if levels[0] != shape.precision or any(p not in self.pool_index for p in levels):
            raise ConfigError(f"miss policy {miss.name!r} fetches at {list(levels)}, but the "
                              f"cache's pools are {list(shape.precisions)} (the first level is "
                              "the plain precision and needs the first pool)")
        self.multi = len(pools) > 1
        self.pools = PrecisionPools(self)
        if self.multi:
            self.allocate = self.pools.allocate
        self.metrics = CacheMetrics(list(shape.layers), shape.precisions)
        s = shape.num_slots
        self.residency: dict[Key, int] = {}
        self.slot_key: list[Key | None] = [None] * s
        self.slot_ready = [0.0] * s
        self.slot_pool = [i for i, p in enumerate(pools) for _ in range(p.num_slots)]
        self.slot_bytes = [p.expert_bytes for p in pools for _ in range(p.num_slots)]
        # pop() gives a pool's lowest slot first.
        self.free_lists = [list(range(p.offset + p.num_slots - 1, p.offset - 1, -1))
                           for p in pools]
        self.free = self.free_lists[0]
        self.tell_precision = eviction.needs_precision
        self.in_cache: dict[int, set[int]] = {l: set() for l in shape.layers}
        # Per layer, a count of the changes to its residency (an expert placed, evicted or
        # released): equal counts, equal slots (`residency_of`).
        self.layer_changes: dict[int, int] = dict.fromkeys(shape.layers, 0)
        # The host tier in front of storage (None: every expert in host memory).
        self.host = options.host
        # Per slot: when the storage read behind its last transfer landed (0: none was
        # waited for), so a late hit's wait can be traced to storage.
        self.slot_storage = [0.0] * s
        self.fixed: frozenset[Key] = frozenset()
        self.wave_slots = s  # slots a wave of an ordinary layer may use
        if options.full_layers:
            placement.reserve_full_layers(self, options.full_layers)
        # The staging share for prefetches (`staging.py`; None: every slot open to both).
        self.staging = (Staging(options.prefetch_share, s, shape.top_k, len(pools),
                                options.full_layers, options.prefetch_share_use)
                        if options.prefetch_share else None)
        if self.staging is not None:
            self.wave_slots = self.staging.demand_slots
        self.host_path = options.host_path
        self.host_compute = HostCompute(self, options.host_compute_layers, options.full_layers)
        self.host_layers = self.host_compute.layers
        # Prefetched and not yet used: key -> (pass, layer) it was fetched for.
        self.prefetch_origin: dict[Key, tuple[int, int]] = {}
        # (pass, layer) -> the experts predicted for it (every prefetch call's selection,
        # admitted or not), compared with the layer's routing when it runs.
        self.predicted: dict[tuple[int, int], set[int]] = {}
        self.running_pos = -1  # position of the layer being served
        self.watchdog = options.prefetch_queue != "immediate"
        self.watchdog_queue = WatchdogQueue(self, options.prefetch_queue == "watchdog_idle")
        self.idle_engine_rule = self.watchdog_queue.idle_engine_rule
        self.queue = self.watchdog_queue.entries  # key -> (target layer, time it was queued)
        self.running_pins: set[Key] = set()  # the running wave's experts (watchdog protection)
        self.seen_this_pass: set[Key] = set()  # resident at the pass start or admitted since
        self.pass_id = -1
        self._pass: PassState | None = None
        self.seeding: dict | None = None  # what `cache.seed` placed (build.seed_cache)
        # Profiler annotation around host work (`jax.profiler.TraceAnnotation` when tracing).
        self.annotate = lambda name: contextlib.nullcontext()

    @property
    def untouched(self) -> bool:
        """Nothing placed, run or counted yet: the cache as its constructor left it (a seed,
        a warm start or a pass makes it used)."""
        return (self.pass_id < 0 and not self.residency and not self.prefetch_origin
                and not self.queue and not self.metrics.passes and self.seeding is None)

    def policies(self) -> tuple[EvictionPolicy, PrefetchPolicy, MissPolicy, RoutingPolicy]:
        return self.eviction, self.prefetch, self.miss, self.routing

    def needs_scores(self) -> tuple[bool, bool]:
        """Whether the policies read router probabilities, and speculative scores."""
        return (any(p.needs_probs for p in self.policies()),
                any(p.needs_spec for p in self.policies()))

    # -- passes --------------------------------------------------------------------------------
    def begin_pass(self, kind: str, tokens: int, context_end: int) -> None:
        """A forward pass of `tokens` tokens ending at position `context_end` starts."""
        if self.host is not None and not self.host.preloaded:  # replay: count them here
            self.preload_host()
        self.pass_id += 1
        self.eviction.on_pass_start(self.pass_id)
        self.seen_this_pass = set(self.residency)
        self.predicted = {x: v for x, v in self.predicted.items() if x[0] >= self.pass_id}
        self.running_pos = -1
        start = self.clock.now()
        if self.timing is not None:
            host_work = self.clock.host_s
            self.timing.begin_pass(self, kind, tokens, context_end)
            self._pass = PassState(kind, tokens, context_end, start, host_work_start=host_work)
            return
        if self.cost is not None:
            self.clock.compute(self.cost.embed_and_logits(tokens) / 2)
        self._pass = PassState(kind, tokens, context_end, start)

    def end_pass(self) -> PassTiming:
        p = self._pass
        if self.queue:  # every target of this pass has started: what is left is dropped
            self.watchdog_queue.drop(len(self.shape.layers))
        self._charge_dense_layers(self.shape.num_layers)
        host_work = 0.0
        if self.timing is not None:
            self.timing.end_pass(self)
            host_work = self.clock.host_s - p.host_work_start
        elif self.cost is not None:
            self.clock.compute(self.cost.embed_and_logits(p.tokens) / 2)
        timing = PassTiming(p.kind, p.tokens, p.start, self.clock.now(), p.stall,
                            p.storage_stall, p.host_wait, host_work)
        self.metrics.passes.append(timing)
        self.metrics.snapshot()
        if self.host is not None:
            self.metrics.snapshots[-1].update(
                {f"host_{k}": v for k, v in self.host.totals().items()})
        self._pass = None
        return timing

    def finish(self) -> None:
        """End of the run: prefetched experts never used are wasted bytes."""
        for key in self.prefetch_origin:
            self.metrics.count_wasted_prefetch(self.pos_of[key[0]],
                                               self.slot_bytes[self.residency[key]])
        self.prefetch_origin.clear()

    def _charge_dense_layers(self, upto: int) -> None:
        """Charge the dense layers before layer `upto` that this pass has not run yet."""
        p = self._pass
        while p.next_layer < upto:
            if p.next_layer in self.pos_of:
                pass
            elif self.timing is not None:
                self.timing.dense(self, p.tokens, p.context)
            elif self.cost is not None:
                self.clock.compute(self.cost.dense_layer(p.tokens, p.context))
            p.next_layer += 1

    # -- residency -----------------------------------------------------------------------------
    def resident_keys(self) -> set[Key]:
        return set(self.residency)

    def residency_of(self, layer: int) -> dict[int, int]:
        """`layer`'s resident (or in-flight) experts and their slots."""
        residency = self.residency
        return {e: residency[(layer, e)] for e in self.in_cache[layer]}

    def precision_of_slot(self, slot: int) -> str:
        return self.shape.pools[self.slot_pool[slot]].precision

    def precision_of(self, key: Key) -> str | None:
        """The precision of `key`'s resident (or in-flight) copy, None if it has none."""
        slot = self.residency.get(key)
        return None if slot is None else self.precision_of_slot(slot)

    def evict(self, key: Key) -> int:
        """`key` leaves its slot (the eviction policy's victim); returns the slot."""
        with self.annotate("cache/evict"):
            slot = self.residency.pop(key)
            self.slot_key[slot] = None
            self.in_cache[key[0]].discard(key[1])
            self.layer_changes[key[0]] += 1
            self.eviction.on_evict(key)
            if self.staging is not None:
                self.staging.evicted(key)
            origin = self.prefetch_origin.pop(key, None)
            # Prefetched for a layer of this pass that has not run yet: evicted before use.
            early = (origin is not None and origin[0] == self.pass_id
                     and self.pos_of[origin[1]] > self.running_pos)
            self.metrics.count_eviction(self.pos_of[key[0]],
                                        self.slot_bytes[slot] if origin is not None else 0,
                                        early)
            return slot

    def allocate(self, pos: int, protected: set[Key], incoming: Key, pool: int = 0,
                 prefetch: bool = False) -> int | None:
        """A slot for `incoming` (a prefetch's when `prefetch`): a free one, or a victim's that
        is not in `protected` (one pool; with several, `PrecisionPools.allocate` replaces it).
        The eviction policy may refuse the free slot (`may_take_free`: a strict per-layer quota
        at its share). With a staging share, both come from the incoming expert's share."""
        staging = self.staging
        if staging is None:
            evictable = lambda k: k not in protected  # noqa: E731
            room = bool(self.free)
        else:
            evictable = staging.evictable(prefetch, protected)
            room = bool(self.free) and not staging.full(prefetch, len(self.residency))
        if room and self.eviction.may_take_free(incoming, evictable):
            return self.free.pop()
        victim = self.eviction.victim(pos, evictable, incoming)
        if victim is None:
            return None
        if not evictable(victim) or victim not in self.residency:
            raise AssertionError(f"eviction policy {self.eviction.name} chose {victim}, which is "
                                 "protected or not resident" + (
                                     "" if staging is None else " or in the other share"))
        return self.evict(victim)

    def admit(self, key: Key, slot: int, issue_at: float, prefetch: bool, pos: int,
              in_host: float | None = None) -> float:
        """Books `key`'s transfer into `slot`; returns when it lands. With a host tier its
        bytes must be in host memory first: `in_host` is when they are (a prefetch asked the
        host tier already, `prefetch_bytes`), else the host tier is asked now."""
        if self.host is not None:
            if in_host is None:
                in_host = self.host.bytes_ready(key, pos, issue_at, self.host_evictable, False)
            self.slot_storage[slot] = in_host if in_host > issue_at else 0.0
            issue_at = in_host
        # A slot still being filled by an earlier transfer is reused only after it lands.
        ready = timeline.landed(self.clock.transfer(self.slot_bytes[slot], issue_at),
                                self.slot_ready[slot])
        self.residency[key] = slot
        self.slot_key[slot] = key
        self.slot_ready[slot] = ready
        self.booked[prefetch] += 1
        self.in_cache[key[0]].add(key[1])
        self.layer_changes[key[0]] += 1
        self.seen_this_pass.add(key)
        self.eviction.on_admit(key, pos, prefetch)
        if self.staging is not None:
            self.staging.admitted(key, prefetch)
        if self.sink is not None:
            self.sink.load(key, slot, prefetch)
        return ready

    # -- one MoE layer: the pipeline -----------------------------------------------------------
    def run_layer(self, gate: LayerGate) -> Iterator[Wave]:
        """Processes one layer's gate outputs; yields the waves to compute, each with its
        experts resident (in order: the consumer runs a wave before asking for the next)."""
        layer = gate.layer
        pos = self.pos_of[layer]
        self._enter_layer(gate, pos)
        decision = self._decide(gate, layer, pos)
        ids, weights, active = decision.ids, decision.weights, decision.active
        here = (self.pass_id, layer)
        queue = self.watchdog_queue
        if self.queue and queue.idle_engine_rule:  # what an idle engine took meanwhile
            queue.issue(self.clock.now(), True, self.running_pins)
        host: HostRun | None = None
        if decision.host:  # (less what an idle engine took meanwhile: a late hit now)
            host = self.host_compute.start(layer, ids, active,
                                           decision.host - self.in_cache[layer])
            if host is not None:  # the device's contributions
                active = active & ~host.mask
        self.running_pos = pos
        if self.queue:
            queue.drop(pos)
        had_prediction = self._count_prediction(gate, here, pos)
        if host is not None:
            self.host_compute.count(layer, pos, host, had_prediction)

        requests = waves.requests(ids, active)
        if self.timing is not None:
            self.timing.decided(self, len(requests))
        if not self.multi and len(requests) <= self.wave_slots:  # one wave, as planned below
            planned = ((waves.PlannedWave(requests), True),)
        elif self.multi:
            planned = self.pools.waves(layer, requests, decision.precision)
        else:
            planned = waves.single_pool(requests, self.in_cache[layer], self.wave_slots,
                                        bool(self.fixed) and (layer, 0) in self.fixed)
        tokens = gate.ids.shape[0]
        for w, (wave, last) in enumerate(planned):  # each wave planned after the previous ran
            ready, pairs = self._serve_wave(gate, pos, here, w, wave, last, ids, weights, active,
                                            had_prediction, host)
            yield ready  # the consumer runs the wave's experts step
            if self.timing is not None:
                self.timing.experts(self, pairs, len(wave.experts), tokens, w == 0)
            elif self.cost is not None:
                self.clock.compute(self.cost.experts(pairs, len(wave.experts), tokens,
                                                     shared=(w == 0)))
        if host is not None:  # the layer ends when the later of its two paths does
            self._pass.host_wait += self.host_compute.finish(pos, host)

    def _enter_layer(self, gate: LayerGate, pos: int) -> None:
        """Before the router's decision: the watchdog's chance at the slots the previous
        layer freed, the dense layers before this one and this layer's own step charged, and
        the scores handed to an eviction policy that reads them."""
        p, layer = self._pass, gate.layer
        if self.queue and not self.idle_engine_rule:
            # The previous layer's experts are done: its slots may give queued entries space
            # now, before this layer's router has asked for anything.
            self.watchdog_queue.issue(self.clock.now(), False, ())
        self._charge_dense_layers(layer)
        if self.timing is not None:
            self.timing.layer(self, gate, pos)
        elif self.cost is not None:
            self.clock.compute(self.cost.attention_router(gate.ids.shape[0], p.context,
                                                          self.lookahead_scores))
        p.next_layer = layer + 1
        if gate.probs is not None and self.eviction.needs_probs:
            self.eviction.on_scores(layer, gate.probs)

    def _decide(self, gate: LayerGate, layer: int, pos: int) -> MissDecision:
        """What runs: the routing policy's selection, then the miss policy's decision on it
        (every expert on the host in a layer computed there)."""
        ids, weights = self.routing.select(gate, self.in_cache[layer])
        if weights is None:  # id-only traces: the experts step is not run
            weights = np.ones(ids.shape, np.float32)
        if layer in self.host_layers:  # every selected expert runs, on the host
            decision = HostCompute.whole_layer(ids, weights)
        else:
            decision = self.miss.handle(gate, ids, weights, self.in_cache[layer])
        if decision.dropped or decision.substituted:
            self.metrics.count_decision(pos, decision.dropped, decision.substituted)
        if decision.host and self.in_cache[layer] & decision.host:
            raise AssertionError(f"miss policy {self.miss.name} computes resident experts "
                                 f"{sorted(self.in_cache[layer] & decision.host)} of layer "
                                 f"{layer} on the host")
        return decision

    def _count_prediction(self, gate: LayerGate, here: tuple[int, int], pos: int) -> bool:
        """The set predicted for this layer against the router's own selection; whether there
        was a prediction."""
        prediction = self.predicted.pop(here, None)
        if prediction is None:
            return False
        truth = set(gate.ids.ravel().tolist())
        self.metrics.count_prediction(pos, len(prediction), len(prediction & truth), len(truth))
        return True

    def _serve_wave(self, gate: LayerGate, pos: int, here: tuple[int, int], w: int,
                    wave: waves.PlannedWave, last: bool, ids: np.ndarray, weights: np.ndarray,
                    active: np.ndarray, had_prediction: bool, host: HostRun | None
                    ) -> tuple[Wave, int]:
        """One wave made ready to run: served (after the first wave's, the prefetch for the
        layers ahead; after a later one's, the watchdog), the stall waited and counted.
        Returns the wave and its token-expert products (its experts step is charged once it
        ran, `run_layer`)."""
        layer, p, timing = gate.layer, self._pass, self.timing
        only = last if w == 0 else False  # one wave: every contribution is this wave's
        chunk = wave.experts
        now = self.clock.now()
        pinned = self.running_pins = {(layer, e) for e in chunk}
        outcome, served = admission.serve(self, layer, pos, wave, pinned, now, here)
        if w == 0:
            if self.watchdog:
                self.watchdog_queue.enqueue(gate, pos, now)
            else:
                admission.prefetch_now(self, gate, pos, pinned, now)
        elif self.queue and not self.idle_engine_rule:  # the previous wave is done
            self.watchdog_queue.issue(now, False, pinned)
        if timing is not None:
            timing.served(self)
        outcome.stall = self.clock.wait(outcome.ready)
        p.stall += outcome.stall
        if outcome.storage_ready > now:
            storage = min(outcome.stall, outcome.storage_ready - now)
            self.host.count_stall(pos, storage)
            p.storage_stall += storage
        wave_active = active if only else active & np.isin(ids, chunk)
        outcome.products = pairs = int(np.count_nonzero(wave_active))
        self.metrics.count_wave(pos, len(chunk), outcome, had_prediction,
                                self.shape.expert_bytes)
        if self.multi:
            self.pools.count(pos, ids, wave_active, chunk, served, outcome.demand_by_pool)
        residency = self.residency
        # (With pin_scope="request" an expert of the wave may already be gone again.)
        return Wave(layer, {e: residency[(layer, e)] for e in chunk if (layer, e) in residency},
                    ids, weights, wave_active, first=(w == 0), last=last,
                    host_experts=host.span.experts if w == 0 and host is not None else (),
                    host_active=host.mask if w == 0 and host is not None else None), pairs

    # -- the host tier -------------------------------------------------------------------------
    def prefetch_bytes(self, key: Key, pos: int, at: float) -> float | None:
        """When a prefetch's bytes are in host memory (None without a host tier); asked after
        `HostTier.can_take` said yes and a device slot was taken."""
        if self.host is None:
            return None
        return self.host.bytes_ready(key, pos, at, self.host_evictable, True)

    def preload_host(self) -> tuple[list[Key], list[Key]]:
        """The host tier's reads before the first token (`HostTier.preload`): the experts on
        the device before the first pass that the host tier does not hold, then its seeded
        entries. The live runtime calls this when it loads them; replay at the first pass."""
        return self.host.preload(list(self.residency))

    def host_evictable(self, key: Key) -> bool:
        """What the host tier may evict: anything but the running wave's experts."""
        return key not in self.running_pins

    # -- placement -----------------------------------------------------------------------------
    def seed(self, keys: list[Key], priorities: dict[Key, int] | None = None) -> int:
        """Seeds the device slots with `keys` (hottest first) before the first pass
        (`placement.seed`). Returns how many were placed."""
        return placement.seed(self, keys, priorities)

    # -- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Budget and bookkeeping consistency (used by the property tests): per pool, resident
        plus in-flight keys within its slots, and over the pools their bytes within the byte
        budget."""
        s = self.shape.num_slots
        assert len(self.residency) + sum(map(len, self.free_lists)) == s, "slots leaked"
        assert len(self.residency) <= s, "budget exceeded"
        held = [0] * len(self.shape.pools)
        for key, slot in self.residency.items():
            assert self.slot_key[slot] == key
            held[self.slot_pool[slot]] += 1
        for i, (pool, free) in enumerate(zip(self.shape.pools, self.free_lists)):
            assert held[i] <= pool.num_slots, f"the {pool.precision} pool is over its slots"
            assert all(self.slot_pool[f] == i and self.slot_key[f] is None for f in free)
        used = sum(n * p.expert_bytes for n, p in zip(held, self.shape.pools))
        assert used <= self.shape.capacity_bytes + 1e-6, "byte budget exceeded"
        assert sum(len(v) for v in self.in_cache.values()) == len(self.residency)
        if self.staging is not None:
            staged = self.staging.staged
            assert staged <= self.residency.keys(), "a staged expert is not resident"
            assert len(staged) <= self.staging.slots, "the staging share is over its slots"
            assert len(self.residency) - len(staged) <= self.staging.demand_slots, \
                "the demand share is over its slots"
