"""The claims tool's structural rule (studies/specmd/rules.py, `structural_rule`): without
prefetch, when the cache holds fewer slots than the fewest distinct experts a pass requests
(MoE layers × top-k), §4's Least-Stale order and LRU make the same choices, so their equality
is labelled "structural", not a finding. Checked here on random traces, both engines, and the
rule's boundary: with slots above one pass, or with prefetch, the two may differ."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.cache import build_cache_for
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.replay.engine import replay
from moejax.testing import random_scored_trace
from studies.specmd.rules import structural_rule
from tests.fuzzing import examples

BYTES = 4096
KEYS = ("hits", "late_hits", "misses", "collision_misses", "evictions")


def _run(traces, eviction, slots, prefetch="none", engine="reference") -> dict:
    c = base_config()
    c.clock.kind = "virtual"
    c.cache.slots = slots
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    t = traces[0]
    cache = build_cache_for(resolve(c), None, {"native": BYTES}, False, layers=tuple(t.layers),
                            num_layers=max(t.layers) + 1, num_experts=t.num_experts,
                            top_k=t.top_k)
    replay(cache, traces, engine=engine)
    total = cache.metrics.totals()
    return {k: total[k] for k in KEYS}


@st.composite
def _traces(draw):
    """1-3 requests of one model: a prefill of a few tokens or none, then decode steps; the
    routing drawn from a skewed preference, so experts repeat across tokens."""
    layers, experts = draw(st.integers(2, 6)), draw(st.integers(4, 16))
    k = draw(st.integers(1, min(4, experts)))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    out = []
    for _ in range(draw(st.integers(1, 3))):
        prefill = draw(st.integers(0, 1))
        passes = [draw(st.integers(2, 6))] * prefill + [1] * draw(st.integers(3, 12))
        out.append(random_scored_trace(rng, layers, experts, k, passes, BYTES, scores=False,
                                       prefill_passes=prefill))
    return out


@settings(max_examples=examples(200))
@given(traces=_traces(), data=st.data())
def test_least_stale_is_lru_when_the_cache_holds_less_than_one_pass(traces, data):
    t = traces[0]
    pass_experts = len(t.layers) * t.top_k
    slots = data.draw(st.integers(t.top_k, max(t.top_k, pass_experts - 1)), label="slots")
    assert structural_rule("least_stale(order=two_queue)", "none", slots, pass_experts)
    engine = data.draw(st.sampled_from(("reference", "auto")), label="engine")
    assert _run(traces, "least_stale", slots, engine=engine) == _run(traces, "lru", slots,
                                                                     engine=engine)


def test_the_rule_holds_only_where_it_says():
    """Above one pass, with prefetch, or for another order, the rule says nothing; and there
    the two policies do differ on some trace (so the rule is not vacuous)."""
    assert structural_rule("least_stale(order=two_queue)", "none", 8, 8) is None
    assert structural_rule("least_stale(order=two_queue)", "temporal", 4, 8) is None
    assert structural_rule("least_stale(order=cyclic)", "none", 4, 8) is None
    rng = np.random.default_rng(7)
    differ = 0
    for _ in range(20):
        traces = [random_scored_trace(rng, 3, 8, 2, [1] * 24, BYTES, scores=False)]
        slots = int(rng.integers(7, 16))  # at least one pass (6 experts)
        differ += _run(traces, "least_stale", slots) != _run(traces, "lru", slots)
    assert differ > 0
