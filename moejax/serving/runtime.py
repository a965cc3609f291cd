"""The live expert cache: an `ExpertSource` that runs the model with only `num_slots` experts
on the device.

* Host tier: per MoE layer and precision, `gate_up [E, H, 2I]` and `down [E, I, H]` in
  `pinned_host` memory — native arrays, or packed `QuantizedWeights` (values, scales, zeros).
* Device slot pools: one per precision the cache uses (`CacheShape.pools`), each
  `gate_up [S_p, H, 2I]`, `down [S_p, I, H]` in that precision's packed form, allocated once;
  their slots share one numbering (`SlotPools`). The experts step dequantizes inside the step.
* Slot loads (`moejax.serving.slot_pool`) are queued as the cache issues them and dispatched
  together (`SlotPools.load_many`): a wave's before its experts step, the rest after it. They
  run asynchronously; the experts step that reads the pool is ordered after them by data
  dependency (copy_stream places them when a step reads their slots: `SlotPools.arrays`).
* Prefetch loads are queued and dispatched after the current layer's experts step, so they
  overlap the next layer's attention instead of delaying this layer's experts.
* A pass over a complete cache (every expert resident and landed; standard routing, fetch)
  dispatches all its layers without a host round trip each and takes its decisions after it
  (`_can_defer`, `_decide_deferred`): they can only be hits, so they cannot change what a step
  reads, and the cache stays complete. On the virtual clock they are taken a pass late, while
  the device runs the next pass (`end_pass`); `sync` (the end of `SteppedDecoder.generate`,
  reading `CachedExperts.cache`, `moejax.jobs.common.settle`) takes what is pending. Counters
  and virtual times are those of deciding layer by layer.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from moejax.cache.expert_cache import ExpertCache
from moejax.cache.speculation import SpeculationSchedule
from moejax.models.experts import as_pools
from moejax.quant.weights import QuantizedWeights
from moejax.seam import ExpertWave, GateOutputs, Key, LayerGate, Rewind, Wave
from moejax.serving.slot_pool import SlotPools


class CachedExperts:
    """`ExpertSource` backed by an `ExpertCache` and its `SlotPools`."""

    def __init__(self, cache: ExpertCache, pool: SlotPools, num_experts: int, host_store=None):
        """`host_store`: the disk tier's `HostExperts` when the cache has a host tier."""
        self._cache, self.pool = cache, pool
        self.num_experts = num_experts
        self._queued: list[tuple[Key, int, bool]] = []  # (key, slot, prefetch), issue order
        self.host_store = host_store
        cache.sink = self
        if cache.host is None:  # full layers, a seed: before token 1
            self.pool.load_many(list(cache.residency.items()))
        else:
            self._preload()
        # Which gate outputs the policies read: the others never leave the device.
        self.needs_probs, self.needs_spec = cache.needs_scores()
        self._host_backend = jax.devices()[0].platform == "cpu"
        # What the policies see of a layer instead of the router's gate, when set: a function of
        # the router's `LayerGate` returning the one to decide on (a trace-driven run's recorded
        # gate). The experts step then runs the replaced selection, never the router's.
        self.gate_source: Callable[[LayerGate], LayerGate] | None = None
        # Its gates of the pass being run, per layer: the source is asked once per layer and
        # pass, in order (`moejax.traces.driven.TraceDriver`), and a layer a speculative pass
        # re-runs takes the gate it had (`_source_gate`).
        self._sourced: dict[int, LayerGate] = {}
        # This runtime computes a wave's host experts (`Wave.host_experts`: host compute) in
        # a step on the host (`_host_wave`, `moejax.models.stepped.host_experts_step`).
        self.computes_host_experts = self._host_backend
        self._identity = None
        self._host_views: dict[int, tuple] = {}
        # Per layer: the slot map last built (`_upload`), reused while the layer's residency is
        # unchanged.
        self._slot_maps: dict[int, tuple[tuple, np.ndarray | jax.Array]] = {}
        # Per layer: its resident experts' slots and slot map as a speculative step reads them,
        # with the cache's count of the layer's changes they were built at (`layer_changes`).
        self._resident_maps: dict[int, tuple[int, dict[int, int], object]] = {}
        # A complete cache's passes (`_can_defer`) run on a fixed full slot map and their
        # decisions are taken later: `_open` is the pass being run, `_pending` the passes run
        # whose decisions are not taken yet, oldest first (`end_pass`, `sync`).
        self.defer_complete = True
        self.pipeline_complete = True
        self._open: _DeferredPass | None = None
        self._pending: collections.deque[_DeferredPass] = collections.deque()
        self._full_maps: dict[int, tuple[np.ndarray, jax.Array]] = {}
        self.deferred_passes = 0
        # A speculative pass (`_may_speculate`) runs each layer's experts step on the slots
        # its experts hold when the step is dispatched, without waiting for its decision, and
        # checks and decides each layer once its gate has landed (`_check_pending`) or at the
        # end of the pass (`_verify`): `_spec` is the run being checked. `speculation_allowed`
        # is the decoder's say (no gate observer it would mislead). A failed check re-runs
        # the pass from the layer that failed, that layer decided first and the layers after
        # it speculating again, a few times a pass; past that the pass goes on layer by layer
        # and the next passes decide layer by layer: `schedule` keeps those rules
        # (`moejax.cache.speculation`, which the virtual clock's model of this runtime follows
        # too).
        self.speculate = True
        self.speculation_allowed = True
        self._spec: _SpeculativePass | None = None
        self.schedule = SpeculationSchedule()
        self.speculative_passes = 0
        self.speculation_misses = 0  # failed checks, those found mid-pass (`rewinds`) included
        # Of them, on the wall clock: a step read an expert whose emulated transfer had not
        # landed when the step was dispatched (`_check`).
        self.speculation_in_flight = 0
        self.rewinds = 0
        # Whether a gate's router step is done, asked before a speculative run checks the
        # layer mid-pass (never waiting for one there); replaceable (tests force both ways).
        self.gate_landed: Callable[[GateOutputs], bool] = gate_landed
        # When a speculative pass checks layers mid-pass (`MID_PASS_CHECKS`). A mid-pass check
        # pays off when a check may fail: the pass then stops before the rest of it is
        # dispatched in vain, and a layer's prefetches are in the slot maps of the layers after
        # it. When no check can be expected to fail, it only delays the next layers' dispatch
        # on the host thread, while the same checks at the end of the pass run beside the
        # device's last steps (100% from cold, steady passes: 1.23-1.36x resident checked
        # mid-pass against 1.15-1.20x at the end, `benchmarks/decision_cost.py` part 4).
        # "adaptive": mid-pass in a pass after one whose residency changed or whose check
        # failed, and in the rest of a pass once one of its checks failed. Where the checks
        # run never changes a decision (the decisions are deciding layer by layer's,
        # `tests/test_speculation.py`). `mid_pass_checks` (the schedule's) says which.
        self.eager_passes = 0  # speculative passes begun checking mid-pass
        # On the CPU backend and the virtual clock, a speculative step reads an expert that is
        # not resident when the step is dispatched from its host copy — the bytes its load
        # copies into a slot — instead of from a slot it does not hold (`_reads_host_copies`):
        # every expert the step reads is then its own, so a check fails only for a layer that
        # a decision would split into waves, not for each miss, eviction or prefetch (warm 25%
        # and 5%: 2.16x / 1.94x and 1.95x / 2.06x resident against 2.51x / 2.62x and 2.39x /
        # 2.57x reading slots only, two runs of `benchmarks/decision_cost.py` part 6).
        # `cache.speculate_from_host`.
        self.read_host_copies = True
        self._reads_host = False  # this speculative pass's
        self.host_copy_reads = 0  # experts speculative steps read from their host copy
        self._eager = True
        self._resume: tuple[GateOutputs, list] | None = None

    @property
    def mid_pass_checks(self) -> str:
        """Where a speculative pass checks its layers (`MID_PASS_CHECKS`)."""
        return self.schedule.mid_pass_checks

    @mid_pass_checks.setter
    def mid_pass_checks(self, mode: str) -> None:
        self.schedule.mid_pass_checks = mode

    def speculation_report(self) -> dict:
        """How this runtime's passes ran (results.json's `speculation`, the generate job):
        speculative passes, their failed checks (of them: a step read an expert still in flight
        on the wall clock; found mid-pass, so the rest of the pass was not dispatched), the
        passes that checked mid-pass, the experts their steps read from the host copy (not
        resident when the step was dispatched), and a complete cache's passes decided after
        them."""
        return {"speculative_passes": self.speculative_passes,
                "failed_checks": self.speculation_misses,
                "failed_in_flight": self.speculation_in_flight,
                "failed_mid_pass": self.rewinds,
                "checked_mid_pass": self.eager_passes,
                "host_copy_reads": self.host_copy_reads,
                "complete_cache_passes": self.deferred_passes}

    @property
    def cache(self) -> ExpertCache:
        """The expert cache with every finished pass's decisions taken (`sync`): whoever reads
        its metrics, clock or residency through the runtime sees them up to date."""
        if self._pending:
            self.sync()
        return self._cache

    @property
    def pending_passes(self) -> int:
        """Passes run whose decisions are not taken yet (a complete cache decides late)."""
        return len(self._pending)

    @property
    def cache_unsynced(self) -> ExpertCache:
        """The expert cache as it is, without taking the pending decisions first (to see what
        a pass has not decided yet; `cache` is what every reader should use)."""
        return self._cache

    def sync(self) -> None:
        """Takes the decisions of the passes still pending, in order. Called at the end of a
        generation (`SteppedDecoder.generate`, so its wall time includes them), by `cache`, and
        by the jobs before they report (`moejax.jobs.common.report_cache`)."""
        while self._pending:
            self._decide_deferred(self._pending.popleft())

    def _preload(self) -> None:
        """The disk tier's reads before the first token, as the host tier counts them
        (`HostTier.preload`): the experts on the device that the host tier does not hold, read
        for their loads in groups within the host bound and let go, then its seeded entries."""
        cache, store = self._cache, self.host_store
        cache.host.sink = store
        store.reclaim = self._reclaim
        start = time.perf_counter()
        transient, seeded = cache.preload_host()
        group = max(cache.host.capacity, 1)
        for i in range(0, len(transient), group):
            chunk = transient[i:i + group]
            for key in chunk:
                store.read(key)
            self.pool.load_many([(key, cache.residency[key]) for key in chunk])
            for key in chunk:
                store.drop(key)
            store.release_dropped()
        for key in seeded:
            store.read(key)
        self.pool.load_many([(key, slot) for key, slot in cache.residency.items()
                             if key not in transient])
        store.preload_s = time.perf_counter() - start

    # SlotSink
    def load(self, key: Key, slot: int, prefetch: bool) -> None:
        # Queued, demand loads too: a wave's loads go together before its experts step
        # (`experts_for`: one `load_many`), and with the disk tier every read the wave needs
        # is submitted before any load waits for one (`_dispatch`).
        self._queued.append((key, slot, prefetch))

    def _flush(self) -> None:
        """Dispatches every queued load."""
        self._dispatch(None, landed_only=False)

    def _reclaim(self) -> None:
        """The host store needs its dropped buffers back: dispatch the loads reading them."""
        dropped = self.host_store.dropped
        self._dispatch({s for k, s, _ in self._queued if k in dropped}, landed_only=False)

    def _dispatch(self, slots: set | None, landed_only: bool) -> None:
        """Dispatches the queued loads into `slots` (None: all), or with `landed_only` those
        whose reads have landed. Loads into one slot keep their order; across slots the one
        whose read lands first goes first (with the disk tier), so a load never waits for a
        read while another's bytes are ready. What is not dispatched stays queued."""
        store, queued = self.host_store, self._queued
        if landed_only:  # per slot, the loads up to the first whose read is still running
            stopped, chosen = set(), []
            for i, (key, slot, _) in enumerate(queued):
                if slot in stopped or not (store is None or store.landed(key)):
                    stopped.add(slot)
                else:
                    chosen.append(i)
        else:
            chosen = [i for i, (_, slot, _) in enumerate(queued) if slots is None or slot in slots]
        if chosen:
            go = [queued[i] for i in chosen]
            taken = set(chosen)
            self._queued = [x for i, x in enumerate(queued) if i not in taken]
            while go:
                if store is None:  # every load's bytes are in host memory: all at once
                    ready = list(range(len(go)))
                else:  # each slot's next load whose read has landed
                    heads = _slot_heads(go)
                    ready = [i for i in heads if store.landed(go[i][0])]
                    if not ready:
                        store.wait_any([go[i][0] for i in heads])
                        continue
                batch = [go[i] for i in ready]
                for i in sorted(ready, reverse=True):
                    go.pop(i)
                with jax.profiler.TraceAnnotation(
                        "cache/prefetch" if all(p for _, _, p in batch) else "cache/fetch"):
                    self.pool.load_many([(key, slot) for key, slot, _ in batch])
        if store is not None:  # every dropped entry no queued load reads goes
            store.release_dropped(k for k, _, _ in self._queued)

    # ExpertSource
    def begin_pass(self, tokens: int, position: int) -> None:
        self._sourced = {}
        if self._pending and self.defer_complete:
            # The pass before was complete, so this one is too (`_can_defer`: a complete
            # cache's decisions are all hits, it stays complete): run it on the same full slot
            # map and queue it, the cache's own `begin_pass` included.
            self._open = _DeferredPass(tokens, position, False)
            return
        self.sync()
        self._cache.begin_pass("prefill" if position == 0 else "decode", tokens,
                               position + tokens)
        self._eager = self._checks_mid_pass()
        if self.defer_complete and self._can_defer():
            self._refresh_full_maps()
            self._open = _DeferredPass(tokens, position, True)
        elif tokens == 1 and self._may_speculate():
            # Decode passes only: a prefill layer asks for most of its experts, so below a
            # complete cache its checks fail and the pass runs twice (25% warm: 35 ms TTFT
            # speculating against 24 layer by layer, `benchmarks/cache_runtime.py` part 2).
            self._spec = _SpeculativePass()
            self.schedule.start()
            self._reads_host = self._reads_host_copies()
            self.speculative_passes += 1
            self.eager_passes += self._eager

    def end_pass(self) -> int | None:
        """Ends the pass; returns None, or after a speculative pass whose check failed at an
        MoE layer, that layer: the decoder re-runs the pass from its experts step (the layers
        before it were checked and decided; this pass now decides layer by layer) and calls
        `end_pass` again."""
        if self._spec is not None:
            return self._verify()
        done, self._open = self._open, None
        if done is None:
            self._flush()
            self._cache.end_pass()
            return None
        self._pending.append(done)
        # Pipelined (`_pipelines`), the decisions of the pass before this one are taken now,
        # while the device runs this pass (dispatched, not finished), instead of between the
        # two passes on the host's critical path; this pass's wait for the next `end_pass` or
        # `sync`, so at most one pass is pending. (A worker thread deciding the pending passes
        # measured slower here: it contends for the interpreter with the dispatching thread,
        # 1.53-1.62x resident against 1.15-1.41x for this, both under load.)
        keep = 1 if self._pipelines() else 0
        while len(self._pending) > keep:
            self._decide_deferred(self._pending.popleft())
        return None

    # -- speculation: each layer on the residency it finds, checked once its gate lands -------
    def _may_speculate(self) -> bool:
        """Whether this pass may run each layer's experts step on the experts of that layer
        resident when the step is dispatched, without a host round trip per layer, and decide
        the layer later (`_check`). Its decisions are then the same as layer by layer (same
        gates, same order), and a layer whose decision would read other slots than the step
        did is re-run from there. That holds when a decision that finds every requested expert
        resident keeps the router's selection and serves it in one wave from the slots it
        sits in: standard routing (or a trace-driven run's, whose selection is the trace's,
        known on the host when the step is dispatched; its check still waits for the router's
        step, the round trip a run of the router makes), fetch, one slot pool, no watchdog
        queue (it may issue a layer's transfers out of order), no disk tier (its loads wait for
        reads) and no layer computed on the host.

        On the virtual clock the times are the cost model's whenever the decisions are taken,
        so every number is deciding layer by layer's. The wall clock times a decision when it
        is taken: there a step may read only experts whose emulated transfers had landed when
        it was dispatched (deciding layer by layer would have waited for them first; `_check`
        fails the layer otherwise), and a layer's prefetches are issued when it is decided,
        after the steps dispatched before — what this runtime does, timed as it does it."""
        c = self._cache
        routing = "standard" if self.gate_source is None else "trace"
        if not (self.speculate and self.speculation_allowed) or c.routing.name != routing \
                or c.miss.name != "fetch" or c.multi \
                or c.watchdog or c.host is not None or c.host_layers \
                or getattr(c.clock, "kind", None) not in ("virtual", "wall") or not c.residency:
            return False
        return self.schedule.may_start()

    def _checks_mid_pass(self) -> bool:
        """Whether the pass beginning now checks its layers mid-pass (`mid_pass_checks`)."""
        # Reading host copies, a residency change fails no check (`_check`): only failed
        # checks make the next pass check mid-pass.
        changes = 0 if self._reads_host_copies() else sum(self._cache.layer_changes.values())
        return self.schedule.checks_mid_pass(changes, self.speculation_misses)

    def _speculative_wave(self, gate: GateOutputs) -> ExpertWave:
        """The experts step of `gate.layer` on the router's own selection and the slots the
        layer's resident experts hold now; a non-resident expert reads its host copy when the
        pass reads them (`_reads_host_copies`), else slot 0 (the check rejects any step that
        used one). First the run's earlier layers whose gates have landed are checked and
        decided (`_check_pending`): a failed check stops the pass here (`Rewind`) instead of
        after the rest of it was dispatched in vain."""
        failed = self._check_pending(wait=False) if self._eager else None
        if failed is not None:
            self.rewinds += 1
            raise Rewind(failed)
        layer = gate.layer
        changes = self._cache.layer_changes[layer]
        held = self._resident_maps.get(layer)
        if held is None or held[0] != changes or (self._reads_host and held[3] is None):
            # (the layer's residency changed since, or its host-copy map was not built)
            slot_of = self._cache.residency_of(layer)
            held = self._resident_maps[layer] = (
                changes, slot_of, self._slot_map(Wave(layer, slot_of, None, None, None, True)),
                self._host_slot_map(slot_of) if self._reads_host else None)
        _, slot_of, slot_map, host_map = held
        if not self._reads_host:  # this pass reads slots only
            host_map = None
        # The wall clock: when the step reads its experts (`_check` holds it to their landing).
        clock = self._cache.clock
        dispatched = clock.now() if clock.kind == "wall" else None
        if self.gate_source is None:  # the router's own selection, on the device
            ran = None
            ids, weights = gate.ids, gate.weights
        else:  # the trace's, known on the host before the router's step lands
            traced = self._source_gate(gate.layer, gate.ids)
            ids, weights = self._cache.routing.select(traced, self._cache.in_cache[layer])
            ran = (np.asarray(ids, np.int32), np.asarray(weights, np.float32))
            ids, weights = (self._upload(a) for a in ran)
        self._spec.layers.append((gate, slot_of, dispatched, ran))
        gate_up, down = self.pool.arrays()
        if host_map is not None:  # the slot pool, then the layer's host tables as a pool
            host_gate_up, host_down = self._host_tables(layer)
            gate_up = as_pools(gate_up) + as_pools(host_gate_up)
            down = as_pools(down) + as_pools(host_down)
            slot_map = host_map
        return ExpertWave(gate_up, down, slot_map, ids, weights, True)

    def _reads_host_copies(self) -> bool:
        """Whether a speculative step may read a non-resident expert from its host copy: the
        device is the host (the CPU backend: `_host_tables` views the `pinned_host` tables'
        own bytes, no copy), the clock is virtual (the wall clock must see a step wait for its
        transfer), and the one pool is loaded from those tables (fused; no disk tier) at their
        precision. The step then computes what the decision's wave computes, bit for bit (a
        live cache keeps a wave's experts resident together: pin_scope "layer")."""
        pools = self.pool.pools
        return (self.read_host_copies and self._host_backend
                and getattr(self._cache.clock, "kind", None) == "virtual"
                and len(pools) == 1 and pools[0].load_path == "fused"
                and pools[0].host_store is None)

    def _host_slot_map(self, slot_of: dict[int, int]):
        """A layer's slot map for a step over its slot pool and then its host tables: a
        resident expert's slot, else the host table's row (after the pool's slots)."""
        base = self.pool.pools[0].num_slots
        return self._upload(np.asarray([slot_of.get(e, base + e)
                                        for e in range(self.num_experts)], np.int32))

    def _check_pending(self, wait: bool) -> int | None:
        """Checks and decides the speculative run's layers not checked yet (`_check`), in
        order: all of them, waiting for each gate (`wait`), or while their router steps are
        done, never waiting for one (mid-pass). Returns the layer whose check failed, or
        None."""
        spec = self._spec
        while spec.checked < len(spec.layers):
            gate, slot_of, dispatched, ran = spec.layers[spec.checked]
            if not wait and not self.gate_landed(gate):
                return None
            failed = self._check(gate, slot_of, dispatched, ran)
            if failed is not None:
                return failed
            spec.checked += 1
        return None

    def _verify(self) -> int | None:
        """The end of a speculative run: checks and decides its layers not checked yet,
        waiting for each gate; then the pass ends as layer by layer. Returns None, or the
        layer whose check failed (the decoder re-runs from it)."""
        failed = self._check_pending(wait=True)
        if failed is not None:
            return failed
        self._spec = None
        self.schedule.held()
        self._flush()
        self._cache.end_pass()
        return None

    def _check(self, gate: GateOutputs, slot_of: dict[int, int], dispatched: float | None,
               ran: tuple[np.ndarray, np.ndarray] | None) -> int | None:
        """Decides a speculative step's layer on its own gate if the decision serves what the
        step computed: one wave of the router's selection (or in a trace-driven run `ran`,
        the trace's ids and weights the step computed) with each expert's own weights. The
        step read them if every expert it requested still holds the slot the step read (and on
        the wall clock, `dispatched` the time the step was dispatched, had landed by then) —
        or, reading host copies (`_reads_host_copies`), always: each expert was read from the
        slot holding it when the step was dispatched (a later load into that slot is ordered
        after the step) or from its host copy, so there only a layer the decision splits into
        waves fails. Then the decision is taken as if layer by layer. Otherwise nothing of
        it is decided and the layer is returned: the decoder re-runs the pass from there, that
        layer decided first (`_resume`), the layers after it speculating again on the
        residency they then find — or, past `speculation.RETRIES` failed checks in the pass,
        deciding layer by layer."""
        got = self._to_host(self._policy_arrays(gate))
        host = self._layer_gate(gate, got)
        residency, layer = self._cache.residency, gate.layer
        requested = set(host.ids.ravel().tolist())
        read_host = self._reads_host
        if read_host:  # one wave for the layer's requests (`ExpertCache.run_layer`)
            moved = len(requested) > self._cache.wave_slots
        else:
            moved = any(residency.get((layer, e), -1) != slot_of.get(e, -2) for e in requested)
        in_flight = not moved and dispatched is not None and any(
            self._cache.slot_ready[slot_of[e]] > dispatched for e in requested)
        if moved or in_flight:
            self.speculation_misses += 1
            self.speculation_in_flight += in_flight
            self._eager = self.schedule.eager_after_failure
            self._resume = (gate, got)
            self._spec = _SpeculativePass() if self.schedule.failed() else None
            return layer
        waves = list(self._cache.run_layer(host))
        wave = waves[0]
        if ran is None:
            same = wave.ids is host.ids
        else:  # a trace-driven step computed what the decision serves, bit for bit
            same = np.array_equal(wave.ids, ran[0]) and np.array_equal(
                np.asarray(wave.weights, np.float32), ran[1])
        if read_host:  # every requested expert in the wave (read from a slot or its copy)
            served = set(wave.slot_of) == requested
            self.host_copy_reads += len(requested - slot_of.keys())
        else:  # from the slots the step read
            served = all(slot_of.get(e) == s for e, s in wave.slot_of.items())
        if len(waves) != 1 or not wave.active.all() or not same or not served:
            raise AssertionError(f"layer {layer}: a speculative step's check passed but its "
                                 "decision served other experts or slots")
        if self._queued:  # its prefetches, as after its step
            self._dispatch(None, landed_only=False)
        return None

    # -- a complete cache: decisions after the pass ------------------------------------------
    def _can_defer(self) -> bool:
        """Whether this pass's decisions cannot change what its experts steps read, so they can
        be taken after the pass in one host round trip instead of one per layer: every expert
        is resident and landed (a request can only hit, so nothing is fetched, evicted or
        prefetched), and the policies pass the router's selection through unchanged (standard
        routing, fetch) over one slot pool. All of this still holds after such a pass (hits
        change no residency, the clock only moves on), which `begin_pass` relies on for the
        passes it queues behind a pending one."""
        c = self._cache
        if (self.gate_source is not None or c.routing.name != "standard"
                or c.miss.name != "fetch" or c.multi or c.queue
                or len(c.residency) != c.shape.total_experts):
            return False
        now = c.clock.now()
        return all(t <= now for t in c.slot_ready)

    def _pipelines(self) -> bool:
        """Whether a complete pass's decisions may wait until the next pass ran. Only on the
        virtual clock: its times are the cost model's, whenever the decisions are taken, while
        a wall clock would time the passes at their decisions (one pass late)."""
        return self.pipeline_complete and getattr(self._cache.clock, "kind", None) == "virtual"

    def _refresh_full_maps(self) -> None:
        """Every expert's slot per layer as the experts step reads it, built when a run of
        complete passes starts (the residency is fixed while it lasts); a layer's device map is
        reused while its slots are unchanged."""
        residency = self._cache.residency
        for layer in self._cache.shape.layers:
            slot_of = np.asarray([residency[(layer, e)] for e in range(self.num_experts)],
                                 np.int32)
            cached = self._full_maps.get(layer)
            if cached is None or not np.array_equal(cached[0], slot_of):
                self._full_maps[layer] = (slot_of, jnp.asarray(slot_of))

    def _decide_deferred(self, done: "_DeferredPass") -> None:
        """Takes a run pass's decisions: the cache's `begin_pass` (unless taken when the pass
        began), every layer in order on one host copy of its gates, `end_pass`; checking each
        is what the pass computed with: one wave, all hits, nothing loaded."""
        cache = self._cache
        if not done.begun:
            cache.begin_pass("prefill" if done.position == 0 else "decode", done.tokens,
                             done.position + done.tokens)
        loads = self.pool.loads
        gates = done.gates
        for gate, got in zip(gates, self._to_host([self._policy_arrays(g) for g in gates])):
            host = self._layer_gate(gate, got)
            waves = list(cache.run_layer(host))
            if len(waves) != 1 or self.pool.loads != loads or self._queued:
                raise AssertionError(f"layer {gate.layer}: a complete cache's decision fetched "
                                     "or split the layer after its experts step ran")
        self._flush()
        cache.end_pass()
        self.deferred_passes += 1

    def _to_host(self, arrays: list) -> list:
        """Host copies of (lists of) gate arrays. On the CPU backend a device buffer is host
        memory and `np.asarray` reads it in a few µs, while `jax.device_get` first starts an
        asynchronous copy per leaf (~6x the time here: 0.4 ms of a complete pass's 1.1 ms of
        decisions); on an accelerator those batched copies save round trips."""
        if not self._host_backend:
            return jax.device_get(arrays)
        return [self._to_host(a) if isinstance(a, list) else np.asarray(a) for a in arrays]

    def _policy_arrays(self, gate: GateOutputs) -> list:
        """What the policies read of a gate (ids, weights, and probs / spec when needed), for
        one `device_get` (host arrays, from the io_callback gate path, pass through)."""
        wanted = [gate.ids if gate.host_ids is None else gate.host_ids,
                  gate.weights if gate.host_weights is None else gate.host_weights]
        if self.gate_source is not None:  # the policies read the trace's gate: the round trip
            return wanted[:1]  # stays (as with the router's), but only the ids make it
        if self.needs_probs:
            wanted.append(gate.probs)
        if self.needs_spec:
            wanted.append(gate.spec)
        return wanted

    def _layer_gate(self, gate: GateOutputs, got: list) -> LayerGate:
        if self.gate_source is not None:  # `got` is the router's ids alone
            return self._source_gate(gate.layer, got[0])
        spec = got[-1][: len(gate.spec_layers)] if self.needs_spec else None
        return LayerGate(gate.layer, got[0], got[1], got[2] if self.needs_probs else None, spec,
                         gate.spec_layers)

    def _source_gate(self, layer: int, routed_ids) -> LayerGate:
        """`gate_source`'s gate of `layer` in the pass being run: asked once (with the router's
        ids, host or device: the source reads their shape), then the same gate for a re-run."""
        sourced = self._sourced.get(layer)
        if sourced is None:
            sourced = self._sourced[layer] = self.gate_source(
                LayerGate(layer, routed_ids, None, None))
        return sourced

    def experts_for(self, gate: GateOutputs) -> Iterator[ExpertWave]:
        if self._open is not None:  # every expert resident: decide after the pass
            self._open.gates.append(gate)
            gate_up, down = self.pool.arrays()
            yield ExpertWave(gate_up, down, self._full_maps[gate.layer][1], gate.ids,
                             gate.weights, True)
            return
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] is gate:  # the layer a failed check stopped at
            got = resume[1]
        elif self._spec is not None:  # on the slots its experts hold now: checked later
            yield self._speculative_wave(gate)
            return
        else:  # one host round trip for what the policies read
            got = self._to_host(self._policy_arrays(gate))
        host = self._layer_gate(gate, got)
        routed = self.gate_source is None  # the device gate holds what the policies saw
        for wave in self._cache.run_layer(host):
            unchanged = routed and wave.ids is host.ids and wave.active.all()
            ids = gate.ids if unchanged else self._upload(np.asarray(wave.ids, np.int32))
            if wave.host_experts:  # before the device's waves: it reads no slot
                yield self._host_wave(wave, ids)
            weights = gate.weights if unchanged and wave.weights is host.weights else \
                self._upload(np.where(wave.active, wave.weights, 0.0).astype(np.float32))
            if self._queued:
                used = set(wave.slot_of.values())
                if not used.isdisjoint(s for _, s, _ in self._queued):
                    # Its demand fetches, and a prefetch this wave uses (the watchdog sends
                    # transfers for the running layer): they land before the step reads them.
                    self._dispatch(used, landed_only=False)
            # copy_stream: the loads into the slots this wave reads are placed now, the others
            # when a step reads them (their transfers keep running behind this step).
            gate_up, down = self.pool.arrays(wave.slot_of.values())
            yield ExpertWave(gate_up, down, self._slot_map(wave), ids, weights, wave.last)
            # Prefetches go after this wave's experts step was dispatched; with the disk tier
            # only those whose reads have landed (the rest wait for a later wave or the pass
            # end: compute waits only for what it uses).
            self._dispatch(None, landed_only=self.host_store is not None)

    def _host_wave(self, wave: Wave, ids) -> ExpertWave:
        """The step computing `wave.host_experts` from the host's copy, before the device's
        waves: a wave over the layer's host tables at the plain precision (every expert, so
        the identity slot map) with the host's contributions only (`host_active`), its
        outputs joining the device waves' as a wave's partial outputs do."""
        gate_up, down = self._host_tables(wave.layer)
        if self._identity is None:
            self._identity = self._upload(np.arange(self.num_experts, dtype=np.int32))
        weights = np.where(wave.host_active, wave.weights, 0.0).astype(np.float32)
        return ExpertWave(gate_up, down, self._identity, ids, self._upload(weights), False)

    def _host_tables(self, layer: int) -> tuple:
        """The host's copy of `layer`'s experts as a step reads them. On the CPU backend the
        device is the host: the `pinned_host` tables' own bytes, viewed as device arrays (no
        copy, no slot), so the host computes the experts where their weights are, with the
        experts step's own function (bit for bit the device's). On an accelerator the step
        would have to run under `compute_on("device_host")`, whose memory-space typing (JAX
        0.10) refuses the grouped matmul's gathers: `_check_host_compute` refuses it there."""
        tables = self._host_views.get(layer)
        if tables is None:
            pool = self.pool.pools[0]  # the plain precision's (host compute: no disk tier)
            on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0],
                                                          memory_kind="device")
            view = functools.partial(_alias, sharding=on_device)
            gate_up = jax.tree.map(view, pool.host_gate_up[layer])
            down = jax.tree.map(view, pool.host_down[layer])
            if isinstance(gate_up, QuantizedWeights):  # as the step reads a packed pool
                gate_up, down = (gate_up,), (down,)
            tables = self._host_views[layer] = (gate_up, down)
        return tables

    def _upload(self, array: np.ndarray):
        """A host array as an experts step's argument. On the CPU backend the numpy array
        itself: the jitted step takes it in a few µs, against 30-60 µs for a `jnp.asarray`
        (per layer at a partial capacity: the slot map and any changed ids / weights)."""
        return array if self._host_backend else jnp.asarray(array)

    def _slot_map(self, wave: Wave):
        signature = tuple(sorted(wave.slot_of.items()))
        cached = self._slot_maps.get(wave.layer)
        if cached is not None and cached[0] == signature:
            return cached[1]
        slot_of = np.zeros(self.num_experts, np.int32)
        for e, slot in wave.slot_of.items():
            slot_of[e] = slot
        device = self._upload(slot_of)
        self._slot_maps[wave.layer] = (signature, device)
        return device




