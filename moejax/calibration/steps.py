"""Each compiled step the live runtime dispatches, timed as the runtime pays for it: what the host
spends dispatching it (the call's return) and how long after that its results are on the host
(`jax.block_until_ready`) — the step table of hardware.json's `host_work` section
(`moejax.timing.host_work.StepTable`), per model shape, over token counts (an experts step per
precision; a slot load by the bytes it moves).

The steps are the runtime's own (`moejax.models.stepped`: the embedding, the attention + router
step, the experts step over a slot pool, the logits step that also picks the next token; the
fused slot load, `moejax.serving.slot_pool`), run on one MoE layer of the model with random
weights (timing does not depend on values), every candidate in alternated rounds (forward,
then backward) so a busy spell of a shared machine lands on all of them; each figure is the
median of its rounds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.calibration.measure import one_layer
from moejax.model_config import ModelConfig
from moejax.model_source import in_memory
from moejax.models import (
    MoEDecoder,
    ResidentExperts,
    SteppedDecoder,
    attention_router_step,
    dense_layer_step,
    embed_step,
    experts_step,
    logits_next_step,
)
from moejax.serving.slot_pool import SlotPool
from moejax.timing import StepTable, model_key

# Token counts a table spans by default: a decode step to a long prompt's prefill.
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
# Slot loads come in waves (a decode layer's misses, a prefill layer's): timed as one of 8.
LOAD_BURST = 8


def split_timed(runs: dict[Hashable, Callable[[], object]], reps: int
                ) -> dict[Hashable, tuple[float, float]]:
    """Each of `runs` (a callable that dispatches a step and returns its outputs, not waited
    for) run once to warm it, then `reps` alternated rounds; its median `(dispatch_s,
    complete_s)`: the call's own time, then the wait for its outputs."""
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    keys = list(runs)
    for k in keys:
        jax.block_until_ready(runs[k]())
    seen: dict[Hashable, list[tuple[float, float]]] = {k: [] for k in keys}
    for r in range(reps):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            start = time.perf_counter()
            out = runs[k]()
            returned = time.perf_counter()
            jax.block_until_ready(out)
            seen[k].append((returned - start, time.perf_counter() - returned))
    return {k: (float(np.median([d for d, _ in v])), float(np.median([c for _, c in v])))
            for k, v in seen.items()}


