"""The host's work in the virtual clock (moejax/timing/host_work.py, moejax/cache/runtime_timing.py,
moejax/calibration/host_fit.py): a profile without it gives the device-only numbers bit for bit, a
virtual time's parts add up to it, the time is monotone in every term where the runtime's
choices do not depend on time, the fit recovers the terms of a made-up machine from its pass
times, and the model runs a pass as the live runtime on the wall clock does (speculative
passes, failed checks, complete passes)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile

import ml_collections
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled
from moejax.cache import build_cache_for
from moejax.cache.metrics import PARTS, PassTiming, parts_of
from moejax.calibration import cells as cells_lib
from moejax.calibration import host_fit, matrix
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs import clocks
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.replay.engine import replay
from moejax.timing import hardware as hw_lib
from moejax.timing import host_work
from moejax.traces.importers import import_traces
from moejax.traces.requests import as_requests
from tests.fuzzing import examples

WIDTH = 8
CFG = preset("olmoe", "olmoe-1b-7b", WIDTH)
CAPTURE = bundled.capture_path("olmoe_code")
# Terms of a made-up machine (seconds per charge).
TERMS = {"pass_s": 300e-6, "round_trip_s": 120e-6, "speculative_layer_s": 70e-6,
         "request_s": 3e-6, "load_s": 15e-6, "load_batch_s": 60e-6,
         "prefetch_s": 8e-6}


def _tables(cfg, scale: float = 1.0) -> dict:
    """Step tables of a made-up machine for `cfg`: dispatch and completion growing with size."""
    sizes = [1, 2, 4, 8, 16, 32, 64]

    def table(d0, c0, per):
        return {"sizes": sizes, "dispatch_s": [scale * (d0 + 1e-6 * s) for s in sizes],
                "complete_s": [scale * (c0 + per * s) for s in sizes]}
    steps = {"embed": table(50e-6, 10e-6, 1e-6), "attention_router": table(90e-6, 60e-6, 5e-6),
             "experts:native": table(80e-6, 100e-6, 15e-6), "logits": table(50e-6, 300e-6, 40e-6),
             "load": {"sizes": [1000, 100000], "dispatch_s": [25e-6, 30e-6],
                      "complete_s": [1e-6, 20e-6]}}
    return {host_work.model_key(cfg): steps}


def _profile(path: str, terms: dict | None = None, steps: dict | None = None,
             hardware: str = "a100_specmd", with_host_work: bool = True) -> str:
    """A hardware.json: a preset's profile, and a host_work section (steps, terms) unless
    `with_host_work` is False."""
    hw = dataclasses.replace(hw_lib.get(hardware), name="calibrated:test")
    doc = {"format": hw_lib.FILE_FORMAT, "hardware": hw_lib.as_dict(hw)}
    if with_host_work:
        doc["host_work"] = {"name": "calibrated:test",
                            "steps": _tables(CFG) if steps is None else steps,
                            **(TERMS if terms is None else terms)}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def _replay_config(**fields) -> ml_collections.ConfigDict:
    c = base_config()
    c.job, c.clock.kind = "replay", "virtual"
    c.model.family, c.model.preset, c.model.width = "olmoe", "olmoe-1b-7b", WIDTH
    c.log.progress = c.log.tensorboard = False
    c.policies.prefetch = "none"  # (an id-only capture: no scores to prefetch on)
    for k, v in fields.items():
        section, name = k.split("__")
        c[section][name] = v
    return c


_TRACES = {}


def _traces(passes: int = 40):
    """The first `passes` passes of the OLMoE code capture, its first 8 rows one prefill."""
    if passes not in _TRACES:
        got = import_traces(CAPTURE).traces[0]
        _TRACES[passes] = as_requests(got, request_tokens=passes + 7, prefill_tokens=8)[:1]
    return _TRACES[passes]


def _replayed(config, traces=None):
    cache = build_cache_for(resolve(config), CFG, {"native": CFG.expert_bytes}, CFG.norm_topk_prob)
    decision = replay(cache, traces or _traces(), [0])
    return cache, decision


# -- the profile's section ---------------------------------------------------------------------
def test_a_step_table_interpolates_inside_and_says_none_outside():
    t = host_work.StepTable((1, 4, 16), (10.0, 40.0, 100.0), (1.0, 4.0, 16.0))
    assert t.at(4) == (40.0, 4.0)
    assert t.at(2) == (20.0, 2.0)  # a third of the way from 1 to 4
    assert t.at(10) == (70.0, 10.0)
    assert t.at(0.5) is None and t.at(17) is None  # the caller charges the roofline
    # A load of another precision's bytes: the nearest size's dispatch, completion by size.
    assert t.at(32, extrapolate=True) == (100.0, 32.0)
    assert t.at(0.5, extrapolate=True) == (10.0, 0.5)


@pytest.mark.parametrize("section, message", [
    ({"name": "x", "steps": {}, "round_trip_s": -1.0}, "round_trip_s=-1.0 must be a finite"),
    ({"name": "x", "steps": {}, "pass_s": "fast"}, "pass_s='fast' must be a finite"),
    ({"name": "x", "steps": {}, "bogus_s": 1.0}, "has a field 'bogus_s'"),
    ({"steps": {}}, "needs a name"),
    ({"name": "x", "steps": {"m": {"warp": {"sizes": [1], "dispatch_s": [1e-6],
                                            "complete_s": [1e-6]}}}}, "step 'warp' is not"),
    ({"name": "x", "steps": {"m": {"embed": {"sizes": [2, 1], "dispatch_s": [1e-6, 1e-6],
                                             "complete_s": [1e-6, 1e-6]}}}}, "must increase"),
    ({"name": "x", "steps": {"m": {"embed": {"sizes": [1], "dispatch_s": [1e-6]}}}},
     "takes sizes, dispatch_s and complete_s"),
])
def test_a_bad_host_work_section_is_one_error_naming_the_file(tmp_path, section, message):
    path = tmp_path / "hardware.json"
    _profile(str(path))
    doc = json.loads(path.read_text())
    doc["host_work"] = section
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=message) as e:
        _replayed(_replay_config(hardware__file=str(path)))
    assert f"hardware.file={str(path)!r}" in str(e.value) and "\n" not in str(e.value)


# -- the device-only model, unchanged ----------------------------------------------------------
def _numbers(cache) -> dict:
    t = cache.metrics.timing()
    return {"total": cache.metrics.totals(), "ttft": t["ttft_s"], "decode": t["decode_s"],
            "passes": [dataclasses.astuple(p) for p in cache.metrics.passes]}


def test_a_profile_without_host_work_gives_the_device_only_numbers_bit_for_bit(tmp_path):
    """The preset, the same profile in a file without host_work, and a file with it but
    `clock.host_work=False` replay to the same numbers, on the compiled engine."""
    fields = dict(cache__capacity_frac=0.25, policies__prefetch="temporal")
    preset_cache, d0 = _replayed(_replay_config(**fields))
    plain = _profile(str(tmp_path / "plain.json"), with_host_work=False)
    plain_cache, d1 = _replayed(_replay_config(hardware__file=plain, **fields))
    full = _profile(str(tmp_path / "full.json"))
    off_cache, d2 = _replayed(_replay_config(hardware__file=full, clock__host_work=False,
                                             **fields))
    assert d0.engine == d1.engine == d2.engine == "compiled"
    assert _numbers(preset_cache) == _numbers(plain_cache) == _numbers(off_cache)
    # With the host's work the time grows (the same decisions: what the clock does not
    # split, a hit being ready or late, is the same)...
    on_cache, d3 = _replayed(_replay_config(hardware__file=full, **fields))
    on, off = on_cache.metrics.totals(), preset_cache.metrics.totals()
    assert {k: on[k] for k in (*clocks.COUNTERS, "hit_rate")} == {
        k: off[k] for k in (*clocks.COUNTERS, "hit_rate")}
    assert _numbers(on_cache)["decode"] > _numbers(preset_cache)["decode"]
    # ... and the compiled engine, which charges the device's steps only, refuses it.
    assert d3.engine == "reference" and "HostDeviceClock" in d3.reason


def test_a_preset_says_the_host_work_is_not_modelled(tmp_path):
    from moejax.cache.summary import host_work_section, model_words

    cache, _ = _replayed(_replay_config())
    assert model_words(cache) == "host work not modelled"
    assert host_work_section(cache)["modelled"] is False
    full = _profile(str(tmp_path / "full.json"))
    cache, _ = _replayed(_replay_config(hardware__file=full))
    section = host_work_section(cache)
    assert section["modelled"] and section["terms"]["round_trip_s"] == TERMS["round_trip_s"]
    assert section["words"].startswith("with the live runtime's host work (calibrated:test), "
                                       "not validated yet")
    assert section["steps_measured"] > 0 and section["steps_roofline"] == 0
    # A model the calibration did not measure: its steps on the roofline, and said so.
    other = _profile(str(tmp_path / "other.json"), steps={})
    cache, _ = _replayed(_replay_config(hardware__file=other))
    assert host_work_section(cache)["steps_measured"] == 0
    assert "no step table of this model: its steps on the roofline" in model_words(cache)


# -- parts -------------------------------------------------------------------------------------
@settings(max_examples=examples(12), deadline=None)
@given(capacity=st.sampled_from([0.05, 0.25, 1.0]),
       eviction=st.sampled_from(["lru", "least_stale", "lru_per_layer"]),
       prefetch=st.sampled_from(["none", "temporal"]), speculate=st.booleans(),
       modelled=st.booleans(), queue=st.sampled_from(["immediate", "watchdog"]))
def test_the_parts_of_a_virtual_time_add_up_to_it(capacity, eviction, prefetch, speculate,
                                                   modelled, queue):
    with tempfile.TemporaryDirectory() as d:
        fields = dict(cache__capacity_frac=capacity, policies__eviction=eviction,
                      policies__prefetch=prefetch, cache__speculate=speculate,
                      cache__prefetch_queue=queue)
        if modelled:
            fields["hardware__file"] = _profile(os.path.join(d, "hw.json"))
        cache, _ = _replayed(_replay_config(**fields), _traces(12))
    for p in cache.metrics.passes:
        parts = p.parts
        assert math.fsum(parts.values()) == pytest.approx(p.end_s - p.start_s, rel=1e-12,
                                                         abs=1e-15)
        assert all(v >= -1e-15 for v in parts.values())
        assert (parts["host_work"] > 0) == modelled
    t = cache.metrics.timing()
    assert math.fsum(t["parts"]["ttft"].values()) == pytest.approx(t["ttft_s"], rel=1e-12)
    assert math.fsum(t["parts"]["decode"].values()) == pytest.approx(t["decode_s"], rel=1e-12)


_SECONDS = st.floats(0.0, 10.0, allow_nan=False)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(_SECONDS, _SECONDS, _SECONDS, _SECONDS, _SECONDS, _SECONDS),
                max_size=30))
def test_the_parts_of_passes_are_each_passes_parts_added_in_pass_order(rows):
    """`metrics.parts_of`, which sums without a dict a pass, gives each part as the passes'
    `PassTiming.parts` added one by one, to the last bit."""
    passes = [PassTiming("decode", 1, start, start + length, stall, storage, wait, work)
              for start, length, stall, storage, wait, work in rows]
    expected = dict.fromkeys(PARTS, 0.0)
    for p in passes:
        for name, value in p.parts.items():
            expected[name] += value
    assert parts_of(passes) == expected
    assert list(parts_of(passes)) == list(PARTS)


# -- monotone ----------------------------------------------------------------------------------
@settings(max_examples=examples(10), deadline=None)
@given(capacity=st.sampled_from([0.05, 0.25, 1.0]),
       eviction=st.sampled_from(["lru", "least_stale", "fifo"]),
       prefetch=st.sampled_from(["none", "temporal"]),
       term=st.sampled_from(sorted(TERMS) + ["steps"]),
       more=st.floats(1e-6, 2e-3), base=st.floats(0.0, 2.0))
def test_the_virtual_time_is_monotone_in_every_term(capacity, eviction, prefetch, term, more,
                                                    base):
    """Where the runtime's choices do not depend on time — no speculation (whether a check
    holds depends on when its step went) and a trace's routing (no complete pass, which asks
    whether every transfer has landed) — every term, and every step's time, only adds: a
    later issue makes a later transfer, and a wait is a max."""
    terms = {k: base * v for k, v in TERMS.items()}
    bigger = dict(terms)
    steps, bigger_steps = _tables(CFG), _tables(CFG)
    if term == "steps":
        bigger_steps = _tables(CFG, scale=1.0 + more * 1e3)
    else:
        bigger[term] = terms[term] + more
    got = []
    with tempfile.TemporaryDirectory() as d:
        for i, (t, s) in enumerate(((terms, steps), (bigger, bigger_steps))):
            path = _profile(os.path.join(d, f"hw{i}.json"), t, s)
            cache, _ = _replayed(_replay_config(
                hardware__file=path, cache__capacity_frac=capacity, cache__speculate=False,
                policies__eviction=eviction, policies__prefetch=prefetch), _traces(12))
            got.append(cache.metrics.timing())
    assert got[1]["ttft_s"] >= got[0]["ttft_s"]
    assert got[1]["decode_s"] >= got[0]["decode_s"]


# -- the fit, and the runtime's own choices ----------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Live cells of OLMoE-1B-7B at width 8 driven by the code capture, on the wall clock of a
    profile with a link fast enough that no transfer is in flight when a step goes; their
    samples (routing, each pass's wall time), and the profile file."""
    d = tmp_path_factory.mktemp("live")
    path = _profile(str(d / "hardware.json"), hardware="h200")
    doc = json.loads(open(path).read())
    doc["hardware"].update(h2d_gbps=1000.0, h2d_latency_s=0.0, link_gbps=1000.0)
    with open(path, "w") as f:
        json.dump(doc, f)
    group = matrix.Group("olmoe_code", trace="olmoe_code")
    cells = [cells_lib.Cell(0.05, "none"), cells_lib.Cell(0.25, "temporal"),
             cells_lib.Cell(1.0, "none", True, "all"), cells_lib.Cell(1.0, "none", False, "all"),
             cells_lib.Cell(1.0, "none")]
    entries = matrix.entries([(group, cells)], path, tokens=12, prefill_tokens=8, width=WIDTH)
    samples: list = []
    rows = cells_lib.run_entries(entries, reps=1, samples=samples)
    return rows, samples, path


