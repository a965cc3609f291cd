"""Precision pools in the cache core (replay and live share it): the byte budget split over
per-precision slot pools (`moejax/cache/capacity.py`), capacity as a share of the whole model
(SpecMD's meaning), the precision-aware miss policies (`fetch_lowest_bit`, `fetch_priority`
with its capacity fallback, `drop_priority_cascade`), upgrades, LHU eviction, the metrics per
precision, and replay equivalence — all without JAX weights (hand-built gates and traces).
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from moejax import jobs
from moejax.bundled import SCORED_TRACES_DIR, capture_path
from moejax.cache import CacheOptions, ExpertCache, build_cache_for, capacity
from moejax.cache.summary import table
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_config import ModelConfig
from moejax.models import sizes
from moejax.policies import build, names
from moejax.policies.presets import PRESETS
from moejax.replay.engine import replay
from moejax.replay.gates import layer_gates
from moejax.seam import LayerGate
from moejax.testing import random_scored_trace
from moejax.traces.format import load
from tests.fuzzing import examples

GiB = 2 ** 30
BYTES = {"native": 1000, "int8": 500, "int4": 250, "int2": 125}
E, K = 8, 2
CTX = dict(num_layers=1, num_experts=E, top_k=K, num_slots=8, seed=0, renormalize=True)


def _config(miss="fetch", eviction="lru", prefetch="none", **cache):
    c = base_config()
    c.clock.kind = "virtual"
    c.policies.miss, c.policies.eviction, c.policies.prefetch = miss, eviction, prefetch
    c.policies.routing = "standard"
    for k, v in cache.items():
        setattr(c.cache, k, v)
    return c


def _cache(config, layers=(0,), num_experts=E, top_k=K, precision_bytes=BYTES) -> ExpertCache:
    return build_cache_for(resolve(config), None, precision_bytes, True, layers=tuple(layers),
                           num_layers=len(layers), num_experts=num_experts, top_k=top_k)


def _gate(layer, ids, weights=None):
    ids = np.atleast_2d(np.asarray(ids, np.int64))
    w = None if weights is None else np.atleast_2d(np.asarray(weights, np.float32))
    return LayerGate(layer, ids, w, None)


def _run(cache, gates, kind="decode"):
    cache.begin_pass(kind, gates[0].ids.shape[0], 1)
    waves = []
    for gate in gates:
        waves.extend(cache.run_layer(gate))
        cache.check_invariants()
    cache.end_pass()
    return waves


# -- capacity and pools -----------------------------------------------------------------------

def test_model_bytes_match_specmds_table():
    olmoe = preset("olmoe", "olmoe-1b-7b")
    params = olmoe.dense_param_count + olmoe.expert_param_count * olmoe.num_experts \
        * olmoe.num_moe_layers
    assert params == pytest.approx(6.92e9, rel=2e-3)
    assert olmoe.model_bytes / GiB == pytest.approx(12.89, abs=0.01)
    assert olmoe.total_expert_bytes / GiB == 12.0
    mixtral = preset("mixtral", "mixtral-8x7b")
    assert mixtral.model_bytes / GiB == pytest.approx(86.99, abs=0.01)


@settings(max_examples=16, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(["mixtral", "olmoe", "phimoe", "qwen2_moe"]),
       data=st.data())
def test_the_dense_count_is_the_decoders_own(family, data):
    """`ModelConfig.dense_param_count` is arithmetic over the config; it must count what the
    decoder's abstract shapes hold, for every family, with dense layers among the MoE ones and
    every option that adds parameters on or off (biases, q/k norms, LayerNorm, a shared
    expert, tied embeddings)."""
    base = preset(family, "tiny", 0)
    layers = data.draw(st.integers(1, 5), label="layers")
    moe = data.draw(st.lists(st.integers(0, layers - 1), min_size=1, unique=True), label="moe")
    flag = st.booleans()
    cfg = dataclasses.replace(
        base, num_layers=layers, moe_layers=tuple(sorted(moe)), sliding_window=(),
        dense_intermediate_size=data.draw(st.sampled_from([24, 40]), label="dense width"),
        shared_expert_intermediate_size=data.draw(st.sampled_from([0, 16]), label="shared"),
        tie_word_embeddings=data.draw(flag, label="tied"),
        qkv_bias=data.draw(flag, label="qkv bias"), o_bias=data.draw(flag, label="o bias"),
        lm_head_bias=data.draw(flag, label="lm head bias"),
        qk_norm=data.draw(flag, label="qk norm"),
        norm=data.draw(st.sampled_from(["rms", "layer"]), label="norm"))
    assert cfg.dense_param_count == sizes.abstract_dense_param_count(cfg)


def test_olmoe_at_five_percent_of_the_model():
    """SpecMD's "5% or 0.6 GB" of OLMoE: 0.64 GiB, 195 four-bit experts (54 native)."""
    cfg = preset("olmoe", "olmoe-1b-7b")
    by = capacity.precision_bytes_of(cfg)
    assert by["native"] == cfg.expert_bytes == 12 * 2 ** 20
    assert by["int4"] == 3 * 2 ** 20 + 384 * 1024  # packed values + f16 scales and zeros
    common = dict(precision_bytes=by, total_experts=1024, top_k=8, capacity_frac=0.05,
                  slots=None, model_bytes=cfg.model_bytes)
    model = capacity.pools_for(in_use=("int4",), capacity_of="model", **common)
    assert model.capacity_bytes / GiB == pytest.approx(0.644, abs=1e-3)
    assert model.pools[0].num_slots == 195
    native = capacity.pools_for(in_use=("native",), capacity_of="model", **common)
    assert native.pools[0].num_slots == 54
    experts = capacity.pools_for(in_use=("native",), capacity_of="experts", **common)
    assert experts.pools[0].num_slots == 51  # floor(0.05 * 1024): the old meaning
    assert experts.capacity_bytes == pytest.approx(0.05 * cfg.total_expert_bytes)


