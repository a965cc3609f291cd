"""The compiled replay core (`moejax/cache/fast_replay.py`) against the reference (the policy
objects, request by request): identical counters per layer, pass timings, per-pass running
totals, final residency and clock — on every shipped trace and on random traces (property)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled, jobs
from moejax.cache import fast_replay
from moejax.cache.build import build_cache_for
from moejax.cache.replay import replay
from moejax.config import ConfigError
from moejax.job_config import base_config
from moejax.testing import random_scored_trace
from moejax.traces.importers import load_traces


def _config(eviction, slots, pin, **cache):
    c = base_config()
    c.cache.slots, c.cache.pin_scope = slots, pin
    c.policies.eviction, c.policies.prefetch = eviction, "none"
    c.policies.miss, c.policies.routing = "fetch", "standard"
    c.clock.kind = "virtual"
    for k, v in cache.items():
        c.cache[k] = v
    return c


def _cache(config, trace, expert_bytes=1000, hardware=None):
    if hardware:
        for k, v in hardware.items():
            config.hardware[k] = v
    return build_cache_for(config, None, {"native": expert_bytes}, False,
                           layers=tuple(trace.layers), num_layers=max(trace.layers) + 1,
                           num_experts=trace.num_experts, top_k=trace.top_k)


def _both(config, traces, **kw):
    ref, fast = _cache(config, traces[0], **kw), _cache(config, traces[0], **kw)
    assert replay(ref, traces, engine="reference") == "reference"
    assert replay(fast, traces) == "compiled"
    return ref, fast


def _assert_same(ref, fast):
    assert fast.metrics.to_dict() == ref.metrics.to_dict()
    assert fast.metrics.snapshots == ref.metrics.snapshots
    assert fast.residency == ref.residency and fast.slot_ready == ref.slot_ready
    assert (fast.clock.t, fast.clock.link_free, fast.clock.engine_free) == \
        (ref.clock.t, ref.clock.link_free, ref.clock.engine_free)
    assert sorted(fast.free) == sorted(ref.free)


@pytest.mark.parametrize("path", bundled.capture_files())
@pytest.mark.parametrize("eviction", ["lru", "belady"])
def test_every_real_capture_gives_the_reference_numbers(path, eviction):
    (trace,) = load_traces(path)
    slots = len(trace.layers) * trace.num_experts // 20  # 5%
    for pin in ("request", "layer"):
        ref, fast = _both(_config(eviction, slots, pin), [trace])
        _assert_same(ref, fast)


@pytest.mark.parametrize("path", bundled.scored_trace_files() + bundled.long_trace_files())
def test_every_scored_trace_through_the_replay_job_with_the_cost_model(path, tmp_path):
    """The embedded model's traces carry its config: the virtual clock charges the cost
    model's compute, which the compiled core adds in the reference's order."""
    out = {}
    for engine in ("reference", "auto"):
        c = _config("belady" if "long" in path else "lru", 40, "layer", replay_engine=engine)
        c.job, c.trace, c.model.preset = "replay", path, ""
        c.log.progress = c.log.tensorboard = False
        out[engine] = jobs.run(c, str(tmp_path / engine))
    assert out["auto"]["replay"]["engine"] == "compiled"
    assert out["reference"]["replay"]["engine"] == "reference"
    assert out["auto"]["cache"] == out["reference"]["cache"]
    assert out["auto"]["cache"]["timing"]["decode_s"] > 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), eviction=st.sampled_from(["lru", "belady"]),
       pin=st.sampled_from(["request", "layer"]), experts=st.integers(4, 12),
       extra=st.integers(0, 20), engines=st.integers(1, 3),
       passes=st.lists(st.integers(1, 3), min_size=2, max_size=12),
       sequences=st.integers(1, 2))
def test_random_traces_give_the_reference_numbers(seed, eviction, pin, experts, extra, engines,
                                                 passes, sequences):
    rng = np.random.default_rng(seed)
    k = 2
    traces = [random_scored_trace(rng, layers=3, experts=experts, k=k, passes=passes,
                                  expert_bytes=1000) for _ in range(sequences)]
    slots = min(max(passes) * k + extra, 3 * experts)
    ref, fast = _both(_config(eviction, slots, pin), traces,
                      hardware={"copy_engines": engines, "link_gbps": 2.0 * engines})
    _assert_same(ref, fast)


def test_what_the_compiled_core_does_not_cover_runs_on_the_reference():
    (trace,) = load_traces(bundled.capture_files()[0])
    for cache_args, policies in (({}, {"prefetch": "temporal"}), ({"host_capacity_frac": 0.5}, {}),
                                 ({"full_layers": 1}, {}), ({}, {"eviction": "least_stale"})):
        c = _config("lru", 200, "layer", **cache_args)
        for key, value in policies.items():
            c.policies[key] = value
        cache = _cache(c, trace)
        assert fast_replay.applicable(cache) is not None
        assert replay(cache, [trace]) == "reference"
    # A pass-layer needing more experts than slots (waves) too.
    prefill = random_scored_trace(np.random.default_rng(0), layers=2, experts=16, k=4,
                                  passes=[12, 1], expert_bytes=1000)
    cache = _cache(_config("lru", 8, "layer"), prefill)
    assert not fast_replay.fits(cache, [prefill])
    assert replay(cache, [prefill]) == "reference"
    with pytest.raises(ConfigError, match="replay_engine='fast' is not one of"):
        replay(_cache(_config("lru", 8, "layer"), prefill), [prefill], engine="fast")
