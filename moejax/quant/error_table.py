"""The reconstruction error of every precision and calibration on a checkpoint's experts.

    python -m moejax.quant.error_table [CHECKPOINT]   # the embedded model's when not given

prints `| precision | calibration | numerics | mean | max |`: the relative Frobenius error of
`dequantize(quantize(w))` over every MoE layer array, at the default group size.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from moejax import bundled, checkpoint
from moejax.quant.formats import CALIBRATIONS, DEFAULT_CALIBRATION, DEFAULT_GROUP_SIZE, QUANTIZED
from moejax.quant.quantizer import QWIX_CALIBRATIONS, quantize, reconstruction_error


def error_table(gate_up: dict, down: dict, group_size: int = DEFAULT_GROUP_SIZE,
                calibrations=CALIBRATIONS) -> list[tuple[str, str, float, float]]:
    """`(precision, calibration, mean, max)` relative error over every MoE layer and kind."""
    rows = []
    for precision in QUANTIZED:
        for cal in calibrations:
            errs = [reconstruction_error(w, quantize(w, precision, group_size, cal))
                    for d in (gate_up, down) for w in d.values()]
            rows.append((precision, cal, float(np.mean(errs)), float(np.max(errs))))
    return rows


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else bundled.EMBEDDED_DIR
    ck = checkpoint.load(path)
    gu = {l: np.asarray(v) for l, v in ck.host_gate_up.items()}
    dn = {l: np.asarray(v) for l, v in ck.host_down.items()}
    t = time.perf_counter()
    print(f"{path}: relative Frobenius error of dequantize(quantize(w)) per precision and "
          f"calibration, group_size={DEFAULT_GROUP_SIZE} (mean / max over "
          f"{len(gu) + len(dn)} layer arrays)")
    print("| precision | calibration | numerics | mean | max |")
    print("|---|---|---|---|---|")
    for p, c, mean, mx in error_table(gu, dn):
        where = "qwix" if (p, c) in QWIX_CALIBRATIONS else "moejax"
        star = " (default)" if DEFAULT_CALIBRATION[p] == c else ""
        print(f"| {p} | {c}{star} | {where} | {mean:.4f} | {mx:.4f} |")
    print(f"({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
