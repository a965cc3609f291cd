"""The host-compute grid's answers (`configs/grid_host.py`), as markdown tables.

    python -m moejax.analysis.host_compute --sweep_dir=grid_host

Two modelled times per cell, both on the virtual clock (replay): the decode time per token
(`decode_s / decode_tokens`, ms) and the TTFT (the prefill of each request, ms; the mean over
the trace's requests). Each is compared on its own, trace by trace (never averaged over
traces), at each condition — capacity (of the model's bytes), link (`hardware.h2d_gbps`) and
host (`host.preset`):

1. `host_compute` and `latency_aware` against SpecMD's best caching configuration: per trace,
   capacity and link, the caching cell (`fetch`, `fetch_priority`, with or without the
   trace's prefetcher; they move weights, so the host does not enter) with the lowest time of
   that measure, named; a policy "beats" it when its time is lower, "loses" when higher
   (equal within `TIE` of the reference: a tie). The conditions where each wins and loses.
2. `latency_aware` against the better of `fetch` and `host_compute` (both without prefetch,
   as latency_aware runs): every condition where it is above the better one by more than
   `TIE`, listed with the three times.
3. Fiddler's claims (ICLR 2025, Mixtral-8x7B): single-batch decode 1.26x and prefill 1.30x
   faster than the best offloading baseline. In our model Fiddler's per-expert choice is
   `latency_aware` and the best offloading baseline is SpecMD's best caching configuration;
   per trace and host, the speedups (reference time / latency_aware's) over the grid's
   capacities and links, and a verdict (`fiddler_verdict`).

A --sweep_dir that is not a sweep, holds a results.json that does not parse, or has no cell
computing on the host, is named with exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys

from moejax.analysis.sweep_cells import mean, report_main
from moejax.cli import UsageError

PROG = "python -m moejax.analysis.host_compute"

CACHING = ("fetch", "fetch_priority")
HOST_POLICIES = ("host_compute", "latency_aware")
HOST_ORDER = ("desktop_ddr5", "server_ddr5", "this_vm", "cpu")
# Two modelled times within this share of each other are a tie (float sums of one schedule).
TIE = 1e-9
# Fiddler's claims (issue 25's reading of the paper): measure -> speedup over the best
# offloading baseline.
FIDDLER_CLAIMS = {"decode": 1.26, "ttft": 1.30}
MEASURES = {"decode": "decode ms/token", "ttft": "TTFT ms (mean over requests)"}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One finished cell, as the tables read it."""

    trace: str
    capacity: float  # cache.capacity_frac as configured (of the model's bytes in the grid)
    gbps: float  # host->device link (hardware.h2d_gbps)
    miss: str  # the miss policy's name, without arguments
    prefetch: str  # the prefetcher's spec ("none" when none)
    host: str | None  # host.preset of a host-compute cell; None for a caching cell
    decode_ms: float | None  # modelled decode time per token, ms
    ttft_ms: float | None  # modelled TTFT, ms, mean over the trace's requests

    def time(self, measure: str) -> float | None:
        return self.decode_ms if measure == "decode" else self.ttft_ms

    @property
    def condition(self) -> tuple:
        return (self.trace, self.capacity, self.gbps)

    @property
    def label(self) -> str:
        return self.miss + ("" if self.prefetch == "none" else f" + {self.prefetch}")


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


def cell_of(row: dict) -> Cell:
    """A `sweep_cells.cell_row` row as a `Cell`."""
    miss = _base(row["miss"])
    rate = row.get("decode_tok_per_s")
    ttfts = row.get("ttft_per_request_s") or [row.get("ttft_s")]
    ttft = mean(ttfts)
    host = _shown((row.get("setup") or {}).get("host.preset")) if miss in HOST_POLICIES else None
    # The capacity as configured (of the model's bytes in this grid), not the cache's
    # effective share of the experts' bytes (`capacity_frac` of the row).
    capacity = _shown((row.get("setup") or {}).get("cache.capacity_frac"))
    return Cell(trace=row["trace"],
                capacity=float(capacity if capacity is not None else row["capacity_frac"]),
                gbps=float(row["h2d_gbps"]), miss=miss,
                prefetch="none" if _base(row["prefetch"]) == "none" else row["prefetch"],
                host=host, decode_ms=1e3 / rate if rate else None,
                ttft_ms=None if ttft is None else 1e3 * ttft)


