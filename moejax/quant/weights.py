"""Packed quantized weights as JAX holds them (`QuantizedWeights`, a pytree: in host memory, in
the slot pool, inside the experts step), and their unpacking and dequantization, traced into
the experts step. The format itself (codes packed along K, float16 scale and zero per group) is
`moejax/quant/formats.py`'s."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeights:
    """Packed quantized weights `[..., K, N]` (numpy on disk and while converting, jax arrays
    in host memory, the slot pool and the experts step). `bits` is static: it is part of a
    compiled step's signature."""

    values: jax.Array  # uint8 [..., K * bits / 8, N]
    scale: jax.Array  # float16 [..., K / g, N]
    zero: jax.Array  # float16 [..., K / g, N]
    bits: int = dataclasses.field(metadata=dict(static=True))

    @property
    def rows(self) -> int:
        """K, the contraction length."""
        return self.values.shape[-2] * 8 // self.bits

    @property
    def group_size(self) -> int:
        return self.rows // self.scale.shape[-2]

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.scale.nbytes + self.zero.nbytes)

    def map(self, fn) -> "QuantizedWeights":
        """The same weights with `fn` applied to each of the three arrays."""
        return QuantizedWeights(fn(self.values), fn(self.scale), fn(self.zero), self.bits)


def unpack(values: jax.Array, bits: int) -> jax.Array:
    """Inverse of `pack`, traceable: packed `[..., R, N]` -> uint8 codes `[..., R * 8/bits, N]`."""
    if bits == 8:
        return values
    per = 8 // bits
    shifts = (jnp.arange(per, dtype=jnp.uint8) * bits)[:, None]
    codes = (values[..., :, None, :] >> shifts) & jnp.uint8((1 << bits) - 1)
    return codes.reshape(*values.shape[:-2], values.shape[-2] * per, values.shape[-1])


def dequantize(q: QuantizedWeights, dtype) -> jax.Array:
    """`[..., K, N]` weights in `dtype`, traceable (the experts step calls it on the tiles it
    multiplies)."""
    codes = unpack(q.values, q.bits).astype(jnp.float32)
    *lead, k, n = codes.shape
    groups = q.scale.shape[-2]
    codes = codes.reshape(*lead, groups, k // groups, n)
    scale = q.scale.astype(jnp.float32)[..., :, None, :]
    zero = q.zero.astype(jnp.float32)[..., :, None, :]
    return ((codes - zero) * scale).reshape(*lead, k, n).astype(dtype)
