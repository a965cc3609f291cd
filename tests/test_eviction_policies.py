"""Hand-worked unit tests of every eviction policy (SpecMD §3, appendix B; DESIGN.md "Policy
space"), driving the policy objects directly through the hook sequence `ExpertCache` uses:

* a demand fetch is `on_admit(key, pos, prefetch=False)` then `on_access(key, pos)`;
* a hit is `on_access(key, pos)`;
* a prefetch of a non-resident expert is `on_admit(key, pos, prefetch=True)` only;
* a prefetch of a resident expert is `on_touch(key, pos)`;
* `on_evict(key)` when a victim leaves; `on_pass_start(pass_id)` at each forward pass;
* `victim(pos, evictable, incoming)` with `evictable = lambda k: k not in pinned`.

Layer indices deliberately differ from layer positions (MoE layers 1, 3, 5, ... as in a model
with dense layers in between), so a policy mixing up the two is caught.

`priority` has its own module (tests/test_priority_eviction.py, on this module's `Driver`);
`belady` (replay only) reads the trace's future, handed over as a `Future` with the `Driver`
as the cache whose `pass_id` it reads.
"""

from __future__ import annotations

import numpy as np
import pytest

from moejax.policies import build, names
from moejax.replay.future import Future

# MoE layer index -> position in the pass (0..L-1).
POS3 = {1: 0, 3: 1, 5: 2}
POS4 = {2: 0, 4: 1, 6: 2, 8: 3}


class Driver:
    """Feeds a policy the hook sequence of `ExpertCache` and tracks residency, so a test can
    check that every victim is resident and not pinned."""

    def __init__(self, spec: str, pos_of: dict[int, int], num_experts: int = 8,
                 num_slots: int = 8, seed: int = 0):
        self.pos_of = pos_of
        self.policy = build("eviction", spec, num_layers=len(pos_of), num_experts=num_experts,
                            num_slots=num_slots, seed=seed)
        self.policy.set_layer_positions(pos_of)
        self.resident: set = set()
        self.pass_id = -1

    def start_pass(self):
        self.pass_id += 1
        self.policy.on_pass_start(self.pass_id)

    def fetch(self, key, pos=None):
        """Demand fetch by the layer running at `pos` (default: the key's own layer)."""
        pos = self.pos_of[key[0]] if pos is None else pos
        assert key not in self.resident
        self.resident.add(key)
        self.policy.on_admit(key, pos, False)
        self.policy.on_access(key, pos)

    def hit(self, key, pos=None):
        assert key in self.resident
        self.policy.on_access(key, self.pos_of[key[0]] if pos is None else pos)

    def prefetch(self, key, pos):
        """The prefetcher, running at `pos`, selected `key`."""
        if key in self.resident:
            self.policy.on_touch(key, pos)
        else:
            self.resident.add(key)
            self.policy.on_admit(key, pos, True)

    def evict(self, key):
        self.resident.remove(key)
        self.policy.on_evict(key)

    def victim(self, pos, pinned=(), incoming=None):
        pinned = set(pinned)
        v = self.policy.victim(pos, lambda k: k not in pinned, incoming)
        if v is not None:
            assert v in self.resident, f"{v} is not resident"
            assert v not in pinned, f"{v} is pinned"
        return v

    def evict_victim(self, pos, pinned=(), incoming=None):
        v = self.victim(pos, pinned, incoming)
        assert v is not None
        self.evict(v)
        return v


def run_pass(d: Driver, per_layer: dict[int, list[int]]):
    """One pass in which every layer demand-fetches (or hits) the given experts, in order."""
    d.start_pass()
    for layer in sorted(per_layer, key=d.pos_of.__getitem__):
        for e in per_layer[layer]:
            key = (layer, e)
            if key in d.resident:
                d.hit(key)
            else:
                d.fetch(key)


# ---------------------------------------------------------------------------------------------
# lru


def test_lru_global_recency_evicts_the_next_layers_expert():
    # Pass 0 runs layers 1, 3, 5 (positions 0, 1, 2), two experts each: recency order
    # (1,0) (1,1) (3,0) (3,1) (5,0) (5,1).
    d = Driver("lru", POS3)
    run_pass(d, {1: [0, 1], 3: [0, 1], 5: [0, 1]})
    # Pass 1, layer 1 (position 0) hits its two experts again: they become the most recent,
    # order (3,0) (3,1) (5,0) (5,1) (1,0) (1,1). Layer 1 now needs expert 2: the LRU victim is
    # (3,0) — an expert of the very next layer, needed a moment from now — while the
    # just-used layer-1 experts (not needed again until the next pass) are kept. This is the
    # failure of purely temporal policies that SpecMD describes.
    d.start_pass()
    d.hit((1, 0))
    d.hit((1, 1))
    pinned = {(1, 0), (1, 1), (1, 2)}
    assert d.victim(0, pinned, incoming=(1, 2)) == (3, 0)


