"""The virtual clock against the command itself: a trace-driven live run on the wall clock with a
calibrated profile, each its own `python -m moejax.main` process, at 5%, 25% and 100% capacity,
alternated over rounds.

    python -m moejax.calibration --workdir=W      # first
    python benchmarks/clock_check.py --hardware_file=W/hardware.json [--rounds 3] [--trace olmoe_code]

Each run is OLMoE-1B-7B at width 32 driven by a real capture the calibration did not use
(`olmoe_code`; the calibration fits `olmoe_prose`), a 16-token prefill and 47 decode steps,
no prefetch, `--config.clock.kind=wall`: results.json's `clocks.wall` (what the run took) and
`clocks.virtual` (the run's routing replayed on the profile with its host work). Printed: each
run's TTFT and decode time on both clocks and the signed error, then per capacity the median
error over the rounds and its range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPACITIES = (0.05, 0.25, 1.0)


def command(hardware_file: str, trace: str, capacity: float, workdir: str) -> list[str]:
    path = os.path.join(ROOT, "moejax", "assets", "captures", f"{trace}.jsonl")
    return [sys.executable, "-m", "moejax.main", "--config=configs/default.py",
            f"--config.policies.routing=trace(path={path!r})", "--config.model.family=olmoe",
            "--config.model.preset=olmoe-1b-7b", "--config.model.width=32",
            "--config.run.max_new_tokens=48", "--config.replay.prefill_tokens=16",
            "--config.policies.prefetch=none", "--config.clock.kind=wall",
            f"--config.hardware.file={hardware_file}",
            f"--config.cache.capacity_frac={capacity}", "--config.log.tensorboard=False",
            "--config.log.progress=False", f"--workdir={workdir}"]


def error(virtual: float, wall: float) -> float:
    return (virtual - wall) / wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hardware_file", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trace", default="olmoe_code")
    args = p.parse_args(argv)
    hardware_file = os.path.abspath(args.hardware_file)
    got: dict[float, list[dict]] = {c: [] for c in CAPACITIES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = CAPACITIES if r % 2 == 0 else CAPACITIES[::-1]
            for capacity in order:
                workdir = os.path.join(tmp, f"r{r}_{capacity}")
                run = subprocess.run(command(hardware_file, args.trace, capacity, workdir),
                                     cwd=ROOT, capture_output=True, text=True)
                if run.returncode != 0:
                    print(run.stderr, file=sys.stderr)
                    return 1
                with open(os.path.join(workdir, "results.json")) as f:
                    c = json.load(f)["clocks"]
                w, v = c["wall"], c["virtual"]
                row = {"ttft": error(v["ttft_s"], w["ttft_s"]),
                       "decode": error(v["decode_s"], w["decode_s"]), "wall": w, "virtual": v}
                got[capacity].append(row)
                print(f"round {r} {100 * capacity:>3g}%: TTFT wall {1e3 * w['ttft_s']:7.2f} ms "
                      f"virtual {1e3 * v['ttft_s']:7.2f} ({100 * row['ttft']:+5.1f}%); decode "
                      f"wall {w['decode_tok_per_s']:6.1f} tok/s virtual "
                      f"{v['decode_tok_per_s']:6.1f} (time {100 * row['decode']:+5.1f}%)")
    print(f"{args.trace}, {args.rounds} rounds, each run its own process (median [min, max] of "
          "the signed error of virtual against wall):")
    for capacity, rows in got.items():
        parts = []
        for m in ("ttft", "decode"):
            e = [x[m] for x in rows]
            parts.append(f"{m} {100 * statistics.median(e):+.1f}% [{100 * min(e):+.1f}, "
                         f"{100 * max(e):+.1f}]")
        print(f"  {100 * capacity:>3g}%: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
