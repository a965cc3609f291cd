"""Grouped-query attention over a preallocated KV cache."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model_config import ModelConfig
from moejax.models import rope as rope_lib
from moejax.models.layers import Norm, jnp_dtype, linear


class KVCache(NamedTuple):
    """One layer's keys and values, `[B, max_len, kv_heads, head_dim]`, written in place."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, max_len: int) -> "KVCache":
        shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
        dtype = jnp_dtype(cfg.dtype)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        h, nh, kvh, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.q = linear(h, nh * hd, cfg.qkv_bias, cfg, rngs)
        self.k = linear(h, kvh * hd, cfg.qkv_bias, cfg, rngs)
        self.v = linear(h, kvh * hd, cfg.qkv_bias, cfg, rngs)
        self.o = linear(nh * hd, h, cfg.o_bias, cfg, rngs)
        if cfg.qk_norm:
            dtype = jnp_dtype(cfg.dtype)
            self.q_norm = Norm(nh * hd, "rms", cfg.norm_eps, dtype)
            self.k_norm = Norm(kvh * hd, "rms", cfg.norm_eps, dtype)

    def __call__(self, x: jax.Array, cache: KVCache, pos: jax.Array,
                 window: int | None) -> tuple[jax.Array, KVCache]:
        """`x` `[B, T, H]` at positions `pos..pos+T-1`; returns the output and the new cache."""
        cfg = self.cfg
        b, t, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.clip_qkv is not None:
            q, k, v = (jnp.clip(a, -cfg.clip_qkv, cfg.clip_qkv) for a in (q, k, v))
        q = q.reshape(b, t, cfg.num_heads, cfg.head_dim)
        k = k.reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        positions = pos + jnp.arange(t)
        cos, sin = rope_lib.cos_sin(cfg.rope, cfg.head_dim, positions)
        q, k = rope_lib.apply(q, cos, sin), rope_lib.apply(k, cos, sin)

        cache = KVCache(
            jax.lax.dynamic_update_slice_in_dim(cache.k, k.astype(cache.k.dtype), pos, axis=1),
            jax.lax.dynamic_update_slice_in_dim(cache.v, v.astype(cache.v.dtype), pos, axis=1))

        groups = cfg.num_heads // cfg.num_kv_heads
        qg = q.reshape(b, t, cfg.num_kv_heads, groups, cfg.head_dim)
        scores = jnp.einsum("btkgd,bskd->bkgts", qg, cache.k) * (cfg.head_dim ** -0.5)
        key_pos = jnp.arange(cache.k.shape[1])
        allowed = key_pos[None, :] <= positions[:, None]
        if window is not None:
            allowed &= key_pos[None, :] > positions[:, None] - window
        scores = jnp.where(allowed, scores.astype(jnp.float32), -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, cache.v)
        return self.o(out.reshape(b, t, cfg.num_heads * cfg.head_dim)), cache
