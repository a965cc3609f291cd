"""Calibration (moejax/calibration/): the fits recover the parameters that made their timings, the
measurements run for real and charge what the cost model charges, a hardware.json round-trips
through `--config.hardware.file` (overrides on top), a bad file is one line naming it, and the
command's bad flags are one line each."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.calibration import calibrate, fit, measure, profile
from moejax.calibration import host_cpu as host_mod
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.specs import hardware_from, resolve
from moejax.jobs.unapplied import say_unapplied
from moejax.testing import config_from_flags
from moejax.timing import hardware
from moejax.timing import host as host_lib
from moejax.timing.cost import CostModel
from tests.fuzzing import examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
SIZES = [4096 * 4 ** i for i in range(8)]  # 4 KiB .. 64 MiB, as measured


# -- the fits ---------------------------------------------------------------------------------
@settings(max_examples=examples(60), deadline=None)
@given(latency=st.floats(0.0, 2e-3), gbps=st.floats(0.5, 200.0))
def test_the_transfer_fit_recovers_latency_and_bandwidth(latency, gbps):
    seconds = [latency + n / (gbps * 1e9) for n in SIZES]
    got = fit.fit_transfer(SIZES, seconds)
    assert got.gbps == pytest.approx(gbps, rel=1e-6)
    assert got.latency_s == pytest.approx(latency, rel=1e-6, abs=1e-12)
    assert got.rms_rel < 1e-9 and got.points == len(SIZES)


def test_the_transfer_fit_through_noise_and_its_residual():
    # 12 us + bytes / 7.5 GB/s, each time off by a fixed +-3%: both come back within a few
    # percent, and the residual says the points are ~3% off the line.
    wobble = np.array([1.03, 0.97] * 4)
    seconds = (12e-6 + np.array(SIZES) / 7.5e9) * wobble
    got = fit.fit_transfer(SIZES, seconds)
    assert got.gbps == pytest.approx(7.5, rel=0.05)
    assert got.latency_s == pytest.approx(12e-6, rel=0.05)
    assert 0.02 < got.rms_rel < 0.04 and 0.02 < got.max_rel < 0.05
    # A latency the noise would make negative is 0, the bandwidth fitted through the origin:
    # between the two points' own rates (10 and 9.09 GB/s).
    flat = fit.fit_transfer([1e6, 2e6], [1.0e-4, 2.2e-4])
    assert flat.latency_s == 0.0 and 2e6 / 2.2e-4 / 1e9 < flat.gbps < 10.0


@pytest.mark.parametrize("sizes, seconds, message", [
    ([4096, 4096], [1e-5, 2e-5], "two distinct sizes"),
    ([4096, 8192], [1e-5, 0.0], "finite and > 0"),
    ([4096, 8192], [1e-5, float("nan")], "finite and > 0"),
    ([4096, 8192], [2e-5, 1e-5], "do not grow with size"),
])
def test_the_transfer_fit_refuses_what_cannot_be_fitted(sizes, seconds, message):
    with pytest.raises(ValueError, match=message):
        fit.fit_transfer(sizes, seconds)


def _steps_on_both_sides(peak_tflops, hbm_gbps, launch_s):
    """FLOPs and bytes of steps that show all three parameters of the roofline (peak,
    bandwidth, launch): memory terms from 1/20 of a launch to 50 launches, intensities from
    1/100 to 100 times the ridge point (so some steps are compute-bound, some memory-bound,
    some mostly launch)."""
    ridge = peak_tflops * 1e12 / (hbm_gbps * 1e9)  # FLOPs per byte where the two meet
    nbytes = launch_s * hbm_gbps * 1e9 * np.array([0.05, 0.5, 2.0, 10.0, 50.0, 3.0, 30.0])
    intensity = ridge * np.array([0.01, 0.1, 0.5, 2.0, 10.0, 100.0, 4.0])
    return nbytes * intensity, nbytes


@settings(max_examples=examples(40), deadline=None)
@given(peak=st.floats(0.01, 1000.0), hbm=st.floats(1.0, 5000.0),
       launch=st.floats(1e-6, 1e-3))
def test_the_roofline_fit_recovers_peak_bandwidth_and_launch(peak, hbm, launch):
    flops, nbytes = _steps_on_both_sides(peak, hbm, launch)
    launches = np.array([1, 1, 2, 1, 1, 2, 1])
    seconds = np.maximum(flops / (peak * 1e12), nbytes / (hbm * 1e9)) + launches * launch
    got = fit.fit_roofline(flops, nbytes, seconds, launches)
    assert got.peak_tflops == pytest.approx(peak, rel=1e-3)
    assert got.hbm_gbps == pytest.approx(hbm, rel=1e-3)
    assert got.launch_s == pytest.approx(launch, rel=1e-3)
    assert got.determined == {"peak_tflops": True, "hbm_gbps": True, "launch_s": True}
    assert got.rms_rel < 1e-3


def test_a_roofline_side_no_step_reached_is_a_lower_bound_and_said():
    # Every step memory-bound on (50 GFLOP/s, 10 GB/s, 50 us): the peak is not determined; the
    # fit keeps the best FLOP rate a step showed over its time less its launch, which is below
    # the true peak: 0.5e8 FLOPs in 10 ms, 5 GFLOP/s.
    nbytes = np.array([1e5, 1e6, 1e7, 1e8])
    flops = nbytes * 0.5  # 0.5 FLOP per byte, a tenth of the ridge (5 FLOP per byte)
    seconds = nbytes / 10e9 + 50e-6
    got = fit.fit_roofline(flops, nbytes, seconds)
    assert got.determined == {"peak_tflops": False, "hbm_gbps": True, "launch_s": True}
    assert got.hbm_gbps == pytest.approx(10.0, rel=1e-3)
    assert got.launch_s == pytest.approx(50e-6, rel=1e-3)
    assert got.peak_tflops == pytest.approx(0.005, rel=1e-3) and got.peak_tflops <= 0.05


def test_launch_bound_steps_leave_both_rates_bounded_below():
    # Steps of 1 ms, all but a few percent launch (the embedded model's on a busy CPU): neither
    # rate is determined, and each is the best shown over a quarter of a step's time (no step
    # had more than that left for its work): finite lower bounds, not a fit run off to
    # infinity.
    flops = np.array([1e3, 2e3, 4e3])
    nbytes = np.array([1e4, 3e4, 2e4])
    seconds = np.array([1.00e-3, 1.01e-3, 1.02e-3])
    got = fit.fit_roofline(flops, nbytes, seconds)
    assert got.determined["peak_tflops"] is False and got.determined["hbm_gbps"] is False
    assert got.peak_tflops == pytest.approx(4e3 / (0.25 * 1.02e-3) / 1e12, rel=1e-6)
    assert got.hbm_gbps == pytest.approx(3e4 / (0.25 * 1.01e-3) / 1e9, rel=1e-6)
    assert got.launch_s == pytest.approx(1e-3, rel=0.03)


def test_the_roofline_fit_refuses_too_few_or_bad_steps():
    with pytest.raises(ValueError, match="three steps"):
        fit.fit_roofline([1, 2], [1, 2], [1e-3, 2e-3])
    with pytest.raises(ValueError, match="finite and > 0"):
        fit.fit_roofline([1, 2, 3], [1, 2, 3], [1e-3, -1.0, 2e-3])


# -- the measurements, for real ---------------------------------------------------------------
def test_transfers_are_measured_and_fitted():
    # Up to 16 MiB: a transfer there takes milliseconds, so on this shared machine a busy
    # spell cannot make the largest look no slower than the smallest (the fit refuses such
    # points: no bandwidth to fit; 1 MiB at the top once did under a loaded suite).
    sizes = [4096, 1 << 20, 16 << 20]
    rows = measure.transfers(sizes, reps=3, stream=2)
    assert [r["bytes"] for r in rows] == sizes
    for r in rows:
        for how in ("single", "stream"):
            t = r[how]
            assert 0 < t["min_s"] <= t["median_s"] <= t["max_s"] and t["reps"] == 3
        assert math.isfinite(r["single_gbps"]) and r["single_gbps"] > 0
    got = fit.fit_transfer([r["bytes"] for r in rows], [r["single"]["median_s"] for r in rows])
    assert got.gbps > 0 and got.latency_s >= 0 and math.isfinite(got.rms_rel)


def test_steps_are_charged_what_the_cost_model_charges():
    """The FLOPs and bytes next to each measured step are the cost model's: worked by hand
    for OLMoE-1B-7B at width 16 (one expert 3 x 16 x 16 = 768 parameters of 2 bytes; heads
    of 8 dimensions, 2 of them; 50304 tokens of vocabulary)."""
    cfg = preset("olmoe", "olmoe-1b-7b", width=16)
    assert (cfg.hidden_size, cfg.expert_intermediate_size, cfg.num_heads, cfg.head_dim) == (
        16, 16, 2, 8)
    flops, nbytes, launches = measure.charged(cfg, "experts", pairs=8, unique=8, tokens=1)
    assert (flops, nbytes, launches) == (2 * 8 * 768, 8 * 768 * 2, 1)
    flops, nbytes, launches = measure.charged(cfg, "embed_logits", tokens=4)
    assert (flops, nbytes, launches) == (2 * 4 * 16 * 50304, 16 * 50304 * 2, 2)
    # attention + router, 3 tokens at context 3, one row of speculative gates: q, k, v, o
    # (16 x 8 x (2 x 2 + 2 x 2) = 1024) and the router twice (16 x 64): 3072 parameters.
    flops, nbytes, _ = measure.charged(cfg, "attention_router", tokens=3, context=3,
                                       lookahead=1)
    assert flops == 2 * 3 * 3072 + 4 * 3 * 3 * 2 * 8
    assert nbytes == (3072 + 2 * 3 * 2 * 8) * 2 + 4 * 3 * 16 * 2
    # And the profile's roofline over those is the cost model's time.
    hw = hardware.get("cpu")
    got = fit.roofline_seconds(flops, nbytes, hw.peak_tflops, hw.hbm_gbps, hw.launch_s)
    assert got == pytest.approx(CostModel(cfg, hw).attention_router(3, 3, 1), rel=1e-12)


def test_steps_are_timed_for_real():
    cfg = preset("olmoe", "tiny")  # 16 experts, top-4
    rows = measure.steps(cfg, (1, 4), reps=2, decode_context=4)
    assert sorted((r["step"], r["tokens"]) for r in rows) == [
        ("attention_router", 1), ("attention_router", 4), ("embed_logits", 1),
        ("embed_logits", 4), ("experts", 1), ("experts", 4)]
    for r in rows:
        assert 0 < r["timing"]["min_s"] <= r["timing"]["median_s"] and r["flops"] > 0
    experts = {r["tokens"]: r for r in rows if r["step"] == "experts"}
    assert experts[1]["unique"] == 4 and 4 <= experts[4]["unique"] <= 16


# -- hardware.json ----------------------------------------------------------------------------
MEASURED = hardware.Hardware("calibrated:testhost", h2d_gbps=7.25, h2d_latency_s=41e-6,
                             copy_engines=1, peak_tflops=0.0375, hbm_gbps=12.5,
                             launch_s=61e-6, link_gbps=None)


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def _document():
    return profile.document(MEASURED, {"transfers": []}, "python -m moejax.calibration",
                            {"platform": "cpu"})


def test_a_hardware_json_round_trips_through_the_config_flag(tmp_path):
    path = _write(tmp_path / "hardware.json", _document())
    got = hardware_from(config_from_flags(DEFAULT, f"--config.hardware.file={path}"))
    assert got == dataclasses.replace(MEASURED, link_gbps=7.25)
    # The group's overrides apply on top of the file, as on top of a preset.
    got = hardware_from(config_from_flags(DEFAULT, f"--config.hardware.file={path}",
                                          "--config.hardware.h2d_gbps=5",
                                          "--config.hardware.launch_s=0"))
    assert (got.name, got.h2d_gbps, got.link_gbps, got.launch_s, got.hbm_gbps) == (
        "calibrated:testhost", 5.0, 5.0, 0.0, 12.5)


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "is not JSON"),
    ([1, 2], 'has no "hardware" object'),
    ({"format": hardware.FILE_FORMAT}, 'has no "hardware" object'),
    ({"hardware": {**hardware.as_dict(MEASURED), "x": 1}}, "has a field 'x'"),
    ({"hardware": {k: v for k, v in hardware.as_dict(MEASURED).items() if k != "launch_s"}},
     "has no field 'launch_s'"),
    ({"hardware": {**hardware.as_dict(MEASURED), "h2d_gbps": -1.0}},
     r"hardware.h2d_gbps=-1.0 must be a finite number > 0"),
    ({"hardware": {**hardware.as_dict(MEASURED), "copy_engines": 1.5}},
     r"hardware.copy_engines=1.5 must be an integer"),
    ({"hardware": {**hardware.as_dict(MEASURED), "name": ""}}, "must be a non-empty string"),
])
def test_a_bad_hardware_file_is_one_error_naming_it(tmp_path, content, message):
    path = tmp_path / "hardware.json"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_text(json.dumps(content))
    config = config_from_flags(DEFAULT, f"--config.hardware.file={path}")
    with pytest.raises(ConfigError, match=message) as e:
        hardware_from(config)
    assert str(e.value).startswith(f"hardware.file={str(path)!r}")
    assert "\n" not in str(e.value)


def test_a_directory_is_not_a_hardware_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        hardware.from_file(str(tmp_path))


def test_an_override_out_of_range_names_the_override_not_the_file(tmp_path):
    path = _write(tmp_path / "hardware.json", _document())
    with pytest.raises(ConfigError, match=r"^hardware.h2d_gbps=0.0 must be"):
        hardware.from_file(path, h2d_gbps=0.0)


@pytest.mark.slow
def test_the_command_line_says_a_missing_hardware_file_in_one_line(tmp_path):
    missing = str(tmp_path / "nowhere.json")
    out = subprocess.run([sys.executable, "-m", "moejax.main", f"--config={DEFAULT}",
                          f"--config.hardware.file={missing}", f"--workdir={tmp_path / 'w'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (f"moejax.main: error: hardware.file={missing!r}: no such file "
                                  "(python -m moejax.calibration --workdir=W writes "
                                  "W/hardware.json)")
    assert not (tmp_path / "w").exists()


def test_the_calibrated_profile_is_the_fits(tmp_path):
    transfer = fit.TransferFit(latency_s=3e-5, gbps=9.5, rms_rel=0.1, max_rel=0.2, points=8)
    roofline = fit.RooflineFit(peak_tflops=0.02, hbm_gbps=6.0, launch_s=8e-5, rms_rel=0.3,
                               max_rel=0.5, points=9, determined={})
    hw = profile.profile_of(transfer, roofline, profile.calibrated_name("box"))
    assert hw == hardware.Hardware("calibrated:box", 9.5, 3e-5, 1, 0.02, 6.0, 8e-5, None)
    path = _write(tmp_path / "hardware.json",
                  profile.document(hw, {}, "cmd", measure.device_description()))
    assert hardware.from_file(path) == dataclasses.replace(hw, link_gbps=9.5)


# -- the command's flags ----------------------------------------------------------------------
@pytest.mark.parametrize("flag, message", [
    ("--cells=2", "--cells='2': takes capacities in (0, 1]"),
    ("--cells=abc", "--cells='abc': takes capacities in (0, 1]"),
    ("--tokens=0", "--tokens=0 must be >= 1"),
    ("--reps=0", "--reps=0 must be >= 1"),
    ("--width=-8", "--width=-8 must be >= 0"),
    ("--width=12", "--width=12: model.width=12 must be a multiple of 8"),
    ("--h2d_gbps=0", "--h2d_gbps=0.0 must be a finite number > 0"),
    ("--trace=nowhere", "--trace='nowhere' is neither a file nor a bundled capture"),
    ("--model=mixtral", "argument --model: invalid choice"),
])
def test_bad_flags_are_one_line_each(tmp_path, capsys, flag, message):
    workdir = tmp_path / "w"
    with pytest.raises(SystemExit) as e:
        sys.exit(calibrate.main([f"--workdir={workdir}", flag]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m moejax.calibration: error: ") and "\n" not in err
    assert message in err
    assert not workdir.exists()


# -- the host CPU -----------------------------------------------------------------------------
EXPERT = 3 * 2048 * 1024  # OLMoE-1B-7B's expert: parameters, and bytes in bfloat16
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


@settings(max_examples=examples(40), deadline=None)
@given(gbps=st.floats(0.5, 400.0), tflops=st.floats(1e-4, 10.0),
       overhead=st.floats(0.0, 1e-2))
def test_the_host_fit_recovers_overhead_and_flops(gbps, tflops, overhead):
    # Times of the host model itself, from tokens 1 to 1024: the calls that reach the FLOP
    # side give the FLOP/s back, the bandwidth given, and the overhead with it.
    nbytes = 2 * EXPERT
    read = nbytes / (gbps * 1e9)
    seconds = [overhead + max(read, 2 * t * EXPERT / (tflops * 1e12)) for t in TOKENS]
    got = fit.fit_host(TOKENS, seconds, EXPERT, nbytes, gbps)
    # (Within 1%, not exactly: where only the largest call just passes the ridge, the loss
    # is nearly flat along the kink and the simplex stops a fraction of a percent off.)
    assert got.points == len(TOKENS)
    assert got.call_overhead_s == pytest.approx(overhead, rel=1e-2, abs=1e-2 * read)
    if got.determined["tflops"]:
        assert got.tflops == pytest.approx(tflops, rel=1e-2) and got.rms_rel < 5e-3
    else:  # no call's FLOPs on top (within a few percent: a bump of 1% of one call's time
        # is not a ridge) and a quarter of its time: the best rate shown, a lower bound
        compute = 2 * TOKENS[-1] * EXPERT / (tflops * 1e12)
        assert compute <= read * 1.05 or compute < fit.SENSITIVE * seconds[-1] * 1.01
        assert got.tflops <= tflops * 1.01


def test_the_host_fit_through_noise_says_its_residual():
    # 50 us + max(b / 10 GB/s, 2 t P / 0.2 TFLOP/s), each time off by a fixed +-5%.
    nbytes = 2 * EXPERT
    wobble = np.array([1.05, 0.95] * 6)[:len(TOKENS)]
    seconds = fit.host_seconds(np.array(TOKENS), EXPERT, nbytes, 10.0, 0.2, 50e-6) * wobble
    got = fit.fit_host(TOKENS, seconds, EXPERT, nbytes, 10.0)
    assert got.tflops == pytest.approx(0.2, rel=0.06) and got.determined == {"tflops": True}
    assert 0.03 < got.rms_rel < 0.07 and 0.03 < got.max_rel < 0.11


def test_memory_bound_calls_leave_the_flops_a_lower_bound():
    # 1 ms + b / 10 GB/s whatever the tokens (1..16 tokens never reach 0.2 TFLOP/s's side).
    nbytes = 2 * EXPERT
    seconds = [1e-3 + nbytes / 10e9] * 5
    got = fit.fit_host([1, 2, 4, 8, 16], seconds, EXPERT, nbytes, 10.0)
    assert got.determined == {"tflops": False}
    assert got.call_overhead_s == pytest.approx(1e-3, rel=1e-3)
    # The best rate shown: 16 tokens' FLOPs over the call's time less its overhead.
    assert got.tflops == pytest.approx(2 * 16 * EXPERT / (nbytes / 10e9) / 1e12, rel=1e-3)


@pytest.mark.parametrize("tokens, seconds, message", [
    ([4, 4], [1e-3, 1e-3], "two distinct token counts"),
    ([1, 2], [1e-3, 0.0], "finite and > 0"),
    ([1, 2], [1e-3, float("inf")], "finite and > 0"),
])
def test_the_host_fit_refuses_what_cannot_be_fitted(tokens, seconds, message):
    with pytest.raises(ValueError, match=message):
        fit.fit_host(tokens, seconds, EXPERT, 2 * EXPERT, 10.0)


HOST = host_lib.HostCPU("calibrated:testhost", mem_gbps=3.5, tflops=0.0625, threads=2,
                        call_overhead_s=1.5e-3, d2h_gbps=None)


def _with_host(doc, profile_dict=None):
    return {**doc, "host": {"profile": profile_dict if profile_dict is not None
                            else dataclasses.asdict(HOST), "measured": {}}}


def test_a_host_section_round_trips_into_the_cache_host_path(tmp_path, capsys):
    from moejax.cache import build_cache_for
    from moejax.jobs.schema import base_config
    from moejax.jobs.specs import host_cpu_from
    from tests.test_host_compute import CFG, SCORED, B, replay_config

    path = _write(tmp_path / "hardware.json", _with_host(_document()))
    config = replay_config(SCORED, "host_compute")
    config.cache.slots = 2
    config.hardware.file = path
    assert host_cpu_from(config) == HOST  # the file's host, not host.preset's desktop_ddr5
    config.host.mem_gbps = 7.0  # the group's overrides apply on top of the file
    assert host_cpu_from(config) == dataclasses.replace(HOST, mem_gbps=7.0)
    cache = build_cache_for(resolve(config), CFG, {"native": B}, False)
    assert cache.host_path.host == dataclasses.replace(HOST, mem_gbps=7.0)
    assert cache.clock.hw.name == "calibrated:testhost"
    config.host.preset = "server_ddr5"  # given beside the file's host: warned, not used
    say_unapplied(config, False, base_config())
    assert (f"host.preset='server_ddr5' does not apply: hardware.file={path!r} gives the host "
            "profile") in capsys.readouterr().err
    assert host_cpu_from(config).name == "calibrated:testhost"
    # A file without a host section: the preset, as without a file.
    plain = _write(tmp_path / "plain.json", _document())
    config.hardware.file = plain
    assert host_cpu_from(config) == dataclasses.replace(host_lib.get("server_ddr5"),
                                                        mem_gbps=7.0)


@pytest.mark.parametrize("section, message", [
    ([1], 'has no host section\'s "profile" object'),
    ({"measured": {}}, 'has no host section\'s "profile" object'),
    ({"profile": {k: v for k, v in dataclasses.asdict(HOST).items() if k != "tflops"}},
     "its host section's \"profile\" object has no field 'tflops'"),
    ({"profile": {**dataclasses.asdict(HOST), "cores": 2}}, "has a field 'cores'"),
    ({"profile": {**dataclasses.asdict(HOST), "mem_gbps": 0.0}},
     r"host.mem_gbps=0.0 must be a finite number > 0"),
    ({"profile": {**dataclasses.asdict(HOST), "threads": 1.5}},
     r"host.threads=1.5 must be an integer"),
    ({"profile": {**dataclasses.asdict(HOST), "name": 3}}, "name=3 must be a non-empty"),
])
def test_a_bad_host_section_is_one_error_naming_the_file(tmp_path, section, message):
    from moejax.jobs.specs import host_cpu_from

    path = _write(tmp_path / "hardware.json", {**_document(), "host": section})
    config = config_from_flags(DEFAULT, f"--config.hardware.file={path}")
    with pytest.raises(ConfigError, match=message) as e:
        host_cpu_from(config)
    assert str(e.value).startswith(f"hardware.file={path!r}") and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^host.tflops=-1 must be"):  # an override's own
        host_lib.from_file(_write(tmp_path / "good.json", _with_host(_document())), tflops=-1)


TINY_HOST = host_mod.HostPlan(hidden=64, width=32, experts=4, dtype="bfloat16",
                              tokens=(1, 4, 16), matmul_tokens=16, reps=1)


def test_the_host_is_measured_for_real_and_written_alone(tmp_path, monkeypatch, capsys):
    # --host-only on a tiny expert: every measurement timed, the fits through them, and the
    # file's host section read back as the run's host profile.
    monkeypatch.setattr(host_mod, "host_plan", lambda quick: TINY_HOST)
    workdir = tmp_path / "w"
    assert calibrate.main([f"--workdir={workdir}", "--host-only"]) == 0
    out = capsys.readouterr().out
    assert "host CPU (" in out and "fit, live:" in out and "fit, dense:" in out
    doc = json.loads((workdir / "hardware.json").read_text())
    assert "hardware" not in doc and doc["host"]["command"].endswith("--host-only")
    measured = doc["host"]["measured"]
    assert [r["tokens"] for r in measured["timings"]["live"]] == [1, 4, 16]
    for row in measured["timings"]["dense"] + measured["timings"]["live"]:
        assert 0 < row["min_s"] <= row["median_s"] <= row["max_s"] and row["model_s"] > 0
    assert measured["expert_bytes"] == 3 * 64 * 32 * 2
    got = host_lib.from_file(str(workdir / "hardware.json"))
    assert got.name == profile.calibrated_name()
    assert (got.mem_gbps, got.tflops) == (measured["fit_live"]["mem_gbps"],
                                          measured["fit_live"]["tflops"])
    # Into a calibration already there: its device profile kept, the host replaced.
    (workdir / "hardware.json").write_text(json.dumps(_with_host(_document())))
    assert calibrate.main([f"--workdir={workdir}", "--host-only"]) == 0
    doc = json.loads((workdir / "hardware.json").read_text())
    assert doc["hardware"] == hardware.as_dict(MEASURED)
    assert doc["host"]["profile"]["name"] == profile.calibrated_name()
