"""A synthetic sweep for the report tests: results.json files built through `CacheMetrics` (so
totals and rates follow metrics.py exactly), laid out as `launch.sweep` lays out a sweep, with
unfinished, corrupt and crashed cells; and a check that a figure is a real PNG."""

from __future__ import annotations

import os

import matplotlib.image
import numpy as np

from moejax.cache.metrics import CacheMetrics, PassTiming, WaveOutcome
from moejax.results import write_json_atomic

TRACES = ("prose_0", "code_0")


CAPACITIES = (0.05, 0.25)


EVICTIONS = ("lru", "fld", "least_stale")


PREFETCHES = ("none", "score_percentile(p=80)")


LAYERS = 4


TOTAL_EXPERTS = LAYERS * 32


def synthetic_results(trace: str, frac: float, eviction: str, prefetch: str, seed: int,
             h2d_gbps: float = 5.0) -> dict:
    """A generate/replay-shaped results.json built through CacheMetrics, so totals and rates
    follow metrics.py exactly (hits + late + misses == requests, collisions <= misses)."""
    rng = np.random.default_rng(seed)
    m = CacheMetrics(list(range(1, LAYERS + 1)))
    for pos in range(LAYERS):
        requests = 200
        hits = int(rng.integers(60, 160))
        late = int(rng.integers(0, requests - hits))
        misses = requests - hits - late
        collisions = int(rng.integers(0, misses + 1))
        issued = int(rng.integers(10, 60)) if prefetch != "none" else 0
        used = int(rng.integers(0, min(issued, hits) + 1))
        wasted = int(rng.integers(0, issued)) if issued else 0
        outcome = WaveOutcome(hits=hits, late_hits=late, misses=misses, collisions=collisions,
                              prefetch_used=used, stall=float(rng.uniform(1e-3, 1e-2)))
        m.count_wave(pos, requests, outcome, had_prediction=issued > 0, expert_bytes=1000)
        for _ in range(issued):
            m.count_prefetch(pos, 1000)
        for i in range(misses):
            m.count_eviction(pos, 1000 if i < wasted else 0)
    m.passes = [PassTiming("prefill", 64, 0.0, float(rng.uniform(0.01, 0.05)), 0.001),
                PassTiming("decode", 1, 0.05, 0.06, 0.0), PassTiming("decode", 1, 0.06, 0.07, 0.0)]
    slots = max(4, round(frac * TOTAL_EXPERTS))
    policies = {"eviction": eviction, "prefetch": prefetch, "miss": "fetch",
                "routing": "standard"}
    return {
        "job": "replay",
        "config": {"cache": {"capacity_frac": frac, "slots": 0},
                   "hardware": {"preset": "a100_specmd", "h2d_gbps": 0.0},
                   "policies": policies, "trace": f"/traces/{trace}.npz"},
        "trace": {"path": f"/traces/{trace}.npz", "name": trace},
        "cache": {"slots": slots, "capacity_frac": slots / TOTAL_EXPERTS, "expert_bytes": 1000,
                  "clock": "virtual", "hardware": {"name": "a100_specmd", "h2d_gbps": h2d_gbps},
                  "policies": policies, **m.to_dict()},
    }


def cell_name(trace, frac, eviction, prefetch):
    return f"trace={trace},cap={frac},ev={eviction},pf={prefetch.split('(')[0]}"


def synthetic_sweep(root, traces=TRACES, capacities=CAPACITIES, bad_cells=True) -> dict:
    cells = {}
    seed = 0
    for trace in traces:
        for frac in capacities:
            for ev in EVICTIONS:
                for pf in PREFETCHES:
                    name = cell_name(trace, frac, ev, pf)
                    cells[name] = synthetic_results(trace, frac, ev, pf, seed)
                    write_json_atomic(os.path.join(root, "cells", name, "results.json"),
                                      cells[name])
                    seed += 1
    if bad_cells:
        os.makedirs(os.path.join(root, "cells", "unfinished_cell"))
        os.makedirs(os.path.join(root, "cells", "corrupt_cell"))
        with open(os.path.join(root, "cells", "corrupt_cell", "results.json"), "w") as f:
            f.write('{"cache": {"total": ')
        os.makedirs(os.path.join(root, "cells", "crashed_cell"))  # as launch/worker.py leaves it
        with open(os.path.join(root, "cells", "crashed_cell", "error.txt"), "w") as f:
            f.write("Traceback (most recent call last):\n  ...\nConfigError: slots < top_k\n")
    return cells


def assert_png(path):
    assert os.path.getsize(path) > 1000
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    assert 200 < img.shape[0] < 4000 and 300 < img.shape[1] < 6000


def grid_config(grid_path: str, overrides: dict, arg: str | None = None):
    """The config a cell of the grid config file `grid_path` runs: its `get_config(arg)` with
    the cell's `overrides` (dotted field -> value) set, as a sweep's worker sets them."""
    from launch import cells as cells_lib

    c = cells_lib.call_get_config(cells_lib.load_config_module(grid_path), arg)
    for key, value in overrides.items():
        section, _, field = key.rpartition(".")
        node = c.get(section) if section else c
        assert field in node, key  # a typo in the grid would fail every cell
        setattr(node, field, value)  # the locked config also checks the value's type
    return c
