"""The compiled replay engine (`moejax/replay/compiled.py`, `kernel.py`) against the reference
(the policy objects, request by request): identical counters per layer, pass timings, per-pass
running totals, final residency, prefetch origins and clock.

* on every shipped trace (captures, scored, long, families), each under another policy;
* on real traces cut into requests with prefills, under the configurations of the issue that
  asked for the engine to fail closed;
* by a fuzzer drawn from the policy registry (every registered policy, each argument from its
  declared values) over random traces with dense-layer gaps, lookaheads 1-3, with and without
  scores, prefills and several sequences, with and without the cost model; whatever the
  kernel does not implement must run on the reference, so `auto` equals `reference` always;
* on a slice of the capture grid (slow);
and the coverage decision itself: what each declaration makes compiled, and that everything
not declared — a subclass, a policy built outside the registry, an unknown option, an
argument value — runs on the reference, saying why.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, note, reject, settings
from hypothesis import strategies as st

from moejax import bundled, jobs
from moejax.cache import (
    PREFETCH_QUEUES,
    CacheOptions,
    CacheShape,
    ExpertCache,
    PoolSpec,
    build_cache_for,
)
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.policies import build
from moejax.policies.eviction import LRU
from moejax.policies.prefetch import OraclePrefetch, TopKPrefetch
from moejax.policies.registry import names, policy_class
from moejax.replay import compiled, coverage
from moejax.replay.engine import replay
from moejax.testing import random_scored_trace
from moejax.traces.importers import load_traces
from tests import cache_checks
from tests.fuzzing import examples
from tests.policy_strategies import any_spec
from tests.replay_cells import run_replay_cell

# Bytes of one expert at each precision (a precision-aware miss policy gets one pool each).
BYTES_AT = {"native": 4096, "int8": 2176, "int4": 1152, "int2": 640}


def _config(eviction="lru", prefetch="none", miss="fetch", routing="standard", slots=0,
            pin="layer", **cache):
    c = base_config()
    c.cache.slots, c.cache.pin_scope = slots, pin
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    c.policies.miss, c.policies.routing = miss, routing
    c.clock.kind = "virtual"
    for k, v in cache.items():
        c.cache[k] = v
    return c


def _cache(config, trace, hardware=None, model_cfg=None, expert_bytes=None):
    for k, v in (hardware or {}).items():
        config.hardware[k] = v
    sizes = dict(BYTES_AT) if expert_bytes is None else {"native": expert_bytes}
    return build_cache_for(resolve(config), model_cfg, sizes, False, layers=tuple(trace.layers),
                           num_layers=(model_cfg.num_layers if model_cfg else
                                       max(trace.layers) + 1),
                           num_experts=trace.num_experts, top_k=trace.top_k)


def _both(config, traces, context=None, **kw):
    """The same cache replayed on each engine; the auto one's decision."""
    ref, fast = _cache(config, traces[0], **kw), _cache(config, traces[0], **kw)
    assert replay(ref, traces, context, engine="reference").engine == "reference"
    decision = replay(fast, traces, context)
    return ref, fast, decision


def _assert_same(ref, fast):
    assert fast.metrics.to_dict() == ref.metrics.to_dict()
    assert fast.metrics.snapshots == ref.metrics.snapshots
    assert fast.residency == ref.residency and fast.slot_ready == ref.slot_ready
    assert fast.slot_key == ref.slot_key and fast.in_cache == ref.in_cache
    assert fast.prefetch_origin == ref.prefetch_origin and not fast.queue and not ref.queue
    assert fast.running_pins == ref.running_pins
    assert (fast.clock.t, fast.clock.link_free, fast.clock.engine_free) == \
        (ref.clock.t, ref.clock.link_free, ref.clock.engine_free)
    assert sorted(fast.free) == sorted(ref.free)


# -- every shipped trace ----------------------------------------------------------------------

CAPTURES = bundled.capture_files()
NPZ_TRACES = (bundled.scored_trace_files() + bundled.long_trace_files()
              + bundled.family_trace_files())
COMPILED_EVICTIONS = [n for n in names("eviction")
                      if build("eviction", n, num_layers=2, num_experts=4, top_k=1,
                               num_slots=2, seed=0).kernel_form() is not None] + [
    "least_stale(order=two_queue)", "least_stale(order=cyclic)", "lru_per_layer(quota=strict)"]


def test_the_shipped_trace_lists_name_every_shipped_trace():
    on_disk = sorted(glob.glob(os.path.join(bundled.ASSETS, "traces", "**", "*.npz"),
                               recursive=True))
    assert sorted(NPZ_TRACES) == on_disk and len(on_disk) == 21
    assert sorted(CAPTURES) == sorted(glob.glob(os.path.join(bundled.CAPTURES_DIR, "*.jsonl")))


@pytest.mark.parametrize("path", CAPTURES)
@pytest.mark.parametrize("eviction", ["lru", "belady"])
def test_every_real_capture_gives_the_reference_numbers(path, eviction):
    (trace,) = load_traces(path)
    slots = len(trace.layers) * trace.num_experts // 20  # 5%
    for pin in ("request", "layer"):
        ref, fast, decision = _both(_config(eviction, slots=slots, pin=pin), [trace],
                                    expert_bytes=1000)
        assert decision.engine == "compiled"
        _assert_same(ref, fast)


