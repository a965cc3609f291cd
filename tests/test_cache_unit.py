"""`ExpertCache` driven directly (no JAX, no model): hand-built `LayerGate`s for a 3-layer,
6-expert, top-2 toy, a `VirtualClock` on SpecMD's A100 profile (5 GB/s, 10 us latency, one
copy engine), no cost model (compute takes no virtual time unless the test says so) and no
slot sink. Every counter and time below is worked out by hand.

Transfer time of one expert: T = latency + bytes / bandwidth = 10 us + 50 kB / 5 GB/s = 20 us;
transfers run FIFO on the single copy engine, so k experts issued at once land at T, 2T, ...
"""

from __future__ import annotations

import numpy as np
import pytest

from moejax.cache import CacheOptions, CacheShape, ExpertCache, slots_for
from moejax.errors import ConfigError
from moejax.policies import build
from moejax.seam import LayerGate
from moejax.timing import hardware
from moejax.timing.clock import VirtualClock

E, K, B = 6, 2, 50_000
HW = hardware.get("a100_specmd")
T = HW.h2d_latency_s + B / (HW.h2d_gbps * 1e9)
COUNTERS = ("requests", "hits", "late_hits", "misses", "collision_misses", "dropped",
            "prefetch_issued", "prefetch_used", "recall_served", "recall_requests",
            "evictions", "waves", "demand_bytes", "prefetch_bytes", "wasted_prefetch_bytes")


def make_cache(slots, eviction="lru", prefetch="none", miss="fetch", routing="standard",
               layers=(0, 1, 2), num_layers=3, hw=HW, **cache_args):
    shape = CacheShape(tuple(layers), num_layers, E, K, B, slots)
    ctx = dict(num_layers=len(layers), num_experts=E, top_k=K, num_slots=slots, seed=0,
               renormalize=True)
    return ExpertCache(shape, build("eviction", eviction, **ctx),
                       build("prefetch", prefetch, **ctx), build("miss", miss, **ctx),
                       build("routing", routing, **ctx),
                       CacheOptions(VirtualClock(hw), cost=None, sink=None, **cache_args))


def make_gate(layer, ids, next_layer=None, next_scores=None):
    """Gate of `layer`; `next_scores` (length E) are the speculative scores of `next_layer`.
    Weights are uniform and probs put 1/K on each selected expert (per token)."""
    ids = np.asarray(ids, np.int64)
    n = len(ids)
    probs = np.zeros((n, E))
    np.put_along_axis(probs, ids, 1.0 / K, axis=1)
    if next_layer is None:
        spec, spec_layers = np.zeros((1, n, E), np.float32), ()
    else:
        spec = np.broadcast_to(np.asarray(next_scores, np.float32), (1, n, E)).copy()
        spec_layers = (next_layer,)
    return LayerGate(layer, ids, np.full(ids.shape, 1.0 / K, np.float32), probs, spec,
                     spec_layers)


def run_layer(cache, gate):
    waves = list(cache.run_layer(gate))
    cache.check_invariants()
    return waves


def counters(cache):
    return {k: cache.metrics.per_layer[k].copy() for k in COUNTERS}


def diff(after, before):
    return {k: (after[k] - before[k]).tolist() for k in COUNTERS}


def assert_counts(d, **expected):
    for k, v in expected.items():
        assert d[k] == v, (k, d[k], v)
    # hits + late hits + misses == requests, per layer.
    for p in range(len(d["requests"])):
        assert d["hits"][p] + d["late_hits"][p] + d["misses"][p] == d["requests"][p]


# ---------------------------------------------------------------------------------------------


