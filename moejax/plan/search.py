"""The planner's search: which candidate configurations it replays, stage by stage.

The space is capacity x precision x eviction x prefetch x queue x miss handling; crossed whole
it is thousands of replays. The search walks it in stages, each varying one part of the
configurations the stage before ranked best (`keep` of them), every other part held:

1. **sizes**: each precision the budget and the quality floor allow, at the most slots the
   budget holds there and at the LRU capacity curve's knee below it (the fewest slots that
   keep 99% of the hits the budget's size gets: one pass over the trace, stack distances), on
   LRU without prefetch or host compute. A precision whose budget holds fewer than top-k slots
   is not run. A trace with router scores adds the precision cascade (`fetch_priority` over a
   precision and the next one the floor allows, the budget's bytes split between them).
2. **eviction**: every eviction policy in `EVICTIONS` on the kept sizes, no prefetch.
3. **prefetch**: every prefetcher the trace can run (`temporal`, `cooccur`; with scores
   `score_percentile(p=80)` and `topk`) under every queue, on the kept configurations.
4. **miss**: host compute (`host_compute`, `latency_aware`) and the first N MoE layers on the
   host (`cache.host_compute_layers`, N at 1, a quarter and half of them), on the kept ones
   (not behind a disk tier: host compute reads every expert from host memory).

Host memory (`plan.host_gb`) holds experts at the plain precision: a precision whose experts it
cannot hold runs behind the disk tier (`cache.host_bytes`), or not at all without one.

A part the user gave (`policies.eviction=lru`, `cache.precision=int4`, ...) is held to that
value in every stage. Every candidate replayed is kept with its forecast and the stage that
made it; the default configuration (moejax's default policies at native precision, or the
highest precision that fits, at the budget's size) is always one of them, so the
recommendation is at least as fast as the default on the forecast's own clock: a structural
result, said as such wherever it is printed.
"""

from __future__ import annotations

import dataclasses

from moejax.policies import presets
from moejax.quant import formats

EVICTIONS = ("lru", "lru_per_layer", "least_stale", "lfu", "fifo", "fld", "s3fifo", "arc")
ID_PREFETCHERS = ("temporal", "cooccur")
SCORED_PREFETCHERS = ("score_percentile(p=80)", "topk(overfetch=1.0)")
QUEUES = ("immediate", "watchdog", "watchdog_idle")
HOST_MISSES = ("host_compute", "latency_aware")
KNEE = 0.99  # the knee: the fewest slots keeping this share of the budget size's hits
STAGES = ("default", "sizes", "eviction", "prefetch", "miss")
# The fields a user may hold the search to (given away from their defaults).
HELD = ("cache.precision", "policies.eviction", "policies.prefetch", "cache.prefetch_queue",
        "policies.miss", "cache.host_compute_layers")


@dataclasses.dataclass(frozen=True)
class Space:
    """What the search may vary, after the budget and the constraints."""

    sizes: dict[str, list[int]]  # precision -> slot counts to try (the budget's, the knee's)
    cascades: list[tuple[str, str, float]]  # (high, low, capacity_frac of the experts' bytes)
    has_scores: bool  # the trace has router scores (score prefetchers, cascades)
    num_moe_layers: int
    held: dict[str, object]  # the user's given values of HELD fields
    # Per precision: 0 (host memory holds every expert at it), or the host tier's bound (the
    # disk tier): the host keeps experts at the plain precision.
    host_bytes: dict[str, int]


def candidate(precision: str, slots: int, eviction: str = "lru", prefetch: str = "none",
              queue: str = "immediate", miss: str = "fetch", host_layers: int = 0,
              host_bytes: int = 0, capacity_frac: float = 0.0) -> dict:
    """A candidate's overrides. A cascade is sized by bytes (`capacity_frac` of the experts',
    `slots` 0): its pools share the budget."""
    size = ({"cache.slots": slots} if slots else
            {"cache.capacity_frac": capacity_frac, "cache.capacity_of": "experts"})
    return {"cache.precision": precision, **size,
            "policies.eviction": eviction, "policies.prefetch": prefetch,
            "cache.prefetch_queue": queue, "policies.miss": miss,
            "policies.routing": "standard", "cache.host_compute_layers": host_layers,
            **({"cache.host_bytes": host_bytes} if host_bytes else {})}


