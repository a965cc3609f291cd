"""Live against virtual: the same runs timed by this machine's wall clock and predicted by the
virtual clock, cell by cell, so a user sees how far the virtual clock is from the hardware.

A cell is one cache setting (a capacity, a prefetch policy, speculative passes or layer by
layer) of one model run. It runs live on the wall clock (`clock.kind=wall`: the cache's
transfers held to the profile's host->device bandwidth, compute as long as it takes) `reps`
times, alternated with the other cells', each time on a fresh cache; its wall figures are the
medians. Its prediction is what results.json's `clocks.virtual` reports for such a run
(`moejax.jobs.clocks`): the run's own routing replayed through a fresh cache of the same
settings on the virtual clock, with the same profile. Each cell's error is signed,
`(virtual - wall) / wall`: negative when the virtual clock predicts less time than the run
took.

Runs are the generate job's, in process (`LiveRuns`): its requests (a trace-driven run's, when
`policies.routing='trace(path=T)'`), its warm-up (compiles out of the timed runs), its decoder
over the configured expert source. A family preset's model can be drawn at any size
(`drawn_model`: OLMoE-1B-7B's 12.9 GB of experts on a GPU).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics

import jax
import ml_collections
import numpy as np
from flax import nnx

from moejax.calibration.fit import relative_error
from moejax.calibration.host_fit import Sample
from moejax.families import preset
from moejax.jobs import clocks
from moejax.jobs import generate as generate_job
from moejax.jobs.cache_report import settle
from moejax.jobs.common import cache_of, configured_decoder
from moejax.jobs.specs import resolve
from moejax.model_source import LoadedModel, in_memory
from moejax.models import MoEDecoder
from moejax.traces import driven


@dataclasses.dataclass(frozen=True)
class Cell:
    capacity_frac: float
    prefetch: str  # a prefetch policy spec
    speculate: bool = True  # `cache.speculate`: False decides every layer before its step
    warm_start: str = ""  # `cache.warm_start` ("all": every expert that fits before token 1)
    # Other config fields the cell sets, as (dotted field, value): the eviction, the
    # precision, a disk tier, a miss policy...
    settings: tuple[tuple[str, object], ...] = ()

    @property
    def name(self) -> str:
        extra = " ".join(f"{k.split('.')[-1]}={v}" for k, v in self.settings)
        return (f"{100 * self.capacity_frac:g}% {self.prefetch}"
                + ("" if self.speculate else " layer by layer")
                + (f" warm_start={self.warm_start}" if self.warm_start else "")
                + (f" {extra}" if extra else ""))

    def config(self, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """`base` with this cell's capacity, prefetch, speculation, warm start and settings,
        on the wall clock."""
        c = ml_collections.ConfigDict(base.to_dict())
        c.cache.enabled = True
        c.cache.capacity_frac, c.cache.slots = self.capacity_frac, 0
        c.cache.speculate = self.speculate
        c.cache.warm_start = self.warm_start
        c.policies.prefetch = self.prefetch
        for field, value in self.settings:
            group, name = field.split(".")
            c[group][name] = value
        c.clock.kind = "wall"
        return c


@dataclasses.dataclass
class Entry:
    """One cell to run live: its config (on the wall clock), its model, and the label of the
    group it belongs to (the model and its routing: what a report compares cells within)."""

    cell: Cell
    config: ml_collections.ConfigDict
    loaded: LoadedModel
    group: str = ""


def drawn_model(family: str, name: str, width: int = 0, seed: int = 0) -> LoadedModel:
    """A family preset with random weights, at `width` (0: its own), its experts drawn on the
    device layer by layer (`jax.random`) and moved to host memory: what
    `model_source.load_model` gives a preset, but at any size (it draws experts with numpy and
    up to 1 GiB of them; OLMoE-1B-7B's are 12.9 GB). Timing does not depend on the values."""
    cfg = preset(family, name, width)
    model = MoEDecoder(cfg, nnx.Rngs(seed))
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate_size
    dtype = np.dtype(cfg.dtype)
    key = jax.random.PRNGKey(seed)
    gate_up, down = {}, {}
    for layer in cfg.moe_layers:
        k1, k2 = jax.random.split(jax.random.fold_in(key, layer))
        gate_up[layer] = np.asarray(jax.random.normal(k1, (e, h, 2 * i), dtype) * h ** -0.5)
        down[layer] = np.asarray(jax.random.normal(k2, (e, i, h), dtype) * i ** -0.5)
    at = f" at width {width}" if width else ""
    return in_memory(cfg, model, gate_up, down,
                     source=f"preset:{family}/{name}{at} (random experts drawn on the device)")


def cells_of(capacities, prefetchers) -> list[Cell]:
    return [Cell(float(c), p) for c in capacities for p in prefetchers]


class LiveRuns:
    """Live runs of one config, as the generate job runs it: the model and requests built
    once (and the warm-up run, with `run.warmup`), a fresh runtime per `run()`."""

    def __init__(self, config: ml_collections.ConfigDict, loaded):
        self.config, self.loaded = config, loaded
        self.spec = spec = resolve(config)
        path = driven.trace_path(spec.policies)
        self.driving = None
        if path is not None:
            driven.check_run(spec)
            self.driving = driven.load(spec.trace, path)
            driven.check_model(loaded.cfg, self.driving)
            self.requests = generate_job.driven_requests(config, loaded, self.driving)
        else:
            self.requests = generate_job.requests_of(config, loaded)
        self.max_len = max(len(q.ids) + self.new_tokens(q) for q in self.requests)
        if config.run.warmup:
            generate_job.warm_up(config, spec, loaded, self.requests, max_len=self.max_len,
                                 batch=1)

    def new_tokens(self, request) -> int:
        return request.new_tokens or self.config.run.max_new_tokens

    def run(self, keep_routing: bool = False) -> dict:
        """One live run: its `clocks` section, its cache's size and counts (None without a
        cache), how its runtime ran the passes (`speculation`, with a cache), and each pass's
        wall time in order (`wall_passes`: each request's prefill, then its decode passes).
        `keep_routing`: also its routing, request by request (`routing`: the traces a replay
        of the run takes; on the wall clock only, where the run records it)."""
        config = self.config
        experts, decoder = configured_decoder(self.spec, self.loaded, max_len=self.max_len)
        cache = cache_of(experts)
        driver = driven.driver_of(experts)
        routing = clocks.routing_recorder(self.spec, self.loaded, decoder, experts, cache)
        eos = (self.loaded.cfg.eos_token_id if config.run.stop_at_eos and self.driving is None
               else None)
        generations = []
        for q in self.requests:
            if driver is not None:
                driver.start(q.sequence)
            generations.append(decoder.generate(np.asarray([q.ids], np.int32),
                                                self.new_tokens(q), eos_id=eos))
        out = {"slots": None, "total_experts": None, "hit_rate": None, "misses": None,
               "requests": None}
        if cache is not None:  # (every expert resident: no cache to report)
            settle(cache).finish()
            totals = cache.metrics.totals()
            out = {"slots": cache.shape.num_slots, "total_experts": cache.shape.total_experts,
                   "hit_rate": totals["hit_rate"], "misses": totals["misses"],
                   "requests": totals["requests"]}
        if hasattr(experts, "speculation_report"):  # how the live runtime ran its passes
            out["speculation"] = experts.speculation_report()
        out["wall_passes"] = [s for g in generations for s in (g.prefill_s, *g.decode_pass_s)]
        if keep_routing and routing is not None:
            out["routing"] = routing.traces()
            out["driven"] = routing.driving is not None
        return {"clocks": clocks.section(self.spec, self.loaded, generations, cache, routing,
                                         warmup=bool(config.run.warmup)),
                **out}


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _larger(wall: float | None, virtual: float | None) -> str | None:
    if wall is None or virtual is None:
        return None
    return "equal" if wall == virtual else ("virtual" if virtual > wall else "wall")


def run_entries(entries: list[Entry], reps: int = 3, progress=None,
                samples: list | None = None) -> list[dict]:
    """Each entry (a cell, its config on the wall clock, its model): `reps` live runs, the
    entries alternated run by run (forward, then backward), and the virtual clock's prediction
    of each run; one row per entry (see the module docstring).
    `samples`: a list that gets each entry's `moejax.calibration.host_fit.Sample` (its routing and
    the median wall time of each of its passes), for a fit of the host's terms."""
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    runners = [LiveRuns(e.config, e.loaded) for e in entries]
    got: list[list[dict]] = [[] for _ in entries]
    keep = samples is not None
    # Every model, request and warm-up of the cells is built: out of the collector's way, so a
    # run pays for its own objects as a run of the command would, not for a collection that
    # walks every other cell's (more cells, more to walk: a harness effect, not the runtime's).
    gc.collect()
    gc.freeze()
    try:
        for r in range(reps):
            order = range(len(entries)) if r % 2 == 0 else reversed(range(len(entries)))
            for i in order:
                got[i].append(runners[i].run(keep_routing=keep and not got[i]))
                if progress is not None:
                    progress(1)
    finally:
        gc.unfreeze()
    rows = []
    for entry, runner, runs in zip(entries, runners, got):
        config = entry.config
        walls = [run["clocks"]["wall"] for run in runs]
        virtual = runs[0]["clocks"]["virtual"]
        wall = {k: _median([w[k] for w in walls])
                for k in ("ttft_s", "decode_s", "decode_tok_per_s")}
        wall["decode_tokens"] = walls[0]["decode_tokens"]
        predicted = {k: virtual[k] for k in ("ttft_s", "decode_s", "decode_tok_per_s",
                                             "decode_tokens")}
        cell = entry.cell
        rows.append({
            "cell": cell.name, "group": entry.group, "capacity_frac": cell.capacity_frac,
            "prefetch": cell.prefetch, "speculate": cell.speculate,
            "settings": dict(cell.settings),
            "slots": runs[0]["slots"], "total_experts": runs[0]["total_experts"],
            "hit_rate": runs[0]["hit_rate"], "requests": runs[0]["requests"],
            "misses": runs[0]["misses"], "hardware": runner.spec.hardware.device.name,
            "wall": {**wall, "runs": [{k: w[k] for k in ("ttft_s", "decode_s")} for w in walls],
                     "what": f"median of {len(walls)} live runs: {walls[0]['what']}"},
            "virtual": {**predicted, "what": virtual["what"],
                        "parts": virtual.get("parts"), "host_work": virtual.get("host_work"),
                        "replay_counters_equal_live": virtual.get("replay_counters_equal_live"),
                        # Routing, hence the replay, is the same in every run.
                        "same_in_every_run": all(
                            run["clocks"]["virtual"]["decode_s"] == virtual["decode_s"]
                            for run in runs)},
            # How the runtime ran its passes, summed over the live runs (None: no cache).
            "speculation": _summed([run.get("speculation") for run in runs]),
            "ttft_error": relative_error(predicted["ttft_s"], wall["ttft_s"]),
            "decode_error": relative_error(predicted["decode_s"], wall["decode_s"]),
            "larger": {"ttft": _larger(wall["ttft_s"], predicted["ttft_s"]),
                       "decode": _larger(wall["decode_s"], predicted["decode_s"])},
        })
        if keep and runs[0].get("routing") is not None:
            passes = [statistics.median(p) for p in zip(*(run["wall_passes"] for run in runs))]
            samples.append(Sample(f"{entry.group} {cell.name}".strip(), config, entry.loaded,
                                  runs[0]["routing"],
                                  clocks.replay_specs(runner.spec, runner.driving),
                                  runs[0]["driven"], passes))
    return rows


def _summed(reports: list[dict | None]) -> dict | None:
    """The runs' `speculation` reports added up, key by key (None when a run had none)."""
    if not reports or any(r is None for r in reports):
        return None
    return {k: sum(r[k] for r in reports) for k in reports[0]}


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f}"


