"""The plan's check (`plan.verify`): the recommended configuration run live, and its measured
decode rate against the band of the virtual clock's forecast of that same run.

The live run is the clock validation's (`moejax.calibration.cells`): the generate job in
process, driven by the workload's first trace (`policies.routing='trace(path=T)'`, its first
16 rows one prefill, `plan.verify_tokens` tokens) on the model at `model.width` (random
experts drawn: timing does not depend on their values; at full size on a GPU with width 0),
on the wall clock with the profile's transfers held to its bandwidth, `plan.verify_reps` runs
and their median. Its forecast is the virtual clock's replay of the run's own routing through
a fresh cache of the same settings (`results.json`'s `clocks.virtual`): the run the plan
forecast over the whole trace is longer, so the check compares like with like and reports the
plan's whole-trace forecast beside it. A miss is printed as a miss.
"""

from __future__ import annotations

import ml_collections

from moejax.plan.forecast import band_of, unvalidated_parts

PREFILL_TOKENS = 16  # the trace's first rows, one prefill (the clock validation's cells')


def live_config(config: ml_collections.ConfigDict, overrides: dict, trace_path: str
                ) -> ml_collections.ConfigDict:
    """The generate run of the recommendation, trace-driven, on the wall clock."""
    from moejax.jobs.schema import base_config

    c = base_config()
    c.log.progress = c.log.tensorboard = False
    for section in ("hardware", "host", "storage", "io"):
        c[section] = ml_collections.ConfigDict(config[section].to_dict())
    m = config.model
    if m.checkpoint:
        c.model.checkpoint = m.checkpoint
    else:
        c.model.family, c.model.preset, c.model.width = m.family, m.preset, m.width
    c.cache.pin_scope = config.cache.pin_scope
    for field, value in overrides.items():
        section, name = field.split(".")
        c[section][name] = value
    c.policies.routing = f"trace(path={trace_path!r})"
    c.replay.prefill_tokens = PREFILL_TOKENS
    c.run.max_new_tokens = config.plan.verify_tokens
    c.clock.kind = "wall"
    return c


def verify(config: ml_collections.ConfigDict, overrides: dict, trace_path: str,
           validation) -> dict:
    """`plan.verified`: the measured decode against the forecast of the same run and its band."""
    from moejax.calibration.cells import Cell, Entry, drawn_model, run_entries
    from moejax.jobs.specs import resolve
    from moejax.model_source import load_model_for

    c = live_config(config, overrides, trace_path)
    m = config.model
    loaded = (load_model_for(resolve(c)) if m.checkpoint
              else drawn_model(m.family, m.preset, m.width, config.seed))
    cell = Cell(0.0, overrides["policies.prefetch"], settings=tuple(overrides.items()))
    reps = config.plan.verify_reps
    print(f"plan: verifying the recommendation live: {reps} runs of "
          f"{config.plan.verify_tokens} tokens driven by {trace_path} ...", flush=True)
    (row,) = run_entries([Entry(cell, c, loaded, "plan")], reps)
    measured = row["wall"]["decode_tok_per_s"]
    forecast = row["virtual"]["decode_tok_per_s"]
    off = unvalidated_parts(overrides, int(overrides.get("cache.host_bytes", 0) or 0))
    if validation is not None:
        off += validation.outside(overrides)
    band = None if (validation is None or off) else band_of(forecast,
                                                            validation.errors("decode"), True)
    within = inside(measured, band)
    at = f"at width {m.width}" if m.width else "at the model's size"
    head = (f"verified live ({reps} runs of {config.plan.verify_tokens} tokens, trace-driven "
            f"{at}, {row['hardware']}): decode {_rate(measured)} tok/s measured, "
            f"{_rate(forecast)} forecast for that run")
    if band is None:
        why = ("the profile was never validated" if validation is None
               else f"outside the validated conditions: {'; '.join(off)}")
        line = f"{head}; no band ({why})"
    else:
        verdict = "within the band" if within else "MISSED the band"
        line = f"{head}, band {band[0]:,.1f}-{band[1]:,.1f}: {verdict}"
    return {"decode_tok_per_s": measured, "predicted_decode_tok_per_s": forecast,
            "band": band, "within_band": within,
            "ttft_s": row["wall"]["ttft_s"], "predicted_ttft_s": row["virtual"]["ttft_s"],
            "decode_error": row["decode_error"], "runs": row["wall"]["runs"],
            "tokens": config.plan.verify_tokens, "trace": trace_path,
            "what": row["wall"]["what"], "line": line}


def inside(measured: float | None, band: list[float] | None) -> bool | None:
    """Whether the measured rate lies in the band, both ends included (None: no band, or
    nothing measured)."""
    if band is None or measured is None:
        return None
    return band[0] <= measured <= band[1]


def _rate(x):
    return "-" if x is None else f"{x:,.1f}"
