"""Paths of the data moejax ships inside its package (`moejax/assets/`), so that code, tests,
configs and benchmarks never reach outside the repository.

* `CAPTURES_DIR`, `capture_files()`, `capture_path(name)`: recorded routing of real models
  (OLMoE-1B-7B, Qwen1.5-MoE-A2.7B; ids only) — see `assets/captures/README.md`;
* `GSM8K`: the GSM8K test split, the math domain of the training corpus;
* `HELDOUT_DIR`, `heldout_path(name)`: fixed evaluation texts (held-out prose, code and math
  the embedded model never trained on, and an `unseen` text of none of those kinds);
* `SCORED_TRACES_DIR`, `scored_trace_files()`: the embedded model's six short scored traces
  (`{prose,code,math}_{0,1}.npz`: 64-token prompt, 192 decode steps) — see
  `assets/traces/README.md`;
* `LONG_TRACES_DIR`, `long_trace_files()`, `long_trace_path(domain)`: one scored trace of the
  embedded model per domain, as long as its context (1024 tokens);
* `FAMILY_TRACES_DIR`, `family_trace_files(family)`, `family_trace_path(family, domain)`:
  scored traces of each family's `tiny` preset with **random weights** (architecture-dependent
  routing only: top-k, expert count, shared experts, router normalisation — not learned);
* `EMBEDDED`, `EMBEDDED_DIR`: the embedded model's `model.preset` name and its checkpoint.
"""

from __future__ import annotations

import glob
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
TRACE_DOMAINS = ("prose", "code", "math")
# Subfolders of SCORED_TRACES_DIR (a glob of SCORED_TRACES_DIR/*.npz sees the six short ones only).
LONG_TRACES_DIR = os.path.join(SCORED_TRACES_DIR, "long")
FAMILY_TRACES_DIR = os.path.join(SCORED_TRACES_DIR, "families")
# moejax.families.FAMILIES names, one subfolder of FAMILY_TRACES_DIR each.
TRACE_FAMILIES = ("mixtral", "olmoe", "phimoe", "qwen2_moe")

EMBEDDED = "embedded"  # `model.preset` of the embedded model
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


def capture_overrides(path: str) -> dict:
    """How the replay grids (`studies/*/grid_*.py`) replay capture `path`: on the model it was
    recorded from, its decode steps as requests of 128 tokens, each with a 32-token prefill."""
    family, preset = capture_model(path)
    return {"model.family": family, "model.preset": preset, "replay.request_tokens": 128,
            "replay.prefill_tokens": 32}


def heldout_path(name: str) -> str:
    """`name` is one of HELDOUT_NAMES."""
    if name not in HELDOUT_NAMES:
        raise ValueError(f"held-out text {name!r} is not one of {HELDOUT_NAMES}")
    return os.path.join(HELDOUT_DIR, f"{name}.txt")



def _domain(domain: str) -> str:
    if domain not in TRACE_DOMAINS:
        raise ValueError(f"domain {domain!r} is not one of {TRACE_DOMAINS}")
    return domain


def scored_trace_files() -> list[str]:
    """The embedded model's six short scored traces, sorted by path."""
    return sorted(glob.glob(os.path.join(SCORED_TRACES_DIR, "*.npz")))


def long_trace_path(domain: str) -> str:
    """`domain` is one of TRACE_DOMAINS."""
    return os.path.join(LONG_TRACES_DIR, f"{_domain(domain)}.npz")


def long_trace_files() -> list[str]:
    """The embedded model's three long scored traces, sorted by path."""
    return sorted(long_trace_path(d) for d in TRACE_DOMAINS)


def family_trace_path(family: str, domain: str = "prose") -> str:
    """`family` is one of TRACE_FAMILIES, `domain` one of TRACE_DOMAINS."""
    if family not in TRACE_FAMILIES:
        raise ValueError(f"family {family!r} is not one of {TRACE_FAMILIES}")
    return os.path.join(FAMILY_TRACES_DIR, family, f"{_domain(domain)}.npz")


def family_trace_files(family: str | None = None) -> list[str]:
    """The random-weight family traces (every family's, or one family's), sorted by path."""
    families = TRACE_FAMILIES if family is None else (family,)
    return sorted(family_trace_path(f, d) for f in families for d in TRACE_DOMAINS)
