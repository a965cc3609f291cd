"""The prefetch staging share (`cache.prefetch_share`) against issue 21's finding, on every
shipped real capture: at SpecMD's setting (5% of the model's bytes, int4 experts, the A100
profile at 5 GB/s; `specmd_rules.py`), prefetches that evict current experts cost hits — the
oracle through the idle-engine watchdog under `least_stale(order=left_first)` fell below no
prefetch. Each prefetch configuration runs without a share, with shares of 10% and 25% (a used
prefetch joins the demand share: `promote`, the default) and with 25% under the `stay` variant.

    python benchmarks/prefetch_share.py [--traces=olmoe_prose,...] [--shares=0,0.1,0.25,0.25:stay]

Each row is one replay job (`specmd_rules.run`: its command line is written there) plus the
flags in its `flags` column. Hits are SpecMD's (ready + late); decode is the virtual clock's
modelled decode speed of the capture's model (`cache.timing.decode_tok_per_s`); used / wasted
are the staging share's counters (results.json `cache.staging`; none without a share).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

from specmd_rules import flags, run  # the same setting, the same jobs

from moejax import bundled

CONFIGS = [
    ("LS, no prefetch", {"policies.prefetch": "none"}),
    ("LS(left_first), oracle, watchdog_idle (issue 21)",
     {"policies.eviction": "least_stale(order=left_first)", "policies.prefetch": "oracle",
      "cache.prefetch_queue": "watchdog_idle"}),
    ("LS, oracle, watchdog", {"policies.prefetch": "oracle",
                              "cache.prefetch_queue": "watchdog"}),
    ("LS, temporal", {"policies.prefetch": "temporal"}),
    ("LS, cooccur", {"policies.prefetch": "cooccur"}),
    ("LRU, cooccur", {"policies.eviction": "lru", "policies.prefetch": "cooccur"}),
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [os.path.splitext(os.path.basename(p))[0] for p in bundled.capture_files()]
    ap.add_argument("--traces", default=",".join(names),
                    help=f"comma-separated capture names (default: all: {','.join(names)})")
    ap.add_argument("--shares", default="0,0.1,0.25,0.25:stay",
                    help="prefetch shares to run each prefetch configuration at, each "
                         "SHARE or SHARE:USE (cache.prefetch_share_use; default promote)")
    args = ap.parse_args(argv)
    paths = {os.path.splitext(os.path.basename(p))[0]: p for p in bundled.capture_files()}
    unknown = [t for t in args.traces.split(",") if t not in paths]
    if unknown:
        sys.exit(f"--traces: unknown capture(s) {unknown}; the shipped ones are {names}")
    shares = []
    for given in args.shares.split(","):
        share, _, use = given.partition(":")
        shares.append((float(share), use or "promote"))
    print("| trace | configuration | share | hits (ready + late) | collision misses | "
          "prefetches | used / wasted | decode tok/s | stall s | flags |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for trace in args.traces.split(","):
        for label, overrides in CONFIGS:
            prefetching = overrides["policies.prefetch"] != "none"
            for share, use in shares if prefetching else [(0.0, "promote")]:
                o = {**overrides, **({"cache.prefetch_share": share} if share else {}),
                     **({"cache.prefetch_share_use": use} if use != "promote" else {})}
                with contextlib.redirect_stdout(io.StringIO()):  # each job's own table
                    c = run(paths[trace], o)["cache"]
                t, s = c["total"], c.get("staging")
                staged = f"{s['used']:,} / {s['wasted']:,}" if s else "-"
                decode = c["timing"]["decode_tok_per_s"]
                shown = f"{share:g}" + (f" ({use})" if use != "promote" else "")
                print(f"| {trace} | {label} | {shown} | {t['hits'] + t['late_hits']:,} | "
                      f"{t['collision_misses']:,} | {t['prefetch_issued']:,} | {staged} | "
                      f"{decode:.1f} | {t['stall_s']:.2f} | `{flags(o)}` |", flush=True)


if __name__ == "__main__":
    main()