@pytest.mark.parametrize("n,path", list(enumerate(NPZ_TRACES)))
def test_every_recorded_trace_through_the_replay_job_with_the_cost_model(n, path, tmp_path):
    """The recorded traces carry their model's config, so the virtual clock charges the cost
    model's compute, which the compiled engine adds in the reference's order. Each trace runs
    another compiled eviction, prefetcher and queue."""
    out = {}
    eviction = COMPILED_EVICTIONS[n % len(COMPILED_EVICTIONS)]
    prefetch = ("score_percentile(p=80)", "topk(overfetch=1.5, lookahead=2)", "none",
                "temporal")[n % 4]
    (trace,) = load_traces(path)
    # 40 slots, or every expert of a smaller model (a slot count above it is an error).
    slots = min(40, len(trace.layers) * trace.num_experts)
    for engine in ("reference", "auto"):
        c = _config(eviction, prefetch, slots=slots,
                    prefetch_queue=PREFETCH_QUEUES[n % len(PREFETCH_QUEUES)])
        c.job, c.replay.trace, c.model.preset, c.replay.engine = "replay", path, "", engine
        c.log.progress = c.log.tensorboard = False
        out[engine] = jobs.run(c, str(tmp_path / engine))
    assert out["auto"]["replay"]["engine"] == "compiled", out["auto"]["replay"]
    assert out["reference"]["replay"]["engine_reason"] == "replay.engine=reference"
    assert out["auto"]["cache"] == out["reference"]["cache"]
    assert out["auto"]["cache"]["timing"]["decode_s"] > 0


# The configurations the fail-closed issue named, on real traces cut into requests with
# prefills (the capture grid's 128-token requests with 32-token prefills).
NAMED = [
    ("least_stale(order=cyclic)", "noisy_oracle(precision=0.6, lookahead=2)", "watchdog",
     "layer"),
    ("lfu", "temporal(lookahead=2)", "immediate", "layer"),
    ("lru_per_layer", "oracle", "immediate", "layer"),
    ("fld", "temporal", "immediate", "request"),
]


@pytest.mark.parametrize("path", CAPTURES[:2])
@pytest.mark.parametrize("eviction,prefetch,queue,pin", NAMED)
def test_the_named_configurations_run_compiled_with_the_reference_numbers(
        path, eviction, prefetch, queue, pin, tmp_path):
    family, model = bundled.capture_model(path)
    out = {}
    for engine in ("reference", "auto"):
        out[engine] = run_replay_cell(str(tmp_path / engine), {
            "replay.trace": path, "model.family": family, "model.preset": model,
            "replay.request_tokens": 128, "replay.prefill_tokens": 32,
            "cache.capacity_frac": 0.05, "cache.capacity_of": "model",
            "cache.precision": "int4", "cache.prefetch_queue": queue, "cache.pin_scope": pin,
            "policies.eviction": eviction, "policies.prefetch": prefetch,
            "replay.engine": engine})
    assert out["auto"]["replay"]["engine"] == "compiled", out["auto"]["replay"]
    assert out["auto"]["cache"] == out["reference"]["cache"]
    total = out["auto"]["cache"]["total"]
    assert total["prefetch_issued"] > 0 and total["evictions"] > 0
    assert out["auto"]["cache"]["timing"]["ttft_per_request_s"][3] > 0  # four requests


# -- the registry fuzzer ----------------------------------------------------------------------

def _model_cfg(layer_ids: list[int], num_layers: int, experts: int, k: int, shared: int):
    """A tiny model of the trace's layer structure, for the cost model's compute."""
    return dataclasses.replace(preset("olmoe", "tiny"), num_layers=num_layers,
                               moe_layers=tuple(layer_ids), num_experts=experts, top_k=k,
                               dense_intermediate_size=48, shared_expert_intermediate_size=shared,
                               sliding_window=())


@st.composite
def _traces(draw, scored: bool):
    """1-2 random sequences of one model: MoE layers with dense layers between them, several
    lookaheads, leading prefill passes of several tokens, then decode steps."""
    layers = draw(st.integers(2, 4))
    num_layers = layers + draw(st.integers(0, 3))
    layer_ids = sorted(draw(st.permutations(range(num_layers)))[:layers])
    experts, k = draw(st.integers(4, 10)), 2
    lookahead = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    traces = []
    for _ in range(draw(st.integers(1, 2))):
        prefill = draw(st.integers(0, 2))
        passes = ([draw(st.integers(2, 6)) for _ in range(prefill)]
                  + [1] * draw(st.integers(1, 6)))
        traces.append(random_scored_trace(rng, layers, experts, k, passes, BYTES_AT["native"],
                                          layer_ids=layer_ids, lookahead=lookahead,
                                          scores=scored, prefill_passes=prefill))
    return traces, num_layers


def _usable(scored: bool):
    """On an id-only trace, only policies that need neither probabilities nor scores."""
    return (lambda cls: True) if scored else (
        lambda cls: not (cls.needs_probs or cls.needs_spec))


