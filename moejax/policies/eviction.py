"""Eviction policies (SpecMD §3, appendix B). Victim selection is O(1) amortised or O(layers)
for all but `score` (a vectorised argmin): replay runs millions of requests. With several
precision pools the cache asks for a victim of one pool (`evictable` is False for the keys of
the others), so a victim search may walk past the other pools' keys: O(resident keys) at
worst.

All take `num_layers` (MoE layers) and `num_experts` from the cache; `random` takes a seed.
"""

from __future__ import annotations

import bisect
import random as _random
from collections import OrderedDict

import numpy as np

from moejax.policies.base import EvictionPolicy, Key
from moejax.policies.declare import Choice, KernelForm
from moejax.policies.registry import register


class _Base(EvictionPolicy):
    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.pos_of: dict[int, int] = {}


def _first_evictable(order, evictable):
    for key in order:
        if evictable(key):
            return key
    return None


# The orders in which the layered policies look for a victim, as data: the reference's policy
# objects below and the compiled replay kernel (which reads them as tables) share them, so an
# order is written once. `pos` is the running MoE layer position, -1 before a pass's first
# layer (the watchdog issuing at a pass start).
def least_stale_walk(order: str, pos: int, num_layers: int) -> tuple[int, ...]:
    """The queues a Least-Stale victim search walks, first to last (`LeastStale`): queue
    `q < L` is position q's stale queue, `L + q` its current queue."""
    L = num_layers
    if order == "two_queue":
        return tuple(range(2 * L))
    if order == "left_first":
        left, right = tuple(range(0, pos + 1)), tuple(range(pos + 1, L))
        return left + tuple(L + q for q in left) + right + tuple(L + q for q in right)
    if order == "cyclic":
        cycle = tuple(range(pos, -1, -1)) + tuple(range(L - 1, pos, -1))
        return cycle + tuple(L + q for q in cycle)
    raise ValueError(f"unknown Least-Stale order {order!r}")


def farthest_layer_walk(pos: int, num_layers: int) -> tuple[int, ...]:
    """FLD's layers, farthest from `pos` first, the lower position first among equals."""
    return tuple(sorted(range(num_layers), key=lambda p: (-abs(p - pos), p)))


@register("eviction", "lru")
class LRU(_Base):
    """Global least-recently-used across all layers (admission counts as a use)."""

    name = "lru"
    KERNEL = KernelForm("lru")

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.order: OrderedDict[Key, None] = OrderedDict()

    def on_admit(self, key, pos, prefetch):
        self.order[key] = None
        self.order.move_to_end(key)

    def on_access(self, key, pos):
        self.order.move_to_end(key)

    on_touch = on_access

    def on_evict(self, key):
        del self.order[key]

    def victim(self, pos, evictable, incoming=None):
        return _first_evictable(self.order, evictable)


@register("eviction", "fifo")
class FIFO(LRU):
    """First in, first out: admission order only."""

    name = "fifo"
    KERNEL = KernelForm("fifo")

    def on_access(self, key, pos):
        pass

    on_touch = on_access


