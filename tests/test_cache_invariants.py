"""DESIGN.md's invariants of the live cache, as property tests over random policies,
capacities and prompts on a tiny model (real JAX arrays, real slot loads):

1. exactness — standard routing + fetch gives the resident model's logits at every capacity
   and under every eviction and prefetch policy (waves included);
2. budget — resident plus in-flight experts never exceed the slots;
3. no use-after-evict — covered by exactness with one wave's slots overwritten by the next
   wave's loads while the first wave's step may still be running;
5. determinism — same config, same numbers;
and `hits + late_hits + misses == requests` per layer.
"""

from __future__ import annotations

import numpy as np
import pytest

from moejax.cache import PREFETCH_QUEUES
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import in_memory
from moejax.models.stepped import SteppedDecoder
from moejax.policies import names
from moejax.serving.build import build_cached_experts
from moejax.testing import random_model, resident_decoder

# Every policy that runs live, from the registry (a new one is fuzzed without editing a list),
# plus argument variants of the prefetchers.
EVICTIONS = names("eviction", live=True)
PREFETCHES = names("prefetch", live=True) + ["topk(overfetch=1.5, lookahead=2)",
                                             "score_percentile(p=50, lookahead=2)"]
SLOTS = [4, 7, 16, 64]  # top-k = 4 ... every expert (4 layers x 16)
MAX_LEN, NEW = 40, 6


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=11)
    return cfg, model, gate_up, down, in_memory(cfg, model, gate_up, down)


_reference: dict = {}


def _resident(tiny, prompt_len, seed):
    key = (prompt_len, seed)
    if key not in _reference:
        cfg, model, gate_up, down, _ = tiny
        prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, (1, prompt_len))
        dec = resident_decoder(model, gate_up, down, max_len=MAX_LEN, lookahead=2)
        _reference[key] = (prompt, dec.generate(prompt, NEW, keep_logits=True))
    return _reference[key]


def _cached_run(tiny, prompt, eviction, prefetch, slots, miss="fetch", routing="standard",
                queue="immediate", observe_routing: list | None = None):
    """`observe_routing`: appended, per layer decision, the tokens whose selected experts the
    routing policy changed."""
    cfg, model, _, _, loaded = tiny
    c = base_config()
    c.cache.prefetch_queue = queue
    c.cache.slots, c.policies.eviction, c.policies.prefetch = slots, eviction, prefetch
    c.policies.miss, c.policies.routing = miss, routing
    source = build_cached_experts(resolve(c), loaded)
    cache = source.cache
    if observe_routing is not None:
        select = cache.routing.select

        def observed(gate, cached):
            ids, weights = select(gate, cached)
            changed = np.sort(ids, -1) != np.sort(gate.ids, -1)
            observe_routing.append(int(changed.any(-1).sum()))
            return ids, weights

        cache.routing.select = observed
    checks = []

    def after_pass(_tokens):
        cache.check_invariants()
        checks.append(len(cache.residency))

    dec = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2, pass_observers=(after_pass,))
    out = dec.generate(prompt, NEW, keep_logits=True)
    cache.finish()
    return out, cache, checks