@settings(max_examples=examples(300))
@given(data=st.data())
def test_any_registered_policies_give_the_same_numbers_on_both_engines(data):
    """Every registered policy of every kind, its arguments drawn from its declared values
    (miss and routing half the time the kernel's fetch and standard, so that the compiled
    engine runs often); where the kernel does not implement a policy the reference runs, so
    the two must agree whatever is drawn."""
    scored = data.draw(st.booleans(), label="scored")
    traces, num_layers = data.draw(_traces(scored))
    trace = traces[0]
    usable = _usable(scored)
    eviction = data.draw(any_spec("eviction", usable), label="eviction")
    prefetch = data.draw(any_spec("prefetch", usable), label="prefetch")
    miss = data.draw(st.one_of(st.just("fetch"), any_spec("miss", usable)), label="miss")
    routing = data.draw(st.one_of(st.just("standard"), any_spec("routing", usable)),
                        label="routing")
    if policy_class("eviction", eviction).needs_future:  # MIN's future: the router's choice
        miss, routing = "fetch", "standard"
    config = _config(eviction, prefetch, miss, routing,
                     pin=data.draw(st.sampled_from(["layer", "request"]), label="pin"),
                     prefetch_queue=data.draw(st.sampled_from(PREFETCH_QUEUES),
                                              label="queue"),
                     capacity_frac=data.draw(st.sampled_from([0.05, 0.15, 0.3, 0.6, 1.0]),
                                             label="capacity"),
                     min_slots=trace.top_k)
    engines = data.draw(st.integers(1, 3), label="copy engines")
    hardware = {"copy_engines": engines, "link_gbps": data.draw(
        st.sampled_from([2.0, 5.0 * engines]), label="link")}
    model_cfg = None
    if data.draw(st.booleans(), label="cost model"):
        model_cfg = _model_cfg(trace.layers, num_layers, trace.num_experts, trace.top_k,
                               data.draw(st.sampled_from([0, 32]), label="shared expert"))
    context = [data.draw(st.integers(0, 40), label="context") for _ in traces]
    try:
        ref, fast, decision = _both(config, traces, context, hardware=hardware,
                                    model_cfg=model_cfg)
    except ConfigError as e:  # a capacity below top-k in some pool, levels it cannot have
        note(str(e))
        reject()
    note(f"{decision.engine}: {decision.reason}")
    _assert_same(ref, fast)
    assert fast.metrics.totals()["requests"] > 0


def test_the_fuzzer_runs_the_compiled_engine_for_every_compiled_form():
    """Each kernel form the registry declares runs compiled under its default arguments
    (so the fuzzer above compares engines for each), and each policy without one does not."""
    rng = np.random.default_rng(0)
    trace = random_scored_trace(rng, 3, 6, 2, [3, 1, 1], BYTES_AT["native"])
    # (A model: the miss policies that compute on the host model it from its shapes.)
    model_cfg = _model_cfg(list(trace.layers), max(trace.layers) + 1, trace.num_experts,
                           trace.top_k, 0)
    for kind, default in (("eviction", "lru"), ("prefetch", "none"), ("miss", "fetch"),
                          ("routing", "standard")):
        for name in names(kind):
            specs = {"eviction": "lru", "prefetch": "none", "miss": "fetch",
                     "routing": "standard", kind: name}
            cache = _cache(_config(**specs, capacity_frac=0.5, min_slots=2), trace,
                           model_cfg=model_cfg)
            declared = "KERNEL" in vars(policy_class(kind, name))
            decision = coverage.decide(cache)
            assert (decision.engine == "compiled") == declared, (kind, name, decision)
            if not declared:
                assert f"{kind} {name}(" in decision.reason


# -- failing closed ---------------------------------------------------------------------------

def _capture_cache(**kw):
    (trace,) = load_traces(CAPTURES[0])
    return trace, _cache(_config(slots=200, **kw), trace, expert_bytes=1000)


def test_a_subclass_of_the_cache_runs_on_the_reference():
    trace, plain = _capture_cache()

    class Checked(ExpertCache):
        pass

    cache = Checked(plain.shape, *plain.policies(), CacheOptions(plain.clock))
    decision = replay(cache, [trace])
    assert decision.engine == "reference" and "subclass" in decision.reason


def test_a_shape_of_several_pools_runs_on_the_reference():
    """A cache whose policies all have a compiled form but whose shape has two precision pools
    (the kernel keeps one): the reference runs it, saying why."""
    trace, plain = _capture_cache()
    s = plain.shape
    pools = (PoolSpec("native", s.expert_bytes, 100, 0), PoolSpec("int4", s.expert_bytes // 4,
                                                                 100, 100))
    shape = CacheShape.with_pools(s.layers, s.num_layers, s.num_experts, s.top_k, pools)
    cache = ExpertCache(shape, *plain.policies(), CacheOptions(plain.clock))
    decision = replay(cache, [trace])
    assert decision.engine == "reference"
    assert decision.reason.startswith("several precision pools ['native', 'int4']"), \
        decision.reason


def test_an_option_the_kernel_does_not_declare_runs_on_the_reference():
    trace, cache = _capture_cache()
    # As if CacheOptions had grown a field the kernel does not know.
    grown = dataclasses.make_dataclass("GrownOptions", [("a_new_option", int, 1)],
                                       bases=(CacheOptions,), frozen=True)
    cache.options = grown(**cache.options.fields())
    decision = coverage.decide(cache)
    assert decision.engine == "reference"
    assert "a_new_option=1 is not declared" in decision.reason
    with pytest.raises(ValueError, match="cannot run this cache"):
        compiled.run(cache, [trace])


def test_an_option_set_after_construction_is_judged_as_it_is_now():
    """A live runtime gives the cache its slot sink after construction: the decision reads the
    cache as it is, not only the arguments it was built with."""
    trace, cache = _capture_cache()
    assert coverage.decide(cache).engine == "compiled"
    cache.sink = object()
    decision = coverage.decide(cache)
    assert decision.engine == "reference" and "slot sink" in decision.reason


def test_a_policy_argument_the_kernel_does_not_declare_runs_on_the_reference():
    """A covered policy class given an argument its `KernelForm` does not name (as when a new
    argument is added to it), or a value outside the named ones, or built without the
    registry, is not covered."""
    trace, cache = _capture_cache(eviction="least_stale(prefetch_current=until_target)")
    assert "prefetch_current='until_target'" in coverage.decide(cache).reason

    class LRUWithAKnob(LRU):  # a subclass inherits no kernel form: fifo, say, must declare one
        def __init__(self, num_layers, num_experts, knob=0):
            super().__init__(num_layers, num_experts)

    policy = LRUWithAKnob(2, 4)
    policy.arguments = {"knob": 0}
    assert policy.kernel_form() is None
    lru = LRU(2, 4)  # not built by the registry: its arguments are unknown
    assert lru.kernel_form() is None
    lru.arguments = {}
    assert lru.kernel_form() == "lru"
    lru.arguments = {"knob": 1}  # an argument LRU's KernelForm does not name
    assert lru.kernel_form() is None


