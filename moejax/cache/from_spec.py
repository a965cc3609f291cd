"""Builds the `ExpertCache` of a run from its typed specs (`moejax.run_spec.RunSpec`: the
cache, the policies, the hardware and the clock) — the one way replay and live runs build their
cache (the live runtime around it is `moejax.serving.build`).

`build_cache_for` resolves the policies, the plain precision (`cache.precision`, or the first of
the miss policy's levels when not given), the precision pools and their slots
(`moejax/cache/capacity.py`) from the bytes of one expert at each precision the source has
(`precision_bytes`: a checkpoint's, live; `capacity.precision_bytes_of(model config)`, replay),
then the clock, the cost model, the host tier and the placement. The spec's values were checked
when the job resolved it (`moejax.jobs.specs`); what needs the model is checked here.
"""

from __future__ import annotations

import math

from moejax.cache import capacity as capacity_lib
from moejax.cache.cache_options import CacheOptions
from moejax.cache.capacity import CacheShape
from moejax.cache.expert_cache import ExpertCache
from moejax.cache.host_path import HostPath
from moejax.cache.host_tier import HostTier
from moejax.cache.runtime_timing import RuntimeTiming
from moejax.errors import ConfigError
from moejax.model_config import ModelConfig
from moejax.policies import build, presets
from moejax.quant import formats
from moejax.run_spec import CacheSpec, HardwareSpec, RunSpec
from moejax.timing import CostModel, HostDeviceClock, VirtualClock, WallClock
from moejax.timing import storage as storage_lib

CLOCKS = ("auto", "virtual", "wall")


# `cache.load_path` (moejax/serving/slot_pool.py: LOAD_PATHS; the cache package loads no JAX).
LOAD_PATHS = ("auto", "fused", "copy_stream")


def clock_kind(hardware: HardwareSpec) -> str:
    """`clock.kind` with "auto" resolved: virtual off-GPU (deterministic), wall on a GPU
    (DESIGN.md)."""
    if hardware.clock == "auto":
        import jax  # (only here: the cache itself is numpy)

        return "wall" if jax.default_backend() == "gpu" else "virtual"
    return hardware.clock


def policy_context(shape: CacheShape, cfg_router_renorm: bool, seed: int) -> dict:
    """What the registry hands to policy constructors that declare it (`cache_precision`: the
    plain precision, the first pool's; not `precision`, a user argument of `noisy_oracle`)."""
    return dict(num_layers=len(shape.layers), num_experts=shape.num_experts, top_k=shape.top_k,
                num_slots=shape.num_slots, seed=seed, renormalize=cfg_router_renorm,
                cache_precision=shape.precision)


def build_policies(run: RunSpec, shape: CacheShape, renormalize: bool,
                   specs: dict[str, str] | None = None):
    """The four policies: `specs` when given (a job that adjusted them), else the specs
    `presets.resolve` makes of the run's `policies`."""
    ctx = policy_context(shape, renormalize, run.seed)
    p = specs if specs is not None else presets.resolve(run.policies)
    return (build("eviction", p["eviction"], **ctx), build("prefetch", p["prefetch"], **ctx),
            build("miss", p["miss"], **ctx), build("routing", p["routing"], **ctx))


def build_host_tier(run: RunSpec, shape: CacheShape, read_bytes: int,
                    renormalize: bool) -> HostTier | None:
    """The host tier of a run whose experts stay on storage (None: every expert in host
    memory). It holds experts at the cache's one precision, `read_bytes` each."""
    c = run.cache
    if not c.host_tier:
        return None
    if len(shape.pools) > 1:
        raise ConfigError(f"a host tier (cache.host_capacity_frac / cache.host_bytes) needs a "
                          f"cache of one precision; this one has pools {list(shape.precisions)}")
    total = shape.total_experts
    if c.host_bytes > total * read_bytes:  # (a tier above every expert would be cut to them)
        raise ConfigError(f"cache.host_bytes={c.host_bytes} is more than all {total} experts "
                          f"take ({total * read_bytes} bytes at {shape.precision}): it takes "
                          f"1 to {total * read_bytes}, or 0 (the schema's default: "
                          "cache.host_capacity_frac sizes the host tier)")
    if c.host_bytes:
        capacity = c.host_bytes // read_bytes
        what = (f"cache.host_bytes={c.host_bytes} holds {capacity} experts of {read_bytes} "
                f"bytes ({shape.precision})")
    else:
        capacity = int(math.floor(c.host_capacity_frac * total + 1e-9))
        what = (f"cache.host_capacity_frac={c.host_capacity_frac} holds {capacity} of the "
                f"{total} experts ({capacity * read_bytes} bytes at {shape.precision})")
    if capacity < shape.num_experts:
        raise ConfigError(f"{what}: fewer than one layer's {shape.num_experts} experts "
                          f"({shape.num_experts * read_bytes} bytes); a layer's experts must "
                          "fit in host memory together")
    spec = c.host_eviction
    ctx = {**policy_context(shape, renormalize, run.seed), "num_slots": capacity}
    try:
        policy = build("eviction", spec, **ctx)
    except ConfigError as e:  # ("eviction policy ..." alone would not say which of the two)
        raise ConfigError(f"cache.host_eviction: {e}") from e
    if policy.needs_future or policy.needs_probs:
        raise ConfigError(f"cache.host_eviction={spec!r} reads "
                          f"{'the future routing' if policy.needs_future else 'router scores'}, "
                          "which the host tier does not see; choose one that does not "
                          "(lru, lru_per_layer, fifo, lfu, least_stale, priority, ...)")
    return HostTier(capacity, read_bytes, policy, storage_lib.StorageQueue(run.hardware.storage),
                    list(shape.layers), spec)


