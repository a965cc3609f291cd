"""The plan job (`moejax/jobs/plan.py`, `moejax/plan/`): its recommendation is a replay of its
own overrides, fits the budget and is never slower than the default on its clock; a model
from a Hugging Face config.json plans without weights on a labelled synthetic workload; the
band is the validation's and holds where it says; a budget that holds nothing says by how
much; a searched field given holds the search; bad input is one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled
from moejax.errors import ConfigError
from moejax.families import get_family
from moejax.jobs import check
from moejax.jobs import run as run_job
from moejax.jobs.schema import base_config, current_config
from moejax.plan import forecast, search
from moejax.testing import config_from_flags
from moejax.timing import hardware
from moejax.traces import load_traces
from tests.fuzzing import examples

PLAN = "configs/plan.py"
PASSES = 40  # of the OLMoE capture: a plan in a few seconds


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory):
    """The first passes of a real OLMoE capture, as a trace file."""
    (trace,) = load_traces(bundled.capture_path("olmoe_code"))
    path = str(tmp_path_factory.mktemp("plan") / "olmoe_code_40.npz")
    trace.first_passes(PASSES).save(path)
    return path


def _plan(*flags):
    return config_from_flags(PLAN, "--config.log.progress=False", *flags)


def _olmoe(trace, *flags):
    return _plan("--config.model.family=olmoe", "--config.model.preset=olmoe-1b-7b",
                 "--config.model.width=32", f"--config.replay.trace={trace}",
                 "--config.plan.keep=1", *flags)


@pytest.fixture(scope="module")
def olmoe_plan(short_trace, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("plan_olmoe") / "w")
    return run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0015"), workdir)


def test_the_recommendation_is_a_replay_of_its_own_overrides(olmoe_plan, short_trace, tmp_path):
    """What the plan forecasts for its pick is what the replay job reports for the same
    overrides: the same numbers, bit for bit (the forecast is that replay)."""
    rec = olmoe_plan["plan"]["recommended"]
    flags = [f"--config.{k}={v}" for k, v in rec["overrides"].items()]
    replay = config_from_flags(
        "configs/replay.py", "--config.log.progress=False", "--config.log.tensorboard=False",
        f"--config.replay.trace={short_trace}", "--config.model.family=olmoe",
        "--config.model.preset=olmoe-1b-7b", "--config.model.width=32",
        "--config.replay.prefill_tokens=16", *flags)
    got = run_job(replay, str(tmp_path / "r"))["cache"]
    assert got["timing"]["decode_tok_per_s"] == rec["predicted"]["decode_tok_per_s"]
    assert got["timing"]["ttft_s"] == rec["predicted"]["ttft_s"]
    assert got["total"]["h2d_bytes"] == rec["predicted"]["h2d_bytes"]
    # The printed command reproduces it too: the same flags, defaults left out.
    assert rec["replay_command"].startswith("python -m moejax.main --config=configs/replay.py")
    assert "--config.replay.prefill_tokens=16" in rec["replay_command"]


def test_the_recommendation_fits_the_budget_and_beats_the_default(olmoe_plan):
    plan = olmoe_plan["plan"]
    rec, default = plan["recommended"], plan["default"]
    assert 0 < rec["device_bytes"] <= 1_500_000
    # Every candidate's slots fit the budget.
    assert all(r["predicted"]["device_bytes"] <= 1_500_000 for r in plan["candidates"])
    # The default (SpecMD's recommended policies, none prefetching on an id-only trace, at
    # native precision and the budget's size) is a candidate: the pick is at least as fast.
    assert default["overrides"]["policies.eviction"] == "least_stale"
    assert default["overrides"]["cache.precision"] == "native"
    assert rec["predicted"]["decode_tok_per_s"] >= default["predicted"]["decode_tok_per_s"]
    # Every stage ran, and nothing was replayed twice.
    assert {r["stage"] for r in plan["candidates"]} == set(search.STAGES)
    keys = [json.dumps(r["overrides"], sort_keys=True) for r in plan["candidates"]]
    assert len(keys) == len(set(keys)) == olmoe_plan["timings"]["replays"]
    # The fit at each precision the floor allows (int4 by default), the dense weights and the
    # KV cache counted beside the slots.
    assert set(plan["fit"]) == {"native", "int8", "int4"}
    assert plan["fit"]["native"]["slots"] == 1_500_000 // plan["fit"]["native"]["expert_bytes"]
    # A decode-only capture gets a TTFT from its first rows as one prefill, and says so.
    assert "replayed as one (replay.prefill_tokens=16)" in plan["workload"]["label"]
    assert rec["predicted"]["ttft_s"] > 0
    # A preset's clock was never validated: no band, and the reason.
    assert rec["predicted"]["band"] is None and "never validated" in plan["band_basis"]


def test_the_ranking_is_by_the_objective(olmoe_plan):
    ranked = sorted((r for r in olmoe_plan["plan"]["candidates"] if "rank" in r),
                    key=lambda r: r["rank"])
    rates = [r["predicted"]["decode_tok_per_s"] for r in ranked]
    assert rates == sorted(rates, reverse=True)


def test_a_searched_field_given_holds_the_search(short_trace, tmp_path):
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0015",
                         "--config.policies.eviction=fifo", "--config.plan.min_precision=native"),
                  str(tmp_path / "w"))
    candidates = doc["plan"]["candidates"]
    assert {r["overrides"]["policies.eviction"] for r in candidates} == {"fifo"}
    assert {r["overrides"]["cache.precision"] for r in candidates} == {"native"}
    assert set(doc["plan"]["fit"]) == {"native"}


def test_a_precision_given_holds_the_sizes_to_its_own(short_trace, tmp_path):
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0015",
                         "--config.cache.precision=int8"), str(tmp_path / "w"))
    plan = doc["plan"]
    assert set(plan["fit"]) == {"int8"}
    slots = plan["fit"]["int8"]["slots"]
    assert {r["overrides"]["cache.precision"] for r in plan["candidates"]} == {"int8"}
    assert max(r["predicted"]["slots"] for r in plan["candidates"]) == slots
    with pytest.raises(ConfigError, match="cache.precision='int2' holds the search to a "
                       "precision the plan may not use"):
        run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0015",
                       "--config.cache.precision=int2"), str(tmp_path / "w2"))


def test_host_memory_short_of_the_experts_takes_the_disk_tier_or_refuses(short_trace, tmp_path,
                                                                        capsys):
    """3 MB of host memory holds every expert at int4 (1.97 MB), not at int8 or native (3.6 and
    6.3 MB): those run behind the disk tier, without host compute (which reads every expert
    from host memory); with plan.disk=False they are not planned, and say why."""
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0005",
                         "--config.plan.host_gb=0.003"), str(tmp_path / "w"))
    for r in doc["plan"]["candidates"]:
        o = r["overrides"]
        behind = o["cache.precision"] in ("native", "int8")
        assert o.get("cache.host_bytes", 0) == (3_000_000 if behind else 0)
        assert r["predicted"]["disk_tier"] == behind
        assert r["predicted"]["host_bytes"] == (3_000_000 if behind else 1024 * 1920)
        if behind:
            assert o["policies.miss"] == "fetch" and not o["cache.host_compute_layers"]
        assert "error" not in r["predicted"], r["predicted"]
    assert doc["plan"]["host_refused"] == {}
    # Held to int8, every candidate is behind the disk tier: the miss stage tries no host
    # compute there.
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0005",
                         "--config.plan.host_gb=0.003", "--config.cache.precision=int8"),
                  str(tmp_path / "w1"))
    assert all(r["overrides"]["cache.host_bytes"] == 3_000_000 and "error" not in r["predicted"]
               and r["overrides"]["policies.miss"] == "fetch" for r in doc["plan"]["candidates"])
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0005",
                         "--config.plan.host_gb=0.003", "--config.plan.disk=False"),
                  str(tmp_path / "w2"))
    assert set(doc["plan"]["host_refused"]) == {"native", "int8"}
    assert {r["overrides"]["cache.precision"] for r in doc["plan"]["candidates"]} == {"int4"}
    assert "native: not planned, host memory is short: plan.host_gb=0.003 holds 3.00 MB of the " \
           "experts' 6.29 MB at native, and plan.disk=False" in capsys.readouterr().out


def test_a_budget_below_top_k_slots_says_by_how_much(short_trace, tmp_path, capsys):
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.00001",
                         "--config.plan.lossless=True"), str(tmp_path / "w"))
    plan = doc["plan"]
    assert plan["recommended"] is None and plan["candidates"] == []
    native = plan["fit"]["native"]
    assert not native["fits"]
    assert native["shortfall_bytes"] == 8 * native["expert_bytes"] - 10_000
    assert "does not fit" in plan["why_nothing"]
    assert "nothing to recommend: does not fit" in capsys.readouterr().out


def test_a_hugging_face_config_plans_without_weights(tmp_path, monkeypatch, capsys):
    """Mixtral's config.json alone: the fit at 24 GB and a recommendation, on a synthetic
    routing labelled as such (no Mixtral capture ships)."""
    from moejax.jobs import plan as plan_job

    monkeypatch.setattr(plan_job, "SYNTHETIC_PASSES", 24)  # (a few seconds)
    hf = dict(get_family("mixtral").presets["mixtral-8x7b"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    doc = run_job(_plan(f"--config.model.hf_config={path}", "--config.plan.device_gb=24",
                        "--config.plan.keep=1"), str(tmp_path / "w"))
    plan = doc["plan"]
    assert plan["workload"]["kind"] == "synthetic" and "SYNTHETIC" in plan["workload"]["label"]
    native = plan["fit"]["native"]
    assert native["expert_bytes"] == 3 * 4096 * 14336 * 2
    assert native["slots"] == 24_000_000_000 // native["expert_bytes"] == 68
    assert plan["recommended"]["device_bytes"] <= 24e9
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "--config.model.checkpoint=CONVERTED" in out
    assert "(structural: the default is one of the candidates the recommendation is chosen " \
           "from, so it is never slower on this clock)" in out
    # Its config is the preset's: the forecast's replay names it.
    assert "--config.model.preset=mixtral-8x7b" in plan["recommended"]["replay_command"]


def test_a_checkpoint_and_a_scored_trace_open_the_score_prefetchers_and_the_cascade(tmp_path):
    """The embedded checkpoint with its own scored routing: the score prefetchers and the
    precision cascade are candidates; a cascade too small to hold top-k in a pool is kept
    with its reason, not run."""
    doc = run_job(_plan(f"--config.model.checkpoint={bundled.EMBEDDED_DIR}",
                        f"--config.replay.trace={bundled.scored_trace_files()[0]}",
                        "--config.plan.device_gb=0.0002", "--config.plan.keep=1"),
                  str(tmp_path / "w"))
    plan = doc["plan"]
    prefetchers = {r["overrides"]["policies.prefetch"] for r in plan["candidates"]}
    assert set(search.SCORED_PREFETCHERS) <= prefetchers
    cascades = [r for r in plan["candidates"]
                if r["overrides"]["policies.miss"].startswith("fetch_priority")]
    assert cascades
    for r in cascades:
        assert ("error" in r["predicted"]) or r["predicted"]["device_bytes"] <= 200_000
    refused = [r for r in cascades if "error" in r["predicted"]]
    assert all("below what one decode layer needs" in r["predicted"]["error"] for r in refused)
    assert plan["recommended"]["command"].startswith(
        f"python -m moejax.main --config=configs/default.py --config.model.checkpoint="
        f"{bundled.EMBEDDED_DIR}")


def _validated(tmp_path, decode_p90: float, signed: tuple[float, float] | None = None,
               covers: dict | None = None):
    from moejax.calibration import profile

    measured = hardware.Hardware("calibrated:testhost", h2d_gbps=7.25, h2d_latency_s=41e-6,
                                 copy_engines=1, peak_tflops=0.0375, hbm_gbps=12.5,
                                 launch_s=61e-6, link_gbps=None)
    doc = profile.document(measured, {"transfers": []}, "python -m moejax.calibration",
                           {"platform": "cpu"})
    decode = {"median": 0.07, "p90": decode_p90}
    if signed is not None:
        decode.update(signed_p5=signed[0], signed_p95=signed[1])
    doc["validation"] = {"date": "D", "cells": 66, "decode": decode,
                         "ttft": {"median": 0.06, "p90": 0.19}}
    if covers is not None:
        doc["validation"]["covers"] = covers
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_printed_commands_read_back_as_the_overrides(tmp_path):
    """Each command line the plan prints, split as a shell splits it and parsed as
    `moejax.main` parses it, sets every override it shows: a spec with quotes and
    parentheses (the cascade's) and a path with a space included."""
    import shlex

    from moejax.jobs import plan as plan_job

    config = _plan("--config.model.family=olmoe", "--config.model.preset=olmoe-1b-7b",
                   "--config.model.width=32", "--config.plan.device_gb=0.0015")
    cfg = plan_job.model_of(config)[0]
    overrides = {**search.candidate("native", 0, "lru", "topk(overfetch=1.0)",
                                    capacity_frac=0.25,
                                    miss="fetch_priority(levels='native:int4')"),
                 "cache.host_compute_layers": 2}
    rp = base_config().replay
    rp.prefill_tokens = 16
    path = str(tmp_path / "a trace.npz")
    for line in (plan_job.command_line(config, cfg, overrides),
                 plan_job.replay_command(config, cfg, overrides, path, rp)):
        argv = shlex.split(line)
        assert argv[:3] == ["python", "-m", "moejax.main"]
        flags = [a for a in argv[3:] if not a.startswith("--config=")]
        got = config_from_flags(argv[3].split("=", 1)[1], *flags)
        for field, value in overrides.items():
            section, name = field.split(".")
            assert got[section][name] == value, (field, line)
    assert got.replay.trace == path and got.replay.prefill_tokens == 16


def test_a_validated_profile_bands_the_forecast_and_recommends_within_it(short_trace, tmp_path):
    path = _validated(tmp_path, 0.171, signed=(-0.25, 0.06))
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0015",
                         f"--config.hardware.file={path}"), str(tmp_path / "w"))
    plan = doc["plan"]
    pred = plan["recommended"]["predicted"]
    rate, ttft = pred["decode_tok_per_s"], pred["ttft_s"]
    # The central 90% of the signed errors for decode; the TTFT summary has no signed
    # percentiles, so its band is -+ its p90.
    assert pred["band"] == [rate * (1 - 0.25), rate * (1 + 0.06)]
    assert pred["ttft_band"] == [ttft / (1 + 0.19), ttft / (1 - 0.19)]
    assert ("validation of D on 66 live cells, the central 90% of its signed errors: decode "
            "-25.0% to +6.0%, TTFT -19.0% to +19.0%") in plan["band_basis"]
    # Host compute is outside what the validation found the clock near: no band there, and
    # such a candidate is not the one recommended.
    host = [r for r in plan["candidates"]
            if r["overrides"]["policies.miss"] in ("host_compute", "latency_aware")]
    assert host and all(r["predicted"]["band"] is None for r in host)
    assert "host compute" in host[0]["predicted"]["band_basis"]
    assert plan["recommended"]["overrides"]["policies.miss"] == "fetch"