def test_lru_skips_pinned_and_evicted_keys():
    d = Driver("lru", POS3)
    run_pass(d, {1: [0, 1], 3: [0, 1], 5: [0, 1]})
    # LRU order (1,0) (1,1) (3,0) ...; pinning the first two leaves (3,0).
    assert d.victim(1, pinned={(1, 0), (1, 1)}) == (3, 0)
    # Once (1,0) is evicted, it is never returned again: the next victim is (1,1).
    d.evict((1, 0))
    assert d.victim(1) == (1, 1)
    # Everything pinned: no victim.
    assert d.victim(1, pinned=set(d.resident)) is None


def test_lru_admission_and_touch_count_as_use():
    d = Driver("lru", POS3)
    d.start_pass()
    d.fetch((1, 0))  # order: (1,0)
    d.fetch((1, 1))  # order: (1,0) (1,1)
    d.prefetch((3, 0), pos=0)  # admitted, never accessed: (1,0) (1,1) (3,0)
    d.hit((1, 0))  # (1,1) (3,0) (1,0)
    # (3,0) was never requested, yet its admission counts as a use later than (1,1)'s.
    assert d.victim(0) == (1, 1)
    assert d.victim(0, pinned={(1, 1)}) == (3, 0)
    # A prefetch touch of (1,1) (already resident) is a use too: (3,0) (1,0) (1,1).
    d.prefetch((1, 1), pos=0)
    assert d.victim(0) == (3, 0)


# ---------------------------------------------------------------------------------------------
# fifo


def test_fifo_admission_order_ignores_accesses():
    d = Driver("fifo", POS3)
    d.start_pass()
    d.fetch((1, 0))
    d.fetch((1, 1))
    d.prefetch((3, 2), pos=0)
    # Admission order (1,0) (1,1) (3,2). Accessing and touching (1,0) does not move it
    # (LRU would now pick (1,1)).
    for _ in range(3):
        d.hit((1, 0))
    d.prefetch((1, 0), pos=0)  # touch
    assert d.victim(0) == (1, 0)
    assert d.victim(0, pinned={(1, 0)}) == (1, 1)
    # Evict (1,0) and bring it back: it is now the newest, (1,1) the oldest.
    d.evict((1, 0))
    d.fetch((1, 0))
    assert d.victim(0) == (1, 1)
    d.evict((1, 1))
    assert d.victim(0) == (3, 2)


# ---------------------------------------------------------------------------------------------
# lru_per_layer


def test_lru_per_layer_quota_split():
    # 6 slots over 3 layers: 2 each; 7 slots: the first layer gets the extra one.
    assert Driver("lru_per_layer", POS3, num_slots=6).policy.quota == [2, 2, 2]
    assert Driver("lru_per_layer", POS3, num_slots=7).policy.quota == [3, 2, 2]


def test_lru_per_layer_own_layer_once_at_quota():
    d = Driver("lru_per_layer", POS3, num_slots=6)
    # Pass 0 fills every layer to its quota of 2: global recency (1,0) (1,1) (3,0) (3,1)
    # (5,0) (5,1).
    run_pass(d, {1: [0, 1], 3: [0, 1], 5: [0, 1]})
    # Pass 1: layer 1 hits (1,1) then (1,0): layer-1 order (1,1) (1,0), and both are now the
    # most recent globally. Incoming (1,2) while only it is pinned: layer 1 holds its quota,
    # so the victim is layer 1's own LRU, (1,1) — global LRU would have taken (3,0).
    d.start_pass()
    d.hit((1, 1))
    d.hit((1, 0))
    assert d.victim(0, pinned={(1, 2)}, incoming=(1, 2)) == (1, 1)
    # Same for an incoming layer-5 key at position 0 (a prefetch): it is the incoming key's
    # layer that counts, not the running one: layer 5's LRU is (5,0).
    assert d.victim(0, pinned={(1, 0), (1, 1)}, incoming=(5, 2)) == (5, 0)


def test_lru_per_layer_borrows_then_repays_from_over_quota_layer():
    d = Driver("lru_per_layer", POS3, num_slots=6)
    # Fill order (ticks 1..6): (5,0) (5,1) (3,0) (3,1) (1,0) (1,1); every layer at quota.
    d.start_pass()
    for key in [(5, 0), (5, 1), (3, 0), (3, 1), (1, 0), (1, 1)]:
        d.fetch(key)
    # A prefill wave of layer 1 needs three experts at once, more than its quota of 2. For
    # incoming (1,2) with (1,0) (1,1) (1,2) pinned: layer 1 is at quota but nothing of it may
    # go; no layer is over quota; so the global LRU among the evictable ones is taken — (5,0)
    # (tick 1) — instead of deadlocking on layer 1's share.
    v = d.evict_victim(0, pinned={(1, 0), (1, 1), (1, 2)}, incoming=(1, 2))
    assert v == (5, 0)
    d.fetch((1, 2), pos=0)  # tick 7; layer 1 now holds 3 (over quota), layer 5 holds 1
    # Incoming (5,2) at position 2: layer 5 is below its quota, so the victim comes from the
    # over-quota layer 1 (its LRU, (1,0), tick 5) — not from the globally least recent
    # (5,1) (tick 2), nor (3,0) (tick 3).
    assert d.victim(2, pinned={(5, 2)}, incoming=(5, 2)) == (1, 0)
    # With (1,0) pinned, layer 1's next evictable entry, (1,1), is taken.
    assert d.victim(2, pinned={(5, 2), (1, 0)}, incoming=(5, 2)) == (1, 1)
    # With all of layer 1 pinned, no over-quota entry may go: global LRU, (5,1).
    assert d.victim(2, pinned={(5, 2), (1, 0), (1, 1), (1, 2)}, incoming=(5, 2)) == (5, 1)


