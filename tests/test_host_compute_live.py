"""Host compute in the live runtime (`CachedExperts._host_wave`): experts the cache names
(`Wave.host_experts`) are computed from the host's copy of their weights — on the CPU backend
the `pinned_host` tables' own bytes, no slot, no transfer — and their contributions join the
device's waves exactly, so the logits are the resident model's, bit for bit, under every miss
policy that computes on the host and `cache.host_compute_layers`, at every capacity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.models.stepped import SteppedDecoder
from moejax.serving.build import build_cached_experts
from tests.tiny_reference import tiny_reference

MAX_LEN = 32


@pytest.fixture(scope="module")
def tiny():
    return tiny_reference(seed=3, prompt_seed=2, prompt_len=7, tokens=10, max_len=MAX_LEN)


def _generate(tiny, miss, capacity, prefetch, host_layers=0):
    cfg, model, loaded, prompt, _ = tiny
    c = base_config()
    c.clock.kind = "virtual"
    c.cache.capacity_frac = capacity
    c.cache.host_compute_layers = host_layers
    c.policies.miss, c.policies.prefetch = miss, prefetch
    source = build_cached_experts(resolve(c), loaded)
    loads = []
    pool_load = source.pool.load
    source.pool.load = lambda key, slot: (loads.append(key), pool_load(key, slot))[1]
    out = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2).generate(
        prompt, 10, keep_logits=True)
    return out, source.cache, loads


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(miss=st.sampled_from(["host_compute", "latency_aware", "latency_aware(admit_after=1)",
                             "fetch"]),
       capacity=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
       prefetch=st.sampled_from(["none", "score_percentile(p=80)"]),
       host_layers=st.sampled_from([0, 1]))
def test_host_compute_live_gives_the_resident_models_logits(tiny, miss, capacity, prefetch,
                                                              host_layers):
    if miss == "fetch" and not host_layers:
        host_layers = 2  # fetch computes on the host only in host layers
    out, cache, loads = _generate(tiny, miss, capacity, prefetch, host_layers)
    ref = tiny[4]
    assert out.generated_ids == ref.generated_ids
    np.testing.assert_array_equal(out.prefill_logits, ref.prefill_logits)
    for x, y in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(x, y)
    host_layer_ids = set(tiny[0].moe_layers[:host_layers])
    assert not any(layer in host_layer_ids for layer, _ in loads)  # never in a slot


def test_host_compute_computes_on_the_host_and_never_loads_a_missed_expert(tiny):
    out, cache, loads = _generate(tiny, "host_compute", 0.1, "none")
    total = cache.metrics.totals()
    assert total["host_computed"] > 0 and total["host_computed"] == total["misses"]
    assert loads == []  # no prefetcher, every miss on the host: nothing ever moved to a slot
    assert out.generated_ids == tiny[4].generated_ids