def test_demand_only_lru_hits_misses_collisions_and_stall():
    cache = make_cache(5)
    gates = [make_gate(0, [[0, 1]]), make_gate(1, [[2, 3]]), make_gate(2, [[4, 5]])]

    # Pass 0 (cold). Layer 0: (0,0) -> slot 0 ready T, (0,1) -> slot 1 ready 2T: stall 2T.
    # Layer 1: issued at 2T -> 3T, 4T. Layer 2: (2,4) -> slot 4 ready 5T; the cache is full,
    # so (2,5) evicts the LRU (0,0) (pinned: (2,4), (2,5)) and lands at 6T.
    before = counters(cache)
    cache.begin_pass("decode", 1, 1)
    stalls = []
    for g in gates:
        s0 = cache.metrics.per_layer["stall_s"].copy()
        run_layer(cache, g)
        stalls.append(float((cache.metrics.per_layer["stall_s"] - s0).sum()))
    timing = cache.end_pass()
    assert_counts(diff(counters(cache), before), requests=[2, 2, 2], hits=[0, 0, 0],
                  late_hits=[0, 0, 0], misses=[2, 2, 2], collision_misses=[0, 0, 0],
                  evictions=[1, 0, 0], waves=[1, 1, 1], demand_bytes=[2 * B] * 3,
                  prefetch_bytes=[0, 0, 0])
    assert stalls == pytest.approx([2 * T] * 3)
    assert (timing.start_s, timing.end_s, timing.stall_s) == pytest.approx((0, 6 * T, 6 * T))
    assert cache.resident_keys() == {(0, 1), (1, 2), (1, 3), (2, 4), (2, 5)}
    assert cache.residency[(2, 5)] == 0  # the freed slot of (0,0)

    # Pass 1, same routing. LRU order (0,1) (1,2) (1,3) (2,4) (2,5).
    # Layer 0: (0,0) misses — not a collision, it left in the previous pass — and evicts
    #   (1,2) ((0,1) is pinned); (0,1) hits. Order: (1,3) (2,4) (2,5) (0,0) (0,1).
    # Layer 1: (1,2) misses: a COLLISION (resident when the pass began, evicted by layer 0's
    #   fetch); it evicts (2,4); (1,3) hits. Order: (2,5) (0,0) (0,1) (1,2) (1,3).
    # Layer 2: (2,4) collision miss, evicts (0,0); (2,5) hits.
    # One transfer per layer, each issued when the layer starts: stall T per layer.
    before = counters(cache)
    cache.begin_pass("decode", 1, 2)
    for g in gates:
        run_layer(cache, g)
    timing = cache.end_pass()
    assert_counts(diff(counters(cache), before), requests=[2, 2, 2], hits=[1, 1, 1],
                  late_hits=[0, 0, 0], misses=[1, 1, 1], collision_misses=[0, 1, 1],
                  evictions=[1, 1, 1], demand_bytes=[B] * 3)
    assert (timing.start_s, timing.end_s, timing.stall_s) == pytest.approx(
        (6 * T, 9 * T, 3 * T))
    total = cache.metrics.totals()
    assert total["requests"] == 12 and total["hits"] == 3 and total["misses"] == 9
    assert total["collision_miss_rate"] == pytest.approx(2 / 12)
    assert total["prefetch_precision"] is None and total["prefetch_recall"] is None
    assert [p.kind for p in cache.metrics.passes] == ["decode", "decode"]
    assert len(cache.metrics.snapshots) == 2


