"""SpecMD's grid at the paper's settings, replayed on routing traces.

python -m launch.sweep --config=studies/specmd/grid_specmd.py --sweep_dir=/tmp/grid --workers=2
python -m launch.sweep --config=studies/specmd/grid_specmd.py:traces=captures --sweep_dir=/tmp/grid_real
python -m moejax.analysis.report --sweep_dir=/tmp/grid
# the time claims again on this machine's calibrated profile (python -m moejax.calibration):
python -m launch.sweep --config=studies/specmd/grid_specmd.py:traces=long,parts=dropin+miss,hardware_file=W/hardware.json \
    --sweep_dir=/tmp/grid_vm --workers=2

The paper's settings: capacity {1%, 5%, 25%} of the whole model's bytes
(`cache.capacity_of=model`), four-bit experts (`cache.precision=int4`), 5 GB/s host->device on
SpecMD's A100 profile; both prefetch queues (`immediate`, and SpecMD's `watchdog`, which issues
when space allows; the idle-engine variant, `watchdog_idle`, is not in the grid). Parts:

* `policies` — eviction {lru, lru_per_layer, lfu, fld, score, least_stale (two_queue, the
  default: §4's rule), least_stale(left_first), least_stale(cyclic), belady} x prefetch;
* `dropin` — SpecMD's drop-in experiment: presets specmd_1..specmd_4 as they are, and with
  their eviction replaced by Least-Stale (scored traces: the presets' prefetchers and
  cache-aware routing read gate scores);
* `miss` — the miss policies under least_stale + score_percentile(80) (scored traces);
* `peers` (only when named: `all` is SpecMD's three) — the peers' policies against LRU and
  Least-Stale: eviction {lru, least_stale, s3fifo, arc} x prefetch {none, temporal, cooccur},
  each prefetcher also with a staging share of 25% (`cache.prefetch_share=0.25`); the peers'
  policies run on the reference engine.

Traces (`traces=` all (default), captures, scored, long, families):
* `captures`: the four real captures (OLMoE-1B-7B, Qwen1.5-MoE-A2.7B; ids only: no score
  eviction or score-based prefetch; `temporal`, `noisy_oracle(precision=0.6)` and `oracle`
  instead), each replayed as four
  requests of 128 tokens with a 32-token prefill (`replay.request_tokens`), so that cold and
  warm TTFT exist;
* `scored`: the embedded model's six short scored traces (a 64-token prefill, 191 decodes);
* `long`: its three 1024-token traces, as four requests of 256 tokens with a 64-token prefill;
* `families`: the four families' tiny presets with random weights (architecture only; the
  prose trace of each, and fewer policies: FAMILY_EVICTIONS x FAMILY_PREFETCHES).
Small capacities of the small models get a floor of 4 slots (`cache.min_slots`: every tiny
model's top-k fits).

`hardware_file=PATH`: every cell on that calibrated profile (`hardware.file`; the host's work
modelled where it has it) instead of SpecMD's A100, at the same 5 GB/s host->device.
"""

from moejax import bundled
from moejax.jobs.schema import parse_args, replay_grid_config

CAPACITIES = (0.01, 0.05, 0.25)
H2D_GBPS = 5.0
QUEUES = ("immediate", "watchdog")
EVICTIONS = ("lru", "lru_per_layer", "lfu", "fld", "score", "least_stale",
             "least_stale(order=left_first)", "least_stale(order=cyclic)", "belady")
PREFETCHES = ("none", "topk(overfetch=1.0)", "topk(overfetch=1.5)", "score_percentile(p=80)",
              "oracle")
