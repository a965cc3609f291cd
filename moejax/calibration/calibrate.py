"""Calibration: measures the machine it runs on, writes a hardware profile of it, and says how
far the virtual clock is from this machine's wall clock.

    python -m moejax.calibration --workdir=W [--quick] [--host-only]

1. host->device latency and bandwidth by transfer size (`jax.device_put` of `pinned_host` arrays
   to `device` memory, 4 KiB to 64 MiB), alternated repetitions, min / median / max, and the fit
   `latency + bytes / bandwidth` with its residual;
2. the compiled steps of one MoE layer (experts; attention + router; embedding + LM head) at a
   few token counts, against the roofline the cost model charges them: the effective
   `peak_tflops`, `hbm_gbps` and `launch_s` this machine shows;
3. `W/hardware.json`: that profile (`calibrated:<hostname>`) with every table, the command, the
   date, JAX's version and the device — a run uses it with `--config.hardware.file=W/hardware.json`;
4. the host CPU (`moejax.calibration.host_cpu`): one expert computed on the host for 1, 2, 4, ...
   tokens (a plain kernel and the live runtime's host step), the memory bandwidth, matmul FLOP/s and
   per-call overhead, and the host model fitted to them: hardware.json's `host` section, which
   replaces `host.preset` in a run with `--config.hardware.file` (`--host-only` measures this
   part alone, in seconds, into W/hardware.json: merged into a calibration already there);
5. the live runtime's host work (DESIGN.md "The host's work in the virtual clock"): the step
   tables of every model a calibration or validation runs (`moejax.calibration.steps`: each compiled
   step as the runtime dispatches it, by token count), then live cells
   (`moejax.calibration.matrix`'s calibration cells: capacities 5%, 25%, 100% with and without
   prefetch, a warm full cache speculating and not, int4) on the wall clock (transfers held to the
   profile's bandwidth), and the host's terms fitted to their passes
   (`moejax.calibration.host_fit`): hardware.json's `host_work` section;
6. the cells' TTFT and decode time on both clocks with the fitted profile and each cell's
   error (in-sample: `python -m moejax.calibration.validate` checks other cells), printed as one
   table and written to `W/calibration.json`.

The cells run the routing structure of OLMoE-1B-7B and Qwen1.5-MoE-A2.7B driven by their
prose captures (`policies.routing='trace(path=T)'`, the first `--prefill_tokens` rows one
prefill): on a GPU at the real expert size, on a CPU at `--width` (32 unless given); and the
embedded model on its own routing (`--model=embedded`: it alone). `--quick` measures fewer
sizes, steps, tokens and repetitions, one capture (the same code paths). `--cells=none`
measures no cells: then no host work either, and the profile's virtual clock models the
device only. Every number printed says which clock it is on.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from moejax import bundled, cli
from moejax import workdir as workdir_lib
from moejax.cli import UsageError, guarded
from moejax.errors import ConfigError
from moejax.results import write_json_atomic

PROG = "python -m moejax.calibration"
MODELS = ("olmoe", "embedded")


@dataclasses.dataclass
class Plan:
    """What a calibration measures and runs (`plan_for` fills what was not given)."""

    transfer_sizes: tuple[int, ...]
    transfer_reps: int
    step_widths: tuple[int, ...]  # the OLMoE-1B-7B layers the steps are timed at (0: 2048)
    step_tokens: tuple[int, ...]
    step_reps: int
    capacities: tuple[float, ...]  # of the cells; () runs none
    prefetch: str  # the prefetch of the cells with prefetch ("": the model's usual, see cells)
    model: str  # "olmoe" (trace-driven by `trace`) or "embedded"
    trace: str  # the capture (a bundled name or a path) driving olmoe cells
    width: int  # the cells' model width (0: the preset's own)
    tokens: int  # tokens each cell's request generates
    prefill_tokens: int  # rows of the trace prefilled as the prompt (olmoe cells)
    reps: int  # live runs per cell
    h2d_gbps: float | None  # the cells' bandwidth, on top of the profile (None: the profile's)
    quick_host: bool = False  # the host measured at `--quick`'s smaller expert
    # The host's work: the token counts of the step tables, their precisions, and whether the
    # embedded model's cells join the fit (its own routing: router round trips, complete
    # passes) beside the capture's.
    table_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    table_precisions: tuple[str, ...] = ("native", "int4")
    with_embedded: bool = True
    validation_tables: bool = True  # also the step tables of the models a validation runs
    # Captures of other families the fit also runs (each driving its family's preset at the
    # plan's width): another model depth, so a pass's own cost and a layer's are told apart.
    extra_captures: tuple[str, ...] = ("qwen_prose",)
    table_reps: int = 20  # rounds of the step tables (their medians)


def plan_for(platform: str, quick: bool, **given) -> Plan:
    """The plan on `platform` ("gpu", "cpu", ...), `--quick` or not, with `given` (not None)
    replacing its defaults."""
    from moejax.calibration import measure

    given = {k: v for k, v in given.items() if v is not None}
    gpu = platform == "gpu"
    width = given.get("width", 0 if gpu else 32)
    if gpu:  # the real size, steps up to a prefill's thousands of tokens
        step_widths = (width,)
        step_tokens = (1, 16, 256, 4096) if quick else (1, 4, 16, 64, 256, 1024, 4096)
        tokens = 32 if quick else 128
    else:  # at the cells' width (where the clock is asked) and four times it (where compute
        # and memory show more than the launch)
        step_widths = (width or 32,) if quick else (width or 32, 4 * (width or 32))
        step_tokens = (1, 16) if quick else (1, 4, 16, 64)
        # (not 32: run.max_new_tokens at its default means "every pass of the trace")
        tokens = 12 if quick else 48
    plan = Plan(transfer_sizes=measure.TRANSFER_SIZES[:6] if quick else measure.TRANSFER_SIZES,
                transfer_reps=3 if quick else 10, step_widths=step_widths,
                step_tokens=step_tokens, step_reps=3 if quick else 10,
                capacities=(0.05, 1.0) if quick else (0.05, 0.25, 1.0), prefetch="",
                model="olmoe", trace="olmoe_prose", width=width, tokens=tokens,
                prefill_tokens=16, reps=1 if quick else 3, h2d_gbps=None, quick_host=quick,
                table_tokens=(1, 16) if quick else (
                    (1, 2, 4, 8, 16, 32, 64, 256, 1024) if gpu else (1, 2, 4, 8, 16, 32)),
                table_precisions=("native",) if quick else ("native", "int4"),
                with_embedded=not quick, validation_tables=not quick,
                extra_captures=() if quick else ("qwen_prose",), table_reps=3 if quick else 20)
    plan = dataclasses.replace(plan, **given)
    if plan.model == "embedded":
        plan = dataclasses.replace(plan, with_embedded=False)
    return plan


def trace_file(name: str) -> str:
    """A bundled capture's path by name (`olmoe_prose`, ...), or a path as given."""
    if os.path.isfile(name):
        return name
    if name in bundled.CAPTURE_NAMES:
        return bundled.capture_path(name)
    raise UsageError(f"--trace={name!r} is neither a file nor a bundled capture "
                     f"({', '.join(bundled.CAPTURE_NAMES)})")


