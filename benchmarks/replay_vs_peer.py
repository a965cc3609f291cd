"""moejax's trace replay against a peer simulator, bigrig 0.9.1 (`bigrig_engine.pool`:
`simulate` with its `LRU`, and `belady`; Apache-2.0, pure standard library, hits and misses
only), on the same request stream, side by side in one process.

    pip install -e '.[bench]'         # bigrig==0.9.1; this script installs nothing
    python benchmarks/replay_vs_peer.py [--reps=3]

The stream: the shipped real captures (OLMoE-1B-7B and Qwen1.5-MoE-A2.7B, prose and code), every
pass's MoE layers in order and each layer's experts in router-rank order, as one global stream
of `(layer, expert)` keys (bigrig sees `position * E + expert` over `L * E` experts). The cache
holds 5% and 25% of all experts (`cache.slots`). moejax runs its full replay — the policy
objects, every counter per layer, the virtual clock — with `cache.pin_scope=request` (only the
incoming expert is protected, as in bigrig), no prefetch, fetch, standard routing; its hits
(ready + late) must equal bigrig's, which the script checks. Without bigrig it times moejax
alone. Requests/s are medians over `--reps` timed runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from moejax import bundled
from moejax.cache import build_cache_for
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.replay.engine import replay
from moejax.seam import requests_in_rank_order
from moejax.traces import load_traces

CAPACITIES = (0.05, 0.25)
POLICIES = ("lru", "belady")


def stream(trace) -> list[tuple[int, int]]:
    """`(layer position, expert)` of every request, pass by pass, layer by layer, rank order."""
    out = []
    for p in range(trace.num_passes):
        rows = trace.ids[trace.pass_rows(p)]
        for pos in range(rows.shape[1]):
            out.extend((pos, e) for e in requests_in_rank_order(rows[:, pos]))
    return out


def moejax_run(trace, slots: int, eviction: str) -> tuple[float, int, int]:
    """Seconds, hits (ready + late), requests of one full replay."""
    c = base_config()
    c.cache.slots, c.cache.pin_scope = slots, "request"
    c.policies.eviction, c.policies.prefetch = eviction, "none"
    c.policies.miss, c.policies.routing = "fetch", "standard"
    c.clock.kind = "virtual"
    cache = build_cache_for(resolve(c), None, {"native": 1}, False, layers=tuple(trace.layers),
                            num_layers=max(trace.layers) + 1, num_experts=trace.num_experts,
                            top_k=trace.top_k)
    start = time.perf_counter()
    replay(cache, [trace])
    seconds = time.perf_counter() - start
    t = cache.metrics.totals()
    return seconds, t["hits"] + t["late_hits"], t["requests"]


def peer_run(pool, keys: list[int], slots: int, n: int, eviction: str) -> tuple[float, int]:
    start = time.perf_counter()
    if eviction == "lru":
        out = pool.simulate(keys, slots, n, pool.LRU)
    else:
        out = pool.belady(keys, slots)
    return time.perf_counter() - start, out["hits"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    try:
        from bigrig_engine import pool
    except ImportError:
        pool = None
        print("bigrig is not installed (pip install -e '.[bench]'): timing moejax alone")
    print(f"{'trace':12s} {'cap':>4s} {'policy':7s} {'requests':>9s} {'moejax req/s':>13s} "
          f"{'bigrig req/s':>13s} {'ratio':>6s} {'hits':>7s}")
    ratios = {p: [] for p in POLICIES}
    (first,) = load_traces(bundled.capture_files()[0])
    moejax_run(first, len(first.layers) * first.num_experts // 20, "lru")  # loads the kernel
    for path in bundled.capture_files():
        (trace,) = load_traces(path)
        name = path.rsplit("/", 1)[-1].removesuffix(".jsonl")
        requests = stream(trace)
        e = trace.num_experts
        keys = [pos * e + x for pos, x in requests]
        total = len(trace.layers) * e
        for capacity in CAPACITIES:
            slots = int(capacity * total)
            for policy in POLICIES:
                ours = [moejax_run(trace, slots, policy) for _ in range(args.reps)]
                seconds = statistics.median(r[0] for r in ours)
                hits, n = ours[0][1], ours[0][2]
                assert n == len(requests), (n, len(requests))
                line = (f"{name:12s} {capacity:4.0%} {policy:7s} {n:9d} "
                        f"{n / seconds:13,.0f}")
                if pool is not None:
                    theirs = [peer_run(pool, keys, slots, total, policy)
                              for _ in range(args.reps)]
                    peer_s = statistics.median(r[0] for r in theirs)
                    if theirs[0][1] != hits:
                        raise SystemExit(f"{name} {capacity} {policy}: moejax {hits} hits, "
                                         f"bigrig {theirs[0][1]}")
                    ratio = peer_s / seconds
                    ratios[policy].append(ratio)
                    line += f" {n / peer_s:13,.0f} {ratio:6.2f}"
                else:
                    line += f" {'-':>13s} {'-':>6s}"
                print(line + f" {hits:7d}")
    if pool is not None:
        for policy, r in ratios.items():
            print(f"{policy}: moejax / bigrig speed {min(r):.2f}-{max(r):.2f} "
                  f"(median {statistics.median(r):.2f}); identical hits everywhere")


if __name__ == "__main__":
    main()
