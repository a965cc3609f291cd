"""The device check of the GPU path, one run of at most 6 minutes on one GPU.

    python benchmarks/gpu_check.py [--quick] [--out=DIR]

At OLMoE-1B-7B's real expert size (hidden 2048, expert intermediate 1024), driven by the real
OLMoE capture (`policies.routing='trace(path=T)'`), at an emulated 5 GB/s host->device link
(`hardware.h2d_gbps=5`):

0. slot loads on the copy stream (`benchmarks/slot_loads.py`, `cache.load_path=copy_stream`):
   a wave of 8 experts' host->device rate as a share of a raw `jax.device_put` from pinned
   host, native and int4 (the goal: >= 0.9), and the share of a wave's load hidden behind
   an experts step dispatched before it (>= 0.8 where the step is the longer);
1. calibration (`moejax.calibration.calibrate`): host->device transfers 4 KiB to 64 MiB, the
   compiled steps of one layer at the real size, and the profile they give (`OUT/hardware.json`);
2. live cells against the virtual clock: capacities 5%, 25%, 100%, with and without prefetch
   (`temporal`: the capture has no scores), each live on the wall clock (the cache's transfers
   held to 5 GB/s) and as the virtual clock predicts it with the calibrated profile at 5 GB/s,
   and how many decode passes speculated, with their failed checks (these cells follow a
   capture, `routing=trace(...)`: a trace-driven pass speculates on the trace's selection);
   the 100% prefetching cell also runs layer by layer (`cache.speculate=False`, its twin);
2b. the host's work: the step tables at this size (`moejax.calibration.steps`), the host
   terms fitted to part 2's cells (`moejax.calibration.host_fit`), then part of the validation
   (`python -m moejax.calibration.validate`) at this size on the capture the fit did not see
   (`olmoe_code`: capacities 25% and 100% x eviction lru / least_stale x prefetch none /
   temporal, 8 cells; `--quick`: 2), its median and 90th percentile |error| and Kendall's tau;
3. an XProf trace of one prefetching decode step (`jax.profiler`, `OUT/xprof`; open it with
   TensorBoard's profile plugin or xprof), its host-side annotations on;
4. speculative passes on the wall clock: the 100% prefetching cell of part 2 against its
   layer-by-layer twin (a trace-driven run at this check's size: OLMoE's real size on a GPU),
   decode tok/s of each and their ratio; and where the router's own gates drive the cache, the
   first command (`configs/default.py`, the embedded model, 100% from cold, 64 tokens; 16
   with `--quick`) on the wall clock at the emulated 5 GB/s, speculating and layer by layer
   (`cache.speculate=False`), alternated: decode tok/s of each, their ratio, and the
   speculative passes' failed checks, of them for an expert still in flight (on a GPU the
   copy stream's transfers are real; its tiny experts make this the runtime's overhead, not
   a real model's);
5. one table of everything (and `OUT/gpu_check.json`, written after each part: a part that
   fails is a row saying so, the others still run, and the exit status is 1).

`--quick` runs the same code on the CPU backend at tiny sizes in under a minute (OLMoE's
structure at width 8, a few tokens, one capacity): what `tests/test_gpu_check.py` runs. A
figure only a GPU gives is marked GPU-only when it comes from another backend.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
import traceback

import jax
import numpy as np
import slot_loads  # benchmarks/slot_loads.py, beside this script

from moejax.calibration import calibrate, cells, profile
from moejax.jobs.common import cache_of, configured_decoder
from moejax.results import write_json_atomic
from moejax.timing import hardware as hw_lib
from moejax.traces import driven

EMULATED_GBPS = 5.0  # the link SpecMD measured on its A100 (hardware preset a100_specmd)


def plan(platform: str, quick: bool) -> calibrate.Plan:
    """What this check measures and runs: the calibration's plan at OLMoE's real size on a GPU
    (fewer step shapes than a full calibration: the 6 minutes), tiny with `--quick`."""
    if quick:  # transfers up to 16 MiB, 3 reps: smaller ones can look flat on a busy machine
        return calibrate.Plan(
            transfer_sizes=(4096, 1 << 20, 16 << 20), transfer_reps=3, step_widths=(8,),
            step_tokens=(1, 4), step_reps=2, capacities=(0.05,), prefetch="temporal",
            model="olmoe", trace="olmoe_prose", width=8, tokens=4, prefill_tokens=4, reps=1,
            h2d_gbps=EMULATED_GBPS, table_tokens=(1, 4), table_precisions=("native",),
            with_embedded=False, validation_tables=False, extra_captures=(), table_reps=3)
    gpu = platform == "gpu"
    return calibrate.Plan(
        transfer_sizes=tuple(4096 * 4 ** i for i in range(8)), transfer_reps=10,
        step_widths=(0,) if gpu else (32,), step_tokens=(1, 16, 256, 4096) if gpu else
        (1, 16, 256), step_reps=10, capacities=(0.05, 0.25, 1.0), prefetch="temporal",
        model="olmoe", trace="olmoe_prose", width=0 if gpu else 32, tokens=24,
        prefill_tokens=16, reps=2, h2d_gbps=EMULATED_GBPS,
        table_tokens=(1, 4, 16, 64, 256) if gpu else (1, 4, 16), with_embedded=False,
        validation_tables=False, extra_captures=())


@dataclasses.dataclass
class Row:
    section: str
    what: str
    value: float | None
    unit: str
    note: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def gpu_only(platform: str, why: str) -> str:
    """The note of a figure only a GPU gives, on this `platform`."""
    return "" if platform == "gpu" else f"GPU-only ({platform} here: {why})"


def load_rows(platform: str, quick: bool) -> list[Row]:
    """Part 0 (slot loads) at OLMoE's expert size (tiny with `quick`), along copy_stream."""
    size = dict(hidden=64, intermediate=32, reps=2) if quick else {}
    why = gpu_only(platform, "the CPU backend has no copy stream; cache.load_path=auto takes "
                             "fused on it")
    rows = []
    for precision in ("native", "int4"):
        r = slot_loads.h2d_fraction(precision, "copy_stream", **size)
        mib = r["bytes"] / 2 ** 20
        rows += [
            Row("loads", f"{precision}: a wave's copy_stream load / raw device_put",
                r["fraction"], "x", "; ".join(x for x in ("goal >= 0.9", why) if x)),
            Row("loads", f"{precision}: raw device_put of the wave ({mib:.2f} MiB)",
                r["bytes"] / r["raw"].median / 1e9, "GB/s", why),
            Row("loads", f"{precision}: copy_stream load of the wave ({mib:.2f} MiB)",
                r["bytes"] / r["load"].median / 1e9, "GB/s", why)]
    for precision in ("native", "int4"):
        r = slot_loads.overlap_fraction(precision, "copy_stream",
                                        tokens=16 if quick else None, **size)
        longer = "the step was the longer" if r["compute_longer"] else \
            "the step was SHORTER than the load"
        rows.append(Row("loads", f"{precision}: share of the load hidden behind an experts step",
                        r["overlap"], "x", "; ".join(x for x in (
                            f"goal >= 0.8; {r['tokens']} tokens, {longer}", why) if x)))
    return rows


