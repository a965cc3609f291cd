"""The gates of a recorded pass, as the live runtime built them: what replay feeds the cache."""

from __future__ import annotations

import numpy as np

from moejax.seam import LayerGate
from moejax.traces import Trace


def layer_gates(trace: Trace, p: int) -> list[LayerGate]:
    """The `LayerGate`s of pass `p`, exactly as the live runtime built them."""
    rows = trace.pass_rows(p)
    layers = trace.layers
    lookahead = int(trace.meta.get("lookahead", 0))
    gates = []
    for i, layer in enumerate(layers):
        spec_layers = tuple(layers[i + 1:i + 1 + lookahead])
        spec = None
        if trace.spec is not None:
            spec = np.ascontiguousarray(
                np.moveaxis(trace.spec[rows, i, :len(spec_layers)], 1, 0))
        gates.append(LayerGate(
            layer, trace.ids[rows, i],
            None if trace.weights is None else trace.weights[rows, i],
            None if trace.probs is None else trace.probs[rows, i], spec, spec_layers))
    return gates
