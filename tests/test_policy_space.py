"""The cache's bookkeeping invariants over the whole policy space, as property tests: every
registered eviction, prefetch, miss and routing policy (the lists come from the registry, so a
new policy is fuzzed without editing this file), replay-only ones included, on random scored
traces replayed through the one cache code path (no model: fast enough to draw many cases).

Checked after every pass: the budget (resident + in-flight <= slots, per precision pool, and
their bytes within the byte budget), slot bookkeeping, `hits + late_hits + misses == requests`
per layer, collisions <= misses, prefetch used <= issued, demand bytes == misses x expert bytes
(one pool) and the per-precision counters summing to the totals; at the end, wasted <=
prefetched bytes. The plain precision is drawn too, so the precision-aware miss policies run
over one pool per level of their cascade. And the capability declarations the cache relies on
hold (`needs_future` implies `replay_only`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from moejax.cache import PREFETCH_QUEUES, CacheOptions, CacheShape, ExpertCache, PoolSpec
from moejax.cache.host_path import HostPath
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.policies import build, names
from moejax.policies.base import KINDS, EvictionPolicy, PrefetchPolicy
from moejax.policies.registry import policy_class
from moejax.replay.engine import replay
from moejax.replay.gates import layer_gates
from moejax.testing import random_scored_trace
from moejax.timing import hardware
from moejax.timing import host as host_lib
from moejax.timing.clock import VirtualClock
from tests import cache_checks
from tests.fuzzing import examples
from tests.policy_strategies import any_spec

EXPERT_BYTES = 4096
BYTES_AT = {"native": EXPERT_BYTES, "int8": 2176, "int4": 1152, "int2": 640}


def _shape(miss_policy, layers: int, experts: int, k: int, slots: list[int]) -> CacheShape:
    """One pool per level of the miss policy, `slots[i]` slots in the i-th."""
    pools, offset = [], 0
    for level, n in zip(miss_policy.levels, slots):
        pools.append(PoolSpec(level, BYTES_AT[level], n, offset))
        offset += n
    return CacheShape.with_pools(tuple(range(layers)), layers, experts, k, tuple(pools))


def _host_path(miss_policy) -> HostPath | None:
    """The host model a miss policy that computes on the host needs (the tiny OLMoE's shapes:
    what its host calls and activations cost), None for the others."""
    if not miss_policy.computes_on_host:
        return None
    return HostPath(host_lib.get("desktop_ddr5"), hardware.get("a100_specmd"),
                    preset("olmoe", "tiny"), EXPERT_BYTES)


class _CheckingCache(ExpertCache):
    """Checks the invariants at the end of every pass (a subclass: the replay runs it on the
    reference engine, which the test asserts), and after every layer that a layer's count of
    residency changes (`layer_changes`, which the live runtime keys its slot maps on) moved
    whenever its experts or their slots did."""

    passes_checked = 0
    maps: dict | None = None

    def run_layer(self, gate):
        yield from super().run_layer(gate)
        maps = self.maps = self.maps or {}
        for layer in self.shape.layers:
            now = (self.layer_changes[layer], self.residency_of(layer))
            if layer in maps and maps[layer][0] == now[0]:
                assert maps[layer][1] == now[1], f"layer {layer} changed uncounted"
            maps[layer] = now

    def end_pass(self):
        timing = super().end_pass()
        cache_checks.check_final(self)
        self.passes_checked += 1
        return timing


@settings(max_examples=examples(400))
@given(eviction=any_spec("eviction"), prefetch=any_spec("prefetch"), miss=any_spec("miss"),
       routing=any_spec("routing"), pin_scope=st.sampled_from(["layer", "request"]),
       queue=st.sampled_from(PREFETCH_QUEUES), data=st.data())
def test_every_policy_combination_keeps_the_invariants(eviction, prefetch, miss, routing,
                                                       pin_scope, queue, data):
    """Any registered policy of each kind, its arguments drawn from its declared values."""
    if policy_class("eviction", eviction).needs_future:  # MIN's future is the router's choice
        miss, routing = "fetch", "standard"
    layers, experts, k = data.draw(st.integers(2, 4)), data.draw(st.integers(4, 8)), 2
    prefill = data.draw(st.integers(1, 5))
    steps = data.draw(st.integers(1, 6))
    slots = data.draw(st.integers(k, layers * experts))
    trace = random_scored_trace(np.random.default_rng(data.draw(st.integers(0, 2**16))), layers,
                                experts, k, [prefill] + [1] * steps, EXPERT_BYTES)
    precision = data.draw(st.sampled_from(["", "native", "int8", "int4", "int2"]))
    ctx = dict(num_layers=layers, num_experts=experts, top_k=k, seed=0, renormalize=True)
    try:
        miss_policy = build("miss", miss, **ctx, cache_precision=precision)
    except ConfigError:  # levels that do not start at the given cache.precision
        reject()
    slots = [slots] + [data.draw(st.integers(k, layers * experts))
                       for _ in miss_policy.levels[1:]]
    shape = _shape(miss_policy, layers, experts, k, slots)
    ctx.update(num_slots=shape.num_slots, cache_precision=shape.precision)
    cache = _CheckingCache(shape, build("eviction", eviction, **ctx),
                           build("prefetch", prefetch, **ctx), miss_policy,
                           build("routing", routing, **ctx),
                           CacheOptions(VirtualClock(hardware.get("a100_specmd")),
                                        pin_scope=pin_scope, prefetch_queue=queue,
                                        host_path=_host_path(miss_policy)))
    assert replay(cache, [trace]).engine == "reference"
    assert cache.passes_checked == trace.num_passes
    t = cache.metrics.totals()
    assert t["requests"] > 0
    assert t["prefetch_issued"] == 0 or prefetch != "none"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_registered_policy_declares_its_capabilities(kind):
    assert names(kind), kind
    for name in names(kind):
        cls = policy_class(kind, name)
        assert issubclass(cls, KINDS[kind]) and cls.name == name and cls.kind == kind
        assert not cls.needs_future or cls.replay_only
    assert set(names(kind, live=True)) | set(names(kind, live=False)) == set(names(kind))


def test_a_hook_a_class_overrides_implies_its_capability_unless_declared():
    class Scores(EvictionPolicy):
        def on_scores(self, layer, probs):
            pass

    class Future(PrefetchPolicy):
        def set_future(self, future, cache):
            pass

    class Precision(EvictionPolicy):
        def on_use_precision(self, key, precision):
            pass

    class Declared(EvictionPolicy):
        needs_probs = False  # its own declaration wins

        def on_scores(self, layer, probs):
            pass

    class Subclass(Scores):  # inherited from a class that has it
        pass

    assert Scores.needs_probs and not Scores.needs_precision and not Scores.replay_only
    assert Future.needs_future and Future.replay_only and not Future.needs_probs
    assert Precision.needs_precision and not Precision.needs_probs
    assert not Declared.needs_probs and Subclass.needs_probs
    # The kinds' base classes, which define the hooks, declare none of them.
    assert not any((EvictionPolicy.needs_probs, EvictionPolicy.needs_precision,
                    PrefetchPolicy.needs_future, PrefetchPolicy.replay_only))


def test_capabilities_match_what_the_policy_reads():
    """A policy that does not declare `needs_probs`/`needs_spec` must run on gates without
    them (the live runtime never copies them to the host for it)."""
    rng = np.random.default_rng(0)
    trace = random_scored_trace(rng, 3, 6, 2, [3, 1, 1], EXPERT_BYTES)
    for kind in sorted(KINDS):
        for name in names(kind, live=True):
            cls = policy_class(kind, name)
            ctx = dict(num_layers=3, num_experts=6, top_k=2, num_slots=5, seed=0,
                       renormalize=True)
            policies = {k: build(k, {"eviction": "lru", "prefetch": "none", "miss": "fetch",
                                     "routing": "standard"}[k], **ctx) for k in KINDS}
            policies[kind] = build(kind, name, **ctx)
            cache = ExpertCache(_shape(policies["miss"], 3, 6, 2, [5] * 4),
                                policies["eviction"], policies["prefetch"], policies["miss"],
                                policies["routing"],
                                CacheOptions(VirtualClock(hardware.get("a100_specmd")),
                                             host_path=_host_path(policies["miss"])))
            for p in range(trace.num_passes):
                cache.begin_pass("decode", 1, p + 1)
                for gate in layer_gates(trace, p):
                    if not cls.needs_probs:
                        gate.probs = None
                    if not cls.needs_spec:
                        gate.spec = None
                    for _ in cache.run_layer(gate):
                        pass
                cache.end_pass()
