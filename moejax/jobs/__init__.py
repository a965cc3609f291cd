"""Jobs the main entry point runs, by `config.job`."""

from __future__ import annotations

import ml_collections

from moejax.errors import ConfigError
from moejax.jobs.schema import JOBS


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
