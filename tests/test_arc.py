"""`arc` eviction (`moejax/policies/arc.py`), step by step against ARC's rules (Megiddo & Modha,
FAST 2003, Fig. 4): request sequences through a real `ExpertCache`, each victim, list and target
`p` worked out by hand in the comments; the hooks alone where the cache cannot reach a case; a
replay of a shipped capture held to the cache's and ARC's invariants; the conformance kit.

The toy cache: one MoE layer of 8 experts, top-1, 3 slots (c = 3); a request is one pass of
one token, so the letters below are experts A=0, B=1, ... and every miss on a full cache
evicts. Lists are written oldest first."""

from __future__ import annotations

import numpy as np
import pytest

from moejax.bundled import capture_path
from moejax.cache import CacheOptions, CacheShape, ExpertCache, build_cache_for
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.policies import build, conformance
from moejax.replay import replay
from moejax.seam import LayerGate
from moejax.timing import hardware
from moejax.timing.clock import VirtualClock
from moejax.traces import load_traces
from tests.cache_checks import check_final
from tests.test_eviction_policies import Driver

E = 8
NAMES = "ABCDEFGH"  # experts 0..7
C, D = NAMES.index("C"), NAMES.index("D")


def _toy(slots: int = 3, eviction: str = "arc") -> ExpertCache:
    shape = CacheShape((0,), 1, E, 1, 1000, slots)
    ctx = dict(num_layers=1, num_experts=E, top_k=1, num_slots=slots, seed=0, renormalize=True)
    return ExpertCache(shape, build("eviction", eviction, **ctx), build("prefetch", "none", **ctx),
                       build("miss", "fetch", **ctx), build("routing", "standard", **ctx),
                       CacheOptions(VirtualClock(hardware.get("a100_specmd")), cost=None,
                                    sink=None))


def _request(cache: ExpertCache, *experts: int) -> None:
    """One pass of the layer, one token per expert (one wave: all of them pinned)."""
    ids = np.array([[e] for e in experts], np.int64)
    cache.begin_pass("decode", len(experts), 1)
    list(cache.run_layer(LayerGate(0, ids, None, None)))
    cache.check_invariants()
    cache.end_pass()


def _requests(cache: ExpertCache, letters: str) -> None:
    for ch in letters:
        _request(cache, NAMES.index(ch))


def _names(keys) -> str:
    return "".join(NAMES[e] for _, e in keys)


def _resident(cache: ExpertCache) -> str:
    return "".join(sorted(_names(cache.resident_keys())))


def _lists(cache: ExpertCache) -> tuple[str, str, str, str]:
    arc = cache.eviction
    return _names(arc.t1), _names(arc.t2), _names(arc.b1), _names(arc.b2)


def test_a_scan_of_new_experts_does_not_evict_one_used_twice():
    cache = _toy()
    # A, A: A is fetched (T1; the fetch's own use is no hit), then hit: to T2. B, C fill the
    # cache in T1. D: |T1| = 2 > p = 0, so T1's oldest, B, goes (to B1). E: C goes (B1 = B, C;
    # then |T1| + |B1| = 2 + 2 > c: B1's oldest, B, is forgotten). F: D goes, C forgotten.
    _requests(cache, "AABCDEF")
    assert _resident(cache) == "AEF"
    assert _lists(cache) == ("EF", "A", "D", "")
    assert cache.eviction.p == 0
    assert cache.metrics.totals()["evictions"] == 3
    # LRU on the same requests: A is the oldest when D comes, and goes.
    lru = _toy(eviction="lru")
    _requests(lru, "AABCDEF")
    assert _resident(lru) == "DEF"


def test_a_ghost_hit_in_b1_raises_p_and_changes_the_next_victim():
    cache = _toy()
    # A, A: T2 = A. B, C: T1 = B C. D: B goes (|T1| = 2 > 0): B1 = B, T1 = C D.
    _requests(cache, "AABCD")
    assert _lists(cache) == ("CD", "A", "B", "")
    # B, from B1: p += max(1, |B2| / |B1| = 0 / 1) = 1. REPLACE with p = 1: |T1| = 2 > 1, C
    # goes to B1; B enters T2.
    _requests(cache, "B")
    assert cache.eviction.p == 1
    assert _lists(cache) == ("D", "AB", "C", "")
    # E, new: |T1| = 1 is not above p = 1, so T2's oldest, A, goes (with p = 0 it would be D).
    _requests(cache, "E")
    assert _resident(cache) == "BDE"
    assert _lists(cache) == ("DE", "B", "C", "A")


