"""Quantized expert copies: the precisions and the packed format every copy has on disk, in host
memory, in the slot pool and inside the experts step (`formats.py`), how they are made
(`quantize.py`: qwix and moejax's own calibrations), and their reconstruction error on a
checkpoint (`python -m moejax.quant.error_table`)."""

from moejax.quant.formats import (
    BITS,
    CALIBRATIONS,
    DEFAULT_CALIBRATION,
    DEFAULT_GROUP_SIZE,
    PRECISIONS,
    QUANTIZED,
    QuantizedWeights,
    dequantize,
    expert_bytes,
)
from moejax.quant.quantize import quantize, reconstruction_error

__all__ = ["BITS", "CALIBRATIONS", "DEFAULT_CALIBRATION", "DEFAULT_GROUP_SIZE", "PRECISIONS",
           "QUANTIZED", "QuantizedWeights", "dequantize", "expert_bytes", "quantize",
           "reconstruction_error"]