# ---------------------------------------------------------------------------------------------
# lfu


def test_lfu_lowest_count_ties_by_least_recent():
    d = Driver("lfu", POS3)
    d.start_pass()
    d.fetch((1, 0))  # count 1
    d.fetch((1, 1))  # count 1
    d.fetch((3, 0))  # count 1
    d.hit((1, 0))
    d.hit((1, 0))  # (1,0): 3
    d.hit((1, 1))  # (1,1): 2
    # Lowest count: (3,0) with 1.
    assert d.victim(1) == (3, 0)
    # (3,1) fetched now: also count 1, but used more recently than (3,0): the tie goes to the
    # least recent, (3,0); with (3,0) pinned, (3,1).
    d.fetch((3, 1))
    assert d.victim(1) == (3, 0)
    assert d.victim(1, pinned={(3, 0)}) == (3, 1)
    # A prefetched expert not yet used has count 0: first to go.
    d.prefetch((5, 0), pos=1)
    assert d.victim(1) == (5, 0)
    # A prefetch touch is not an access: after a touch (3,0) still has count 1 and its old
    # last use, so it is still the victim (were it counted, (3,0) would have 2 and (3,1) go).
    d.prefetch((3, 0), pos=1)
    assert d.victim(1, pinned={(5, 0)}) == (3, 0)
    # Counts are over the whole run: (1,0) evicted and prefetched back keeps its count of 3.
    d.evict((1, 0))
    d.prefetch((1, 0), pos=1)
    assert d.victim(1, pinned={(5, 0), (3, 0), (3, 1)}) == (1, 1)  # 2 < 3
    assert d.victim(1, pinned={(5, 0), (3, 0), (3, 1), (1, 1)}) == (1, 0)


# ---------------------------------------------------------------------------------------------
# fld


def test_fld_farthest_layer_first_lru_within_layer():
    d = Driver("fld", POS4)
    # Layers 2, 4, 6, 8 at positions 0..3, two experts each; in layer 8, expert 0 is used
    # after expert 1, so (8,1) is that layer's least recent.
    d.start_pass()
    for key in [(2, 0), (2, 1), (4, 0), (4, 1), (6, 0), (6, 1), (8, 1), (8, 0)]:
        d.fetch(key)
    # Running position 1: distances pos0:1 pos1:0 pos2:1 pos3:2 — farthest is position 3
    # (layer 8), LRU within it: (8,1).
    assert d.victim(1) == (8, 1)
    assert d.victim(1, pinned={(8, 1)}) == (8, 0)
    # Layer 8 entirely pinned: positions 0 and 2 tie at distance 1; the tie goes to the lower
    # position (the layer already run this pass): (2,0), the LRU of layer 2.
    assert d.victim(1, pinned={(8, 0), (8, 1)}) == (2, 0)
    # Running position 3: farthest is position 0 (layer 2); after a hit on (2,0) its LRU is
    # (2,1).
    d.hit((2, 0))
    assert d.victim(3) == (2, 1)
    # Running position 0: farthest is position 3 again; the running layer's own experts
    # (distance 0) go last.
    assert d.victim(0, pinned={(8, 0), (8, 1), (6, 0), (6, 1), (4, 0), (4, 1), (2, 1)}) == (2, 0)
    assert d.victim(0, pinned=set(d.resident)) is None


# ---------------------------------------------------------------------------------------------
# score


def test_score_lowest_accumulated_probability_resident_only():
    d = Driver("score", {1: 0, 3: 1}, num_experts=4)
    # on_scores adds router probabilities summed over the pass's tokens:
    # layer 1: [.1 .2 .3 .4] + [.3 .3 .2 .2]     = [.4 .5 .5 .6]
    # layer 3: [.7 .1 .1 .1], next pass + [.05 .05 .1 .8] = [.75 .15 .2 .9]
    d.policy.on_scores(1, np.array([[.1, .2, .3, .4], [.3, .3, .2, .2]]))
    d.policy.on_scores(3, np.array([[.7, .1, .1, .1]]))
    d.policy.on_scores(3, np.array([[.05, .05, .1, .8]]))
    d.start_pass()
    for key in [(1, 0), (1, 1), (3, 2), (3, 3)]:
        d.fetch(key)
    # Resident scores: (1,0) .4, (1,1) .5, (3,2) .2, (3,3) .9. The lowest score overall is the
    # non-resident (3,1) at .15: never a victim. The victim is (3,2) at .2.
    assert d.victim(0) == (3, 2)
    # Then (1,0) (.4), (1,1) (.5), (3,3) (.9).
    assert d.victim(0, pinned={(3, 2)}) == (1, 0)
    assert d.victim(0, pinned={(3, 2), (1, 0)}) == (1, 1)
    assert d.victim(0, pinned={(3, 2), (1, 0), (1, 1)}) == (3, 3)
    assert d.victim(0, pinned=set(d.resident)) is None
    # After (3,2) is evicted it is not chosen again, though its score is the lowest resident.
    d.evict((3, 2))
    assert d.victim(0) == (1, 0)


