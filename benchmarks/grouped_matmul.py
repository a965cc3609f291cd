"""Grouped matmul implementations against one dense matmul of the same rows, on this machine.

    python benchmarks/grouped_matmul.py [--reps=N] [--quick]

Prints, per shape, the time of `tiled` and `ragged_dot` as a ratio to a single dense matmul of
all rows against one expert (the lower bound of the arithmetic), all measured in one process.
The three variants of a shape are timed in alternated rounds (`slot_loads.alternate`: every
round runs each variant once, in a rotated order, after one warm-up call each), so that a busy
spell of the machine hits them alike; each is reported as its median over the rounds with the
min–max spread, and each ratio is one of medians. `--quick`: the small shapes only.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import slot_loads  # benchmarks/slot_loads.py, beside this script: the alternated rounds

from moejax.models import grouped_matmul

SHAPES = [  # (groups, rows, K, N): decode and prefill of OLMoE-like and tiny shapes
    ("decode, OLMoE top-8 over 64", 64, 8, 2048, 2048),
    ("prefill 64 tok, OLMoE", 64, 512, 2048, 2048),
    ("prefill 512 tok, tiny 16x4", 16, 2048, 64, 64),
    ("train batch, 32 experts top-4", 32, 16384, 256, 512),
]
QUICK = [s for s in SHAPES if s[3] * s[4] <= 64 * 64]  # the tiny shape
VARIANTS = ("dense", "tiled", "ragged_dot")


def time_shape(rng, g: int, m: int, k: int, n: int, reps: int) -> dict:
    """The variants of one shape over `reps` alternated rounds: name -> `slot_loads.Timing`."""
    sizes = jnp.asarray(rng.multinomial(m, np.ones(g) / g).astype(np.int32))
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((g, k, n)) * 0.01, jnp.float32)
    dense = jax.jit(lambda x, w: x @ w[0])
    tiled = jax.jit(lambda x, w, s: grouped_matmul(x, w, s, "tiled"))
    ragged = jax.jit(lambda x, w, s: grouped_matmul(x, w, s, "ragged_dot"))
    return slot_loads.alternate({"dense": lambda: dense(x, w),
                                 "tiled": lambda: tiled(x, w, sizes),
                                 "ragged_dot": lambda: ragged(x, w, sizes)}, reps)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7, help="alternated rounds per shape")
    p.add_argument("--quick", action="store_true", help="the small shapes only")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error(f"--reps={args.reps}: must be >= 1")
    rng = np.random.default_rng(0)
    print(f"{args.reps} alternated rounds per shape; each variant: median ms [min-max], and "
          "median / dense's median")
    print(f"{'shape':32s} " + " ".join(f"{v:>34s}" for v in VARIANTS))
    for name, g, m, k, n in (QUICK if args.quick else SHAPES):
        t = time_shape(rng, g, m, k, n, args.reps)
        base = t["dense"].median
        cells = [f"{t[v].median * 1e3:8.3f} [{t[v].min * 1e3:.3f}-{t[v].max * 1e3:.3f}]"
                 + (f" {t[v].median / base:5.1f}x" if v != "dense" else "")
                 for v in VARIANTS]
        print(f"{name:32s} " + " ".join(f"{c:>34s}" for c in cells))


if __name__ == "__main__":
    main()