def cells_base(plan: Plan, hardware_file: str):
    """The config every cell starts from: the model and its requests, the profile in
    `hardware_file` (and `plan.h2d_gbps` over it), no progress bars or TensorBoard
    (`matrix.base_config` of the plan's first group)."""
    from moejax.calibration import matrix

    if plan.model not in MODELS:
        raise UsageError(f"--model={plan.model!r} is not one of {MODELS}")
    trace_file(plan.trace)  # (a bad name or path is one line)
    return matrix.base_config(fit_groups(plan)[0], hardware_file, plan.tokens,
                              plan.prefill_tokens, plan.width, plan.h2d_gbps)


def cells_model(plan: Plan, base):
    """The cells' model: OLMoE-1B-7B at `plan.width` with its experts drawn on the device
    (`cells.drawn_model`: at its real size too), or the one `base` names (the embedded)."""
    from moejax.calibration import cells as cells_lib
    from moejax.jobs.specs import resolve
    from moejax.model_source import load_model_for

    if plan.model == "olmoe":
        return cells_lib.drawn_model("olmoe", "olmoe-1b-7b", plan.width)
    return load_model_for(resolve(base))


def cell_prefetch(plan: Plan) -> str:
    """The cells' prefetcher: the one given, else SpecMD's default where the routing has
    speculative scores (the embedded model's own) and `temporal` on a capture (ids only)."""
    if plan.prefetch:
        return plan.prefetch
    return "temporal" if plan.model == "olmoe" else "score_percentile(p=80)"


