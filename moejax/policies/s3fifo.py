"""`s3fifo`: S3-FIFO eviction (Yang et al., "FIFO queues are all you need for cache eviction",
SOSP 2023), by the rules libCacheSim's `S3FIFOv0` (the paper's version) states: a small FIFO
(10% of the slots) that every new expert enters, a main FIFO for experts used again, and a
ghost FIFO of the keys the small queue evicted, as long as the main queue.

- Admitted: into the main queue if its key is in the ghost (it was evicted from the small
  queue not long ago), else into the small queue.
- Used (a hit or a late hit; a demand fetch's own use does not count): its use count goes up,
  capped at 3.
- A victim: from the small queue while it holds its share or more (else from the main queue):
  its oldest expert goes to the main queue, count reset, if it was used since it came in, else
  it is the victim (and its key joins the ghost). From the main queue: its oldest expert with a
  count above 0 goes back to the end with one use fewer, one without is the victim.
  Experts the cache may not evict (the running wave's) keep their places.

The count's reset on the move to the main queue, and a demand fetch's own use not counting,
are this implementation's readings where the rules say nothing.

Written through the public policy API, as a user would write it. From the peers: bigrig 0.9.1
ships it among its adaptive baselines.
"""

from __future__ import annotations

from collections import OrderedDict

from moejax.policies.base import EvictionPolicy
from moejax.policies.declare import Floats
from moejax.policies.registry import register

MAX_USES = 3  # the paper's two-bit counter


@register("eviction", "s3fifo")
class S3FIFO(EvictionPolicy):
    """S3-FIFO (SOSP 2023): a small FIFO for new experts, a main FIFO for those used again, and
    a ghost of the small queue's evictions."""

    ARGS = {"small": Floats(0.01, 0.5, above=0.0, below=1.0)}

    def __init__(self, num_slots: int, small: float = 0.1):
        if not 0 < small < 1:
            raise ValueError(f"small={small} must be in (0, 1)")
        self.small_slots = max(1, round(small * num_slots))
        self.ghost_slots = max(1, num_slots - self.small_slots)
        self.small: OrderedDict = OrderedDict()  # oldest first
        self.main: OrderedDict = OrderedDict()
        self.ghost: OrderedDict = OrderedDict()
        self.uses: dict = {}

    def on_admit(self, key, pos, prefetch):
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None
        # A demand fetch is followed by its own use (`on_access`), which is not a reuse.
        self.uses[key] = 0 if prefetch else -1

    def on_access(self, key, pos):
        self.uses[key] = min(self.uses[key] + 1, MAX_USES)

    def on_evict(self, key):
        del self.uses[key]
        if key in self.small:
            del self.small[key]
            self.ghost[key] = None
            while len(self.ghost) > self.ghost_slots:
                self.ghost.popitem(last=False)
        else:
            del self.main[key]

    def _from_small(self, evictable):
        for key in list(self.small):
            if not evictable(key):
                continue
            if self.uses[key] <= 0:
                return key
            del self.small[key]  # used again since it came in: to the main queue
            self.main[key] = None
            self.uses[key] = 0
        return None

    def _from_main(self, evictable):
        for _ in range(MAX_USES + 1):
            for key in list(self.main):
                if not evictable(key):
                    continue
                if self.uses[key] <= 0:
                    return key
                self.uses[key] -= 1  # one more chance, at the end of the queue
                self.main.move_to_end(key)
        return None

    def victim(self, pos, evictable, incoming=None):
        if len(self.small) >= self.small_slots:
            key = self._from_small(evictable)
            return key if key is not None else self._from_main(evictable)
        key = self._from_main(evictable)
        return key if key is not None else self._from_small(evictable)