# Id-only traces: the score-free predictor, a predictor of SpecMD-like precision (the oracle
# with each true expert swapped for a wrong one with probability 0.4: top-k's prediction
# precision on the scored traces is about 0.65), and the ceiling.
SCORE_FREE_PREFETCH = ("none", "temporal", "noisy_oracle(precision=0.6)", "oracle")
DROPIN_PRESETS = ("specmd_1", "specmd_2", "specmd_3", "specmd_4")
FAMILY_EVICTIONS = ("lru", "fld", "score", "least_stale", "least_stale(order=left_first)")
FAMILY_PREFETCHES = ("none", "topk(overfetch=1.0)", "score_percentile(p=80)", "oracle")
MISSES = ("fetch", "drop(keep=2)", "substitute(tol=0.05)", "fetch_priority", "fetch_lowest_bit")
PARTS = ("policies", "dropin", "miss")
# Named only (`parts=peers`, `parts=policies+peers`): not in `all`, which stays SpecMD's grid.
PEER_PARTS = ("peers",)
PEER_EVICTIONS = ("lru", "least_stale", "s3fifo", "arc")
PEER_PREFETCHES = ("none", "temporal", "cooccur")
PEER_SHARES = (0.0, 0.25)
# Config arguments (`studies/specmd/grid_specmd.py:traces=captures,engine=reference`): `engine` is
# `replay.engine` for every cell (benchmarks/replay_grid_engines.py runs both).
ARGS = {"traces": "all", "parts": "all", "engine": "auto", "hardware_file": ""}
GROUPS = ("captures", "scored", "long", "families")


def get_config(arg: str | None = None):
    args = parse_args(arg, ARGS)
    c = replay_grid_config()
    c.hardware.h2d_gbps = H2D_GBPS
    c.hardware.file = args["hardware_file"]
    c.replay.engine = args["engine"]
    return c


def traces(which: str) -> list[tuple[str, dict]]:
    """(path, overrides) of the traces of group(s) `which` ("all" or one of GROUPS)."""
    if which != "all" and which not in GROUPS:
        raise ValueError(f"traces={which!r}: expected all or one of {GROUPS}")
    out = []
    if which in ("all", "captures"):
        for path in bundled.capture_files():
            out.append((path, bundled.capture_overrides(path)))
    if which in ("all", "scored"):
        out += [(path, {"cache.min_slots": 4}) for path in bundled.scored_trace_files()]
    if which in ("all", "long"):
        out += [(path, {"cache.min_slots": 4, "replay.request_tokens": 256,
                        "replay.prefill_tokens": 64}) for path in bundled.long_trace_files()]
    if which in ("all", "families"):  # random weights: one domain is enough
        out += [(bundled.family_trace_path(family, "prose"), {"cache.min_slots": 4})
                for family in bundled.TRACE_FAMILIES]
    return out


def sweep(add, arg: str | None = None):
    args = parse_args(arg, ARGS)
    parts = PARTS if args["parts"] == "all" else tuple(args["parts"].split("+"))
    if not set(parts) <= set(PARTS + PEER_PARTS):
        raise ValueError(f"parts={args['parts']!r}: expected all or a '+'-list of "
                         f"{PARTS + PEER_PARTS}")
    for path, model in traces(args["traces"]):
        scored = path.endswith(".npz")
        family = path.startswith(bundled.FAMILY_TRACES_DIR)
        for capacity in CAPACITIES:
            for queue in QUEUES:
                cell = {"replay.trace": path, "cache.capacity_frac": capacity,
                        "cache.prefetch_queue": queue, **model}
                if "policies" in parts:
                    evictions = EVICTIONS if scored else tuple(e for e in EVICTIONS
                                                               if e != "score")
                    prefetches = PREFETCHES if scored else SCORE_FREE_PREFETCH
                    if family:
                        evictions, prefetches = FAMILY_EVICTIONS, FAMILY_PREFETCHES
                    for eviction in evictions:
                        for prefetch in prefetches:
                            add(**cell, **{"policies.eviction": eviction,
                                           "policies.prefetch": prefetch})
                if "dropin" in parts and scored:
                    for preset in DROPIN_PRESETS:
                        add(**cell, **{"policies.preset": preset})
                        add(**cell, **{"policies.preset": preset,
                                       "policies.eviction": "least_stale"})
                if "peers" in parts and not family:
                    for eviction in PEER_EVICTIONS:
                        for prefetch in PEER_PREFETCHES:
                            for share in PEER_SHARES if prefetch != "none" else (0.0,):
                                add(**cell, **{"policies.eviction": eviction,
                                               "policies.prefetch": prefetch},
                                    **({"cache.prefetch_share": share} if share else {}))
                if "miss" in parts and scored:
                    for miss in MISSES:
                        add(**cell, **{"policies.eviction": "least_stale",
                                       "policies.prefetch": "score_percentile(p=80)",
                                       "policies.miss": miss})