def test_the_model_runs_its_passes_as_the_live_runtime_did(live):
    """The model's speculative passes and failed checks are the live runtime's, cell by cell
    (the same rules: `moejax.cache.speculation`)."""
    rows, samples, path = live
    for row in rows:
        model = row["virtual"]["host_work"]
        assert model["modelled"]
        assert model["speculative_passes"] == row["speculation"]["speculative_passes"], row["cell"]
        assert model["failed_checks"] == row["speculation"]["failed_checks"], row["cell"]
    assert any(r["speculation"]["failed_checks"] for r in rows)
    assert any(r["speculation"]["speculative_passes"] > r["speculation"]["failed_checks"]
               for r in rows)


def test_the_fit_recovers_the_terms_of_a_made_up_machine(live, tmp_path):
    """Pass times made by the model with known terms (a machine whose every cost is known):
    the fit, started from none, finds the terms the cells charge."""
    _, samples, path = live
    doc = json.loads(open(path).read())
    known = str(tmp_path / "known.json")
    with open(known, "w") as f:  # the live cells' profile, its terms the made-up machine's
        json.dump({**doc, "host_work": {**doc["host_work"], **TERMS}}, f)
    made = [dataclasses.replace(s, wall_passes=host_fit.predict(s, known)[0]) for s in samples]
    doc["host_work"] = {"name": "calibrated:test", "steps": doc["host_work"]["steps"]}
    record, _ = host_fit.fit(made, doc, str(tmp_path / "fitted.json"))
    assert record["rms_rel"] < 1e-3
    for k in host_fit.FITTED:
        if record["determined"][k]:
            assert record["terms"][k] == pytest.approx(TERMS[k], rel=0.02, abs=2e-7), k
    # One model's cells: a pass's own cost could move into its layers' round trips and
    # speculative steps (each layer charges one of them), unless complete passes or a model of
    # another depth tell them apart. What the fit cannot tell apart it says.
    assert sum(record["determined"].values()) >= 4
    assert record["determined"]["load_batch_s"] and record["determined"]["request_s"]


