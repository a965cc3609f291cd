"""A sweep as a Slurm job array: `cells.txt` holds one command line per cell, `slurm.sbatch`
runs line `$SLURM_ARRAY_TASK_ID + 1` of it unless that cell already has a results.json, and
then records the cell's wall time (`launch.worker.WALL_TIME`) for the launcher's estimate."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import sys

from launch import cells as cells_lib
from moejax.results import write_text_atomic

# Slurm's default MaxArraySize is 1001 (indices 0-1000); larger arrays need splitting.
MAX_ARRAY = 1001


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    time: str = "04:00:00"
    partition: str = ""  # empty: the cluster's default partition
    gres: str = "gpu:1"  # one run is one device (DESIGN.md, Distribution)
    cpus_per_task: int = 8
    mem: str = "64G"
    max_parallel: int = 0  # `--array=0-N%K`: at most K cells at once (0: no limit)
    job_name: str = ""  # empty: moejax-<sweep dir name>


def _environment_lines(repo: str) -> list[str]:
    lines = [f"cd {shlex.quote(repo)}"]
    venv = os.environ.get("VIRTUAL_ENV") or (sys.prefix if sys.prefix != sys.base_prefix else "")
    if venv and os.path.isfile(os.path.join(venv, "bin", "activate")):
        lines.append(f"source {shlex.quote(os.path.join(venv, 'bin', 'activate'))}")
    return lines


def sbatch_script(sweep_dir: str, n: int, options: SlurmOptions, repo: str,
                  cells_sha256: str) -> str:
    name = options.job_name or f"moejax-{os.path.basename(os.path.normpath(sweep_dir))}"
    array = f"0-{n - 1}" + (f"%{options.max_parallel}" if options.max_parallel > 0 else "")
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --array={array}",
        f"#SBATCH --output={os.path.join(sweep_dir, 'logs', '%A_%a.out')}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={options.cpus_per_task}",
        f"#SBATCH --mem={options.mem}",
        f"#SBATCH --time={options.time}",
    ]
    if options.gres:
        header.append(f"#SBATCH --gres={options.gres}")
    if options.partition:
        header.append(f"#SBATCH --partition={options.partition}")
    cells_txt = shlex.quote(os.path.join(sweep_dir, "cells.txt"))
    body = [
        "# One cell of the sweep: line SLURM_ARRAY_TASK_ID+1 of cells.txt (written by",
        "# `python -m launch.sweep --slurm`). A cell whose results.json exists and parses is",
        "# skipped, so resubmitting the array after an interruption runs only what is left.",
        "set -euo pipefail",
        *_environment_lines(repo),
        f"CELLS={cells_txt}",
        "# Tasks still pending read cells.txt when they start: one rewritten since (another",
        "# --slurm run) would give them other cells, so they stop instead.",
        f'if [ "$(sha256sum < "$CELLS" | cut -d" " -f1)" != {cells_sha256} ]; then',
        '  echo "$CELLS changed since this script was written: rerun launch.sweep --slurm and'
        ' resubmit" >&2',
        "  exit 1",
        "fi",
        'LINE=$((SLURM_ARRAY_TASK_ID + 1))',
        'CMD=$(sed -n "${LINE}p" "$CELLS")',
        'if [ -z "$CMD" ]; then echo "no line $LINE in $CELLS" >&2; exit 1; fi',
        'eval "set -- $CMD"  # the line is shell-quoted: this splits it as bash would',
        'WORKDIR=""',
        'for a in "$@"; do case "$a" in --workdir=*) WORKDIR="${a#--workdir=}";; esac; done',
        'if [ -n "$WORKDIR" ] && [ -f "$WORKDIR/results.json" ] && python -c '
        '"import json, sys; json.load(open(sys.argv[1]))" "$WORKDIR/results.json" 2>/dev/null;'
        ' then',
        '  echo "finished already: $WORKDIR"',
        "  exit 0",
        "fi",
        'echo "cell $LINE: $CMD"',
        "START=$(date +%s.%N)",
        '"$@"',
        "# The cell's wall time, for the launcher's run-time estimate (launch/worker.py).",
        'if [ -n "$WORKDIR" ]; then',
        '  python -c "import sys, time; from launch.worker import record_wall_time; '
        'record_wall_time(sys.argv[1], time.time() - float(sys.argv[2]))" "$WORKDIR" "$START"'
        ' || true',
        "fi",
    ]
    return "\n".join(header + [""] + body) + "\n"


def write(sweep_dir: str, config: str, arg: str | None, cells: list[cells_lib.Cell],
          options: SlurmOptions, repo: str) -> tuple[str, str]:
    """Writes DIR/cells.txt (one command per cell, in sweep order) and DIR/slurm.sbatch, and
    creates DIR/logs/ (Slurm does not); returns the two paths."""
    if not cells:
        raise ValueError("no cells to write")
    lines = [cells_lib.command(config, arg, cells_lib.cell_dir(sweep_dir, c.name), c.overrides)
             for c in cells]
    assert all("\n" not in line for line in lines)
    cells_txt = os.path.join(sweep_dir, "cells.txt")
    sbatch = os.path.join(sweep_dir, "slurm.sbatch")
    os.makedirs(os.path.join(sweep_dir, "logs"), exist_ok=True)
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()
    write_text_atomic(cells_txt, text)
    write_text_atomic(sbatch, sbatch_script(sweep_dir, len(cells), options, repo, digest))
    os.chmod(sbatch, 0o755)
    return cells_txt, sbatch