def measure_machine(plan: Plan, out=print) -> tuple:
    """Steps 1-2: the measurements and their fits. Returns `(profile, measured)`: the
    `Hardware` they give and the tables and fits for hardware.json."""
    from moejax.calibration import fit, measure, profile
    from moejax.families import preset

    device = measure.device_description()
    out(f"calibrating {device['device_kind']} ({device['platform']}, JAX {device['jax']}): "
        f"host->device is jax.device_put from {device['host_memory_kind']} to device memory")
    rows = measure.transfers(plan.transfer_sizes, plan.transfer_reps)
    sizes = [r["bytes"] for r in rows]
    stream = fit.fit_transfer(sizes, [r["stream"]["median_s"] for r in rows])
    single = fit.fit_transfer(sizes, [r["single"]["median_s"] for r in rows])
    out(transfer_table(rows, plan.transfer_reps, stream, single))
    steps, models = [], []
    for width in plan.step_widths:
        cfg = preset("olmoe", "olmoe-1b-7b", width=width)
        models.append(measure.model_summary(measure.one_layer(cfg)))
        steps += [{"hidden_size": cfg.hidden_size, **s}
                  for s in measure.steps(cfg, plan.step_tokens, plan.step_reps)]
    roofline = fit.fit_roofline([s["flops"] for s in steps], [s["bytes"] for s in steps],
                                [s["timing"]["median_s"] for s in steps],
                                [s["launches"] for s in steps])
    for s in steps:
        s["roofline_s"] = roofline.seconds(s["flops"], s["bytes"], s["launches"])
        s["bound"] = roofline.bound(s["flops"], s["bytes"])
    out(step_table(steps, plan.step_reps, roofline))
    hw = profile.profile_of(stream, roofline, profile.calibrated_name())
    measured = {"transfers": rows, "transfer_fit": stream.to_dict(),
                "transfer_fit_single": single.to_dict(),
                "transfer_what": ("seconds per transfer: `single` one jax.device_put waited "
                                  "for; `stream` each of a back-to-back stream (the profile's "
                                  "fit)"),
                "steps": steps, "step_models": models,
                "roofline_fit": roofline.to_dict(),
                "copy_engines": "1: not measured apart (a stream's per-transfer time holds "
                                "whatever its transfers overlap)"}
    return hw, measured


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def transfer_table(rows: list[dict], reps: int, stream, single) -> str:
    lines = [f"host->device transfers (this machine's wall clock; median of {reps}, [min, max]):",
             f"  {'bytes':>10s} {'one, us':>10s} {'[min, max]':>20s} {'GB/s':>6s} | "
             f"{'stream, us each':>15s} {'GB/s':>6s}"]
    for r in rows:
        s, t = r["single"], r["stream"]
        lines.append(f"  {r['bytes']:>10d} {_us(s['median_s']):>10s} "
                     f"{'[' + _us(s['min_s']) + ', ' + _us(s['max_s']) + ']':>20s} "
                     f"{r['single_gbps']:>6.2f} | {_us(t['median_s']):>15s} "
                     f"{r['stream_gbps']:>6.2f}")
    for what, f in (("stream (the profile)", stream), ("one at a time", single)):
        lines.append(f"  fit, {what}: {_us(f.latency_s)} us + bytes / {f.gbps:.2f} GB/s; "
                     f"residual rms {100 * f.rms_rel:.1f}%, max {100 * f.max_rel:.1f}%")
    return "\n".join(lines)


