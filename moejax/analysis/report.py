"""A sweep's report: one row per finished cell, `report.md` and SpecMD-style figures.

    python -m moejax.analysis.report --sweep_dir=DIR

reads `DIR/cells/<cell>/results.json` (cells without one are unfinished, or failed when the
launcher left an `error.txt`; an unreadable results.json also counts as failed: all are
skipped and counted) and writes into DIR: `report.md`, `cells.csv` and
`fig4_misses_by_eviction.png` (SpecMD Fig. 4: total and collision misses per eviction policy),
`fig5_collisions_per_layer.png` (Fig. 5: per-layer collision-miss rate),
`fig6_prefetch_precision_recall.png` (Fig. 6: precision vs recall, ready and late hit rate vs
stall per prefetch policy) and `fig_ttft_decode.png` (TTFT and decode tok/s per
configuration); when the sweep holds SpecMD drop-in pairs (a `policies.preset` run with its own
eviction and with `policies.eviction=least_stale`, all else equal: `sweep_cells.dropin_pairs`),
also `fig_dropin_least_stale.png` and the drop-in tables; when it holds quality cells (the
`quality` job: studies/specmd/grid_quality.py), also `fig_quality_frontier.png` and a "Quality–speed
frontier" section (`moejax/analysis/frontier.py`), and their columns in cells.csv.

Hit rates are always shown as ready + late (`ready_hit_rate`: resident and ready;
`late_hit_rate`: in flight when needed; their sum is `hit_rate`, SpecMD's hit rate: DESIGN.md
"One hit rate"). Rates are DESIGN.md's
(moejax/cache/metrics.py); TTFT and decode tok/s are the cache clock's
(`results["cache"]["timing"]`; TTFT is the first request's, cold). Cells are grouped by their
*configured* capacity (`5%`, or `N slots`), so one model's 5% and another's (different
effective fractions) share a column; the effective fraction is kept in `capacity_frac`.
Figures fix the dimensions they do not plot to a baseline: the lowest H2D bandwidth present,
miss `fetch`, routing `standard`, prefetch queue `immediate`, prefetch `none` (Fig. 4, 5) and
eviction `least_stale` (Fig. 6), each when present, otherwise the most common value.

A table entry and a bar are one configuration: the fields that tell two cells of one entry
apart (the experts' precision, the queue, any config field: `sweep_cells.identity_keys`) join
its label, so cells are never averaged across configurations (`*` marks a mean over repeats of
one). A "best" among configurations tied exactly names all of them ("tie of N").

    python -m moejax.analysis.report --sweep_dir=DIR

checks DIR first: a path that is missing, a file, not a sweep (no cells/), or a sweep with a
results.json that does not parse, is named with exit status 2 and nothing is written.
"""

from __future__ import annotations

import collections
import csv
import os
import sys
from typing import Iterable

from moejax import cli
from moejax.analysis import frontier as frontier_lib
from moejax.analysis.sweep_cells import (
    EVICTION_ORDER,
    PREFETCH_ORDER,
    QUALITY,
    SCALARS,
    TIMING,
    DropInPair,
    Sweep,
    capacities,
    dropin_pairs,
    field_name,
    field_value,
    gbps_label,
    hit_parts,
    identity_keys,
    lowest_bandwidth,
    mean,
    open_sweep,
    order_names,
    scan,
    ttft_change_pct,
)
from moejax.cli import guarded

# Written for every sweep (a figure without data says so).
FIGURES = ("fig4_misses_by_eviction.png", "fig5_collisions_per_layer.png",
           "fig6_prefetch_precision_recall.png", "fig_ttft_decode.png")
# Written only when the sweep holds drop-in pairs.
DROPIN_FIGURE = "fig_dropin_least_stale.png"
CSV_COLUMNS = ("name", "trace", "capacity", "capacity_frac", "slots", "h2d_gbps", "preset",
               "eviction", "prefetch", "miss", "routing", *SCALARS, *TIMING)
