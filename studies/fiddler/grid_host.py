"""The host-compute grid: cache it, fetch it, or compute it where it is?

python -m launch.sweep --config=studies/fiddler/grid_host.py --sweep_dir=grid_host --workers=2
python -m launch.sweep --config=studies/fiddler/grid_host.py:traces=captures,precisions=native \
    --sweep_dir=grid_host_native --workers=2
python -m studies.fiddler.claims --sweep_dir=grid_host

Every cell replays one trace at SpecMD's setting — four-bit experts (`cache.precision=int4`;
`precisions=native` for Fiddler's 16-bit weights, `int4+native` for both), a cache of 1, 5 or
25% of the whole model's bytes (`cache.capacity_of=model`), SpecMD's A100 profile with its
host->device link at 5, 16 or 32 GB/s (`hardware.h2d_gbps`), Least-Stale eviction (SpecMD's
choice) — under one miss policy:

* the caching configurations, which move weights to the device (host-independent: run once
  per trace, capacity and link): `fetch` and `fetch_priority` (SpecMD's precision cascade; at
  int4 its levels are int4:int2, at native native:int8:int4:int2: lossy), each with no
  prefetch and with the trace's predictor — `score_percentile(p=80)` on the embedded model's
  scored traces (with Least-Stale and fetch, SpecMD's own choice, preset `specmd_5`),
  `temporal` on the id-only captures (no gate scores to read). `fetch` is also Fiddler's
  "offloading with lossless fetch" baseline;
* the host-compute policies, per host CPU preset (`host.preset`: desktop_ddr5, server_ddr5
  and this machine, `this_vm`; moejax/timing/host.py): `host_compute` and `latency_aware`
  (Fiddler's per-expert choice, `admit_after=0`), without prefetch — the setting in which
  DESIGN.md ("latency_aware: the plans it tries") states what latency_aware guarantees.
  `this_machine=P` (`studies/fiddler/grid_host.py:this_machine=cpu`) puts preset P in this
  machine's place (`cpu`: of the order of this machine, not a calibration);
* llama.cpp's layer split (`--n-cpu-moe N`), Fiddler's other baseline: `fetch` with
  `cache.host_compute_layers=N` — the first N MoE layers always on the host, the cache's whole
  budget on the others — per host, for N at each quarter of the model's MoE layers (OLMoE
  4/8/12/16, Qwen 6/12/18/24, the embedded model 2/4/6/8; N = 0 is the plain `fetch` cell),
  without prefetch (llama.cpp has none).

"SpecMD's best caching configuration" of a trace, capacity and link is the caching cell with
the lowest modelled time (decode time per token, or TTFT, each on its own): the strongest
offloading baseline this grid holds, and SpecMD's own recommendation (`specmd_5`) among them
on the scored traces (the analysis names which won). It is not Fiddler's baseline (it includes
the lossy cascade); the analysis holds Fiddler's claims against the layer split's best N and
against lossless fetch, each apart, and keeps it as a third.

Traces (`traces=` all (default), captures, embedded):
* `captures`: the four real captures (OLMoE-1B-7B and Qwen1.5-MoE-A2.7B, prose and code; ids
  only, the model named by `model.family` / `model.preset`), each as four requests of 128
  tokens with a 32-token prefill (`replay.request_tokens`, `replay.prefill_tokens`), so TTFT
  (the prefills) and decode are reported apart;
* `embedded`: the embedded model's six short scored traces (moejax/assets/traces/*.npz: one
  64-token prefill, then 191 decode steps), with a floor of 4 slots (`cache.min_slots`: 1%
  of this small model is below its top-k). Its long traces are left out: the six short ones
  already give two per domain.

Per trace, capacity, link and precision: 2 caching misses x 2 prefetches + 3 hosts x (2 host
policies + 4 layer splits) = 22 cells. 10 traces x 3 capacities x 3 links x 22 = 1,980 cells
at int4 (507 s on this 2-core VM, --workers=2, 2026-12-06); the native captures 4 x 9 x 22 = 792
less the 12 refused cascade cells (CASCADE_REFUSED) = 780 (418 s).
"""

from moejax import bundled
from moejax.families import preset
from moejax.jobs.schema import parse_args, replay_grid_config

