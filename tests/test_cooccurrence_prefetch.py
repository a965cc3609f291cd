"""`cooccur` prefetch (`moejax/policies/cooccurrence.py`): what it counts, that it never reads
the future, and its recall on real captures against `temporal`'s."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from moejax import bundled, jobs
from moejax.jobs.schema import base_config
from moejax.policies import build, conformance
from moejax.seam import LayerGate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gate(layer: int, *rows: list[int]) -> LayerGate:
    return LayerGate(layer, np.array(rows, np.int64), None, None)


def test_it_prefetches_the_experts_most_often_chosen_with_this_layers():
    p = build("prefetch", "cooccur", top_k=2, num_experts=6)
    assert p.predict(_gate(0, [0, 1])) == []  # nothing counted yet
    assert p.predict(_gate(3, [4, 5])) == []  # the last MoE layer seen: nothing after it
    # Pass 2: layer 0's experts 0, 1 were chosen with layer 3's 4, 5 (one token).
    assert p.predict(_gate(0, [0, 2])) == [(3, [4, 5])]  # 0 counted with 4 and 5: a tie
    p.predict(_gate(3, [5, 3]))  # now 0 with 5 twice, with 3 and 4 once; 2 with 5, 3
    assert p.predict(_gate(0, [0, 1])) == [(3, [5, 4])]  # 5: 2 + 1, 4: 1 + 1, 3: 1
    # Layer 0 right after layer 0 (a new pass) is not a pair: nothing is counted for it.
    before = p.counts[0].copy()
    assert p.predict(_gate(0, [2, 1])) == [(3, [5, 3])]  # 5: 1 + 1, 3: 1, 4: 1 (tie: lower id)
    assert np.array_equal(p.counts[0], before)
    # Two tokens in a pass (a prefill): pairs are per token, not across tokens.
    q = build("prefetch", "cooccur", top_k=1, num_experts=6)
    q.predict(_gate(0, [0], [1]))
    q.predict(_gate(1, [2], [3]))
    assert q.predict(_gate(0, [1])) == [(1, [3])]
    assert q.predict(_gate(1, [3])) == []  # the last layer


@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_a_prediction_reads_no_pass_after_its_own(seed, cut):
    """Two streams equal up to pass `cut` (the routing after it redrawn): every prediction made
    up to and including that pass's layers is the same."""
    rng = np.random.default_rng(seed)
    layers, experts, k, passes = 3, 8, 2, 14
    ids = np.stack([[rng.choice(experts, k, replace=False) for _ in range(layers)]
                    for _ in range(passes)])
    other = ids.copy()
    other[cut + 1:] = np.stack([[rng.choice(experts, k, replace=False) for _ in range(layers)]
                                for _ in range(passes - cut - 1)])

    def predictions(stream):
        p = build("prefetch", "cooccur", top_k=k, num_experts=experts)
        return [p.predict(_gate(layer, list(stream[t, layer]))) for t in range(cut + 1)
                for layer in range(layers)]

    assert predictions(ids) == predictions(other)


def test_the_conformance_kit_passes_it():
    report = conformance.check("moejax.policies.cooccurrence:CooccurrencePrefetch",
                               captures=())
    assert report.policy == "prefetch cooccur" and report.passed, report.table()


def test_it_recalls_more_of_the_routed_experts_than_temporal_on_the_olmoe_captures(tmp_path):
    """The peer's figure (mlx-flash's `RoutingPredictor`: 57.0% of the routed experts on the
    OLMoE capture, where `temporal` recalls 40.6%), on both OLMoE captures."""
    recall = {}
    for capture in ("olmoe_code", "olmoe_prose"):
        for prefetch in ("cooccur", "temporal"):
            c = base_config()
            c.job, c.cache.slots = "replay", 256
            c.replay.trace = bundled.capture_path(capture)
            c.policies.prefetch = prefetch
            c.log.tensorboard = False
            results = jobs.run(c, str(tmp_path / f"{capture}_{prefetch}"))
            recall[capture, prefetch] = results["cache"]["total"]["prediction_recall"]
    assert round(recall["olmoe_code", "cooccur"], 3) == 0.570
    assert round(recall["olmoe_code", "temporal"], 3) == 0.407
    assert recall["olmoe_prose", "cooccur"] > recall["olmoe_prose", "temporal"]
