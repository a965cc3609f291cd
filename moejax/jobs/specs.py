"""A job config checked and resolved, once, into the typed specs the layers below the jobs
take (`moejax.run_spec`): `check_settings` checks the fields that feed the cache, the clocks,
storage, io and the policies against what each means (a value outside it is a `ConfigError`
naming `field=value` and what the field takes), `check_model` the model's fields and the model
they name; `resolve` runs both and makes the `RunSpec`, reading the hardware, host and storage
profiles (`hardware_from`, `host_cpu_from`, `host_work_from`, `storage_from`). What a given
setting does not apply to is said by `moejax.jobs.unapplied`.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from moejax.bundled import EMBEDDED
from moejax.cache import CAPACITY_OF, CLOCKS, LOAD_PATHS, check_prefetch_share
from moejax.errors import ConfigError
from moejax.families import FAMILIES, get_family
from moejax.jobs.schema import REPLAYS
from moejax.model_config import GATE_PATHS, GMM_IMPLS
from moejax.policies import check as check_policy
from moejax.policies import presets
from moejax.policies.registry import policy_class
from moejax.quant import formats
from moejax.run_spec import (
    IO_MODES,
    CacheSpec,
    HardwareSpec,
    IOSpec,
    ModelSpec,
    PolicySpec,
    RunSpec,
    TraceReading,
    check_io,
)
from moejax.timing import hardware as hw_lib
from moejax.timing import host as host_lib
from moejax.timing import host_work as host_work_lib
from moejax.timing import storage as storage_lib


def hardware_from(config: ml_collections.ConfigDict) -> hw_lib.Hardware:
    """The `hardware.file` profile (a hardware.json of `python -m moejax.calibration`) when
    given, else the `hardware.preset` profile, with the group's overrides: a field left None
    keeps the profile's value, any given value (0 included) replaces it and is validated. A
    preset given beside a file does not apply (`moejax.jobs.unapplied` says so)."""
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
    apply: the file measured the host the run is on."""
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


def storage_from(config: ml_collections.ConfigDict) -> storage_lib.Storage:
    """The `storage.preset` profile with the group's overrides (None keeps the preset's)."""
    s = config.storage
    return storage_lib.get(s.preset, **{k: s[k] for k in storage_lib.OVERRIDABLE if k in s})


def trace_driven(config: ml_collections.ConfigDict) -> bool:
    """Whether the run the cache times follows a trace's routing: a replay or a replay's
    capacity curve (what it times is the trace-driven run of its trace), or
    `policies.routing='trace(...)'`."""
    routing = presets.resolve(config.policies)["routing"]
    return config.job in REPLAYS or policy_class("routing", routing).name == "trace"


def computes_on_host(config: ml_collections.ConfigDict) -> bool:
    """Whether a run computes experts on the host (a miss policy that does, or
    `cache.host_compute_layers`)."""
    miss = presets.resolve(config.policies)["miss"]
    return (policy_class("miss", miss).computes_on_host
            or config.cache.get("host_compute_layers", 0) > 0)