def _pct(error: float | None) -> str:
    return "n/a" if error is None else f"{100 * error:+.0f}%"


def table(rows: list[dict]) -> str:
    """The cells as one printed table: each clock's TTFT and decode time per token, and the
    virtual clock's error against the wall clock's (signed: + when it predicts more)."""
    head = (f"{'cell':32s} {'slots':>9s} {'hit':>5s} | {'TTFT ms wall':>12s} {'virtual':>8s} "
            f"{'error':>6s} | {'decode ms/tok wall':>18s} {'virtual':>8s} {'error':>6s} | "
            "larger (TTFT, decode)")
    lines = [head, "-" * len(head)]
    for r in rows:
        w, v = r["wall"], r["virtual"]
        per_w = w["decode_s"] / w["decode_tokens"] if w["decode_tokens"] else None
        per_v = v["decode_s"] / v["decode_tokens"] if v["decode_tokens"] else None
        hit = "n/a" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}"
        lines.append(
            f"{r['cell'][:32]:32s} {r['slots']:>4d}/{r['total_experts']:<4d} {hit:>5s} | "
            f"{_ms(w['ttft_s']):>12s} {_ms(v['ttft_s']):>8s} {_pct(r['ttft_error']):>6s} | "
            f"{_ms(per_w):>18s} {_ms(per_v):>8s} {_pct(r['decode_error']):>6s} | "
            f"{r['larger']['ttft']}, {r['larger']['decode']}")
    return "\n".join(lines)
