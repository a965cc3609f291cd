"""The replay job: a recorded or imported routing trace through the expert cache.

    python -m moejax.main --config=configs/replay.py --config.replay.trace=PATH --config.cache.slots=N \\
        --config.policies.eviction=lru --workdir=W

Writes `W/results.json` in the live schema (`cache`: totals, per layer, timing) and `replay`:
the engine's own time (`seconds`, `requests_per_s`; this machine's wall clock) with the compiled
kernel's one-time load apart (`setup_s`; `setup`: "compiled", numba's compile, once per machine,
or "numba disk cache", or "in process"). The load is a phase of its own on the screen too: a
line says it while it runs and what it took, and the progress bar starts after it, so its rate
is the replay's. Prints the cache's table (with `log.progress`), the replay's speed, and where
the results went. The model shape comes from the trace; expert bytes
(and the cost model of the virtual clock) from the trace's model config when it has one (moejax
traces), else from `model.family`/`model.preset`.
Precision pools are sized as live ones (`moejax.cache.build_cache_for`, the same cache
code), with each quantized expert's bytes computed from that model config and
`cache.group_size` — no weights are loaded:

    python -m moejax.main --config=configs/replay.py --config.replay.trace=olmoe_prose.jsonl \\
        --config.model.family=olmoe --config.model.preset=olmoe-1b-7b \\
        --config.cache.capacity_frac=0.05 --config.cache.capacity_of=model \\
        --config.cache.precision=int4 --workdir=W
"""

from __future__ import annotations

import dataclasses
import os
import time

import ml_collections

from moejax.cache import ExpertCache, build_cache_for, clock_kind, precision_bytes_of, summary
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.cache_report import (
    announce_results,
    cache_header,
    cache_table,
    progress,
    report_cache,
)
from moejax.jobs.specs import resolve
from moejax.model_config import ModelConfig
from moejax.policies import presets
from moejax.policies.registry import policy_class
from moejax.quant import formats
from moejax.replay import compiled
from moejax.replay.engine import replay
from moejax.results import write_json_atomic
from moejax.run_spec import RunSpec
from moejax.traces import ImportedTraces, Trace, TraceError, as_requests, import_traces_memo


def _model_config(config: ml_collections.ConfigDict, trace: Trace) -> ModelConfig | None:
    model = trace.meta.get("model") or {}
    if "family" in model and "hidden_size" in model:
        return ModelConfig.from_dict(model)
    m = config.model
    if m.preset in ("", "embedded"):
        return None
    cfg = preset(m.family, m.preset, m.width)  # (a preset of the family: `specs.check_model`)
    if (cfg.num_moe_layers, cfg.num_experts, cfg.top_k) != (len(trace.layers), trace.num_experts,
                                                           trace.top_k):
        raise ConfigError(
            f"model.preset={m.family}/{m.preset} has {cfg.num_moe_layers} MoE layers x "
            f"{cfg.num_experts} experts, top-{cfg.top_k}; the trace has {len(trace.layers)} x "
            f"{trace.num_experts}, top-{trace.top_k}"
            + (" (the trace's expert count was inferred from its largest id: state the model's "
               "with --config.replay.num_experts=N)"
               if (trace.meta.get("info") or {}).get("num_experts_source") == "inferred" else ""))
    return cfg


def _same_shape(cfg: ModelConfig, trace: Trace, path: str) -> ModelConfig:
    """`cfg`, when its MoE layers, experts and top-k are the trace's."""
    if (cfg.num_moe_layers, cfg.num_experts, cfg.top_k) != (len(trace.layers), trace.num_experts,
                                                           trace.top_k):
        raise ConfigError(f"the model has {cfg.num_moe_layers} MoE layers x {cfg.num_experts} "
                          f"experts, top-{cfg.top_k}; {path} has {len(trace.layers)} x "
                          f"{trace.num_experts}, top-{trace.top_k}")
    return cfg


