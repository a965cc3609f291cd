"""Running replay cells as a sweep worker would, for tests that build a sweep directory."""

from __future__ import annotations

from launch.worker import apply_overrides
from moejax import jobs
from moejax.jobs.schema import base_config


def run_replay_cell(workdir: str, overrides: dict) -> dict:
    """One replay cell (the base config, virtual clock, no progress bar or TensorBoard,
    `overrides` on declared fields) run into `workdir`; its results."""
    c = base_config()
    c.job, c.model.preset, c.clock.kind = "replay", "", "virtual"
    c.log.progress = c.log.tensorboard = False
    apply_overrides(c, overrides)
    return jobs.run(c, workdir)
