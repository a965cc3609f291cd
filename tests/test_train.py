"""The training job, on its seconds-long smoke variant: learns, checkpoints, resumes, exports
a checkpoint the main job loads; reachable as `config.job = "train"` through the one entry
point (`moejax.jobs.run`, `python -m moejax.main`) and as `python -m moejax.train`.

One run, resumed once (module-scoped fixtures), checked by three tests. (Several tests, not
one: pytest-xdist hands out the modules with the fewest tests last, and a module of one long
test left for the end keeps one worker busy after the other has finished.)"""

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


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """The smoke run of 6 steps: its workdir, its results, and what it left there (checkpoints,
    TensorBoard scalars) read before anything resumed it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work = str(tmp_path_factory.mktemp("train") / "train")
    first = jobs.run(_config(6), work)  # config.job = "train" through the one entry point
    acc = EventAccumulator(os.path.join(work, "tensorboard"))
    acc.Reload()
    return {"work": work, "results": first,
            "checkpoints": sorted(os.listdir(os.path.join(work, "checkpoints"))),
            "scalars": set(acc.Tags()["scalars"]),
            "losses": [e.value for e in acc.Scalars("loss/ce_nats")]}


@pytest.fixture(scope="module")
def resumed(trained, subprocess_env) -> subprocess.CompletedProcess:
    """`trained` re-run with more steps (8) — through the command line users type."""
    return subprocess.run(
        [sys.executable, "-m", "moejax.train", "--config=configs/train_small.py:smoke",
         "--config.train.steps=8", f"--workdir={trained['work']}"],
        cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_train_learns_checkpoints_and_logs(trained):
    assert trained["results"]["heldout"]["eval/prose_bits_per_byte"] < 8.0
    assert trained["checkpoints"] == ["3", "6"]
    assert {"loss/bits_per_byte", "loss/load_balance", "eval/code_bits_per_byte"} <= \
        trained["scalars"]
    losses = trained["losses"]
    assert losses[-1] < losses[0], "the loss should go down over the smoke run"


@pytest.mark.slow
def test_a_rerun_with_more_steps_resumes(trained, resumed):
    # Re-running with more steps resumes from the last checkpoint instead of starting over.
    work = trained["work"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 6" in resumed.stdout
    second = json.load(open(os.path.join(work, "results.json")))
    assert second["steps"] == 8
    assert "8" in os.listdir(os.path.join(work, "checkpoints"))


@pytest.mark.slow
def test_the_export_is_a_checkpoint_the_main_job_runs(trained, resumed, tmp_path):
    work = trained["work"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = json.load(open(os.path.join(work, "results.json")))
    c = base_config()
    c.model.checkpoint = second["export"]
    c.run.max_new_tokens, c.log.progress = 3, False
    c.cache.enabled = False
    out = jobs.run(c, str(tmp_path / "gen"))
    assert len(out["generated_token_ids"]) == 3
    assert json.load(open(os.path.join(work, "results.json")))["steps"] == 8
