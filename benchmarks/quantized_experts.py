"""The experts step at int8 / int4 / int2 against native, same shapes, on this machine.

    python benchmarks/quantized_experts.py

One compiled `moe_ffn` (the routed part of the experts step) over a pool of slots holding the
same experts at each precision: native bfloat16, and packed int8 / int4 / int2 values with
float16 scales and zero points, unpacked and dequantized inside the step on the tiles it
multiplies (so the unpacking cost is in the time). Also a mixed pool (int8 + int4 + int2 slots,
as `fetch_priority` uses) and the bytes one expert moves at each precision. Times are the best
of `REPS` after compilation; the ratio to native is measured in the same process.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from moejax.models.experts import moe_ffn
from moejax.quant import formats
from moejax.quant.quantize import quantize

REPS = 7
SHAPES = [  # (name, tokens, top-k, slots, H, I)
    ("OLMoE decode: 1 token, top-8, 16 slots", 1, 8, 16, 2048, 1024),
    ("OLMoE prefill: 64 tokens, top-8, 64 slots", 64, 8, 64, 2048, 1024),
    ("embedded decode: 1 token, top-4, 8 slots", 1, 4, 8, 96, 48),
    ("embedded prefill: 128 tokens, top-4, 32 slots", 128, 4, 32, 96, 48),
]

_step = jax.jit(moe_ffn, static_argnames=("act", "impl"))


def best_of(fn, *args) -> float:
    fn(*args).block_until_ready()
    best = float("inf")
    for _ in range(REPS):
        t = time.perf_counter()
        fn(*args).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    rng = np.random.default_rng(0)
    print(f"{'shape':46s} {'native us':>10s} " +
          " ".join(f"{p:>7s}" for p in (*formats.QUANTIZED, "mixed")) + "   (x native)")
    for name, n, k, s, h, i in SHAPES:
        gu = (rng.standard_normal((s, h, 2 * i)) * h ** -0.5).astype(jnp.bfloat16)
        dn = (rng.standard_normal((s, i, h)) * i ** -0.5).astype(jnp.bfloat16)
        x = jnp.asarray(rng.standard_normal((n, h)), jnp.bfloat16)
        ids = jnp.asarray(np.stack([rng.choice(s, k, replace=False) for _ in range(n)]),
                          jnp.int32)
        weights = jnp.full((n, k), 1.0 / k, jnp.float32)
        slot_of = jnp.arange(s, dtype=jnp.int32)
        native = best_of(_step, x, ids, weights, jnp.asarray(gu), jnp.asarray(dn), slot_of)
        ratios = []
        q = {p: (quantize(gu, p).map(jnp.asarray), quantize(dn, p).map(jnp.asarray))
             for p in formats.QUANTIZED}
        for p in formats.QUANTIZED:
            t = best_of(_step, x, ids, weights, (q[p][0],), (q[p][1],), slot_of)
            ratios.append(t / native)
        # Mixed: the slots split over three pools (a third each).
        cut = [0, s // 3, 2 * s // 3, s]
        mixed_gu = tuple(q[p][0].map(lambda a, a0=cut[j], a1=cut[j + 1]: a[a0:a1])
                         for j, p in enumerate(formats.QUANTIZED))
        mixed_dn = tuple(q[p][1].map(lambda a, a0=cut[j], a1=cut[j + 1]: a[a0:a1])
                         for j, p in enumerate(formats.QUANTIZED))
        ratios.append(best_of(_step, x, ids, weights, mixed_gu, mixed_dn, slot_of) / native)
        print(f"{name:46s} {native * 1e6:10.0f} " + " ".join(f"{r:6.2f}x" for r in ratios))
    print("\nbytes of one expert (values + f16 scales and zeros, group 64):")
    for name, h, i in (("OLMoE-1B-7B", 2048, 1024), ("Mixtral-8x7B", 4096, 14336),
                       ("embedded", 96, 48)):
        native = formats.expert_bytes(h, i, "native", 64, 2)
        row = ", ".join(f"{p} {formats.expert_bytes(h, i, p, 64, 2) / native:.3f}"
                        for p in formats.QUANTIZED)
        print(f"  {name:14s} native {native / 2**20:8.2f} MiB; as a share of native: {row}")


if __name__ == "__main__":
    main()
