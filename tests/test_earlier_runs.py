"""Nothing a user had is overwritten (issue 39, part 3): a second run into a workdir holding an
earlier run's results.json is refused with one line saying what is there and from when, and
the earlier results.json is untouched; with `run.overwrite=True` the earlier run's files
(results, TensorBoard events, anything else) are moved aside into `previous/<time>/`, never
mixed with the new run's. Real runs of the replay job on a bundled trace."""

from __future__ import annotations

import json
import os

import pytest

from moejax import bundled, jobs
from moejax.cli import UsageError
from moejax.jobs.schema import base_config

TRACE = bundled.scored_trace_files()[0]


def _replay(workdir, slots: int, overwrite: bool = False, tensorboard: bool = True) -> dict:
    c = base_config()
    c.job = "replay"
    c.replay.trace = TRACE
    c.cache.slots = slots
    c.log.progress = False
    c.log.tensorboard = tensorboard
    c.run.overwrite = overwrite
    return jobs.run(c, str(workdir))


def test_a_second_run_does_not_replace_the_first_ones_results(tmp_path):
    _replay(tmp_path, 8)
    with open(tmp_path / "results.json") as f:
        first = f.read()
    with pytest.raises(UsageError) as e:
        _replay(tmp_path, 16)
    msg = str(e.value)
    assert msg.startswith(f"--workdir={tmp_path}: holds the results.json of an earlier run "
                          "(job replay, written ")
    assert msg.endswith("give a new workdir, or --config.run.overwrite=True to move that run "
                        "aside into previous/")
    with open(tmp_path / "results.json") as f:
        assert f.read() == first  # untouched
    assert not os.path.exists(tmp_path / ".moejax.lock")  # the refused run let go


def test_overwrite_moves_the_earlier_run_aside_whole(tmp_path):
    _replay(tmp_path, 8)
    (tmp_path / "notes.txt").write_text("the user's own")
    earlier = sorted(os.listdir(tmp_path))
    assert "tensorboard" in earlier
    _replay(tmp_path, 16, overwrite=True)
    (aside,) = os.listdir(tmp_path / "previous")
    moved = tmp_path / "previous" / aside
    assert sorted(os.listdir(moved)) == [e for e in earlier if e != ".moejax.lock"]
    assert (moved / "notes.txt").read_text() == "the user's own"
    with open(moved / "results.json") as f:
        assert json.load(f)["cache"]["slots"] == 8
    with open(tmp_path / "results.json") as f:
        assert json.load(f)["cache"]["slots"] == 16
    # The new run's TensorBoard events are its own: the earlier ones went with its results.
    assert len(os.listdir(tmp_path / "tensorboard")) == len(os.listdir(moved / "tensorboard"))
    # A third run moves the second aside too, beside the first.
    _replay(tmp_path, 24, overwrite=True)
    assert len(os.listdir(tmp_path / "previous")) == 2
