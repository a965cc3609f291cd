"""python -m moejax.main --config=configs/NAME.py[:ARG] [--workdir=DIR] [--config.FIELD=VALUE ...]

Runs one job, the config's `job`: {jobs}.
Config files ({configs}):
{config_files}
  Sweeps (grids) are studies' configs: python -m launch.sweep --config=studies/S/grid_NAME.py
  --sweep_dir=D (studies/README.md lists them)
Fields: every field is declared, with its type and default, in moejax/jobs/schema.py;
  --fields lists them all (and, for a field only some jobs read, which). Override any with
  --config.SECTION.FIELD=VALUE; an undeclared field, a value of the wrong type, or a setting
  this run would ignore is said before anything loads.
Workdir: results.json, TensorBoard events, traces and profiles. Without --workdir a run writes
  to runs/<config name>-<date-time>/ and prints it. A workdir holding an earlier run's results
  is refused; --config.run.overwrite=True moves that run's files to DIR/previous/<time>/.
Exit status: 2 for a mistake in what was typed (one line naming it), 1 for a run that failed,
  130 for Ctrl-C (saying what was kept). MOEJAX_DEBUG=1 shows tracebacks.
"""

import os
import sys
import textwrap

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Job config file, configs/NAME.py[:ARG].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for results, events and traces (default: a fresh "
    "runs/<config name>-<date-time>/).")
_FIELDS = flags.DEFINE_bool("fields", False, "List every config field (type, default, the jobs "
                            "that read it) and exit.")


def _help_text() -> str:
    """The module docstring with the jobs and this directory's config files filled in (absl
    prints `__doc__` for --help)."""
    from moejax.jobs.schema import JOBS

    folder = "configs"
    names = sorted(n for n in (os.listdir(folder) if os.path.isdir(folder) else ())
                   if n.endswith(".py") and not n.startswith(("_", "grid_")))
    files = textwrap.fill(", ".join(names) or "none in this directory", width=92,
                          initial_indent="  ", subsequent_indent="  ")
    return __doc__.format(jobs=", ".join(JOBS), configs=f"{folder}/", config_files=files)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _FIELDS.value:
        from moejax.jobs.declared import listing
        from moejax.jobs.schema import READ_BY, base_config

        print(f"{'field':38} {'type':6} default  [the only jobs that read it]")
        print("\n".join(listing(base_config(), READ_BY)))
        return
    if _CONFIG.value is None:
        raise app.UsageError("--config is required (--config=configs/default.py runs the "
                             "shipped model; --help lists the config files)")
    from moejax import workdir as workdir_lib
    from moejax.jobs.declared import check_typed
    from moejax.jobs.schema import NOT_GIVEN

    check_typed(sys.argv[1:], _CONFIG.value, NOT_GIVEN)
    if not flags.FLAGS["verbosity"].present:  # orbax/XLA INFO chatter: --verbosity=0 shows it
        logging.set_verbosity(logging.WARNING)
    from moejax import jobs

    workdir = _WORKDIR.value or workdir_lib.fresh(_config_argument())
    if not _WORKDIR.value:
        jobs.check(_CONFIG.value)  # a mistake is its one line, before a workdir is named
        print(f"workdir: {workdir}", file=sys.stderr)
    jobs.run(_CONFIG.value, workdir, checked=not _WORKDIR.value)


def _config_argument() -> str:
    """`--config`'s argument as typed (`configs/NAME.py[:ARG]`)."""
    from moejax.cli import argument_of

    return argument_of("config", sys.argv[1:])


def _kept() -> str:
    """What Ctrl-C before the job claimed its workdir kept (once claimed, `jobs.run` says)."""
    return f"nothing written to {_WORKDIR.value}" if _WORKDIR.value else "nothing written"


__doc__ = _help_text()


def _say_moved_fields() -> None:
    """A flag naming a field that moved into its job's section (`--config.trace`) names the
    new one (`moejax.cli` parses the flags and imports no job: it is given the table)."""
    from moejax.cli import set_moved_fields
    from moejax.jobs.schema import MOVED

    set_moved_fields(MOVED)


_say_moved_fields()


def start(prog: str = "moejax.main") -> None:
    """Runs this door as `prog` through the one error path (`moejax.cli.run_absl`): a mistake
    in what was typed is one line and status 2 (`python -m moejax.main`, `python -m
    moejax.train`)."""
    from moejax.cli import run_absl

    run_absl(prog, main, kept=_kept)


if __name__ == "__main__":
    start()
