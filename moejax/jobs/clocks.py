"""Both clocks' speed of a live run: results.json's `clocks` section, `{"wall": ..., "virtual":
...}`, each with TTFT and decode speed and a `what` saying what the figures are.

* **wall**: this machine's own clock, as the generate job timed its requests (`Generation`'s
  `prefill_s`, `decode_s`): what a user waited.
* **virtual**: what the virtual clock says the same run takes on the configured hardware
  profile (the roofline cost model's compute and the modelled transfers' stalls). When the
  cache ran on the virtual clock these are its clock's figures (`cache.metrics.timing()`).
  When it ran on the wall clock (the GPU default), or every expert was resident
  (`cache.enabled=False`), the run's own routing — recorded while it ran (`RunRouting`) — is
  replayed on a fresh cache of the same settings on the virtual clock (no cache: every expert
  resident, `capacity_frac=1.0` with `warm_start=all`: compute only). Routing does not depend on
  the clock (the cache never changes what the model computes), so that replay is the run the
  virtual clock would have timed (DESIGN invariant 4).

The generate job builds a `RunRouting` with `routing_recorder` before its timed requests and
calls `section` at its end (`line` says it in one line). Recording keeps the gate outputs as
they are (device arrays) and reads them to the host only when `section` builds the traces,
after the timed run, so it adds no host round trip to a timed pass. A trace-driven run
(`moejax.traces.driven`) records only how many passes of which sequence each request ran: its
cache saw the driving trace's gates, and the replay is of those.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.cache import ExpertCache, build_cache_for, host_work_section, model_words
from moejax.jobs.cache_report import settle
from moejax.model_config import ModelConfig
from moejax.policies import presets
from moejax.replay.engine import replay
from moejax.run_spec import PolicySpec, RunSpec
from moejax.seam import GateOutputs
from moejax.traces import Trace, TraceRecorder, driven

WALL_WHAT = ("wall clock (this machine), as the job timed its requests: TTFT from the prompt's "
             "forward pass to its first token, decode over the later tokens' passes")
# The figures each clock reports (seconds, tokens, tokens per second).
FIGURES = ("ttft_s", "ttft_per_request_s", "cold_ttft_s", "warm_ttft_s", "decode_s",
           "decode_tokens", "decode_tok_per_s")
# The counters a replay of the run's routing must give as the live cache gave them (the split
# of hits into ready and late ones depends on the clock, hits + late hits does not).
COUNTERS = ("requests", "misses", "evictions", "prefetch_issued")


class RunRouting:
    """The routing a live run's cache decided on, request by request (a request begins with a
    pass at position 0), for `traces()` to hand to a replay: one `Trace` per request, batch row
    0 (as `TraceRecorder` records).

    A run of the router: each MoE layer's gate (`GateOutputs`, kept on the device until
    `traces()`) and each pass's tokens. A trace-driven run (`moejax.traces.driven`): the cache
    saw the driving trace's gates, not the router's, so only which sequence each request
    followed and how many of its passes ran are kept; `traces()` cuts those passes out of the
    driving trace."""

    def __init__(self, cfg: ModelConfig, lookahead: int, source: str):
        self.cfg, self.lookahead, self.source = cfg, lookahead, source
        self._requests: list[dict] = []
        self._gates: dict = {}
        self._decoder = None
        self._driver: driven.TraceDriver | None = None

    def attach(self, decoder, experts=None) -> "RunRouting":
        """Observes `decoder`'s passes over `experts` (its source: a trace-driven runtime's
        driver says what the cache saw)."""
        self._decoder = decoder
        self._driver = driven.driver_of(experts)
        if self._driver is None:
            decoder.gate_observers.append(self.on_gate)
        decoder.pass_observers.append(self.end_pass)
        return self

    @property
    def driving(self) -> driven.DrivingTrace | None:
        """The trace that drove the run (None: the router did)."""
        return None if self._driver is None else self._driver.driving

    def on_gate(self, gate: GateOutputs) -> None:
        self._gates[gate.layer] = gate  # a layer a speculative pass re-ran: its last gate

    on_gate.sees_reruns = True  # (`moejax.models.stepped.sees_reruns`)

    def end_pass(self, tokens: np.ndarray) -> None:
        """`tokens` `[B, T]` the pass consumed (the decoder's position is already past them)."""
        tokens = np.asarray(tokens)
        if not self._requests or self._decoder.pos == tokens.shape[1]:
            sequence = self._driver.sequence if self._driver is not None else None
            self._requests.append({"sequence": sequence, "passes": []})
        self._requests[-1]["passes"].append((self._gates, tokens))
        self._gates = {}

    @property
    def requests(self) -> int:
        return len(self._requests)

    def traces(self) -> list[Trace]:
        """One trace per request (its first pass the prefill, from position 0), in the order
        they ran."""
        out = []
        for request in self._requests:
            if self._driver is not None:
                whole = self._driver.driving.sequences[request["sequence"]]
                out.append(_first_passes(whole, len(request["passes"]), self.cfg))
                continue
            recorder = TraceRecorder(self.cfg, self.lookahead, self.source)
            for gates, tokens in request["passes"]:
                for gate in gates.values():
                    recorder.on_gate(gate)
                recorder.end_pass(tokens)
            out.append(recorder.trace())
        return out


def _first_passes(trace: Trace, passes: int, cfg: ModelConfig) -> Trace:
    """The first `passes` passes of a driving trace as the live run ran them: its first pass a
    prefill from position 0 (a capture's first pass is a decode step after a prompt the file
    lacks; the run prefilled it as its prompt), its layers the model's (the driver matches them
    by position)."""
    if passes > trace.num_passes:
        raise ValueError(f"the run ran {passes} passes of a sequence of {trace.num_passes}")
    return trace.first_passes(passes, layers=list(cfg.moe_layers), prefill_passes=1)


def needs_replay(cache: ExpertCache | None) -> bool:
    """Whether the virtual figures come from a replay of the run's routing: the cache ran on
    the wall clock, or there was no cache."""
    return cache is None or cache.clock.kind != "virtual"


def routing_recorder(run: RunSpec, loaded, decoder, experts,
                     cache: ExpertCache | None) -> RunRouting | None:
    """A `RunRouting` attached to `decoder` (over `experts`) when `section` will replay the run
    (`needs_replay`); None when the cache's own clock is the virtual one."""
    if not needs_replay(cache):
        return None
    return RunRouting(loaded.cfg, run.model.lookahead, loaded.source).attach(decoder, experts)


def wall_figures(generations, warmup: bool) -> dict:
    """The wall clock's figures of the requests (`Generation`s, in order), as
    `ExpertCache.metrics.timing` defines them: TTFT of the first (cold) and the mean of the
    later ones (warm); decode over all requests' decode passes (tokens of batch row 0)."""
    ttfts = [g.prefill_s for g in generations]
    decode_s = sum(g.decode_s for g in generations)
    tokens = sum(max(0, len(g.generated_ids[0]) - 1) for g in generations)
    what = WALL_WHAT + ("; XLA compiles excluded (run.warmup)" if warmup else
                        "; XLA compiles included (run.warmup=False)")
    return {"ttft_s": ttfts[0], "ttft_per_request_s": ttfts, "cold_ttft_s": ttfts[0],
            "warm_ttft_s": sum(ttfts[1:]) / (len(ttfts) - 1) if len(ttfts) > 1 else None,
            "decode_s": decode_s, "decode_tokens": tokens,
            "decode_tok_per_s": tokens / decode_s if decode_s > 0 and tokens else None,
            "what": what}


def resident_run(run: RunSpec, precision: str) -> RunSpec:
    """`run` as a cache that holds every expert from the start at `precision`, on the
    virtual clock: a run with every expert resident, timed by the virtual clock (compute
    only: no transfer, no stall)."""
    cache = dataclasses.replace(
        run.cache, enabled=True, precision="" if precision == "native" else precision,
        capacity_frac=1.0, capacity_of="experts", slots=0, min_slots=0, precision_shares="",
        warm_start="all", seed="", full_layers=0, host_capacity_frac=1.0, host_bytes=0,
        host_compute_layers=0, prefetch_share=0.0)
    policies = PolicySpec(preset="", eviction="lru", prefetch="none", miss="fetch",
                          routing="standard", modules=run.policies.modules)
    return dataclasses.replace(virtual_run(run), cache=cache, policies=policies,
                               trace_driven=run.job == "replay")


def virtual_run(run: RunSpec) -> RunSpec:
    """`run` on the virtual clock."""
    return dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, clock="virtual"))


