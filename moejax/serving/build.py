"""The live cache runtime of a loaded model: its `ExpertCache` (`moejax.cache.from_spec`) with
the device slot pools that hold real expert bytes, fed from host memory or, behind a host tier,
from the checkpoint on storage. Under `policies.routing='trace(path=T)'` the runtime is driven
by the trace (`moejax/traces/driven.py`): its cache sees T's gates instead of the router's."""

from __future__ import annotations

import jax

from moejax.cache import ExpertCache, build_cache_for
from moejax.errors import ConfigError
from moejax.models import ResidentExperts
from moejax.policies import presets
from moejax.run_spec import RunSpec
from moejax.serving.runtime import CachedExperts
from moejax.serving.slot_pool import HostRecords, SlotPool, SlotPools, resolve_load_path
from moejax.traces import driven


def build_cached_experts(run: RunSpec, loaded) -> CachedExperts:
    """The live cache runtime over `loaded` (a `moejax.model_source.LoadedModel`): the cache
    sized from the bytes of the precisions the model has, and one device slot pool per
    precision the cache uses, fed from the host tables at that precision. Trace-driven
    (`policies.routing='trace(path=T)'`): the model must have T's shape, the policies are those
    the replay of T runs (`driven.policies_for`), and a `TraceDriver` of its own replaces the
    router's gates with T's (`CachedExperts.gate_source`)."""
    if run.cache.pin_scope != "layer":
        raise ConfigError(f"cache.pin_scope={run.cache.pin_scope!r}: a live run computes a "
                          "layer's experts as one grouped matmul, so they must be resident "
                          "together (pin_scope='layer'); 'request' is for replay")
    cfg = loaded.cfg
    driving, specs = None, None
    path = driven.trace_path(run.policies)
    if path is not None:
        driven.check_run(run)
        driving = driven.load(run.trace, path)
        driven.check_model(cfg, driving)
        specs = {k: v for k, v in driven.policies_for(run.policies, driving).items()
                 if k in presets.FIELDS}
    cache = build_cache_for(run, cfg, loaded.precision_bytes(), cfg.norm_topk_prob, specs)
    if (cache.miss.computes_on_host or cache.host_layers) and \
            jax.devices()[0].platform != "cpu":
        what = (f"policies.miss={cache.miss.name}" if cache.miss.computes_on_host
                else f"cache.host_compute_layers={len(cache.host_layers)}")
        raise ConfigError(f"{what}: a live run computes experts on the host only on the CPU "
                          "backend so far (compute_on('device_host') is not built: DESIGN.md "
                          "'Host compute'); replay models it (configs/replay.py)")
    for policy in cache.policies():
        if policy.replay_only:
            raise ConfigError(f"{policy.kind} policy {policy.name!r} needs the future routing: "
                              "it runs in trace replay only (configs/replay.py)")
    if cache.host is None:
        # copy_stream holds each expert as a record in host memory (`HostRecords`), built once
        # per model from its tables, which it takes over (`records_of`), unless a step computes
        # experts on the host, which reads the tables: then the pool keeps both.
        if resolve_load_path(run.cache.load_path) == "copy_stream" and not (
                cache.miss.computes_on_host or cache.host_layers):
            pools = SlotPools.from_records(cache.shape, lambda p: records_of(loaded, p))
        else:
            pools = SlotPools.for_shape(cache.shape, loaded.experts_at, run.cache.load_path)
        runtime = CachedExperts(cache, pools, cfg.num_experts)
    else:
        runtime = _storage_backed(run, cache, loaded)
    if driving is not None:
        runtime.gate_source = driven.TraceDriver(driving, cfg.moe_layers)
    return runtime


def records_of(loaded, precision: str) -> HostRecords:
    """copy_stream's records of `loaded`'s experts at `precision`: built on first use from the
    tables handed over (`LoadedModel.take_experts`: a checkpoint forgets its copy, so each
    expert is held once; weights drawn in memory keep theirs) and kept in `loaded.shared`,
    so every runtime built from the model (a sweep's cells in one process, calibration's and
    `gpu_check.py`'s live runs) reads the same records instead of copying every expert
    again."""
    key = ("copy_stream records", precision)
    held = loaded.shared.get(key)
    if held is None:
        held = loaded.shared[key] = HostRecords.of(*loaded.take_experts(precision), consume=True)
    return held


def _storage_backed(run: RunSpec, cache: ExpertCache, loaded) -> CachedExperts:
    """The live runtime of a cache with a host tier: its device pool is fed from a
    `HostExperts` store that reads experts from the checkpoint on storage as the host tier
    says (`io.split` range reads over `io.workers` threads)."""
    from moejax import checkpoint
    from moejax.checkpoint import ExpertReader
    from moejax.serving.host_store import HostExperts, expert_templates

    if not loaded.path:
        raise ConfigError(f"a host tier reads experts from a checkpoint on storage; "
                          f"{loaded.source} is not one (convert one with python -m "
                          "moejax.convert, or use the embedded model)")
    cfg, precision = loaded.cfg, cache.shape.precision
    reader = ExpertReader(loaded.path, cfg, checkpoint.read_precisions(loaded.path),
                          split=run.hardware.io.split, workers=run.hardware.io.workers,
                          mode=run.hardware.io.mode)
    store = HostExperts(reader, precision, checkpoint.to_host, capacity=cache.host.capacity)
    gate_up, down = expert_templates(cfg, precision, loaded.groups.get(precision))
    first = cfg.moe_layers[0]
    pool = SlotPool(cache.shape.num_slots, {first: gate_up}, {first: down}, store,
                    run.cache.load_path)
    return CachedExperts(cache, SlotPools([pool]), cfg.num_experts, store)


def resident_precision(run: RunSpec) -> str:
    """The precision every expert runs at when `cache.enabled` is False."""
    return run.cache.precision or "native"


def expert_source(run: RunSpec, loaded):
    """The cache runtime for a loaded model, or every expert on the device (at
    `cache.precision`) when `cache.enabled` is False."""
    if driven.trace_path(run.policies) is not None:
        driven.check_run(run)  # (a trace-driven run needs the cache)
    if not run.cache.enabled:
        return ResidentExperts.from_host(*loaded.experts_at(resident_precision(run)))
    return build_cached_experts(run, loaded)