@register("eviction", "lru_per_layer")
class LRUPerLayer(_Base):
    """LRU within each layer's share of the cache (capacity split evenly over the layers).

    The shares are `divmod(num_slots, num_layers)` (the first `num_slots % num_layers`
    positions one more). `quota` says what a share is:

    * `quota="share"` (default) — a share is what a layer may keep once the cache is full,
      not a bound: a free slot is taken first, whatever the layer holds, so a layer may exceed
      its share while free slots remain. The victim comes from the incoming layer's own
      entries once that layer holds its share; otherwise from a layer over its share (so a
      share smaller than top-k borrows rather than deadlocks); global LRU only if no layer is
      over its share.
    * `quota="strict"` — each layer only competes with itself (the per-layer LRU of boyle and
      moe-l2): a layer at (or over) its share evicts its own least recently used evictable
      expert even while other slots are free (`may_take_free`); a layer under its share takes
      a free slot if any, else a victim by the rule above. Fallback: when a layer at its share
      has no evictable expert of its own (its whole share protected by the running wave, as
      when the share is below top-k under `pin_scope=layer`, or a share of 0 with fewer slots
      than layers), it takes a free slot, else borrows by the rule above, so a demand miss
      always gets a slot; such a layer is then over its share and recycles its own entries
      first from there on. Where the fallback never runs (every share at least the widest
      wave) and without a prefetcher it is exactly an LRU per layer of fixed capacity.

    docs/DESIGN.md ("Readings where the papers leave room", lru_per_layer) gives both readings
    and why `share` is the default."""

    name = "lru_per_layer"
    QUOTAS = ("share", "strict")
    ARGS = {"quota": Choice(QUOTAS)}
    KERNEL = KernelForm(lambda p: "lru_per_layer" if p.quota_rule == "share"
                        else f"lru_per_layer:{p.quota_rule}", {"quota": QUOTAS})

    def __init__(self, num_layers: int, num_experts: int, num_slots: int, quota: str = "share"):
        super().__init__(num_layers, num_experts)
        if quota not in self.QUOTAS:
            raise ValueError(f"unknown quota {quota!r}; valid: {list(self.QUOTAS)}")
        self.quota_rule, self.strict = quota, quota == "strict"
        base, extra = divmod(num_slots, num_layers)
        self.quota = [base + (1 if p < extra else 0) for p in range(num_layers)]
        self.per_layer: list[OrderedDict[Key, None]] = [OrderedDict() for _ in range(num_layers)]
        self.tick = 0
        self.last: dict[Key, int] = {}

    def _pos(self, key: Key) -> int:
        return self.pos_of[key[0]]

    def on_admit(self, key, pos, prefetch):
        self.per_layer[self._pos(key)][key] = None
        self.on_access(key, pos)

    def on_access(self, key, pos):
        self.per_layer[self._pos(key)].move_to_end(key)
        self.tick += 1
        self.last[key] = self.tick

    on_touch = on_access

    def on_evict(self, key):
        del self.per_layer[self._pos(key)][key]
        del self.last[key]

    def may_take_free(self, incoming, evictable):
        """`share`: always. `strict`: not while `incoming`'s layer holds its share and has an
        evictable entry of its own (`victim` then gives that layer's least recent one)."""
        if not self.strict:
            return True
        own = self.per_layer[self._pos(incoming)]
        return len(own) < self.quota[self._pos(incoming)] or \
            _first_evictable(own, evictable) is None

    def victim(self, pos, evictable, incoming=None):
        own = pos if incoming is None else self._pos(incoming)
        if len(self.per_layer[own]) >= self.quota[own]:
            key = _first_evictable(self.per_layer[own], evictable)
            if key is not None:
                return key
        over = [p for p in range(self.num_layers) if len(self.per_layer[p]) > self.quota[p]]
        candidates = [k for p in over for k in [_first_evictable(self.per_layer[p], evictable)]
                      if k is not None]
        if not candidates:
            candidates = [k for p in range(self.num_layers)
                          for k in [_first_evictable(self.per_layer[p], evictable)] if k is not None]
        return min(candidates, key=self.last.__getitem__) if candidates else None


@register("eviction", "lfu")
class LFU(_Base):
    """Least frequently used over the whole run; ties broken by least recent use."""

    name = "lfu"
    KERNEL = KernelForm("lfu")

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.count: dict[Key, int] = {}
        self.tick = 0
        self.last: dict[Key, int] = {}
        self.resident: set[Key] = set()

    def on_admit(self, key, pos, prefetch):
        self.resident.add(key)
        self.count.setdefault(key, 0)
        self.tick += 1
        self.last[key] = self.tick

    def on_access(self, key, pos):
        self.count[key] = self.count.get(key, 0) + 1
        self.tick += 1
        self.last[key] = self.tick

    def on_evict(self, key):
        self.resident.discard(key)

    def victim(self, pos, evictable, incoming=None):
        best, best_rank = None, None
        for key in self.resident:
            if evictable(key):
                rank = (self.count[key], self.last[key])
                if best_rank is None or rank < best_rank:
                    best, best_rank = key, rank
        return best


@register("eviction", "fld")
class FLD(_Base):
    """Farthest layer distance (HOBBIT): evicts from the layer farthest from the current one
    (|layer position - current position|), least recently used first within a layer."""

    name = "fld"
    KERNEL = KernelForm("fld")

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.per_layer: list[OrderedDict[Key, None]] = [OrderedDict() for _ in range(num_layers)]
        self.walks = {p: farthest_layer_walk(p, num_layers) for p in range(-1, num_layers)}

    def on_admit(self, key, pos, prefetch):
        self.per_layer[self.pos_of[key[0]]][key] = None

    def on_access(self, key, pos):
        self.per_layer[self.pos_of[key[0]]].move_to_end(key)

    on_touch = on_access

    def on_evict(self, key):
        del self.per_layer[self.pos_of[key[0]]][key]

    def victim(self, pos, evictable, incoming=None):
        for p in self.walks[max(-1, min(pos, self.num_layers - 1))]:
            key = _first_evictable(self.per_layer[p], evictable)
            if key is not None:
                return key
        return None


