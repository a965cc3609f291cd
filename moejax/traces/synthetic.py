"""Routing traces drawn at random, for tests, demos and the policy conformance kit
(`moejax.policies.conformance`): a model's gate outputs without a model."""

from __future__ import annotations

import numpy as np

from moejax.traces.format import FORMAT, Trace


def random_scored_trace(rng, layers: int, experts: int, k: int, passes: list[int],
                        expert_bytes: int, noisy_spec: bool = True, weights: bool = True, *,
                        layer_ids: list[int] | None = None, lookahead: int = 1,
                        scores: bool = True, prefill_passes: int = 1,
                        confine: dict[int, int] | None = None):
    """A `Trace` from random router logits: top-k ids in rank order, renormalised weights
    (left out with `weights=False`), probabilities, and speculative scores for the next
    `lookahead` MoE layers — their probabilities, times uniform(0.5, 1.5) noise when
    `noisy_spec`. `passes`: token rows per pass, the first `prefill_passes` of them prefill.
    `layer_ids`: the MoE layers' indices (default `0..layers-1`; give gaps for dense layers in
    between). `scores=False`: ids only (no weights, probabilities or speculative scores), as an
    imported capture. `confine`: MoE layer id -> N, that layer's routing confined to its
    first N experts (>= k) in every pass: the others are never chosen, their probabilities 0."""
    layer_ids = list(range(layers)) if layer_ids is None else list(layer_ids)
    if len(layer_ids) != layers:
        raise ValueError(f"layer_ids {layer_ids} are not {layers} layers")
    rows = sum(passes)
    logits = rng.normal(0, 2, (rows, layers, experts))
    for layer, n in (confine or {}).items():
        if layer not in layer_ids or not k <= n <= experts:
            raise ValueError(f"confine={{{layer}: {n}}}: needs a MoE layer of {layer_ids} "
                             f"and {k} <= N <= {experts}")
        logits[:, layer_ids.index(layer), n:] = -np.inf
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    w = np.take_along_axis(probs, ids, -1)
    w = w / w.sum(-1, keepdims=True)
    spec_source = probs
    if noisy_spec:
        noisy = probs * rng.uniform(0.5, 1.5, probs.shape)
        spec_source = noisy / noisy.sum(-1, keepdims=True)
    spec = np.zeros((rows, layers, lookahead, experts), np.float32)
    for a in range(min(lookahead, layers - 1)):  # rows past the last layer stay 0
        spec[:, :layers - 1 - a, a] = spec_source[:, 1 + a:]
    meta = {"format": FORMAT, "model": {}, "layers": layer_ids, "num_experts": experts,
            "top_k": k, "expert_bytes": expert_bytes, "lookahead": lookahead if scores else 0,
            "prefill_passes": prefill_passes, "source": "test", "info": {}}
    offsets = np.concatenate([[0], np.cumsum(passes)]).astype(np.int64)
    if not scores:
        return Trace(meta, offsets, np.full(rows, -1, np.int32), ids.astype(np.int64))
    return Trace(meta, offsets, np.zeros(rows, np.int32), ids.astype(np.int64),
                 w.astype(np.float32) if weights else None, probs.astype(np.float32), spec)