def _precision_bytes(config: ml_collections.ConfigDict, trace: Trace,
                     cfg: ModelConfig | None, by_slots: bool = False
                     ) -> tuple[dict[str, int], bool]:
    """Bytes of one expert at each precision replay can size, and whether they are known.

    Native: `cache.expert_bytes`, else the trace's, else the model config's. The quantized
    precisions from the model config's shapes (`cache.group_size`), when a model is known.
    Unknown sizes (an id-only trace, no model named): every precision counts 1-byte experts
    (counts exact, bytes and times meaningless), and only an absolute slot count sizes the
    cache (`cache.slots`; `by_slots`: the job gives one itself, the curve)."""
    native = (config.cache.expert_bytes or trace.meta.get("expert_bytes")
              or (cfg.expert_bytes if cfg else None))
    if not native:
        # Misses, collisions and hits + late hits do not depend on expert size (admission is
        # immediate); bytes and times do, and so does the split of hits into ready and late
        # ones: those are reported as unknown.
        if config.cache.slots <= 0 and not by_slots:
            raise ConfigError(f"{config.replay.trace} does not record expert bytes, so a capacity "
                              "fraction cannot be turned into slots: give --config.cache.slots=N, "
                              "or name the model (--config.model.family=F "
                              "--config.model.preset=P, e.g. olmoe / olmoe-1b-7b), or "
                              "--config.cache.expert_bytes=B")
        return dict.fromkeys(formats.PRECISIONS, 1), False
    if cfg is None:
        return {"native": int(native)}, True
    out = precision_bytes_of(cfg, config.cache.group_size)
    out["native"] = int(native)
    return out, True


def _import(config: ml_collections.ConfigDict) -> ImportedTraces:
    """The trace file's sequences and the import's notes (`replay.num_experts`,
    `replay.strict`; moejax/traces/importers.py). A file this process parsed before with the
    same content is not parsed again (`moejax/traces/memo.py`: a sweep worker's many cells on
    one trace)."""
    num_experts = config.replay.num_experts  # (checked: `moejax.jobs.specs.check_settings`)
    try:
        return import_traces_memo(config.replay.trace, num_experts=num_experts or None,
                                  strict=config.replay.strict)
    except TraceError as e:
        raise ConfigError(str(e)) from e


