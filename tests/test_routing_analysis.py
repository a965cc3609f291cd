"""Routing statistics (moejax/analysis/routing_stats.py) on hand-worked traces, on the bundled capture
traces (moejax/assets/captures), and as invariants over random routing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled
from moejax.analysis.routing_stats import (
    COLUMNS,
    reuse_rate,
    spec_scores,
    summarize,
    table,
    usage_entropy_frac,
)
from moejax.traces.format import FORMAT, Trace
from moejax.traces.importers import load_traces

CAPTURE = bundled.capture_path("olmoe_code")


def test_entropy_uniform_use_is_one():
    ids = np.array([[[0, 1]], [[2, 3]], [[3, 0]], [[1, 2]]])  # every expert twice
    np.testing.assert_allclose(usage_entropy_frac(ids, 4), [1.0])


def test_entropy_single_expert_is_zero():
    ids = np.zeros((6, 2, 1), np.int64)  # two layers, top-1, always expert 0
    np.testing.assert_allclose(usage_entropy_frac(ids, 8), [0.0, 0.0])


def test_entropy_per_layer_hand_worked():
    # Layer 0: experts 0, 0, 1, 1 of E=4 -> 1 bit / 2 bits. Layer 1: 0, 1, 2, 3 -> 2 / 2 bits.
    ids = np.array([[[0], [0]], [[0], [1]], [[1], [2]], [[1], [3]]])
    np.testing.assert_allclose(usage_entropy_frac(ids, 4), [0.5, 1.0])


def test_reuse_rate_hand_worked():
    # K=2. Layer 0 shares exactly one expert with the previous step; layer 1 all (in another
    # order); layer 2 none.
    l0 = [[0, 1], [1, 2], [3, 2], [3, 0]]
    l1 = [[4, 5], [5, 4], [4, 5], [5, 4]]
    l2 = [[0, 1], [2, 3], [0, 1], [2, 3]]
    ids = np.array([l0, l1, l2]).transpose(1, 0, 2)  # [S=4, L=3, K=2]
    np.testing.assert_allclose(reuse_rate(ids), [0.5, 1.0, 0.0])


def test_reuse_rate_mixed_steps():
    # Step transitions share 2, 0, 1 of K=2 -> mean (1 + 0 + 0.5) / 3.
    ids = np.array([[[0, 1]], [[1, 0]], [[2, 3]], [[3, 4]]])
    np.testing.assert_allclose(reuse_rate(ids), [0.5])


# --- speculative scores ------------------------------------------------------------------

E, K, L = 10, 2, 3


def _spec_trace(on_top: bool, prefill: int = 3, steps: int = 6, seed: int = 0) -> Trace:
    """A trace of one `prefill`-token pass and `steps` decode steps whose spec[:, l, 0]
    ranks layer l+1's true experts first (on_top) or last, with distinct scores (so exactly K
    experts lie above the 80th percentile of E=10)."""
    rng = np.random.default_rng(seed)
    r = prefill + steps
    ids = np.stack([[rng.choice(E, K, replace=False) for _ in range(L)] for _ in range(r)])
    spec = np.zeros((r, L, 1, E), np.float32)
    for row in range(r):
        # The prefill rows rank the other way: summarize must score the decode rows only.
        top = on_top if row >= prefill else not on_top
        for l in range(L - 1):
            true = ids[row, l + 1]
            rest = [e for e in range(E) if e not in true]
            order = (list(true) + rest) if top else (rest + list(true))  # best first
            spec[row, l, 0, order] = np.linspace(0.3, 0.01, E)
    meta = {"format": FORMAT, "model": {}, "layers": [0, 2, 3], "num_experts": E, "top_k": K,
            "expert_bytes": None, "lookahead": 1, "prefill_passes": 1, "source": "hand", "info": {}}
    offsets = np.array([0] + list(range(prefill, r + 1)), np.int64)
    t = Trace(meta, offsets, np.arange(r, dtype=np.int32), ids.astype(np.int64),
              spec=spec.astype(np.float16))
    t.validate()
    return t


@pytest.mark.parametrize("on_top,want", [(True, 1.0), (False, 0.0)])
def test_spec_scores_hand_built(on_top, want):
    t = _spec_trace(on_top)
    rows = np.arange(3, t.ids.shape[0])
    topk, p_prec, p_rec = spec_scores(t, rows)
    assert topk.shape == p_prec.shape == p_rec.shape == (L - 1,)  # no pair after the last layer
    np.testing.assert_allclose(topk, want)
    np.testing.assert_allclose(p_prec, want)
    np.testing.assert_allclose(p_rec, want)


def test_spec_scores_half_right():
    # Layer pair 0->1: true experts ranked 1st and 3rd -> top-2 precision 1/2.
    t = _spec_trace(True, prefill=1, steps=2)
    for row in range(t.ids.shape[0]):
        true = t.ids[row, 1]
        rest = [e for e in range(E) if e not in true]
        order = [true[0], rest[0], true[1]] + rest[1:]
        t.spec[row, 0, 0, order] = np.linspace(0.3, 0.01, E)
    topk, p_prec, p_rec = spec_scores(t, np.arange(1, 3))
    np.testing.assert_allclose(topk, [0.5, 1.0])
    np.testing.assert_allclose(p_prec, [0.5, 1.0])
    np.testing.assert_allclose(p_rec, [0.5, 1.0])


@pytest.mark.parametrize("on_top,want", [(True, 1.0), (False, 0.0)])
def test_summarize_scores_decode_steps_only(on_top, want):
    s = summarize(_spec_trace(on_top))
    assert s["steps"] == 6 and s["layers"] == L and s["experts"] == E and s["top_k"] == K
    assert s["spec_topk_precision"] == pytest.approx(want)
    assert s["spec_p80_precision"] == pytest.approx(want)
    assert s["spec_p80_recall"] == pytest.approx(want)


# --- bundled capture trace and the table ---------------------------------------------------


@pytest.fixture(scope="module")
def capture():
    return load_traces(CAPTURE)[0]


def test_summarize_capture_trace(capture):
    s = summarize(capture)
    assert not any(k.startswith("spec") for k in s)
    assert (s["steps"], s["layers"], s["experts"], s["top_k"]) == (512, 16, 64, 8)
    assert s["reuse_uniform"] == pytest.approx(8 / 64)
    # Independent recomputation with Python sets and Counter-free entropy.
    ids = capture.ids
    reuse = np.mean([[len(set(ids[t, l]) & set(ids[t - 1, l])) / 8 for l in range(16)]
                     for t in range(1, 512)])
    assert s["reuse"] == pytest.approx(reuse)
    ent = []
    for l in range(16):
        p = np.bincount(ids[:, l].ravel(), minlength=64) / (512 * 8)
        ent.append(-sum(x * np.log(x) for x in p if x > 0) / np.log(64))
    assert s["entropy_frac"] == pytest.approx(np.mean(ent))
    assert s["entropy_frac_min"] == pytest.approx(min(ent))
    assert 0 < s["entropy_frac_min"] <= s["entropy_frac"] <= 1


def test_table_one_row_per_trace(tmp_path):
    vllm = tmp_path / "rows.jsonl"
    with open(vllm, "w") as f:
        for problem in ("a", "b"):
            for tok in range(3):
                for layer in (0, 1):
                    f.write(json.dumps({"problem_id": problem, "layer": layer, "token_idx": tok,
                                        "experts": [(tok + layer) % 4, (tok + layer + 1) % 4],
                                        "gating_probs": [0.6, 0.4]}) + "\n")
    npz = str(tmp_path / "spec.npz")
    _spec_trace(True).save(npz)
    paths = [str(vllm), npz, CAPTURE]
    lines = table(paths).splitlines()
    assert lines[0] == "| trace | " + " | ".join(COLUMNS) + " |"
    assert lines[1].count("---") == len(COLUMNS) + 1
    body = lines[2:]
    assert len(body) == 4  # two vLLM problems, the .npz, the capture
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in body]
    assert all(len(c) == 1 + len(COLUMNS) for c in cells)
    assert [c[0] for c in cells[:3]] == ["rows.jsonl", "rows.jsonl#1", "spec.npz"]
    col = {c: i + 1 for i, c in enumerate(COLUMNS)}
    assert cells[0][col["steps"]] == "3" and cells[0][col["spec_topk_precision"]] == "–"
    assert cells[0][col["reuse"]] == "0.500"  # each step shares one of its two experts
    assert cells[2][col["spec_topk_precision"]] == "1.000"
    assert cells[3][0] == "olmoe_code.jsonl" and cells[3][col["experts"]] == "64"


# --- invariants ---------------------------------------------------------------------------


@st.composite
def routing(draw):
    e = draw(st.integers(2, 24))
    k = draw(st.integers(1, min(e, 6)))
    steps, layers = draw(st.integers(2, 12)), draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    ids = np.array([[rng.choice(e, k, replace=False) for _ in range(layers)]
                    for _ in range(steps)])
    return ids, e


@settings(max_examples=60, deadline=None)
@given(routing())
def test_reuse_and_entropy_are_fractions(case):
    ids, e = case
    s, l, k = ids.shape
    reuse, ent = reuse_rate(ids), usage_entropy_frac(ids, e)
    assert reuse.shape == ent.shape == (l,)
    assert np.all((reuse >= 0) & (reuse <= 1))
    assert np.all((ent >= -1e-12) & (ent <= 1 + 1e-12))
    # Reuse agrees with a set-based count; entropy ignores expert labels.
    want = [np.mean([len(set(ids[t, j]) & set(ids[t - 1, j])) / k for t in range(1, s)])
            for j in range(l)]
    np.testing.assert_allclose(reuse, want)
    perm = np.random.default_rng(0).permutation(e)
    np.testing.assert_allclose(usage_entropy_frac(perm[ids], e), ent, atol=1e-12)