def test_prefetch_late_hits_hits_precision_recall_and_waste():
    # MoE layers 1, 3, 5 (positions 0, 1, 2) of a 6-layer model; 4 slots; topk prefetch of the
    # next layer (2 experts).
    cache = make_cache(4, prefetch="topk", layers=(1, 3, 5), num_layers=6)
    to3 = [0, 0, .5, .4, .1, 0]  # predicts layer 3 needs [2, 3]
    to5 = [.3, 0, 0, 0, .5, .2]  # predicts layer 5 needs [4, 0] (it will need [4, 5])

    # ---- Pass 0 (cold), no compute time between layers.
    cache.begin_pass("decode", 1, 1)
    before = counters(cache)
    # Layer 1 at t=0: demand (1,0) -> T, (1,1) -> 2T; then the prefetches, FIFO behind them on
    # the copy engine: (3,2) -> 3T, (3,3) -> 4T (free slots 2, 3). Stall: 2T.
    run_layer(cache, make_gate(1, [[0, 1]], 3, to3))
    assert cache.clock.now() == pytest.approx(2 * T)
    assert [cache.slot_ready[cache.residency[k]] for k in [(3, 2), (3, 3)]] == \
        pytest.approx([3 * T, 4 * T])
    # Layer 3 at 2T: both prefetched experts are still in flight: two LATE hits, both served
    # by the prefetch made for this pass-layer (used 2, recall 2/2). Prefetch for layer 5 at 2T:
    # (5,4) evicts the LRU (1,0), (5,0) evicts (1,1); the engine is busy until 4T, so they
    # land at 5T and 6T. Stall: until 4T.
    run_layer(cache, make_gate(3, [[2, 3]], 5, to5))
    assert cache.clock.now() == pytest.approx(4 * T)
    assert [cache.slot_ready[cache.residency[k]] for k in [(5, 4), (5, 0)]] == \
        pytest.approx([5 * T, 6 * T])
    # Layer 5 at 4T: (5,4) in flight -> late hit (used, recall); (5,5) misses: LRU victim
    # (3,2) (used already: no waste), issued at 4T but queued behind (5,0): lands at 7T.
    # Stall 3T. (5,0) was never requested.
    run_layer(cache, make_gate(5, [[4, 5]]))
    timing = cache.end_pass()
    d = diff(counters(cache), before)
    assert_counts(d, requests=[2, 2, 2], hits=[0, 0, 0], late_hits=[0, 2, 1], misses=[2, 0, 1],
                  collision_misses=[0, 0, 0], prefetch_issued=[0, 2, 2], prefetch_used=[0, 2, 1],
                  recall_served=[0, 2, 1], recall_requests=[0, 2, 2], evictions=[2, 1, 0],
                  demand_bytes=[2 * B, 0, B], prefetch_bytes=[0, 2 * B, 2 * B],
                  wasted_prefetch_bytes=[0, 0, 0])
    assert (timing.end_s, timing.stall_s) == pytest.approx((7 * T, 7 * T))
    rows = cache.metrics.layer_table()
    assert [r["layer"] for r in rows] == [1, 3, 5]
    assert [r["prefetch_precision"] for r in rows] == [None, 1.0, 0.5]
    assert [r["prefetch_recall"] for r in rows] == [None, 1.0, 0.5]
    assert [r["late_hit_rate"] for r in rows] == [0.0, 1.0, 0.5]
    assert cache.resident_keys() == {(3, 3), (5, 0), (5, 4), (5, 5)}

    # ---- Pass 1, with compute time before layer 3 so its prefetches land first.
    # LRU order (3,3) (5,0) (5,4) (5,5); t = 7T.
    cache.begin_pass("decode", 1, 2)
    before = counters(cache)
    # Layer 1: (1,0) misses, evicts (3,3) -> 8T; (1,1) misses, evicts (5,0) — an unused
    # prefetch: WASTED bytes, booked on layer 5 — -> 9T. Prefetch (3,2) evicts (5,4) -> 10T,
    # (3,3) evicts (5,5) -> 11T. Stall 2T (t = 9T).
    run_layer(cache, make_gate(1, [[0, 1]], 3, to3))
    assert cache.clock.now() == pytest.approx(9 * T)
    cache.clock.compute(5 * T)  # layer 1's experts and layer 3's attention: t = 14T
    # Layer 3 at 14T: (3,2) (ready 10T) and (3,3) (11T) are plain HITS, used, recall 2/2.
    # Prefetch for layer 5 at 14T: [5, 4]: (5,5) evicts (1,0) -> 15T, (5,4) evicts (1,1) -> 16T.
    # No stall.
    run_layer(cache, make_gate(3, [[2, 3]], 5, [0, 0, 0, 0, .3, .6]))
    assert cache.clock.now() == pytest.approx(14 * T)
    # Layer 5 at 14T: both in flight: late hits, stall until 16T.
    run_layer(cache, make_gate(5, [[4, 5]]))
    timing = cache.end_pass()
    d = diff(counters(cache), before)
    assert_counts(d, requests=[2, 2, 2], hits=[0, 2, 0], late_hits=[0, 0, 2], misses=[2, 0, 0],
                  collision_misses=[0, 0, 0], prefetch_issued=[0, 2, 2], prefetch_used=[0, 2, 2],
                  recall_served=[0, 2, 2], recall_requests=[0, 2, 2], evictions=[2, 1, 3],
                  demand_bytes=[2 * B, 0, 0], prefetch_bytes=[0, 2 * B, 2 * B],
                  wasted_prefetch_bytes=[0, 0, B])
    assert (timing.start_s, timing.end_s, timing.stall_s) == pytest.approx(
        (7 * T, 16 * T, 4 * T))
    # Every prefetch was used or already booked as wasted: finish() adds nothing.
    cache.finish()
    assert cache.metrics.totals()["wasted_prefetch_bytes"] == B
    total = cache.metrics.totals()
    assert total["prefetch_precision"] == pytest.approx(7 / 8)
    assert total["prefetch_recall"] == pytest.approx(7 / 8)
    assert total["h2d_bytes"] == 13 * B  # 5 demand + 8 prefetch


