"""Slot loads of the live runtime: queued as the cache issues them, dispatched together.

The cache books a transfer (`SlotSink.load`); the runtime queues it and dispatches the queue
with `SlotPools.load_many`: a wave's loads before its experts step, the rest (prefetches)
after it, so that they overlap the next layer's attention. With the disk tier a load waits for
its expert's read: across slots the one whose read lands first goes first, and the host
store's dropped buffers are released once no queued load reads them.
"""

from __future__ import annotations

import time

import jax

from moejax.seam import Key


class SlotLoads:
    """The slot-load part of `CachedExperts` (`runtime.py`): its `_queued` loads (key, slot,
    prefetch), in issue order, into `pool` (`SlotPools`), with `host_store` behind them when
    the cache has a host tier."""

    def _init_slot_loads(self) -> None:
        self._queued: list[tuple[Key, int, bool]] = []  # (key, slot, prefetch), issue order

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


def _slot_heads(loads: list[tuple[Key, int, bool]]) -> list[int]:
    """The index of each slot's first load in `loads` (later ones into a slot must wait)."""
    seen, heads = set(), []
    for i, (_, slot, _) in enumerate(loads):
        if slot not in seen:
            seen.add(slot)
            heads.append(i)
    return heads
