"""The plan job: for a model on a machine and a workload, which expert-cache configuration to
run and how fast it will be — every candidate forecast on the machine's virtual clock, ranked,
the best recommended as a command line; with `plan.verify`, checked live.

    python -m moejax.main --config=configs/plan.py --config.model.preset=olmoe-1b-7b \\
        --config.model.width=32 --config.replay.trace=T --config.hardware.file=W/hardware.json \\
        --config.plan.device_gb=0.0015 --workdir=D

The model: `model.hf_config` (a Hugging Face config.json: no weights), `model.checkpoint` (a
converted one) or `model.family` / `model.preset` (`model.width` honoured). The machine:
`hardware.*` (a calibrated `hardware.file`, or a preset), `host.*`, `storage.*`, and the
budgets `plan.device_gb` (`plan.budget_of`), `plan.context`, `plan.host_gb`, `plan.disk`. The
workload: `replay.trace`; without one, the shipped captures of the model's family, or (none
ships for it) a synthetic routing, each labelled so in every output. The search
(`moejax/plan/search.py`), the forecasts and their bands (`moejax/plan/forecast.py`) and the
check (`moejax/plan/verify.py`) are described where they live; docs/DESIGN.md "The planner".

Writes `D/results.json` (`plan`: `fit`, `workload`, `candidates`, `recommended` with
`overrides`, `predicted` = {`ttft_s`, `decode_tok_per_s`, `band`}, `device_bytes` and
`command`, `default`, `verified` with `plan.verify`) and prints the fit, the ranked table and
the command line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import ml_collections
import numpy as np

from moejax import bundled, cli
from moejax.errors import ConfigError
from moejax.families import config_from_hf, family_for_hf, get_family, preset
from moejax.families.family import at_width
from moejax.jobs.cache_report import announce_results, progress
from moejax.model_config import ModelConfig
from moejax.plan import forecast as forecast_lib
from moejax.plan import memory_fit, search
from moejax.plan.verify import PREFILL_TOKENS
from moejax.quant import formats
from moejax.replay import stack_curve
from moejax.results import write_json_atomic

OBJECTIVES = ("decode", "ttft", "mix")
WORKLOAD_FILE = "plan_workload.npz"  # the synthetic workload, when one is drawn
SYNTHETIC_PASSES = 512


# -- the config ---------------------------------------------------------------------------
def _number(value, field: str, low: float, high: float = math.inf, *, integer=False,
            low_open=False) -> None:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and (isinstance(value, int) or not integer) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        kind = "an integer" if integer else "a number"
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        upper = "" if high == math.inf else f" and <= {high:g}"
        raise ConfigError(f"plan.{field}={value!r} must be {kind} {bound}{upper}")


def validate(config: ml_collections.ConfigDict) -> None:
    """The plan's own fields and its model, before anything loads (`moejax.jobs.check`)."""
    p, m = config.plan, config.model
    _number(p.device_gb, "device_gb", 0, low_open=True)
    if p.budget_of not in memory_fit.BUDGETS_OF:
        raise ConfigError(f"plan.budget_of={p.budget_of!r} is not one of "
                          f"{memory_fit.BUDGETS_OF}")
    _number(p.context, "context", 1, integer=True)
    _number(p.host_gb, "host_gb", 0)
    _number(p.decode_weight, "decode_weight", 0, 1)
    _number(p.keep, "keep", 1, integer=True)
    _number(p.tolerance, "tolerance", 0, 0.5)
    _number(p.verify_tokens, "verify_tokens", 2, integer=True)
    _number(p.verify_reps, "verify_reps", 1, integer=True)
    for field in ("disk", "lossless", "verify"):
        if not isinstance(p[field], bool):
            raise ConfigError(f"plan.{field}={p[field]!r} must be True or False")
    if p.min_precision not in formats.PRECISIONS:
        raise ConfigError(f"plan.min_precision={p.min_precision!r} is not one of "
                          f"{formats.PRECISIONS}")
    if p.objective not in OBJECTIVES:
        raise ConfigError(f"plan.objective={p.objective!r} is not one of {OBJECTIVES}")
    given = [f for f, v in (("model.hf_config", m.hf_config), ("model.checkpoint", m.checkpoint),
                            ("model.preset", m.preset not in ("", "embedded"))) if v]
    if not given:
        raise ConfigError("the plan needs a model: --config.model.hf_config=PATH/config.json, "
                          "--config.model.checkpoint=DIR (converted), or "
                          "--config.model.family=F --config.model.preset=P")
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} both name the model: give one")
    if m.checkpoint:
        from moejax.checkpoint import hugging_face_message, is_hugging_face_dir

        if not os.path.isdir(m.checkpoint):
            raise ConfigError(f"model.checkpoint={m.checkpoint!r} is not a directory")
        if is_hugging_face_dir(m.checkpoint):
            raise ConfigError(f"model.checkpoint={hugging_face_message(m.checkpoint)}; the plan "
                              "reads its config.json alone as model.hf_config")
    _precisions(config)  # (a precision given that the constraints forbid)
    if m.hf_config:
        _read_hf(m.hf_config)
        if p.verify:
            raise ConfigError("plan.verify runs the model live, and model.hf_config has no "
                              "weights: plan with model.family / model.preset (drawn at "
                              "model.width) or a converted model.checkpoint to verify")


