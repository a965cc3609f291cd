"""Layer-stepped decode: milliseconds per generated token of the tiny presets, resident experts.

    python benchmarks/decode_step.py

Measures host dispatch plus compute of one decode step (all layers, two jitted steps per MoE
layer) after warm-up, best of 3 runs of 32 tokens.
"""

from __future__ import annotations

import numpy as np

from moejax.families import FAMILIES, preset
from moejax.testing import random_model, resident_decoder


def main():
    print(f"{'family':10s} {'layers':>6s} {'ms/token':>9s} {'prefill 64 tok ms':>18s}")
    for family in FAMILIES:
        cfg = preset(family, "tiny")
        model, gate_up, down = random_model(cfg)
        dec = resident_decoder(model, gate_up, down, max_len=128)
        prompt = np.zeros((1, 64), np.int32)
        dec.generate(prompt, 3)  # compile prefill and decode shapes
        runs = [dec.generate(prompt, 33) for _ in range(3)]
        per_token = min(r.decode_s / 32 for r in runs)
        prefill = min(r.prefill_s for r in runs)
        print(f"{family:10s} {cfg.num_layers:6d} {per_token * 1e3:9.2f} {prefill * 1e3:18.2f}")


if __name__ == "__main__":
    main()
