"""The host tier (`moejax/cache/host_tier.py`) in the cache model, worked by hand on the toy
of `tests/test_cache_unit.py` (3 layers, 6 experts, top-2, one copy engine: a transfer takes
T = 20 us), in front of a storage of one queue slot reading 1 GB/s with 10 us per read: a read
takes R = 10 us + 50 kB / 1 GB/s = 60 us, reads back to back. A device fetch of an expert the
host lacks reads it first; its transfer is issued when the read lands.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.cache import build_cache_for, build_host_tier
from moejax.cache.host_tier import HostTier
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.policies import build, names, policy_class
from moejax.replay.engine import replay
from moejax.testing import random_scored_trace
from moejax.timing import storage as storage_lib
from moejax.timing.storage import Storage, StorageQueue
from tests.fuzzing import examples
from tests.test_cache_unit import B, E, K, T, make_cache, make_gate, run_layer

DISK = Storage("test", read_gbps=1.0, read_latency_s=10e-6, queue_depth=1)
R = 10e-6 + B / 1e9


def host_tier(capacity, eviction="lru", storage=DISK, layers=(0, 1, 2)):
    policy = build("eviction", eviction, num_layers=len(layers), num_experts=E,
                   num_slots=capacity, top_k=K, seed=0, renormalize=True)
    return HostTier(capacity, B, policy, StorageQueue(storage), list(layers))


def cache_with_host(slots, capacity, **kw):
    return make_cache(slots, host=host_tier(capacity, kw.pop("host_eviction", "lru")), **kw)


def decode(cache, *layer_ids, prefetch_scores=None):
    cache.begin_pass("decode", 1, 10)
    for layer, ids in enumerate(layer_ids):
        nxt = layer + 1 if prefetch_scores is not None and layer + 1 < 3 else None
        run_layer(cache, make_gate(layer, [ids], nxt, prefetch_scores))
        cache.host.check_invariants()
    cache.end_pass()


def test_a_cold_miss_reads_storage_then_transfers():
    cache = cache_with_host(slots=6, capacity=6)
    decode(cache, [0, 1])
    # Reads land at R and 2R (one queue slot); each transfer goes when its read lands.
    assert cache.clock.now() == pytest.approx(2 * R + T)
    h = cache.host.totals()
    assert (h["requests"], h["hits"], h["misses"], h["demand_misses"]) == (2, 0, 2, 2)
    assert (h["storage_reads"], h["storage_bytes"]) == (2, 2 * B)
    # The wave waited 2R + T; until the last read landed (2R) it waited on storage.
    assert h["storage_stall_s"] == pytest.approx(2 * R)
    assert cache.metrics.totals()["stall_s"] == pytest.approx(2 * R + T)


def test_an_expert_in_host_memory_transfers_at_once():
    cache = cache_with_host(slots=2, capacity=6)
    decode(cache, [0, 1], [0, 1])  # layer 1's experts push layer 0's off the device
    start = cache.clock.now()
    decode(cache, [0, 1])  # ... and back: device misses, host hits
    assert cache.clock.now() - start == pytest.approx(2 * T)
    h = cache.host.totals()
    assert (h["requests"], h["hits"], h["misses"], h["evictions"]) == (6, 2, 4, 0)
    assert cache.metrics.totals()["misses"] == 6


def test_a_full_host_tier_evicts_by_its_own_policy():
    cache = cache_with_host(slots=2, capacity=2)
    decode(cache, [0, 1], [2, 3])
    h = cache.host.totals()
    assert h["evictions"] == 2 and set(cache.host.ready) == {(1, 2), (1, 3)}
    decode(cache, [0, 1])  # read again
    assert cache.host.totals()["misses"] == 6


def test_the_running_wave_is_never_evicted_from_host_memory():
    """Capacity 2 and a wave of two: the second read must not evict the first."""
    cache = cache_with_host(slots=2, capacity=2)
    decode(cache, [4, 5])
    assert set(cache.host.ready) == {(0, 4), (0, 5)}


def test_prefetch_predictions_without_a_device_slot_are_read_ahead():
    # Two device slots, both held by layer 0's wave: top-k prefetch for layer 1 ({2, 3}) finds
    # no device slot, so the immediate queue reads them ahead into host memory.
    scores = np.array([0.0, 0.0, 0.5, 0.4, 0.05, 0.05])
    cache = cache_with_host(slots=2, capacity=6, prefetch="topk(overfetch=1.0)")
    cache.begin_pass("decode", 1, 10)
    run_layer(cache, make_gate(0, [[0, 1]], 1, scores))
    h = cache.host.totals()
    assert h["read_ahead"] == 2 and {(1, 2), (1, 3)} <= set(cache.host.ready)
    assert cache.metrics.totals()["prefetch_issued"] == 0
    run_layer(cache, make_gate(1, [[2, 3]]))
    cache.end_pass()
    h = cache.host.totals()
    assert (h["hits"] + h["late_hits"], h["storage_reads"]) == (2, 4)


def test_a_watchdog_queue_entry_is_read_ahead_while_it_waits():
    scores = np.array([0.0, 0.0, 0.5, 0.4, 0.05, 0.05])
    cache = cache_with_host(slots=6, capacity=6, prefetch="topk(overfetch=1.0)",
                            prefetch_queue="watchdog")
    cache.begin_pass("decode", 1, 10)
    run_layer(cache, make_gate(0, [[0, 1]], 1, scores))
    assert cache.host.totals()["read_ahead"] == 2


def _host_evictions() -> list[str]:
    """Every eviction policy the host tier accepts: the registry's, but those that read the
    future routing or the router's probabilities (the host tier has neither)."""
    return [n for n in names("eviction") if not (policy_class("eviction", n).needs_future
                                                 or policy_class("eviction", n).needs_probs)]