@register("eviction", "score")
class ScoreBased(_Base):
    """Evicts the resident expert with the lowest accumulated router probability (the
    gate-score history of Zhu et al.), ignoring position in the pass."""

    name = "score"
    needs_probs = True

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.score = np.zeros((num_layers, num_experts))
        self.resident = np.zeros((num_layers, num_experts), bool)
        # score where resident, +inf elsewhere: kept current so a victim is one partition.
        self.masked = np.full(num_layers * num_experts, np.inf)

    def set_layer_positions(self, pos_of):
        super().set_layer_positions(pos_of)
        self.layer_of = {p: l for l, p in self.pos_of.items()}

    def on_scores(self, layer, probs):
        p = self.pos_of[layer]
        self.score[p] += probs.sum(axis=0)
        row = slice(p * self.num_experts, (p + 1) * self.num_experts)
        self.masked[row] = np.where(self.resident[p], self.score[p], np.inf)

    def on_admit(self, key, pos, prefetch):
        p = self.pos_of[key[0]]
        self.resident[p, key[1]] = True
        self.masked[p * self.num_experts + key[1]] = self.score[p, key[1]]

    def on_evict(self, key):
        p = self.pos_of[key[0]]
        self.resident[p, key[1]] = False
        self.masked[p * self.num_experts + key[1]] = np.inf

    def victim(self, pos, evictable, incoming=None):
        n = self.masked.size
        k = 8
        while True:  # the lowest scores are rarely all pinned: look at the k lowest first
            k = min(k, n)
            cand = np.argpartition(self.masked, k - 1)[:k] if k < n else np.arange(n)
            for flat in cand[np.lexsort((cand, self.masked[cand]))].tolist():
                if self.masked[flat] == np.inf:
                    return None
                p, e = divmod(flat, self.num_experts)
                key = (self.layer_of[p], e)
                if evictable(key):
                    return key
            if k == n:
                return None
            k *= 4


