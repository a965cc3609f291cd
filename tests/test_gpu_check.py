"""`benchmarks/gpu_check.py --quick`: the device check's code paths at tiny sizes on the backend
the suite runs on — every row of its table there and finite, the GPU-only figures saying so on
a CPU (and not on a GPU), its hardware.json a profile a run can use, its XProf trace written.

The check runs once for the module (`quick_check`); each test reads what it wrote. (Several
tests, not one: pytest-xdist hands out the modules with the fewest tests last, and a module of
one long test left for the end keeps one worker busy after the other has finished.)"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import pytest

from moejax.timing import hardware

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _expected_rows() -> list[str]:
    """The rows every run prints (with a value, finite)."""
    expected = [f"{p}: {what}" for p in ("native", "int4") for what in (
        "a wave's copy_stream load / raw device_put", "share of the load hidden behind an "
        "experts step")]
    expected += ["host->device bandwidth (back-to-back stream)",
                 "host->device latency per transfer", "transfer fit residual (rms)",
                 "peak (roofline fit)", "memory bandwidth (roofline fit)",
                 "launch per step (roofline fit)", "roofline fit residual (rms)",
                 "gpu_check wall time"]
    for cell in ("5% none", "5% temporal", "5% temporal layer by layer"):
        name = f"cell {cell} (51/1024 slots)"
        expected += [f"{name}: TTFT, wall clock", f"{name}: TTFT, virtual clock",
                     f"{name}: TTFT error (virtual - wall) / wall",
                     f"{name}: decode per token, wall clock",
                     f"{name}: decode per token, virtual clock",
                     f"{name}: decode error (virtual - wall) / wall",
                     f"{name}: speculative decode passes", f"{name}: their failed checks"]
    twins = "cell 5% temporal, trace-driven, wall clock"
    expected += [f"{twins}: decode speculating", f"{twins}: decode layer by layer",
                 f"{twins}: speculating / layer by layer"]
    spec = "first command, 100% cold, wall clock, 16 tokens"
    expected += [f"{spec}: decode speculating", f"{spec}: decode layer by layer",
                 f"{spec}: speculating / layer by layer",
                 f"{spec}: speculative passes' failed checks"]
    return expected


@pytest.fixture(scope="module")
def quick_check(tmp_path_factory):
    """One run of `gpu_check.py --quick`: (the finished process, its gpu_check.json, its rows
    by name)."""
    out_dir = tmp_path_factory.mktemp("gpu_check")
    env = dict(os.environ)
    cache_dir = jax.config.jax_compilation_cache_dir  # (the suite's: compiled steps reused)
    if cache_dir:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    out = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--quick",
                          f"--out={out_dir}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = json.loads((out_dir / "gpu_check.json").read_text())
    return out, got, {r["what"]: r for r in got["rows"]}


@pytest.mark.slow
def test_the_quick_check_prints_every_row_finite(quick_check):
    out, got, rows = quick_check
    expected = _expected_rows()
    failed = [r["what"] for r in got["rows"] if r["what"].startswith("FAILED")]  # (sections
    # that raised: their message, so that a failure here says why)
    for what in expected:
        assert what in rows, (what, failed)
        assert rows[what]["value"] is not None and math.isfinite(rows[what]["value"]), \
            (what, rows[what], failed)
    # The table printed holds the same rows.
    for what in expected:
        assert what in out.stdout, what
    assert got["failed"] == []


@pytest.mark.slow
def test_its_xprof_trace_is_written(quick_check):
    _, got, _ = quick_check
    xprof = [r for r in got["rows"] if r["section"] == "xprof"]
    assert len(xprof) == 1 and xprof[0]["value"] > 0
    assert any(f.endswith(".xplane.pb") for f in got["xprof"]["files"])


@pytest.mark.slow
def test_a_figure_only_a_gpu_gives_says_so_on_any_other_backend(quick_check):
    # (the check's subprocess runs on this process's backend: the same environment)
    _, got, rows = quick_check
    backend = jax.default_backend()
    assert got["platform"] == backend
    cell_note = rows["cell 5% none (51/1024 slots): TTFT, wall clock"]["note"]
    peak_note = rows["peak (roofline fit)"]["note"]
    load_note = rows["native: a wave's copy_stream load / raw device_put"]["note"]
    if backend == "gpu":  # the figures are a GPU's: no note says otherwise
        assert cell_note == "", cell_note
        assert "not a GPU's" not in peak_note, peak_note
        assert load_note == "goal >= 0.9", load_note
    else:
        assert cell_note.startswith(f"GPU-only ({backend} here: OLMoE's structure at width "
                                    "8"), cell_note
        assert f"this {backend} backend's, not a GPU's" in peak_note, peak_note
        assert load_note == (f"goal >= 0.9; GPU-only ({backend} here: the CPU backend has no "
                             "copy stream; cache.load_path=auto takes fused on it)"), load_note


@pytest.mark.slow
def test_the_twin_cell_decided_layer_by_layer_and_the_other_speculated(quick_check):
    # The twin cell decided layer by layer; the prefetching cell speculated (and its passes'
    # checks failed: 5% holds few of a layer's experts).
    _, got, _ = quick_check
    twin = {r["cell"]: r["speculation"] for r in got["cells"]}
    assert twin["5% temporal layer by layer"]["speculative_passes"] == 0
    assert twin["5% temporal"]["speculative_passes"] > 0
    assert twin["5% temporal"]["failed_checks"] > 0


@pytest.mark.slow
def test_its_profile_is_one_a_run_reads(quick_check):
    # Its profile is one a run reads back (`--config.hardware.file`).
    _, got, rows = quick_check
    hw = hardware.from_file(got["hardware_file"])
    assert hw.name.startswith("calibrated:")
    assert hw.h2d_gbps == pytest.approx(rows["host->device bandwidth (back-to-back stream)"][
        "value"])