def test_a_band_only_where_the_validation_ran_and_the_pick_among_those(short_trace, tmp_path):
    """The validation's cells ran lru and least_stale without prefetch or with temporal: a
    candidate with another eviction or prefetcher has no band and says which setting is
    outside, and the recommendation is one of those with a band."""
    covers = {"policies.eviction": ["least_stale", "lru"],
              "policies.prefetch": ["none", "temporal"], "cache.prefetch_queue": ["immediate"],
              "cache.precision": ["int4", "native"], "policies.miss": ["fetch"]}
    path = _validated(tmp_path, 0.2, signed=(-0.1, 0.2), covers=covers)
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0015",
                         f"--config.hardware.file={path}"), str(tmp_path / "w"))
    plan = doc["plan"]
    for r in plan["candidates"]:
        o, pred = r["overrides"], r["predicted"]
        inside = all(str(o[f]) in ran for f, ran in covers.items()) \
            and not o["cache.host_compute_layers"]
        assert (pred["band"] is not None) == inside, (o, pred["band_basis"])
    lfu = next(r for r in plan["candidates"] if r["overrides"]["policies.eviction"] == "lfu")
    assert ("none: outside the validated conditions: eviction lfu (the validation ran "
            "least_stale, lru)") in lfu["predicted"]["band_basis"]
    rec = plan["recommended"]["overrides"]
    assert rec["policies.eviction"] in ("least_stale", "lru")
    assert rec["policies.prefetch"] in ("none", "temporal")
    # No candidate with a band beats it by more than the tolerance (1%).
    best = max(r["score"] for r in plan["candidates"] if r["predicted"].get("band"))
    chosen = next(r for r in plan["candidates"] if r["overrides"] == rec)
    assert chosen["score"] >= 0.99 * best