# ---------------------------------------------------------------------------------------------
# least_stale
# The hand-worked scenarios below are of the two-queue reading (an earlier issue's wording:
# "stale left, then stale right, then current"); the default order is two_queue (tests of the
# orders side by side follow).
TWO_QUEUE = 'least_stale(order="two_queue")'


def test_least_stale_issue_scenario_stale_left_then_stale_right_then_current():
    """"Least-Stale evicts stale experts left of the current layer before stale ones to its
    right, and current ones only when nothing stale is left"."""
    d = Driver(TWO_QUEUE, POS4)
    # Pass 0 runs layers 2, 4, 6, 8 (positions 0..3): every expert becomes current.
    run_pass(d, {2: [0, 1], 4: [0, 1], 6: [0, 1], 8: [0, 1]})
    # Pass 1 starts: all eight are stale. Layer 2 (pos 0) uses (2,0) again: current. The
    # prefetcher running at pos 0 selects (4,1) for layer 4: resident, so a touch makes it
    # current too.
    d.start_pass()
    d.hit((2, 0))
    d.prefetch((4, 1), pos=0)
    # Now layer 4 (pos 1) runs: it hits (4,1) and needs (4,2), both pinned.
    d.hit((4, 1))
    pinned = {(4, 1), (4, 2)}
    # stale:   pos0 (2,1) | pos1 (4,0) | pos2 (6,0) (6,1) | pos3 (8,0) (8,1)
    # current: pos0 (2,0) | pos1 (4,1)
    # 1. The stale expert left of the current layer goes first: (2,1).
    assert d.evict_victim(1, pinned, incoming=(4, 2)) == (2, 1)
    # 2. Then the stale expert of the running layer that it did not request: (4,0).
    assert d.evict_victim(1, pinned, incoming=(4, 2)) == (4, 0)
    # 3. Then stale ones to its right, by ascending position, FIFO within a layer: (6,0),
    #    (6,1), (8,0), (8,1) — before any current expert.
    for expected in [(6, 0), (6, 1), (8, 0), (8, 1)]:
        assert d.evict_victim(1, pinned, incoming=(4, 2)) == expected
    # 4. Nothing stale left: current ones, ascending position: (2,0), then — (4,1) being
    #    pinned — nothing else.
    assert d.victim(1, pinned, incoming=(4, 2)) == (2, 0)
    d.evict((2, 0))
    assert d.victim(1, pinned, incoming=(4, 2)) is None


def test_least_stale_left_before_right_regardless_of_age():
    d = Driver(TWO_QUEUE, POS4)
    # Pass 0: only layer 8 (pos 3) uses (8,0). Pass 1: only layer 2 (pos 0) uses (2,5).
    run_pass(d, {8: [0]})
    run_pass(d, {2: [5]})
    # Pass 2, running layer 4 (pos 1): both are stale; (8,0) is the older one (LRU would take
    # it), but (2,5) is left of the current layer (its layer already ran): it goes first.
    d.start_pass()
    assert d.victim(1, incoming=(4, 0)) == (2, 5)
    # Among stale-left experts, ascending layer position: (2,5) at pos 0 before (4,3) at pos 1
    # even though (4,3) became stale in an earlier pass.
    d2 = Driver(TWO_QUEUE, POS4)
    run_pass(d2, {4: [3]})
    run_pass(d2, {2: [5]})
    d2.start_pass()
    assert d2.victim(2, incoming=(6, 0)) == (2, 5)
    assert d2.victim(2, pinned={(2, 5)}, incoming=(6, 0)) == (4, 3)


def test_least_stale_pass_start_and_touch():
    d = Driver(TWO_QUEUE, POS4)
    d.start_pass()
    d.fetch((2, 0))
    d.fetch((6, 0))
    # Within the pass nothing is stale: the current queue, ascending position: (2,0).
    assert d.victim(1) == (2, 0)
    # At the next pass start every current expert becomes stale: still (2,0) first, but now
    # a use in this pass protects it: (2,0) current, (6,0) stale -> (6,0) goes.
    d.start_pass()
    d.hit((2, 0))
    assert d.victim(1) == (6, 0)
    # A prefetch touch (on_touch) of the stale (6,0) makes it current: now both are current
    # and the ascending-position order of the current queue gives (2,0).
    d.prefetch((6, 0), pos=1)
    assert d.victim(1) == (2, 0)
    # A prefetch *admission* is current as well.
    d.prefetch((8, 1), pos=2)
    assert d.victim(2, pinned={(2, 0), (6, 0)}) == (8, 1)


