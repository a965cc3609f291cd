"""Dense (non-expert) parameters as an Orbax checkpoint of a flat `{dotted.path: array}` dict."""

from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from moejax.errors import CheckpointError
from moejax.interrupts import ctrl_c_deferred


def save(path: str, params: dict[str, np.ndarray]) -> None:
    with ctrl_c_deferred():  # (Orbax's event loop: see `moejax.interrupts`)
        ckpt = ocp.StandardCheckpointer()
        ckpt.save(os.path.abspath(path), params, force=True)
        ckpt.wait_until_finished()


def restore(path: str, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, np.ndarray]:
    """Restores and checks every parameter against the expected shape and dtype."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: dense parameter checkpoint is missing")
    ckpt = ocp.StandardCheckpointer()
    try:
        with ctrl_c_deferred():
            stored = ckpt.metadata(path).item_metadata
    except Exception as e:
        raise CheckpointError(f"{path}: unreadable Orbax checkpoint: {e}") from e
    stored = dict(stored) if stored is not None else {}
    missing = sorted(set(abstract) - set(stored))
    if missing:
        raise CheckpointError(f"{path}: dense parameters missing: {missing[:5]}"
                              f"{' ...' if len(missing) > 5 else ''}")
    for name, want in abstract.items():
        got = stored[name]
        if tuple(got.shape) != tuple(want.shape) or np.dtype(got.dtype) != np.dtype(want.dtype):
            raise CheckpointError(
                f"{path}: dense parameter {name!r} is {tuple(got.shape)} {got.dtype}, "
                f"the config implies {tuple(want.shape)} {np.dtype(want.dtype)}")
    try:
        with ctrl_c_deferred():  # (Orbax's event loop: see `moejax.interrupts`)
            return ckpt.restore(path, {k: abstract[k] for k in abstract})
    except Exception as e:
        raise CheckpointError(f"{path}: restoring dense parameters failed: {e}") from e
