"""The disk tier grid's answers (`studies/dossier/grid_disk.py`), as markdown tables.

    python -m moejax.analysis.disk_tier --sweep_dir=/tmp/grid_disk

1. Policies when a miss costs a storage read: per trace group, decode tok/s of each eviction
   (both tiers) and prefetch under each storage and host size, and at a host of 30% on the
   NVMe preset the tiers' hit rates and the storage stall.
2. Hotlists across domains and against per-layer LRU: per replayed trace, device and host
   hit rates and warm TTFT of LRU, per-layer LRU, full layers, and LRU / `priority` seeded
   with each domain's hotlist.

A --sweep_dir that is not a sweep, holds a results.json that does not parse, or has no cell
with a host tier, is named with exit status 2.

Trace groups: the embedded model's long traces (`embedded`: prose, code, math) and the real
captures by model (`olmoe`, `qwen`); numbers of a group are means over its traces.
"""

from __future__ import annotations

import collections
import re
import sys

from moejax.analysis.sweep_cells import mean, report_main
from moejax.errors import UsageError

PROG = "python -m moejax.analysis.disk_tier"

EMBEDDED_DOMAINS = ("prose", "code", "math")
STORAGE_ORDER = ("nvme_gen4", "sata_ssd", "this_disk")


def group_of(trace: str) -> str:
    return "embedded" if trace in EMBEDDED_DOMAINS else trace.split("_")[0]


def storage_label(row: dict) -> str:
    """The grid's storage names: a preset, or `this_disk` (the preset with overrides)."""
    setup = row["setup"]
    if setup.get("storage.read_gbps") not in (None, "None", "null"):
        return "this_disk"
    return str(row["storage"])


def seed_domain(seed: str) -> str:
    """The domain of a `hotlist(trace=...)` seed, from its trace names."""
    names = re.findall(r"([a-z]+)(?:_\d)?\.(?:npz|jsonl)", seed)
    domains = {n.split("_")[-1] for n in names}
    return "+".join(sorted(domains)) if domains else seed


def _fmt(x, digits=1, scale=1.0, pct=False) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.{digits}f}%" if pct else f"{x * scale:.{digits}f}"


def _groups(rows: list[dict]) -> dict[str, list[dict]]:
    out = collections.defaultdict(list)
    for r in rows:
        out[group_of(r["trace"])].append(r)
    return dict(out)


def policy_tables(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if not r["seed"] and not r["full_layers"]
            and r["host_experts"] is not None]
    lines = []
    for group, grows in _groups(rows).items():
        storages = [s for s in STORAGE_ORDER if any(storage_label(r) == s for r in grows)]
        hosts = sorted({r["host_capacity_frac"] for r in grows})
        cols = [(s, h) for s in storages for h in hosts]
        lines += [f"### {group}: decode tok/s (mean over traces)", "",
                  "| eviction | prefetch | " + " | ".join(f"{s} {100 * h:.0f}%" for s, h in cols)
                  + " |", "| --- | --- |" + " ---: |" * len(cols)]
        keys = sorted({(r["eviction"], r["prefetch"]) for r in grows},
                      key=lambda k: (k[1] != "none", k))
        best = {c: max(mean(r["decode_tok_per_s"] for r in grows
                            if (r["eviction"], r["prefetch"]) == k and
                            (storage_label(r), r["host_capacity_frac"]) == c) or 0
                       for k in keys) for c in cols}
        for k in keys:
            cells = []
            for c in cols:
                v = mean(r["decode_tok_per_s"] for r in grows if (r["eviction"], r["prefetch"]) == k
                         and (storage_label(r), r["host_capacity_frac"]) == c)
                mark = " ★" if v is not None and v == best[c] else ""
                cells.append(_fmt(v, 0) + mark)
            lines.append(f"| {k[0]} | {k[1]} | " + " | ".join(cells) + " |")
        lines.append("")
        detail = [r for r in grows if storage_label(r) == "nvme_gen4" and
                  r["host_capacity_frac"] == 0.3]
        if detail:
            lines += [f"### {group}: nvme_gen4, host 30% (means)", "",
                      "| eviction | prefetch | device hit (ready + late) | collision misses | "
                      "host hit | storage MB | storage stall ms | stall ms | warm TTFT ms |",
                      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
            for k in keys:
                sel = [r for r in detail if (r["eviction"], r["prefetch"]) == k]
                if not sel:
                    continue
                m = {f: mean(r[f] for r in sel) for f in (
                    "ready_hit_rate", "late_hit_rate", "collision_miss_rate", "host_hit_rate",
                    "host_storage_bytes", "host_storage_stall_s", "stall_s", "warm_ttft_s")}
                lines.append(
                    f"| {k[0]} | {k[1]} | {_fmt(m['ready_hit_rate'], pct=True)} + "
                    f"{_fmt(m['late_hit_rate'], pct=True)} | "
                    f"{_fmt(m['collision_miss_rate'], pct=True)} | "
                    f"{_fmt(m['host_hit_rate'], pct=True)} | "
                    f"{_fmt(m['host_storage_bytes'], 0, 1e-6)} | "
                    f"{_fmt(m['host_storage_stall_s'], 0, 1e3)} | {_fmt(m['stall_s'], 0, 1e3)} | "
                    f"{_fmt(m['warm_ttft_s'], 2, 1e3)} |")
            lines.append("")
    return lines


def placement_label(row: dict) -> str:
    if row["full_layers"]:
        return f"{row['eviction']}, full_layers={row['full_layers']}"
    if row["seed"]:
        return f"{row['eviction']} + hotlist({seed_domain(row['seed'])})"
    return row["eviction"]


def hotlist_tables(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if r["host_capacity_frac"] == 0.3 and storage_label(r) == "nvme_gen4"
            and r["prefetch"] == "none" and r["eviction"] in ("lru", "lru_per_layer", "priority")
            and r["host_eviction"] == r["eviction"]]
    lines = []
    for group, grows in _groups(rows).items():
        traces = sorted({r["trace"] for r in grows})
        labels = sorted({placement_label(r) for r in grows},
                        key=lambda x: ("hotlist" in x, "full" in x, x))
        lines += [f"### {group}: device hit rate (ready + late) / host hit rate / warm TTFT ms",
                  "", "| placement | " + " | ".join(traces) + " |",
                  "| --- |" + " ---: |" * len(traces)]
        for label in labels:
            cells = []
            for t in traces:
                sel = [r for r in grows if r["trace"] == t and placement_label(r) == label]
                if not sel:
                    cells.append("–")
                    continue
                r = sel[0]
                cells.append(f"{_fmt(r['hit_rate'], pct=True)} / "
                             f"{_fmt(r['host_hit_rate'], pct=True)} / "
                             f"{_fmt(r['warm_ttft_s'], 2, 1e3)}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    return report_main(PROG, __doc__, _main, argv)


def _main(sweep_dir: str, rows: list[dict]) -> None:
    if not any(r["host_experts"] is not None for r in rows):
        raise UsageError(f"--sweep_dir={sweep_dir}: none of its {len(rows)} finished cells "
                         f"ran a host tier (cache.host_capacity_frac): these tables are of "
                         f"studies/dossier/grid_disk.py's sweep")
    policies, hotlists = policy_tables(rows), hotlist_tables(rows)
    none = ["(no cell of this part of the grid here)", ""]
    print("\n".join(["## Policies with a storage tier", "", *(policies or none),
                     "## Hotlists, full layers and per-layer LRU", "", *(hotlists or none)]))


if __name__ == "__main__":
    sys.exit(main())
