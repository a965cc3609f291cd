"""`moejax/json_text.py` against the standard library: `dumps(obj, default)` is
`json.dumps(obj, indent=2, default=default)` character for character on random trees of every
kind `json` encodes (and numpy values through results.json's `default`), and raises what
`json.dumps` raises where it refuses one."""

from __future__ import annotations

import enum
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moejax import json_text
from moejax.results import write_json_atomic


class Level(enum.IntEnum):
    LOW = 1


class Ratio(float):
    """A float subclass whose own repr `json` does not use."""

    def __repr__(self):
        return "ratio"


def _default(o):  # results.json's (`moejax.results`): numpy values as Python's
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 5e-324, 1e300, math.inf, -math.inf, math.nan]),
    st.text(max_size=8), st.builds(Ratio, st.floats(-10, 10)), st.just(Level.LOW),
    st.builds(np.float32, st.floats(-1e6, 1e6, width=32)), st.builds(np.int64, st.integers(0, 9)),
    st.just(np.bool_(True)))
KEYS = st.one_of(st.text(max_size=6), st.integers(-99, 99), st.floats(allow_nan=False),
                 st.sampled_from([math.inf, -math.inf, -0.0]), st.booleans(), st.none())
TREES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(KEYS, inner, max_size=5),
        st.lists(st.integers(0, 9), max_size=4).map(np.asarray)),
    max_leaves=40)


@given(TREES)
def test_the_text_is_the_standard_librarys(tree):
    assert json_text.dumps(tree, _default) == json.dumps(tree, indent=2, default=_default)


def test_what_the_standard_library_refuses_is_refused_alike():
    loop: list = [1]
    loop.append(loop)
    inside: dict = {"a": {}}
    inside["a"]["b"] = inside
    for bad, error in ((loop, ValueError), (inside, ValueError), ({(1, 2): 3}, TypeError),
                       ([object()], TypeError)):
        with pytest.raises(error) as ours:
            json_text.dumps(bad, _default)
        with pytest.raises(error) as theirs:
            json.dumps(bad, indent=2, default=_default)
        assert str(ours.value) == str(theirs.value)


def test_results_json_reads_back_as_written(tmp_path):
    obj = {"total": {"hits": np.int64(3), "rate": np.float64(0.25), "nan": math.nan},
           "per_layer": {"hits": np.arange(4)}, "passes": [{"kind": "decode", "s": 1e-3}]}
    write_json_atomic(str(tmp_path / "results.json"), obj)
    text = (tmp_path / "results.json").read_text()
    assert text == json.dumps(obj, indent=2, default=_default)
    assert json.loads(text)["per_layer"]["hits"] == [0, 1, 2, 3]
