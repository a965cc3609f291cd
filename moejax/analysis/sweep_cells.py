"""The cells of a sweep as flat rows: loading each `cells/<cell>/results.json`, and the
grouping and baseline helpers the report's tables (`report.py`) and figures
(`report_figures.py`) share."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
from typing import Any, Iterable

# Known policies in the paper's order (Fig. 4: FLD, SB, LRU, LS); unknown ones follow by name.
EVICTION_ORDER = ("fld", "score", "lru", "lru_per_layer", "lfu", "lhu", "least_stale", "belady")
PREFETCH_ORDER = ("none", "topk", "score_percentile", "oracle")
SCALARS = ("requests", "hits", "late_hits", "misses", "collision_misses", "hit_rate",
           "late_hit_rate", "miss_rate", "collision_miss_rate", "prefetch_precision",
           "prefetch_recall", "stall_s", "h2d_bytes", "demand_bytes", "prefetch_bytes",
           "wasted_prefetch_bytes")

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Sweep:
    rows: list[dict]  # one per finished cell, sorted by name
    unfinished: list[str]  # cell directories without results.json
    failed: dict[str, str]  # cell name -> why its results.json could not be used


# -- loading ---------------------------------------------------------------------------------
def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path.rstrip("/")))[0]


def trace_name(results: dict, config: dict) -> str:
    t = results.get("trace")  # replay: {"path", "name"}; a live recording's is a bare path
    if isinstance(t, dict):
        if t.get("name"):
            return str(t["name"])
        if t.get("path"):
            return _stem(str(t["path"]))
    c = config.get("trace")
    if isinstance(c, dict):
        c = c.get("path")
    return _stem(c) if isinstance(c, str) and c else "live"


def capacity_label(cache_cfg: dict, effective: float | None) -> tuple[str, tuple]:
    """The configured capacity as a label and a sort key (fractions before slot counts)."""
    slots = int(cache_cfg.get("slots") or 0)
    if slots > 0:
        return f"{slots} slots", (1, slots)
    frac = cache_cfg.get("capacity_frac", effective)
    if frac is None:
        return "?", (2, 0)
    of = " of the model" if cache_cfg.get("capacity_of") == "model" else ""
    return f"{100 * float(frac):.3g}%{of}", (0, float(frac))


def cell_row(name: str, results: Any) -> dict:
    if not isinstance(results, dict):
        raise TypeError("results.json does not hold an object")
    if results.get("error"):
        raise ValueError(f"the job reported an error: {results['error']}")
    if not isinstance(results.get("cache"), dict):
        raise KeyError("no 'cache' section (was the cache enabled?)")
    cache, config = results["cache"], results.get("config") or {}
    total, timing = cache["total"], cache.get("timing") or {}
    # The resolved policies the cache ran (a preset expands to four) win over the config fields.
    policies = {**(config.get("policies") or {}), **(cache.get("policies") or {})}
    hw = {**(config.get("hardware") or {}), **(cache.get("hardware") or {})}
    capacity, capacity_key = capacity_label(config.get("cache") or {}, cache.get("capacity_frac"))
    per_layer = cache.get("per_layer") or []
    timings = results.get("timings") or {}
    row = {
        "name": name, "trace": trace_name(results, config),
        "capacity": capacity, "capacity_key": capacity_key,
        "capacity_frac": cache.get("capacity_frac"), "slots": cache.get("slots"),
        "h2d_gbps": hw.get("h2d_gbps") or None,
        **{k: str(policies.get(k, "?")) for k in ("eviction", "prefetch", "miss", "routing")},
        **{k: total.get(k) for k in SCALARS},
        "ttft_s": timing.get("ttft_s", timings.get("ttft_s")),
        "decode_tok_per_s": timing.get("decode_tok_per_s", timings.get("decode_tok_per_s")),
        "layers": [p.get("layer", i) for i, p in enumerate(per_layer)],
        "layer_collision_miss_rate": [p.get("collision_miss_rate") for p in per_layer],
        "layer_miss_rate": [p.get("miss_rate") for p in per_layer],
    }
    if row["hit_rate"] is None and row["requests"] is None:
        raise KeyError("cache.total has no requests or hit_rate")
    return row


def _last_line(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "error.txt (empty)"


def scan(sweep_dir: str) -> Sweep:
    """Every cell of a sweep: finished rows, unfinished and failed cell names."""
    cells_dir = os.path.join(sweep_dir, "cells")
    names = sorted(n for n in os.listdir(cells_dir)
                   if os.path.isdir(os.path.join(cells_dir, n))) if os.path.isdir(cells_dir) else []
    sweep = Sweep([], [], {})
    for name in names:
        path = os.path.join(cells_dir, name, "results.json")
        if not os.path.exists(path):
            error = os.path.join(cells_dir, name, "error.txt")  # launch/worker.py's failure
            if os.path.exists(error):
                sweep.failed[name] = _last_line(error)
            else:
                sweep.unfinished.append(name)
            continue
        try:
            with open(path) as f:
                sweep.rows.append(cell_row(name, json.load(f)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            sweep.failed[name] = f"{type(e).__name__}: {e}"
    return sweep


def load_cells(sweep_dir: str) -> list[dict]:
    """One flat row per finished cell; unfinished and failed cells are skipped and logged."""
    sweep = scan(sweep_dir)
    if sweep.unfinished or sweep.failed:
        log.warning("%s: skipped %d unfinished and %d failed cells (%s)", sweep_dir,
                    len(sweep.unfinished), len(sweep.failed),
                    ", ".join(sweep.unfinished + sorted(sweep.failed)))
    return sweep.rows


# -- grouping --------------------------------------------------------------------------------
def order_names(names: Iterable[str], known: tuple[str, ...]) -> list[str]:
    def key(s):
        base = s.split(" · ")[0].split("(")[0].strip()  # a row label "lru · drop(keep=2)"
        return (known.index(base) if base in known else len(known), s)
    return sorted(set(names), key=key)


def capacities(rows: list[dict]) -> list[str]:
    keys = {r["capacity"]: r["capacity_key"] for r in rows}
    return sorted(keys, key=keys.get)


def prefer(rows: list[dict], key: str, preferred: str | None = None):
    values = collections.Counter(r[key] for r in rows)
    if preferred is not None:
        for v in values:  # a spec with arguments still counts: "none" matches "none()"
            if v.split("(")[0].strip() == preferred:
                return v
    return min(values, key=lambda v: (-values[v], str(v))) if values else None


def lowest_bandwidth(rows: list[dict]):
    bws = [r["h2d_gbps"] for r in rows if r["h2d_gbps"] is not None]
    return min(bws) if bws else None


def baseline(rows: list[dict], **preferred) -> tuple[list[dict], dict]:
    """Rows at the lowest bandwidth with each named dimension fixed to its preferred value."""
    bw = lowest_bandwidth(rows)
    rows = [r for r in rows if r["h2d_gbps"] == bw]
    fixed = {"h2d_gbps": bw}
    for key, pref in preferred.items():
        fixed[key] = prefer(rows, key, pref)
        rows = [r for r in rows if r[key] == fixed[key]]
    return rows, fixed


def mean(values: Iterable) -> float | None:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else None


def nan_if_none(x) -> float:
    return float("nan") if x is None else float(x)


def varying(rows: list[dict], keys: Iterable[str]) -> list[str]:
    return [k for k in keys if len({r[k] for r in rows}) > 1]


def gbps_label(x) -> str:
    return "?" if x is None else f"{x:g}"