def _pairs() -> list[tuple[str, str]]:
    """(device eviction, host eviction): every live device eviction and every host eviction at
    least once, rotating (offset: not the same policy in both tiers every time)."""
    device, host = names("eviction", live=True), _host_evictions()
    return [(device[i % len(device)], host[(i + 4) % len(host)])
            for i in range(max(len(device), len(host)))]


def test_the_host_tier_takes_every_policy_but_those_reading_the_future_or_scores():
    accepted = _host_evictions()
    assert "lru" in accepted and "belady" not in accepted and "score" not in accepted
    for n in names("eviction"):
        config = _config(slots=4, host_capacity_frac=0.5, host_eviction=n)
        if n in accepted:
            assert _shape_cache(config).host.policy.name == n
        else:
            with pytest.raises(ConfigError, match=rf"host_eviction='{n}' reads"):
                _shape_cache(config)


@pytest.mark.parametrize("eviction, host_eviction", _pairs())
@settings(max_examples=examples(5))
@given(slots=st.integers(2, 12), capacity=st.integers(E + 1, 18), seed=st.integers(0, 1000),
       prefetch=st.sampled_from(["none", "topk(overfetch=1.0)", "score_percentile(p=80)"]))
def test_the_host_tier_changes_timings_not_device_residency(eviction, host_eviction, slots,
                                                            capacity, seed, prefetch):
    """With the immediate queue the device tier's decisions do not depend on time, so a host
    tier larger than one layer's experts (a prefetch then always finds a host slot the running
    wave does not hold), of any policy (every host eviction of the registry, each beside a
    device eviction, every live one at least once), leaves every device counter but the
    ready/late split as it was; and its own counters add up."""
    rng = np.random.default_rng(seed)
    trace = random_scored_trace(rng, layers=3, experts=E, k=K, passes=[4, 1, 1, 1, 1],
                                expert_bytes=B)
    runs = []
    for host in (None, capacity):
        cache = make_cache(slots, eviction=eviction, prefetch=prefetch,
                           host=None if host is None else host_tier(host, host_eviction))
        replay(cache, [trace], [0], None)
        cache.check_invariants()
        runs.append(cache)
    plain, tiered = (c.metrics.totals() for c in runs)
    for k in ("requests", "misses", "collision_misses", "evictions", "prefetch_issued",
              "prefetch_used"):
        assert plain[k] == tiered[k], k
    assert plain["hits"] + plain["late_hits"] == tiered["hits"] + tiered["late_hits"]
    host = runs[1].host
    host.check_invariants()
    h = host.totals()
    assert h["requests"] == tiered["misses"] + tiered["prefetch_issued"]
    assert h["storage_stall_s"] <= tiered["stall_s"] + 1e-12
    assert tiered["stall_s"] >= plain["stall_s"] - 1e-12


