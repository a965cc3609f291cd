"""The clock's validation (moejax/sim/validate.py, agreement.py): the statistics a reviewer asks
for, computed as defined (Kendall's tau-b worked by hand, spreads, predicted ties, the goals);
the command's bad input is one line; and, end to end, a calibration then a validation write
their files and every later run with the profile quotes how far the clock was."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from moejax.calibration import agreement, matrix, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _row(group, capacity, eviction, wall, virtual, runs=None, misses=1, decode=None):
    """A validation row: TTFT `wall` (median) with its runs, `virtual` predicted; decode the
    same unless given."""
    runs = runs or [wall, wall]
    decode = decode or (wall, virtual, runs)
    return {"group": group, "capacity_frac": capacity, "prefetch": "none",
            "cell": f"{capacity} {eviction}", "misses": misses, "requests": 10,
            "settings": {"policies.eviction": eviction},
            "wall": {"ttft_s": wall, "decode_s": decode[0], "decode_tokens": 4,
                     "runs": [{"ttft_s": t, "decode_s": d} for t, d in zip(runs, decode[2])]},
            "virtual": {"ttft_s": virtual, "decode_s": decode[1], "decode_tokens": 4},
            "ttft_error": (virtual - wall) / wall, "decode_error": (decode[1] - decode[0])
            / decode[0]}


def test_kendall_tau_b_as_worked_by_hand():
    assert agreement.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert agreement.kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    # pairs: (1,2) C, (1,3) C, (2,3) D -> (2 - 1) / 3
    assert agreement.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    # a tie in y: C = 2 ((1,2), (1,3)), D = 0, ties_y = 1 -> 2 / sqrt(3 * 2)
    assert agreement.kendall_tau([1, 2, 3], [1, 2, 2]) == pytest.approx(2 / 6 ** 0.5)
    assert agreement.kendall_tau([1, 2, 3], [5, 5, 5]) is None  # no order to compare


def test_the_summary_is_of_absolute_errors():
    rows = [_row("g", 0.05, "lru", 1.0, v) for v in (1.1, 0.8, 1.02, 1.5)]
    s = agreement.summary(rows)["ttft"]
    assert s["cells"] == 4 and s["over"] == 3
    assert s["median"] == pytest.approx(0.15)  # |errors| 0.02, 0.1, 0.2, 0.5
    assert s["max"] == pytest.approx(0.5)
    assert s["signed_median"] == pytest.approx(0.06)
    # signed errors -0.2, 0.02, 0.1, 0.5: numpy's linear percentiles at 5% and 95%
    assert s["signed_p5"] == pytest.approx(-0.2 + 0.15 * 0.22)
    assert s["signed_p95"] == pytest.approx(0.1 + 0.85 * 0.4)


def test_the_summary_records_the_conditions_the_cells_ran(tmp_path):
    """`covers`: each policy field's specs as they ran (a field left to the default is the
    default's spec), from the validation's own cells."""
    from moejax.calibration import validate

    ((group, cells),) = matrix.validation_matrix(quick=True)
    base = matrix.base_config(group, str(tmp_path / "hardware.json"), 48, 16, 32)
    base.hardware.file = ""  # (resolving a config reads no profile here)
    got = validate.covers([c.config(base) for c in cells])
    assert got == {"policies.eviction": ["lru"], "policies.prefetch": ["none", "temporal"],
                   "cache.prefetch_queue": ["immediate"], "cache.precision": ["native"],
                   "policies.miss": ["fetch"]}


def test_rankings_count_only_what_the_spreads_separate():
    rows = [  # lru fastest and well apart; fifo and lfu inside each other's spread
        _row("g", 0.25, "lru", 1.0, 1.0, runs=[0.95, 1.05]),
        _row("g", 0.25, "fifo", 2.0, 2.5, runs=[1.9, 2.2]),
        _row("g", 0.25, "lfu", 2.1, 2.0, runs=[2.0, 2.3]),
    ]
    (r,) = agreement.rankings(rows, matrix.condition, matrix.policy)
    t = r["ttft"]
    assert t["separated_pairs"] == 2 and t["decided_pairs"] == 2
    assert t["tau_decided"] == 1.0  # lru before both, as predicted
    assert t["tau"] == pytest.approx(1 / 3)  # the unseparated pair is ordered the other way
    assert t["winner_holds"] and t["measured_winner"] == "lru none"
    rows[0] = _row("g", 0.25, "lru", 1.0, 3.0, runs=[0.95, 1.05])  # predicted slowest
    (r,) = agreement.rankings(rows, matrix.condition, matrix.policy)
    assert not r["ttft"]["winner_holds"] and r["ttft"]["tau_decided"] == -1.0
    met = agreement.goals(agreement.summary(rows), [r])
    assert not met["winners"]["met"] and not met["tau"]["met"]


def test_a_predicted_tie_is_labelled_and_not_a_ranking():
    rows = [_row("g", 1.0, e, w, 1.0, runs=[w, w]) for e, w in (("lru", 1.0), ("fifo", 1.3))]
    (r,) = agreement.rankings(rows, matrix.condition, matrix.policy)
    t = r["ttft"]
    assert t["predicted_tie"] and t["structural"]  # the same misses: the same choices
    assert t["decided_pairs"] == 0 and t["missed_ties"] == ["lru none / fifo none"]
    assert t["winner_holds"]  # the measured winner is among the predicted fastest
    assert "predicted tie: structural" in agreement.summary_text(
        agreement.summary(rows), [r], agreement.goals(agreement.summary(rows), [r]))


def test_the_matrix_is_at_least_48_cells_fitted_on_other_data():
    cells = matrix.validation_matrix()
    assert sum(len(c) for _, c in cells) >= 48
    names = {g.name for g, _ in cells}
    traces = {g.trace for g, _ in cells if g.trace}
    assert not traces & {g.trace for g in matrix.CALIBRATION_GROUPS if g.trace}
    assert matrix.VALIDATION_PROMPT != matrix.CALIBRATION_PROMPT
    assert {"embedded_disk", "embedded_host"} <= names


def test_the_plot_is_a_png(tmp_path):
    rows = [_row("g", 0.05, "lru", 1e-3, 1.1e-3), _row("h", 0.25, "fifo", 2e-3, 1.9e-3)]
    path = agreement.plot(rows, str(tmp_path / "v.png"), "test")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("flags, message", [
    (["--reps", "0"], "--reps=0 must be >= 1"),
    (["--tokens", "1"], "--tokens=1: a cell decodes after its prefill"),
    (["--width", "-1"], "--width=-1 must be >= 0"),
])
def test_bad_flags_are_one_line_each(tmp_path, capsys, flags, message):
    assert validate.main(["--workdir", str(tmp_path / "w"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_profile_to_validate_must_exist_and_have_host_work(tmp_path, capsys):
    assert validate.main(["--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert "hardware.json: no such file (python -m moejax.calibration" in err
    assert len(err.splitlines()) == 1
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"format": "moejax.hardware/1"}))
    assert validate.main(["--workdir", str(tmp_path / "w"), "--hardware_file",
                          str(plain)]) == 2
    err = capsys.readouterr().err.strip()
    assert "it has no host_work section" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_calibrate_then_validate_end_to_end(tmp_path, subprocess_env):
    """`calibrate --quick` writes a profile with the host's work fitted; `validate --quick`
    runs its cells against it, writes validation.json and the plot, and leaves its summary in
    the profile, which a run with `--config.hardware.file` then quotes."""
    w = str(tmp_path / "w")
    # The suite's compilation cache: validate's cells read the steps calibrate compiled.
    env = {**subprocess_env, "PYTHONPATH": ROOT}
    cal = subprocess.run([sys.executable, "-m", "moejax.sim.calibrate", f"--workdir={w}",
                          "--quick"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert cal.returncode == 0, cal.stderr
    assert "the host's work, fitted to" in cal.stdout
    doc = json.load(open(os.path.join(w, "hardware.json")))
    assert doc["host_work"]["fit"]["points"] > 0 and doc["host_work"]["steps"]
    val = subprocess.run([sys.executable, "-m", "moejax.sim.validate", f"--workdir={w}",
                          "--quick"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert val.returncode == 0, val.stderr
    assert "goals:" in val.stdout and "rankings within each condition" in val.stdout
    got = json.load(open(os.path.join(w, "validation.json")))
    assert len(got["cells"]) == 2 and got["summary"]["decode"]["cells"] == 2
    assert os.path.isfile(os.path.join(w, "validation.png"))
    summary = json.load(open(os.path.join(w, "hardware.json")))["validation"]
    assert summary["cells"] == 2 and summary["decode"]["median"] is not None
    run = subprocess.run(
        [sys.executable, "-m", "moejax.main", "--config=configs/replay.py",
         f"--config.replay.trace={os.path.join(ROOT, 'moejax/assets/captures/olmoe_code.jsonl')}",
         "--config.model.family=olmoe", "--config.model.preset=olmoe-1b-7b",
         "--config.model.width=32", "--config.policies.prefetch=none",
         f"--config.hardware.file={os.path.join(w, 'hardware.json')}",
         "--config.log.tensorboard=False",  # (its writer imports torch: seconds)
         f"--workdir={tmp_path / 'r'}"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "with the live runtime's host work (calibrated:" in run.stdout
    assert "validated " in run.stdout and "on 2 live cells: median |error| TTFT" in run.stdout


def test_a_capture_given_as_a_path_drives_olmoe(tmp_path):
    """`calibrate --trace=PATH` takes a capture of OLMoE's routing by its path, as by a
    bundled name: the cells follow that file."""
    import shutil

    from moejax import bundled

    path = str(tmp_path / "mine.jsonl")
    shutil.copy(bundled.capture_path("olmoe_code"), path)
    group = matrix.Group("mine", trace=path)
    assert group.family() == bundled.CAPTURE_MODELS["olmoe"] and group.path == path
    c = matrix.base_config(group, str(tmp_path / "hw.json"), 12, 8, 8)
    assert c.policies.routing == f"trace(path={path!r})" and c.model.width == 8
    assert matrix.Group("q", trace="qwen_code").family() == bundled.CAPTURE_MODELS["qwen"]
