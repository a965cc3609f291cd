"""What the sweep launcher and the analysis tools answer to a user's mistake (issue 23): one
line naming the input, exit status 2, no traceback, nothing written; the sweep's size and run
time estimate; report tables and bars that never average two configurations; and figures
whose panels share their scale and say why they are empty.

Everything runs in-process (each tool's `main(argv)`) on tiny inputs built here, but for the
two checks that need a real pipe or a bash Slurm task."""

from __future__ import annotations

import colorsys
import fcntl
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from matplotlib.colors import to_rgb

from launch import cells as cells_lib
from launch import diff, sweep, worker
from moejax.analysis import (
    compare,
    disk_tier,
    report,
    report_figures,
    routing_stats,
    sweep_cells,
)
from moejax.analysis import frontier as frontier_lib
from moejax.results import write_json_atomic
from studies.fiddler import claims as host_compute
from studies.specmd import claims
from tests.sweep_fixtures import synthetic_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID_SPECMD = os.path.join(ROOT, "studies", "specmd", "grid_specmd.py")

# A sweep of N cells of the schema's config: only the launcher's side is exercised (it builds
# and checks every cell's config, in a process of its own).
TINY_CONFIG = textwrap.dedent('''
    def get_config(arg=None):
        from moejax.jobs.schema import base_config

        return base_config()


    def sweep(add, arg=None):
        for i in range(int(arg or 6)):
            add(**{"cache.capacity_frac": 0.25, "seed": i})
''')


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny_sweep.py"
    path.write_text(TINY_CONFIG)
    return str(path)


def _check_in_process(monkeypatch) -> list[list[str]]:
    """`checks_in_process` (below), set up by a test part-way."""
    from launch import preflight

    checked = []

    def check(spec, config, arg, cells):
        checked.append([c.name for c in cells])
        return preflight.checked(spec, config, arg, cells)

    monkeypatch.setattr(sweep.preflight, "check_in_subprocess", check)
    monkeypatch.setattr(sweep.preflight, "check_in_pool",
                        lambda pool, processes, *args: check(*args))
    return checked


@pytest.fixture
def checks_in_process(monkeypatch) -> list[list[str]]:
    """The cells' config check (`launch/preflight.py`) run in this process: `preflight.checked`,
    the very function the spawned process runs, without the ~2.5 s of starting that process
    and importing JAX in it. For the tests about something else; the spawned process itself is
    tested by `test_cells_whose_config_does_not_check_are_refused_before_anything_runs` (its
    dry run) and `test_the_launching_process_checks_the_cells_without_importing_jax`. Yields
    the names of the cells each check was given, one list per check."""
    return _check_in_process(monkeypatch)


def _error_lines(err: str) -> list[str]:
    """stderr's lines but the notice of the cells' config check (`N cells to run; checking
    each one's config first ...`), which comes before it."""
    lines = err.strip().splitlines()
    if lines and re.match(r"\d+ cells to run; checking each one's config first \(about ",
                          lines[0]):
        return lines[1:]
    return lines


def _usage_error(capsys, status, *words) -> str:
    """The tool returned (or exited with) 2 and said every word on stderr, no traceback."""
    out = capsys.readouterr()
    assert status == 2, out
    _no_traceback(out.err + out.out)
    for w in words:
        assert w in out.err, (w, out.err)
    return out.err


# -- launch.sweep: what was typed ------------------------------------------------------------
def test_a_malformed_only_pattern_is_named(tiny_config, tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit) as e:
        sweep.main([f"--config={tiny_config}", f"--sweep_dir={sweep_dir}", "--only=["])
    _usage_error(capsys, e.value.code, "argument --only: '[' is not a regular expression")
    assert not sweep_dir.exists()


def test_an_only_pattern_matching_nothing_is_named_in_every_mode(tiny_config, tmp_path,
                                                                  capsys):
    for mode in ([], ["--dry_run"], ["--slurm"]):
        status = sweep.main([f"--config={tiny_config}", f"--sweep_dir={tmp_path / 's'}",
                             "--only=no_such_cell", *mode])
        _usage_error(capsys, status, "--only=no_such_cell: matches none of the 6 cell names")
    assert not (tmp_path / "s").exists()


