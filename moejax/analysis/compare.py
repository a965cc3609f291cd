"""Eviction policies side by side on a finished sweep: hit rate and collision-miss rate per
trace and capacity, for one prefetch policy and bandwidth — the figures behind WORKSPACE.md's
grid findings.

    python -m moejax.analysis.compare --sweep_dir=D [--prefetch=none] [--h2d_gbps=5]
        [--evictions=lru,lru_per_layer,least_stale,belady]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from moejax.analysis.sweep_cells import load_cells


def table(sweep_dir: str, prefetch: str, h2d_gbps: float, evictions: list[str]) -> str:
    rows = [r for r in load_cells(sweep_dir)
            if r["prefetch"] == prefetch and abs(float(r["h2d_gbps"]) - h2d_gbps) < 1e-9]
    by = defaultdict(dict)
    label = {}
    for r in rows:
        key = (r["trace"], r["capacity_key"])
        by[key][r["eviction"]] = r
        label[key] = f"{r['capacity']} ({r['slots']} slots)"
    head = " | ".join(f"{e} hit / coll" for e in evictions)
    lines = [f"prefetch `{prefetch}`, {h2d_gbps:g} GB/s", "",
             f"| trace | capacity | {head} |", "| --- | ---: |" + " ---: |" * len(evictions)]

    def cell(r):
        if r is None:
            return "–"
        return f"{100 * r['hit_rate']:.1f}% / {100 * r['collision_miss_rate']:.2f}%"

    for key in sorted(by):
        cells = " | ".join(cell(by[key].get(e)) for e in evictions)
        lines.append(f"| {key[0]} | {label[key]} | {cells} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweep_dir", required=True)
    ap.add_argument("--prefetch", default="none")
    ap.add_argument("--h2d_gbps", type=float, default=5.0)
    ap.add_argument("--evictions", default="lru,lru_per_layer,least_stale,belady")
    a = ap.parse_args()
    print(table(a.sweep_dir, a.prefetch, a.h2d_gbps, a.evictions.split(",")))


if __name__ == "__main__":
    main()
