"""The planner against exhaustive search: its pick beside the best of the whole grid it walks
in stages, and (with `--verify`) how often its band holds the live decode.

    python benchmarks/plan_vs_grid.py [--trace=qwen_code] [--passes=128] \
        [--budgets=0.0005,0.002] [--workers=2] [--hardware_file=W/hardware.json] \
        [--verify=0] [--verify_traces=olmoe_code,olmoe_prose,qwen_code,qwen_prose]

Part 1, for each budget (`plan.device_gb`, the expert slots' budget, decimal GB): the plan job
(in process) on the capture's first `--passes` passes, its model at width 32 (the capture's
model: OLMoE-1B-7B or Qwen1.5-MoE-A2.7B); then every candidate of the space its stages walk
(`moejax.plan.search.every_candidate`: sizes x evictions x prefetch x queue x miss handling),
each forecast the same way (`moejax.plan.forecast`), over `--workers` processes. It prints
the plan's pick, the grid's best (over all, and over the candidates the plan may recommend:
with a validated profile, those with a band), their ratio (the goal: >= 0.95), how many
replays each took and their wall times. Default `qwen_code`: the search's stages were
written against `olmoe_code`, not this capture.

Part 2 (`--verify N`): N plans with `plan.verify=True` (3 live runs of 48 tokens each), over
the captures and budgets in turn, with a validated `--hardware_file`; it prints each
recommendation's forecast of the live run, its band, the measured decode, and how many landed
inside their band (the goal: >= 90%).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import multiprocessing
import os
import tempfile
import time

from moejax import bundled
from moejax.jobs import plan as plan_job
from moejax.jobs import run as run_job
from moejax.plan import search
from moejax.testing import config_from_flags
from moejax.traces import load_traces

WIDTH = 32


def capture_cut(name: str, passes: int, where: str) -> str:
    """The capture's first `passes` passes as a trace file (the whole capture with 0)."""
    (trace,) = load_traces(bundled.capture_path(name))
    if not passes or passes >= trace.num_passes:
        return bundled.capture_path(name)
    path = os.path.join(where, f"{name}_{passes}.npz")
    trace.first_passes(passes).save(path)
    return path


def plan_flags(name: str, trace: str, budget: float, hardware_file: str) -> list[str]:
    family, preset = bundled.CAPTURE_MODELS[name.split("_")[0]]
    return ["--config.log.progress=False", f"--config.model.family={family}",
            f"--config.model.preset={preset}", f"--config.model.width={WIDTH}",
            f"--config.replay.trace={trace}", f"--config.plan.device_gb={budget}",
            *([f"--config.hardware.file={hardware_file}"] if hardware_file else [])]


def quiet_plan(flags: list[str], workdir: str) -> dict:
    """The plan job in process, its printout kept out of the benchmark's tables."""
    with contextlib.redirect_stdout(io.StringIO()):
        return run_job(config_from_flags("configs/plan.py", *flags), workdir)


def _forecast_chunk(flags: list[str], workdir: str, chunk: list[dict]) -> list[dict]:
    """A worker's share of the grid: its own planning (the same base config and space), each
    candidate forecast."""
    config = config_from_flags("configs/plan.py", *flags)
    planning = plan_job.prepare(config, workdir)
    return [planning.forecaster.forecast(c) for c in chunk]


def grid(flags: list[str], workdir: str, workers: int) -> tuple[list[dict], list[dict], float]:
    config = config_from_flags("configs/plan.py", *flags)
    planning = plan_job.prepare(config, workdir)
    every = search.every_candidate(planning.space)
    t0 = time.perf_counter()
    chunks = [every[i::workers] for i in range(workers)]
    with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_forecast_chunk, [flags] * workers, [workdir] * workers, chunks))
    predicted = [None] * len(every)
    for i, part in enumerate(done):
        predicted[i::workers] = part
    return every, predicted, time.perf_counter() - t0


