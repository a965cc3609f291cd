"""The short metrics table a run prints, and the TensorBoard series it writes.

When expert bytes are unknown (a replay of an id-only trace with no model named and no
`cache.expert_bytes`), the run counts with 1-byte experts: hits and misses are exact, but
bytes and every time (stall, TTFT, decode rate) are meaningless. They print as "unknown",
are left out of TensorBoard, and are null in results.json. Values that are None (a rate with
no denominator) print as "-"; a TTFT or decode rate that does not exist (no prefill pass ran,
no decode pass ran) prints as "n/a" with the reason.

Every time the table prints is on the cache's clock, and its timing line says which
(`clock_words`): the virtual clock models a hardware profile, the wall clock is this machine's.
"""

from __future__ import annotations

import dataclasses

from moejax.cache.metrics import BYTES, HOST_BYTES, HOST_SECONDS, SECONDS, CacheMetrics
from moejax.metrics_writer import MetricsWriter
from moejax.timing import host_work as host_work_lib

UNKNOWN = "unknown"


def _pct(x) -> str:
    return "   -" if x is None else f"{100 * x:5.1f}%"


def _int(x) -> str:
    return "-" if x is None else f"{int(x):d}"


def _ms(seconds, known: bool = True, digits: int = 3) -> str:
    """Milliseconds without the unit; "-" for None, "unknown" when sizes are unknown."""
    if not known:
        return UNKNOWN
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def _mb(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.2f}"


def clock_words(kind: str, hardware: str, h2d_gbps: float, model: str = "") -> str:
    """What a cache-clock time was measured on, for every printed speed: "virtual clock
    (modelled a100_specmd, 5 GB/s host->device; host work not modelled)" or "wall clock (this
    machine, transfers held to a100_specmd's 5 GB/s host->device)". `model`: what the virtual
    clock modelled (`host_work.words`)."""
    if kind == "virtual":
        more = f"; {model}" if model else ""
        return f"virtual clock (modelled {hardware}, {h2d_gbps:g} GB/s host->device{more})"
    return (f"{kind} clock (this machine, transfers held to {hardware}'s {h2d_gbps:g} GB/s "
            "host->device)")


def model_words(cache) -> str:
    """What `cache`'s virtual clock models besides the device (`host_work.words`); "" on
    the wall clock."""
    if cache.clock.kind != "virtual":
        return ""
    if cache.timing is None:
        return host_work_lib.words(None)
    words = host_work_lib.words(cache.timing.work)
    if not cache.timing.tables:  # (a model the calibration did not measure)
        words += ("; no step table of this model: its steps on the roofline, which no "
                  "validation covered")
    return words


def host_work_section(cache) -> dict:
    """results.json's `host_work` of a cache's virtual clock: what the live runtime's model
    charged (`RuntimeTiming.report`), or that the host's work was not modelled."""
    words = model_words(cache)
    if cache.timing is None:
        return {"modelled": False, "words": words,
                "what": "the device's steps on the cost model's roofline and the transfers "
                        "only: the live runtime's host work (dispatch, gate round trips, "
                        "decisions, slot loads) is in no figure"}
    return {"modelled": True, "words": words, **cache.timing.report(),
            "validated": cache.timing.work.validated,
            "what": "the live runtime's steps as measured (step tables; the roofline where "
                    "none was), its host work by term, the transfers (moejax/cache/"
                    "runtime_timing.py)"}


# The host's own clock: what generate's wall timings and replay's run time are measured on.
WALL_CLOCK = "wall clock (this machine)"
# Why a table has no TTFT, when nobody says better: TTFT is a prefill pass's time.
NO_PREFILL = "no prefill pass ran"


def host_line(host, bytes_known: bool = True) -> str:
    """One line on the host tier (`moejax.cache.host_tier.HostTier`) for the text report."""
    t = host.totals()
    late = None if t["hit_rate"] is None else t["hit_rate"] - t["ready_hit_rate"]
    read = (f"{_mb(t['storage_bytes'])} MB read from storage, storage stall "
            f"{_ms(t['storage_stall_s'])} ms" if bytes_known else f"storage bytes {UNKNOWN}")
    return (f"host tier {host.capacity} experts ({host.spec}): {_int(t['requests'])} requests, "
            f"hit rate {_pct(t['hit_rate']).strip()} = ready {_pct(t['ready_hit_rate']).strip()}"
            f" + late {_pct(late).strip()}, "
            f"{_int(t['misses'])} misses ({_int(t['demand_misses'])} demand), "
            f"{_int(t['read_ahead'])} read ahead; {read}")


