"""Property tests of the routed-expert compute: `grouped_matmul` (tiled vs `ragged_dot` vs a
numpy loop over groups) and `moe_ffn` (vs a per-token numpy loop over the chosen experts).

Shapes are drawn from a few fixed sets so each jitted function compiles a handful of times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moejax.models.experts import grouped_matmul, moe_ffn

_gmm = jax.jit(grouped_matmul, static_argnames=("impl",))
_moe = jax.jit(moe_ffn, static_argnames=("act", "impl"))

# (G, M, K, N): one group; groups > rows (tile 1); a mid-size tile; the 128-row tile cap.
GMM_SHAPES = [(1, 5, 3, 2), (8, 3, 4, 5), (4, 37, 6, 3), (3, 16, 5, 7), (2, 300, 4, 3)]
RTOL, ATOL = 1e-5, 1e-5


def np_grouped_matmul(x: np.ndarray, w: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    out = np.zeros((x.shape[0], w.shape[2]), np.float64)
    start = 0
    for g, size in enumerate(sizes):
        out[start:start + size] = x[start:start + size].astype(np.float64) @ w[g]
        start += size
    return out  # rows past sum(sizes) stay zero


@st.composite
def group_sizes(draw, g: int, m: int) -> np.ndarray:
    kind = draw(st.sampled_from(["random", "one_group", "all", "short", "empty"]))
    if kind == "empty":
        return np.zeros(g, np.int32)
    if kind == "one_group":  # every row (or a prefix of them) in one group, the others empty
        sizes = np.zeros(g, np.int32)
        sizes[draw(st.integers(0, g - 1))] = draw(st.sampled_from([m, max(0, m - 1)]))
        return sizes
    total = {"all": m, "short": draw(st.integers(0, max(0, m - 1))),
             "random": draw(st.integers(0, m))}[kind]
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=g - 1, max_size=g - 1)))
    sizes = np.diff(np.array([0, *cuts, total])).astype(np.int32)
    assert sizes.sum() == total and (sizes >= 0).all()
    return sizes


@st.composite
def gmm_case(draw):
    g, m, k, n = draw(st.sampled_from(GMM_SHAPES))
    sizes = draw(group_sizes(g, m))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((g, k, n)).astype(np.float32)
    return x, w, sizes


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gmm_case())
def test_grouped_matmul_matches_ragged_dot_and_numpy(case):
    x, w, sizes = case
    want = np_grouped_matmul(x, w, sizes)
    tiled = np.asarray(_gmm(jnp.asarray(x), jnp.asarray(w), jnp.asarray(sizes), impl="tiled"))
    ragged = np.asarray(_gmm(jnp.asarray(x), jnp.asarray(w), jnp.asarray(sizes),
                             impl="ragged_dot"))
    assert tiled.shape == ragged.shape == want.shape
    assert tiled.dtype == np.float32
    np.testing.assert_allclose(tiled, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ragged, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(tiled, ragged, rtol=RTOL, atol=ATOL)
    # Rows past the groups are exactly zero.
    assert not tiled[sizes.sum():].any()


@pytest.mark.parametrize("sizes", [[0, 0, 0, 0], [37, 0, 0, 0], [0, 0, 0, 37], [0, 36, 0, 0],
                                   [10, 0, 11, 3], [1, 1, 1, 1]])
def test_grouped_matmul_edge_cases(sizes):
    rng = np.random.default_rng(len(sizes) + sum(sizes))
    x = rng.standard_normal((37, 6)).astype(np.float32)
    w = rng.standard_normal((4, 6, 3)).astype(np.float32)
    sizes = np.array(sizes, np.int32)
    got = np.asarray(_gmm(jnp.asarray(x), jnp.asarray(w), jnp.asarray(sizes), impl="tiled"))
    np.testing.assert_allclose(got, np_grouped_matmul(x, w, sizes), rtol=RTOL, atol=ATOL)
    assert not got[sizes.sum():].any()


def test_grouped_matmul_unknown_impl():
    with pytest.raises(ValueError, match="nope"):
        grouped_matmul(jnp.zeros((2, 3)), jnp.zeros((1, 3, 4)), jnp.array([2]), impl="nope")


# -- moe_ffn -------------------------------------------------------------------------------------


def _silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def np_moe_ffn(x, ids, weights, gate_up, down, slot_of):
    """Per token, per choice: weight * down(silu(gate(x)) * up(x)), in float64."""
    inter = gate_up.shape[-1] // 2
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            s = slot_of[ids[t, j]]
            gu = x[t].astype(np.float64) @ gate_up[s]
            h = _silu(gu[:inter]) * gu[inter:]
            out[t] += weights[t, j] * (h @ down[s])
    return out


# (tokens N, top-k K, experts E, pool slots S >= E, hidden H, intermediate I)
MOE_SHAPES = [(1, 2, 4, 6, 8, 5), (7, 2, 5, 9, 6, 4), (16, 4, 8, 11, 8, 3), (3, 1, 3, 3, 4, 6)]


@st.composite
def moe_case(draw):
    n, k, e, s, h, i = draw(st.sampled_from(MOE_SHAPES))
    seed = draw(st.integers(0, 2**31 - 1))
    distinct = draw(st.booleans())  # a router picks distinct experts; duplicates must add up too
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h)).astype(np.float32)
    if distinct:
        ids = np.stack([rng.permutation(e)[:k] for _ in range(n)]).astype(np.int32)
    else:
        ids = rng.integers(0, e, (n, k)).astype(np.int32)
    weights = rng.uniform(0.0, 1.0, (n, k)).astype(np.float32)
    gate_up = (rng.standard_normal((s, h, 2 * i)) / np.sqrt(h)).astype(np.float32)
    down = (rng.standard_normal((s, i, h)) / np.sqrt(i)).astype(np.float32)
    slot_of = rng.permutation(s)[:e].astype(np.int32)  # arbitrary distinct slots
    return x, ids, weights, gate_up, down, slot_of


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moe_case(), st.sampled_from(["tiled", "ragged_dot"]))
def test_moe_ffn_matches_per_token_loop(case, impl):
    x, ids, weights, gate_up, down, slot_of = case
    want = np_moe_ffn(x, ids, weights, gate_up, down, slot_of)
    got = np.asarray(_moe(*(jnp.asarray(a) for a in case), act="silu", impl=impl))
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_moe_ffn_reads_only_the_chosen_slots():
    """With the tiled implementation, slots not holding a chosen expert may hold anything (here
    NaN) without changing the output; a chosen expert's slot is read from where
    `slot_of` says. (`ragged_dot` is not checked: off TPU it lowers to a dense masked
    computation over every group, so a NaN anywhere in the pool reaches every row.)"""
    rng = np.random.default_rng(0)
    n, k, e, s, h, i = 7, 2, 5, 9, 6, 4
    x = rng.standard_normal((n, h)).astype(np.float32)
    ids = np.stack([rng.permutation(e)[:k] for _ in range(n)]).astype(np.int32)
    weights = rng.uniform(0, 1, (n, k)).astype(np.float32)
    gate_up = rng.standard_normal((s, h, 2 * i)).astype(np.float32) / 3
    down = rng.standard_normal((s, i, h)).astype(np.float32) / 3
    slot_of = np.array([8, 0, 5, 2, 6], np.int32)
    unused = sorted(set(range(s)) - set(slot_of[np.unique(ids)].tolist()))
    assert unused
    gate_up[unused] = np.nan
    down[unused] = np.nan
    args = (x, ids, weights, gate_up, down, slot_of)
    want = np_moe_ffn(*args)
    got = np.asarray(_moe(*(jnp.asarray(a) for a in args), act="silu", impl="tiled"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
