"""Several precision pools: a slot of the right pool, the waves planned by pool, upgrades.

The slots are split into one pool per precision the miss policy may fetch (its `levels`, high
to low; `CacheShape.pools`). Each pool has its own free list, and a victim for a fetch into a
pool is chosen among that pool's keys. A request wants the precision the miss policy names: a
resident copy at or above it is a hit; one below it is the policy's `upgrade` choice — a hit
on the low copy, or a fetch at the wanted precision into its pool, the low slot released
(`release`: not an eviction). A prefill layer's waves are cut so that each pool holds its share
of the wave; a policy with `fallback` fetches at the next lower level with room instead of
starting a new wave. With one pool none of this runs: the cache plans plain slices
(`waves.single_pool`).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from moejax.cache.waves import PlannedWave, resident_first
from moejax.seam import Key


class PrecisionPools:
    """The pool-aware steps of one `ExpertCache` (`cache`) with several pools."""

    def __init__(self, cache):
        self.cache = cache

    def allocate(self, pos: int, protected: set[Key], incoming: Key, pool: int = 0,
                 prefetch: bool = False) -> int | None:
        """A slot of `pool` for `incoming`: a free one, or a victim's (of that pool) that is
        not in `protected`; the eviction policy may refuse the free slot (`may_take_free`).
        (No staging share with several pools: `prefetch` is not read.)"""
        cache = self.cache
        free = cache.free_lists[pool]
        residency, slot_pool = cache.residency, cache.slot_pool

        def evictable(k):
            return k not in protected and slot_pool[residency[k]] == pool

        if free and cache.eviction.may_take_free(incoming, evictable):
            return free.pop()
        victim = cache.eviction.victim(pos, evictable, incoming)
        if victim is None:
            return None
        if victim in protected or victim not in residency or slot_pool[residency[victim]] != pool:
            raise AssertionError(f"eviction policy {cache.eviction.name} chose {victim}, which "
                                 "is protected, not resident or in another pool")
        return cache.evict(victim)

    def release(self, key: Key) -> None:
        """An upgrade: `key`'s low copy leaves its slot (back to its pool's free list); not an
        eviction."""
        cache = self.cache
        slot = cache.residency.pop(key)
        cache.slot_key[slot] = None
        cache.in_cache[key[0]].discard(key[1])
        cache.layer_changes[key[0]] += 1
        cache.eviction.on_evict(key)
        if cache.prefetch_origin.pop(key, None) is not None:
            cache.metrics.count_wasted_prefetch(cache.pos_of[key[0]], cache.slot_bytes[slot])
        cache.free_lists[cache.slot_pool[slot]].append(slot)

    def waves(self, layer: int, requests: list[int], wanted: dict[int, str] | None
              ) -> Iterator[tuple[PlannedWave, bool]]:
        """The layer's waves, each planned (`plan_wave`) just before it is served, with whether
        it is the last; with several waves the resident experts go first."""
        want_of = self.wanted(requests, wanted)
        wave, rest = self.plan_wave(layer, requests, want_of)
        if rest:  # several waves: resident experts first (as with one pool)
            wave, rest = self.plan_wave(
                layer, resident_first(self.cache.in_cache[layer], requests), want_of)
        while True:
            yield wave, not rest
            if not rest:
                return
            wave, rest = self.plan_wave(layer, rest, want_of)

    def wanted(self, requests: list[int], wanted: dict[int, str] | None) -> dict[int, int]:
        """Expert -> index of the pool of the precision the miss policy wants it at."""
        if not wanted:
            return dict.fromkeys(requests, 0)
        index = self.cache.pool_index
        try:
            return {e: index[wanted[e]] if e in wanted else 0 for e in requests}
        except KeyError as err:
            raise AssertionError(f"miss policy {self.cache.miss.name} wants precision {err} "
                                 f"outside its levels {self.cache.shape.precisions}") from None

    def plan_wave(self, layer: int, requests: list[int], want_of: dict[int, int]
                  ) -> tuple[PlannedWave, list[int]]:
        """The next wave (each expert with the pool it is served from and the pool wanted) and
        the requests left for later waves. A pool's room in a wave is its slot count: every key
        the wave holds in it counts (its hits and fetches, and the low copies an upgrade leaves
        only when it is served). A fetch whose pool is full falls to the next lower pool with
        room when the miss policy has `fallback` (an upgrade stays at its resident copy if none
        above it has room); otherwise the wave ends there."""
        cache = self.cache
        residency, slot_pool = cache.residency, cache.slot_pool
        upgrade, fallback = cache.miss.upgrade, cache.miss.fallback
        room = [p.num_slots for p in cache.shape.pools]
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

    def count(self, pos: int, ids: np.ndarray, wave_active: np.ndarray, chunk: list[int],
              served: list[int], demand: list[int]) -> None:
        """A wave's requests and products by the precision that served them, and its demand
        bytes by pool."""
        cache = self.cache
        n = len(cache.shape.pools)
        requests_by, products_by = [0] * n, [0] * n
        per_expert = (np.bincount(ids[wave_active], minlength=cache.shape.num_experts)
                      if wave_active.any() else None)
        for e, i in zip(chunk, served):
            requests_by[i] += 1
            if per_expert is not None:
                products_by[i] += int(per_expert[e])
        cache.metrics.count_pools(pos, requests_by, products_by, demand)
