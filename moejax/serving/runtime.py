"""The live expert cache: an `ExpertSource` that runs the model with only `num_slots` experts
on the device.

* Host tier: per MoE layer and precision, `gate_up [E, H, 2I]` and `down [E, I, H]` in
  `pinned_host` memory — native arrays, or packed `QuantizedWeights` (values, scales, zeros).
* Device slot pools: one per precision the cache uses (`CacheShape.pools`), each
  `gate_up [S_p, H, 2I]`, `down [S_p, I, H]` in that precision's packed form, allocated once;
  their slots share one numbering (`SlotPools`). The experts step dequantizes inside the step.
* Slot loads (`slot_loads.py`, into `moejax.serving.slot_pool`) are queued as the cache issues
  them and dispatched together (`SlotPools.load_many`): a wave's before its experts step, the
  rest (prefetches) after it, so that they overlap the next layer's attention. They run
  asynchronously; the experts step that reads the pool is ordered after them by data
  dependency (copy_stream places them when a step reads their slots: `SlotPools.arrays`).
* A decode pass may speculate (`speculative_pass.py`): each layer's experts step on the slots
  its resident experts hold, decided once its gate lands.
* A pass over a complete cache (`deferred_decisions.py`) takes its decisions after it; `sync`
  (the end of `SteppedDecoder.generate`, reading `CachedExperts.cache`,
  `moejax.jobs.common.settle`) takes what is pending.
* Experts computed on the host run in a step over the host's copy (`host_compute_step.py`).
"""

from __future__ import annotations

from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from moejax.cache import ExpertCache
from moejax.seam import ExpertWave, GateOutputs, LayerGate, Wave
from moejax.serving.deferred_decisions import DeferredDecisions, DeferredPass
from moejax.serving.host_compute_step import HostComputeSteps
from moejax.serving.slot_loads import SlotLoads
from moejax.serving.slot_pool import SlotPools
from moejax.serving.speculative_pass import SpeculativePasses, SpeculativeRun


class CachedExperts(SlotLoads, SpeculativePasses, DeferredDecisions, HostComputeSteps):
    """`ExpertSource` backed by an `ExpertCache` and its `SlotPools`. Its parts, one module
    each: slot loads (`slot_loads.py`), speculative passes (`speculative_pass.py`), a complete
    cache's deferred decisions (`deferred_decisions.py`), host compute (`host_compute_step.py`);
    this class holds what they share and runs a layer (`experts_for`)."""

    def __init__(self, cache: ExpertCache, pool: SlotPools, num_experts: int, host_store=None):
        """`host_store`: the disk tier's `HostExperts` when the cache has a host tier."""
        self._cache, self.pool = cache, pool
        self.num_experts = num_experts
        self._init_slot_loads()
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
        self._init_host_compute()
        # Per layer: the slot map last built (`_upload`), reused while the layer's residency is
        # unchanged.
        self._slot_maps: dict[int, tuple[tuple, np.ndarray | jax.Array]] = {}
        self._init_deferred()
        self._init_speculation()

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

    # SlotSink

    # ExpertSource
    def begin_pass(self, tokens: int, position: int) -> None:
        self._sourced = {}
        if self._pending and self.defer_complete:
            # The pass before was complete, so this one is too (`_can_defer`: a complete
            # cache's decisions are all hits, it stays complete): run it on the same full slot
            # map and queue it, the cache's own `begin_pass` included.
            self._open = DeferredPass(tokens, position, False)
            return
        self.sync()
        self._cache.begin_pass("prefill" if position == 0 else "decode", tokens,
                               position + tokens)
        self._eager = self._checks_mid_pass()
        if self.defer_complete and self._can_defer():
            self._refresh_full_maps()
            self._open = DeferredPass(tokens, position, True)
        elif tokens == 1 and self._may_speculate():
            # Decode passes only: a prefill layer asks for most of its experts, so below a
            # complete cache its checks fail and the pass runs twice (25% warm: 35 ms TTFT
            # speculating against 24 layer by layer, `benchmarks/cache_runtime.py` part 2).
            self._spec = SpeculativeRun()
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
