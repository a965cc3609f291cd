"""python -m moejax.train --config=configs/train_small.py --workdir=DIR"""

from absl import app, flags, logging
from ml_collections import config_flags

from moejax.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, TensorBoard events, export.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None or not _WORKDIR.value:
        raise app.UsageError("--config and --workdir are required")
    logging.set_verbosity(logging.WARNING)
    from moejax.train.loop import train

    try:
        train(_CONFIG.value, _WORKDIR.value)
    except ConfigError as e:
        raise SystemExit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