def test_unused_prefetch_wasted_at_finish():
    cache = make_cache(6, prefetch="topk")
    cache.begin_pass("decode", 1, 1)
    # Layer 0 prefetches [2, 3] for layer 1 (free slots); layer 1 uses 2 but not 3, and needs 4.
    run_layer(cache, make_gate(0, [[0, 1]], 1, [0, 0, .5, .4, 0, 0]))
    run_layer(cache, make_gate(1, [[2, 4]]))
    # Layer 2 fills the 6th slot and evicts the LRU (0,0); (1,3) stays resident, unused.
    run_layer(cache, make_gate(2, [[0, 1]]))
    cache.end_pass()
    rows = cache.metrics.layer_table()
    assert rows[1]["prefetch_issued"] == 2 and rows[1]["prefetch_used"] == 1
    assert rows[1]["prefetch_precision"] == 0.5 and rows[1]["prefetch_recall"] == 0.5
    assert rows[1]["misses"] == 1 and rows[1]["late_hits"] == 1  # no compute time
    assert (1, 3) in cache.resident_keys()
    assert cache.metrics.totals()["wasted_prefetch_bytes"] == 0
    cache.finish()
    assert cache.metrics.layer_table()[1]["wasted_prefetch_bytes"] == B
    cache.finish()  # idempotent
    assert cache.metrics.totals()["wasted_prefetch_bytes"] == B


def test_collision_miss_of_an_expert_admitted_in_the_same_pass():
    # 4 slots, score-based eviction, topk prefetch of 1 expert for each of the next 2 layers.
    # Every gate puts prob 1/2 on each of its two experts, so the accumulated scores are .5 for
    # experts used once, 0 for never-used ones.
    cache = make_cache(4, eviction="score", prefetch="topk(overfetch=0.5, lookahead=2)")
    cache.begin_pass("decode", 1, 1)
    spec = np.zeros((2, 1, E), np.float32)
    spec[0, 0, 2] = 1  # layer 1 will need 2
    spec[1, 0, 4] = 1  # layer 2 will need 4
    g0 = make_gate(0, [[0, 1]])
    g0.spec, g0.spec_layers = spec, (1, 2)
    # Layer 0: (0,0) (0,1) demand-fetched into slots 0, 1; prefetch (1,2) -> slot 2,
    # (2,4) -> slot 3.
    run_layer(cache, g0)
    assert cache.resident_keys() == {(0, 0), (0, 1), (1, 2), (2, 4)}
    # Layer 1: (1,2) late hit; (1,3) misses. Scores: (0,0) (0,1) .5, (1,2) .5 (layer 1's
    # probs are added before its requests), (2,4) 0 — layer 2 has no history yet — so the
    # score policy evicts the prefetched (2,4) (wasted), which layer 2 needs next: SpecMD's
    # complaint about score-based eviction.
    run_layer(cache, make_gate(1, [[2, 3]]))
    assert (2, 4) not in cache.resident_keys()
    # Layer 2: (2,4) misses — a COLLISION: admitted during this pass and evicted before the
    # pass used it; (2,5) misses too (never resident: not a collision). Victims: the lowest
    # scores, ties by flat index: (0,0), then (0,1).
    run_layer(cache, make_gate(2, [[4, 5]]))
    cache.end_pass()
    rows = cache.metrics.layer_table()
    assert (rows[2]["misses"], rows[2]["collision_misses"]) == (2, 1)
    assert rows[2]["wasted_prefetch_bytes"] == B
    assert (rows[2]["prefetch_issued"], rows[2]["prefetch_used"]) == (1, 0)
    assert (rows[2]["recall_requests"], rows[2]["recall_served"]) == (2, 0)
    assert (rows[1]["late_hits"], rows[1]["misses"], rows[1]["prefetch_used"]) == (1, 1, 1)
    assert cache.resident_keys() == {(1, 2), (1, 3), (2, 4), (2, 5)}


