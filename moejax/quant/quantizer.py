"""Makes the quantized copies of routed experts (`moejax.quant.weights.QuantizedWeights`).

`quantize(w, precision, group_size, calibration)` takes weights `[..., K, N]` (K the contraction
axis) and returns packed codes with one float16 scale and zero point per group of `g` rows of K
and per column (`g = group_size_for(K, group_size)`), `w ~= (code - zero) * scale`.

Calibrations (how each group's scale and zero point are chosen):

* `absmax` — symmetric, the group's largest magnitude maps to the top code (qwix's absmax:
  `scale = absmax / (2**(bits-1) - 0.5)`, integer zero point `2**(bits-1)`). bitsandbytes-int8
  style; wastes one level, and at 2 bits (levels -2s, -s, 0, s) loses much of the signal;
* `minmax` — asymmetric, `[min, max]` of the group spans the code range (qwix's minmax at 8 and
  4 bits, whose zero point is an integer and whose range always includes 0; qwix refuses it at
  2 bits, so int2 minmax is computed here, with a float zero point);
* `search` — asymmetric with a float zero point: per group, the candidate clipping range with
  the lowest squared reconstruction error among a coarse grid (`[min, max]` shrunk towards its
  midpoint or towards 0, or a step proportional to the group's standard deviation), refined
  around each group's best, then a few rounds of alternating least squares (codes fixed: the
  best scale and offset in closed form; then the codes again), keeping each group's best.
  Each candidate costs one pass over the weights, so there are few (15 passes in all: ~4x
  faster than the 10 x 2 grid it replaced, and as accurate on the embedded model);
* `hqq` — half-quadratic quantization (Badri & Shaji, 2023): from minmax, the zero point is
  optimised against an l_p (p < 1) error with a shrinkage step, which tolerates outliers.

Whatever the calibration, the codes are computed with the float16-rounded scale and zero point
that are stored, so `dequantize` reproduces exactly what the error was measured on. Work is
done in float32 with jitted JAX, a slab of experts at a time (bounded memory).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import qwix

from moejax.errors import ConfigError
from moejax.quant.formats import (
    BITS,
    DEFAULT_GROUP_SIZE,
    SCALE_DTYPE,
    check_calibration,
    group_size_for,
    pack,
)
from moejax.quant.weights import QuantizedWeights, dequantize

# Where qwix computes the scale / zero point (it refuses asymmetric int2).
QWIX_QTYPES = {"int8": jnp.int8, "int4": jnp.int4, "int2": jnp.int2}
QWIX_CALIBRATIONS = {("int8", "absmax"), ("int8", "minmax"), ("int4", "absmax"),
                     ("int4", "minmax"), ("int2", "absmax")}

# Elements per jitted slab (float32 temporaries of a few times this).
SLAB_ELEMENTS = 1 << 24
# search (see `_search`): the coarse grid, per family (shrink towards the midpoint, shrink
# towards 0, multiple of the Gaussian-optimal step), the refinement steps around each group's
# best factor, and the alternating least-squares rounds. Chosen by measurement on the embedded
# model (`python -m moejax.quant.error_table`): 15 passes over the weights, as accurate as the
# 10 x 2 grid and 4 two-pass rounds they replaced (int4 0.0788 vs 0.0786, int2 0.3129 vs 0.3140).
SEARCH_GRID = ((0.7, 0.4), (0.7, 0.4), (1.0,))
SEARCH_REFINE = (0.15, 0.075)
SEARCH_LS_ROUNDS = 4
# The step of the MSE-optimal uniform quantizer of a unit Gaussian at 2**bits levels (Max, 1960).
SEARCH_GAUSS_STEP = {2: 0.9957, 4: 0.3352, 8: 0.0308}
# hqq: the paper's defaults.
HQQ_ITERS, HQQ_LP, HQQ_BETA, HQQ_KAPPA = 20, 0.7, 10.0, 1.01

_F16_TINY = float(np.finfo(np.float16).smallest_subnormal)
_F16_MAX = float(np.finfo(np.float16).max)


def quantize(w: np.ndarray, precision: str, group_size: int = DEFAULT_GROUP_SIZE,
             calibration: str | None = None) -> QuantizedWeights:
    """Weights `[..., K, N]` (any float dtype) -> packed `QuantizedWeights` of numpy arrays."""
    calibration = check_calibration(precision, calibration)
    bits = BITS[precision]
    w = np.asarray(w)
    if w.ndim < 2:
        raise ValueError(f"weights must be [..., K, N], got shape {w.shape}")
    *lead, k, n = w.shape
    if (k * bits) % 8:
        raise ConfigError(f"a contraction axis of {k} rows cannot be packed at {bits} bits")
    g = group_size_for(k, group_size)
    flat = w.reshape(-1, k, n)
    b = flat.shape[0]
    per = max(1, SLAB_ELEMENTS // max(1, k * n))
    codes = np.empty((b, k, n), np.uint8)
    scale = np.empty((b, k // g, n), SCALE_DTYPE)
    zero = np.empty((b, k // g, n), SCALE_DTYPE)
    for start in range(0, b, per):
        x = jnp.asarray(flat[start:start + per], jnp.float32)
        c, s, z = _quantize_slab(x, bits, g, calibration)
        codes[start:start + per] = np.asarray(c)
        scale[start:start + per] = np.asarray(s)
        zero[start:start + per] = np.asarray(z)
    shape = lambda a: a.reshape(*lead, *a.shape[1:])  # noqa: E731
    return QuantizedWeights(shape(pack(codes, bits)), shape(scale), shape(zero), bits)


def reconstruction_error(w, q: QuantizedWeights) -> float:
    """Relative Frobenius error `||dequantize(q) - w|| / ||w||` (float32 dequantization)."""
    w = np.asarray(w, np.float64)
    q = q.map(np.asarray)  # host-memory jax arrays too: dequantize on the default device
    d = np.asarray(dequantize(q, jnp.float32), np.float64)
    if d.shape != w.shape:
        raise ValueError(f"quantized weights are {d.shape}, the reference {w.shape}")
    norm = np.linalg.norm(w)
    err = np.linalg.norm(d - w)
    return float(err / norm) if norm > 0 else float(err)


# -- the numerics (jitted per slab shape, bits, group and calibration) ------------------------


def _quantize_slab(x, bits: int, g: int, calibration: str):
    """float32 `[B, K, N]` -> (uint8 codes `[B, K, N]`, f16 scale, f16 zero `[B, K/g, N]`)."""
    precision = f"int{bits}"
    if (precision, calibration) in QWIX_CALIBRATIONS:
        return _qwix_slab(x, bits, g, calibration)
    return _affine_slab(x, bits, g, calibration)


@functools.partial(jax.jit, static_argnames=("bits", "g", "calibration"))
def _qwix_slab(x, bits, g, calibration):
    q = qwix.quantize(x, QWIX_QTYPES[f"int{bits}"], channelwise_axes=(0, 2), tiled_axes={1: g},
                      calibration_method=calibration)
    offset = float(1 << (bits - 1))  # qwix's signed codes -> our unsigned ones
    zero = offset if q.zero_point is None else q.zero_point.astype(jnp.float32) + offset
    zero = jnp.broadcast_to(zero, q.scale.shape)
    scale, zero = _f16(q.scale.astype(jnp.float32)), _f16(zero)
    xg = _groups(x, g)
    codes = _codes(xg, scale[:, :, None, :], zero[:, :, None, :], bits)
    return (codes.reshape(x.shape).astype(jnp.uint8), scale.astype(SCALE_DTYPE),
            zero.astype(SCALE_DTYPE))


@functools.partial(jax.jit, static_argnames=("bits", "g", "calibration"))
def _affine_slab(x, bits, g, calibration):
    xg = _groups(x, g)  # [B, G, g, N]; groups reduce over axis 2
    qmax = float((1 << bits) - 1)
    if calibration == "absmax":  # symmetric, qwix's bound (only reached where qwix is not used)
        amax = jnp.max(jnp.abs(xg), axis=2, keepdims=True)
        scale = _safe(amax / (qmax / 2 + 0.5))
        zero = jnp.full_like(scale, float(1 << (bits - 1)))
    else:
        lo = jnp.min(xg, axis=2, keepdims=True)
        hi = jnp.max(xg, axis=2, keepdims=True)
        scale, zero = _range_to_affine(lo, hi, qmax)
        if calibration == "search":
            scale, zero = _search(xg, lo, hi, bits)
        elif calibration == "hqq":
            scale, zero = _hqq(xg, scale, zero, bits)
    scale, zero = _f16(scale), _f16(zero)
    codes = _codes(xg, scale, zero, bits)
    return (codes.reshape(x.shape).astype(jnp.uint8), scale[:, :, 0, :].astype(SCALE_DTYPE),
            zero[:, :, 0, :].astype(SCALE_DTYPE))


def _groups(x, g):
    b, k, n = x.shape
    return x.reshape(b, k // g, g, n)


def _safe(scale):
    """Scales a float16 can hold and that do not divide by zero (a constant group gets 1)."""
    scale = jnp.where(scale < 1e-30, 1.0, scale)
    return jnp.clip(scale, _F16_TINY, _F16_MAX)


def _f16(a):
    return jnp.clip(a, -_F16_MAX, _F16_MAX).astype(jnp.float16).astype(jnp.float32)


def _codes(xg, scale, zero, bits):
    return jnp.clip(jnp.round(xg / scale + zero), 0.0, float((1 << bits) - 1))


def _range_to_affine(lo, hi, qmax):
    scale = _safe((hi - lo) / qmax)
    return scale, -lo / scale


def _sq_error(xg, scale, zero, bits):
    """Per group squared error with the f16-rounded scale and zero (what would be stored), and
    the codes it was measured with. `(code - z) * s - x = s * (code - t)` with `t = x / s + z`,
    so the error is `s**2 * sum((code - t)**2)`: one multiply-add, a round and a clip per
    element (a multiply by `1 / s` here; the stored codes divide, which differs only on ties)."""
    s, z = _f16(scale), _f16(zero)
    t = xg * (1.0 / s) + z
    codes = jnp.clip(jnp.round(t), 0.0, float((1 << bits) - 1))
    d = codes - t
    return jnp.sum(d * d, axis=2, keepdims=True) * (s * s), codes


def _search(xg, lo, hi, bits):
    """Per group the best of a few clipping ranges, refined, then alternating least squares.

    Every step costs one pass over the weights per candidate (the error of a candidate is one
    fused multiply-add, round, clip and square-sum), so the candidates are few and placed where
    they matter: a coarse grid over three families of ranges, a finer look around each group's
    best, then least squares, which moves each group to the scale and offset its codes call for.
    """
    qmax = float((1 << bits) - 1)
    xm = jnp.mean(xg, axis=2, keepdims=True)
    sd = jnp.sqrt(jnp.mean(jnp.square(xg - xm), axis=2, keepdims=True))
    mid = (lo + hi) / 2

    def candidate(family, p):
        """Family 0: [lo, hi] shrunk by p towards its midpoint; 1: towards 0; 2: a step of p
        times the Gaussian-optimal step for the group's standard deviation, centred on its
        mean."""
        if family == 0:
            return _range_to_affine(mid + (lo - mid) * p, mid + (hi - mid) * p, qmax)
        if family == 1:
            return _range_to_affine(lo * p, hi * p, qmax)
        s = _safe(sd * (p * SEARCH_GAUSS_STEP[bits]))
        return s, qmax / 2 - xm / s

    def keep(best, s, z, p, family):
        e, _ = _sq_error(xg, s, z, bits)
        if best is None:
            return s, z, e, p, family
        better = e < best[2]
        return tuple(jnp.where(better, new, old)
                     for new, old in zip((s, z, e, p, family), best))

    # 1. A coarse grid: minmax, then each family at its factors.
    ones = jnp.ones_like(lo)
    best = keep(None, *candidate(0, 1.0), ones, 0 * ones)
    for family, factors in enumerate(SEARCH_GRID):
        for p in factors:
            best = keep(best, *candidate(family, p), p * ones, family * ones)
    # 2. Finer: each group's factor +- each step in turn, within its family.
    for step in SEARCH_REFINE:
        for sign in (-1.0, 1.0):
            p = jnp.maximum(best[3] + sign * step, 0.05)
            family = best[4]
            options = [candidate(f, p) for f in range(3)]
            s = jnp.select([family == 0, family == 1], [options[0][0], options[1][0]],
                           options[2][0])
            z = jnp.select([family == 0, family == 1], [options[0][1], options[1][1]],
                           options[2][1])
            best = keep(best, s, z, p, family)
    # 3. Alternating least squares from the best: codes fixed, the best affine map in closed
    #    form (w ~ s * (c - z)); each pass measures the current map and yields the next one.
    bs, bz, be = best[0], best[1], best[2]
    s, z = bs, bz
    for r in range(SEARCH_LS_ROUNDS + 1):
        e, c = _sq_error(xg, s, z, bits)
        if r:
            better = e < be
            bs, bz, be = (jnp.where(better, s, bs), jnp.where(better, z, bz),
                          jnp.where(better, e, be))
        if r == SEARCH_LS_ROUNDS:
            break
        cm = jnp.mean(c, axis=2, keepdims=True)
        cov = jnp.mean(c * (xg - xm), axis=2, keepdims=True)  # = mean((c - cm)(x - xm))
        var = jnp.mean(c * c, axis=2, keepdims=True) - cm * cm  # exact sums of small integers
        s_new = jnp.where(var > 0, cov / jnp.where(var > 0, var, 1.0), s)
        s = _safe(jnp.where(s_new > 0, s_new, s))
        z = cm - xm / s
    return bs, bz


def _hqq(xg, scale, zero, bits):
    """HQQ's proximal zero-point optimisation (scale fixed at minmax), per group keeping the
    iterate with the lowest mean absolute error."""
    qmax = float((1 << bits) - 1)
    beta = HQQ_BETA
    # HQQ works with the inverse scale; so do we, to follow its update.
    inv = 1.0 / scale
    z = zero

    def shrink(e, beta):
        return jnp.sign(e) * jax.nn.relu(jnp.abs(e) - (1.0 / beta) *
                                         jnp.power(jnp.abs(e) + 1e-8, HQQ_LP - 1.0))

    best_z = z
    best_e = jnp.full(z.shape, jnp.inf, jnp.float32)
    for _ in range(HQQ_ITERS):
        wq = jnp.clip(jnp.round(xg * inv + z), 0.0, qmax)
        wr = (wq - z) / inv
        err = jnp.mean(jnp.abs(xg - wr), axis=2, keepdims=True)
        better = err < best_e
        best_z, best_e = jnp.where(better, z, best_z), jnp.where(better, err, best_e)
        we = shrink(xg - wr, beta)
        z = jnp.mean(wq - (xg - we) * inv, axis=2, keepdims=True)
        beta *= HQQ_KAPPA
    return scale, best_z