def test_a_model_with_a_dense_layer_gets_its_step_table():
    """Step tables are per model shape: a dense decoder layer (a model whose first layer has
    no experts) is timed as the runtime dispatches it, beside the MoE layer's steps."""
    from moejax.calibration import steps

    cfg = dataclasses.replace(preset("olmoe", "tiny"), moe_layers=(1, 2, 3),
                              dense_intermediate_size=64)
    tables = steps.step_table(cfg, ("native",), tokens=(1, 2), reps=1)
    assert {"embed", "attention_router", "experts:native", "logits", "load",
            "dense_layer"} <= set(tables)
    assert tables["dense_layer"].sizes == (1, 2)
    assert all(v > 0 for v in tables["dense_layer"].dispatch_s)


@pytest.mark.parametrize("validation, said", [
    ({"date": "D", "cells": 66, "ttft": {"median": 0.063}, "decode": {"median": 0.073}},
     "validated D on 66 live cells: median |error| TTFT 6%, decode 7%"),
    ({"date": "D", "cells": 2, "ttft": {"median": None}}, "median |error| TTFT n/a, decode n/a"),
])
def test_every_virtual_time_quotes_the_validation_it_can_read(tmp_path, validation, said):
    from moejax.cache.summary import model_words

    path = _profile(str(tmp_path / "hw.json"))
    doc = json.loads(open(path).read())
    doc["validation"] = validation
    with open(path, "w") as f:
        json.dump(doc, f)
    cache, _ = _replayed(_replay_config(hardware__file=path))
    assert said in model_words(cache)