# -- configuration -------------------------------------------------------------------------


def _config(**cache):
    c = base_config()
    for k, v in cache.items():
        c.cache[k] = v
    return c


def _shape_cache(config, precision_bytes=None):
    return build_cache_for(resolve(config), None, precision_bytes or {"native": B}, True,
                           {"eviction": "lru", "prefetch": "none", "miss": "fetch",
                            "routing": "standard"},
                           layers=(0, 1, 2), num_layers=3, num_experts=E, top_k=K)


def test_the_default_has_no_host_tier_and_a_fraction_sizes_it():
    assert _shape_cache(_config(slots=4)).host is None
    cache = _shape_cache(_config(slots=4, host_capacity_frac=0.5))
    assert cache.host.capacity == 9 and cache.host.read_bytes == B
    assert _shape_cache(_config(slots=4, host_bytes=7 * B + 1)).host.capacity == 7


def test_a_host_tier_smaller_than_one_layer_names_both_numbers():
    with pytest.raises(ConfigError, match=r"holds 5 of the 18 experts.*one layer's 6 experts"):
        _shape_cache(_config(slots=4, host_capacity_frac=5 / 18))
    with pytest.raises(ConfigError, match=r"host_bytes=100000 holds 2 experts.*6 experts"):
        _shape_cache(_config(slots=4, host_bytes=2 * B))


@pytest.mark.parametrize("field, value, match", [
    ("host_capacity_frac", 0.0, r"host_capacity_frac=0.0 must be in \(0, 1\]"),
    ("host_capacity_frac", 1.5, r"host_capacity_frac=1.5"),
    ("host_bytes", -1, r"host_bytes=-1 must be an integer >= 0"),
    ("host_eviction", "belady", r"host_eviction='belady' reads the future"),
    ("host_eviction", "score", r"host_eviction='score' reads router scores"),
])
def test_bad_host_settings_name_the_field(field, value, match):
    config = _config(slots=4, host_capacity_frac=0.5)
    config.cache[field] = value
    with pytest.raises(ConfigError, match=match):
        _shape_cache(config)


