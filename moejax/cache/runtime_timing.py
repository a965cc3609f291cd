"""The virtual clock of the live runtime: where a calibrated profile has the host's work
(`moejax.timing.host_work.HostWork`), a pass's time is what the live runtime on the wall clock
pays for it, step by step, on two timelines (`HostDeviceClock`): the host thread dispatches
every compiled step, reads gates back, decides and issues transfers; the device runs the steps
in order. DESIGN.md "The host's work in the virtual clock".

How the runtime runs a pass decides where the host waits for the device, so the model follows
its rules (`moejax.serving.runtime.CachedExperts`, the same `SpeculationSchedule`):

* **layer by layer** (prefill; decode when it does not speculate): per MoE layer, the router
  step, the gate read back (`round_trip_s`), the decision (`request_s` per request, `load_s`
  per load and `prefetch_s` per prefetch issued), the wait for the layer's transfers, its
  demand loads, its experts step, its prefetch loads;
* **speculative** (a decode pass, standard or a trace's routing, fetch, one pool, no watchdog,
  no disk tier, no host compute): each layer's router step and experts step dispatched on the
  residency the layer finds (`speculative_layer_s` each, its check included), checked once its
  gate has landed —
  mid-pass before the next layer's experts step, or at the end of the pass — as the wall-clock
  runtime checks: every expert it asked for still in the slot the step read, and landed when
  the step was dispatched. A failed check re-runs the pass from that layer (its gate already on
  the host), the layers after it dispatched again; past `speculation.RETRIES` the rest goes
  layer by layer and later passes back off;
* **complete** (every expert resident and landed, standard routing from the router, fetch, one
  pool, no queue): every step dispatched, the gates read back once after the pass, the
  decisions taken then.

Each compiled step is the profile's measured table for this model (`HostWork.tables`): its
dispatch on the host, its completion on the device. A step the table does not cover is charged the cost model's
roofline on the device (`counts["steps_roofline"]` says how many). The decisions themselves are
the cache's own, whatever the mode (a speculative pass decides as layer by layer does): only
when the host takes them, hence when transfers are issued, follows the mode.
"""

from __future__ import annotations

from typing import Iterator

from moejax.cache.speculation import SpeculationSchedule
from moejax.timing import TERMS, CostModel, HostDeviceClock, HostWork

MODES = ("layers", "speculative", "complete")
# A layer's own part of its pass: decided before its experts step ("layers"), checked after a
# speculative step ("checked"), decided after a failed check ("rerun": its gate is on the host,
# its router step ran), or decided after a complete pass ("complete").
LAYER_MODES = ("layers", "checked", "rerun", "complete")


