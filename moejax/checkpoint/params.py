"""Flat `{dotted.path: array}` views of an NNX module's parameters."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx


def flat_params(module: nnx.Module) -> dict[str, jax.Array]:
    pure = nnx.state(module, nnx.Param).to_pure_dict()
    out: dict[str, jax.Array] = {}

    def walk(prefix: str, node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = node

    walk("", pure)
    return out


def load_flat_params(module: nnx.Module, flat: dict[str, np.ndarray | jax.Array]) -> None:
    """Writes `flat` into `module`'s parameters in place (every parameter must be given)."""
    state = nnx.state(module, nnx.Param)
    pure = state.to_pure_dict()

    def fill(prefix: str, node):
        if isinstance(node, dict):
            return {k: fill(f"{prefix}.{k}" if prefix else str(k), v) for k, v in node.items()}
        return flat[prefix]

    nnx.replace_by_pure_dict(state, fill("", pure))
    nnx.update(module, state)