WARM_STARTS = ("none", "all", "hotlist(trace=PATH, top=N)")


def _placement(c: CacheSpec, cache: ExpertCache):
    """What to place before the first pass: `(spec, source, keys hottest first, priorities or
    None)`, from `cache.seed` (ds4: placement and priorities) or `cache.warm_start` (a preload
    only); None when neither is set."""
    from moejax.cache import hotlist as hotlist_lib

    seed = c.seed or ""
    warm = c.warm_start or "none"
    if seed and warm != "none":
        raise ConfigError(f"cache.seed={seed!r} and cache.warm_start={warm!r}: set one (seed "
                          "places a hotlist and gives its priorities; warm_start only preloads)")
    if warm == "all":
        # Every expert when they fit, else an equal share of each layer (expert 0 of every
        # layer, then expert 1, ...).
        keys = [(l, e) for e in range(cache.shape.num_experts) for l in cache.shape.layers]
        return "cache.warm_start=all", "all", keys, None
    spec, what = (seed, "cache.seed") if seed else (warm, "cache.warm_start")
    if warm != "none" and not warm.startswith("hotlist("):
        raise ConfigError(f"cache.warm_start={warm!r} is not one of {WARM_STARTS}")
    parsed = hotlist_lib.parse_seed(spec, what)
    if parsed is None:
        return None
    hot = hotlist_lib.from_trace(parsed["trace"])
    hot.check_against(list(cache.shape.layers), cache.shape.num_experts)
    if parsed["top"] is not None:
        hot = hot.top(parsed["top"])
    return f"{what}={spec}", hot.source, list(hot.keys), (hot.priorities() if seed else None)


def seed_cache(c: CacheSpec, cache: ExpertCache) -> dict | None:
    """Applies `cache.seed` or `cache.warm_start` before the first pass: the experts fill the
    device slots and the host tier (loaded before the first token, not counted as fetches),
    and a seed's priorities go to the policies that take them. Returns results.json's
    `cache.seed` (None when nothing is placed)."""
    placement = _placement(c, cache)
    if placement is None:
        return None
    spec, source, keys, priorities = placement
    device = cache.seed(keys, priorities)
    host = 0
    if cache.host is not None:
        if priorities is not None and hasattr(cache.host.policy, "set_priorities"):
            cache.host.policy.set_priorities(priorities)
        cache.host.seed(keys)
        host = cache.host.seeded
    return {"spec": spec, "source": source, "experts": len(keys), "device_seeded": device,
            "host_seeded": host,
            "priority_policy": priorities is not None and hasattr(cache.eviction,
                                                                   "set_priorities")}


