"""Capacity curves (`moejax/replay/stack_curve.py`, the curve job `moejax/jobs/curve.py`): the counts
at every cache size from one pass of stack distances equal independent replays on the
compiled engine at EVERY size — on random traces (property test: prefills, several sequences,
both pin scopes) and on a shipped real capture cut into requests with prefills (so that the
sizes below the widest pass-layer, which are replayed, come up too); the per-layer sums against
a from-scratch strict per-layer LRU; the job's table, results.json, plot and self-check; bad
input as one line; and the command itself (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled, jobs
from moejax.cache import build_cache_for
from moejax.errors import CheckFailed, ConfigError
from moejax.jobs import curve as curve_job
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.replay import replay
from moejax.replay import stack_curve as curve
from moejax.testing import random_scored_trace, with_fields
from moejax.traces import Trace, as_requests
from moejax.traces.importers import load_traces
from tests.fuzzing import examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _maker(trace: Trace, eviction: str = "lru", pin: str = "layer", prefetch: str = "none"):
    """`make(slots)`: a fresh cache of `slots` slots for `trace`'s shape, as the replay job
    builds one (1000-byte experts: no model, so no cost model)."""
    config = with_fields(base_config(), job="replay", **{
        "model.preset": "", "clock.kind": "virtual", "cache.pin_scope": pin,
        "policies.eviction": eviction, "policies.prefetch": prefetch, "cache.slots": 1})
    run = resolve(config)

    def make(slots: int):
        import dataclasses

        spec = dataclasses.replace(run, cache=dataclasses.replace(run.cache, slots=slots))
        return build_cache_for(spec, None, {"native": 1000}, False,
                               layers=tuple(trace.layers), num_layers=max(trace.layers) + 1,
                               num_experts=trace.num_experts, top_k=trace.top_k)
    return make


def _every_size_equals_a_replay(traces, pin: str, context=None,
                                eviction: str = "lru") -> curve.Curve:
    """The curve at every size from top-k to every distinct expert asked for (from there on
    nothing is evicted), each row against an independent compiled replay at that size; the
    stack rule used wherever it holds (for lru, from the widest pass-layer up)."""
    first = traces[0]
    make = _maker(first, eviction=eviction, pin=pin)
    distinct = curve.requests_of(traces, first.num_experts).distinct()
    sizes = list(range(first.top_k, min(distinct + 1, len(first.layers) * first.num_experts) + 1))
    made = curve.capacity_curve(make, traces, context, sizes)
    widest = curve.requests_of(traces, first.num_experts).widest
    assert made.form == (curve.GLOBAL if eviction == "lru" else curve.PER_LAYER)
    for row in made.rows:
        stacked = (row["slots"] >= widest if eviction == "lru" else
                   made.stack_from is not None and row["slots"] >= made.stack_from)
        assert row["method"] == (curve.STACK if stacked else curve.REPLAY), row
        cache = make(row["slots"])
        assert replay(cache, traces, context).engine == "compiled"
        assert {k: row[k] for k in curve.COUNTED} == curve.counts_of(cache), row
    return made


@st.composite
def _traces(draw):
    layers = draw(st.integers(1, 3))
    experts = draw(st.integers(2, 6))
    k = draw(st.integers(1, min(3, experts)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    out = []
    for _ in range(draw(st.integers(1, 2))):  # sequences, one after another through one cache
        prefill = draw(st.integers(0, 1))
        passes = ([draw(st.integers(1, 4))] if prefill else []) + draw(
            st.lists(st.integers(1, 2), min_size=1, max_size=10))
        out.append(random_scored_trace(rng, layers, experts, k, passes, 1000, scores=False,
                                       prefill_passes=prefill))
    return out


@settings(max_examples=examples(12))
@given(traces=_traces(), pin=st.sampled_from(["layer", "request"]),
       eviction=st.sampled_from(["lru", "lru_per_layer(quota=strict)"]))
def test_the_stack_curve_equals_a_replay_at_every_size_on_random_traces(traces, pin, eviction):
    _every_size_equals_a_replay(traces, pin, eviction=eviction)


def _capture_cut(passes: int) -> Trace:
    (trace,) = load_traces(os.path.join(bundled.CAPTURES_DIR, "olmoe_code.jsonl"))
    return trace.first_passes(passes)


@pytest.mark.parametrize("pin", ["layer", "request"])
def test_the_stack_curve_equals_a_replay_at_every_size_on_a_real_capture(pin):
    """OLMoE's captured routing (its first 24 decode steps) cut into two requests, each with
    a 6-token prefill: its pass-layers are up to 30 experts wide, so the sizes below that
    are replayed (waves) and the rest come from stack distances."""
    traces = as_requests(_capture_cut(24), 12, 6)
    made = _every_size_equals_a_replay(traces, pin, context=[0] * len(traces))
    assert made.stack_from == curve.requests_of(traces, 64).widest > 8
    strict = _every_size_equals_a_replay(traces, pin, context=[0] * len(traces),
                                         eviction="lru_per_layer(quota=strict)")
    assert strict.stack_from is not None and any(r["method"] == curve.STACK
                                                 for r in strict.rows)
    hits = [r["hits"] for r in made.rows]
    assert hits[-1] > hits[0] and made.rows[-1]["collision_misses"] == 0


def test_the_whole_capture_at_sampled_sizes():
    """The whole capture (65,536 requests): the stack curve around LRU's cliff and up to every
    distinct expert, against replays."""
    (trace,) = load_traces(os.path.join(bundled.CAPTURES_DIR, "olmoe_code.jsonl"))
    make = _maker(trace)
    sizes = [8, 120, 122, 124, 126, 128, 200, 512, 898]
    made = curve.capacity_curve(make, [trace], None, sizes)
    assert [r["method"] for r in made.rows] == [curve.STACK] * len(sizes)
    for row in made.rows:
        cache = make(row["slots"])
        replay(cache, [trace], None)
        assert {k: row[k] for k in curve.COUNTED} == curve.counts_of(cache)
    hits = [r["hits"] for r in made.rows]
    assert hits == sorted(hits) and hits[0] == 0 < hits[-2]  # a stack algorithm: inclusion
    assert made.rows[-1]["misses"] == 898  # every distinct expert fits: only first uses miss


def _drawn(seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    layers, experts = int(rng.integers(1, 4)), int(rng.integers(3, 8))
    k = int(rng.integers(1, min(3, experts) + 1))
    passes = [int(rng.integers(2, 6))] + [int(x) for x in
                                          rng.integers(1, 3, size=rng.integers(2, 10))]
    return random_scored_trace(rng, layers, experts, k, passes, 1000, scores=False,
                               prefill_passes=1)


@pytest.mark.parametrize("pin, seed, size", [("layer", 21, 3), ("request", 6, 3)])
def test_below_the_widest_pass_layer_the_stack_rule_is_wrong_so_it_is_replayed(pin, seed,
                                                                              size):
    """Waves (resident experts first) make the order a pass-layer's keys are used in depend on
    the size: the stack rule's count differs from the replay's there, and the curve replays."""
    trace = _drawn(seed)
    req = curve.requests_of([trace], trace.num_experts)
    assert size < req.widest
    make = _maker(trace, pin=pin)
    cache = make(size)
    replay(cache, [trace], None)
    assert curve.global_counts(req, pin).at(size)["hits"] != curve.counts_of(cache)["hits"]
    (row,) = curve.capacity_curve(make, [trace], None, [size]).rows
    assert row["method"] == curve.REPLAY and row["hits"] == curve.counts_of(cache)["hits"]


# -- per layer ----------------------------------------------------------------------------------

def _strict_per_layer(keys, starts, n_layers, n_experts, quota, pin):
    """From scratch: each layer its own LRU of `quota[pos]` keys; a pass-layer's keys are
    protected together (`pin="layer"`) or only the key fetched (`"request"`); a miss on a key
    evicted earlier in the same pass is a collision."""
    caches = [OrderedDict() for _ in range(n_layers)]
    evicted_in: dict[int, int] = {}
    hits = coll = 0
    for pl in range(len(starts) - 1):
        p, pos = divmod(pl, n_layers)
        cache, wave = caches[pos], set(keys[starts[pl]:starts[pl + 1]].tolist())
        for key in keys[starts[pl]:starts[pl + 1]].tolist():
            if key in cache:
                hits += 1
                cache.move_to_end(key)
                continue
            coll += evicted_in.get(key) == p
            if len(cache) >= quota[pos]:
                victim = next(k for k in cache if pin == "request" or k not in wave)
                del cache[victim]
                evicted_in[victim] = p
            cache[key] = None
    return hits, coll


@settings(max_examples=examples(20))
@given(traces=_traces(), pin=st.sampled_from(["layer", "request"]), extra=st.integers(0, 4))
def test_per_layer_stack_sums_equal_a_from_scratch_strict_per_layer_lru(traces, pin, extra):
    first = traces[0]
    req = curve.requests_of(traces, first.num_experts)
    counts = curve.per_layer_counts(req, pin)
    widest = req.widest_per_layer()
    rng = np.random.default_rng(extra)
    quota = widest + rng.integers(0, extra + 1, len(widest))
    got = curve.sum_per_layer(counts, quota)
    hits, coll = _strict_per_layer(req.keys, req.starts, req.num_layers, req.num_experts,
                                   quota, pin)
    assert (got["hits"], got["collision_misses"], got["late_hits"]) == (hits, coll, 0)
    assert got["hits"] + got["misses"] == len(req.keys)
    if pin == "layer":
        assert coll == 0  # only the layer's own pass-layer evicts its keys, never a key of it


def test_which_evictions_the_stack_rule_covers():
    trace = random_scored_trace(np.random.default_rng(0), 2, 4, 2, [1] * 6, 1000, scores=False,
                                prefill_passes=0)
    assert curve.stack_form(_maker(trace, "lru")(8))[0] == curve.GLOBAL
    for eviction in ("lru_per_layer", "fifo", "lfu", "belady", "least_stale"):
        form, why = curve.stack_form(_maker(trace, eviction)(8))
        assert form is None and "not a stack algorithm" in why, eviction
    form, why = curve.stack_form(_maker(trace, "lru", prefetch="temporal")(8))
    assert form is None and "prefetch temporal" in why
    # Not a stack algorithm here: every size replayed, and equal to a replay.
    make = _maker(trace, "lru_per_layer")
    made = curve.capacity_curve(make, [trace], None, [2, 3, 5, 8])
    assert [r["method"] for r in made.rows] == [curve.REPLAY] * 4 and made.stack_from is None


# -- the job ------------------------------------------------------------------------------------

def _curve_config(trace: str, **fields):
    c = with_fields(base_config(), job="curve", **{
        "model.preset": "", "clock.kind": "virtual", "policies.prefetch": "none",
        "replay.trace": trace, "log.progress": False, **fields})
    return c


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("curve") / "t.npz")
    random_scored_trace(np.random.default_rng(3), 3, 6, 2, [4] + [1] * 30, 1000, scores=False,
                        prefill_passes=1).save(path)
    return path


def test_the_job_writes_every_size_a_plot_and_checks_itself(small_trace, tmp_path, capsys):
    config = _curve_config(small_trace, **{"curve.policies": "lru, lru_per_layer",
                                           "curve.checks": 3})
    jobs.check(config, warn=False)
    results = jobs.run(config, str(tmp_path))
    out = capsys.readouterr().out
    with open(tmp_path / "results.json") as f:
        written = json.load(f)
    assert written["curve"] == results["curve"] and set(written["curve"]) == {
        "lru", "lru_per_layer"}
    distinct = written["capacity"]["distinct_experts"]
    for spec, rows in written["curve"].items():
        assert [r["slots"] for r in rows] == list(range(2, distinct + 1))
        for r in rows:
            assert {"slots", "hits", "late_hits", "misses", "collision_misses"} <= set(r)
            assert r["hits"] + r["late_hits"] + r["misses"] == r["requests"]
        assert rows[-1]["misses"] == distinct  # nothing more to gain: only first uses miss
        m = written["curve_methods"][spec]
        assert len(m["checked"]) == 3 and m["checks_equal"]
    assert {r["method"] for r in written["curve"]["lru_per_layer"]} == {curve.REPLAY}
    lru = written["curve"]["lru"]
    widest = written["capacity"]["widest_pass_layer"]
    assert all(r["method"] == (curve.STACK if r["slots"] >= widest else curve.REPLAY)
               for r in lru)
    assert os.path.getsize(tmp_path / curve_job.PLOT) > 10_000
    assert "eviction lru:" in out and "eviction lru_per_layer:" in out
    assert f"{distinct:>6} " in out and "stack" in out and "replay" in out
    assert written["config"]["curve"]["policies"] == "lru, lru_per_layer"


def test_a_curve_that_differs_from_its_replay_is_refused(small_trace, tmp_path, monkeypatch):
    """Break the stack rule (one hit too many at every size): the run's own check refuses it,
    naming the size and the counters, and writes no results."""
    real = curve.StackCounts.at

    def off_by_one(self, capacity):
        out = real(self, capacity)
        return {**out, "hits": out["hits"] + 1, "misses": out["misses"] - 1}

    monkeypatch.setattr(curve.StackCounts, "at", off_by_one)
    with pytest.raises(CheckFailed, match=r"eviction 'lru' at \d+ slots differs from an "
                                          r"independent replay there: hits"):
        jobs.run(_curve_config(small_trace, **{"curve.policies": "lru"}), str(tmp_path))
    assert not os.path.exists(tmp_path / "results.json")


@pytest.mark.parametrize("fields, says", [
    ({"curve.policies": "lru,nope"}, "curve.policies: unknown eviction policy 'nope'"),
    ({"curve.policies": ""}, "curve.policies='' must name one eviction policy or more"),
    ({"curve.policies": "lru,lru"}, "names 'lru' twice"),
    ({"curve.max_slots": -1}, "curve.max_slots=-1 must be an integer >= 0"),
    ({"curve.checks": -2}, "curve.checks=-2 must be an integer >= 0"),
])
def test_bad_curve_fields_are_refused_before_anything_runs(small_trace, fields, says):
    with pytest.raises(ConfigError) as info:
        jobs.check(_curve_config(small_trace, **fields), warn=False)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("fields, says", [
    ({"replay.trace": "/nonexistent/t.jsonl"}, "replay.trace='/nonexistent/t.jsonl' is not a "
                                               "file"),
    ({"curve.max_slots": 1}, "curve.max_slots=1 is not a cache size of this trace: it takes 2 "
                             "(top-k, the smallest cache) to 18"),
])
def test_bad_input_the_trace_decides_is_one_line(small_trace, tmp_path, fields, says):
    with pytest.raises(ConfigError) as info:
        jobs.run(_curve_config(small_trace, **fields), str(tmp_path))
    assert says in str(info.value) and "\n" not in str(info.value)


def test_top_level_commas_split_the_policies():
    assert curve_job.policy_list("lru, least_stale(order='cyclic', prefetch_current='pass'),fifo"
                                 ) == ["lru", "least_stale(order='cyclic', "
                                       "prefetch_current='pass')", "fifo"]


def test_what_the_curve_does_not_read_is_said(small_trace, tmp_path):
    """The curve sizes each cache itself and takes its evictions from curve.policies."""
    from moejax.jobs.declared import unread_by_job
    from moejax.jobs.schema import LIVE, READ_BY, REPLAYS

    config = _curve_config(small_trace, **{"cache.slots": 12, "policies.eviction": "fifo"})
    unread = dict(unread_by_job(config, base_config(), READ_BY, LIVE, unnamed=(*LIVE, *REPLAYS)))
    assert set(unread) == {"cache.slots", "policies.eviction"}
    replay = with_fields(config, job="replay")
    assert unread_by_job(replay, base_config(), READ_BY, LIVE, unnamed=(*LIVE, *REPLAYS)) == []


# -- the command --------------------------------------------------------------------------------

def _main(*args):
    return subprocess.run([sys.executable, "-m", "moejax.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_command_on_a_shipped_capture(tmp_path):
    capture = os.path.join("moejax", "assets", "captures", "olmoe_code.jsonl")
    done = _main("--config=configs/curve.py", f"--config.replay.trace={capture}",
                 "--config.model.family=olmoe", "--config.model.preset=olmoe-1b-7b",
                 "--config.curve.max_slots=40", "--config.log.progress=False",
                 f"--workdir={tmp_path / 'w'}")
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "w" / "results.json") as f:
        results = json.load(f)
    assert [r["slots"] for r in results["curve"]["lru"]] == list(range(8, 41))
    assert {r["method"] for r in results["curve"]["lru"]} == {"stack"}
    assert {r["method"] for r in results["curve"]["lru_per_layer"]} == {"replay"}
    assert results["curve"]["lru"][-1]["share_of_model"] > 0
    assert "eviction lru: 33 sizes, 8 to 40 slots" in done.stdout
    assert os.path.exists(tmp_path / "w" / "curve.png")
    # The flat trace field of old is refused in one line naming its section.
    moved = _main("--config=configs/curve.py", f"--config.trace={capture}",
                  f"--workdir={tmp_path / 'x'}")
    unknown = _main("--config=configs/curve.py", f"--config.replay.trace={capture}",
                    "--config.curve.policies=lru,nope", f"--workdir={tmp_path / 'y'}")
    for done in (moved, unknown):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "replay.trace" in moved.stderr
    assert "curve.policies: unknown eviction policy 'nope'" in unknown.stderr


def test_a_results_config_written_before_the_curve_section_reads_as_one_written_now():
    """A sweep's results.json from before the curve job has no `curve` section: it reads with
    the section at its defaults, so `launch.diff` pairs it field for field with one since."""
    from moejax.jobs.schema import current_config

    now = base_config().to_dict()
    before = {k: v for k, v in now.items() if k != "curve"}
    assert current_config(before) == now and current_config(now) is now
