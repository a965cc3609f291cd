"""Routed-expert compute over a pool of expert weights: one grouped matmul, no expert loop.

Token-expert pairs are sorted by the pool slot holding their expert and run as a grouped matmul
(`gate_up` then `down`). Two implementations of the grouped matmul:

* ``"tiled"`` (default): each group is padded to a multiple of a row tile, so every tile belongs
  to one slot; tiles run as one batched matmul against the gathered weights of their slots. Work
  is ~rows x weights, whatever the pool size.
* ``"ragged_dot"``: `jax.lax.ragged_dot`. Off TPU it lowers to a dense computation per group
  (cost grows with rows x pool size: ~90x the dense matmul for 512 rows over 64 slots on CPU,
  see WORKSPACE.md), so it is kept as the reference the tiled version is tested against.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from moejax.models.layers import activation

GMM_IMPLS = ("tiled", "ragged_dot")


def _tile_rows(rows: int, groups: int) -> int:
    """Rows per tile: small when few rows spread over many slots (decode), larger in prefill."""
    per_group = max(1, rows // max(1, groups))
    return int(min(128, 2 ** math.floor(math.log2(per_group))))


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array,
                   impl: str = "tiled") -> jax.Array:
    """`x` `[M, K]` with rows sorted by group, `w` `[G, K, N]`, `group_sizes` `[G]` summing to
    at most M. Row r of the output is `x[r] @ w[group(r)]` (rows past the groups give zeros)."""
    if impl == "ragged_dot":
        return jax.lax.ragged_dot(x, w, group_sizes)
    if impl != "tiled":
        raise ValueError(f"unknown grouped matmul impl {impl!r}; known: {GMM_IMPLS}")
    m, kdim = x.shape
    g, _, n = w.shape
    tile = _tile_rows(m, g)
    # Each non-empty group wastes at most tile-1 padded rows; at most min(G, M) are non-empty.
    n_tiles = (m + min(g, m) * (tile - 1)) // tile + 1
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    padded = (group_sizes + tile - 1) // tile * tile
    padded_ends = jnp.cumsum(padded)
    padded_starts = padded_ends - padded
    row = jnp.arange(m)
    row_group = jnp.minimum(jnp.searchsorted(ends, row, side="right"), g - 1)
    valid = row < ends[-1]
    dest = jnp.where(valid, padded_starts[row_group] + row - starts[row_group], n_tiles * tile)
    xp = jnp.zeros((n_tiles * tile, kdim), x.dtype).at[dest].set(x, mode="drop")
    tile_group = jnp.minimum(
        jnp.searchsorted(padded_ends, jnp.arange(n_tiles) * tile, side="right"), g - 1)
    yp = jnp.einsum("tbk,tkn->tbn", xp.reshape(n_tiles, tile, kdim), w[tile_group],
                    preferred_element_type=jnp.float32).astype(x.dtype)
    y = yp.reshape(n_tiles * tile, n).at[dest].get(mode="fill", fill_value=0)
    return y


def moe_ffn(x: jax.Array, ids: jax.Array, weights: jax.Array, gate_up: jax.Array,
            down: jax.Array, slot_of: jax.Array, act: str = "silu",
            impl: str = "tiled") -> jax.Array:
    """Routed experts for tokens `x` `[N, H]`.

    ids, weights: `[N, K]` chosen experts and their contribution weights.
    gate_up: `[S, H, 2I]`, down: `[S, I, H]` the pool of expert weights in S slots.
    slot_of: `[E]` the slot holding each expert (only chosen experts are read).
    """
    n, k = ids.shape
    slots = slot_of[ids].reshape(-1)
    order = jnp.argsort(slots, stable=True)
    x_sorted = x[order // k]
    sizes = jnp.bincount(slots, length=gate_up.shape[0]).astype(jnp.int32)
    gu = grouped_matmul(x_sorted, gate_up, sizes, impl)
    inter = gate_up.shape[-1] // 2
    h = activation(act)(gu[:, :inter]) * gu[:, inter:]
    out_sorted = grouped_matmul(h, down, sizes, impl)
    out = jnp.zeros_like(out_sorted).at[order].set(out_sorted)
    out = out.reshape(n, k, -1).astype(jnp.float32) * weights[..., None].astype(jnp.float32)
    # A zero weight means "not computed here" (a dropped expert, or one of another wave): its
    # slot may hold anything, so mask rather than trust 0 * garbage.
    out = jnp.where(weights[..., None] != 0, out, 0.0)
    return jnp.sum(out, axis=1).astype(x.dtype)
