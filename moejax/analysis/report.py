"""A sweep's report: one row per finished cell, `report.md` and SpecMD-style figures.

    python -m moejax.analysis.report --sweep_dir=DIR

reads `DIR/cells/<cell>/results.json` (cells without one are unfinished, or failed when the
launcher left an `error.txt`; an unreadable results.json also counts as failed: all are
skipped and counted) and writes into DIR: `report.md`, `cells.csv` and
`fig4_misses_by_eviction.png` (SpecMD Fig. 4: total and collision misses per eviction policy),
`fig5_collisions_per_layer.png` (Fig. 5: per-layer collision-miss rate),
`fig6_prefetch_precision_recall.png` (Fig. 6: precision vs recall, hit rate vs stall per
prefetch policy) and `fig_ttft_decode.png` (TTFT and decode tok/s per configuration).

Rates are DESIGN.md's (moejax/cache/metrics.py); TTFT and decode tok/s are the cache clock's
(`results["cache"]["timing"]`). Cells are grouped by their *configured* capacity (`5%`, or
`N slots`), so one model's 5% and another's (different effective fractions) share a column;
the effective fraction is kept in `capacity_frac`. Figures fix the dimensions they do not plot
to a baseline: the lowest H2D bandwidth present, miss `fetch`, routing `standard`, prefetch
`none` (Fig. 4, 5) and eviction `least_stale` (Fig. 6), each when present, otherwise the most
common value.
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import json
import logging
import math
import os
from typing import Any, Iterable

FIGURES = ("fig4_misses_by_eviction.png", "fig5_collisions_per_layer.png",
           "fig6_prefetch_precision_recall.png", "fig_ttft_decode.png")
DPI = 120
# Known policies in the paper's order (Fig. 4: FLD, SB, LRU, LS); unknown ones follow by name.
EVICTION_ORDER = ("fld", "score", "lru", "lru_per_layer", "lfu", "lhu", "least_stale", "belady")
PREFETCH_ORDER = ("none", "topk", "score_percentile", "oracle")
SCALARS = ("requests", "hits", "late_hits", "misses", "collision_misses", "hit_rate",
           "late_hit_rate", "miss_rate", "collision_miss_rate", "prefetch_precision",
           "prefetch_recall", "stall_s", "h2d_bytes", "demand_bytes", "prefetch_bytes",
           "wasted_prefetch_bytes")
CSV_COLUMNS = ("name", "trace", "capacity", "capacity_frac", "slots", "h2d_gbps", "eviction",
               "prefetch", "miss", "routing", *SCALARS, "ttft_s", "decode_tok_per_s")
_OTHER_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
                 "tab:gray", "tab:olive", "tab:cyan")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Sweep:
    rows: list[dict]  # one per finished cell, sorted by name
    unfinished: list[str]  # cell directories without results.json
    failed: dict[str, str]  # cell name -> why its results.json could not be used


# -- loading ---------------------------------------------------------------------------------
def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path.rstrip("/")))[0]


def _trace_name(results: dict, config: dict) -> str:
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


def _capacity(cache_cfg: dict, effective: float | None) -> tuple[str, tuple]:
    """The configured capacity as a label and a sort key (fractions before slot counts)."""
    slots = int(cache_cfg.get("slots") or 0)
    if slots > 0:
        return f"{slots} slots", (1, slots)
    frac = cache_cfg.get("capacity_frac", effective)
    if frac is None:
        return "?", (2, 0)
    return f"{100 * float(frac):.3g}%", (0, float(frac))


def _row(name: str, results: Any) -> dict:
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
    capacity, capacity_key = _capacity(config.get("cache") or {}, cache.get("capacity_frac"))
    per_layer = cache.get("per_layer") or []
    timings = results.get("timings") or {}
    row = {
        "name": name, "trace": _trace_name(results, config),
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
                sweep.rows.append(_row(name, json.load(f)))
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
def _order(names: Iterable[str], known: tuple[str, ...]) -> list[str]:
    def key(s):
        base = s.split(" · ")[0].split("(")[0].strip()  # a row label "lru · drop(keep=2)"
        return (known.index(base) if base in known else len(known), s)
    return sorted(set(names), key=key)


def _capacities(rows: list[dict]) -> list[str]:
    keys = {r["capacity"]: r["capacity_key"] for r in rows}
    return sorted(keys, key=keys.get)


def _prefer(rows: list[dict], key: str, preferred: str | None = None):
    values = collections.Counter(r[key] for r in rows)
    if preferred is not None:
        for v in values:  # a spec with arguments still counts: "none" matches "none()"
            if v.split("(")[0].strip() == preferred:
                return v
    return min(values, key=lambda v: (-values[v], str(v))) if values else None


def _lowest_bandwidth(rows: list[dict]):
    bws = [r["h2d_gbps"] for r in rows if r["h2d_gbps"] is not None]
    return min(bws) if bws else None


def _baseline(rows: list[dict], **preferred) -> tuple[list[dict], dict]:
    """Rows at the lowest bandwidth with each named dimension fixed to its preferred value."""
    bw = _lowest_bandwidth(rows)
    rows = [r for r in rows if r["h2d_gbps"] == bw]
    fixed = {"h2d_gbps": bw}
    for key, pref in preferred.items():
        fixed[key] = _prefer(rows, key, pref)
        rows = [r for r in rows if r[key] == fixed[key]]
    return rows, fixed


def _mean(values: Iterable) -> float | None:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else None


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def _varying(rows: list[dict], keys: Iterable[str]) -> list[str]:
    return [k for k in keys if len({r[k] for r in rows}) > 1]


# -- report.md -------------------------------------------------------------------------------
def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _ms(x) -> str:
    if x is None:
        return "–"
    ms = 1e3 * x
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _gbps(x) -> str:
    return "?" if x is None else f"{x:g}"


def _config_label(row: dict, keys: list[str]) -> str:
    return " · ".join(row[k] for k in keys)


def _table(header: list[str], rows: list[list[str]], numeric: Iterable[int] | None = None
           ) -> list[str]:
    """A markdown table; `numeric` columns (all but the first by default) align right."""
    numeric = set(range(1, len(header)) if numeric is None else numeric)
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---:" if i in numeric else "---" for i in range(len(header))) + " |"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _slots_note(rows: list[dict]) -> str:
    slots = sorted({r["slots"] for r in rows if r["slots"] is not None})
    fracs = sorted({r["capacity_frac"] for r in rows if r["capacity_frac"] is not None})
    parts = []
    if slots:
        parts.append(f"{slots[0]} slots" if len(slots) == 1 else f"{slots[0]}–{slots[-1]} slots")
    if fracs:
        parts.append(f"{_pct(fracs[0])} of experts" if len(fracs) == 1
                     else f"{_pct(fracs[0])}–{_pct(fracs[-1])} of experts")
    return f" ({', '.join(parts)})" if parts else ""


def _markdown(sweep_dir: str, sweep: Sweep) -> str:
    rows = sweep.rows
    n_dirs = len(rows) + len(sweep.unfinished) + len(sweep.failed)
    lines = [f"# Sweep report: `{os.path.abspath(sweep_dir)}`", "",
             f"{len(rows)} finished cells of {n_dirs} cell directories "
             f"({len(sweep.unfinished)} unfinished, {len(sweep.failed)} failed)."]
    if sweep.unfinished:
        lines.append(f"Unfinished: {', '.join(sweep.unfinished)}.")
    for name, why in sorted(sweep.failed.items()):
        lines.append(f"Failed: `{name}` — {why}")
    if not rows:
        return "\n".join(lines + ["", "No finished cells: nothing to report."]) + "\n"
    evictions = _order((r["eviction"] for r in rows), EVICTION_ORDER)
    prefetches = _order((r["prefetch"] for r in rows), PREFETCH_ORDER)
    lines += ["", f"- traces: {', '.join(sorted({r['trace'] for r in rows}))}",
              f"- capacities: {', '.join(_capacities(rows))}",
              f"- H2D bandwidth (GB/s): "
              f"{', '.join(_gbps(b) for b in sorted({r['h2d_gbps'] for r in rows if r['h2d_gbps']}))}",
              f"- eviction: {', '.join(evictions)}", f"- prefetch: {', '.join(prefetches)}",
              f"- miss: {', '.join(sorted({r['miss'] for r in rows}))}; "
              f"routing: {', '.join(sorted({r['routing'] for r in rows}))}"]

    bw = _lowest_bandwidth(rows)
    at_bw = [r for r in rows if r["h2d_gbps"] == bw]
    row_keys = ["eviction"] + _varying(at_bw, ("miss", "routing"))
    lines += ["", f"## By trace, at H2D {_gbps(bw)} GB/s (the lowest present)", "",
              "Each entry: hit rate / collision-miss rate (both of requests) / TTFT "
              "(cache clock); `*` = mean of several cells."]
    for trace in sorted({r["trace"] for r in at_bw}):
        lines += ["", f"### {trace}"]
        for cap in _capacities([r for r in at_bw if r["trace"] == trace]):
            sel = [r for r in at_bw if r["trace"] == trace and r["capacity"] == cap]
            labels = _order({_config_label(r, row_keys) for r in sel}, EVICTION_ORDER)
            pfs = [p for p in prefetches if any(r["prefetch"] == p for r in sel)]
            body = []
            for label in labels:
                cells = []
                for pf in pfs:
                    group = [r for r in sel
                             if _config_label(r, row_keys) == label and r["prefetch"] == pf]
                    if not group:
                        cells.append("")
                        continue
                    star = "*" if len(group) > 1 else ""
                    cells.append(" / ".join((
                        _pct(_mean(r["hit_rate"] for r in group)),
                        _pct(_mean(r["collision_miss_rate"] for r in group)),
                        _ms(_mean(r["ttft_s"] for r in group)))) + star)
                body.append([label] + cells)
            head = " · ".join(row_keys) + " \\ prefetch"
            lines += ["", f"**capacity {cap}**{_slots_note(sel)}", ""]
            lines += _table([head] + pfs, body)

    config_keys = ["eviction", "prefetch"] + _varying(rows, ("miss", "routing"))
    body = []
    groups = collections.defaultdict(list)
    for r in rows:
        bw_key = -1.0 if r["h2d_gbps"] is None else float(r["h2d_gbps"])
        groups[(r["trace"], r["capacity_key"], bw_key, r["capacity"])].append(r)
    for (trace, _, _, cap), group in sorted(groups.items()):
        timed = [r for r in group if r["ttft_s"] is not None]
        rated = [r for r in group if r["hit_rate"] is not None]
        t = min(timed, key=lambda r: r["ttft_s"]) if timed else None
        h = max(rated, key=lambda r: r["hit_rate"]) if rated else None
        body.append([trace, cap, _gbps(group[0]["h2d_gbps"]),
                     _config_label(t, config_keys) if t else "–", _ms(t and t["ttft_s"]),
                     _config_label(h, config_keys) if h else "–", _pct(h and h["hit_rate"])])
    lines += ["", "## Best configuration per trace and capacity", ""]
    lines += _table(["trace", "capacity", "H2D GB/s", f"best by TTFT ({' · '.join(config_keys)})",
                     "TTFT", f"best by hit rate ({' · '.join(config_keys)})", "hit rate"],
                    body, numeric=(2, 4, 6))
    lines += ["", "## Figures", "",
              "- `fig4_misses_by_eviction.png`: total (grey) and collision (red) misses per "
              "eviction policy (SpecMD Fig. 4)",
              "- `fig5_collisions_per_layer.png`: per-layer collision-miss rate per eviction "
              "policy (SpecMD Fig. 5)",
              "- `fig6_prefetch_precision_recall.png`: prefetch precision vs recall; hit rate vs "
              "stall (SpecMD Fig. 6)",
              "- `fig_ttft_decode.png`: TTFT and decode tok/s per configuration",
              "- `cells.csv`: every finished cell's row"]
    return "\n".join(lines) + "\n"


# -- figures ---------------------------------------------------------------------------------
def _write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS + ("layer_collision_miss_rate",))
        for r in rows:
            w.writerow([("" if r[k] is None else r[k]) for k in CSV_COLUMNS]
                       + [" ".join("" if v is None else f"{v:.6g}"
                                   for v in r["layer_collision_miss_rate"])])


def write_report(sweep_dir: str) -> str:
    """Writes report.md, cells.csv and the figures into sweep_dir; returns report.md's path."""
    from moejax.analysis import report_figures as figs  # imports this module's helpers

    sweep = scan(sweep_dir)
    rows = sweep.rows
    for draw, name in zip((figs.fig4, figs.fig5, figs.fig6, figs.fig_ttft_decode), FIGURES):
        draw(rows, os.path.join(sweep_dir, name))
    _write_csv(os.path.join(sweep_dir, "cells.csv"), rows)
    path = os.path.join(sweep_dir, "report.md")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(_markdown(sweep_dir, sweep))
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep_dir", required=True, help="the sweep (DIR/cells/*/results.json)")
    args = parser.parse_args(argv)
    print(write_report(args.sweep_dir))


if __name__ == "__main__":
    main()
