"""Routed-expert compute over a pool of expert weights: one grouped matmul, no expert loop.

Token-expert pairs are sorted by the pool slot holding their expert and run as a grouped matmul
(`gate_up` then `down`). Two implementations of the grouped matmul:

* ``"tiled"`` (default): each group is padded to a multiple of a row tile, so every tile belongs
  to one slot; tiles run as one batched matmul against the gathered weights of their slots. Work
  is ~rows x weights, whatever the pool size.
* ``"ragged_dot"``: `jax.lax.ragged_dot`. Off TPU it lowers to a dense computation per group
  (cost grows with rows x pool size: ~90x the dense matmul for 512 rows over 64 slots on CPU,
  see benchmarks/README.md), so it is kept as the reference the tiled version is tested against.

The weights are one array `[G, K, N]`, or a tuple of *pools* (`ExpertPools`): the cache's
per-precision slot pools, each a native array or packed `QuantizedWeights`
(`moejax/quant/formats.py`), concatenated along the slot axis (pool i holds the global slots
after pool i-1's). The tiled implementation dequantizes inside the step, and only the tiles it
multiplies: each tile gathers its slot's packed values from every pool, unpacks and scales them,
and keeps the one of the pool that slot lies in — work ~ tiles x weights x pools, never the
whole pool, and no host-side dequantization.
"""

from __future__ import annotations

import math
from typing import Union

import jax
import jax.numpy as jnp

from moejax.model_config import GMM_IMPLS
from moejax.models.layers import activation
from moejax.quant import QuantizedWeights, dequantize

ExpertPool = Union[jax.Array, QuantizedWeights]  # [S, K, N] native, or packed quantized
ExpertPools = Union[jax.Array, tuple[ExpertPool, ...]]


def pool_slots(pool: ExpertPool) -> int:
    return (pool.values if isinstance(pool, QuantizedWeights) else pool).shape[0]


def as_pools(w: ExpertPools) -> tuple[ExpertPool, ...]:
    return w if isinstance(w, tuple) else (w,)


def gather_slots(w: ExpertPools, slots: jax.Array, dtype) -> jax.Array:
    """The weights `[T, K, N]` (in `dtype`) of global slot `slots[t]`, from whichever pool
    holds it; quantized pools are dequantized on the gathered slots only."""
    out, offset = None, 0
    for pool in as_pools(w):
        n = pool_slots(pool)
        local = jnp.clip(slots - offset, 0, n - 1) if offset or out is not None else slots
        if isinstance(pool, QuantizedWeights):
            tiles = dequantize(pool.map(lambda a: a[local]), dtype)
        else:
            tiles = pool[local].astype(dtype)
        if out is None:
            out = tiles
        else:
            inside = (slots >= offset) & (slots < offset + n)
            out = jnp.where(inside[:, None, None], tiles, out)
        offset += n
    return out


def dense_pool(w: ExpertPools, dtype) -> jax.Array:
    """Every slot of every pool as one `[G, K, N]` array in `dtype` (the reference path)."""
    parts = [dequantize(p, dtype) if isinstance(p, QuantizedWeights) else p.astype(dtype)
             for p in as_pools(w)]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)


def total_slots(w: ExpertPools) -> int:
    return sum(pool_slots(p) for p in as_pools(w))


def _tile_rows(rows: int, groups: int) -> int:
    """Rows per tile: small when few rows spread over many slots (decode), larger in prefill."""
    per_group = max(1, rows // max(1, groups))
    return int(min(128, 2 ** math.floor(math.log2(per_group))))


def grouped_matmul(x: jax.Array, w: ExpertPools, group_sizes: jax.Array,
                   impl: str = "tiled") -> jax.Array:
    """`x` `[M, K]` with rows sorted by group, `w` `[G, K, N]` (or pools totalling G slots),
    `group_sizes` `[G]` summing to at most M. Row r of the output is `x[r] @ w[group(r)]` (rows
    past the groups give zeros)."""
    if impl == "ragged_dot":
        return jax.lax.ragged_dot(x, dense_pool(w, x.dtype), group_sizes)
    if impl != "tiled":
        raise ValueError(f"unknown grouped matmul impl {impl!r}; known: {GMM_IMPLS}")
    m, kdim = x.shape
    g = total_slots(w)
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
    w_tiles = w[tile_group] if not isinstance(w, tuple) else gather_slots(w, tile_group, x.dtype)
    yp = jnp.einsum("tbk,tkn->tbn", xp.reshape(n_tiles, tile, kdim), w_tiles,
                    preferred_element_type=jnp.float32).astype(x.dtype)
    y = yp.reshape(n_tiles * tile, -1).at[dest].get(mode="fill", fill_value=0)
    return y


def moe_ffn(x: jax.Array, ids: jax.Array, weights: jax.Array, gate_up: ExpertPools,
            down: ExpertPools, slot_of: jax.Array, act: str = "silu",
            impl: str = "tiled") -> jax.Array:
    """Routed experts for tokens `x` `[N, H]`.

    ids, weights: `[N, K]` chosen experts and their contribution weights.
    gate_up: `[S, H, 2I]`, down: `[S, I, H]` the pool of expert weights in S slots (or the
    per-precision pools, S slots in all).
    slot_of: `[E]` the slot holding each expert (only chosen experts are read).
    """
    return combine(expert_outputs(x, ids, weights, gate_up, down, slot_of, act, impl), x.dtype)


def combine(outputs: jax.Array, dtype) -> jax.Array:
    """The routed experts' output `[N, H]`: the weighted contributions `[N, K, H]` (float32)
    summed over k, in the model's dtype. A layer served in several waves sums once, here, after
    its last wave, so its rounding is the resident model's."""
    return jnp.sum(outputs, axis=1).astype(dtype)


def expert_outputs(x: jax.Array, ids: jax.Array, weights: jax.Array, gate_up: ExpertPools,
                   down: ExpertPools, slot_of: jax.Array, act: str = "silu",
                   impl: str = "tiled") -> jax.Array:
    """The weighted contribution of each chosen expert, `[N, K, H]` float32, and exactly 0.0
    where the weight is 0 (not computed here: a dropped expert, or one of another wave), so
    that the waves of a layer add up without rounding (v + 0.0 == v)."""
    n, k = ids.shape
    slots = slot_of[ids].reshape(-1)
    order = jnp.argsort(slots, stable=True)
    x_sorted = x[order // k]
    sizes = jnp.bincount(slots, length=total_slots(gate_up)).astype(jnp.int32)
    gu = grouped_matmul(x_sorted, gate_up, sizes, impl)
    inter = gu.shape[-1] // 2
    h = activation(act)(gu[:, :inter]) * gu[:, inter:]
    out_sorted = grouped_matmul(h, down, sizes, impl)
    out = jnp.zeros_like(out_sorted).at[order].set(out_sorted)
    out = out.reshape(n, k, -1).astype(jnp.float32) * weights[..., None].astype(jnp.float32)
    # A zero weight means "not computed here" (a dropped expert, or one of another wave): its
    # slot may hold anything, so mask rather than trust 0 * garbage.
    return jnp.where(weights[..., None] != 0, out, 0.0)