def replay_specs(run: RunSpec, driving: driven.DrivingTrace | None) -> dict[str, str]:
    """The four policies the replay runs: the run's (a trace-driven run's as it adjusted them,
    `driven.policies_for`), with a trace-driven run's routing as `standard`: its gates are the
    driving trace's already, as the cache saw them."""
    if driving is None:
        return presets.resolve(run.policies)
    chosen = driven.policies_for(run.policies, driving)
    return {**{k: chosen[k] for k in presets.FIELDS}, "routing": "standard"}


def replay_run(run: RunSpec, cfg: ModelConfig, precision_bytes: dict[str, int],
               traces: list[Trace], specs: dict[str, str] | None = None,
               driven: bool | None = None) -> ExpertCache:
    """The cache of `run` (its clock whatever `run` says: give `virtual_run`'s), with the
    policies `specs` (None: the run's), after replaying `traces` through it, request after
    request, each from position 0. On the reference engine: a live run's passes are few, and
    the compiled engine's one-time load would cost more than it saves."""
    cache = build_cache_for(run, cfg, precision_bytes, cfg.norm_topk_prob, specs,
                            driven=driven)
    replay(cache, traces, [0] * len(traces), engine="reference")
    return cache


def _figures(timing: dict) -> dict:
    return {k: timing.get(k) for k in FIGURES}


