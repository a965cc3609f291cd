"""Slot loads on the device this runs on: the two load paths (`cache.load_path`,
moejax/serving/slot_pool.py) against a raw transfer, and how much of a load hides behind an
experts step.

    python benchmarks/slot_loads.py [--quick] [--reps=N] [--hidden=H --intermediate=I]

Every time is the wall clock (`time.perf_counter`) from dispatching a piece of work to the
return of `block_until_ready` on its outputs; the pieces of one table are run in alternated
rounds (each round runs every piece once, in a rotated order) so that a busy spell of the
machine hits them alike, and each is reported as min / median / max over the rounds.

`h2d_fraction` and `overlap_fraction` are what `benchmarks/gpu_check.py` reuses:

* **h2d_fraction(precision, load_path)**: the host->device rate of a runtime load against a
  raw copy. A wave of `wave` experts (OLMoE-1B-7B's shape by default, native bfloat16 or
  packed int4) sits in `pinned_host` memory; "raw" is one `jax.device_put` of the wave's
  per-expert host arrays to device memory; "load" is `SlotPools.load_many` of the same wave
  into a slot pool, placed (`SlotPools.arrays`). fraction = median raw / median load: 1.0
  is a load as fast as the raw copy (the goal: >= 0.9 on a GPU).
* **overlap_fraction(precision, load_path)**: the share of a wave's load time hidden behind a
  concurrently running experts step, when the step is longer than the load. The step
  (`moe_ffn` over the pool being loaded, `tokens` tokens, top-k over the wave's experts) is
  dispatched first and the loads after it, as the runtime dispatches a layer's prefetches
  after its experts step; the loads are then placed (`SlotPools.arrays`, as the next step's
  read does) and everything waited for. With T_step, T_load each alone and T_both together
  (medians): overlap = (T_step + T_load - T_both) / T_load — 1.0: the load is hidden, 0.0:
  it runs after the step. `tokens=None` doubles the tokens from 64 until T_step >= 1.5
  T_load (the result says whether it got there: `compute_longer`).

On the CPU backend there is no copy stream: the transfer and the step share the cores, and
copy_stream moves the bytes twice (the copy, then the placement), which is why
`cache.load_path=auto` takes fused there.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from moejax.checkpoint import to_host
from moejax.models import moe_ffn
from moejax.quant import quantize
from moejax.serving.slot_pool import SlotPool, SlotPools

HIDDEN, INTERMEDIATE = 2048, 1024  # OLMoE-1B-7B's expert
PATHS = ("fused", "copy_stream")


@dataclasses.dataclass
class Timing:
    """Wall seconds of one piece of work over the alternated rounds."""

    samples: list[float]

    @property
    def min(self) -> float:
        return float(np.min(self.samples))

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def max(self) -> float:
        return float(np.max(self.samples))

    def ms(self) -> str:
        return f"{self.min * 1e3:.3f} / {self.median * 1e3:.3f} / {self.max * 1e3:.3f}"


def alternate(pieces: dict[str, Callable[[], object]], reps: int) -> dict[str, Timing]:
    """Each piece run once to warm up (compilations), then `reps` rounds running every piece
    once, the order rotated each round; a piece's time ends when its outputs are ready."""
    names = list(pieces)
    for name in names:
        jax.block_until_ready(pieces[name]())
    samples = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            jax.block_until_ready(pieces[name]())
            samples[name].append(time.perf_counter() - start)
    return {name: Timing(s) for name, s in samples.items()}


def host_tables(precision: str, experts: int, hidden: int, intermediate: int, seed: int = 0):
    """`(gate_up, down)` of `experts` experts in pinned host memory, bfloat16 or packed."""
    rng = np.random.default_rng(seed)
    gate_up = (rng.standard_normal((experts, hidden, 2 * intermediate)) * hidden ** -0.5)
    down = (rng.standard_normal((experts, intermediate, hidden)) * intermediate ** -0.5)
    gate_up, down = gate_up.astype(jnp.bfloat16), down.astype(jnp.bfloat16)
    if precision == "native":
        return to_host(gate_up), to_host(down)
    return quantize(gate_up, precision).map(to_host), quantize(down, precision).map(to_host)


