"""The replay engines of two checkouts of moejax, alternated: did a change make replay slower?

    python benchmarks/replay_checkouts.py --a=/path/to/other/checkout [--b=.] [--reps=5]
        [--engine=reference]

Each case replays the OLMoE decode capture (65 536 requests) at 5% capacity under one policy
combination, in a fresh process whose working directory is the checkout (so that checkout's
moejax is the one imported), A and B alternated `--reps` times; the figure is the replay job's
own `requests_per_s` (the replay itself; import and results excluded). Prints the median and
the range (min–max) per checkout and case, and B's median over A's. Make a checkout of an older
commit with `git worktree add /tmp/old COMMIT`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = [("lru", "none", "fetch", "immediate"), ("random", "none", "fetch", "immediate"),
         ("least_stale", "temporal", "fetch", "watchdog"), ("lhu", "oracle", "fetch", "immediate"),
         ("lru", "temporal", "drop(keep=2)", "immediate")]

ONE_RUN = """
import json, sys, tempfile
from moejax import jobs, bundled
try:
    from moejax.jobs.schema import base_config
except ImportError:  # a checkout from before `moejax/jobs/` (the config module's old home)
    from moejax.job_config import base_config
eviction, prefetch, miss, queue, engine = sys.argv[1:6]
c = base_config()
c.job, c.clock.kind = "replay", "virtual"
if "replay" in c:  # the replay job's own section
    c.replay.trace, c.replay.engine = bundled.capture_path("olmoe_prose"), engine
else:  # a checkout from before its fields moved there
    c.trace, c.cache.replay_engine = bundled.capture_path("olmoe_prose"), engine
c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
c.cache.capacity_frac, c.cache.prefetch_queue = 0.05, queue
c.policies.eviction, c.policies.prefetch, c.policies.miss = eviction, prefetch, miss
c.log.progress = c.log.tensorboard = False
with tempfile.TemporaryDirectory() as work:
    r = jobs.run(c, work)
print(json.dumps({"rps": r["replay"]["requests_per_s"], "engine": r["replay"]["engine"],
                  "hits": r["cache"]["total"]["hits"]}))
"""


def run_once(checkout: str, case: tuple, engine: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE_RUN, *case, engine], cwd=checkout,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="the checkout to compare against")
    p.add_argument("--b", default=".", help="this checkout (default)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--engine", default="reference", choices=("reference", "auto"))
    args = p.parse_args(argv)
    checkouts = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    print(f"A = {checkouts['A']}\nB = {checkouts['B']}\nengine = {args.engine}, "
          f"{args.reps} alternated runs each\n")
    print("| eviction | prefetch | miss | queue | A req/s median (range) | "
          "B req/s median (range) | B / A |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for case in CASES:
        rps = {"A": [], "B": []}
        hits = set()
        for _ in range(args.reps):
            for side in ("A", "B"):
                r = run_once(checkouts[side], case, args.engine)
                rps[side].append(r["rps"])
                hits.add(r["hits"])
        if len(hits) != 1:
            raise SystemExit(f"{case}: the checkouts count different hits {sorted(hits)}")
        med = {s: statistics.median(v) for s, v in rps.items()}
        cells = [f"{med[s]:,.0f} ({min(v):,.0f}–{max(v):,.0f})".replace(",", " ")
                 for s, v in rps.items()]
        print(f"| {' | '.join(case)} | {cells[0]} | {cells[1]} | {med['B'] / med['A']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