def build_cache(run: RunSpec, shape: CacheShape,
                model_cfg: ModelConfig | None, renormalize: bool,
                specs: dict[str, str] | None = None, policies=None,
                driven: bool | None = None) -> ExpertCache:
    """The cache of a given `shape` (`policies`: the four already built, else from the
    run's / `specs`), with its host tier, full layers and seed. On the virtual clock with a
    model, a profile with the host's work (`run.hardware.host_work`) times the live runtime
    (`RuntimeTiming`; `driven`: the run follows a trace's routing, None: `run.trace_driven`)."""
    eviction, prefetch, miss, routing = (policies if policies is not None else
                                         build_policies(run, shape, renormalize, specs))
    hw = run.hardware.device
    kind = clock_kind(run.hardware)
    cost = (CostModel.shared(model_cfg, hw) if (model_cfg is not None and kind == "virtual")
            else None)
    work = run.hardware.host_work if cost is not None else None
    timing = None
    if kind == "wall":
        clock = WallClock(hw)
    elif work is None:
        clock = VirtualClock(hw)
    else:
        clock = HostDeviceClock(hw)
        timing = RuntimeTiming(work, cost,
                               trace_driven=run.trace_driven if driven is None else driven,
                               speculate=run.cache.speculate)
    if run.cache.prefetch_share and prefetch.name == "none":
        raise ConfigError(f"cache.prefetch_share={run.cache.prefetch_share} sets slots apart for "
                          "prefetches, but policies.prefetch is none: set a prefetcher or "
                          "leave the share at 0")
    host = build_host_tier(run, shape, shape.expert_bytes, renormalize)
    host_compute_layers = run.cache.host_compute_layers
    host_path = None  # (without a model the cache says what host compute needs)
    if (miss.computes_on_host or host_compute_layers) and model_cfg is not None:
        host_path = HostPath(run.hardware.host_cpu, hw, model_cfg, shape.expert_bytes)
    options = CacheOptions(
        clock, cost, lookahead_scores=max(1, prefetch.lookahead) if model_cfg else 0,
        pin_scope=run.cache.pin_scope, prefetch_queue=run.cache.prefetch_queue, host=host,
        full_layers=run.cache.full_layers, host_path=host_path,
        host_compute_layers=host_compute_layers, timing=timing,
        prefetch_share=run.cache.prefetch_share,
        prefetch_share_use=run.cache.prefetch_share_use)
    cache = ExpertCache(shape, eviction, prefetch, miss, routing, options)
    cache.seeding = seed_cache(run.cache, cache)
    return cache


def model_bytes_of(cfg: ModelConfig | None) -> int | None:
    """The whole model's native bytes (None without a model): `ModelConfig.model_bytes`."""
    return None if cfg is None else cfg.model_bytes


def build_cache_for(run: RunSpec, model_cfg: ModelConfig | None,
                    precision_bytes: dict[str, int], renormalize: bool,
                    specs: dict[str, str] | None = None, *, layers=None,
                    num_layers: int | None = None, num_experts: int | None = None,
                    top_k: int | None = None, driven: bool | None = None) -> ExpertCache:
    """The expert cache of a run, live or replayed.

    `precision_bytes`: bytes of one routed expert at each precision the source has (live: the
    checkpoint's; replay: `capacity.precision_bytes_of` of the model config, or only
    `{"native": bytes}` when no model is known). The shape (`layers` in pass order, all
    `num_layers` decoder layers, `num_experts`, `top_k`) comes from `model_cfg` unless given
    (a trace without a model config). `specs`: the four policy specs, when the job adjusted
    the run's choice."""
    if model_cfg is not None:
        layers = tuple(model_cfg.moe_layers) if layers is None else layers
        num_layers = model_cfg.num_layers if num_layers is None else num_layers
        num_experts = model_cfg.num_experts if num_experts is None else num_experts
        top_k = model_cfg.top_k if top_k is None else top_k
    if None in (layers, num_layers, num_experts, top_k):
        raise ValueError("build_cache_for needs a model config or the shape "
                         "(layers, num_layers, num_experts, top_k)")
    specs = specs if specs is not None else presets.resolve(run.policies)
    given = run.cache.precision
    available = [p for p in formats.PRECISIONS if p in precision_bytes]
    if given and given not in precision_bytes:
        raise ConfigError(f"cache.precision={given}: this source has no {given} experts (it has "
                          f"{available})")
    context = dict(num_layers=len(layers), num_experts=num_experts, top_k=top_k,
                   seed=run.seed, renormalize=renormalize)
    miss = build("miss", specs["miss"], **context, cache_precision=given)
    levels = tuple(miss.levels)
    missing = [p for p in levels if p not in precision_bytes]
    if missing:
        raise ConfigError(f"miss policy {specs['miss']!r} fetches at {list(levels)}, but this "
                          f"source has no {missing} experts (it has {available}); set "
                          "cache.precision or the policy's levels to those it has")
    c = run.cache
    slots = c.given_slots
    budget = capacity_lib.pools_for(
        in_use=levels, precision_bytes=precision_bytes,
        total_experts=num_experts * len(layers), top_k=top_k,
        capacity_frac=None if slots is not None else c.capacity_frac, slots=slots,
        min_slots=c.min_slots, capacity_of=c.capacity_of,
        model_bytes=model_bytes_of(model_cfg), shares=c.precision_shares)
    shape = CacheShape.with_pools(layers, num_layers, num_experts, top_k, budget.pools, budget,
                                  precision_bytes)
    ctx = policy_context(shape, renormalize, run.seed)
    policies = (build("eviction", specs["eviction"], **ctx),
                build("prefetch", specs["prefetch"], **ctx), miss,
                build("routing", specs["routing"], **ctx))
    return build_cache(run, shape, model_cfg, renormalize, policies=policies, driven=driven)


