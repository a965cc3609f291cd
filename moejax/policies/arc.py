"""`arc`: ARC eviction (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache",
FAST 2003), by the rules of the paper's Fig. 4: the resident experts are split into T1 (seen
once recently) and T2 (seen at least twice), the keys evicted from them are remembered, without
data, in the ghost lists B1 and B2, and a target `p` for T1's length (0 at the start, at most
`c`, the cache's slots) adapts to the ghost hits.

- Admitted: a key in B1 (evicted from T1 not long ago) raises `p` by max(1, |B2| / |B1|),
  capped at `c`, and enters T2 (case II); a key in B2 lowers `p` by max(1, |B1| / |B2|),
  floored at 0, and enters T2 (case III); any other key enters T1 (case IV), and the ghosts are
  trimmed to case IV's bounds: B1's oldest keys go while |T1| + |B1| > c, then B2's while
  |T1| + |T2| + |B1| + |B2| > 2c.
- Used (a hit or a late hit, case I): to T2's most recent end, from T1 or from within T2.
- A victim (REPLACE): T1's oldest expert if |T1| > p, or |T1| = p and the incoming key is in
  B2, else T2's oldest; the evicted key joins B1 or B2, by the list it left. As in the paper,
  `p` is adapted before REPLACE (the cache asks for a victim before it admits: the victim is
  chosen with the `p` the incoming key's admission will set) and the step's |B1| and |B2| are
  those before the victim joins them.

This implementation's readings where the rules say nothing (the paper fetches on demand only,
one page at a time, into a cache it owns):

- a demand fetch's own use (the `on_access` that follows its admission) is not a hit, so a
  new expert stays in T1 until it is used again; a prefetch's admission is not a use, its first
  use is a hit (case I: to T2), and a key in a ghost list that a prefetch brings back adapts
  `p` and enters T2 as a demand fetch's would;
- the prefetcher selecting a resident expert (`on_touch`) is no request: nothing moves;
- experts the cache may not evict (the running wave's, another pool's, a staging share's) keep
  their places: the victim is the oldest evictable expert of the list REPLACE chose, else of
  the other list, else none;
- an upgrade (a resident expert fetched again at a higher precision: its low copy leaves and it
  is admitted again, with at most a victim's eviction between) is neither an eviction nor a
  ghost hit: the expert goes back to its list, and its request is a hit. An evicted key joins
  its ghost at the next hook other than a victim's or an eviction's, so a key admitted before
  then is taken for an upgrade;
- `p` is a real number, as the paper writes the steps (|B2| / |B1| is not rounded).

Written through the public policy API, as a user would write it. It takes no argument: ARC
tunes its one parameter itself.
"""

from __future__ import annotations

from collections import OrderedDict

from moejax.policies.base import EvictionPolicy
from moejax.policies.registry import register


@register("eviction", "arc")
class ARC(EvictionPolicy):
    """ARC (FAST 2003): a recency and a frequency list, split by ghost hits. LRU lists of the
    experts seen once (T1) and at least twice (T2); the ghosts of their evictions steer T1's
    target length."""

    def __init__(self, num_slots: int):
        self.c = num_slots
        self.p = 0.0  # the target length of T1
        # Oldest first, each.
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()
        self.fetched = None  # the key a demand fetch just admitted: its own use comes next
        # The keys that left their slots since the last hook other than a victim's, each with
        # the list it left: the victims of an admission to come, or a key being upgraded. They
        # join the ghosts at the next other hook (the admission's, after its `p` is adapted).
        self.leaving: dict = {}

    def _to_ghosts(self) -> None:
        for key, was in self.leaving.items():
            (self.b1 if was is self.t1 else self.b2)[key] = None
        self.leaving.clear()

    def _target(self, incoming) -> float:
        """`p` once `incoming` is admitted (cases II and III adapt it; others leave it)."""
        if incoming in self.b1:
            return min(self.p + max(1.0, len(self.b2) / len(self.b1)), float(self.c))
        if incoming in self.b2:
            return max(self.p - max(1.0, len(self.b1) / len(self.b2)), 0.0)
        return self.p

    # -- hooks ------------------------------------------------------------------------------
    def on_pass_start(self, pass_id):
        self._to_ghosts()
        self.fetched = None

    def on_admit(self, key, pos, prefetch):
        was = self.leaving.pop(key, None)
        if was is None:
            self.p = self._target(key)
        self._to_ghosts()
        if was is not None:  # an upgrade: back to its list, its request a hit
            was[key] = None
            self.fetched = None
            return
        if key in self.b1 or key in self.b2:
            self.b1.pop(key, None)
            self.b2.pop(key, None)
            self.t2[key] = None
        else:
            self.t1[key] = None
            while len(self.t1) + len(self.b1) > self.c and self.b1:
                self.b1.popitem(last=False)
            while len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * self.c \
                    and self.b2:
                self.b2.popitem(last=False)
        # A demand fetch is followed by its own use (`on_access`), which is not a hit.
        self.fetched = None if prefetch else key

    def on_access(self, key, pos):
        self._to_ghosts()
        if key == self.fetched:
            self.fetched = None
            return
        self.fetched = None
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        else:
            self.t2.move_to_end(key)

    def on_touch(self, key, pos):
        self._to_ghosts()  # (the prefetcher's selection itself moves nothing)

    def on_evict(self, key):
        # Into its ghost at the next hook; the ghosts were trimmed at the last admission, and
        # a move from T to B keeps both sums.
        if key in self.t1:
            del self.t1[key]
            self.leaving[key] = self.t1
        else:
            del self.t2[key]
            self.leaving[key] = self.t2
        if key == self.fetched:
            self.fetched = None

    def victim(self, pos, evictable, incoming=None):
        p = self._target(incoming)
        n1 = len(self.t1)
        lists = ((self.t1, self.t2) if n1 > p or (incoming in self.b2 and n1 == p)
                 else (self.t2, self.t1))
        for queue in lists:
            for key in queue:
                if evictable(key):
                    return key
        return None
