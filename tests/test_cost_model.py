"""The virtual clock's cost model (`moejax/timing/cost.py`): the step times of every pass at
once (`CostModel.pass_times`, what the compiled replay's preparation takes) are the calls',
bit for bit, for every family's presets on every hardware preset; past int64's range it
declines, and the replay's preparation calls instead."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.families import FAMILIES, preset
from moejax.timing import hardware
from moejax.timing.cost import CostModel
from tests.fuzzing import examples

MODELS = sorted((family, name) for family, fam in FAMILIES.items() for name in fam.presets)


def _calls(cost: CostModel, tokens, context, lookahead: int):
    return (np.asarray([cost.dense_layer(t, c) for t, c in zip(tokens, context)]),
            np.asarray([cost.attention_router(t, c, lookahead) for t, c in zip(tokens, context)]),
            np.asarray([cost.embed_and_logits(t) / 2 for t in tokens]))


@settings(max_examples=examples(200), deadline=None)
@given(model=st.sampled_from(MODELS), hw=st.sampled_from(sorted(hardware.PRESETS)),
       passes=st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 10 ** 7)),
                       min_size=1, max_size=30),
       lookahead=st.integers(0, 3))
def test_every_passs_times_at_once_are_the_calls_bit_for_bit(model, hw, passes, lookahead):
    cost = CostModel(preset(*model), hardware.get(hw))
    tokens, context = (np.asarray(x, np.int64) for x in zip(*passes))
    got = cost.pass_times(tokens, context, lookahead)
    assert got is not None
    for at_once, called in zip(got, _calls(cost, tokens.tolist(), context.tolist(), lookahead),
                               strict=True):
        assert at_once.dtype == np.float64 and np.array_equal(at_once, called)


def test_terms_past_int64_are_left_to_the_calls():
    """Up to 2**62 the arrays hold the calls' integers exactly (terms past 2**53, where the
    conversion to float rounds, included); a context whose attention FLOPs pass 2**62 gets
    None (the calls' Python ints are exact there); an empty run gets empty arrays."""
    cost = CostModel(preset("mixtral", "mixtral-8x7b"), hardware.get("h200"))
    tokens, near = np.asarray([1, 2], np.int64), np.asarray([10 ** 13, 5 * 10 ** 13 + 7], np.int64)
    got = cost.pass_times(tokens, near, 1)
    assert got is not None
    assert all(np.array_equal(a, b) for a, b in zip(got, _calls(cost, [1, 2], near.tolist(), 1)))
    assert cost.pass_times(tokens, np.asarray([10, 10 ** 15], np.int64), 1) is None
    assert all(len(x) == 0 for x in cost.pass_times(np.zeros(0, np.int64),
                                                      np.zeros(0, np.int64), 1))