def table(metrics: CacheMetrics, header: str, bytes_known: bool = True, host=None,
          clock: str = "cache clock", no_ttft: str = NO_PREFILL, staging=None) -> str:
    """`bytes_known=False`: bytes and times print as "unknown" (counts stay exact); `host`:
    the cache's host tier, when it has one; `staging`: its prefetch staging share, when it has
    one (`moejax/cache/staging.py`); `clock`: the clock the times are on
    (`clock_words`); `no_ttft`: why there is no TTFT when no prefill pass ran (a replayed
    trace says its own reason)."""
    t, tm = metrics.totals(), metrics.timing()
    # With host compute, a column of the misses computed on the host (part of "miss").
    # "ready" and "late" are the two kinds of hit (a late one waited for its transfer): the
    # line under the table names them so, and its hit rate is their sum.
    on_host = bool(t["host_computed"])
    lines = [header,
             f"{'layer':>5} {'req':>6} {'ready':>6} {'late':>5} {'miss':>5} "
             + (f"{'host':>5} " if on_host else "")
             + f"{'coll':>5} {'pf':>5} {'prec':>6} {'stall ms':>9}"]
    for row in metrics.layer_table() + [{"layer": "all", **t}]:
        lines.append(f"{row['layer']!s:>5} {_int(row['requests']):>6} {_int(row['hits']):>6} "
                     f"{_int(row['late_hits']):>5} {_int(row['misses']):>5} "
                     + (f"{_int(row['host_computed']):>5} " if on_host else "")
                     + f"{_int(row['collision_misses']):>5} {_int(row['prefetch_issued']):>5} "
                     f"{_pct(row['prefetch_precision']):>6} "
                     f"{_ms(row['stall_s'], bytes_known):>9}")
    lines.append(
        f"hit rate {_pct(t['hit_rate']).strip()} = ready {_pct(t['ready_hit_rate']).strip()} "
        f"+ late {_pct(t['late_hit_rate']).strip()}, "
        f"collision misses {_pct(t['collision_miss_rate']).strip()}, prefetch precision "
        f"{_pct(t['prefetch_precision']).strip()} recall {_pct(t['prefetch_recall']).strip()}")
    if t["predicted"]:
        lines.append(
            f"prediction precision {_pct(t['prediction_precision']).strip()} recall "
            f"{_pct(t['prediction_recall']).strip()} (predicted sets against the routing), "
            f"prefetches evicted before use {t['evicted_before_use']}"
            + (f", dropped from the queue {t['prefetch_dropped']}" if t["prefetch_dropped"]
               else ""))
    if t["prefetch_issued"]:
        behind = _ms(t["stall_behind_prefetch_s"], bytes_known)
        lines.append(f"stall behind prefetch transfers {behind} ms of "
                     f"{_ms(t['stall_s'], bytes_known)} ms (demand fetches queued behind "
                     "prefetches already on a copy engine)")
    if staging is not None:
        s = staging.summary()
        lines.append(f"staging share {s['slots']} slots for prefetches (prefetch_share "
                     f"{s['prefetch_share']}, a used one "
                     f"{'joins the demand share' if s['on_use'] == 'promote' else 'stays'}), "
                     f"{s['demand_slots']} "
                     f"for demand fetches: prefetched experts used {_int(s['used'])} (promoted "
                     f"{_int(s['promoted'])}), wasted (evicted unused) {_int(s['wasted'])}, "
                     f"unused at the end {_int(s['unused_at_end'])}")
    if len(metrics.precisions) > 1:
        lines.extend(_precision_lines(t, bytes_known))
    if t["host_computed"]:
        lines.append(host_compute_line(t, bytes_known))
    if host is not None:
        lines.append(host_line(host, bytes_known))
    if not bytes_known:
        lines.append(f"{clock}: TTFT {UNKNOWN}, decode {UNKNOWN}, stall {UNKNOWN}; H2D "
                     f"{UNKNOWN} (expert bytes unknown: name the model or give "
                     "cache.expert_bytes; the counts above are exact)")
        return "\n".join(lines)
    if tm["ttft_s"] is None:
        ttft = f"n/a ({no_ttft})"
    elif tm["warm_ttft_s"] is not None:
        later = len(tm["ttft_per_request_s"]) - 1
        ttft = f"{_ms(tm['ttft_s'])} ms cold, {_ms(tm['warm_ttft_s'])} ms warm (mean of {later})"
    else:
        ttft = f"{_ms(tm['ttft_s'])} ms"
    if tm["decode_tok_per_s"]:
        decode = f"{tm['decode_tok_per_s']:.1f} tok/s"
    else:
        decode = ("n/a (no decode pass ran)" if not tm["decode_tokens"]
                  else "n/a (the decode passes took no time on this clock)")
    lines.append(
        f"{clock}: TTFT {ttft}, decode {decode}, stall "
        f"{_ms(t['stall_s'])} ms; H2D {_mb(t['h2d_bytes'])} MB (demand "
        f"{_mb(t['demand_bytes'])}, prefetch {_mb(t['prefetch_bytes'])}, wasted "
        f"{_mb(t['wasted_prefetch_bytes'])})")
    return "\n".join(lines)


