"""`noisy_oracle`'s compiled perturbation (`moejax/policies/seeded_draws.py`) against numpy's own
generator: every group's draws equal `NoisyOraclePrefetch.perturbed`'s, which seeds
`np.random.default_rng([seed, pass_id, target])` and draws from it."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from moejax.policies import seeded_draws
from moejax.policies.prefetch import NoisyOraclePrefetch

WORD = 2 ** 32 - 1


@st.composite
def groups(draw):
    """A noisy oracle and groups of true experts (distinct within a group) with their
    pass ids and targets, every seed word anywhere in 32 bits."""
    num_experts = draw(st.integers(1, 160))
    precision = draw(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)))
    seed = draw(st.one_of(st.just(0), st.integers(0, WORD)))
    policy = NoisyOraclePrefetch(num_experts, precision, seed=seed)
    n = draw(st.integers(0, 12))
    pass_ids = draw(st.lists(st.one_of(st.integers(0, 4096), st.integers(0, WORD)),
                             min_size=n, max_size=n))
    targets = draw(st.lists(st.integers(0, WORD), min_size=n, max_size=n))
    true = [draw(st.lists(st.integers(0, num_experts - 1), unique=True,
                          max_size=num_experts)) for _ in range(n)]
    return policy, pass_ids, targets, true


def _numpy(policy, pass_ids, targets, true) -> list[int]:
    """The policy's own draws, group by group (`perturbed`: numpy's generator)."""
    return [e for p, t, g in zip(pass_ids, targets, true) for e in policy.perturbed(p, t, g)]


def _compiled(policy, pass_ids, targets, true) -> list[int]:
    bounds = np.cumsum([0] + [len(g) for g in true])
    experts = np.asarray([e for g in true for e in g], np.int64)
    return seeded_draws.perturb_groups(policy.seed, policy.precision, policy.num_experts,
                                       np.asarray(pass_ids, np.int64),
                                       np.asarray(targets, np.int64), experts,
                                       bounds.astype(np.int64)).tolist()


@given(groups())
def test_the_compiled_draws_are_numpys(case):
    assert _compiled(*case) == _numpy(*case)


def test_a_rejected_bounded_draw_is_drawn_again_as_numpy_does():
    # Lemire's method rejects a 32-bit draw with probability below n / 2**32 (n: the wrong
    # experts left), too rare for the examples above to meet. This seed (found by searching
    # the passes) rejects the first bounded draw: the replacement for expert 0.
    policy = NoisyOraclePrefetch(1_500_000, 0.0)
    case = (policy, [432], [0], [list(range(8))])
    assert _compiled(*case) == _numpy(*case)


def test_the_groups_method_takes_numpys_draws_where_a_seed_word_is_wider():
    # A seed word of 2**32 or more is two words to numpy: the policy's method draws those
    # groups with numpy itself.
    policy = NoisyOraclePrefetch(16, 0.3, seed=2 ** 40)
    assert not seeded_draws.fits(policy.seed)
    true = [[1, 2, 3], [4, 5], [0, 15]]
    bounds = np.asarray([0, 3, 5, 7], np.int64)
    got = policy.perturbed_groups(np.asarray([0, 1, 2 ** 33], np.int64),
                                  np.asarray([3, 4, 5], np.int64),
                                  np.asarray([e for g in true for e in g], np.int64), bounds)
    assert got.tolist() == _numpy(policy, [0, 1, 2 ** 33], [3, 4, 5], true)