def test_least_stale_fifo_within_a_queue():
    d = Driver(TWO_QUEUE, POS4)
    # Pass 0, layer 2: (2,3) then (2,1) are fetched, then (2,3) is used again. FIFO keeps
    # (2,3) first in the current queue (LRU would now put (2,1) first).
    d.start_pass()
    d.fetch((2, 3))
    d.fetch((2, 1))
    d.hit((2, 3))
    assert d.victim(0, pinned=set()) == (2, 3)
    # They move to the stale queue in the same order.
    d.start_pass()
    assert d.victim(1) == (2, 3)
    # Stale entries that outlive a pass stay ahead of those that became stale later: in pass
    # 1 only (2,1) is used; at pass 2 the stale queue of layer 2 is (2,3) (stale since pass
    # 1), then (2,1).
    d.hit((2, 1))
    d.fetch((2, 7))
    d.start_pass()
    assert d.victim(1) == (2, 3)
    assert d.victim(1, pinned={(2, 3)}) == (2, 1)
    assert d.victim(1, pinned={(2, 3), (2, 1)}) == (2, 7)


def test_least_stale_defaults_to_the_two_queue_reading():
    # §4's rule (docs/DESIGN.md, "Least-Stale: which reading is the default").
    d = Driver("least_stale", POS4)
    assert (d.policy.order, d.policy.prefetch_current) == ("two_queue", "pass")


def _ls_orders_state(spec: str) -> Driver:
    """Pass 0 uses two experts of every layer (layer 2: 3, 1, 0 in that order); pass 1 reuses
    (2,0) and (4,0), the prefetcher running at pos 1 touches (6,0) and at pos 2 touches
    (8,0); layer 6 (pos 2) is running: it hits (6,0) and needs (6,2), both pinned. Then:

        stale:   pos0 (2,3) (2,1) | pos1 (4,1) | pos2 (6,1) | pos3 (8,1)
        current: pos0 (2,0)       | pos1 (4,0) | pos2 (6,0)*| pos3 (8,0)     (* pinned)
    """
    d = Driver(spec, POS4)
    run_pass(d, {2: [3, 1, 0], 4: [0, 1], 6: [0, 1], 8: [0, 1]})
    d.start_pass()
    d.hit((2, 0))
    d.hit((4, 0))
    d.prefetch((6, 0), pos=1)
    d.hit((6, 0))
    d.prefetch((8, 0), pos=2)
    return d


def _drain(d: Driver, pos: int, pinned, incoming) -> list:
    out = []
    while (v := d.victim(pos, pinned, incoming)) is not None:
        d.evict(v)
        out.append(v)
    return out


LS_PINNED = {(6, 0), (6, 2)}


def test_least_stale_two_queue_order():
    # Stale queue, ascending position, FIFO within a layer ((2,3) entered before (2,1), so
    # it goes first although its id is larger); then the current queue, ascending.
    for spec in ("least_stale", 'least_stale(order="two_queue")'):  # the default
        d = _ls_orders_state(spec)
        assert _drain(d, 2, LS_PINNED, (6, 2)) == [
            (2, 3), (2, 1), (4, 1), (6, 1), (8, 1),  # stale: pos 0, 0, 1, 2, 3
            (2, 0), (4, 0), (8, 0)]  # current, (6,0) pinned


def test_least_stale_left_first_order():
    # Left = position <= 2 (the running layer's own unpinned (6,1) is done for this pass).
    # stale-left, current-left, stale-right, current-right, each ascending: the current-left
    # (2,0) and (4,0) go before the stale-right (8,1), unlike two_queue.
    d = _ls_orders_state('least_stale(order="left_first")')
    assert _drain(d, 2, LS_PINNED, (6, 2)) == [
        (2, 3), (2, 1), (4, 1), (6, 1),  # stale-left
        (2, 0), (4, 0),  # current-left ((6,0) pinned)
        (8, 1),  # stale-right
        (8, 0)]  # current-right


def test_least_stale_cyclic_order():
    # After layer 6 (pos 2) the next use of a layer at position q is (q - 2) mod 4 layers
    # away, 4 for q = 2 itself (the next pass): the order of positions is 2, 1, 0, 3. The
    # stale queue in that order, then the current queue in that order.
    d = _ls_orders_state('least_stale(order="cyclic")')
    assert _drain(d, 2, LS_PINNED, (6, 2)) == [
        (6, 1), (4, 1), (2, 3), (2, 1), (8, 1),  # stale: pos 2, 1, 0, 0, 3
        (4, 0), (2, 0), (8, 0)]  # current: pos 1, 0, 3 ((6,0) pinned)


def test_least_stale_cyclic_right_side_farthest_first():
    # Running layer 2 (pos 0) in pass 1, all of pass 0's experts stale: after pos 0 the
    # positions come round as 1, 2, 3 (then 0 in the next pass), so the order is 0, 3, 2, 1:
    # the next layer's (4,0) is kept longest; two_queue and left_first take ascending 0..3.
    want = {"cyclic": [(2, 1), (8, 0), (6, 0), (4, 0)],
            "two_queue": [(2, 1), (4, 0), (6, 0), (8, 0)],
            "left_first": [(2, 1), (4, 0), (6, 0), (8, 0)]}
    for order, expected in want.items():
        d = Driver(f'least_stale(order="{order}")', POS4)
        run_pass(d, {2: [0, 1], 4: [0], 6: [0], 8: [0]})
        d.start_pass()
        d.hit((2, 0))
        assert _drain(d, 0, {(2, 0), (2, 2)}, (2, 2)) == expected, order