def _modelled(cache: ExpertCache) -> dict:
    """What a virtual time is made of and what made it: its parts (`timing.parts`: cold TTFT
    and decode) and the host work it modelled (`summary.host_work_section`)."""
    return {"parts": cache.metrics.timing()["parts"], "host_work": host_work_section(cache)}


def virtual_figures(run: RunSpec, loaded, cache: ExpertCache | None,
                    routing: RunRouting | None) -> dict:
    """The virtual clock's figures of the run: its cache's clock, or the replay of its
    routing (`needs_replay`)."""
    if not needs_replay(cache):
        settle(cache)
        hw = cache.clock.hw
        return {**_figures(cache.metrics.timing()), "hardware": hw.name, "source": "cache clock",
                **_modelled(cache),
                "what": f"the cache's virtual clock (modelled {hw.name}, {hw.h2d_gbps:g} GB/s "
                        f"host->device; {model_words(cache)}): the compiled steps, the stalls "
                        "of the modelled transfers and the modelled host work, for this run's "
                        "passes"}
    hw = run.hardware.device
    unavailable = {**dict.fromkeys(FIGURES), "hardware": hw.name, "source": "replay"}
    if routing is None or not routing.requests:
        return {**unavailable, "what": "not measured: the run's routing was not recorded"}
    if run.batch_size != 1:
        return {**unavailable,
                "what": f"not measured: run.batch_size={run.batch_size}, and a replay of "
                        "a run's routing covers batch row 0 only"}
    traces = routing.traces()
    if cache is None:
        from moejax.serving.build import resident_precision

        precision = resident_precision(run)
        replayed = replay_run(resident_run(run, precision), loaded.cfg,
                              loaded.precision_bytes(), traces)
        what = (f"this run's routing replayed on the virtual clock (modelled {hw.name}) with "
                f"every expert resident at {precision} (the run had cache.enabled=False): "
                "compute only, no transfer")
        equal = None
    else:
        settle(cache)
        replayed = replay_run(virtual_run(run), loaded.cfg, loaded.precision_bytes(),
                              traces, replay_specs(run, routing.driving),
                              driven=routing.driving is not None)
        what = (f"this run's routing replayed on the virtual clock (modelled {hw.name}, "
                f"{hw.h2d_gbps:g} GB/s host->device; {model_words(replayed)}) through a "
                f"fresh cache of the same settings (the run's cache ran on the "
                f"{cache.clock.kind} clock)")
        live, again = cache.metrics.totals(), replayed.metrics.totals()
        equal = all(live[k] == again[k] for k in COUNTERS)
    return {**_figures(replayed.metrics.timing()), "hardware": hw.name, "source": "replay",
            **_modelled(replayed), "replay_counters_equal_live": equal, "what": what}


def section(run: RunSpec, loaded, generations, cache: ExpertCache | None,
            routing: RunRouting | None, *, warmup: bool) -> dict:
    """results.json's `clocks`: `{"wall": ..., "virtual": ...}` of a live run whose requests
    gave `generations` (in order; `warmup`: compiled before they ran), through `cache` (None:
    every expert resident), its routing recorded by `routing` (`routing_recorder`'s; None when
    the cache ran on the virtual clock)."""
    return {"wall": wall_figures(generations, warmup),
            "virtual": virtual_figures(run, loaded, cache, routing)}


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.1f} tok/s"


def line(clocks: dict) -> str:
    """`section`'s figures in one line, each clock named: "wall clock (this machine): TTFT
    12.30 ms, decode 85.9 tok/s; virtual clock (modelled h200, from a replay of this run's
    routing): TTFT 3.41 ms, decode 1190.3 tok/s"."""
    wall, virtual = clocks["wall"], clocks["virtual"]
    how = ("its cache's clock" if virtual["source"] == "cache clock"
           else "a replay of this run's routing")
    modelled = virtual.get("host_work")
    if modelled is not None:  # (None: not measured)
        how += f"; {modelled['words']}"
    return (f"wall clock (this machine): TTFT {_ms(wall['ttft_s'])}, decode "
            f"{_rate(wall['decode_tok_per_s'])}; virtual clock (modelled {virtual['hardware']}, "
            f"{how}): TTFT {_ms(virtual['ttft_s'])}, decode {_rate(virtual['decode_tok_per_s'])}")
