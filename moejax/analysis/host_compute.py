"""The host-compute grid's answers (`configs/grid_host.py`), as markdown tables.

    python -m moejax.analysis.host_compute --sweep_dir=grid_host

Two modelled times per cell, both on the virtual clock (replay): the decode time per token
(`decode_s / decode_tokens`, ms) and the TTFT (the prefill of each request, ms; the mean over
the trace's requests). Each is compared on its own, trace by trace, at each condition — trace,
precision, capacity (as configured, of the model's bytes), link (`hardware.h2d_gbps`), hardware
profile, prefetch queue, request cut and, where the host computes, host (`host.preset`). Cells
that differ in any of these are never averaged:

1. `host_compute` and `latency_aware` against SpecMD's best caching configuration: per
   condition, the caching cell (`fetch`, `fetch_priority`, with or without the trace's
   prefetcher; they move weights, so the host does not enter) with the lowest time of that
   measure, named; a policy "beats" it when its time is lower, "loses" when higher (equal
   within `TIE` of the reference: "ties").
2. `latency_aware` against the better of `fetch` and `host_compute` (both without prefetch,
   as latency_aware runs): every condition where it is above the better one by more than
   `TIE`, listed with the three times and which of the two it lost to.
3. Fiddler's claims (ICLR 2025, Mixtral-8x7B, single batch): decode 1.26x and prefill 1.30x
   faster than existing offloading systems. Fiddler's per-expert choice is `latency_aware`;
   its speedup (the baseline's time / latency_aware's) is held to the source's number ±25%
   (`verdicts.point`) against each baseline apart (`BASELINES`): a llama.cpp-style layer split
   (the best N of `cache.host_compute_layers`), offloading with lossless fetch, and SpecMD's
   best caching configuration (not Fiddler's baseline: it includes the lossy cascade). The
   words are within / exceeds / falls short (`moejax/analysis/verdicts.py`).
   `fiddler_records` gives them in the claims.json schema.

A --sweep_dir that is not a sweep, holds a results.json that does not parse, or has no cell
computing on the host, is named with exit status 2.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys

from moejax.analysis import verdicts
from moejax.analysis.sweep_cells import mean, report_main
from moejax.cli import UsageError

PROG = "python -m moejax.analysis.host_compute"

CACHING = ("fetch", "fetch_priority")
HOST_POLICIES = ("host_compute", "latency_aware")
HOST_ORDER = ("desktop_ddr5", "server_ddr5", "this_vm", "cpu")
PRECISION_ORDER = ("int4", "native")
# Two modelled times within this share of each other are a tie (float sums of one schedule).
TIE = verdicts.TIME_TIE
MEASURES = {"decode": "decode ms/token", "ttft": "TTFT ms (mean over requests)"}
# The time a verdict names where latency_aware is slower than the baseline.
SPEED = {"decode": "decode time", "ttft": "TTFT"}
# Fiddler's claims (issue 25's reading of the paper; the ids are claims.json's): measure, the
# speedup the source states, and what it states it of.
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


@dataclasses.dataclass(frozen=True)
class Cell:
    """One finished cell, as the tables read it."""

    trace: str
    capacity: float  # cache.capacity_frac as configured (of the model's bytes in the grid)
    gbps: float  # host->device link (hardware.h2d_gbps)
    miss: str  # the miss policy's name, without arguments
    prefetch: str  # the prefetcher's spec ("none" when none)
    host: str | None  # host.preset where the host computes; None for a caching cell
    decode_ms: float | None  # modelled decode time per token, ms
    ttft_ms: float | None  # modelled TTFT, ms, mean over the trace's requests
    precision: str = "int4"  # cache.precision (the plain one)
    split: int = 0  # cache.host_compute_layers: the first N MoE layers on the host
    queue: str = "immediate"  # cache.prefetch_queue
    hardware: str = ""  # the GPU profile (hardware.preset, or the file's)
    capacity_of: str = "model"
    slots: int | None = None
    moe_layers: int | None = None
    top_k: int | None = None
    request_tokens: int | None = None  # trace_request_tokens (None: the trace's own passes)
    prefill_tokens: int | None = None

    def time(self, measure: str) -> float | None:
        return self.decode_ms if measure == "decode" else self.ttft_ms

    @property
    def condition(self) -> tuple:
        """What a comparison holds fixed (every field of a claims.json condition but the
        prefetcher, the slots, which follow from the rest, and the host)."""
        return (self.trace, self.precision, self.capacity, self.gbps, self.queue,
                self.hardware, self.capacity_of, self.request_tokens, self.prefill_tokens)

    @property
    def label(self) -> str:
        split = f" + host_compute_layers={self.split}" if self.split else ""
        return self.miss + split + ("" if self.prefetch == "none" else f" + {self.prefetch}")

    @property
    def capacity_passes(self) -> float | None:
        """The cache in passes: slots / (MoE layers x top_k), what one pass asks for."""
        if not (self.slots and self.moe_layers and self.top_k):
            return None
        return self.slots / (self.moe_layers * self.top_k)


def _base(spec: str) -> str:
    return spec.split("(")[0].strip()


def _shown(value) -> str | None:
    if value is None:
        return None
    try:
        v = json.loads(value)
    except (TypeError, ValueError):
        return str(value)
    return None if v is None else str(v)


def _int_or_none(value) -> int | None:
    return int(value) if value not in (None, "", 0, "0") else None


TRACE_FIELDS = ("top_k", "request_tokens", "prefill_tokens", "hardware")


def trace_fields(sweep_dir: str, row: dict) -> dict:
    """What a `sweep_cells.cell_row` row does not carry and a claims.json condition names, read
    from the cell's results.json: the trace's `top_k`, its request cut (`request_tokens`,
    `prefill_tokens`; None when the trace is replayed as recorded) and the GPU profile's name
    (`hardware`)."""
    with open(os.path.join(sweep_dir, "cells", row["name"], "results.json")) as f:
        results = json.load(f)
    trace = results.get("trace") if isinstance(results.get("trace"), dict) else {}
    hw = (results.get("cache") or {}).get("hardware") or {}
    return {"top_k": trace.get("top_k"), "request_tokens": trace.get("request_tokens"),
            "prefill_tokens": trace.get("prefill_tokens"), "hardware": hw.get("name")}


def cell_of(row: dict, fields: dict | None = None) -> Cell:
    """A `sweep_cells.cell_row` row as a `Cell`; `fields` (`trace_fields`) fills what the row
    lacks (a key of the row itself wins)."""
    fields = {**(fields or {}), **{k: row[k] for k in TRACE_FIELDS if row.get(k) is not None}}
    setup = row.get("setup") or {}
    miss = _base(row["miss"])
    rate = row.get("decode_tok_per_s")
    ttfts = row.get("ttft_per_request_s") or [row.get("ttft_s")]
    ttft = mean(ttfts)
    split = int(_shown(setup.get("cache.host_compute_layers")) or 0)
    # The host enters only where it computes (a caching cell's host.preset is not used).
    host = (_shown(setup.get("host.preset")) if miss in HOST_POLICIES or split else None)
    # The capacity as configured (of the model's bytes in this grid), not the cache's
    # effective share of the experts' bytes (`capacity_frac` of the row).
    capacity = _shown(setup.get("cache.capacity_frac"))
    hardware = fields.get("hardware") or _shown(setup.get("hardware.preset")) or ""
    return Cell(trace=row["trace"],
                capacity=float(capacity if capacity is not None else row["capacity_frac"]),
                gbps=float(row["h2d_gbps"]), miss=miss,
                prefetch="none" if _base(row["prefetch"]) == "none" else row["prefetch"],
                host=host, decode_ms=1e3 / rate if rate else None,
                ttft_ms=None if ttft is None else 1e3 * ttft,
                precision=str(row.get("precision") or _shown(setup.get("cache.precision"))
                              or "native"),
                split=split, queue=str(row.get("queue") or "immediate"), hardware=hardware,
                capacity_of=_shown(setup.get("cache.capacity_of")) or "experts",
                slots=row.get("slots"), moe_layers=len(row.get("layers") or []) or None,
                top_k=fields.get("top_k"),
                request_tokens=_int_or_none(fields.get("request_tokens",
                                                       _shown(setup.get("trace_request_tokens")))),
                prefill_tokens=_int_or_none(fields.get("prefill_tokens",
                                                       _shown(setup.get("trace_prefill_tokens")))))


def cells_of(rows: list[dict], sweep_dir: str | None = None) -> list[Cell]:
    """The rows with a capacity and a link as cells; with `sweep_dir`, each row's missing
    condition fields read from its results.json (`trace_fields`)."""
    return [cell_of(r, trace_fields(sweep_dir, r) if sweep_dir else None) for r in rows
            if r["capacity_frac"] is not None and r["h2d_gbps"] is not None]


# -- the comparisons (pure: tested on hand-made cells) ----------------------------------------
def verdict(time: float, reference: float) -> str:
    """"beats" (lower), "loses" (higher) or "ties" (within `TIE` of the reference)."""
    if abs(time - reference) <= TIE * abs(reference):
        return "ties"
    return "beats" if time < reference else "loses"


def _fastest(found: list[Cell], measure: str) -> Cell | None:
    found = [c for c in found if c.time(measure) is not None]
    return min(found, key=lambda c: (c.time(measure), c.label)) if found else None


def best_caching(cells: list[Cell], condition: tuple, measure: str) -> Cell | None:
    """SpecMD's best caching configuration at `condition`: the caching cell (no layer on the
    host) with the lowest time of `measure` (the first by label among equal ones)."""
    return _fastest([c for c in cells if c.miss in CACHING and not c.split
                     and c.condition == condition], measure)


def baseline_cell(cells: list[Cell], kind: str, cell: Cell, measure: str) -> Cell | None:
    """The baseline `kind` (of BASELINES) for the host-compute cell `cell`: the fastest cell of
    that kind at its condition (and, for the layer split, its host); None when there is none
    — for the layer split, when no cell of N > 0 ran on that host there."""
    if kind == "best_caching":
        return best_caching(cells, cell.condition, measure)
    if kind == "lossless_fetch":
        return _fastest([c for c in cells if c.miss == "fetch" and not c.split
                         and c.condition == cell.condition], measure)
    if kind == "layer_split":
        found = [c for c in cells if c.miss == "fetch" and c.prefetch == "none"
                 and c.condition == cell.condition and (not c.split or c.host == cell.host)]
        return _fastest(found, measure) if any(c.split for c in found) else None
    raise ValueError(f"baseline {kind!r}: expected one of {sorted(BASELINES)}")


def against_best(cells: list[Cell], measure: str) -> list[tuple[Cell, Cell, float, str]]:
    """(host-compute cell, best caching cell, speedup = reference / its time, verdict) of
    every host-compute cell with a time and a reference."""
    out = []
    for c in cells:
        if c.miss not in HOST_POLICIES or c.time(measure) is None:
            continue
        ref = best_caching(cells, c.condition, measure)
        if ref is None:
            continue
        out.append((c, ref, ref.time(measure) / c.time(measure),
                    verdict(c.time(measure), ref.time(measure))))
    return out


def latency_aware_exceptions(cells: list[Cell], measure: str
                             ) -> tuple[int, list[tuple[Cell, float, float]]]:
    """(conditions compared, exceptions): each latency_aware cell above the better of `fetch`
    without prefetch (same condition) and `host_compute` (same host too), beyond `TIE`, as
    (cell, fetch's time, host_compute's time)."""
    fetch = {c.condition: c for c in cells
             if c.miss == "fetch" and c.prefetch == "none" and not c.split}
    host = {(*c.condition, c.host): c for c in cells if c.miss == "host_compute"}
    compared, out = 0, []
    for c in cells:
        f, h = fetch.get(c.condition), host.get((*c.condition, c.host))
        if c.miss != "latency_aware" or f is None or h is None:
            continue
        t, tf, th = c.time(measure), f.time(measure), h.time(measure)
        if t is None or tf is None or th is None:
            continue
        compared += 1
        if verdict(t, min(tf, th)) == "loses":
            out.append((c, tf, th))
    return compared, out


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


def condition_record(c: Cell) -> dict:
    """A claims.json condition of a host-compute cell."""
    passes = c.capacity_passes
    return {"queue": c.queue, "prefetch": c.prefetch, "capacity_frac": c.capacity,
            "capacity_of": c.capacity_of, "slots": c.slots,
            "capacity_passes": None if passes is None else round(passes, 6),
            "precision": c.precision, "h2d_gbps": c.gbps, "hardware": c.hardware,
            "request_tokens": c.request_tokens, "prefill_tokens": c.prefill_tokens,
            "host": c.host}


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


# -- tables ----------------------------------------------------------------------------------
def _hosts(cells: list[Cell]) -> list[str]:
    found = {c.host for c in cells if c.host}
    return [h for h in HOST_ORDER if h in found] + sorted(found - set(HOST_ORDER))


def _groups(cells: list[Cell]) -> list[tuple[str, str]]:
    """(trace, precision) pairs, captures first, int4 before native."""
    found = {(c.trace, c.precision) for c in cells}
    return sorted(found, key=lambda g: (
        PRECISION_ORDER.index(g[1]) if g[1] in PRECISION_ORDER else len(PRECISION_ORDER), g[1],
        g[0].endswith(("_0", "_1")), g[0]))


def _cond(capacity: float, gbps: float, host: str | None = None) -> str:
    return f"{100 * capacity:g}% / {gbps:g} GB/s" + (f" / {host}" if host else "")


def _ms(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _fixed(cells: list[Cell]) -> str:
    """The condition fields a table holds fixed, as a line (several values: listed)."""
    def one(key, fmt=str):
        vals = sorted({getattr(c, key) for c in cells}, key=lambda v: (v is None, str(v)))
        return "/".join(fmt(v) for v in vals)
    cut = one("request_tokens", lambda v: "as recorded" if v is None else f"{v} tokens")
    return (f"hardware {one('hardware')}, queue {one('queue')}, capacity of the "
            f"{one('capacity_of')}, requests {cut} (prefill "
            f"{one('prefill_tokens', lambda v: 'as recorded' if v is None else str(v))})")


def best_tables(cells: list[Cell], measure: str) -> list[str]:
    compared = against_best(cells, measure)
    hosts = _hosts(cells)
    lines = []
    for trace, precision in _groups(cells):
        rows = [x for x in compared if (x[0].trace, x[0].precision) == (trace, precision)]
        if not rows:
            continue
        conds = sorted({(x[0].capacity, x[0].gbps) for x in rows})
        head = ["capacity / link", "best caching"] + [
            f"{p} {h}" for h in hosts for p in HOST_POLICIES]
        lines += [f"### {trace} ({precision}): {MEASURES[measure]}; host compute's time "
                  f"(speedup over the best caching configuration)", "",
                  f"{_fixed([x[0] for x in rows])}.", "",
                  "| " + " | ".join(head) + " |",
                  "| --- | --- |" + " ---: |" * (len(head) - 2)]
        for cap, gbps in conds:
            at = [x for x in rows if (x[0].capacity, x[0].gbps) == (cap, gbps)]
            ref = at[0][1]
            out = [_cond(cap, gbps), f"{_ms(ref.time(measure))} ({ref.label})"]
            for h in hosts:
                for p in HOST_POLICIES:
                    hit = [x for x in at if x[0].host == h and x[0].miss == p]
                    out.append(f"{_ms(hit[0][0].time(measure))} (×{hit[0][2]:.2f})"
                               if hit else "–")
            lines.append("| " + " | ".join(out) + " |")
        lines.append("")
        for p in HOST_POLICIES:
            mine = [x for x in rows if x[0].miss == p]
            won = [x for x in mine if x[3] == "beats"]
            lost = [x for x in mine if x[3] == "loses"]
            lines.append(f"- {p}: beats it in {len(won)} of {len(mine)} conditions, loses in "
                         f"{len(lost)}" + (": " + "; ".join(
                             f"{_cond(x[0].capacity, x[0].gbps, x[0].host)} "
                             f"({_ms(x[0].time(measure))} against {_ms(x[1].time(measure))})"
                             for x in lost) if lost else ""))
        lines.append("")
    return lines


def summary_table(cells: list[Cell]) -> list[str]:
    """Per trace and precision: of its conditions, how many each host policy wins, per
    measure."""
    lines = ["| trace | precision | " + " | ".join(
        f"{p} {m}" for m in MEASURES for p in HOST_POLICIES) + " |",
        "| --- | --- |" + " ---: |" * (2 * len(MEASURES))]
    results = {m: against_best(cells, m) for m in MEASURES}
    for trace, precision in _groups(cells):
        out = []
        for m in MEASURES:
            for p in HOST_POLICIES:
                mine = [x for x in results[m] if (x[0].trace, x[0].precision, x[0].miss) ==
                        (trace, precision, p)]
                won = sum(x[3] == "beats" for x in mine)
                out.append(f"{won} / {len(mine)}" if mine else "–")
        if any(o != "–" for o in out):
            lines.append(f"| {trace} | {precision} | " + " | ".join(out) + " |")
    return lines + [""]


def latency_aware_lines(cells: list[Cell]) -> list[str]:
    lines = []
    for measure in MEASURES:
        compared, exceptions = latency_aware_exceptions(cells, measure)
        above_host = sum(verdict(c.time(measure), th) == "loses" for c, _, th in exceptions)
        lines.append(f"- {MEASURES[measure]}: latency_aware is above the better of fetch and "
                     f"host_compute in {len(exceptions)} of {compared} conditions (above "
                     f"host_compute in {above_host})" + (":" if exceptions else "."))
        for c, tf, th in sorted(exceptions, key=lambda e: (e[0].condition, e[0].host)):
            better = min(tf, th)
            lost_to = "fetch" if tf <= th else "host_compute"
            lines.append(f"  - {c.trace} ({c.precision}), {_cond(c.capacity, c.gbps, c.host)}: "
                         f"{_ms(c.time(measure))} against fetch {_ms(tf)}, host_compute "
                         f"{_ms(th)} (+{100 * (c.time(measure) / better - 1):.2f}% over "
                         f"{lost_to})")
    return lines + [""]


def _passes(c: Cell) -> str:
    p = c.capacity_passes
    return f"{c.slots} slots" + ("" if p is None else f", {p:.2g} passes")


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
                      key=lambda k: (_groups([r.cell for r in mine]).index(k[:2]),
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
        for trace, precision in _groups([r.cell for r in mine]):
            at = [r for r in mine if (r.cell.trace, r.cell.precision) == (trace, precision)]
            lines += [f"### {claim} ({value:g}×): {trace} ({precision}), {MEASURES[measure]}",
                      "", f"{_fixed([r.cell for r in at])}. Each baseline: its time (cell), "
                      "speedup, word.", "",
                      "| capacity / link / host | cache | latency_aware | " +
                      " | ".join(BASELINES) + " |",
                      "| --- | --- | ---: |" + " --- |" * len(BASELINES)]
            cells = sorted({r.cell for r in at}, key=lambda c: (
                c.capacity, c.gbps, HOST_ORDER.index(c.host) if c.host in HOST_ORDER else 9))
            for c in cells:
                out = [_cond(c.capacity, c.gbps, c.host), _passes(c), _ms(c.time(measure))]
                for kind in BASELINES:
                    r = next(r for r in at if r.cell == c and r.baseline == kind)
                    out.append("–" if r.reference is None else
                               f"{_ms(r.reference.time(measure))} ({_short(r.reference)}) "
                               f"×{r.speedup:.2f} {r.verdict.word}")
                lines.append("| " + " | ".join(out) + " |")
            lines.append("")
    return lines


def _short(c: Cell) -> str:
    if c.split:
        return f"N={c.split}"
    return c.label


def host_profiles(sweep_dir: str, rows: list[dict]) -> list[str]:
    """The host profile each preset ran with, as its cells' results.json record it
    (`cache.host_compute.host`); a preset whose cells disagree (edited mid-sweep) says so."""
    seen: dict[str, set] = {}
    for r in rows:
        split = _shown((r.get("setup") or {}).get("cache.host_compute_layers"))
        if _base(r["miss"]) not in HOST_POLICIES and not int(split or 0):
            continue
        path = os.path.join(sweep_dir, "cells", r["name"], "results.json")
        with open(path) as f:
            host = ((json.load(f).get("cache") or {}).get("host_compute") or {}).get("host")
        if host:
            seen.setdefault(host["name"], set()).add(tuple(
                host.get(k) for k in ("mem_gbps", "tflops", "threads", "call_overhead_s")))
    lines = ["| host | memory GB/s | TFLOP/s | threads | call overhead µs |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name in [h for h in HOST_ORDER if h in seen] + sorted(set(seen) - set(HOST_ORDER)):
        for mem, tflops, threads, overhead in sorted(seen[name]):
            note = " (cells disagree)" if len(seen[name]) > 1 else ""
            lines.append(f"| {name}{note} | {mem:g} | {tflops:g} | {threads} | "
                         f"{1e6 * overhead:g} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    return report_main(PROG, __doc__, _main, argv)


def _main(sweep_dir: str, rows: list[dict]) -> None:
    cells = cells_of(rows, sweep_dir)
    if not any(c.miss in HOST_POLICIES for c in cells):
        raise UsageError(f"--sweep_dir={sweep_dir}: none of its {len(rows)} finished cells "
                         f"computed on the host (policies.miss=host_compute or latency_aware): "
                         f"these tables are of configs/grid_host.py's sweep")
    none = ["(no cell of this comparison here)", ""]
    fiddler = fiddler_rows(cells)
    print("\n".join([
        "## The hosts (as the cells ran them)", "", *host_profiles(sweep_dir, rows),
        "## Host compute against SpecMD's best caching configuration", "",
        "Conditions won, per trace and precision (of capacity x link x host):", "",
        *summary_table(cells),
        *(best_tables(cells, "decode") or none), *(best_tables(cells, "ttft") or none),
        "## latency_aware against the better of fetch and host_compute", "",
        *latency_aware_lines(cells),
        "## Fiddler's claims, against each baseline apart", "",
        *[f"- `{k}`: {v}" for k, v in BASELINES.items()], "",
        "Words: latency_aware must be faster than the baseline (slower: refuted on the time; "
        "equal: a tie), then its speedup (the baseline's time / its own) is held to the "
        "source's number ±25%, per condition; the counts are of conditions (capacity x "
        "link), never an average over them.", "",
        *(fiddler_summary(fiddler) or none), *(fiddler_detail(fiddler) or none)]))


if __name__ == "__main__":
    sys.exit(main())
