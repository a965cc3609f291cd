"""Greedy drift: the same prompts continued greedily by the reference and the cached model.

A continuation is a list of token ids; `tokens_to_divergence` is the index of the first token
where the two differ (the continuation's length when they never do). Once they differ, the two
models condition on different text, so later tokens are not compared."""

from __future__ import annotations

from typing import Sequence


def tokens_to_divergence(reference: Sequence[int], cached: Sequence[int]) -> int:
    for i, (a, b) in enumerate(zip(reference, cached)):
        if a != b:
            return i
    return min(len(reference), len(cached))


def summary(references: list[list[int]], cached: list[list[int]], prompt_tokens: list[int],
            new_tokens: int) -> dict:
    """results.json's `drift`: per prompt tokens to first divergence, the share of
    continuations identical to the reference's, and their mean."""
    if len(references) != len(cached):
        raise ValueError(f"{len(references)} reference continuations, {len(cached)} cached")
    ttd = [tokens_to_divergence(r, c) for r, c in zip(references, cached)]
    identical = [r == c for r, c in zip(references, cached)]
    return {
        "prompts": len(ttd),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "tokens_to_divergence": ttd,
        "identical_share": sum(identical) / len(identical) if identical else None,
        "mean_tokens_to_divergence": sum(ttd) / len(ttd) if ttd else None,
    }