def _held(space: Space, overrides: dict) -> dict:
    return {**overrides, **space.held}


def default_candidate(space: Space) -> dict | None:
    """moejax's default policies (`presets.DEFAULTS`; no score prefetcher on a trace without
    scores) at native precision, or the highest that fits, at the budget's size."""
    for precision in formats.PRECISIONS:
        if precision in space.sizes:
            d = presets.DEFAULTS
            prefetch = d["prefetch"] if space.has_scores else "none"
            return candidate(precision, max(space.sizes[precision]), d["eviction"], prefetch,
                             miss=d["miss"], host_bytes=space.host_bytes[precision])
    return None


def stage_sizes(space: Space) -> list[dict]:
    out = [candidate(p, s, host_bytes=space.host_bytes[p])
           for p in formats.PRECISIONS if p in space.sizes for s in space.sizes[p]]
    out += [candidate(high, 0, miss=f"fetch_priority(levels='{high}:{low}')",
                      host_bytes=space.host_bytes[high], capacity_frac=frac)
            for high, low, frac in space.cascades]
    return [_held(space, c) for c in out]


def stage_eviction(space: Space, kept: list[dict]) -> list[dict]:
    return [_held(space, {**k, "policies.eviction": e}) for k in kept for e in EVICTIONS]


def stage_prefetch(space: Space, kept: list[dict]) -> list[dict]:
    prefetchers = ID_PREFETCHERS + (SCORED_PREFETCHERS if space.has_scores else ())
    return [_held(space, {**k, "policies.prefetch": p, "cache.prefetch_queue": q})
            for k in kept for p in prefetchers for q in QUEUES]


def host_layer_counts(num_moe_layers: int) -> list[int]:
    """The first N MoE layers on the host: 1, a quarter and half of them (distinct, >= 1)."""
    return sorted({n for n in (1, num_moe_layers // 4, num_moe_layers // 2)
                   if 1 <= n < num_moe_layers})


def stage_miss(space: Space, kept: list[dict]) -> list[dict]:
    out = []
    for k in kept:
        if k["policies.miss"].startswith("fetch_priority") or k.get("cache.host_bytes"):
            continue  # (the cascade decides every miss itself; host compute reads every
            # expert from host memory, which a disk tier does not hold)
        out += [{**k, "policies.miss": m} for m in HOST_MISSES]
        out += [{**k, "cache.host_compute_layers": n}
                for n in host_layer_counts(space.num_moe_layers)]
    return [_held(space, c) for c in out]


def unique(candidates: list[dict]) -> list[dict]:
    """`candidates` without repeats (a held field makes stages repeat one)."""
    seen, out = set(), []
    for c in candidates:
        key = tuple(sorted((k, str(v)) for k, v in c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def knee(hits: dict[int, int], top: int) -> int:
    """The fewest slots (of `hits`' sizes, at most `top`) whose hits reach `KNEE` of those at
    `top`."""
    goal = KNEE * hits[top]
    return min(c for c, h in hits.items() if c <= top and h >= goal)


def every_candidate(space: Space) -> list[dict]:
    """The whole space the stages walk, crossed: every size (and cascade) x eviction x
    prefetch x queue x miss handling, held fields held (`benchmarks/plan_vs_grid.py`'s
    exhaustive search; each stage's candidates are among these)."""
    prefetches = [("none", "immediate")] + [
        (p, q) for p in ID_PREFETCHERS + (SCORED_PREFETCHERS if space.has_scores else ())
        for q in QUEUES]
    out = []
    for size in stage_sizes(space):
        misses = [{}]
        if not (size["policies.miss"].startswith("fetch_priority")
                or size.get("cache.host_bytes")):
            misses += [{"policies.miss": m} for m in HOST_MISSES]
            misses += [{"cache.host_compute_layers": n}
                       for n in host_layer_counts(space.num_moe_layers)]
        for e in EVICTIONS:
            for p, q in prefetches:
                for m in misses:
                    out.append(_held(space, {**size, "policies.eviction": e,
                                             "policies.prefetch": p,
                                             "cache.prefetch_queue": q, **m}))
    return unique(out)
