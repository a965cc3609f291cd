"""Replay throughput: requests per second through the cache, per policy, on the real OLMoE
decode capture (512 steps x 16 layers x top-8 = 65 536 requests) at 5% capacity, on both
replay engines (`replay.engine`: the policy objects, and the compiled engine where it
applies), in one process; the two must give the same cache results.

    python benchmarks/replay_throughput.py

`requests_per_s` is the replay job's own figure (requests / seconds in `replay()`: the compiled
engine's preparation, the predictions taken from the prefetch policy included; the trace import
and results excluded). noisy_oracle's memo of its predictions is cleared before each run, so
neither engine reuses the other's draws.
"""

from __future__ import annotations

import tempfile

from moejax import jobs
from moejax.bundled import capture_path
from moejax.jobs.schema import base_config
from moejax.policies import prefetch as prefetch_policies

TRACE = capture_path("olmoe_prose")
CASES = [("lru", "none", "immediate"), ("fifo", "none", "immediate"),
         ("lru_per_layer", "none", "immediate"), ("lfu", "none", "immediate"),
         ("fld", "none", "immediate"), ("least_stale", "none", "immediate"),
         ("random", "none", "immediate"), ("belady", "none", "immediate"),
         ("least_stale", "temporal", "immediate"), ("least_stale", "oracle", "immediate"),
         ("least_stale", "noisy_oracle(precision=0.6)", "watchdog"),
         ("least_stale", "temporal", "watchdog"), ("lru", "oracle", "immediate"),
         ("belady", "oracle", "watchdog")]


def _run(eviction: str, prefetch: str, queue: str, engine: str) -> dict:
    c = base_config()
    c.job, c.replay.trace, c.clock.kind = "replay", TRACE, "virtual"
    c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
    c.cache.capacity_frac = 0.05
    c.cache.prefetch_queue, c.replay.engine = queue, engine
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    c.log.progress = c.log.tensorboard = False
    prefetch_policies.NOISY_MEMO.clear()  # each run draws noisy_oracle's predictions itself
    with tempfile.TemporaryDirectory() as work:
        return jobs.run(c, work)


def main():
    _run("lru", "none", "immediate", "auto")  # the kernel's first load (numba's disk cache)
    print("| eviction | prefetch | queue | reference req/s | engine | req/s | speed-up |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    for eviction, prefetch, queue in CASES:
        ref = _run(eviction, prefetch, queue, "reference")
        auto = _run(eviction, prefetch, queue, "auto")
        if auto["cache"] != ref["cache"]:
            raise SystemExit(f"{eviction}/{prefetch}/{queue}: the engines disagree")
        r, a = ref["replay"]["requests_per_s"], auto["replay"]["requests_per_s"]
        print(f"| {eviction} | {prefetch} | {queue} | {r:,.0f} | {auto['replay']['engine']} | "
              f"{a:,.0f} | {a / r:.1f}x |".replace(",", " "))


if __name__ == "__main__":
    main()
