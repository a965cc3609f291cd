"""The short metrics table a run prints, and the TensorBoard series it writes."""

from __future__ import annotations

import dataclasses

from moejax.cache.metrics import CacheMetrics
from moejax.metrics_writer import MetricsWriter
from moejax.policies import presets


def _pct(x) -> str:
    return "   -" if x is None else f"{100 * x:5.1f}%"


def table(metrics: CacheMetrics, header: str) -> str:
    lines = [header,
             f"{'layer':>5} {'req':>6} {'hit':>6} {'late':>5} {'miss':>5} {'coll':>5} "
             f"{'pf':>5} {'prec':>6} {'stall ms':>9}"]
    for row in metrics.layer_table() + [{"layer": "all", **metrics.totals()}]:
        lines.append(f"{row['layer']!s:>5} {row['requests']:6d} {row['hits']:6d} "
                     f"{row['late_hits']:5d} {row['misses']:5d} {row['collision_misses']:5d} "
                     f"{row['prefetch_issued']:5d} {_pct(row['prefetch_precision']):>6} "
                     f"{row['stall_s'] * 1e3:9.3f}")
    t, tm = metrics.totals(), metrics.timing()
    mb = 1e6
    lines.append(
        f"hit rate {_pct(t['hit_rate']).strip()} (late {_pct(t['late_hit_rate']).strip()}), "
        f"collision misses {_pct(t['collision_miss_rate']).strip()}, prefetch precision "
        f"{_pct(t['prefetch_precision']).strip()} recall {_pct(t['prefetch_recall']).strip()}")
    decode = f"{tm['decode_tok_per_s']:.1f} tok/s" if tm["decode_tok_per_s"] else "-"
    lines.append(
        f"TTFT {tm['ttft_s'] * 1e3:.3f} ms, decode {decode}, stall {t['stall_s'] * 1e3:.3f} ms; "
        f"H2D {t['h2d_bytes'] / mb:.2f} MB (demand {t['demand_bytes'] / mb:.2f}, prefetch "
        f"{t['prefetch_bytes'] / mb:.2f}, wasted {t['wasted_prefetch_bytes'] / mb:.2f})")
    return "\n".join(lines)


def write_tensorboard(writer: MetricsWriter, metrics: CacheMetrics) -> None:
    """One point per pass (step = pass index) of the running totals, then the run's timing."""
    for step, snap in enumerate(metrics.snapshots):
        writer.scalars(step, {
            "cache/hit_rate": snap["hit_rate"],
            "cache/late_hit_rate": snap["late_hit_rate"],
            "cache/miss_rate": snap["miss_rate"],
            "cache/collision_miss_rate": snap["collision_miss_rate"],
            "cache/prefetch_precision": snap["prefetch_precision"],
            "cache/prefetch_recall": snap["prefetch_recall"],
            "cache/requests": snap["requests"],
            "transfer/h2d_bytes": snap["h2d_bytes"],
            "transfer/demand_bytes": snap["demand_bytes"],
            "transfer/prefetch_bytes": snap["prefetch_bytes"],
            "transfer/wasted_prefetch_bytes": snap["wasted_prefetch_bytes"],
            "perf/stall_s": snap["stall_s"],
            "perf/pass_s": snap["pass_s"],
        })
    tm = metrics.timing()
    last = max(0, len(metrics.snapshots) - 1)
    writer.scalars(last, {"perf/ttft_s": tm["ttft_s"], "perf/decode_tok_per_s":
                          tm["decode_tok_per_s"], "perf/decode_s": tm["decode_s"]})


def cache_results(cache, policies, passes: bool = True,
                  expert_bytes_known: bool = True) -> dict:
    """The `cache` section of a job's results.json (schema in WORKSPACE.md), one place for the
    generate, perplexity and replay jobs. `passes=False` leaves out the per-pass timings."""
    shape = cache.shape
    out = {"slots": shape.num_slots, "capacity_frac": shape.num_slots / shape.total_experts,
           "expert_bytes": shape.expert_bytes if expert_bytes_known else None,
           "clock": cache.clock.kind, "hardware": dataclasses.asdict(cache.clock.hw),
           "policies": presets.report(policies), **cache.metrics.to_dict()}
    if not passes:
        del out["passes"]
    return out
