"""Hand-worked unit tests of the prefetch, miss and routing policies on hand-built
`LayerGate`s (numpy only)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.errors import ConfigError
from moejax.policies import build
from moejax.seam import LayerGate


def gate(ids, weights=None, probs=None, spec=None, spec_layers=(), layer=0):
    ids = np.asarray(ids, np.int32)
    return LayerGate(layer, ids,
                     None if weights is None else np.asarray(weights, np.float32),
                     None if probs is None else np.asarray(probs, np.float64),
                     None if spec is None else np.asarray(spec, np.float32), tuple(spec_layers))


def spec_gate(*rows, spec_layers, tokens=1):
    """A gate whose speculative rows `[A, N, E]` are given per lookahead row as [N, E]."""
    spec = np.stack([np.asarray(r, np.float32).reshape(tokens, -1) for r in rows])
    return gate(np.zeros((tokens, 1)), spec=spec, spec_layers=spec_layers)


# ---------------------------------------------------------------------------------------------
# prefetch: topk


@pytest.mark.parametrize("overfetch, count", [(1.0, 8), (1.5, 12)])
def test_topk_count_and_order(overfetch, count):
    # top-8 of 64 experts; overfetch 1.5 gives round(8 * 1.5) = 12 (SpecMD's OLMoE example).
    p = build("prefetch", f"topk(overfetch={overfetch})", top_k=8, num_experts=64)
    scores = np.random.default_rng(0).permutation(64) / 64.0  # distinct scores
    [(layer, experts)] = p.predict(spec_gate(scores, spec_layers=(3,)))
    assert layer == 3
    assert experts == np.argsort(-scores)[:count].tolist()
    assert len(experts) == count
    assert all(scores[a] > scores[b] for a, b in zip(experts, experts[1:]))  # descending


def test_topk_prefill_ranks_by_mean_over_tokens():
    # Two tokens, 4 experts: token 0 [.5 .4 .1 0], token 1 [0 .4 .1 .5]. Each token's own top-1
    # is expert 0 or 3, but the mean [.25 .4 .1 .25] ranks expert 1 first; the tie between 0
    # and 3 at .25 goes to the lower id (stable sort): top-2 = [1, 0].
    p = build("prefetch", "topk", top_k=2, num_experts=4)
    rows = np.array([[.5, .4, .1, 0.], [0., .4, .1, .5]])
    assert p.predict(spec_gate(rows, spec_layers=(1,), tokens=2)) == [(1, [1, 0])]
    p1 = build("prefetch", "topk(overfetch=0.5)", top_k=2, num_experts=4)
    assert p1.predict(spec_gate(rows, spec_layers=(1,), tokens=2)) == [(1, [1])]


def test_topk_lookahead_uses_spec_rows_and_spec_layers():
    row0 = [.1, .7, .2, 0.]  # next MoE layer (3): top-2 [1, 2]
    row1 = [.6, 0., .1, .3]  # the one after (5): top-2 [0, 3]
    p2 = build("prefetch", "topk(lookahead=2)", top_k=2, num_experts=4)
    assert p2.lookahead == 2
    assert p2.predict(spec_gate(row0, row1, spec_layers=(3, 5))) == [(3, [1, 2]), (5, [0, 3])]
    # lookahead=1 looks at row 0 only.
    p1 = build("prefetch", "topk", top_k=2, num_experts=4)
    assert p1.predict(spec_gate(row0, row1, spec_layers=(3, 5))) == [(3, [1, 2])]
    # Near the last MoE layer only one row is real (the other is padding): one prediction.
    assert p2.predict(spec_gate(row0, [0.] * 4, spec_layers=(3,))) == [(3, [1, 2])]
    # At the last MoE layer there is nothing ahead.
    assert p2.predict(spec_gate([0.] * 4, [0.] * 4, spec_layers=())) == []


@pytest.mark.parametrize("spec", ["topk", "topk(overfetch=1.5, lookahead=2)",
                                  "score_percentile(p=80)"])
def test_score_based_prefetch_needs_spec(spec):
    p = build("prefetch", spec, top_k=2, num_experts=4)
    with pytest.raises(ConfigError, match="speculative"):
        p.predict(gate([[0, 1]], spec=None))


def test_none_predicts_nothing():
    p = build("prefetch", "none", top_k=2, num_experts=4)
    assert p.lookahead == 0
    assert p.predict(spec_gate([.1, .7, .2, 0.], spec_layers=(3,))) == []
    assert p.predict(gate([[0, 1]])) == []


def test_topk_count_clamped():
    assert build("prefetch", "topk(overfetch=100)", top_k=2, num_experts=4).count == 4
    assert build("prefetch", "topk(overfetch=0.01)", top_k=2, num_experts=4).count == 1


# ---------------------------------------------------------------------------------------------
# prefetch: score_percentile


def test_score_percentile_hand_examples():
    """On a layer's first pass the running distribution is that pass's scores alone, so the
    threshold is their 80th percentile (to a histogram bin: a bin's upper edge, ~2.7% above).
    Each example uses a fresh policy: the threshold is a running one (next test)."""

    def fresh(pct=80):
        return build("prefetch", f"score_percentile(p={pct})", top_k=2, num_experts=10)

    # 10 experts, scores sorted ascending: .01 .01 .03 .05 .07 .08 .10 .15 .20 .30.
    # 80% of 10 scores is 8: the bin holding the 8th smallest (.15) gives a threshold just
    # above .15. Strictly above: .30 (expert 4), .20 (expert 9), best first.
    s = np.array([.30, .20, .15, .10, .08, .07, .05, .03, .01, .01])
    perm = np.array([4, 9, 0, 7, 2, 5, 8, 1, 3, 6])  # expert ids shuffled
    scores = np.empty(10)
    scores[perm] = s
    assert fresh().predict(spec_gate(scores, spec_layers=(1,))) == [(1, [4, 9])]
    # Peaked: one expert at .91, nine at .01: the 8th smallest is .01, threshold just above
    # .01, and only the .91 expert is above it.
    peaked = np.full(10, .01)
    peaked[6] = .91
    assert fresh().predict(spec_gate(peaked, spec_layers=(1,))) == [(1, [6])]
    # Flat: every score equals the threshold (.1); none is strictly above: nothing prefetched.
    assert fresh().predict(spec_gate(np.full(10, .1), spec_layers=(1,))) == [(1, [])]
    # Two plateaus: four experts at .2, six at .0333: the 8th smallest is .2, threshold just
    # above .2, none above it.
    two = np.array([.2] * 4 + [.2 / 6] * 6)
    assert fresh().predict(spec_gate(two, spec_layers=(1,))) == [(1, [])]
    # p=50 on the first example: the 5th smallest is .07, threshold just above it: .08 and
    # up, 5 experts.
    [(_, chosen)] = fresh(50).predict(spec_gate(scores, spec_layers=(1,)))
    assert chosen == [int(perm[i]) for i in range(5)]


def _percentile_numpy(hist, scores, p):
    """score_percentile's selection written with numpy's own searchsorted and cumsum (the
    compiled `above_percentile` must give the same, histogram included)."""
    from moejax.policies.prefetch import SCORE_BINS

    hist += np.bincount(np.searchsorted(SCORE_BINS, scores, side="right") - 1, minlength=len(hist))
    cum = np.cumsum(hist)
    b = int(np.searchsorted(cum, p / 100 * cum[-1], side="left"))
    threshold = SCORE_BINS[b + 1] if b + 1 < len(SCORE_BINS) - 1 else SCORE_BINS[-2]
    above = np.flatnonzero(scores > threshold)
    return above[np.argsort(-scores[above], kind="stable")].tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), p=st.sampled_from([0, 50, 80, 95.5, 99]),
       experts=st.integers(1, 64), calls=st.integers(1, 6), ties=st.booleans())
def test_score_percentile_compiled_selection_is_the_numpy_formula(seed, p, experts, calls,
                                                                  ties):
    from moejax.policies.prefetch import SCORE_BINS, above_percentile

    rng = np.random.default_rng(seed)
    ours = np.zeros(len(SCORE_BINS) - 1, np.int64)
    theirs = ours.copy()
    for _ in range(calls):
        scores = rng.dirichlet(np.full(experts, 0.3))
        if ties:  # equal scores, zeros and ones: the bin edges and the stable order
            scores = np.round(scores, 2)
            scores[rng.integers(experts)] = 1.0
        assert above_percentile(ours, scores, p, SCORE_BINS).tolist() == \
            _percentile_numpy(theirs, scores, p)
        assert np.array_equal(ours, theirs)


def test_score_percentile_prefill_mean_and_lookahead():
    p = build("prefetch", "score_percentile(p=50, lookahead=2)", top_k=2, num_experts=4)
    # Means over 2 tokens: row 0 [.2 .5 .25 .05] -> percentile 50 = (.2 + .25) / 2 = .225:
    # experts 1 (.5), 2 (.25). Row 1 [.4 .1 .1 .4]: median (.1 + .4) / 2 = .25: experts 0, 3.
    row0 = np.array([[.4, .4, .1, .1], [0., .6, .4, 0.]])
    row1 = np.array([[.8, .2, 0., 0.], [0., 0., .2, .8]])
    assert p.predict(spec_gate(row0, row1, spec_layers=(2, 4), tokens=2)) == \
        [(2, [1, 2]), (4, [0, 3])]


def test_score_percentile_count_adapts_to_peakedness():
    p = build("prefetch", "score_percentile(p=80)", top_k=8, num_experts=64)
    x = np.random.default_rng(0).normal(size=64)
    counts = []
    for temp in (0.01, 10.0):  # nearly flat vs one expert holding ~3/4 of the mass
        s = np.exp(temp * x - (temp * x).max())
        s /= s.sum()
        assert len(np.unique(s.astype(np.float32))) == 64  # distinct: no ties
        [(_, chosen)] = p.predict(spec_gate(s, spec_layers=(1,)))
        counts.append(len(chosen))
    assert counts[0] != counts[1], counts


# ---------------------------------------------------------------------------------------------
# miss: fetch, drop


def test_fetch_keeps_everything():
    m = build("miss", "fetch")
    ids, w = np.array([[0, 1]]), np.array([[.6, .4]], np.float32)
    d = m.handle(gate(ids, w), ids, w, set())
    np.testing.assert_array_equal(d.ids, ids)
    np.testing.assert_array_equal(d.weights, w)
    assert d.active.all() and d.dropped == 0 and d.substituted == 0


def test_drop_low_rank_missing_unless_some_token_ranks_it_high():
    m = build("miss", "drop(keep=2)")
    ids = np.array([[0, 1, 2, 7],
                    [4, 2, 5, 6],
                    [3, 0, 6, 5]])
    w = np.array([[.4, .3, .2, .1], [.4, .3, .2, .1], [.4, .3, .2, .1]], np.float32)
    resident = {6, 7}
    # Experts some token ranks 1st or 2nd ("must"): {0, 1, 4, 2, 3}.
    # token 0: 0, 1 (rank 1-2); 2 at rank 3 is missing, but token 1 ranks it 2nd: kept; 7 at
    #          rank 4 is resident: kept.
    # token 1: 5 at rank 3 is missing and nobody ranks it in the top 2: dropped; 6 resident.
    # token 2: 6 resident (rank 3) kept; 5 at rank 4 dropped.
    d = m.handle(gate(ids, w), ids, w, resident)
    expected = np.array([[1, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0]], bool)
    np.testing.assert_array_equal(d.active, expected)
    np.testing.assert_array_equal(d.weights, np.where(expected, w, 0))  # not renormalised
    np.testing.assert_array_equal(d.ids, ids)
    assert d.dropped == 1  # expert 5, dropped for two tokens, counts once
    # keep=1: "must" is {0, 4, 3}. Token 0 drops 1 and 2; token 1 drops 2 and 5; token 2
    # keeps 0 at rank 2 (token 0 ranks it 1st) and drops 5: distinct {1, 2, 5}.
    d1 = build("miss", "drop(keep=1)").handle(gate(ids, w), ids, w, resident)
    np.testing.assert_array_equal(
        d1.active, np.array([[1, 0, 0, 1], [1, 0, 0, 1], [1, 1, 1, 0]], bool))
    assert d1.dropped == 3
    # Everything resident: nothing dropped.
    d2 = m.handle(gate(ids, w), ids, w, set(range(8)))
    assert d2.active.all() and d2.dropped == 0


# ---------------------------------------------------------------------------------------------
# miss: substitute


SUB_PROBS = np.array([[.40, .25, .20, .10, .05, .00],
                      [.05, .30, .28, .27, .10, .00]])
SUB_IDS = np.array([[0, 1], [1, 2]])
SUB_W = np.array([[.6, .4], [.55, .45]], np.float32)


def test_substitute_within_tol_by_best_resident_not_already_selected():
    m = build("miss", "substitute(tol=0.1)")
    resident = {2, 3}
    # token 0: expert 0 (.40) missing; best resident not selected by the token: 2 (.20);
    #   .40 - .20 = .20 > .1: kept (fetched). Expert 1 (.25) missing: 2 again, .05 <= .1:
    #   replaced by 2 -> [0, 2].
    # token 1: expert 1 (.30) missing; 2 (.28) is the best resident but the token already
    #   selected it; next 3 (.27): .03 <= .1: replaced -> [3, 2].
    d = m.handle(gate(SUB_IDS, SUB_W, SUB_PROBS), SUB_IDS, SUB_W, resident)
    np.testing.assert_array_equal(d.ids, [[0, 2], [3, 2]])
    np.testing.assert_array_equal(d.weights, SUB_W)  # the contribution keeps its weight
    assert d.active.all()
    assert d.substituted == 1  # expert 1, replaced in both tokens, counts once
    np.testing.assert_array_equal(SUB_IDS, [[0, 1], [1, 2]])  # input not modified


def test_substitute_tol_zero_and_no_resident():
    d = build("miss", "substitute(tol=0)").handle(
        gate(SUB_IDS, SUB_W, SUB_PROBS), SUB_IDS, SUB_W, {2, 3})
    np.testing.assert_array_equal(d.ids, SUB_IDS)
    assert d.substituted == 0
    # tol=0.2 also admits token 0's expert 0 (.40 - .20 = .20); its slot then takes 2,
    # and expert 1 (now with 2 taken) gets 3 (.25 - .10 = .15).
    d = build("miss", "substitute(tol=0.2)").handle(
        gate(SUB_IDS, SUB_W, SUB_PROBS), SUB_IDS, SUB_W, {2, 3})
    np.testing.assert_array_equal(d.ids, [[2, 3], [3, 2]])
    assert d.substituted == 2
    d = build("miss", "substitute(tol=1)").handle(
        gate(SUB_IDS, SUB_W, SUB_PROBS), SUB_IDS, SUB_W, set())
    np.testing.assert_array_equal(d.ids, SUB_IDS)
    assert d.substituted == 0


def test_substitute_needs_probs():
    m = build("miss", "substitute")
    with pytest.raises(ConfigError, match="probabilities"):
        m.handle(gate(SUB_IDS, SUB_W, None), SUB_IDS, SUB_W, {2, 3})


# ---------------------------------------------------------------------------------------------
# routing: standard, cache_aware


def test_standard_is_the_router():
    r = build("routing", "standard", top_k=2, renormalize=True)
    g = gate([[0, 1]], [[.6, .4]], [[.5, .3, .2]])
    ids, w = r.select(g, {2})
    assert ids is g.ids and w is g.weights


P4 = [.5, .3, .15, .05]


@pytest.mark.parametrize("lam, cached", [(0.0, {2, 3}), (0.5, set())])
def test_cache_aware_unchanged_without_bias(lam, cached):
    r = build("routing", f"cache_aware(lam={lam})", top_k=2, renormalize=True)
    g = gate([[0, 1]], [[.625, .375]], [P4])
    ids, w = r.select(g, cached)
    np.testing.assert_array_equal(ids, g.ids)
    np.testing.assert_array_equal(w, g.weights)


def test_cache_aware_large_lam_dual_logit_weights():
    probs = [[.5, .3, .15, .05],   # token 0: router picks [0, 1]
             [.1, .2, .3, .4],     # token 1: router picks [3, 2]
             [.4, .3, .2, .1]]     # token 2: router picks [0, 1]
    ids = [[0, 1], [3, 2], [0, 1]]
    # Router weights of token 1 deliberately not the renormalised probs (.571, .429): a
    # token whose set does not change must keep the router's own values exactly.
    weights = [[.625, .375], [.6, .4], [4 / 7, 3 / 7]]
    g = gate(ids, weights, probs)
    for renorm in (True, False):
        r = build("routing", "cache_aware(lam=10)", top_k=2, renormalize=renorm)
        new_ids, w = r.select(g, {3})
        # Token 0: expert 3 (cached) jumps to the top: selection by z' is [3, 0]; weights
        # are the ORIGINAL probabilities .05 and .5, renormalised over the selection
        # (.05/.55, .5/.55) or not.
        np.testing.assert_array_equal(new_ids[0], [3, 0])
        expected = [.05 / .55, .5 / .55] if renorm else [.05, .5]
        np.testing.assert_allclose(w[0], expected, rtol=1e-6)
        # Token 1 already had 3: same set, original ids and weights exactly.
        np.testing.assert_array_equal(new_ids[1], [3, 2])
        np.testing.assert_array_equal(w[1], g.weights[1])
        # Token 2: [3, 0] with .1 and .4.
        np.testing.assert_array_equal(new_ids[2], [3, 0])
        np.testing.assert_allclose(w[2], [.2, .8] if renorm else [.1, .4], rtol=1e-6)
    # Cached {2, 3}: token 1's set {3, 2} is unchanged although z' orders it [2, 3]: the
    # router's order [3, 2] and weights are kept. Tokens 0 and 2 switch to [2, 3].
    r = build("routing", "cache_aware(lam=10)", top_k=2, renormalize=True)
    new_ids, w = r.select(g, {2, 3})
    np.testing.assert_array_equal(new_ids, [[2, 3], [3, 2], [2, 3]])
    np.testing.assert_allclose(w[0], [.75, .25], rtol=1e-6)
    np.testing.assert_array_equal(w[1], g.weights[1])
    np.testing.assert_allclose(w[2], [2 / 3, 1 / 3], rtol=1e-6)


def _select1(r, probs, cached, layer=0):
    k = int(np.argmax(probs))
    return r.select(gate([[k]], [[1.0]], [probs], layer=layer), cached)


def test_cache_aware_bias_magnitude_flip_threshold():
    # One token, top-1, probs [.5 .3 .15 .05]; expert 1 cached. delta_avg = ln .5 - ln .05 =
    # ln 10; the logit gap between expert 0 and 1 is ln(.5/.3) = ln(5/3). The selection flips
    # to expert 1 exactly when lam * ln 10 > ln(5/3), lam > 0.22185.
    lam_star = math.log(5 / 3) / math.log(10)
    assert 0.2218 < lam_star < 0.2219
    for lam, flips in [(0.221, False), (0.223, True), (0.5, True)]:
        for renorm in (True, False):
            r = build("routing", f"cache_aware(lam={lam})", top_k=1, renormalize=renorm)
            ids, w = _select1(r, P4, {1})
            assert ids.tolist() == ([[1]] if flips else [[0]]), lam
            assert r.range_sum[0] / r.range_count[0] == pytest.approx(math.log(10))
            if flips:  # weight: the original prob .3, renormalised over {1}: 1.0
                assert w[0, 0] == pytest.approx(1.0 if renorm else 0.3)
            else:
                assert w.tolist() == [[1.0]]
    # Expert 2 cached instead: gap ln(.5/.15) = ln(10/3), lam* = 0.5229.
    r = build("routing", "cache_aware(lam=0.5)", top_k=1, renormalize=True)
    assert _select1(r, P4, {2})[0].tolist() == [[0]]
    r = build("routing", "cache_aware(lam=0.53)", top_k=1, renormalize=True)
    assert _select1(r, P4, {2})[0].tolist() == [[2]]


def test_cache_aware_delta_is_running_mean_per_layer():
    flat = [.25] * 4  # per-token range 0
    # After one flat token and one P4 token on layer 0, delta_avg = (0 + ln 10) / 2, so the
    # threshold for cached expert 1 doubles to 0.4437: lam=0.3 no longer flips ...
    r = build("routing", "cache_aware(lam=0.3)", top_k=1, renormalize=True)
    _select1(r, flat, set())  # no cached experts: unchanged, but the range is recorded
    assert _select1(r, P4, {1})[0].tolist() == [[0]]
    assert r.range_sum[0] / r.range_count[0] == pytest.approx(math.log(10) / 2)
    # ... lam=0.45 does.
    r = build("routing", "cache_aware(lam=0.45)", top_k=1, renormalize=True)
    _select1(r, flat, set())
    assert _select1(r, P4, {1})[0].tolist() == [[1]]
    # Another layer's history does not count: flat on layer 7, then P4 on layer 0 with
    # lam=0.3 flips (delta_avg of layer 0 is ln 10).
    r = build("routing", "cache_aware(lam=0.3)", top_k=1, renormalize=True)
    _select1(r, flat, set(), layer=7)
    assert _select1(r, P4, {1})[0].tolist() == [[1]]
    # Several tokens in one call: delta_avg is the mean of their per-token ranges.
    r = build("routing", "cache_aware(lam=0.3)", top_k=1, renormalize=True)
    r.select(gate([[0], [0]], [[1.], [1.]], [P4, [.4, .3, .2, .1]]), {1})
    assert r.range_sum[0] / r.range_count[0] == pytest.approx((math.log(10) + math.log(4)) / 2)


def test_cache_aware_needs_probs():
    r = build("routing", "cache_aware", top_k=1, renormalize=True)
    with pytest.raises(ConfigError, match="probabilities"):
        r.select(gate([[0]], [[1.]], None), {1})