def _ls_prefetch_scenario(spec: str):
    """Pass 0 uses (4,1) and (8,1). Pass 1: layer 2 (pos 0) fetches (2,0); the prefetcher
    running at pos 0 admits (4,5) for layer 4; layer 4 (pos 1) runs and requests only (4,6),
    pinned, not yet fetched. (4,5) was prefetch-selected, never requested."""
    d = Driver(spec, POS4)
    run_pass(d, {4: [1], 8: [1]})
    d.start_pass()
    d.fetch((2, 0))
    d.prefetch((4, 5), pos=0)
    return d


def test_least_stale_prefetch_current_pass():
    d = _ls_prefetch_scenario(TWO_QUEUE)
    # (4,5) stays current for the whole pass: stale (4,1) (8,1) first, then current
    # (2,0) (4,5).
    assert _drain(d, 1, {(4, 6)}, (4, 6)) == [(4, 1), (8, 1), (2, 0), (4, 5)]
    # A touch by the prefetcher makes a stale key current even when its layer already ran.
    d = _ls_prefetch_scenario(TWO_QUEUE)
    d.prefetch((4, 1), pos=3)
    assert _drain(d, 3, {(8, 1)}, (8, 2)) == [(2, 0), (4, 5), (4, 1)]


def test_least_stale_prefetch_current_until_target():
    spec = 'least_stale(order="two_queue", prefetch_current="until_target")'
    d = _ls_prefetch_scenario(spec)
    # While layer 4 has not been reached (running pos 0), (4,5) is current: the stale (4,1),
    # (8,1) go first, then current (2,0)... (pinned (2,0) here: then (4,5)).
    assert d.victim(0, {(2, 0)}, (2, 1)) == (4, 1)
    assert d.victim(0, {(2, 0), (4, 1), (8, 1)}, (2, 1)) == (4, 5)
    # Layer 4 (pos 1) is running and did not request (4,5): it is stale now, appended to
    # layer 4's stale queue behind (4,1) (stale since the pass start).
    assert _drain(d, 1, {(4, 6)}, (4, 6)) == [(4, 1), (4, 5), (8, 1), (2, 0)]

    # A prefetched key that its layer does request is current for the rest of the pass.
    d = _ls_prefetch_scenario(spec)
    d.prefetch((6, 7), pos=1)
    d.fetch((4, 6), pos=1)
    d.hit((6, 7), pos=2)
    assert _drain(d, 3, {(8, 1)}, (8, 2)) == [(4, 1), (4, 5), (2, 0), (4, 6), (6, 7)]

    # A selection for a layer already reached in this pass leaves the key stale; the next
    # pass starts afresh.
    d = _ls_prefetch_scenario(spec)
    d.prefetch((4, 1), pos=3)  # layer 4 (pos 1) already reached: (4,1) stays stale
    assert d.victim(3, {(8, 1)}, (8, 2)) == (4, 1)
    d.prefetch((2, 9), pos=3)  # a new admission for a reached layer enters stale
    assert _drain(d, 3, {(8, 1)}, (8, 2)) == [(2, 9), (4, 1), (4, 5), (2, 0)]
    d.start_pass()
    d.prefetch((8, 1), pos=0)  # reached was reset: current until layer 8 runs
    d.fetch((2, 3))
    d.fetch((4, 4), pos=1)
    assert d.victim(1, {(4, 4)}, None) == (2, 3)  # (8,1) still current at pos 1 (else first)
    assert d.victim(3, {(4, 4)}, None) == (8, 1)  # layer 8 reached, (8,1) not requested


def _ls_reference_victim(policy, ref, pos, evictable):
    """Brute force over `ref` (key -> [current?, requested?, seq]): the order's rank."""
    L = policy.num_layers

    def rank(key):
        cur, req, seq = ref[key]
        p = policy.pos_of[key[0]]
        if policy.order == "two_queue":
            return (cur, p, seq)
        if policy.order == "left_first":
            return (p > pos, cur, p, seq)
        return (cur, (pos - p) % L, seq)

    keys = [k for k in ref if evictable(k)]
    return min(keys, key=rank) if keys else None


