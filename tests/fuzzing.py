"""How many examples a property test draws: `examples(n)` is n in CI and n times
`MOEJAX_FUZZ_SCALE` in a deep local run (conftest.py: the hypothesis profiles)."""

from __future__ import annotations

import os


def examples(n: int) -> int:
    scale = os.environ.get("MOEJAX_FUZZ_SCALE", "1")
    if not scale.isdigit() or int(scale) < 1:
        raise ValueError(f"MOEJAX_FUZZ_SCALE={scale!r} must be a positive integer")
    return n * int(scale)
