"""Trace replay: drives the very same `ExpertCache`, policies and clock the live runtime uses
from recorded gate outputs instead of a model (DESIGN.md: one policy code path).

Passes are replayed in order; a trace's first `prefill_passes` passes are prefill, the rest
decode steps. A file holding several sequences (a vLLM log's problems) is replayed sequence
after sequence through one cache, as a server would see them.

Replay-only policies (Belady eviction, oracle prefetch) see the future through `Future`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from moejax.cache import fast_replay
from moejax.cache.cache import ExpertCache
from moejax.config import ConfigError
from moejax.seam import Key, LayerGate, requests_in_rank_order
from moejax.traces.format import Trace

ENGINES = ("auto", "reference")


@dataclasses.dataclass
class Future:
    """The requests of a replay known in advance (the router's own choices): per global pass
    (sequences concatenated) and MoE layer position, the experts in router-rank order."""

    passes: list[list[list[int]]]  # [global pass][layer position] -> experts
    layers: list[int]  # MoE layer index of each position

    def __post_init__(self):
        self._index = {layer: pos for pos, layer in enumerate(self.layers)}

    @functools.cached_property
    def _clock(self) -> tuple[list[list[int]], dict[Key, list[int]]]:
        """The global request clock (pass -> layer -> router rank): each pass-layer's first
        request index, and each key's request indices (what Belady reads; built when first
        asked, as oracle prefetch does not need it)."""
        layer_start: list[list[int]] = []
        uses: dict[Key, list[int]] = {}
        t = 0
        for passes in self.passes:
            starts = []
            for pos, experts in enumerate(passes):
                starts.append(t)
                for e in experts:
                    uses.setdefault((self.layers[pos], e), []).append(t)
                    t += 1
            layer_start.append(starts)
        return layer_start, uses

    @property
    def layer_start(self) -> list[list[int]]:
        return self._clock[0]

    @property
    def uses(self) -> dict[Key, list[int]]:
        return self._clock[1]

    def requests(self, pass_id: int, layer: int) -> list[int]:
        if pass_id >= len(self.passes):
            return []
        return self.passes[pass_id][self._index[layer]]


def future_of(traces: list[Trace]) -> Future:
    passes = []
    for trace in traces:
        for p in range(trace.num_passes):
            rows = trace.ids[trace.pass_rows(p)]
            passes.append([requests_in_rank_order(rows[:, i]) for i in range(rows.shape[1])])
    return Future(passes, list(traces[0].layers))


def future_of_requests(experts: np.ndarray, starts: np.ndarray, layers: list[int]) -> Future:
    """The `Future` of requests already flattened in rank order (`experts[starts[i]:
    starts[i + 1]]` is pass-layer i, passes of `len(layers)` pass-layers each), as the compiled
    engine holds them: the same lists `future_of` builds."""
    per = np.split(experts, starts[1:-1]) if len(starts) > 2 else [experts]
    per = [x.tolist() for x in per]
    n = len(layers)
    return Future([per[i:i + n] for i in range(0, len(per), n)], list(layers))


def layer_gates(trace: Trace, p: int) -> list[LayerGate]:
    """The `LayerGate`s of pass `p`, exactly as the live runtime built them."""
    rows = trace.pass_rows(p)
    layers = trace.layers
    lookahead = int(trace.meta.get("lookahead", 0))
    gates = []
    for i, layer in enumerate(layers):
        spec_layers = tuple(layers[i + 1:i + 1 + lookahead])
        spec = None
        if trace.spec is not None:
            spec = np.ascontiguousarray(
                np.moveaxis(trace.spec[rows, i, :len(spec_layers)], 1, 0))
        gates.append(LayerGate(
            layer, trace.ids[rows, i],
            None if trace.weights is None else trace.weights[rows, i],
            None if trace.probs is None else trace.probs[rows, i], spec, spec_layers))
    return gates


def replay(cache: ExpertCache, traces: list[Trace], context_start: list[int] | None = None,
           progress=None, engine: str = "auto") -> str:
    """Replays `traces` through `cache` (then `cache.finish()`). `context_start[i]`: tokens
    already in context before sequence i's first pass (capture traces start after a prompt
    that is not in the file). `engine`: "auto" takes the compiled path
    (`moejax/cache/fast_replay.py`) where it applies, "reference" always runs the policy
    objects request by request. Returns the engine that ran: "compiled" or "reference"."""
    if engine not in ENGINES:
        raise ConfigError(f"cache.replay_engine={engine!r} is not one of {ENGINES}")
    if engine == "auto" and fast_replay.applicable(cache) is None:
        fast_replay.run(cache, traces, context_start)
        if progress is not None:
            progress(sum(t.num_passes for t in traces))
        return "compiled"
    future = None
    for policy in (cache.eviction, cache.prefetch, cache.miss, cache.routing):
        if policy.needs_future:
            future = future or future_of(traces)
            policy.set_future(future, cache)
    for s, trace in enumerate(traces):
        context = context_start[s] if context_start else 0
        for p in range(trace.num_passes):
            gates = layer_gates(trace, p)
            tokens = len(gates[0].ids)
            context += tokens
            kind = "prefill" if p < trace.prefill_passes else "decode"
            cache.begin_pass(kind, tokens, context)
            for gate in gates:
                for _ in cache.run_layer(gate):
                    pass
            cache.end_pass()
            if progress is not None:
                progress(1)
    cache.finish()
    return "reference"
