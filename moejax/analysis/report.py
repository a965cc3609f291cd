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
import os
from typing import Iterable

from moejax.analysis.sweep_cells import (
    EVICTION_ORDER,
    PREFETCH_ORDER,
    SCALARS,
    Sweep,
    capacities,
    gbps_label,
    lowest_bandwidth,
    mean,
    order_names,
    scan,
    varying,
)

FIGURES = ("fig4_misses_by_eviction.png", "fig5_collisions_per_layer.png",
           "fig6_prefetch_precision_recall.png", "fig_ttft_decode.png")
CSV_COLUMNS = ("name", "trace", "capacity", "capacity_frac", "slots", "h2d_gbps", "eviction",
               "prefetch", "miss", "routing", *SCALARS, "ttft_s", "decode_tok_per_s")


# -- report.md -------------------------------------------------------------------------------
def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _ms(x) -> str:
    if x is None:
        return "–"
    ms = 1e3 * x
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


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
    evictions = order_names((r["eviction"] for r in rows), EVICTION_ORDER)
    prefetches = order_names((r["prefetch"] for r in rows), PREFETCH_ORDER)
    lines += ["", f"- traces: {', '.join(sorted({r['trace'] for r in rows}))}",
              f"- capacities: {', '.join(capacities(rows))}",
              f"- H2D bandwidth (GB/s): "
              f"{', '.join(gbps_label(b) for b in sorted({r['h2d_gbps'] for r in rows if r['h2d_gbps']}))}",
              f"- eviction: {', '.join(evictions)}", f"- prefetch: {', '.join(prefetches)}",
              f"- miss: {', '.join(sorted({r['miss'] for r in rows}))}; "
              f"routing: {', '.join(sorted({r['routing'] for r in rows}))}"]

    bw = lowest_bandwidth(rows)
    at_bw = [r for r in rows if r["h2d_gbps"] == bw]
    row_keys = ["eviction"] + varying(at_bw, ("miss", "routing"))
    lines += ["", f"## By trace, at H2D {gbps_label(bw)} GB/s (the lowest present)", "",
              "Each entry: hit rate / collision-miss rate (both of requests) / TTFT "
              "(cache clock); `*` = mean of several cells."]
    for trace in sorted({r["trace"] for r in at_bw}):
        lines += ["", f"### {trace}"]
        for cap in capacities([r for r in at_bw if r["trace"] == trace]):
            sel = [r for r in at_bw if r["trace"] == trace and r["capacity"] == cap]
            labels = order_names({_config_label(r, row_keys) for r in sel}, EVICTION_ORDER)
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
                        _pct(mean(r["hit_rate"] for r in group)),
                        _pct(mean(r["collision_miss_rate"] for r in group)),
                        _ms(mean(r["ttft_s"] for r in group)))) + star)
                body.append([label] + cells)
            head = " · ".join(row_keys) + " \\ prefetch"
            lines += ["", f"**capacity {cap}**{_slots_note(sel)}", ""]
            lines += _table([head] + pfs, body)

    config_keys = ["eviction", "prefetch"] + varying(rows, ("miss", "routing"))
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
        body.append([trace, cap, gbps_label(group[0]["h2d_gbps"]),
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
    from moejax.analysis import report_figures as figs  # matplotlib: only when drawing

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
