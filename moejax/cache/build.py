"""Builds an `ExpertCache` (and, live, its `CachedExperts`) from the job config groups
`cache`, `policies`, `hardware` and `clock`."""

from __future__ import annotations

import jax
import ml_collections

from moejax.cache.cache import CacheShape, ExpertCache, slots_for
from moejax.cache.runtime import CachedExperts, SlotPool
from moejax.config import ConfigError, ModelConfig
from moejax.models.stepped import ResidentExperts
from moejax.policies import build, presets
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
    return dict(num_layers=len(shape.layers), num_experts=shape.num_experts, top_k=shape.top_k,
                num_slots=shape.num_slots, seed=seed, renormalize=cfg_router_renorm)


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
                specs: dict[str, str] | None = None) -> ExpertCache:
    eviction, prefetch, miss, routing = build_policies(config, shape, renormalize, specs)
    hw = hardware_from(config)
    kind = clock_kind(config)
    clock = VirtualClock(hw) if kind == "virtual" else WallClock(hw)
    cost = CostModel(model_cfg, hw) if (model_cfg is not None and kind == "virtual") else None
    return ExpertCache(shape, eviction, prefetch, miss, routing, clock, cost,
                       lookahead_scores=max(1, prefetch.lookahead) if model_cfg else 0,
                       pin_scope=config.cache.pin_scope)


def build_cached_experts(config: ml_collections.ConfigDict, cfg: ModelConfig, host_gate_up,
                         host_down) -> CachedExperts:
    if config.cache.pin_scope != "layer":
        raise ConfigError(f"cache.pin_scope={config.cache.pin_scope!r}: a live run computes a "
                          "layer's experts as one grouped matmul, so they must be resident "
                          "together (pin_scope='layer'); 'request' is for replay")
    s = num_slots(config, cfg.num_moe_layers, cfg.num_experts, cfg.top_k, cfg.expert_bytes)
    shape = CacheShape(tuple(cfg.moe_layers), cfg.num_layers, cfg.num_experts, cfg.top_k,
                       cfg.expert_bytes, s)
    cache = build_cache(config, shape, cfg, cfg.norm_topk_prob)
    for policy in cache.policies():
        if policy.replay_only:
            raise ConfigError(f"{policy.kind} policy {policy.name!r} needs the future routing: "
                              "it runs in trace replay only (configs/replay.py)")
    return CachedExperts(cache, SlotPool(s, host_gate_up, host_down), cfg.num_experts)


def expert_source(config: ml_collections.ConfigDict, loaded):
    """The cache runtime for a loaded model, or every expert on the device when
    `cache.enabled` is False."""
    if not config.cache.enabled:
        return ResidentExperts.from_host(loaded.host_gate_up, loaded.host_down)
    return build_cached_experts(config, loaded.cfg, loaded.host_gate_up, loaded.host_down)