@register("eviction", "least_stale")
class LeastStale(_Base):
    """SpecMD's Least-Stale (§4 "The Least-Stale Policy"), as a family of readings.

    An expert is *current* once requested in this pass, or selected by the prefetcher (see
    `prefetch_current`); *stale* otherwise (every expert becomes stale at a pass start). Each
    class keeps one FIFO per layer position (insertion order: when it became current, resp.
    stale); a victim is the first evictable key of the first non-empty queue in the walk that
    `order` gives. Let `p` be the running layer's position and L the number of MoE layers.
    *Left* means layer position <= p: the running layer's own keys count as left, since every
    key it still needs is pinned by its wave, so an unpinned one is done until the next pass.

    * `order="two_queue"` (default) — §4's rule as written: "The cache is partitioned into a
      stale queue containing experts from previous forward passes and a current queue
      containing experts from the ongoing pass. Eviction prioritizes stale experts [...].
      Experts in the current queue are evicted only to prevent out-of-memory errors. Within
      each queue, experts follow FIFO ordering based on layer position" (and "Stale experts
      have a higher eviction priority than current ones", Fig. 2). Walk: stale positions
      0, 1, ..., L-1, then current positions 0, 1, ..., L-1: a current expert goes only when
      no stale one can. FIFO by layer position: experts enter the current queue in layer
      order as the pass runs (a prefetched one when selected, before its layer) and the stale
      queue in that order at the pass start, so the first in is the lowest position. The
      order is static (it does not depend on `p`), as the paper's "priority heaps [...]
      O(log N) insertion, and O(1) eviction" need; while layer p runs, stale positions < p are
      the "stale left-layer experts" that go first. docs/DESIGN.md ("Least-Stale: which
      reading is the default") gives the argument.
    * `order="left_first"` — a reading of the mechanism §5 gives for the paper's result
      ("Least-Stale maintains near-zero collisions across all layers by only evicting stale
      left-layer experts"; appendix: "prioritizes removing experts from already-processed
      layers while protecting experts needed for upcoming layers"). Walk: stale-left,
      current-left, stale-right, current-right, each by ascending position (0..p, then
      p+1..L-1). It breaks §4's rule in one place: a current expert of a layer already run
      goes before a stale expert of an upcoming layer (the default once, a named variant now;
      measured: a perfect predictor through the watchdog loses hits against no prefetch).
    * `order="cyclic"` — Belady's intuition over the pass cycle: after layer p, layer q's
      experts are next needed at distance (q - p) mod L, with q = p farthest (L: the next
      pass), so the layer that comes round last goes first: positions p, p-1, ..., 0 (left,
      most recently finished first), then L-1, L-2, ..., p+1 (right, farthest first). The
      stale queue in that order, then the current queue in that order (stale before current,
      as the paper says).

    Ties within a layer: FIFO (the order the keys entered the queue); deterministic.

    `prefetch_current` — what a prefetch selection (`on_admit(prefetch=True)` or `on_touch`)
    of a not yet requested expert makes current:

    * `"pass"` (default, "current, meaning it is used in the current pass or selected by
      prefetching"): current for the rest of the pass;
    * `"until_target"`: current only until its target layer (the key's own layer, `key[0]`)
      is reached: once the running position is >= that layer's position, a prefetched key
      that layer did not request is stale (appended to its layer's stale queue). A request
      makes it current for the pass as usual. A selection for a layer already reached in this
      pass leaves (or puts) the key stale.

    Cost: a victim walks 2L layer queues (plus the pinned keys at their heads), as before;
    `until_target` moves each prefetched key at most once per pass."""

    name = "least_stale"
    ORDERS = ("two_queue", "left_first", "cyclic")
    PREFETCH_CURRENT = ("pass", "until_target")
    ARGS = {"order": Choice(ORDERS), "prefetch_current": Choice(PREFETCH_CURRENT)}
    KERNEL = KernelForm(lambda p: f"least_stale:{p.order}",
                        {"order": ORDERS, "prefetch_current": ("pass",)})

    def __init__(self, num_layers: int, num_experts: int, order: str = "two_queue",
                 prefetch_current: str = "pass"):
        super().__init__(num_layers, num_experts)
        if order not in self.ORDERS:
            raise ValueError(f"unknown order {order!r}; valid: {list(self.ORDERS)}")
        if prefetch_current not in self.PREFETCH_CURRENT:
            raise ValueError(f"unknown prefetch_current {prefetch_current!r}; valid: "
                             f"{list(self.PREFETCH_CURRENT)}")
        self.order, self.prefetch_current = order, prefetch_current
        self.until_target = prefetch_current == "until_target"
        self.stale: list[OrderedDict[Key, None]] = [OrderedDict() for _ in range(num_layers)]
        # key -> True once requested in this pass, False while only prefetch-selected.
        self.current: list[OrderedDict[Key, bool]] = [OrderedDict() for _ in range(num_layers)]
        self.reached = -1  # highest running position seen in this pass (until_target)
        # The queues a victim search walks, per running position -1..L-1 (the queue objects
        # are never replaced, only mutated, so the walks stay valid).
        queues = self.stale + self.current
        self.walks = {p: tuple(queues[q] for q in least_stale_walk(order, p, num_layers))
                      for p in range(-1, num_layers)}

    def on_pass_start(self, pass_id):
        for p in range(self.num_layers):
            self.stale[p].update(self.current[p])
            self.current[p].clear()
        self.reached = -1

    def _reach(self, pos: int) -> None:
        """until_target: the pass has reached `pos`; prefetched keys of layers up to it that
        were not requested become stale."""
        for p in range(self.reached + 1, min(pos, self.num_layers - 1) + 1):
            cur = self.current[p]
            if cur and not all(cur.values()):
                moved = [k for k, requested in cur.items() if not requested]
                for k in moved:
                    del cur[k]
                self.stale[p].update(dict.fromkeys(moved))
        self.reached = pos

    def _request(self, key, pos):
        if self.until_target and pos > self.reached:
            self._reach(pos)
        p = self.pos_of[key[0]]
        self.stale[p].pop(key, None)
        self.current[p][key] = True  # keeps its FIFO place if already current

    def _select(self, key, pos):
        """A prefetch selection of `key` by the prefetcher running at `pos`."""
        p = self.pos_of[key[0]]
        if self.until_target:
            if pos > self.reached:
                self._reach(pos)
            if p <= self.reached:  # its target layer has been reached: it stays stale
                if key not in self.current[p]:
                    self.stale[p].setdefault(key, None)
                return
        self.stale[p].pop(key, None)
        self.current[p].setdefault(key, False)

    def on_admit(self, key, pos, prefetch):
        if prefetch:
            self._select(key, pos)
        else:
            self._request(key, pos)

    def on_access(self, key, pos):
        self._request(key, pos)

    def on_touch(self, key, pos):
        self._select(key, pos)

    def on_evict(self, key):
        p = self.pos_of[key[0]]
        self.stale[p].pop(key, None)
        self.current[p].pop(key, None)

    def victim(self, pos, evictable, incoming=None):
        if self.until_target and pos > self.reached:
            self._reach(pos)
        for queue in self.walks[max(-1, min(pos, self.num_layers - 1))]:
            if queue:
                for key in queue:
                    if evictable(key):
                        return key
        return None


