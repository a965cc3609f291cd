"""Placement before the first pass: ds4's full layers and a seed.

`reserve_full_layers`: every expert of the first `n` MoE layers resident for the whole run in
slots of their own, never evicted and never shown to the eviction policy; the other layers
share the remaining slots. `seed`: free slots filled with the hottest experts of a hotlist (or
any list), resident and ready from the start, not counted as fetches.
"""

from __future__ import annotations

from moejax.errors import ConfigError
from moejax.seam import Key


def _place(cache, key: Key, slot: int) -> None:
    cache.residency[key] = slot
    cache.slot_key[slot] = key
    cache.in_cache[key[0]].add(key[1])
    cache.layer_changes[key[0]] += 1


def reserve_full_layers(cache, n: int) -> None:
    """Reserves the first `n` MoE layers of `cache` (`cache.full_layers`): sets its `fixed`
    keys and its `wave_slots` (the slots an ordinary layer's wave may use)."""
    shape = cache.shape
    if cache.multi:
        raise ConfigError("cache.full_layers needs a single precision pool")
    if not 0 < n <= len(shape.layers):
        raise ConfigError(f"cache.full_layers={n} must be in 0..{len(shape.layers)} (the "
                          "MoE layers)")
    reserved = n * shape.num_experts
    left = shape.num_slots - reserved
    if left < 0 or (n < len(shape.layers) and left < shape.top_k):
        raise ConfigError(
            f"cache.full_layers={n} reserves {reserved} of the {shape.num_slots} slots, "
            f"leaving {shape.num_slots - reserved} for the other layers, fewer than one "
            f"decode layer needs (top-k = {shape.top_k})")
    fixed = []
    for layer in shape.layers[:n]:
        for e in range(shape.num_experts):
            key = (layer, e)
            _place(cache, key, cache.free.pop())
            fixed.append(key)
    cache.fixed = frozenset(fixed)
    cache.wave_slots = max(shape.num_slots - reserved, 1)


def seed(cache, keys: list[Key], priorities: dict[Key, int] | None = None) -> int:
    """Seeds `cache`'s free slots with `keys` (hottest first) before its first pass, up to the
    free slots; layers computed on the host get none. `priorities` go to an eviction policy
    that takes them (`priority`): ds4's hotlist entries are priorities, not pins. Returns how
    many were placed."""
    if cache.pass_id >= 0:
        raise AssertionError("seed the cache before its first pass")
    if priorities is not None and hasattr(cache.eviction, "set_priorities"):
        cache.eviction.set_priorities(priorities)
    # Seeding fills the demand share (`staging.py`): the staging share is the prefetches'.
    room = len(cache.free)
    if cache.staging is not None:
        room = min(room, cache.staging.demand_slots
                   - (len(cache.residency) - len(cache.staging.staged)))
    chosen = [k for k in dict.fromkeys(keys) if k not in cache.residency
              and k[0] in cache.pos_of and k[0] not in cache.host_layers][:room]
    # Coldest first: within one priority (and for a recency policy) the hottest is the most
    # recently admitted, so it goes last.
    for key in reversed(chosen):
        _place(cache, key, cache.free.pop())
        cache.eviction.on_admit(key, 0, False)
    return len(chosen)
