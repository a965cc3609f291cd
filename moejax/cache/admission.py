"""Admission: what a wave's requests and a layer's predictions do to the residency.

`serve` makes a wave's experts resident — hits, late hits (in flight), and demand fetches of
the misses, the eviction policy choosing victims among the slots the pin scope leaves it.
`prefetch_now` admits the prefetch policy's predictions at once (`prefetch_queue=immediate`;
the watchdog queues them instead, `watchdog_queue.py`). Both act on one `ExpertCache` through
its primitives (`allocate`, `admit`, `evict`) and hand what they counted back to it.
"""

from __future__ import annotations

from moejax.cache.metrics import WaveOutcome
from moejax.cache.waves import PlannedWave
from moejax.seam import Key, LayerGate
from moejax.timing import timeline


def serve(cache, layer: int, pos: int, wave: PlannedWave, pinned: set[Key], now: float,
          here: tuple[int, int]) -> tuple[WaveOutcome, list[int] | None]:
    """Makes the wave's experts resident: hits (a resident copy at or above the pool planned
    for it; below the wanted precision counted `served_below_wanted`), late hits, and demand
    fetches of the misses into the planned pool (an upgrade first releases the low copy).
    Returns the outcome and, with several pools, the pool each expert was served from. (One
    pool plans no pools: every expert is pool 0's, wanted there; the loop reads the plan only
    when there is one — replay runs millions of requests through it.)"""
    targets, wants = wave.targets, wave.wants
    multi = targets is not None
    out = WaveOutcome(ready=now)
    residency, slot_ready, origins = cache.residency, cache.slot_ready, cache.prefetch_origin
    slot_pool, pools, slot_storage = cache.slot_pool, cache.shape.pools, cache.slot_storage
    on_access, tell, fixed = cache.eviction.on_access, cache.tell_precision, cache.fixed
    by_layer = cache.pin_scope == "layer"
    staging = cache.staging
    served = [] if multi else None
    if multi:
        out.demand_bytes, out.demand_by_pool = 0, [0] * len(pools)
    target = want = 0
    for i, e in enumerate(wave.experts):
        if multi:
            target, want = targets[i], wants[i]
        key = (layer, e)
        slot = residency.get(key)
        if slot is not None and (not multi or slot_pool[slot] <= target):
            # A hit (the plan's; with pin_scope="request" possibly a copy above it).
            at = slot_ready[slot]
            if at > now:
                out.late_hits += 1
                if at > out.ready:
                    out.ready = at
                if slot_storage[slot] > out.storage_ready:
                    out.storage_ready = slot_storage[slot]
            else:
                out.hits += 1
            if multi and slot_pool[slot] > want:
                out.served_below_wanted += 1
            if fixed and key in fixed:  # a reserved full layer: the policy never sees it
                continue
            if origins and origins.pop(key, None) == here:
                out.prefetch_used += 1
        else:
            if slot is not None:  # an upgrade: the low copy's slot goes back to its pool
                cache.pools.release(key)
                out.upgrades += 1
            else:
                out.collisions += key in cache.seen_this_pass
            slot = cache.allocate(pos, pinned if by_layer else {key}, key, target)
            if slot is None:
                raise AssertionError(f"no slot in the {pools[target].precision} pool for a "
                                     "demand fetch although the wave was planned to fit")
            first = not out.misses
            if first:  # what is on the engines now went before it (`engine_wait`)
                engine_free = min(cache.clock.engine_free)
            ready = cache.admit(key, slot, now, False, pos)
            if first:
                issued = slot_storage[slot] if slot_storage[slot] > now else now
                out.engine_wait = timeline.stall(engine_free, issued)
            if ready > out.ready:
                out.ready = ready
            out.misses += 1
            if multi:
                nbytes = pools[target].expert_bytes
                out.demand_bytes += nbytes
                out.demand_by_pool[target] += nbytes
                if target > want:
                    out.served_below_wanted += 1
            if slot_storage[slot] > out.storage_ready:
                out.storage_ready = slot_storage[slot]
        if multi:
            served.append(slot_pool[slot])
        on_access(key, pos)
        if staging is not None:
            staging.accessed(cache, key, pos, pinned if by_layer else {key})
        if tell:
            cache.eviction.on_use_precision(key, pools[slot_pool[slot]].precision)
    return out, served


def prefetch_now(cache, gate: LayerGate, pos: int, pinned: set[Key], issue_at: float) -> None:
    """Admits the prefetch policy's predictions while a slot is free or evictable. What this
    call selected — admitted, or found already resident — is never a victim of the same call:
    a later (lower-priority) prediction must not push out an earlier one. With a host tier, a
    prediction without a device slot (or host room) is read ahead into host memory."""
    protected = set(pinned)
    host = cache.host
    full = False  # no device slot left for this call: its other predictions are read ahead
    for target, experts in cache.prefetch.predict(gate):
        if target not in cache.pos_of:
            continue
        experts = [int(e) for e in experts]
        cache.predicted.setdefault((cache.pass_id, target), set()).update(experts)
        if target in cache.host_layers:  # computed on the host: never given a slot
            continue
        tpos = cache.pos_of[target]
        for e in experts:
            key = (target, e)
            if key in cache.residency:
                if key not in cache.fixed:
                    cache.eviction.on_touch(key, pos)
                protected.add(key)
                continue
            if full:
                host.read_ahead(key, pos, issue_at, cache.host_evictable)
                continue
            if host is not None and not host.can_take(key, pos, cache.host_evictable):
                continue  # no host slot for it either: this prediction does not go
            slot = cache.allocate(pos, protected, key, prefetch=True)
            if slot is None:  # no room: prefetch never blocks
                if host is None:
                    return
                full = True
                host.read_ahead(key, pos, issue_at, cache.host_evictable)
                continue
            protected.add(key)
            cache.admit(key, slot, issue_at, True, pos, cache.prefetch_bytes(key, pos, issue_at))
            cache.prefetch_origin[key] = (cache.pass_id, target)
            cache.metrics.count_prefetch(tpos, cache.shape.expert_bytes)
