"""End to end: the main job on tiny configs into a temporary workdir, read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from moejax import checkpoint, jobs
from moejax.errors import ConfigError
from moejax.families import FAMILIES, preset
from moejax.jobs.schema import base_config
from moejax.testing import random_model, resident_decoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**run):
    c = base_config()
    c.run.max_new_tokens = 6
    c.log.progress = False
    c.cache.capacity_frac = 0.25  # tiny presets have 32-64 experts: 5% is below top-k
    for k, v in run.items():
        setattr(c.run, k, v)
    return c


@pytest.mark.slow
def test_default_config_generates_and_writes_results(tmp_path):
    results = jobs.run(_config(), str(tmp_path))
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["generated_token_ids"] == results["generated_token_ids"]
    assert len(on_disk["generated_token_ids"]) == 6
    assert on_disk["prompt_ids"] == list(b"The Python interpreter")
    assert on_disk["timings"]["ttft_s"] > 0 and on_disk["timings"]["decode_s"] > 0
    assert on_disk["model"]["family"] == "olmoe"


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpoint_run_matches_direct_decoding(family, tmp_path):
    """`model.checkpoint=` runs the saved model: same tokens as decoding it directly."""
    cfg = preset(family, "tiny")
    model, gate_up, down = random_model(cfg, seed=3)
    checkpoint.save_model(str(tmp_path / "ckpt"), model, gate_up, down)
    c = _config(prompt="Mixture of experts")
    c.model.checkpoint = str(tmp_path / "ckpt")
    results = jobs.run(c, str(tmp_path / "work"))

    prompt = np.asarray([list(b"Mixture of experts")], np.int32)
    direct = resident_decoder(model, gate_up, down, max_len=prompt.shape[1] + 6)
    expected = direct.generate(prompt, 6, eos_id=cfg.eos_token_id).generated_ids[0]
    assert results["generated_token_ids"] == expected


@pytest.mark.slow
def test_prompt_ids_and_warmup_do_not_change_tokens(tmp_path):
    a = jobs.run(_config(prompt_ids="84,104,101", warmup=False), str(tmp_path / "a"))
    b = jobs.run(_config(prompt="The"), str(tmp_path / "b"))
    assert a["prompt_ids"] == b["prompt_ids"] == [84, 104, 101]
    assert a["generated_token_ids"] == b["generated_token_ids"]


@pytest.mark.parametrize("field,value,message", [
    ("run.max_new_tokens", 0, "run.max_new_tokens=0"),
    ("run.prompt_ids", "1,x", "run.prompt_ids"),
    ("run.prompt_ids", "1,999", "outside the vocabulary"),
    ("model.gmm_impl", "loop", "model.gmm_impl='loop'"),
    ("model.family", "gpt", "model.family='gpt'"),
    ("model.preset", "huge", "model.preset='huge'"),
    ("model.checkpoint", "/nonexistent/ckpt", "model.checkpoint='/nonexistent/ckpt'"),
    ("run.max_new_tokens", 10_000, "max_position_embeddings"),
])
def test_bad_config_values_are_named(field, value, message, tmp_path):
    c = _config()
    if field in ("model.family", "model.preset"):
        c.model.preset = "tiny"  # family presets; the embedded model ignores `family`
    group, name = field.split(".")
    setattr(getattr(c, group), name, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jobs.run(c, str(tmp_path))


@pytest.mark.slow
def test_main_cli_door(tmp_path, subprocess_env):
    """The command users type: success writes results; a typo in a field fails loudly."""
    # The run of `_config()` (test_default_config_generates_and_writes_results): the steps it
    # compiled are read from the suite's compilation cache.
    cmd = [sys.executable, "-m", "moejax.main", "--config=configs/default.py",
           f"--workdir={tmp_path}", "--config.run.max_new_tokens=6",
           "--config.cache.capacity_frac=0.25", "--config.log.progress=False"]
    ok = subprocess.run(cmd, cwd=ROOT, env=subprocess_env, capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads((tmp_path / "results.json").read_text())["generated_token_ids"]) == 6
    typo = subprocess.run(cmd + ["--config.run.max_new_token=3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert typo.returncode != 0 and "max_new_token" in typo.stderr
    # A fresh workdir: the first one holds a run's results.json, which a second run refuses.
    bad = subprocess.run([*cmd, f"--workdir={tmp_path / 'bad'}", "--config.model.gmm_impl=loop"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "model.gmm_impl='loop'" in bad.stderr