@dataclasses.dataclass
class Wave:
    """A wave of experts in host memory and, per load path, a slot pool it is loaded into."""

    precision: str
    tables: tuple
    pools: dict[str, SlotPools]
    raw: list  # each expert's own host arrays (what a raw device_put moves)
    nbytes: int

    @property
    def loads(self) -> list:
        return [((0, e), e) for e in range(len(self.raw))]

    def load(self, load_path: str):
        pools = self.pools[load_path]
        pools.load_many(self.loads)
        return pools.arrays()

    def raw_put(self):
        return jax.device_put(self.raw, _device())


def _device():
    return jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")


def make_wave(precision: str = "native", wave: int = 8, hidden: int = HIDDEN,
              intermediate: int = INTERMEDIATE, paths=PATHS) -> Wave:
    gate_up, down = host_tables(precision, wave, hidden, intermediate)
    raw = [jax.tree.map(lambda a, e=e: to_host(np.asarray(a)[e]), (gate_up, down))
           for e in range(wave)]
    pools = {p: SlotPools([SlotPool(wave, {0: gate_up}, {0: down}, load_path=p)])
             for p in paths}
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(raw))
    return Wave(precision, (gate_up, down), pools, raw, nbytes)


def h2d_times(w: Wave, reps: int = 10) -> dict[str, Timing]:
    """"raw" and each load path's time for the wave `w`, alternated."""
    pieces = {"raw": w.raw_put}
    pieces.update({p: (lambda p=p: w.load(p)) for p in w.pools})
    return alternate(pieces, reps)


def h2d_fraction(precision: str = "native", load_path: str = "copy_stream", *, wave: int = 8,
                 hidden: int = HIDDEN, intermediate: int = INTERMEDIATE,
                 reps: int = 10) -> dict:
    """A runtime load's host->device rate as a share of a raw `device_put`'s (the module
    docstring): {"fraction", "raw", "load" (Timings), "bytes" (of the wave)}."""
    w = make_wave(precision, wave, hidden, intermediate, (load_path,))
    t = h2d_times(w, reps)
    return {"fraction": t["raw"].median / t[load_path].median, "raw": t["raw"],
            "load": t[load_path], "bytes": w.nbytes}


def _experts_step(w: Wave, load_path: str, tokens: int, top_k: int):
    """The experts step over the pool `load_path` loads into (`tokens` tokens, top-k of the
    wave's experts, every slot filled): a function dispatching it on the pool as it is."""
    rng = np.random.default_rng(1)
    n = len(w.raw)
    k = min(top_k, n)
    hidden = jax.tree.leaves(w.raw[0][1])[0].shape[-1]  # down [I, H] (packed: [I*b/8, H])
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.bfloat16)
    ids = jnp.asarray(np.stack([rng.choice(n, k, replace=False) for _ in range(tokens)]),
                      jnp.int32)
    weights = jnp.full((tokens, k), 1.0 / k, jnp.float32)
    slot_of = jnp.arange(n, dtype=jnp.int32)
    step = jax.jit(moe_ffn, static_argnames=("act", "impl"))
    pools = w.pools[load_path]
    w.load(load_path)  # every slot holds its expert

    def run():
        gate_up, down = pools.arrays()
        return step(x, ids, weights, gate_up, down, slot_of)

    return run


def overlap_times(w: Wave, load_path: str, tokens: int, top_k: int = 8,
                  reps: int = 10) -> dict[str, Timing]:
    """"step", "load" and "both" (the step dispatched, then the loads, then placed) for the
    wave `w` along `load_path`, alternated."""
    step = _experts_step(w, load_path, tokens, top_k)

    def both():
        out = step()
        return out, w.load(load_path)

    return alternate({"step": step, "load": lambda: w.load(load_path), "both": both}, reps)


