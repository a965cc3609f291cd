"""Grouped matmul implementations against one dense matmul of the same rows, on this machine.

    python benchmarks/grouped_matmul.py

Prints, per shape, the time of `tiled` and `ragged_dot` as a ratio to a single dense matmul of
all rows against one expert (the lower bound of the arithmetic), all measured in one process.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from moejax.models.experts import grouped_matmul

SHAPES = [  # (groups, rows, K, N): decode and prefill of OLMoE-like and tiny shapes
    ("decode, OLMoE top-8 over 64", 64, 8, 2048, 2048),
    ("prefill 64 tok, OLMoE", 64, 512, 2048, 2048),
    ("prefill 512 tok, tiny 16x4", 16, 2048, 64, 64),
    ("train batch, 32 experts top-4", 32, 16384, 256, 512),
]


def timeit(f, *args, reps: int = 5) -> float:
    f(*args).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(*args).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    rng = np.random.default_rng(0)
    print(f"{'shape':34s} {'dense ms':>9s} {'tiled':>8s} {'ragged':>8s}")
    for name, g, m, k, n in SHAPES:
        sizes = jnp.asarray(rng.multinomial(m, np.ones(g) / g).astype(np.int32))
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((g, k, n)) * 0.01, jnp.float32)
        dense = timeit(jax.jit(lambda x, w: x @ w[0]), x, w)
        tiled = timeit(jax.jit(lambda x, w, s: grouped_matmul(x, w, s, "tiled")), x, w, sizes)
        ragged = timeit(jax.jit(lambda x, w, s: grouped_matmul(x, w, s, "ragged_dot")), x, w,
                        sizes)
        print(f"{name:34s} {dense * 1e3:9.2f} {tiled / dense:7.1f}x {ragged / dense:7.1f}x")


if __name__ == "__main__":
    main()