# Written only when the sweep holds quality cells (a replay sweep's files stay as they were).
QUALITY_FIGURE = "fig_quality_frontier.png"
QUALITY_CSV_COLUMNS = ("model", "precision", "pools", *QUALITY)


# -- report.md -------------------------------------------------------------------------------
def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _ms(x) -> str:
    if x is None:
        return "–"
    ms = 1e3 * x
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _hits(ready, late, total=None, sep: str = " + ") -> str:
    """A hit rate as ready + late; the total alone only with "split ?" beside it."""
    if ready is not None and late is not None:
        return f"{_pct(ready)}{sep}{_pct(late)}"
    return "–" if total is None else f"{_pct(total)} (split ?)"


def _row_hits(row: dict, sep: str = " + ") -> str:
    return _hits(*hit_parts(row), row.get("hit_rate"), sep=sep)


def _group_hits(group: list[dict], sep: str = "+") -> str:
    """Mean ready + mean late over cells (each cell's split known), else the mean total."""
    parts = [hit_parts(r) for r in group]
    if all(p[0] is not None for p in parts):
        return _hits(mean(p[0] for p in parts), mean(p[1] for p in parts), sep=sep)
    return _hits(None, None, mean(r["hit_rate"] for r in group), sep=sep)


def _signed_pct(x) -> str:
    return "–" if x is None else f"{x:+.1f}%"


def _config_label(row: dict, keys: list[str]) -> str:
    return " · ".join(field_value(row, k) for k in keys)


def _keys_header(keys: list[str]) -> str:
    return " · ".join(field_name(k) for k in keys)


# A "best" cell of a table names at most this many of the cells tied for it.
MAX_TIED = 3