def test_pools_share_the_budget():
    common = dict(precision_bytes=BYTES, total_experts=64, top_k=2, capacity_frac=0.5,
                  slots=None)
    b = capacity.pools_for(in_use=("int8", "int4", "int2"), **common)  # C = 32 000 bytes
    assert [(p.precision, p.num_slots, p.offset) for p in b.pools] == [
        ("int8", 21, 0), ("int4", 42, 21), ("int2", 64, 63)]  # int2: 85 capped at 64 experts
    b = capacity.pools_for(in_use=("int8", "int4"), shares="int8=0.75, int4=0.25", **common)
    assert [p.num_slots for p in b.pools] == [48, 32]
    assert sum(p.num_slots * p.expert_bytes for p in b.pools) <= b.capacity_bytes


@pytest.mark.parametrize("kwargs, message", [
    (dict(shares="int8=0.5,int4=0.6"), "sum to 1.1"),
    (dict(shares="int8=1.0,int4=0"), "must be > 0"),
    (dict(shares="int8=1.0"), r"no share to \['int4'\]"),
    (dict(shares="int8=0.5,int2=0.5"), "int2 is not a precision in use"),
    (dict(shares="fp8=1"), "fp8"),
    (dict(shares="int8:1"), "precision=share"),
    (dict(capacity_frac=0.02), r"the int8 pool .* 1 slots of 500 bytes at a share of 0.5"),
    (dict(capacity_frac=None, slots=8), "cache.slots=8 is one pool's slot count"),
    (dict(capacity_of="model"), "capacity_of='model' needs the model"),
    (dict(capacity_of="weights"), "capacity_of='weights'"),
])
def test_pool_errors(kwargs, message):
    args = dict(in_use=("int8", "int4"), precision_bytes=BYTES, total_experts=64, top_k=2,
                capacity_frac=0.5, slots=None)
    with pytest.raises(ConfigError, match=message):
        capacity.pools_for(**{**args, **kwargs})


def test_slots_and_min_slots_with_one_pool():
    args = dict(in_use=("int4",), precision_bytes=BYTES, total_experts=64, top_k=2)
    assert capacity.pools_for(**args, capacity_frac=None, slots=7).pools[0].num_slots == 7
    b = capacity.pools_for(**args, capacity_frac=0.01, slots=None, min_slots=3)
    assert b.pools[0].num_slots == 3 and b.capacity_bytes == 3 * 250  # the floor lifts it


def test_a_precision_the_source_lacks_names_what_it_has():
    c = _config(precision="int4")
    with pytest.raises(ConfigError, match=r"no int4 experts \(it has \['native'\]\)"):
        _cache(c, precision_bytes={"native": 1000})
    c = _config(miss="fetch_priority(levels='int8:int4')", capacity_frac=0.5)
    with pytest.raises(ConfigError, match=r"no \['int4'\] experts"):
        _cache(c, precision_bytes={"native": 1000, "int8": 500})