@pytest.mark.parametrize("cache_args,policies,why", [
    ({"host_capacity_frac": 0.5}, {}, "a host tier"),
    ({"full_layers": 1}, {}, "full-layer placement"),
    ({"warm_start": "all"}, {}, "already used"),
    ({}, {"eviction": "random"}, "eviction random("),
    ({}, {"eviction": "lhu"}, "eviction lhu("),
    ({}, {"miss": "drop(keep=2)"}, "miss drop(keep=2)"),
])
def test_what_the_compiled_engine_does_not_cover_runs_on_the_reference(cache_args, policies,
                                                                       why, tmp_path):
    (trace,) = load_traces(CAPTURES[0])
    c = _config(slots=200, **cache_args)
    for key, value in policies.items():
        c.policies[key] = value
    cache = _cache(c, trace, expert_bytes=1000)
    decision = coverage.decide(cache)
    assert decision.engine == "reference" and why in decision.reason, decision
    with pytest.raises(ValueError, match="cannot run this cache"):
        compiled.run(cache, [trace])
    assert replay(_cache(c, trace, expert_bytes=1000), [trace]).engine == "reference"


def test_an_unknown_engine_is_a_clear_error():
    trace, cache = _capture_cache()
    with pytest.raises(ConfigError, match="replay.engine='fast' is not one of"):
        replay(cache, [trace], engine="fast")


# -- the kernel's outputs keep the invariants -------------------------------------------------

@settings(max_examples=examples(100))
@given(data=st.data())
def test_the_compiled_engine_keeps_the_invariants(data):
    """The invariants the reference is checked against after every pass (tests/cache_checks.py),
    over the compiled engine's outputs: its per-pass running totals, final counters per layer,
    and final slot bookkeeping."""
    traces, _ = data.draw(_traces(scored=True))
    trace = traces[0]
    eviction = data.draw(st.sampled_from(COMPILED_EVICTIONS), label="eviction")
    # (a prefetcher the kernel has a form of: `cooccur` has none and runs on the reference)
    prefetch = data.draw(any_spec("prefetch", keep=lambda cls: "KERNEL" in cls.__dict__),
                         label="prefetch")
    config = _config(eviction, prefetch,
                     pin=data.draw(st.sampled_from(["layer", "request"])),
                     prefetch_queue=data.draw(st.sampled_from(PREFETCH_QUEUES)),
                     slots=data.draw(st.integers(trace.top_k, min(3, len(trace.layers))
                                                 * trace.num_experts)))
    cache = _cache(config, trace)
    assert replay(cache, traces).engine == "compiled"
    cache_checks.check_final(cache)
    previous = None
    for snap in cache.metrics.snapshots:
        cache_checks.check_totals(snap, cache.shape.expert_bytes)
        if previous is not None:
            for name in ("requests", "hits", "misses", "evictions", "prefetch_issued"):
                assert snap[name] >= previous[name], name
        previous = snap


# -- a slice of the capture grid --------------------------------------------------------------

GRID = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "studies",
                    "specmd", "grid_specmd.py")


@pytest.mark.slow
def test_a_slice_of_the_capture_grid_gives_the_reference_numbers(tmp_path):
    """Every 55th cell of the 768-cell capture grid (`studies/specmd/grid_specmd.py:traces=captures`;
    a stride that every eviction, prefetcher, queue, capacity and trace meets among the 14,
    checked below) on both engines, as a sweep worker runs them: identical results.json
    `cache` sections (`benchmarks/replay_grid_engines.py` runs all 768; the property tests
    above, every registered policy on both engines)."""
    from launch.cells import load_config_module
    from launch.worker import apply_overrides

    grid = load_config_module(GRID)
    cells = []
    grid.sweep(lambda **o: cells.append(o), "traces=captures")
    assert len(cells) == 768
    sample = cells[::55]
    assert len(sample) == 14
    for field in ("policies.eviction", "policies.prefetch", "cache.prefetch_queue",
                  "cache.capacity_frac", "replay.trace"):
        assert {c[field] for c in sample} == {c[field] for c in cells}, field
    for i, overrides in enumerate(sample):
        out = {}
        for engine in ("reference", "auto"):
            config = grid.get_config(f"traces=captures,engine={engine}")
            apply_overrides(config, overrides)
            out[engine] = jobs.run(config, str(tmp_path / f"{i}_{engine}"))
        assert out["auto"]["replay"]["engine"] == "compiled", overrides
        assert out["auto"]["cache"] == out["reference"]["cache"], overrides


# -- the lean kernel ----------------------------------------------------------------------------

LEAN_EVICTIONS = ("lru", "fifo", "lru_per_layer", "lru_per_layer(quota=strict)", "fld",
                  "least_stale", "least_stale(order=left_first)", "least_stale(order=cyclic)")


