"""Reading a host-compute sweep (such as the Fiddler study's grid, studies/fiddler/): its
cells (`Cell`), the comparisons and the tables, in markdown. The study's claims and their
numbers are studies/fiddler/claims.py's; its command prints these tables and its own
(`python -m studies.fiddler.claims --sweep_dir=D`).

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

`tables` gives both, with the host profiles the cells ran; a sweep with no cell computing on
the host is refused (`host_cells`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from moejax.analysis import verdicts
from moejax.analysis.sweep_cells import mean
from moejax.cli import UsageError

CACHING = ("fetch", "fetch_priority")
HOST_POLICIES = ("host_compute", "latency_aware")
HOST_ORDER = ("desktop_ddr5", "server_ddr5", "this_vm", "cpu")
PRECISION_ORDER = ("int4", "native")
# Two modelled times within this share of each other are a tie (float sums of one schedule).
TIE = verdicts.TIME_TIE
MEASURES = {"decode": "decode ms/token", "ttft": "TTFT ms (mean over requests)"}
# The time a verdict names where latency_aware is slower than the baseline.
SPEED = {"decode": "decode time", "ttft": "TTFT"}
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
    request_tokens: int | None = None  # replay.request_tokens (None: the trace's own passes)
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
                                                       _setup_field(setup, "request_tokens"))),
                prefill_tokens=_int_or_none(fields.get("prefill_tokens",
                                                       _setup_field(setup, "prefill_tokens"))))


def _setup_field(setup: dict, name: str):
    """The replay section's field `name` of a row's config: `replay.NAME`, or in a row built
    before it moved there (sweeps on disk) `trace_NAME`."""
    value = setup.get(f"replay.{name}")
    return _shown(value if value is not None else setup.get(f"trace_{name}"))


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


def fastest(found: list[Cell], measure: str) -> Cell | None:
    """The cell of `found` with the lowest time of `measure` (the first by label among equal
    ones); None when none has a time."""
    found = [c for c in found if c.time(measure) is not None]
    return min(found, key=lambda c: (c.time(measure), c.label)) if found else None


def best_caching(cells: list[Cell], condition: tuple, measure: str) -> Cell | None:
    """SpecMD's best caching configuration at `condition`: the caching cell (no layer on the
    host) with the lowest time of `measure` (the first by label among equal ones)."""
    return fastest([c for c in cells if c.miss in CACHING and not c.split
                     and c.condition == condition], measure)


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


def condition_record(c: Cell) -> dict:
    """A claims.json condition of a host-compute cell."""
    passes = c.capacity_passes
    return {"queue": c.queue, "prefetch": c.prefetch, "capacity_frac": c.capacity,
            "capacity_of": c.capacity_of, "slots": c.slots,
            "capacity_passes": None if passes is None else round(passes, 6),
            "precision": c.precision, "h2d_gbps": c.gbps, "hardware": c.hardware,
            "request_tokens": c.request_tokens, "prefill_tokens": c.prefill_tokens,
            "host": c.host}


# -- tables ----------------------------------------------------------------------------------
def _hosts(cells: list[Cell]) -> list[str]:
    found = {c.host for c in cells if c.host}
    return [h for h in HOST_ORDER if h in found] + sorted(found - set(HOST_ORDER))


def groups(cells: list[Cell]) -> list[tuple[str, str]]:
    """(trace, precision) pairs, captures first, int4 before native."""
    found = {(c.trace, c.precision) for c in cells}
    return sorted(found, key=lambda g: (
        PRECISION_ORDER.index(g[1]) if g[1] in PRECISION_ORDER else len(PRECISION_ORDER), g[1],
        g[0].endswith(("_0", "_1")), g[0]))


def cond_text(capacity: float, gbps: float, host: str | None = None) -> str:
    return f"{100 * capacity:g}% / {gbps:g} GB/s" + (f" / {host}" if host else "")


def ms_text(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def fixed_text(cells: list[Cell]) -> str:
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
    for trace, precision in groups(cells):
        rows = [x for x in compared if (x[0].trace, x[0].precision) == (trace, precision)]
        if not rows:
            continue
        conds = sorted({(x[0].capacity, x[0].gbps) for x in rows})
        head = ["capacity / link", "best caching"] + [
            f"{p} {h}" for h in hosts for p in HOST_POLICIES]
        lines += [f"### {trace} ({precision}): {MEASURES[measure]}; host compute's time "
                  f"(speedup over the best caching configuration)", "",
                  f"{fixed_text([x[0] for x in rows])}.", "",
                  "| " + " | ".join(head) + " |",
                  "| --- | --- |" + " ---: |" * (len(head) - 2)]
        for cap, gbps in conds:
            at = [x for x in rows if (x[0].capacity, x[0].gbps) == (cap, gbps)]
            ref = at[0][1]
            out = [cond_text(cap, gbps), f"{ms_text(ref.time(measure))} ({ref.label})"]
            for h in hosts:
                for p in HOST_POLICIES:
                    hit = [x for x in at if x[0].host == h and x[0].miss == p]
                    out.append(f"{ms_text(hit[0][0].time(measure))} (×{hit[0][2]:.2f})"
                               if hit else "–")
            lines.append("| " + " | ".join(out) + " |")
        lines.append("")
        for p in HOST_POLICIES:
            mine = [x for x in rows if x[0].miss == p]
            won = [x for x in mine if x[3] == "beats"]
            lost = [x for x in mine if x[3] == "loses"]
            lines.append(f"- {p}: beats it in {len(won)} of {len(mine)} conditions, loses in "
                         f"{len(lost)}" + (": " + "; ".join(
                             f"{cond_text(x[0].capacity, x[0].gbps, x[0].host)} "
                             f"({ms_text(x[0].time(measure))} against {ms_text(x[1].time(measure))})"
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
    for trace, precision in groups(cells):
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
            lines.append(f"  - {c.trace} ({c.precision}), {cond_text(c.capacity, c.gbps, c.host)}: "
                         f"{ms_text(c.time(measure))} against fetch {ms_text(tf)}, host_compute "
                         f"{ms_text(th)} (+{100 * (c.time(measure) / better - 1):.2f}% over "
                         f"{lost_to})")
    return lines + [""]


def passes_text(c: Cell) -> str:
    p = c.capacity_passes
    return f"{c.slots} slots" + ("" if p is None else f", {p:.2g} passes")


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


def host_cells(sweep_dir: str, rows: list[dict]) -> list[Cell]:
    """The sweep's cells (`cells_of`); a sweep with none computing on the host is refused."""
    cells = cells_of(rows, sweep_dir)
    if not any(c.miss in HOST_POLICIES for c in cells):
        raise UsageError(f"--sweep_dir={sweep_dir}: none of its {len(rows)} finished cells "
                         f"computed on the host (policies.miss=host_compute or latency_aware): "
                         f"these tables are of studies/fiddler/grid_host.py's sweep")
    return cells


NONE = ["(no cell of this comparison here)", ""]


def tables(sweep_dir: str, rows: list[dict], cells: list[Cell]) -> list[str]:
    """The host profiles the cells ran, host compute against the best caching configuration,
    and latency_aware against the better of fetch and host_compute, as markdown lines."""
    return ["## The hosts (as the cells ran them)", "", *host_profiles(sweep_dir, rows),
            "## Host compute against SpecMD's best caching configuration", "",
            "Conditions won, per trace and precision (of capacity x link x host):", "",
            *summary_table(cells),
            *(best_tables(cells, "decode") or NONE), *(best_tables(cells, "ttft") or NONE),
            "## latency_aware against the better of fetch and host_compute", "",
            *latency_aware_lines(cells)]


if __name__ == "__main__":
    sys.exit("moejax.analysis.host_compute is a library module: the host-compute tables and "
             "Fiddler's claims are python -m studies.fiddler.claims --sweep_dir=D "
             "(studies/fiddler/README.md)")