def test_a_host_tier_needs_one_precision_pool():
    config = _config(capacity_frac=0.5, host_capacity_frac=0.5)
    config.policies.miss = "fetch_lowest_bit(levels='native:int4')"
    with pytest.raises(ConfigError, match="needs a cache of one precision"):
        build_cache_for(resolve(config), None, {"native": B, "int4": B // 4}, True,
                        layers=(0, 1, 2), num_layers=3, num_experts=E, top_k=K)


def test_storage_presets_and_overrides():
    assert storage_lib.get("sata_ssd").read_gbps == 0.56
    assert storage_lib.get("nvme_gen4", read_gbps=2.5).read_gbps == 2.5
    with pytest.raises(ConfigError, match="storage.preset='floppy' is not one of"):
        storage_lib.get("floppy")
    with pytest.raises(ConfigError, match="storage.queue_depth=0 must be an integer >= 1"):
        storage_lib.get("hdd", queue_depth=0)
    with pytest.raises(ConfigError, match="storage.read_gbps=-1.0 must be a finite number > 0"):
        storage_lib.get("hdd", read_gbps=-1.0)
    # Queue depth overlaps latencies; the bandwidth is shared.
    q = StorageQueue(Storage("q", read_gbps=1.0, read_latency_s=1e-3, queue_depth=2))
    assert q.read(B, 0.0) == pytest.approx(1e-3 + B / 1e9)
    assert q.read(B, 0.0) == pytest.approx(1e-3 + 2 * B / 1e9)  # the second read's bytes wait


def test_replay_reports_the_host_tier(tmp_path):
    from moejax.jobs import replay as replay_job

    config = base_config()
    config.job, config.clock.kind, config.model.preset = "replay", "virtual", ""
    config.replay.trace = "moejax/assets/traces/prose_0.npz"
    config.cache.host_capacity_frac, config.storage.preset = 0.3, "sata_ssd"
    config.log.progress = config.log.tensorboard = False
    replay_job.run(config, str(tmp_path))
    host = json.load(open(tmp_path / "results.json"))["cache"]["host"]
    assert host["storage"]["preset"] == "sata_ssd" and host["eviction"] == "lru"
    t = host["total"]
    assert t["requests"] > 0 and t["storage_bytes"] == t["storage_reads"] * host["expert_read_bytes"]
    assert t["storage_stall_s"] > 0
    assert sum(r["misses"] for r in host["per_layer"]) == t["misses"]


def test_build_host_tier_is_none_without_one():
    cache = _shape_cache(_config(slots=4))
    assert build_host_tier(resolve(_config(slots=4)), cache.shape, B, True) is None


def test_a_prefetch_finding_no_host_slot_does_not_go():
    # Host capacity 2, both held by layer 0's running wave: the predictions for layer 1 find
    # no host slot, so nothing is prefetched or read ahead (a prefetch never blocks).
    scores = np.array([0.0, 0.0, 0.5, 0.4, 0.05, 0.05])
    cache = cache_with_host(slots=6, capacity=2, prefetch="topk(overfetch=1.0)")
    cache.begin_pass("decode", 1, 10)
    run_layer(cache, make_gate(0, [[0, 1]], 1, scores))
    assert cache.metrics.totals()["prefetch_issued"] == 0
    assert cache.host.totals()["read_ahead"] == 0 and set(cache.host.ready) == {(0, 0), (0, 1)}


# -- placement: full layers and seeding ------------------------------------------------------


def test_full_layers_are_resident_hits_and_never_evicted():
    cache = make_cache(slots=8, full_layers=1)  # layer 0's six experts + 2 shared slots
    cache.begin_pass("decode", 1, 10)
    for layer, ids in ((0, [0, 5]), (1, [0, 1]), (2, [2, 3]), (0, [3, 4])):
        run_layer(cache, make_gate(layer, [ids]))
    cache.end_pass()
    t = cache.metrics.per_layer
    assert (t["hits"][0], t["misses"][0]) == (4, 0)  # layer 0: always resident and ready
    assert (t["misses"][1], t["misses"][2], t["evictions"].sum()) == (2, 2, 2)
    assert {(0, e) for e in range(E)} <= set(cache.residency)
    assert cache.clock.now() == pytest.approx(4 * T)  # only layers 1 and 2 fetched


def test_full_layers_leaving_fewer_slots_than_top_k_are_an_error():
    with pytest.raises(ConfigError, match=r"full_layers=1 reserves 6 of the 7 slots, leaving 1"):
        make_cache(slots=7, full_layers=1)
    with pytest.raises(ConfigError, match=r"full_layers=4 must be in 0..3"):
        make_cache(slots=30, full_layers=4)


def test_a_seed_places_the_hottest_ready_and_priorities_protect_them():
    cache = make_cache(slots=3, eviction="priority")
    hot = [(0, 1), (0, 2), (1, 3), (2, 4)]
    assert cache.seed(hot, {k: 32 - i for i, k in enumerate(hot)}) == 3
    assert set(cache.residency) == {(0, 1), (0, 2), (1, 3)}
    cache.begin_pass("decode", 1, 10)
    run_layer(cache, make_gate(0, [[1, 2]]))  # seeded: ready hits, no time
    assert cache.clock.now() == 0.0
    run_layer(cache, make_gate(2, [[0, 5]]))  # two misses; the wave's own keys are pinned
    cache.end_pass()
    t = cache.metrics.totals()
    assert (t["hits"], t["misses"], t["evictions"]) == (2, 2, 2)
    # The two victims are the lowest-priority seeds ((1, 3) at 30, then (0, 2) at 31): ds4's
    # priorities are not pins.
    assert set(cache.residency) == {(0, 1), (2, 0), (2, 5)}


def test_the_seed_config_builds_a_hotlist_into_both_tiers(tmp_path):
    config = _config(slots=4, host_capacity_frac=0.5)
    config.policies.eviction, config.cache.host_eviction = "priority", "priority"
    config.cache.seed = "hotlist(trace=moejax/assets/traces/prose_1.npz, top=20)"
    from moejax.traces.format import load

    trace = load("moejax/assets/traces/prose_1.npz")
    cache = build_cache_for(resolve(config), None, {"native": B}, True,
                            layers=tuple(trace.layers), num_layers=max(trace.layers) + 1,
                            num_experts=trace.num_experts, top_k=trace.top_k)
    assert cache.seeding["device_seeded"] == 4 and cache.seeding["host_seeded"] == 20
    assert cache.seeding["experts"] == 20 and cache.seeding["priority_policy"]
    assert len(cache.host.ready) == 20 and cache.host.seeded == 20


# -- warm start (issue 13) -----------------------------------------------------------------


def _trace_cache(config):
    from moejax.traces.format import load

    trace = load("moejax/assets/traces/prose_1.npz")
    return build_cache_for(resolve(config), None, {"native": B}, True, layers=tuple(trace.layers),
                           num_layers=max(trace.layers) + 1, num_experts=trace.num_experts,
                           top_k=trace.top_k), trace


def test_warm_start_all_fills_every_slot_with_an_equal_share_of_each_layer():
    config = _config(slots=40)
    config.cache.warm_start = "all"
    cache, trace = _trace_cache(config)
    assert cache.seeding["device_seeded"] == 40 and not cache.seeding["priority_policy"]
    per_layer = [len(cache.in_cache[l]) for l in trace.layers]
    assert per_layer == [5] * 8  # 40 slots over 8 layers
    # Every expert fits: a replay then never misses.
    config = _config(slots=len(trace.layers) * trace.num_experts)
    config.cache.warm_start = "all"
    cache, trace = _trace_cache(config)
    replay(cache, [trace], [0], None)
    assert cache.metrics.totals()["misses"] == 0


def test_warm_start_hotlist_preloads_without_priorities():
    config = _config(slots=6)
    config.policies.eviction = "priority"
    config.cache.warm_start = "hotlist(trace=moejax/assets/traces/prose_0.npz)"
    cache, _ = _trace_cache(config)
    assert cache.seeding["device_seeded"] == 6 and not cache.seeding["priority_policy"]
    assert cache.seeding["spec"].startswith("cache.warm_start=hotlist(")


@pytest.mark.parametrize("seed, warm, match", [
    ("hotlist(trace=moejax/assets/traces/prose_0.npz)", "all", "set one"),
    ("", "everything", r"cache.warm_start='everything' is not one of"),
])
def test_bad_warm_starts_are_named(seed, warm, match):
    config = _config(slots=6)
    config.cache.seed, config.cache.warm_start = seed, warm
    with pytest.raises(ConfigError, match=match):
        _trace_cache(config)


def test_a_live_warm_start_at_full_capacity_fetches_nothing(tmp_path):
    from moejax import jobs

    runs = {}
    for warm in ("none", "all"):
        c = base_config()
        c.model.preset, c.model.family = "tiny", "olmoe"
        c.cache.capacity_frac, c.cache.warm_start = 1.0, warm
        c.run.max_new_tokens, c.log.progress, c.log.tensorboard = 4, False, False
        c.clock.kind = "virtual"  # the TTFTs compared below are modelled (auto: wall on a GPU)
        runs[warm] = jobs.run(c, str(tmp_path / warm))
    assert runs["all"]["generated_token_ids"] == runs["none"]["generated_token_ids"]
    cold, warm = runs["none"]["cache"], runs["all"]["cache"]
    assert warm["total"]["misses"] == 0 < cold["total"]["misses"]
    assert warm["timing"]["ttft_s"] < cold["timing"]["ttft_s"]
    assert warm["seed"]["device_seeded"] == warm["slots"]
