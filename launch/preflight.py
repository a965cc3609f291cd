"""Every cell's config built and checked before a sweep runs a cell or writes its Slurm array:
the config file's `get_config(arg)`, the cell's overrides set on its declared fields
(`worker.apply_overrides`, as the worker sets them), and what `moejax.jobs.run` checks before
a job starts (`moejax.jobs.check`: the job, the cache / clock / storage / io / policy fields,
the job's own fields). A typo in `sweep(add)` or a value outside a field is then one usage
error at launch, naming the cells it breaks, instead of the same failure in every cell after
the sweep has started. What only the model or the run can tell (a checkpoint that does not
load, a slot count above the model's experts) still fails in its cell.

About 1 ms a cell on a 2-core machine (each cell's config a copy of one `get_config` result,
`cells.get_config_copy`): `python -m launch.sweep --config=studies/specmd/grid_specmd.py
--sweep_dir=D --dry_run` (4,692 cells) takes 5.4 s, 1.7 s for the 768 cells of
`:traces=captures` (2026-12-06); the launcher says so before the check starts
(`expected_seconds`).
The checks run in one spawned process (`check_in_subprocess`), so
that the launching process stays free of JAX, as it always was; a local run has them shared by
the workers of its pool (`check_in_pool`), which then run the cells: they start once, and the
check takes 1/workers of the time."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from concurrent.futures.process import BrokenProcessPool

from launch import cells as cells_lib
from launch import worker

# What checking n cells takes, roughly (`expected_seconds`, said before the check starts):
# starting the process and importing what a check needs, then each cell. Measured on a 2-core
# machine (the dry runs above, 2026-12-06): 1.0 s and ~0.9 ms a cell.
START_S = 1.0
PER_CELL_S = 0.001


def expected_seconds(cells: int, processes: int = 1) -> float:
    """`cells` checked by `processes` processes at once (a local run's pool)."""
    return START_S + PER_CELL_S * -(-cells // max(processes, 1))


# The checking process's environment defaults (os.environ wins): it needs no accelerator.
CHECK_ENV = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


class ConfigFileError(Exception):
    """The config file's `get_config(arg)` raised: every cell would fail the same way."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def cell_errors(config_path: str, arg: str | None,
                cells: list[cells_lib.Cell]) -> dict[str, str]:
    """Cell name -> why its config is refused (one line), for the cells whose config does not
    build or check; empty when every cell's does. A `get_config(arg)` that raises for the first
    cell is `ConfigFileError` (its exception in `error`). Errors outside what a config check
    raises (a defect, not a value) propagate."""
    from moejax import jobs
    from moejax.errors import ConfigError

    module = cells_lib.load_config_module(config_path)
    errors: dict[str, str] = {}
    for i, cell in enumerate(cells):
        try:  # a fresh config per cell, as the worker builds it
            config = cells_lib.get_config_copy(module, arg)
        except Exception as e:
            if i == 0:
                raise ConfigFileError(e) from e
            errors[cell.name] = f"get_config({arg!r}): {type(e).__name__}: {e}"
            continue
        try:
            worker.apply_overrides(config, cell.overrides)
            jobs.check(config, warn=False)
        except (ConfigError, ValueError, TypeError, KeyError) as e:
            errors[cell.name] = _one_line(e)
    return errors


def _one_line(e: BaseException) -> str:
    """A check's message on one line (a KeyError's without the quotes its `str` adds; a
    TypeError's with its kind)."""
    if isinstance(e, KeyError) and len(e.args) == 1:
        text = str(e.args[0])
    elif isinstance(e, ValueError):
        text = str(e)
    else:
        text = f"{type(e).__name__}: {e}"
    return " ".join(text.split())


def checked(spec: str, config_path: str, arg: str | None,
            cells: list[cells_lib.Cell]) -> tuple[str | None, dict[str, str]]:
    """`cell_errors` with a `get_config(arg)` that raises told as the usage error's text (the
    first item; None when it did not raise), in the process that ran it (its traceback names
    the config file's line)."""
    from launch import sweep

    try:
        return None, cell_errors(config_path, arg, cells)
    except ConfigFileError as e:
        if not isinstance(e.error, sweep.CONFIG_FILE_ERRORS):
            raise e.error from None
        return str(sweep.config_file_error(f"--config={spec}: get_config({arg!r})",
                                           config_path, e.error)), {}


def check_in_pool(pool: cf.ProcessPoolExecutor, processes: int, spec: str, config_path: str,
                  arg: str | None, cells: list[cells_lib.Cell]
                  ) -> tuple[str | None, dict[str, str]]:
    """`checked`, shared by the `processes` workers of `pool` (a local run's own pool, which
    runs the cells next): the cells cut into one consecutive part per worker, the answers
    joined in the cells' order (the refused cells as one process would list them; a
    `get_config(arg)` that raises, as the first part says it). A worker that dies is a usage
    error, as in `check_in_subprocess`."""
    from moejax.cli import UsageError

    n = max(1, min(processes, len(cells)))
    size = -(-len(cells) // n)
    futures = [pool.submit(checked, spec, config_path, arg, cells[i:i + size])
               for i in range(0, len(cells), size)]
    message, errors = None, {}
    try:
        for fut in futures:
            said, refused = fut.result()
            message = message if message is not None else said
            errors.update(refused)
    except BrokenProcessPool:
        raise UsageError(f"--config={spec}: a process checking the cells' configs died; "
                         "run one cell with python -m moejax.main to see why") from None
    return message, errors


def check_in_subprocess(spec: str, config_path: str, arg: str | None,
                        cells: list[cells_lib.Cell]) -> tuple[str | None, dict[str, str]]:
    """`checked`, run in one spawned process. A process that dies (a config file's code that
    ends it, a broken install) is a usage error saying how to see why."""
    from moejax.cli import UsageError

    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=worker.init,
                                initargs=(CHECK_ENV,)) as pool:
        try:
            return pool.submit(checked, spec, config_path, arg, cells).result()
        except BrokenProcessPool:
            raise UsageError(f"--config={spec}: the process checking the cells' configs died; "
                             "run one cell with python -m moejax.main to see why") from None
