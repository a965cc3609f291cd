"""studies/dossier/grid_disk.py and its tables (moejax/analysis/disk_tier.py): every cell is a valid
config whose cache builds, the parts hold the comparisons the tables make, and a few cells
run end to end into both tables."""

from __future__ import annotations

import json
import os

from launch import cells as cells_lib
from moejax import jobs
from moejax.analysis import disk_tier
from tests.sweep_fixtures import grid_config

GRID = os.path.join(os.path.dirname(os.path.dirname(__file__)), "studies", "dossier", "grid_disk.py")


def _module():
    return cells_lib.load_config_module(GRID)


def _config(overrides: dict):
    return grid_config(GRID, overrides)


def test_the_cells_and_their_parts():
    cells = cells_lib.collect(_module().sweep, None)
    keys = [tuple(sorted(c.items())) for c in cells]
    assert len(keys) == len(set(keys))
    policies = [c for c in cells if "cache.seed" not in c and "cache.full_layers" not in c]
    seeded = [c for c in cells if "cache.seed" in c]
    # 7 traces x 3 storages x 3 host sizes x 4 evictions x 2 prefetches.
    assert len(policies) == 7 * 3 * 3 * 4 * 2
    for c in cells:
        assert c["cache.host_capacity_frac"] in (0.15, 0.3, 0.6)
        assert c["policies.eviction"] == c["cache.host_eviction"]  # both tiers, one policy
        _config(c)
    for c in seeded:  # every hotlist names traces that exist
        paths = c["cache.seed"].removeprefix("hotlist(trace=").removesuffix(")").split(",")
        assert paths and all(os.path.isfile(p) for p in paths), c["cache.seed"]
    # The embedded model: 3 hotlist domains x {priority, lru} per long trace.
    long_prose = [c for c in seeded if c["replay.trace"].endswith("long/prose.npz")]
    assert len(long_prose) == 6


def test_cells_run_into_both_tables(tmp_path, capsys):
    cells = cells_lib.collect(_module().sweep, "parts=hotlists")
    wanted = [c for c in cells if c["replay.trace"].endswith("long/code.npz") and (
        c.get("cache.full_layers") or "prose_0" in c.get("cache.seed", "")
        or ("cache.seed" not in c and "cache.full_layers" not in c))]
    assert len(wanted) == 5  # lru, lru_per_layer, full_layers=1, priority / lru + prose hotlist
    for i, c in enumerate(wanted):
        work = tmp_path / "cells" / f"cell{i}"
        results = jobs.run(_config(c), str(work))
        assert results["cache"]["host"]["total"]["requests"] > 0
        json.loads((work / "results.json").read_text())
    disk_tier.main(["--sweep_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "### embedded: device hit rate" in out
    for label in ("| lru |", "| lru_per_layer |", "| lru, full_layers=1 |",
                  "| priority + hotlist(prose) |", "| lru + hotlist(prose) |"):
        assert label in out, label
    assert "### embedded: decode tok/s" in out  # the policy table from the unseeded cells