@register("eviction", "random")
class RandomEviction(_Base):
    """Uniformly random victim (seeded: runs are reproducible)."""

    name = "random"

    def __init__(self, num_layers: int, num_experts: int, seed: int = 0):
        super().__init__(num_layers, num_experts)
        self.rng = _random.Random(seed)
        self.keys: list[Key] = []
        self.index: dict[Key, int] = {}

    def on_admit(self, key, pos, prefetch):
        self.index[key] = len(self.keys)
        self.keys.append(key)

    def on_evict(self, key):
        i = self.index.pop(key)
        last = self.keys.pop()
        if i < len(self.keys):
            self.keys[i] = last
            self.index[last] = i

    def victim(self, pos, evictable, incoming=None):
        order = self.rng.sample(range(len(self.keys)), len(self.keys))
        for i in order:
            if evictable(self.keys[i]):
                return self.keys[i]
        return None


@register("eviction", "belady")
class Belady(_Base):
    """Belady's MIN, the offline optimum (replay only): evict the resident expert whose next
    use is furthest in the future (never used again first). The future is the trace's router
    selection, so it needs standard routing and the fetch miss policy. Always admits on a
    miss (demand fetch)."""

    name = "belady"
    KERNEL = KernelForm("belady")
    needs_future = True
    replay_only = True

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.future = None
        self.resident: set[Key] = set()
        self.where = (-1, -1)  # (pass, position) of the requests being counted
        self.done = 0  # requests of that layer served so far

    def set_future(self, future, cache) -> None:
        self.future, self.cache = future, cache

    def _now(self, pos: int) -> int:
        """Index of the request being served (the cache serves them in the future's order).
        Before the pass's first layer runs (position -1: the watchdog queue issuing at the pass
        start), that is the pass's first request."""
        here = (self.cache.pass_id, max(pos, 0))
        if here != self.where:
            self.where, self.done = here, 0
        return self.future.layer_start[here[0]][here[1]] + self.done

    def on_access(self, key, pos):
        self._now(pos)
        self.done += 1

    def on_admit(self, key, pos, prefetch):
        self.resident.add(key)

    def on_evict(self, key):
        self.resident.discard(key)

    def next_use(self, key: Key, now: int) -> float:
        uses = self.future.uses.get(key)
        if not uses:
            return float("inf")
        i = bisect.bisect_left(uses, now)
        return uses[i] if i < len(uses) else float("inf")

    def victim(self, pos, evictable, incoming=None):
        if self.future is None:
            raise RuntimeError("belady needs the future: it runs in replay only")
        now = self._now(pos)
        best, best_use = None, None
        for key in self.resident:
            if evictable(key):
                use = self.next_use(key, now)
                if best is None or use > best_use or (use == best_use and key < best):
                    best, best_use = key, use
        return best




