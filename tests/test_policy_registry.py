"""Policy spec strings (`moejax.policies.registry`): parsing, and the errors `build` gives for
unknown names, unknown/duplicate/too many arguments, non-literal arguments and bad values."""

from __future__ import annotations

import pytest

from moejax.errors import ConfigError
from moejax.policies import build, check, names, parse
from moejax.policies.registry import PLANNED

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
    # A file argument is its text, quoted or not (the shell strips quotes).
    ("trace(path=moejax/assets/captures/olmoe_code.jsonl)",
     ("trace", [], {"path": "moejax/assets/captures/olmoe_code.jsonl"})),
    ("trace(path=/tmp/t.npz)", ("trace", [], {"path": "/tmp/t.npz"})),
    ("trace(path='/tmp/a b.npz')", ("trace", [], {"path": "/tmp/a b.npz"})),
    ("trace(path=olmoe_code.jsonl)", ("trace", [], {"path": "olmoe_code.jsonl"})),
])
def test_parse(spec, expected):
    assert parse(spec) == expected


@pytest.mark.parametrize("spec", ["topk(overfetch=1.5", "lru lfu", "1 + 2", "a.b", "topk()()",
                                  "topk(overfetch=os.sep)", "trace(path=a/b"])
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


@pytest.mark.parametrize("kind, spec, message", [
    ("prefetch", "topk(overfech=1.5)", "unknown argument 'overfech'; it takes"),
    ("prefetch", "topk(top_k=4)", "unknown argument 'top_k'"),  # context, not an argument
    ("eviction", "lru(1)", "too many arguments"),
    ("miss", "drop(2, keep=3)", "'keep' given twice"),
    ("prefetch", "topk(overfetch='x')", "overfetch='x' must be a number > 0"),
    ("eviction", "no_such_policy", "unknown eviction policy 'no_such_policy'"),
])
def test_check_refuses_what_build_refuses_of_a_spec_without_the_context(kind, spec, message):
    """`check` (what `moejax.jobs.check` and a sweep's launch run, before any model is
    known) refuses a spec's names, count and kinds of arguments as `build` does."""
    with pytest.raises(ConfigError, match=message):
        check(kind, spec)
    with pytest.raises(ConfigError, match=message):
        build(kind, spec, **CTX)


def test_check_refuses_a_declared_range_without_the_model():
    """A range that is the argument's meaning is refused by `check` (what a sweep's launch
    runs), as `build` refuses it; one that depends on the model (a lookahead beyond its MoE
    layers) is not `check`'s to know."""
    for refuse in (check, lambda kind, spec: build(kind, spec, **CTX)):
        with pytest.raises(ConfigError, match=r"p=150 must be a number in \[0, 100\)"):
            refuse("prefetch", "score_percentile(p=150)")
    assert check("prefetch", "topk(lookahead=9)").__name__ == "TopKPrefetch"


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
        build("prefetch", "topk(overfetch=os.sep)", **CTX)
    assert "topk(overfetch=os.sep)" in str(e.value)
    with pytest.raises(ConfigError, match="literals"):
        parse("drop(len([1]))")


def test_bare_names_are_strings():
    # The shell strips the quotes of --config.policies.eviction=least_stale(order="cyclic").
    assert parse("least_stale(order=cyclic)") == parse('least_stale(order="cyclic")') == (
        "least_stale", [], {"order": "cyclic"})
    assert parse("fetch_priority(levels=(int8, int4))")[2] == {"levels": ("int8", "int4")}
    assert parse("drop(keep=True)")[2] == {"keep": True}  # True/False/None stay constants
    with pytest.raises(ConfigError, match="overfetch"):
        build("prefetch", "topk(overfetch=x)", **CTX)  # a string where a number is wanted


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
    ("miss", "fetch_lowest_bit"), ("miss", "fetch_priority"), ("eviction", "lhu"),
    ("miss", "drop_priority_cascade")])
def test_precision_tier_policies_are_built(kind, spec):
    assert not PLANNED
    policy = build(kind, spec, **CTX)
    assert policy.name == spec


def test_cache_precision_is_context_only():
    """The plain precision comes from the cache, never from a spec's arguments."""
    with pytest.raises(ConfigError, match="unknown argument 'cache_precision'"):
        build("miss", "fetch(cache_precision='int4')", **CTX)
    with pytest.raises(ConfigError, match="too many arguments"):
        build("miss", "fetch('int4')", **CTX)
    assert build("miss", "fetch", **CTX, cache_precision="int4").levels == ("int4",)
    assert build("miss", "fetch", **CTX).levels == ("native",)


@pytest.mark.parametrize("spec, precision, levels", [
    ("fetch_lowest_bit", "", ("int8", "int4")),
    ("fetch_lowest_bit", "int4", ("int4", "int2")),
    ("fetch_lowest_bit(levels='native:int4')", "", ("native", "int4")),
    ("fetch_priority", "", ("int8", "int4", "int2")),
    ("fetch_priority", "native", ("native", "int8", "int4", "int2")),
    ("fetch_priority", "int8", ("int8", "int4", "int2")),
    ("fetch_priority", "int4", ("int4", "int2")),
    ("fetch_priority(levels='int8:4:2')", "", ("int8", "int4", "int2")),
    ("drop_priority_cascade", "", ("int8", "int4")),
    ("substitute(tol=0.1)", "int2", ("int2",)),
])
def test_miss_policy_levels(spec, precision, levels):
    assert build("miss", spec, **CTX, cache_precision=precision).levels == levels


@pytest.mark.parametrize("spec, precision, message", [
    ("fetch_priority(levels='int4:int8')", "", "high to low"),
    ("fetch_priority(levels='int8:int4')", "int4", "start at int8, but cache.precision=int4"),
    ("fetch_priority(percentile=101)", "", "percentile=101"),
    ("fetch_priority(upgrade=1)", "", "upgrade=1"),
    ("fetch_lowest_bit(levels='fp8')", "", "fp8"),
    ("drop_priority_cascade(keep=0)", "", "keep=0"),
    ("fetch", "int3", "cache.precision='int3'"),
])
def test_bad_precision_arguments_name_the_problem(spec, precision, message):
    with pytest.raises(ConfigError, match=message):
        build("miss", spec, **CTX, cache_precision=precision)


@pytest.mark.parametrize("kind, spec", [("miss", "drop(keep=2.5)"),
                                        ("prefetch", "topk(lookahead=1.5)")])
def test_non_integer_counts_rejected_at_build(kind, spec):
    with pytest.raises(ConfigError):
        build(kind, spec, **CTX)


def test_every_spec_argument_declares_values_that_hold_its_default():
    """`ARGS` names exactly the spec arguments (the registry refuses a class otherwise), and
    each argument's default lies in the values it declares, as the fuzzers draw them."""
    from inspect import Parameter

    from moejax.policies.base import KINDS
    from moejax.policies.registry import policy_class, spec_arguments

    checked = 0
    for kind in KINDS:
        for name in names(kind):
            cls = policy_class(kind, name)
            assert set(cls.ARGS) == set(spec_arguments(cls)), (kind, name)
            for arg, default in spec_arguments(cls).items():
                assert default is not Parameter.empty, f"{kind} {name}: {arg} has no default"
                assert cls.ARGS[arg].contains(default), (kind, name, arg, default)
                checked += 1
    assert checked >= 15