def _read_hf(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"model.hf_config={path!r} is not a file (a Hugging Face config.json)")
    try:
        with open(path) as f:
            hf = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.hf_config={path!r} is not JSON: {e}") from e
    if not isinstance(hf, dict) or "model_type" not in hf:
        raise ConfigError(f"model.hf_config={path!r} has no model_type: not a Hugging Face "
                          "config.json")
    family_for_hf(hf)  # (a ConfigError naming the families moejax knows)
    return hf


def model_of(config: ml_collections.ConfigDict) -> tuple[ModelConfig, str]:
    """The model config and where it came from."""
    m = config.model
    if m.hf_config:
        hf = _read_hf(m.hf_config)
        if m.width:
            hf = at_width(hf, m.width)
        at = f" at width {m.width}" if m.width else ""
        return config_from_hf(hf), f"Hugging Face config {m.hf_config}{at} (no weights)"
    if m.checkpoint:
        from moejax.checkpoint import read_config

        return read_config(m.checkpoint), f"checkpoint {m.checkpoint}"
    at = f" at width {m.width}" if m.width else ""
    return preset(m.family, m.preset, m.width), f"preset {m.family}/{m.preset}{at}"


# -- the workload ---------------------------------------------------------------------------
def workload(config: ml_collections.ConfigDict, cfg: ModelConfig, workdir: str
             ) -> tuple[list[str], str, str]:
    """The trace files the plan replays, what they are (`kind`: "trace", "captures" or
    "synthetic") and a label for every output."""
    if config.replay.trace:
        return [config.replay.trace], "trace", f"the trace {config.replay.trace}"
    shape = (cfg.num_moe_layers, cfg.num_experts, cfg.top_k)
    captures = []
    for name in bundled.CAPTURE_NAMES:
        family, name_of = bundled.CAPTURE_MODELS[name.split("_")[0]]
        of = preset(family, name_of)
        if family == cfg.family and (of.num_moe_layers, of.num_experts, of.top_k) == shape:
            captures.append(name)
    if captures:
        return ([bundled.capture_path(n) for n in captures], "captures",
                f"no trace given: the shipped captures of {cfg.family} ({', '.join(captures)}), "
                "not this workload's routing")
    from moejax.traces import random_scored_trace

    path = os.path.join(workdir, WORKLOAD_FILE)
    trace = random_scored_trace(np.random.default_rng(config.seed), cfg.num_moe_layers,
                                cfg.num_experts, cfg.top_k, [1] * SYNTHETIC_PASSES,
                                cfg.expert_bytes, scores=False, prefill_passes=0,
                                layer_ids=list(cfg.moe_layers))
    trace.save(path)
    return [path], "synthetic", (
        f"no trace given and no capture of {cfg.family} ships: SYNTHETIC routing "
        f"({SYNTHETIC_PASSES} decode passes, each token's experts drawn independently, seed "
        f"{config.seed}), a worst case for any cache, not a model's routing")