@settings(max_examples=examples(30))
@given(data=st.data())
def test_the_lean_kernel_gives_the_general_kernels_numbers(data):
    """Runs without prefetch under a list eviction take the lean kernel (`lean_kernel.py`);
    forced onto the general kernel instead, the same replay gives the same everything."""
    traces, num_layers = data.draw(_traces(False))
    trace = traces[0]
    eviction = data.draw(st.sampled_from(LEAN_EVICTIONS), label="eviction")
    config = _config(eviction, pin=data.draw(st.sampled_from(["layer", "request"]), label="pin"),
                     capacity_frac=data.draw(st.sampled_from([0.05, 0.15, 0.3, 0.6, 1.0]),
                                             label="capacity"),
                     min_slots=trace.top_k)
    hardware = {"copy_engines": data.draw(st.integers(1, 3), label="copy engines")}
    model_cfg = (_model_cfg(trace.layers, num_layers, trace.num_experts, trace.top_k, 0)
                 if data.draw(st.booleans(), label="cost model") else None)
    context = [data.draw(st.integers(0, 40), label="context") for _ in traces]
    try:
        lean, general = (_cache(config, trace, hardware=hardware, model_cfg=model_cfg)
                         for _ in range(2))
    except ConfigError as e:
        note(str(e))
        reject()
    ran = []
    real_kernel_for = compiled.lean_kernel.kernel_for

    def spy(*args):
        kernel = real_kernel_for(*args)
        ran.append(kernel)
        return kernel
    covers = compiled.lean_kernel.covers
    try:
        compiled.lean_kernel.kernel_for = spy
        assert replay(lean, traces, context).engine == "compiled"
        compiled.lean_kernel.covers = lambda policy, has_predictions: False
        assert replay(general, traces, context).engine == "compiled"
    finally:
        compiled.lean_kernel.kernel_for, compiled.lean_kernel.covers = real_kernel_for, covers
    assert len(ran) == 1 and ran[0] in compiled.lean_kernel.KERNELS.values()
    _assert_same(general, lean)


# (eviction, pin scope, copy engines, slots, prefill tokens, the kernel `kernel_for` picks, with
# a cost model): every specialisation, on a trace whose first pass is a prefill.
_LEAN = compiled.lean_kernel
# (8 slots, a pass's 4 layers x top-2: the experts the layer's wave protects are often the
# list's head, so the protection is put to work.)
LEAN_KERNELS = (
    ("lru", "request", 1, 8, 3, _LEAN.ONE_LIST_REQUEST, True),
    ("lru", "layer", 1, 8, 3, _LEAN.ONE_LIST_LAYER, True),
    ("fifo", "layer", 1, 8, 3, _LEAN.ONE_LIST_LAYER, True),
    ("lru", "layer", 2, 8, 3, _LEAN.ONE_LIST_LAYER, True),
    ("fifo", "request", 3, 8, 3, _LEAN.ONE_LIST_REQUEST, True),
    ("lru", "layer", 1, 4, 8, _LEAN.CODED, True),  # the prefill's layers have waves
    ("lru_per_layer", "request", 1, 8, 3, _LEAN.CODED, True),
    ("least_stale", "layer", 2, 8, 3, _LEAN.CODED, True),
    ("lru", "request", 1, 8, 3, _LEAN.ONE_LIST_REQUEST, False),
    ("fifo", "layer", 2, 8, 3, _LEAN.ONE_LIST_LAYER, False),
    ("lru", "layer", 1, 4, 8, _LEAN.CODED, False),
)


@pytest.mark.parametrize("eviction,pin,engines,slots,prefill,serve,costed", LEAN_KERNELS)
def test_each_lean_kernel_is_taken_where_it_applies_and_gives_the_references_numbers(
        eviction, pin, engines, slots, prefill, serve, costed):
    """`lean_kernel.kernel_for` hands each of its specialisations to the runs it names (one
    list served in the clock's loop for lru and fifo without waves under either pin scope,
    each with one copy engine or several, with a cost model or without), and each gives the
    general kernel's and the reference engine's numbers: counters, timings, running totals,
    residency, clock."""
    trace = random_scored_trace(np.random.default_rng(7), 4, 16, 2, [prefill] + [1] * 60,
                                BYTES_AT["native"], scores=False)
    config = _config(eviction, pin=pin, slots=slots)
    kw = {"hardware": {"copy_engines": engines},
          "model_cfg": (_model_cfg(trace.layers, 6, trace.num_experts, trace.top_k, 8)
                        if costed else None)}
    handed = _lean_against_general_and_reference(config, trace, kw)
    assert handed == [_LEAN.KERNELS[(engines == 1, serve, costed)]]


@pytest.mark.parametrize("eviction,pin,capacity", [("lru_per_layer", "layer", 0.05),
                                                    ("lru_per_layer", "layer", 0.12),
                                                    ("lru_per_layer", "request", 0.05),
                                                    ("lru_per_layer(quota=strict)", "request",
                                                     0.05),
                                                    ("least_stale", "layer", 0.05),
                                                    ("least_stale", "request", 0.05)])
def test_the_lean_victim_searches_give_the_references_numbers_on_a_capture(eviction, pin,
                                                                          capacity):
    """At 5% of the OLMoE prose capture (51 slots: 3 or 4 a layer of 16, each layer-pass asking
    for 8) every request misses, and the victim searches' shortcuts are put to work: the
    per-layer LRU's set of the layers over their share, and its search over every layer's
    first key (`head_last`) where none of those has a key not protected (two of every five
    misses), Least-Stale's walk from the first list that holds a key. At 12% under the layer
    pin scope, hits move a layer's first key and lists empty and fill again between those
    searches. The capture's first 96 passes, on the lean kernel, the general one and the
    reference: all equal."""
    (trace,) = load_traces(bundled.capture_path("olmoe_prose"))
    trace = trace.first_passes(96)
    config = _config(eviction, pin=pin, capacity_frac=capacity)
    handed = _lean_against_general_and_reference(config, trace, {})
    assert handed == [_LEAN.KERNELS[(True, _LEAN.CODED, False)]]