def test_a_sweep_dir_that_is_a_file_is_named_and_kept(tiny_config, tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    status = sweep.main([f"--config={tiny_config}", f"--sweep_dir={path}"])
    _usage_error(capsys, status, f"--sweep_dir={path}: is a file, not a directory")
    assert path.read_text() == "mine"


def _unwritable_parent(tmp_path, monkeypatch) -> str:
    """A sweep directory whose parent cannot be created (mkdir refused as for a user without
    the permission; the tests run as root, which would be let through)."""
    real_mkdir = os.mkdir
    parent = str(tmp_path / "locked")

    def mkdir(path, *args, **kwargs):
        if os.fspath(path) == parent:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    return os.path.join(parent, "sweep")


@pytest.mark.parametrize("mode", [[], ["--dry_run"], ["--slurm"]])
@pytest.mark.parametrize("where, why", [
    (lambda tmp_path, mp: "/proc/1/sw", "cannot create it ("),
    (lambda tmp_path, mp: str(tmp_path / "notes.txt" / "sweep"),
     "cannot create it ({tmp_path}/notes.txt is a file, not a directory)"),
    (_unwritable_parent, "cannot create it ({tmp_path}/locked: Permission denied)"),
])
def test_a_sweep_dir_that_cannot_be_created_is_one_line_before_anything_runs(
        where, why, mode, tiny_config, tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    sweep_dir = where(tmp_path, monkeypatch)
    status = sweep.main([f"--config={tiny_config}", f"--sweep_dir={sweep_dir}", *mode])
    err = _usage_error(capsys, status, f"--sweep_dir={sweep_dir}: "
                       + why.format(tmp_path=tmp_path))
    assert err.count("\n") == 1, err  # before the cells' configs were checked
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "tiny_sweep.py"]  # nothing left


def test_a_sweep_dir_that_can_be_created_is_not_left_by_a_dry_run(tiny_config, tmp_path,
                                                                    capsys, checks_in_process):
    sweep_dir = tmp_path / "new" / "sweep"
    assert sweep.main([f"--config={tiny_config}", f"--sweep_dir={sweep_dir}", "--dry_run"]) == 0
    assert "6 cells (6 to run, 0 done)" in capsys.readouterr().out
    assert not (tmp_path / "new").exists()


def test_a_sweep_dir_it_cannot_write_in_is_refused_but_a_dry_run_reads_it(
        tiny_config, tmp_path, monkeypatch, capsys, checks_in_process):
    sweep_dir = tmp_path / "theirs"
    sweep_dir.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if os.fspath(path) == str(sweep_dir) and mode & os.W_OK
        else real_access(path, mode, **kw)))
    for mode in ([], ["--slurm"]):
        status = sweep.main([f"--config={tiny_config}", f"--sweep_dir={sweep_dir}", *mode])
        _usage_error(capsys, status, f"--sweep_dir={sweep_dir}: cannot write in it "
                                     "(Permission denied)")
    assert os.listdir(sweep_dir) == []
    assert sweep.main([f"--config={tiny_config}", f"--sweep_dir={sweep_dir}", "--dry_run"]) == 0


def test_the_check_of_the_cells_configs_is_announced_before_it_starts(tiny_config, tmp_path,
                                                                      monkeypatch, capsys):
    said = []

    def check(spec, config, arg, cells):
        said.append(capsys.readouterr().err)  # what stderr held as the check began
        return None, {}

    monkeypatch.setattr(sweep.preflight, "check_in_subprocess", check)
    sweep_dir = tmp_path / "s"
    assert sweep.main([f"--config={tiny_config}:3000", f"--sweep_dir={sweep_dir}",
                       "--dry_run"]) == 0
    # 1 s to start and 1 ms a cell (launch/preflight.py): 4 s
    assert said == ["3000 cells to run; checking each one's config first (about 4 s, at ~1 ms "
                    "a cell) ...\n"]


@pytest.mark.parametrize("arg, words", [
    ("traces=bogus", ["traces='bogus': expected all or one of", "grid_specmd.py, line"]),
    ("bogus=1", ["config argument 'bogus=1': expected one of"]),
])
def test_a_config_argument_the_sweep_rejects_is_named(arg, words, tmp_path, capsys):
    spec = f"{GRID_SPECMD}:{arg}"
    status = sweep.main([f"--config={spec}", f"--sweep_dir={tmp_path / 's'}"])
    _usage_error(capsys, status, f"--config={spec}: ", *words)
    assert not (tmp_path / "s").exists()


