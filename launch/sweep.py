"""Runs a config file's sweep: every `add(**overrides)` call of its `sweep(add)` is one cell,
run into DIR/cells/<name>/ (results.json marks it finished).

    python -m launch.sweep --config=configs/NAME.py[:ARG] --sweep_dir=DIR [--workers=2]
        [--only=REGEX] [--dry_run] [--slurm [--time=04:00:00] [--partition=P] [--gres=gpu:1]]

Locally, cells run in a pool of `--workers` spawned processes (this process never imports
JAX); finished cells are skipped, so re-running an interrupted sweep finishes it. Failed cells
are listed in DIR/failures.json and make the exit status 1. `--slurm` writes DIR/cells.txt and
DIR/slurm.sbatch (a job array) instead of running anything. See launch/README.md.

Before anything runs (and in `--dry_run`) it prints the sweep's size and an estimate of its run
time: the median wall time of the cells earlier runs finished in this sweep directory (each
cell's `wall_time.json`), or "unknown" until some have. While a local sweep runs, a progress
line on stderr after each finished cell (at most about 50 lines, or one line rewritten on a
terminal) corrects it from the cells timed in this run (`Progress`). A mistake in what was
typed (a flag, the config file or its argument, a sweep directory that cannot be created or
written) is one line and exit status 2, before anything is written (`moejax.cli.guarded`); so
is a cell whose config does not build or check (`launch/preflight.py`: every selected cell's,
in a spawned process, announced on stderr first with its rough duration).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import errno
import fcntl
import json
import multiprocessing
import os
import re
import signal
import statistics
import sys
import time
import traceback
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, TextIO

from launch import cells as cells_lib
from launch import preflight, slurm, worker
from moejax import cli, workdir
from moejax.cli import UsageError, debug, guarded, message_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Several JAX processes share one accelerator in a local pool: none may grab most of its
# memory up front. Set the variable yourself to override.
WORKER_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


PROG = "python -m launch.sweep"
# What Slurm's --time and --mem take (sbatch(1)); anything else would fail only at submission.
_SLURM_TIME = re.compile(r"(\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)\Z",
                         re.IGNORECASE)
_SLURM_MEM = re.compile(r"\d+[KMGT]?\Z", re.IGNORECASE)


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({e}); it "
                                         f"takes one as re.search does, e.g. 'eviction=lru,'")
    return text


def _slurm_field(pattern: re.Pattern | None, example: str):
    """An argparse type: one #SBATCH value (no white space), matching `pattern` if given."""
    def check(text: str) -> str:
        if any(c.isspace() for c in text) or (pattern is not None and text
                                                and not pattern.match(text)):
            raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm value such as {example}")
        return text
    return check


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog=PROG, description="Runs a config file's sweep(add): one "
                                "job per cell, locally in a process pool or as a Slurm array.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", required=True, help="config file, PATH[:ARG]")
    p.add_argument("--sweep_dir", required=True, help="output directory of the sweep")
    p.add_argument("--workers", type=int, default=2, help="local pool processes")
    p.add_argument("--only", default=None, type=_regex,
                   help="only cells whose name matches this regex (re.search)")
    p.add_argument("--dry_run", action="store_true", help="list the cells; run nothing")
    p.add_argument("--slurm", action="store_true", help="write a Slurm job array, run nothing")
    d = slurm.SlurmOptions()
    p.add_argument("--time", default=d.time, type=_slurm_field(_SLURM_TIME, "04:00:00"),
                   help="Slurm --time per cell")
    p.add_argument("--partition", default=d.partition, type=_slurm_field(None, "gpu"),
                   help="Slurm --partition (empty: default)")
    p.add_argument("--gres", default=d.gres, type=_slurm_field(None, "gpu:1"),
                   help="Slurm --gres (empty: none)")
    p.add_argument("--cpus_per_task", type=int, default=d.cpus_per_task)
    p.add_argument("--mem", default=d.mem, type=_slurm_field(_SLURM_MEM, "64G"),
                   help="Slurm --mem per cell")
    p.add_argument("--max_parallel", type=int, default=d.max_parallel,
                   help="Slurm array throttle %%K (0: none)")
    p.add_argument("--job_name", default=d.job_name, type=_slurm_field(None, "moejax-grid"),
                   help="Slurm job name (empty: moejax-<sweep dir>)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers={args.workers}: must be >= 1")
    if args.cpus_per_task < 1:
        p.error(f"--cpus_per_task={args.cpus_per_task}: must be >= 1")
    if args.max_parallel < 0:
        p.error(f"--max_parallel={args.max_parallel}: must be >= 0 (0: no limit)")
    return args