def step_table(steps: list[dict], reps: int, roofline) -> str:
    lines = [f"compiled steps of one OLMoE-1B-7B layer at each width (hidden = expert width; "
             f"this machine's wall clock, median of {reps}) against the fitted roofline:",
             f"  {'width':>5s} {'step':16s} {'tokens':>6s} {'GFLOP':>9s} {'MB':>9s} "
             f"{'measured us':>12s} {'roofline us':>12s} {'bound':>7s}"]
    for s in steps:
        lines.append(f"  {s['hidden_size']:>5d} {s['step']:16s} {s['tokens']:>6d} "
                     f"{s['flops'] / 1e9:>9.3f} "
                     f"{s['bytes'] / 1e6:>9.2f} {_us(s['timing']['median_s']):>12s} "
                     f"{_us(s['roofline_s']):>12s} {s['bound']:>7s}")
    free = [k for k, ok in roofline.determined.items() if not ok]
    lines.append(f"  fit: peak {roofline.peak_tflops:.4g} TFLOP/s, HBM {roofline.hbm_gbps:.4g} "
                 f"GB/s, launch {_us(roofline.launch_s)} us; residual rms "
                 f"{100 * roofline.rms_rel:.1f}%, max {100 * roofline.max_rel:.1f}%"
                 + (f" ({', '.join(free)}: no step reached that side of the roofline, so the "
                    "best rate measured, a lower bound)" if free else ""))
    return "\n".join(lines)


def calibrate(workdir: str, plan: Plan, command: str, out=print) -> dict:
    """Steps 1-6 into `workdir` (claimed by the caller). Returns what calibration.json holds:
    the profile, its file, and the cells' rows."""
    from moejax.calibration import cells as cells_lib
    from moejax.calibration import host_fit, matrix, measure, profile
    from moejax.jobs.cache_report import progress
    from moejax.jobs.specs import hardware_from
    from moejax.timing import hardware as hw_lib

    hw, measured = measure_machine(plan, out)
    device = measure.device_description()
    path = os.path.join(workdir, "hardware.json")
    doc = profile.document(hw, measured, command, device)
    doc["host"] = measure_host(plan.quick_host, out)
    write_json_atomic(path, doc)
    out(f"profile {hw.name}: {hw.h2d_gbps:.3g} GB/s + {_us(hw.h2d_latency_s)} us per transfer, "
        f"{hw.peak_tflops:.4g} TFLOP/s, HBM {hw.hbm_gbps:.4g} GB/s, launch "
        f"{_us(hw.launch_s)} us -> {path} (use it with --config.hardware.file={path})")
    result = {"hardware": hw_lib.as_dict(hw), "hardware_file": path, "command": command,
              "device": device, "plan": dataclasses.asdict(plan), "cells": []}
    if plan.capacities:
        groups = fit_groups(plan)
        doc["host_work"] = measure_steps(plan, groups, profile.calibrated_name(), out)
        write_json_atomic(path, doc)
        cells = [(g, matrix.calibration_cells(g, plan.capacities,
                                              "int4" in plan.table_precisions))
                 for g in groups]
        entries = matrix.entries(cells, path, plan.tokens, plan.prefill_tokens, plan.width,
                                 plan.h2d_gbps)
        ran = hardware_from(entries[0].config)
        if ran.name != hw.name:  # fail closed: the cells must run on the profile just measured
            raise RuntimeError(f"hardware.file={path} gave the profile {ran.name!r}, not "
                               f"{hw.name!r}: moejax.jobs.specs.hardware_from does not "
                               "read hardware.file")
        out(f"live cells ({len(entries)} x {plan.reps} runs: {fit_description(plan, groups)}) "
            f"on {ran.name} at {ran.h2d_gbps:.3g} GB/s host->device, the host's work fitted "
            "to their passes:")
        samples: list = []
        with progress(True, len(entries) * plan.reps, "cells", unit="run") as bar:
            rows = cells_lib.run_entries(entries, plan.reps,
                                         bar.update if bar is not None else None, samples)
        record, _ = host_fit.fit(samples, doc, path)
        doc["host_work"]["fit"] = record
        write_json_atomic(path, doc)
        rows = [host_fit.repredicted(r, s, path) for r, s in zip(rows, samples)]
        result["cells"] = rows
        result["host_work_fit"] = record
        result["cells_what"] = (
            f"{fit_description(plan, groups)}; wall: the median of {plan.reps} live runs on "
            "the wall clock (this machine; the cache's transfers held to the profile's "
            "host->device bandwidth); virtual: the same run's routing replayed on the virtual "
            "clock with the profile and the host's work fitted to these very cells (in-sample: "
            "`python -m moejax.calibration.validate` checks it on others); error = "
            "(virtual - wall) / wall")
        out(host_fit.table(record))
        out(cells_lib.table(rows))
    else:
        out("no live cells (--cells=none): the host's work is not measured, and the profile's "
            "virtual clock models the device only")
    calibration = os.path.join(workdir, "calibration.json")
    write_json_atomic(calibration, result)
    out(f"results -> {path}, {calibration}")
    return result


