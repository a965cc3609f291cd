"""The jobs `python -m moejax.main` runs, by `config.job` (each a library function
`run(config, workdir)`): generate, perplexity, quality, eval, record_traces, replay and train.
`schema.py` declares every field a job config has (`base_config`); `common.py` is what the jobs
share (the decoder over the configured expert source, the cache report)."""

from __future__ import annotations

import ml_collections

from moejax.errors import ConfigError
from moejax.jobs.schema import JOBS, base_config

__all__ = ["JOBS", "base_config", "run"]


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    if config.job not in JOBS:
        raise ConfigError(f"config.job={config.job!r} is not one of {JOBS}")
    if config.job == "generate":
        from moejax.jobs import generate

        return generate.run(config, workdir)
    if config.job == "perplexity":
        from moejax.jobs import perplexity

        return perplexity.run(config, workdir)
    if config.job == "quality":
        from moejax.jobs import quality

        return quality.run(config, workdir)
    if config.job == "eval":
        from moejax.jobs import evaluate  # imports seqio (the `eval` extra) only here

        return evaluate.run(config, workdir)
    if config.job == "record_traces":
        from moejax.jobs import record_traces

        return record_traces.run(config, workdir)
    if config.job == "replay":
        from moejax.jobs import replay

        return replay.run(config, workdir)
    if config.job == "train":
        from moejax.train.loop import train

        return train(config, workdir)
    raise AssertionError(config.job)
