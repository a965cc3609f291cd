"""Answer extraction and metrics of the eval tasks (moejax/eval/scoring.py): pure functions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moejax.eval import scoring
from moejax.eval.scoring import (
    extract_flexible,
    extract_strict,
    gsm8k_match,
    mc1,
    mc2,
    normalize_answer,
    normalize_number,
    nq_match,
)

REFERENCE = ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
             "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.\n#### 18")


@pytest.mark.parametrize("text,strict,flexible", [
    ("#### 18", "18", "18"),
    ("#### ", None, None),  # "####" with nothing after it
    ("####", None, None),
    ("", None, None),
    ("no number here", None, None),
    ("#### 1,234", "1234", "1234"),
    ("#### $5.00", "5", "5"),
    ("#### -3", "-3", "-3"),
    ("#### 7.", "7", "7"),
    ("#### +3", "3", "3"),
    ("#### -0", "0", "0"),
    ("#### 3.50", "3.5", "3.5"),
    ("#### 5\n#### 6", "6", "6"),  # two "####": the last one
    ("#### 5\n####", None, "5"),  # the last "####" has no number: strict fails
    ("####\n5", None, "5"),  # strict: the number right after "####", on its line
    ("####abc 4", None, "4"),
    ("The answer is 1,234.", None, "1234"),
    ("16-3-4=9 so", None, "9"),  # a minus between numbers is not a sign
    ("it costs $5.00 each", None, "5"),
    ("x = -3", None, "-3"),
    ("from 5 to 6 apples", None, "6"),
    ("1,2345", None, "2345"),  # not a thousands grouping: two numbers
    ("a list 1,2,3", None, "3"),
    (REFERENCE, "18", "18"),
])
def test_gsm8k_extraction(text, strict, flexible):
    assert extract_strict(text) == strict
    assert extract_flexible(text) == flexible


@pytest.mark.parametrize("text,expected", [
    ("1,234", "1234"), ("$5.00", "5"), ("+3", "3"), ("7.", "7"), ("3.0", "3"),
    ("3.50", "3.5"), ("-0", "0"), ("-0.0", "0"), (".5", "0.5"), ("007", "7"), ("-12", "-12"),
    (" 42 ", "42"), ("", None), ("-", None), ("abc", None), ("1.2.3", None), ("$", None),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


def test_gsm8k_match_against_the_full_reference():
    assert gsm8k_match(REFERENCE, " She makes $18 a day.\n#### 18")
    assert gsm8k_match(REFERENCE, "#### 18.00")
    assert not gsm8k_match(REFERENCE, "She makes 18 dollars")  # strict needs "####"
    assert gsm8k_match(REFERENCE, "She makes 18 dollars", flexible=True)
    assert not gsm8k_match(REFERENCE, "#### 19")
    assert not gsm8k_match(REFERENCE, "#### ")
    assert not gsm8k_match(REFERENCE, "", flexible=True)
    assert not gsm8k_match("no answer line", "#### 18")  # a reference without "####"


def test_gsm8k_metrics_in_seqio_form():
    post = scoring.postprocess_gsm8k
    targets = [post(REFERENCE, is_target=True)] * 4
    predictions = [post(p) for p in ("#### 18", "so 18", "#### 17 or 18", "")]
    assert scoring.gsm8k_metrics(targets, predictions) == {"exact_match": 0.25,
                                                           "flexible_match": 0.75}
    with pytest.raises(ValueError):  # lengths must agree
        scoring.gsm8k_metrics(targets, predictions[:2])


@pytest.mark.parametrize("text,expected", [
    ("The Beatles!", "beatles"), ("  an  Apple,  a day ", "apple day"),
    ("Guido van Rossum.", "guido van rossum"), ("THE", ""), ("theater", "theater"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_nq_match():
    assert nq_match("the  Beatles.", ["Beatles"])
    assert nq_match("Paul", ["John", "paul!"])
    assert nq_match(" an apple", ["apple"])
    assert not nq_match("banana", ["apple", "pear"])
    assert not nq_match("the beatles band", ["Beatles"])  # exact, not containment
    assert not nq_match("", ["the"])  # an empty prediction never matches
    assert not nq_match("The", ["a"])  # nor one that normalises to nothing
    example = {"meta": '{"answers": ["Guido van Rossum", "van Rossum"]}'}
    target = scoring.postprocess_nq(" Guido van Rossum", example=example, is_target=True)
    assert target == ["Guido van Rossum", "van Rossum"]
    preds = [scoring.postprocess_nq(p) for p in (" Van Rossum\n", "Guido")]
    assert scoring.nq_metrics([target, target], preds) == {"exact_match": 0.5}


def test_mc1_on_hand_made_loglikelihoods():
    assert mc1([-1.0, -2.0, -3.0], [1, 0, 0]) == 1.0
    assert mc1([-2.0, -1.0, -3.0], [1, 0, 0]) == 0.0
    assert mc1([-5.0, -4.0, -1.0], [0, 0, 1]) == 1.0
    with pytest.raises(ValueError):
        mc1([-1.0], [1, 0])


def test_mc2_equals_the_hand_computed_value():
    # (e^-1 + e^-3) / (e^-1 + e^-2 + e^-3), worked out by hand: 0.41766651 / 0.55300179
    assert mc2([-1.0, -2.0, -3.0], [1, 0, 1]) == pytest.approx(0.7552715289, abs=1e-9)
    assert mc2([-1.0, -2.0], [1, 1]) == pytest.approx(1.0)
    # Far below exp's range: a naive sum of exps is 0/0; 1 / (1 + e^-1) = 0.7310585786.
    assert mc2([-1000.0, -1001.0], [1, 0]) == pytest.approx(0.7310585786, abs=1e-9)
    targets = [{"mc1": [1, 0], "mc2": [1, 0]}, {"mc1": [0, 1], "mc2": [1, 1]}]
    preds = [{"mc1": [-1.0, -2.0], "mc2": [-1000.0, -1001.0]},
             {"mc1": [-1.0, -2.0], "mc2": [-3.0, -4.0]}]
    m = scoring.truthfulqa_metrics(targets, preds)
    assert m["mc1"] == 0.5
    assert m["mc2"] == pytest.approx((0.7310585786 + 1.0) / 2)


def test_bits_per_byte_pools_the_texts():
    preds = [{"bits": 10.0, "bytes": 5}, {"bits": 30.0, "bytes": 5}]
    assert scoring.bits_per_byte_metrics([None, None], preds) == {"bits_per_byte": 4.0}


def test_exact_match_of_stripped_text():
    post = scoring.postprocess_strip
    targets = [post(" sys"), post(" a + b")]
    assert scoring.exact_match_metrics(targets, [post("sys\n"), post(" a+b")]) == \
        {"exact_match": 0.5}
    assert scoring.exact_match_metrics([post("")], [post("  ")]) == {"exact_match": 0.0}


# -- properties ---------------------------------------------------------------------------------

numbers = st.from_regex(r"[+-]?\$?[0-9]{1,7}(\.[0-9]{0,4})?", fullmatch=True)


@given(numbers)
def test_normalize_number_is_idempotent(text):
    once = normalize_number(text)
    assert once is not None
    assert normalize_number(once) == once
    assert float(once) == pytest.approx(float(text.replace("$", "")))


@given(st.integers(-10**12, 10**12), st.sampled_from(["", "$"]), st.sampled_from(["", ".", ".00"]))
def test_numbers_with_commas_round_trip(n, dollar, tail):
    written = f"{'-' if n < 0 else ''}{dollar}{abs(n):,}{tail}"
    assert normalize_number(written) == str(n)
    assert extract_flexible(f"So the total is {written}") == str(n)
    assert extract_strict(f"reasoning 12, 7\n#### {written}") == str(n)


@given(st.text())
def test_normalize_answer_is_idempotent(text):
    once = normalize_answer(text)
    assert normalize_answer(once) == once


@given(st.text())
def test_extraction_never_raises(text):
    for value in (extract_strict(text), extract_flexible(text)):
        assert value is None or normalize_number(value) == value


@given(st.lists(st.tuples(st.floats(-50, 0), st.booleans()), min_size=1, max_size=8),
       st.floats(-100, 100))
def test_mc2_is_a_probability_and_shift_invariant(pairs, shift):
    lls = [ll for ll, _ in pairs]
    labels = [int(t) for _, t in pairs]
    labels[0] = 1
    value = mc2(lls, labels)
    assert 0.0 <= value <= 1.0 + 1e-12
    assert mc2([ll + shift for ll in lls], labels) == pytest.approx(value, rel=1e-9, abs=1e-12)
    direct = sum(math.exp(ll) for ll, t in zip(lls, labels) if t) / sum(math.exp(ll) for ll in lls)
    assert value == pytest.approx(direct, rel=1e-9, abs=1e-300)
