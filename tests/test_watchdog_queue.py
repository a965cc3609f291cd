"""SpecMD's watchdog prefetch queue, worked by hand on the toy of `tests/test_cache_unit.py`:
3 layers, 6 experts, top-2, one copy engine; at 5 GB/s one expert lands T = 20 us after its
transfer starts, at 50 GB/s T50 = 11 us. No cost model: compute takes only the virtual time a
test gives it (`clock.compute`), so layer 1 starts the instant layer 0's compute ends.

Layer 0 routes to {0, 1} (cold: two demand misses, landing at T and 2T) and predicts {2, 3}
for layer 1 (top-k prefetch); layer 1 routes to {2, 3} unless a test says otherwise.

Two rules (`cache.prefetch_queue`):
* `watchdog` (SpecMD: "issuing non-blocking CUDA transfers when space allows"): an entry goes
  as soon as a slot can be had; its transfer queues on the engine behind those in flight;
* `watchdog_idle` (issue 10's rule): it also waits for an idle copy engine — so what it sends
  depends on when the engine frees relative to layer 1's start.
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


def _two_layers(cache, gap: float, layer1=(2, 3)) -> dict:
    """Layer 0, `gap` seconds of compute, layer 1 (routed to `layer1`); the totals."""
    cache.begin_pass("decode", 1, 10)
    run_layer(cache, make_gate(0, [[0, 1]], 1, SCORES))
    cache.clock.compute(gap)
    run_layer(cache, make_gate(1, [list(layer1)]))
    cache.end_pass()
    return cache.metrics.totals()


def _layer1(cache) -> tuple[int, int, int]:
    row = cache.metrics.layer_table()[1]
    return row["hits"], row["late_hits"], row["misses"]


# -- watchdog: issues when space allows ----------------------------------------------------------
@pytest.mark.parametrize("gap, hits, late", [
    # Both go at 0, behind layer 0's demand fetches: 2 -> [2T, 3T], 3 -> [3T, 4T].
    (0.0, 0, 2),     # layer 1 starts at 2T: both in flight
    (1.5 * T, 1, 1),  # at 3.5T: 2 landed, 3 in flight
    (5 * T, 2, 0),    # at 7T: both landed
])
def test_the_watchdog_issues_at_once_when_slots_are_free(gap, hits, late):
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog")
    t = _two_layers(cache, gap)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (2, 0)
    assert _layer1(cache) == (hits, late, 0)
    assert t["stall_behind_prefetch_s"] == 0.0  # layer 1 fetches nothing


def test_a_demand_fetch_waits_behind_prefetches_in_flight_and_the_wait_is_counted():
    # The prediction is wrong: layer 1 routes to {4, 5}. At 2T the engine still carries 2 and
    # 3 (until 4T); the demand fetches go behind them: 4 -> [4T, 5T], 5 -> [5T, 6T]. Layer 1
    # stalls 4T, of which 2T behind the prefetches (without them it would stall 2T).
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog")
    t = _two_layers(cache, 0.0, layer1=(4, 5))
    assert _layer1(cache) == (0, 0, 2)
    layer1 = cache.metrics.layer_table()[1]
    assert layer1["stall_s"] == pytest.approx(4 * T)
    assert layer1["stall_behind_prefetch_s"] == pytest.approx(2 * T)
    assert t["stall_behind_prefetch_s"] == pytest.approx(2 * T)  # layer 0 found the engine idle
    # No prefetch: the same demand fetches start at 2T.
    cache = make_cache(slots=6, prefetch="none", prefetch_queue="watchdog")
    _two_layers(cache, 0.0, layer1=(4, 5))
    row = cache.metrics.layer_table()[1]
    assert (row["stall_s"], row["stall_behind_prefetch_s"]) == (pytest.approx(2 * T), 0.0)


def test_space_freed_when_a_layer_is_done_is_taken_before_the_next_layer_asks():
    # Two slots, both holding layer 0's running experts: nothing can go while layer 0 runs.
    # When its compute ends (10T + 2T), 0 and 1 may go: 2 and 3 are sent at 12T, landing at
    # 13T and 14T, while layer 1 (starting at 12T) waits for them: late hits, not misses.
    cache = make_cache(slots=2, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog")
    t = _two_layers(cache, gap=10 * T)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (2, 0)
    assert _layer1(cache) == (0, 2, 0)
    assert t["evictions"] == 2 and t["evicted_before_use"] == 0


def test_an_entry_without_space_before_its_layer_starts_is_dropped():
    # Three slots, four predictions for layer 1 (overfetch 2: 2, 3, 4, 5). While layer 0 runs
    # one slot is free: 2 takes it; 3 would have to evict a running expert or expert 2 (a
    # prefetch whose layer has not run): the head waits. When layer 0 is done, 3 and 4 evict
    # 0 and 1; 5 finds only pending prefetches and is dropped when layer 1 starts.
    cache = make_cache(slots=3, prefetch="topk(overfetch=2.0)", prefetch_queue="watchdog")
    t = _two_layers(cache, gap=10 * T)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (3, 1)
    assert t["evicted_before_use"] == 0 and t["prefetch_used"] == 2
    assert _layer1(cache) == (1, 1, 0)  # 2 landed at 3T; 3 goes at 12T


def test_bandwidth_changes_what_has_landed():
    # 15 us of compute after layer 0. At 5 GB/s 2 and 3 land at 60 and 80 us, after layer 1
    # started (55 us); at 50 GB/s at 33 and 44 us, layer 1 starting at 37 us: 2 has landed.
    slow = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog")
    fast = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog",
                      hw=HW50)
    ts, tf = _two_layers(slow, 15e-6), _two_layers(fast, 15e-6)
    assert ts["prefetch_issued"] == tf["prefetch_issued"] == 2
    assert _layer1(slow) == (0, 2, 0) and _layer1(fast) == (1, 1, 0)


def _decode_four_layers(hw, queue="watchdog") -> dict:
    """A decode pass over layers 0..3 whose only new experts are layer 3's {0, 1}, predicted
    two layers ahead at layer 1 (top-k, lookahead 2). Layers 0..2's {0, 1} were seeded
    (resident and ready); 8 slots: 2 free. Each layer computes C = 8 us, less than one
    transfer at either bandwidth (T = 20 us, T50 = 11 us)."""
    cache = make_cache(slots=8, prefetch="topk(overfetch=1.0, lookahead=2)",
                       prefetch_queue=queue, layers=(0, 1, 2, 3), num_layers=4, hw=hw)
    cache.seed([(layer, e) for layer in range(3) for e in (0, 1)])
    cache.begin_pass("decode", 1, 10)
    for layer in range(4):
        gate = make_gate(layer, [[0, 1]])
        if layer == 1:  # its speculative scores for layers 2 and 3: {0, 1} first
            gate = dataclasses.replace(gate, spec=np.stack([SCORES_01, SCORES_01])[:, None],
                                       spec_layers=(2, 3))
        run_layer(cache, gate)
        cache.clock.compute(8e-6)
    cache.end_pass()
    return cache.metrics.layer_table()[3]


SCORES_01 = np.array([0.5, 0.4, 0.0, 0.0, 0.05, 0.05], np.float32)


def test_bandwidth_changes_ready_hits_when_transfers_are_longer_than_a_layer():
    # Layer 1 starts at 8 us and queues layer 3's {0, 1}: free slots, so both go at once,
    # one behind the other on the engine; layer 3 starts at 24 us. At 50 GB/s they land at
    # 19 and 30 us: one ready hit, one late. At 5 GB/s at 28 and 48 us: two late hits. Under
    # the idle-engine rule the second waits for the engine: at 50 GB/s it goes at 19 us (seen
    # when layer 3 starts), at 5 GB/s the engine is busy until 28 us, after layer 3 started:
    # it is dropped and becomes a demand miss.
    fast, slow = _decode_four_layers(HW50), _decode_four_layers(HW)
    assert (fast["hits"], fast["late_hits"], fast["misses"]) == (1, 1, 0)
    assert (slow["hits"], slow["late_hits"], slow["misses"]) == (0, 2, 0)
    fast = _decode_four_layers(HW50, "watchdog_idle")
    slow = _decode_four_layers(HW, "watchdog_idle")
    assert (fast["hits"], fast["late_hits"], fast["misses"]) == (1, 1, 0)
    assert (slow["hits"], slow["late_hits"], slow["misses"]) == (0, 1, 1)


# -- watchdog_idle: issue 10's rule, a transfer only onto an idle copy engine ----------------------
def test_idle_rule_demand_goes_first_and_an_entry_whose_layer_started_is_dropped():
    # No compute: layer 1 starts at 2T, the instant the engine frees from layer 0's demand
    # fetches. Its own demand fetches go first, so the queued {2, 3} are dropped, never sent.
    t = _two_layers(make_cache(slots=6, prefetch="topk(overfetch=1.0)",
                               prefetch_queue="watchdog_idle"), gap=0.0)
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
def test_idle_rule_issues_as_the_engine_frees_during_compute(gap, issued, hits, late, misses):
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog_idle")
    t = _two_layers(cache, gap)
    assert t["prefetch_issued"] == issued and t["prefetch_dropped"] == 2 - issued
    layer1 = cache.metrics.layer_table()[1]
    assert (layer1["hits"], layer1["late_hits"], layer1["misses"]) == (hits, late, misses)


def test_idle_rule_bandwidth_changes_which_experts_are_resident():
    # 15 us of compute after layer 0. At 5 GB/s the engine frees at 40 us, expert 2 goes then
    # and lands at 60 us, after layer 1 started (55 us); expert 3 is dropped. At 50 GB/s it
    # frees at 22 us: 2 lands at 33 us, 3 starts at 33 < 37 us and is sent too.
    slow = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog_idle")
    fast = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog_idle",
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


def test_idle_rule_no_slot_no_transfer():
    # Two slots: both hold layer 0's running experts, which no prefetch may evict.
    t = _two_layers(make_cache(slots=2, prefetch="topk(overfetch=1.0)",
                               prefetch_queue="watchdog_idle"), gap=10 * T)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (0, 2)
    assert t["evictions"] == 2  # layer 1's demand fetches evict layer 0's experts


def test_idle_rule_a_prefetch_does_not_evict_another_prefetch_whose_layer_has_not_run():
    # Three slots, prefetch of layer 1's top-2 from layer 0: one free slot after layer 0's
    # two. Expert 2 takes it; expert 3 would have to evict expert 2 (layer 0's experts are
    # pinned while the queue is polled at layer 1's start): it waits, then is dropped.
    t = _two_layers(make_cache(slots=3, prefetch="topk(overfetch=1.0)",
                               prefetch_queue="watchdog_idle"), gap=10 * T)
    assert (t["prefetch_issued"], t["prefetch_dropped"]) == (1, 1)
    assert t["evicted_before_use"] == 0 and t["prefetch_used"] == 1


def test_resident_predictions_are_not_queued_and_the_queue_empties_every_pass():
    cache = make_cache(slots=6, prefetch="topk(overfetch=1.0)", prefetch_queue="watchdog_idle")
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