def test_the_in_order_walk_starts_at_the_first_list_that_can_hold_a_key():
    """Least-Stale's default walk (its lists in order) starts at a bound below which no list
    holds a key (`kernel.victim`'s `WALK_FIRST`): a search raises it past the empty lists, a
    key appended below it lowers it, a pass start (the current queues spliced onto the stale
    ones) resets it. Each, on the general kernel's own functions: the victim is the first key
    along the lists."""
    K = compiled.K
    n_layers, n_experts = 3, 4
    I, _ = K.layout(K.LS_TWO_QUEUE, 4, n_experts, n_layers, K.IMMEDIATE, False, 1,
                    np.zeros(n_layers, np.int64), np.zeros(0, np.int64),
                    np.zeros(n_layers * n_experts + 1, np.int64), np.zeros(0, np.int64),
                    compiled.walk_table("least_stale:two_queue", n_layers), (1.0, 0.0, 1.0, 1.0))
    assert I[K.WALK_IN_ORDER] == 1 and I[K.WALK_FIRST] == 0
    no_stamp = -1  # no key protected

    def key(layer, expert):
        return layer * n_experts + expert
    K.append(I, K.EL, n_layers + 2, key(2, 1))  # layer 2's current queue
    assert K.victim(I, 2, no_stamp, key(0, 0), 0) == key(2, 1)
    assert I[K.WALK_FIRST] == n_layers + 2
    K.append(I, K.EL, n_layers + 1, key(1, 3))  # layer 1's, below the bound
    assert I[K.WALK_FIRST] == n_layers + 1
    assert K.victim(I, 2, no_stamp, key(0, 0), 0) == key(1, 3)
    K.begin_pass(I)  # both current queues become stale ones (lists 1 and 2)
    assert I[K.WALK_FIRST] == 0
    K.append(I, K.EL, n_layers + 0, key(0, 2))
    assert K.victim(I, 0, no_stamp, key(0, 0), 1) == key(1, 3)


@pytest.mark.parametrize("expert_bytes", [1000, 2 ** 50 + 1])
def test_the_one_list_kernels_demand_bytes_where_a_sum_could_be_inexact(expert_bytes):
    """The one-list kernels take a layer's demand bytes as its misses times the expert's bytes
    where no sum can reach 2**53 (1000 bytes), and add them wave by wave where one could
    (2**50 + 1 bytes: the sums are rounded): either way the general kernel's numbers, the
    bytes' counters and running totals among them, and the reference's where every sum is
    exact (its byte counts are Python integers, the kernels' float64)."""
    trace = random_scored_trace(np.random.default_rng(3), 4, 16, 2, [1] * 60,
                                BYTES_AT["native"], scores=False)
    handed = _lean_against_general_and_reference(_config("lru", pin="request", slots=8),
                                                 trace, {"expert_bytes": expert_bytes},
                                                 reference=expert_bytes < 2 ** 50)
    assert handed == [_LEAN.KERNELS[(True, _LEAN.ONE_LIST_REQUEST, False)]]


# One process's replay on a one-list lean kernel, with a cost model or without, its numbers
# and the symbol numba gave each lean kernel it holds (`test_lean_kernels_...`).
_ONE_PROCESS = """
import dataclasses, sys
import numpy as np
from moejax.cache import build_cache_for
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.replay import lean_kernel
from moejax.replay.engine import replay
from moejax.testing import random_scored_trace

trace = random_scored_trace(np.random.default_rng(7), 4, 16, 2, [1] * 40, 4096, scores=False)
for kind in sys.argv[1:]:
    c = base_config()
    c.cache.slots, c.cache.pin_scope, c.clock.kind = 8, "layer", "virtual"
    c.policies.eviction, c.policies.prefetch = "lru", "none"
    layers = tuple(trace.layers)
    model = (dataclasses.replace(preset("olmoe", "tiny"), num_layers=6, moe_layers=layers,
                                 num_experts=16, top_k=2, dense_intermediate_size=48,
                                 sliding_window=())
             if kind == "costed" else None)
    cache = build_cache_for(resolve(c), model, {"native": 4096}, False, layers=layers,
                            num_layers=6, num_experts=16, top_k=2)
    assert replay(cache, [trace]).engine == "compiled"
    print("numbers", kind, cache.metrics.totals(), cache.clock.t)
for key, kernel in lean_kernel.KERNELS.items():
    for held in kernel.overloads.values():
        print("symbol", key, held.fndesc.mangled_name)
"""