class RuntimeTiming:
    """The cache's hooks (`ExpertCache` calls them where it charged the cost model before):
    `begin_pass`, `dense`, `layer`, `decided`, `served`, `experts`, `end_pass`. `trace_driven`:
    the run's routing is a trace's (`policies.routing='trace(...)'`: a replay of T is such a
    run), so a complete cache's passes are not deferred; `speculate`: `cache.speculate`."""

    def __init__(self, work: HostWork, cost: CostModel, *, trace_driven: bool,
                 speculate: bool = True, mid_pass_checks: str = "adaptive"):
        self.work, self.cost = work, cost
        self.tables = work.tables(cost.cfg)  # this model's measured steps ({}: none)
        self.trace_driven, self.speculate = trace_driven, speculate
        self.schedule = SpeculationSchedule(mid_pass_checks)
        self.counts = dict.fromkeys(
            ("steps_measured", "steps_roofline", "steps_extrapolated", "speculative_passes",
             "failed_checks", "failed_mid_pass", "complete_passes", "round_trips"), 0)
        self.mode = "layers"
        self._layer_mode = "layers"
        self._tokens = self._context = 0
        self._run: Iterator[int] | None = None  # the speculative run being checked
        self._mid = False  # its check now is a mid-pass one
        self._unchecked = 0
        self._ar_done: dict[int, float] = {}
        self._read: dict[int, tuple[dict[int, int], float]] = {}
        self._head_done = False
        self._pending_host = 0.0  # a complete pass's decisions, taken after it
        self._booked = (0, 0)  # the cache's demand and prefetch loads counted so far
        self._loads = [0, 0]  # loads to dispatch with the next experts step (demand, prefetch)
        # How many times each scalar term was charged in each pass (what a fit of the terms
        # to live runs reads: `moejax.calibration.host_fit`), and in the pass being run.
        self.pass_counts: list[dict[str, int]] = []
        self._counted = dict.fromkeys(TERMS, 0)

    @staticmethod
    def check_clock(clock) -> None:
        if not isinstance(clock, HostDeviceClock):
            raise TypeError(f"RuntimeTiming needs a HostDeviceClock, not {type(clock).__name__}")

    # -- what the runtime would choose -------------------------------------------------------
    def _complete(self, cache) -> bool:
        """`CachedExperts._can_defer`: every expert resident and landed, the router's selection
        passed through (standard, fetch), one pool, nothing queued."""
        if (self.trace_driven or cache.routing.name != "standard" or cache.miss.name != "fetch"
                or cache.multi or cache.queue
                or len(cache.residency) != cache.shape.total_experts):
            return False
        now = cache.clock.now()
        return all(t <= now for t in cache.slot_ready)

    def _may_speculate(self, cache) -> bool:
        """`CachedExperts._may_speculate`'s conditions but the schedule's."""
        return (self.speculate and cache.routing.name in ("standard", "trace")
                and cache.miss.name == "fetch" and not cache.multi and not cache.watchdog
                and cache.host is None and not cache.host_layers and bool(cache.residency))

    # -- steps -------------------------------------------------------------------------------
    def _step(self, clock: HostDeviceClock, kind: str, size: float, roofline_s: float,
              precision: str = "native") -> float:
        table = self.tables.get(f"experts:{precision}" if kind == "experts" else kind)
        measured = None
        if table is not None:
            measured = table.at(size)
            if measured is None and kind == "load":  # (a load has no roofline)
                measured = table.at(size, extrapolate=True)
                self.counts["steps_extrapolated"] += 1
        if measured is None:
            self.counts["steps_roofline"] += 1
            return clock.dispatch(0.0, roofline_s)
        self.counts["steps_measured"] += 1
        return clock.dispatch(*measured)

    def _attention(self, cache) -> float:
        tokens = self._tokens
        return self._step(cache.clock, "attention_router", tokens,
                          self.cost.attention_router(tokens, self._context,
                                                     cache.lookahead_scores))

    def _experts_step(self, cache, pairs: int, unique: int, tokens: int, shared: bool) -> None:
        self._step(cache.clock, "experts", tokens,
                   self.cost.experts(pairs, unique, tokens, shared), cache.shape.precision)

    def _load_steps(self, cache, n: int) -> None:
        """`n` slot loads dispatched: the runtime's work for each (`load_s`), then its step
        (the transfer itself is the link's, booked by the cache when it was issued)."""
        if not n:
            return
        self._charge(cache.clock, "load_batch_s")
        self._charge(cache.clock, "load_s", n)
        nbytes = cache.slot_bytes[0]
        for _ in range(n):
            self._step(cache.clock, "load", nbytes, 0.0)

    def _head(self, cache) -> None:
        self._step(cache.clock, "logits", self._tokens,
                   self.cost.embed_and_logits(self._tokens) / 2)
        self._head_done = True

    def _charge(self, clock: HostDeviceClock, term: str, n: int = 1) -> None:
        """The host works `n` times scalar term `term` (a complete pass's decisions: after the
        pass, `end_pass`)."""
        if not n:
            return
        self._counted[term] += n
        seconds = getattr(self.work, term) * n
        if self._layer_mode == "complete" and term != "round_trip_s":
            self._pending_host += seconds
        else:
            clock.host(seconds)

    def _round_trip(self, clock: HostDeviceClock, gate_ready: float) -> None:
        """A gate read to the host: wait for its router step, then the runtime's work around
        the decision."""
        clock.sync(gate_ready)
        self._charge(clock, "round_trip_s")
        self.counts["round_trips"] += 1

    # -- the cache's hooks ---------------------------------------------------------------------
    def begin_pass(self, cache, kind: str, tokens: int, context: int) -> None:
        clock = cache.clock
        self._tokens, self._context = tokens, context
        self._counted = dict.fromkeys(TERMS, 0)
        self._layer_mode = "layers"
        self._charge(clock, "pass_s")
        self._step(clock, "embed", tokens, self.cost.embed_and_logits(tokens) / 2)
        self._head_done = False
        self._pending_host = 0.0
        self._ar_done, self._read = {}, {}
        self._booked = tuple(cache.booked)
        self._loads = [0, 0]
        eager = self.schedule.checks_mid_pass(sum(cache.layer_changes.values()),
                                              self.counts["failed_checks"])
        self._run = None
        if self._complete(cache):
            self.mode = "complete"
            self.counts["complete_passes"] += 1
        elif tokens == 1 and self._may_speculate(cache) and self.schedule.may_start():
            self.mode = "speculative"
            self.schedule.start()
            self.counts["speculative_passes"] += 1
            self._run = self._events(cache, 0, eager)
        else:
            self.mode = "layers"

    def dense(self, cache, tokens: int, context: int) -> None:
        self._step(cache.clock, "dense_layer", tokens, self.cost.dense_layer(tokens, context))

    def layer(self, cache, gate, pos: int) -> None:
        """Before the cache decides MoE layer `pos`: the runtime brought to that decision."""
        if self.mode == "speculative" and self._run is not None:
            self._speculative(cache, gate, pos)
            return
        self._ar_done[pos] = self._attention(cache)
        if self.mode == "complete":
            self._layer_mode = "complete"
            return
        self._round_trip(cache.clock, self._ar_done[pos])
        self._layer_mode = "layers"

    def _speculative(self, cache, gate, pos: int) -> None:
        """The speculative run goes on until it checks `pos` (`_events`); the check reads the
        gate and holds, or fails and the pass re-runs from `pos`."""
        checked = next(self._run)
        if checked != pos:
            raise AssertionError(f"the speculative run checked position {checked} before "
                                 f"{pos}")
        self._layer_mode = "checked"
        if self._holds(cache, gate, pos):
            return
        self.counts["failed_checks"] += 1
        self.counts["failed_mid_pass"] += self._mid
        self._layer_mode = "rerun"
        eager = self.schedule.eager_after_failure
        self._run = self._events(cache, pos + 1, eager) if self.schedule.failed() else None
        self._head_done = False  # (a re-run dispatches the head again)

    def _holds(self, cache, gate, pos: int) -> bool:
        """`CachedExperts._check` on the wall clock (steps read slots only): every expert the
        layer asks for still in the slot its step read, and landed when that step went."""
        slots, dispatched = self._read[pos]
        residency, layer = cache.residency, gate.layer
        requested = set(gate.ids.ravel().tolist())
        if any(residency.get((layer, e), -1) != slots.get(e, -2) for e in requested):
            return False
        ready = cache.slot_ready
        return all(ready[slots[e]] <= dispatched for e in requested)

    def _events(self, cache, start: int, eager: bool) -> Iterator[int]:
        """The runtime's speculative run from MoE position `start` (`SteppedDecoder._layers`
        over `CachedExperts._speculative_wave`, then `end_pass`'s `_verify`): per layer its
        router step, then (`eager`) the checks of the layers before it whose gates have
        landed, then its speculative experts step; after the last, the head and the checks
        left, each waiting for its gate. Yields each position when it is checked."""
        clock = cache.clock
        layers = cache.shape.layers
        top_k = cache.shape.top_k
        self._unchecked = start
        for q in range(start, len(layers)):
            self._ar_done[q] = self._attention(cache)
            while eager and self._unchecked < q and self._ar_done[self._unchecked] <= clock.t:
                self._mid = True
                yield self._unchecked
                self._unchecked += 1
            self._charge(clock, "speculative_layer_s")
            self._read[q] = (cache.residency_of(layers[q]), clock.t)
            self._experts_step(cache, top_k, top_k, 1, True)
        self._head(cache)
        while self._unchecked < len(layers):
            clock.sync(self._ar_done[self._unchecked])
            self._mid = False
            yield self._unchecked
            self._unchecked += 1

    def decided(self, cache, requests: int) -> None:
        """The layer's requests are known (routing, miss policy)."""
        self._charge(cache.clock, "request_s", requests)

    def served(self, cache) -> None:
        """A wave was served and its prefetches issued, before its wait for transfers (which
        were booked when the wave began: this work overlaps them): the predictions' host work.
        The loads go with the experts step, after the wait, as the runtime dispatches them."""
        demand, prefetch = cache.booked[0] - self._booked[0], cache.booked[1] - self._booked[1]
        self._booked = tuple(cache.booked)
        if demand or prefetch:
            self._charge(cache.clock, "prefetch_s", prefetch)
            self._loads[0] += demand
            self._loads[1] += prefetch

    def experts(self, cache, pairs: int, unique: int, tokens: int, shared: bool) -> None:
        """A wave's experts step, after its wait for transfers: its demand loads before it,
        the prefetch loads after (the runtime's order), each a load step."""
        demand, prefetch = self._loads
        self._loads = [0, 0]
        mode = self._layer_mode
        if mode in ("layers", "rerun"):
            self._load_steps(cache, demand)
            self._experts_step(cache, pairs, unique, tokens, shared)
        elif mode == "complete":
            self._experts_step(cache, pairs, unique, tokens, shared)
        elif demand:  # ("checked": its step ran speculatively, on slots that held)
            raise AssertionError("a speculative layer whose check held fetched on demand")
        self._load_steps(cache, prefetch)

    def end_pass(self, cache) -> None:
        clock = cache.clock
        if self.mode == "complete":
            self._head(cache)
            if self._ar_done:  # the gates read back at once, the decisions then
                clock.sync(max(self._ar_done.values()))
            self._layer_mode = "layers"
            self._charge(clock, "round_trip_s")
            clock.host(self._pending_host)
            self.counts["round_trips"] += 1
        elif not self._head_done:
            self._head(cache)
        if self.mode == "speculative" and self._run is not None:
            for _ in self._run:  # (every layer is checked: nothing is left to run)
                raise AssertionError("a speculative run ended with a layer unchecked")
            self.schedule.held()
        self._run = None
        clock.sync()  # the next token, read back
        self.pass_counts.append(self._counted)

    def report(self) -> dict:
        """What the model charged, for results.json (`clocks.virtual.host_work`)."""
        return {"profile": self.work.name, "terms": self.work.terms(), **self.counts}
