"""What this machine takes, measured for real: host->device transfers by size, and the model's
compiled steps (the experts step, the attention + router step, the embedding + LM head) at a
few token counts, each next to the FLOPs and bytes the cost model charges it.

Every figure is timed the same way (`timed`): each candidate run once to compile and warm it,
then `reps` rounds in which every candidate runs once, in alternating order (forward, then
backward), so a busy spell of a shared machine lands on all of them rather than on one; each
candidate's min, median and max are kept. A run is dispatched and waited for
(`block_until_ready`): it is the time the host sees, dispatch included.

Transfers are `jax.device_put` of a `pinned_host` array (`checkpoint.host_memory_kind`) to the
device's `device` memory, on whatever platform runs (a GPU's copy engines; the CPU backend's
copy between its memory kinds). Two ways: one transfer waited for (`single`), and a stream of
`STREAM` transfers issued back to back and waited for together (`stream`, per transfer): what
a wave's loads are, and what the clock's copy-engine FIFO models.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Hashable

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from flax import nnx

from moejax.checkpoint import host_memory_kind
from moejax.model_config import ModelConfig
from moejax.models import (
    MoEDecoder,
    ResidentExperts,
    SteppedDecoder,
    attention_router_step,
    embed_step,
    experts_step,
    logits_step,
)
from moejax.timing import CostModel, Hardware

KiB, MiB = 1 << 10, 1 << 20
# 4 KiB to 64 MiB, a factor 4 apart: from latency-bound to bandwidth-bound on any link.
TRANSFER_SIZES = tuple(4 * KiB * 4 ** i for i in range(8))
STREAM = 8  # transfers per stream


@dataclasses.dataclass(frozen=True)
class Timing:
    min_s: float
    median_s: float
    max_s: float
    reps: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def timed(runs: dict[Hashable, Callable[[], None]], reps: int) -> dict[Hashable, Timing]:
    """Each of `runs` (a callable that dispatches and waits) run once to warm it, then `reps`
    alternated rounds; its seconds per run as min / median / max."""
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    keys = list(runs)
    for k in keys:
        runs[k]()
    seconds: dict[Hashable, list[float]] = {k: [] for k in keys}
    for r in range(reps):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            start = time.perf_counter()
            runs[k]()
            seconds[k].append(time.perf_counter() - start)
    return {k: Timing(min(v), float(np.median(v)), max(v), len(v)) for k, v in seconds.items()}


def device_description() -> dict:
    """What ran: platform, device kind, the memory kinds a transfer went between, JAX."""
    device = jax.devices()[0]
    return {"platform": device.platform, "device_kind": device.device_kind,
            "host_memory_kind": host_memory_kind(device), "jax": jax.__version__,
            "jaxlib": jaxlib.__version__}


# -- transfers ----------------------------------------------------------------------------------
def transfers(sizes=TRANSFER_SIZES, reps: int = 10, stream: int = STREAM) -> list[dict]:
    """Host->device `jax.device_put` of `pinned_host` arrays of each size in `sizes` (bytes):
    one waited for, and `stream` back to back (per transfer). One row per size: `bytes`,
    `single` and `stream` (`Timing` dicts; a stream's per transfer) and the GB/s of each
    median."""
    device = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(device, memory_kind=host_memory_kind(device))
    on_device = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
    sources = {}
    for size in sizes:
        src = jax.device_put(np.full(int(size), 7, np.uint8), host)
        src.block_until_ready()
        sources[int(size)] = src

    def one(src):
        def run():
            jax.device_put(src, on_device).block_until_ready()
        return run

    def many(src):
        def run():
            for out in [jax.device_put(src, on_device) for _ in range(stream)]:
                out.block_until_ready()
        return run

    runs = {}
    for size, src in sources.items():
        runs[("single", size)] = one(src)
        runs[("stream", size)] = many(src)
    got = timed(runs, reps)
    rows = []
    for size in sources:
        single = got[("single", size)]
        per = got[("stream", size)]
        per = Timing(per.min_s / stream, per.median_s / stream, per.max_s / stream, per.reps)
        rows.append({"bytes": size, "single": single.to_dict(), "stream": per.to_dict(),
                     "stream_transfers": stream,
                     "single_gbps": size / single.median_s / 1e9,
                     "stream_gbps": size / per.median_s / 1e9})
    return rows


# -- compiled steps -----------------------------------------------------------------------------
# Profiles on which the cost model's seconds are a step's FLOPs (1 FLOP/s, memory free) and
# its bytes (1 byte/s, compute free), so the fit reads the very accounting the virtual clock
# charges rather than a copy of its formulas.
_FLOPS_PROBE = Hardware("flops probe", 1.0, 0.0, 1, peak_tflops=1e-12, hbm_gbps=1e30,
                        launch_s=0.0)
_BYTES_PROBE = Hardware("bytes probe", 1.0, 0.0, 1, peak_tflops=1e30, hbm_gbps=1e-9,
                        launch_s=0.0)


def charged(cfg: ModelConfig, step: str, **shape) -> tuple[float, float, int]:
    """(FLOPs, bytes, launches) the cost model charges `step` ("experts",
    "attention_router", "embed_logits") of `cfg` at `shape` (its arguments)."""
    flops_model, bytes_model = CostModel(cfg, _FLOPS_PROBE), CostModel(cfg, _BYTES_PROBE)
    if step == "experts":
        args = (shape["pairs"], shape["unique"], shape["tokens"], True)
        return flops_model.experts(*args), bytes_model.experts(*args), 1
    if step == "attention_router":
        args = (shape["tokens"], shape["context"], shape["lookahead"])
        return flops_model.attention_router(*args), bytes_model.attention_router(*args), 1
    if step == "embed_logits":  # the cost model: the LM head's roofline, a launch for each
        return (flops_model.embed_and_logits(shape["tokens"]),
                bytes_model.embed_and_logits(shape["tokens"]), 2)
    raise ValueError(f"no step {step!r}")


def one_layer(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with one decoder layer, a MoE one: every layer runs the same compiled steps, so
    one measures them all without the memory of the rest."""
    return dataclasses.replace(cfg, num_layers=1, moe_layers=(0,), sliding_window=(None,))


def steps(cfg: ModelConfig, token_counts=(1, 4, 16, 64, 256), reps: int = 10,
          lookahead: int = 2, decode_context: int = 64, gmm_impl: str = "tiled",
          seed: int = 0) -> list[dict]:
    """The compiled steps of one MoE layer of `cfg` (random weights, every expert resident on
    the device) at each token count: the experts step (top-k of `tokens` tokens drawn at
    random, so `unique` experts read), the attention + router step (one token at position
    `decode_context`, more from position 0: decode and prefill), the embedding + LM head. One
    row each: what, its shape, the FLOPs / bytes / launches the cost model charges, `Timing`."""
    cfg = one_layer(cfg)
    max_tokens = max(token_counts)
    max_len = max(max_tokens, decode_context + 1)
    model = MoEDecoder(cfg, nnx.Rngs(seed))
    key = jax.random.PRNGKey(seed)
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate_size
    dtype = jnp.dtype(cfg.dtype)
    on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
    k1, k2, k3 = jax.random.split(key, 3)
    gate_up = jax.device_put(jax.random.normal(k1, (e, h, 2 * i), dtype) * h ** -0.5, on_device)
    down = jax.device_put(jax.random.normal(k2, (e, i, h), dtype) * i ** -0.5, on_device)
    experts = ResidentExperts({0: gate_up}, {0: down})
    dec = SteppedDecoder(model, experts, max_len=max_len, lookahead=lookahead,
                         gmm_impl=gmm_impl)
    graph, state, static = dec.layer_graph[0], dec.layer_state[0], dec.static_cfg
    spec, _ = dec.spec[0]
    rng = np.random.default_rng(seed)
    runs, shapes = {}, {}
    holder = {"cache": dec.caches[0]}  # one KV cache, donated by each step to the next
    for t in token_counts:
        x = jax.random.normal(jax.random.fold_in(k3, t), (1, t, h), dtype)
        ids_np = np.stack([rng.choice(e, cfg.top_k, replace=False) for _ in range(t)])
        ids = jnp.asarray(ids_np, jnp.int32)
        weights = jnp.full((t, cfg.top_k), 1.0 / cfg.top_k, jnp.float32)
        unique = len(np.unique(ids_np))

        def run_experts(x=x, ids=ids, weights=weights):
            experts_step(graph, state, x, x, ids, weights, gate_up, down, experts.identity,
                         cfg=static, impl=gmm_impl).block_until_ready()

        runs[("experts", t)] = run_experts
        shapes[("experts", t)] = dict(tokens=t, pairs=t * cfg.top_k, unique=unique)
        position = decode_context if t == 1 else 0

        def run_attention(x=x, position=position):
            out = attention_router_step(graph, state, spec, x, holder["cache"],
                                        jnp.int32(position), cfg=static)
            holder["cache"] = out[2]
            jax.block_until_ready(out)

        runs[("attention_router", t)] = run_attention
        shapes[("attention_router", t)] = dict(tokens=t, context=position + t,
                                               lookahead=lookahead)
        tokens = jnp.zeros((1, t), jnp.int32)

        def run_head(tokens=tokens):
            y = embed_step(dec.head_graph, dec.head_state, tokens)
            logits_step(dec.head_graph, dec.head_state, y).block_until_ready()

        runs[("embed_logits", t)] = run_head
        shapes[("embed_logits", t)] = dict(tokens=t)
    got = timed(runs, reps)
    rows = []
    for (step, t), timing in got.items():
        flops, nbytes, launches = charged(cfg, step, **shapes[(step, t)])
        rows.append({"step": step, **shapes[(step, t)], "flops": flops, "bytes": nbytes,
                     "launches": launches, "timing": timing.to_dict()})
    return rows


def model_summary(cfg: ModelConfig) -> dict:
    """The shape a step measurement ran at (results files say it with each table)."""
    return {"family": cfg.family, "hidden_size": cfg.hidden_size,
            "expert_intermediate_size": cfg.expert_intermediate_size,
            "num_experts": cfg.num_experts, "top_k": cfg.top_k, "num_heads": cfg.num_heads,
            "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size, "dtype": cfg.dtype,
            "expert_bytes": cfg.expert_bytes}
