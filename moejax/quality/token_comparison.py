"""Per-token comparison of two models' next-token distributions on the same tokens.

For each scored position, from the reference logits `r` and the cached model's logits `c`:

* `kl` = KL(reference ‖ cached) = Σ_v p_r(v) (log p_r(v) − log p_c(v)), in nats — how much
  probability mass the cached model moved, weighted by where the reference puts it. Identical
  logits give exactly 0 (the difference of two equal log-softmaxes is 0 in floating point).
* `agree`: the two argmaxes are the same token (what greedy decoding would emit).
* `nll_reference`, `nll_cached`: −log p(target) under each, for bits per byte of both.

`Totals` sums them over segments and summarises (mean, quantiles, bits per byte).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _compare(reference: jax.Array, cached: jax.Array, targets: jax.Array):
    lr = jax.nn.log_softmax(reference.astype(jnp.float32), axis=-1)
    lc = jax.nn.log_softmax(cached.astype(jnp.float32), axis=-1)
    kl = jnp.sum(jnp.exp(lr) * (lr - lc), axis=-1)
    agree = jnp.argmax(reference, axis=-1) == jnp.argmax(cached, axis=-1)
    pick = targets[:, None]
    nll_r = -jnp.take_along_axis(lr, pick, axis=-1)[:, 0]
    nll_c = -jnp.take_along_axis(lc, pick, axis=-1)[:, 0]
    return kl, agree, nll_r, nll_c


@dataclasses.dataclass
class TokenComparison:
    """Per scored token: position in its segment's sequence, target id and the four values."""

    targets: np.ndarray  # [T] int32
    kl: np.ndarray  # [T] float64, nats (rounding below 0 clipped: KL >= 0)
    agree: np.ndarray  # [T] bool
    nll_reference: np.ndarray  # [T] nats
    nll_cached: np.ndarray  # [T] nats


def compare(reference_logits, cached_logits, targets) -> TokenComparison:
    """`reference_logits`, `cached_logits`: `[T, V]` logits predicting `targets` `[T]`."""
    if np.shape(reference_logits) != np.shape(cached_logits):
        raise ValueError(f"logits of different shapes: {np.shape(reference_logits)} vs "
                         f"{np.shape(cached_logits)}")
    targets = np.asarray(targets, np.int32)
    kl, agree, nll_r, nll_c = (np.asarray(a) for a in _compare(
        jnp.asarray(reference_logits), jnp.asarray(cached_logits), jnp.asarray(targets)))
    # A sum of terms that are each >= 0 in exact arithmetic can round to -1e-9.
    return TokenComparison(targets, np.maximum(kl.astype(np.float64), 0.0), agree.astype(bool),
                           nll_r.astype(np.float64), nll_c.astype(np.float64))


def concat(parts: list[TokenComparison]) -> TokenComparison:
    if not parts:
        empty = np.zeros(0)
        return TokenComparison(np.zeros(0, np.int32), empty, np.zeros(0, bool), empty, empty)
    return TokenComparison(*(np.concatenate([getattr(p, f.name) for p in parts])
                             for f in dataclasses.fields(TokenComparison)))


def summary(tokens: TokenComparison, scored_bytes: int) -> dict:
    """results.json's per-text numbers: KL mean and quantiles (nats), top-1 agreement, bits
    per byte and per token of both models over the same `scored_bytes`."""
    n = len(tokens.kl)
    if n == 0:
        raise ValueError("no scored tokens")
    bits_r = float(tokens.nll_reference.sum() / math.log(2))
    bits_c = float(tokens.nll_cached.sum() / math.log(2))
    q = np.quantile(tokens.kl, [0.5, 0.9, 0.99])
    return {
        "tokens": n,
        "bytes": int(scored_bytes),
        "kl_mean": float(tokens.kl.mean()),
        "kl_p50": float(q[0]), "kl_p90": float(q[1]), "kl_p99": float(q[2]),
        "kl_max": float(tokens.kl.max()),
        "top1_agreement": float(tokens.agree.mean()),
        "bits_per_byte": bits_c / scored_bytes,
        "reference_bits_per_byte": bits_r / scored_bytes,
        "bits_per_byte_delta": (bits_c - bits_r) / scored_bytes,
        "bits_per_token": bits_c / n,
        "reference_bits_per_token": bits_r / n,
    }