def fit_groups(plan: Plan) -> list:
    """The groups whose cells the host's work is fitted to: the capture `plan.trace` driving
    OLMoE-1B-7B at the plan's width and `plan.extra_captures` their families' (or the embedded
    model alone, `--model=embedded`), and the embedded model after the default prompt
    (`plan.with_embedded`)."""
    from moejax.calibration import matrix

    groups = []
    if plan.model == "olmoe":
        groups += [matrix.Group(t, trace=t) for t in (plan.trace, *plan.extra_captures)]
    if plan.model == "embedded" or plan.with_embedded:
        groups.append(matrix.Group("embedded", prompt=matrix.CALIBRATION_PROMPT))
    return groups


def fit_description(plan: Plan, groups: list) -> str:
    what = []
    for g in groups:
        if g.trace:
            width = f"width {plan.width}" if plan.width else "its real size"
            what.append(f"{g.family()[1]} at {width} driven by {g.trace} (a "
                        f"{plan.prefill_tokens}-token prefill, {plan.tokens - 1} decode steps)")
        else:
            what.append(f"the embedded model after {g.prompt!r} ({plan.tokens} tokens)")
    return "; ".join(what)


def measure_steps(plan: Plan, groups: list, name: str, out=print) -> dict:
    """Step 5: the step tables (`moejax.calibration.steps`) of every model the cells and a
    validation run — the captures' families at the plan's width, the embedded model — as
    hardware.json's `host_work` section (its scalar terms fitted next)."""
    from moejax.calibration import matrix, steps
    from moejax.families import preset
    from moejax.model_source import embedded_config
    from moejax.timing import model_key

    configs = {}
    if plan.validation_tables:
        groups = [*groups, *(g for g, _ in matrix.validation_matrix())]
    for g in groups:
        cfg = preset(*g.family(), plan.width) if g.trace else embedded_config()
        configs[model_key(cfg)] = cfg
    tables = {}
    for key, cfg in configs.items():
        tables[key] = steps.step_table(cfg, plan.table_precisions, plan.table_tokens,
                                       plan.table_reps)
        out(steps.table(cfg, tables[key], plan.table_reps))
    return {"name": name, "steps": {k: {kind: t.to_dict() for kind, t in v.items()}
                                    for k, v in tables.items()}}


def measure_host(quick: bool, out=print) -> dict:
    """Step 4: hardware.json's `host` section (`moejax.calibration.host_cpu`), its table printed."""
    from moejax.calibration import host_cpu, profile

    plan = host_cpu.host_plan(quick)
    section = host_cpu.section(plan, host_cpu.measure_host(plan), profile.calibrated_name())
    out(host_cpu.table(section))
    return section


def calibrate_host(workdir: str, quick: bool, command: str, out=print) -> dict:
    """`--host-only`: the host section alone into `workdir`/hardware.json, replacing the one of
    a calibration already there (its device profile kept), else a file holding the host
    only. Returns the file's document."""
    import json
    import socket

    from moejax.calibration import measure, profile
    from moejax.timing import hardware as hw_lib

    path = os.path.join(workdir, "hardware.json")
    doc = {}
    if os.path.isfile(path):
        with open(path) as f:
            doc = json.load(f)
    section = measure_host(quick, out)
    section["command"], section["date"] = command, profile.now()
    doc.update({"host": section, "hostname": socket.gethostname(),
                "device": doc.get("device") or measure.device_description()})
    doc.setdefault("format", hw_lib.FILE_FORMAT)
    write_json_atomic(path, doc)
    out(f"host profile {section['profile']['name']} -> {path} (--config.hardware.file={path}: "
        "it replaces host.preset" + ("" if "hardware" in doc else "; the file has no device "
                                     "profile: run a full calibration into it for one") + ")")
    return doc