def calibration_rows(hw: hw_lib.Hardware, measured: dict, platform: str) -> list[Row]:
    t, r = measured["transfer_fit"], measured["roofline_fit"]
    where = "" if platform == "gpu" else f"this {platform} backend's, not a GPU's"
    free = [k for k, ok in r["determined"].items() if not ok]
    bound = f"lower bound: no step reached {', '.join(free)}" if free else ""
    return [
        Row("calibration", "host->device bandwidth (back-to-back stream)", hw.h2d_gbps, "GB/s",
            where),
        Row("calibration", "host->device latency per transfer", hw.h2d_latency_s * 1e6, "us",
            where),
        Row("calibration", "transfer fit residual (rms)", 100 * t["rms_rel"], "%"),
        Row("calibration", "peak (roofline fit)", hw.peak_tflops, "TFLOP/s",
            "; ".join(x for x in (where, bound if "peak" in bound else "") if x)),
        Row("calibration", "memory bandwidth (roofline fit)", hw.hbm_gbps, "GB/s",
            "; ".join(x for x in (where, bound if "hbm" in bound else "") if x)),
        Row("calibration", "launch per step (roofline fit)", hw.launch_s * 1e6, "us", where),
        Row("calibration", "roofline fit residual (rms)", 100 * r["rms_rel"], "%"),
    ]


