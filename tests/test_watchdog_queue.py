"""SpecMD's watchdog prefetch queue (`cache.prefetch_queue="watchdog"`), worked by hand on the
toy of `tests/test_cache_unit.py`: 3 layers, 6 experts, top-2, one copy engine; at 5 GB/s one
expert lands T = 20 us after its transfer starts, at 50 GB/s T50 = 11 us. No cost model:
compute takes only the virtual time a test gives it (`clock.compute`).

Layer 0 routes to {0, 1} (cold: two demand misses, landing at T and 2T) and predicts {2, 3}
for layer 1 (top-k prefetch); layer 1 routes to {2, 3}. What the watchdog issues depends on
when the copy engine frees relative to layer 1's start — so bandwidth changes residency.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moejax.errors import ConfigError
from tests.test_cache_unit import HW, T, make_cache, make_gate, run_layer

SCORES = np.array([0.0, 0.0, 0.5, 0.4, 0.05, 0.05])  # layer 1's top-2: experts 2, 3
HW50 = dataclasses.replace(HW, h2d_gbps=50.0, link_gbps=50.0)
T50 = HW50.h2d_latency_s + 50_000 / 50e9


def _two_layers(cache, gap: float) -> dict:
    """Layer 0, `gap` seconds of compute, layer 1; the totals."""
    cache.begin_pass("decode", 1, 10)
    run_layer(cache, make_gate(0, [[0, 1]], 1, SCORES))
    cache.clock.compute(gap)
    run_layer(cache, make_gate(1, [[2, 3]]))
    cache.end_pass()
    return cache.metrics.totals()


def test_demand_goes_first_and_an_entry_whose_layer_started_is_dropped():
    # No compute: layer 1 starts at 2T, the instant the engine frees from layer 0's demand
    # fetches. Its own demand fetches go first, so the queued {2, 3} are dropped, never sent.
    t = _two_layers(make_cache(slots=6, prefetch="topk(overfetch=1.0)",
                               prefetch_queue="watchdog"), gap=0.0)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (0, 2)
    assert (t["hits"], t["late_hits"], t["misses"]) == (0, 0, 4)
    # Today's immediate queue books both transfers at layer 0: two late hits at layer 1.
    t = _two_layers(make_cache(slots=6, prefetch="topk(overfetch=1.0)"), gap=0.0)
    assert (t["prefetch_issued"], t["prefetch_dropped"], t["late_hits"]) == (2, 0, 2)


@pytest.mark.parametrize("gap, issued, hits, late, misses", [
    # Engine free at 2T; layer 1 starts at 2T + gap.
    (5 * T, 2, 2, 0, 0),   # 2 -> [2T, 3T], 3 -> [3T, 4T]: both land before 7T
    (1.5 * T, 2, 1, 1, 0),  # 3 starts at 3T < 3.5T but lands at 4T: late
    (0.5 * T, 1, 0, 1, 1),  # 2 lands at 3T > 2.5T (late); the engine is busy at 2.5T: 3 dropped
])
def test_the_watchdog_issues_as_the_engine_frees_during_compute(gap, issued, hits, late, misses):
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog")
    t = _two_layers(cache, gap)
    assert t["prefetch_issued"] == issued and t["prefetch_dropped"] == 2 - issued
    layer1 = cache.metrics.layer_table()[1]
    assert (layer1["hits"], layer1["late_hits"], layer1["misses"]) == (hits, late, misses)


def test_bandwidth_changes_which_experts_are_resident():
    # 15 us of compute after layer 0. At 5 GB/s the engine frees at 40 us, expert 2 goes then
    # and lands at 60 us, after layer 1 started (55 us); expert 3 is dropped. At 50 GB/s it
    # frees at 22 us: 2 lands at 33 us, 3 starts at 33 < 37 us and is sent too.
    slow = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog")
    fast = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog",
                      hw=HW50)
    ts, tf = _two_layers(slow, 15e-6), _two_layers(fast, 15e-6)
    assert (ts["prefetch_issued"], ts["prefetch_dropped"]) == (1, 1)
    assert (tf["prefetch_issued"], tf["prefetch_dropped"]) == (2, 0)
    assert (ts["late_hits"], ts["misses"]) == (1, 3)  # 2 late; 3 a demand miss
    assert (tf["hits"], tf["late_hits"], tf["misses"]) == (1, 1, 2)  # 2 landed; 3 in flight
    # With the immediate queue bandwidth changes only timings: both issue both.
    for hw in (HW, HW50):
        t = _two_layers(make_cache(slots=6, prefetch="topk(overfetch=1.0)", hw=hw), 15e-6)
        assert (t["prefetch_issued"], t["late_hits"] + t["hits"]) == (2, 2)


def test_no_slot_no_transfer():
    # Two slots: both hold layer 0's running experts, which no prefetch may evict.
    t = _two_layers(make_cache(slots=2, prefetch="topk(overfetch=1.0)",
                               prefetch_queue="watchdog"), gap=10 * T)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (0, 2)
    assert t["evictions"] == 2  # layer 1's demand fetches evict layer 0's experts


def test_a_prefetch_does_not_evict_another_prefetch_whose_layer_has_not_run():
    # Three slots, prefetch of layer 1's top-2 from layer 0: one free slot after layer 0's
    # two. Expert 2 takes it; expert 3 would have to evict expert 2 (layer 0's experts are
    # pinned while the queue is polled at layer 1's start): it waits, then is dropped.
    t = _two_layers(make_cache(slots=3, prefetch="topk(overfetch=1.0)",
                               prefetch_queue="watchdog"), gap=10 * T)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (1, 1)
    assert t["evicted_before_use"] == 0 and t["prefetch_used"] == 1


def test_resident_predictions_are_not_queued_and_the_queue_empties_every_pass():
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog")
    _two_layers(cache, 10 * T)
    assert not cache.queue
    before = cache.metrics.totals()["prefetch_issued"]
    _two_layers(cache, 10 * T)  # {2, 3} are resident: predicted again, nothing to send
    t = cache.metrics.totals()
    assert t["prefetch_issued"] == before and not cache.queue
    assert t["predicted"] == 4  # both passes' predictions count, sent or not


def test_unknown_queue_is_a_clear_error():
    with pytest.raises(ConfigError, match="prefetch_queue='fifo'"):
        make_cache(slots=6, prefetch_queue="fifo")