def test_a_config_file_that_is_missing_a_directory_or_broken_is_named(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def sweep(add):\n    add(**{'cache.slots': })\n")
    for config, words in ((tmp_path / "nope.py", ["nope.py does not exist"]),
                          (tmp_path, ["is a directory, not a config file"]),
                          (broken, ["SyntaxError: ", "broken.py, line 2)\n"])):
        status = sweep.main([f"--config={config}", f"--sweep_dir={tmp_path / 's'}"])
        _usage_error(capsys, status, f"--config={config}: ", *words)
    assert not (tmp_path / "s").exists()


# A sweep whose config argument picks its cells: one of them refused by a check `sweep(add)`
# cannot make (the field's existence, its value, the job's own fields, a policy's arguments),
# or (`all`) one refused by each.
REFUSED_CONFIG = textwrap.dedent('''
    def get_config(arg=None):
        if arg == "bogus":
            raise ValueError(f"config argument {arg!r}: expected one of {sorted(BAD)}")
        from moejax.jobs.schema import base_config

        return base_config()


    BAD = {"typo": {"cache.capacity_fac": 0.5}, "range": {"cache.capacity_frac": 1.5},
           "job": {"run.max_new_tokens": 0}, "policy": {"policies.prefetch": "topk(depth=2)"}}


    def sweep(add, arg=None):
        add(**{"cache.capacity_frac": 0.25})
        if arg == "all":
            for bad in BAD.values():
                add(**bad)
        else:
            add(**BAD.get(arg, {"cache.capacity_frac": 0.5}))
        add(**{"cache.capacity_frac": 0.75})
''')


# Each refused cell of the sweep `all`, in the order `sweep(add)` adds them: its name and the
# words of why.
REFUSED = [
    ("capacity_fac=0.5", ["cache.capacity_fac is not a declared field",
                          "did you mean cache.capacity_frac?"]),
    ("capacity_frac=1.5", ["cache.capacity_frac=1.5 must be in (0, 1]"]),
    ("max_new_tokens=0", ["run.max_new_tokens=0 must be >= 1"]),
    ("prefetch=topk_depth-2", ["prefetch policy 'topk(depth=2)': unknown argument 'depth'; it "
                               "takes ['overfetch', 'lookahead']"]),
]


def test_cells_whose_config_does_not_check_are_refused_before_anything_runs(tmp_path, capsys,
                                                                            monkeypatch):
    """One sweep holding a cell refused by each kind of check (`all`): the dry run, through
    the real checking process, names every refused cell with why; then (the same check in this
    process, `checks_in_process`) every mode refuses it and writes nothing, and one refused
    cell selected alone is named in the singular."""
    config = tmp_path / "refused.py"
    config.write_text(REFUSED_CONFIG)
    spec = f"{config}:all"
    sweep_dir = tmp_path / "s"
    # A dry run lists every cell, each refused one with why, and exits 2 too.
    status = sweep.main([f"--config={spec}", f"--sweep_dir={sweep_dir}", "--dry_run"])
    out = capsys.readouterr()
    assert status == 2
    lines = out.out.splitlines()
    refused = [i for i, line in enumerate(lines) if line.startswith("refused")]
    assert [lines[i].split()[1] for i in refused] == [n for n, _ in REFUSED], out.out
    for i, (_, words) in zip(refused, REFUSED):
        assert all(w in lines[i + 1] for w in words), (words, lines[i + 1])
    assert sum(line.startswith("todo") for line in lines) == 2, out.out
    assert not sweep_dir.exists()
    checked = _check_in_process(monkeypatch)
    first, first_words = REFUSED[0]
    status = sweep.main([f"--config={spec}", f"--sweep_dir={sweep_dir}"])
    _usage_error(capsys, status, f"--config={spec}: 4 cells cannot run; cell {first}: ",
                 *first_words, "(and 3 more: --dry_run lists every cell's)")
    assert not sweep_dir.exists()
    name, words = REFUSED[1]
    status = sweep.main([f"--config={spec}", f"--sweep_dir={sweep_dir}", "--slurm",
                         f"--only={re.escape(name)}$"])
    err = _usage_error(capsys, status, f"--config={spec}: 1 cell cannot run; cell {name}: ",
                       *words)
    assert "more: --dry_run" not in err, err
    assert not sweep_dir.exists()
    # Selected away, the refused cells do not stop the others.
    status = sweep.main([f"--config={spec}", f"--sweep_dir={sweep_dir}", "--dry_run",
                         "--only=capacity_frac=0.25"])
    assert status == 0, capsys.readouterr()
    assert len(checked) == 3  # (the three runs after the dry run)


def test_a_config_argument_get_config_rejects_is_named_once(tmp_path, capsys):
    config = tmp_path / "refused.py"
    config.write_text(REFUSED_CONFIG)
    spec = f"{config}:bogus"
    status = sweep.main([f"--config={spec}", f"--sweep_dir={tmp_path / 's'}"])
    err = _usage_error(capsys, status, f"--config={spec}: get_config('bogus'): config argument "
                       "'bogus': expected one of ['job', 'policy', 'range', 'typo'] (",
                       "refused.py, line 4)")
    assert len(_error_lines(err)) == 1, err
    assert not (tmp_path / "s").exists()


def test_the_launching_process_checks_the_cells_without_importing_jax(tmp_path):
    config = tmp_path / "refused.py"
    config.write_text(REFUSED_CONFIG)
    code = ("import sys; from launch import sweep; "
            f"status = sweep.main(['--config={config}:typo', '--sweep_dir={tmp_path / 's'}', "
            "'--dry_run']); "
            "print(status, sorted({'jax', 'flax'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "2 []", out.stdout + out.stderr
    assert "cache.capacity_fac is not a declared field" in out.stdout


def test_the_check_shared_by_a_pools_workers_says_what_one_process_says(tmp_path):
    """A local run's check, cut into one part per worker of its pool (`check_in_pool`): the
    refused cells, in the cells' order, and a `get_config` that raises, as one process says
    them (`checked`). Threads stand in for the pool's processes."""
    import concurrent.futures as cf

    from launch import preflight

    config = tmp_path / "refused.py"
    config.write_text(REFUSED_CONFIG)
    for arg in ("all", "bogus"):
        spec = f"{config}:{arg}"
        cells = cells_lib.cells_from_config(str(config), "all")
        one = preflight.checked(spec, str(config), arg, cells)
        assert (one[0] is not None) == (arg == "bogus") and (one[1] != {}) == (arg == "all")
        with cf.ThreadPoolExecutor(4) as pool:
            for workers in (1, 2, 3, len(cells) + 2):
                shared = preflight.check_in_pool(pool, workers, spec, str(config), arg, cells)
                assert shared == one and list(shared[1]) == list(one[1]), workers


@pytest.mark.parametrize("flag", ["--time=4h", "--mem=lots", "--job_name=my job",
                                  "--max_parallel=-1", "--cpus_per_task=0", "--workers=0"])
def test_slurm_and_pool_values_are_checked_before_anything_is_written(flag, tiny_config,
                                                                      tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main([f"--config={tiny_config}", f"--sweep_dir={tmp_path / 's'}", "--slurm",
                    flag])
    _usage_error(capsys, e.value.code, flag.split("=")[0])
    assert not (tmp_path / "s").exists()


def test_a_second_launcher_leaves_the_first_ones_sweep_alone(tiny_config, tmp_path, capsys,
                                                             checks_in_process):
    sweep_dir = tmp_path / "s"
    os.makedirs(sweep_dir / "cells")
    (sweep_dir / "sweep.json").write_text('{"the first launcher": "wrote this"}')
    with open(sweep_dir / ".lock", "w") as held:  # what the running launcher holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for mode in ([], ["--slurm"]):
            status = sweep.main([f"--config={tiny_config}", f"--sweep_dir={sweep_dir}", *mode])
            _usage_error(capsys, status, "another launcher is running this sweep")
    assert json.loads((sweep_dir / "sweep.json").read_text()) == {"the first launcher":
                                                                  "wrote this"}
    assert not (sweep_dir / "cells.txt").exists()


def _slurm(config: str, sweep_dir, *more: str) -> int:
    return sweep.main([f"--config={config}", f"--sweep_dir={sweep_dir}", "--slurm", *more])


def test_a_sweep_dir_holding_another_sweep_is_refused_and_kept(tiny_config, tmp_path, capsys,
                                                              checks_in_process):
    sweep_dir = tmp_path / "s"
    assert _slurm(f"{tiny_config}:6", sweep_dir) == 0
    capsys.readouterr()
    before = {p: (sweep_dir / p).read_bytes() for p in ("sweep.json", "cells.txt")}
    # Another argument of the same file, and another file: every mode refuses, writes nothing.
    other = tmp_path / "other_sweep.py"
    other.write_text(TINY_CONFIG)
    for config in (f"{tiny_config}:4", str(other)):
        for mode in ([], ["--slurm"], ["--dry_run"]):
            status = sweep.main([f"--config={config}", f"--sweep_dir={sweep_dir}", *mode])
            err = _usage_error(capsys, status, f"--sweep_dir={sweep_dir}: holds the sweep of "
                                               f"{tiny_config}:6, not ", "another --sweep_dir")
            assert len(_error_lines(err)) == 1, err
    assert {p: (sweep_dir / p).read_bytes() for p in before} == before
    assert os.listdir(sweep_dir / "cells") == []


def test_a_cell_name_with_other_overrides_is_refused_a_grown_sweep_is_not(tmp_path, capsys,
                                                                          checks_in_process):
    config, sweep_dir = tmp_path / "grid.py", tmp_path / "s"
    grid = "from moejax.jobs.schema import base_config as get_config\n\n\n" \
           "def sweep(add):\n    for n in {}:\n        add(**{{'run.max_new_tokens': n}})\n"
    config.write_text(grid.format("(1, 2)"))
    assert _slurm(str(config), sweep_dir) == 0
    config.write_text(grid.format("(1, 2, 3)"))  # grown: the first two cells are the same
    assert _slurm(str(config), sweep_dir) == 0
    assert len(json.loads((sweep_dir / "sweep.json").read_text())["cells"]) == 3
    capsys.readouterr()
    held = json.loads((sweep_dir / "sweep.json").read_text())
    name = held["cells"][0]["name"]
    held["cells"][0]["overrides"] = {"run.max_new_tokens": 7}  # what that cell ran before
    (sweep_dir / "sweep.json").write_text(json.dumps(held))
    _usage_error(capsys, _slurm(str(config), sweep_dir), f"its cell {name} ran "
                 '{"run.max_new_tokens": 7}, this sweep\'s has {"run.max_new_tokens": 1}')
    held["config"] = 5  # edited by hand into something that is no path
    (sweep_dir / "sweep.json").write_text(json.dumps(held))
    _usage_error(capsys, _slurm(str(config), sweep_dir), "its sweep.json cannot be read",
                 "not strings")
    (sweep_dir / "sweep.json").write_text('{"cells": ')  # cut off
    _usage_error(capsys, _slurm(str(config), sweep_dir), "its sweep.json cannot be read")
    assert (sweep_dir / "sweep.json").read_text() == '{"cells": '


# TINY_CONFIG's cells with a long prompt each: a long line (~580 bytes) per cell in a dry run's
# listing.
LONG_LINES_CONFIG = textwrap.dedent('''
    def get_config(arg=None):
        from moejax.jobs.schema import base_config

        return base_config()


    def sweep(add, arg):
        for i in range(int(arg)):
            add(**{"cache.capacity_frac": 0.25, "seed": i, "run.prompt": "a prompt " * 40})
''')


def test_a_dry_run_into_a_closed_pipe_stops_quietly(tmp_path):
    config = tmp_path / "big.py"
    config.write_text(LONG_LINES_CONFIG)
    # 500 cells' lines (~290 KB) are far more than a pipe holds (64 KiB): head has closed it
    # long before. (Long lines: fewer cells to check before the listing starts.)
    proc = subprocess.run(
        f"{sys.executable} -m launch.sweep --config={config}:500 --sweep_dir={tmp_path / 's'}"
        f" --dry_run | head -1; exit ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash",
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("todo ") and proc.stdout.count("\n") == 1
    # The one line on stderr says what the seconds before the listing are spent on.
    assert proc.stderr.startswith("500 cells to run; checking each one's config first (about ")
    assert proc.stderr.count("\n") == 1, proc.stderr


# -- launch.sweep: size and estimate ---------------------------------------------------------
def _finish(sweep_dir, cell: cells_lib.Cell, seconds: float | None) -> None:
    work = cells_lib.cell_dir(str(sweep_dir), cell.name)
    write_json_atomic(os.path.join(work, "results.json"), {"done": True})
    if seconds is not None:
        worker.record_wall_time(work, seconds)


def test_the_size_and_an_estimate_only_from_measured_wall_times(tiny_config, tmp_path,
                                                               capsys, checks_in_process):
    sweep_dir = tmp_path / "s"
    argv = [f"--config={tiny_config}", f"--sweep_dir={sweep_dir}", "--dry_run"]
    assert sweep.main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("6 cells (6 to run, 0 done); estimate unknown until the first "
                           "cells finish")
    cells = cells_lib.cells_from_config(tiny_config, None)
    _finish(sweep_dir, cells[0], None)  # finished before wall times were recorded
    assert sweep.main(argv) == 0
    assert "(5 to run, 1 done); estimate unknown" in capsys.readouterr().out
    # The finished cell's config is not checked again (it is not run again).
    assert checks_in_process[-1] == [c.name for c in cells[1:]]

    for cell, seconds in zip(cells[1:4], (10.0, 40.0, 20.0)):  # median 20, mean 23.3
        _finish(sweep_dir, cell, seconds)
    os.makedirs(cells_lib.cell_dir(str(sweep_dir), cells[4].name))
    open(os.path.join(cells_lib.cell_dir(str(sweep_dir), cells[4].name), "error.txt"),
         "w").close()
    assert sweep.main(argv + ["--workers=1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "6 cells (2 to run, 1 of them failed before, 4 done); estimate ~40 s with 1 worker "
        "(the median wall time of the 3 cells earlier runs finished here, 20 s, x 2 / 1)")
    assert sweep.main(argv + [f"--only=seed={cells[5].overrides['seed']}$"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "1 of 6 cells selected (1 to run, 0 done); estimate ~10 s with 2 workers (the median "
        "wall time of the 3 cells earlier runs finished here, 20 s, x 1 / 2)")


def test_a_cell_run_by_the_pool_worker_records_its_wall_time(tmp_path, monkeypatch):
    import types

    import moejax

    def run(config, workdir, claim=None):
        return {"ran": True}

    fake_jobs = types.SimpleNamespace(run=run)
    monkeypatch.setattr(worker, "build_config", lambda *a: None)
    monkeypatch.setitem(sys.modules, "moejax.jobs", fake_jobs)
    monkeypatch.setattr(moejax, "jobs", fake_jobs, raising=False)
    work = str(tmp_path / "cell")
    outcome = worker.run_cell("unused.py", None, "cell", {}, work)
    assert outcome["ok"]
    assert worker.read_wall_time(work) == pytest.approx(outcome["seconds"], abs=1e-3)


def test_a_slurm_task_records_its_cells_wall_time(tiny_config, tmp_path, monkeypatch, capsys,
                                                  checks_in_process):
    """The array task runs its line, then records the wall time the next estimate reads: at
    least the job's own run and at most the whole task's (both read on the same clock as the
    task's, `date +%s.%N`). A stub `python` stands in for the job (it writes the cell's
    results.json, between two readings of the clock 0.3 s apart)."""
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    stub = stub_dir / "python"
    stub.write_text(textwrap.dedent(f'''\
        #!/bin/bash
        if [ "$1" = "-m" ] && [ "$2" = "moejax.main" ]; then
          for a in "$@"; do case "$a" in --workdir=*) W="${{a#--workdir=}}";; esac; done
          date +%s.%N > "{tmp_path}/job_start"
          mkdir -p "$W" && echo '{{"job": "stub"}}' > "$W/results.json" && sleep 0.3
          date +%s.%N > "{tmp_path}/job_end"
          exit 0
        fi
        exec {sys.executable} "$@"
    '''))
    stub.chmod(0o755)
    sweep_dir = tmp_path / "s"
    argv = [f"--config={tiny_config}:2", f"--sweep_dir={sweep_dir}"]
    assert sweep.main(argv + ["--slurm"]) == 0
    assert "2 cells (2 to run, 0 done); estimate unknown" in capsys.readouterr().out
    # Without activating the virtual environment, whose python would shadow the stub.
    script = sweep_dir / "slurm.sbatch"
    script.write_text("".join(line for line in script.read_text().splitlines(keepends=True)
                              if not line.startswith("source ")))
    env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}",
           "SLURM_ARRAY_TASK_ID": "0"}
    task = subprocess.run(["bash", "-c", f'date +%s.%N > "{tmp_path}/task_start"; '
                           f'bash "{sweep_dir / "slurm.sbatch"}"; status=$?; '
                           f'date +%s.%N > "{tmp_path}/task_end"; exit $status'],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert task.returncode == 0, task.stdout + task.stderr
    first = cells_lib.cells_from_config(tiny_config, "2")[0]
    seconds = worker.read_wall_time(cells_lib.cell_dir(str(sweep_dir), first.name))
    clock = {k: float((tmp_path / k).read_text()) for k in ("task_start", "job_start",
                                                             "job_end", "task_end")}
    assert seconds is not None
    # Rounded to the millisecond when recorded (`worker.record_wall_time`).
    assert clock["job_end"] - clock["job_start"] - 5e-4 <= seconds, (seconds, clock)
    assert seconds <= clock["task_end"] - clock["task_start"] + 5e-4, (seconds, clock)
    assert sweep.main(argv + ["--slurm"]) == 0
    assert ("(1 to run, 1 done); estimate ~" in capsys.readouterr().out)


# -- launch.diff -----------------------------------------------------------------------------
def test_diff_names_a_path_that_is_not_a_sweep_and_a_corrupt_results_json(tmp_path, capsys):
    good = tmp_path / "good"
    write_json_atomic(str(good / "cells" / "a" / "results.json"), {"x": 1})
    (tmp_path / "afile").write_text("")
    assert diff.main([str(tmp_path / "nope"), str(good)]) == 2
    _usage_error(capsys, 2, f"SWEEP_A={tmp_path / 'nope'}: no such directory")
    assert diff.main([str(good), str(tmp_path / "afile")]) == 2
    _usage_error(capsys, 2, f"SWEEP_B={tmp_path / 'afile'}: is a file, not a sweep directory")
    bad = tmp_path / "bad"
    os.makedirs(bad / "cells" / "a")
    (bad / "cells" / "a" / "results.json").write_text('{"x": ')
    assert diff.main([str(good), str(bad)]) == 2
    _usage_error(capsys, 2, f"{bad / 'cells' / 'a' / 'results.json'}: does not parse as JSON")


# -- the analysis tools ----------------------------------------------------------------------
def _replay_cell(root, name: str, **changes) -> dict:
    r = synthetic_results("prose_0", 0.05, "lru", "none", len(name))
    r["cache"].update(changes)
    write_json_atomic(str(root / "cells" / name / "results.json"), r)
    return r


def _bad_sweeps(tmp_path) -> dict[str, tuple[str, str]]:
    """Each kind of bad --sweep_dir: (path, the words naming it)."""
    (tmp_path / "afile").write_text("")
    os.makedirs(tmp_path / "no_cells")
    corrupt = tmp_path / "corrupt"
    _replay_cell(corrupt, "fine")
    os.makedirs(corrupt / "cells" / "broken")
    (corrupt / "cells" / "broken" / "results.json").write_text('{"cache": {"total": ')
    return {"missing": (str(tmp_path / "nope"), "no such directory"),
            "file": (str(tmp_path / "afile"), "is a file, not a sweep directory"),
            "no cells": (str(tmp_path / "no_cells"), "not a sweep directory (it has no cells/"),
            "corrupt": (str(corrupt), f"{corrupt / 'cells' / 'broken' / 'results.json'}: "
                                      f"does not parse as JSON")}


@pytest.mark.parametrize("tool", [report, claims, compare, disk_tier, host_compute])
def test_every_analysis_tool_names_a_bad_sweep_dir_and_writes_nothing(tool, tmp_path, capsys):
    for kind, (path, words) in _bad_sweeps(tmp_path).items():
        before = sorted(os.listdir(path)) if os.path.isdir(path) else None
        status = tool.main([f"--sweep_dir={path}"])
        err = _usage_error(capsys, status, words)
        assert err.startswith(f"{tool.PROG}: error: "), err
        if kind != "corrupt":
            assert f"--sweep_dir={path}: " in err
        assert (sorted(os.listdir(path)) if os.path.isdir(path) else None) == before, kind


def test_claims_names_a_capacity_or_bandwidth_it_cannot_read(tmp_path, capsys):
    _replay_cell(tmp_path, "a")
    with pytest.raises(SystemExit) as e:
        claims.main([f"--sweep_dir={tmp_path}", "--capacity=five"])
    _usage_error(capsys, e.value.code, "argument --capacity: 'five' is not a capacity")
    _usage_error(capsys, claims.main([f"--sweep_dir={tmp_path}", "--capacity=0.07"]),
                 "--capacity=7%: no cell at that capacity; the sweep's: 5%")
    _usage_error(capsys, claims.main([f"--sweep_dir={tmp_path}", "--h2d_gbps=7"]),
                 "--h2d_gbps=7: no cell at that bandwidth; the sweep's: 5 GB/s")


def test_compare_names_a_filter_no_cell_matches(tmp_path, capsys):
    _replay_cell(tmp_path, "a")
    status = compare.main([f"--sweep_dir={tmp_path}", "--prefetch=topk"])
    _usage_error(capsys, status, "--prefetch=topk: no cell has it among the cells with "
                                 "--h2d_gbps=5; they have: none")
    _usage_error(capsys, compare.main([f"--sweep_dir={tmp_path}", "--evictions=,"]),
                 "--evictions=,: name at least one eviction")
    assert compare.main([f"--sweep_dir={tmp_path}", "--evictions=lru,belady"]) == 0
    assert "No cell of belady here (–); the evictions these cells ran: lru." in \
        capsys.readouterr().out


def test_disk_tier_says_when_no_cell_ran_a_host_tier(tmp_path, capsys):
    _replay_cell(tmp_path, "a")
    status = disk_tier.main([f"--sweep_dir={tmp_path}"])
    _usage_error(capsys, status, "none of its 1 finished cells ran a host tier")


def test_routing_stats_names_a_file_that_is_not_a_trace(tmp_path, capsys):
    (tmp_path / "notes.jsonl").write_text("not json\n")
    for path, words in ((tmp_path / "notes.jsonl", "notes.jsonl:1: not JSON"),
                        (tmp_path, "is a directory"),
                        (tmp_path / "nope.npz", "nope.npz: No such file or directory")):
        _usage_error(capsys, routing_stats.main([str(path)]), words)


# -- the report: one configuration per entry and bar -----------------------------------------
def _precision_sweep(root) -> dict[str, dict]:
    """Cells of one trace, capacity, eviction and prefetch differing only in the experts'
    precision (numbers 25x apart), and an lfu cell whose TTFT ties the int8 cell's."""
    out = {}
    for name, precision, ev, seed in (("int8", "int8", "lru", 1), ("int4", "int4", "lru", 2),
                                      ("lfu", "int8", "lfu", 3)):
        r = synthetic_results("prose_0", 0.05, ev, "none", seed)
        r["config"]["cache"]["precision"] = r["cache"]["precision"] = precision
        out[name] = r
    out["int4"]["cache"]["timing"]["ttft_s"] = 25 * out["int8"]["cache"]["timing"]["ttft_s"]
    out["lfu"]["cache"]["timing"]["ttft_s"] = out["int8"]["cache"]["timing"]["ttft_s"]
    for name, r in out.items():
        write_json_atomic(str(root / "cells" / name / "results.json"), r)
    return out


def test_cells_differing_only_in_precision_stay_apart_and_ties_are_named(tmp_path):
    cells = _precision_sweep(tmp_path)
    text = open(report.write_report(str(tmp_path))).read()
    assert "| eviction · precision \\ prefetch | none |" in text
    rows = {line.split(" | ")[0]: line for line in text.splitlines()
            if line.startswith(("| lru ·", "| lfu ·"))}
    assert sorted(rows) == ["| lfu · int8", "| lru · int4", "| lru · int8"]
    assert not any(line.rstrip(" |").endswith("*") for line in rows.values())
    ttft_ms = 1e3 * cells["int4"]["cache"]["timing"]["ttft_s"]
    assert ttft_ms >= 100 and f"/ {ttft_ms:.0f} ms |" in rows["| lru · int4"]  # not a mean
    best = next(line for line in text.splitlines() if line.startswith("| prose_0 | 5% |"))
    assert "| tie of 2: lru · none · int8; lfu · none · int8 |" in best
    assert "none is better than the others" in text


def test_bars_keep_precisions_apart(tmp_path):
    _precision_sweep(tmp_path)
    rows = sweep_cells.load_cells(str(tmp_path))
    fig = report_figures.fig_ttft_decode(rows, str(tmp_path / "f.png"))
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["lru · int4", "lru · int8", "lfu · int8"]
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert max(heights) == pytest.approx(25 * min(h for h in heights if h > 0), rel=0.3)


# -- figures ---------------------------------------------------------------------------------
def _rows(tmp_path, specs) -> list[dict]:
    """Rows of synthetic cells: (capacity, eviction, prefetch, scale of the miss rates)."""
    rows = []
    for i, (frac, ev, pf, scale) in enumerate(specs):
        row = sweep_cells.cell_row(f"c{i}", synthetic_results("prose_0", frac, ev, pf, i))
        for key in ("miss_rate", "collision_miss_rate"):
            row[key] *= scale
        row["layer_collision_miss_rate"] = [v * scale for v in row["layer_collision_miss_rate"]]
        rows.append(row)
    return rows


def test_capacity_panels_share_one_y_scale_and_an_all_zero_panel_says_so(tmp_path):
    rows = _rows(tmp_path, [(0.05, "lru", "none", 1.0), (0.05, "least_stale", "none", 1.0),
                            (0.25, "lru", "none", 0.04), (0.25, "least_stale", "none", 0.04),
                            (0.5, "lru", "none", 0.0), (0.5, "least_stale", "none", 0.0)])
    for draw, why in ((report_figures.fig4, "all zero: no misses in these cells"),
                      (report_figures.fig5, "all zero: no collision misses in these cells")):
        fig = draw(rows, str(tmp_path / "f.png"))
        axes = fig.axes
        assert len(axes) == 3
        assert len({ax.get_ylim() for ax in axes}) == 1  # 25x smaller looks 25x smaller
        assert "one y scale for every panel" in fig.get_suptitle()
        notes = [[t.get_text() for t in ax.texts if t.get_text().startswith("all zero")]
                 for ax in axes]
        assert notes[:2] == [[], []] and len(notes[2]) == 1 and notes[2][0].startswith(why)


def test_fig6_legend_entries_are_all_distinct(tmp_path):
    rows = _rows(tmp_path, [(0.05, "least_stale", "none", 1), (0.25, "least_stale", "none", 1),
                            (0.05, "least_stale", "score_percentile(p=80)", 1)])
    fig = report_figures.fig6(rows, str(tmp_path / "f.png"))
    looks = {}
    for legend in fig.legends:
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            if hasattr(handle, "get_marker"):
                look = ("marker", handle.get_marker(), str(handle.get_markerfacecolor()),
                        str(handle.get_color()))
            else:
                look = ("patch", tuple(handle.get_facecolor()))
            looks[text.get_text()] = look
    assert {"capacity 5%", "ready hits (filled)", "none"} <= set(looks)
    assert len(set(looks.values())) == len(looks), looks
    # A capacity's shape is never the hit legend's (a grey and a black circle look alike).
    shapes = {looks[t][1] for t in looks if t.startswith("capacity ")}
    assert not shapes & {looks[t][1] for t in looks if "hits" in t}
    assert [lg.get_title().get_text() for lg in fig.legends] == [
        "prefetch (colour)", "capacity (marker)", "hit rate (fill)"]


def test_frontier_rows_differing_in_a_config_field_read_apart():
    rows = [{"name": f"q{i}", "model": "embedded", "capacity": "5%", "capacity_key": (0, 0.05),
             "h2d_gbps": 5.0, "miss": "drop(keep=1)", "routing": "standard", "precision": None,
             "pools": None, "eviction": "lru", "prefetch": "none", "queue": "immediate",
             "decode_tok_per_s": 100.0 + i, "kl_mean": 0.01 * (i + 1),
             "setup": {"quality.segment_tokens": json.dumps(tokens)}}
            for i, tokens in enumerate((64, 128))]
    (group,) = frontier_lib.frontier_rows(rows)
    assert [group.label(i) for i in range(2)] == ["drop(keep=1) · 128", "drop(keep=1) · 64"]


def test_frontier_colours_of_the_precisions_differ_in_hue(tmp_path):
    rows = []
    for i, precision in enumerate(("native", "int8", "int4", "int2")):
        rows.append({"name": f"q{i}", "model": "embedded", "capacity": "5%",
                     "capacity_key": (0, 0.05), "h2d_gbps": 5.0, "miss": "fetch",
                     "routing": "standard", "precision": precision, "pools": None,
                     "eviction": "lru", "prefetch": "none", "queue": "immediate",
                     "decode_tok_per_s": 100.0 - 10 * i, "kl_mean": 0.01 * i})
    groups = frontier_lib.frontier_rows(rows)
    fig = report_figures.fig_quality_frontier(groups, str(tmp_path / "f.png"))
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "miss policy (colour)"
    colours = {text.get_text(): to_rgb(handle.get_facecolor())
               for handle, text in zip(legend.legend_handles, legend.get_texts())}
    quantized = [colours[f"fetch @{p}"] for p in ("int8", "int4", "int2")]
    hues = [360 * colorsys.rgb_to_hsv(*c)[0] for c in quantized]
    for a, b in itertools.combinations(hues, 2):
        assert min(abs(a - b), 360 - abs(a - b)) >= 30, hues
    assert len(set(colours.values())) == len(colours)