def write_sweep_json(sweep_dir: str, config: str, arg: str | None,
                     cells: list[cells_lib.Cell]) -> None:
    from moejax.results import write_json_atomic  # json/os only: no JAX

    write_json_atomic(os.path.join(sweep_dir, "sweep.json"), {
        "config": config,
        "config_arg": arg,
        "launcher": cells_lib.launcher_argv(),
        "cells": [{"name": c.name, "overrides": c.overrides,
                   "command": cells_lib.command(config, arg,
                                                cells_lib.cell_dir(sweep_dir, c.name),
                                                c.overrides)}
                  for c in cells],
    })


@contextlib.contextmanager
def _sweep_lock(sweep_dir: str):
    """One local launcher per sweep directory: a second one would re-run (and first empty) the
    cells the first is running. The lock goes with the process, however it ends."""
    try:
        f = open(os.path.join(sweep_dir, ".lock"), "w")
    except OSError as e:
        raise _cannot_create(sweep_dir, e) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise UsageError(f"--sweep_dir={sweep_dir}: another launcher is running this sweep "
                         f"(it holds {os.path.join(sweep_dir, '.lock')}); wait for it, or "
                         f"stop it first") from None
    try:
        yield
    finally:
        f.close()


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _new_pool(workers: int) -> cf.ProcessPoolExecutor:
    # spawn: JAX does not survive fork after it has initialised, and workers should start clean.
    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(
        "spawn"), initializer=worker.init, initargs=(WORKER_ENV if workers > 1 else {},))