@register("eviction", "lhu")
class LHU(_Base):
    """Least High-precision Used (HOBBIT, via SpecMD appendix B): "tracks high-precision expert
    usage frequency, prioritizing retention of frequently-accessed high-precision experts".

    Per key, the number of its uses served at the highest precision in use (`cache_precision`,
    the plain precision: the miss policy's first level) over the whole run (kept across
    evictions, as `lfu`'s counts). Victim: fewest high-precision uses, ties to the least
    recently used (admission, every use and a prefetch selection count as recent). With a
    single precision every use is high-precision: LFU with LRU ties.

    Keys sit in one LRU-ordered bucket per count, the counts in a sorted list: a victim is the
    first evictable key of the lowest buckets (O(1) amortised with one pool; with several, the
    other pools' keys are walked past)."""

    name = "lhu"
    needs_precision = True

    def __init__(self, num_layers: int, num_experts: int, cache_precision: str = "native"):
        super().__init__(num_layers, num_experts)
        self.high = cache_precision or "native"
        self.uses: dict[Key, int] = {}  # high-precision uses, resident or not
        self.buckets: dict[int, OrderedDict[Key, None]] = {}
        self.counts: list[int] = []  # sorted counts with a non-empty bucket
        self.where: dict[Key, int] = {}  # resident key -> its bucket

    def _put(self, key: Key, count: int) -> None:
        bucket = self.buckets.get(count)
        if bucket is None:
            bucket = self.buckets[count] = OrderedDict()
            bisect.insort(self.counts, count)
        bucket[key] = None
        self.where[key] = count

    def _take(self, key: Key) -> None:
        count = self.where.pop(key)
        bucket = self.buckets[count]
        del bucket[key]
        if not bucket:
            del self.buckets[count]
            self.counts.pop(bisect.bisect_left(self.counts, count))

    def on_admit(self, key, pos, prefetch):
        self._put(key, self.uses.get(key, 0))

    def on_access(self, key, pos):
        self.buckets[self.where[key]].move_to_end(key)

    on_touch = on_access  # selected by the prefetcher: recent, not a use

    def on_use_precision(self, key, precision):
        if precision == self.high:
            count = self.uses.get(key, 0) + 1
            self.uses[key] = count
            self._take(key)
            self._put(key, count)

    def on_evict(self, key):
        self._take(key)

    def victim(self, pos, evictable, incoming=None):
        for count in self.counts:
            for key in self.buckets[count]:
                if evictable(key):
                    return key
        return None


@register("eviction", "priority")
class Priority(_Base):
    """Priority eviction, the way ds4 seeds its expert cache from a compiled hotlist
    (`moejax/cache/hotlist.py`): the victim is the evictable resident key of lowest priority,
    least recently used first among equals (admission, every use and a prefetch selection
    count as recent, as in `lru`). A priority is not a pin: a hot expert still goes, but only
    once nothing of lower priority may.

    The cache (or whoever seeds it) hands the priorities over with `set_priorities`; keys it
    does not name, and every key before it is called, have priority 0, so with no priorities
    this is exactly `lru`. Priorities are the integers 0..MAX_PRIORITY (ds4's range): each has
    its own LRU-ordered bucket, so a victim is the first evictable key of the lowest non-empty
    buckets (O(1) amortised when few keys are pinned; the pinned and other pools' keys at a
    bucket's head are walked past, as in `lru`)."""

    name = "priority"
    MAX_PRIORITY = 32

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.priority: dict[Key, int] = {}  # named keys only; absent means 0
        self.buckets: list[OrderedDict[Key, None]] = [OrderedDict()
                                                      for _ in range(self.MAX_PRIORITY + 1)]
        self.where: dict[Key, int] = {}  # resident key -> its bucket
        # Recency of every resident key, so `set_priorities` can rebuild the buckets without
        # losing the LRU order across them.
        self.tick = 0
        self.last: dict[Key, int] = {}

    def set_priorities(self, priorities: dict[Key, int]) -> None:
        """Replaces all priorities (keys absent: 0). May come before any admission or between
        passes; resident keys move to their new buckets keeping their recency order."""
        checked: dict[Key, int] = {}
        for key, value in priorities.items():
            is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            if not (is_int and 0 <= value <= self.MAX_PRIORITY):
                raise ValueError(f"priority of {key} must be an integer in "
                                 f"0..{self.MAX_PRIORITY}, got {value!r}")
            if value:  # 0 is the default: not stored, so `priority` holds the named keys only
                checked[tuple(key)] = int(value)
        self.priority = checked
        for bucket in self.buckets:
            bucket.clear()
        for key in sorted(self.where, key=self.last.__getitem__):
            self._put(key)

    def _put(self, key: Key) -> None:
        p = self.priority.get(key, 0)
        self.buckets[p][key] = None
        self.where[key] = p

    def _use(self, key: Key) -> None:
        self.tick += 1
        self.last[key] = self.tick

    def on_admit(self, key, pos, prefetch):
        if key in self.where:  # re-admission without an eviction: just a use
            self.on_access(key, pos)
            return
        self._put(key)
        self._use(key)

    def on_access(self, key, pos):
        self.buckets[self.where[key]].move_to_end(key)
        self._use(key)

    on_touch = on_access

    def on_evict(self, key):
        del self.buckets[self.where.pop(key)][key]
        del self.last[key]

    def victim(self, pos, evictable, incoming=None):
        for bucket in self.buckets:
            if bucket:
                key = _first_evictable(bucket, evictable)
                if key is not None:
                    return key
        return None
