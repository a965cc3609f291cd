"""SpecMD's watchdog prefetch queue: predictions wait in a FIFO and go when a slot can be had.

With `cache.prefetch_queue=watchdog` (or `watchdog_idle`) a layer's predictions are queued
(best first, nearest target first, as the prefetch policy lists them) instead of taking slots
at once. The queue is worked where the cache changes: after a wave's demand fetches were
booked, when a layer's experts are done, and before a layer's router runs. An entry whose
target layer has started is dropped. `immediate` never queues: the queue stays empty.
"""

from __future__ import annotations

from moejax.seam import Key, LayerGate
from moejax.timing import timeline


class WatchdogQueue:
    """The queue of one `ExpertCache` (`cache`). `entries` (insertion-ordered): key ->
    (target layer, time it was queued)."""

    def __init__(self, cache, idle_engine_rule: bool):
        self.cache = cache
        self.idle_engine_rule = idle_engine_rule
        self.entries: dict[Key, tuple[int, float]] = {}

    def enqueue(self, gate: LayerGate, pos: int, now: float) -> None:
        """Queues this layer's predictions, then issues what it can now — after this layer's
        demand fetches, which were booked first."""
        cache = self.cache
        queue, residency = self.entries, cache.residency
        for target, experts in cache.prefetch.predict(gate):
            if target not in cache.pos_of:
                continue
            predicted = cache.predicted.setdefault((cache.pass_id, target), set())
            predicted.update(int(e) for e in experts)
            if target in cache.host_layers:  # computed on the host: never queued for a slot
                continue
            for e in experts:
                key = (target, int(e))
                if key in residency:
                    if key not in cache.fixed:
                        cache.eviction.on_touch(key, pos)
                elif key not in queue:
                    queue[key] = (target, now)
                    if cache.host is not None:  # its bytes are read ahead while it waits
                        cache.host.read_ahead(key, pos, now, cache.host_evictable)
        self.issue(now, False, cache.running_pins)

    def issue(self, now: float, strict: bool, pinned) -> None:
        """Issues queued prefetches, head first, while the eviction policy can give the head a
        slot, sparing `pinned` (the running wave; nothing between layers) and the prefetched
        experts whose target layer has not run. The head blocks the queue (FIFO).

        `watchdog` (the default): an entry goes at `now` — the moment space appears, since the
        cache changes only where this is called: after a wave's demand fetches were booked (a
        demand miss goes ahead of entries not yet issued) and when a layer's experts are done.
        Its transfer queues on the copy engines behind those in flight, demand fetches
        included, as a CUDA stream serialises its copies; a transfer on an engine is never
        pre-empted, so a later demand fetch waits behind it (`stall_behind_prefetch_s`).

        `watchdog_idle` (a named variant): the head also waits for an idle copy engine: it
        starts at `max(queued, engine free)`, no later than `now` (before `now` when `strict`,
        because a demand fetch booked at `now` goes first). Nothing happens to the cache
        between two calls, so issuing at an engine's free time in the past is what a watchdog
        polling continuously would have done."""
        cache = self.cache
        queue, engine_free = self.entries, cache.clock.engine_free
        protected = None
        while queue:
            key = next(iter(queue))
            target, queued_at = queue[key]
            if key in cache.residency:
                del queue[key]
                continue
            issue = now
            if self.idle_engine_rule:
                issue = timeline.watchdog_issue_time(queued_at, engine_free)
                if not timeline.watchdog_may_issue(issue, now, strict):
                    return
            if protected is None:
                protected = set(pinned)
                protected.update(k for k, (p, t) in cache.prefetch_origin.items()
                                 if p == cache.pass_id and cache.pos_of[t] > cache.running_pos)
            if cache.host is not None and not cache.host.can_take(key, cache.running_pos,
                                                                  cache.host_evictable):
                return  # no host slot until the running wave is done
            slot = cache.allocate(cache.running_pos, protected, key, prefetch=True)
            if slot is None:
                return  # no room until the running layer or a prefetch target is done
            del queue[key]
            protected.add(key)
            cache.admit(key, slot, issue, True, cache.running_pos,
                        cache.prefetch_bytes(key, cache.running_pos, issue))
            cache.prefetch_origin[key] = (cache.pass_id, target)
            cache.metrics.count_prefetch(cache.pos_of[target], cache.shape.expert_bytes)

    def drop(self, upto: int) -> None:
        """Drops the queued predictions whose target layer (position <= `upto`) has started."""
        pos_of, queue, metrics = self.cache.pos_of, self.entries, self.cache.metrics
        for key, (target, _) in list(queue.items()):
            tpos = pos_of[target]
            if tpos <= upto:
                del queue[key]
                metrics.count_prefetch_dropped(tpos)