def _stop(pool: cf.ProcessPoolExecutor) -> None:
    """Kills the workers (their running cells leave no results.json) and drops queued cells.
    The processes are taken first: shutdown() forgets them."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for p in processes:
        if p.is_alive():
            p.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        p.join(timeout=10)


def _finish(pool: cf.ProcessPoolExecutor) -> None:
    """Ends a pool every cell of which has its outcome. Its workers are idle, and a cell's
    files are written and closed before its outcome comes back, so they are stopped as `_stop`
    does rather than left to exit: an exit tears down the interpreter with JAX and numba in it,
    about a second a worker, which the sweep would wait for."""
    _stop(pool)


class _Runner:
    """The local pool. A worker that dies (segfault, OOM kill) breaks the whole pool: every
    cell still in it fails with BrokenProcessPool. Cells that had not started go to a fresh
    pool; those that were running (their RUNNING marker is left behind) run again one at a
    time at the end, where a worker's death is the cell's own and fails only that cell."""

    def __init__(self, config: str, arg: str | None, sweep_dir: str, workers: int,
                 progress: Progress, pool: cf.ProcessPoolExecutor | None = None):
        self.config, self.arg, self.sweep_dir, self.workers = config, arg, sweep_dir, workers
        self.progress = progress
        self.failures: dict[str, str] = {}
        self.done = 0
        self._started = pool  # started before (it checked the cells): the first round's

    def _pool(self, cells: list[cells_lib.Cell]) -> cf.ProcessPoolExecutor:
        pool, self._started = self._started, None
        return pool or _new_pool(min(self.workers, len(cells)))

    def close(self) -> None:
        """Stops the pool it was given if no round took it."""
        if self._started is not None:
            _stop(self._started)
            self._started = None

    def _marker(self, cell) -> str:
        return os.path.join(cells_lib.cell_dir(self.sweep_dir, cell.name), worker.RUNNING)

    def _submit(self, pool, cell):
        directory = cells_lib.cell_dir(self.sweep_dir, cell.name)
        if not workdir.held(directory):  # left by a killed launcher (a live run's stays:
            with contextlib.suppress(FileNotFoundError):  # its claim refuses this one)
                os.unlink(self._marker(cell))
        return pool.submit(worker.run_cell, self.config, self.arg, cell.name, cell.overrides,
                           directory)

    def _record(self, cell, outcome: dict) -> None:
        if outcome["ok"]:
            self.done += 1
        else:
            self.failures[cell.name] = outcome["error"]
            self.progress.note(f"FAILED {cell.name}: {outcome['error']}")
        self.progress.cell(outcome["ok"], outcome.get("seconds"))

    def _outcome(self, fut) -> dict | None:
        """The cell's outcome, or None when its worker died (the pool is broken)."""
        try:
            return fut.result()
        except BrokenProcessPool:
            return None
        except Exception as e:  # run_cell returns failures; this is the pool's own error
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}

    def _round(self, cells: list[cells_lib.Cell]) -> list[cells_lib.Cell]:
        """Runs `cells` in a pool; returns those a broken pool left without an outcome."""
        broken = []
        pool = self._pool(cells)
        try:
            futures = {self._submit(pool, c): c for c in cells}
            for fut in cf.as_completed(futures):
                outcome = self._outcome(fut)
                if outcome is None:
                    broken.append(futures[fut])
                else:
                    self._record(futures[fut], outcome)
        except BaseException:
            _stop(pool)
            raise
        _finish(pool)
        return broken

    def _finished_anyway(self, broken: list[cells_lib.Cell]) -> list[cells_lib.Cell]:
        """Records as done the cells of a broken pool whose worker died after their job wrote
        a complete results.json (their stale marker removed); returns the others."""
        rest = []
        for c in broken:
            if worker.clear_stale_marker(cells_lib.cell_dir(self.sweep_dir, c.name)):
                self.progress.note(f"a worker process died after finishing {c.name}; its "
                                   f"results.json is complete")
                self._record(c, {"ok": True, "error": None})
            else:
                rest.append(c)
        return rest

    def run(self, todo: list[cells_lib.Cell]) -> None:
        pending, alone = list(todo), []
        while pending:
            broken = self._finished_anyway(self._round(pending))
            running = [c for c in broken if os.path.exists(self._marker(c))]
            if broken:
                self.progress.note(
                    f"a worker process died while running "
                    f"{', '.join(c.name for c in running) or 'no cell'}; "
                    f"{'they run' if running else 'the rest runs'} alone at the end")
            if not running:  # died outside any cell: do not loop, isolate them all
                alone += broken
                break
            alone += running
            pending = [c for c in broken if c not in running]
        pool = None
        try:
            for cell in alone:
                pool = pool or _new_pool(1)
                outcome = self._outcome(self._submit(pool, cell))
                if outcome is None:  # alone in the pool: this cell killed its worker
                    _stop(pool)
                    pool = None
                    if worker.clear_stale_marker(cells_lib.cell_dir(self.sweep_dir,
                                                                    cell.name)):
                        outcome = {"ok": True, "error": None}  # died after finishing
                    else:
                        outcome = {"ok": False, "error": "the worker process died running "
                                   "this cell (a crash, or killed: out of memory?)"}
                self._record(cell, outcome)
        except BaseException:
            if pool is not None:
                _stop(pool)
            raise
        if pool is not None:
            _finish(pool)