# -- the verdicts (pure: tested on hand-made cells) ------------------------------------------
def verdict(time: float, reference: float) -> str:
    """"beats" (lower), "loses" (higher) or "ties" (within `TIE` of the reference)."""
    if abs(time - reference) <= TIE * abs(reference):
        return "ties"
    return "beats" if time < reference else "loses"


def best_caching(cells: list[Cell], condition: tuple, measure: str) -> Cell | None:
    """SpecMD's best caching configuration at `condition` (trace, capacity, link): the caching
    cell with the lowest time of `measure` (the first by label among equal ones)."""
    found = [c for c in cells if c.miss in CACHING and c.condition == condition
             and c.time(measure) is not None]
    return min(found, key=lambda c: (c.time(measure), c.label)) if found else None


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
    without prefetch (same trace, capacity, link) and `host_compute` (same host too), beyond
    `TIE`, as (cell, fetch's time, host_compute's time)."""
    fetch = {c.condition: c for c in cells if c.miss == "fetch" and c.prefetch == "none"}
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


def fiddler_verdict(speedups: list[float], claim: float) -> str:
    """The claim against the speedups of one trace (or group) over its conditions:
    "reproduced" when the median reaches the claim; "partly" when some condition reaches it
    (but not the median); "not reproduced" otherwise — said "faster, short of the claim" when
    every speedup is above 1 and "slower" when none is."""
    if not speedups:
        return "no cells"
    reach = sum(s >= claim for s in speedups)
    if statistics.median(speedups) >= claim:
        return f"reproduced ({reach} of {len(speedups)} conditions reach {claim}x)"
    if reach:
        return f"partly ({reach} of {len(speedups)} conditions reach {claim}x)"
    if all(s > 1 for s in speedups):
        return "not reproduced (faster, short of the claim)"
    if not any(s > 1 for s in speedups):
        return "not reproduced (slower)"
    faster = sum(s > 1 for s in speedups)
    return f"not reproduced (faster in {faster} of {len(speedups)} conditions)"


# -- tables ----------------------------------------------------------------------------------
def _hosts(cells: list[Cell]) -> list[str]:
    found = {c.host for c in cells if c.host}
    return [h for h in HOST_ORDER if h in found] + sorted(found - set(HOST_ORDER))


def _traces(cells: list[Cell]) -> list[str]:
    return sorted({c.trace for c in cells}, key=lambda t: (t.endswith(("_0", "_1")), t))


def _cond(capacity: float, gbps: float, host: str | None = None) -> str:
    return f"{100 * capacity:g}% / {gbps:g} GB/s" + (f" / {host}" if host else "")


def _ms(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def best_tables(cells: list[Cell], measure: str) -> list[str]:
    compared = against_best(cells, measure)
    hosts = _hosts(cells)
    lines = []
    for trace in _traces(cells):
        rows = [x for x in compared if x[0].trace == trace]
        if not rows:
            continue
        conds = sorted({x[0].condition[1:] for x in rows})
        head = ["capacity / link", "best caching"] + [
            f"{p} {h}" for h in hosts for p in HOST_POLICIES]
        lines += [f"### {trace}: {MEASURES[measure]}; host compute's time (speedup over the "
                  f"best caching configuration)", "", "| " + " | ".join(head) + " |",
                  "| --- | --- |" + " ---: |" * (len(head) - 2)]
        for cap, gbps in conds:
            at = [x for x in rows if x[0].condition[1:] == (cap, gbps)]
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
    """Per trace: of its conditions, how many each host policy wins, per measure."""
    lines = ["| trace | " + " | ".join(f"{p} {m}" for m in MEASURES for p in HOST_POLICIES)
             + " |", "| --- |" + " ---: |" * (2 * len(MEASURES))]
    results = {m: against_best(cells, m) for m in MEASURES}
    for trace in _traces(cells):
        out = []
        for m in MEASURES:
            for p in HOST_POLICIES:
                mine = [x for x in results[m] if x[0].trace == trace and x[0].miss == p]
                won = sum(x[3] == "beats" for x in mine)
                out.append(f"{won} / {len(mine)}" if mine else "–")
        lines.append(f"| {trace} | " + " | ".join(out) + " |")
    return lines + [""]


def latency_aware_lines(cells: list[Cell]) -> list[str]:
    lines = []
    for measure in MEASURES:
        compared, exceptions = latency_aware_exceptions(cells, measure)
        lines.append(f"- {MEASURES[measure]}: latency_aware is above the better of fetch and "
                     f"host_compute in {len(exceptions)} of {compared} conditions"
                     + (":" if exceptions else "."))
        for c, tf, th in sorted(exceptions, key=lambda e: (e[0].trace, e[0].condition,
                                                           e[0].host)):
            better = min(tf, th)
            lines.append(f"  - {c.trace}, {_cond(c.capacity, c.gbps, c.host)}: "
                         f"{_ms(c.time(measure))} against fetch {_ms(tf)}, host_compute "
                         f"{_ms(th)} (+{100 * (c.time(measure) / better - 1):.2f}%)")
    return lines + [""]


def fiddler_table(cells: list[Cell]) -> list[str]:
    """Per trace and host: latency_aware's speedups over the best caching configuration,
    across the grid's capacities and links, and the verdict on each claim."""
    hosts = _hosts(cells)
    la = {m: [x for x in against_best(cells, m) if x[0].miss == "latency_aware"]
          for m in FIDDLER_CLAIMS}
    head = [f"{m}: min / median / max (Fiddler: {c}x) | verdict"
            for m, c in FIDDLER_CLAIMS.items()]
    lines = ["| trace | host | " + " | ".join(head) + " |",
             "| --- | --- |" + " ---: | --- |" * len(FIDDLER_CLAIMS)]
    for trace in _traces(cells):
        for h in hosts:
            out = []
            for m, claim in FIDDLER_CLAIMS.items():
                s = sorted(x[2] for x in la[m] if x[0].trace == trace and x[0].host == h)
                out += ([f"{s[0]:.2f} / {statistics.median(s):.2f} / {s[-1]:.2f}",
                         fiddler_verdict(s, claim)] if s else ["–", "no cells"])
            if any(o != "–" for o in out[::2]):
                lines.append(f"| {trace} | {h} | " + " | ".join(out) + " |")
    return lines + [""]