def cell_rows(rows: list[dict], platform: str, width: int) -> list[Row]:
    size = gpu_only(platform, f"OLMoE's structure at width {width}, not its real size") \
        if width else ""
    out = []
    for r in rows:
        w, v = r["wall"], r["virtual"]
        per_w = w["decode_s"] / w["decode_tokens"] if w["decode_tokens"] else None
        per_v = v["decode_s"] / v["decode_tokens"] if v["decode_tokens"] else None
        name = f"cell {r['cell']} ({r['slots']}/{r['total_experts']} slots)"
        out += [
            Row("cells", f"{name}: TTFT, wall clock", _ms(w["ttft_s"]), "ms", size),
            Row("cells", f"{name}: TTFT, virtual clock", _ms(v["ttft_s"]), "ms", size),
            Row("cells", f"{name}: TTFT error (virtual - wall) / wall",
                _pct(r["ttft_error"]), "%", f"larger: {r['larger']['ttft']}"),
            Row("cells", f"{name}: decode per token, wall clock", _ms(per_w), "ms", size),
            Row("cells", f"{name}: decode per token, virtual clock", _ms(per_v), "ms", size),
            Row("cells", f"{name}: decode error (virtual - wall) / wall",
                _pct(r["decode_error"]), "%", f"larger: {r['larger']['decode']}"),
        ]
        spec = r.get("speculation")
        if spec is not None:  # the wall clock's speculative passes, all runs of the cell
            out += [
                Row("cells", f"{name}: speculative decode passes", spec["speculative_passes"],
                    "passes", f"{spec['checked_mid_pass']} checked mid-pass"),
                Row("cells", f"{name}: their failed checks", spec["failed_checks"], "checks",
                    f"{spec['failed_in_flight']} for an expert still in flight"),
            ]
    return out


def cell_speculation_rows(ran: list[dict] | None, pair: cells.Cell | None, platform: str,
                          width: int) -> list[Row]:
    """Part 4 on the cells (part 2): the largest prefetching cell, a trace-driven run, speculating
    against deciding layer by layer (its twin cell), wall-clock decode of each (median of the
    cell's runs, alternated with the others)."""
    if not ran or pair is None:
        return [Row("speculation", "trace-driven cell: no cells ran (part 2 failed)", None, "")]
    by_name = {r["cell"]: r for r in ran}
    spec = by_name[pair.name]
    lbl = by_name[dataclasses.replace(pair, speculate=False).name]
    size = gpu_only(platform, f"OLMoE's structure at width {width}, not its real size") \
        if width else "OLMoE-1B-7B's real size"
    what = f"cell {pair.name}, trace-driven, wall clock"
    tok = spec["wall"]["decode_tok_per_s"], lbl["wall"]["decode_tok_per_s"]
    return [
        Row("speculation", f"{what}: decode speculating", tok[0], "tok/s", size),
        Row("speculation", f"{what}: decode layer by layer", tok[1], "tok/s", size),
        Row("speculation", f"{what}: speculating / layer by layer",
            tok[0] / tok[1] if tok[0] and tok[1] else None, "x",
            "above 1: speculation is faster; its failed checks are the cell's rows"),
    ]


def speculation_rows(quick: bool) -> list[Row]:
    """Part 4: the embedded model's first command on the wall clock, speculating and layer by
    layer, alternated (`reps` each), through the generate job (`cache_runtime.cli_run`)."""
    from cache_runtime import cli_run  # benchmarks/cache_runtime.py, beside this script

    tokens, reps = (16, 1) if quick else (64, 3)
    got: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(reps):
        for speculate in ((True, False) if r % 2 == 0 else (False, True)):
            got[speculate].append(cli_run({"capacity_frac": 1.0, "speculate": speculate,
                                           "clock.kind": "wall",
                                           "hardware.h2d_gbps": EMULATED_GBPS}, tokens))
    tok = {k: float(np.median([g["timings"]["decode_tok_per_s"] for g in v]))
           for k, v in got.items()}
    spec = [g["speculation"] for g in got[True]]
    what = f"first command, 100% cold, wall clock, {tokens} tokens"
    note = f"{reps} run{'s' if reps > 1 else ''} of each, alternated: the median"
    return [
        Row("speculation", f"{what}: decode speculating", tok[True], "tok/s", note),
        Row("speculation", f"{what}: decode layer by layer", tok[False], "tok/s", note),
        Row("speculation", f"{what}: speculating / layer by layer", tok[True] / tok[False],
            "x", "above 1: speculation is faster"),
        Row("speculation", f"{what}: speculative passes' failed checks",
            sum(s["failed_checks"] for s in spec), "checks",
            f"of {sum(s['speculative_passes'] for s in spec)} passes; "
            f"{sum(s['failed_in_flight'] for s in spec)} for an expert still in flight"),
    ]


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def _pct(error):
    return None if error is None else 100 * error


