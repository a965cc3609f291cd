"""The host's scalar terms (`moejax.timing.host_work.TERMS`) fitted to live runs: each run's
passes timed on the wall clock, next to the virtual clock's model of the same passes
(`moejax.cache.runtime_timing`: the run's routing replayed on the calibrated profile), whose
every charge of a term is counted per pass (`RuntimeTiming.pass_counts`).

A pass's modelled time is `rest + sum_k count_k * term_k`, where `rest` is everything else it
charges (the measured steps, the transfers' stalls): linear in the terms while the host is the
longer of the two timelines and no stall shrinks. `fit` solves that by non-negative least
squares over every pass (`fit.fit_terms`, relative errors), replays with the terms found, and
solves again until they settle (a stall that the host's work now overlaps is what moves
`rest`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections

from moejax.calibration import fit as fit_lib
from moejax.jobs import clocks
from moejax.jobs.specs import resolve
from moejax.model_source import LoadedModel
from moejax.results import write_json_atomic
from moejax.traces import Trace

# The terms fitted to live passes (every one of `host_work.TERMS`).
FITTED = ("pass_s", "round_trip_s", "speculative_layer_s", "request_s", "load_s",
          "load_batch_s", "prefetch_s")


@dataclasses.dataclass
class Sample:
    """One live cell: its config as it ran (wall clock), its model, its routing request by
    request, whether a trace drove it, and each pass's wall time in replay order (each
    request's prefill, then its decode passes; the median over the cell's runs)."""

    name: str
    config: ml_collections.ConfigDict
    loaded: LoadedModel
    traces: list[Trace]
    specs: dict[str, str]
    driven: bool
    wall_passes: list[float]


def predict(sample: Sample, hardware_file: str, host_work: bool = True
            ) -> tuple[list[float], list[dict[str, int]]]:
    """The virtual clock's time of each of `sample`'s passes on the profile in `hardware_file`
    (with its host work; `host_work=False`: the device-only model), and the terms each charged
    ([] without the host's work)."""
    c = ml_collections.ConfigDict(sample.config.to_dict())
    c.hardware.file = hardware_file
    c.clock.host_work = host_work
    cache = clocks.replay_run(clocks.virtual_run(resolve(c)), sample.loaded.cfg, sample.loaded.precision_bytes(),
                              sample.traces, sample.specs, driven=sample.driven)
    if host_work and cache.timing is None:
        raise ValueError(f"{hardware_file} has no host_work section to fit")
    passes = [p.end_s - p.start_s for p in cache.metrics.passes]
    return passes, cache.timing.pass_counts if cache.timing is not None else []


def fit(samples: list[Sample], doc: dict, path: str, iterations: int = 8,
        tolerance: float = 0.005) -> tuple[dict, list[dict]]:
    """The terms of `FITTED` for the hardware.json document `doc` (its `host_work` section
    holding the step tables), fitted to `samples`: each round writes `doc` with the terms so
    far to `path`, replays every sample on it and solves `fit.fit_terms`; it stops when no
    term moves by more than `tolerance` of the largest. Returns the section's fit record
    (`TermsFit` and what it was fitted to) and the rounds."""
    terms = dict.fromkeys(FITTED, 0.0)
    rounds = []
    for _ in range(iterations):
        _write(doc, terms, path)
        counts, rest, measured = [], [], []
        for s in samples:
            predicted, charged = predict(s, path)
            if len(predicted) != len(s.wall_passes):
                raise ValueError(f"{s.name}: {len(s.wall_passes)} live passes, "
                                 f"{len(predicted)} replayed")
            for group in _groups(s):
                row = [sum(charged[i][k] for i in group) for k in FITTED]
                counts.append(row)
                rest.append(sum(predicted[i] for i in group)
                            - sum(c * terms[k] for c, k in zip(row, FITTED)))
                measured.append(sum(s.wall_passes[i] for i in group))
        got = fit_lib.fit_terms(FITTED, counts, rest, measured)
        rounds.append(got.to_dict())
        scale = max(max(got.terms.values()), 1e-12)
        moved = max(abs(got.terms[k] - terms[k]) for k in FITTED) / scale
        terms = got.terms
        if moved <= tolerance:
            break
    _write(doc, terms, path)
    record = {**rounds[-1], "cells": [s.name for s in samples],
              "what": ("seconds per charge of each term, non-negative least squares over every "
                       "live pass of the cells (relative errors), the model replayed with the "
                       "terms until they settle; residuals of the last round")}
    return record, rounds


# A request's decode passes are fitted in this many groups of consecutive passes: a group's
# summed time is far less noisy than one pass's, and the prefill (one pass, the TTFT) keeps a
# weight of the order of the decode time's.
DECODE_GROUPS = 4


def _groups(sample: Sample) -> list[list[int]]:
    """The fit's rows of `sample`: each request's prefill pass alone, then its decode passes
    in `DECODE_GROUPS` consecutive groups (indices into its passes)."""
    out, start = [], 0
    for trace in sample.traces:
        n = trace.num_passes
        out.append([start])
        decode = list(range(start + 1, start + n))
        size = -(-len(decode) // DECODE_GROUPS) if decode else 0
        out += [decode[i:i + size] for i in range(0, len(decode), size)] if size else []
        start += n
    return out


def _write(doc: dict, terms: dict, path: str) -> None:
    doc["host_work"].update(terms)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(path, json.loads(json.dumps(doc)))


def figures(sample: Sample, predicted: list[float]) -> dict:
    """A run's TTFT (its first request's prefill, cold) and decode time from its passes'
    times, as `CacheMetrics.timing` counts them."""
    ttft, decode, tokens, i = None, 0.0, 0, 0
    for trace in sample.traces:
        if ttft is None:
            ttft = predicted[i]
        decode += sum(predicted[i + 1:i + trace.num_passes])
        tokens += trace.num_passes - 1
        i += trace.num_passes
    return {"ttft_s": ttft, "decode_s": decode, "decode_tokens": tokens,
            "decode_tok_per_s": tokens / decode if decode else None}


def repredicted(row: dict, sample: Sample, hardware_file: str) -> dict:
    """`row` (`cells.run_entries`') with its virtual figures and errors from the profile in
    `hardware_file` now (the host's terms as fitted)."""
    got = figures(sample, predict(sample, hardware_file)[0])
    virtual = {**row["virtual"], **got}
    wall = row["wall"]
    return {**row, "virtual": virtual,
            "ttft_error": fit_lib.relative_error(got["ttft_s"], wall["ttft_s"]),
            "decode_error": fit_lib.relative_error(got["decode_s"], wall["decode_s"]),
            "larger": {k: None if wall[f"{k}_s"] is None else (
                "equal" if got[f"{k}_s"] == wall[f"{k}_s"] else
                "virtual" if got[f"{k}_s"] > wall[f"{k}_s"] else "wall")
                for k in ("ttft", "decode")}}


def table(record: dict) -> str:
    """The fitted terms, printed with what each is and how well they fit."""
    from moejax.timing import TERMS

    lines = [f"the host's work, fitted to {len(record['cells'])} cells' passes "
             f"({record['points']} rows: each prefill, decode passes in {DECODE_GROUPS} "
             f"groups): residual rms {100 * record['rms_rel']:.1f}%, max "
             f"{100 * record['max_rel']:.1f}%"]
    for k, v in record["terms"].items():
        said = "" if record["determined"][k] else (
            "  (not determined by these cells: no charge, or charged only with others)")
        lines.append(f"  {k:20s} {1e6 * v:8.1f} us  {TERMS[k]}{said}")
    return "\n".join(lines)
