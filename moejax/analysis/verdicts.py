"""The words a claim's verdict is made of, defined once (docs/DESIGN.md, "Verdict words").

A claim is its whole statement: every metric its source states, each compared between the
claimed policy and its baseline (`Check`), and, where the source gives a number, that number
held to a band (`Band`). `judge` turns a trace's checks and band into one word:

* **refuted on M** — a stated metric M goes the other way (every such metric is named);
* **tie** — every stated metric is equal, exactly or within the trace's own noise (`tied`);
* **partly (tie on M)** — none goes the other way, but M, which the source says improves, is
  equal (a metric the source only says is not worse, `Check.must_improve=False`, may tie);
* for a numeric claim (the band *is* the claim: a factor, a hit rate, a speedup) with every
  other metric the stated way: the band's word, **within** / **exceeds** / **falls short**
  (of the band, on the claim's side: "exceeds" is better than the source's number);
* otherwise **reproduced** — every stated metric goes the stated way; a directional claim with
  a band beside it is **partly (falls short of <band>)** when its number misses the band;
* **structural** — equal by construction (the rule that makes it so is printed), decided before
  the numbers are read (`judge(structural=...)`);
* **not testable** — a metric the claim needs is not measured here (why).

Across traces (`across`): one word when every trace has it; otherwise **mixed**, with every
word's count, listed in `WORDS` order, never headed by the majority.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Iterable

REPRODUCED = "reproduced"
REFUTED = "refuted"
PARTLY = "partly"
TIE = "tie"
STRUCTURAL = "structural"
NOT_TESTABLE = "not testable"
WITHIN = "within"
EXCEEDS = "exceeds"
FALLS_SHORT = "falls short"
MIXED = "mixed"
# Every verdict's first word, in the order `across` lists them.
WORDS = (REPRODUCED, EXCEEDS, WITHIN, PARTLY, TIE, FALLS_SHORT, REFUTED, STRUCTURAL,
         NOT_TESTABLE)
# Two modelled times within this share of each other are one (float sums of one schedule).
TIME_TIE = 1e-9
# A rate's noise on a trace: this many binomial standard errors over the trace's requests.
RATE_NOISE_SE = 2.0


def rate_noise(rate: float | None, n: int | None) -> float:
    """The noise of a rate measured over `n` requests: RATE_NOISE_SE binomial standard errors
    (the trace's length is its sample; a replay itself is deterministic). 0 when unknown."""
    if rate is None or not n or n <= 0:
        return 0.0
    return RATE_NOISE_SE * math.sqrt(max(rate * (1.0 - rate), 0.0) / n)


def tied(a: float, b: float, noise: float = 0.0) -> bool:
    """Equal exactly, within `noise` (absolute), or within TIME_TIE of each other."""
    return a == b or abs(a - b) <= max(noise, TIME_TIE * max(abs(a), abs(b)))


@dataclasses.dataclass(frozen=True)
class Check:
    """One stated metric, the claimed policy's value against its baseline's."""

    metric: str  # as printed: "collisions", "hit rate", "TTFT", "decode time"
    claimed: float | None
    baseline: float | None
    lower_is_better: bool
    noise: float = 0.0  # absolute: a difference within it is a tie
    # The source states it improves (a tie is not its stated way); False: only that it is
    # not worse (a tie goes the stated way).
    must_improve: bool = True

    @property
    def outcome(self) -> str | None:
        """"better", "worse", "tie", or None when either value is unknown."""
        if self.claimed is None or self.baseline is None:
            return None
        if tied(self.claimed, self.baseline, self.noise):
            return "tie"
        better = self.claimed < self.baseline if self.lower_is_better else (
            self.claimed > self.baseline)
        return "better" if better else "worse"


@dataclasses.dataclass(frozen=True)
class Band:
    """The source's number for a metric: a range [low, high], or a point ±POINT_BAND."""

    metric: str
    low: float
    high: float
    lower_is_better: bool
    text: str  # as the source states it: "2–3×", "≈2× (±25%)"

    def word(self, value: float | None) -> str | None:
        """within / exceeds (better than the band) / falls short; None when unknown."""
        if value is None or math.isnan(value):
            return None
        if self.low <= value <= self.high:
            return WITHIN
        above = value > self.high
        return EXCEEDS if above != self.lower_is_better else FALLS_SHORT


POINT_BAND = 0.25  # a point figure's band: the source's number ±25%


def point(metric: str, value: float, lower_is_better: bool, text: str) -> Band:
    """A band of ±POINT_BAND around a point figure `value` (ordered for negative values)."""
    a, b = sorted((value * (1 - POINT_BAND), value * (1 + POINT_BAND)))
    return Band(metric, a, b, lower_is_better, f"{text} (±{POINT_BAND:.0%})")


@dataclasses.dataclass(frozen=True)
class Verdict:
    word: str
    failing_metric: str | None  # the first stated metric that fails, or None
    rule: str  # what decided it, in words


def judge(checks: Iterable[Check], band: Band | None = None, value: float | None = None,
          numeric: bool = False, structural: str | None = None) -> Verdict:
    """One trace's verdict on a claim: its `checks` (every stated metric), and the band
    `band` its number `value` is held to (`numeric`: the band is the claim itself)."""
    checks = list(checks)
    if structural:
        return Verdict(STRUCTURAL, None, structural)
    unknown = [c.metric for c in checks if c.outcome is None]
    if band is not None and value is None:
        unknown.append(band.metric)
    if unknown:
        return Verdict(f"{NOT_TESTABLE} (no {', '.join(unknown)})", unknown[0],
                       f"{', '.join(unknown)} not measured")
    worse = [c.metric for c in checks if c.outcome == "worse"]
    ties = [c.metric for c in checks if c.outcome == "tie" and c.must_improve]
    stated = "; ".join(_check_text(c) for c in checks)
    if worse:
        return Verdict(f"{REFUTED} on {' and '.join(worse)}", worse[0], stated)
    if checks and all(c.outcome == "tie" for c in checks):
        return Verdict(TIE, None, stated)
    band_word = band.word(value) if band is not None else None
    band_rule = f"{band.metric} {_num(value)} against {band.text}: {band_word}" if band else ""
    rule = "; ".join(x for x in (stated, band_rule) if x)
    if ties:
        return Verdict(f"{PARTLY} (tie on {' and '.join(ties)})", ties[0], rule)
    if numeric and band_word is not None:
        return Verdict(band_word, band.metric if band_word == FALLS_SHORT else None, rule)
    if band_word == FALLS_SHORT:
        return Verdict(f"{PARTLY} (falls short of {band.text} on {band.metric})", band.metric,
                       rule)
    return Verdict(REPRODUCED, None, rule)


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def _check_text(c: Check) -> str:
    side = ("lower" if c.lower_is_better else "higher") + (
        "" if c.must_improve else ", not worse is enough")
    noise = f", noise ±{_num(c.noise)}" if c.noise else ""
    return (f"{c.metric} {_num(c.claimed)} vs {_num(c.baseline)} ({side} is better"
            f"{noise}): {c.outcome}")


def first_word(word: str) -> str:
    """The verdict word a full verdict starts with ("refuted on hit rate" -> "refuted")."""
    for w in sorted(WORDS, key=len, reverse=True):
        if word.startswith(w):
            return w
    return word


def word_order(word: str) -> tuple:
    """A sort key putting verdicts in `WORDS` order (unknown words last, by name)."""
    first = first_word(word)
    return (WORDS.index(first) if first in WORDS else len(WORDS), word)


def across(words: dict[str, str], missing: Iterable[str] = ()) -> str:
    """A group's word from its traces' (`words`: trace -> verdict): the one word when every
    trace has it and none is missing; else "mixed: <word> on N, <word> on M of T traces",
    every word listed in `WORDS` order (never led by the most common), then the missing."""
    missing = sorted(missing)
    if not words:
        return f"{NOT_TESTABLE} (no trace has the cells)" if missing else ""
    counts = collections.Counter(words.values())
    if len(counts) == 1 and not missing:
        return next(iter(counts))
    order = sorted(counts, key=word_order)
    total = len(words) + len(missing)
    head = MIXED if len(counts) > 1 else f"{order[0]} on {counts[order[0]]}"
    parts = ", ".join(f"{w} on {counts[w]}" for w in order) if len(counts) > 1 else ""
    text = f"{head}: {parts} of {total} traces" if parts else f"{head} of {total} traces"
    return text + (f"; missing: {', '.join(missing)}" if missing else "")
