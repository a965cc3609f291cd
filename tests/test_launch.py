"""The sweep launcher (`python -m launch.sweep`) with real processes: a pool sweep of tiny
generate cells, a re-run that skips them, a sweep killed half-way and resumed, failing cells,
the Slurm job array's command lines, and the cell names.

The subprocesses share a JAX persistent compilation cache in a session temporary directory, so
only the first pool worker compiles the tiny model's steps from scratch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launch import cells as cells_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Cells of the test config, by config argument (`sweep.py:main`): get_config ignores it, sweep
# picks its cells by it, so the argument is seen to reach both.
SWEEP_CONFIG = textwrap.dedent('''
    import os

    from moejax.jobs.schema import base_config

    SETS = {
        # (the first two compile different slot counts: a pool of two starts them together)
        "main": [
            {"cache.capacity_frac": 0.25, "policies.eviction": "lru"},
            {"cache.capacity_frac": 0.5, "policies.eviction": "lru"},
            {"cache.capacity_frac": 0.25, "policies.eviction": "lfu"},
            # a spec string with '(' and '=', a bool, an int: the flag formats of cells.txt
            {"policies.prefetch": "topk(overfetch=1.5)", "run.stop_at_eos": False,
             "run.max_new_tokens": 3},
        ],
        # distinct slot counts: the first cell compiles (~2 s), so the sweep is slow enough to
        # kill after it; the next two are the main set's slot counts, whose compiled steps the
        # shared cache holds once that set ran, and the last compiles again
        "kill": [{"cache.capacity_frac": f, "policies.eviction": "lru"}
                 for f in (0.3, 0.25, 0.5, 0.7)],
        # configs that check, cells that fail as they run (below; a config that does not check
        # is refused at launch: tests/test_bad_input_sweep.py)
        "fail": [
            {"cache.capacity_frac": 0.25, "policies.eviction": "lru"},
            {"run.max_new_tokens": 101},
            {"run.max_new_tokens": 102},
        ],
        # seed=-1 kills its worker process (below); the other cells fail cheaply, without JAX
        "crash": [{"run.max_new_tokens": 101}, {"seed": -1}, {"run.max_new_tokens": 102},
                  {"run.max_new_tokens": 103}, {"run.max_new_tokens": 104}],
        # cells that fail as they run, cheaply (below)
        "marker": [{"run.max_new_tokens": 101}, {"run.max_new_tokens": 102}],
        # each cell's job writes its results.json, then its worker dies (below): no JAX
        "finish_then_die": [{"run.max_new_tokens": 5}, {"run.max_new_tokens": 6}],
    }


    def _fail_or_die(run):
        """A cell's job that dies (os._exit, as a segfault or the OOM killer would) with
        seed=-1, fails with run.max_new_tokens > 100, and is `run` otherwise."""

        def job(config, workdir, claim=None):
            if config.seed == -1:
                os._exit(3)
            if config.run.max_new_tokens > 100:
                raise RuntimeError(f"run.max_new_tokens={config.run.max_new_tokens}: this "
                                   "cell fails as it runs")
            return run(config, workdir, claim=claim)

        job.replaced = True
        return job


    def _finish_then_die(config, workdir, claim=None):
        """A job killed (os._exit, as SIGKILL or the OOM killer would) just after it wrote
        its results.json atomically, before its worker could remove the .running marker."""
        from moejax.results import write_json_atomic

        write_json_atomic(os.path.join(workdir, "results.json"),
                          {"max_new_tokens": config.run.max_new_tokens})
        os._exit(3)


    def get_config(arg=None):
        """(Also called where the launcher checks the cells: `jobs.check` is not replaced.)
        With TINY_SWEEP_CALLS set, each call appends its process id to that file: what
        shows that a worker or the launcher's check process ran."""
        assert arg in SETS, arg
        if os.environ.get("TINY_SWEEP_CALLS"):
            with open(os.environ["TINY_SWEEP_CALLS"], "a") as f:
                f.write(f"{os.getpid()}\\n")
        import moejax.jobs

        if arg == "finish_then_die":  # in the worker process running the cell
            moejax.jobs.run = _finish_then_die
        elif arg in ("fail", "crash", "marker") and not getattr(moejax.jobs.run, "replaced",
                                                               False):
            moejax.jobs.run = _fail_or_die(moejax.jobs.run)
        c = base_config()
        c.model.preset = "tiny"
        c.model.family = "olmoe"
        c.cache.capacity_frac = 0.25
        c.run.max_new_tokens = 2
        c.run.warmup = False
        c.log.progress = False
        c.log.tensorboard = False  # (its writer imports torch: seconds in each worker)
        return c


    def sweep(add, arg):
        for overrides in SETS[arg]:
            add(**overrides)
