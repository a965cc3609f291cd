"""The sweep launcher: many independent moejax jobs, locally in a process pool or as a Slurm job
array, one atomically written `results.json` per cell (launch/README.md).

    python -m launch.sweep --config=configs/NAME.py --sweep_dir=DIR [--workers=2] [--slurm]

`launch.cells` expands a config file's `sweep(add)` into named cells and their command lines;
`launch.preflight` builds and checks every cell's config before any runs; `launch.worker` runs
one cell in a pool process; `launch.slurm` writes the job array. Only the worker and the
checking process import JAX (through `moejax.jobs`), so the launching process stays free of it.
"""
