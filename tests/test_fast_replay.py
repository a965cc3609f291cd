"""The compiled replay engine (`moejax/replay/compiled.py`, `kernel.py`) against the
reference (the policy objects, request by request): identical counters per layer, pass timings,
per-pass running totals, final residency, prefetch origins and clock — on every shipped trace,
on the capture grid's settings (waves, prefetchers, both queues) and on random traces
(property tests over every compiled policy)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled, jobs
from moejax.cache.from_config import build_cache_for
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.replay import compiled
from moejax.replay.engine import replay
from moejax.testing import random_scored_trace
from moejax.traces.importers import load_traces
from moejax.traces.requests import as_requests

EVICTIONS = ("lru", "fifo", "lru_per_layer", "lfu", "fld", "least_stale",
             "least_stale(order=two_queue)", "least_stale(order=cyclic)", "belady")
SCORE_FREE_PREFETCHES = ("none", "temporal", "oracle", "noisy_oracle(precision=0.6)")
PREFETCHES = SCORE_FREE_PREFETCHES + ("topk(overfetch=1.5)", "score_percentile(p=80)",
                                      "topk(overfetch=1.0,lookahead=2)")


def _config(eviction, slots, pin, prefetch="none", **cache):
    c = base_config()
    c.cache.slots, c.cache.pin_scope = slots, pin
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
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
    assert fast.prefetch_origin == ref.prefetch_origin and not fast.queue and not ref.queue
    assert fast.running_pins == ref.running_pins
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


# Every compiled eviction on every capture, split into requests as the capture grid replays
# them (a 32-token prefill each: waves at the smallest capacity); the prefetchers, the queues
# and the capacities take turns so that each eviction meets every prefetcher.
GRID_CELLS = [(path, eviction, SCORE_FREE_PREFETCHES[(i + j) % 4],
               ("immediate", "watchdog")[(i + j) // 4 % 2], (24, 51, 256)[(i + 2 * j) % 3])
              for j, path in enumerate(bundled.capture_files())
              for i, eviction in enumerate(EVICTIONS)]


@pytest.mark.parametrize("path,eviction,prefetch,queue,slots", GRID_CELLS)
def test_the_capture_grid_settings_give_the_reference_numbers(path, eviction, prefetch, queue,
                                                              slots):
    (trace,) = load_traces(path)
    requests = as_requests(trace, 128, 32, path)[:2]
    ref, fast = _both(_config(eviction, slots, "layer", prefetch, prefetch_queue=queue),
                      requests)
    _assert_same(ref, fast)
    totals = fast.metrics.totals()
    pass_layers = sum(t.num_passes for t in requests) * len(trace.layers)
    if slots == 24:  # prefill layers in waves
        assert totals["waves"] > pass_layers
    if slots == 256:  # every layer in one
        assert totals["waves"] == pass_layers
    assert (totals["predicted"] > 0) == (prefetch != "none")


SCORED = bundled.scored_trace_files() + bundled.long_trace_files()


@pytest.mark.parametrize("n,path", list(enumerate(SCORED)))
def test_every_scored_trace_through_the_replay_job_with_the_cost_model(n, path, tmp_path):
    """The embedded model's traces carry its config: the virtual clock charges the cost
    model's compute, which the compiled engine adds in the reference's order (the experts'
    steps per wave). Each trace runs another eviction, score-based prefetcher and queue."""
    out = {}
    eviction = EVICTIONS[n % len(EVICTIONS)]
    prefetch = ("score_percentile(p=80)", "topk(overfetch=1.5)", "none")[n % 3]
    for engine in ("reference", "auto"):
        c = _config(eviction, 40, "layer", prefetch, replay_engine=engine,
                    prefetch_queue=("immediate", "watchdog")[n % 2])
        c.job, c.trace, c.model.preset = "replay", path, ""
        c.log.progress = c.log.tensorboard = False
        out[engine] = jobs.run(c, str(tmp_path / engine))
    assert out["auto"]["replay"]["engine"] == "compiled"
    assert out["reference"]["replay"]["engine"] == "reference"
    assert out["auto"]["cache"] == out["reference"]["cache"]
    assert out["auto"]["cache"]["timing"]["decode_s"] > 0


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), eviction=st.sampled_from(EVICTIONS),
       prefetch=st.sampled_from(PREFETCHES), queue=st.sampled_from(["immediate", "watchdog"]),
       pin=st.sampled_from(["request", "layer"]), experts=st.integers(4, 12),
       extra=st.integers(0, 24), engines=st.integers(1, 3),
       passes=st.lists(st.integers(1, 5), min_size=2, max_size=10),
       sequences=st.integers(1, 2))
def test_random_traces_give_the_reference_numbers(seed, eviction, prefetch, queue, pin, experts,
                                                 extra, engines, passes, sequences):
    """Any compiled policy, prefetcher, queue and pin scope; slots from top-k up, so prefill
    passes often run in waves."""
    rng = np.random.default_rng(seed)
    k = 2
    traces = [random_scored_trace(rng, layers=3, experts=experts, k=k, passes=passes,
                                  expert_bytes=1000) for _ in range(sequences)]
    slots = min(k + extra, 3 * experts)
    ref, fast = _both(_config(eviction, slots, pin, prefetch, prefetch_queue=queue), traces,
                      hardware={"copy_engines": engines, "link_gbps": 2.0 * engines})
    _assert_same(ref, fast)


def test_what_the_compiled_engine_does_not_cover_runs_on_the_reference():
    (trace,) = load_traces(bundled.capture_files()[0])
    uncovered = (({"host_capacity_frac": 0.5}, {}), ({"full_layers": 1}, {}),
                 ({}, {"eviction": "random"}), ({}, {"eviction": "lhu"}),
                 ({}, {"eviction": "least_stale(prefetch_current=until_target)"}),
                 ({}, {"miss": "drop(keep=2)"}))
    for cache_args, policies in uncovered:
        c = _config("lru", 200, "layer", **cache_args)
        for key, value in policies.items():
            c.policies[key] = value
        cache = _cache(c, trace)
        reason = compiled.applicable(cache)
        assert reason is not None
        with pytest.raises(ValueError, match="cannot run this cache"):
            compiled.run(cache, [trace])
        assert replay(_cache(c, trace), [trace]) == "reference"
    with pytest.raises(ConfigError, match="replay_engine='fast' is not one of"):
        replay(_cache(_config("lru", 8, "layer"), trace), [trace], engine="fast")