# -- the precision-aware miss policies ---------------------------------------------------------

WEIGHTS = [0.3, 0.2, 0.15, 0.12, 0.1, 0.07, 0.04, 0.02]  # experts 0..7 in rank order


def test_fetch_priority_bands():
    policy = build("miss", "fetch_priority(levels='int8:int4:int2', percentile=60)", **CTX)
    gate = _gate(0, range(8), WEIGHTS)
    d = policy.handle(gate, gate.ids, gate.weights, set())
    # p60 = 0.126, p30 = 0.073: >= p60 int8 (not named), p30..p60 int4, < p30 int2.
    assert d.precision == {3: "int4", 4: "int4", 5: "int2", 6: "int2", 7: "int2"}
    assert d.active.all() and not d.dropped
    # An id-only gate: the router rank stands in for the score.
    ids_only = _gate(0, range(8))
    d = policy.handle(ids_only, ids_only.ids, np.ones((1, 8), np.float32), set())
    assert d.precision == {3: "int4", 4: "int4", 5: "int2", 6: "int2", 7: "int2"}
    # Several tokens: an expert's score is its largest weight over them.
    gate = _gate(0, [[0, 1], [2, 1]], [[0.9, 0.1], [0.5, 0.5]])
    d = build("miss", "fetch_priority(levels='int8:int4', percentile=60)", **CTX).handle(
        gate, gate.ids, gate.weights, set())
    assert d.precision == {1: "int4", 2: "int4"}  # scores 0.9, 0.5, 0.5; p60 = 0.66


def test_drop_priority_cascade_drops_the_last_band_only_when_missing():
    policy = build("miss", "drop_priority_cascade(levels='int8:int4', percentile=60, keep=1)",
                   **CTX)
    gate = _gate(0, [list(range(8)), [7] + list(range(7))],
                 [WEIGHTS, [0.01] + WEIGHTS[:7]])
    d = policy.handle(gate, gate.ids, gate.weights, resident={6})
    # Bands as fetch_priority's int8:int4:int2: 5, 6, 7 are the last, 6 is resident and 7 is
    # the second token's top-1: only 5 is dropped.
    assert d.dropped == 1 and not d.active[gate.ids == 5].any() and d.active[gate.ids != 5].all()
    assert (d.weights[gate.ids == 5] == 0).all()
    assert d.precision == {3: "int4", 4: "int4", 6: "int4", 7: "int4"}


def test_fetch_lowest_bit_fetches_low_and_prefetches_high():
    c = _config(miss="fetch_lowest_bit", capacity_frac=1.0)
    cache = _cache(c, layers=(0, 1))
    assert cache.shape.precisions == ("int8", "int4") and cache.shape.precision == "int8"
    _run(cache, [_gate(0, [0, 1]), _gate(1, [2, 3])])
    t = cache.metrics.totals()
    assert t["requests_by_precision"] == {"int8": 0, "int4": 4}
    assert t["h2d_bytes_by_precision"] == {"int8": 0, "int4": 4 * 250} and t["misses"] == 4
    assert all(cache.precision_of(k) == "int4" for k in cache.residency)


def test_prefetch_moves_the_plain_precision():
    c = _config(miss="fetch_lowest_bit", prefetch="topk(overfetch=1.0)", capacity_frac=1.0)
    cache = _cache(c, layers=(0, 1))
    spec = np.zeros((1, 1, E), np.float32)
    spec[0, 0, [4, 5]] = 1.0
    g0 = LayerGate(0, np.array([[0, 1]]), np.array([[0.5, 0.5]], np.float32), None, spec, (1,))
    g1 = LayerGate(1, np.array([[4, 5]]), np.array([[0.5, 0.5]], np.float32), None,
                   np.zeros((1, 1, E), np.float32), ())
    _run(cache, [g0, g1])
    t = cache.metrics.totals()
    assert t["prefetch_issued"] == 2 and t["hits"] + t["late_hits"] == 2 == t["prefetch_used"]
    assert cache.precision_of((1, 4)) == "int8"
    assert t["requests_by_precision"] == {"int8": 2, "int4": 2}
    assert t["h2d_bytes_by_precision"] == {"int8": 2 * 500, "int4": 2 * 250}


