"""Quantizing expert weights (`moejax.quant.quantizer`): the packed format round-trips, codes are
self-consistent with the stored float16 scale / zero point, and the reconstruction error on the
embedded model's real experts stays within the bounds measured when the defaults were chosen
(`python -m moejax.quant.error_table` prints the full table)."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled, checkpoint
from moejax.errors import ConfigError
from moejax.quant import formats, weights
from moejax.quant.formats import CALIBRATIONS, DEFAULT_CALIBRATION
from moejax.quant.quantizer import QWIX_CALIBRATIONS, quantize, reconstruction_error

# Measured on the embedded model (mean / max over its 16 layer arrays, group_size 64 -> 48):
# int8 absmax 0.0058 / 0.0059; int4 search 0.0788 / 0.0793 (qwix minmax 0.0865, absmax 0.0989);
# int2 search 0.313 / 0.3145 (hqq 0.407, minmax 0.426, qwix absmax 0.492).
BOUNDS = {"int8": 0.0065, "int4": 0.082, "int2": 0.325}


@st.composite
def _codes(draw):
    bits = draw(st.sampled_from([2, 4, 8]))
    per = 8 // bits
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    k = per * draw(st.integers(1, 6))
    n = draw(st.integers(1, 5))
    codes = draw(hnp.arrays(np.uint8, (*lead, k, n), elements=st.integers(0, (1 << bits) - 1)))
    return bits, codes


@settings(max_examples=60, deadline=None)
@given(_codes())
def test_pack_unpack_round_trip(bits_codes):
    bits, codes = bits_codes
    packed = formats.pack(codes, bits)
    assert packed.dtype == np.uint8
    assert packed.shape == (*codes.shape[:-2], codes.shape[-2] * bits // 8, codes.shape[-1])
    np.testing.assert_array_equal(np.asarray(weights.unpack(jnp.asarray(packed), bits)), codes)


def _gauss(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.02).astype(np.float32)


# The shape of the synthetic weights below: each (precision, calibration) compiles its slab
# function once for it (group_size 64 -> 48), and the tests after the first reuse it.
SHAPE = (3, 96, 40)


@pytest.mark.parametrize("precision", formats.QUANTIZED)
@pytest.mark.parametrize("calibration", CALIBRATIONS)
def test_codes_match_the_stored_f16_scale_and_zero(precision, calibration):
    w = _gauss(SHAPE)
    q = quantize(w, precision, 64, calibration)
    bits = formats.BITS[precision]
    g = formats.group_size_for(96, 64)
    assert g == 48 and q.group_size == g and q.bits == bits
    assert q.values.dtype == np.uint8 and q.values.shape == (3, 96 * bits // 8, 40)
    assert q.scale.dtype == q.zero.dtype == np.float16
    assert q.scale.shape == q.zero.shape == (3, 96 // g, 40)
    assert np.all(np.isfinite(q.scale)) and np.all(q.scale > 0) and np.all(np.isfinite(q.zero))
    codes = np.asarray(weights.unpack(jnp.asarray(q.values), bits))
    assert codes.max() < 1 << bits
    # Recomputing the codes from the f16 values that are stored gives the stored codes.
    s = np.repeat(q.scale.astype(np.float32), g, axis=-2)
    z = np.repeat(q.zero.astype(np.float32), g, axis=-2)
    again = np.clip(np.round(w / s + z), 0, (1 << bits) - 1)
    mismatch = np.mean(again != codes)
    assert mismatch < 1e-4, mismatch  # only float ties at .5 may round differently
    # And dequantize is exactly (code - zero) * scale.
    np.testing.assert_allclose(np.asarray(weights.dequantize(q, jnp.float32)),
                               (codes - z) * s, rtol=1e-6, atol=1e-9)
    if calibration == "absmax":  # symmetric: the zero point is the middle code
        np.testing.assert_array_equal(q.zero, np.float16(1 << (bits - 1)))


def test_error_orders_on_gaussian_weights():
    w = _gauss(SHAPE, seed=1)  # (other weights, the shape above: its compiled steps reused)
    err = {(p, c): reconstruction_error(w, quantize(w, p, 64, c))
           for p in formats.QUANTIZED for c in CALIBRATIONS}
    for c in CALIBRATIONS:
        assert err["int8", c] < err["int4", c] < err["int2", c]
    assert err["int8", "absmax"] < 0.01
    assert err["int2", "search"] < 0.8 * err["int2", "absmax"]
    assert err["int4", "search"] < err["int4", "absmax"]


def test_constant_and_zero_groups_are_exact_enough():
    w = np.zeros(SHAPE, np.float32)  # two groups of 48 rows per column, each all 0 or all 0.25
    w[1] = 0.25
    for p in formats.QUANTIZED:
        for c in CALIBRATIONS:
            q = quantize(w, p, 64, c)
            d = np.asarray(weights.dequantize(q, jnp.float32))
            assert np.all(np.isfinite(d))
            np.testing.assert_array_equal(d[0], 0.0)
            # absmax puts the group's maximum at the top bucket's edge (qwix's bound
            # 2**(bits-1) - 0.5): half a step; the asymmetric ones represent it exactly.
            step = 0.25 / ((1 << (formats.BITS[p] - 1)) - 0.5)
            atol = step / 2 + 1e-3 if c == "absmax" else 1e-3
            np.testing.assert_allclose(d, w, atol=atol, err_msg=f"{p}/{c}")


def test_bfloat16_input_and_leading_axes():
    w = _gauss((2, 3, 48, 16)).astype(jnp.bfloat16)
    q = quantize(w, "int4", 64)
    assert q.values.shape == (2, 3, 24, 16) and q.scale.shape == (2, 3, 1, 16)
    assert reconstruction_error(w, q) < 0.1


def test_bad_arguments():
    w = _gauss((1, 8, 4))
    with pytest.raises(ConfigError, match="calibration='mse'"):
        quantize(w, "int4", 64, "mse")
    with pytest.raises(ConfigError, match="native"):
        quantize(w, "native")
    with pytest.raises(ConfigError, match="group_size=0"):
        quantize(w, "int8", 0)
    with pytest.raises(ConfigError, match="cannot be packed"):
        quantize(_gauss((1, 6, 4)), "int2")
    assert set(DEFAULT_CALIBRATION) == set(formats.QUANTIZED)
    assert ("int2", "minmax") not in QWIX_CALIBRATIONS  # qwix refuses asymmetric int2


# -- the embedded model's real experts ----------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_experts():
    ck = checkpoint.load(bundled.EMBEDDED_DIR)
    return ([np.asarray(v) for v in ck.host_gate_up.values()] +
            [np.asarray(v) for v in ck.host_down.values()])


@pytest.mark.parametrize("precision", formats.QUANTIZED)
def test_embedded_error_bounds_default_calibration(embedded_experts, precision):
    """Two arrays (first gate_up, last down) with each precision's default calibration."""
    for w in (embedded_experts[0], embedded_experts[-1]):
        err = reconstruction_error(w, quantize(w, precision))
        assert err < BOUNDS[precision], (precision, err)


