"""Fiddler's claims (ICLR 2025, Mixtral-8x7B, single batch) in moejax's model: decode 1.26×
and prefill 1.30× faster than existing offloading systems — the Fiddler study's numbers, held
against a host-compute sweep (studies/fiddler/grid_host.py; studies/fiddler/README.md).

    python -m studies.fiddler.claims --sweep_dir=D

prints the host-compute tables (`moejax.analysis.host_compute.tables`: the hosts, host compute
against SpecMD's best caching configuration, latency_aware against the better of fetch and
host_compute), then Fiddler's claims. Fiddler's per-expert choice is `latency_aware`; its
speedup (the baseline's time / latency_aware's) is held to the source's number ±25%
(`verdicts.point`) against each baseline apart (`BASELINES`): a llama.cpp-style layer split
(the best N of `cache.host_compute_layers`), offloading with lossless fetch, and SpecMD's best
caching configuration (not Fiddler's baseline: it includes the lossy cascade). The words are
within / exceeds / falls short (`moejax/analysis/verdicts.py`). `fiddler_records` gives them in
the claims.json schema (SpecMD's claims tool adds them for a sweep that ran latency_aware).

A --sweep_dir that is not a sweep, holds a results.json that does not parse, or has no cell
computing on the host, is named with exit status 2.
"""

from __future__ import annotations

import collections
import dataclasses
import sys

from moejax.analysis import verdicts
from moejax.analysis.host_compute import (
    HOST_ORDER,
    MEASURES,
    NONE,
    SPEED,
    Cell,
    best_caching,
    cells_of,
    cond_text,
    condition_record,
    fastest,
    fixed_text,
    groups,
    host_cells,
    ms_text,
    passes_text,
    tables,
)
from moejax.analysis.sweep_cells import report_main

PROG = "python -m studies.fiddler.claims"

# Fiddler's claims (this study's reading of the paper, studies/fiddler/README.md; the ids are
# claims.json's): measure, the speedup the source states, and what it states it of.
FIDDLER_CLAIMS = {"fiddler.decode": ("decode", 1.26, "single-batch decode"),
                  "fiddler.prefill": ("ttft", 1.30, "prefill")}
# The baselines Fiddler's claims are held against, each apart (`baseline_cell`).
BASELINES = {
    "layer_split": "llama.cpp-style layer split: fetch with cache.host_compute_layers=N on the "
                   "same host, the fastest N of the grid's (N = 0, plain fetch, included)",
    "lossless_fetch": "offloading with lossless fetch: fetch at the cell's precision, with or "
                      "without the trace's prefetcher, the faster",
    "best_caching": "SpecMD's best caching configuration (fetch or the lossy fetch_priority "
                    "cascade, with or without prefetch): not Fiddler's baseline",
}
CLAIMED = "latency_aware"


def baseline_cell(cells: list[Cell], kind: str, cell: Cell, measure: str) -> Cell | None:
    """The baseline `kind` (of BASELINES) for the host-compute cell `cell`: the fastest cell of
    that kind at its condition (and, for the layer split, its host); None when there is none
    — for the layer split, when no cell of N > 0 ran on that host there."""
    if kind == "best_caching":
        return best_caching(cells, cell.condition, measure)
    if kind == "lossless_fetch":
        return fastest([c for c in cells if c.miss == "fetch" and not c.split
                         and c.condition == cell.condition], measure)
    if kind == "layer_split":
        found = [c for c in cells if c.miss == "fetch" and c.prefetch == "none"
                 and c.condition == cell.condition and (not c.split or c.host == cell.host)]
        return fastest(found, measure) if any(c.split for c in found) else None
    raise ValueError(f"baseline {kind!r}: expected one of {sorted(BASELINES)}")