def test_the_b1_step_is_the_ratio_of_the_ghosts_not_rounded():
    cache = _toy()
    # A A B B: T2 = A B. C: T1 = C. D: |T1| = 1 > 0, C goes: B1 = C. D again: to T2 = A B D.
    # E: |T1| = 0, A (T2's oldest) goes: B2 = A. E again: T2 = B D E. F: B goes: B2 = A B,
    # T1 = F.
    _requests(cache, "AABBCDDEEF")
    assert _lists(cache) == ("F", "DE", "C", "AB")
    # C, from B1: p += max(1, |B2| / |B1| = 2 / 1) = 2. |T1| = 1 is not above 2: D (T2's oldest)
    # goes; C enters T2.
    _requests(cache, "C")
    assert cache.eviction.p == 2
    assert _lists(cache) == ("F", "EC", "", "ABD")
    # G, new: |T1| = 1 <= 2, E goes (B2 = A B D E); G enters T1, and the four lists would hold
    # 7 > 2c = 6 keys: B2's oldest, A, is forgotten. H, new: |T1| = 2 <= 2, C goes, B
    # forgotten. (A step of 1, p = 1, would evict F here instead.)
    _requests(cache, "GH")
    assert _resident(cache) == "FGH"
    assert _lists(cache) == ("FGH", "", "", "DEC")


def test_a_ghost_hit_in_b2_lowers_p_and_evicts_from_t1_at_the_target():
    cache = _toy()
    # E C B: T1 = E C B. E again: T2 = E. D: |T1| = 2 > 0, C goes: B1 = C, T1 = B D.
    # C, from B1: p = 1; |T1| = 2 > 1, B goes; C to T2 = E C, B1 = B, T1 = D.
    # B, from B1: p = 2; |T1| = 1 <= 2, E goes (B2 = E); B to T2 = C B, B1 empty.
    _requests(cache, "ECBEDCB")
    assert cache.eviction.p == 2
    assert _lists(cache) == ("D", "CB", "", "E")
    # E, from B2: p -= max(1, |B1| / |B2| = 0 / 1) = 1, so p = 1 = |T1| and E is in B2: T1's
    # oldest, D, goes (without the step, or at |T1| = p without E in B2, it would be C).
    _requests(cache, "E")
    assert cache.eviction.p == 1
    assert _resident(cache) == "BCE"
    assert _lists(cache) == ("", "CBE", "D", "")


def test_when_the_chosen_list_is_all_pinned_the_victim_comes_from_the_other():
    cache = _toy()
    # A A B B: T2 = A B. Then one pass asks for C and D together (one wave, both pinned):
    # C takes the free slot (T1 = C); for D, REPLACE chooses T1 (|T1| = 1 > 0), whose only
    # expert is pinned: T2's oldest, A, goes.
    _requests(cache, "AABB")
    _request(cache, C, D)
    assert _resident(cache) == "BCD"
    assert _lists(cache) == ("CD", "B", "", "A")


def test_refused_experts_keep_their_places():
    d = Driver("arc", {1: 0}, num_slots=4)
    a, b, c, e = (1, 0), (1, 1), (1, 2), (1, 3)
    for key in (a, b, c, e):
        d.fetch(key)
    d.hit(c)
    d.hit(e)
    arc = d.policy
    assert (list(arc.t1), list(arc.t2)) == ([a, b], [c, e])
    # REPLACE chooses T1 (|T1| = 2 > p = 0): its oldest that may go; then T2's; then none.
    assert d.victim(0, pinned={a}) == b
    assert d.victim(0, pinned={a, b}) == c
    assert d.victim(0, pinned={a, b, c}) == e
    assert d.victim(0, pinned={a, b, c, e}) is None
    assert (list(arc.t1), list(arc.t2)) == ([a, b], [c, e])  # asking moved nothing
    assert d.evict_victim(0, pinned={a}) == b
    assert d.victim(0) == a  # a kept its place: T1's oldest


def test_a_prefetch_is_not_a_use_and_a_touch_moves_nothing():
    d = Driver("arc", {1: 0}, num_slots=4)
    a, b, c = (1, 0), (1, 1), (1, 2)
    d.prefetch(a, 0)  # admitted by the prefetcher: T1, no use
    d.fetch(b)  # a demand fetch and its own use: T1
    arc = d.policy
    assert (list(arc.t1), list(arc.t2)) == ([a, b], [])
    d.prefetch(a, 0)  # selected again while resident: nothing moves
    assert (list(arc.t1), list(arc.t2)) == ([a, b], [])
    d.hit(a)  # the prefetched expert's first use is a hit (case I): to T2
    d.prefetch(c, 0)
    d.hit(c)  # also when it comes right after the prefetch
    assert (list(arc.t1), list(arc.t2)) == ([b], [a, c])
    d.hit(a)  # a hit in T2: to its most recent end
    assert list(arc.t2) == [c, a]