def test_verify_runs_the_pick_live_and_judges_it_by_its_band(short_trace, tmp_path, capsys):
    """`plan.verify`: the recommendation run live, trace-driven (here 8 tokens, one run), its
    measured decode against the virtual clock's forecast of that run and its band; the
    verdict is what the numbers say, printed either way."""
    path = _validated(tmp_path, 0.2, signed=(-0.2, 0.2))
    doc = run_job(_olmoe(short_trace, "--config.plan.device_gb=0.0015",
                         f"--config.hardware.file={path}", "--config.plan.verify=True",
                         "--config.plan.verify_tokens=8", "--config.plan.verify_reps=1"),
                  str(tmp_path / "w"))
    v = doc["plan"]["verified"]
    measured, forecast_rate = v["decode_tok_per_s"], v["predicted_decode_tok_per_s"]
    assert measured > 0 and forecast_rate > 0 and len(v["runs"]) == 1
    assert v["band"] == [forecast_rate * 0.8, forecast_rate * 1.2]
    assert v["within_band"] == (forecast_rate * 0.8 <= measured <= forecast_rate * 1.2)
    assert v["decode_error"] == pytest.approx(measured / forecast_rate - 1, rel=1e-6)
    verdict = "within the band" if v["within_band"] else "MISSED the band"
    assert verdict in capsys.readouterr().out and verdict in v["line"]
    # The plan was written before the live check, and again with it.
    saved = json.loads((tmp_path / "w" / "results.json").read_text())
    assert saved["plan"]["verified"]["decode_tok_per_s"] == measured


