"""A local sweep's progress (issue 39): the time left, estimated from the wall times of the cells
finished in this run and corrected as each cell finishes, one line per finished cell (at most
about 50, or one line rewritten on a terminal), and the first estimate saying where it came
from. The estimate is tested with injected cell times and an injected clock; a real small
sweep (a stand-in job, no model) is seen to print a line per finished cell."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap

import pytest

from launch import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_time_left_is_the_median_cell_time_x_cells_left_over_workers():
    assert sweep.remaining_seconds([2.0, 2.0, 2.0], left=6, workers=2) == 6.0
    assert sweep.remaining_seconds([1.0, 2.0, 9.0], left=6, workers=2) == 6.0  # median, not mean
    assert sweep.remaining_seconds([2.0, 2.0, 2.0], left=1, workers=2) == 2.0  # one cell: one
    assert sweep.remaining_seconds([3.0], left=4, workers=1) == 12.0
    assert sweep.remaining_seconds([], left=4, workers=2) is None
    assert sweep.remaining_seconds([2.0], left=0, workers=2) == 0.0
    assert sweep.remaining([2.0, 2.0, 2.0], left=6, workers=2) == (
        "~6 s left (the median of the 3 cells finished in this run, 2.0 s, x 6 to go / "
        "2 workers)")
    assert sweep.remaining([], left=6, workers=2) == (
        "time left unknown (no cell has finished in this run yet)")
    # A replay cell takes milliseconds: its median is said in them, not as "0.0 s".
    assert sweep.remaining([0.026, 0.031, 0.020], left=400, workers=2) == (
        "~5 s left (the median of the 3 cells finished in this run, 26 ms, x 400 to go / "
        "2 workers)")


class Clock:
    """A clock the test sets."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_finished_cell_prints_done_failed_elapsed_and_the_corrected_estimate():
    clock, out = Clock(), io.StringIO()
    progress = sweep.Progress(total=10, before=1, workers=2, clock=clock, out=out, tty=False)
    for now, ok, seconds in ((102.0, True, 2.0), (102.5, False, 0.5), (104.0, True, 2.0),
                             (105.0, True, 2.0)):
        clock.now = now
        progress.cell(ok, seconds)
    assert out.getvalue().splitlines() == [
        "2/10 cells done (0 failed), 2.0 s elapsed; ~8 s left (the median of the 1 cell "
        "finished in this run, 2.0 s, x 8 to go / 2 workers)",
        # a failed cell counts as done; its time is no finished cell's
        "3/10 cells done (1 failed), 2.5 s elapsed; ~7 s left (the median of the 1 cell "
        "finished in this run, 2.0 s, x 7 to go / 2 workers)",
        "4/10 cells done (1 failed), 4.0 s elapsed; ~6 s left (the median of the 2 cells "
        "finished in this run, 2.0 s, x 6 to go / 2 workers)",
        "5/10 cells done (1 failed), 5.0 s elapsed; ~5 s left (the median of the 3 cells "
        "finished in this run, 2.0 s, x 5 to go / 2 workers)",
    ]
    for _ in range(4):
        progress.cell(True, 60.0)
    clock.now = 220.0
    progress.cell(True, 60.0)
    lines = out.getvalue().splitlines()
    assert lines[-2] == ("9/10 cells done (1 failed), 5.0 s elapsed; ~60 s left (the median of "
                         "the 7 cells finished in this run, 60 s, x 1 to go / 1 worker)")
    assert lines[-1] == "10/10 cells done (1 failed), 2 min elapsed"


@pytest.mark.parametrize("total, before, lines", [(5000, 0, 50), (1000, 990, 10),
                                                  (51, 0, 50), (50, 0, 50), (120, 19, 50)])
def test_a_large_sweep_prints_about_50_lines_and_always_the_last(total, before, lines):
    out = io.StringIO()
    progress = sweep.Progress(total, before, 4, clock=Clock(), out=out, tty=False)
    for _ in range(total - before):
        progress.cell(True, 1.0)
    printed = out.getvalue().splitlines()
    assert len(printed) == lines
    assert printed[-1].startswith(f"{total}/{total} cells done (0 failed)")
    done = [int(line.split("/")[0]) for line in printed]
    assert done == sorted(set(done))


def test_on_a_terminal_one_line_is_rewritten_and_a_failure_printed_above_it(capsys):
    out = io.StringIO()
    progress = sweep.Progress(3, 0, 1, clock=Clock(), out=out, tty=True)
    progress.cell(True, 1.0)
    progress.note("FAILED cell_b: it broke")
    progress.cell(False, 0.1)
    progress.close()
    first = "1/3 cells done (0 failed), 0.0 s elapsed; ~2 s left (the median of the 1 cell " \
            "finished in this run, 1.0 s, x 2 to go / 1 worker)"
    assert out.getvalue() == (f"\r{first}\x1b[K" + "\r\x1b[K" + f"\r{first}\x1b[K"
                              + "\r2/3 cells done (1 failed), 0.0 s elapsed; ~1 s left (the "
                              "median of the 1 cell finished in this run, 1.0 s, x 1 to go / "
                              "1 worker)\x1b[K\n")
    assert capsys.readouterr().out == "FAILED cell_b: it broke\n"


# Cells whose job is a stand-in (it writes a small result; max_new_tokens > 100 fails): only
# the launcher, its pool and its progress are exercised.
STAND_IN = textwrap.dedent('''
    def _job(config, workdir, claim=None):
        if config.run.max_new_tokens > 100:
            raise RuntimeError("this cell fails as it runs")
        return {"max_new_tokens": config.run.max_new_tokens}


    def get_config(arg=None):
        import moejax.jobs
        from moejax.jobs.schema import base_config

        moejax.jobs.run = _job  # in the worker running the cell (the check keeps jobs.check)
        c = base_config()
        c.model.preset = "tiny"
        return c


    def sweep(add):
        for n in (2, 3, 101, 4, 5):
            add(**{"run.max_new_tokens": n})
''')


@pytest.mark.slow
def test_a_local_sweep_prints_a_progress_line_per_finished_cell(tmp_path):
    config = tmp_path / "stand_in.py"
    config.write_text(STAND_IN)
    sweep_dir = tmp_path / "s"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}

    def run():
        return subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={config}",
                               f"--sweep_dir={sweep_dir}", "--workers=2"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    first = run()
    assert first.returncode == 1, first.stdout + first.stderr  # the failing cell
    assert ("5 cells (5 to run, 0 done); estimate unknown until the first cells finish (no "
            "earlier run here timed a cell") in first.stdout
    progress = [line for line in first.stderr.splitlines()
                if re.match(r"\d+/5 cells done \(\d failed\), ", line)]
    assert [line.split("/")[0] for line in progress] == ["1", "2", "3", "4", "5"], first.stderr
    assert all(" elapsed; " in line and " left" in line for line in progress[:-1])
    assert progress[-1].startswith("5/5 cells done (1 failed), ")
    assert progress[-1].endswith(" elapsed")  # nothing left

    second = run()  # only the failed cell runs again; the first estimate is the first run's
    assert second.returncode == 1, second.stdout + second.stderr
    assert ("5 cells (1 to run, 1 of them failed before, 4 done); estimate ~"
            in second.stdout), second.stdout
    assert ("(the median wall time of the 4 cells earlier runs finished here, "
            in second.stdout), second.stdout
    progress = [line for line in second.stderr.splitlines() if " cells done " in line]
    assert len(progress) == 1 and progress[0].startswith("5/5 cells done (1 failed), "), \
        second.stderr
