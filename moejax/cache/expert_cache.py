"""The expert cache: which experts occupy the device slots, and the policies that decide it.

One code path for the live runtime and for trace replay (DESIGN.md): both feed `LayerGate`s
to `ExpertCache.run_layer` pass by pass; only the source of the gates and what a slot load
does differ (`SlotSink`: the live runtime copies real bytes, replay does nothing). Time comes
from a clock (`moejax.timing.clock`): virtual (cost model) or wall.

Per MoE layer of a pass, in the order of SpecMD's gate hook (Algorithm 1):
routing policy -> miss policy -> requests (hit / late hit / miss; misses demand-fetched, the
eviction policy choosing victims among unpinned slots) -> prefetch for the layers ahead ->
the layer's experts run (in waves of at most `num_slots` experts when a prefill layer needs
more experts than there are slots).

Precision pools (`CacheShape.pools`, `moejax/cache/capacity.py`): the slots are split into one
pool per precision the miss policy may fetch (its `levels`, high to low), numbered globally
pool after pool; each pool has its own free list, and a victim for a fetch into a pool is
chosen among that pool's keys. Residency stays per `(layer, expert)`: at most one copy of an
expert is resident, at one precision (`precision_of_slot`). A request wants the precision the
miss policy names (`MissDecision.precision`, `levels[0]` by default): a resident copy at or
above it is a hit; one below it is the miss policy's `upgrade` choice — a hit on the low copy
(`served_below_wanted`), or a fetch at the wanted precision into its pool, the low slot freed
(an `upgrade`: a miss, not an eviction; the eviction policy sees the key leave and re-enter).
A miss is fetched into the wanted precision's pool; prefetches go at `levels[0]`. A prefill
layer's waves are cut so that each pool holds its share of the wave; a policy with
`fallback` fetches at the next lower level with room instead of starting a new wave. One serve
loop (`run_layer`, `_waves`, `_serve`) runs one pool and several alike; with one pool the waves
are plain slices and no plan of pools is made.

The disk tier (`host`, `moejax/cache/host_tier.py`): a transfer is issued when the expert's bytes
are in host memory, which the host tier decides (a host hit, or a storage read first); a
prefetch goes only if the host tier can hold its expert, and predictions without a device slot
(immediate queue) or waiting in the watchdog's queue are read ahead into host memory.
Placement: `full_layers` reserves slots for whole layers (always hits, never shown to the
eviction policy), and `seed` fills free slots before the first pass.

Host compute (`moejax/cache/host_path.py`): experts the miss policy names
(`MissDecision.host`) and every expert of the first `host_compute_layers` MoE layers (the miss
policy is not asked there: every selected expert runs, on the host) are computed on the host:
no slot, no transfer, no eviction, never prefetched or seeded. Their path starts when the
router has decided and runs beside the device's waves; the layer ends at the later of the two
(`host_path`, the model of it; counted by `CacheMetrics.count_host`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator, Protocol

import numpy as np

from moejax.cache.capacity import PoolSpec
from moejax.cache.host_path import HostPath, HostSpan, LayerPlanner
from moejax.cache.host_tier import HostTier
from moejax.cache.metrics import CacheMetrics, PassTiming, WaveOutcome
from moejax.cache.runtime_timing import RuntimeTiming
from moejax.errors import ConfigError
from moejax.policies.base import (
    EvictionPolicy,
    MissDecision,
    MissPolicy,
    PrefetchPolicy,
    RoutingPolicy,
)
from moejax.seam import Key, LayerGate, Wave, requests_in_rank_order
from moejax.timing import timeline
from moejax.timing.cost import CostModel


@dataclasses.dataclass(frozen=True)
class CacheShape:
    """The cache's dimensions. `expert_bytes` is one expert at the plain precision (the first
    pool's), `num_slots` all slots; `pools` (one native pool of every slot when not given) the
    per-precision pools, high to low, their slots consecutive. `capacity` (the byte budget and
    what it is a fraction of) and `precision_bytes` (bytes of one expert at each precision the
    source has) are what results.json reports; None / () when the shape was given directly."""

    layers: tuple[int, ...]  # MoE layer indices in pass order
    num_layers: int  # all decoder layers (dense ones included), for the cost model
    num_experts: int
    top_k: int
    expert_bytes: int
    num_slots: int
    pools: tuple[PoolSpec, ...] = ()
    capacity: object = None  # moejax.cache.capacity.Budget
    precision_bytes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        if not self.pools:
            object.__setattr__(self, "pools", (PoolSpec("native", self.expert_bytes,
                                                        self.num_slots, 0),))
        offset = 0
        for p in self.pools:
            if p.offset != offset or p.num_slots < 1:
                raise ValueError(f"pools {self.pools} are not consecutive non-empty slot ranges")
            offset += p.num_slots
        if offset != self.num_slots or self.pools[0].expert_bytes != self.expert_bytes:
            raise ValueError(f"pools {self.pools} disagree with num_slots={self.num_slots} / "
                             f"expert_bytes={self.expert_bytes} (the first pool's)")

    @classmethod
    def with_pools(cls, layers, num_layers: int, num_experts: int, top_k: int,
                   pools: tuple[PoolSpec, ...], capacity=None,
                   precision_bytes: dict[str, int] | None = None) -> "CacheShape":
        return cls(tuple(layers), num_layers, num_experts, top_k, pools[0].expert_bytes,
                   sum(p.num_slots for p in pools), tuple(pools), capacity,
                   tuple((precision_bytes or {}).items()))

    @property
    def total_experts(self) -> int:
        return self.num_experts * len(self.layers)

    @property
    def precision(self) -> str:
        """The plain precision: what a plain fetch and a prefetch move (the first pool's)."""
        return self.pools[0].precision

    @property
    def precisions(self) -> tuple[str, ...]:
        return tuple(p.precision for p in self.pools)

    @property
    def capacity_bytes(self) -> float:
        """The byte budget the pools share (their slots' bytes when not given)."""
        if self.capacity is not None:
            return self.capacity.capacity_bytes
        return float(sum(p.num_slots * p.expert_bytes for p in self.pools))


def slots_for(shape_experts: int, top_k: int, expert_bytes: int, capacity_frac: float | None,
              slots: int | None) -> int:
    """Slot count of one native pool from `cache.capacity_frac` (of all routed-expert bytes) or
    `cache.slots` (`moejax/cache/capacity.py` sizes the precision pools in general)."""
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

# How predictions become transfers. "immediate": each prediction takes a slot and books its
# transfer when it is made (one call's predictions protect each other, so a prefetched expert
# is never evicted before its use, and bandwidth changes timings only). "watchdog" (SpecMD's
# appendix: "a watchdog thread monitors this queue and GPU capacity, issuing non-blocking CUDA
# transfers when space allows"): predictions wait in a FIFO queue and go as soon as a slot can
# be had; their transfers queue on the copy engines. "watchdog_idle": the same queue under
# issue 10's rule, a transfer issued only onto an idle copy engine. See `ExpertCache._watchdog`.
PREFETCH_QUEUES = ("immediate", "watchdog", "watchdog_idle")


class SlotSink(Protocol):
    """What moves experts into slots (the live runtime; replay has none). A sink whose
    consumer computes a wave's host experts (`Wave.host_experts`) says so with a true
    `computes_host_experts` attribute; the cache refuses to hand host work to one that does
    not (its consumer would skip those contributions)."""

    def load(self, key: Key, slot: int, prefetch: bool) -> None:
        """Start copying expert `key` into `slot` (asynchronously)."""


@dataclasses.dataclass(slots=True)
class PlannedWave:
    """One wave of a layer as planned: its experts in serving order and, with several pools,
    the pool each is served from and the pool wanted (None with one pool: pool 0 for all)."""

    experts: list[int]
    targets: list[int] | None = None
    wants: list[int] | None = None


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
    pool; `free` is the first pool's) describe the slots. Deciding (`run_layer`, `_serve`,
    `_prefetch`) is kept apart from counting (`CacheMetrics.count_*`).
    """

    def __init__(self, shape: CacheShape, eviction: EvictionPolicy, prefetch: PrefetchPolicy,
                 miss: MissPolicy, routing: RoutingPolicy, clock, cost: CostModel | None = None,
                 sink: SlotSink | None = None, lookahead_scores: int = 0,
                 pin_scope: str = "layer", prefetch_queue: str = "immediate",
                 host: HostTier | None = None, full_layers: int = 0,
                 host_compute_layers: int = 0, host_path: HostPath | None = None,
                 timing: RuntimeTiming | None = None):
        # Every constructor argument as given: the compiled replay engine runs a cache only
        # when it declares each of them (moejax/replay/coverage.py), so a new option runs on
        # this reference until the kernel learns it.
        self.options = {k: v for k, v in locals().items() if k != "self"}
        if pin_scope not in PIN_SCOPES:
            raise ConfigError(f"cache.pin_scope={pin_scope!r} is not one of {PIN_SCOPES}")
        if prefetch_queue not in PREFETCH_QUEUES:
            raise ConfigError(f"cache.prefetch_queue={prefetch_queue!r} is not one of "
                              f"{PREFETCH_QUEUES}")
        self.shape, self.pin_scope = shape, pin_scope
        self.watchdog = prefetch_queue != "immediate"
        self.idle_engine_rule = prefetch_queue == "watchdog_idle"
        self.eviction, self.prefetch, self.miss, self.routing = eviction, prefetch, miss, routing
        self.clock, self.cost, self.sink = clock, cost, sink
        # How a pass's time is charged: None, the cost model's device steps on the virtual
        # clock (`cost`); or the live runtime's host work and steps (`RuntimeTiming`, a
        # calibrated profile's `host_work`) on a `HostDeviceClock`.
        if timing is not None:
            timing.check_clock(clock)
        self.timing = timing
        # Transfers booked so far: demand fetches, prefetches (what `timing` dispatches).
        self.booked = [0, 0]
        self.lookahead_scores = lookahead_scores
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
        if self.multi:
            self._allocate = self._allocate_in_pool
        self.tell_precision = eviction.needs_precision
        self.in_cache: dict[int, set[int]] = {l: set() for l in shape.layers}
        # Per layer, a count of the changes to its residency (an expert placed, evicted or
        # released): equal counts, equal slots (`residency_of`).
        self.layer_changes: dict[int, int] = dict.fromkeys(shape.layers, 0)
        # The host tier in front of storage (None: every expert in host memory).
        self.host = host
        # Per slot: when the storage read behind its last transfer landed (0: none was
        # waited for), so a late hit's wait can be traced to storage.
        self.slot_storage = [0.0] * s
        self.fixed: frozenset[Key] = frozenset()
        self.wave_slots = s  # slots a wave of an ordinary layer may use
        if full_layers:
            self._reserve_full_layers(full_layers)
        self.host_path = host_path
        self.host_layers = self._host_compute_layers(host_compute_layers)
        if miss.computes_on_host or self.host_layers:
            self._check_host_compute(full_layers)
        if miss.computes_on_host:
            miss.set_planner(LayerPlanner(self))
        # Prefetched and not yet used: key -> (pass, layer) it was fetched for.
        self.prefetch_origin: dict[Key, tuple[int, int]] = {}
        # (pass, layer) -> the experts predicted for it (every prefetch call's selection,
        # admitted or not), compared with the layer's routing when it runs.
        self.predicted: dict[tuple[int, int], set[int]] = {}
        self.running_pos = -1  # position of the layer being served
        # The watchdog's queue (insertion-ordered): key -> (target layer, time it was queued).
        self.queue: dict[Key, tuple[int, float]] = {}
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
            self._drop_queued(len(self.shape.layers))
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

    def _evict(self, key: Key) -> int:
        with self.annotate("cache/evict"):
            slot = self.residency.pop(key)
            self.slot_key[slot] = None
            self.in_cache[key[0]].discard(key[1])
            self.layer_changes[key[0]] += 1
            self.eviction.on_evict(key)
            origin = self.prefetch_origin.pop(key, None)
            # Prefetched for a layer of this pass that has not run yet: evicted before use.
            early = (origin is not None and origin[0] == self.pass_id
                     and self.pos_of[origin[1]] > self.running_pos)
            self.metrics.count_eviction(self.pos_of[key[0]],
                                        self.slot_bytes[slot] if origin is not None else 0,
                                        early)
            return slot

    def _release(self, key: Key) -> None:
        """An upgrade: `key`'s low copy leaves its slot (back to its pool's free list); not an
        eviction."""
        slot = self.residency.pop(key)
        self.slot_key[slot] = None
        self.in_cache[key[0]].discard(key[1])
        self.layer_changes[key[0]] += 1
        self.eviction.on_evict(key)
        if self.prefetch_origin.pop(key, None) is not None:
            self.metrics.count_wasted_prefetch(self.pos_of[key[0]], self.slot_bytes[slot])
        self.free_lists[self.slot_pool[slot]].append(slot)

    def _allocate(self, pos: int, protected: set[Key], incoming: Key, pool: int = 0) -> int | None:
        """A slot for `incoming`: a free one, or a victim's that is not in `protected` (one
        pool; with several, `_allocate_in_pool` replaces it)."""
        if self.free:
            return self.free.pop()
        victim = self.eviction.victim(pos, lambda k: k not in protected, incoming)
        if victim is None:
            return None
        if victim in protected or victim not in self.residency:
            raise AssertionError(f"eviction policy {self.eviction.name} chose {victim}, which is "
                                 "protected or not resident")
        return self._evict(victim)

    def _allocate_in_pool(self, pos: int, protected: set[Key], incoming: Key,
                          pool: int = 0) -> int | None:
        """A slot of `pool` for `incoming`: a free one, or a victim's (of that pool) that is
        not in `protected`."""
        free = self.free_lists[pool]
        if free:
            return free.pop()
        residency, slot_pool = self.residency, self.slot_pool
        victim = self.eviction.victim(
            pos, lambda k: k not in protected and slot_pool[residency[k]] == pool, incoming)
        if victim is None:
            return None
        if victim in protected or victim not in residency or slot_pool[residency[victim]] != pool:
            raise AssertionError(f"eviction policy {self.eviction.name} chose {victim}, which is "
                                 "protected, not resident or in another pool")
        return self._evict(victim)

    def _admit(self, key: Key, slot: int, issue_at: float, prefetch: bool, pos: int,
               in_host: float | None = None) -> float:
        """Books `key`'s transfer into `slot`. With a host tier its bytes must be in host
        memory first: `in_host` is when they are (a prefetch asked the host tier already,
        `_prefetch_bytes`), else the host tier is asked now."""
        if self.host is not None:
            if in_host is None:
                in_host = self.host.bytes_ready(key, pos, issue_at, self._host_evictable, False)
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
        if self.queue and not self.idle_engine_rule:
            # The previous layer's experts are done: its slots may give queued entries space
            # now, before this layer's router has asked for anything.
            self._watchdog(self.clock.now(), False, ())
        self._charge_dense_layers(layer)
        timing = self.timing
        if timing is not None:
            timing.layer(self, gate, pos)
        elif self.cost is not None:
            self.clock.compute(self.cost.attention_router(tokens, p.context,
                                                          self.lookahead_scores))
        p.next_layer = layer + 1
        if gate.probs is not None and self.eviction.needs_probs:
            self.eviction.on_scores(layer, gate.probs)

        # Decide what runs: routing, then the miss policy, then the requests it makes.
        ids, weights = self.routing.select(gate, self.in_cache[layer])
        if weights is None:  # id-only traces: the experts step is not run
            weights = np.ones(ids.shape, np.float32)
        if layer in self.host_layers:  # every selected expert runs, on the host
            decision = MissDecision(ids, weights, np.ones(ids.shape, bool),
                                    host=frozenset(np.unique(ids).tolist()))
        else:
            decision = self.miss.handle(gate, ids, weights, self.in_cache[layer])
        ids, weights, active = decision.ids, decision.weights, decision.active
        if decision.dropped or decision.substituted:
            self.metrics.count_decision(pos, decision.dropped, decision.substituted)
        if decision.host and self.in_cache[layer] & decision.host:
            raise AssertionError(f"miss policy {self.miss.name} computes resident experts "
                                 f"{sorted(self.in_cache[layer] & decision.host)} of layer "
                                 f"{layer} on the host")
        here = (self.pass_id, layer)
        if self.queue and self.idle_engine_rule:  # what an idle engine took meanwhile
            self._watchdog(self.clock.now(), True, self.running_pins)
        host_mask = span = None
        if decision.host:  # (less what an idle engine took meanwhile: a late hit now)
            host_mask, span = self._host_work(layer, ids, active,
                                              decision.host - self.in_cache[layer])
        if span is not None:  # the host path starts now, beside the device's waves
            host_back = self.clock.now() + span.down_s + span.compute_s + span.back_s
            active = active & ~host_mask  # the device's contributions
        self.running_pos = pos
        if self.queue:
            self._drop_queued(pos)
        prediction = self.predicted.pop(here, None)
        had_prediction = prediction is not None
        if had_prediction:  # the predicted set against the router's own selection
            truth = set(gate.ids.ravel().tolist())
            self.metrics.count_prediction(pos, len(prediction), len(prediction & truth),
                                          len(truth))
        if span is not None:
            seen = self.seen_this_pass
            self.metrics.count_host(pos, len(span.experts), span.pairs,
                                    sum((layer, e) in seen for e in span.experts),
                                    span.compute_s, span.down_bytes, span.back_bytes,
                                    had_prediction)

        requests = self._requests(layer, ids, active)
        if timing is not None:
            timing.decided(self, len(requests))
        if not self.multi and len(requests) <= self.wave_slots:  # one wave, as `_waves` plans
            waves = ((PlannedWave(requests), True),)
        else:
            waves = self._waves(layer, requests, decision.precision)
        for w, (wave, last) in enumerate(waves):  # each wave planned after the previous ran
            only = last if w == 0 else False  # one wave: every contribution is this wave's
            chunk = wave.experts
            now = self.clock.now()
            pinned = self.running_pins = {(layer, e) for e in chunk}
            outcome, served = self._serve(layer, pos, wave, pinned, now, here)
            if w == 0:
                self._prefetch(gate, pos, pinned, now)
            elif self.queue and not self.idle_engine_rule:  # the previous wave is done
                self._watchdog(now, False, pinned)
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
                self._count_pools(pos, ids, wave_active, chunk, served, outcome.demand_by_pool)
            residency = self.residency
            # (With pin_scope="request" an expert of the wave may already be gone again.)
            yield Wave(layer, {e: residency[(layer, e)] for e in chunk if (layer, e) in residency},
                       ids, weights, wave_active, first=(w == 0), last=last,
                       host_experts=span.experts if w == 0 and span is not None else (),
                       host_active=host_mask if w == 0 else None)
            if timing is not None:
                timing.experts(self, pairs, len(chunk), tokens, w == 0)
            elif self.cost is not None:
                self.clock.compute(self.cost.experts(pairs, len(chunk), tokens, shared=(w == 0)))
        if span is not None:  # the layer ends when the later of its two paths does
            waited = self.clock.wait(host_back)
            self.metrics.count_host_wait(pos, waited)
            p.host_wait += waited

    def _host_work(self, layer: int, ids: np.ndarray, active: np.ndarray, host: frozenset[int]
                   ) -> tuple[np.ndarray | None, HostSpan | None]:
        """The contributions of the experts `host` names and the host's work on them (None,
        None when none of them runs)."""
        if self.sink is not None and not getattr(self.sink, "computes_host_experts", False):
            what = (f"cache.host_compute_layers={len(self.host_layers)}"
                    if layer in self.host_layers else f"policies.miss={self.miss.name}")
            raise ConfigError(f"{what}: this live runtime does not compute experts on the host "
                              "yet; replay it (configs/replay.py) instead")
        mask = active & np.isin(ids, list(host))
        if not mask.any():
            return None, None
        return mask, self.host_path.span(ids, mask)

    def _requests(self, layer: int, ids: np.ndarray, active: np.ndarray) -> list[int]:
        """The layer's distinct experts in router-rank order (rank-major over tokens, first
        occurrence wins)."""
        if ids.shape[0] == 1:
            return [int(e) for e, a in zip(ids[0].tolist(), active[0].tolist()) if a]
        return requests_in_rank_order(ids, active)

    def _resident_first(self, layer: int, requests: list[int]) -> list[int]:
        """When a layer needs more than one wave, its resident experts go first, so no wave
        evicts an expert a later wave of the layer needs only because of ordering."""
        here = self.in_cache[layer]
        return [e for e in requests if e in here] + [e for e in requests if e not in here]

    def _waves(self, layer: int, requests: list[int], wanted: dict[int, str] | None
               ) -> Iterator[tuple["PlannedWave", bool]]:
        """The layer's waves, each planned just before it is served (on the residency it
        finds), with whether it is the last. One pool: at most `wave_slots` experts a wave (a
        reserved full layer is resident whole: one wave). Several pools: `_plan_wave`, so that
        every pool holds its part of the wave."""
        if not self.multi:
            if len(requests) > self.wave_slots:
                requests = self._resident_first(layer, requests)
            fixed = self.fixed and (layer, 0) in self.fixed
            s = len(requests) if fixed else self.wave_slots
            chunks = [requests[i:i + s] for i in range(0, len(requests), s)] or [[]]
            for i, chunk in enumerate(chunks):
                yield PlannedWave(chunk), i == len(chunks) - 1
            return
        want_of = self._wanted(requests, wanted)
        wave, rest = self._plan_wave(layer, requests, want_of)
        if rest:  # several waves: resident experts first (as with one pool)
            wave, rest = self._plan_wave(layer, self._resident_first(layer, requests), want_of)
        while True:
            yield wave, not rest
            if not rest:
                return
            wave, rest = self._plan_wave(layer, rest, want_of)

    def _wanted(self, requests: list[int], wanted: dict[int, str] | None) -> dict[int, int]:
        """Expert -> index of the pool of the precision the miss policy wants it at."""
        if not wanted:
            return dict.fromkeys(requests, 0)
        index = self.pool_index
        try:
            return {e: index[wanted[e]] if e in wanted else 0 for e in requests}
        except KeyError as err:
            raise AssertionError(f"miss policy {self.miss.name} wants precision {err} "
                                 f"outside its levels {self.shape.precisions}") from None

    def _plan_wave(self, layer: int, requests: list[int], want_of: dict[int, int]
                   ) -> tuple["PlannedWave", list[int]]:
        """The next wave over several pools (each expert with the pool it is served from and
        the pool wanted) and the requests left for later waves. A pool's room in a wave is its
        slot count: every key the wave holds in it counts (its hits and fetches, and the low
        copies an upgrade leaves only when it is served). A fetch whose pool is full falls to
        the next lower pool with room when the miss policy has `fallback` (an upgrade stays at
        its resident copy if none above it has room); otherwise the wave ends there."""
        residency, slot_pool = self.residency, self.slot_pool
        upgrade, fallback = self.miss.upgrade, self.miss.fallback
        room = [p.num_slots for p in self.shape.pools]
        last = len(room)
        wave = PlannedWave([], [], [])
        for n, e in enumerate(requests):
            want = want_of[e]
            slot = residency.get((layer, e))
            r = last if slot is None else slot_pool[slot]
            target = None
            if r <= want or (r < last and not upgrade):  # a hit on the resident copy
                if room[r]:
                    target = r
            elif r == last or room[r]:  # a fetch (an upgrade also holds its low slot)
                for t in range(want, r if fallback else want + 1):
                    if room[t]:
                        target = t
                        break
                if target is None and fallback and r < last:
                    target = r  # no room above: the resident copy serves
            if target is None:
                if not wave.experts:
                    raise AssertionError(f"request {e} of layer {layer} fits no pool")
                return wave, requests[n:]
            room[target] -= 1
            if r < last and target != r:
                room[r] -= 1
            wave.experts.append(e)
            wave.targets.append(target)
            wave.wants.append(want)
        return wave, []

    def _serve(self, layer: int, pos: int, wave: "PlannedWave", pinned: set[Key], now: float,
               here: tuple[int, int]) -> tuple[WaveOutcome, list[int] | None]:
        """Makes the wave's experts resident: hits (a resident copy at or above the pool
        planned for it; below the wanted precision counted `served_below_wanted`), late hits,
        and demand fetches of the misses into the planned pool (an upgrade first frees the low
        copy). Returns the outcome and, with several pools, the pool each expert was served
        from. (One pool plans no pools: every expert is pool 0's, wanted there; the loop reads
        the plan only when there is one — replay runs millions of requests through it.)"""
        targets, wants = wave.targets, wave.wants
        multi = targets is not None
        out = WaveOutcome(ready=now)
        residency, slot_ready, origins = self.residency, self.slot_ready, self.prefetch_origin
        slot_pool, pools, slot_storage = self.slot_pool, self.shape.pools, self.slot_storage
        on_access, tell, fixed = self.eviction.on_access, self.tell_precision, self.fixed
        by_layer = self.pin_scope == "layer"
        served = [] if multi else None
        if multi:
            out.demand_bytes, out.demand_by_pool = 0, [0] * len(pools)
        target = want = 0
        for i, e in enumerate(wave.experts):
            if multi:
                target, want = targets[i], wants[i]
            key = (layer, e)
            slot = residency.get(key)
            if slot is not None and (not multi or slot_pool[slot] <= target):
                # A hit (the plan's; with pin_scope="request" possibly a copy above it).
                at = slot_ready[slot]
                if at > now:
                    out.late_hits += 1
                    if at > out.ready:
                        out.ready = at
                    if slot_storage[slot] > out.storage_ready:
                        out.storage_ready = slot_storage[slot]
                else:
                    out.hits += 1
                if multi and slot_pool[slot] > want:
                    out.served_below_wanted += 1
                if fixed and key in fixed:  # a reserved full layer: the policy never sees it
                    continue
                if origins and origins.pop(key, None) == here:
                    out.prefetch_used += 1
            else:
                if slot is not None:  # an upgrade: the low copy's slot goes back to its pool
                    self._release(key)
                    out.upgrades += 1
                else:
                    out.collisions += key in self.seen_this_pass
                slot = self._allocate(pos, pinned if by_layer else {key}, key, target)
                if slot is None:
                    raise AssertionError(f"no slot in the {pools[target].precision} pool for a "
                                         "demand fetch although the wave was planned to fit")
                first = not out.misses
                if first:  # what is on the engines now went before it (`engine_wait`)
                    engine_free = min(self.clock.engine_free)
                ready = self._admit(key, slot, now, False, pos)
                if first:
                    issued = slot_storage[slot] if slot_storage[slot] > now else now
                    out.engine_wait = timeline.stall(engine_free, issued)
                if ready > out.ready:
                    out.ready = ready
                out.misses += 1
                if multi:
                    nbytes = pools[target].expert_bytes
                    out.demand_bytes += nbytes
                    out.demand_by_pool[target] += nbytes
                    if target > want:
                        out.served_below_wanted += 1
                if slot_storage[slot] > out.storage_ready:
                    out.storage_ready = slot_storage[slot]
            if multi:
                served.append(slot_pool[slot])
            on_access(key, pos)
            if tell:
                self.eviction.on_use_precision(key, pools[slot_pool[slot]].precision)
        return out, served

    def _count_pools(self, pos: int, ids: np.ndarray, wave_active: np.ndarray,
                     chunk: list[int], served: list[int], demand: list[int]) -> None:
        """Several pools: a wave's requests and products by the precision that served them,
        and its demand bytes by pool."""
        n = len(self.shape.pools)
        requests_by, products_by = [0] * n, [0] * n
        per_expert = (np.bincount(ids[wave_active], minlength=self.shape.num_experts)
                      if wave_active.any() else None)
        for e, i in zip(chunk, served):
            requests_by[i] += 1
            if per_expert is not None:
                products_by[i] += int(per_expert[e])
        self.metrics.count_pools(pos, requests_by, products_by, demand)

    def _prefetch(self, gate: LayerGate, pos: int, pinned: set[Key], issue_at: float) -> None:
        """Admits the prefetch policy's predictions while a slot is free or evictable. What
        this call selected — admitted, or found already resident — is never a victim of the
        same call: a later (lower-priority) prediction must not push out an earlier one.
        With the watchdog queue the predictions are queued instead (`_enqueue`)."""
        if self.watchdog:
            self._enqueue(gate, pos, issue_at)
            return
        protected = set(pinned)
        full = False  # no device slot left for this call: its other predictions are read ahead
        for target, experts in self.prefetch.predict(gate):
            if target not in self.pos_of:
                continue
            experts = [int(e) for e in experts]
            self.predicted.setdefault((self.pass_id, target), set()).update(experts)
            if target in self.host_layers:  # computed on the host: never given a slot
                continue
            tpos = self.pos_of[target]
            for e in experts:
                key = (target, e)
                if key in self.residency:
                    if key not in self.fixed:
                        self.eviction.on_touch(key, pos)
                    protected.add(key)
                    continue
                if full:
                    self.host.read_ahead(key, pos, issue_at, self._host_evictable)
                    continue
                if self.host is not None and not self.host.can_take(key, pos,
                                                                    self._host_evictable):
                    continue  # no host slot for it either: this prediction does not go
                slot = self._allocate(pos, protected, key)
                if slot is None:  # no room: prefetch never blocks
                    if self.host is None:
                        return
                    full = True
                    self.host.read_ahead(key, pos, issue_at, self._host_evictable)
                    continue
                protected.add(key)
                self._admit(key, slot, issue_at, True, pos,
                            self._prefetch_bytes(key, pos, issue_at))
                self.prefetch_origin[key] = (self.pass_id, target)
                self.metrics.count_prefetch(tpos, self.shape.expert_bytes)

    # -- the watchdog prefetch queue -----------------------------------------------------------
    def _enqueue(self, gate: LayerGate, pos: int, now: float) -> None:
        """Queues this layer's predictions (best first, nearest target first, as the prefetch
        policy lists them), then lets the watchdog issue what it can now — after this layer's
        demand fetches, which were booked first."""
        queue, residency = self.queue, self.residency
        for target, experts in self.prefetch.predict(gate):
            if target not in self.pos_of:
                continue
            predicted = self.predicted.setdefault((self.pass_id, target), set())
            predicted.update(int(e) for e in experts)
            if target in self.host_layers:  # computed on the host: never queued for a slot
                continue
            for e in experts:
                key = (target, int(e))
                if key in residency:
                    if key not in self.fixed:
                        self.eviction.on_touch(key, pos)
                elif key not in queue:
                    queue[key] = (target, now)
                    if self.host is not None:  # its bytes are read ahead while it waits
                        self.host.read_ahead(key, pos, now, self._host_evictable)
        self._watchdog(now, False, self.running_pins)

    def _watchdog(self, now: float, strict: bool, pinned) -> None:
        """Issues queued prefetches, head first, while the eviction policy can give the head a
        slot, sparing `pinned` (the running wave; nothing between layers) and the prefetched
        experts whose target layer has not run. The head blocks the queue (FIFO).

        `watchdog` (the default): an entry goes at `now` — the moment space appears, since the
        cache changes only where this is called: after a wave's demand fetches were booked (a
        demand miss goes ahead of entries not yet issued) and when a layer's experts are done.
        Its transfer queues on the copy engines behind those in flight, demand fetches
        included, as a CUDA stream serialises its copies; a transfer on an engine is never
        pre-empted, so a later demand fetch waits behind it (`stall_behind_prefetch_s`).

        `watchdog_idle` (issue 10's rule, a named variant): the head also waits for an idle
        copy engine: it starts at `max(queued, engine free)`, no later than `now` (before
        `now` when `strict`, because a demand fetch booked at `now` goes first). Nothing
        happens to the cache between two calls, so issuing at an engine's free time in the past
        is what a watchdog polling continuously would have done."""
        queue, engine_free = self.queue, self.clock.engine_free
        protected = None
        while queue:
            key = next(iter(queue))
            target, queued_at = queue[key]
            if key in self.residency:
                del queue[key]
                continue
            issue = now
            if self.idle_engine_rule:
                issue = timeline.watchdog_issue_time(queued_at, engine_free)
                if not timeline.watchdog_may_issue(issue, now, strict):
                    return
            if protected is None:
                protected = set(pinned)
                protected.update(k for k, (p, t) in self.prefetch_origin.items()
                                 if p == self.pass_id and self.pos_of[t] > self.running_pos)
            if self.host is not None and not self.host.can_take(key, self.running_pos,
                                                                self._host_evictable):
                return  # no host slot until the running wave is done
            slot = self._allocate(self.running_pos, protected, key)
            if slot is None:
                return  # no room until the running layer or a prefetch target is done
            del queue[key]
            protected.add(key)
            self._admit(key, slot, issue, True, self.running_pos,
                        self._prefetch_bytes(key, self.running_pos, issue))
            self.prefetch_origin[key] = (self.pass_id, target)
            self.metrics.count_prefetch(self.pos_of[target], self.shape.expert_bytes)

    def _drop_queued(self, upto: int) -> None:
        """Drops the queued predictions whose target layer (position <= `upto`) has started."""
        pos_of, queue = self.pos_of, self.queue
        for key, (target, _) in list(queue.items()):
            tpos = pos_of[target]
            if tpos <= upto:
                del queue[key]
                self.metrics.count_prefetch_dropped(tpos)

    # -- the host tier, full layers and seeding ----------------------------------------------
    def _prefetch_bytes(self, key: Key, pos: int, at: float) -> float | None:
        """When a prefetch's bytes are in host memory (None without a host tier); asked after
        `HostTier.can_take` said yes and a device slot was taken."""
        if self.host is None:
            return None
        return self.host.bytes_ready(key, pos, at, self._host_evictable, True)

    def preload_host(self) -> tuple[list[Key], list[Key]]:
        """The host tier's reads before the first token (`HostTier.preload`): the experts on
        the device before the first pass that the host tier does not hold, then its seeded
        entries. The live runtime calls this when it loads them; replay at the first pass."""
        return self.host.preload(list(self.residency))

    def _host_evictable(self, key: Key) -> bool:
        """What the host tier may evict: anything but the running wave's experts."""
        return key not in self.running_pins

    def _reserve_full_layers(self, n: int) -> None:
        """ds4's full-layer placement: every expert of the first `n` MoE layers resident for
        the whole run in slots of their own, never evicted and never shown to the eviction
        policy; the other layers share the remaining slots."""
        shape = self.shape
        if self.multi:
            raise ConfigError("cache.full_layers needs a single precision pool")
        if not 0 < n <= len(shape.layers):
            raise ConfigError(f"cache.full_layers={n} must be in 0..{len(shape.layers)} (the "
                              "MoE layers)")
        reserved = n * shape.num_experts
        left = shape.num_slots - reserved
        if left < 0 or (n < len(shape.layers) and left < shape.top_k):
            raise ConfigError(
                f"cache.full_layers={n} reserves {reserved} of the {shape.num_slots} slots, "
                f"leaving {shape.num_slots - reserved} for the other layers, fewer than one "
                f"decode layer needs (top-k = {shape.top_k})")
        fixed = []
        for layer in shape.layers[:n]:
            for e in range(shape.num_experts):
                slot = self.free.pop()
                key = (layer, e)
                self.residency[key] = slot
                self.slot_key[slot] = key
                self.in_cache[layer].add(e)
                self.layer_changes[layer] += 1
                fixed.append(key)
        self.fixed = frozenset(fixed)
        self.wave_slots = max(shape.num_slots - reserved, 1)

    def _host_compute_layers(self, n) -> frozenset[int]:
        """The first `n` MoE layers (`cache.host_compute_layers`), computed on the host."""
        layers = self.shape.layers
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(layers):
            raise ConfigError(f"cache.host_compute_layers={n!r} must be an integer from 0 to "
                              f"{len(layers)} (the MoE layers whose experts always run on the "
                              "host)")
        return frozenset(layers[:n])

    def _check_host_compute(self, full_layers: int) -> None:
        """Host compute needs a host model and every expert in host memory, and is not ds4's
        full layers (both place the first layers, one on the device, one on the host)."""
        what = (f"miss policy {self.miss.name!r}" if self.miss.computes_on_host
                else f"cache.host_compute_layers={len(self.host_layers)}")
        if self.host_path is None:
            raise ConfigError(f"{what} computes experts on the host, which needs the host's "
                              "model and the model's shapes: name the model "
                              "(--config.model.family=F --config.model.preset=P)")
        if self.host is not None:
            raise ConfigError(f"{what} computes experts from host memory, so every expert "
                              "must be there: it needs cache.host_capacity_frac=1 and "
                              "cache.host_bytes=0 (no disk tier)")
        if full_layers and self.host_layers:
            raise ConfigError(f"cache.full_layers={full_layers} and cache.host_compute_layers="
                              f"{len(self.host_layers)} both place the first MoE layers (on "
                              "the device, on the host): set one")

    def seed(self, keys: list[Key], priorities: dict[Key, int] | None = None) -> int:
        """Seeds the device slots with `keys` (hottest first) before the first pass: resident
        and ready from the start (loaded before the first token, not counted as fetches), up
        to the free slots. `priorities` go to an eviction policy that takes them (`priority`):
        ds4's hotlist entries are priorities, not pins. Returns how many were placed."""
        if self.pass_id >= 0:
            raise AssertionError("seed the cache before its first pass")
        if priorities is not None and hasattr(self.eviction, "set_priorities"):
            self.eviction.set_priorities(priorities)
        chosen = [k for k in dict.fromkeys(keys) if k not in self.residency
                  and k[0] in self.pos_of and k[0] not in self.host_layers][:len(self.free)]
        # Coldest first: within one priority (and for a recency policy) the hottest is the
        # most recently admitted, so it goes last.
        for key in reversed(chosen):
            slot = self.free.pop()
            self.residency[key] = slot
            self.slot_key[slot] = key
            self.in_cache[key[0]].add(key[1])
            self.layer_changes[key[0]] += 1
            self.eviction.on_admit(key, 0, False)
        return len(chosen)

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