def _policies_for(config: ml_collections.ConfigDict, trace: Trace) -> dict:
    """What runs: `presets.report_for_trace` (a trace without scores runs no default
    score-based prefetcher)."""
    return presets.report_for_trace(config.policies, trace.spec is not None,
                                     config.replay.trace)


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A replay's trace and settings, read and checked once (`load`): the run's specs, the
    imported file and the sequences it replays (cut into requests), the model config (None:
    the trace's shape only), each precision's expert bytes (`bytes_known`: False for 1-byte
    stand-ins), the policies that run (`policies`: `presets.report_for_trace`, `specs`: the
    four specs) and the context before each sequence's first pass."""

    spec: RunSpec
    imported: ImportedTraces
    traces: list[Trace]
    cfg: ModelConfig | None
    precision_bytes: dict[str, int]
    bytes_known: bool
    policies: dict
    specs: dict[str, str]
    context: list[int]

    @property
    def first(self) -> Trace:
        return self.traces[0]


def load(config: ml_collections.ConfigDict, by_slots: bool = False,
         model: ModelConfig | None = None) -> Loaded:
    """The replay `config` describes, read and checked before any cache is built: the trace
    file, its model, the expert sizes and the policies (`by_slots`: the caller sizes every
    cache in slots itself, so unknown expert sizes need no `cache.slots`; `model`: the model
    config instead of the trace's or the preset's, the planner's from a Hugging Face
    config.json)."""
    spec = resolve(config)
    routing = presets.resolve(spec.policies)["routing"]
    if policy_class("routing", routing).name == "trace":
        raise ConfigError(f"policies.routing={routing!r} drives a live run by a trace; a replay "
                          "already follows its own (replay.trace): leave policies.routing unset")
    rp = config.replay
    if not rp.trace:
        raise ConfigError("replay.trace is empty: pass --config.replay.trace=PATH")
    if not os.path.isfile(rp.trace):
        raise ConfigError(f"replay.trace={rp.trace!r} is not a file")
    if clock_kind(spec.hardware) != "virtual":
        raise ConfigError("replay runs on the virtual clock: set clock.kind=virtual (or auto)")
    imported = _import(config)
    traces = [r for t in imported.traces
              for r in as_requests(t, rp.request_tokens, rp.prefill_tokens, rp.trace)]
    first = traces[0]
    for t in traces[1:]:
        if (t.layers, t.num_experts, t.top_k) != (first.layers, first.num_experts, first.top_k):
            raise ConfigError(f"{rp.trace}: sequences of different model shapes")
    cfg = _model_config(config, first) if model is None else _same_shape(model, first, rp.trace)
    precision_bytes, bytes_known = _precision_bytes(config, first, cfg, by_slots)
    policies = _policies_for(config, first)
    specs = {k: policies[k] for k in presets.FIELDS}
    prompt = int(first.meta.get("info", {}).get("prompt_tokens", 0) or 0)
    context = [prompt if t.prefill_passes == 0 else 0 for t in traces]
    return Loaded(spec, imported, traces, cfg, precision_bytes, bytes_known, policies, specs,
                  context)


def build(loaded: Loaded, specs: dict[str, str] | None = None,
          slots: int | None = None) -> ExpertCache:
    """A fresh cache for `loaded`'s replay: its policies (`specs`: others instead), at its
    configured size or at `slots` slots (`cache.slots`; the capacity curve's sizes, with no
    `cache.min_slots` floor)."""
    spec = loaded.spec
    if slots is not None:
        spec = dataclasses.replace(spec, cache=dataclasses.replace(spec.cache, slots=slots,
                                                                   min_slots=0))
    specs = loaded.specs if specs is None else specs
    cfg, first = loaded.cfg, loaded.first
    cache = build_cache_for(spec, cfg, loaded.precision_bytes,
                            cfg.norm_topk_prob if cfg else False, specs,
                            layers=tuple(first.layers),
                            num_layers=cfg.num_layers if cfg else max(first.layers) + 1,
                            num_experts=first.num_experts, top_k=first.top_k)
    if cache.eviction.needs_future and (specs["routing"] != "standard"
                                        or specs["miss"] != "fetch"):
        raise ConfigError("belady's future is the trace's router selection: it needs "
                          "policies.routing=standard and policies.miss=fetch")
    return cache


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    loaded = load(config)
    rp = config.replay
    traces = loaded.traces
    bytes_known, policies, specs = loaded.bytes_known, loaded.policies, loaded.specs
    cache = build(loaded)
    context = loaded.context

    passes = sum(t.num_passes for t in traces)
    start = time.perf_counter()
    with progress(config.log.progress, passes, "replay", unit="pass") as bar:
        phase = KernelPhase(bar)
        engine = replay(cache, traces, context, bar.update if bar is not None else None,
                        engine=rp.engine, on_load=phase)
    # The engine's own time: the compiled kernel's one-time load (numba's disk cache, or a
    # compile) is `setup_s`, apart, or a short replay's rate would mostly measure that load;
    # what is taken out is the whole load phase (`KernelPhase.seconds`: the load and its lines).
    elapsed = time.perf_counter() - start - phase.seconds
    requests = cache.metrics.totals()["requests"]
    results = {
        "job": "replay",
        "trace": trace_section(config, loaded),
        # Per-pass timings: in TensorBoard, not in every cell file.
        "cache": report_cache(config, cache, workdir, passes=False,
                              expert_bytes_known=bytes_known, policies=policies),
        "replay": {"seconds": elapsed, "setup_s": engine.setup_s, "setup": engine.setup,
                   "requests_per_s": requests / elapsed if elapsed > 0 else None,
                   "engine": engine.engine, "engine_reason": engine.reason},
        "config": config.to_dict(),
    }
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    if config.log.progress:
        header = f"replay of {rp.trace}: {cache_header(config, cache, specs, bytes_known)}"
        print(cache_table(config, cache, header=header, bytes_known=bytes_known,
                          no_ttft=_no_ttft(traces)))
    print(run_line(results["replay"], requests))
    announce_results(path)
    return results


def trace_section(config: ml_collections.ConfigDict, loaded: Loaded) -> dict:
    """results.json's `trace`: the file, how it was read and cut into requests, its shape
    and who routed it."""
    rp, first = config.replay, loaded.first
    return {"path": os.path.abspath(rp.trace),
            "name": os.path.splitext(os.path.basename(rp.trace))[0],
            "sequences": len(loaded.imported.traces), "requests": len(loaded.traces),
            "request_tokens": rp.request_tokens,
            "prefill_tokens": rp.prefill_tokens,
            "passes": sum(t.num_passes for t in loaded.traces),
            "has_scores": first.has_scores,
            # Who routed it (claims group traces by this, never by their folder).
            "model": first.model_name, "synthetic": first.synthetic,
            "layers": first.layers, "num_experts": first.num_experts, "top_k": first.top_k,
            **loaded.imported.notes.to_dict()}


class KernelPhase:
    """`on_load` of `replay` (`compiled.run`): the compiled kernel's load as a phase of its own.
    Unless this process already holds the kernel, a line says the load while it runs (a numba
    compile takes a minute, once per machine) and then what it was and took; the progress bar
    is cleared for the line and restarted after it, so that its rate counts the replay only.
    `seconds`: the phase's wall time, lines included (0 when the engine loads no kernel)."""

    def __init__(self, bar):
        self.bar, self.seconds = bar, 0.0

    def __call__(self, make, loaded: bool) -> compiled.KernelLoad:
        t0 = time.perf_counter()
        if loaded:
            done = make()
            self.seconds = time.perf_counter() - t0
            return done
        if self.bar is not None:
            self.bar.clear()
        print("replay engine: loading its numba kernel (compiled once per machine, then read "
              "from numba's disk cache) ...", end=" ", flush=True)
        done = make()
        what = ("compiled" if done.how == compiled.COMPILED
                else "read from numba's disk cache")
        print(f"{what} in {done.seconds:.2f} s, {summary.WALL_CLOCK}; apart from the replay's "
              "time", flush=True)
        if self.bar is not None:
            self.bar.reset()  # its clock restarts: the bar's rate is the replay's
        self.seconds = time.perf_counter() - t0
        return done


def _no_ttft(traces: list[Trace]) -> str:
    """Why a replay has no TTFT (TTFT is a request's prefill pass; `summary.table`)."""
    if any(t.prefill_passes for t in traces):
        return summary.NO_PREFILL
    return ("the trace has no prefill pass, only decode steps: --config.replay.request_tokens=N "
            "--config.replay.prefill_tokens=M cut it into requests that start with one")


def run_line(replay_section: dict, requests: int) -> str:
    """The replay's own speed on this machine's clock, with the one-time kernel load apart."""
    r = replay_section
    rate = (f"{r['requests_per_s']:,.0f} requests/s" if r["requests_per_s"] is not None
            else "too fast to time")
    line = (f"{summary.WALL_CLOCK}: {requests:,} cache requests replayed in {r['seconds']:.3f} s "
            f"on the {r['engine']} engine ({rate})")
    if r["engine"] == "compiled":
        line += f", after {r['setup_s']:.2f} s loading its kernel (once per process)"
        line += {compiled.COMPILED: ": numba compiled it (once per machine)",
                 compiled.DISK_CACHE: ": read from numba's disk cache"}.get(r.get("setup"), "")
    return line