def host_compute_line(t: dict, bytes_known: bool = True) -> str:
    """One line on the experts computed on the host (totals `t`), its times on the cache's
    clock like the table's."""
    share = _pct(t["host_computed_rate"]).strip()
    line = (f"computed on the host: {t['host_computed']} requests ({share} of requests, "
            f"counted as misses), {t['host_products']} contributions")
    if not bytes_known:
        return line + f"; host compute {UNKNOWN}"
    return (line + f"; host compute {_ms(t['host_compute_s'])} ms, layers waited on the host "
            f"path {_ms(t['host_wait_s'])} ms; activations {_mb(t['d2h_activation_bytes'])} "
            f"MB down, {_mb(t['h2d_activation_bytes'])} MB back")


def _precision_lines(t: dict, bytes_known: bool) -> list[str]:
    """One line per precision: requests served at it, products computed at it, H2D bytes;
    then the upgrades and the requests served below the precision wanted."""
    out = []
    for p, n in t["requests_by_precision"].items():
        share = t["products_share_by_precision"][p]
        h2d = _mb(t["h2d_bytes_by_precision"][p]) + " MB" if bytes_known else UNKNOWN
        of_requests = _pct(n / t["requests"] if t["requests"] else None).strip()
        products = t["products_by_precision"][p]
        out.append(f"  {p:>6}: requests {n} ({of_requests}), products {products} "
                   f"({_pct(share).strip()}), H2D {h2d}")
    out.append(f"  upgrades {t['upgrades']}, served below the precision wanted "
               f"{t['served_below_wanted']}")
    return out


_SIZED_SERIES = ("transfer/", "perf/")  # bytes and times: meaningless when sizes are unknown


def write_tensorboard(writer: MetricsWriter, metrics: CacheMetrics,
                      bytes_known: bool = True, clock: str = "virtual") -> None:
    """One point per pass (step = pass index) of the running totals, then the run's timing.
    `bytes_known=False` leaves out the byte and time series. Every time series is named by
    the clock that made it, `clock` (the cache's: `perf/virtual/ttft_s`, `perf/wall/...`):
    results.json's wall-clock `timings` and the cache's clock share no name."""

    def scalars(step, values):
        if not bytes_known:
            values = {k: v for k, v in values.items() if not k.startswith(_SIZED_SERIES)}
        values = {(f"perf/{clock}/{k[len('perf/'):]}" if k.startswith("perf/") else k): v
                  for k, v in values.items()}
        if values:
            writer.scalars(step, values)

    for step, snap in enumerate(metrics.snapshots):
        scalars(step, {
            "cache/hit_rate": snap["hit_rate"],
            "cache/late_hit_rate": snap["late_hit_rate"],
            "cache/ready_hit_rate": snap["ready_hit_rate"],
            "cache/prediction_precision": snap["prediction_precision"],
            "cache/prediction_recall": snap["prediction_recall"],
            "cache/miss_rate": snap["miss_rate"],
            "cache/collision_miss_rate": snap["collision_miss_rate"],
            "cache/prefetch_precision": snap["prefetch_precision"],
            "cache/prefetch_recall": snap["prefetch_recall"],
            "cache/requests": snap["requests"],
            "cache/evicted_before_use": snap["evicted_before_use"],
            "cache/prefetch_dropped": snap["prefetch_dropped"],
            "transfer/h2d_bytes": snap["h2d_bytes"],
            "transfer/demand_bytes": snap["demand_bytes"],
            "transfer/prefetch_bytes": snap["prefetch_bytes"],
            "transfer/wasted_prefetch_bytes": snap["wasted_prefetch_bytes"],
            "perf/stall_s": snap["stall_s"],
            "perf/pass_s": snap["pass_s"],
        })
        if snap["host_computed"]:  # host compute
            scalars(step, {"host_compute/requests": snap["host_computed"],
                           "host_compute/rate": snap["host_computed_rate"],
                           "perf/host_compute_s": snap["host_compute_s"],
                           "perf/host_wait_s": snap["host_wait_s"],
                           "transfer/d2h_activation_bytes": snap["d2h_activation_bytes"],
                           "transfer/h2d_activation_bytes": snap["h2d_activation_bytes"]})
        if "host_requests" in snap:  # the disk tier
            scalars(step, {"host/hit_rate": snap["host_hit_rate"],
                           "host/ready_hit_rate": snap["host_ready_hit_rate"],
                           "host/requests": snap["host_requests"],
                           "host/misses": snap["host_misses"],
                           "host/read_ahead": snap["host_read_ahead"],
                           "storage/bytes": snap["host_storage_bytes"],
                           "storage/stall_s": snap["host_storage_stall_s"]})
    tm = metrics.timing()
    last = max(0, len(metrics.snapshots) - 1)
    for i, ttft in enumerate(tm["ttft_per_request_s"] or ()):
        scalars(i, {"perf/ttft_per_request_s": ttft})
    scalars(last, {"perf/ttft_s": tm["ttft_s"], "perf/decode_tok_per_s":
                   tm["decode_tok_per_s"], "perf/decode_s": tm["decode_s"]})