def host_profiles(sweep_dir: str, rows: list[dict]) -> list[str]:
    """The host profile each preset ran with, as its cells' results.json record it
    (`cache.host_compute.host`); a preset whose cells disagree (edited mid-sweep) says so."""
    seen: dict[str, set] = {}
    for r in rows:
        if _base(r["miss"]) not in HOST_POLICIES:
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
    cells = [cell_of(r) for r in rows if r["capacity_frac"] is not None
             and r["h2d_gbps"] is not None]
    if not any(c.miss in HOST_POLICIES for c in cells):
        raise UsageError(f"--sweep_dir={sweep_dir}: none of its {len(rows)} finished cells "
                         f"computed on the host (policies.miss=host_compute or latency_aware): "
                         f"these tables are of configs/grid_host.py's sweep")
    none = ["(no cell of this comparison here)", ""]
    print("\n".join([
        "## The hosts (as the cells ran them)", "", *host_profiles(sweep_dir, rows),
        "## Host compute against SpecMD's best caching configuration", "",
        "Conditions won, per trace (of capacity x link x host):", "", *summary_table(cells),
        *(best_tables(cells, "decode") or none), *(best_tables(cells, "ttft") or none),
        "## latency_aware against the better of fetch and host_compute", "",
        *latency_aware_lines(cells),
        "## Fiddler's claims, in our model", "",
        "latency_aware's speedup over the best caching configuration, over the grid's "
        "capacities and links:", "", *fiddler_table(cells)]))


if __name__ == "__main__":
    sys.exit(main())
