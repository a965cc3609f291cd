"""Validation: the virtual clock, with the host's work calibrated on this machine, against live
runs it was not fitted to.

    python -m moejax.calibration --workdir=W       # first: W/hardware.json
    python -m moejax.calibration.validate --workdir=W [--quick] [--reps=3] [--groups=olmoe_code,...]

Each cell of the matrix (`moejax.calibration.matrix.validation_matrix`: other captures than the
calibration's, the embedded model after another prompt, capacity x eviction x prefetch x
precision, the disk tier, host compute) runs live on the wall clock with W/hardware.json's
profile (transfers held to its bandwidth) `--reps` times, the cells alternated run by run;
beside each, the virtual clock's prediction of the same run (its routing replayed with the
profile and its host work, `clocks.virtual`). It prints the cells, the summary (median, 90th
percentile, largest |error| of TTFT and decode), Kendall's tau per condition and whether each
predicted winner holds (`moejax.calibration.agreement`), and writes W/validation.json, the plot
W/validation.png, and the summary into W/hardware.json (`validation`), which every virtual
time a run with `--config.hardware.file` prints then quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from moejax import cli
from moejax import workdir as workdir_lib
from moejax.cli import UsageError, guarded
from moejax.results import write_json_atomic

PROG = "python -m moejax.calibration.validate"


def run_validation(workdir: str, hardware_file: str, *, quick: bool, reps: int, tokens: int,
                   prefill_tokens: int, width: int, groups: tuple[str, ...], command: str,
                   out=print, matrix_cells: list | None = None) -> dict:
    """The validation into `workdir` (module docstring); returns validation.json's content.
    `matrix_cells`: [(group, cells)] instead of the matrix (`benchmarks/gpu_check.py`'s part
    of it at the real size)."""
    from moejax.calibration import agreement, host_fit, matrix, profile
    from moejax.calibration import cells as cells_lib
    from moejax.calibration import fit as fit_lib
    from moejax.jobs.cache_report import progress
    from moejax.timing import host_work as host_work_lib

    work = host_work_lib.from_file(hardware_file)
    if work is None:
        raise UsageError(f"--hardware_file={hardware_file}: it has no host_work section "
                         f"(python -m moejax.calibration --workdir=W writes one)")
    cells = matrix_cells or matrix.validation_matrix(quick)
    if groups:
        known = [g.name for g, _ in cells]
        unknown = sorted(set(groups) - set(known))
        if unknown:
            raise UsageError(f"--groups: {unknown[0]!r} is not one of {known}")
        cells = [(g, c) for g, c in cells if g.name in groups]
    entries = matrix.entries(cells, hardware_file, tokens, prefill_tokens, width,
                             workdir=workdir)
    load = os.getloadavg()
    out(f"validating {work.name} ({hardware_file}) on {len(entries)} live cells x {reps} runs "
        f"(the wall clock of this machine, load average {load[0]:.1f}), each against the "
        "virtual clock's prediction of its run:")
    samples: list = []
    with progress(True, len(entries) * reps, "cells", unit="run") as bar:
        rows = cells_lib.run_entries(entries, reps, bar.update if bar is not None else None,
                                     samples)
    after = os.getloadavg()
    for row, sample in zip(rows, samples):  # the device-only clock's prediction of each run
        got = host_fit.figures(sample, host_fit.predict(sample, hardware_file, False)[0])
        row["device_only"] = {**got, "ttft_error": fit_lib.relative_error(
            got["ttft_s"], row["wall"]["ttft_s"]), "decode_error": fit_lib.relative_error(
            got["decode_s"], row["wall"]["decode_s"])}
    summ = agreement.summary(rows)
    device_only = agreement.summary([{**r, **{f"{m}_error": r["device_only"][f"{m}_error"]
                                              for m in agreement.METRICS}} for r in rows])
    ranks = agreement.rankings(rows, matrix.condition, matrix.policy)
    met = agreement.goals(summ, ranks)
    out(agreement.cell_table(rows))
    out(agreement.summary_text(summ, ranks, met))
    out("the device-only clock (clock.host_work=False) on the same runs: " + "; ".join(
        f"{m} median |error| {100 * device_only[m]['median']:.1f}%, 90th percentile "
        f"{100 * device_only[m]['p90']:.1f}%" for m in agreement.METRICS
        if device_only[m]["cells"]))
    date = profile.now()
    png = agreement.plot(rows, os.path.join(workdir, "validation.png"),
                         f"{work.name}: virtual clock against {len(rows)} live cells "
                         f"({reps} runs each), {date}")
    steps = {k: sum((r["virtual"].get("host_work") or {}).get(k, 0) for r in rows)
             for k in ("steps_measured", "steps_roofline", "steps_extrapolated")}
    result = {"command": command, "date": date, "hardware_file": hardware_file,
              "profile": work.name, "reps": reps, "tokens": tokens, "width": width,
              "load_average": {"before": list(load), "after": list(after)},
              "groups": [g.name for g, _ in cells], "summary": summ,
              "summary_by_group": {g: agreement.summary([r for r in rows if r["group"] == g])
                                   for g in dict.fromkeys(r["group"] for r in rows)},
              "device_only_summary": device_only, "rankings": ranks,
              "goals": met, "steps": steps, "cells": rows, "plot": png,
              "what": ("wall: the median of the live runs on the wall clock (transfers held to "
                       "the profile's bandwidth); virtual: the run's routing replayed on the "
                       "virtual clock with the profile and its host work; error = (virtual - "
                       "wall) / wall")}
    path = os.path.join(workdir, "validation.json")
    write_json_atomic(path, result)
    with open(os.path.join(workdir, "validation.md"), "w") as f:
        f.write(agreement.markdown(result))
    _remember(hardware_file, {"date": date, "command": command, "cells": len(rows),
                              "reps": reps, "load_average": result["load_average"],
                              "ttft": summ["ttft"], "decode": summ["decode"],
                              "goals_met": all(g["met"] for g in met.values()),
                              "covers": covers([e.config for e in entries]), "file": path})
    out(f"results -> {path}, {png}, {os.path.join(workdir, 'validation.md')}; the summary -> "
        f"{hardware_file} (validation)")
    return result


# The settings a validation's cells ran, per field: the conditions its errors describe (the
# planner bands a forecast only inside them, `moejax/plan/forecast.py`).
COVERED_FIELDS = ("policies.eviction", "policies.prefetch", "cache.prefetch_queue",
                  "cache.precision", "policies.miss")


def covers(configs) -> dict[str, list[str]]:
    """Each of `COVERED_FIELDS` -> the values the cells ran (the specs as resolved: a field
    left to its preset or default is the spec that ran; precision "" is native)."""
    from moejax.jobs.specs import resolve
    from moejax.policies import presets

    out: dict[str, set] = {f: set() for f in COVERED_FIELDS}
    for config in configs:
        spec = resolve(config)
        policies = presets.resolve(spec.policies)
        out["policies.eviction"].add(policies["eviction"])
        out["policies.prefetch"].add(policies["prefetch"])
        out["policies.miss"].add(policies["miss"])
        out["cache.prefetch_queue"].add(spec.cache.prefetch_queue)
        out["cache.precision"].add(spec.cache.precision or "native")
    return {f: sorted(v) for f, v in out.items()}


def _remember(hardware_file: str, summary: dict) -> None:
    """The validation's summary into the hardware.json it validated (`validation`): what a run
    with that file prints beside every virtual time."""
    with open(hardware_file) as f:
        doc = json.load(f)
    doc["validation"] = summary
    write_json_atomic(hardware_file, doc)


def main(argv=None) -> int:
    p = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True,
                   help="where validation.json and validation.png go (and, by default, the "
                        "calibration's hardware.json is read from)")
    p.add_argument("--hardware_file", default=None,
                   help="the calibrated profile to validate (default: WORKDIR/hardware.json)")
    p.add_argument("--quick", action="store_true", help="two cells, one run (a smoke test)")
    p.add_argument("--reps", type=int, default=None, help="live runs per cell (default 3)")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens each cell generates (default 48; not 32, which a trace-driven "
                        "run reads as every pass of its trace)")
    p.add_argument("--width", type=int, default=None,
                   help="the trace-driven models' width (default 32 on a CPU, 0 = the real size "
                        "on a GPU)")
    p.add_argument("--groups", default="",
                   help="only these groups of the matrix, by name, separated by commas")
    args = p.parse_args(argv)
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    return guarded(PROG, lambda: run(args, command))


def run(args: argparse.Namespace, command: str) -> int:
    for flag in ("reps", "tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag}={value} must be >= 1")
    if args.tokens is not None and args.tokens < 2:
        raise UsageError(f"--tokens={args.tokens}: a cell decodes after its prefill (at least 2)")
    if args.width is not None and args.width < 0:
        raise UsageError(f"--width={args.width} must be >= 0 (0: the preset's own)")
    workdir_lib.check(args.workdir)
    hardware_file = os.path.abspath(args.hardware_file or os.path.join(args.workdir,
                                                                         "hardware.json"))
    if not os.path.isfile(hardware_file):
        raise UsageError(f"{hardware_file}: no such file (python -m moejax.calibration "
                         f"--workdir={args.workdir} writes it)")
    import jax

    gpu = jax.default_backend() == "gpu"
    width = args.width if args.width is not None else (0 if gpu else 32)
    tokens = args.tokens or (12 if args.quick else 48)
    groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    with workdir_lib.claimed(args.workdir):
        run_validation(args.workdir, hardware_file, quick=args.quick,
                       reps=args.reps or (1 if args.quick else 3), tokens=tokens,
                       prefill_tokens=16, width=width, groups=groups, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