def _count(value, field: str, lo: int, meaning: str) -> int:
    """`value` of an integer field that takes `lo` and up (`meaning`: what it takes, for the
    message)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{field}={value!r} must be {meaning}")
    return value


def _fraction(value, field: str, meaning: str) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value <= 1):  # nan fails too
        raise ConfigError(f"{field}={value!r} must be in (0, 1]: {meaning}")


def check_settings(config: ml_collections.ConfigDict) -> HardwareSpec:
    """Checks the fields that feed the cache, the clocks, storage, io and the policies against
    what each means, before anything runs: a value outside it is a ConfigError naming
    `field=value` and what the field takes, whether or not this run uses the field; each
    policy's name and arguments against the values it declares (`moejax.policies.check`).
    Limits that need the model (a slot count above its experts, a prefetch lookahead beyond
    its MoE layers) are checked where the model is known (`capacity.pools_for`,
    `build_host_tier`, the policy's constructor). Returns the run's hardware as read while
    checking it (each profile read once)."""
    c = config.cache
    _count(c.slots, "cache.slots", 0, "a slot count >= 1, or 0 (the schema's default: "
           "cache.capacity_frac sizes the cache)")
    _fraction(c.capacity_frac, "cache.capacity_frac",
              "the fraction of cache.capacity_of's bytes the cache holds")
    _count(c.min_slots, "cache.min_slots", 0,
           "an integer >= 0 (a floor on each pool's slots; 0, the default: no floor)")
    _count(c.group_size, "cache.group_size", 1, "an integer >= 1 (a quantization group's length)")
    _count(c.expert_bytes, "cache.expert_bytes", 0,
           "an integer >= 0 (bytes of one expert; 0, the default: from the trace or the model)")
    if c.capacity_of not in CAPACITY_OF:
        raise ConfigError(f"cache.capacity_of={c.capacity_of!r} is not one of {CAPACITY_OF}")
    if c.load_path not in LOAD_PATHS:
        raise ConfigError(f"cache.load_path={c.load_path!r} is not one of {LOAD_PATHS}: how a "
                          "live slot load moves an expert")
    if c.precision:
        formats.check(c.precision, "cache.precision")
    if config.clock.kind not in CLOCKS:
        raise ConfigError(f"clock.kind={config.clock.kind!r} is not one of {CLOCKS}")
    if not isinstance(config.clock.host_work, bool):
        raise ConfigError(f"clock.host_work={config.clock.host_work!r} must be True or False")
    _count(c.host_compute_layers, "cache.host_compute_layers", 0,
           "an integer >= 0 (the first MoE layers whose experts always run on the host; 0, "
           "the default: none)")
    _fraction(c.host_capacity_frac, "cache.host_capacity_frac",
              "1.0: every expert in host memory, no storage tier")
    _count(c.host_bytes, "cache.host_bytes", 0,
           "an integer >= 0 (0: use cache.host_capacity_frac)")
    check_prefetch_share(c.prefetch_share, c.prefetch_share_use)
    _check_io(config)
    hardware = HardwareSpec(hardware_from(config), host_cpu_from(config), host_work_from(config),
                            storage_from(config), config.clock.kind, _section(IOSpec, config.io))
    for kind, spec in presets.resolve(config.policies).items():
        check_policy(kind, spec)
    try:
        check_policy("eviction", c.host_eviction)
    except ConfigError as e:
        raise ConfigError(f"cache.host_eviction: {e}") from e
    _count(config.replay.num_experts, "replay.num_experts", 0,
           "an integer >= 0 (0: from the trace)")
    return hardware


def _check_io(config: ml_collections.ConfigDict) -> None:
    """`io.*` checked as the live reader would, where no reader is built too."""
    check_io(config.io.split, config.io.workers)
    if config.io.mode not in IO_MODES:
        raise ConfigError(f"io.mode={config.io.mode!r} is not one of {IO_MODES}")


def check_model(config: ml_collections.ConfigDict) -> None:
    """`model.*` against what each field takes, and the model it names: a directory that is a
    converted checkpoint (not a Hugging Face one), or a preset of the family; before any
    model loads, so a sweep's launch refuses a cell's bad model before the first cell runs. A
    replay reads no checkpoint, and `model.preset=""` is the trace's own model config there."""
    m = config.model
    if m.gmm_impl not in GMM_IMPLS:
        raise ConfigError(f"model.gmm_impl={m.gmm_impl!r} is not one of {GMM_IMPLS}")
    _count(m.lookahead, "model.lookahead", 0, "an integer >= 0 (MoE layers ahead whose gates "
           "score a layer's hidden state)")
    if m.gate_path not in GATE_PATHS:
        raise ConfigError(f"model.gate_path={m.gate_path!r} is not one of {GATE_PATHS}")
    _count(m.width, "model.width", 0, "an integer >= 0 (0: the preset's widths)")
    if m.width and m.checkpoint:
        raise ConfigError(f"model.width={m.width!r} draws a family preset at another width; "
                          f"model.checkpoint={m.checkpoint!r} has its own widths (leave one out)")
    if m.checkpoint and config.job not in REPLAYS:
        if not os.path.isdir(m.checkpoint):
            raise ConfigError(f"model.checkpoint={m.checkpoint!r} is not a directory")
        from moejax.checkpoint import hugging_face_message, is_hugging_face_dir

        if is_hugging_face_dir(m.checkpoint):  # refused here, before a job loads anything
            raise ConfigError(f"model.checkpoint={hugging_face_message(m.checkpoint)}")
        return
    if m.width and m.preset == EMBEDDED:
        raise ConfigError(f"model.width={m.width!r} draws a family preset at another width, "
                          f"and model.preset={EMBEDDED!r} is trained at its own: name a preset "
                          "(e.g. model.preset=olmoe-1b-7b)")
    if m.preset == EMBEDDED or (m.preset == "" and config.job in REPLAYS):
        return
    if m.family not in FAMILIES:
        raise ConfigError(f"model.family={m.family!r} is not one of {sorted(FAMILIES)}")
    if m.preset not in get_family(m.family).presets:
        raise ConfigError(f"model.preset={m.preset!r} is not a preset of {m.family}; known: "
                          f"{sorted(get_family(m.family).presets)} (or {EMBEDDED!r})")


def model_spec(model: ml_collections.ConfigDict, seed: int = 0) -> ModelSpec:
    """The `model` section as a `ModelSpec`, as given (`resolve` checks it first, `check_model`;
    a test that builds a model from a section it wrote calls this)."""
    return _section(ModelSpec, model, seed=seed)


def _section(cls, section: ml_collections.ConfigDict, **more):
    return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)
                  if f.name not in more}, **more)


def resolve(config: ml_collections.ConfigDict) -> RunSpec:
    """The run `config` describes, checked (`check_settings`) and typed: the specs the layers
    below the jobs take. A job resolves its config once; a config that is not checked here
    does not reach the model, the cache or the clocks."""
    check_model(config)
    hardware = check_settings(config)
    return RunSpec(job=config.job, seed=config.seed,
                   model=model_spec(config.model, config.seed),
                   cache=_section(CacheSpec, config.cache),
                   policies=_section(PolicySpec, config.policies),
                   hardware=hardware, trace=_section(TraceReading, config.replay),
                   batch_size=config.run.batch_size, records_trace=config.tracing.record,
                   trace_driven=trace_driven(config))
