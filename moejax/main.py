"""The door: `python -m moejax.main --config=configs/NAME.py --workdir=DIR`.

Everything else is a library function (`moejax.jobs.run`) that tests import and call.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from moejax.errors import CheckpointError, ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Job config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for results, events and traces.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None or not _WORKDIR.value:
        raise app.UsageError("--config and --workdir are required")
    logging.set_verbosity(logging.WARNING)  # keep orbax/XLA INFO chatter out of the output
    from moejax import jobs

    try:
        jobs.run(_CONFIG.value, _WORKDIR.value)
    except (ConfigError, CheckpointError) as e:
        raise SystemExit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