def xprof_decode_step(config, loaded, trace_dir: str, step: int = 2) -> dict:
    """An XProf trace of one decode step of a prefetching run (`config`: a cell's, warmed up
    by the cells): the profiler runs from after token `step` to after token `step + 1`, so it
    holds exactly that forward pass, with the decoder's and the cache's host annotations.
    Returns the trace's files and the prefetches issued in the step."""
    runs = cells.LiveRuns(config, loaded)
    experts, decoder = configured_decoder(runs.spec, loaded, max_len=runs.max_len)
    cache, driver = cache_of(experts), driven.driver_of(experts)
    decoder.annotate = cache.annotate = jax.profiler.TraceAnnotation
    request = runs.requests[0]
    if driver is not None:
        driver.start(request.sequence)
    issued = {}

    def on_token(i):
        if i == step:
            issued["before"] = cache_of(experts).metrics.totals()["prefetch_issued"]
            jax.profiler.start_trace(trace_dir)
        elif i == step + 1:
            jax.profiler.stop_trace()
            issued["after"] = cache_of(experts).metrics.totals()["prefetch_issued"]

    tokens = runs.new_tokens(request)
    if tokens < step + 2:
        raise ValueError(f"a trace of decode step {step} needs {step + 2} tokens, not {tokens}")
    decoder.generate(np.asarray([request.ids], np.int32), tokens, on_token=on_token)
    files = [os.path.join(d, f) for d, _, names in os.walk(trace_dir) for f in names]
    return {"dir": trace_dir, "files": files, "bytes": sum(os.path.getsize(f) for f in files),
            "prefetch_issued": issued["after"] - issued["before"]}


