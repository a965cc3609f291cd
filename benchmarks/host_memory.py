"""Pinned host memory held by copy_stream runtimes built from one loaded model:

    python benchmarks/host_memory.py [--runtimes 2]

The embedded model (`configs/default.py`'s) with `cache.load_path=copy_stream` at 25%: the
runtimes are built one after the other from one `load_model` and all kept; after each, the
bytes of every live JAX array in `pinned_host` memory (`jax.live_arrays()`) and the build's
wall time, against the experts' own bytes (DESIGN "Records")."""

from __future__ import annotations

import argparse
import gc
import time

import jax

from moejax.jobs.schema import base_config
from moejax.model_source import load_model
from moejax.serving.build import build_cached_experts


def pinned_bytes() -> int:
    gc.collect()
    return sum(a.nbytes for a in jax.live_arrays() if a.sharding.memory_kind == "pinned_host")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtimes", type=int, default=2, help="runtimes built and kept")
    args = parser.parse_args()
    config = base_config()
    config.cache.load_path, config.cache.capacity_frac = "copy_stream", 0.25
    loaded = load_model(config.model)
    experts = sum(a.nbytes for table in loaded.experts_at("native") for a in table.values())
    print(f"experts {experts / 2**20:.2f} MiB; pinned host before any runtime "
          f"{pinned_bytes() / 2**20:.2f} MiB")
    kept = []
    for i in range(args.runtimes):
        start = time.perf_counter()
        kept.append(build_cached_experts(config, loaded))
        seconds = time.perf_counter() - start
        print(f"runtime {i + 1}: built in {seconds * 1e3:.1f} ms; pinned host "
              f"{pinned_bytes() / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