@settings(max_examples=examples(200))
@given(value=st.floats(1e-3, 1e6), low=st.floats(-0.95, 0.5), width=st.floats(0, 1),
       where=st.floats(0, 1), outside=st.floats(1e-3, 0.5))
def test_the_band_holds_a_run_exactly_when_its_error_is_in_range(value, low, width, where,
                                                                outside):
    """A live run whose time error e = (virtual - wall) / wall lies in the validation's range
    decodes inside the band of its forecast, and a run with an error outside it does not;
    a TTFT band alike."""
    high = low + width
    e = low + where * width

    def rate(err):
        return value * (1 + err)  # tokens / wall, wall = virtual / (1 + err)

    lo, hi = forecast.band_of(value, (low, high), rate=True)
    assert lo * (1 - 1e-12) <= rate(e) <= hi * (1 + 1e-12)
    assert rate(high + outside) > hi and (low - outside <= -1 or rate(low - outside) < lo)
    lo, hi = forecast.band_of(value, (low, high), rate=False)
    assert lo * (1 - 1e-12) <= value / (1 + e) <= hi * (1 + 1e-12)
    assert value / (1 + high + outside) < lo
    assert forecast.band_of(None, (low, high), True) is None
    assert forecast.band_of(value, None, True) is None


def test_the_knee_worked_by_hand():
    hits = {8: 50, 9: 90, 10: 98, 11: 99, 12: 100}
    assert search.knee(hits, 12) == 11  # 99% of 100
    assert search.knee(hits, 10) == 10  # 99% of 98 is 97.02: 9 slots have 90
    assert search.knee({8: 0, 9: 0}, 9) == 8  # nothing to gain: the fewest


