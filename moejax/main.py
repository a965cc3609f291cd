"""The door: `python -m moejax.main --config=configs/NAME.py --workdir=DIR`.

Everything else is a library function (`moejax.jobs.run`) that tests import and call. Errors
go through `moejax.cli.run_absl`: a user's mistake is one line naming the flag, field, file or
workdir at fault (status 2; 1 for a run that failed; 130 for Ctrl-C, saying what was kept).
"""

from absl import app, flags, logging
from ml_collections import config_flags

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

    jobs.run(_CONFIG.value, _WORKDIR.value)


def _kept() -> str:
    """What Ctrl-C before the job claimed its workdir kept (once claimed, `jobs.run` says)."""
    return f"nothing written to {_WORKDIR.value}" if _WORKDIR.value else ""


if __name__ == "__main__":
    from moejax.cli import run_absl

    run_absl("moejax.main", main, kept=_kept)