def test_lean_kernels_compiled_by_two_processes_run_side_by_side_from_the_disk_cache(tmp_path):
    """Two lean kernels compiled by two processes into one disk cache, each the first a
    process compiled, then loaded by a third: each has symbols of its own, and the third gives
    each process's numbers. (The twelve shared one qualified name, which numba names the
    symbols after, with a count of the process's compiles: both processes gave theirs the
    same symbols, and a capture grid's worker that loaded two such kernels failed with
    "SystemError: ... returned a result with an exception set".)"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}  # an empty disk cache

    def one_process(*kinds):
        out = subprocess.run([sys.executable, "-c", _ONE_PROCESS, *kinds], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = out.stdout.splitlines()
        return ([line for line in lines if line.startswith("numbers")],
                {line for line in lines if line.startswith("symbol")})
    costed, costed_symbols = one_process("costed")
    plain, plain_symbols = one_process("uncosted")
    assert len(costed_symbols) == len(plain_symbols) == 1
    (first,), (second,) = costed_symbols, plain_symbols
    assert first.split()[-1] != second.split()[-1]
    assert one_process("costed", "uncosted") == (costed + plain, costed_symbols | plain_symbols)
    assert len({k.py_func.__qualname__ for k in _LEAN.KERNELS.values()}) == len(_LEAN.KERNELS)


def _lean_against_general_and_reference(config, trace, kw, reference=True) -> list:
    """`trace` replayed through three caches of `config` (`_cache(**kw)`): on the lean kernel,
    on the general one and (`reference`) on the reference engine, all equal (evictions among
    them); returns the lean kernels `kernel_for` handed out."""
    lean, general, ref = (_cache(config, trace, **kw) for _ in range(3))
    handed = []
    real = _LEAN.kernel_for

    def spy(*args):
        handed.append(real(*args))
        return handed[-1]
    covers = _LEAN.covers
    try:
        _LEAN.kernel_for = spy
        assert replay(lean, [trace]).engine == "compiled"
        _LEAN.covers = lambda policy, has_predictions: False
        assert replay(general, [trace]).engine == "compiled"
    finally:
        _LEAN.kernel_for, _LEAN.covers = real, covers
    assert lean.metrics.totals()["misses"] > 0 and lean.metrics.totals()["evictions"] > 0
    _assert_same(general, lean)
    if reference:
        assert replay(ref, [trace], engine="reference").engine == "reference"
        _assert_same(ref, lean)
    return handed


TOPK = "topk(overfetch=1.5)"


def test_predictions_are_taken_once_per_prefetcher_and_trace_content(monkeypatch):
    """A grid replays one trace under one prefetcher at many sizes: the predictions are taken
    from the policy object once (`compiled._kept_predictions`), and a later run at another
    size gives the reference's numbers; a trace whose content differs is asked again. (A
    score-based prefetcher's, on a scored trace: the oracles' and the temporal prefetcher's are
    taken for the whole stream at once, `stream_predictions`, not kept.)"""
    cut = random_scored_trace(np.random.default_rng(1), 4, 16, 2, [1] * 40, 1000)
    compiled.forget_predictions()
    calls = []
    real = TopKPrefetch.predict

    def counted(self, gate):
        calls.append(gate.layer)
        return real(self, gate)
    monkeypatch.setattr(TopKPrefetch, "predict", counted)
    taken = []
    for slots in (4, 12, 30):
        ref = _cache(_config(prefetch=TOPK, slots=slots), cut, expert_bytes=1000)
        fast = _cache(_config(prefetch=TOPK, slots=slots), cut, expert_bytes=1000)
        assert replay(ref, [cut], engine="reference").engine == "reference"
        before = len(calls)
        assert replay(fast, [cut]).engine == "compiled"
        taken.append(len(calls) > before)
        _assert_same(ref, fast)
    assert taken == [True, False, False]
    changed = dataclasses.replace(cut, ids=cut.ids.copy())
    changed.ids[0, 0, 0] = (changed.ids[0, 0, 0] + 1) % cut.num_experts
    if changed.ids[0, 0, 0] in changed.ids[0, 0, 1:]:  # a token's top-k stay distinct
        changed.ids[0, 0, 0] = next(e for e in range(cut.num_experts)
                                    if e not in changed.ids[0, 0])
    fast = _cache(_config(prefetch=TOPK, slots=12), changed, expert_bytes=1000)
    before = len(calls)
    replay(fast, [changed])
    assert len(calls) > before
    ref = _cache(_config(prefetch=TOPK, slots=12), changed, expert_bytes=1000)
    replay(ref, [changed], engine="reference")
    _assert_same(ref, fast)


def test_request_arrays_are_built_once_per_trace_content(monkeypatch):
    """The request arrays are built once for traces of the same values
    (`compiled._kept_requests`), and again for a trace changed in place since: each run
    gives the reference's numbers."""
    trace = random_scored_trace(np.random.default_rng(2), 4, 16, 2, [3] + [1] * 30, 1000)
    compiled.forget_predictions()
    built = []
    real = compiled.requests

    def counted(traces, n_experts):
        built.append(n_experts)
        return real(traces, n_experts)
    monkeypatch.setattr(compiled, "requests", counted)

    def both(slots):
        ref = _cache(_config(slots=slots), trace, expert_bytes=1000)
        fast = _cache(_config(slots=slots), trace, expert_bytes=1000)
        assert replay(ref, [trace], engine="reference").engine == "reference"
        assert replay(fast, [trace]).engine == "compiled"
        _assert_same(ref, fast)
    both(5)
    both(11)
    assert len(built) == 1
    row = trace.ids[3, 0]  # the first decode token's first layer: another expert, still distinct
    row[0] = next(e for e in range(trace.num_experts) if e not in row)
    both(11)
    assert len(built) == 2
    monkeypatch.setattr(compiled, "KEEP_REQUEST_BYTES", 1000)  # arrays over it are not kept
    compiled.forget_predictions()
    both(7)
    both(7)
    assert len(built) == 4


def test_the_cost_plan_called_pass_by_pass_where_the_arrays_decline(monkeypatch):
    """Where `CostModel.pass_times` declines (a term past int64's range), the compiled
    preparation calls the cost model per distinct (tokens, context) instead, and the replay
    still gives the reference's numbers, as it does with the arrays."""
    from moejax.timing.cost import CostModel

    trace = random_scored_trace(np.random.default_rng(5), 3, 8, 2, [4, 1, 3] + [1] * 30,
                                BYTES_AT["native"], scores=False)
    model_cfg = _model_cfg(trace.layers, 5, trace.num_experts, trace.top_k, 8)
    config = _config("lru", slots=5)
    declined = []
    real = CostModel.pass_times

    def decline(self, *args):
        declined.append(real(self, *args) is not None)
        return None
    for arrays in (True, False):
        if not arrays:
            monkeypatch.setattr(CostModel, "pass_times", decline)
        ref, fast = (_cache(config, trace, model_cfg=model_cfg) for _ in range(2))
        assert replay(ref, [trace], [6], engine="reference").engine == "reference"
        assert replay(fast, [trace], [6]).engine == "compiled"
        _assert_same(ref, fast)
    assert declined == [True]  # (the arrays would have served: the calls ran instead)


