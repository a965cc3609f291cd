"""Builds an `ExpertCache` (and, live, its `CachedExperts`) from the job config groups
`cache`, `policies`, `hardware` and `clock`.

`build_cache_for` is the one way replay and live runs build their cache: it resolves the
policies, the plain precision (`cache.precision`, or the first of the miss policy's levels
when not given), the precision pools and their slots (`moejax/cache/capacity.py`) from the
bytes of one expert at each precision the source has (`precision_bytes`: a checkpoint's,
live; `capacity.precision_bytes_of(model config)`, replay).
"""

from __future__ import annotations

import functools
import json

import jax
import ml_collections

from moejax.cache import capacity as capacity_lib
from moejax.cache.cache import CacheShape, ExpertCache, slots_for
from moejax.cache.runtime import CachedExperts, SlotPools
from moejax.config import ConfigError, ModelConfig
from moejax.models.stepped import ResidentExperts
from moejax.policies import build, presets
from moejax.quant import formats
from moejax.sim import hardware as hw_lib
from moejax.sim.clock import VirtualClock, WallClock
from moejax.sim.cost import CostModel

CLOCKS = ("auto", "virtual", "wall")


def hardware_from(config: ml_collections.ConfigDict) -> hw_lib.Hardware:
    """The `hardware.preset` profile with the group's overrides: a field left None keeps the
    preset's value, any given value (0 included) replaces it and is validated."""
    h = config.hardware
    return hw_lib.get(h.preset, **{k: h[k] for k in hw_lib.OVERRIDABLE if k in h})


def clock_kind(config: ml_collections.ConfigDict) -> str:
    kind = config.clock.kind
    if kind not in CLOCKS:
        raise ConfigError(f"clock.kind={kind!r} is not one of {CLOCKS}")
    if kind == "auto":  # DESIGN.md: virtual off-GPU (deterministic), wall on a GPU
        return "wall" if jax.default_backend() == "gpu" else "virtual"
    return kind


def num_slots(config: ml_collections.ConfigDict, layers: int, num_experts: int, top_k: int,
              expert_bytes: int) -> int:
    """The slot count of a single native pool with `capacity_of="experts"` (what
    `build_cache_for` computes in that case; kept for callers that need only the number)."""
    c = config.cache
    slots = c.slots if c.slots > 0 else None
    frac = None if slots is not None else c.capacity_frac
    if c.min_slots < 0:
        raise ConfigError(f"cache.min_slots={c.min_slots} must be >= 0")
    if c.min_slots:
        wanted = slots if slots is not None else int(frac * layers * num_experts)
        slots, frac = max(wanted, c.min_slots), None
    return slots_for(layers * num_experts, top_k, expert_bytes, frac, slots)


def policy_context(shape: CacheShape, cfg_router_renorm: bool, seed: int) -> dict:
    """What the registry hands to policy constructors that declare it (`cache_precision`: the
    plain precision, the first pool's; not `precision`, a user argument of `noisy_oracle`)."""
    return dict(num_layers=len(shape.layers), num_experts=shape.num_experts, top_k=shape.top_k,
                num_slots=shape.num_slots, seed=seed, renormalize=cfg_router_renorm,
                cache_precision=shape.precision)


def build_policies(config: ml_collections.ConfigDict, shape: CacheShape, renormalize: bool,
                   specs: dict[str, str] | None = None):
    """The four policies: `specs` when given (a job that adjusted them), else the specs
    `presets.resolve` makes of the config's `policies` group."""
    ctx = policy_context(shape, renormalize, config.seed)
    p = specs if specs is not None else presets.resolve(config.policies)
    return (build("eviction", p["eviction"], **ctx), build("prefetch", p["prefetch"], **ctx),
            build("miss", p["miss"], **ctx), build("routing", p["routing"], **ctx))


def build_cache(config: ml_collections.ConfigDict, shape: CacheShape,
                model_cfg: ModelConfig | None, renormalize: bool,
                specs: dict[str, str] | None = None, policies=None) -> ExpertCache:
    """The cache of a given `shape` (`policies`: the four already built, else from the
    config / `specs`)."""
    eviction, prefetch, miss, routing = (policies if policies is not None else
                                         build_policies(config, shape, renormalize, specs))
    hw = hardware_from(config)
    kind = clock_kind(config)
    clock = VirtualClock(hw) if kind == "virtual" else WallClock(hw)
    cost = CostModel(model_cfg, hw) if (model_cfg is not None and kind == "virtual") else None
    return ExpertCache(shape, eviction, prefetch, miss, routing, clock, cost,
                       lookahead_scores=max(1, prefetch.lookahead) if model_cfg else 0,
                       pin_scope=config.cache.pin_scope,
                       prefetch_queue=config.cache.get("prefetch_queue", "immediate"))


def given_precision(config: ml_collections.ConfigDict) -> str:
    """`cache.precision` as given ("" when not given)."""
    p = config.cache.get("precision", "") or ""
    return formats.check(p, "cache.precision") if p else ""


