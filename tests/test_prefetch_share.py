"""The prefetch staging share (`cache.prefetch_share`, moejax/cache/staging.py): step by step on
a small cache, as properties over random traces (every prefetcher, both queues), its counters,
what it refuses, and a run end to end.

The properties read the cache through the eviction policy's hooks only: which expert came in
by a prefetch (`on_admit`), what was used (`on_access`), what left (`on_evict`), and which
admission each eviction made room for (the admission that follows it). Each share's size is
computed here from the config."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled, jobs
from moejax.cache import PREFETCH_QUEUES, PREFETCH_SHARE_USES, build_cache_for
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.replay.engine import replay
from moejax.traces.format import FORMAT, Trace
from tests.fuzzing import examples
from tests.policy_strategies import any_spec
from tests.trace_strategies import BYTES, id_traces

CAPTURE = bundled.capture_path("olmoe_code")


def _cache(traces, slots, share, prefetch="oracle", queue="immediate", eviction="lru",
           on_use="promote", precision=""):
    c = base_config()
    c.clock.kind = "virtual"
    c.cache.slots, c.cache.prefetch_share, c.cache.prefetch_queue = slots, share, queue
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    c.cache.precision, c.cache.prefetch_share_use = precision, on_use
    t = traces[0]
    return build_cache_for(resolve(c), None, {"native": BYTES}, False, layers=tuple(t.layers),
                           num_layers=max(t.layers) + 1, num_experts=t.num_experts,
                           top_k=t.top_k)


def _record(cache) -> list[tuple]:
    """The cache's calls of the eviction policy's hooks as events, in order: ("admit", key,
    prefetch), ("access", key), ("evict", key). A hook the policy calls itself (per-layer
    LRU's admission counts as a use through its own `on_access`) is not the cache's: left
    out."""
    policy, events, inside = cache.eviction, [], []

    def wrap(name, record):
        hook = getattr(policy, name)

        def wrapped(*args):
            if not inside:
                events.append(record(*args))
            inside.append(name)
            try:
                return hook(*args)
            finally:
                inside.pop()

        setattr(policy, name, wrapped)

    wrap("on_admit", lambda key, pos, prefetch: ("admit", key, prefetch))
    wrap("on_access", lambda key, pos: ("access", key))
    wrap("on_evict", lambda key: ("evict", key))
    return events


def _small_cache(on_use):
    """4 slots at share 0.5: 2 for prefetches, 2 for demand fetches; LRU."""
    meta = {"format": FORMAT, "model": {}, "layers": [0, 1], "num_experts": 8, "top_k": 1,
            "expert_bytes": BYTES, "lookahead": 0, "prefill_passes": 0, "source": "test",
            "info": {}}
    one = Trace(meta, np.array([0, 1]), np.array([-1], np.int32), np.zeros((1, 2, 1), np.int64))
    cache = _cache([one], slots=4, share=0.5, on_use=on_use)
    assert (cache.staging.slots, cache.staging.demand_slots) == (2, 2)

    def take(key, prefetch):
        slot = cache.allocate(0, set(), key, prefetch=prefetch)
        cache.admit(key, slot, 0.0, prefetch, 0)

    def use(key, pinned):
        cache.eviction.on_access(key, key[0])
        cache.staging.accessed(cache, key, key[0], pinned)

    take((0, 1), False)
    take((0, 2), False)  # the demand share is full
    take((1, 5), True)
    take((1, 6), True)  # so is the staging share
    assert not cache.free
    take((0, 3), False)  # evicts the demand share's oldest, (0, 1), not a prefetched one
    assert set(cache.residency) == {(0, 2), (0, 3), (1, 5), (1, 6)}
    return cache, take, use


def test_a_used_prefetch_stays_staged_under_the_stay_variant():
    cache, take, use = _small_cache("stay")
    use((1, 5), {(1, 5)})
    take((1, 7), True)  # evicts the staging share's least recent, (1, 6), never a demand one
    assert set(cache.residency) == {(0, 2), (0, 3), (1, 5), (1, 7)}
    s = cache.staging.summary()
    assert (s["used"], s["wasted"], s["unused_at_end"], s["promoted"]) == (1, 1, 1, 0)
    # Everything in the staging share protected: a prefetch gets no slot, and evicts nothing.
    assert cache.allocate(0, {(1, 5), (1, 7)}, (1, 4), prefetch=True) is None
    assert len(cache.residency) == 4
    cache.check_invariants()


def test_a_used_prefetch_joins_the_demand_share_which_evicts_its_own_victim():
    cache, take, use = _small_cache("promote")
    use((1, 5), {(1, 5)})  # the demand share is full: its least recent, (0, 2), goes
    assert set(cache.residency) == {(0, 3), (1, 5), (1, 6)}
    assert cache.staging.staged == {(1, 6)}
    take((1, 7), True)  # the staging share has room again: the freed slot
    assert set(cache.residency) == {(0, 3), (1, 5), (1, 6), (1, 7)}
    take((0, 4), False)  # a demand fetch evicts the demand share's least recent: (0, 3)
    assert set(cache.residency) == {(0, 4), (1, 5), (1, 6), (1, 7)}
    # A use while the running wave holds the whole demand share: it stays staged.
    use((1, 6), {(1, 6), (0, 4), (1, 5)})
    assert cache.staging.staged == {(1, 6), (1, 7)}
    s = cache.staging.summary()
    assert (s["used"], s["wasted"], s["unused_at_end"], s["promoted"]) == (2, 0, 1, 1)
    cache.check_invariants()


@settings(max_examples=examples(120))
@given(traces=id_traces(), data=st.data())
def test_a_prefetch_never_evicts_a_demand_fetched_expert_and_each_share_keeps_its_size(
        traces, data):
    usable = lambda cls: not (cls.needs_probs or cls.needs_spec)  # noqa: E731 (id-only traces)
    prefetch = data.draw(any_spec("prefetch", usable).filter(lambda s: s != "none"),
                         label="prefetch")
    eviction = data.draw(st.sampled_from(("lru", "least_stale", "fifo", "lfu", "arc", "s3fifo",
                                          "lru_per_layer(quota=strict)")),
                         label="eviction")
    queue = data.draw(st.sampled_from(PREFETCH_QUEUES), label="queue")
    on_use = data.draw(st.sampled_from(PREFETCH_SHARE_USES), label="on_use")
    t = traces[0]
    keys = len(t.layers) * t.num_experts
    slots = data.draw(st.integers(t.top_k + 1, max(t.top_k + 1, keys)), label="slots")
    share = data.draw(st.floats(0.01, 0.99), label="share")
    staged_slots = max(1, math.floor(share * slots))
    if slots - staged_slots < t.top_k:
        with pytest.raises(ConfigError, match="prefetch_share"):
            _cache(traces, slots, share, prefetch, queue, eviction, on_use)
        return
    cache = _cache(traces, slots, share, prefetch, queue, eviction, on_use)
    events = _record(cache)
    replay(cache, traces, engine="reference")

    staged: dict = {}  # resident key -> in the staging share
    unused: set = set()
    used = wasted = promoted = 0
    promoting = None  # a used prefetch whose demand share was full: the next eviction's
    for i, event in enumerate(events):
        kind, key = event[0], event[1]
        if kind == "evict" and promoting is not None:
            # The use's eviction: one of the demand share's; the used expert joins it.
            assert not staged[key], f"{key} of the staging share evicted for a use"
            del staged[key]
            staged[promoting] = False
            promoted += 1
        elif kind == "admit":
            staged[key] = event[2]
            if event[2]:
                unused.add(key)
        elif kind == "access":
            if key in unused:
                unused.discard(key)
                used += 1
                if on_use == "promote":
                    demand = len(staged) - sum(staged.values())
                    if demand < slots - staged_slots:
                        staged[key] = False
                        promoted += 1
                    elif i + 1 < len(events) and events[i + 1][0] == "evict":
                        promoting = key
                        continue
        else:
            # An eviction makes room for the admission that follows it, into the same share.
            nxt = events[i + 1]
            assert nxt[0] == "admit", (event, nxt)
            assert nxt[2] == staged[key], f"{nxt} evicted {key} of the other share"
            del staged[key]
            if key in unused:
                unused.discard(key)
                wasted += 1
        promoting = None
        held = sum(staged.values())
        assert held <= staged_slots
        assert len(staged) - held <= slots - staged_slots
    cache.check_invariants()
    assert {k for k, v in staged.items() if v} == cache.staging.staged
    s = cache.staging.summary()
    assert (s["used"], s["wasted"], s["unused_at_end"], s["promoted"]) == (
        used, wasted, len(unused), promoted)
    issued = cache.metrics.totals()["prefetch_issued"]
    assert s["used"] + s["wasted"] + s["unused_at_end"] == issued


@pytest.mark.parametrize("fields,message", [
    (dict(prefetch_share=1.0), r"cache.prefetch_share=1.0 must be a number in \[0, 1\)"),
    (dict(prefetch_share=-0.1), r"cache.prefetch_share=-0.1 must be a number"),
    (dict(prefetch_share=0.2, prefetch="none"),
     "sets slots apart for prefetches, but policies.prefetch is none"),
    (dict(prefetch_share=0.9, slots=20),
     "leaves 2 of the 20 slots to demand fetches, fewer than a token's 8 experts"),
    (dict(prefetch_share=0.2, slots=0, capacity_frac=0.25, model="olmoe-1b-7b",
          miss='fetch_priority(levels="int8:int4")'), "works with one precision pool, not 2"),
    (dict(prefetch_share=0.2, full_layers=1), "does not combine with cache.full_layers=1"),
    (dict(prefetch_share=0.2, prefetch_share_use="move"),
     r"cache.prefetch_share_use='move' is not one of \('promote', 'stay'\)"),
])
def test_what_the_share_refuses_is_named(tmp_path, fields, message):
    """(A ConfigError is one line on the command line: tests/test_bad_input_main.py.)"""
    c = base_config()
    c.job, c.replay.trace, c.clock.kind = "replay", CAPTURE, "virtual"
    c.log.progress = c.log.tensorboard = False
    c.cache.slots = fields.pop("slots", 128)
    c.policies.prefetch = fields.pop("prefetch", "temporal")
    c.policies.miss = fields.pop("miss", "fetch")
    if "model" in fields:
        c.model.family, c.model.preset = "olmoe", fields.pop("model")
    for k, v in fields.items():
        setattr(c.cache, k, v)
    with pytest.raises(ConfigError, match=message):
        jobs.run(c, str(tmp_path / "w"))
    assert not (tmp_path / "w" / "results.json").exists()


def test_a_replay_with_a_share_reports_it_and_runs_on_the_reference_engine(tmp_path):
    c = base_config()
    c.job, c.replay.trace, c.clock.kind = "replay", CAPTURE, "virtual"
    c.cache.slots, c.cache.prefetch_share = 256, 0.2
    c.policies.prefetch = "temporal"
    c.log.progress = c.log.tensorboard = False
    out = jobs.run(c, str(tmp_path / "w"))
    s = out["cache"]["staging"]
    assert (s["slots"], s["demand_slots"], s["prefetch_share"], s["on_use"]) == (
        51, 205, 0.2, "promote")
    t = out["cache"]["total"]
    assert s["used"] + s["wasted"] + s["unused_at_end"] == t["prefetch_issued"] > 0
    assert s["used"] > 0 and s["wasted"] > 0 and 0 < s["promoted"] <= s["used"]
    assert out["replay"]["engine"] == "reference"
    assert "prefetch staging share (prefetch_share=0.2)" in out["replay"]["engine_reason"]
    saved = json.loads((tmp_path / "w" / "results.json").read_text())
    assert saved["cache"]["staging"] == s
    # Without a share, no staging section: the results of every other run are as before.
    c.cache.prefetch_share = 0.0
    assert "staging" not in jobs.run(c, str(tmp_path / "none"))["cache"]
