"""A complete cache's passes: run on a fixed full slot map, their decisions taken after them.

A pass over a complete cache (every expert resident and landed; standard routing, fetch, one
pool) dispatches all its layers without a host round trip each and takes its decisions after
it: they can only be hits, so they cannot change what a step reads, and the cache stays
complete. On the virtual clock they are taken a pass late, while the device runs the next pass
(`CachedExperts.end_pass`); `sync` takes what is pending. Counters and virtual times are those
of deciding layer by layer.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax.seam import GateOutputs


class DeferredDecisions:
    """The complete-cache part of `CachedExperts` (`runtime.py`): whether a pass may decide
    after it, its full slot maps, and its decisions taken. It uses the runtime's cache
    (`_cache`), slot pools (`pool`), gate helpers (`_policy_arrays`, `_to_host`, `_layer_gate`)
    and loads (`_queued`, `_flush`)."""

    def _init_deferred(self) -> None:
        # A complete cache's passes (`_can_defer`) run on a fixed full slot map and their
        # decisions are taken later: `_open` is the pass being run, `_pending` the passes run
        # whose decisions are not taken yet, oldest first (`end_pass`, `sync`).
        self.defer_complete = True
        self.pipeline_complete = True
        self._open: DeferredPass | None = None
        self._pending: collections.deque[DeferredPass] = collections.deque()
        self._full_maps: dict[int, tuple[np.ndarray, jax.Array]] = {}
        self.deferred_passes = 0

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

    def _decide_deferred(self, done: "DeferredPass") -> None:
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


@dataclasses.dataclass
class DeferredPass:
    """A complete cache's pass whose decisions are not taken yet: its tokens and position, its
    gates in layer order, and whether the cache's `begin_pass` was taken when it began (the
    first of a run of complete passes: that is when `_can_defer` was asked)."""

    tokens: int
    position: int
    begun: bool
    gates: list[GateOutputs] = dataclasses.field(default_factory=list)