def cells_description(plan: Plan) -> str:
    if plan.model == "embedded":
        return (f"the embedded model on its own routing, {plan.tokens} tokens after the default "
                "prompt")
    width = f"width {plan.width}" if plan.width else "its real size"
    return (f"OLMoE-1B-7B at {width}, driven by {plan.trace}: a {plan.prefill_tokens}-token "
            f"prefill, {plan.tokens - 1} decode steps")


def _capacities(text: str) -> tuple[float, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < v <= 1 for v in values):
        raise UsageError(f"--cells={text!r}: takes capacities in (0, 1] separated by commas "
                         "(e.g. 0.05,0.25,1.0), or none")
    return values


def _positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{flag}={value} must be >= 1")


def main(argv=None) -> int:
    p = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="where hardware.json and calibration.json go")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes, steps, tokens and runs (the same code paths)")
    p.add_argument("--host-only", action="store_true",
                   help="measure the host CPU alone (hardware.json's host section, seconds)")
    p.add_argument("--cells", default=None,
                   help="capacities of the live cells, fractions of the routed experts "
                        "(default 0.05,0.25,1.0; --quick 0.05,1.0), or none")
    p.add_argument("--prefetch", default=None,
                   help="the cells' prefetch policy besides none (default: temporal on a "
                        "capture, score_percentile(p=80) on the embedded model)")
    p.add_argument("--model", default="olmoe", choices=MODELS,
                   help="olmoe: OLMoE-1B-7B driven by a capture; embedded: the embedded model")
    p.add_argument("--trace", default=None, help="the capture driving olmoe cells (a bundled "
                   "name, e.g. olmoe_code, or a path; default olmoe_prose)")
    p.add_argument("--width", type=int, default=None,
                   help="the olmoe cells' model width (default 32 on a CPU, 0 = the real "
                        "2048 on a GPU)")
    p.add_argument("--tokens", type=int, default=None, help="tokens each cell generates")
    p.add_argument("--reps", type=int, default=None, help="live runs per cell (the median)")
    p.add_argument("--h2d_gbps", type=float, default=None,
                   help="the cells' host->device bandwidth over the profile's (an emulated "
                        "link; default: the profile's)")
    args = p.parse_args(argv)
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    return guarded(PROG, lambda: run(args, command))


def run(args: argparse.Namespace, command: str) -> int:
    _positive("--tokens", args.tokens)
    _positive("--reps", args.reps)
    if args.width is not None and args.width < 0:
        raise UsageError(f"--width={args.width} must be >= 0 (0: the preset's own)")
    if args.h2d_gbps is not None and not 0 < args.h2d_gbps < float("inf"):
        raise UsageError(f"--h2d_gbps={args.h2d_gbps} must be a finite number > 0")
    if args.tokens is not None and args.model == "olmoe" and args.tokens < 2:
        raise UsageError(f"--tokens={args.tokens}: an olmoe cell decodes after its prefill "
                         "(at least 2)")
    capacities = None if args.cells is None else _capacities(args.cells)
    if args.trace is not None:
        trace_file(args.trace)
    workdir_lib.check(args.workdir)
    if args.host_only:
        with workdir_lib.claimed(args.workdir):
            calibrate_host(args.workdir, args.quick, command)
        return 0
    import jax

    plan = plan_for(jax.default_backend(), args.quick, capacities=capacities,
                    prefetch=args.prefetch, model=args.model, trace=args.trace,
                    width=args.width, tokens=args.tokens, reps=args.reps,
                    h2d_gbps=args.h2d_gbps)
    if plan.model == "olmoe" and plan.width:
        from moejax.families import preset

        try:
            preset("olmoe", "olmoe-1b-7b", width=plan.width)
        except ConfigError as e:
            raise UsageError(f"--width={plan.width}: {e}") from None
    with workdir_lib.claimed(args.workdir):
        calibrate(args.workdir, plan, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
