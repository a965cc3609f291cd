"""Router math of each family: which experts a token uses and with what weights.

All functions take router logits `[N, E]` (float32) and return `(ids [N, K] int32,
weights [N, K] float32)`. Selection ties break to the lower expert id, as `torch.topk` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def softmax_topk(logits: jax.Array, k: int, renormalize: bool) -> tuple[jax.Array, jax.Array]:
    """OLMoE, Mixtral, Qwen-MoE: top-k of the softmax, optionally renormalised over the k."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, ids = jax.lax.top_k(probs, k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return ids.astype(jnp.int32), weights


def _masked_choice(scores: jax.Array, full: jax.Array, eps: float):
    """One sparsemixer pick (eval mode): argmax of `scores`, weighted by the softmax over the
    entries within a relative threshold of the max."""
    top = jnp.max(scores, axis=-1, keepdims=True)
    choice = jnp.argmax(scores, axis=-1)
    factor = jnp.maximum(jnp.abs(full), top)
    masked = jnp.where((top - full) / factor > 2 * eps, -jnp.inf, scores)
    gates = jax.nn.softmax(masked, axis=-1)
    weight = jnp.take_along_axis(gates, choice[:, None], axis=-1)[:, 0]
    return choice, weight


def sparsemixer_top2(logits: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """Phi-3.5-MoE's sparsemixer in eval mode: the first expert is the argmax with weight
    softmax over the experts near it; the second is the argmax after masking the first, with
    its own masked softmax. Weights are not renormalised."""
    logits = logits.astype(jnp.float32)
    first, w1 = _masked_choice(logits, logits, eps)
    without_first = jnp.where(jax.nn.one_hot(first, logits.shape[-1], dtype=bool), -jnp.inf, logits)
    second, w2 = _masked_choice(without_first, logits, eps)
    ids = jnp.stack([first, second], axis=-1).astype(jnp.int32)
    return ids, jnp.stack([w1, w2], axis=-1)


def route(logits: jax.Array, router: str, k: int, renormalize: bool,
          eps: float) -> tuple[jax.Array, jax.Array]:
    if router == "sparsemixer":
        return sparsemixer_top2(logits, eps)
    return softmax_topk(logits, k, renormalize)
