"""The cells SpecMD's claims read, as `--traces` runs them on any traces without a grid config
(`moejax.analysis.claims_run`: the runner; this file: what it runs).

At the paper's settings unless the flags say otherwise: capacity `--capacity` and 1% (claim
2), both prefetch queues, int4, 5 GB/s on SpecMD's A100 profile, each request cut apart
(`none`: the trace as recorded, decode only for a capture); evictions LRU, FLD, Least-Stale's
three orders (and score-based where the trace has gate scores), each without prefetch and with
the trace's predictors (score-percentile and top-k on scored traces; temporal, a noisy oracle
and the oracle on id-only ones), and on scored traces the drop-in and miss-policy cells.
"""

from __future__ import annotations

from moejax.analysis.claims_run import Plan

SP80 = "score_percentile(p=80)"
EVICTIONS = ("lru", "fld", "least_stale", "least_stale(order=left_first)",
             "least_stale(order=cyclic)")
SCORED_PREFETCHES = ("none", SP80, "topk(overfetch=1.0)", "topk(overfetch=1.5)", "oracle")
ID_PREFETCHES = ("none", "temporal", "noisy_oracle(precision=0.6)", "oracle")
DROPIN_PRESETS = ("specmd_1", "specmd_2", "specmd_3", "specmd_4")
MISSES = ("fetch", "drop(keep=2)", "substitute(tol=0.05)", "fetch_priority", "fetch_lowest_bit")
QUEUES = ("immediate", "watchdog")
# 1% is claim 2's second capacity ("up to 85× at 1%"), run beside --capacity.
DEFAULTS = {"precision": "int4", "h2d_gbps": 5.0, "hardware": "a100_specmd",
            "capacity": 0.05, "request_cut": ("none",), "also_capacities": (0.01,)}
# Small models' small shares still hold every top-k (the grids' floor, `cache.min_slots`).
MIN_SLOTS = 4


def cells_for(path: str, info: dict, caps: list[float], cut: tuple[int, int],
              settings: dict, model: dict) -> list[dict]:
    """The overrides of every cell SpecMD's claims read on trace `path` under one request cut."""
    base = {"replay.trace": path, "cache.precision": settings["precision"],
            "hardware.preset": settings["hardware"], "hardware.h2d_gbps": settings["h2d_gbps"],
            "replay.request_tokens": cut[0], "replay.prefill_tokens": cut[1],
            "cache.min_slots": MIN_SLOTS, **model}
    scored = info["scored"]
    evictions = EVICTIONS + (("score",) if scored else ())
    prefetches = SCORED_PREFETCHES if scored else ID_PREFETCHES
    out = []
    for cap in caps:
        for queue in QUEUES:
            cell = {**base, "cache.capacity_frac": cap, "cache.prefetch_queue": queue}
            out += [{**cell, "policies.eviction": e, "policies.prefetch": p}
                    for e in evictions for p in prefetches]
            if scored:
                for preset in DROPIN_PRESETS:
                    out += [{**cell, "policies.preset": preset},
                            {**cell, "policies.preset": preset,
                             "policies.eviction": "least_stale"}]
                out += [{**cell, "policies.eviction": "least_stale", "policies.prefetch": SP80,
                         "policies.miss": m} for m in MISSES]
    return out


PLAN = Plan(cells_for, DEFAULTS)
