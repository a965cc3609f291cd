"""moejax/analysis/frontier.py: the Pareto front of (speed, loss) points, the grouping of
quality rows and their baselines."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.analysis import frontier


def test_pareto_front_by_hand():
    points = [
        (100.0, 0.0),   # 0: slow, exact
        (150.0, 0.01),  # 1: faster, a little loss
        (140.0, 0.02),  # 2: dominated by 1 (slower and lossier)
        (200.0, 0.5),   # 3: fastest
        (150.0, 0.01),  # 4: equal to 1: neither dominates the other
        (150.0, 0.03),  # 5: as fast as 1, lossier: dominated
        (90.0, 0.0),    # 6: as exact as 0, slower: dominated
        (None, 0.0),    # 7: no speed: never on the front
        (300.0, math.nan),  # 8: no loss
    ]
    assert frontier.pareto_front(points) == [0, 1, 4, 3]
    assert frontier.pareto_front([]) == []
    assert frontier.pareto_front([(1.0, 1.0)]) == [0]
    # Equal speed, equal loss everywhere: all on the front, in index order.
    assert frontier.pareto_front([(1.0, 2.0), (1.0, 2.0), (1.0, 2.0)]) == [0, 1, 2]
    # Equal loss: only the fastest; equal speed: only the least lossy.
    assert frontier.pareto_front([(1.0, 0.5), (2.0, 0.5), (3.0, 0.5)]) == [2]
    assert frontier.pareto_front([(2.0, 0.3), (2.0, 0.1), (2.0, 0.2)]) == [1]
    assert frontier.dominates((2.0, 0.1), (1.0, 0.1))
    assert not frontier.dominates((1.0, 0.1), (1.0, 0.1))


_coord = st.floats(min_value=0, max_value=1e3, allow_nan=False).map(lambda x: round(x, 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_coord, _coord), max_size=30))
def test_pareto_front_properties(points):
    front = frontier.pareto_front(points)
    assert len(set(front)) == len(front)
    on = set(front)
    for i in front:  # no frontier point is dominated by any point
        assert not any(frontier.dominates(q, points[i]) for q in points)
    for i in set(range(len(points))) - on:  # every other point by some frontier point
        assert any(frontier.dominates(points[j], points[i]) for j in front)
    speeds = [points[i] for i in front]  # speed order, loss never decreasing along it
    assert speeds == sorted(speeds)


def _row(name, miss="fetch", routing="standard", precision="native", pools=None, speed=100.0,
         kl=0.0, model="embedded", capacity="5% of the model", key=(0, 0.05), gbps=5.0,
         **more):
    return {"name": name, "miss": miss, "routing": routing, "precision": precision,
            "pools": pools or precision, "decode_tok_per_s": speed, "kl_mean": kl,
            "model": model, "capacity": capacity, "capacity_key": key, "h2d_gbps": gbps,
            "eviction": "least_stale", "prefetch": "score_percentile(p=80)",
            "queue": "immediate", **more}


def test_frontier_rows_groups_and_baselines():
    rows = [
        _row("base", speed=100.0, kl=0.0),
        _row("base8", precision="int8", speed=150.0, kl=0.01),
        _row("prio", miss="fetch_priority", precision="int8", pools="int8:int4:int2",
             speed=180.0, kl=0.02),
        _row("drop", miss="drop(keep=1)", speed=120.0, kl=0.3),
        _row("ca", routing="cache_aware(lam=0.3)", speed=130.0, kl=0.005),
        _row("big", key=(0, 0.25), capacity="25% of the model", speed=400.0, kl=0.0),
        _row("mx", model="mixtral/tiny", speed=50.0, kl=0.0),
        _row("mx_ca", model="mixtral/tiny", routing="cache_aware(lam=0.1)", speed=60.0,
             kl=0.1),
        _row("phi", model="phimoe/tiny", miss="drop(keep=1)", speed=70.0, kl=0.2),
        _row("replay", kl=None),  # a replay cell: no quality, left out
    ]
    groups = frontier.frontier_rows(rows)
    assert [(g.model, g.capacity) for g in groups] == [
        ("embedded", "5% of the model"), ("embedded", "25% of the model"),
        ("mixtral/tiny", "5% of the model"), ("phimoe/tiny", "5% of the model")]
    g = groups[0]
    assert [r["name"] for r in g.rows] == ["prio", "base8", "ca", "drop", "base"]  # fastest first
    assert [r["name"] for r in g.front_rows] == ["base", "ca", "base8", "prio"]
    assert g.on_front == [True, True, True, False, True]
    base = {r["name"]: (b["name"] if b else None) for r, b in zip(g.rows, g.baselines)}
    # The cascade compares with fetch at its first pool's precision; the rest (plain fetch at
    # int8 too) with native.
    assert base == {"prio": "base8", "base8": "base", "ca": "base", "drop": "base",
                    "base": "base"}
    d_kl, ratio = frontier.relative(g.rows[3], g.baselines[3])
    assert d_kl == pytest.approx(0.3) and ratio == pytest.approx(1.2)
    assert g.label(0) == "fetch_priority [int8:int4:int2]"
    assert g.label(1) == "fetch @int8"
    assert g.label(2) == "fetch · cache_aware(lam=0.3)"
    text = "\n".join(frontier.summary(g))
    assert text.startswith("On the frontier (slowest first): fetch (100 tok/s, kl_mean 0 "
                           "(exact)); fetch · cache_aware(lam=0.3)")
    assert "drop(keep=1): kl_mean 0.3 (+0.3 vs fetch), speed 1.20x." in text
    assert "fetch_priority [int8:int4:int2]: kl_mean 0.02 (+0.01 vs fetch @int8), speed 1.20x" \
        " — on the frontier." in text
    assert "fetch @int8: kl_mean 0.01 (+0.01 vs fetch), speed 1.50x — on the frontier." in text
    assert len(frontier.summary(g, per_config=False)) == 2  # the frontier and the baseline
    assert frontier.policy_family(g.rows[1]) == "fetch @int8"
    assert frontier.policy_family(g.rows[0]) == "fetch_priority"
    # A group without a baseline says so.
    assert "+0.1 vs fetch), speed 1.20x — on the frontier." in frontier.summary(groups[2])[-1]
    assert "nothing to compare with" in frontier.summary(groups[3])[-1]
    assert groups[3].baselines == [None]


def test_a_varying_eviction_joins_the_label_and_the_baseline_key():
    rows = [_row("a", speed=10.0), _row("b", eviction="lru", speed=20.0, kl=0.1),
            _row("c", miss="drop(keep=1)", eviction="lru", speed=30.0, kl=0.2)]
    (g,) = frontier.frontier_rows(rows)
    assert g.other == ("eviction",)
    assert g.label(0) == "drop(keep=1) · lru"
    assert g.baselines[0]["name"] == "b"
