"""The capture grid (`studies/specmd/grid_specmd.py:traces=captures`, 768 cells) on both replay
engines: wall time of each sweep, and whether every cell's cache results are the same.

    python benchmarks/replay_grid_engines.py [--workers=2] [--out=/tmp/grid_engines]

Each engine's sweep runs in a fresh directory under `--out` (`auto`: the compiled engine
where it applies, which is every cell of this grid; `reference`: the policy objects), through
`python -m launch.sweep` as a user runs it. Exits non-zero if any cell differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ENGINES = ("auto", "reference")


def sweep(out: str, engine: str, workers: int) -> float:
    """Wall seconds of the grid on `engine`, its cells under `out/engine`."""
    where = os.path.join(out, engine)
    shutil.rmtree(where, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "launch.sweep",
                    f"--config=studies/specmd/grid_specmd.py:traces=captures,engine={engine}",
                    f"--sweep_dir={where}", f"--workers={workers}"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def cells(out: str, engine: str) -> dict[str, dict]:
    root = os.path.join(out, engine, "cells")
    return {d: json.load(open(os.path.join(root, d, "results.json"))) for d in os.listdir(root)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="/tmp/grid_engines")
    args = p.parse_args(argv)
    seconds = {e: sweep(args.out, e, args.workers) for e in ENGINES}
    ran = {e: cells(args.out, e) for e in ENGINES}
    names = sorted(ran["auto"])
    if names != sorted(ran["reference"]):
        print("the two sweeps hold different cells")
        return 1
    differ = [n for n in names if ran["auto"][n]["cache"] != ran["reference"][n]["cache"]]
    used = sorted({ran["auto"][n]["replay"]["engine"] for n in names})
    for e in ENGINES:
        print(f"{e:9s}: {len(names)} cells in {seconds[e]:.1f} s ({args.workers} workers)")
    print(f"speed-up {seconds['reference'] / seconds['auto']:.2f}x; engines that ran under auto:"
          f" {used}; cells with different cache results: {len(differ)}")
    for n in differ[:5]:
        print("  differs:", n)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