def run_local(config: str, arg: str | None, sweep_dir: str, selected: list[cells_lib.Cell],
              workers: int, pool: cf.ProcessPoolExecutor | None = None) -> int:
    """Runs the selected cells that have not finished, in a pool of `workers` processes
    (`pool`: one already started, for the first of them; shut down here)."""
    # A finished cell (complete results.json) is skipped; a worker killed just after writing
    # it left its RUNNING marker too, removed here so no finished cell keeps one.
    finished = [c for c in selected
                if worker.clear_stale_marker(cells_lib.cell_dir(sweep_dir, c.name))]
    done = {c.name for c in finished}
    todo = [c for c in selected if c.name not in done]
    t0 = time.perf_counter()
    failures_json = os.path.join(sweep_dir, "failures.json")
    progress = Progress(len(selected), len(finished), workers)
    runner = _Runner(config, arg, sweep_dir, workers, progress, pool)
    try:
        if todo:
            runner.run(todo)
    finally:
        progress.close()
        runner.close()
    elapsed = time.perf_counter() - t0
    from moejax.results import write_json_atomic

    if runner.failures:
        write_json_atomic(failures_json, [{"name": n, "error": e}
                                          for n, e in sorted(runner.failures.items())])
    elif os.path.exists(failures_json):
        os.unlink(failures_json)  # left by an earlier run whose failures are now fixed
    print(f"{len(selected)} cells: {len(finished)} finished before, {runner.done} ran now, "
          f"{len(runner.failures)} failed ({elapsed:.1f} s)")
    if runner.failures:
        for name, error in sorted(runner.failures.items()):
            print(f"  FAILED {name}: {error.splitlines()[0] if error else ''}")
        print(f"failures: {failures_json}; each cell's log.txt and error.txt under "
              f"{os.path.join(sweep_dir, 'cells')}")
        return 1
    return 0


# -- the size and the estimate --------------------------------------------------------------
def duration(seconds: float) -> str:
    """A rough duration: "40 s", "12 min", "3.5 h", "2.1 days"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _seconds(seconds: float) -> str:
    """A time so far: "2.0 s" under 10 s, else as `duration`."""
    return f"{seconds:.1f} s" if seconds < 10 else duration(seconds)


def _cell_time(seconds: float) -> str:
    """A cell's wall time: "26 ms" under a second (a replay cell's), else as `_seconds`."""
    return f"{seconds * 1000:.0f} ms" if seconds < 0.9995 else _seconds(seconds)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def estimate(sweep_dir: str, cells: list[cells_lib.Cell], to_run: int, workers: int | None,
             running: bool = False) -> str:
    """What running `to_run` cells will take, from the wall times the cells earlier runs
    finished in this sweep directory recorded (`worker.WALL_TIME`): their median x cells /
    workers (`workers` None: the total cell time, as a Slurm array spends it). Never a number
    the sweep did not measure. `running`: said as a local run starts (its progress lines
    correct it), not by a dry run."""
    if to_run == 0:
        return "nothing to run"
    times = [t for t in (worker.read_wall_time(cells_lib.cell_dir(sweep_dir, c.name))
                         for c in cells) if t is not None]
    if not times:
        if running:
            return ("estimate unknown until the first cells finish (no earlier run here timed "
                    "a cell; each finished cell's progress line gives one)")
        return ("estimate unknown until the first cells finish (then run this command with "
                "--dry_run again)")
    median = statistics.median(times)
    basis = (f"the median wall time of the {_plural(len(times), 'cell')} earlier runs "
             f"finished here, {duration(median)}")
    if workers is None:
        return (f"estimate ~{duration(median * to_run)} of cell time ({basis}, x {to_run}); "
                f"the array's wall time depends on how many tasks run at once")
    then = "; corrected as cells finish" if running else ""
    return (f"estimate ~{duration(median * to_run / workers)} with {_plural(workers, 'worker')}"
            f" ({basis}, x {to_run} / {workers}){then}")


def remaining_seconds(times: list[float], left: int, workers: int) -> float | None:
    """The time `left` cells will take on `workers` workers, from the wall `times` of the cells
    this run has finished: their median x left / workers (no more workers than cells left);
    None with no cell timed yet."""
    if left <= 0:
        return 0.0
    if not times:
        return None
    return statistics.median(times) * left / min(workers, left)


def remaining(times: list[float], left: int, workers: int) -> str:
    """`remaining_seconds` said with its basis: "~6 s left (the median of the 3 cells finished
    in this run, 2.0 s, x 6 to go / 2 workers)"."""
    seconds = remaining_seconds(times, left, workers)
    if seconds is None:
        return "time left unknown (no cell has finished in this run yet)"
    shared = min(workers, left)
    return (f"~{duration(seconds)} left (the median of the {_plural(len(times), 'cell')} "
            f"finished in this run, {_cell_time(statistics.median(times))}, x {left} to go / "
            f"{_plural(shared, 'worker')})")