@dataclasses.dataclass(frozen=True)
class FiddlerRow:
    """One claim at one host-compute condition against one baseline."""

    claim: str  # of FIDDLER_CLAIMS
    baseline: str  # of BASELINES
    cell: Cell  # latency_aware's
    reference: Cell | None  # the baseline's cell (None: no such cell at this condition)
    speedup: float | None  # reference's time / latency_aware's
    verdict: verdicts.Verdict


def fiddler_band(claim: str) -> verdicts.Band:
    measure, value, what = FIDDLER_CLAIMS[claim]
    return verdicts.point("speedup", value, lower_is_better=False,
                          text=f"{value:g}× (Fiddler, {what})")


def fiddler_rows(cells: list[Cell]) -> list[FiddlerRow]:
    """Every latency_aware cell with a time, each claim, each baseline: the speedup and its
    verdict — "faster than the baseline" is stated (a slower latency_aware is refuted on the
    time, an equal one a tie), then the speedup is held to the claim's band (`fiddler_band`;
    `verdicts.judge`, numeric: within / exceeds / falls short)."""
    out = []
    for claim, (measure, _, _) in FIDDLER_CLAIMS.items():
        band = fiddler_band(claim)
        for c in cells:
            if c.miss != CLAIMED or c.time(measure) is None:
                continue
            for kind in BASELINES:
                ref = baseline_cell(cells, kind, c, measure)
                speedup = None if ref is None else ref.time(measure) / c.time(measure)
                faster = () if ref is None else (verdicts.Check(
                    SPEED[measure], c.time(measure), ref.time(measure), True),)
                v = verdicts.judge(faster, band=band, value=speedup, numeric=True)
                if ref is None:
                    v = dataclasses.replace(v, rule=f"no {kind} cell at this condition"
                                            + (" and host" if kind == "layer_split" else ""))
                else:
                    v = dataclasses.replace(v, rule=f"{band.metric} = {ref.label} "
                                            f"{ref.time(measure):.6g} ms / {CLAIMED} "
                                            f"{c.time(measure):.6g} ms; {v.rule} (band "
                                            f"{band.low:.4g}–{band.high:.4g}×)")
                out.append(FiddlerRow(claim, kind, c, ref, speedup, v))
    return out


def fiddler_records(rows: list[dict], sweep_dir: str | None = None) -> list[dict]:
    """Fiddler's claims in claims.json's schema: one record per claim (`fiddler.decode`,
    `fiddler.prefill`) x trace x condition x baseline, from a sweep's `cell_row` rows (its
    results.json read for the trace fields a row lacks when `sweep_dir` is given:
    `trace_fields`). Each: {"claim", "baseline" (of BASELINES), "trace" (results.json
    `trace.name`), "condition" (`condition_record`), "metrics" {"claimed_ms", "baseline_ms",
    "speedup", "baseline_cell" (its label), "measure", "band"}, "verdict", "failing_metric",
    "rule"}."""
    out = []
    for r in fiddler_rows(cells_of(rows, sweep_dir)):
        measure = FIDDLER_CLAIMS[r.claim][0]
        band = fiddler_band(r.claim)
        out.append({
            "claim": r.claim, "baseline": r.baseline, "trace": r.cell.trace,
            "condition": condition_record(r.cell),
            "metrics": {"measure": MEASURES[measure], "claimed_ms": r.cell.time(measure),
                        "baseline_ms": None if r.reference is None else r.reference.time(measure),
                        "baseline_cell": None if r.reference is None else r.reference.label,
                        "speedup": r.speedup, "band": [band.low, band.high]},
            "verdict": r.verdict.word, "failing_metric": r.verdict.failing_metric,
            "rule": r.verdict.rule})
    return out