def test_embedded_int2_search_beats_absmax(embedded_experts):
    w = embedded_experts[1]
    search = reconstruction_error(w, quantize(w, "int2", calibration="search"))
    absmax = reconstruction_error(w, quantize(w, "int2", calibration="absmax"))
    minmax = reconstruction_error(w, quantize(w, "int2", calibration="minmax"))
    assert search < BOUNDS["int2"] and absmax > 0.45
    assert search < absmax - 0.15 and search < minmax - 0.08


@pytest.mark.slow
def test_embedded_error_bounds_every_layer(embedded_experts):
    for precision in formats.QUANTIZED:
        errs = [reconstruction_error(w, quantize(w, precision)) for w in embedded_experts]
        assert max(errs) < BOUNDS[precision], (precision, errs)


def test_shipped_copies_match_quantize(embedded_experts):
    """The embedded model ships its int8/int4/int2 copies, made by `quantize` with the
    recorded group size and calibration."""
    ck = checkpoint.load(bundled.EMBEDDED_DIR)
    assert list(ck.precisions) == ["native", "int8", "int4", "int2"]
    layer = ck.cfg.moe_layers[0]
    for precision in formats.QUANTIZED:
        entry = ck.precisions[precision]
        gate_up, down = ck.experts_at(precision)
        q = quantize(np.asarray(ck.host_gate_up[layer]), precision, entry["group_size"],
                     entry["calibration"])
        stored = gate_up[layer].map(np.asarray)
        np.testing.assert_array_equal(stored.values, q.values)
        np.testing.assert_array_equal(stored.scale, q.scale)
        np.testing.assert_array_equal(stored.zero, q.zero)
        assert reconstruction_error(np.asarray(ck.host_down[layer]), down[layer]) < \
            BOUNDS[precision]
