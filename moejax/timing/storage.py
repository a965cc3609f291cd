"""Storage profiles: the device the disk tier reads experts from, as the clocks model it.

A storage read of `b` bytes issued at `t` is booked like a host->device transfer
(`moejax.timing.clock.Channels`): `queue_depth` reads are in flight at once, each pays
`read_latency_s` (the device's per-command latency, overlapped across the queue), and all share
`read_gbps` (one read alone can also reach it: large sequential reads saturate an SSD at low
queue depth). So `end = max(start + latency + b / read_gbps, shared timeline + b / read_gbps)`.

Presets are config values (`storage.preset`), every field overridable (`--config.storage.
read_gbps=2.5`); a field left None keeps the preset's value. Each preset names its sources in
a comment: a vendor's sequential-read specification for the bandwidth and a vendor's or a
published measurement's 4 KiB queue-depth-1 random read for the latency — not measurements
here. `benchmarks/cold_read.py` measures this machine's disk (cold: O_DIRECT, bytes never read
since boot), and its numbers can be given as overrides (`THIS_DISK` in studies/dossier/grid_disk.py).
The dossier this tier comes from states no Apple SSD bandwidth or latency (only end-to-end
expert I/O per token), so there is no Apple preset.
"""

from __future__ import annotations

import dataclasses
import numbers

from moejax.errors import ConfigError
from moejax.timing.clock import Channels
from moejax.timing.profiles import with_overrides


@dataclasses.dataclass(frozen=True)
class Storage:
    name: str
    read_gbps: float  # sequential read bandwidth, GB/s (1e9 bytes), shared by all reads
    read_latency_s: float  # fixed cost per read command
    queue_depth: int  # reads in flight at once

    def validate(self) -> None:
        # Finite: an infinite bandwidth or latency models no device (`v - v == 0` fails for
        # inf and nan).
        for field, ok, what in (("read_gbps", lambda v: v > 0, "> 0 (GB/s)"),
                                ("read_latency_s", lambda v: v >= 0, ">= 0 (seconds)")):
            v = getattr(self, field)
            if (isinstance(v, bool) or not isinstance(v, numbers.Real) or not v - v == 0
                    or not ok(v)):
                raise ConfigError(f"storage.{field}={v!r} must be a finite number {what}")
        q = self.queue_depth
        if isinstance(q, bool) or not isinstance(q, numbers.Integral) or q < 1:
            raise ConfigError(f"storage.queue_depth={q!r} must be an integer >= 1")


PRESETS: dict[str, Storage] = {
    # A PCIe 4.0 x4 NVMe SSD. Bandwidth: Samsung 990 PRO, "sequential read up to 7,450 MB/s"
    # (Samsung's specification, 2022 launch). Latency: 4 KiB random reads at queue depth 1,
    # one thread, measured 20,176 IOPS = 49.6 us per read on a Lexar NM790 4TB (PCIe 4.0;
    # KitGuru's review, CrystalDiskMark 8); Samsung's sheet gives QD32 figures only. Queue
    # depth: the QD32 at which the random-read specification is stated.
    "nvme_gen4": Storage("nvme_gen4", read_gbps=7.45, read_latency_s=50e-6, queue_depth=32),
    # A SATA SSD: Samsung 870 EVO, "up to 560 MB/s" sequential read and 13,000 IOPS 4 KiB
    # random read at QD1 (= 77 us per read), Samsung's specification as quoted in KitGuru's
    # review; SATA's native command queue holds 32 commands.
    "sata_ssd": Storage("sata_ssd", read_gbps=0.56, read_latency_s=77e-6, queue_depth=32),
    # A 7200 rpm hard disk: Seagate BarraCuda ST1000DM010, "max sustained data rate, OD read
    # 210 MB/s" (Seagate's data sheet); per read, the average rotational latency at 7200 rpm
    # (half a turn, 4.16 ms) plus an average read seek of 8.2 ms (HGST Ultrastar 7K4000
    # specification, typical): 12.4 ms; one head, so one command at a time.
    "hdd": Storage("hdd", read_gbps=0.21, read_latency_s=12.4e-3, queue_depth=1),
}
# No PCIe 5.0 preset: its bandwidth has a specification (Crucial T700, 12.4 GB/s), but no
# published queue-depth-1 latency of a PCIe 5.0 drive was found; give one with
# `--config.storage.preset=nvme_gen4 --config.storage.read_gbps=12.4` and a latency you trust.

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
