"""Expert precisions and the packed format every quantized expert copy has, on disk, in host
memory, in the device slot pool and inside the experts step.

A weight matrix `[..., K, N]` (K the contraction axis: `H` for `gate_up`, `I` for `down`) at
`bits` in {8, 4, 2} is three arrays:

* `values` uint8 `[..., K * bits / 8, N]`: unsigned codes in `[0, 2**bits)`, packed along K —
  byte `r` holds codes `k = r * (8 // bits) + j` at bit offset `j * bits`. The CPU backend (and
  ml_dtypes) stores `int4`/`int2` arrays one byte per element, so only packing makes a transfer
  move fewer bytes (FIELD-NOTES);
* `scale`, `zero` float16 `[..., K / g, N]`: per group of `g` consecutive rows of K and per
  output column, `w = (code - zero) * scale`.

Unpacking and dequantizing are a few shifts and one multiply-add, traced into the experts step
(`moejax/quant/weights.py`, called by `moejax.models.experts`), so no host-side dequantization
ever happens. This module is numpy only: the cache and the policies read the precisions and
their sizes from it without loading JAX.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError

# Highest to lowest. "native" is the checkpoint's own dtype (bfloat16, float16 or float32).
PRECISIONS = ("native", "int8", "int4", "int2")
QUANTIZED = PRECISIONS[1:]
BITS = {"int8": 8, "int4": 4, "int2": 2}
SCALE_DTYPE = np.float16
DEFAULT_GROUP_SIZE = 64
# How a group's scale and zero point are chosen (`moejax.quant.quantizer`).
CALIBRATIONS = ("absmax", "minmax", "search", "hqq")
# Chosen by measurement on the embedded model's experts (docs/findings/precision.md,
# tests/test_quantize.py): int8 absmax is already ~0.4% error (bitsandbytes-style); at 4 and 2
# bits the MSE search wins.
DEFAULT_CALIBRATION = {"int8": "absmax", "int4": "search", "int2": "search"}


def check_calibration(precision: str, calibration: str | None, what: str = "calibration") -> str:
    """The calibration to use for `precision` (its default when None)."""
    if precision not in QUANTIZED:
        raise ConfigError(f"precision={precision!r} cannot be quantized; one of {QUANTIZED}")
    if calibration is None:
        return DEFAULT_CALIBRATION[precision]
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"{what}={calibration!r} is not one of {CALIBRATIONS}")
    return calibration


def rank(precision: str) -> int:
    """0 for the highest precision (native), 3 for int2."""
    return PRECISIONS.index(check(precision))


def check(precision: str, what: str = "precision") -> str:
    if precision not in PRECISIONS:
        raise ConfigError(f"{what}={precision!r} is not one of {PRECISIONS}")
    return precision


def parse_levels(levels: str | tuple[str, ...], what: str = "levels") -> tuple[str, ...]:
    """`"int8:int4:int2"` (or a tuple) -> `("int8", "int4", "int2")`: known precisions, each
    strictly lower than the one before."""
    items = tuple(levels.split(":")) if isinstance(levels, str) else tuple(levels)
    items = tuple("int" + p if p in ("8", "4", "2") else p for p in items)  # SpecMD's "int8:4"
    if not items or not all(items):
        raise ConfigError(f"{what}={levels!r}: expected precisions joined by ':', e.g. "
                          "'int8:int4:int2'")
    for p in items:
        check(p, what)
    ranks = [PRECISIONS.index(p) for p in items]
    if any(b <= a for a, b in zip(ranks, ranks[1:])):
        raise ConfigError(f"{what}={levels!r}: levels must go from high to low precision "
                          f"(order {PRECISIONS}) without repeats")
    return items


def group_size_for(k: int, group_size: int) -> int:
    """The group length used along a contraction axis of length `k`: the largest divisor of
    `k` that is at most `group_size` (so a 96-row axis with group_size 64 uses 48)."""
    if group_size < 1:
        raise ConfigError(f"group_size={group_size} must be >= 1")
    for g in range(min(group_size, k), 0, -1):
        if k % g == 0:
            return g
    return 1


def matrix_bytes(k: int, n: int, precision: str, group_size: int, native_itemsize: int) -> int:
    """Bytes of one `[K, N]` weight matrix at `precision` (values, scales and zero points)."""
    if check(precision) == "native":
        return k * n * native_itemsize
    bits = BITS[precision]
    if (k * bits) % 8:
        raise ConfigError(f"a contraction axis of {k} rows cannot be packed at {bits} bits")
    groups = k // group_size_for(k, group_size)
    return k * n * bits // 8 + 2 * groups * n * np.dtype(SCALE_DTYPE).itemsize


def expert_bytes(hidden: int, intermediate: int, precision: str, group_size: int,
                 native_itemsize: int) -> int:
    """Bytes of one routed expert (`gate_up [H, 2I]` and `down [I, H]`) at `precision`."""
    return (matrix_bytes(hidden, 2 * intermediate, precision, group_size, native_itemsize) +
            matrix_bytes(intermediate, hidden, precision, group_size, native_itemsize))


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes `[..., K, N]` in `[0, 2**bits)` -> packed `[..., K * bits / 8, N]`."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"codes must be uint8, got {codes.dtype}")
    if bits == 8:
        return codes.copy()
    per = 8 // bits
    k, n = codes.shape[-2:]
    if k % per:
        raise ValueError(f"K={k} is not a multiple of {per} codes per byte")
    if codes.max(initial=0) >= 1 << bits:
        raise ValueError(f"a code exceeds {bits} bits")
    grouped = codes.reshape(*codes.shape[:-2], k // per, per, n)
    out = np.zeros((*codes.shape[:-2], k // per, n), np.uint8)
    for j in range(per):
        out |= grouped[..., j, :] << np.uint8(j * bits)
    return out
