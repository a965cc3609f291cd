"""The capture grid (`studies/specmd/grid_specmd.py:traces=captures`, 768 cells) of two checkouts
of moejax, alternated: what the whole sweep costs, where its time goes, and whether every cell
is the same.

    python benchmarks/replay_grid_checkouts.py --a=/path/to/other/checkout [--b=.] [--reps=3]
        [--workers=2] [--warmup=1] [--out=/tmp/grid_checkouts]

Each run is `python -m launch.sweep --config=studies/specmd/grid_specmd.py:traces=captures
--workers=N` as a user types it, in a fresh sweep directory, from the checkout's root (so that
checkout's moejax is the one imported), A and B alternated `--reps` times after `--warmup`
untimed runs of each (numba compiles a checkout's kernel once, into its own disk cache), each
round in the other order than the one before (the second sweep of a round runs slower). Per
checkout: the sweep's wall time and the CPU seconds of the launcher and its workers (median
and range); from the cells' files, the cell time (`wall_time.json`) and the part of it the
replay engine took (`replay.seconds` + `replay.setup_s`), and both by prefetcher in the last
sweep of each.
Then `python -m launch.diff` of the last two sweeps; exits non-zero if any cell differs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

CONFIG = "studies/specmd/grid_specmd.py:traces=captures"


def sweep(checkout: str, where: str, workers: int) -> dict:
    """One sweep of the grid from `checkout` into the fresh directory `where`."""
    shutil.rmtree(where, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={CONFIG}",
                    f"--sweep_dir={where}", f"--workers={workers}"], cwd=checkout, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cell_s = replay_s = 0.0
    cells = os.path.join(where, "cells")
    for name in os.listdir(cells):
        with open(os.path.join(cells, name, "wall_time.json")) as f:
            cell_s += json.load(f)["seconds"]
        with open(os.path.join(cells, name, "results.json")) as f:
            r = json.load(f)["replay"]
        replay_s += r["seconds"] + r["setup_s"]
    return {"wall": wall, "cpu": cpu, "cells": len(os.listdir(cells)), "cell_s": cell_s,
            "replay_s": replay_s}


def by_prefetch(where: str) -> dict[str, tuple[int, float, float]]:
    """policies.prefetch -> (cells, their cell time, their replay engine's time) of a sweep."""
    out: dict[str, list] = {}
    cells = os.path.join(where, "cells")
    for name in os.listdir(cells):
        with open(os.path.join(cells, name, "results.json")) as f:
            r = json.load(f)
        with open(os.path.join(cells, name, "wall_time.json")) as f:
            seconds = json.load(f)["seconds"]
        row = out.setdefault(r["config"]["policies"]["prefetch"], [0, 0.0, 0.0])
        row[0] += 1
        row[1] += seconds
        row[2] += r["replay"]["seconds"] + r["replay"]["setup_s"]
    return {k: tuple(v) for k, v in sorted(out.items())}


def _spread(values: list[float], unit: str = "s") -> str:
    return (f"{statistics.median(values):.1f} {unit} ({min(values):.1f}–{max(values):.1f})"
            if len(values) > 1 else f"{values[0]:.1f} {unit}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="the checkout to compare against")
    p.add_argument("--b", default=".", help="this checkout (default)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each checkout first")
    p.add_argument("--out", default="/tmp/grid_checkouts")
    args = p.parse_args(argv)
    if args.reps < 1 or args.workers < 1 or args.warmup < 0:
        p.error("--reps and --workers must be >= 1, --warmup >= 0")
    checkouts = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    for flag, path in (("--a", checkouts["A"]), ("--b", checkouts["B"])):
        if not os.path.isfile(os.path.join(path, "launch", "sweep.py")):
            p.error(f"{flag}={path}: not a checkout of moejax (no launch/sweep.py in it)")
    print(f"A = {checkouts['A']}\nB = {checkouts['B']}\n{CONFIG}, {args.workers} workers, "
          f"{args.reps} alternated runs each after {args.warmup} untimed\n", flush=True)
    where = {s: os.path.join(args.out, s) for s in checkouts}
    for _ in range(args.warmup):  # numba's compile, once per checkout
        for side, checkout in checkouts.items():
            sweep(checkout, where[side], args.workers)
    runs = {"A": [], "B": []}
    for rep in range(args.reps):
        # Each round in the other order (A B, B A, ...): the second sweep of a round runs
        # while the first one's files are still being written out, about a tenth slower
        # whichever checkout it is (2026-12-07: 0.91 with either checkout as A).
        for side in ("A", "B") if rep % 2 == 0 else ("B", "A"):
            checkout = checkouts[side]
            r = sweep(checkout, where[side], args.workers)
            runs[side].append(r)
            print(f"  run {rep + 1} {side}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU",
                  flush=True)
    print("\n| checkout | cells | sweep wall (median, range) | CPU, launcher + workers | "
          "cell time (sum) | of it the replay engine |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for side in checkouts:
        rs = runs[side]
        cell, replay = (statistics.median(r["cell_s"] for r in rs),
                        statistics.median(r["replay_s"] for r in rs))
        print(f"| {side} | {rs[0]['cells']} | {_spread([r['wall'] for r in rs])} | "
              f"{_spread([r['cpu'] for r in rs])} | {cell:.1f} s | {replay:.1f} s "
              f"({replay / cell:.0%}) |")
    print("\nBy prefetcher, the last sweep of each:\n\n| prefetch | cells | A cell time | "
          "A replay engine | B cell time | B replay engine |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    split = {side: by_prefetch(where[side]) for side in checkouts}
    for prefetch, (n, cell_a, replay_a) in split["A"].items():
        _, cell_b, replay_b = split["B"].get(prefetch, (0, 0.0, 0.0))
        print(f"| {prefetch} | {n} | {cell_a:.1f} s | {replay_a:.1f} s | {cell_b:.1f} s | "
              f"{replay_b:.1f} s |")
    ratios = [a["wall"] / b["wall"] for a, b in zip(runs["A"], runs["B"])]
    print(f"\nA / B wall, median of the rounds' ratios: {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}–{max(ratios):.2f})\n", flush=True)
    diff = subprocess.run([sys.executable, "-m", "launch.diff", where["A"], where["B"],
                           f"--root_a={checkouts['A']}", f"--root_b={checkouts['B']}"],
                          capture_output=True, text=True)
    print("launch.diff A B:", diff.stdout.strip() or diff.stderr.strip())
    return diff.returncode


if __name__ == "__main__":
    raise SystemExit(main())
