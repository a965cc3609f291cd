"""`--traces`: a study's cells on any set of traces, without a grid config — the runner the
claims tool (`claims.main`) calls; the cells are the study's (`Plan.cells_for`, e.g.
studies/specmd/cells.py).

    python -m studies.specmd.claims --traces='runs/*.jsonl' other.npz --workdir=W
        [--capacity=0.05] [--precision=int4] [--h2d_gbps=5] [--hardware=a100_specmd]
        [--request_cut=none --request_cut=128/32] [--model=family/preset]

Each file is imported (any format `moejax.traces.importers` reads) and identified by its own
metadata: the model it names, its MoE layers, experts and top-k. A capacity is a share of the
whole model's bytes, so a trace that records no expert bytes (a capture) needs the model: the
moejax preset whose layers, experts and top-k are the trace's (one real model per shape), else
`--model`. The study's `cells_for` gives every cell's overrides for one trace and request cut,
at the study's settings (`Plan.defaults`) unless the flags say otherwise; each request cut is
its own condition (`none`: the trace as recorded, decode only for a capture).

Cells run in this process into `W/cells/<name>/` (a sweep's layout: `launch.sweep`'s tools and
`--sweep_dir=W` read it); a finished cell is kept and not re-run, so an interrupted run
resumes. A workdir holding cells of other traces or settings is refused, not mixed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import sys
import time
from typing import Callable, Mapping

from moejax.cli import UsageError

PLAN = "claims_plan.json"  # in the workdir: the cells it holds and what they were made for

# A study's cells of one trace: (path, `describe(path)`, capacities (shares of the model),
# request cut (R, P), settings {precision, hardware, h2d_gbps}, model overrides) -> every
# cell's overrides.
CellsFor = Callable[[str, dict, list, tuple, dict, dict], list]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a study runs on `--traces`: its cells (`cells_for`) and its settings' defaults
    (`defaults`: precision, hardware, h2d_gbps, capacity (a share of the model), request_cut
    (a tuple of texts), and `also_capacities`: shares run beside --capacity)."""

    cells_for: CellsFor
    defaults: Mapping


def add_arguments(ap: argparse.ArgumentParser, defaults: Mapping) -> None:
    """The `--traces` options, their help naming the study's `defaults`."""
    run = ap.add_argument_group("with --traces")
    run.add_argument("--workdir", help="where the cells run (required with --traces)")
    run.add_argument("--precision", default=None,
                     help=f"expert precision of every cell (default {defaults['precision']})")
    run.add_argument("--hardware", default=None,
                     help=f"hardware preset (default {defaults['hardware']})")
    run.add_argument("--request_cut", action="append", default=None, metavar="none|R/P",
                     help="how the trace is cut into requests: none (as recorded) or R/P "
                          "(requests of R tokens, the first P a prefill); repeat for several "
                          "(each its own condition; default none)")
    run.add_argument("--model", default=None, metavar="FAMILY/PRESET",
                     help="the model of traces whose shape matches no moejax preset")


_RUN_ONLY = ("workdir", "precision", "hardware", "request_cut", "model")


def refuse_run_options(a: argparse.Namespace) -> None:
    given = [f"--{k}" for k in _RUN_ONLY if getattr(a, k) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} only apply with --traces (a sweep's cells "
                         "already ran)")


def expand(globs: list[str]) -> list[str]:
    """The files the globs name, sorted, each once; a glob that names none is an error."""
    out: dict[str, None] = {}
    for g in globs:
        found = sorted(p for p in glob.glob(os.path.expanduser(g)) if os.path.isfile(p))
        if not found:
            raise UsageError(f"--traces={g}: no such file (a path or a glob of trace files)")
        out.update(dict.fromkeys(os.path.abspath(p) for p in found))
    return list(out)


def parse_cut(text: str) -> tuple[int, int]:
    """`none` -> (0, 0); `128/32` -> (128, 32)."""
    if text.strip().lower() == "none":
        return (0, 0)
    try:
        r, p = (int(x) for x in text.split("/"))
    except ValueError:
        r = p = -1
    if r < 1 or not 0 <= p < r:
        raise UsageError(f"--request_cut={text}: takes none or R/P (requests of R tokens, the "
                         "first P of each a prefill, 0 <= P < R), e.g. 128/32")
    return (r, p)


def _presets() -> list[tuple[str, str, tuple]]:
    from moejax.families import FAMILIES, preset

    return [(family, name, (c.num_layers, c.num_experts, c.top_k))
            for family, f in FAMILIES.items() for name in f.presets
            for c in [preset(family, name)]]


