"""studies/specmd/grid_specmd.py, SpecMD's grid at the paper's settings: every cell is a valid config,
the parts make the cells the report pairs, and cells of each kind run."""

from __future__ import annotations

import os

import pytest

from launch import cells as cells_lib
from moejax import jobs
from moejax.analysis import sweep_cells
from tests.sweep_fixtures import grid_config

GRID = os.path.join(os.path.dirname(os.path.dirname(__file__)), "studies", "specmd", "grid_specmd.py")


def _cells(arg: str) -> list[dict]:
    return cells_lib.collect(cells_lib.load_config_module(GRID).sweep, arg)


def _config(overrides: dict):
    return grid_config(GRID, overrides)


def test_the_paper_settings_and_the_parts():
    c = _config({})
    assert (c.cache.capacity_of, c.cache.precision, c.hardware.h2d_gbps) == ("model", "int4", 5.0)
    scored = _cells("traces=scored")
    traces = {o["replay.trace"] for o in scored}
    assert len(traces) == 6
    for o in scored:
        _config(o)
    per_trace = len(scored) // 6
    # 3 capacities x 2 queues x (9 evictions x 5 prefetches + 4 presets x 2 + 5 misses).
    assert per_trace == 3 * 2 * (9 * 5 + 4 * 2 + 5)
    captures = _cells("traces=captures,parts=policies")
    assert len(captures) == 4 * 3 * 2 * 8 * 4  # no score eviction, score-free prefetchers
    assert all(o["replay.request_tokens"] == 128 for o in captures)
    with pytest.raises(cells_lib.SweepError, match="no cells"):  # presets need gate scores
        _cells("traces=captures,parts=dropin")
    with pytest.raises(ValueError, match="parts="):
        _cells("parts=nothing")
    # The peers' policies, only when named: 4 evictions x (none + 2 prefetchers x 2 shares).
    assert not [o for o in _cells("traces=captures") if "cache.prefetch_share" in o
                or o["policies.eviction"] in ("arc", "s3fifo")]
    peers = _cells("traces=captures,parts=peers")
    assert len(peers) == 4 * 3 * 2 * 4 * (1 + 2 * 2)
    for o in peers[::37]:
        _config(o)


def test_dropin_cells_pair_in_the_report(tmp_path):
    """One capacity of the drop-in part on one trace: each preset's baseline and +Least-Stale
    cells run and the report pairs all four."""
    cells = [o for o in _cells("traces=scored,parts=dropin")
             if o["replay.trace"].endswith("code_0.npz") and o["cache.capacity_frac"] == 0.25
             and o["cache.prefetch_queue"] == "watchdog"]
    assert len(cells) == 8
    rows = []
    for i, o in enumerate(cells):
        workdir = str(tmp_path / f"c{i}")
        rows.append(sweep_cells.cell_row(f"c{i}", jobs.run(_config(o), workdir)))
    pairs = sweep_cells.dropin_pairs(rows)
    assert sorted(p.preset for p in pairs) == ["specmd_1", "specmd_2", "specmd_3", "specmd_4"]
