"""Replay throughput: requests per second through the cache, per policy, on the real OLMoE
decode trace (512 steps x 16 layers x top-8 = 65 536 requests) at 5% capacity.

    python benchmarks/replay_throughput.py
"""

from __future__ import annotations

import tempfile
import time

from moejax import jobs
from moejax.bundled import capture_path
from moejax.job_config import base_config

TRACE = capture_path("olmoe_prose")
CASES = [("lru", "none"), ("lru_per_layer", "none"), ("lfu", "none"), ("fld", "none"),
         ("least_stale", "none"), ("fifo", "none"), ("random", "none"), ("belady", "none"),
         ("least_stale", "temporal"), ("least_stale", "oracle"), ("lru", "oracle")]


def main():
    print(f"{'eviction':14s} {'prefetch':10s} {'requests/s':>12s} {'seconds':>8s}")
    for eviction, prefetch in CASES:
        c = base_config()
        c.job, c.trace, c.clock.kind = "replay", TRACE, "virtual"
        c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
        c.cache.capacity_frac = 0.05
        c.policies.eviction, c.policies.prefetch = eviction, prefetch
        c.log.progress = c.log.tensorboard = False
        with tempfile.TemporaryDirectory() as work:
            start = time.perf_counter()
            res = jobs.run(c, work)
            total = time.perf_counter() - start
        print(f"{eviction:14s} {prefetch:10s} {res['replay']['requests_per_s']:12,.0f} "
              f"{total:8.2f}")


if __name__ == "__main__":
    main()
