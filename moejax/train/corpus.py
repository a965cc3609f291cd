"""The three-domain byte corpus the small model learns from, built from files every CPython
install ships plus the GSM8K test split bundled with moejax (moejax/assets/gsm8k):

* prose: the Python documentation topics bundled with CPython (`pydoc_data.topics`) and IDLE's
  plain-text documents;
* code: the standard library's top-level Python sources;
* math: GSM8K problems with their worked answers.

Each domain has a deterministic held-out part (by a hash of the document name), never trained
on: training evaluates on it and the scored traces were recorded from it. Prose and code come
from the running interpreter, so both parts vary with the Python installation; tests that need
fixed held-out text use the excerpts committed in moejax/assets/heldout.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import sysconfig

import numpy as np

from moejax import bundled

DOMAINS = ("prose", "code", "math")
HELDOUT_FRACTION = 0.1
DEFAULT_GSM8K = bundled.GSM8K


def is_heldout(name: str) -> bool:
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < HELDOUT_FRACTION


def _prose_docs() -> dict[str, str]:
    import pydoc_data.topics

    docs = {f"topic:{k}": v for k, v in sorted(pydoc_data.topics.topics.items())}
    idle = os.path.join(sysconfig.get_paths()["stdlib"], "idlelib")
    for path in sorted(glob.glob(os.path.join(idle, "*.txt"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            docs[f"idle:{os.path.basename(path)}"] = f.read()
    return docs


def _code_docs() -> dict[str, str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    docs = {}
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            docs[f"stdlib:{os.path.basename(path)}"] = f.read()
    return docs


def math_docs(gsm8k_path: str) -> dict[str, str]:
    if not os.path.exists(gsm8k_path):
        raise FileNotFoundError(f"{gsm8k_path}: GSM8K split not found (set data.gsm8k_path)")
    docs = {}
    with open(gsm8k_path) as f:
        for i, line in enumerate(f):
            row = json.loads(line)
            docs[f"gsm8k:{i}"] = f"Question: {row['question']}\nAnswer: {row['answer']}\n"
    return docs


@dataclasses.dataclass
class Split:
    """One domain's documents joined by a separator, as bytes."""

    domain: str
    data: np.ndarray  # uint8
    documents: list[str]


def load_domain(domain: str, heldout: bool, gsm8k_path: str = DEFAULT_GSM8K) -> Split:
    docs = {"prose": _prose_docs, "code": _code_docs,
            "math": lambda: math_docs(gsm8k_path)}[domain]()
    names = [n for n in docs if is_heldout(n) == heldout]
    text = "\n\n".join(docs[n] for n in names)
    return Split(domain, np.frombuffer(text.encode("utf-8"), np.uint8).copy(), names)


def load_splits(heldout: bool, gsm8k_path: str = DEFAULT_GSM8K) -> dict[str, Split]:
    return {d: load_domain(d, heldout, gsm8k_path) for d in DOMAINS}


def sample_batch(splits: dict[str, Split], batch: int, seq_len: int,
                 rng: np.random.Generator) -> np.ndarray:
    """`[batch, seq_len + 1]` byte windows, domains drawn uniformly (so the small prose corpus
    is not drowned by code)."""
    out = np.empty((batch, seq_len + 1), np.int32)
    domains = rng.integers(0, len(DOMAINS), batch)
    for row, d in enumerate(domains):
        data = splits[DOMAINS[d]].data
        start = rng.integers(0, len(data) - seq_len - 1)
        out[row] = data[start:start + seq_len + 1]
    return out


def unigram_bits_per_byte(train: np.ndarray, test: np.ndarray) -> float:
    """Cross-entropy of `test` under the add-one-smoothed byte frequencies of `train`."""
    counts = np.bincount(train, minlength=256).astype(np.float64) + 1.0
    logp = np.log2(counts / counts.sum())
    return float(-logp[test].mean())