def test_every_stage_draws_from_the_whole_space():
    """The exhaustive benchmark's grid (`every_candidate`) holds every candidate any stage
    makes, from any configurations kept; a held field is held in all of them."""
    space = search.Space({"native": [40, 31], "int4": [120]}, [("native", "int4", 0.2)], True,
                         16, {"cache.prefetch_queue": "watchdog"}, {"native": 0, "int4": 0})
    every = {json.dumps(c, sort_keys=True) for c in search.every_candidate(space)}
    sizes = search.stage_sizes(space)
    made = sizes + search.stage_eviction(space, sizes)
    made += search.stage_prefetch(space, made)
    made += search.stage_miss(space, made)
    made.append({**search.default_candidate(space), **space.held})
    assert {json.dumps(c, sort_keys=True) for c in made} <= every
    assert all(json.loads(c)["cache.prefetch_queue"] == "watchdog" for c in every)
    # The cascade is sized by bytes; its misses are its own (no host compute beside it).
    cascade = [json.loads(c) for c in every if "fetch_priority" in json.loads(c)["policies.miss"]]
    assert cascade and all(c["cache.capacity_frac"] == 0.2 and "cache.slots" not in c
                           and c["cache.host_compute_layers"] == 0 for c in cascade)
    # 3 sizes x 8 evictions x (no prefetch, or 4 prefetchers under the one queue held) x
    # (fetch, 2 host misses, 3 host layer counts), and the cascade's 8 x 5.
    assert len(every) == 3 * 8 * (1 + 4) * (1 + 2 + 3) + 8 * (1 + 4)


