"""Trace replay: equivalence with the live run (DESIGN invariant 4), Belady against a brute-force
optimum, LRU and Belady against an independent simulation of the shared traces, oracles."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_cache import lru_hits, min_hits

from moejax import jobs
from moejax.bundled import CAPTURES_DIR
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.traces.format import FORMAT, Trace
from tests.fuzzing import examples

SHARED = CAPTURES_DIR  # the four real captures (moejax/assets/captures)


ENGINES = ("reference", "auto")  # the policy objects; the compiled engine where it covers
RAN = {"reference": "reference", "auto": "compiled"}  # LRU and Belady have compiled forms


def _replay_config(trace: str, engine: str = "auto", **policies):
    c = base_config()
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", trace, "", "virtual"
    c.replay.engine = engine
    c.log.progress = c.log.tensorboard = False
    for k, v in policies.items():
        setattr(c.policies, k, v)
    return c


@pytest.mark.parametrize("eviction,prefetch,miss,cache", [
    ("least_stale", "score_percentile(p=80, lookahead=2)", "fetch", {"slots": 9}),
    ("lru", "topk(overfetch=1.5)", "fetch", {"slots": 9}),
    ("score", "none", "drop(keep=2)", {"slots": 9}),
    ("lru_per_layer", "temporal", "substitute(tol=0.2)", {"slots": 9}),
    # Precision-aware: three pools sharing the budget, LHU, the cascade with upgrades.
    ("lhu", "score_percentile(p=80)", 'fetch_priority(levels="int8:int4:int2", upgrade=True)',
     {"capacity_frac": 0.3}),
    ("least_stale", "topk(overfetch=1.0)", "fetch", {"capacity_frac": 0.1, "precision": "int4"}),
    # SpecMD's watchdog queue: transfers issued when a copy engine frees, on the virtual clock.
    ("least_stale(order=left_first)", "score_percentile(p=60, lookahead=2)", "fetch",
     {"slots": 9, "prefetch_queue": "watchdog"}),
])
@pytest.mark.slow
def test_replay_of_a_live_run_reproduces_it_exactly(tmp_path, eviction, prefetch, miss, cache):
    live = base_config()
    live.model.preset, live.model.family = "tiny", "olmoe"
    live.policies.eviction, live.policies.prefetch, live.policies.miss = eviction, prefetch, miss
    live.run.max_new_tokens, live.log.progress = 12, False
    live.tracing.record = True
    for k, v in cache.items():
        setattr(live.cache, k, v)
    ran = jobs.run(live, str(tmp_path / "live"))
    c = _replay_config(ran["trace"], eviction=eviction, prefetch=prefetch, miss=miss)
    for k, v in cache.items():
        setattr(c.cache, k, v)
    replayed = jobs.run(c, str(tmp_path / "replay"))
    assert replayed["cache"]["pools"] == ran["cache"]["pools"]
    for part in ("total", "per_layer"):
        assert replayed["cache"][part] == ran["cache"][part], part
    assert replayed["cache"]["timing"] == ran["cache"]["timing"]
    assert ran["cache"]["total"]["requests"] > 0
    used = [p for p, n in ran["cache"]["total"]["requests_by_precision"].items() if n]
    assert len(used) == len(ran["cache"]["pools"])  # every pool served requests


def _id_trace(ids: np.ndarray, num_experts: int) -> Trace:
    """A decode-only id trace `[steps, layers, k]`."""
    steps, layers, k = ids.shape
    meta = {"format": FORMAT, "model": {}, "layers": list(range(layers)),
            "num_experts": num_experts, "top_k": k, "expert_bytes": 1000, "lookahead": 0,
            "prefill_passes": 0, "source": "test", "info": {}}
    return Trace(meta, np.arange(steps + 1), np.full(steps, -1, np.int32), ids.astype(np.int64))


def _requests(ids: np.ndarray):
    """(layer, expert) requests in pass -> layer -> router-rank order, per layer groups."""
    return [[[(l, int(e)) for e in ids[s, l]] for l in range(ids.shape[1])]
            for s in range(ids.shape[0])]


def _brute_force_hits(ids: np.ndarray, slots: int) -> int:
    """The most hits any eviction choice achieves (keys of the running layer not evictable)."""
    passes = _requests(ids)
    flat = [(layer_keys, key) for p in passes for layer_keys in p for key in layer_keys]
    best = 0

    def go(i, cache, hits):
        nonlocal best
        if hits + (len(flat) - i) <= best:
            return
        if i == len(flat):
            best = max(best, hits)
            return
        layer_keys, key = flat[i]
        if key in cache:
            return go(i + 1, cache, hits + 1)
        if len(cache) < slots:
            return go(i + 1, cache | {key}, hits)
        for victim in sorted(cache - set(layer_keys)):
            go(i + 1, (cache - {victim}) | {key}, hits)

    go(0, frozenset(), 0)
    return best


def _replay_trace(tmp_path, trace: Trace, slots: int, name: str, engine: str, **policies):
    path = str(tmp_path / f"{name}.npz")
    trace.save(path)
    c = _replay_config(path, engine, **policies)
    c.cache.slots = slots
    res = jobs.run(c, str(tmp_path / f"{name}-{engine}"))
    assert res["replay"]["engine"] == RAN[engine], res["replay"]["engine_reason"]
    return res["cache"]["total"]


@settings(max_examples=examples(25))
@given(data=st.data())
def test_belady_equals_the_brute_force_optimum(tmp_path_factory, data):
    layers = data.draw(st.integers(2, 3))
    experts = data.draw(st.integers(3, 4))
    k = data.draw(st.integers(1, 2))
    steps = data.draw(st.integers(2, 4))
    slots = data.draw(st.integers(k, min(layers * experts, k + 2)))
    rows = [[data.draw(st.permutations(range(experts)))[:k] for _ in range(layers)]
            for _ in range(steps)]
    ids = np.asarray(rows)
    best = _brute_force_hits(ids, slots)
    tmp = tmp_path_factory.mktemp("b")
    for engine in ENGINES:
        total = _replay_trace(tmp, _id_trace(ids, experts), slots, "t", engine,
                              eviction="belady", prefetch="none")
        assert total["hits"] + total["late_hits"] == best, engine


def _independent_sim(path: str, slots: int, policy: str) -> int:
    """A from-scratch simulation of the definitions on a capture JSONL: global cache keyed by
    (layer, expert), demand fetch, requests in pass -> layer -> router-rank order."""
    with open(path) as f:
        meta = json.loads(f.readline())["meta"]
        steps = [json.loads(line)["routed"] for line in f]
    reqs = [[(int(l), e) for l in range(meta["layers"]) for e in step[str(l)]] for step in steps]
    flat = [k for step in reqs for k in step]
    return lru_hits(flat, slots) if policy == "lru" else min_hits(flat, slots)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["olmoe_code", "qwen_prose"])
@pytest.mark.parametrize("capacity", [0.01, 0.05, 0.25])
def test_shared_traces_match_an_independent_simulation(tmp_path, name, capacity):
    path = os.path.join(SHARED, f"{name}.jsonl")
    family, preset = ("olmoe", "olmoe-1b-7b") if name.startswith("olmoe") else \
        ("qwen2_moe", "qwen1.5-moe-a2.7b")
    got = {}
    for engine in ENGINES:
        for policy in ("lru", "belady"):
            c = _replay_config(path, engine, eviction=policy, prefetch="none")
            c.model.family, c.model.preset = family, preset
            c.cache.capacity_frac = capacity
            c.cache.pin_scope = "request"  # the classic model: one request at a time
            res = jobs.run(c, str(tmp_path / f"{policy}-{engine}"))
            assert res["replay"]["engine"] == RAN[engine], res["replay"]["engine_reason"]
            total = res["cache"]["total"]
            got[policy] = total["hits"] + total["late_hits"]
            assert got[policy] == _independent_sim(path, res["cache"]["slots"], policy), (
                policy, engine)
        assert got["belady"] >= got["lru"]


def test_oracle_prefetch_is_precise_and_beats_none(tmp_path):
    path = os.path.join(SHARED, "olmoe_prose.jsonl")
    runs = {}
    for prefetch in ("none", "oracle", "noisy_oracle(precision=0.5)", "temporal"):
        c = _replay_config(path, eviction="least_stale", prefetch=prefetch)
        c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
        c.cache.capacity_frac = 0.25
        runs[prefetch] = jobs.run(c, str(tmp_path / prefetch.split("(")[0]))["cache"]["total"]
    assert runs["oracle"]["prefetch_precision"] > 0.95
    assert runs["oracle"]["hit_rate"] > runs["none"]["hit_rate"]
    assert runs["noisy_oracle(precision=0.5)"]["prefetch_precision"] < \
        runs["oracle"]["prefetch_precision"]
    assert runs["temporal"]["prefetch_issued"] > 0


def test_replay_only_and_score_policies_refuse_clearly(tmp_path):
    live = base_config()
    live.model.preset, live.model.family = "tiny", "olmoe"
    live.cache.capacity_frac, live.log.progress = 0.25, False
    live.policies.eviction = "belady"
    with pytest.raises(ConfigError, match="replay only"):
        jobs.run(live, str(tmp_path / "a"))
    path = os.path.join(SHARED, "olmoe_code.jsonl")
    c = _replay_config(path, prefetch="score_percentile(p=80)")
    c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
    with pytest.raises(ConfigError, match="needs speculative gate scores"):
        jobs.run(c, str(tmp_path / "b"))
    c = _replay_config(path)
    with pytest.raises(ConfigError, match="expert bytes"):  # a fraction, no sizes known
        jobs.run(c, str(tmp_path / "c"))


def test_vllm_rows_replay_each_problem_as_a_sequence(tmp_path):
    rng = np.random.default_rng(0)
    lines, requests = [], 0
    for problem in ("p1", "p2"):
        for tok in range(5):
            for layer in range(3):
                experts = rng.permutation(6)[:2].tolist()
                requests += 2
                lines.append(json.dumps({"problem_id": problem, "layer": layer,
                                         "experts": experts, "gating_probs": [0.6, 0.4],
                                         "token_idx": tok}))
    path = tmp_path / "vllm.jsonl"
    path.write_text("\n".join(lines) + "\n")
    c = _replay_config(str(path), eviction="lru", prefetch="none")
    with pytest.raises(ConfigError, match="cache.slots"):  # a fraction needs expert sizes
        jobs.run(c, str(tmp_path / "a"))
    c.cache.slots = 4
    res = jobs.run(c, str(tmp_path / "b"))
    assert res["trace"]["sequences"] == 2 and res["trace"]["passes"] == 10
    assert res["cache"]["total"]["requests"] == requests
    assert res["cache"]["expert_bytes"] is None  # unknown: counts only


def test_truncated_trace_is_a_clear_error(tmp_path):
    src = os.path.join(SHARED, "olmoe_code.jsonl")
    text = open(src).read()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) // 2])
    c = _replay_config(str(cut))
    with pytest.raises(ConfigError, match=r"cut\.jsonl:\d+"):
        jobs.run(c, str(tmp_path / "w"))


def _independent_sim_ids(ids, slots, policy, tmp=None):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps({"meta": {"layers": ids.shape[1], "top_k": ids.shape[2],
                                         "n_experts": int(ids.max()) + 1}}) + "\n")
            for s, row in enumerate(ids):
                f.write(json.dumps({"step": s, "routed": {str(l): row[l].tolist()
                                                          for l in range(ids.shape[1])}}) + "\n")
        return _independent_sim(path, slots, policy)


def test_independent_sim_itself_is_sound():
    """A worked case: one layer, experts 0,1,2 requested 0 1 2 0 1 2 with 2 slots: MIN keeps
    one of the next two and gets 2 hits; LRU always evicts the next one needed: 0 hits."""
    ids = np.asarray([[[0]], [[1]], [[2]], [[0]], [[1]], [[2]]])
    assert _brute_force_hits(ids, 2) == 2
    assert _independent_sim_ids(ids, 2, "belady") == 2
    assert _independent_sim_ids(ids, 2, "lru") == 0