CAPACITIES = (0.01, 0.05, 0.25)
H2D_GBPS = (5.0, 16.0, 32.0)
HOSTS = ("desktop_ddr5", "server_ddr5")  # and this machine's (`this_machine`, below)
CACHING_MISSES = ("fetch", "fetch_priority")
HOST_MISSES = ("host_compute", "latency_aware")
# llama.cpp's layer split (`cache.host_compute_layers=N`): N at each quarter of the model's MoE
# layers (N = 0 is the plain `fetch` cell, which the caching cells already hold).
SPLIT_QUARTERS = (1, 2, 3, 4)
EVICTION = "least_stale"
PRECISIONS = ("int4", "native")
# (precision, capacity, model family) where the cascade cannot run: at native, 1% of
# OLMoE-1B-7B's bytes gives its native pool (a quarter of the budget, the default share of
# four pools) 2 slots of 12.6 MB, below one decode layer's top-8 — the config refuses it
# ("below what one decode layer needs"), so the grid leaves those cells out.
CASCADE_REFUSED = {("native", 0.01, "olmoe")}
# `this_machine`: the host preset standing for this machine (`this_vm`, measured here);
# `precisions`: `+`-joined, of PRECISIONS (int4 is SpecMD's setting and the base config's).
ARGS = {"traces": "all", "this_machine": "this_vm", "precisions": "int4"}
GROUPS = ("captures", "embedded")


def get_config(arg: str | None = None):
    parse_args(arg, ARGS)
    c = replay_grid_config()
    c.policies.eviction = EVICTION
    return c


def _moe_layers(path: str, overrides: dict) -> int:
    """The MoE layers of a trace's model: the named preset's for a capture, the trace's own
    for a scored trace (its ids are [tokens, layers, top_k])."""
    if "model.family" in overrides:
        return len(preset(overrides["model.family"], overrides["model.preset"]).moe_layers)
    import numpy as np  # (only a scored trace's arrays need it)

    with np.load(path) as data:
        return int(data["ids"].shape[1])


def traces(which: str) -> list[tuple[str, str, dict]]:
    """(path, predictor, overrides) of the traces of group(s) `which` ("all" or of GROUPS)."""
    if which != "all" and which not in GROUPS:
        raise ValueError(f"traces={which!r}: expected all or one of {GROUPS}")
    out = []
    if which in ("all", "captures"):
        for path in bundled.capture_files():
            out.append((path, "temporal", bundled.capture_overrides(path)))
    if which in ("all", "embedded"):
        out += [(path, "score_percentile(p=80)", {"cache.min_slots": 4})
                for path in bundled.scored_trace_files()]
    return out


def split_layers(moe_layers: int) -> list[int]:
    """The layer split's N of a model with `moe_layers` MoE layers: each quarter, rounded."""
    return sorted({max(1, round(q * moe_layers / 4)) for q in SPLIT_QUARTERS})


def precisions(which: str) -> list[str]:
    out = which.split("+")
    bad = [p for p in out if p not in PRECISIONS]
    if bad or not out:
        raise ValueError(f"precisions={which!r}: expected a +-joined list of {PRECISIONS}")
    return out


def sweep(add, arg: str | None = None):
    args = parse_args(arg, ARGS)
    hosts = (*HOSTS, args["this_machine"])
    for precision in precisions(args["precisions"]):
        # int4 is the base config's: its cells keep the names they had before the axis.
        at = {} if precision == "int4" else {"cache.precision": precision}
        for path, predictor, overrides in traces(args["traces"]):
            splits = split_layers(_moe_layers(path, overrides))
            for capacity in CAPACITIES:
                for gbps in H2D_GBPS:
                    cell = {"replay.trace": path, "cache.capacity_frac": capacity,
                            "hardware.h2d_gbps": gbps, **overrides, **at}
                    refused = (precision, capacity, overrides.get("model.family"))
                    for miss in CACHING_MISSES:
                        if miss == "fetch_priority" and refused in CASCADE_REFUSED:
                            continue
                        for prefetch in ("none", predictor):
                            add(**cell, **{"policies.miss": miss,
                                           "policies.prefetch": prefetch})
                    for host in hosts:
                        for miss in HOST_MISSES:
                            add(**cell, **{"policies.miss": miss, "policies.prefetch": "none",
                                           "host.preset": host})
                        # The host computes these layers: one cell per host and N.
                        for n in splits:
                            add(**cell, **{"policies.miss": "fetch", "policies.prefetch": "none",
                                           "cache.host_compute_layers": n, "host.preset": host})
