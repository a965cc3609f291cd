"""The future of a replay: the requests a trace will make, known in advance (the router's own
choices, pass by pass and layer by layer). Replay-only policies read it (`needs_future`:
Belady's eviction, the oracle prefetchers); both replay engines build it the same way."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from moejax.seam import Key, requests_in_rank_order
from moejax.traces import Trace


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