def _upgrade_run(upgrade: bool):
    c = _config(miss=f"fetch_priority(levels='int8:int4', percentile=60, upgrade={upgrade})",
                capacity_frac=1.0)
    cache = _cache(c)
    _run(cache, [_gate(0, [0, 1], [0.9, 0.1])])  # 0 at int8, 1 at int4
    assert cache.precision_of((0, 0)) == "int8" and cache.precision_of((0, 1)) == "int4"
    _run(cache, [_gate(0, [1, 2], [0.9, 0.1])])  # now 1 is wanted at int8
    return cache, cache.metrics.totals()


def test_an_upgrade_is_a_miss_not_an_eviction():
    cache, t = _upgrade_run(True)
    assert cache.precision_of((0, 1)) == "int8"
    assert (t["upgrades"], t["misses"], t["hits"], t["evictions"]) == (1, 4, 0, 0)
    assert t["served_below_wanted"] == 0
    assert t["demand_bytes"] == 500 + 250 + 500 + 250
    assert t["requests_by_precision"] == {"int8": 2, "int4": 2}
    assert len(cache.free_lists[1]) == cache.shape.pools[1].num_slots - 1  # low slot freed


def test_without_upgrade_the_low_copy_serves():
    cache, t = _upgrade_run(False)
    assert cache.precision_of((0, 1)) == "int4"
    assert (t["upgrades"], t["misses"], t["hits"], t["served_below_wanted"]) == (0, 3, 1, 1)
    assert t["requests_by_precision"] == {"int8": 1, "int4": 3}


def test_a_higher_copy_serves_a_lower_request():
    cache, _ = _upgrade_run(True)
    _run(cache, [_gate(0, [2, 1], [0.9, 0.1])])  # 1 wanted at int4, resident at int8
    t = cache.metrics.totals()
    assert t["hits"] == 1 and t["upgrades"] == 2 and t["served_below_wanted"] == 0
    assert cache.precision_of((0, 1)) == "int8"


def _fallback_cache(fallback: bool):
    # int8 pool: 0.4 * 4000 / 500 = 3 slots; int4: 0.6 * 4000 / 250 = 9 -> 8 (every expert).
    c = _config(miss="fetch_priority(levels='int8:int4', percentile=0)", capacity_frac=0.5,
                precision_shares="int8=0.4,int4=0.6")
    cache = _cache(c)
    assert [p.num_slots for p in cache.shape.pools] == [3, 8]
    cache.miss.fallback = fallback
    prefill = _gate(0, [[0, 1], [2, 3], [4, 5]], [[0.5, 0.5]] * 3)  # 6 experts, all want int8
    waves = _run(cache, [prefill], kind="prefill")
    return cache, waves, cache.metrics.totals()


def test_fetch_priority_falls_to_a_lower_pool_when_its_pool_is_full():
    cache, waves, t = _fallback_cache(True)
    assert len(waves) == 1 and t["waves"] == 1
    assert t["requests_by_precision"] == {"int8": 3, "int4": 3}
    assert t["served_below_wanted"] == 3
    assert t["products_by_precision"] == {"int8": 3, "int4": 3}
    assert t["products_share_by_precision"] == {"int8": 0.5, "int4": 0.5}


def test_without_fallback_the_wave_splits():
    cache, waves, t = _fallback_cache(False)
    assert len(waves) == 2 and t["requests_by_precision"] == {"int8": 6, "int4": 0}
    assert t["served_below_wanted"] == 0
    assert sum(w.active.sum() for w in waves) == 6


def test_lhu_keeps_high_precision_experts():
    c = _config(miss="fetch_priority(levels='int8:int4', percentile=60)", eviction="lhu",
                capacity_frac=0.5, precision_shares="int8=0.25,int4=0.75")
    cache = _cache(c)
    assert [p.num_slots for p in cache.shape.pools] == [2, 8]
    for ids in ([0, 1], [0, 2], [3, 0], [4, 5]):
        _run(cache, [_gate(0, ids, [0.9, 0.1])])
    # int8 pool of two: 0 (three int8 uses) stays, 3 and 4 took turns in the other slot.
    assert cache.precision_of((0, 0)) == "int8"
    assert cache.precision_of((0, 4)) == "int8" and (0, 3) not in cache.residency


