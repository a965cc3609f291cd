"""Quantized expert copies: precisions, the packed format the runtime moves, and how they are
made (`moejax.quant.quantize`)."""