def _best(rows: list[dict], key: str, lowest: bool, keys: list[str]) -> tuple[str, dict | None]:
    """The configuration with the lowest (highest) `key` among `rows`, and its row; every
    configuration exactly tied for it is named ("tie: a; b; c"), never one picked from them."""
    rated = [r for r in rows if r[key] is not None]
    if not rated:
        return "–", None
    best = (min if lowest else max)(float(r[key]) for r in rated)
    tied = [r for r in rated if float(r[key]) == best]
    labels = order_names({_config_label(r, keys) for r in tied}, EVICTION_ORDER)
    if len(labels) == 1:
        return labels[0], tied[0]
    more = len(labels) - MAX_TIED
    return (f"tie of {len(labels)}: " + "; ".join(labels[:MAX_TIED])
            + (f"; and {more} more (cells.csv)" if more > 0 else "")), tied[0]


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
              f"routing: {', '.join(sorted({r['routing'] for r in rows}))}; "
              f"prefetch queue: {', '.join(sorted({r['queue'] for r in rows}))}"]

    bw = lowest_bandwidth(rows)
    at_bw = [r for r in rows if r["h2d_gbps"] == bw]
    # Every field telling two cells of a table entry apart (the precision, the queue, ...)
    # joins the row label: an entry is one configuration, never a mean over several.
    row_keys = ["eviction"] + identity_keys(at_bw, ("trace", "capacity", "eviction",
                                                    "prefetch"))
    lines += ["", f"## By trace, at H2D {gbps_label(bw)} GB/s (the lowest present)", "",
              "Each entry: hit rate as ready+late / collision-miss rate (all of requests) / "
              "TTFT (cache clock); `*` = mean of several cells of the same configuration."]
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
                        _group_hits(group),
                        _pct(mean(r["collision_miss_rate"] for r in group)),
                        _ms(mean(r["ttft_s"] for r in group)))) + star)
                body.append([label] + cells)
            head = _keys_header(row_keys) + " \\ prefetch"
            lines += ["", f"**capacity {cap}**{_slots_note(sel)}", ""]
            lines += _table([head] + pfs, body)

    config_keys = ["eviction", "prefetch"] + identity_keys(
        rows, ("trace", "capacity", "h2d_gbps", "eviction", "prefetch"))
    body = []
    groups = collections.defaultdict(list)
    for r in rows:
        bw_key = -1.0 if r["h2d_gbps"] is None else float(r["h2d_gbps"])
        groups[(r["trace"], r["capacity_key"], bw_key, r["capacity"])].append(r)
    for (trace, _, _, cap), group in sorted(groups.items()):
        t_label, t = _best(group, "ttft_s", True, config_keys)
        h_label, h = _best(group, "hit_rate", False, config_keys)
        body.append([trace, cap, gbps_label(group[0]["h2d_gbps"]),
                     t_label, _ms(t and t["ttft_s"]), h_label, _row_hits(h) if h else "–"])
    lines += ["", "## Best configuration per trace and capacity", ""]
    if any(cell.startswith("tie of") for b in body for cell in (b[3], b[5])):
        lines += ["Where configurations are tied exactly for the best, all of them are named "
                  "(\"tie of N\"): none is better than the others.", ""]
    lines += _table(["trace", "capacity", "H2D GB/s",
                            f"best by TTFT ({_keys_header(config_keys)})", "TTFT",
                            f"best by hit rate ({_keys_header(config_keys)})",
                            "hit rate (ready + late)"],
                           body, numeric=(2, 4, 6))
    lines += ["", "## Figures", "",
              "- `fig4_misses_by_eviction.png`: total (grey) and collision (red) misses per "
              "eviction policy (SpecMD Fig. 4)",
              "- `fig5_collisions_per_layer.png`: per-layer collision-miss rate per eviction "
              "policy (SpecMD Fig. 5)",
              "- `fig6_prefetch_precision_recall.png`: prefetch precision vs recall; ready and "
              "late hit rate vs stall (SpecMD Fig. 6)",
              "- `fig_ttft_decode.png`: TTFT and decode tok/s per configuration"]
    pairs = dropin_pairs(rows)
    if pairs:
        lines.append(f"- `{DROPIN_FIGURE}`: SpecMD's drop-in: each preset with its own eviction "
                     "vs with Least-Stale")
    groups = frontier_lib.frontier_rows(rows)
    if groups:
        lines.append(f"- `{QUALITY_FIGURE}`: the quality–speed frontier per model and "
                     "capacity (decode tok/s vs KL mean; SpecMD Fig. 5/7)")
    lines.append("- `cells.csv`: every finished cell's row")
    if pairs:
        lines += ["", "## SpecMD drop-in: each preset with Least-Stale eviction", ""]
        lines += dropin_markdown(pairs)
    if groups:
        lines += ["", "## Quality–speed frontier", ""]
        lines += frontier_markdown(groups)
    return "\n".join(lines) + "\n"


# -- the drop-in tables ----------------------------------------------------------------------
def _arrow(a: str, b: str) -> str:
    return f"{a} → {b}"


def dropin_summary(pairs: list[DropInPair]) -> list[str]:
    """One row per preset, drop-in spec and other varying setup: means over its pairs."""
    groups = collections.defaultdict(list)
    for p in pairs:
        groups[(p.preset, p.other, p.label)].append(p)
    other_keys = [k for k, _ in pairs[0].other]
    body = []
    for (preset, other, label), ps in groups.items():
        bases = [p.base for p in ps]
        drops = [p.dropin for p in ps]
        body.append([preset, *(v for _, v in other),
                     ", ".join(sorted({p.base["eviction"] for p in ps})), label, str(len(ps)),
                     _arrow(_ms(mean(r["ttft_s"] for r in bases)),
                            _ms(mean(r["ttft_s"] for r in drops))),
                     _signed_pct(mean(ttft_change_pct(p.base["ttft_s"], p.dropin["ttft_s"])
                                      for p in ps)),
                     _arrow(_group_hits(bases, " + "), _group_hits(drops, " + ")),
                     _arrow(_pct(mean(r["collision_miss_rate"] for r in bases)),
                            _pct(mean(r["collision_miss_rate"] for r in drops)))])
    head = ["preset", *other_keys, "baseline eviction", "drop-in", "pairs",
            "TTFT baseline → drop-in", "ΔTTFT", "hit rate ready + late, baseline → drop-in",
            "collision misses, baseline → drop-in"]
    n = 1 + len(other_keys)
    return _table(head, body, numeric=range(n + 2, len(head)))


