"""Pinned host memory held by copy_stream runtimes built from one loaded model:

    python benchmarks/host_memory.py [--runtimes 2] [--olmoe-layer]

The embedded model (`configs/default.py`'s) with `cache.load_path=copy_stream` at 25%: the
runtimes are built one after the other from one `load_model` and all kept; after each, the
bytes of every live JAX array in `pinned_host` memory (`jax.live_arrays()`) and the build's
wall time, against the experts' own bytes (DESIGN "Records"). `--olmoe-layer`: also the time
to cut one layer of OLMoE-1B-7B's real size (64 experts of 12.6 MB, bfloat16, zeros) into
records, twice: what each runtime paid per layer before the records were shared."""

from __future__ import annotations

import argparse
import gc
import time

import jax
import jax.numpy as jnp
import numpy as np

from moejax import checkpoint
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import load_model
from moejax.serving.build import build_cached_experts
from moejax.serving.slot_pool import HostRecords


def pinned_bytes() -> int:
    gc.collect()
    return sum(a.nbytes for a in jax.live_arrays() if a.sharding.memory_kind == "pinned_host")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtimes", type=int, default=2, help="runtimes built and kept")
    parser.add_argument("--olmoe-layer", action="store_true",
                        help="also time cutting one OLMoE-1B-7B layer into records")
    args = parser.parse_args()
    if args.runtimes < 1:
        parser.error(f"--runtimes={args.runtimes}: the runtimes to build, 1 or more")
    config = base_config()
    config.cache.load_path, config.cache.capacity_frac = "copy_stream", 0.25
    loaded = load_model(resolve(config).model)
    experts = sum(a.nbytes for table in loaded.experts_at("native") for a in table.values())
    print(f"experts {experts / 2**20:.2f} MiB; pinned host before any runtime "
          f"{pinned_bytes() / 2**20:.2f} MiB")
    kept = []
    for i in range(args.runtimes):
        start = time.perf_counter()
        kept.append(build_cached_experts(resolve(config), loaded))
        seconds = time.perf_counter() - start
        print(f"runtime {i + 1}: built in {seconds * 1e3:.1f} ms; pinned host "
              f"{pinned_bytes() / 2**20:.2f} MiB")
    if args.olmoe_layer:
        e, h, i = 64, 2048, 1024
        for rep in range(2):
            gate_up = {0: checkpoint.to_host(np.zeros((e, h, 2 * i), jnp.bfloat16))}
            down = {0: checkpoint.to_host(np.zeros((e, i, h), jnp.bfloat16))}
            start = time.perf_counter()
            records = HostRecords.of(gate_up, down, consume=True)
            jax.block_until_ready(records.records)
            print(f"one OLMoE-1B-7B layer ({e} experts, {2 * e * h * i * 3 / 2**20:.0f} MiB) "
                  f"cut into records: {time.perf_counter() - start:.2f} s")
            del records


if __name__ == "__main__":
    main()
