"""What each precision costs on the device this runs on (on a GPU: the numbers only a GPU gives).

    python benchmarks/device_precision.py

1. host->device transfer of one OLMoE-1B-7B expert (H=2048, I=1024, bfloat16 native) at each
   precision: a raw `jax.device_put` of the same packed arrays from `pinned_host` memory
   against a load through the runtime (`SlotPool.load`: slice from the pinned host table,
   move, write into the donated slot pool); bytes, ms and GB/s of each;
2. overlap of slot loads with an experts step: the step alone, the loads alone, and both
   dispatched together (the loads first, as the runtime dispatches prefetches before the next
   layer's compute); overlap = (alone + alone - together) / the shorter one (1: hidden);
3. wall-clock TTFT and decode tok/s of the embedded model, fully resident and through the
   cache at 5% of the model's bytes, native and int4 (virtual clock off: `clock.kind=wall`).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from moejax.checkpoint import to_host
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import load_model
from moejax.models import SteppedDecoder, moe_ffn
from moejax.quant import formats, quantize
from moejax.serving.build import build_cached_experts, expert_source
from moejax.serving.slot_pool import SlotPool

H, I, E = 2048, 1024, 8  # OLMoE-1B-7B expert shape; E experts in the host table
REPS = 30


def _block(tree):
    for leaf in jax.tree.leaves(tree):
        leaf.block_until_ready()


def best(fn, reps=REPS):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def host_tables(precision):
    rng = np.random.default_rng(0)
    gu = (rng.standard_normal((E, H, 2 * I)) * H ** -0.5).astype(jnp.bfloat16)
    dn = (rng.standard_normal((E, I, H)) * I ** -0.5).astype(jnp.bfloat16)
    if precision != "native":
        gu, dn = quantize(gu, precision), quantize(dn, precision)
    to = (lambda a: a.map(to_host)) if precision != "native" else to_host
    return to(gu), to(dn)


def transfers():
    print("1. one OLMoE expert host->device (median of %d):" % REPS)
    print(f"   {'precision':9s} {'MiB':>7s} {'raw ms':>8s} {'GB/s':>7s} {'runtime ms':>11s} "
          f"{'GB/s':>7s} {'ratio':>6s}")
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
    for p in formats.PRECISIONS:
        gu, dn = host_tables(p)
        one = jax.tree.map(lambda a: to_host(np.asarray(a[3])), (gu, dn))
        nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(one))
        raw = best(lambda: _block(jax.device_put(one, dev)))
        pool = SlotPool(4, {0: gu}, {0: dn})
        runtime = best(lambda: (pool.load((0, 3), 1), _block((pool.gate_up, pool.down))))
        print(f"   {p:9s} {nbytes / 2**20:7.2f} {raw * 1e3:8.3f} {nbytes / raw / 1e9:7.2f} "
              f"{runtime * 1e3:11.3f} {nbytes / runtime / 1e9:7.2f} {runtime / raw:6.2f}")
        # Pipelined: 32 loads dispatched back to back, one wait (what a layer's prefetches do).
        many_raw = best(lambda: _block([jax.device_put(one, dev) for _ in range(32)]), 5)
        many = best(lambda: ([pool.load((0, e % E), e % 4) for e in range(32)],
                             _block((pool.gate_up, pool.down))), 5)
        print(f"   {'':9s} 32 back to back: raw {32 * nbytes / many_raw / 1e9:6.2f} GB/s, "
              f"runtime {32 * nbytes / many / 1e9:6.2f} GB/s")


def overlap():
    print("2. slot loads overlapping an experts step (64 tokens, top-8, 64 slots):")
    rng = np.random.default_rng(1)
    step = jax.jit(moe_ffn, static_argnames=("act", "impl"))
    for p in ("native", "int4"):
        gu, dn = host_tables(p)
        pool = SlotPool(8, {0: gu}, {0: dn})
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
        big_gu = jax.tree.map(lambda a: jax.device_put(np.concatenate([np.asarray(a)] * 8), dev),
                              gu)
        big_dn = jax.tree.map(lambda a: jax.device_put(np.concatenate([np.asarray(a)] * 8), dev),
                              dn)
        pools = ((big_gu,), (big_dn,)) if p != "native" else (big_gu, big_dn)
        x = jnp.asarray(rng.standard_normal((64, H)), jnp.bfloat16)
        ids = jnp.asarray(np.stack([rng.choice(64, 8, replace=False) for _ in range(64)]),
                          jnp.int32)
        w = jnp.full((64, 8), 0.125, jnp.float32)
        slot_of = jnp.arange(64, dtype=jnp.int32)

        def compute():
            return step(x, ids, w, pools[0], pools[1], slot_of)

        def loads():
            for e in range(E):
                pool.load((0, e), e)

        t_compute = best(lambda: compute().block_until_ready(), 10)
        t_loads = best(lambda: (loads(), _block((pool.gate_up, pool.down))), 10)
        t_both = best(lambda: (loads(), compute().block_until_ready(),
                               _block((pool.gate_up, pool.down))), 10)
        hidden = (t_compute + t_loads - t_both) / min(t_compute, t_loads)
        print(f"   {p:7s} step {t_compute * 1e3:7.3f} ms, {E} loads {t_loads * 1e3:7.3f} ms, "
              f"together {t_both * 1e3:7.3f} ms: overlap {hidden:5.2f}")
        # The same bytes as plain device_puts of the host slices (no fused slot write).
        slices = [jax.tree.map(lambda a, e=e: to_host(np.asarray(a[e])), (gu, dn))
                  for e in range(E)]
        t_puts = best(lambda: _block([jax.device_put(one, dev) for one in slices]), 10)
        t_both = best(lambda: _block(([jax.device_put(one, dev) for one in slices],
                                      compute())), 10)
        hidden = (t_compute + t_puts - t_both) / min(t_compute, t_puts)
        print(f"   {'':7s} as device_put: {E} puts {t_puts * 1e3:7.3f} ms, together "
              f"{t_both * 1e3:7.3f} ms: overlap {hidden:5.2f}")


def generation():
    print("3. embedded model, wall clock, 32 tokens after a warm-up (best of 3):")
    prompt = np.frombuffer(b"The expert cache keeps the experts that", np.uint8)[None].astype(
        np.int32)
    for enabled, precision in ((False, "native"), (False, "int4"), (True, "native"),
                               (True, "int4")):
        c = base_config()
        c.clock.kind = "wall"
        c.cache.enabled, c.cache.precision = enabled, precision
        c.cache.capacity_frac, c.cache.capacity_of = 0.05, "model"
        loaded = load_model(resolve(c).model)
        runs = []
        for _ in range(4):
            source = (build_cached_experts(resolve(c), loaded) if enabled
                      else expert_source(resolve(c), loaded))
            dec = SteppedDecoder(loaded.model, source, max_len=prompt.shape[1] + 33, lookahead=2)
            gen = dec.generate(prompt, 32)
            runs.append((gen.prefill_s, 31 / gen.decode_s))
        ttft, tps = min(r[0] for r in runs[1:]), max(r[1] for r in runs[1:])
        what = f"cache 5% of model at {precision}" if enabled else f"resident at {precision}"
        print(f"   {what:30s} TTFT {ttft * 1e3:7.2f} ms, decode {tps:7.1f} tok/s")


def main():
    print(f"backend {jax.default_backend()}, device {jax.devices()[0].device_kind}")
    transfers()
    overlap()
    generation()


if __name__ == "__main__":
    main()
