"""Hotlists (`moejax/cache/hotlist.py`): request counts and ranking on a hand-built trace, ds4's
priority formula, the `cache.seed` syntax and its errors, the work-directory form, the shape
check against a model, and a smoke run on a shipped trace."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from moejax.cache import hotlist
from moejax.cache.hotlist import Hotlist, from_trace, parse_seed, priority
from moejax.errors import ConfigError
from moejax.policies import build
from moejax.traces.format import FORMAT, Trace, load

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "moejax", "assets")


def tiny_trace() -> Trace:
    """MoE layers 1 and 3 (indices, not positions), 4 experts, top-2: a 2-row prefill pass,
    then two 1-row decode passes."""
    ids = np.array([[[0, 1], [2, 3]],   # prefill
                    [[0, 2], [2, 1]],   # prefill
                    [[0, 3], [3, 1]],   # decode 0
                    [[1, 3], [3, 0]]])  # decode 1
    meta = {"format": FORMAT, "model": {"name": "tiny"}, "layers": [1, 3], "num_experts": 4,
            "top_k": 2, "expert_bytes": None, "lookahead": 0, "prefill_passes": 1,
            "source": "test"}
    return Trace(meta, np.array([0, 2, 3, 4]), np.full(4, -1, np.int32), ids)


@pytest.fixture
def tiny(tmp_path) -> str:
    path = str(tmp_path / "tiny.npz")
    tiny_trace().save(path)
    return path


# --- counts and ranking ----------------------------------------------------------------------


def test_counts_and_ranking_on_a_hand_built_trace(tiny):
    hot = from_trace(tiny)
    # Layer 1: expert 0 x3, 1 x2, 3 x2, 2 x1. Layer 3: 3 x3, 1 x2, 2 x2, 0 x1.
    assert hot.counts == {(1, 0): 3, (1, 1): 2, (1, 2): 1, (1, 3): 2,
                          (3, 0): 1, (3, 1): 2, (3, 2): 2, (3, 3): 3}
    # Count descending; equal counts in (layer, expert) order.
    assert hot.keys == [(1, 0), (3, 3), (1, 1), (1, 3), (3, 1), (3, 2), (1, 2), (3, 0)]
    assert (hot.layers, hot.num_experts, hot.source) == ([1, 3], 4, tiny)
    assert all(type(x) is int for key in hot.keys for x in key)


def test_decode_only_counts_the_passes_after_the_prefill(tiny):
    hot = from_trace(tiny, decode_only=True)
    assert hot.counts == {(1, 0): 1, (1, 1): 1, (1, 3): 2, (3, 0): 1, (3, 1): 1, (3, 3): 2}
    assert hot.keys == [(1, 3), (3, 3), (1, 0), (1, 1), (3, 0), (3, 1)]  # never routed: unlisted


def test_several_paths_joined_by_commas_sum_their_counts(tiny):
    once, twice = from_trace(tiny), from_trace(f"{tiny}, {tiny}")
    assert twice.counts == {k: 2 * n for k, n in once.counts.items()}
    assert twice.keys == once.keys and twice.source == f"{tiny},{tiny}"


def test_top_and_priorities():
    hot = Hotlist([(0, 2), (0, 0), (1, 1)], {(0, 2): 9, (0, 0): 5, (1, 1): 1}, "x", [0, 1], 4)
    top = hot.top(2)
    assert (top.keys, top.counts, top.source) == ([(0, 2), (0, 0)], {(0, 2): 9, (0, 0): 5}, "x")
    assert hot.top(10).keys == hot.keys and hot.top(0).keys == []
    assert hot.priorities() == {(0, 2): 32, (0, 0): 21, (1, 1): 11}  # 1 + 31*{3,2,1}//3
    assert top.priorities() == {(0, 2): 32, (0, 0): 16}  # ranks relative to the shorter list


# --- ds4's priority --------------------------------------------------------------------------


@pytest.mark.parametrize("rank, total, expected", [
    (0, 32, 32), (1, 32, 31), (31, 32, 1),  # 1 + 31*32//32, 1 + 31*31//32 = 1 + 30, 1 + 31//32
    (0, 1, 32), (0, 2, 32), (1, 2, 16),     # 1 + 31//2 = 16 (rounded down)
    (0, 100, 32), (50, 100, 16), (99, 100, 1),
])
def test_priority_formula(rank, total, expected):
    assert priority(rank, total) == expected


def test_priority_spans_1_to_32_and_never_rises():
    for total in (1, 7, 31, 32, 33, 1024):
        values = [priority(r, total) for r in range(total)]
        assert values[0] == 32 and min(values) >= 1
        assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("rank, total", [(-1, 4), (4, 4), (0, 0)])
def test_priority_rejects_ranks_outside_the_list(rank, total):
    with pytest.raises(ValueError, match="out of range"):
        priority(rank, total)


# --- cache.seed ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, expected", [
    ("", None), ("none", None), ("  None ", None),
    ("hotlist(trace=a.npz)", {"kind": "hotlist", "trace": "a.npz", "top": None}),
    ("hotlist(trace=runs/x, top=64)", {"kind": "hotlist", "trace": "runs/x", "top": 64}),
    (" hotlist( top=8 ,trace='a b.npz' ) ", {"kind": "hotlist", "trace": "a b.npz", "top": 8}),
    ("hotlist(trace=a.npz,b(1).jsonl, top=2)",
     {"kind": "hotlist", "trace": "a.npz,b(1).jsonl", "top": 2}),
])
def test_parse_seed_forms(spec, expected):
    assert parse_seed(spec) == expected


@pytest.mark.parametrize("spec, why", [
    ("lru", "not understood"),
    ("hotlist(trace=a.npz", "not understood"),
    ("hotlist()", "needs trace=PATH"),
    ("hotlist(top=3)", "needs trace=PATH"),
    ("hotlist(trace=a.npz, top=0)", "positive integer"),
    ("hotlist(trace=a.npz, top=many)", "positive integer"),
    ("hotlist(trace=a.npz, depth=3)", "unknown argument 'depth=3'"),
    ("hotlist(trace=a.npz, trace=b.npz)", "given twice"),
])
def test_parse_seed_errors_name_the_setting_and_the_forms(spec, why):
    with pytest.raises(ConfigError, match=why) as e:
        parse_seed(spec)
    assert "cache.seed" in str(e.value)
    if why in ("not understood", "needs trace=PATH"):
        assert "hotlist(trace=PATH, top=N)" in str(e.value)


def test_a_parsed_seed_loads_its_hotlist(tiny):
    seed = parse_seed(f"hotlist(trace={tiny}, top=3)")
    hot = from_trace(seed["trace"]).top(seed["top"])
    assert hot.priorities() == {(1, 0): 32, (3, 3): 21, (1, 1): 11}


def test_a_work_directory_reads_its_recorded_trace(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    tiny_trace().save(str(run / "trace.npz"))
    assert from_trace(str(run)).counts == from_trace(str(run / "trace.npz")).counts


def test_a_work_directory_without_a_trace_asks_for_tracing_record(tmp_path):
    with pytest.raises(ConfigError, match=r"cache\.seed.*tracing\.record=True"):
        from_trace(str(tmp_path))


def test_a_missing_trace_file_names_the_setting_and_the_path(tmp_path):
    missing = str(tmp_path / "nope.npz")
    with pytest.raises(ConfigError, match="cache.seed") as e:
        from_trace(missing)
    assert missing in str(e.value)


def test_a_malformed_trace_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match=r"cache\.seed.*bad\.jsonl"):
        from_trace(str(bad))


# --- the shape check -------------------------------------------------------------------------


def test_check_against_a_model(tiny):
    hot = from_trace(tiny)
    hot.check_against([1, 3], 4)
    hot.check_against(2, 4)
    with pytest.raises(ConfigError, match=r"layers \[1, 3\].*MoE layers are \[0, 1\]"):
        hot.check_against([0, 1], 4)
    with pytest.raises(ConfigError, match="2 MoE layers.*has 3"):
        hot.check_against(3, 4)
    with pytest.raises(ConfigError, match="num_experts=4.*num_experts=8"):
        hot.check_against([1, 3], 8)


def test_an_inferred_expert_count_only_has_to_fit(tmp_path):
    """An id-only capture without n_experts: its count is a lower bound (largest id + 1)."""
    path = tmp_path / "cap.jsonl"
    rows = [{"meta": {"layers": 2, "top_k": 1, "n_experts": None}},
            {"step": 0, "routed": {"0": [2], "1": [0]}}, {"step": 1, "routed": {"0": [2], "1": [1]}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hot = from_trace(str(path))
    assert (hot.keys, hot.num_experts, hot.num_experts_inferred) == ([(0, 2), (1, 0), (1, 1)],
                                                                     3, True)
    hot.check_against(2, 8)
    with pytest.raises(ConfigError, match="expert 2.*num_experts=2"):
        hot.check_against(2, 2)
    assert from_trace(str(path), num_experts=8).num_experts_inferred is False


# --- shipped traces --------------------------------------------------------------------------


def test_shipped_trace_smoke():
    path = os.path.join(ASSETS, "traces", "prose_0.npz")
    trace, hot = load(path), from_trace(path)
    rows, layers, top_k = trace.ids.shape
    assert sum(hot.counts.values()) == rows * layers * top_k
    assert len(hot.keys) <= layers * trace.num_experts
    counts = [hot.counts[k] for k in hot.keys]
    assert counts == sorted(counts, reverse=True)
    hot.check_against(trace.layers, trace.num_experts)


def test_hotlist_priorities_seed_the_priority_policy(tiny):
    hot = from_trace(tiny).top(2)  # (1, 0) at 32, (3, 3) at 16; the rest 0
    policy = build("eviction", "priority", num_layers=2, num_experts=4)
    policy.set_layer_positions({1: 0, 3: 1})
    policy.set_priorities(hot.priorities())
    for key in [(3, 3), (1, 0), (1, 1), (3, 2)]:
        policy.on_admit(key, 0, False)
        policy.on_access(key, 0)
    order: list = []
    while (v := policy.victim(1, lambda k: k not in order)) is not None:
        order.append(v)
    assert order == [(1, 1), (3, 2), (3, 3), (1, 0)]
    assert hotlist.MAX_PRIORITY == policy.MAX_PRIORITY