def step_table(cfg: ModelConfig, precisions=("native",), tokens=TOKENS, reps: int = 10,
               decode_context: int = 64, lookahead: int = 2, gmm_impl: str = "tiled",
               seed: int = 0) -> dict[str, StepTable]:
    """The step tables of `cfg`'s shape (module docstring): `embed`, `attention_router`,
    `experts:<precision>` for each of `precisions`, `logits`, `load` (one expert's bytes at
    each precision), and `dense_layer` where the model has dense layers. An attention step of
    one token runs at position `decode_context` (a decode step), more from position 0 (a
    prefill)."""
    layer_cfg = one_layer(cfg)
    max_tokens = max(tokens)
    model = MoEDecoder(layer_cfg, nnx.Rngs(seed))
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate_size
    rng = np.random.default_rng(seed)
    dtype = np.dtype(cfg.dtype)
    loaded = in_memory(layer_cfg, model,
                       {0: (rng.standard_normal((e, h, 2 * i)) * h ** -0.5).astype(dtype)},
                       {0: (rng.standard_normal((e, i, h)) * i ** -0.5).astype(dtype)})
    pools = {p: ResidentExperts.from_host(*loaded.experts_at(p)) for p in precisions}
    dec = SteppedDecoder(model, pools[precisions[0]], max_len=max(max_tokens, decode_context + 1),
                         lookahead=lookahead, gmm_impl=gmm_impl)
    graph, state, static = dec.layer_graph[0], dec.layer_state[0], dec.static_cfg
    spec, _ = dec.spec[0]
    holder = {"cache": dec.caches[0]}  # one KV cache, donated by each step to the next
    key = jax.random.PRNGKey(seed)
    runs: dict[Hashable, Callable[[], object]] = {}
    for t in tokens:
        x = jax.random.normal(jax.random.fold_in(key, t), (1, t, h), jnp.dtype(cfg.dtype))
        ids = jnp.asarray(np.stack([rng.choice(e, cfg.top_k, replace=False) for _ in range(t)]),
                          jnp.int32)
        weights = jnp.full((t, cfg.top_k), 1.0 / cfg.top_k, jnp.float32)
        tokens_in = jnp.zeros((1, t), jnp.int32)
        position = decode_context if t == 1 else 0

        def attention(x=x, position=jnp.int32(position)):  # (a pass makes its position once)
            out = attention_router_step(graph, state, spec, x, holder["cache"], position,
                                        cfg=static)
            holder["cache"] = out[2]
            return out

        runs[("attention_router", t)] = attention
        runs[("embed", t)] = lambda tokens_in=tokens_in: embed_step(dec.head_graph,
                                                                    dec.head_state, tokens_in)
        runs[("logits", t)] = lambda x=x: logits_next_step(dec.head_graph, dec.head_state, x)
        for p, experts in pools.items():
            runs[(f"experts:{p}", t)] = (
                lambda x=x, ids=ids, weights=weights, experts=experts: experts_step(
                    graph, state, x, x, ids, weights, experts.gate_up[0], experts.down[0],
                    experts.identity, cfg=static, impl=gmm_impl))
        if cfg.num_layers > len(cfg.moe_layers):  # the model has dense layers: one of them
            runs[("dense_layer", t)] = _dense_run(cfg, x, position, max(max_tokens,
                                                                        decode_context + 1), seed)
    sizes = loaded.precision_bytes()
    for p in precisions:
        slots = SlotPool(LOAD_BURST, *loaded.experts_at(p), load_path="fused")
        runs[("load", sizes[p])] = _load_run(slots)
    got = split_timed(runs, reps)
    for p in precisions:  # a burst's time, per load
        got[("load", sizes[p])] = tuple(v / LOAD_BURST for v in got[("load", sizes[p])])
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for (kind, size), timing in got.items():
        out.setdefault(kind, {})[int(size)] = timing
    return {kind: StepTable(tuple(sorted(by)), tuple(by[s][0] for s in sorted(by)),
                            tuple(by[s][1] for s in sorted(by)))
            for kind, by in out.items()}


def _load_run(pool: SlotPool) -> Callable[[], object]:
    """A wave's fused slot loads as the runtime issues them (`LOAD_BURST` experts of MoE
    layer 0 in one `load_many`)."""
    loads = [((0, e), e) for e in range(LOAD_BURST)]

    def run():
        pool.load_many(loads)
        return pool.gate_up, pool.down
    return run


def _dense_run(cfg: ModelConfig, x, position: int, max_len: int, seed: int):
    """A dense decoder layer's step of `cfg` (a model with a dense layer first)."""
    dense_cfg = dataclasses.replace(cfg, num_layers=1, moe_layers=(), sliding_window=(None,))
    model = MoEDecoder(dense_cfg, nnx.Rngs(seed))
    dec = SteppedDecoder(model, None, max_len=max_len)  # (no MoE layer asks for experts)
    graph, state = dec.layer_graph[0], dec.layer_state[0]
    holder = {"cache": dec.caches[0]}

    def run():
        y, holder["cache"] = dense_layer_step(graph, state, x, holder["cache"], pos)
        return y

    pos = jnp.int32(position)
    return run


def tables_entry(cfg: ModelConfig, tables: dict[str, StepTable]) -> dict:
    """`{model_key(cfg): tables}`, as hardware.json's `host_work.steps` holds them."""
    return {model_key(cfg): tables}


def table(cfg: ModelConfig, tables: dict[str, StepTable], reps: int) -> str:
    """The step tables of one model, printed: dispatch and completion in microseconds."""
    lines = [f"compiled steps of {cfg.family} (hidden {cfg.hidden_size}, expert "
             f"{cfg.expert_intermediate_size}, {cfg.num_experts} experts, top-{cfg.top_k}) as "
             f"the runtime dispatches them (this machine's wall clock, median of {reps}): "
             "dispatch / complete, us"]
    for kind, t in sorted(tables.items()):
        cols = ", ".join(f"{size}: {1e6 * d:.0f}/{1e6 * c:.0f}"
                         for size, d, c in zip(t.sizes, t.dispatch_s, t.complete_s))
        unit = "bytes" if kind == "load" else "tokens"
        lines.append(f"  {kind:18s} by {unit}: {cols}")
    return "\n".join(lines)