def test_prefetch_batch_does_not_evict_its_own_prefetches_lfu():
    cache = make_cache(4, eviction="lfu", prefetch="topk")
    cache.begin_pass("decode", 1, 1)
    run_layer(cache, make_gate(0, [[0, 1]], 1, [0, 0, .5, .4, 0, 0]))  # fills the 4 slots
    # Layer 1 uses (1,2) (1,3) (count 1 each) and prefetches [4, 5] for layer 2. The unpinned
    # keys are (0,0) and (0,1), both used once this pass: they are the ones to make room.
    # The bug this guards against: (2,4) evicts (0,0), then (2,5) evicts the in-flight (2,4)
    # (count 0 < 1), so the batch collapses to its last expert.
    run_layer(cache, make_gate(1, [[2, 3]], 2, [0, 0, 0, 0, .5, .4]))
    assert {(2, 4), (2, 5)} <= cache.resident_keys()
    assert cache.metrics.totals()["wasted_prefetch_bytes"] == 0


def test_prefetch_batch_does_not_evict_its_own_prefetches_lru():
    # 3 slots. Layer 0 fetches (0,0) (0,1), then prefetches [2, 3] for layer 1: (1,2), the
    # best-scored, takes the last free slot. For (1,3) the only unpinned key is (1,2), still in
    # flight: the prefetch must stop there, not evict its own better prediction (wasted bytes,
    # then a collision miss when layer 1 needs it).
    cache = make_cache(3, prefetch="topk")
    cache.begin_pass("decode", 1, 1)
    run_layer(cache, make_gate(0, [[0, 1]], 1, [0, 0, .5, .4, 0, 0]))
    assert cache.resident_keys() == {(0, 0), (0, 1), (1, 2)}
    assert cache.metrics.totals()["wasted_prefetch_bytes"] == 0


def test_prefetch_call_does_not_evict_what_it_found_resident_and_selected():
    # FIFO, 4 slots (a touch does not refresh FIFO order, so nothing but the protection keeps
    # the touched expert). Pass 0: layer 1 fetches (1,2) then (1,3). Pass 1: layer 0 fetches
    # (0,0) (0,1): the cache is full. Its prefetch for layer 1 predicts [2, 5]: (1,2) is
    # already resident (selected, touched), (1,5) needs a victim. The oldest unpinned key is
    # (1,2) — the same call's best prediction — so the victim must be (1,3) instead.
    cache = make_cache(4, eviction="fifo", prefetch="topk")
    cache.begin_pass("decode", 1, 1)
    run_layer(cache, make_gate(1, [[2, 3]]))
    cache.end_pass()
    cache.begin_pass("decode", 1, 2)
    run_layer(cache, make_gate(0, [[0, 1]], 1, [0, 0, .5, 0, 0, .4]))
    assert cache.resident_keys() == {(0, 0), (0, 1), (1, 2), (1, 5)}
    before = counters(cache)
    run_layer(cache, make_gate(1, [[2, 5]]))
    # (1,5) is still in flight (no compute time passes here): a late hit, and no miss.
    d = diff(counters(cache), before)
    assert_counts(d, hits=[0, 1, 0], misses=[0, 0, 0], collision_misses=[0, 0, 0])
    assert cache.metrics.per_layer["late_hits"].tolist() == [0, 1, 0]


# ---------------------------------------------------------------------------------------------
# waves


def _check_waves(waves, decision_active, slots):
    total = np.zeros(decision_active.shape, int)
    for w in waves:
        assert 1 <= len(w.slot_of) <= slots
        assert len(set(w.slot_of.values())) == len(w.slot_of)
        assert all(0 <= s < slots for s in w.slot_of.values())
        # A wave's contributions are exactly the active ones on its experts.
        np.testing.assert_array_equal(w.active,
                                      decision_active & np.isin(w.ids, list(w.slot_of)))
        total += w.active
    # The waves partition the layer's active contributions.
    np.testing.assert_array_equal(total, decision_active.astype(int))
    assert [w.first for w in waves] == [True] + [False] * (len(waves) - 1)