def test_table_has_a_line_per_precision():
    cache, _, _ = _fallback_cache(True)
    text = table(cache.metrics, "header")
    assert "int8: requests 3 (50.0%), products 3 (50.0%), H2D" in text
    assert "upgrades 0, served below the precision wanted 3" in text
    one = _cache(_config(capacity_frac=1.0))
    assert "int8:" not in table(one.metrics, "header")


# -- the budget, as a property over traces, capacities, shares and policies --------------------

MISSES = ["fetch", "drop(keep=1)", "fetch_lowest_bit", "fetch_lowest_bit(levels='native:int2')",
          "fetch_priority", "fetch_priority(levels='int8:int4:int2', upgrade=True)",
          "fetch_priority(levels='native:int4', percentile=90, upgrade=True)",
          "drop_priority_cascade", "drop_priority_cascade(levels='int8:int4:int2', upgrade=True)"]


class _Checked(ExpertCache):
    """Checks the budget at every wave (a subclass: replay runs it on the reference engine,
    which the test asserts)."""

    waves_checked = 0

    def run_layer(self, gate):
        for wave in super().run_layer(gate):
            self.check_invariants()
            for e, slot in wave.slot_of.items():
                assert self.slot_key[slot] == (gate.layer, e)
            self.waves_checked += 1
            yield wave


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.filter_too_much])
@given(miss=st.sampled_from(MISSES), eviction=st.sampled_from(names("eviction", live=True)),
       prefetch=st.sampled_from(["none", "topk(overfetch=1.5)"]),
       pin_scope=st.sampled_from(["layer", "request"]), frac=st.floats(0.05, 1.0),
       shares=st.lists(st.integers(1, 5), min_size=4, max_size=4), scored=st.booleans(),
       data=st.data())
def test_the_byte_budget_holds_at_every_wave(miss, eviction, prefetch, pin_scope, frac, shares,
                                             scored, data):
    layers, experts, k = data.draw(st.integers(2, 3)), data.draw(st.integers(4, 8)), 2
    trace = random_scored_trace(np.random.default_rng(data.draw(st.integers(0, 2 ** 16))),
                                layers, experts, k, [data.draw(st.integers(1, 6))] +
                                [1] * data.draw(st.integers(1, 6)), BYTES["native"],
                                noisy_spec=False, weights=scored)
    levels = build("miss", miss, **CTX).levels
    total = sum(shares[:len(levels)])
    share_text = ",".join(f"{p}={s / total!r}" for p, s in zip(levels, shares))
    c = _config(miss=miss, eviction=eviction, prefetch=prefetch, capacity_frac=frac,
                precision_shares=share_text if data.draw(st.booleans()) else "",
                pin_scope=pin_scope)
    try:
        plain = _cache(c, range(layers), experts, k)
    except ConfigError as e:
        assume("below what one decode layer needs" not in str(e))
        raise
    cache = _Checked(plain.shape, *plain.policies(),
                     CacheOptions(plain.clock, pin_scope=pin_scope))
    assert replay(cache, [trace]).engine == "reference"
    assert cache.waves_checked == sum(cache.metrics.per_layer["waves"])
    t = cache.metrics.totals()
    assert sum(t["requests_by_precision"].values()) == t["requests"] > 0
    assert sum(t["h2d_bytes_by_precision"].values()) == t["h2d_bytes"]
    assert sum(t["products_by_precision"].values()) == t["products"]
    assert t["hits"] + t["late_hits"] + t["misses"] == t["requests"]
    assert t["upgrades"] <= t["misses"] and t["wasted_prefetch_bytes"] <= t["prefetch_bytes"]
    for row in cache.metrics.layer_table():
        assert sum(row["requests_by_precision"].values()) == row["requests"]
        assert sum(row["h2d_bytes_by_precision"].values()) == \
            row["demand_bytes"] + row["prefetch_bytes"]
    if not cache.miss.upgrade:
        assert t["upgrades"] == 0
    used = {p for p, n in t["requests_by_precision"].items() if n}
    assert used <= set(levels)


# -- replay -----------------------------------------------------------------------------------

SCORED = sorted(glob.glob(os.path.join(SCORED_TRACES_DIR, "*.npz")))
CASCADE = "fetch_priority(levels='int8:int4:int2', percentile=60, upgrade=True)"


def _scored_config(**fields):
    c = _config(miss=CASCADE, eviction="lhu", prefetch="topk(overfetch=1.0)",
                capacity_frac=0.25)
    c.job, c.model.preset = "replay", ""
    c.log.progress = c.log.tensorboard = False
    for k, v in fields.items():
        section, name = k.split(".")
        setattr(c[section], name, v)
    return c