def dropin_table(pairs: list[DropInPair]) -> list[str]:
    """One row per pair."""
    other_keys = [k for k, _ in pairs[0].other]
    warm = any(r["warm_ttft_s"] is not None for p in pairs for r in (p.base, p.dropin))
    body = []
    for p in pairs:
        b, d = p.base, p.dropin
        row = [b["trace"], b["capacity"], gbps_label(b["h2d_gbps"]), p.preset,
               *(v for _, v in p.other), b["eviction"], p.label,
               _arrow(_ms(b["ttft_s"]), _ms(d["ttft_s"])),
               _signed_pct(ttft_change_pct(b["ttft_s"], d["ttft_s"]))]
        if warm:
            row += [_arrow(_ms(b["warm_ttft_s"]), _ms(d["warm_ttft_s"])),
                    _signed_pct(ttft_change_pct(b["warm_ttft_s"], d["warm_ttft_s"]))]
        row += [_arrow(_row_hits(b), _row_hits(d)),
                _arrow(_pct(b["collision_miss_rate"]), _pct(d["collision_miss_rate"]))]
        body.append(row)
    head = ["trace", "capacity", "H2D GB/s", "preset", *other_keys, "baseline eviction",
            "drop-in", "TTFT baseline → drop-in", "ΔTTFT"]
    if warm:
        head += ["warm TTFT baseline → drop-in", "Δwarm TTFT"]
    head += ["hit rate ready + late, baseline → drop-in", "collision misses, baseline → drop-in"]
    n = 4 + len(other_keys)
    return _table(head, body, numeric=[1, 2, *range(n + 2, len(head))])


def dropin_markdown(pairs: list[DropInPair]) -> list[str]:
    """The drop-in section's text: what was paired, the summary and the per-pair table."""
    return [
        "Each preset (`policies.preset`) run twice, everything else equal: with its own "
        "eviction (baseline) and with only the eviction replaced by Least-Stale "
        "(`policies.eviction=least_stale…`; SpecMD's drop-in). TTFT: the cache clock's first "
        "request (cold); ΔTTFT = (drop-in − baseline) / baseline. Hit rate: ready + late, of "
        "requests; collision misses: of requests.", "",
        f"**Per preset** (means over {len(pairs)} pair{'s' if len(pairs) != 1 else ''}; "
        "ΔTTFT is the mean of the pairs' changes)", "",
        *dropin_summary(pairs), "", "**Per pair**", "", *dropin_table(pairs)]


# -- the quality–speed frontier --------------------------------------------------------------
FRONT_MARK = "★"


def _kl(x) -> str:
    if x is None:
        return "–"
    x = float(x)
    if x <= 0:
        return "0 (exact)"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.4f}"


def _signed_num(x, fmt: str = "+.4f") -> str:
    return "–" if x is None else format(float(x), fmt)


def _kl_delta(x) -> str:
    if x is None:
        return "–"
    return "0" if x == 0 else (f"{x:+.2e}" if abs(x) < 1e-3 else f"{x:+.4f}")


def _speed(x) -> str:
    return "–" if x is None else f"{float(x):.4g}"


def frontier_table(group: frontier_lib.FrontierGroup) -> list[str]:
    """One row per configuration of the group, fastest first; ★ on the frontier."""
    body = []
    for i, r in enumerate(group.rows):
        base = group.baselines[i]
        d_kl, ratio = frontier_lib.relative(r, base, group.speed, group.loss)
        if base is r:
            vs = "baseline"
        elif base is None:
            vs = "–"
        else:
            vs = f"{_kl_delta(d_kl)} / {'–' if ratio is None else f'{ratio:.2f}×'}"
        body.append([group.label(i), _kl(r["kl_mean"]), _pct(r["top1_agreement"]),
                     _signed_num(r["bits_per_byte_delta"]), _pct(r["drift_identical_share"]),
                     _speed(r["decode_tok_per_s"]), _ms(r["ttft_s"]), vs,
                     FRONT_MARK if group.on_front[i] else ""])
    head = ["configuration", "KL mean", "top-1 agreement", "bpb Δ", "drift identical",
            "decode tok/s", "TTFT", "vs baseline: ΔKL / speed", "frontier"]
    return _table(head, body)


