"""Rotary position embeddings with the Hugging Face conventions (rotate-half layout).

The frequency set of longrope is chosen per call from the largest position in it, as
transformers does, so a prefill past `original_max_position_embeddings` and the decode steps
after it see the same rotation the reference computes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from moejax.model_config import RopeConfig


def _inv_freq(theta: float, head_dim: int, factors=None) -> np.ndarray:
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    base = np.float32(theta) ** exponent
    if factors is not None:
        base = np.asarray(factors, np.float32) * base
    return (1.0 / base).astype(np.float32)


def cos_sin(rope: RopeConfig, head_dim: int, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables `[T, head_dim]` (float32) for integer `positions` `[T]`."""
    pos = positions.astype(jnp.float32)
    if rope.type == "default":
        inv, scale = jnp.asarray(_inv_freq(rope.theta, head_dim)), 1.0
    elif rope.type == "linear":
        inv, scale = jnp.asarray(_inv_freq(rope.theta, head_dim)) / rope.factor, 1.0
    elif rope.type == "longrope":
        is_long = jnp.max(positions) + 1 > rope.original_max_position_embeddings
        short = _inv_freq(rope.theta, head_dim, rope.short_factor)
        long = _inv_freq(rope.theta, head_dim, rope.long_factor)
        inv = jnp.where(is_long, long, short) if rope.long_factor_frequencies else short
        scale = jnp.where(is_long, rope.long_mscale, rope.short_mscale).astype(jnp.float32)
    else:
        raise ValueError(f"unsupported rope type {rope.type!r}")
    freqs = pos[:, None] * inv[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates `x` `[B, T, heads, head_dim]` by the tables `[T, head_dim]`."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[None, :, None, :].astype(x.dtype)
    sin = sin[None, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin
