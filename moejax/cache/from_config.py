"""Builds an `ExpertCache` from the job config groups `cache`, `policies`, `hardware`, `clock`
and `storage` — the one way replay and live runs build their cache (the live runtime around it
is `moejax.serving.build`).

`build_cache_for` resolves the policies, the plain precision (`cache.precision`, or the first of
the miss policy's levels when not given), the precision pools and their slots
(`moejax/cache/capacity.py`) from the bytes of one expert at each precision the source has
(`precision_bytes`: a checkpoint's, live; `capacity.precision_bytes_of(model config)`, replay),
then the clock, the cost model, the host tier and the placement.

`check_settings` checks those groups' fields (and `io`) first, against what each field means:
a value outside it is a `ConfigError` naming `field=value` and what the field takes, and a
setting given that does not apply to the run (storage without a host tier, io in a replay) is
one warning line on stderr, said once per config.
"""

from __future__ import annotations

import functools
import json
import math
import weakref

import ml_collections

from moejax import errors
from moejax.cache import capacity as capacity_lib
from moejax.cache.cache_options import CacheOptions
from moejax.cache.capacity import CacheShape, slots_for
from moejax.cache.expert_cache import ExpertCache
from moejax.cache.host_path import HostPath
from moejax.cache.host_tier import HostTier
from moejax.cache.runtime_timing import RuntimeTiming
from moejax.errors import ConfigError
from moejax.model_config import ModelConfig
from moejax.policies import build, presets
from moejax.policies import check as check_policy
from moejax.policies.registry import policy_class
from moejax.quant import formats
from moejax.timing import hardware as hw_lib
from moejax.timing import host as host_lib
from moejax.timing import host_work as host_work_lib
from moejax.timing import storage as storage_lib
from moejax.timing.clock import HostDeviceClock, VirtualClock, WallClock
from moejax.timing.cost import CostModel

CLOCKS = ("auto", "virtual", "wall")


def hardware_from(config: ml_collections.ConfigDict) -> hw_lib.Hardware:
    """The `hardware.file` profile (a hardware.json of `python -m moejax.calibration`) when
    given, else the `hardware.preset` profile, with the group's overrides: a field left None
    keeps the profile's value, any given value (0 included) replaces it and is validated. A
    preset given beside a file does not apply (`check_settings` warns)."""
    h = config.hardware
    overrides = {k: h[k] for k in hw_lib.OVERRIDABLE if k in h}
    path = h.get("file", "") or ""
    if path:
        return hw_lib.from_file(path, **overrides)
    return hw_lib.get(h.preset, **overrides)


def host_cpu_from(config: ml_collections.ConfigDict) -> host_lib.HostCPU:
    """The host CPU that computes missed experts: the `host` section of the `hardware.file`
    (a calibration's measurement of its host) when given and the file has one, else the
    `host.preset` profile; with the group's overrides on top (None keeps the profile's). As
    for `hardware.preset`, a `host.preset` given beside a file with a host section does not
    apply (`check_settings` warns): the file measured the host the run is on."""
    h = config.host
    overrides = {k: h[k] for k in host_lib.OVERRIDABLE if k in h}
    path = config.hardware.get("file", "") or ""
    if path:
        measured = host_lib.from_file(path, **overrides)
        if measured is not None:
            return measured
    return host_lib.get(h.preset, **overrides)


def host_work_from(config: ml_collections.ConfigDict) -> host_work_lib.HostWork | None:
    """The host's work the virtual clock charges (`moejax.cache.runtime_timing`): the
    `host_work` section of `hardware.file`; None for a preset, a file without one, or
    `clock.host_work=False` (the device-only model: roofline and transfers)."""
    path = config.hardware.get("file", "") or ""
    if not path or not config.clock.get("host_work", True):
        return None
    return host_work_lib.from_file(path)


def trace_driven(config: ml_collections.ConfigDict) -> bool:
    """Whether the run the cache times follows a trace's routing: a replay (what it times is
    the trace-driven run of its trace), or `policies.routing='trace(...)'`."""
    routing = presets.resolve(config.policies)["routing"]
    return config.job == "replay" or policy_class("routing", routing).name == "trace"


def computes_on_host(config: ml_collections.ConfigDict) -> bool:
    """Whether a run computes experts on the host (a miss policy that does, or
    `cache.host_compute_layers`)."""
    miss = presets.resolve(config.policies)["miss"]
    return (policy_class("miss", miss).computes_on_host
            or config.cache.get("host_compute_layers", 0) > 0)


# `cache.load_path` (moejax/serving/slot_pool.py: LOAD_PATHS; the cache package loads no JAX).
LOAD_PATHS = ("auto", "fused", "copy_stream")


def clock_kind(config: ml_collections.ConfigDict) -> str:
    kind = config.clock.kind
    if kind not in CLOCKS:
        raise ConfigError(f"clock.kind={kind!r} is not one of {CLOCKS}")
    if kind == "auto":  # DESIGN.md: virtual off-GPU (deterministic), wall on a GPU
        import jax  # (only here: the cache itself is numpy)

        return "wall" if jax.default_backend() == "gpu" else "virtual"
    return kind


def num_slots(config: ml_collections.ConfigDict, layers: int, num_experts: int, top_k: int,
              expert_bytes: int) -> int:
    """The slot count of a single native pool with `capacity_of="experts"` (what
    `build_cache_for` computes in that case; kept for callers that need only the number)."""
    c = config.cache
    slots = given_slots(config)
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


def storage_from(config: ml_collections.ConfigDict) -> storage_lib.Storage:
    """The `storage.preset` profile with the group's overrides (None keeps the preset's)."""
    s = config.storage
    return storage_lib.get(s.preset, **{k: s[k] for k in storage_lib.OVERRIDABLE if k in s})


def host_tier_enabled(config: ml_collections.ConfigDict) -> bool:
    """Whether experts stay on storage behind a bounded host tier (`cache.host_bytes`, or
    `cache.host_capacity_frac` below 1)."""
    c = config.cache
    frac, nbytes = c.get("host_capacity_frac", 1.0), c.get("host_bytes", 0)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ConfigError(f"cache.host_capacity_frac={frac!r} must be in (0, 1] (1.0: every "
                          "expert in host memory, no storage tier)")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ConfigError(f"cache.host_bytes={nbytes!r} must be an integer >= 0 (0: use "
                          "cache.host_capacity_frac)")
    return nbytes > 0 or frac < 1


def _count(value, field: str, lo: int, meaning: str) -> int:
    """`value` of an integer field that takes `lo` and up (`meaning`: what it takes, for the
    message)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{field}={value!r} must be {meaning}")
    return value


def given_slots(config: ml_collections.ConfigDict) -> int | None:
    """`cache.slots` when given (None: 0, the default, lets `cache.capacity_frac` size the
    cache). A negative count is an error, not "not set"."""
    slots = _count(config.cache.slots, "cache.slots", 0,
                   "a slot count >= 1, or 0 (the schema's default: cache.capacity_frac sizes "
                   "the cache)")
    return slots or None


def check_settings(config: ml_collections.ConfigDict, *, live: bool | None = None,
                   defaults: ml_collections.ConfigDict | None = None) -> None:
    """Checks the fields that feed the cache, the clocks, storage, io and the policies against
    what each means, before anything runs: a value outside it is a ConfigError naming
    `field=value` and what the field takes, whether or not this run uses the field; each
    policy's name and arguments against the values it declares (`moejax.policies.check`).
    Limits that need the model (a slot count above its experts, a prefetch lookahead beyond
    its MoE layers) are checked where the model is known (`capacity.pools_for`,
    `build_host_tier`, the policy's constructor).

    Then, given `defaults` (the schema's `base_config()`: `moejax.jobs.run` passes it; the
    cache does not import the jobs), a setting that is given (not the schema's default) but
    does not apply to this run gets one warning line on stderr, once per config
    (`warn_once`). `live`: True for a run of the model, False for a replay, None when the
    caller does not know (only the warnings that hold either way)."""
    c = config.cache
    given_slots(config)
    frac = c.capacity_frac
    if (isinstance(frac, bool) or not isinstance(frac, (int, float))
            or not 0 < frac <= 1):  # nan fails too
        raise ConfigError(f"cache.capacity_frac={frac!r} must be in (0, 1]: the fraction of "
                          "cache.capacity_of's bytes the cache holds")
    _count(c.min_slots, "cache.min_slots", 0,
           "an integer >= 0 (a floor on each pool's slots; 0, the default: no floor)")
    _count(c.group_size, "cache.group_size", 1, "an integer >= 1 (a quantization group's length)")
    _count(c.expert_bytes, "cache.expert_bytes", 0,
           "an integer >= 0 (bytes of one expert; 0, the default: from the trace or the model)")
    if c.capacity_of not in capacity_lib.CAPACITY_OF:
        raise ConfigError(f"cache.capacity_of={c.capacity_of!r} is not one of "
                          f"{capacity_lib.CAPACITY_OF}")
    if c.get("load_path", "auto") not in LOAD_PATHS:
        raise ConfigError(f"cache.load_path={c.load_path!r} is not one of {LOAD_PATHS}: how a "
                          "live slot load moves an expert")
    if config.clock.kind not in CLOCKS:
        raise ConfigError(f"clock.kind={config.clock.kind!r} is not one of {CLOCKS}")
    if not isinstance(config.clock.get("host_work", True), bool):
        raise ConfigError(f"clock.host_work={config.clock.host_work!r} must be True or False")
    _count(c.get("host_compute_layers", 0), "cache.host_compute_layers", 0,
           "an integer >= 0 (the first MoE layers whose experts always run on the host; 0, "
           "the default: none)")
    host_tier_enabled(config)
    hardware_from(config)
    host_cpu_from(config)
    storage_from(config)
    _check_io(config)
    for kind, spec in presets.resolve(config.policies).items():
        check_policy(kind, spec)
    try:
        check_policy("eviction", c.host_eviction)
    except ConfigError as e:
        raise ConfigError(f"cache.host_eviction: {e}") from e
    if defaults is None:
        return
    warn_unapplied(config, _not_applying(config, live, defaults))


def warn_unapplied(config: ml_collections.ConfigDict, unapplied) -> None:
    """One warning for each `(field, why)`: `field=value does not apply: why`."""
    for field, why in unapplied:
        warn_once(config, f"{field}={_shown(config, field)} does not apply: {why}")


def _check_io(config: ml_collections.ConfigDict) -> None:
    """`io.*` checked as the live reader would, where no reader is built too."""
    from moejax.checkpoint.expert_reader import IO_MODES, check_io  # (jax: only here)

    check_io(config.io.split, config.io.workers)
    if config.io.mode not in IO_MODES:
        raise ConfigError(f"io.mode={config.io.mode!r} is not one of {IO_MODES}")


# Fields a run of the model does not read (replay sizes experts by them; its engine,
# `replay.engine`, is in the replay job's own section: `moejax.jobs.schema.READ_BY`).
REPLAY_ONLY = ("cache.group_size", "cache.expert_bytes")
HOST_TIER = ("cache.host_eviction",)
STORAGE = tuple(f"storage.{k}" for k in ("preset", *storage_lib.OVERRIDABLE))
HOST_CPU = tuple(f"host.{k}" for k in ("preset", *host_lib.OVERRIDABLE))
IO = ("io.split", "io.workers", "io.mode")


def field_value(config: ml_collections.ConfigDict, field: str):
    """The value of dotted `field` (`cache.slots`) in `config`."""
    for part in field.split("."):
        config = config[part]
    return config


def _not_applying(config: ml_collections.ConfigDict, live: bool | None,
                  defaults: ml_collections.ConfigDict):
    """`(field, why)` for each setting given (other than in `defaults`) that this run does not
    use. A field left at its default is not "given", even where a config file restated it."""
    def given(config, field):
        return field_value(config, field) != field_value(defaults, field)

    c = config.cache
    out = []
    if live and not c.enabled:
        why = "cache.enabled=False puts every expert on the device"
        fields = [f"cache.{k}" for k in c.keys() if k not in ("enabled", "precision")]
        fields += [f"policies.{k}" for k in config.policies.keys()]
        fields += list(STORAGE + IO + HOST_CPU)
        return [(f, why) for f in fields if given(config, f)]
    if not host_tier_enabled(config):
        why = (f"this run has no host tier (cache.host_capacity_frac="
               f"{_shown(config, 'cache.host_capacity_frac')}: every expert in host memory)")
        out += [(f, why) for f in HOST_TIER + STORAGE if given(config, f)]
        if live is not False:  # (a replay's io.* is said below)
            out += [(f, why + ", so no expert is read from storage") for f in IO
                    if given(config, f)]
    if live is False:
        out += [(f, "a replay reads no checkpoint (io.* sets the live runtime's expert reader)")
                for f in IO if given(config, f)]
        moved = ("cache.load_path", "cache.speculate_from_host") + (
            () if host_work_from(config) is not None else ("cache.speculate",))
        out += [(f, "a replay moves no expert bytes") for f in moved if given(config, f)]
    if live:
        out += [(f, "a run of the model takes its experts' sizes from the checkpoint and runs "
                    "no replay engine") for f in REPLAY_ONLY if given(config, f)]
    if given(config, "clock.host_work") and host_work_from(
            _with_host_work(config)) is None:
        out.append(("clock.host_work", "no hardware.file with a host_work section "
                    "(python -m moejax.calibration writes one): the device-only model runs"))
    if config.hardware.get("file", "") and given(config, "hardware.preset"):
        out.append(("hardware.preset",
                    f"hardware.file={config.hardware.file!r} gives the profile"))
    if (config.hardware.get("file", "") and given(config, "host.preset")
            and host_lib.from_file(config.hardware.file) is not None):
        out.append(("host.preset", f"hardware.file={config.hardware.file!r} gives the host "
                                   "profile (its host section)"))
    if not computes_on_host(config):
        why = (f"no expert is computed on the host (policies.miss="
               f"{presets.resolve(config.policies)['miss']}, cache.host_compute_layers=0)")
        out += [(f, why) for f in HOST_CPU if given(config, f)]
    if not c.get("speculate", True) and given(config, "cache.speculate_from_host"):
        out.append(("cache.speculate_from_host", "cache.speculate=False: no pass speculates"))
    if c.slots > 0:  # (with cache.capacity_frac given too: an error, `jobs.CONFLICTS`)
        out += [(f, f"cache.slots={c.slots} sets the slot count")
                for f in ("cache.capacity_of",) if given(config, f)]
    return out


def _with_host_work(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(config.to_dict())
    c.clock.host_work = True
    return c


def _shown(config: ml_collections.ConfigDict, field: str) -> str:
    value = field_value(config, field)
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


# Warnings already printed, per config object (id -> (weak reference, messages)): a job
# builds its cache more than once (generate's warm-up), but a warning is said once.
_WARNED: dict[int, tuple[weakref.ref, set[str]]] = {}


def warn_once(config: ml_collections.ConfigDict, message: str) -> None:
    entry = _WARNED.get(id(config))
    if entry is None or entry[0]() is not config:
        for key in [k for k, (ref, _) in _WARNED.items() if ref() is None]:
            del _WARNED[key]
        entry = _WARNED[id(config)] = (weakref.ref(config), set())
    if message not in entry[1]:
        entry[1].add(message)
        errors.warn(message)


def warned(config: ml_collections.ConfigDict) -> list[str]:
    """The warnings said for `config` (`warn_once`), sorted: results.json's `warnings`."""
    entry = _WARNED.get(id(config))
    return sorted(entry[1]) if entry is not None and entry[0]() is config else []


def build_host_tier(config: ml_collections.ConfigDict, shape: CacheShape,
                    read_bytes: int, renormalize: bool) -> HostTier | None:
    """The host tier of a run whose experts stay on storage (None: every expert in host
    memory). It holds experts at the cache's one precision, `read_bytes` each."""
    if not host_tier_enabled(config):
        return None
    c = config.cache
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
    ctx = {**policy_context(shape, renormalize, config.seed), "num_slots": capacity}
    try:
        policy = build("eviction", spec, **ctx)
    except ConfigError as e:  # ("eviction policy ..." alone would not say which of the two)
        raise ConfigError(f"cache.host_eviction: {e}") from e
    if policy.needs_future or policy.needs_probs:
        raise ConfigError(f"cache.host_eviction={spec!r} reads "
                          f"{'the future routing' if policy.needs_future else 'router scores'}, "
                          "which the host tier does not see; choose one that does not "
                          "(lru, lru_per_layer, fifo, lfu, least_stale, priority, ...)")
    return HostTier(capacity, read_bytes, policy, storage_lib.StorageQueue(storage_from(config)),
                    list(shape.layers), spec)


WARM_STARTS = ("none", "all", "hotlist(trace=PATH, top=N)")


def _placement(config: ml_collections.ConfigDict, cache: ExpertCache):
    """What to place before the first pass: `(spec, source, keys hottest first, priorities or
    None)`, from `cache.seed` (ds4: placement and priorities) or `cache.warm_start` (a preload
    only); None when neither is set."""
    from moejax.cache import hotlist as hotlist_lib

    seed = config.cache.get("seed", "") or ""
    warm = config.cache.get("warm_start", "none") or "none"
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


def seed_cache(config: ml_collections.ConfigDict, cache: ExpertCache) -> dict | None:
    """Applies `cache.seed` or `cache.warm_start` before the first pass: the experts fill the
    device slots and the host tier (loaded before the first token, not counted as fetches),
    and a seed's priorities go to the policies that take them. Returns results.json's
    `cache.seed` (None when nothing is placed)."""
    placement = _placement(config, cache)
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


def build_cache(config: ml_collections.ConfigDict, shape: CacheShape,
                model_cfg: ModelConfig | None, renormalize: bool,
                specs: dict[str, str] | None = None, policies=None,
                driven: bool | None = None) -> ExpertCache:
    """The cache of a given `shape` (`policies`: the four already built, else from the
    config / `specs`), with its host tier, full layers and seed. On the virtual clock with a
    model, a profile with the host's work (`host_work_from`) times the live runtime
    (`RuntimeTiming`; `driven`: the run follows a trace's routing, None: `trace_driven`)."""
    eviction, prefetch, miss, routing = (policies if policies is not None else
                                         build_policies(config, shape, renormalize, specs))
    hw = hardware_from(config)
    kind = clock_kind(config)
    cost = CostModel(model_cfg, hw) if (model_cfg is not None and kind == "virtual") else None
    work = host_work_from(config) if cost is not None else None
    timing = None
    if kind == "wall":
        clock = WallClock(hw)
    elif work is None:
        clock = VirtualClock(hw)
    else:
        clock = HostDeviceClock(hw)
        timing = RuntimeTiming(work, cost,
                               trace_driven=trace_driven(config) if driven is None else driven,
                               speculate=bool(config.cache.get("speculate", True)))
    host = build_host_tier(config, shape, shape.expert_bytes, renormalize)
    host_compute_layers = config.cache.get("host_compute_layers", 0)
    host_path = None  # (without a model the cache says what host compute needs)
    if (miss.computes_on_host or host_compute_layers) and model_cfg is not None:
        host_path = HostPath(host_cpu_from(config), hw, model_cfg, shape.expert_bytes)
    options = CacheOptions(
        clock, cost, lookahead_scores=max(1, prefetch.lookahead) if model_cfg else 0,
        pin_scope=config.cache.pin_scope,
        prefetch_queue=config.cache.get("prefetch_queue", "immediate"), host=host,
        full_layers=config.cache.get("full_layers", 0), host_path=host_path,
        host_compute_layers=host_compute_layers, timing=timing)
    cache = ExpertCache(shape, eviction, prefetch, miss, routing, options)
    cache.seeding = seed_cache(config, cache)
    return cache


def given_precision(config: ml_collections.ConfigDict) -> str:
    """`cache.precision` as given ("" when not given)."""
    p = config.cache.get("precision", "") or ""
    return formats.check(p, "cache.precision") if p else ""


@functools.lru_cache(maxsize=32)
def _model_bytes(cfg_json: str) -> int:
    from moejax.models import sizes  # the decoder's abstract shapes (flax)

    return sizes.model_bytes(ModelConfig.from_dict(json.loads(cfg_json)))


def model_bytes_of(cfg: ModelConfig | None) -> int | None:
    """The whole model's native bytes (None without a model), computed once per config."""
    return None if cfg is None else _model_bytes(cfg.to_json())


def build_cache_for(config: ml_collections.ConfigDict, model_cfg: ModelConfig | None,
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
    the config's choice."""
    if model_cfg is not None:
        layers = tuple(model_cfg.moe_layers) if layers is None else layers
        num_layers = model_cfg.num_layers if num_layers is None else num_layers
        num_experts = model_cfg.num_experts if num_experts is None else num_experts
        top_k = model_cfg.top_k if top_k is None else top_k
    if None in (layers, num_layers, num_experts, top_k):
        raise ValueError("build_cache_for needs a model config or the shape "
                         "(layers, num_layers, num_experts, top_k)")
    check_settings(config, live=False if config.job == "replay" else None)
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
    slots = given_slots(config)
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
    return build_cache(config, shape, model_cfg, renormalize, policies=policies, driven=driven)


