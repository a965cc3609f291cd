"""Paths of the data moejax ships inside its package (`moejax/assets/`), so that code, tests,
configs and benchmarks never reach outside the repository.

* `CAPTURES_DIR`, `capture_files()`, `capture_path(name)`: recorded routing of real models
  (OLMoE-1B-7B, Qwen1.5-MoE-A2.7B; ids only) — see `assets/captures/README.md`;
* `GSM8K`: the GSM8K test split, the math domain of the training corpus;
* `HELDOUT_DIR`, `heldout_path(name)`: fixed evaluation texts (held-out prose, code and math
  the embedded model never trained on, and an `unseen` text of none of those kinds);
* `SCORED_TRACES_DIR`: the embedded model's scored traces;
* `EMBEDDED_DIR`: the embedded model's checkpoint.
"""

from __future__ import annotations

import os

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")

CAPTURES_DIR = os.path.join(ASSETS, "captures")
CAPTURE_NAMES = ("olmoe_code", "olmoe_prose", "qwen_code", "qwen_prose")
# The model each capture was recorded from (family, moejax preset): expert sizes, cost model.
CAPTURE_MODELS = {"olmoe": ("olmoe", "olmoe-1b-7b"), "qwen": ("qwen2_moe", "qwen1.5-moe-a2.7b")}

GSM8K = os.path.join(ASSETS, "gsm8k", "gsm8k_test.jsonl")

HELDOUT_DIR = os.path.join(ASSETS, "heldout")
HELDOUT_NAMES = ("prose", "code", "math", "unseen")

SCORED_TRACES_DIR = os.path.join(ASSETS, "traces")

EMBEDDED_DIR = os.path.join(ASSETS, "small_moe")


def capture_path(name: str) -> str:
    """`name` is one of CAPTURE_NAMES, e.g. "olmoe_code"."""
    if name not in CAPTURE_NAMES:
        raise ValueError(f"capture {name!r} is not one of {CAPTURE_NAMES}")
    return os.path.join(CAPTURES_DIR, f"{name}.jsonl")


def capture_files() -> list[str]:
    """The four capture JSONL files, sorted by name."""
    return [capture_path(n) for n in CAPTURE_NAMES]


def capture_model(path: str) -> tuple[str, str]:
    """(family, preset) of the model a capture file was recorded from, from its name."""
    return CAPTURE_MODELS[os.path.basename(path).split("_")[0]]


def heldout_path(name: str) -> str:
    """`name` is one of HELDOUT_NAMES."""
    if name not in HELDOUT_NAMES:
        raise ValueError(f"held-out text {name!r} is not one of {HELDOUT_NAMES}")
    return os.path.join(HELDOUT_DIR, f"{name}.txt")