def test_prefill_waves_when_a_layer_needs_more_experts_than_slots():
    cache = make_cache(3)
    cache.begin_pass("prefill", 3, 3)
    ids = np.array([[0, 1], [2, 3], [4, 0]])
    # Requests in router-rank order (rank-major over tokens, first occurrence wins):
    # rank 1: 0, 2, 4; rank 2: 1, 3, (0) -> [0, 2, 4, 1, 3]; waves of <= 3: [0, 2, 4], [1, 3].
    # Wave 0: three misses into slots 0, 1, 2, landing at T, 2T, 3T: stall 3T.
    # Wave 1 at 3T: (0,1) evicts the LRU (0,0) (slot 0) -> 4T, (0,3) evicts (0,2) (slot 1) ->
    # 5T: stall 2T. (0,0) and (0,2) already ran in wave 0: no collision.
    waves = run_layer(cache, make_gate(0, ids))
    assert len(waves) == 2
    assert waves[0].slot_of == {0: 0, 2: 1, 4: 2}
    assert waves[1].slot_of == {1: 0, 3: 1}
    np.testing.assert_array_equal(waves[0].active, [[1, 0], [1, 0], [1, 1]])
    np.testing.assert_array_equal(waves[1].active, [[0, 1], [0, 1], [0, 0]])
    _check_waves(waves, np.ones(ids.shape, bool), 3)
    row = cache.metrics.layer_table()[0]
    assert (row["requests"], row["misses"], row["waves"], row["evictions"]) == (5, 5, 2, 2)
    assert row["collision_misses"] == 0
    assert row["stall_s"] == pytest.approx(5 * T)
    # A layer whose experts fit runs in one wave.
    waves = run_layer(cache, make_gate(1, [[0, 1], [0, 1], [1, 0]]))
    assert len(waves) == 1 and sorted(waves[0].slot_of) == [0, 1]
    _check_waves(waves, np.ones((3, 2), bool), 3)
    cache.end_pass()


def test_waves_with_dropped_contributions():
    cache = make_cache(2, miss="drop(keep=1)")
    cache.begin_pass("prefill", 3, 3)
    ids = np.array([[0, 1], [2, 3], [4, 0]])
    # Nothing resident; experts some token ranks 1st: {0, 2, 4}. Rank-2 contributions of
    # 1 and 3 are dropped (2 distinct experts); token 2's rank-2 0 is kept.
    active = np.array([[1, 0], [1, 0], [1, 1]], bool)
    # Requests [0, 2, 4] in waves of 2: [0, 2], [4].
    waves = run_layer(cache, make_gate(0, ids))
    assert [sorted(w.slot_of) for w in waves] == [[0, 2], [4]]
    np.testing.assert_array_equal(waves[0].active, [[1, 0], [1, 0], [0, 1]])
    np.testing.assert_array_equal(waves[1].active, [[0, 0], [0, 0], [1, 0]])
    _check_waves(waves, active, 2)
    np.testing.assert_array_equal(waves[0].weights, np.where(active, 0.5, 0.0))
    row = cache.metrics.layer_table()[0]
    assert (row["requests"], row["misses"], row["dropped"], row["waves"]) == (3, 3, 2, 2)
    cache.end_pass()


# ---------------------------------------------------------------------------------------------
# slots_for


def test_slots_for():
    assert slots_for(18, 2, B, None, 5) == 5
    assert slots_for(18, 2, B, None, 100) == 18  # at most every expert
    assert slots_for(18, 2, B, 0.5, None) == 9
    assert slots_for(18, 2, B, 1.0, None) == 18
    assert slots_for(1024, 8, B, 0.05, None) == 51  # floor(51.2)
    with pytest.raises(ConfigError, match="exactly one"):
        slots_for(18, 2, B, None, None)
    with pytest.raises(ConfigError, match="exactly one"):
        slots_for(18, 2, B, 0.5, 4)
    with pytest.raises(ConfigError) as e:
        slots_for(18, 2, B, 0.05, None)  # 0.9 -> 0 slots
    msg = str(e.value)
    assert "capacity_frac=0.05" in msg and "0 slots" in msg and "top-k = 2" in msg
    with pytest.raises(ConfigError) as e:
        slots_for(1024, 8, B, 0.005, None)  # 5.12 -> 5 slots < top-8
    assert "0.005" in str(e.value) and "5 slots" in str(e.value) and "top-k = 8" in str(e.value)
    with pytest.raises(ConfigError, match=r"cache.slots=1 .*top-k = 2"):
        slots_for(18, 2, B, None, 1)
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ConfigError, match=r"\(0, 1\]"):
            slots_for(18, 2, B, bad, None)


def test_slots_for_exact_fraction():
    assert slots_for(100, 2, B, 0.29, None) == 29
    assert slots_for(100, 2, B, 0.57, None) == 57
