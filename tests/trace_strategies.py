"""Hypothesis strategies for routing traces: id-only sequences of one model, with routing
independent from token to token or repeating as real routing does."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from moejax.testing import random_scored_trace
from moejax.traces.format import FORMAT, Trace

BYTES = 4096


def local_trace(rng, layers, experts, k, passes, prefill, noise):
    """An id-only trace whose routing repeats from token to token, as real routing does: each
    layer's logits are a fixed preference plus `noise` (small: the same experts again)."""
    rows = sum(passes)
    logits = rng.normal(0, 2, (1, layers, experts)) + rng.normal(0, noise,
                                                                  (rows, layers, experts))
    ids = np.argsort(-logits, axis=-1, kind="stable")[..., :k].astype(np.int64)
    meta = {"format": FORMAT, "model": {}, "layers": list(range(layers)),
            "num_experts": experts, "top_k": k, "expert_bytes": BYTES, "lookahead": 0,
            "prefill_passes": prefill, "source": "test", "info": {}}
    offsets = np.concatenate([[0], np.cumsum(passes)]).astype(np.int64)
    return Trace(meta, offsets, np.full(rows, -1, np.int32), ids)


@st.composite
def id_traces(draw):
    """1-2 random id-only sequences of one model: some prefill passes, then decode steps;
    routing independent from token to token, or repeating (a small `noise`)."""
    layers = draw(st.integers(2, 5))
    experts, k = draw(st.integers(4, 12)), draw(st.integers(1, 2))
    noise = draw(st.sampled_from([None, 0.5, 1.5]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    out = []
    for _ in range(draw(st.integers(1, 2))):
        prefill = draw(st.integers(0, 2))
        passes = [draw(st.integers(2, 5)) for _ in range(prefill)] + [1] * draw(
            st.integers(2, 8))
        out.append(random_scored_trace(rng, layers, experts, k, passes, BYTES, scores=False,
                                       prefill_passes=prefill) if noise is None
                   else local_trace(rng, layers, experts, k, passes, prefill, noise))
    return out