def test_least_stale_random_sequences_match_a_brute_force_reference():
    rng = np.random.default_rng(0)
    for order in ("two_queue", "left_first", "cyclic"):
        for pc in ("pass", "until_target"):
            d = Driver(f'least_stale(order="{order}", prefetch_current="{pc}")', POS4)
            layers = sorted(POS4, key=POS4.__getitem__)
            ref, seq, checked, selected = {}, iter(range(10**9)), 0, 0
            for _ in range(40):  # passes
                d.start_pass()
                # Current keys turn stale in the order they had in the current queues.
                for k in sorted((k for k, v in ref.items() if v[0]), key=lambda k: ref[k][2]):
                    ref[k] = [False, False, next(seq)]
                reached = -1
                for layer in layers:
                    pos = POS4[layer]
                    if pc == "until_target":  # prefetch-only keys of reached layers: stale
                        for k in sorted((k for k, v in ref.items() if v[0] and not v[1]
                                         and POS4[k[0]] <= pos), key=lambda k: ref[k][2]):
                            ref[k] = [False, False, next(seq)]
                    reached = pos
                    want = rng.choice(6, size=2, replace=False).tolist()
                    pinned = {(layer, int(e)) for e in want}
                    for key in sorted(pinned):
                        if key not in d.resident and len(d.resident) >= 7:
                            exp = _ls_reference_victim(d.policy, ref, pos,
                                                       lambda k: k not in pinned)
                            assert d.victim(pos, pinned, key) == exp
                            checked += 1
                            d.evict(exp)
                            del ref[exp]
                        if key in d.resident:
                            d.hit(key)
                            if not ref[key][0]:
                                ref[key] = [True, True, next(seq)]
                            ref[key][1] = True
                        else:
                            d.fetch(key)
                            ref[key] = [True, True, next(seq)]
                    if pos + 1 < len(layers) and rng.random() < 0.7:  # prefetch the next layer
                        nxt = layers[pos + 1]
                        for e in rng.choice(6, size=2, replace=False).tolist():
                            key = (nxt, int(e))
                            selected += 1
                            if key in d.resident:
                                d.prefetch(key, pos)
                                if not ref[key][0]:
                                    ref[key] = [True, False, next(seq)]
                            elif len(d.resident) < 7:
                                d.prefetch(key, pos)
                                ref[key] = [True, False, next(seq)]
                assert reached == len(layers) - 1
            assert checked > 100 and selected > 50, (checked, selected)


def test_least_stale_arguments_and_spec_parsing():
    from moejax.errors import ConfigError
    from moejax.policies.registry import policy_class

    ctx = dict(num_layers=4, num_experts=8, num_slots=8, seed=0)
    p = build("eviction", 'least_stale(order="left_first")', **ctx)
    assert (p.name, p.order, p.prefetch_current) == ("least_stale", "left_first", "pass")
    p = build("eviction", 'least_stale("cyclic", prefetch_current="until_target")', **ctx)
    assert (p.order, p.prefetch_current) == ("cyclic", "until_target")
    assert policy_class("eviction", 'least_stale(order="cyclic")').name == "least_stale"
    with pytest.raises(ConfigError, match=r"order='lifo' must be one of 'two_queue', "
                                          r"'left_first', 'cyclic'"):
        build("eviction", 'least_stale(order="lifo")', **ctx)
    with pytest.raises(ConfigError, match=r"prefetch_current='layer' must be one of 'pass', "
                                          r"'until_target'"):
        build("eviction", 'least_stale(prefetch_current="layer")', **ctx)
    with pytest.raises(ConfigError, match=r"unknown argument 'ordr'.*'order', "
                                          r"'prefetch_current'"):
        build("eviction", 'least_stale(ordr="cyclic")', **ctx)


# ---------------------------------------------------------------------------------------------
# random


def _random_draws(seed: int, n: int = 60) -> list:
    d = Driver("random", POS4, seed=seed)
    d.start_pass()
    for layer in POS4:
        for e in range(4):
            d.fetch((layer, e))
    return [d.victim(1) for _ in range(n)]


def test_random_reproducible_and_seeded():
    a, b, c = _random_draws(0), _random_draws(0), _random_draws(1)
    assert a == b
    assert a != c
    # Over 60 draws from 16 keys, more than one key shows up.
    assert len(set(a)) > 1


def test_random_never_pinned_and_consistent_after_evictions():
    d = Driver("random", POS4, seed=3)
    d.start_pass()
    keys = [(layer, e) for layer in POS4 for e in range(3)]
    for key in keys:
        d.fetch(key)
    # Only one key evictable: always it.
    free = (6, 1)
    for _ in range(20):
        assert d.victim(1, pinned=set(keys) - {free}) == free
    assert d.victim(1, pinned=set(keys)) is None
    # Random evictions and re-admissions: the Driver asserts every victim is resident and
    # unpinned (the swap-remove bookkeeping stays consistent).
    for i in range(40):
        pinned = {keys[i % len(keys)], keys[(i * 5) % len(keys)]}
        v = d.evict_victim(i % 4, pinned)
        d.fetch(v)  # it comes back at once
        assert len(d.resident) == len(keys)


# ---------------------------------------------------------------------------------------------


def test_lhu_evicts_the_fewest_high_precision_uses_then_lru():
    lhu = build("eviction", "lhu", num_layers=3, num_experts=8, num_slots=6, seed=0,
                cache_precision="int8")
    assert lhu.needs_precision
    lhu.set_layer_positions({0: 0, 1: 1, 2: 2})
    a, b, c = (0, 1), (1, 2), (2, 3)
    for key in (a, b, c):
        lhu.on_admit(key, 0, False)
    anything = lambda k: True  # noqa: E731
    assert lhu.victim(0, anything) == a  # no uses yet: least recently admitted
    for key, level in ((a, "int8"), (a, "int8"), (b, "int4"), (b, "int4"), (b, "int4"),
                       (c, "int8")):
        lhu.on_access(key, 0)
        lhu.on_use_precision(key, level)
    # b was used most, but never at the high precision: it goes first.
    assert lhu.victim(0, anything) == b
    assert lhu.victim(0, lambda k: k != b) == c  # one high use against a's two
    lhu.on_evict(b)
    lhu.on_evict(c)
    lhu.on_admit(c, 0, False)  # counts survive eviction (as LFU's)
    assert lhu.uses[c] == 1 and lhu.victim(0, anything) == c
    lhu.on_access(c, 0)
    lhu.on_use_precision(c, "int8")  # ties with a (two each): the least recent goes
    assert lhu.victim(0, anything) == a
    assert lhu.victim(0, lambda k: False) is None


