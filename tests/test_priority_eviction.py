"""The `priority` eviction policy (ds4's hotlist priorities, `moejax/cache/hotlist.py`):
hand-worked victim orders through the hook sequence `ExpertCache` uses (the `Driver` of
test_eviction_policies.py), and two property tests: with all priorities equal it chooses
exactly what `lru` chooses, and with any priorities its victim is the lowest (priority, last
use) among the evictable resident keys."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.policies import build, names
from tests.test_eviction_policies import POS3, Driver

A, B, C, D = (1, 0), (3, 0), (5, 0), (1, 1)
KEYS = [(layer, e) for layer in POS3 for e in range(4)]


def victim_order(d: Driver, pos: int = 0) -> list:
    """Every resident key in the order the policy would evict them (each victim pinned in
    turn, so nothing is evicted)."""
    order: list = []
    while (v := d.victim(pos, pinned=order)) is not None:
        order.append(v)
    return order


def fetch_all(d: Driver, keys) -> None:
    for key in keys:
        d.fetch(key)


def test_priority_is_registered_and_builds_like_the_others():
    assert "priority" in names("eviction") and "priority" in names("eviction", live=True)
    p = build("eviction", "priority", num_layers=3, num_experts=8, top_k=2, num_slots=6,
              seed=0, renormalize=True)
    assert (p.num_layers, p.num_experts) == (3, 8)


def test_lowest_priority_goes_first_unlisted_keys_are_zero():
    d = Driver("priority", POS3)
    d.policy.set_priorities({A: 5, B: 2})  # C and D unlisted: priority 0
    fetch_all(d, [A, B, C, D])
    assert victim_order(d) == [C, D, B, A]
    # Evicting really removes them: the next victims follow the same order.
    assert d.evict_victim(0) == C
    assert d.evict_victim(0) == D
    assert d.evict_victim(0) == B
    assert d.evict_victim(0) == A
    assert d.victim(0) is None


def test_ties_go_least_recently_used_first():
    d = Driver("priority", POS3)
    d.policy.set_priorities({A: 3, B: 3, C: 3})
    fetch_all(d, [A, B, C])
    d.hit(A)  # A becomes the most recent of the three
    assert victim_order(d) == [B, C, A]
    d.prefetch(B, pos=0)  # a prefetch selection of a resident key is a use too
    assert victim_order(d) == [C, A, B]


def test_admission_counts_as_a_use():
    d = Driver("priority", POS3)
    fetch_all(d, [A, B])
    d.prefetch(C, pos=0)  # admitted by the prefetcher, never requested: still the newest
    assert victim_order(d) == [A, B, C]


def test_non_evictable_keys_are_skipped_within_and_across_buckets():
    d = Driver("priority", POS3)
    d.policy.set_priorities({A: 1, B: 1, C: 7})
    fetch_all(d, [D, A, B, C])  # bucket 0: D; bucket 1: A, B; bucket 7: C
    assert d.victim(0, pinned={D}) == A  # the whole lowest bucket pinned: the next one
    assert d.victim(0, pinned={D, A}) == B  # the head of a bucket pinned: the next in it
    assert d.victim(0, pinned={D, A, B}) == C
    assert d.victim(0, pinned={A, B, C, D}) is None


def test_set_priorities_after_admissions_rebuckets_keeping_recency():
    d = Driver("priority", POS3)
    fetch_all(d, [A, B, C, D])
    d.hit(A)  # recency, oldest first: B C D A
    assert victim_order(d) == [B, C, D, A]  # no priorities: plain LRU
    d.policy.set_priorities({A: 1, B: 1})
    assert victim_order(d) == [C, D, B, A]  # B older than A in their new bucket
    d.policy.set_priorities({C: 4})  # replaces all: A and B are back to 0
    assert victim_order(d) == [B, D, A, C]


def test_evicted_key_keeps_its_priority_and_readmits_as_the_newest():
    d = Driver("priority", POS3)
    d.policy.set_priorities({A: 2, B: 2})
    fetch_all(d, [A, B, C])
    assert d.evict_victim(0) == C
    d.evict(A)
    d.fetch(A)  # back in bucket 2, behind B
    assert victim_order(d) == [B, A]
    d.fetch(C)  # priority 0 again on readmission
    assert victim_order(d) == [C, B, A]


@pytest.mark.parametrize("bad", [33, -1, 1.5, True, "3"])
def test_priorities_outside_0_to_32_are_rejected(bad):
    d = Driver("priority", POS3)
    with pytest.raises(ValueError, match=r"0\.\.32"):
        d.policy.set_priorities({A: bad})


# --- properties ------------------------------------------------------------------------------


@st.composite
def hook_ops(draw, with_priorities: bool):
    """A random hook sequence the cache could send: fetches, hits, prefetches, evictions,
    victim queries with random pins, pass starts and (re)settings of the priorities."""
    resident: set = set()
    ops = []
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["fetch", "fetch", "hit", "prefetch", "evict", "victim",
                                     "victim", "pass", "prio"]))
        key = draw(st.sampled_from(KEYS))
        if kind in ("fetch", "hit", "prefetch", "evict"):
            if kind in ("hit", "evict") and key not in resident:
                continue
            if kind == "fetch" and key in resident:
                kind = "hit"
            if kind == "evict":
                resident.discard(key)
            elif kind != "hit":
                resident.add(key)
            ops.append((kind, key, draw(st.integers(0, 2))))
        elif kind == "victim":
            pinned = draw(st.sets(st.sampled_from(KEYS), max_size=4))
            ops.append((kind, pinned, draw(st.integers(0, 2))))
        elif kind == "pass":
            ops.append((kind, None, 0))
        elif with_priorities:
            ops.append((kind, draw(st.dictionaries(st.sampled_from(KEYS), st.integers(0, 32),
                                                   max_size=6)), 0))
        else:  # all equal: every key of the universe gets the same priority
            ops.append((kind, dict.fromkeys(KEYS, draw(st.integers(0, 32))), 0))
    return ops


def _apply(d: Driver, op) -> None:
    kind, key, pos = op
    if kind == "fetch":
        d.fetch(key, pos)
    elif kind == "hit":
        d.hit(key, pos)
    elif kind == "prefetch":
        d.prefetch(key, pos)
    elif kind == "evict":
        d.evict(key)
    elif kind == "pass":
        d.start_pass()
    elif kind == "prio" and hasattr(d.policy, "set_priorities"):
        d.policy.set_priorities(key)


@settings(max_examples=50, deadline=None)
@given(ops=hook_ops(with_priorities=False))
def test_equal_priorities_choose_exactly_what_lru_chooses(ops):
    prio, lru = Driver("priority", POS3), Driver("lru", POS3)
    for op in ops:
        if op[0] == "victim":
            pinned, pos = op[1], op[2]
            assert prio.victim(pos, pinned) == lru.victim(pos, pinned), ops
        else:
            _apply(prio, op)
            _apply(lru, op)


@settings(max_examples=50, deadline=None)
@given(ops=hook_ops(with_priorities=True))
def test_victim_is_the_lowest_priority_then_least_recent(ops):
    d = Driver("priority", POS3)
    priorities: dict = {}
    last: dict = {}  # key -> time of its last use (admission, request or prefetch selection)
    for t, op in enumerate(ops):
        kind, key, pos = op
        if kind == "victim":
            free = [k for k in d.resident if k not in key]
            want = min(free, key=lambda k: (priorities.get(k, 0), last[k]), default=None)
            assert d.victim(pos, key) == want, ops
            continue
        _apply(d, op)
        if kind == "prio":
            priorities = dict(key)
        elif kind in ("fetch", "hit", "prefetch"):
            last[key] = t