# Every live eviction with every live prefetcher (and its argument variants): the queue, the
# capacity and the prompt take turns, so each eviction and each prefetcher meets both queues,
# and every capacity from top-k (prefill layers in many waves) to every expert.
EXACTNESS_CASES = [(eviction, prefetch, PREFETCH_QUEUES[(i + j) % len(PREFETCH_QUEUES)],
                    SLOTS[(i + 2 * j) % len(SLOTS)], (5, 23)[(i + j // 2) % 2], (i + j) % 3)
                   for i, eviction in enumerate(EVICTIONS)
                   for j, prefetch in enumerate(PREFETCHES)]


@pytest.mark.slow
@pytest.mark.parametrize("eviction,prefetch,queue,slots,prompt_len,seed", EXACTNESS_CASES)
def test_exactness_budget_and_counters(tiny, eviction, prefetch, queue, slots, prompt_len, seed):
    prompt, ref = _resident(tiny, prompt_len, seed)
    out, cache, occupancy = _cached_run(tiny, prompt, eviction, prefetch, slots, queue=queue)
    # 1. Exactness, bit for bit (waves included: their float32 contributions are summed once).
    np.testing.assert_array_equal(out.prefill_logits, ref.prefill_logits)
    assert out.generated_ids == ref.generated_ids
    assert len(out.step_logits) == len(ref.step_logits) == NEW - 1
    for a, b in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    # 2. Budget, after every pass (the per-layer check runs inside check_invariants too).
    assert max(occupancy) <= slots and len(occupancy) == NEW
    # Counters.
    for row in cache.metrics.layer_table():
        assert row["hits"] + row["late_hits"] + row["misses"] == row["requests"]
        assert row["collision_misses"] <= row["misses"]
        assert row["prefetch_used"] <= row["prefetch_issued"]
    total = cache.metrics.totals()
    assert total["demand_bytes"] == total["misses"] * cache.shape.expert_bytes
    assert total["wasted_prefetch_bytes"] <= total["prefetch_bytes"]


def test_the_exactness_cases_cover_every_live_policy_and_every_queue():
    assert {c[0] for c in EXACTNESS_CASES} == set(names("eviction", live=True))
    assert {c[1] for c in EXACTNESS_CASES} >= set(names("prefetch", live=True))
    for name in names("eviction", live=True):
        assert {c[2] for c in EXACTNESS_CASES if c[0] == name} == set(PREFETCH_QUEUES)
    assert {c[3] for c in EXACTNESS_CASES} == set(SLOTS)


def test_decode_is_bit_exact_without_waves(tiny):
    """With room for a whole layer, no wave splits a sum: logits are bit-identical."""
    prompt, ref = _resident(tiny, 5, 0)
    out, _, _ = _cached_run(tiny, prompt, "least_stale", "score_percentile(p=80)", 16)
    np.testing.assert_array_equal(out.prefill_logits, ref.prefill_logits)
    for a, b in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("eviction, slots", [("fifo", 64), ("lru", 7)])
def test_watchdog_prefetches_for_the_running_layer_land_before_its_step(tiny, eviction, slots):
    """The watchdog sends, at a layer's start, transfers it could have sent while the previous
    layer ran — for this layer too. The runtime queues prefetch loads until a step is
    dispatched; one this step reads must go first (found by the property test above: with
    every expert fitting, the decode read slots whose prefetch had not been loaded yet)."""
    prompt, ref = _resident(tiny, 5, 0)
    out, cache, _ = _cached_run(tiny, prompt, eviction, "score_percentile(p=80)", slots,
                                queue="watchdog")
    assert cache.metrics.totals()["prefetch_issued"] > 0
    assert out.generated_ids == ref.generated_ids
    for a, b in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)


def test_waves_reuse_slots_without_use_after_evict(tiny):
    """S = top-k and a long prompt: every prefill layer runs in many waves through the same
    four slots, each wave's loads overwriting slots the previous wave's step reads."""
    prompt, ref = _resident(tiny, 23, 1)
    out, cache, _ = _cached_run(tiny, prompt, "lru", "none", 4)
    waves = cache.metrics.per_layer["waves"]
    assert waves.sum() > 2 * len(waves), "the prompt should need several waves per layer"
    np.testing.assert_array_equal(out.prefill_logits, ref.prefill_logits)
    assert out.generated_ids == ref.generated_ids


def test_same_config_same_numbers(tiny):
    prompt, _ = _resident(tiny, 23, 2)
    runs = [_cached_run(tiny, prompt, "random", "topk(overfetch=1.5)", 7) for _ in range(2)]
    (a, ca, _), (b, cb, _) = runs
    assert a.generated_ids == b.generated_ids
    assert ca.metrics.to_dict() == cb.metrics.to_dict()


@pytest.mark.parametrize("miss,routing", [("drop(keep=2)", "standard"),
                                          ("substitute(tol=0.5)", "standard"),
                                          ("fetch", "cache_aware(lam=2.0)")])
def test_quality_policies_change_the_model_and_still_keep_the_budget(tiny, miss, routing):
    prompt, ref = _resident(tiny, 23, 0)
    # Per-layer LRU keeps 3 experts of each layer: some selected experts are resident, some
    # missing (a global LRU at this size thrashes: no layer finds its own experts resident).
    rerouted = []
    out, cache, occupancy = _cached_run(tiny, prompt, "lru_per_layer", "none", 12, miss, routing,
                                        observe_routing=rerouted)
    assert max(occupancy) <= 12
    t = cache.metrics.totals()
    if routing == "standard":  # the miss policy changed the selection
        assert t["dropped"] + t["substituted"] > 0
        assert sum(rerouted) == 0
    else:  # cache-aware routing chose other experts than the router for some tokens
        assert t["dropped"] + t["substituted"] == 0
        assert sum(rerouted) > 0
    # The prefill starts from an empty cache; decode steps find experts resident.
    ours, theirs = np.concatenate(out.step_logits), np.concatenate(ref.step_logits)
    assert not np.allclose(ours, theirs, atol=1e-4), \
        "a lossy policy that changed the selection must change the logits"


def test_io_callback_gate_path_matches_returned_path(tiny):
    """SpecMD's gate hook (io_callback from inside the router step) and the plain path feed
    the cache the same gate outputs: same tokens, same counters, same virtual times."""
    cfg, model, _, _, loaded = tiny
    prompt, _ = _resident(tiny, 23, 0)
    runs = []
    for path in ("returned", "io_callback"):
        c = base_config()
        c.cache.slots, c.policies.eviction = 7, "least_stale"
        c.policies.prefetch = "score_percentile(p=80)"
        source = build_cached_experts(resolve(c), loaded)
        dec = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2, gate_path=path)
        out = dec.generate(prompt, NEW, keep_logits=True)
        source.cache.finish()
        runs.append((out, source.cache.metrics.to_dict()))
    (a, ma), (b, mb) = runs
    assert a.generated_ids == b.generated_ids
    np.testing.assert_array_equal(a.prefill_logits, b.prefill_logits)
    assert ma == mb


@pytest.mark.parametrize("prefetch", ["none", "score_percentile(p=80)"])
def test_a_complete_cache_decides_after_the_pass_with_the_same_numbers(tiny, prefetch):
    """Every expert resident (warm_start=all at 100%): the runtime takes each pass's decisions
    after it in one host round trip (`CachedExperts._can_defer`). Tokens, logits, counters and
    virtual times equal deciding layer by layer."""
    cfg, model, _, _, loaded = tiny
    prompt, ref = _resident(tiny, 5, 0)
    runs = []
    for defer in (True, False):
        c = base_config()
        c.cache.capacity_frac, c.cache.warm_start = 1.0, "all"
        c.policies.eviction, c.policies.prefetch = "least_stale", prefetch
        source = build_cached_experts(resolve(c), loaded)
        source.defer_complete = defer
        dec = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2)
        out = dec.generate(prompt, NEW, keep_logits=True)
        source.cache.finish()
        runs.append((out, source))
    (a, deferred), (b, inline) = runs
    assert deferred.deferred_passes == NEW and inline.deferred_passes == 0
    assert a.generated_ids == b.generated_ids == ref.generated_ids
    for x, y in zip(a.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(x, y)
    assert deferred.cache.metrics.to_dict() == inline.cache.metrics.to_dict()
    assert deferred.cache.metrics.totals()["misses"] == 0