def _without_sizes(out: dict) -> None:
    """Nulls the byte and time values of a `cache` section (sizes unknown; counts stay)."""
    sized = (*BYTES, "h2d_bytes", *SECONDS, *HOST_BYTES, *HOST_SECONDS)
    for section in (out["total"], *out["per_layer"]):
        for key in sized:
            if key in section:
                section[key] = None
        if "h2d_bytes_by_precision" in section:
            section["h2d_bytes_by_precision"] = dict.fromkeys(section["h2d_bytes_by_precision"])
    out["timing"] = {k: (v if k == "decode_tokens" else None) for k, v in out["timing"].items()}
    if "host" in out:
        h = out["host"]
        h["expert_read_bytes"] = h["capacity_bytes"] = None
        for section in (h["total"], *h["per_layer"]):
            section["storage_bytes"] = section["storage_stall_s"] = None
    for p in out.get("passes", ()):
        for key in ("start_s", "end_s", "stall_s"):
            p[key] = None


def cache_results(cache, policies: dict, passes: bool = True,
                  expert_bytes_known: bool = True) -> dict:
    """The `cache` section of a job's results.json (docs/DESIGN.md, "results.json"), one place
    for the generate, perplexity and replay jobs. `policies`: what ran (`presets.report`).
    `passes=False` leaves out the per-pass timings; `expert_bytes_known=False` nulls
    `expert_bytes` and every byte and time value.

    Capacity: `slots` (all pools), `capacity_frac` (slots over routed experts, the old measure),
    `capacity_bytes` (the pools' byte budget), `capacity_of` ("experts" or "model"),
    `capacity_frac_of_experts` / `capacity_frac_of_model` (that budget over all routed experts'
    native bytes / the whole model's native bytes, None when unknown), `pools` (per precision:
    slots, expert_bytes, share of the budget), `precision` (the plain precision, whose bytes
    `expert_bytes` are) and `expert_bytes_by_precision` (one expert at each precision the
    source has)."""
    shape = cache.shape
    known = expert_bytes_known
    budget = shape.capacity
    experts_native = (budget.expert_native_bytes if budget is not None
                      else shape.total_experts * shape.expert_bytes)
    model_bytes = budget.model_bytes if budget is not None else None
    cap = shape.capacity_bytes
    out = {"slots": shape.num_slots, "capacity_frac": shape.num_slots / shape.total_experts,
           "expert_bytes": shape.expert_bytes if known else None,
           "precision": shape.precision,
           "capacity_of": budget.capacity_of if budget is not None else "experts",
           "capacity_bytes": cap if known else None,
           "capacity_frac_of_experts": cap / experts_native if known and experts_native
           else None,
           "capacity_frac_of_model": cap / model_bytes if known and model_bytes else None,
           "pools": {p.precision: {"slots": p.num_slots,
                                   "expert_bytes": p.expert_bytes if known else None,
                                   "share": p.share} for p in shape.pools},
           "expert_bytes_by_precision": ({p: b for p, b in shape.precision_bytes} if known
                                         else None) or (
               {shape.precision: shape.expert_bytes} if known else None),
           "clock": cache.clock.kind, "hardware": dataclasses.asdict(cache.clock.hw),
           "host_work": host_work_section(cache) if cache.clock.kind == "virtual" else None,
           # Each policy's arguments as built, defaults included: what a bare spec meant when
           # it ran (a default can change between versions: `least_stale`'s order did).
           "policies": {**policies, "arguments": {p.kind: dict(p.arguments or {})
                                                  for p in cache.policies()}},
           **cache.metrics.to_dict(passes=passes)}
    if cache.host is not None:
        out["host"] = cache.host.to_dict()
    if cache.fixed:
        out["full_layers"] = {"layers": sorted({k[0] for k in cache.fixed}),
                              "slots": len(cache.fixed)}
    if cache.host_path is not None:
        # The host model the run's host compute was timed with, and the layers always on it.
        out["host_compute"] = {"host": cache.host_path.to_dict(),
                               "layers": sorted(cache.host_layers)}
    if cache.seeding is not None:
        out["seed"] = cache.seeding
    if cache.staging is not None:
        out["staging"] = cache.staging.summary()
    if not expert_bytes_known:
        _without_sizes(out)
    return out