# -- the search -----------------------------------------------------------------------------
def _precisions(config) -> list[str]:
    """The precisions the constraints allow, high to low: native only when lossless, else
    down to the floor; of a checkpoint, those it has; `cache.precision` given, that one (it
    must be allowed)."""
    p = config.plan
    floor = 0 if p.lossless else formats.PRECISIONS.index(p.min_precision)
    allowed = list(formats.PRECISIONS[:floor + 1])
    if config.model.checkpoint:
        from moejax.checkpoint import read_precisions

        has = {"native", *read_precisions(config.model.checkpoint)}
        allowed = [q for q in allowed if q in has]
    given = config.cache.precision
    if given:
        if given not in allowed:
            why = ("plan.lossless=True allows native only" if p.lossless else
                   f"the floor plan.min_precision={p.min_precision!r} and the model allow "
                   f"{allowed}")
            raise ConfigError(f"cache.precision={given!r} holds the search to a precision "
                              f"the plan may not use: {why}")
        return [given]
    return allowed


def fits_of(config, cfg: ModelConfig) -> dict[str, memory_fit.Fit]:
    p = config.plan
    return {q: memory_fit.fit(cfg, p.device_gb, p.context, q,
                              group_size=config.cache.group_size, budget_of=p.budget_of)
            for q in _precisions(config)}


def _held(config) -> dict:
    """The searched fields the user gave (away from the declared defaults)."""
    from moejax.jobs.declared import field_value
    from moejax.jobs.schema import declared_defaults

    schema = declared_defaults()
    return {f: field_value(config, f) for f in search.HELD
            if field_value(config, f) != field_value(schema, f)}


def _host_bounds(config, cfg: ModelConfig, fits: dict[str, memory_fit.Fit]
                 ) -> tuple[dict[str, int], dict[str, str]]:
    """Per precision, the host tier's bound (0: host memory holds every expert at it, the
    plain precision the host keeps), and the precisions refused (host memory too small and no
    disk tier allowed) with why."""
    p = config.plan
    have = int(p.host_gb * memory_fit.GB)
    bounds, refused = {}, {}
    for q, f in fits.items():
        need = cfg.num_experts * cfg.num_moe_layers * f.expert_bytes
        if not p.host_gb or have >= need:
            bounds[q] = 0
        elif p.disk:
            bounds[q] = have
        else:
            refused[q] = (f"plan.host_gb={p.host_gb:g} holds {memory_fit.size_text(have)} of "
                          f"the experts' {memory_fit.size_text(need)} at {q}, and "
                          "plan.disk=False")
    return bounds, refused


def _score(pred: dict, objective: str, weight: float, best: dict) -> float:
    """Higher is better: decode tok/s, 1/TTFT, or the weighted mix of both relative to the
    best of each among the candidates (`best`)."""
    d, t = pred.get("decode_tok_per_s"), pred.get("ttft_s")
    if objective == "decode":
        return d or 0.0
    if objective == "ttft":
        return 1.0 / t if t else 0.0
    return (weight * (d / best["decode"] if d and best["decode"] else 0.0)
            + (1 - weight) * (best["ttft"] / t if t and best["ttft"] else 0.0))


def _bests(rows: list[dict]) -> dict:
    decodes = [r["predicted"]["decode_tok_per_s"] for r in rows
               if r["predicted"].get("decode_tok_per_s")]
    ttfts = [r["predicted"]["ttft_s"] for r in rows if r["predicted"].get("ttft_s")]
    return {"decode": max(decodes, default=None), "ttft": min(ttfts, default=None)}


@dataclasses.dataclass
class Planning:
    """What a plan searches: the model, the workload, the fit, the space, and the forecaster
    that replays a candidate (`prepare`)."""

    cfg: ModelConfig
    model_words: str
    paths: list[str]
    kind: str
    label: str
    fits: dict[str, memory_fit.Fit]
    refused: dict[str, str]  # precisions host memory cannot hold (no disk tier), and why
    base: ml_collections.ConfigDict  # the replay config every forecast starts from
    validation: forecast_lib.Validation | None
    forecaster: forecast_lib.Forecaster
    space: search.Space
    knees: dict[str, int]


