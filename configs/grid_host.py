"""The host-compute grid (issue 25): cache it, fetch it, or compute it where it is?

python -m launch.sweep --config=configs/grid_host.py --sweep_dir=grid_host --workers=2
python -m launch.sweep --config=configs/grid_host.py:traces=captures --sweep_dir=grid_host_real
python -m moejax.analysis.host_compute --sweep_dir=grid_host

Every cell replays one trace at SpecMD's setting — four-bit experts (`cache.precision=int4`),
a cache of 1, 5 or 25% of the whole model's bytes (`cache.capacity_of=model`), SpecMD's A100
profile with its host->device link at 5, 16 or 32 GB/s (`hardware.h2d_gbps`), Least-Stale
eviction (SpecMD's choice) — under one miss policy:

* the caching configurations, which move weights to the device (host-independent: run once
  per trace, capacity and link): `fetch` and `fetch_priority` (SpecMD's precision cascade; at
  int4 its levels are int4:int2, moejax/policies/miss.py), each with no prefetch and with the
  trace's predictor — `score_percentile(p=80)` on the embedded model's scored traces (with
  Least-Stale and fetch, SpecMD's own choice, preset `specmd_5`), `temporal` on the id-only
  captures (no gate scores to read);
* the host-compute policies, per host CPU preset (`host.preset`: desktop_ddr5, server_ddr5
  and this machine, `this_vm`; moejax/timing/host.py): `host_compute` and `latency_aware`
  (Fiddler's per-expert choice, `admit_after=0`), without prefetch — the setting in which
  DESIGN.md ("latency_aware: the plans it tries") states what latency_aware guarantees.
  `this_machine=P` (`configs/grid_host.py:this_machine=cpu`) puts preset P in this
  machine's place (`cpu`: of the order of this machine, not a calibration).

"SpecMD's best caching configuration" of a trace, capacity and link is the caching cell with
the lowest modelled time (decode time per token, or TTFT, each on its own): the strongest
offloading baseline this grid holds, and SpecMD's own recommendation (`specmd_5`) among them
on the scored traces (the analysis names which won).

Traces (`traces=` all (default), captures, embedded):
* `captures`: the four real captures (OLMoE-1B-7B and Qwen1.5-MoE-A2.7B, prose and code; ids
  only, the model named by `model.family` / `model.preset`), each as four requests of 128
  tokens with a 32-token prefill (`trace_request_tokens`, `trace_prefill_tokens`), so TTFT
  (the prefills) and decode are reported apart;
* `embedded`: the embedded model's six short scored traces (moejax/assets/traces/*.npz: one
  64-token prefill, then 191 decode steps), with a floor of 4 slots (`cache.min_slots`: 1%
  of this small model is below its top-k). Its long traces are left out: the six short ones
  already give two per domain, and the grid stays within a quarter of an hour on 2 cores.

10 traces x 3 capacities x 3 links x (4 caching + 2 policies x 3 hosts) = 900 cells.
"""

from moejax import bundled
from moejax.jobs.schema import parse_args, replay_grid_config

CAPACITIES = (0.01, 0.05, 0.25)
H2D_GBPS = (5.0, 16.0, 32.0)
HOSTS = ("desktop_ddr5", "server_ddr5")  # and this machine's (`this_machine`, below)
CACHING_MISSES = ("fetch", "fetch_priority")
HOST_MISSES = ("host_compute", "latency_aware")
EVICTION = "least_stale"
# `this_machine`: the host preset standing for this machine (`this_vm`, measured here).
ARGS = {"traces": "all", "this_machine": "this_vm"}
GROUPS = ("captures", "embedded")


def get_config(arg: str | None = None):
    parse_args(arg, ARGS)
    c = replay_grid_config()
    c.policies.eviction = EVICTION
    return c


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


def sweep(add, arg: str | None = None):
    args = parse_args(arg, ARGS)
    hosts = (*HOSTS, args["this_machine"])
    for path, predictor, overrides in traces(args["traces"]):
        for capacity in CAPACITIES:
            for gbps in H2D_GBPS:
                cell = {"trace": path, "cache.capacity_frac": capacity,
                        "hardware.h2d_gbps": gbps, **overrides}
                for miss in CACHING_MISSES:
                    for prefetch in ("none", predictor):
                        add(**cell, **{"policies.miss": miss, "policies.prefetch": prefetch})
                for miss in HOST_MISSES:
                    for host in hosts:
                        add(**cell, **{"policies.miss": miss, "policies.prefetch": "none",
                                       "host.preset": host})
