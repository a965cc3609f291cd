"""Quantized expert copies: the precisions and the packed format every copy has on disk, in host
memory, in the slot pool and inside the experts step (`formats.py`, numpy only: what the cache
and the policies read), the packed weights as JAX holds them and their dequantization
(`weights.py`), how they are made (`quantize.py`: qwix and moejax's own calibrations), and their
reconstruction error on a checkpoint (`python -m moejax.quant.error_table`). The face names the
format; `weights` and `quantize` load JAX (import them from their modules)."""

from moejax.quant.formats import (
    BITS,
    CALIBRATIONS,
    DEFAULT_CALIBRATION,
    DEFAULT_GROUP_SIZE,
    PRECISIONS,
    QUANTIZED,
    check,
    expert_bytes,
    pack,
    parse_levels,
    rank,
)

__all__ = ["BITS", "CALIBRATIONS", "DEFAULT_CALIBRATION", "DEFAULT_GROUP_SIZE", "PRECISIONS",
           "QUANTIZED", "check", "expert_bytes", "pack", "parse_levels", "rank"]