class Progress:
    """A local run's progress, on `out` (stderr): after a cell finishes or fails, one line,
    "12/549 cells done (1 failed), 3 min elapsed; ~5 min left (the median of ...)", the estimate
    from the wall times of the cells finished in this run (`remaining`). Done counts failed
    cells and those finished before this run. At most about `LINES` lines (every cell when there
    are no more to run than that), and always the last; on a terminal, one line rewritten.
    `clock` gives the elapsed time (a parameter, for tests)."""

    LINES = 50

    def __init__(self, total: int, before: int, workers: int, *,
                 clock: Callable[[], float] = time.perf_counter, out: TextIO | None = None,
                 tty: bool | None = None):
        self.total, self.before, self.workers = total, before, workers
        self.to_run = total - before
        self.clock, self.t0 = clock, clock()
        self.out = sys.stderr if out is None else out
        self.tty = _isatty(self.out) if tty is None else tty
        self.ran = self.failed = 0
        self.times: list[float] = []
        self._shown = ""  # the line now on a terminal, unterminated

    def line(self) -> str:
        left = self.to_run - self.ran - self.failed
        text = (f"{self.before + self.ran + self.failed}/{self.total} cells done "
                f"({self.failed} failed), {_seconds(self.clock() - self.t0)} elapsed")
        return text + (f"; {remaining(self.times, left, self.workers)}" if left > 0 else "")

    def cell(self, ok: bool, seconds: float | None) -> None:
        """Counts a cell this run finished (`ok`) or failed; `seconds`, its wall time."""
        step = self.ran + self.failed
        if ok:
            self.ran += 1
            if seconds is not None:
                self.times.append(float(seconds))
        else:
            self.failed += 1
        now = step + 1
        # Every cell up to LINES cells, else each 1/LINES of them (the last one included:
        # now * LINES // to_run reaches LINES only there).
        if (self.tty or self.to_run <= self.LINES
                or now * self.LINES // self.to_run != step * self.LINES // self.to_run):
            self._show(self.line())

    def _show(self, text: str) -> None:
        if self.tty:
            self.out.write(f"\r{text}\x1b[K")
            self._shown = text
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def note(self, message: str) -> None:
        """A line of its own on stdout (a failed cell), the terminal's progress line kept below
        it."""
        shown = self._shown
        if shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
        print(message, flush=True)
        if shown:
            self._show(shown)

    def close(self) -> None:
        """Ends a terminal's progress line."""
        if self._shown:
            self.out.write("\n")
            self.out.flush()
            self._shown = ""


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def size_line(sweep_dir: str, all_cells: list[cells_lib.Cell], selected: list[cells_lib.Cell],
              workers: int | None, running: bool = False) -> str:
    """"N cells (M to run, K done); estimate ..." of the selected cells."""
    todo = [c for c in selected
            if not cells_lib.is_finished(cells_lib.results_path(sweep_dir, c.name))]
    failed = sum(os.path.exists(os.path.join(cells_lib.cell_dir(sweep_dir, c.name), "error.txt"))
                 for c in todo)
    to_run = len(todo)
    n = (f"{len(selected)} cells" if len(selected) == len(all_cells)
         else f"{len(selected)} of {len(all_cells)} cells selected")
    again = f", {failed} of them failed before" if failed else ""
    return (f"{n} ({to_run} to run{again}, {len(selected) - to_run} done); "
            f"{estimate(sweep_dir, all_cells, to_run, workers, running)}")


def dry_run(sweep_dir: str, all_cells: list[cells_lib.Cell], selected: list[cells_lib.Cell],
            workers: int, finished: set[str], refused_cells: dict[str, str]) -> None:
    """Lists the selected cells with their state: finished (`finished`, the names of those
    with a complete results.json), failed, todo, or refused (its config does not check:
    `refused_cells`, the reason on the line after it)."""
    for c in selected:
        done = c.name in finished
        failed = os.path.exists(os.path.join(cells_lib.cell_dir(sweep_dir, c.name), "error.txt"))
        status = "finished" if done else ("failed" if failed else "todo")
        if c.name in refused_cells:
            status = "refused"
        print(f"{status:9} {c.name}  {json.dumps(c.overrides)}")
        if c.name in refused_cells:
            print(f"{'':9} {refused_cells[c.name]}")
    print(size_line(sweep_dir, all_cells, selected, workers))


# -- checking what was typed -----------------------------------------------------------------
def check_sweep_dir(sweep_dir: str, write: bool = True) -> None:
    """The sweep directory is a directory this process can write in, or can become one: one
    that cannot be created (a missing directory above it, no permission, a file in its path, a
    read-only file system) is a usage error naming why, before anything runs. A directory that
    does not exist is created and removed again to find out (nothing is left). `write` False (a
    dry run, which writes nothing): an existing directory only read is fine."""
    if os.path.exists(sweep_dir) and not os.path.isdir(sweep_dir):
        raise UsageError(f"--sweep_dir={sweep_dir}: is a file, not a directory")
    cells_dir = os.path.join(sweep_dir, "cells")
    if os.path.exists(cells_dir) and not os.path.isdir(cells_dir):
        raise UsageError(f"--sweep_dir={sweep_dir}: its cells/ is a file, not a directory "
                         f"(not a sweep directory)")
    if os.path.isdir(sweep_dir):
        if write and not os.access(sweep_dir, os.W_OK | os.X_OK):
            raise UsageError(f"--sweep_dir={sweep_dir}: cannot write in it (Permission denied)")
        return
    missing, above = [], sweep_dir
    while not os.path.isdir(above):
        if os.path.lexists(above):  # a file (or a dangling link) where a directory must be
            raise UsageError(f"--sweep_dir={sweep_dir}: cannot create it ({above} is a file, "
                             f"not a directory)")
        missing.append(above)
        above = os.path.dirname(above)
    made = []
    try:
        for directory in reversed(missing):
            os.mkdir(directory)
            made.append(directory)
    except OSError as e:
        raise _cannot_create(sweep_dir, e) from None
    finally:
        for directory in reversed(made):
            with contextlib.suppress(OSError):  # another process put something in it
                os.rmdir(directory)


def _cannot_create(sweep_dir: str, e: OSError) -> Exception:
    """`e`, raised creating or writing the sweep directory, as a usage error naming it (a full
    disk stays the run's failure)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return e
    where = f"{e.filename}: " if e.filename and e.filename != sweep_dir else ""
    return UsageError(f"--sweep_dir={sweep_dir}: cannot create it "
                      f"({where}{e.strerror or type(e).__name__})")


def check_same_sweep(sweep_dir: str, config: str, arg: str | None,
                     cells: list[cells_lib.Cell]) -> None:
    """A sweep directory holds one sweep: resuming takes its finished cells as this command's,
    so a directory whose sweep.json names another config file or argument, or gives one of
    this sweep's cell names other overrides, is refused (its results would be mixed with this
    sweep's). Cells only one of the two has are fine (a sweep grown or cut since). A sweep.json
    that does not parse is named."""
    path = os.path.join(sweep_dir, "sweep.json")
    if not os.path.exists(path):
        return
    try:
        with open(path) as f:
            held = json.load(f)
        held_config, held_arg = held["config"], held["config_arg"]
        if not isinstance(held_config, str) or not isinstance(held_arg, (str, type(None))):
            raise TypeError("its config and config_arg are not strings")
        held_cells = {c["name"]: c["overrides"] for c in held["cells"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--sweep_dir={sweep_dir}: its sweep.json cannot be read "
                         f"({type(e).__name__}: {e}); move it away, or choose another "
                         f"--sweep_dir") from None
    theirs = held_config + (f":{held_arg}" if held_arg is not None else "")
    if held_arg != arg or os.path.realpath(held_config) != os.path.realpath(config):
        raise UsageError(f"--sweep_dir={sweep_dir}: holds the sweep of {theirs}, not "
                         f"{config + (f':{arg}' if arg is not None else '')}; its finished "
                         f"cells would be taken as this one's. Choose another --sweep_dir")
    for c in cells:
        if c.name in held_cells and held_cells[c.name] != c.overrides:
            raise UsageError(f"--sweep_dir={sweep_dir}: its cell {c.name} ran "
                             f"{json.dumps(held_cells[c.name], sort_keys=True)}, this sweep's "
                             f"has {json.dumps(c.overrides, sort_keys=True)} (the config "
                             f"changed); choose another --sweep_dir")


def _config_frame(e: BaseException, config: str) -> str:
    """Where in the config file `e` was raised from: " (configs/x.py, line 76)", or ""."""
    if isinstance(e, SyntaxError) and e.filename:
        return f" ({e.filename}, line {e.lineno})"
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if os.path.abspath(f.filename) == config]
    shown = os.path.relpath(config)
    shown = config if shown.startswith("..") else shown
    return f" ({shown}, line {frames[-1].lineno})" if frames else ""


def load_cells(spec: str, config: str, arg: str | None) -> list[cells_lib.Cell]:
    """The config's cells. A config file that is missing or does not load, and a sweep(add)
    that rejects its argument (`studies/specmd/grid_specmd.py:traces=bogus`) or adds a malformed
    cell, are usage errors naming `--config`."""
    if os.path.isdir(config):
        raise UsageError(f"--config={spec}: {config} is a directory, not a config file")
    if not os.path.isfile(config):
        raise UsageError(f"--config={spec}: {config} does not exist")
    try:
        return cells_lib.cells_from_config(config, arg)
    except cells_lib.SweepError as e:
        raise UsageError(f"--config={spec}: {e}") from None
    except CONFIG_FILE_ERRORS as e:
        raise config_file_error(f"--config={spec}", config, e) from None


# What a config file's own code may raise, named as the config's fault (`config_file_error`).
CONFIG_FILE_ERRORS = (ValueError, KeyError, TypeError, AttributeError, SyntaxError, NameError,
                      ImportError, OSError)


def config_file_error(prefix: str, config: str, e: BaseException) -> UsageError:
    """`e`, raised by the config file's code, as a usage error: its message (its kind too where
    it more likely is a defect of the file) and the file's line. Re-raised as it is under
    debug, and for an optional extra missing (the shared error path names it)."""
    if debug() or message_of(e) is not None and isinstance(e, ImportError):
        raise e
    if isinstance(e, SyntaxError):
        what = f"SyntaxError: {e.msg}"
    elif isinstance(e, (ValueError, OSError)):
        what = str(e)
    else:
        what = f"{type(e).__name__}: {e}"
    return UsageError(f"{prefix}: {what}{_config_frame(e, config)}")


def check_cells(spec: str, config: str, arg: str | None, cells: list[cells_lib.Cell],
                pool: cf.ProcessPoolExecutor | None = None, processes: int = 1
                ) -> dict[str, str]:
    """Every cell's config built and checked (`launch/preflight.py`), in a spawned process
    (none for no cells), or shared by the `processes` workers of `pool`: cell name -> why it is
    refused. A `get_config(arg)` that raises is a usage error naming `--config`."""
    if not cells:
        return {}
    if pool is None:
        message, errors = preflight.check_in_subprocess(spec, config, arg, cells)
    else:
        message, errors = preflight.check_in_pool(pool, processes, spec, config, arg, cells)
    if message is not None:
        raise UsageError(message)
    return errors


def refused(spec: str, errors: dict[str, str]) -> UsageError:
    """The usage error for cells whose config is refused: how many, the first one and why."""
    name, why = next(iter(errors.items()))
    more = (f" (and {len(errors) - 1} more: --dry_run lists every cell's)"
            if len(errors) > 1 else "")
    cells = "cell cannot" if len(errors) == 1 else "cells cannot"
    return UsageError(f"--config={spec}: {len(errors)} {cells} run; cell {name}: {why}{more}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return guarded(PROG, lambda: _main(args),
                   kept=lambda: "finished cells are kept; run the same command again to finish "
                                "the sweep")


def _main(args: argparse.Namespace) -> int:
    path, arg = cells_lib.split_config(args.config)
    config = os.path.abspath(path)
    sweep_dir = os.path.abspath(args.sweep_dir)
    check_sweep_dir(sweep_dir, write=not args.dry_run)
    all_cells = load_cells(args.config, config, arg)
    selected = cells_lib.select(all_cells, args.only)
    if not selected:
        raise UsageError(f"--only={args.only}: matches none of the {len(all_cells)} cell names "
                         f"(--dry_run without --only lists them)")
    # Every selected cell's config that is to run, before anything is written (a dry run lists
    # the refused; a finished cell is not run again, so it is not checked either).
    finished = {c.name for c in selected
                if cells_lib.is_finished(cells_lib.results_path(sweep_dir, c.name))}
    to_check = [c for c in selected if c.name not in finished]
    # A local run checks the cells in the pool that then runs them: its workers start (and
    # import what a check and a job need) once, and share the check.
    local = bool(to_check) and not (args.dry_run or args.slurm)
    checkers = min(args.workers, len(to_check)) if local else 1
    if to_check:  # the check's seconds, said before they pass in silence
        print(f"{len(to_check)} cells to run; checking each one's config first (about "
              f"{duration(preflight.expected_seconds(len(to_check), checkers))}, at "
              f"~{preflight.PER_CELL_S * 1000:.0f} ms a cell) ...", file=sys.stderr, flush=True)
    pool = _new_pool(checkers) if local else None
    try:
        return _checked_main(args, config, arg, sweep_dir, all_cells, selected, finished,
                             to_check, pool, checkers)
    except BaseException:
        if pool is not None:
            _stop(pool)  # (run_local shuts it down itself once it has it)
        raise


def _checked_main(args: argparse.Namespace, config: str, arg: str | None, sweep_dir: str,
                  all_cells: list[cells_lib.Cell], selected: list[cells_lib.Cell],
                  finished: set[str], to_check: list[cells_lib.Cell],
                  pool: cf.ProcessPoolExecutor | None, processes: int) -> int:
    """`_main` from the cells' check on; `pool`: the local run's pool of `processes` workers
    (None for a dry run, a Slurm array or nothing to run), which checks the cells and then
    runs them."""
    errors = check_cells(args.config, config, arg, to_check, pool, processes)
    if args.dry_run:
        check_same_sweep(sweep_dir, config, arg, all_cells)
        dry_run(sweep_dir, all_cells, selected, args.workers, finished, errors)
        if errors:
            raise refused(args.config, errors)
        return 0
    if errors:
        raise refused(args.config, errors)
    try:
        os.makedirs(os.path.join(sweep_dir, "cells"), exist_ok=True)
    except OSError as e:
        raise _cannot_create(sweep_dir, e) from None
    # The lock before sweep.json: a second launcher must not rewrite the first one's files.
    with _sweep_lock(sweep_dir):
        check_same_sweep(sweep_dir, config, arg, all_cells)
        write_sweep_json(sweep_dir, config, arg, all_cells)
        if args.slurm:
            return _write_slurm(args, sweep_dir, config, arg, all_cells, selected)
        print(size_line(sweep_dir, all_cells, selected, args.workers, running=True),
              flush=True)
        signal.signal(signal.SIGTERM, _on_sigterm)
        return run_local(config, arg, sweep_dir, selected, args.workers, pool)


def _write_slurm(args, sweep_dir: str, config: str, arg: str | None,
                 all_cells: list[cells_lib.Cell], selected: list[cells_lib.Cell]) -> int:
    options = slurm.SlurmOptions(time=args.time, partition=args.partition, gres=args.gres,
                                 cpus_per_task=args.cpus_per_task, mem=args.mem,
                                 max_parallel=args.max_parallel, job_name=args.job_name)
    cells_txt, sbatch = slurm.write(sweep_dir, config, arg, selected, options, REPO)
    print(size_line(sweep_dir, all_cells, selected, None))
    print(f"{len(selected)} cells -> {cells_txt}\nsubmit with:  sbatch {sbatch}")
    if len(selected) > slurm.MAX_ARRAY:
        print(f"note: {len(selected)} array tasks exceed Slurm's default MaxArraySize "
              f"({slurm.MAX_ARRAY}); split the sweep with --only or raise the limit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