def test_the_recommendation_rule_worked_by_hand():
    """The best score; with a validated profile the best with a band; within the tolerance
    the fewest device bytes."""
    from moejax.jobs.plan import recommend

    def row(name, score, band, device_bytes):
        return {"name": name, "score": score,
                "predicted": {"band": band, "device_bytes": device_bytes}}

    host = row("host compute", 10.0, None, 100)
    big = row("big", 9.9, [8.0, 12.0], 100)
    small = row("small", 9.85, [8.0, 12.0], 60)
    slow = row("slow", 5.0, [4.0, 6.0], 10)
    ranked = [host, big, small, slow]
    assert recommend(ranked, 0.0, validated=False)["name"] == "host compute"
    assert recommend(ranked, 0.0, validated=True)["name"] == "big"
    assert recommend(ranked, 0.01, validated=True)["name"] == "small"  # 9.85 >= 0.99 x 9.9
    # 9.85 < 0.99 x 10: among host compute and big, equal bytes, the better score.
    assert recommend(ranked, 0.01, validated=False)["name"] == "host compute"
    assert recommend([host], 0.01, validated=True)["name"] == "host compute"  # none banded


def test_the_verdict_worked_by_hand():
    from moejax.plan.verify import inside

    assert inside(5.0, [4.0, 6.0]) and inside(4.0, [4.0, 6.0]) and inside(6.0, [4.0, 6.0])
    assert inside(6.01, [4.0, 6.0]) is False and inside(3.99, [4.0, 6.0]) is False
    assert inside(5.0, None) is None and inside(None, [4.0, 6.0]) is None


