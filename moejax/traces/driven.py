"""Trace-driven live runs (`policies.routing='trace(path=T)'`): a run of the model whose expert
cache decides on, and whose experts step computes, exactly the experts a recorded trace T chose,
pass by pass.

The router still runs on the device (its time is real), but the runtime hands the cache T's gate
of each MoE layer instead of the router's (`CachedExperts.gate_source`, wired in
`moejax/serving/build.py`): the very `LayerGate`s replay feeds (`moejax.replay.gates`), with
T's ids and, where T has them, its weights, router probabilities and speculative scores. So a
trace-driven run and the replay of T under the same cache settings take the same decisions:
the same counters. An id-only trace (the shipped captures) has no weights: the cache sees none,
as in replay, and the experts step sums the chosen experts with 1/K each (`TraceRouting`).

The pass structure is T's. The generate job runs each sequence of T (cut as replay cuts it,
`replay.request_tokens` / `replay.prefill_tokens`) as one request: its prompt is the first
pass's tokens (T's recorded token ids when it has them, else zeros), then one decoded token per
remaining pass. A `TraceDriver` walks T and checks that every live pass has the token count of
the pass of T it follows.

The model must have T's MoE layer count (matched by position), expert count and top-k: a
family preset narrowed with `model.width` runs a real model's routing structure on a CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from moejax.errors import ConfigError
from moejax.policies import build, policy_class, presets
from moejax.policies.routing import TraceRouting
from moejax.replay.gates import layer_gates
from moejax.run_spec import PolicySpec, RunSpec, TraceReading
from moejax.seam import LayerGate
from moejax.traces.format import Trace, TraceError
from moejax.traces.importers import ImportNotes, import_traces
from moejax.traces.requests import as_requests


@dataclasses.dataclass(frozen=True)
class DrivingTrace:
    """The trace a run follows: its sequences (each one request) and how it was imported."""

    path: str
    sequences: tuple[Trace, ...]
    notes: ImportNotes

    @property
    def first(self) -> Trace:
        return self.sequences[0]

    @property
    def has_weights(self) -> bool:
        return self.first.weights is not None


def trace_path(policies: PolicySpec) -> str | None:
    """The path T of `policies.routing='trace(path=T)'` (checked to be a file), None when the
    routing policy is another."""
    spec = presets.resolve(policies)["routing"]
    if policy_class("routing", spec) is not TraceRouting:
        return None
    path = build("routing", spec).path
    if not path:
        raise ConfigError(f"policies.routing={spec!r} needs the trace to follow: "
                          "trace(path=T), T a moejax .npz, capture JSONL or vLLM rows file")
    if not os.path.isfile(path):
        raise ConfigError(f"policies.routing={spec!r}: {path!r} is not a file")
    return path


def check_run(run: RunSpec) -> None:
    """What a trace-driven run needs of the rest of the run, each refusal one line."""
    routing = presets.resolve(run.policies)["routing"]
    if run.job != "generate":
        raise ConfigError(f"policies.routing={routing!r} drives the generate job, whose passes "
                          f"follow the trace; job={run.job!r} feeds its own tokens")
    if not run.cache.enabled:
        raise ConfigError(f"policies.routing={routing!r} hands the trace's choice to the expert "
                          "cache, and cache.enabled=False runs none: enable it (for every expert "
                          "resident: cache.capacity_frac=1.0 cache.warm_start=all)")
    if run.batch_size != 1:
        raise ConfigError(f"run.batch_size={run.batch_size}: a trace-driven run follows "
                          "one sequence's passes (batch_size=1)")
    if run.records_trace:
        raise ConfigError(f"tracing.record with policies.routing={routing!r} would record the "
                          "router's choice, not the trace's that ran: the trace is its record")


def load(reading: TraceReading, path: str) -> DrivingTrace:
    """T's sequences as the replay job reads them (`replay.num_experts`, `replay.strict`,
    `replay.request_tokens`, `replay.prefill_tokens`), each checked to be a run's passes: at
    most one prefill pass, then decode passes of one token. Read once per file and options."""
    stat = os.stat(path)
    r = reading
    return _load(os.path.abspath(path), stat.st_mtime_ns, stat.st_size,
                 r.num_experts, r.strict, r.request_tokens, r.prefill_tokens)


@functools.lru_cache(maxsize=4)
def _load(path: str, _mtime: int, _size: int, num_experts: int, strict: bool,
          request_tokens: int, prefill_tokens: int) -> DrivingTrace:
    try:
        imported = import_traces(path, num_experts=num_experts or None, strict=strict)
    except TraceError as e:
        raise ConfigError(str(e)) from e
    sequences = tuple(r for t in imported.traces
                      for r in as_requests(t, request_tokens, prefill_tokens, path))
    first = sequences[0]
    for i, t in enumerate(sequences):
        if (t.layers, t.num_experts, t.top_k) != (first.layers, first.num_experts, first.top_k):
            raise ConfigError(f"{path}: sequences of different model shapes")
        where = f"{path}" + (f" (sequence {i})" if len(sequences) > 1 else "")
        if t.prefill_passes > 1:
            raise ConfigError(f"{where} has {t.prefill_passes} prefill passes; a live run "
                              "prefills its prompt in one pass")
        rows = np.diff(t.pass_offsets)[1:]
        if np.any(rows != 1):
            raise ConfigError(f"{where} has passes after the first of several tokens (a batch "
                              "> 1, or chunked prefill); a live run decodes one token per pass")
    return DrivingTrace(path, sequences, imported.notes)


def check_model(cfg, driving: DrivingTrace) -> None:
    """The model must have T's MoE layer count, expert count and top-k."""
    t = driving.first
    model = (len(cfg.moe_layers), cfg.num_experts, cfg.top_k)
    if model != (len(t.layers), t.num_experts, t.top_k):
        inferred = driving.notes.num_experts_inferred
        raise ConfigError(
            f"policies.routing=trace: the model has {model[0]} MoE layers x {model[1]} experts, "
            f"top-{model[2]}; the trace {driving.path} has {len(t.layers)} x {t.num_experts}, "
            f"top-{t.top_k} (a family preset of that shape: model.family / model.preset, "
            "narrowed with model.width=N)"
            + (" (the trace's expert count was inferred from its largest id: state the "
               "model's with --config.replay.num_experts=N)" if inferred else ""))