def part_one(args, where: str) -> None:
    trace = capture_cut(args.trace, args.passes, where)
    print(f"## Part 1: the plan's pick against the whole grid ({args.trace}, first "
          f"{args.passes or 'all'} passes, width {WIDTH}; "
          f"{args.hardware_file or 'the preset a100_specmd'})")
    print("| budget | plan: decode tok/s (its pick) | plan replays, s | grid best tok/s "
          "(its configuration) | best the plan may pick | grid replays, s | pick / best | "
          "pick / best it may pick |")
    print("| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for budget in args.budgets:
        flags = plan_flags(args.trace, trace, budget, args.hardware_file)
        t0 = time.perf_counter()
        doc = quiet_plan(flags, os.path.join(where, f"plan_{budget}"))
        plan_s = time.perf_counter() - t0
        rec = doc["plan"]["recommended"]
        every, predicted, grid_s = grid(flags, os.path.join(where, f"grid_{budget}"),
                                        args.workers)
        rows = [(c, p) for c, p in zip(every, predicted) if p.get("decode_tok_per_s")]
        best = max(rows, key=lambda r: r[1]["decode_tok_per_s"])
        validated = bool(doc["plan"]["band_basis"]) and not doc["plan"]["band_basis"].startswith(
            "none")
        eligible = [r for r in rows if r[1].get("band")] if validated else rows
        best_ok = max(eligible or rows, key=lambda r: r[1]["decode_tok_per_s"])
        pick = rec["predicted"]["decode_tok_per_s"]
        print(f"| {budget:g} GB | {pick:,.1f} ({plan_job.describe(rec['overrides'])}) | "
              f"{doc['timings']['replays']}, {plan_s:.1f} | "
              f"{best[1]['decode_tok_per_s']:,.1f} ({plan_job.describe(best[0])}) | "
              f"{best_ok[1]['decode_tok_per_s']:,.1f} | {len(every)}, {grid_s:.1f} | "
              f"{pick / best[1]['decode_tok_per_s']:.3f} | "
              f"{pick / best_ok[1]['decode_tok_per_s']:.3f} |", flush=True)


def part_two(args, where: str) -> None:
    if not args.hardware_file:
        raise SystemExit("--verify needs --hardware_file (a calibrated and validated "
                         "hardware.json: python -m moejax.calibration, then .validate)")
    print(f"\n## Part 2: {args.verify} plans verified live ({args.hardware_file})")
    print("| capture | budget | recommended | forecast of the run tok/s | band | measured "
          "tok/s | within |")
    print("| --- | ---: | --- | ---: | --- | ---: | --- |")
    settings = [(t, b) for b in args.budgets for t in args.verify_traces]
    hits = total = 0
    for i in range(args.verify):
        name, budget = settings[i % len(settings)]
        trace = capture_cut(name, 0, where)
        flags = plan_flags(name, trace, budget, args.hardware_file) + [
            "--config.plan.verify=True"]
        doc = quiet_plan(flags, os.path.join(where, f"verify_{i}"))
        v = doc["plan"]["verified"]
        band = v["band"]
        total += v["within_band"] is not None
        hits += bool(v["within_band"])
        print(f"| {name} | {budget:g} GB | {plan_job.describe(doc['plan']['recommended']['overrides'])}"
              f" | {v['predicted_decode_tok_per_s']:,.1f} | "
              + ("-" if band is None else f"{band[0]:,.1f}-{band[1]:,.1f}")
              + f" | {v['decode_tok_per_s']:,.1f} | {v['within_band']} |", flush=True)
    if total:
        print(f"\n{hits} of {total} verified runs inside their band ({hits / total:.0%}; the "
              "goal: >= 90%)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="qwen_code", choices=bundled.CAPTURE_NAMES)
    p.add_argument("--passes", type=int, default=128,
                   help="the capture's first passes the grid runs on (0: all)")
    p.add_argument("--budgets", default="0.0005,0.002",
                   help="plan.device_gb values, comma-separated")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--hardware_file", default="")
    p.add_argument("--verify", type=int, default=0, help="plans to verify live (part 2)")
    p.add_argument("--verify_traces", default=",".join(bundled.CAPTURE_NAMES))
    p.add_argument("--skip_grid", action="store_true", help="part 2 only")
    args = p.parse_args()
    try:
        args.budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        p.error(f"--budgets={args.budgets!r} takes numbers (GB), comma-separated")
    args.verify_traces = args.verify_traces.split(",")
    unknown = [t for t in args.verify_traces if t not in bundled.CAPTURE_NAMES]
    if unknown:
        p.error(f"--verify_traces: {unknown[0]!r} is not one of {bundled.CAPTURE_NAMES}")
    if args.workers < 1 or args.passes < 0 or args.verify < 0:
        p.error("--workers >= 1, --passes >= 0, --verify >= 0")
    with tempfile.TemporaryDirectory() as where:
        if not args.skip_grid:
            part_one(args, where)
        if args.verify:
            part_two(args, where)


if __name__ == "__main__":
    main()
