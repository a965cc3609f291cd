"""SpecMD's capacity x bandwidth x policy grid, replayed on routing traces.

python -m launch.sweep --config=configs/grid_specmd.py --sweep_dir=/tmp/grid --workers=2
python -m launch.sweep --config=configs/grid_specmd.py:traces=captures --sweep_dir=/tmp/grid_real
python -m moejax.analysis.report --sweep_dir=/tmp/grid

Axes: capacity {1%, 5%, 25%} of the whole model's bytes (SpecMD's meaning,
`cache.capacity_of=model`: the captures name their model, the scored traces carry theirs) x
host->device bandwidth {5, 16, 32 GB/s} x eviction {lru, lru_per_layer, lfu, fld, score,
least_stale, belady} x prefetch {none, topk(1.0), topk(1.5), score_percentile(80), oracle}, over
* `captures`: the four real capture traces bundled in moejax/assets/captures (OLMoE-1B-7B,
  Qwen1.5-MoE-A2.7B; ids only: policies that need gate scores — score eviction, top-k and
  score-percentile prefetch — cannot run on them, so those cells are left out and the
  score-free `temporal` predictor (same layer, previous token) takes their place);
* `scored`: the embedded model's six scored traces (moejax/assets/traces), every cell. Small
  capacities of these 256-expert traces get the top-k floor of 4 slots.
`traces=all` (default) is both.
"""

import glob
import os

from moejax import bundled
from moejax.job_config import base_config, parse_args

CAPACITIES = (0.01, 0.05, 0.25)
BANDWIDTHS_GBPS = (5.0, 16.0, 32.0)
EVICTIONS = ("lru", "lru_per_layer", "lfu", "fld", "score", "least_stale", "belady")
PREFETCHES = ("none", "topk(overfetch=1.0)", "topk(overfetch=1.5)", "score_percentile(p=80)",
              "oracle")
SCORE_FREE_PREFETCH = ("none", "temporal", "oracle")


def get_config(arg: str | None = None):
    parse_args(arg, {"traces": "all"})
    c = base_config()
    c.job = "replay"
    c.model.preset = ""
    c.clock.kind = "virtual"
    c.cache.capacity_of = "model"
    c.log.progress = False
    c.log.tensorboard = False  # thousands of cells: results.json only
    return c


def traces(which: str) -> list[tuple[str, dict]]:
    out = []
    if which in ("all", "captures"):
        for path in bundled.capture_files():
            family, preset = bundled.capture_model(path)
            out.append((path, {"model.family": family, "model.preset": preset}))
    if which in ("all", "scored"):
        for path in sorted(glob.glob(os.path.join(bundled.SCORED_TRACES_DIR, "*.npz"))):
            out.append((path, {"cache.min_slots": 4}))
    if not out:
        raise ValueError(f"traces={which!r}: expected all, captures or scored (and trace files)")
    return out


def sweep(add, arg: str | None = None):
    which = parse_args(arg, {"traces": "all"})["traces"]
    for path, model in traces(which):
        scored = path.endswith(".npz")
        evictions = EVICTIONS if scored else tuple(e for e in EVICTIONS if e != "score")
        prefetches = PREFETCHES if scored else SCORE_FREE_PREFETCH
        for capacity in CAPACITIES:
            for gbps in BANDWIDTHS_GBPS:
                for eviction in evictions:
                    for prefetch in prefetches:
                        add(**{"trace": path, "cache.capacity_frac": capacity,
                               "hardware.h2d_gbps": gbps, "policies.eviction": eviction,
                               "policies.prefetch": prefetch, **model})
