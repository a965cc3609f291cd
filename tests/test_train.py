"""The training job, on its seconds-long smoke variant: learns, checkpoints, resumes, exports
a checkpoint the main job loads; reachable as `config.job = "train"` through the one entry
point (`moejax.jobs.run`, `python -m moejax.main`) and as `python -m moejax.train`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from moejax import jobs
from moejax.jobs.schema import base_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(steps: int):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_small",
                                                  os.path.join(ROOT, "configs", "train_small.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("smoke")
    c.train.steps = steps
    return c


@pytest.mark.slow
def test_train_resume_export(tmp_path, subprocess_env):
    work = str(tmp_path / "train")
    first = jobs.run(_config(6), work)  # config.job = "train" through the one entry point
    assert first["heldout"]["eval/prose_bits_per_byte"] < 8.0
    assert sorted(os.listdir(os.path.join(work, "checkpoints"))) == ["3", "6"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(work, "tensorboard"))
    acc.Reload()
    assert {"loss/bits_per_byte", "loss/load_balance", "eval/code_bits_per_byte"} <= set(
        acc.Tags()["scalars"])
    losses = [e.value for e in acc.Scalars("loss/ce_nats")]
    assert losses[-1] < losses[0], "the loss should go down over the smoke run"

    # Re-running with more steps resumes from the last checkpoint instead of starting over —
    # here through the command line users type.
    run = subprocess.run(
        [sys.executable, "-m", "moejax.train", "--config=configs/train_small.py:smoke",
         "--config.train.steps=8", f"--workdir={work}"],
        cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resuming from step 6" in run.stdout
    second = json.load(open(os.path.join(work, "results.json")))
    assert second["steps"] == 8
    assert "8" in os.listdir(os.path.join(work, "checkpoints"))

    # The export is a moejax checkpoint the main job runs.
    c = base_config()
    c.model.checkpoint = second["export"]
    c.run.max_new_tokens, c.log.progress = 3, False
    c.cache.enabled = False
    out = jobs.run(c, str(tmp_path / "gen"))
    assert len(out["generated_token_ids"]) == 3
    assert json.load(open(os.path.join(work, "results.json")))["steps"] == 8