''')


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """Subprocess environment: this venv's python first on PATH (cells.txt says `python`), a
    shared persistent compilation cache."""
    e = dict(os.environ)
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path_factory.mktemp("jax_cache"))
    e["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    e["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    e["JAX_PLATFORMS"] = e.get("JAX_PLATFORMS", "cpu")
    return e


@pytest.fixture(scope="session")
def config_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("configs") / "tiny_sweep.py"
    path.write_text(SWEEP_CONFIG)
    return str(path)


def launch(env, config, sweep_dir, *flags, timeout=120):
    return subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={config}",
                           f"--sweep_dir={sweep_dir}", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def results(sweep_dir) -> dict[str, dict]:
    """Every results.json under DIR/cells, parsed (a corrupt one fails the test)."""
    out = {}
    cells_dir = os.path.join(sweep_dir, "cells")
    for name in sorted(os.listdir(cells_dir)):
        path = os.path.join(cells_dir, name, "results.json")
        if os.path.exists(path):
            with open(path) as f:
                out[name] = json.load(f)
    return out


def mtimes(sweep_dir) -> dict[str, int]:
    return {n: os.stat(os.path.join(sweep_dir, "cells", n, "results.json")).st_mtime_ns
            for n in results(sweep_dir)}


def sweep_cells(sweep_dir) -> list[dict]:
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        return json.load(f)["cells"]


@pytest.fixture(scope="session")
def main_sweep(env, config_file, tmp_path_factory):
    """The `main` set run once in a pool of two workers (shared by the tests that read it)."""
    sweep_dir = str(tmp_path_factory.mktemp("main_sweep"))
    calls = os.path.join(str(tmp_path_factory.mktemp("calls")), "get_config")
    proc = launch({**env, "TINY_SWEEP_CALLS": calls}, f"{config_file}:main", sweep_dir,
                  "--workers=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(calls) as f:  # the check process and the workers each called get_config
        callers = set(f.read().split())
    return sweep_dir, proc, callers


@pytest.mark.slow
def test_pool_runs_every_cell_and_a_rerun_skips_them(main_sweep, env, config_file,
                                                      tmp_path):
    sweep_dir, proc, callers = main_sweep
    cells = sweep_cells(sweep_dir)
    assert len(cells) == 4
    done = results(sweep_dir)
    assert sorted(done) == sorted(c["name"] for c in cells)
    for c in cells:
        r = done[c["name"]]
        assert len(r["generated_token_ids"]) == c["overrides"].get("run.max_new_tokens", 2)
        assert r["cache"]["policies"]["eviction"] == c["overrides"].get("policies.eviction",
                                                                       "least_stale")
    assert "4 cells (4 to run, 0 done); estimate unknown until the first cells finish" in \
        proc.stdout  # the size, before it started
    assert "4 cells: 0 finished before, 4 ran now, 0 failed" in proc.stdout
    assert not os.path.exists(os.path.join(sweep_dir, "failures.json"))

    before = mtimes(sweep_dir)
    # The first run's check process and at least one worker called get_config (what the
    # rerun's file below would show had it started either); the rerun starts neither: no
    # process of its called get_config, and it announced no config check.
    assert len(callers) >= 2, callers
    calls = str(tmp_path / "get_config_calls")
    again = launch({**env, "TINY_SWEEP_CALLS": calls}, f"{config_file}:main", sweep_dir,
                   "--workers=2")
    assert again.returncode == 0, again.stderr
    assert not os.path.exists(calls), open(calls).read()
    assert "checking each one's config" not in again.stderr, again.stderr
    assert "4 finished before, 0 ran now" in again.stdout
    assert mtimes(sweep_dir) == before

    dry = launch(env, f"{config_file}:main", sweep_dir, "--dry_run", "--only=eviction=lfu")
    assert dry.returncode == 0, dry.stderr
    listed = [line for line in dry.stdout.splitlines() if line.startswith("finished")]
    assert len(listed) == 1 and "eviction=lfu" in listed[0]
    assert "1 of 4 cells selected (0 to run, 1 done); nothing to run" in dry.stdout


@pytest.mark.slow
def test_killed_sweep_resumes_complete_and_uncorrupted(main_sweep, env, config_file, tmp_path):
    # (main_sweep: run before, so that the compiled steps of its slot counts are in the cache)
    sweep_dir = str(tmp_path / "sweep")
    # One worker: on a two-core machine two JAX processes starting together are slower than one.
    cmd = [sys.executable, "-m", "launch.sweep", f"--config={config_file}:kill",
           f"--sweep_dir={sweep_dir}", "--workers=1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    cells_dir = os.path.join(sweep_dir, "cells")
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            names = os.listdir(cells_dir) if os.path.isdir(cells_dir) else []
            if any(os.path.exists(os.path.join(cells_dir, n, "results.json")) for n in names):
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
        proc.wait()
    partial = results(sweep_dir)  # every results.json left behind parses
    assert 1 <= len(partial) < 4, "the kill should land between the first and the last cell"

    rerun = launch(env, f"{config_file}:kill", sweep_dir, "--workers=1")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"{len(partial)} finished before, {4 - len(partial)} ran now" in rerun.stdout
    done = results(sweep_dir)
    assert len(done) == 4
    assert all(len(r["generated_token_ids"]) == 2 for r in done.values())
    for name, r in done.items():
        if name in partial:  # not run again
            assert r == partial[name]
    slots = {r["cache"]["slots"] for r in done.values()}
    assert len(slots) == 4  # each cell ran with its own capacity
    leftovers = [f for n in done for f in os.listdir(os.path.join(cells_dir, n))
                 if f.startswith(".tmp-") or f == ".running"]
    assert not leftovers


def _markers(sweep_dir) -> list[str]:
    cells_dir = os.path.join(sweep_dir, "cells")
    return sorted(n for n in os.listdir(cells_dir)
                  if os.path.exists(os.path.join(cells_dir, n, ".running")))


@pytest.mark.slow
def test_resume_removes_the_stale_marker_of_a_finished_cell(env, config_file, tmp_path):
    """What a worker SIGKILLed between its job's atomic write of results.json and its removal
    of `.running` leaves: both. A resume counts the cell finished, does not run it again, and
    removes the marker (a finished cell has no marker after any resume)."""
    sweep_dir = str(tmp_path / "sweep")
    cells = cells_lib.cells_from_config(config_file, "main")
    for i, c in enumerate(cells):
        d = cells_lib.cell_dir(sweep_dir, c.name)
        os.makedirs(d)
        with open(os.path.join(d, "results.json"), "w") as f:
            json.dump({"cell": c.name}, f)
        if i % 2 == 0:  # as the killed worker left it (the others finished cleanly)
            with open(os.path.join(d, ".running"), "w") as f:
                f.write("12345")
    before = mtimes(sweep_dir)
    assert _markers(sweep_dir) == sorted(c.name for c in cells[::2])

    proc = launch(env, f"{config_file}:main", sweep_dir, "--workers=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 cells: 4 finished before, 0 ran now, 0 failed" in proc.stdout
    assert _markers(sweep_dir) == []
    assert mtimes(sweep_dir) == before  # not re-run
    assert results(sweep_dir) == {c.name: {"cell": c.name} for c in cells}


@pytest.mark.slow
def test_a_worker_killed_after_its_cell_finished_leaves_it_finished(env, config_file,
                                                                     tmp_path):
    """A worker dies (os._exit) right after each cell's job wrote its results.json: the cells
    count as run, none is run again or failed, and none keeps its marker."""
    sweep_dir = str(tmp_path / "sweep")
    proc = launch(env, f"{config_file}:finish_then_die", sweep_dir, "--workers=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 cells: 0 finished before, 2 ran now, 0 failed" in proc.stdout
    assert not os.path.exists(os.path.join(sweep_dir, "failures.json"))
    assert {r["max_new_tokens"] for r in results(sweep_dir).values()} == {5, 6}
    assert _markers(sweep_dir) == []
    again = launch(env, f"{config_file}:finish_then_die", sweep_dir, "--workers=1")
    assert "2 finished before, 0 ran now" in again.stdout, again.stdout + again.stderr


def test_run_cell_removes_its_marker_however_the_run_ends(tmp_path, monkeypatch):
    """The marker goes in a `finally`: an exception the worker does not catch as a cell failure
    (KeyboardInterrupt) still removes it."""
    from launch import worker

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(worker, "build_config", interrupted)
    workdir = str(tmp_path / "cell")
    with pytest.raises(KeyboardInterrupt):
        worker.run_cell("unused.py", None, "cell", {}, workdir)
    assert os.path.isdir(workdir) and not os.path.exists(os.path.join(workdir, worker.RUNNING))


def test_run_cell_leaves_a_cell_another_run_holds_alone_and_releases_its_own(tmp_path,
                                                                               monkeypatch):
    """A cell's directory is claimed before it is emptied: while another run holds it (a Slurm
    task re-run by hand beside the pool) the cell fails naming that run and nothing of the
    directory is touched; a cell that ran (here: failed in its config) lets its claim go."""
    from launch import worker
    from moejax import workdir as workdir_lib

    workdir = str(tmp_path / "cell")
    with workdir_lib.claimed(workdir):  # the other run
        with open(os.path.join(workdir, "events.the_other_run"), "w") as f:
            f.write("written by the run holding the cell")
        outcome = worker.run_cell("unused.py", None, "cell", {}, workdir)
        assert not outcome["ok"] and "in use by pid" in outcome["error"], outcome
        assert sorted(os.listdir(workdir)) == [workdir_lib.LOCK_NAME, "events.the_other_run"]

    def bad_config(*args):
        raise ValueError("a bad override")

    monkeypatch.setattr(worker, "build_config", bad_config)
    outcome = worker.run_cell("unused.py", None, "cell", {}, workdir)
    assert not outcome["ok"] and "a bad override" in outcome["error"]
    assert sorted(os.listdir(workdir)) == ["error.txt", "log.txt"]  # emptied, claim released
    workdir_lib.claim(workdir).release()

    # A lock a killed run left (no process holds it): taken over, and the cell's log says so.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    with open(os.path.join(workdir, workdir_lib.LOCK_NAME), "w") as f:
        json.dump({"pid": int(dead.stdout), "host": socket.gethostname(), "started": 0.0,
                   "command": "a killed run"}, f)
    outcome = worker.run_cell("unused.py", None, "cell", {}, workdir)
    assert "a bad override" in outcome["error"]
    with open(os.path.join(workdir, "log.txt")) as f:
        log = f.read()
    assert log.startswith(f"note: --workdir={workdir}: taking over the lock left by pid "
                          f"{int(dead.stdout)}"), log[:300]
    assert "(no longer running)" in log.splitlines()[0]
    workdir_lib.claim(workdir).release()


@pytest.mark.slow
def test_failing_cells_are_reported_and_do_not_stop_the_others(env, config_file, tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    proc = launch(env, f"{config_file}:fail", sweep_dir, "--workers=2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    names = [c["name"] for c in sweep_cells(sweep_dir)]
    assert list(results(sweep_dir)) == [names[0]]
    with open(os.path.join(sweep_dir, "failures.json")) as f:
        failures = {x["name"]: x["error"] for x in json.load(f)}
    assert sorted(failures) == sorted(names[1:])
    for name, n in zip(names[1:], (101, 102)):
        assert failures[name] == (f"RuntimeError: run.max_new_tokens={n}: this cell fails as "
                                  "it runs"), failures
    assert "2 failed" in proc.stdout
    assert os.path.exists(os.path.join(sweep_dir, "cells", names[2], "error.txt"))


@pytest.mark.slow
def test_a_cell_that_kills_its_worker_fails_alone(env, config_file, tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    proc = launch(env, f"{config_file}:crash", sweep_dir, "--workers=2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with open(os.path.join(sweep_dir, "failures.json")) as f:
        failures = {x["name"]: x["error"] for x in json.load(f)}
    assert len(failures) == 5
    assert "worker process died" in failures.pop("seed=-1")
    assert all("this cell fails as it runs" in e for e in failures.values())  # each ran itself
    # The pool breaks for every cell in flight when a worker dies, so the message names
    # all of them as suspects (which ones depends on timing); each is rerun alone.
    died = [line for line in proc.stdout.splitlines()
            if line.startswith("a worker process died while running ")]
    assert len(died) == 1, proc.stdout
    suspects = died[0].removeprefix("a worker process died while running ").split(";")[0]
    assert "seed=-1" in suspects.split(", "), died[0]


@pytest.mark.slow
def test_a_cell_another_run_holds_keeps_its_running_marker(env, config_file, tmp_path):
    """A cell another process runs (a Slurm task re-run by hand) fails in the pool as its claim
    is refused, and keeps the RUNNING marker it wrote; a marker a killed launcher left goes."""
    from launch import worker
    from moejax import workdir as workdir_lib

    sweep_dir = tmp_path / "sweep"
    names = ["max_new_tokens=101", "max_new_tokens=102"]
    for name in names:
        (sweep_dir / "cells" / name).mkdir(parents=True)
        (sweep_dir / "cells" / name / worker.RUNNING).write_text("4242")
    with workdir_lib.claimed(str(sweep_dir / "cells" / names[0])):
        proc = launch(env, f"{config_file}:marker", str(sweep_dir), "--workers=1")
        assert (sweep_dir / "cells" / names[0] / worker.RUNNING).read_text() == "4242"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with open(sweep_dir / "failures.json") as f:
        failures = {x["name"]: x["error"] for x in json.load(f)}
    assert f"in use by pid {os.getpid()}" in failures[names[0]], failures
    assert "this cell fails as it runs" in failures[names[1]], failures
    assert not (sweep_dir / "cells" / names[1] / worker.RUNNING).exists()


@pytest.mark.slow
def test_slurm_array_and_its_command_lines(main_sweep, env, config_file, tmp_path):
    pool_dir, _, _ = main_sweep
    sweep_dir = str(tmp_path / "slurm")
    proc = launch(env, f"{config_file}:main", sweep_dir, "--slurm", "--time=00:30:00",
                  "--partition=debug", "--gres=gpu:h200:1")
    assert proc.returncode == 0, proc.stderr
    assert "sbatch " in proc.stdout
    cells = sweep_cells(sweep_dir)
    lines = open(os.path.join(sweep_dir, "cells.txt")).read().splitlines()
    assert lines == [c["command"] for c in cells]
    assert all(line.startswith("python -m moejax.main --config=") for line in lines)
    sbatch = open(os.path.join(sweep_dir, "slurm.sbatch")).read()
    assert "#SBATCH --array=0-3\n" in sbatch
    assert f"#SBATCH --output={sweep_dir}/logs/%A_%a.out" in sbatch
    for flag in ("--time=00:30:00", "--partition=debug", "--gres=gpu:h200:1"):
        assert f"#SBATCH {flag}\n" in sbatch
    assert os.path.isdir(os.path.join(sweep_dir, "logs"))
    assert not os.path.exists(os.path.join(sweep_dir, "cells", cells[3]["name"]))  # ran nothing

    # The cell with a spec string, a bool and an int, run alone from its line.
    i = 3
    assert "'--config.policies.prefetch=topk(overfetch=1.5)'" in lines[i]
    assert "--config.run.stop_at_eos=false" in lines[i]
    run = subprocess.run(["bash", "-c", lines[i]], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    alone = results(sweep_dir)[cells[i]["name"]]
    pooled = results(pool_dir)[cells[i]["name"]]
    assert alone["generated_token_ids"] == pooled["generated_token_ids"]
    assert len(alone["generated_token_ids"]) == 3
    assert alone["cache"]["policies"] == pooled["cache"]["policies"]

    # The array task for that line finds the cell finished and skips it.
    before = mtimes(sweep_dir)
    task = subprocess.run(["bash", os.path.join(sweep_dir, "slurm.sbatch")], cwd=ROOT,
                          env={**env, "SLURM_ARRAY_TASK_ID": str(i)}, capture_output=True,
                          text=True, timeout=60)
    assert task.returncode == 0, task.stdout + task.stderr
    assert "finished already" in task.stdout
    assert mtimes(sweep_dir) == before


# -- cell names ------------------------------------------------------------------------------
_part = st.sampled_from(["a", "b", "cache", "policies", "capacity_frac", "eviction", "x_1"])
_key = st.lists(_part, min_size=1, max_size=3).map(".".join)
_value = st.one_of(st.text(max_size=40), st.integers(), st.booleans(),
                   st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from(["lru", "LRU", "topk(overfetch=1.5)", "topk(overfetch=1.5 )",
                                    "/data/a/trace.jsonl", "/data/b/trace.jsonl", "a,b", "a b"]))
_overrides = st.dictionaries(_key, _value, max_size=5)


@settings(max_examples=200, deadline=None)
@given(st.lists(_overrides, max_size=12, unique_by=cells_lib.canonical))
def test_cell_names_are_deterministic_safe_and_unique(sweep):
    names = cells_lib.cell_names(sweep)
    assert len({n.lower() for n in names}) == len(names)  # case-insensitive file systems too
    for n in names:
        assert cells_lib.NAME_RE.match(n) and len(n) <= cells_lib.MAX_NAME
        assert n not in (".", "..") and not n.startswith(("-", "."))
    # Independent of dict order, of the process, and stable under re-expansion.
    reordered = [dict(reversed(list(o.items()))) for o in sweep]
    assert cells_lib.cell_names(reordered) == names
    assert [c.name for c in cells_lib.make_cells(sweep)] == names


def test_cell_names_read_like_their_overrides():
    names = cells_lib.cell_names([
        {"cache.capacity_frac": 0.05, "policies.eviction": "lru",
         "policies.prefetch": "topk(overfetch=1.5)"},
        {"replay.trace": "/data/traces/olmoe/chat.jsonl", "cache.slots": 8},
        {"model.preset": "tiny", "hardware.preset": "h200"},
        {"policies.eviction": "a:b"}, {"policies.eviction": "a_b"},  # collide once sanitised
    ])
    assert names[0] == "capacity_frac=0.05,eviction=lru,prefetch=topk_overfetch-1.5"
    assert names[1] == "slots=8,trace=chat.jsonl"
    assert names[2] == "hardware.preset=h200,model.preset=tiny"
    assert re.fullmatch(r"eviction=a_b-h[0-9a-f]{8}", names[3])
    assert re.fullmatch(r"eviction=a_b-h[0-9a-f]{8}", names[4])
    assert names[3] != names[4]
    assert cells_lib.readable_name({"run.prompt": "x" * 400}).endswith(
        "-h" + cells_lib.overrides_hash({"run.prompt": "x" * 400}))
    with pytest.raises(cells_lib.SweepError, match="same overrides"):
        cells_lib.make_cells([{"a.b": 1}, {"a.b": 1}])
    with pytest.raises(cells_lib.SweepError, match="dotted field name"):
        cells_lib.collect(lambda add: add(**{"cache..x": 1}))


def test_command_lines_round_trip_through_bash_and_the_config_flags(config_file, tmp_path):
    """Each value reaches the config as `add` gave it: quoted for bash (one line, newlines
    included), formatted for ml_collections' flag parser of the field's type."""
    from absl import flags
    from ml_collections import config_flags

    overrides = {"cache.capacity_frac": 1e-05, "run.max_new_tokens": 7, "run.warmup": True,
                 "run.stop_at_eos": False, "policies.prefetch": "topk(overfetch=1.5, lookahead=2)",
                 "run.prompt": "it's a \"test\"\n\tof $HOME `and` \\ quoting; é ∑",
                 "hardware.h2d_gbps": 32.0, "seed": -3, "run.prompt_ids": ""}
    line = cells_lib.command(config_file, "main", str(tmp_path / "w x"), overrides)
    assert "\n" not in line and line.startswith("python -m moejax.main ")
    split = subprocess.run(["bash", "-c", "printf '%s\\0' " + line.split(" ", 3)[3]],
                           capture_output=True, check=True).stdout.decode().split("\0")[:-1]
    assert split[0] == f"--config={config_file}:main"
    assert split[1] == f"--workdir={tmp_path / 'w x'}"
    fv = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", flag_values=fv, sys_argv=["p", *split])
    fv(["p", *[a for a in split if not a.startswith("--workdir")]])
    config = holder.value
    for key, value in overrides.items():
        group, _, field = key.rpartition(".")
        got = (config[group] if group else config)[field]
        assert got == value and type(got) is type(value), key


def test_a_workers_config_is_a_copy_of_get_configs_once_two_calls_agree(tmp_path):
    """`get_config_copy`: get_config is called until two calls on the same bytes pickle the
    same, then each cell gets an independent copy equal to a fresh call (locked the same,
    type-safe the same); a result that changes from call to call, or a file edited since, is
    built by get_config itself."""
    path = tmp_path / "c.py"
    path.write_text("import ml_collections\nCALLS = []\n"
                    "def get_config(arg=None):\n"
                    "    CALLS.append(arg)\n"
                    "    c = ml_collections.ConfigDict()\n"
                    "    c.rate, c.name = 0.5, arg or 'x'\n"
                    "    c.sub = ml_collections.ConfigDict({'n': 3})\n"
                    "    return c\n")
    calls = []
    for _ in range(4):
        module = cells_lib.load_config_module(str(path))
        config = cells_lib.get_config_copy(module, "a")
        calls.append(len(module.CALLS))
        assert config.to_dict() == {"rate": 0.5, "name": "a", "sub": {"n": 3}}
        assert not config.is_locked  # as get_config returned it
        config.sub.n = 4  # a cell's change stays in its copy
        with pytest.raises(TypeError):
            config.rate = "fast"
    assert calls == [1, 1, 0, 0]
    stat = os.stat(path)
    path.write_text(path.read_text().replace("0.5", "0.7"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    module = cells_lib.load_config_module(str(path))
    assert cells_lib.get_config_copy(module, "a").rate == 0.7 and module.CALLS == ["a"]
    path.write_text("import itertools\nimport ml_collections\nCOUNT = itertools.count()\n"
                    "def get_config():\n"
                    "    return ml_collections.ConfigDict({'n': next(COUNT)})\n")
    module = cells_lib.load_config_module(str(path))  # (one module: its count goes on)
    assert [cells_lib.get_config_copy(module, None).n for _ in range(4)] == [0, 1, 2, 3]


def test_a_config_file_is_run_from_its_current_bytes_each_time(tmp_path):
    """A worker loads the config file for every cell (a fresh module each time) and compiles it
    again only when its bytes changed: an edit of the same size within the same second is
    seen."""
    path = tmp_path / "c.py"
    path.write_text("VALUE = 1\nSEEN = []\n")
    first = cells_lib.load_config_module(str(path))
    first.SEEN.append(1)
    again = cells_lib.load_config_module(str(path))
    assert again is not first and again.VALUE == 1 and again.SEEN == []
    stat = os.stat(path)
    path.write_text("VALUE = 2\nSEEN = []\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cells_lib.load_config_module(str(path)).VALUE == 2
    path.write_text("VALUE = (\n")
    with pytest.raises(SyntaxError):
        cells_lib.load_config_module(str(path))