def model_for(path: str, shape: tuple, model_flag: str | None) -> dict:
    """The model overrides a trace needs for its capacity in model bytes: none where the trace
    records its expert bytes; else `--model`, or the one non-tiny preset of the trace's shape."""
    if model_flag:
        family, _, name = model_flag.partition("/")
        if (family, name) not in {(f, n) for f, n, _ in _presets()}:
            known = ", ".join(f"{f}/{n}" for f, n, _ in _presets())
            raise UsageError(f"--model={model_flag}: not a moejax model preset; the presets: "
                             f"{known}")
        return {"model.family": family, "model.preset": name}
    matches = [(f, n) for f, n, s in _presets() if s == shape and n != "tiny"]
    if len(matches) == 1:
        return {"model.family": matches[0][0], "model.preset": matches[0][1]}
    layers, experts, top_k = shape
    raise UsageError(f"{path}: records no expert bytes and its shape ({layers} layers × "
                     f"{experts} experts, top-{top_k}) is no moejax preset's, so a share of the "
                     "model cannot be turned into slots: give --model=FAMILY/PRESET")


def describe(path: str) -> dict:
    """What a trace file is, from its own metadata: scored or not, its shape, expert bytes."""
    from moejax.traces import TraceError, import_traces

    try:
        first = import_traces(path).traces[0]
    except (TraceError, OSError, ValueError) as e:
        raise UsageError(f"--traces: {e}") from None
    return {"scored": first.has_scores, "model": first.model_name,
            "shape": (len(first.layers), first.num_experts, first.top_k),
            "expert_bytes": first.meta.get("expert_bytes")}


def cell_name(overrides: dict) -> str:
    text = json.dumps(overrides, sort_keys=True)
    stem = os.path.splitext(os.path.basename(str(overrides["replay.trace"])))[0]
    return f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def plan(a: argparse.Namespace, study: Plan) -> dict[str, dict]:
    """Cell name -> overrides, for every trace, capacity and request cut."""
    defaults = study.defaults
    settings = {k: getattr(a, k, None) if getattr(a, k, None) is not None else defaults[k]
                for k in ("precision", "hardware", "h2d_gbps")}
    cap = a.capacity if a.capacity is not None else (0, defaults["capacity"])
    if cap[0] != 0:
        raise UsageError("--capacity with --traces takes a share of the model (0.05 or 5%), "
                         "not a slot count")
    caps = sorted({*defaults.get("also_capacities", ()), float(cap[1])})
    cuts = [parse_cut(c) for c in (a.request_cut or defaults["request_cut"])]
    out = {}
    for path in expand(a.traces):
        info = describe(path)
        model = {} if info["expert_bytes"] else model_for(path, info["shape"], a.model)
        for cut in cuts:
            for o in study.cells_for(path, info, caps, cut, settings, model):
                out[cell_name(o)] = o
    return out


def _check_workdir(workdir: str, cells: dict[str, dict]) -> None:
    """A workdir of another plan (other traces or settings) is refused, not mixed."""
    path = os.path.join(workdir, PLAN)
    if os.path.exists(path):
        with open(path) as f:
            before = json.load(f)
        if set(before.get("cells", {})) != set(cells):
            raise UsageError(f"--workdir={workdir} holds the cells of another claims run "
                             "(other traces or settings): give a new --workdir")
    elif os.path.isdir(workdir) and os.listdir(workdir):
        raise UsageError(f"--workdir={workdir} is not empty and holds no claims run: give a "
                         "new or empty directory")


def run(a: argparse.Namespace, study: Plan) -> str:
    """Runs the study's plan's unfinished cells into `a.workdir`; returns it (a sweep
    directory)."""
    from moejax.results import write_json_atomic

    if not a.workdir:
        raise UsageError("--traces needs --workdir=W (where its cells run)")
    cells = plan(a, study)
    _check_workdir(a.workdir, cells)
    os.makedirs(os.path.join(a.workdir, "cells"), exist_ok=True)
    write_json_atomic(os.path.join(a.workdir, PLAN), {"cells": cells})
    todo = [n for n in cells if not _finished(a.workdir, n)]
    print(f"claims: {len(cells)} cells on {len(expand(a.traces))} trace(s) in {a.workdir}; "
          f"{len(cells) - len(todo)} finished before, {len(todo)} to run", file=sys.stderr)
    start = time.perf_counter()
    for i, name in enumerate(todo, 1):
        _run_cell(os.path.join(a.workdir, "cells", name), cells[name])
        if i % 50 == 0 or i == len(todo):
            print(f"  {i}/{len(todo)} cells ({time.perf_counter() - start:.0f} s)",
                  file=sys.stderr)
    return a.workdir


def _finished(workdir: str, name: str) -> bool:
    path = os.path.join(workdir, "cells", name, "results.json")
    try:
        with open(path) as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False


def _run_cell(cell_dir: str, overrides: dict) -> None:
    """One replay cell, its output in the cell's log.txt; a failure is one line naming it."""
    from moejax import jobs
    from moejax.jobs.schema import replay_grid_config

    config = replay_grid_config()
    config.update_from_flattened_dict(overrides)
    os.makedirs(cell_dir, exist_ok=True)
    with open(os.path.join(cell_dir, "log.txt"), "w") as log, \
            contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            jobs.run(config, cell_dir)
        except Exception as e:  # noqa: BLE001 - the cell's own error, named below
            failed = f"{type(e).__name__}: {e}"
        else:
            failed = ""
    if failed:
        raise UsageError(f"claims: the cell {os.path.basename(cell_dir)} "
                         f"({overrides['replay.trace']}) failed: {failed.splitlines()[0]}")
