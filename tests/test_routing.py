"""Router math: hand-worked sparsemixer and softmax top-k cases, and a property test of
`sparsemixer_top2` against transformers' PhiMoE reference implementation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moejax.models.router import route, softmax_topk, sparsemixer_top2

_sparsemixer = jax.jit(sparsemixer_top2, static_argnames=("eps",))
_softmax_topk = jax.jit(softmax_topk, static_argnames=("k", "renormalize"))


def _mixer(logits, eps=0.01):
    ids, w = _sparsemixer(jnp.asarray(logits, jnp.float32), eps=eps)
    assert ids.dtype == jnp.int32 and w.dtype == jnp.float32
    return np.asarray(ids), np.asarray(w)


# -- sparsemixer, by hand ----------------------------------------------------------------------


def test_sparsemixer_phimoe_example():
    # First pick: max 3.0; factor = max(|x|, 3) = 3 for all; (3 - x)/3 = [0, .033, 1, 1.33];
    # everything but expert 0 is > 2*eps = 0.02 -> masked, so its softmax weight is 1.
    # Second pick: max of the rest is 2.9; factor = max(|x|, 2.9) = [3, 2.9, 2.9, 2.9];
    # (2.9 - x)/factor = [-.033, 0, 1, 1.34]: expert 0 is already -inf, 2 and 3 are masked,
    # so expert 1 is alone in its softmax: weight 1.
    ids, w = _mixer([[3.0, 2.9, 0.0, -1.0]])
    np.testing.assert_array_equal(ids, [[0, 1]])
    np.testing.assert_allclose(w, [[1.0, 1.0]], rtol=0, atol=1e-7)


def test_sparsemixer_second_weight_shared():
    # logits [3.0, 2.0, 1.99, -1.0], eps = 0.01 (threshold 0.02).
    # First pick: expert 0; (3 - 2)/3 = 0.33 > 0.02 so everything else is masked: w1 = 1.
    # Second pick among [-inf, 2.0, 1.99, -1.0]: max 2.0 (expert 1);
    # factor = max(|x|, 2.0) = [3, 2, 2, 2]; (2.0 - x)/factor = [-.33, 0, 0.005, 1.5]:
    # expert 2 (0.005 <= 0.02) stays in, expert 3 is masked, expert 0 is -inf already.
    # w2 = softmax([2.0, 1.99])[0] = 1 / (1 + e^-0.01) = 0.5024999...
    ids, w = _mixer([[3.0, 2.0, 1.99, -1.0]])
    np.testing.assert_array_equal(ids, [[0, 1]])
    w2 = 1.0 / (1.0 + math.exp(-0.01))
    assert w2 < 1
    np.testing.assert_allclose(w, [[1.0, w2]], rtol=0, atol=1e-6)


def test_sparsemixer_first_weight_shared():
    # logits [3.0, 2.95, 0.0, -1.0]: (3 - 2.95)/3 = 0.0167 <= 0.02, so expert 1 stays in the
    # first softmax: w1 = softmax([3.0, 2.95])[0] = 1 / (1 + e^-0.05) = 0.51249...
    # Second pick: expert 1 alone (expert 0 is -inf, 2 and 3 are far below): w2 = 1.
    # Weights are not renormalised: they sum to more than 1.
    ids, w = _mixer([[3.0, 2.95, 0.0, -1.0]])
    np.testing.assert_array_equal(ids, [[0, 1]])
    np.testing.assert_allclose(w, [[1.0 / (1.0 + math.exp(-0.05)), 1.0]], rtol=0, atol=1e-6)


def test_sparsemixer_eps_controls_the_mask():
    # Same logits as the first-weight case with eps = 0.005 (threshold 0.01 < 0.0167):
    # expert 1 is now masked out of the first softmax, so w1 = 1.
    ids, w = _mixer([[3.0, 2.95, 0.0, -1.0]], eps=0.005)
    np.testing.assert_array_equal(ids, [[0, 1]])
    np.testing.assert_allclose(w, [[1.0, 1.0]], rtol=0, atol=1e-7)


def test_sparsemixer_order_and_ties():
    # Rows: argmax not first; a tie for the max (lower id first, as torch.max does);
    # all negative logits (factor = |x| >= |max|): max -1 (expert 2), then -1.01 (expert 0):
    # second pick factor = max(|x|, -1.01) = |x| -> (-1.01 - (-1)) / 1 < 0 for expert 2 (-inf
    # anyway), 0 for expert 0, (-1.01 + 5)/5 = 0.8 for expert 1, (-1.01 + 3)/3 = 0.66 expert 3.
    ids, w = _mixer([[0.0, 1.0, 5.0, 2.0], [2.0, 1.0, 2.0, 0.0], [-1.01, -5.0, -1.0, -3.0]])
    np.testing.assert_array_equal(ids, [[2, 3], [0, 2], [2, 0]])
    # Row 1: first pick softmax over {0, 2} (both 2.0): 0.5; second pick: expert 2 alone.
    # Row 2: first: (-1 - -1.01)/1.01 = 0.0099 <= 0.02, so expert 0 shares the first softmax.
    w_row2 = 1.0 / (1.0 + math.exp(-0.01))
    np.testing.assert_allclose(w, [[1.0, 1.0], [0.5, 1.0], [w_row2, 1.0]], rtol=0, atol=1e-6)


def test_route_dispatch():
    logits = jnp.asarray([[3.0, 2.0, 1.99, -1.0]], jnp.float32)
    ids, w = route(logits, "sparsemixer", 2, False, 0.01)
    np.testing.assert_array_equal(np.asarray(ids), [[0, 1]])
    np.testing.assert_allclose(np.asarray(w), [[1.0, 1.0 / (1.0 + math.exp(-0.01))]], atol=1e-6)
    ids, w = route(logits, "softmax_topk", 3, True, 0.01)
    np.testing.assert_array_equal(np.asarray(ids), [[0, 1, 2]])
    np.testing.assert_allclose(np.asarray(w).sum(), 1.0, atol=1e-6)


# -- softmax top-k -----------------------------------------------------------------------------


def test_softmax_topk_by_hand():
    # softmax([1, 2, 3, 0]) = e^[1,2,3,0] / (e + e^2 + e^3 + 1); top-2 = experts 2, 1.
    z = math.e + math.e**2 + math.e**3 + 1
    ids, w = _softmax_topk(jnp.asarray([[1.0, 2.0, 3.0, 0.0]]), k=2, renormalize=False)
    np.testing.assert_array_equal(np.asarray(ids), [[2, 1]])
    np.testing.assert_allclose(np.asarray(w), [[math.e**3 / z, math.e**2 / z]], rtol=1e-6)
    # Renormalised over the two: e^3 / (e^3 + e^2) = 1 / (1 + e^-1).
    ids, w = _softmax_topk(jnp.asarray([[1.0, 2.0, 3.0, 0.0]]), k=2, renormalize=True)
    np.testing.assert_array_equal(np.asarray(ids), [[2, 1]])
    p = 1.0 / (1.0 + math.exp(-1.0))
    np.testing.assert_allclose(np.asarray(w), [[p, 1.0 - p]], rtol=1e-6)


def test_softmax_topk_ties_break_low():
    ids, _ = _softmax_topk(jnp.asarray([[1.0, 2.0, 2.0, 2.0]]), k=2, renormalize=False)
    np.testing.assert_array_equal(np.asarray(ids), [[1, 2]])


def _np_softmax_topk(logits: np.ndarray, k: int, renormalize: bool):
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if renormalize:
        w = w / w.sum(-1, keepdims=True)
    return ids, w


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_softmax_topk_against_numpy(k, renormalize):
    rng = np.random.default_rng(k + 10 * renormalize)
    logits = (rng.standard_normal((32, 8)) * 3).astype(np.float32)
    ids, w = _softmax_topk(jnp.asarray(logits), k=k, renormalize=renormalize)
    want_ids, want_w = _np_softmax_topk(logits, k, renormalize)
    assert ids.shape == (32, k) and ids.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(ids), want_ids)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-7)
    if renormalize:
        np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)


# -- sparsemixer against transformers ----------------------------------------------------------

import torch  # noqa: E402  (the test extra installs it: a failure, never a skip)
from transformers.models.phimoe import modeling_phimoe as phimoe  # noqa: E402

ROWS = 8


@st.composite
def router_logits(draw):
    e = draw(st.sampled_from([2, 4, 8, 16]))
    kind = draw(st.sampled_from(["wide", "clustered", "integers"]))
    if kind == "wide":
        elems = st.floats(-8.0, 8.0, width=32, allow_subnormal=False)
    elif kind == "clustered":  # many entries within the relative threshold of the max
        elems = st.floats(2.0, 2.125, width=32)
    else:  # ties and exact zeros
        elems = st.integers(-3, 3).map(float)
    values = draw(st.lists(elems, min_size=ROWS * e, max_size=ROWS * e))
    return np.asarray(values, np.float32).reshape(ROWS, e)


@pytest.mark.slow
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(router_logits(), st.sampled_from([0.01, 0.05]))
def test_sparsemixer_matches_transformers(logits, eps):
    with torch.no_grad():
        ref_w, ref_ids = phimoe.sparsemixer(torch.from_numpy(logits.copy()), jitter_eps=eps,
                                            training=False, top_k=2)
    ref_w, ref_ids = ref_w.numpy(), ref_ids.numpy()
    ids, w = _mixer(logits, eps=eps)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-6)
    assert (ids[:, 0] != ids[:, 1]).all()