def table(rows: list[Row]) -> str:
    width = max(len(r.what) for r in rows)
    lines = [f"{'section':12s} {'what':{width}s} {'value':>12s} {'unit':8s} note"]
    for r in rows:
        value = "n/a" if r.value is None else f"{r.value:.4g}"
        lines.append(f"{r.section:12s} {r.what:{width}s} {value:>12s} {r.unit:8s} {r.note}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="the same code on the CPU backend at tiny sizes (under a minute)")
    p.add_argument("--out", default="", help="where hardware.json, the XProf trace and "
                   "gpu_check.json go (default: a new temporary directory)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    platform = jax.devices()[0].platform
    out = args.out or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(out, exist_ok=True)
    the_plan = plan(platform, args.quick)
    command = " ".join(["python benchmarks/gpu_check.py",
                        *(sys.argv[1:] if argv is None else argv)])
    print(f"gpu_check{' --quick' if args.quick else ''}: {jax.devices()[0].device_kind} "
          f"({platform}), JAX {jax.__version__}, into {out}")
    from moejax.calibration import measure

    report = {"command": command, "platform": platform, "device": measure.device_description(),
              "plan": dataclasses.asdict(the_plan), "rows": [], "failed": []}
    rows: list[Row] = []
    state: dict = {}

    def section(name: str, body) -> None:
        """Runs one part; a part that fails is a row saying so, and the next part still runs
        (one device run shows all it can). The report is written after each part."""
        try:
            rows.extend(body())
        except Exception as e:  # noqa: BLE001 - recorded, shown, and the exit status is 1
            rows.append(Row(name, f"FAILED: {type(e).__name__}: {e}"[:200], None, ""))
            report["failed"].append(name)
            traceback.print_exc()
        report["rows"] = [r.to_dict() for r in rows]
        write_json_atomic(os.path.join(out, "gpu_check.json"), report)

    def calibration():
        hw, measured = calibrate.measure_machine(the_plan)
        state["hardware_file"] = report["hardware_file"] = os.path.join(out, "hardware.json")
        write_json_atomic(state["hardware_file"], profile.document(
            hw, measured, command, measure.device_description()))
        return calibration_rows(hw, measured, platform)

    def live_cells():
        base = calibrate.cells_base(the_plan, state["hardware_file"])
        state["base"], state["loaded"] = base, calibrate.cells_model(the_plan, base)
        prefetch = calibrate.cell_prefetch(the_plan)
        state["cells"] = cells.cells_of(the_plan.capacities, ("none", prefetch))
        # The largest prefetching cell, speculating (the default) and layer by layer: what
        # speculation saves on a trace-driven run at this size (part 4).
        state["spec_pair"] = spec_pair = cells.Cell(max(the_plan.capacities), prefetch)
        state["cells"].append(dataclasses.replace(spec_pair, speculate=False))
        print(f"live cells ({len(state['cells'])} x {the_plan.reps} runs, "
              f"{calibrate.cells_description(the_plan)}) at {EMULATED_GBPS:g} GB/s "
              "host->device:")
        entries = [cells.Entry(c, c.config(base), state["loaded"], the_plan.trace)
                   for c in state["cells"]]
        state["samples"] = []
        ran = cells.run_entries(entries, the_plan.reps, samples=state["samples"])
        print(cells.table(ran))
        report["cells"] = ran
        return cell_rows(ran, platform, the_plan.width)

    def host_work():
        from moejax.calibration import host_fit, matrix, validate

        path = state["hardware_file"]
        doc = json.load(open(path))
        groups = [matrix.Group(the_plan.trace, trace=the_plan.trace)]
        doc["host_work"] = calibrate.measure_steps(the_plan, groups, profile.calibrated_name())
        record, _ = host_fit.fit(state["samples"], doc, path)
        doc["host_work"]["fit"] = record
        write_json_atomic(path, doc)
        print(host_fit.table(record))
        target = matrix.Group("olmoe_code", trace="olmoe_code")
        chosen = [cells.Cell(c, p, settings=(("policies.eviction", e),))
                  for c in ((0.25,) if args.quick else (0.25, 1.0))
                  for e in (("lru",) if args.quick else ("lru", "least_stale"))
                  for p in ("none", "temporal")]
        got = validate.run_validation(
            out, path, quick=args.quick, reps=1, tokens=the_plan.tokens,
            prefill_tokens=the_plan.prefill_tokens, width=the_plan.width, groups=(),
            command=command, matrix_cells=[(target, chosen)])
        report["validation"] = {k: got[k] for k in ("summary", "rankings", "goals")}
        size = gpu_only(platform, f"OLMoE's structure at width {the_plan.width}") \
            if the_plan.width else "OLMoE-1B-7B's real size"
        rows = [Row("host work", "fit residual over the part 2 cells (rms)",
                    100 * record["rms_rel"], "%", size)]
        for m in ("ttft", "decode"):
            s = got["summary"][m]
            rows += [Row("host work", f"validation ({len(chosen)} cells, olmoe_code): {m} "
                         "median |error|", None if s["median"] is None else 100 * s["median"],
                         "%", "goal <= 10%"),
                     Row("host work", f"validation: {m} 90th percentile |error|",
                         None if s["p90"] is None else 100 * s["p90"], "%", "goal <= 20%")]
        return rows

    def xprof():
        cell = state["spec_pair"]
        got = xprof_decode_step(cell.config(state["base"]), state["loaded"],
                                os.path.join(out, "xprof"))
        report["xprof"] = got
        return [Row("xprof", f"trace of a decode step ({cell.name})", got["bytes"] / 1e6, "MB",
                    f"{got['prefetch_issued']} prefetches issued in it; {got['dir']}")]

    section("loads", lambda: load_rows(platform, args.quick))
    section("calibration", calibration)
    section("cells", live_cells)
    section("host work", host_work)
    section("xprof", xprof)
    section("speculation", lambda: cell_speculation_rows(report.get("cells"), state.get(
        "spec_pair"), platform, the_plan.width) + speculation_rows(args.quick))
    rows.append(Row("run", "gpu_check wall time", time.perf_counter() - start, "s",
                    "--quick" if args.quick else "the budget on a GPU: 360 s"))
    report["rows"] = [r.to_dict() for r in rows]
    write_json_atomic(os.path.join(out, "gpu_check.json"), report)
    print(table(rows))
    bad = [r.what for r in rows if r.value is not None and not math.isfinite(r.value)]
    if bad:
        print(f"not finite: {bad}", file=sys.stderr)
    if report["failed"]:
        print(f"failed: {report['failed']}", file=sys.stderr)
    print(f"results -> {os.path.join(out, 'gpu_check.json')}")
    return 1 if bad or report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