def test_an_upgrade_is_neither_an_eviction_nor_a_ghost_hit():
    # Two pools (int8, int4) with room for every expert. Pass 1 fetches 0 at int8 and 1 at
    # int4: T1 = 0 1. Pass 2 wants 1 at int8: its int4 copy leaves (`on_evict`) and it is
    # fetched again (`on_admit`); 2 is fetched at int4.
    c = base_config()
    c.clock.kind, c.cache.capacity_frac = "virtual", 1.0
    c.policies.eviction, c.policies.prefetch, c.policies.routing = "arc", "none", "standard"
    c.policies.miss = "fetch_priority(levels='int8:int4', percentile=60, upgrade=True)"
    cache = build_cache_for(resolve(c), None, {"native": 1000, "int8": 500, "int4": 250},
                            True, layers=(0,), num_layers=1, num_experts=8, top_k=2)

    def one_pass(ids, weights):
        cache.begin_pass("decode", 1, 1)
        for _ in cache.run_layer(LayerGate(0, np.array([ids], np.int64),
                                           np.array([weights], np.float32), None)):
            pass
        cache.check_invariants()
        cache.end_pass()

    one_pass([0, 1], [0.9, 0.1])
    arc = cache.eviction
    assert (list(arc.t1), list(arc.t2)) == ([(0, 0), (0, 1)], [])
    one_pass([1, 2], [0.9, 0.1])
    assert cache.metrics.totals()["upgrades"] == 1
    # 1 was requested again: a hit (to T2), not a return from B1 (which would raise p).
    assert (list(arc.t1), list(arc.t2)) == ([(0, 0), (0, 2)], [(0, 1)])
    assert (list(arc.b1), list(arc.b2), arc.p) == ([], [], 0)


def test_an_upgrade_that_needs_a_victim_is_no_ghost_hit():
    # The hooks of an upgrade whose pool is full: the low copy leaves, a victim is asked for
    # the key coming back, and it is admitted and used. Letters as above, c = 3; the first
    # requests as in the B1 test: p = 1, T1 = D, T2 = A B, B1 = C.
    d = Driver("arc", {0: 0}, num_slots=3)
    for ch in "AABCDB":
        key = (0, NAMES.index(ch))
        if key in d.resident:
            d.hit(key)
        else:
            if len(d.resident) == 3:
                d.evict_victim(0, incoming=key)
            d.fetch(key)
    arc, a, b = d.policy, (0, 0), (0, 1)
    assert (_names(arc.t1), _names(arc.t2), _names(arc.b1), arc.p) == ("D", "AB", "C", 1)
    d.evict(a)  # A's low copy leaves
    # A is no return from B2 (which would lower p to 0 and take T1's D): p = 1 = |T1|, and
    # T2's oldest, B, goes.
    assert d.evict_victim(0, incoming=a) == b
    d.fetch(a)  # A at its new precision, and its request: a hit, to T2's recent end
    assert (_names(arc.t1), _names(arc.t2), _names(arc.b1), _names(arc.b2), arc.p) == (
        "D", "A", "C", "B", 1)


def _arc_invariants(cache) -> None:
    arc, c = cache.eviction, cache.shape.num_slots
    t1, t2, b1, b2 = (set(q) for q in (arc.t1, arc.t2, arc.b1, arc.b2))
    assert t1 | t2 == cache.resident_keys()
    assert len(t1) + len(t2) + len(b1) + len(b2) == len(t1 | t2 | b1 | b2)  # disjoint
    assert len(t1) + len(b1) <= c and len(t1) + len(t2) + len(b1) + len(b2) <= 2 * c
    assert 0 <= arc.p <= c


@pytest.mark.parametrize("prefetch", ["none", "temporal"])
def test_a_shipped_capture_replays_within_the_invariants_and_twice_the_same(prefetch):
    traces = load_traces(capture_path("qwen_code"))
    t = traces[0]
    totals = []
    for _ in range(2):
        c = base_config()
        c.job = "replay"
        c.policies.eviction, c.policies.prefetch = "arc", prefetch
        c.policies.miss, c.policies.routing = "fetch", "standard"
        c.cache.slots = 64
        cache = build_cache_for(resolve(c), None, {"native": 1}, False,
                                layers=tuple(t.layers), num_layers=max(t.layers) + 1,
                                num_experts=t.num_experts, top_k=t.top_k)
        replay(cache, traces, engine="reference")
        check_final(cache)  # hits + late hits + misses = requests, and the slots' bookkeeping
        _arc_invariants(cache)
        totals.append(cache.metrics.totals())
    first, again = totals
    assert first["requests"] > 0 and first["evictions"] > 0
    assert (first["prefetch_issued"] > 0) == (prefetch != "none")
    for k in ("requests", "hits", "late_hits", "misses", "collision_misses", "evictions"):
        assert first[k] == again[k], k


def test_the_conformance_kit_passes_it():
    report = conformance.check("moejax.policies.arc:ARC", captures=())
    assert report.policy == "eviction arc" and report.passed, report.table()
