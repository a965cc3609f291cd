"""The verdict words (moejax/analysis/verdicts.py), as properties: a verdict is refuted exactly
when a stated metric goes the other way, and names every such metric in the claim's order;
"reproduced" needs every stated metric the stated way; a band's word is within exactly inside
it; a group's word is one word only when every trace has it, and a mixed group lists every
word's count in the fixed order, never led by the majority."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.analysis import verdicts as V
from tests.fuzzing import examples

VALUES = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def _checks(draw):
    """Checks whose outcome is drawn first and then built into the numbers: each check's
    (outcome, check), the claimed value on the drawn side of its baseline by at least 0.01
    (far beyond a tie's float tolerance), or equal to it for a tie."""
    out = []
    for i in range(draw(st.integers(1, 4))):
        outcome = draw(st.sampled_from(("better", "worse", "tie")))
        lower = draw(st.booleans())
        baseline = draw(st.floats(0.2, 0.8))
        step = draw(st.floats(0.01, 0.2))
        up = (outcome == "better") != lower  # a higher value: better unless lower is better
        claimed = baseline if outcome == "tie" else baseline + (step if up else -step)
        out.append((outcome, V.Check(f"m{i}", claimed, baseline, lower,
                                     must_improve=draw(st.booleans()))))
    return out


@settings(max_examples=examples(300))
@given(_checks())
def test_a_verdict_is_the_conjunction_of_its_stated_metrics(drawn):
    checks = [c for _, c in drawn]
    v = V.judge(checks)
    worse = [c.metric for o, c in drawn if o == "worse"]
    must_tie = [c.metric for o, c in drawn if o == "tie" and c.must_improve]
    if worse:  # every metric the other way, named in the claim's order
        assert v.word == "refuted on " + " and ".join(worse)
        assert v.failing_metric == worse[0]
    elif all(o == "tie" for o, _ in drawn):
        assert v.word == V.TIE
    elif must_tie:  # a stated improvement that did not happen
        assert v.word == "partly (tie on " + " and ".join(must_tie) + ")"
        assert v.failing_metric == must_tie[0]
    else:  # every metric the stated way (a tie where not being worse is enough)
        assert v.word == V.REPRODUCED and v.failing_metric is None
    for c in checks:
        assert c.metric in v.rule


@settings(max_examples=examples(300))
@given(VALUES, VALUES, VALUES, st.booleans())
def test_a_band_is_within_inside_and_names_the_better_side(a, b, x, lower):
    low, high = sorted((a, b))
    band = V.Band("m", low, high, lower, "text")
    word = band.word(x)
    if x > high:
        assert word == (V.FALLS_SHORT if lower else V.EXCEEDS)
    elif x < low:
        assert word == (V.EXCEEDS if lower else V.FALLS_SHORT)
    else:
        assert word == V.WITHIN


def test_a_point_band_is_a_quarter_either_side_and_ordered_for_negatives():
    b = V.point("speedup", 1.26, False, "≈1.26×")
    assert math.isclose(b.low, 0.945) and math.isclose(b.high, 1.575)
    assert b.text == "≈1.26× (±25%)"
    assert b.word(20.4) == V.EXCEEDS and b.word(1.3) == V.WITHIN and b.word(0.9) == (
        V.FALLS_SHORT)
    d = V.point("ΔTTFT", -10.7, True, "-10.7%")
    assert math.isclose(d.low, -13.375) and math.isclose(d.high, -8.025)
    assert d.word(-20) == V.EXCEEDS and d.word(-3) == V.FALLS_SHORT


def test_a_numeric_claim_gets_its_bands_word_once_its_other_metrics_hold():
    band = V.Band("factor", 2.6, 8.6, False, "2.6–8.6×")
    good = [V.Check("collisions", 0.01, 0.05, True)]
    assert V.judge(good, band, 20.0, numeric=True).word == V.EXCEEDS
    assert V.judge(good, band, 1.5, numeric=True).word == V.FALLS_SHORT
    bad = good + [V.Check("hit rate", 0.29, 0.95, False)]
    v = V.judge(bad, band, 20.0, numeric=True)
    assert (v.word, v.failing_metric) == ("refuted on hit rate", "hit rate")
    assert V.judge(good, band, None, numeric=True).word == "not testable (no factor)"
    assert V.judge(good, structural="a rule").word == V.STRUCTURAL


def test_a_rates_noise_is_two_standard_errors_over_its_requests():
    assert V.rate_noise(0.5, 10000) == 2 * math.sqrt(0.25 / 10000)
    assert V.rate_noise(None, 100) == 0.0 and V.rate_noise(0.5, 0) == 0.0
    noisy = V.Check("hit rate", 0.505, 0.5, False, noise=V.rate_noise(0.5, 10000))
    assert noisy.outcome == "tie"
    assert V.Check("hit rate", 0.52, 0.5, False, noise=V.rate_noise(0.5, 10000)).outcome == (
        "better")


WORD_POOL = ("reproduced", "refuted on hit rate", "refuted on collisions", "tie", "within",
             "exceeds", "falls short", "partly (tie on TTFT)", "structural")


@settings(max_examples=examples(300))
@given(st.lists(st.sampled_from(WORD_POOL), min_size=1, max_size=6),
       st.lists(st.sampled_from(("m1", "m2")), max_size=2, unique=True))
def test_a_groups_word_needs_every_trace_and_a_mix_is_never_led_by_one_side(words, missing):
    per = {f"t{i}": w for i, w in enumerate(words)}
    got = V.across(per, missing)
    if len(set(words)) == 1 and not missing:
        assert got == words[0]
        return
    total = len(words) + len(missing)
    assert f" of {total} traces" in got
    if len(set(words)) > 1:
        assert got.startswith("mixed: ")
        listed = got[len("mixed: "):].split(f" of {total} traces")[0].split(", ")
        # Every word with its count, in WORDS order (not by count).
        counts = {w.rsplit(" on ", 1)[0]: int(w.rsplit(" on ", 1)[1]) for w in listed}
        assert counts == {w: words.count(w) for w in set(words)}
        ranks = [V.WORDS.index(V.first_word(w)) for w in counts]
        assert ranks == sorted(ranks)
    for m in missing:
        assert m in got.split("missing: ")[1]