# ---------------------------------------------------------------------------------------------
# belady


def _belady(pos_of: dict[int, int], passes: list[list[list[int]]]) -> Driver:
    """Belady driven through the hooks, its future `passes` ([pass][layer position] ->
    experts in router-rank order) and the Driver as the cache whose `pass_id` it reads."""
    d = Driver("belady", pos_of, num_slots=2)
    d.policy.set_future(Future(passes, list(pos_of)), d)
    return d


def test_belady_evicts_the_furthest_next_use_then_the_smallest_key():
    """One MoE layer (index 1, position 0), top-1, 2 slots. The requests, one per pass, on the
    global request clock t:

        t:       0  1  2  3  4  5
        expert:  0  1  2  0  2  1

    t=0, t=1: misses fill the two slots with (1,0) and (1,1).
    t=2: (1,2) misses; next uses: (1,0) at t=3, (1,1) at t=5 -> evict (1,1), the furthest
         (LRU would evict (1,0), the least recent).
    t=3: (1,0) hits; t=4: (1,2) hits.
    t=5: (1,1) misses; neither (1,0) nor (1,2) is used again (both "infinitely" far): the
         tie goes to the smallest key, (1,0).
    """
    d = _belady({1: 0}, [[[0]], [[1]], [[2]], [[0]], [[2]], [[1]]])
    d.start_pass()
    d.fetch((1, 0))
    d.start_pass()
    d.fetch((1, 1))
    d.start_pass()
    assert d.victim(0, pinned={(1, 1)}) == (1, 0)  # the furthest is pinned: the other goes
    assert d.victim(0, pinned={(1, 0), (1, 1)}) is None
    assert d.evict_victim(0) == (1, 1)
    d.fetch((1, 2))
    d.start_pass()
    d.hit((1, 0))
    d.start_pass()
    d.hit((1, 2))
    d.start_pass()
    assert d.evict_victim(0) == (1, 0)
    d.fetch((1, 1))
    assert d.resident == {(1, 1), (1, 2)}


def test_belady_counts_the_clock_per_layer_position_and_request():
    """MoE layers 3 and 7 at positions 0 and 1, top-2 at layer 3 and top-1 at layer 7, 2 slots.
    The global clock counts requests pass by pass, layer by layer, in router-rank order:

        pass 0: layer 3 -> 4 (t=0), 5 (t=1);  layer 7 -> 4 (t=2)
        pass 1: layer 3 -> 5 (t=3), 6 (t=4);  layer 7 -> 4 (t=5)

    Pass 0: (3,4) and (3,5) fill the slots. At layer 7 (position 1, t=2) (7,4) misses: (3,4)
    is never used again, (3,5) at t=3 -> evict (3,4).
    Pass 1, layer 3: (3,5) hits (t=3); then (3,6) misses at t=4, nothing pinned: (3,5)'s use
    at t=3 is past, so it is never used again, while (7,4) is used at t=5 -> evict (3,5).
    (A clock that did not count the hit, t=3, would keep (3,5) and evict (7,4).)
    At layer 7 (t=5) (7,4) hits.
    """
    d = _belady({3: 0, 7: 1}, [[[4, 5], [4]], [[5, 6], [4]]])
    d.start_pass()
    d.fetch((3, 4))
    d.fetch((3, 5))
    assert d.evict_victim(1) == (3, 4)
    d.fetch((7, 4))
    d.start_pass()
    d.hit((3, 5))
    assert d.evict_victim(0) == (3, 5)
    d.fetch((3, 6))
    d.hit((7, 4))
    assert d.resident == {(3, 6), (7, 4)}


def test_belady_without_its_future_refuses():
    policy = Driver("belady", {1: 0}).policy
    policy.on_admit((1, 0), 0, False)
    with pytest.raises(RuntimeError, match="needs the future"):
        policy.victim(0, lambda k: True)


def test_every_registered_eviction_policy_has_hand_worked_tests():
    """The registry's evictions against the ones this module (and priority's own) work by
    hand: a new policy needs its tests."""
    import inspect
    import sys

    tests = [n for n, f in inspect.getmembers(sys.modules[__name__], inspect.isfunction)
             if n.startswith("test_")]
    worked = {"priority", "s3fifo", "arc"}  # tests/test_{priority_eviction,s3fifo,arc}.py
    for name in names("eviction"):
        if any(t.startswith(f"test_{name}_") for t in tests):
            worked.add(name)
    assert worked == set(names("eviction"))