@functools.lru_cache(maxsize=32)
def _model_bytes(cfg_json: str) -> int:
    return capacity_lib.model_bytes(ModelConfig.from_dict(json.loads(cfg_json)))


def model_bytes_of(cfg: ModelConfig | None) -> int | None:
    """The whole model's native bytes (None without a model), computed once per config."""
    return None if cfg is None else _model_bytes(cfg.to_json())


def build_cache_for(config: ml_collections.ConfigDict, model_cfg: ModelConfig | None,
                    precision_bytes: dict[str, int], renormalize: bool,
                    specs: dict[str, str] | None = None, *, layers=None,
                    num_layers: int | None = None, num_experts: int | None = None,
                    top_k: int | None = None) -> ExpertCache:
    """The expert cache of a run, live or replayed.

    `precision_bytes`: bytes of one routed expert at each precision the source has (live: the
    checkpoint's; replay: `capacity.precision_bytes_of` of the model config, or only
    `{"native": bytes}` when no model is known). The shape (`layers` in pass order, all
    `num_layers` decoder layers, `num_experts`, `top_k`) comes from `model_cfg` unless given
    (a trace without a model config). `specs`: the four policy specs, when the job adjusted
    the config's choice."""
    if model_cfg is not None:
        layers = tuple(model_cfg.moe_layers) if layers is None else layers
        num_layers = model_cfg.num_layers if num_layers is None else num_layers
        num_experts = model_cfg.num_experts if num_experts is None else num_experts
        top_k = model_cfg.top_k if top_k is None else top_k
    if None in (layers, num_layers, num_experts, top_k):
        raise ValueError("build_cache_for needs a model config or the shape "
                         "(layers, num_layers, num_experts, top_k)")
    specs = specs if specs is not None else presets.resolve(config.policies)
    given = given_precision(config)
    available = [p for p in formats.PRECISIONS if p in precision_bytes]
    if given and given not in precision_bytes:
        raise ConfigError(f"cache.precision={given}: this source has no {given} experts (it has "
                          f"{available})")
    context = dict(num_layers=len(layers), num_experts=num_experts, top_k=top_k,
                   seed=config.seed, renormalize=renormalize)
    miss = build("miss", specs["miss"], **context, cache_precision=given)
    levels = tuple(miss.levels)
    missing = [p for p in levels if p not in precision_bytes]
    if missing:
        raise ConfigError(f"miss policy {specs['miss']!r} fetches at {list(levels)}, but this "
                          f"source has no {missing} experts (it has {available}); set "
                          "cache.precision or the policy's levels to those it has")
    c = config.cache
    slots = c.slots if c.slots > 0 else None
    capacity_of = c.get("capacity_of", "experts")
    budget = capacity_lib.pools_for(
        in_use=levels, precision_bytes=precision_bytes,
        total_experts=num_experts * len(layers), top_k=top_k,
        capacity_frac=None if slots is not None else c.capacity_frac, slots=slots,
        min_slots=c.min_slots, capacity_of=capacity_of,
        model_bytes=model_bytes_of(model_cfg), shares=c.get("precision_shares", ""))
    shape = CacheShape.with_pools(layers, num_layers, num_experts, top_k, budget.pools, budget,
                                  precision_bytes)
    ctx = policy_context(shape, renormalize, config.seed)
    policies = (build("eviction", specs["eviction"], **ctx),
                build("prefetch", specs["prefetch"], **ctx), miss,
                build("routing", specs["routing"], **ctx))
    return build_cache(config, shape, model_cfg, renormalize, policies=policies)


def build_cached_experts(config: ml_collections.ConfigDict, loaded) -> CachedExperts:
    """The live cache runtime over `loaded` (a `moejax.model_source.LoadedModel`): the cache
    sized from the bytes of the precisions the model has, and one device slot pool per
    precision the cache uses, fed from the host tables at that precision."""
    if config.cache.pin_scope != "layer":
        raise ConfigError(f"cache.pin_scope={config.cache.pin_scope!r}: a live run computes a "
                          "layer's experts as one grouped matmul, so they must be resident "
                          "together (pin_scope='layer'); 'request' is for replay")
    cfg = loaded.cfg
    cache = build_cache_for(config, cfg, loaded.precision_bytes(), cfg.norm_topk_prob)
    for policy in cache.policies():
        if policy.replay_only:
            raise ConfigError(f"{policy.kind} policy {policy.name!r} needs the future routing: "
                              "it runs in trace replay only (configs/replay.py)")
    return CachedExperts(cache, SlotPools.for_shape(cache.shape, loaded.experts_at),
                         cfg.num_experts)


def resident_precision(config: ml_collections.ConfigDict) -> str:
    """The precision every expert runs at when `cache.enabled` is False."""
    return given_precision(config) or "native"


def expert_source(config: ml_collections.ConfigDict, loaded):
    """The cache runtime for a loaded model, or every expert on the device (at
    `cache.precision`) when `cache.enabled` is False."""
    if not config.cache.enabled:
        return ResidentExperts.from_host(*loaded.experts_at(resident_precision(config)))
    return build_cached_experts(config, loaded)