def test_a_forecast_over_several_traces_is_their_sum(short_trace, tmp_path):
    """Decode over the workload's traces is their tokens over their seconds, and the TTFT the
    first trace's (its cache starts cold); each trace a replay of its own."""
    from moejax.jobs import plan as plan_job

    (prose,) = load_traces(bundled.capture_path("olmoe_prose"))
    other = str(tmp_path / "prose.npz")
    prose.first_passes(24).save(other)
    config = _olmoe(short_trace, "--config.plan.device_gb=0.0015")
    planning = plan_job.prepare(config, str(tmp_path))
    c = search.candidate("int4", 300, "lru", host_bytes=0)
    base, cfg = planning.base, planning.cfg
    both = forecast.Forecaster(base, [short_trace, other], cfg, None).forecast(c)
    one = forecast.Forecaster(base, [short_trace], cfg, None).forecast(c)
    two = forecast.Forecaster(base, [other], cfg, None).forecast(c)
    tokens = one["decode_tokens"] + two["decode_tokens"]
    seconds = (one["decode_tokens"] / one["decode_tok_per_s"]
               + two["decode_tokens"] / two["decode_tok_per_s"])
    assert both["decode_tok_per_s"] == pytest.approx(tokens / seconds, rel=1e-12)
    assert both["ttft_s"] == one["ttft_s"] != two["ttft_s"]
    assert both["h2d_bytes"] == one["h2d_bytes"] + two["h2d_bytes"]


def test_host_layer_counts():
    assert search.host_layer_counts(16) == [1, 4, 8]
    assert search.host_layer_counts(2) == [1]
    assert search.host_layer_counts(1) == []


def test_a_config_written_before_the_plan_reads_as_one_written_now():
    now = base_config().to_dict()
    before = {k: v for k, v in now.items() if k != "plan"}
    before["model"] = {k: v for k, v in now["model"].items() if k != "hf_config"}
    assert current_config(before) == now


@pytest.mark.parametrize("flags, message", [
    ((), "plan.device_gb=0.0 must be a number > 0"),
    (("--config.plan.device_gb=1", "--config.plan.budget_of=gpu"),
     "plan.budget_of='gpu' is not one of"),
    (("--config.plan.device_gb=1", "--config.plan.objective=speed"),
     "plan.objective='speed' is not one of"),
    (("--config.plan.device_gb=1", "--config.plan.min_precision=int3"),
     "plan.min_precision='int3' is not one of"),
    (("--config.plan.device_gb=1", "--config.plan.keep=0"), "plan.keep=0 must be an integer"),
    (("--config.plan.device_gb=1", "--config.model.preset=",), "the plan needs a model"),
    (("--config.plan.device_gb=1", "--config.model.preset=",
      "--config.model.hf_config=/nonexistent/config.json"),
     "model.hf_config='/nonexistent/config.json' is not a file"),
    (("--config.plan.device_gb=1", "--config.model.hf_config=/nonexistent/config.json"),
     "model.hf_config and model.preset both name the model: give one"),
    (("--config.plan.device_gb=1", "--config.model.preset=",
      "--config.model.checkpoint=/nonexistent"), "model.checkpoint='/nonexistent' is not a"),
])
def test_bad_plan_input_is_one_error_naming_it(flags, message):
    config = _plan("--config.model.family=olmoe", "--config.model.preset=olmoe-1b-7b",
                   *(f for f in flags if f != "--config.model.preset="))
    if "--config.model.preset=" in flags:
        config.model.preset = ""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        check(config)


def test_verify_needs_weights_and_a_hugging_face_config_has_none(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(get_family("mixtral").presets["mixtral-8x7b"])))
    with pytest.raises(ConfigError, match="plan.verify runs the model live"):
        check(_plan(f"--config.model.hf_config={path}", "--config.plan.device_gb=24",
                    "--config.plan.verify=True"))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="unknown Hugging Face model_type 'llama'"):
        check(_plan(f"--config.model.hf_config={other}", "--config.plan.device_gb=24"))


def test_the_command_line_refuses_a_bad_budget_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "moejax.main", f"--config={PLAN}",
                           "--config.model.preset=olmoe-1b-7b", "--config.plan.device_gb=-1",
                           f"--workdir={tmp_path / 'w'}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "plan.device_gb=-1" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()