def test_the_same_gates_give_the_same_counters():
    trace = load(SCORED[0])
    cfg = ModelConfig.from_dict(trace.meta["model"])
    runs = []
    for _ in range(2):
        cache = build_cache_for(resolve(_scored_config()), cfg, capacity.precision_bytes_of(cfg), True)
        for p in range(trace.num_passes):
            cache.begin_pass("prefill" if p < trace.prefill_passes else "decode", 1, p + 1)
            for gate in layer_gates(trace, p):
                list(cache.run_layer(gate))
            cache.end_pass()
        cache.finish()
        runs.append(cache.metrics.to_dict())
    assert runs[0] == runs[1]
    t = runs[0]["total"]
    assert sum(1 for n in t["requests_by_precision"].values() if n) > 1


def test_the_replay_job_equals_the_cache_driven_directly(tmp_path):
    c = _scored_config()
    c.replay.trace = SCORED[0]
    res = jobs.run(c, str(tmp_path))
    trace = load(SCORED[0])
    cfg = ModelConfig.from_dict(trace.meta["model"])
    cache = build_cache_for(resolve(c), cfg, capacity.precision_bytes_of(cfg), cfg.norm_topk_prob)
    replay(cache, [trace])
    direct = cache.metrics.to_dict()
    assert res["cache"]["total"] == direct["total"]
    assert res["cache"]["per_layer"] == direct["per_layer"]
    pools = res["cache"]["pools"]
    assert list(pools) == ["int8", "int4", "int2"] and res["cache"]["precision"] == "int8"
    assert res["cache"]["total"]["upgrades"] > 0
    used = sum(p["slots"] * p["expert_bytes"] for p in pools.values())
    assert used <= res["cache"]["capacity_bytes"]
    assert res["cache"]["capacity_frac_of_experts"] == pytest.approx(0.25)
    assert res["cache"]["expert_bytes_by_precision"]["native"] == cfg.expert_bytes


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_at_int4(tmp_path, name):
    c = _scored_config(**{"cache.precision": "int4", "cache.min_slots": 4})
    c.policies.eviction = c.policies.miss = c.policies.prefetch = c.policies.routing = ""
    c.policies.preset, c.replay.trace = name, SCORED[1]
    res = jobs.run(c, str(tmp_path))
    cache = res["cache"]
    assert cache["precision"] == "int4" and cache["total"]["requests"] > 0
    assert set(cache["pools"]) == ({"int4", "int2"} if name == "specmd_3" else {"int4"})


def _capture(tmp_path, name, **fields):
    c = _config(capacity_frac=0.05, capacity_of="model", **fields)
    c.job, c.replay.trace, c.model.family, c.model.preset = "replay", capture_path("olmoe_prose"), \
        "olmoe", "olmoe-1b-7b"
    c.policies.prefetch = "none"
    c.log.progress = c.log.tensorboard = False
    return jobs.run(c, str(tmp_path / name))["cache"]


def test_olmoe_capture_at_five_percent_of_the_model(tmp_path):
    native = _capture(tmp_path, "native")
    int4 = _capture(tmp_path, "int4", precision="int4")
    assert native["slots"] == 54 and int4["slots"] == 195
    assert int4["capacity_bytes"] / GiB == pytest.approx(0.644, abs=1e-3)
    assert int4["capacity_frac_of_model"] == pytest.approx(0.05)
    assert int4["total"]["hit_rate"] > native["total"]["hit_rate"]
    assert int4["total"]["h2d_bytes_by_precision"] == {"int4": int4["total"]["h2d_bytes"]}
    cascade = _capture(tmp_path, "cascade", precision="int4",
                       miss="fetch_priority(percentile=60)", eviction="lhu")
    assert list(cascade["pools"]) == ["int4", "int2"]
    assert all(n > 0 for n in cascade["total"]["requests_by_precision"].values())


def test_capacity_of_model_needs_the_model(tmp_path):
    c = _scored_config(**{"cache.capacity_of": "model"})
    c.replay.trace = capture_path("olmoe_code")
    c.cache.expert_bytes = 1000
    c.policies.miss, c.policies.eviction, c.policies.prefetch = "fetch", "lru", "none"
    with pytest.raises(ConfigError, match="capacity_of='model' needs the model"):
        jobs.run(c, str(tmp_path))
