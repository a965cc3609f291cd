"""Quantized expert copies: the precisions and the packed format every copy has on disk, in host
memory, in the slot pool and inside the experts step (`formats.py`, numpy only: what the cache
and the policies read), the packed weights as JAX holds them and their dequantization
(`weights.py`), how they are made (`quantizer.py`: qwix and moejax's own calibrations), and their
reconstruction error on a checkpoint (`python -m moejax.quant.error_table`).

Code outside the package imports through this face. It is numpy only: the names of `weights`
and `quantizer` load JAX, so they are resolved when first asked for (`_LAZY`), and a numpy
importer of the format (the cache, the policies) never loads JAX."""

import importlib

from moejax.quant.formats import (
    BITS,
    CALIBRATIONS,
    DEFAULT_CALIBRATION,
    DEFAULT_GROUP_SIZE,
    PRECISIONS,
    QUANTIZED,
    SCALE_DTYPE,
    check,
    check_calibration,
    expert_bytes,
    pack,
    parse_levels,
    rank,
)

# The face's names that load JAX, and the module each comes from.
_LAZY = {"QuantizedWeights": "weights", "dequantize": "weights", "quantize": "quantizer",
         "reconstruction_error": "quantizer", "QWIX_CALIBRATIONS": "quantizer"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'moejax.quant' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"moejax.quant.{module}"), name)
    globals()[name] = value  # (resolved once)
    return value


__all__ = ["BITS", "CALIBRATIONS", "DEFAULT_CALIBRATION", "DEFAULT_GROUP_SIZE", "PRECISIONS",
           "QUANTIZED", "QWIX_CALIBRATIONS", "QuantizedWeights", "SCALE_DTYPE", "check",
           "check_calibration", "dequantize", "expert_bytes", "pack", "parse_levels",
           "quantize", "rank", "reconstruction_error"]
