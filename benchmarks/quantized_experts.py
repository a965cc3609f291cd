"""The experts step at int8 / int4 / int2 against native, same shapes, on this machine.

    python benchmarks/quantized_experts.py [--reps=N] [--quick]

One compiled `moe_ffn` (the routed part of the experts step) over a pool of slots holding the
same experts at each precision: native bfloat16, and packed int8 / int4 / int2 values with
float16 scales and zero points, unpacked and dequantized inside the step on the tiles it
multiplies (so the unpacking cost is in the time). Also a mixed pool (int8 + int4 + int2 slots,
as `fetch_priority` uses) and the bytes one expert moves at each precision. The pools of one
shape are timed in alternated rounds (`slot_loads.alternate`: after one compiling call each,
every round runs each pool once, in a rotated order), so that a busy spell of the machine hits
them alike; each is reported as its median over `--reps` rounds with the min–max spread, and
its ratio to native as one of medians. `--quick`: the embedded model's shapes only.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import slot_loads  # benchmarks/slot_loads.py, beside this script: the alternated rounds

from moejax.models import moe_ffn
from moejax.quant import formats, quantize

REPS = 7
SHAPES = [  # (name, tokens, top-k, slots, H, I)
    ("OLMoE decode: 1 token, top-8, 16 slots", 1, 8, 16, 2048, 1024),
    ("OLMoE prefill: 64 tokens, top-8, 64 slots", 64, 8, 64, 2048, 1024),
    ("embedded decode: 1 token, top-4, 8 slots", 1, 4, 8, 96, 48),
    ("embedded prefill: 128 tokens, top-4, 32 slots", 128, 4, 32, 96, 48),
]
QUICK = [s for s in SHAPES if s[0].startswith("embedded")]
POOLS = ("native", *formats.QUANTIZED, "mixed")

_step = jax.jit(moe_ffn, static_argnames=("act", "impl"))


def time_shape(rng, n: int, k: int, s: int, h: int, i: int, reps: int) -> dict:
    """The step over each pool of one shape, `reps` alternated rounds: pool -> `Timing`."""
    gu = (rng.standard_normal((s, h, 2 * i)) * h ** -0.5).astype(jnp.bfloat16)
    dn = (rng.standard_normal((s, i, h)) * i ** -0.5).astype(jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((n, h)), jnp.bfloat16)
    ids = jnp.asarray(np.stack([rng.choice(s, k, replace=False) for _ in range(n)]), jnp.int32)
    weights = jnp.full((n, k), 1.0 / k, jnp.float32)
    slot_of = jnp.arange(s, dtype=jnp.int32)
    q = {p: (quantize(gu, p).map(jnp.asarray), quantize(dn, p).map(jnp.asarray))
         for p in formats.QUANTIZED}
    pools = {"native": (jnp.asarray(gu), jnp.asarray(dn))}
    pools.update({p: ((q[p][0],), (q[p][1],)) for p in formats.QUANTIZED})
    # Mixed: the slots split over three pools (a third each).
    cut = [0, s // 3, 2 * s // 3, s]
    pools["mixed"] = tuple(
        tuple(q[p][w].map(lambda a, a0=cut[j], a1=cut[j + 1]: a[a0:a1])
              for j, p in enumerate(formats.QUANTIZED)) for w in (0, 1))
    return slot_loads.alternate(
        {p: (lambda g=g, d=d: _step(x, ids, weights, g, d, slot_of))
         for p, (g, d) in pools.items()}, reps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=REPS, help="alternated rounds per shape")
    ap.add_argument("--quick", action="store_true", help="the embedded model's shapes only")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps={args.reps}: must be >= 1")
    rng = np.random.default_rng(0)
    print(f"{args.reps} alternated rounds per shape; each pool: median us [min-max], and "
          "median / native's median")
    print(f"{'shape':46s} " + " ".join(f"{p:>30s}" for p in POOLS))
    for name, n, k, s, h, i in (QUICK if args.quick else SHAPES):
        t = time_shape(rng, n, k, s, h, i, args.reps)
        base = t["native"].median
        cells = [f"{t[p].median * 1e6:.0f} [{t[p].min * 1e6:.0f}-{t[p].max * 1e6:.0f}]"
                 + (f" {t[p].median / base:5.2f}x" if p != "native" else "") for p in POOLS]
        print(f"{name:46s} " + " ".join(f"{c:>30s}" for c in cells))
    print("\nbytes of one expert (values + f16 scales and zeros, group 64):")
    for name, h, i in (("OLMoE-1B-7B", 2048, 1024), ("Mixtral-8x7B", 4096, 14336),
                       ("embedded", 96, 48)):
        native = formats.expert_bytes(h, i, "native", 64, 2)
        row = ", ".join(f"{p} {formats.expert_bytes(h, i, p, 64, 2) / native:.3f}"
                        for p in formats.QUANTIZED)
        print(f"  {name:14s} native {native / 2**20:8.2f} MiB; as a share of native: {row}")


if __name__ == "__main__":
    main()