def policies_for(policies: PolicySpec, driving: DrivingTrace, warn: bool = False) -> dict:
    """What runs: the replay job's choice for the same trace (`presets.report_for_trace`),
    so that a live run and the replay of its trace run the same policies (`warn`: say so
    when a default prefetcher is dropped, once per run)."""
    return presets.report_for_trace(policies, driving.first.spec is not None,
                                    driving.path, warn)


def prompt_of(trace: Trace, vocab_size: int) -> tuple[list[int], str]:
    """A sequence's prompt, the tokens of its first pass: the recorded ids when the trace has
    them (all in the model's vocabulary), else zeros; and which of the two, in words."""
    tokens = trace.tokens[trace.pass_rows(0)]
    if np.all((tokens >= 0) & (tokens < vocab_size)):
        return tokens.astype(int).tolist(), "the trace's token ids"
    return [0] * len(tokens), "zeros (the trace records no token ids)"


class TraceDriver:
    """The `gate_source` of a trace-driven runtime: given the router's `LayerGate` of each MoE
    layer, in pass order, returns T's gate of the same layer and pass (the same arrays replay
    feeds, relabelled to the model's layer numbers where T numbers its layers otherwise).

    It walks one sequence of T pass by pass (`start` picks the sequence; a new driver starts
    at sequence 0), advancing at each pass's first MoE layer. A live pass whose token count is
    not the trace pass's, or a pass beyond the sequence's last, is a `ConfigError`: the run is
    not following T. A runtime built for a throwaway decoder (the generate job's warm-up) has a
    driver of its own, so it never consumes the timed run's passes."""

    def __init__(self, driving: DrivingTrace, model_layers):
        self.driving = driving
        trace_layers = driving.first.layers
        self._layer_of = dict(zip(trace_layers, model_layers))
        self._relabel = list(trace_layers) != list(model_layers)
        self.passes_run = 0  # over all sequences
        self.start(0)

    def start(self, sequence: int) -> None:
        """The next pass is the first of `sequence`."""
        if not 0 <= sequence < len(self.driving.sequences):
            raise ValueError(f"sequence {sequence} of {len(self.driving.sequences)}")
        self.sequence, self.next_pass = sequence, 0
        self._gates: list[LayerGate] = []
        self._position = 0  # of the next MoE layer within the pass

    def __call__(self, routed: LayerGate) -> LayerGate:
        if self._position == 0:
            self._begin_pass()
        gate = self._gates[self._position]
        if gate.layer != routed.layer:  # the runtime asks every MoE layer once, in order
            raise AssertionError(f"trace-driven pass asked for layer {routed.layer}, the trace "
                                 f"holds layer {gate.layer} next")
        if len(routed.ids) != len(gate.ids):
            raise ConfigError(
                f"a trace-driven run follows {self.driving.path}'s passes, but its pass "
                f"{self.next_pass - 1}{self._of_sequence()} has {len(gate.ids)} tokens and the "
                f"model's has {len(routed.ids)}")
        self._position = (self._position + 1) % len(self._gates)
        return gate

    def _begin_pass(self) -> None:
        trace = self.driving.sequences[self.sequence]
        if self.next_pass >= trace.num_passes:
            raise ConfigError(f"{self.driving.path}{self._of_sequence()} has "
                              f"{trace.num_passes} passes; the run asked for more")
        gates = layer_gates(trace, self.next_pass)
        if self._relabel:
            gates = [dataclasses.replace(
                g, layer=self._layer_of[g.layer],
                spec_layers=tuple(self._layer_of[s] for s in g.spec_layers)) for g in gates]
        self._gates = gates
        self.next_pass += 1
        self.passes_run += 1

    def _of_sequence(self) -> str:
        return f" (sequence {self.sequence})" if len(self.driving.sequences) > 1 else ""


def driver_of(experts) -> TraceDriver | None:
    """The `TraceDriver` of a runtime (`CachedExperts`), None when it is not trace-driven."""
    source = getattr(experts, "gate_source", None)
    return source if isinstance(source, TraceDriver) else None
