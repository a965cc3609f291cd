"""What a run is, typed: the specs a job resolves its config into once
(`moejax.jobs.specs.resolve`), which the layers below the jobs take instead of the config —
the model (`ModelSpec`), the cache (`CacheSpec`), the policies (`PolicySpec`), the hardware
the clocks model (`HardwareSpec`), how a trace is read (`TraceReading`) and the run that holds
them (`RunSpec`).

Each spec is frozen and has no defaults: its values come from a checked config, so the
schema (`moejax/jobs/schema.py`) stays the one place a default is written. A section's spec
has exactly the section's fields (`tests/test_run_spec.py` holds the two to each other).
`io.*`'s rule (`check_io`, `IO_MODES`) is here too, beside its spec, so that checking a config
needs no checkpoint reader.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.errors import ConfigError
from moejax.timing import Hardware, HostCPU, HostWork, Storage


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """`model.*`, and the seed random weights are drawn from."""

    checkpoint: str
    preset: str
    family: str
    gmm_impl: str
    lookahead: int
    width: int
    gate_path: str
    seed: int


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """`cache.*`, as given (`moejax/jobs/schema.py` says what each field takes)."""

    enabled: bool
    capacity_frac: float
    capacity_of: str
    slots: int
    precision: str
    precision_shares: str
    group_size: int
    min_slots: int
    pin_scope: str
    prefetch_queue: str
    prefetch_share: float
    prefetch_share_use: str
    expert_bytes: int
    host_capacity_frac: float
    host_bytes: int
    host_eviction: str
    seed: str
    warm_start: str
    load_path: str
    full_layers: int
    host_compute_layers: int
    speculate: bool
    speculate_from_host: bool

    @property
    def given_slots(self) -> int | None:
        """`slots` when given (None: 0, the default, lets `capacity_frac` size the cache)."""
        return self.slots or None

    @property
    def host_tier(self) -> bool:
        """Whether experts stay on storage behind a bounded host tier (`host_bytes`, or
        `host_capacity_frac` below 1)."""
        return self.host_bytes > 0 or self.host_capacity_frac < 1


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """`policies.*` as given: a field left "" is the preset's or the default's
    (`moejax.policies.presets.resolve` says which spec runs, `report` where it came from)."""

    preset: str
    eviction: str
    prefetch: str
    miss: str
    routing: str
    # The user's policy files or modules, comma-separated: `jobs.check` imports them before any
    # spec is resolved (`moejax/policies/user_modules.py`); results.json keeps what they were.
    modules: str


@dataclasses.dataclass(frozen=True)
class IOSpec:
    """`io.*`: how the live reader reads experts from a checkpoint on storage."""

    split: int
    workers: int
    mode: str


# `io.*`'s rule, beside its spec: a config's check needs no reader (the reader, and JAX with
# it, loads only where a run reads a checkpoint; a replay's check never does).
MAX_SPLIT = 8
# "direct": pread through `O_DIRECT` descriptors into page-aligned buffers — every read goes
# to the device, bypassing the page cache (a cold read each time; a VM's host may still cache).
IO_MODES = ("pread", "mmap", "direct")


def _positive_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= 1


def check_io(split, workers) -> tuple[int, int]:
    """`split` and `workers` validated (ConfigError naming `io.split` / `io.workers`)."""
    if not _positive_int(split) or split > MAX_SPLIT:
        raise ConfigError(f"io.split={split!r} must be an integer from 1 to {MAX_SPLIT} (the "
                          "page-aligned pieces one expert's read is cut into)")
    if not _positive_int(workers):
        raise ConfigError(f"io.workers={workers!r} must be a positive integer (the reader's "
                          "I/O threads)")
    return int(split), int(workers)


@dataclasses.dataclass(frozen=True)
class HardwareSpec:
    """The machine the clocks model and the run reads from: the device profile (a preset or
    `hardware.file`, with the overrides), the host CPU that computes missed experts, the
    host's measured work (None: the device-only model), storage, `clock.kind` as given
    ("auto" resolves where the backend is known: `moejax.cache.from_spec.clock_kind`) and io."""

    device: Hardware
    host_cpu: HostCPU
    host_work: HostWork | None
    storage: Storage
    clock: str
    io: IOSpec


@dataclasses.dataclass(frozen=True)
class TraceReading:
    """How a trace becomes requests (`replay.*` less the job's own `trace` and `engine`)."""

    num_experts: int
    strict: bool
    request_tokens: int
    prefill_tokens: int


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run: its job, seed and the specs above; `batch_size` and `records_trace`
    (`tracing.record`) are what a trace-driven run is checked against; `trace_driven`: the
    run the cache times follows a trace's routing (a replay, or `policies.routing='trace(...)'`)."""

    job: str
    seed: int
    model: ModelSpec
    cache: CacheSpec
    policies: PolicySpec
    hardware: HardwareSpec
    trace: TraceReading
    batch_size: int
    records_trace: bool
    trace_driven: bool
