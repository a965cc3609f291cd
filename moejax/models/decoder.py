"""The MoE decoder as Flax NNX modules: dense parameters only.

Routed-expert weights are not module state: they live in the host tier (and, once fetched, in
the device slot pool) and reach the expert step as arguments. That keeps the jitted steps'
inputs small and fixed in shape whatever the cache holds (STYLE.md: host-resident experts stay
out of the state that jit sees).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model_config import ModelConfig
from moejax.models.attention import Attention, KVCache
from moejax.models.layers import MLP, Norm, jnp_dtype, linear


class Router(nnx.Module):
    """The gate: logits `[N, E] = x @ kernel` (float32 out)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.proj = linear(cfg.hidden_size, cfg.num_experts, False, cfg, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj(x).astype(jnp.float32)


class DecoderLayer(nnx.Module):
    """Pre-norm block: attention, then either a routed MoE (router + shared expert; the routed
    experts come from outside) or, for Qwen's dense layers, a plain MLP."""

    def __init__(self, cfg: ModelConfig, layer: int, rngs: nnx.Rngs):
        dtype = jnp_dtype(cfg.dtype)
        self.window = cfg.sliding_window[layer]
        self.input_norm = Norm(cfg.hidden_size, cfg.norm, cfg.norm_eps, dtype)
        self.attn = Attention(cfg, rngs)
        self.post_norm = Norm(cfg.hidden_size, cfg.norm, cfg.norm_eps, dtype)
        self.is_moe = cfg.is_moe_layer(layer)
        if self.is_moe:
            self.router = Router(cfg, rngs)
            if cfg.shared_expert_intermediate_size:
                self.shared = MLP(cfg, cfg.shared_expert_intermediate_size, rngs)
                self.shared_gate = linear(cfg.hidden_size, 1, False, cfg, rngs)
        else:
            self.mlp = MLP(cfg, cfg.dense_intermediate_size, rngs)

    def attend(self, x: jax.Array, cache: KVCache, pos: jax.Array):
        """Residual stream after attention, and the normalised input of the MLP."""
        a, cache = self.attn(self.input_norm(x), cache, pos, self.window)
        h = x + a
        return h, self.post_norm(h), cache

    def shared_expert(self, h_norm: jax.Array) -> jax.Array:
        if not hasattr(self, "shared"):
            return jnp.zeros_like(h_norm)
        return jax.nn.sigmoid(self.shared_gate(h_norm)) * self.shared(h_norm)


class MoEDecoder(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp_dtype(cfg.dtype)
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=dtype,
                               embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, i, rngs) for i in range(cfg.num_layers)])
        self.final_norm = Norm(cfg.hidden_size, cfg.norm, cfg.norm_eps, dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = linear(cfg.hidden_size, cfg.vocab_size, cfg.lm_head_bias, cfg, rngs)

    def logits(self, x: jax.Array) -> jax.Array:
        x = self.final_norm(x)
        if self.cfg.tie_word_embeddings:
            return self.embed.attend(x).astype(jnp.float32)
        return self.lm_head(x).astype(jnp.float32)


def abstract_decoder(cfg: ModelConfig) -> MoEDecoder:
    """The module with shape-only parameters, for restoring a checkpoint into."""
    return nnx.eval_shape(lambda: MoEDecoder(cfg, nnx.Rngs(0)))
