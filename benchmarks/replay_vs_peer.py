"""moejax's trace replay against two peer simulators, on the same request streams, side by side
in one process: bigrig 0.9.1 (`bigrig_engine.pool`: `simulate` with its `LRU`, and `belady`;
Apache-2.0, pure standard library) and boyle 0.2.1 (`boyle.trace._lru_hit_rate`, the LRU it
builds its capacity curves with; Apache-2.0, pure standard library but for an import of its
MLX runtime module, which a stub replaces here: nothing of it runs).

    pip install -e '.[bench]'   # bigrig==0.9.1, boyle==0.2.1; this script installs nothing
    python benchmarks/replay_vs_peer.py [--reps=3] [--repeat=1] [--strict=SPEC]

The streams: the shipped real captures (OLMoE-1B-7B and Qwen1.5-MoE-A2.7B, prose and code),
every pass's MoE layers in order and each layer's experts in router-rank order, replayed
`--repeat` times through one cache (`--repeat=1,8`: each length in turn). What each computes:

* bigrig, `simulate(keys, slots, n, LRU)` and `belady(keys, slots)`: one sequence's hits and
  misses. It gets the whole stream as one sequence of `position * E + expert` keys over `L * E`
  experts, a cache of 5% and 25% of all experts; moejax runs global `lru` and `belady` with as
  many slots. Their hits must be equal (checked).
* boyle, `_lru_hit_rate(seq, capacity)`: the hit rate of one sequence through an LRU of
  `capacity` slots. Run once per layer on that layer's requests, a per-layer LRU with a strict
  quota: each layer holds at most its own slots. Per layer 25% and 50% of its experts (16 and 32
  slots of OLMoE's 64); moejax runs `lru_per_layer` with `L x` those slots (the same quota each).
  moejax's `lru_per_layer` lets a layer exceed its share while free slots remain, so its hits
  differ (the table gives moejax's minus boyle's); a strict variant of it, where the registry
  has one (`--strict=SPEC`, else found by an argument or name saying "strict"), must count
  exactly boyle's hits in every layer (checked).
* moejax, in each of those times: its full replay of the stream — the policy's victims, every
  counter per layer (requests, hits, late hits, misses, collisions, bytes, stall), each pass's
  time on the virtual clock, the final residency — with `cache.pin_scope=request` (only the
  incoming expert is protected), no prefetch, fetch, standard routing; the engine `auto` picks
  (the compiled one for these policies). Hits are its ready + late hits.

Requests/s are medians over `--reps` timed runs; the ratio is moejax's speed over the peer's.
A peer that is not installed is left out (moejax is timed alone).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types

import numpy as np

from moejax import bundled
from moejax.cache import build_cache_for
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.policies import check as check_policy
from moejax.policies import names, policy_class
from moejax.replay.engine import replay
from moejax.seam import requests_in_rank_order
from moejax.traces import Trace, load_traces

CAPACITIES = (0.05, 0.25)  # of all experts: bigrig's global caches
POLICIES = ("lru", "belady")
LAYER_CAPACITIES = (0.25, 0.5)  # of a layer's experts: boyle's per-layer caches


def load_bigrig():
    try:
        from bigrig_engine import pool
    except ImportError:
        return None
    return pool


def load_boyle():
    """`boyle.trace`, its runtime module (MLX, Apple silicon) stubbed: the LRU uses none of it."""
    sys.modules.setdefault("boyle._runtime", types.ModuleType("boyle._runtime"))
    try:
        import boyle.trace
    except ImportError:
        return None
    return boyle.trace


def strict_spec(given: str | None) -> str | None:
    """The eviction spec of a per-layer LRU with a strict quota, if moejax has one: `given`,
    else an `lru_per_layer` argument whose name or declared values say "strict", else a
    registered eviction whose name has both "per_layer" and "strict"."""
    if given:
        return given
    cls = policy_class("eviction", "lru_per_layer")
    for arg, domain in getattr(cls, "ARGS", {}).items():
        values = getattr(domain, "values", None) or ((True,) if "strict" in arg else ())
        for v in values:
            if "strict" in arg and v is True or isinstance(v, str) and "strict" in v:
                return f"lru_per_layer({arg}={v!r})"
    for name in names("eviction"):
        if "per_layer" in name and "strict" in name:
            return name
    return None


def repeated(trace: Trace, n: int) -> Trace:
    """`trace` (decode passes of one token each) replayed `n` times in a row."""
    if n == 1:
        return trace
    rows = int(trace.pass_offsets[-1])
    assert trace.num_passes == rows, "one token per pass"
    return Trace(dict(trace.meta), np.arange(rows * n + 1, dtype=np.int64),
                 np.tile(trace.tokens, n), np.tile(trace.ids, (n, 1, 1)))


def stream(trace) -> list[tuple[int, int]]:
    """`(layer position, expert)` of every request, pass by pass, layer by layer, rank order."""
    out = []
    for p in range(trace.num_passes):
        rows = trace.ids[trace.pass_rows(p)]
        for pos in range(rows.shape[1]):
            out.extend((pos, e) for e in requests_in_rank_order(rows[:, pos]))
    return out


def moejax_run(trace, slots: int, eviction: str) -> tuple[float, list[int], int]:
    """Seconds, hits (ready + late) per layer, requests of one full replay."""
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
    m = cache.metrics.c
    return (seconds, [h + late for h, late in zip(m["hits"], m["late_hits"])],
            sum(m["requests"]))


def bigrig_run(pool, keys: list[int], slots: int, n: int, eviction: str) -> tuple[float, int]:
    start = time.perf_counter()
    if eviction == "lru":
        out = pool.simulate(keys, slots, n, pool.LRU)
    else:
        out = pool.belady(keys, slots)
    return time.perf_counter() - start, out["hits"]


def boyle_run(trace_mod, seqs: list[list[int]], capacity: int) -> tuple[float, list[int]]:
    """Seconds and hits per layer of boyle's LRU over each layer's sequence (its hit rate
    times the sequence's length, exact for these lengths)."""
    start = time.perf_counter()
    rates = [trace_mod._lru_hit_rate(seq, capacity) for seq in seqs]
    seconds = time.perf_counter() - start
    return seconds, [round(r * len(seq)) for r, seq in zip(rates, seqs)]


def _lengths(text: str) -> list[int]:
    """`--repeat`: a comma-separated list of positive integers."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers joined by "
                                         f"commas, e.g. 1,8,32")
    return out


def _timed(fn, reps: int):
    runs = [fn() for _ in range(reps)]
    return statistics.median(r[0] for r in runs), runs[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--repeat", default=[1], type=_lengths,
                        help="stream lengths, in captures replayed through one cache: 1,8")
    parser.add_argument("--strict", default=None,
                        help="moejax's strict per-layer LRU spec (default: found in the registry)")
    parser.add_argument("--part", choices=("all", "bigrig", "boyle"), default="all")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps={args.reps}: must be >= 1")
    repeats = args.repeat
    pool, boyle = load_bigrig(), load_boyle()
    strict = strict_spec(args.strict)
    if strict is not None:
        try:
            check_policy("eviction", strict)
        except ValueError as e:  # (a ConfigError: an unknown policy or argument)
            parser.error(f"--strict={strict}: {e}")
    if pool is None:
        print("bigrig is not installed (pip install -e '.[bench]'): timing moejax alone")
    if boyle is None:
        print("boyle is not installed (pip install -e '.[bench]'): timing moejax alone")
    print(f"moejax's strict per-layer LRU: {strict or 'none in the registry'}\n")
    (first,) = load_traces(bundled.capture_files()[0])
    moejax_run(first, len(first.layers) * first.num_experts // 20, "lru")  # loads the kernel
    traces = []
    for path in bundled.capture_files():
        (trace,) = load_traces(path)
        traces.append((path.rsplit("/", 1)[-1].removesuffix(".jsonl"), trace))
    status = 0
    if args.part in ("all", "bigrig"):
        status |= bigrig_part(pool, traces, repeats, args.reps)
    if args.part in ("all", "boyle"):
        status |= boyle_part(boyle, strict, traces, repeats, args.reps)
    return status


def bigrig_part(pool, traces, repeats: list[int], reps: int) -> int:
    print("| trace | x | capacity | policy | requests | moejax req/s | bigrig req/s | "
          "moejax / bigrig | hits |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    ratios = {p: [] for p in POLICIES}
    for name, capture in traces:
        for n in repeats:
            trace = repeated(capture, n)
            requests = stream(trace)
            e = trace.num_experts
            keys = [pos * e + x for pos, x in requests]
            total = len(trace.layers) * e
            for capacity in CAPACITIES:
                slots = int(capacity * total)
                for policy in POLICIES:
                    seconds, (_, per_layer, count) = _timed(
                        lambda: moejax_run(trace, slots, policy), reps)
                    hits = sum(per_layer)
                    assert count == len(requests), (count, len(requests))
                    line = (f"| {name} | {n} | {capacity:.0%} | {policy} | {count:,} | "
                            f"{count / seconds:,.0f} |")
                    if pool is not None:
                        peer_s, (_, theirs) = _timed(
                            lambda: bigrig_run(pool, keys, slots, total, policy), reps)
                        if theirs != hits:
                            print(f"{name} x{n} {capacity:.0%} {policy}: moejax {hits} hits, "
                                  f"bigrig {theirs}")
                            return 1
                        ratios[policy].append(peer_s / seconds)
                        line += f" {count / peer_s:,.0f} | {peer_s / seconds:.2f} |"
                    else:
                        line += " - | - |"
                    print(line + f" {hits:,} |", flush=True)
    if pool is not None:
        for policy, r in ratios.items():
            print(f"\n{policy}: moejax / bigrig speed {min(r):.2f}-{max(r):.2f} "
                  f"(median {statistics.median(r):.2f}); identical hits everywhere")
    print()
    return 0


def boyle_part(boyle, strict: str | None, traces, repeats: list[int], reps: int) -> int:
    print("| trace | x | slots a layer | requests | boyle req/s | moejax strict req/s | "
          "strict / boyle | hits (boyle = strict) | moejax lru_per_layer req/s | "
          "lru_per_layer / boyle | its hits - boyle's (layers differing) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios = {"strict": [], "share": []}
    differences = []
    for name, capture in traces:
        for n in repeats:
            trace = repeated(capture, n)
            layers, e = len(trace.layers), trace.num_experts
            seqs = [[] for _ in range(layers)]
            for pos, x in stream(trace):
                seqs[pos].append(x)
            count = sum(len(s) for s in seqs)
            for fraction in LAYER_CAPACITIES:
                per_layer = round(fraction * e)
                slots = layers * per_layer
                if boyle is not None:
                    peer_s, (_, theirs) = _timed(lambda: boyle_run(boyle, seqs, per_layer),
                                                 reps)
                    line = f"| {name} | {n} | {per_layer} | {count:,} | {count / peer_s:,.0f} |"
                else:
                    peer_s, theirs = None, None
                    line = f"| {name} | {n} | {per_layer} | {count:,} | - |"
                if strict:
                    s_seconds, (_, exact, got) = _timed(lambda: moejax_run(trace, slots, strict),
                                                        reps)
                    assert got == count, (got, count)
                    if theirs is not None and exact != theirs:
                        print(line)
                        print(f"{name} x{n} {per_layer} a layer: {strict} counts {sum(exact)} "
                              f"hits, boyle {sum(theirs)} (layers differing: "
                              f"{sum(a != b for a, b in zip(exact, theirs))})")
                        return 1
                    line += f" {count / s_seconds:,.0f} |"
                    if peer_s is not None:
                        ratios["strict"].append(peer_s / s_seconds)
                        line += f" {peer_s / s_seconds:.2f} | {sum(theirs):,} |"
                    else:
                        line += f" - | {sum(exact):,} |"
                else:
                    line += f" - | - | {sum(theirs):,} |" if theirs is not None else " - | - | - |"
                seconds, (_, ours, got) = _timed(
                    lambda: moejax_run(trace, slots, "lru_per_layer"), reps)
                assert got == count, (got, count)
                line += f" {count / seconds:,.0f} |"
                if theirs is not None:
                    ratios["share"].append(peer_s / seconds)
                    delta = sum(ours) - sum(theirs)
                    differences.append(delta)
                    differ = sum(a != b for a, b in zip(ours, theirs))
                    line += f" {peer_s / seconds:.2f} | {delta:+,} ({differ}) |"
                else:
                    line += " - | - |"
                print(line, flush=True)
    if differences:
        said = [f"{label} / boyle speed {min(r):.2f}-{max(r):.2f} (median "
                f"{statistics.median(r):.2f})" for label, r in
                (("moejax strict", ratios["strict"]), ("moejax lru_per_layer", ratios["share"]))
                if r]
        print(f"\nper-layer LRU: {'; '.join(said)}; lru_per_layer's hits minus boyle's "
              f"{min(differences):+,} to {max(differences):+,}"
              + (f"; {strict}'s equal to boyle's in every layer" if strict else ""))
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
