"""One cell in a pool process: a fresh `get_config(arg)` (or a copy of an equal earlier one,
`cells.get_config_copy`), the cell's overrides on its declared fields,
`moejax.jobs.run(config, cell_dir)`. Output goes to the cell's `log.txt`; a failure is returned
(and kept in `error.txt`), never raised, so one bad cell does not stop the others."""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import shutil
import sys
import time
import traceback
from typing import Any

from launch import cells as cells_lib

# In a cell's directory while a worker runs it: left behind without a complete results.json, it
# names the cell a dead worker was running. A worker killed between the job's atomic write of
# results.json and the marker's removal leaves both: the cell is finished, and the launcher
# removes the stale marker (`clear_stale_marker`) when it next looks at the cell.
RUNNING = ".running"
# In a finished cell's directory: {"seconds": its wall time}, written after its results.json
# (by the worker, or by the Slurm array task). The launcher's run-time estimate reads these.
WALL_TIME = "wall_time.json"


def record_wall_time(workdir: str, seconds: float) -> None:
    # A plain write, not an atomic one: a process killed here must leave no temporary file
    # beside a finished cell's results.json, and a cut-off file reads as "not recorded".
    with open(os.path.join(workdir, WALL_TIME), "w") as f:
        json.dump({"seconds": round(seconds, 3)}, f)


def read_wall_time(workdir: str) -> float | None:
    """The wall time a finished cell recorded; None for an unfinished cell, or one that ran
    before the launcher recorded wall times."""
    if not cells_lib.is_finished(os.path.join(workdir, "results.json")):
        return None
    try:
        with open(os.path.join(workdir, WALL_TIME)) as f:
            seconds = json.load(f)["seconds"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else None


def clear_stale_marker(workdir: str) -> bool:
    """Removes `workdir`'s RUNNING marker if its results.json is complete (a finished cell never
    keeps one); returns whether the cell is finished."""
    if not cells_lib.is_finished(os.path.join(workdir, "results.json")):
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(workdir, RUNNING))
    return True


class OverrideError(ValueError):
    """An override names an undeclared field or has the wrong type for it."""


def apply_overrides(config, overrides: dict[str, Any]) -> None:
    """Sets each dotted field on a locked ConfigDict: an undeclared field or a value of the
    wrong type is an error naming the field (as `--config.FIELD=VALUE` would be); a field that
    moved into its job's section (`trace`, `moejax.jobs.schema.MOVED`) names where it went."""
    import ml_collections

    from moejax.jobs.declared import moved_to
    from moejax.jobs.schema import MOVED

    config.lock()
    for key, value in overrides.items():
        new = moved_to(key, MOVED)
        if new is not None:
            raise OverrideError(f"{key} moved to {new}")
        node, parts = config, key.split(".")
        for i, part in enumerate(parts):
            where = ".".join(parts[:i]) or "the config"
            if not isinstance(node, ml_collections.ConfigDict):
                raise OverrideError(f"{key}: {where} is a {type(node).__name__}, not a group")
            if part not in node:
                close = difflib.get_close_matches(part, list(node.keys()), n=1)
                hint = f" (did you mean {'.'.join(parts[:i] + close)}?)" if close else ""
                raise OverrideError(f"{key} is not a declared field: {where} has no field "
                                    f"{part!r}{hint}")
            if i < len(parts) - 1:
                node = node[part]
        try:
            node[parts[-1]] = value
        except TypeError as e:
            raise OverrideError(f"{key}={value!r}: {e}") from None


def build_config(config_path: str, arg: str | None, overrides: dict[str, Any]):
    config = cells_lib.get_config_copy(cells_lib.load_config_module(config_path), arg)
    apply_overrides(config, overrides)
    return config


@contextlib.contextmanager
def _output_to(path: str):
    """Points fds 1 and 2 at `path` (XLA's C++ logging included), restoring them after."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def init(env: dict[str, str]) -> None:
    """Pool initializer: environment defaults (os.environ wins) before anything imports JAX."""
    for key, value in env.items():
        os.environ.setdefault(key, value)


def _empty(workdir: str, keep: str) -> None:
    """Removes everything in `workdir` but the entry `keep`."""
    for entry in os.scandir(workdir):
        if entry.name == keep:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def run_cell(config_path: str, arg: str | None, name: str, overrides: dict[str, Any],
             workdir: str) -> dict:
    """Runs one cell into `workdir`: claimed first (`moejax.workdir`: a cell another process
    runs — a Slurm task re-run by hand — fails here and its directory is left alone), then
    emptied (a killed run's partial events or traces must not mix with the new run's).
    Returns {"name", "ok", "error", "seconds"}."""
    from moejax import workdir as workdir_lib
    from moejax.cli import UsageError

    t0 = time.perf_counter()
    notes = io.StringIO()  # the claim's (taking over a lock a killed run left): into log.txt
    try:
        with contextlib.redirect_stderr(notes):
            claim = workdir_lib.claim(workdir)
    except UsageError as e:
        return {"name": name, "ok": False, "error": f"UsageError: {e}",
                "seconds": time.perf_counter() - t0}
    _empty(workdir, keep=workdir_lib.LOCK_NAME)
    marker = os.path.join(workdir, RUNNING)
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    error = None
    log = os.path.join(workdir, "log.txt")
    if notes.getvalue():
        with open(log, "w") as f:
            f.write(notes.getvalue())
    try:
        with _output_to(log):
            try:
                config = build_config(config_path, arg, overrides)
                from moejax import jobs

                result = jobs.run(config, workdir, claim=claim)
                path = os.path.join(workdir, "results.json")
                if not cells_lib.is_finished(path):  # a job that returns its result unwritten
                    from moejax.results import write_json_atomic

                    write_json_atomic(path, result)
            except (Exception, SystemExit) as e:
                error = f"{type(e).__name__}: {e}"
                traceback.print_exc()
                with open(os.path.join(workdir, "error.txt"), "w") as f:
                    f.write(traceback.format_exc())
    finally:  # whatever ends the run short of killing the process (KeyboardInterrupt too)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)
        claim.release()  # (already released by `jobs.run` once it got the claim)
    seconds = time.perf_counter() - t0
    if error is None:
        with contextlib.suppress(OSError):  # an estimate's input: never a cell's failure
            record_wall_time(workdir, seconds)
    return {"name": name, "ok": error is None, "error": error, "seconds": seconds}