def test_a_trace_listed_again_is_laid_out_once_with_the_same_arrays():
    """`compiled.requests` lays out a trace object listed several times (a capture replayed
    through one cache again and again) once: its arrays equal those of the same list made of
    distinct copies, pass-layer starts running on across the copies, and a trace of wide
    passes between them keeps its pairs; `longest` is the longest pass-layer."""
    rng = np.random.default_rng(3)
    decode = random_scored_trace(rng, 3, 8, 2, [1] * 20, 1000, scores=False,
                                 prefill_passes=0)
    wide = random_scored_trace(rng, 3, 8, 2, [1, 6, 1, 3], 1000, scores=False)
    listed = [decode, decode, wide, decode]
    copies = [copy.deepcopy(t) for t in listed]
    same, apart = (compiled.requests(traces, 8) for traces in (listed, copies))
    for a, b in zip(same[:3], apart[:3], strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert all(np.array_equal(getattr(same[3], f), getattr(apart[3], f))
               for f in ("prefill", "tokens", "pairs"))
    keys, starts, mult, passes = same
    one = compiled.requests([decode], 8)[0]
    assert np.array_equal(keys[:len(one)], one) and np.array_equal(keys[len(one):2 * len(one)],
                                                                  one)
    assert starts[-1] == len(keys) and len(starts) == 3 * len(passes) + 1
    assert len(mult) == len(keys) and mult.max() > 1  # the wide passes' pairs
    assert passes.longest == np.diff(starts).max() == apart[3].longest > 2


_ARRAYS = st.builds(
    lambda dtype, shape, order, step, writeable: _shaped(dtype, shape, order, step, writeable),
    st.sampled_from([np.int64, np.int32, np.float64, np.bool_, np.uint8]),
    st.lists(st.integers(1, 3), min_size=1, max_size=3), st.sampled_from("CF"),
    st.sampled_from([1, 2]), st.booleans())


def _shaped(dtype, shape, order, step, writeable):
    a = np.zeros([n * step for n in shape], dtype, order=order)[(slice(None, None, step),)]
    a.flags.writeable = writeable
    return a


_VALUES = st.recursive(
    _ARRAYS | st.floats(allow_nan=False) | st.booleans()
    | st.sampled_from([0, -1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64])
    | st.sampled_from([np.float64(1.0), np.int64(3), np.float32(2.0)]),
    lambda inner: st.lists(inner, min_size=1, max_size=3).map(tuple), max_leaves=6)


@given(values=st.lists(_VALUES, min_size=2, max_size=64))
def test_a_kernel_held_by_its_type_key_is_held_for_numbas_types(values):
    """`compiled.kernel_loaded` answers from a cheap key of the arguments' types once numba
    said yes for it: values with the same key must have the same numba type (else a kernel
    would be taken as loaded for types it was never compiled for)."""
    import numba

    typed = {}
    for value in values:
        key = compiled.type_key(value)
        try:
            t = numba.typeof(value)
        except ValueError:  # numba types no int past 64 bits: no kernel takes one
            continue
        if key is not None:
            assert typed.setdefault(key, t) == t, (key, typed[key], t)


@settings(max_examples=examples(120))
@given(data=st.data(),
       kind=st.sampled_from(["oracle", "temporal", "noisy_oracle(precision=0.5,"]))
def test_a_streams_predictions_are_the_policys_gate_by_gate(data, kind):
    """`stream_predictions` (numpy over the whole request stream) takes the oracle's, the
    temporal prefetcher's and the noisy oracle's predictions: the same groups, targets and
    experts, in the same order and dtypes, as the policy stepped gate by gate
    (`compiled.stepped_predictions`), and a temporal prefetcher left as stepping leaves it —
    on random sequences with prefills, dense layers between the MoE ones and several
    lookaheads."""
    from moejax.replay.stream_predictions import stream_predictions

    traces, num_layers = data.draw(_traces(scored=False))
    lookahead = data.draw(st.integers(1, 3), label="lookahead")
    spec = f"{kind}lookahead={lookahead})" if kind.endswith(",") else \
        f"{kind}(lookahead={lookahead})"
    config = _config("lru", spec, slots=8)
    whole, stepped = _cache(config, traces[0]), _cache(config, traces[0])
    keys, starts, _, _ = compiled.requests(traces, traces[0].num_experts)
    got = stream_predictions(whole, traces, keys, starts)
    want = compiled.stepped_predictions(stepped, traces, keys, starts)
    assert got is not None
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    if kind == "temporal":
        assert (whole.prefetch.last, whole.prefetch.order) == \
            (stepped.prefetch.last, stepped.prefetch.order)


def test_stream_predictions_fail_closed():
    """Not taken (None: the policy is stepped gate by gate) for a subclass, which may change
    the answer, a temporal prefetcher that already saw passes, or a cache past its first
    pass."""
    from moejax.replay.stream_predictions import stream_predictions

    trace = random_scored_trace(np.random.default_rng(0), 3, 6, 2, [3, 1, 1],
                                BYTES_AT["native"], scores=False)
    keys, starts, _, _ = compiled.requests([trace], trace.num_experts)
    class Sub(OraclePrefetch):
        pass
    sub = _cache(_config("lru", "oracle", slots=4), trace)
    sub.prefetch.__class__ = Sub
    assert stream_predictions(sub, [trace], keys, starts) is None
    seen = _cache(_config("lru", "temporal", slots=4), trace)
    seen.prefetch.last, seen.prefetch.order = {0: [1, 2]}, [0]
    assert stream_predictions(seen, [trace], keys, starts) is None
    later = _cache(_config("lru", "oracle", slots=4), trace)
    assert stream_predictions(later, [trace], keys, starts) is not None
    later.pass_id = 3
    assert stream_predictions(later, [trace], keys, starts) is None
