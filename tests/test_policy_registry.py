"""Policy spec strings (`moejax.policies.registry`): parsing, and the errors `build` gives for
unknown names, unknown/duplicate/too many arguments, non-literal arguments and bad values."""

from __future__ import annotations

import pytest

from moejax.config import ConfigError
from moejax.policies import build, names, parse

CTX = dict(num_layers=3, num_experts=8, top_k=2, num_slots=6, seed=0, renormalize=True)


@pytest.mark.parametrize("spec, expected", [
    ("lru", ("lru", [], {})),
    ("  lru  ", ("lru", [], {})),
    ("lru()", ("lru", [], {})),
    ("topk(overfetch=1.5)", ("topk", [], {"overfetch": 1.5})),
    ("score_percentile(80)", ("score_percentile", [80], {})),
    ("cache_aware(lam=0.3)", ("cache_aware", [], {"lam": 0.3})),
    ("topk(1.5, lookahead=2)", ("topk", [1.5], {"lookahead": 2})),
    ("topk(overfetch=-1)", ("topk", [], {"overfetch": -1})),
])
def test_parse(spec, expected):
    assert parse(spec) == expected


@pytest.mark.parametrize("spec", ["topk(overfetch=1.5", "lru lfu", "1 + 2", "a.b", "topk()()"])
def test_parse_rejects_malformed(spec):
    with pytest.raises(ConfigError, match="policy spec"):
        parse(spec)


def test_names():
    ev = names("eviction")
    for n in ["lru", "lru_per_layer", "lfu", "fld", "score", "least_stale", "fifo", "random"]:
        assert n in ev
    assert ev == sorted(ev)
    assert {"none", "topk", "score_percentile"} <= set(names("prefetch"))
    assert {"fetch", "drop", "substitute"} <= set(names("miss"))
    assert {"standard", "cache_aware"} <= set(names("routing"))
    assert names("no_such_kind") == []


def test_build_positional_and_keyword_args():
    # Positional arguments fill the user parameters in order (context ones excluded).
    p = build("prefetch", "topk(1.5, 2)", **CTX)
    assert (p.count, p.lookahead) == (3, 2)  # round(2 * 1.5) = 3
    p = build("prefetch", "score_percentile(80)", **CTX)
    assert p.p == 80
    r = build("routing", "cache_aware(0.25)", **CTX)
    assert (r.lam, r.top_k, r.renormalize) == (0.25, 2, True)
    # Context a constructor does not declare is not passed.
    assert build("miss", "drop(keep=3)", **CTX).keep == 3
    assert build("eviction", "random", **{**CTX, "seed": 7}).name == "random"


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ConfigError) as e:
        build("eviction", "least_recent", **CTX)
    msg = str(e.value)
    assert "least_recent" in msg
    for n in ["lru", "least_stale", "fld", "fifo", "random"]:
        assert repr(n) in msg


def test_unknown_argument_named_with_valid_ones():
    with pytest.raises(ConfigError) as e:
        build("prefetch", "topk(overfech=1.5)", **CTX)
    msg = str(e.value)
    assert "'overfech'" in msg and "topk(overfech=1.5)" in msg
    assert "'overfetch'" in msg and "'lookahead'" in msg
    # Context parameters are not user arguments.
    with pytest.raises(ConfigError, match="unknown argument 'top_k'"):
        build("prefetch", "topk(top_k=4)", **CTX)
    with pytest.raises(ConfigError, match="unknown argument 'seed'"):
        build("eviction", "random(seed=3)", **CTX)


def test_too_many_and_duplicate_args():
    with pytest.raises(ConfigError, match="too many arguments"):
        build("miss", "drop(1, 2)", **CTX)
    with pytest.raises(ConfigError, match="too many arguments"):
        build("eviction", "lru(1)", **CTX)
    with pytest.raises(ConfigError, match="'keep' given twice"):
        build("miss", "drop(2, keep=3)", **CTX)


@pytest.mark.parametrize("spec", ["drop(keep=2, keep=3)", "topk(overfetch=1.0, overfetch=1.5)"])
def test_duplicate_keyword_rejected(spec):
    with pytest.raises(ConfigError, match="twice"):
        build("miss" if spec.startswith("drop") else "prefetch", spec, **CTX)


def test_non_literal_args():
    with pytest.raises(ConfigError, match="literals") as e:
        build("prefetch", "topk(overfetch=x)", **CTX)
    assert "topk(overfetch=x)" in str(e.value)
    with pytest.raises(ConfigError, match="literals"):
        parse("drop(len([1]))")


@pytest.mark.parametrize("kind, spec", [
    ("prefetch", "topk(overfetch=-1)"),
    ("prefetch", "topk(overfetch=0)"),
    ("prefetch", "topk(lookahead=0)"),
    ("prefetch", "score_percentile(p=100)"),
    ("prefetch", "score_percentile(p=-1)"),
    ("prefetch", "topk(overfetch='a')"),  # a TypeError inside the constructor
    ("miss", "drop(keep=0)"),
    ("miss", "substitute(tol=-1)"),
    ("routing", "cache_aware(lam=-0.1)"),
])
def test_bad_values_name_the_spec(kind, spec):
    with pytest.raises(ConfigError) as e:
        build(kind, spec, **CTX)
    assert spec in str(e.value)


@pytest.mark.parametrize("kind, spec", [
    ("miss", "fetch_lowest_bit"), ("miss", "fetch_priority"), ("eviction", "lhu")])
def test_quantized_tier_policies_refuse(kind, spec):
    with pytest.raises(ConfigError, match="quantized"):
        build(kind, spec, **CTX)


@pytest.mark.parametrize("kind, spec", [("miss", "drop(keep=2.5)"),
                                        ("prefetch", "topk(lookahead=1.5)")])
def test_non_integer_counts_rejected_at_build(kind, spec):
    with pytest.raises(ConfigError):
        build(kind, spec, **CTX)
