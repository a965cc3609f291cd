"""Answer extraction and metrics of the eval tasks: pure functions (Python and the math module).

* GSM8K: `extract_strict` (the number right after the last `####`), `extract_flexible` (the last
  number in the text), `normalize_number` (commas, `$`, a leading `+`, a trailing `.`,
  trailing zeros of a fraction, `-0`), `gsm8k_match`.
* NQ-open: `normalize_answer` (SQuAD's: lower case, no punctuation, no articles a/an/the,
  single spaces) and `nq_match` (equal to any reference after normalisation).
* TruthfulQA: `mc1` (1 when the most likely choice is the true one) and `mc2` (the normalised
  probability mass of the true choices, computed with log-sum-exp).

A malformed prediction (empty, no number, `####` with nothing after it) scores 0; nothing here
raises on a prediction.

The task-level functions follow seqio's conventions, so `moejax.eval.tasks` registers them as
they are: `postprocess_*(output, example=None, is_target=False)` turns a model output or a
target into what the metrics compare, and `*_metrics(targets, predictions) -> dict` averages
over examples (fractions in [0, 1], not percentages).
"""

from __future__ import annotations

import json
import math
import re
import string
from typing import Any, Sequence

# A number as GSM8K answers write it: optional sign and dollar sign, digits with optional
# thousands separators, an optional fraction. Not inside a word or right after a decimal point.
NUMBER = re.compile(r"(?<![\w.])[-+]?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_PLAIN = re.compile(r"(-?)(\d*)(?:\.(\d*))?")


def normalize_number(text: str) -> str | None:
    """A canonical spelling of a number: "1,234" -> "1234", "$5.00" -> "5", "+3" -> "3",
    "7." -> "7", "3.50" -> "3.5", "-0" -> "0", ".5" -> "0.5"; None if `text` is not one."""
    s = text.strip().replace(",", "").replace("$", "")
    s = s[1:] if s.startswith("+") else s
    s = s[:-1] if s.endswith(".") else s
    m = _PLAIN.fullmatch(s)
    if m is None or not (m[2] or m[3]):
        return None
    whole = m[2].lstrip("0") or "0"
    frac = (m[3] or "").rstrip("0")
    out = whole + ("." + frac if frac else "")
    return out if out == "0" else m[1] + out


def extract_strict(text: str) -> str | None:
    """The number right after the last "####" (spaces or tabs between), normalised."""
    at = text.rfind("####")
    if at < 0:
        return None
    tail = text[at + 4:].lstrip(" \t")
    m = NUMBER.match(tail)
    return normalize_number(m[0]) if m else None


def extract_flexible(text: str) -> str | None:
    """The last number anywhere in the text, normalised."""
    found = NUMBER.findall(text)
    return normalize_number(found[-1]) if found else None


def gsm8k_match(target: str, prediction: str, *, flexible: bool = False) -> bool:
    """Whether the prediction's answer equals the reference's ("#### N" of the full answer)."""
    want = extract_strict(target)
    got = (extract_flexible if flexible else extract_strict)(prediction)
    return want is not None and got == want


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles removed, runs of
    whitespace one space."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def nq_match(prediction: str, answers: Sequence[str]) -> bool:
    """Normalised exact match against any reference answer (an empty prediction never)."""
    got = normalize_answer(prediction)
    return bool(got) and any(got == normalize_answer(a) for a in answers)


def logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    if math.isinf(top):
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def _check(lls: Sequence[float], labels: Sequence[int]) -> None:
    if len(lls) != len(labels) or not lls:
        raise ValueError(f"{len(lls)} log-likelihoods for {len(labels)} labels")
    if 1 not in labels:
        raise ValueError(f"labels {list(labels)} have no true choice")


def mc1(lls: Sequence[float], labels: Sequence[int]) -> float:
    """1.0 when the highest log-likelihood belongs to the choice labelled 1 (the first such
    choice wins a tie), else 0.0."""
    _check(lls, labels)
    best = max(range(len(lls)), key=lambda i: lls[i])
    return float(labels[best] == 1)


def mc2(lls: Sequence[float], labels: Sequence[int]) -> float:
    """sum(exp(ll_true)) / sum(exp(ll_all)), computed as exp(lse(true) - lse(all))."""
    _check(lls, labels)
    true = [ll for ll, label in zip(lls, labels) if label == 1]
    return math.exp(logsumexp(true) - logsumexp(lls))


# -- seqio postprocessors and metrics -----------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def example_meta(example: Any) -> dict:
    """The `meta` of a seqio example (a JSON string, bytes out of numpy) or of a plain dict."""
    meta = example["meta"]
    return meta if isinstance(meta, dict) else json.loads(_text(meta))


def postprocess_gsm8k(output: Any, example: Any = None, is_target: bool = False) -> dict:
    """Both extractions of the answer of a prediction (or of a reference)."""
    text = _text(output)
    return {"strict": extract_strict(text), "flexible": extract_flexible(text)}


def gsm8k_metrics(targets: Sequence[dict], predictions: Sequence[dict]) -> dict:
    """exact_match: strict extraction of the prediction; flexible_match: its last number;
    both against the reference's "#### N"."""
    strict = [p["strict"] is not None and p["strict"] == t["strict"]
              for t, p in zip(targets, predictions, strict=True)]
    flexible = [p["flexible"] is not None and p["flexible"] == t["strict"]
                for t, p in zip(targets, predictions, strict=True)]
    return {"exact_match": _mean(strict), "flexible_match": _mean(flexible)}


def postprocess_nq(output: Any, example: Any = None, is_target: bool = False):
    """A target becomes every reference answer of its example; a prediction its stripped text."""
    if is_target and example is not None:
        return list(example_meta(example)["answers"])
    return _text(output).strip()


def nq_metrics(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict:
    hits = [nq_match(p, t if not isinstance(t, str) else [t])
            for t, p in zip(targets, predictions, strict=True)]
    return {"exact_match": _mean(hits)}


def postprocess_strip(output: Any, example: Any = None, is_target: bool = False) -> str:
    return _text(output).strip()


def exact_match_metrics(targets: Sequence[str], predictions: Sequence[str]) -> dict:
    """Equality after stripping surrounding whitespace (an empty prediction never matches)."""
    hits = [bool(p) and p == t for t, p in zip(targets, predictions, strict=True)]
    return {"exact_match": _mean(hits)}


def postprocess_mc(output: Any, example: Any = None, is_target: bool = False):
    """A target becomes the labels of both choice lists; a prediction (the log-likelihoods of
    the choices, {"mc1": [...], "mc2": [...]}) is kept."""
    if is_target and example is not None:
        meta = example_meta(example)
        return {"mc1": meta["mc1"]["labels"], "mc2": meta["mc2"]["labels"]}
    return output


def truthfulqa_metrics(targets: Sequence[dict], predictions: Sequence[dict]) -> dict:
    pairs = list(zip(targets, predictions, strict=True))
    return {"mc1": _mean([mc1(p["mc1"], t["mc1"]) for t, p in pairs]),
            "mc2": _mean([mc2(p["mc2"], t["mc2"]) for t, p in pairs])}


def postprocess_identity(output: Any, example: Any = None, is_target: bool = False):
    return output


def bits_per_byte_metrics(targets: Sequence[Any], predictions: Sequence[dict]) -> dict:
    """Bits per byte over all texts together: their bits over their bytes (each prediction is
    {"bits": ..., "bytes": ...} of one text)."""
    bits = sum(p["bits"] for p in predictions)
    n = sum(p["bytes"] for p in predictions)
    return {"bits_per_byte": bits / n if n else float("nan")}


def _mean(values: Sequence[float]) -> float:
    return float(sum(values)) / len(values) if values else float("nan")
