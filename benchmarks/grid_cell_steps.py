"""Where a sweep cell's time goes: one worker's share of a grid run in this process, cell by
cell as a sweep's worker runs them (`launch.worker.run_cell`), with a wall-clock timer around
each step of the replay job.

    python benchmarks/grid_cell_steps.py [--config=studies/specmd/grid_specmd.py:traces=captures]
        [--part=0] [--parts=2] [--warm=16] [--out=/tmp/grid_cell_steps]

`--parts` cuts the grid's cells as a sweep's workers share them (every `parts`-th cell from
`part`); the first `--warm` of them run untimed (the kernels' load, each trace's first parse
and predictions, which a worker pays once). Then a table: each step's milliseconds per cell
(summed over the timed cells, over their count), how many calls, and the cell's whole time. A
step inside another is counted in both (the replay engine holds the kernels). The timers are
`time.perf_counter` around the functions, which cost well under a microsecond each.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import time

from launch import cells as cells_lib
from launch import sweep, worker
from moejax import jobs
from moejax.jobs import replay as replay_job
from moejax.replay import compiled, lean_kernel
from moejax.replay import kernel as general_kernel

SECONDS: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    """`owner.name` replaced by itself under a timer that adds to `label`."""
    inner = getattr(owner, name)

    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - start
            CALLS[label] += 1
    setattr(owner, name, call)


class TimedKernel:
    """A numba dispatcher under a timer (its attributes, which the load reads, passed
    through)."""

    def __init__(self, dispatcher, label: str):
        self.dispatcher, self.label = dispatcher, label

    def __getattr__(self, name):
        return getattr(self.dispatcher, name)

    def __call__(self, *args):
        start = time.perf_counter()
        out = self.dispatcher(*args)
        SECONDS[self.label] += time.perf_counter() - start
        CALLS[self.label] += 1
        return out


STEPS = ((worker, "build_config", "the config (get_config and the cell's overrides)"),
         (jobs, "check", "its check"),
         (replay_job, "load", "the trace read and cut into requests"),
         (replay_job, "build", "the cache built"),
         (replay_job, "replay", "the replay engine"),
         (compiled, "requests", "  the request arrays"),
         (replay_job, "report_cache", "the report (results.json's cache section)"),
         (replay_job, "write_json_atomic", "results.json written"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="studies/specmd/grid_specmd.py:traces=captures")
    parser.add_argument("--part", type=int, default=0)
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--warm", type=int, default=16)
    parser.add_argument("--out", default="/tmp/grid_cell_steps")
    args = parser.parse_args()
    if not 0 <= args.part < args.parts or args.warm < 0:
        parser.error("--part takes 0..parts-1, --warm a count >= 0")
    path, _, arg = args.config.partition(":")
    path = os.path.abspath(path)
    try:
        cells = cells_lib.cells_from_config(path, arg or None)[args.part::args.parts]
    except sweep.CONFIG_FILE_ERRORS as e:  # the config file's own mistakes
        parser.error(f"--config={args.config}: {e}")
    if len(cells) <= args.warm:
        parser.error(f"{len(cells)} cells in this part: fewer than --warm={args.warm} + 1")
    for owner, name, label in STEPS:
        timed(owner, name, label)
    for key, kernel in lean_kernel.KERNELS.items():  # (each a specialisation: `kernel_for`)
        lean_kernel.KERNELS[key] = TimedKernel(kernel, "  the lean kernel")
    general_kernel.run = TimedKernel(general_kernel.run, "  the general kernel")
    shutil.rmtree(args.out, ignore_errors=True)

    def run(chosen) -> float:
        start = time.perf_counter()
        for cell in chosen:
            where = os.path.join(args.out, cell.name)
            os.makedirs(where, exist_ok=True)
            done = worker.run_cell(path, arg or None, cell.name, cell.overrides, where)
            if not done["ok"]:
                raise SystemExit(f"{cell.name}: {done['error']}")
        return time.perf_counter() - start
    run(cells[:args.warm])
    SECONDS.clear()
    CALLS.clear()
    timed_cells = cells[args.warm:]
    total = run(timed_cells)
    n = len(timed_cells)
    print(f"{args.config}: part {args.part} of {args.parts}, {n} cells timed after "
          f"{args.warm} untimed; {1e3 * total / n:.1f} ms a cell")
    print("| step | ms per cell | calls |")
    print("| --- | ---: | ---: |")
    labels = [label for _, _, label in STEPS]
    labels[5:5] = ["  the lean kernel", "  the general kernel"]
    for label in labels:
        print(f"| {label} | {1e3 * SECONDS[label] / n:.2f} | {CALLS[label]} |")
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