def _alias(host_array: jax.Array, sharding) -> jax.Array:
    """A CPU-backend `pinned_host` array as a device array over the same bytes (numpy's view
    of it, put on the device without a copy: checked)."""
    view = jax.device_put(np.asarray(host_array), sharding)
    if view.unsafe_buffer_pointer() != host_array.unsafe_buffer_pointer():
        raise AssertionError("the host table's device view is a copy, not its bytes")
    return view


def _slot_heads(loads: list[tuple[Key, int, bool]]) -> list[int]:
    """The index of each slot's first load in `loads` (later ones into a slot must wait)."""
    seen, heads = set(), []
    for i, (_, slot, _) in enumerate(loads):
        if slot not in seen:
            seen.add(slot)
            heads.append(i)
    return heads


def gate_landed(gate: GateOutputs) -> bool:
    """Whether the router step behind `gate` is done (its outputs land together)."""
    return gate.host_ids is not None or gate.ids.is_ready()


@dataclasses.dataclass
class _SpeculativePass:
    """A speculative run (a pass, or what a failed check re-runs of it): per MoE layer, its
    gate, the slots its experts step read (expert -> slot), on the wall clock when that step
    was dispatched (None on the virtual clock), and in a trace-driven run the trace's ids and
    weights it computed (None: the router's), in order; the first `checked` are decided."""

    layers: list[tuple[GateOutputs, dict[int, int], float | None,
                       tuple[np.ndarray, np.ndarray] | None]] = dataclasses.field(
        default_factory=list)
    checked: int = 0


@dataclasses.dataclass
class _DeferredPass:
    """A complete cache's pass whose decisions are not taken yet: its tokens and position, its
    gates in layer order, and whether the cache's `begin_pass` was taken when it began (the
    first of a run of complete passes: that is when `_can_defer` was asked)."""

    tokens: int
    position: int
    begun: bool
    gates: list[GateOutputs] = dataclasses.field(default_factory=list)
