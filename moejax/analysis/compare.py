"""Eviction policies side by side on a finished sweep: hit rate (ready + late) and
collision-miss rate per trace and capacity, for one prefetch policy and bandwidth — the
figures behind studies/specmd/findings.md's grid findings; or, with `--dropin`, SpecMD's drop-in tables
(each `policies.preset` run with its own eviction vs with `policies.eviction=least_stale`, all
else equal; the same tables as report.md's).

    python -m moejax.analysis.compare --sweep_dir=D [--prefetch=none] [--h2d_gbps=5]
        [--evictions=lru,lru_per_layer,least_stale,belady]
    python -m moejax.analysis.compare --sweep_dir=D --dropin [--h2d_gbps=5]

A --sweep_dir that is not a sweep (or holds a results.json that does not parse), and a filter
no cell matches (`--prefetch=topk` where the sweep has `topk(overfetch=1.5)`), are named with
the values the cells have, exit status 2.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from moejax import cli
from moejax.analysis.sweep_cells import dropin_pairs, hit_parts, load_cells, open_sweep
from moejax.cli import UsageError, guarded

PROG = "python -m moejax.analysis.compare"


def _at(rows: list[dict], h2d_gbps: float | None) -> list[dict]:
    if h2d_gbps is None:
        return rows
    return [r for r in rows if r["h2d_gbps"] is not None
            and abs(float(r["h2d_gbps"]) - h2d_gbps) < 1e-9]


def _pct(x, digits: int = 1) -> str:
    return "?" if x is None else f"{100 * x:.{digits}f}%"


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _matching(rows: list[dict], **wanted) -> list[dict]:
    """The rows at every wanted value (`h2d_gbps` within 1e-9). A filter that leaves no cell
    is a usage error naming its flag and the values the cells have."""
    applied = []
    for key, value in wanted.items():
        kept = _at(rows, value) if key == "h2d_gbps" else [r for r in rows if r[key] == value]
        if not kept and rows:
            have = sorted({r[key] for r in rows if r[key] is not None}, key=str)
            among = f" among the cells with {', '.join(applied)}" if applied else ""
            raise UsageError(f"--{key}={_value(value)}: no cell has it{among}; they have: "
                             f"{', '.join(_value(v) for v in have) or 'none recorded'}")
        applied.append(f"--{key}={_value(value)}")
        rows = kept
    return rows


def cell(r: dict | None) -> str:
    """`ready + late / collisions`, all of requests."""
    if r is None:
        return "–"
    ready, late = hit_parts(r)
    hits = (f"{_pct(ready)} + {_pct(late)}" if ready is not None
            else f"{_pct(r['hit_rate'])} (split ?)")
    return f"{hits} / {_pct(r['collision_miss_rate'], 2)}"


def table(sweep_dir: str, prefetch: str, h2d_gbps: float, evictions: list[str],
          queue: str = "immediate", miss: str = "fetch", routing: str = "standard") -> str:
    """One row per trace and capacity, one column per eviction, at one prefetch, bandwidth,
    prefetch queue, miss and routing policy (a cell of any other setup is not shown)."""
    rows = _matching(load_cells(sweep_dir), h2d_gbps=h2d_gbps, prefetch=prefetch, queue=queue,
                     miss=miss, routing=routing)
    by = defaultdict(dict)
    label = {}
    for r in rows:
        key = (r["trace"], r["capacity_key"])
        by[key][r["eviction"]] = r
        label[key] = f"{r['capacity']} ({r['slots']} slots)"
    head = " | ".join(f"{e} hit ready + late / coll" for e in evictions)
    lines = [f"prefetch `{prefetch}` ({queue} queue), miss `{miss}`, routing `{routing}`, "
             f"{h2d_gbps:g} GB/s", "",
             f"| trace | capacity | {head} |", "| --- | ---: |" + " ---: |" * len(evictions)]
    for key in sorted(by):
        cells = " | ".join(cell(by[key].get(e)) for e in evictions)
        lines.append(f"| {key[0]} | {label[key]} | {cells} |")
    absent = [e for e in evictions if not any(r["eviction"] == e for r in rows)]
    if absent:
        lines += ["", f"No cell of {', '.join(absent)} here (–); the evictions these cells "
                      f"ran: {', '.join(sorted({r['eviction'] for r in rows}))}."]
    return "\n".join(lines)


def dropin(sweep_dir: str, h2d_gbps: float | None = None) -> str:
    """SpecMD's drop-in tables (report.md's section), at one bandwidth or all (None)."""
    from moejax.analysis.report import dropin_markdown

    rows = load_cells(sweep_dir)
    pairs = dropin_pairs(rows if h2d_gbps is None else _matching(rows, h2d_gbps=h2d_gbps))
    where = "all bandwidths" if h2d_gbps is None else f"{h2d_gbps:g} GB/s"
    if not pairs:
        return (f"no drop-in pairs ({where}): the sweep needs cells with policies.preset set, "
                "each with the preset's own eviction and with policies.eviction=least_stale, "
                "everything else equal")
    return "\n".join([f"SpecMD drop-in, {where}", "", *dropin_markdown(pairs)])


def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep_dir", required=True)
    ap.add_argument("--prefetch", default="none")
    ap.add_argument("--h2d_gbps", type=float, default=None,
                    help="bandwidth of the cells shown (default: 5 for the eviction table, "
                         "every bandwidth for --dropin)")
    ap.add_argument("--evictions", default="lru,lru_per_layer,least_stale,belady")
    ap.add_argument("--queue", default="immediate", help="cache.prefetch_queue of the cells")
    ap.add_argument("--miss", default="fetch")
    ap.add_argument("--routing", default="standard")
    ap.add_argument("--dropin", action="store_true",
                    help="print SpecMD's drop-in tables (preset vs preset + Least-Stale)")
    a = ap.parse_args(argv)

    def body():
        if not a.dropin and not [e for e in a.evictions.split(",") if e]:
            raise UsageError(f"--evictions={a.evictions}: name at least one eviction "
                             f"(comma-separated, e.g. lru,least_stale)")
        open_sweep(a.sweep_dir)
        if a.dropin:
            print(dropin(a.sweep_dir, a.h2d_gbps))
        else:
            print(table(a.sweep_dir, a.prefetch, 5.0 if a.h2d_gbps is None else a.h2d_gbps,
                        [e for e in a.evictions.split(",") if e], a.queue, a.miss, a.routing))
    return guarded(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
