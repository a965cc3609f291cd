"""Hardware profiles: the numbers the virtual clock runs on, and the emulated host->device
bandwidth the wall clock enforces. Presets are config values (`hardware.preset`); any field can
be overridden (`--config.hardware.h2d_gbps=16`, `--config.hardware.h2d_latency_s=0`): an
override that is not given (None) keeps the preset's value, any given value (0 included)
replaces it and is validated.

The host->device transfer model (`moejax.timing.clock`):

* `copy_engines` DMA engines run transfers FIFO, each transfer on the engine that frees first.
  An engine pays `h2d_latency_s` per transfer, then moves the bytes at up to `h2d_gbps`.
* All engines share one host link of `link_gbps` (PCIe): its bytes are one timeline, so N
  concurrent transfers together never move more than `link_gbps` GB/s. Several engines let
  the fixed latencies of transfers overlap (one engine's latency hides behind another's
  bytes); they do not add bandwidth beyond the link's.

`link_gbps=None` means the link carries what one engine moves (`link_gbps = h2d_gbps`), so
overriding `h2d_gbps` alone changes the host->device bandwidth of every preset; set
`link_gbps` as well to model a link wider (or narrower) than one engine.

A measured profile is a file (`hardware.file`): the `hardware` object of the hardware.json that
`python -m moejax.calibration --workdir=W` writes, read by `from_file` with the same
overrides on top and the same checks, each error naming the file.
"""

from __future__ import annotations

import dataclasses

from moejax.timing.profiles import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    check_fields,
    measured_profile,
    read_json,
    with_overrides,
)


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    h2d_gbps: float  # host->device bandwidth one copy engine moves, GB/s (1e9 bytes)
    h2d_latency_s: float  # fixed cost per transfer, paid on its engine (overlaps across engines)
    copy_engines: int  # transfers run FIFO on the engine that frees first
    peak_tflops: float  # dense bf16 matmul peak, TFLOP/s
    hbm_gbps: float  # device memory bandwidth, GB/s
    launch_s: float  # fixed cost per compiled step
    # The host link all copy engines share, GB/s: the most bytes per second all transfers
    # together move. None: the same as h2d_gbps (the link is what one engine moves).
    link_gbps: float | None = None

    @property
    def link_bandwidth_gbps(self) -> float:
        """The shared host link's bandwidth, GB/s (`link_gbps`, or `h2d_gbps` when unset)."""
        return self.h2d_gbps if self.link_gbps is None else self.link_gbps

    def validate(self) -> None:
        # (link_gbps unset: the link is one engine's worth)
        check_fields(self, "hardware", _RULES, unset=("link_gbps",))


# Each field's type and range, checked by `Hardware.validate` (errors name the field).
_RULES = {"h2d_gbps": POSITIVE, "link_gbps": POSITIVE, "peak_tflops": POSITIVE,
          "hbm_gbps": POSITIVE, "h2d_latency_s": NON_NEGATIVE, "launch_s": NON_NEGATIVE,
          "copy_engines": AT_LEAST_ONE}


PRESETS: dict[str, Hardware] = {
    # SpecMD's testbed: A100 80 GB with a measured 5 GB/s host->device (SpecMD §5 setup). One
    # copy engine, so the link carries what it moves: 10 us + bytes / 5 GB/s per transfer,
    # back to back.
    "a100_specmd": Hardware("a100_specmd", h2d_gbps=5.0, h2d_latency_s=10e-6, copy_engines=1,
                            peak_tflops=312.0, hbm_gbps=2039.0, launch_s=5e-6),
    # H100 PCIe: ~25 GB/s sustained pinned host->device copies over its PCIe host link, which
    # one copy engine can fill alone. Two engines share that link (link_gbps = h2d_gbps =
    # 25 GB/s): together they move at most 25 GB/s; the second engine only overlaps the 8 us
    # per-transfer latencies. 756 TFLOP/s bf16 dense.
    "h100_pcie": Hardware("h100_pcie", h2d_gbps=25.0, h2d_latency_s=8e-6, copy_engines=2,
                          peak_tflops=756.0, hbm_gbps=2000.0, launch_s=5e-6),
    # H200 SXM: PCIe Gen5 x16 host link (~50 GB/s peak; 40 assumed sustained), which one copy
    # engine can fill alone. Two engines share the link (link_gbps = h2d_gbps = 40 GB/s):
    # together they move at most 40 GB/s, not 80; the second engine overlaps the 8 us
    # per-transfer latencies. 989 TFLOP/s bf16.
    "h200": Hardware("h200", h2d_gbps=40.0, h2d_latency_s=8e-6, copy_engines=2,
                     peak_tflops=989.0, hbm_gbps=4800.0, launch_s=4e-6),
    # This 2-core CPU: figures of the order measured here (benchmarks/), for wall-vs-virtual checks.
    "cpu": Hardware("cpu", h2d_gbps=10.0, h2d_latency_s=20e-6, copy_engines=1,
                    peak_tflops=0.05, hbm_gbps=10.0, launch_s=50e-6),
}

OVERRIDABLE = ("h2d_gbps", "h2d_latency_s", "copy_engines", "peak_tflops", "hbm_gbps",
               "launch_s", "link_gbps")


def get(name: str, **overrides) -> Hardware:
    """The preset `name` with `overrides` applied: a None override keeps the preset's value,
    any other value (0 included) replaces it. The result is validated (errors name the field)
    and has `link_gbps` resolved to a number."""
    hw = with_overrides("hardware", PRESETS, name, overrides, OVERRIDABLE)
    return dataclasses.replace(hw, link_gbps=hw.link_bandwidth_gbps)


# The fields a profile in a file must have (`link_gbps` may be null: one engine's worth).
FILE_FIELDS = tuple(f.name for f in dataclasses.fields(Hardware))
# What `python -m moejax.calibration` names its hardware.json files' layout.
FILE_FORMAT = "moejax.hardware/1"


def as_dict(hw: Hardware) -> dict:
    """`hw` as the `hardware` object of a hardware.json (what `from_file` reads back)."""
    return dataclasses.asdict(hw)


def from_file(path: str, **overrides) -> Hardware:
    """The profile in the hardware.json at `path` (its `hardware` object: every field of
    `Hardware`), with `overrides` applied as `get` applies them to a preset (None keeps the
    file's value). A missing or unreadable file, one that is not JSON, a missing or unknown
    field and a value out of range are `ConfigError`s naming `hardware.file=path`."""
    where = f"hardware.file={path!r}"
    doc = read_json(path, where)
    hw = measured_profile(Hardware, doc.get("hardware") if isinstance(doc, dict) else None,
                          "hardware", FILE_FIELDS, overrides, OVERRIDABLE, where,
                          '"hardware"')
    return dataclasses.replace(hw, link_gbps=hw.link_bandwidth_gbps)
