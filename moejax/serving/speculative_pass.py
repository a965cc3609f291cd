"""Speculative passes of the live runtime: each layer on the residency it finds, checked once
its gate lands.

A decode pass may run every MoE layer's experts step on the slots the layer's resident experts
hold when the step is dispatched, without a host round trip per layer, and decide each layer
later on its own gate (`_check`): mid-pass once its router step has landed, or at the end of
the pass. A decision that serves what the step read passes; otherwise the pass is re-run from
that layer (`Rewind`). The rules of when to speculate and when to check mid-pass are
`moejax.cache.speculation.SpeculationSchedule`'s, which the virtual clock's model of this
runtime follows too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from moejax.cache import SpeculationSchedule
from moejax.models import as_pools
from moejax.seam import ExpertWave, GateOutputs, Rewind, Wave


class SpeculativePasses:
    """The speculative part of `CachedExperts` (`runtime.py`): when a pass speculates, its
    layers' steps on the residency they find, and their checks. It uses the runtime's cache
    (`_cache`), slot pools (`pool`), gate helpers (`_policy_arrays`, `_to_host`,
    `_layer_gate`, `_source_gate`, `_upload`, `_slot_map`) and loads (`_dispatch`, `_flush`)."""

    def _init_speculation(self) -> None:
        # Per layer: its resident experts' slots and slot map as a speculative step reads them,
        # with the cache's count of the layer's changes they were built at (`layer_changes`).
        self._resident_maps: dict[int, tuple[int, dict[int, int], object]] = {}
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
        self._spec: SpeculativeRun | None = None
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
            self._spec = SpeculativeRun() if self.schedule.failed() else None
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


def gate_landed(gate: GateOutputs) -> bool:
    """Whether the router step behind `gate` is done (its outputs land together)."""
    return gate.host_ids is not None or gate.ids.is_ready()


@dataclasses.dataclass
class SpeculativeRun:
    """A speculative run (a pass, or what a failed check re-runs of it): per MoE layer, its
    gate, the slots its experts step read (expert -> slot), on the wall clock when that step
    was dispatched (None on the virtual clock), and in a trace-driven run the trace's ids and
    weights it computed (None: the router's), in order; the first `checked` are decided."""

    layers: list[tuple[GateOutputs, dict[int, int], float | None,
                       tuple[np.ndarray, np.ndarray] | None]] = dataclasses.field(
        default_factory=list)
    checked: int = 0
