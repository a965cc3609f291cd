"""The prefetch staging share (`cache.prefetch_share`): slots set apart for prefetched experts.

From the peers (nunspark 0.13.0's staging buffer for speculative prefetches: "a share of the
budget that prefetches may fill and that can never evict the demand set"), against moejax's
own finding that a prefetch which evicts an expert the next pass needs costs hits (DESIGN,
"Least-Stale: which reading is the default"). With a share `s` of the `S` slots,
`max(1, floor(s * S))` slots form the staging share and the others the demand share:

* A prefetch (immediate or through the watchdog) admits into the staging share: a free slot
  while the staging share holds fewer experts than its slots, else one of the staging share's
  experts is evicted (the eviction policy's choice among them). It never evicts an expert of
  the demand share.
* A demand fetch (and seeding) admits into the demand share: a free slot while the demand share
  holds fewer experts than its slots, else one of the demand share's is evicted. It never
  evicts a staged expert either, so a prefetch waits for its use unless another prefetch
  pushes it out.
* A prefetched expert's first use (`cache.prefetch_share_use`):
  - `promote` (the default): it joins the demand share, as a demand fetch of it would, without
    a transfer (its slot changes share). A demand share already full evicts its own victim
    (the eviction policy's choice among the demand share's experts the running wave does not
    hold), and the freed slot is the staging share's room. The eviction is the use's, a
    demand: the prefetch itself evicted no demand-fetched expert. When the running wave holds
    every expert of the demand share, the used expert stays staged.
  - `stay` (a named variant): it stays in the staging share until a prefetch evicts it; the
    demand share keeps only what demand fetches brought in. With an accurate prefetcher most
    uses are then of staged experts and the demand share holds little that is used again
    (docs/findings/policies.md).
* Counters (results.json `cache.staging`): `used`, prefetched experts used at least once while
  resident; `wasted`, evicted without a use; `unused_at_end`, still resident and never used
  when the run ended (every prefetch admitted is exactly one of the three: tested);
  `promoted`, used ones that joined the demand share.

With no share (0, the default) every slot is open to both and none of this runs. The share
works with one precision pool, no full-layer placement, and the reference engine (the compiled
engine does not implement it and says so)."""

from __future__ import annotations

import math

from moejax.errors import ConfigError
from moejax.seam import Key

PREFETCH_SHARE_USES = ("promote", "stay")


def check(share, on_use: str = "promote") -> None:
    """`cache.prefetch_share` and `cache.prefetch_share_use` against what they take."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
        raise ConfigError(f"cache.prefetch_share={share!r} must be a number in [0, 1): the share "
                          "of the slots set apart for prefetched experts (0, the default: none)")
    if on_use not in PREFETCH_SHARE_USES:
        raise ConfigError(f"cache.prefetch_share_use={on_use!r} is not one of "
                          f"{PREFETCH_SHARE_USES}: what a prefetched expert's first use does")


class Staging:
    """The two shares' bookkeeping for one cache."""

    def __init__(self, share: float, num_slots: int, top_k: int, pools: int,
                 full_layers: int, on_use: str = "promote"):
        what = f"cache.prefetch_share={share}"
        check(share, on_use)
        self.on_use = on_use
        if pools > 1:
            raise ConfigError(f"{what} works with one precision pool, not {pools}")
        if full_layers:
            raise ConfigError(f"{what} does not combine with cache.full_layers={full_layers}")
        self.share = share
        self.slots = max(1, math.floor(share * num_slots))
        self.demand_slots = num_slots - self.slots
        if self.demand_slots < top_k:
            raise ConfigError(f"{what} leaves {self.demand_slots} of the {num_slots} slots to "
                              f"demand fetches, fewer than a token's {top_k} experts: lower it "
                              "or give more slots")
        self.staged: set[Key] = set()  # the staging share's resident experts
        self.unused: set[Key] = set()  # of those, the ones not used yet
        self.used = self.wasted = self.promoted = 0

    def full(self, prefetch: bool, resident: int) -> bool:
        """Whether the share an incoming expert enters holds all its slots already."""
        if prefetch:
            return len(self.staged) >= self.slots
        return resident - len(self.staged) >= self.demand_slots

    def evictable(self, prefetch: bool, protected: set[Key]):
        """What an incoming expert may evict: an unprotected expert of its own share."""
        staged = self.staged
        if prefetch:
            return lambda k: k in staged and k not in protected
        return lambda k: k not in staged and k not in protected

    def admitted(self, key: Key, prefetch: bool) -> None:
        if prefetch:
            self.staged.add(key)
            self.unused.add(key)

    def accessed(self, cache, key: Key, pos: int, pinned: set[Key]) -> None:
        """`key` was used by the layer at `pos`; the running wave holds `pinned`."""
        if key not in self.unused:
            return
        self.unused.discard(key)
        self.used += 1
        if self.on_use == "stay":
            return
        if len(cache.residency) - len(self.staged) >= self.demand_slots:
            evictable = self.evictable(False, pinned)
            victim = cache.eviction.victim(pos, evictable, key)
            if victim is None:
                return  # the demand share is the running wave's: it stays staged
            if not evictable(victim) or victim not in cache.residency:
                raise AssertionError(f"eviction policy {cache.eviction.name} chose {victim}, "
                                     "which is protected, not resident or staged")
            cache.free.append(cache.evict(victim))
        self.staged.discard(key)
        self.promoted += 1

    def evicted(self, key: Key) -> None:
        if key in self.staged:
            self.staged.discard(key)
            if key in self.unused:
                self.unused.discard(key)
                self.wasted += 1

    def summary(self) -> dict:
        return {"prefetch_share": self.share, "on_use": self.on_use, "slots": self.slots,
                "demand_slots": self.demand_slots, "used": self.used, "wasted": self.wasted,
                "unused_at_end": len(self.unused), "promoted": self.promoted}