def frontier_markdown(groups: list[frontier_lib.FrontierGroup]) -> list[str]:
    """The frontier section's text: what was measured, then per model and capacity its table
    and frontier."""
    several_bw = len({g.h2d_gbps for g in groups}) > 1
    lines = [
        "Each quality cell runs the model through the configured cache and, side by side, the "
        "reference (the same model, every expert resident at native precision) on the same "
        "tokens. KL mean: KL(reference ‖ cached) in nats per scored token (teacher forcing); "
        "top-1 agreement: share of tokens whose argmax agrees; bpb Δ: bits per byte of the "
        "cached model minus the reference's; drift identical: share of the greedy drift "
        "requests whose continuation equals the reference's. Decode tok/s and TTFT: the drift "
        "requests (prefill + greedy decode) on the cache clock. Baseline: plain fetch with "
        "standard routing at native precision (for a policy at a lower precision, plain fetch "
        "at that precision when the sweep has it: fetch_priority's first pool, int8); ΔKL = "
        "KL − the baseline's, speed = decode tok/s ÷ the baseline's. "
        f"{FRONT_MARK}: on the Pareto frontier (no other configuration of the table is as fast "
        "with less KL, or faster with as little).", ""]
    for g in groups:
        where = f"capacity {g.capacity}"
        if several_bw:
            where += f", H2D {gbps_label(g.h2d_gbps)} GB/s"
        lines += [f"### {g.model} — {where}", ""]
        lines += frontier_table(g)
        lines += [""] + [f"- {s}" for s in frontier_lib.summary(g, per_config=False)] + [""]
    return lines[:-1]


# -- figures ---------------------------------------------------------------------------------
def _write_csv(path: str, rows: list[dict]) -> None:
    quality = any(r.get("kl_mean") is not None for r in rows)
    columns = CSV_COLUMNS + (QUALITY_CSV_COLUMNS if quality else ())
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns + ("layer_collision_miss_rate",))
        for r in rows:
            w.writerow([("" if r.get(k) is None else r[k]) for k in columns]
                       + [" ".join("" if v is None else f"{v:.6g}"
                                   for v in r["layer_collision_miss_rate"])])


def write_report(sweep_dir: str) -> str:
    """Writes report.md, cells.csv and the figures into sweep_dir; returns report.md's path."""
    from moejax.analysis import report_figures as figs  # matplotlib: only when drawing

    sweep = scan(sweep_dir)
    rows = sweep.rows
    for draw, name in zip((figs.fig4, figs.fig5, figs.fig6, figs.fig_ttft_decode), FIGURES):
        draw(rows, os.path.join(sweep_dir, name))
    pairs = dropin_pairs(rows)
    dropin_path = os.path.join(sweep_dir, DROPIN_FIGURE)
    if pairs:
        figs.fig_dropin(pairs, dropin_path)
    elif os.path.exists(dropin_path):  # an earlier report's, of cells no longer there
        os.unlink(dropin_path)
    groups = frontier_lib.frontier_rows(rows)
    quality_path = os.path.join(sweep_dir, QUALITY_FIGURE)
    if groups:
        figs.fig_quality_frontier(groups, quality_path)
    elif os.path.exists(quality_path):
        os.unlink(quality_path)
    _write_csv(os.path.join(sweep_dir, "cells.csv"), rows)
    path = os.path.join(sweep_dir, "report.md")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(_markdown(sweep_dir, sweep))
    os.replace(tmp, path)
    return path


PROG = "python -m moejax.analysis.report"


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep_dir", required=True, help="the sweep (DIR/cells/*/results.json)")
    args = parser.parse_args(argv)

    def body():
        open_sweep(args.sweep_dir)  # checked before anything is written
        print(write_report(args.sweep_dir))
    return guarded(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
