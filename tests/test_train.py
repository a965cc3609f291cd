"""The training job, on its seconds-long smoke variant: learns, checkpoints, resumes, exports
a checkpoint the main job loads."""

from __future__ import annotations

import json
import os

from moejax import jobs
from moejax.job_config import base_config
from moejax.train.loop import train

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


def test_train_resume_export(tmp_path, capsys):
    work = str(tmp_path / "train")
    first = train(_config(6), work)
    assert first["heldout"]["eval/prose_bits_per_byte"] < 8.0
    assert sorted(os.listdir(os.path.join(work, "checkpoints"))) == ["3", "6"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(work, "tensorboard"))
    acc.Reload()
    assert {"loss/bits_per_byte", "loss/load_balance", "eval/code_bits_per_byte"} <= set(
        acc.Tags()["scalars"])
    losses = [e.value for e in acc.Scalars("loss/ce_nats")]
    assert losses[-1] < losses[0], "the loss should go down over the smoke run"

    # Re-running with more steps resumes from the last checkpoint instead of starting over.
    capsys.readouterr()
    second = train(_config(8), work)
    assert "resuming from step 6" in capsys.readouterr().out
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