def prepare(config: ml_collections.ConfigDict, workdir: str) -> Planning:
    """The model, the workload (a synthetic one written into `workdir`), the fit and the
    search space of `config`'s plan, nothing replayed yet but the capacity curve."""
    cfg, model_words = model_of(config)
    paths, kind, label = workload(config, cfg, workdir)
    fits = fits_of(config, cfg)
    host_bytes, refused = _host_bounds(config, cfg, fits)
    base = ml_collections.ConfigDict(config.to_dict())
    base.job, base.clock.kind = "replay", "virtual"
    base.log.progress = base.log.tensorboard = False
    base.model.hf_config = base.model.checkpoint = ""
    base.model.preset, base.model.width = "", 0
    base.policies.preset = ""
    base.cache.min_slots = 0
    validation = forecast_lib.validation_of(config.hardware.file)
    forecaster = forecast_lib.Forecaster(base, paths, cfg, validation)
    first = forecaster.loaded(search.candidate("native", cfg.top_k), paths[0])
    rp = config.replay
    if not any(t.prefill_passes for t in first.traces) and not (rp.request_tokens
                                                               or rp.prefill_tokens):
        # A decode-only capture has no TTFT: its first rows become one prefill, as in the
        # live check (`verify.PREFILL_TOKENS`), and every output says so.
        base.replay.prefill_tokens = PREFILL_TOKENS
        label += (f"; it has no prefill pass, so its first {PREFILL_TOKENS} rows are replayed "
                  f"as one (replay.prefill_tokens={PREFILL_TOKENS}) for a TTFT")
        first = forecaster.loaded(search.candidate("native", cfg.top_k), paths[0])
    has_scores = first.first.spec is not None
    sizes, knees = {}, {}
    feasible = {q: f for q, f in fits.items() if f.fits and q not in refused}
    if feasible:
        requests = stack_curve.requests_of(first.traces, cfg.num_experts)
        curve = stack_curve.global_counts(requests, first.spec.cache.pin_scope)
        for q, f in feasible.items():
            top = f.slots
            sizes[q] = [top]
            if top > requests.widest:  # (below the widest pass-layer the rule does not hold)
                low = max(cfg.top_k, requests.widest)
                knees[q] = search.knee({c: curve.at(c)["hits"] for c in range(low, top + 1)},
                                       top)
                if knees[q] != top:
                    sizes[q].append(knees[q])
    allowed = {q: f for q, f in fits.items() if q not in refused}
    space = search.Space(sizes, _cascades(config, cfg, allowed, has_scores), has_scores,
                         cfg.num_moe_layers, _held(config), host_bytes)
    return Planning(cfg, model_words, paths, kind, label, fits, refused, base, validation,
                    forecaster, space, knees)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    p = config.plan
    t_start = time.perf_counter()
    plan = prepare(config, workdir)
    cfg, paths, fits, base = plan.cfg, plan.paths, plan.fits, plan.base
    validation, forecaster, space = plan.validation, plan.forecaster, plan.space
    sizes, knees = space.sizes, plan.knees
    results = {"model": plan.model_words,
               "workload": {"kind": plan.kind, "traces": paths, "label": plan.label},
               "fit": {q: f.to_dict() for q, f in fits.items()},
               "objective": p.objective, "candidates": [], "recommended": None,
               "default": None, "verified": None}
    rows: list[dict] = []
    if sizes:
        rows = _search(config, space, forecaster)
    results["candidates"] = rows
    results["sizes"] = {"per_precision": sizes, "knee": knees, "knee_rule": (
        f"the fewest slots keeping {search.KNEE:.0%} of the hits the budget's size gets, on "
        "the LRU capacity curve of the first trace (stack distances, exact)")}
    best = _bests(rows)
    for r in rows:
        r["score"] = _score(r["predicted"], p.objective, p.decode_weight, best)
    ranked = sorted((r for r in rows if r["predicted"].get("decode_tok_per_s")),
                    key=lambda r: -r["score"])
    for i, r in enumerate(ranked):
        r["rank"] = i + 1
    if ranked:
        rec = recommend(ranked, p.tolerance, validation is not None)
        results["recommended"] = {
            "overrides": rec["overrides"], "predicted": _predicted(rec["predicted"]),
            "device_bytes": rec["predicted"]["device_bytes"], "rank": rec["rank"],
            "stage": rec["stage"], "command": command_line(config, cfg, rec["overrides"]),
            "replay_command": replay_command(config, cfg, rec["overrides"], paths[0],
                                             base.replay)}
        default = next((r for r in rows if r["stage"] == "default"), None)
        if default is not None:
            results["default"] = {"overrides": default["overrides"],
                                  "predicted": _predicted(default["predicted"]),
                                  "device_bytes": default["predicted"]["device_bytes"]}
    results["host_refused"] = plan.refused
    results["why_nothing"] = None if sizes else _why_nothing(fits, plan.refused)
    results["band_basis"] = (validation.words() if validation else
                             "none: the hardware profile was never validated (a preset, or a "
                             "hardware.json without `validation`: python -m "
                             "moejax.calibration.validate)")
    timings = {"clock": "wall", "plan_s": time.perf_counter() - t_start,
               "replays": forecaster.replays}
    doc = {"job": "plan", "plan": results, "timings": timings, "config": config.to_dict()}
    path = os.path.join(workdir, "results.json")
    # Written before the live check too: an interrupted check leaves the plan.
    write_json_atomic(path, doc)
    _print(config, results, timings, fits, ranked)
    if p.verify and results["recommended"]:
        from moejax.plan import verify as verify_lib

        results["verified"] = verify_lib.verify(config, results["recommended"]["overrides"],
                                                paths[0], validation)
        timings["plan_and_verify_s"] = time.perf_counter() - t_start
        write_json_atomic(path, doc)
        print(results["verified"]["line"])
    announce_results(path)
    return doc


