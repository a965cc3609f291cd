"""The metrics SpecMD reports, beside moejax's own (issue 10): ready hits apart from late ones,
prediction precision / recall of the predicted sets against the routing (not of transfers),
collision misses as a share of misses, and prefetches evicted before their layer ran. Driven
on the hand-checked toy of `tests/test_cache_unit.py` (3 layers, 6 experts, top-2, one copy
engine at 5 GB/s: one expert lands T = 20 us after it is issued)."""

from __future__ import annotations

import numpy as np

from moejax.seam import LayerGate
from tests.test_cache_unit import make_cache, make_gate, run_layer


def _pass(cache, layers_ids, spec=None, kind="decode"):
    cache.begin_pass(kind, 1, 10)
    for layer, ids in enumerate(layers_ids):
        nxt = spec.get(layer) if spec else None
        gate = (make_gate(layer, [ids], layer + 1, nxt) if nxt is not None
                else make_gate(layer, [ids]))
        run_layer(cache, gate)
    cache.end_pass()


def test_ready_hit_rate_excludes_late_hits_and_collision_share():
    cache = make_cache(slots=6)
    _pass(cache, [[0, 1], [2, 3], [4, 5]])
    _pass(cache, [[0, 1], [2, 3], [4, 5]])  # everything resident and landed: ready hits
    t = cache.metrics.totals()
    assert t["requests"] == 12 and t["hits"] == 6 and t["misses"] == 6
    assert t["ready_hit_rate"] == 0.5 == t["hit_rate"]
    assert t["collision_share_of_misses"] == 0.0


def test_late_hits_count_in_hit_rate_but_not_ready_hit_rate():
    # topk prefetch of layer 1's two experts at layer 0: issued at once, they land T and 2T
    # later; with no compute time in between, layer 1 finds them in flight (late hits).
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)")
    scores = np.array([0.0, 0.0, 0.5, 0.4, 0.05, 0.05])
    _pass(cache, [[0, 1], [2, 3], [4, 5]], spec={0: scores})
    t = cache.metrics.totals()
    assert t["late_hits"] == 2 and t["hits"] == 0
    assert t["hit_rate"] == 2 / 6 and t["ready_hit_rate"] == 0.0


def test_prediction_precision_and_recall_are_of_the_predicted_sets():
    # Layer 0 predicts {2, 3} for layer 1, which routes to {2, 4}: 1 of 2 right both ways.
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)")
    scores = np.array([0.0, 0.0, 0.5, 0.4, 0.05, 0.05])
    _pass(cache, [[0, 1], [2, 4], [4, 5]], spec={0: scores})
    t = cache.metrics.totals()
    assert (t["predicted"], t["predicted_routed"], t["routed"]) == (2, 1, 2)
    assert t["prediction_precision"] == 0.5 and t["prediction_recall"] == 0.5
    # Predicting what is already resident still counts as a prediction (not a transfer).
    _pass(cache, [[0, 1], [2, 3], [4, 5]], spec={0: scores})
    t = cache.metrics.totals()
    assert (t["predicted"], t["predicted_routed"], t["routed"]) == (4, 3, 4)
    assert t["prefetch_issued"] == 3  # 2 + only expert 3 the second time (2 was resident)


def test_a_prefetch_evicted_before_its_layer_ran_is_counted():
    # Four slots, LFU (fewest uses, then least recent). Layer 0 fetches {0, 1} (one use each)
    # and prefetches one expert for each of the next two layers: expert 2 of layer 1 and
    # expert 4 of layer 2 (no uses yet). Layer 1 uses its prefetched 2 and misses 3: the
    # victim is the fewest-used, layer 2's expert 4, whose layer has not run yet.
    cache = make_cache(slots=4, eviction="lfu", prefetch="topk(overfetch=0.5, lookahead=2)")
    spec = np.zeros((2, 1, 6), np.float32)
    spec[0, 0, 2], spec[1, 0, 4] = 0.9, 0.9
    cache.begin_pass("decode", 1, 10)
    gate = make_gate(0, [[0, 1]])
    run_layer(cache, LayerGate(0, gate.ids, gate.weights, gate.probs, spec, (1, 2)))
    assert cache.prefetch_origin == {(1, 2): (0, 1), (2, 4): (0, 2)}
    run_layer(cache, make_gate(1, [[2, 3]]))
    t = cache.metrics.totals()
    assert t["evicted_before_use"] == 1 and t["evictions"] == 1
    assert t["wasted_prefetch_bytes"] == cache.shape.expert_bytes
    assert (2, 4) not in cache.residency and t["prefetch_used"] == 1
    # Once its layer has run, an unused prefetch that goes is a misprediction, not "before
    # use": layer 2 routes to {0, 5}, so the next pass's misses evict what is left.
    run_layer(cache, make_gate(2, [[0, 5]]))
    cache.end_pass()
    before = cache.metrics.totals()["evicted_before_use"]
    _pass(cache, [[3, 4], [0, 1], [4, 5]])
    assert cache.metrics.totals()["evicted_before_use"] == before


def test_results_carry_the_paper_metrics():
    cache = make_cache(slots=6)
    _pass(cache, [[0, 1], [2, 3], [4, 5]])
    total = cache.metrics.to_dict()["total"]
    for key in ("ready_hit_rate", "prediction_precision", "prediction_recall",
                "evicted_before_use", "collision_share_of_misses"):
        assert key in total
    assert total["prediction_precision"] is None  # no prefetcher: nothing predicted
