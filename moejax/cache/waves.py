"""A layer's requests and the waves they run in (one slot pool).

A layer's distinct experts are its requests, in router-rank order. They run in waves of at
most `wave_slots` experts (all slots less a reserved full layer's) when a prefill layer needs
more experts than that; the resident experts go first then, so that no wave evicts an expert
a later wave of the layer needs only because of ordering. Each wave is planned just before it
is served, on the residency it finds. With several precision pools the waves are planned by
pool (`precision_pools.PrecisionPools.waves`).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from moejax.seam import requests_in_rank_order


@dataclasses.dataclass(slots=True)
class PlannedWave:
    """One wave of a layer as planned: its experts in serving order and, with several pools,
    the pool each is served from and the pool wanted (None with one pool: pool 0 for all)."""

    experts: list[int]
    targets: list[int] | None = None
    wants: list[int] | None = None


def requests(ids: np.ndarray, active: np.ndarray) -> list[int]:
    """The layer's distinct experts in router-rank order (rank-major over tokens, first
    occurrence wins)."""
    if ids.shape[0] == 1:
        return [int(e) for e, a in zip(ids[0].tolist(), active[0].tolist()) if a]
    return requests_in_rank_order(ids, active)


def resident_first(resident: set[int], experts: list[int]) -> list[int]:
    """`experts` with those in `resident` (the layer's resident experts) first."""
    return [e for e in experts if e in resident] + [e for e in experts if e not in resident]


def single_pool(experts: list[int], resident: set[int], wave_slots: int, whole_layer: bool
                ) -> Iterator[tuple[PlannedWave, bool]]:
    """The waves of one pool, with whether each is the last: at most `wave_slots` experts a
    wave, or one wave of everything for a reserved full layer (`whole_layer`: resident
    whole). `resident` is read when the first wave is asked for."""
    if len(experts) > wave_slots:
        experts = resident_first(resident, experts)
    s = len(experts) if whole_layer else wave_slots
    chunks = [experts[i:i + s] for i in range(0, len(experts), s)] or [[]]
    for i, chunk in enumerate(chunks):
        yield PlannedWave(chunk), i == len(chunks) - 1