def _cascades(config, cfg, fits, has_scores) -> list[tuple[str, str, float]]:
    """(high, low, capacity_frac) of the precision cascades to try: a trace with router
    scores, two precisions the constraints allow, the budget's bytes split between them."""
    if not has_scores:
        return []
    allowed = [q for q in formats.PRECISIONS if q in fits]
    budget = next(iter(fits.values())).free_bytes
    all_native = cfg.num_experts * cfg.num_moe_layers * cfg.expert_bytes
    frac = min(1.0, budget / all_native)
    out = []
    for high, low in zip(allowed, allowed[1:]):
        if fits[low].fits and fits[high].slots >= cfg.top_k:
            out.append((high, low, frac))
    return out


def _search(config, space: search.Space, forecaster) -> list[dict]:
    """The stages of `moejax/plan/search.py`, each candidate forecast once, with a progress
    line per stage."""
    p = config.plan
    rows: list[dict] = []
    seen: set = set()

    def run_stage(stage: str, candidates: list[dict]) -> None:
        todo = [c for c in search.unique(candidates)
                if tuple(sorted((k, str(v)) for k, v in c.items())) not in seen]
        t0 = time.perf_counter()
        with progress(config.log.progress, len(todo), f"plan: {stage}", unit="cand") as bar:
            for c in todo:
                seen.add(tuple(sorted((k, str(v)) for k, v in c.items())))
                pred = forecaster.forecast(c)
                rows.append({"stage": stage, "overrides": c, "predicted": pred})
                if bar is not None:
                    bar.update(1)
        if config.log.progress:
            print(f"plan: stage {stage}: {len(todo)} candidates forecast in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)

    def kept() -> list[dict]:
        ok = [r for r in rows if r["predicted"].get("decode_tok_per_s")]
        best = _bests(ok)
        ok.sort(key=lambda r: -_score(r["predicted"], p.objective, p.decode_weight, best))
        return [r["overrides"] for r in ok[:p.keep]]

    default = search.default_candidate(space)
    if default is not None:
        run_stage("default", [{**default, **space.held}])
    run_stage("sizes", search.stage_sizes(space))
    run_stage("eviction", search.stage_eviction(space, kept()))
    run_stage("prefetch", search.stage_prefetch(space, kept()))
    run_stage("miss", search.stage_miss(space, kept()))
    return rows


def recommend(ranked: list[dict], tolerance: float, validated: bool) -> dict:
    """The best by the objective, or among those within `tolerance` of it the one taking the
    fewest device bytes (then the better score). With a validated profile, among the
    candidates whose forecast has a band (the validated conditions), where any has one: a
    forecast that cannot be checked is ranked, not recommended."""
    if validated and any(r["predicted"].get("band") for r in ranked):
        ranked = [r for r in ranked if r["predicted"].get("band")]
    top = ranked[0]["score"]
    near = [r for r in ranked if r["score"] >= (1 - tolerance) * top]
    return min(near, key=lambda r: (r["predicted"]["device_bytes"], -r["score"]))


def _predicted(pred: dict) -> dict:
    return {"ttft_s": pred.get("ttft_s"), "decode_tok_per_s": pred.get("decode_tok_per_s"),
            "band": pred.get("band"), "ttft_band": pred.get("ttft_band"),
            "band_basis": pred.get("band_basis"), "hit_rate": pred.get("hit_rate"),
            "h2d_bytes": pred.get("h2d_bytes")}


def _why_nothing(fits: dict[str, memory_fit.Fit], refused: dict[str, str]) -> str:
    """Why no precision is left: the device budget's shortfall (the least of them), else the
    host's."""
    short = [f for f in fits.values() if not f.fits]
    if short:
        least = min(short, key=lambda f: f.shortfall_bytes)
        if len(short) == len(fits):
            return f"does not fit: {least.line()}"
    return "; ".join([f"does not fit: {f.line()}" for f in short]
                     + [f"not without a disk tier: {why}" for why in refused.values()])




def _flags(*pairs: tuple[str, object]) -> list[str]:
    """`--config.FIELD=VALUE` for each pair, quoted for a shell (`cli.config_flag`)."""
    return [cli.config_flag(field, value) for field, value in pairs]


def _preset_flags(config, cfg: ModelConfig) -> list[str] | None:
    """The model as family / preset flags: the config's, or the preset a Hugging Face config
    is (None: it is none of them)."""
    m = config.model
    if m.checkpoint:
        return None
    if not m.hf_config:
        return _flags(("model.family", m.family), ("model.preset", m.preset),
                      *((("model.width", m.width),) if m.width else ()))
    family = get_family(cfg.family)
    for name in family.presets:
        if name != "tiny" and preset(cfg.family, name, m.width) == cfg:
            return _flags(("model.family", cfg.family), ("model.preset", name),
                          *((("model.width", m.width),) if m.width else ()))
    return None


def _model_flags(config, cfg: ModelConfig) -> list[str]:
    m = config.model
    if m.checkpoint:
        return _flags(("model.checkpoint", m.checkpoint))
    if m.hf_config:  # (no weights: the run needs them converted)
        return _flags(("model.checkpoint", "CONVERTED"))
    return _preset_flags(config, cfg)


def _machine_flags(config) -> list[str]:
    h = config.hardware
    return _flags(("hardware.file", h.file) if h.file else ("hardware.preset", h.preset))


def _given(overrides: dict) -> list[str]:
    """The flags of the overrides that differ from the declared defaults."""
    from moejax.jobs.declared import field_value
    from moejax.jobs.schema import declared_defaults

    schema = declared_defaults()
    return _flags(*((k, v) for k, v in overrides.items() if field_value(schema, k) != v))


def command_line(config, cfg: ModelConfig, overrides: dict) -> str:
    """The recommended configuration as a generate run (the model's own routing)."""
    return " ".join(["python -m moejax.main --config=configs/default.py",
                     *_model_flags(config, cfg), *_machine_flags(config), *_given(overrides)])


def replay_command(config, cfg: ModelConfig, overrides: dict, path: str, rp) -> str | None:
    """The replay that reproduces the forecast on the first trace (None: the replay job cannot
    name this model, one of no preset)."""
    model = _preset_flags(config, cfg)
    if model is None:
        return None
    return " ".join(["python -m moejax.main --config=configs/replay.py",
                     *_flags(("replay.trace", path)), *model, *_machine_flags(config),
                     *_replay_flags(rp), *_given(overrides)])


def _replay_flags(rp) -> list[str]:
    return _flags(*((f"replay.{k}", rp[k]) for k in ("request_tokens", "prefill_tokens")
                    if rp[k]))


# -- printing -------------------------------------------------------------------------------
def _rate(x):
    return "-" if x is None else f"{x:,.1f}"


def _ms(x):
    return "-" if x is None else f"{1e3 * x:,.2f}"


def _band(b):
    return "-" if not b else f"{b[0]:,.1f}-{b[1]:,.1f}"


def describe(o: dict) -> str:
    """A candidate in a few words."""
    size = (f"{o['cache.slots']} slots" if o.get("cache.slots")
            else f"{o['cache.capacity_frac']:.1%} of the experts' bytes")
    parts = [f"{o['cache.precision']} {size}", o["policies.eviction"]]
    if o["policies.prefetch"] != "none":
        parts.append(f"{o['policies.prefetch']}/{o['cache.prefetch_queue']}")
    if o["policies.miss"] != "fetch":
        parts.append(o["policies.miss"])
    if o.get("cache.host_compute_layers"):
        parts.append(f"host_compute_layers={o['cache.host_compute_layers']}")
    if o.get("cache.host_bytes"):
        parts.append(f"disk tier, host {memory_fit.size_text(o['cache.host_bytes'])}")
    return ", ".join(parts)


def _print(config, results: dict, timings: dict, fits: dict, ranked: list[dict],
           top: int = 15) -> None:
    p = config.plan
    print(f"plan for {results['model']} on "
          f"{config.hardware.file or 'the preset ' + config.hardware.preset}; workload: "
          f"{results['workload']['label']}")
    what = ("the expert slots' budget" if p.budget_of == "experts" else "the whole device")
    print(f"memory fit (plan.device_gb={p.device_gb:g}: {what}; context {p.context:,} tokens):")
    for f in fits.values():
        print(f"  {f.line()}")
    for q, why in results["host_refused"].items():
        print(f"  {q}: not planned, host memory is short: {why}")
    if results["why_nothing"]:
        print(f"nothing to recommend: {results['why_nothing']}")
        return
    print(f"{len(results['candidates'])} candidates forecast on the virtual clock "
          f"({timings['replays']} replays, {timings['plan_s']:.1f} s, {timings['clock']} clock); "
          f"band: {results['band_basis']}; ranked by {p.objective}; device: the expert "
          "slots' bytes, host: the experts host memory holds, H2D: bytes moved to the device:")
    print(f"{'rank':>4} {'decode tok/s':>12} {'band':>17} {'TTFT ms':>9} {'hit':>6} "
          f"{'device':>10} {'host':>10} {'H2D':>10} {'stage':>8}  configuration")
    for r in ranked[:top]:
        f = r["predicted"]
        print(f"{r['rank']:>4} {_rate(f['decode_tok_per_s']):>12} {_band(f['band']):>17} "
              f"{_ms(f['ttft_s']):>9} {100 * f['hit_rate']:>5.1f}% "
              f"{memory_fit.size_text(f['device_bytes']):>10} "
              f"{memory_fit.size_text(f['host_bytes']):>10} "
              f"{memory_fit.size_text(int(f['h2d_bytes'])):>10} {r['stage']:>8}  "
              f"{describe(r['overrides'])}")
    if len(ranked) > top:
        print(f"  ... {len(ranked) - top} more in results.json (plan.candidates)")
    failed = [r for r in results["candidates"] if "error" in r["predicted"]]
    for r in failed:
        print(f"  not run: {describe(r['overrides'])}: {r['predicted']['error']}")
    rec, default = results["recommended"], results["default"]
    pr = rec["predicted"]
    print(f"recommended (rank {rec['rank']}): decode {_rate(pr['decode_tok_per_s'])} tok/s "
          f"(band {_band(pr['band'])}), TTFT {_ms(pr['ttft_s'])} ms, expert slots "
          f"{memory_fit.size_text(rec['device_bytes'])}")
    unbanded = [r for r in ranked[:rec["rank"] - 1] if not r["predicted"].get("band")]
    if pr.get("band") and unbanded:
        fastest = unbanded[0]
        print(f"  ranked above it without a band, so not recommended: {len(unbanded)}, the "
              f"fastest {describe(fastest['overrides'])} at "
              f"{_rate(fastest['predicted']['decode_tok_per_s'])} tok/s "
              f"({fastest['predicted']['band_basis']})")
    if default is not None:
        d = default["predicted"]
        eligible = d.get("band") or not pr.get("band")  # (`recommend`'s rule)
        why = ("structural: the default is one of the candidates the recommendation is chosen "
               "from, so it is never slower on this clock" if eligible else
               f"the default has no band ({d['band_basis']}), so it was not one the "
               "recommendation was chosen from")
        print(f"the default configuration ({describe(default['overrides'])}): decode "
              f"{_rate(d['decode_tok_per_s'])} tok/s, TTFT {_ms(d['ttft_s'])} ms ({why})")
    print(f"run it:\n  {rec['command']}")
    if config.model.hf_config:
        print(f"  (CONVERTED: the model's weights converted first, python -m moejax.convert; the "
              f"plan read only {config.model.hf_config})")
    if rec["replay_command"]:
        print(f"reproduce its forecast:\n  {rec['replay_command']}")