def overlap_fraction(precision: str = "native", load_path: str = "copy_stream", *,
                     wave: int = 8, tokens: int | None = None, top_k: int = 8,
                     hidden: int = HIDDEN, intermediate: int = INTERMEDIATE,
                     reps: int = 10) -> dict:
    """The share of the wave's load time hidden behind an experts step dispatched before it
    (the module docstring): {"overlap", "step", "load", "both" (Timings), "tokens",
    "compute_longer" (whether the step's median is at least the load's)}."""
    w = make_wave(precision, wave, hidden, intermediate, (load_path,))
    if tokens is None:
        tokens = 64
        load = alternate({"load": lambda: w.load(load_path)}, 3)["load"].median
        while tokens < 16384:
            step = alternate({"step": _experts_step(w, load_path, tokens, top_k)}, 3)["step"]
            if step.median >= 1.5 * load:
                break
            tokens *= 2
    t = overlap_times(w, load_path, tokens, top_k, reps)
    hidden_s = t["step"].median + t["load"].median - t["both"].median
    return {"overlap": hidden_s / t["load"].median, "step": t["step"], "load": t["load"],
            "both": t["both"], "tokens": tokens,
            "compute_longer": t["step"].median >= t["load"].median}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small experts (H=256, I=128) and 5 rounds: the code paths only")
    parser.add_argument("--reps", type=int, default=None, help="alternated rounds (10)")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None,
                        help="the experts step's tokens (default: doubled from 64 until the "
                             "step is 1.5x the loads)")
    args = parser.parse_args()
    hidden = args.hidden or (256 if args.quick else HIDDEN)
    inter = args.intermediate or (128 if args.quick else INTERMEDIATE)
    reps = args.reps or (5 if args.quick else 10)
    print(f"backend {jax.default_backend()}, device {jax.devices()[0].device_kind}; experts "
          f"H={hidden} I={inter} (bfloat16 / int4); wall clock, ms min / median / max over "
          f"{reps} alternated rounds")
    print("1. host->device of a wave from pinned host: raw device_put against each load path "
          "(fraction = median raw / median load)")
    print(f"   {'precision':9s} {'wave':>4s} {'MiB':>7s}  {'raw':>24s}  {'fused':>24s}  "
          f"{'copy_stream':>24s}  {'fused':>5s} {'copy':>5s}")
    for precision in ("native", "int4"):
        for size in (1, 8):
            w = make_wave(precision, size, hidden, inter)
            t = h2d_times(w, reps)
            raw = t["raw"].median
            print(f"   {precision:9s} {size:4d} {w.nbytes / 2**20:7.2f}  {t['raw'].ms():>24s}  "
                  f"{t['fused'].ms():>24s}  {t['copy_stream'].ms():>24s}  "
                  f"{raw / t['fused'].median:5.2f} {raw / t['copy_stream'].median:5.2f}")
    print("2. a wave of 8 loads behind an experts step dispatched before it (top-8): overlap = "
          "(step + load - both) / load")
    print(f"   {'precision':9s} {'path':11s} {'tokens':>6s}  {'step':>24s}  {'load':>24s}  "
          f"{'both':>24s}  {'overlap':>7s}")
    for precision in ("native", "int4"):
        for path in PATHS:
            r = overlap_fraction(precision, path, tokens=args.tokens, hidden=hidden,
                                 intermediate=inter, reps=reps)
            note = "" if r["compute_longer"] else "  (step shorter than the load)"
            print(f"   {precision:9s} {path:11s} {r['tokens']:6d}  {r['step'].ms():>24s}  "
                  f"{r['load'].ms():>24s}  {r['both'].ms():>24s}  {r['overlap']:7.2f}{note}")


if __name__ == "__main__":
    main()
