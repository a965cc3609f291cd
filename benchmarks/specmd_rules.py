"""SpecMD's rules as defaults, checked on every shipped real capture: what a new user
gets replaying a capture at the paper's setting (5% of the model's bytes, int4 experts, SpecMD's
A100 profile at 5 GB/s) with the defaults, against the readings and rules they replaced.

    python benchmarks/specmd_rules.py [--traces=olmoe_prose,olmoe_code,...] [--out=FILE.md]

Each row is one replay job; its command line is `python -m moejax.main
--config=configs/replay.py --config.replay.trace=<capture> --config.model.family=<family>
--config.model.preset=<preset> --config.cache.capacity_frac=0.05
--config.cache.capacity_of=model --config.cache.precision=int4 --config.hardware.preset=a100_specmd`
plus the flags in its `flags` column. Hits are SpecMD's (ready + late), shown with the parts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from moejax import bundled, jobs
from moejax.jobs.schema import base_config

REQUESTS = {"replay.request_tokens": 128, "replay.prefill_tokens": 32}
# (check, what the issue asks, [(label, overrides)]): each check compares its rows.
CHECKS = [
    ("a", "Least-Stale + oracle through the watchdog has at least the hits of no prefetch", [
        ("LS, oracle, watchdog", {"policies.prefetch": "oracle",
                                  "cache.prefetch_queue": "watchdog"}),
        ("LS, no prefetch", {"policies.prefetch": "none"}),
        ("LS(left_first), oracle, watchdog_idle (the earlier defaults)",
         {"policies.eviction": "least_stale(order=left_first)",
          "policies.prefetch": "oracle", "cache.prefetch_queue": "watchdog_idle"}),
    ]),
    ("b", "requests of 128 tokens (32-token prefill), no prefetch: LS has >= 90% of LRU's hits", [
        ("LS", dict(REQUESTS)),
        ("LRU", {"policies.eviction": "lru", **REQUESTS}),
        ("LS(left_first)", {"policies.eviction": "least_stale(order=left_first)", **REQUESTS}),
    ]),
    ("c", "watchdog + oracle: 50 GB/s gives more ready hits than 5 GB/s", [
        (f"{gbps:g} GB/s{'' if queue == 'watchdog' else ', ' + queue}",
         {"policies.prefetch": "oracle", "cache.prefetch_queue": queue,
          "hardware.h2d_gbps": gbps})
        for queue in ("watchdog", "watchdog_idle") for gbps in (5.0, 50.0, 55.0)
    ]),
    ("d", "LS + temporal prefetch has fewer collision misses than LRU (immediate queue)", [
        (name, {"policies.eviction": spec, "policies.prefetch": "temporal"})
        for name, spec in (("LS", "least_stale"), ("LRU", "lru"),
                           ("LS(left_first)", "least_stale(order=left_first)"),
                           ("LS(cyclic)", "least_stale(order=cyclic)"), ("FLD", "fld"))
    ]),
]


def run(path: str, overrides: dict) -> dict:
    family, preset = bundled.capture_model(path)
    c = base_config()
    c.job, c.clock.kind, c.replay.trace = "replay", "virtual", path
    c.model.family, c.model.preset = family, preset
    c.cache.capacity_frac, c.cache.capacity_of, c.cache.precision = 0.05, "model", "int4"
    c.hardware.preset = "a100_specmd"
    c.policies.eviction = "least_stale"
    c.log.progress = c.log.tensorboard = False
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (c[section] if section else c)[name] = value
    with tempfile.TemporaryDirectory() as workdir:
        return jobs.run(c, workdir)


def flags(overrides: dict) -> str:
    return " ".join(f"--config.{k}={v!r}" if isinstance(v, str) and "(" in v
                    else f"--config.{k}={v}" for k, v in overrides.items())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [os.path.splitext(os.path.basename(p))[0] for p in bundled.capture_files()]
    ap.add_argument("--traces", default=",".join(names),
                    help=f"comma-separated capture names (default: all: {','.join(names)})")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    paths = {os.path.splitext(os.path.basename(p))[0]: p for p in bundled.capture_files()}
    unknown = [t for t in args.traces.split(",") if t not in paths]
    if unknown:
        sys.exit(f"--traces: unknown capture(s) {unknown}; the shipped ones are {names}")
    lines = ["| check | trace | configuration | hits (ready + late) | ready | late | "
             "collision misses | prefetches sent / dropped | stall s | flags |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for check, _, rows in CHECKS:
        for trace in args.traces.split(","):
            for label, overrides in rows:
                r = run(paths[trace], overrides)
                t = r["cache"]["total"]
                lines.append(
                    f"| {check} | {trace} | {label} | {t['hits'] + t['late_hits']:,} | "
                    f"{t['hits']:,} | {t['late_hits']:,} | {t['collision_misses']:,} | "
                    f"{t['prefetch_issued']:,} / {t['prefetch_dropped']:,} | "
                    f"{t['stall_s']:.2f} | `{flags(overrides)}` |")
            print(lines[-1], flush=True)
    text = "\n".join(["Checks: " + "; ".join(f"({c}) {what}" for c, what, _ in CHECKS), ""]
                     + lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
