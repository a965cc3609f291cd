"""The disk tier's grid: the dossier's open questions, replayed with experts on storage.

python -m launch.sweep --config=studies/dossier/grid_disk.py --sweep_dir=/tmp/grid_disk --workers=2
python -m moejax.analysis.disk_tier --sweep_dir=/tmp/grid_disk

Every cell: the device cache at 5% of the model's bytes with int4 experts (SpecMD's setting,
`cache.capacity_of=model`, 5 GB/s on its A100 profile), a host tier of `host_capacity_frac`
of the experts in front of a storage preset, the immediate prefetch queue. Parts:

* `policies` — does Least-Stale (and score-percentile prefetch) still win when a miss costs a
  storage read? Eviction {lru, lru_per_layer, least_stale, least_stale(order=cyclic)}, the
  same policy on both tiers, x prefetch {none, the trace's predictor: score_percentile(p=80)
  on scored traces, temporal on id-only captures} x host {15, 30, 60}% x storage {nvme_gen4,
  sata_ssd, `this_disk`: the cold read bandwidth and latency benchmarks/cold_read.py measured
  here}.
* `hotlists` — ds4's hotlist seeding across domains and against per-layer LRU. A hotlist
  built on one domain's traces seeds the device and host tiers of a replay of another
  domain's (`cache.seed`, eviction `priority` on both tiers), against `lru` and
  `lru_per_layer` unseeded, and `lru` seeded (the seed without priorities). The embedded
  model: hotlists from its short traces ({domain}_0 + {domain}_1), replays of its long
  traces (3 x 3 domains, the diagonal out of sample); the captures: OLMoE and Qwen prose <->
  code (their diagonal is in sample, one trace per domain). No dialogue traces exist here.
  `full_layers` — ds4's full-layer placement (1 and 2 layers) against per-layer LRU.

Traces: the embedded model's three long traces (as four requests of 256 tokens with a 64-token
prefill) and the four real captures (four requests of 128 with a 32-token prefill).
"""

from moejax import bundled
from moejax.jobs.schema import parse_args, replay_grid_config

HOST_FRACS = (0.15, 0.3, 0.6)
EVICTIONS = ("lru", "lru_per_layer", "least_stale", "least_stale(order=cyclic)")
# `python benchmarks/cold_read.py --reps 5` on this machine, two runs (2026-12-01; the table in
# benchmarks/README.md): O_DIRECT reads of bytes never read since boot — 8 records of 6.75 MiB
# in flight at once, medians 0.82 and 0.62 GB/s; one 4 KiB page at queue depth 1, medians 169
# and 161 us — each the mean of the two runs' medians; the reader's 8 workers as the queue
# depth. (An earlier measurement gave 1.05 GB/s and 65 us, on pages dropped with
# posix_fadvise, which this VM's host serves from its cache.)
THIS_DISK = {"storage.preset": "nvme_gen4", "storage.read_gbps": 0.72,
             "storage.read_latency_s": 1.65e-4, "storage.queue_depth": 8}
STORAGES = {"nvme_gen4": {"storage.preset": "nvme_gen4"},
            "sata_ssd": {"storage.preset": "sata_ssd"}, "this_disk": THIS_DISK}
DOMAINS = ("prose", "code", "math")
PARTS = ("policies", "hotlists")


def get_config(arg: str | None = None):
    parse_args(arg, {"parts": "all"})
    c = replay_grid_config()
    c.cache.min_slots = 4
    c.hardware.h2d_gbps = 5.0
    return c


def _traces() -> list[tuple[str, str, dict]]:
    """(path, predictor, overrides) of the grid's traces."""
    out = [(bundled.long_trace_path(d), "score_percentile(p=80)",
            {"replay.request_tokens": 256, "replay.prefill_tokens": 64}) for d in DOMAINS]
    for path in bundled.capture_files():
        out.append((path, "temporal", bundled.capture_overrides(path)))
    return out


def _hotlist_sources(path: str) -> list[tuple[str, str]]:
    """(domain, hotlist trace paths joined by ',') to seed a replay of `path` with."""
    if path.endswith(".npz"):  # the embedded model: its short traces of each domain
        short = bundled.scored_trace_files()
        return [(d, ",".join(p for p in short if p.rsplit("/", 1)[-1].startswith(d + "_")))
                for d in DOMAINS]
    model = path.rsplit("/", 1)[-1].split("_")[0]  # olmoe / qwen: its own two captures
    return [(d, p) for p in bundled.capture_files()
            for d in [p.rsplit("_", 1)[-1].removesuffix(".jsonl")]
            if p.rsplit("/", 1)[-1].startswith(model + "_")]


def sweep(add, arg: str | None = None):
    args = parse_args(arg, {"parts": "all"})
    parts = PARTS if args["parts"] == "all" else tuple(args["parts"].split("+"))
    if not set(parts) <= set(PARTS):
        raise ValueError(f"parts={args['parts']!r}: expected all or a '+'-list of {PARTS}")
    for path, predictor, overrides in _traces():
        base = {"replay.trace": path, "cache.capacity_frac": 0.05, **overrides}
        if "policies" in parts:
            for storage, fields in STORAGES.items():
                for host in HOST_FRACS:
                    for eviction in EVICTIONS:
                        for prefetch in ("none", predictor):
                            add(**base, **fields, **{
                                "cache.host_capacity_frac": host,
                                "cache.host_eviction": eviction,
                                "policies.eviction": eviction, "policies.prefetch": prefetch})
        if "hotlists" in parts:
            cell = {**base, "cache.host_capacity_frac": 0.3, "storage.preset": "nvme_gen4",
                    "policies.prefetch": "none"}
            if "policies" not in parts:  # else the baselines are cells of that part
                for eviction in ("lru", "lru_per_layer"):
                    add(**cell, **{"policies.eviction": eviction,
                                   "cache.host_eviction": eviction})
            # The embedded model's 5% (48 int4 slots) holds one of its 32-expert layers.
            for layers in ((1,) if path.endswith(".npz") else (1, 2)):
                add(**cell, **{"policies.eviction": "lru", "cache.host_eviction": "lru",
                               "cache.full_layers": layers})
            for _domain, sources in _hotlist_sources(path):
                seed = f"hotlist(trace={sources})"
                for eviction in ("priority", "lru"):
                    add(**cell, **{"policies.eviction": eviction,
                                   "cache.host_eviction": eviction, "cache.seed": seed})
