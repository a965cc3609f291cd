"""Trace replay, the reference engine: drives the very same `ExpertCache`, policies and clock the
live runtime uses from recorded gate outputs instead of a model (DESIGN.md: one policy code
path); `replay` hands a cache to the compiled engine instead only where `coverage.decide` says
it implements all of it.

Passes are replayed in order; a trace's first `prefill_passes` passes are prefill, the rest
decode steps. A file holding several sequences (a vLLM log's problems) is replayed sequence
after sequence through one cache, as a server would see them.

Replay-only policies (Belady eviction, oracle prefetch) see the future through `Future`.
"""

from __future__ import annotations

import dataclasses

from moejax.cache import ExpertCache
from moejax.errors import ConfigError
from moejax.replay import compiled, coverage
from moejax.replay.coverage import ENGINES, Decision
from moejax.replay.future import future_of
from moejax.replay.gates import layer_gates
from moejax.traces import Trace


def replay(cache: ExpertCache, traces: list[Trace], context_start: list[int] | None = None,
           progress=None, engine: str = "auto", on_load=None) -> Decision:
    """Replays `traces` through `cache` (then `cache.finish()`). `context_start[i]`: tokens
    already in context before sequence i's first pass (capture traces start after a prompt
    that is not in the file). `engine`: "auto" takes the compiled engine where everything the
    cache is has a compiled form (`coverage.decide`), "reference" always runs the policy
    objects request by request. Returns which engine ran, why, and its one-time setup
    (`Decision.setup_s` and `setup`: the compiled kernel's load, part of this call's time;
    `on_load` wraps it, `compiled.run`)."""
    if engine not in ENGINES:
        raise ConfigError(f"replay.engine={engine!r} is not one of {ENGINES}")
    decision = coverage.decide(cache, engine)
    if decision.engine == "compiled":
        setup = compiled.run(cache, traces, context_start, on_load)
        if progress is not None:
            progress(sum(t.num_passes for t in traces))
        return dataclasses.replace(decision, setup_s=setup.seconds, setup=setup.how)
    future = None
    for policy in (cache.eviction, cache.prefetch, cache.miss, cache.routing):
        if policy.needs_future:
            future = future or future_of(traces)
            policy.set_future(future, cache)
    for s, trace in enumerate(traces):
        context = context_start[s] if context_start else 0
        for p in range(trace.num_passes):
            gates = layer_gates(trace, p)
            tokens = len(gates[0].ids)
            context += tokens
            kind = "prefill" if p < trace.prefill_passes else "decode"
            cache.begin_pass(kind, tokens, context)
            for gate in gates:
                for _ in cache.run_layer(gate):
                    pass
            cache.end_pass()
            if progress is not None:
                progress(1)
    cache.finish()
    return decision
