"""The decoder with its routed experts as trainable parameters, and the training loss.

Serving keeps experts out of the module state (they live in the host tier); training needs
them as parameters, so `TrainableMoE` holds the same `MoEDecoder` plus stacked expert weights,
and runs the same attention, router and `moe_ffn` code the serving steps run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.model_config import ModelConfig
from moejax.models import KVCache, MoEDecoder, jnp_dtype, moe_ffn, route


class TrainableMoE(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.decoder = MoEDecoder(cfg, rngs)
        n, e, h, i = cfg.num_moe_layers, cfg.num_experts, cfg.hidden_size, \
            cfg.expert_intermediate_size
        dtype = jnp_dtype(cfg.dtype)
        key_gu, key_d = rngs.params(), rngs.params()
        self.gate_up = nnx.Param(jax.random.normal(key_gu, (n, e, h, 2 * i), dtype) * h ** -0.5)
        # Residual-branch outputs start small (scaled by depth), as in GPT-2.
        self.down = nnx.Param(jax.random.normal(key_d, (n, e, i, h), dtype)
                              * (i ** -0.5) / np.sqrt(2 * cfg.num_layers))

    def __call__(self, tokens: jax.Array):
        """Logits `[B, T, V]` and per-MoE-layer router statistics for the auxiliary losses."""
        cfg = self.cfg
        b, t = tokens.shape
        x = self.decoder.embed(tokens)
        identity = jnp.arange(cfg.num_experts, dtype=jnp.int32)
        stats = []
        for l, layer in enumerate(self.decoder.layers):
            h, h_norm, _ = layer.attend(x, KVCache.zeros(cfg, b, t), jnp.int32(0))
            if not layer.is_moe:
                x = h + layer.mlp(h_norm)
                continue
            m = cfg.moe_layers.index(l)
            flat = h_norm.reshape(-1, cfg.hidden_size)
            logits = layer.router(flat)
            ids, weights = route(logits, cfg.router, cfg.top_k, cfg.norm_topk_prob,
                                 cfg.router_jitter_eps)
            y = moe_ffn(flat, ids, weights, self.gate_up[m], self.down[m], identity,
                        cfg.hidden_act, "tiled")
            x = h + (y + layer.shared_expert(flat)).reshape(h.shape)
            stats.append((logits, ids))
        return self.decoder.logits(x), stats


def load_balance_loss(logits: jax.Array, ids: jax.Array, num_experts: int) -> jax.Array:
    """Switch-Transformer auxiliary loss `E * sum_e f_e * P_e` (f: fraction of token-slots
    routed to e, P: mean router probability of e); 1.0 when perfectly balanced."""
    probs = jax.nn.softmax(logits, axis=-1)
    k = ids.shape[-1]
    f = jnp.bincount(ids.reshape(-1), length=num_experts) / (ids.shape[0] * k)
    return num_experts * jnp.sum(jax.lax.stop_gradient(f) * probs.mean(axis=0))


def router_z_loss(logits: jax.Array) -> jax.Array:
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)


def loss_fn(model: TrainableMoE, batch: jax.Array, aux_coef: float, z_coef: float):
    """Next-byte cross-entropy (nats) plus the router losses; returns (total, metrics)."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits, stats = model(inputs)
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
    e = model.cfg.num_experts
    lb = jnp.mean(jnp.stack([load_balance_loss(lg, ids, e) for lg, ids in stats]))
    z = jnp.mean(jnp.stack([router_z_loss(lg) for lg, _ in stats]))
    total = ce + aux_coef * lb + z_coef * z
    return total, {"loss/ce_nats": ce, "loss/bits_per_byte": ce / jnp.log(2.0),
                   "loss/load_balance": lb, "loss/router_z": z, "loss/total": total}