def fiddler_summary(rows: list[FiddlerRow]) -> list[str]:
    """Per claim, baseline, trace, precision and host: how many conditions have each word
    (counts of conditions, never an average over them)."""
    lines = []
    for claim, (measure, value, what) in FIDDLER_CLAIMS.items():
        band = fiddler_band(claim)
        lines += [f"### {claim}: {what} {value:g}× — speedup band {band.low:.4g}–"
                  f"{band.high:.4g}× ({band.text})", "",
                  "| trace | precision | host | " + " | ".join(BASELINES) + " |",
                  "| --- | --- | --- |" + " --- |" * len(BASELINES)]
        mine = [r for r in rows if r.claim == claim]
        keys = sorted({(r.cell.trace, r.cell.precision, r.cell.host) for r in mine},
                      key=lambda k: (groups([r.cell for r in mine]).index(k[:2]),
                                     HOST_ORDER.index(k[2]) if k[2] in HOST_ORDER else 9, k[2]))
        for trace, precision, host in keys:
            out = []
            for kind in BASELINES:
                at = [r for r in mine if r.baseline == kind and
                      (r.cell.trace, r.cell.precision, r.cell.host) == (trace, precision, host)]
                counts = collections.Counter(r.verdict.word for r in at)
                order = sorted(counts, key=verdicts.word_order)
                out.append(", ".join(f"{w} {counts[w]}" for w in order) + f" of {len(at)}")
            lines.append(f"| {trace} | {precision} | {host} | " + " | ".join(out) + " |")
        lines.append("")
    return lines


def fiddler_detail(rows: list[FiddlerRow]) -> list[str]:
    """Every condition: latency_aware's time, each baseline's (which cell), the speedup and
    its word."""
    lines = []
    for claim, (measure, value, _) in FIDDLER_CLAIMS.items():
        mine = [r for r in rows if r.claim == claim]
        for trace, precision in groups([r.cell for r in mine]):
            at = [r for r in mine if (r.cell.trace, r.cell.precision) == (trace, precision)]
            lines += [f"### {claim} ({value:g}×): {trace} ({precision}), {MEASURES[measure]}",
                      "", f"{fixed_text([r.cell for r in at])}. Each baseline: its time (cell), "
                      "speedup, word.", "",
                      "| capacity / link / host | cache | latency_aware | " +
                      " | ".join(BASELINES) + " |",
                      "| --- | --- | ---: |" + " --- |" * len(BASELINES)]
            cells = sorted({r.cell for r in at}, key=lambda c: (
                c.capacity, c.gbps, HOST_ORDER.index(c.host) if c.host in HOST_ORDER else 9))
            for c in cells:
                out = [cond_text(c.capacity, c.gbps, c.host), passes_text(c), ms_text(c.time(measure))]
                for kind in BASELINES:
                    r = next(r for r in at if r.cell == c and r.baseline == kind)
                    out.append("–" if r.reference is None else
                               f"{ms_text(r.reference.time(measure))} ({_short(r.reference)}) "
                               f"×{r.speedup:.2f} {r.verdict.word}")
                lines.append("| " + " | ".join(out) + " |")
            lines.append("")
    return lines


def _short(c: Cell) -> str:
    if c.split:
        return f"N={c.split}"
    return c.label


def main(argv: list[str] | None = None) -> int:
    return report_main(PROG, __doc__, _main, argv)


def _main(sweep_dir: str, rows: list[dict]) -> None:
    cells = host_cells(sweep_dir, rows)
    fiddler = fiddler_rows(cells)
    print("\n".join([
        *tables(sweep_dir, rows, cells),
        "## Fiddler's claims, against each baseline apart", "",
        *[f"- `{k}`: {v}" for k, v in BASELINES.items()], "",
        "Words: latency_aware must be faster than the baseline (slower: refuted on the time; "
        "equal: a tie), then its speedup (the baseline's time / its own) is held to the "
        "source's number ±25%, per condition; the counts are of conditions (capacity x "
        "link), never an average over them.", "",
        *(fiddler_summary(fiddler) or NONE), *(fiddler_detail(fiddler) or NONE)]))


if __name__ == "__main__":
    sys.exit(main())
