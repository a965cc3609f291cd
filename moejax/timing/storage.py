"""Storage profiles: the device the disk tier reads experts from, as the clocks model it.

A storage read of `b` bytes issued at `t` is booked like a host->device transfer
(`moejax.timing.clock.Channels`): `queue_depth` reads are in flight at once, each pays
`read_latency_s` (the device's per-command latency, overlapped across the queue), and all share
`read_gbps` (one read alone can also reach it: large sequential reads saturate an SSD at low
queue depth). So `end = max(start + latency + b / read_gbps, shared timeline + b / read_gbps)`.

Presets are config values (`storage.preset`), every field overridable (`--config.storage.
read_gbps=2.5`); a field left None keeps the preset's value. The figures are vendors'
sequential-read specifications and typical 4 KiB QD1 read latencies of the device class, not
measurements here; `benchmarks/storage_read.py` measures this machine's disk, and its numbers
can be given as overrides. The dossier this tier comes from states no Apple SSD bandwidth or
latency (only end-to-end expert I/O per token), so there is no Apple preset.
"""

from __future__ import annotations

import dataclasses
import numbers

from moejax.errors import ConfigError
from moejax.timing.clock import Channels
from moejax.timing.presets import with_overrides


@dataclasses.dataclass(frozen=True)
class Storage:
    name: str
    read_gbps: float  # sequential read bandwidth, GB/s (1e9 bytes), shared by all reads
    read_latency_s: float  # fixed cost per read command
    queue_depth: int  # reads in flight at once

    def validate(self) -> None:
        for field, ok, what in (("read_gbps", lambda v: v > 0, "positive"),
                                ("read_latency_s", lambda v: v >= 0, ">= 0")):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not ok(v):
                raise ConfigError(f"storage.{field}={v!r} must be a number {what}")
        q = self.queue_depth
        if isinstance(q, bool) or not isinstance(q, numbers.Integral) or q < 1:
            raise ConfigError(f"storage.queue_depth={q!r} must be an integer >= 1")


PRESETS: dict[str, Storage] = {
    # A PCIe 4.0 x4 NVMe SSD (Samsung 990 Pro class: 7.45 GB/s sequential read specified,
    # ~7 sustained), ~80 us per read command, 32 commands in flight.
    "nvme_gen4": Storage("nvme_gen4", read_gbps=7.0, read_latency_s=80e-6, queue_depth=32),
    # A PCIe 5.0 x4 NVMe SSD (~12.4 GB/s specified), ~60 us per command.
    "nvme_gen5": Storage("nvme_gen5", read_gbps=12.0, read_latency_s=60e-6, queue_depth=32),
    # A SATA SSD: the 6 Gb/s interface caps reads at ~0.55 GB/s; ~100 us per command, NCQ 32.
    "sata_ssd": Storage("sata_ssd", read_gbps=0.55, read_latency_s=100e-6, queue_depth=32),
    # A 7200 rpm hard disk: ~0.2 GB/s sequential, ~8 ms seek + rotation, one head.
    "hdd": Storage("hdd", read_gbps=0.2, read_latency_s=8e-3, queue_depth=1),
}

OVERRIDABLE = ("read_gbps", "read_latency_s", "queue_depth")


def get(name: str, **overrides) -> Storage:
    """The preset `name` with `overrides` (None keeps the preset's value), validated."""
    return with_overrides("storage", PRESETS, name, overrides, OVERRIDABLE)


class StorageQueue(Channels):
    """Reads from one storage device, booked in issue order (`read` -> when the bytes are in
    host memory)."""

    def __init__(self, storage: Storage):
        super().__init__(storage.queue_depth, storage.read_gbps, storage.read_latency_s,
                         storage.read_gbps)
        self.storage = storage

    read = Channels.transfer
