"""Hardware profiles: the numbers the virtual clock runs on, and the emulated host->device
bandwidth the wall clock enforces. Presets are config values (`hardware.preset`); any field can
be overridden (`hardware.h2d_gbps=16`)."""

from __future__ import annotations

import dataclasses

from moejax.config import ConfigError


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    h2d_gbps: float  # host->device bandwidth per copy engine, GB/s (1e9 bytes)
    h2d_latency_s: float  # fixed cost per transfer
    copy_engines: int  # transfers run FIFO on the engine that frees first
    peak_tflops: float  # dense bf16 matmul peak, TFLOP/s
    hbm_gbps: float  # device memory bandwidth, GB/s
    launch_s: float  # fixed cost per compiled step

    def validate(self) -> None:
        for f in ("h2d_gbps", "peak_tflops", "hbm_gbps"):
            if getattr(self, f) <= 0:
                raise ConfigError(f"hardware.{f}={getattr(self, f)} must be positive")
        for f in ("h2d_latency_s", "launch_s"):
            if getattr(self, f) < 0:
                raise ConfigError(f"hardware.{f}={getattr(self, f)} must be >= 0")
        if self.copy_engines < 1:
            raise ConfigError(f"hardware.copy_engines={self.copy_engines} must be >= 1")


PRESETS: dict[str, Hardware] = {
    # SpecMD's testbed: A100 80 GB with a measured 5 GB/s host->device (SpecMD §5 setup).
    "a100_specmd": Hardware("a100_specmd", h2d_gbps=5.0, h2d_latency_s=10e-6, copy_engines=1,
                            peak_tflops=312.0, hbm_gbps=2039.0, launch_s=5e-6),
    # H100 PCIe: PCIe Gen5 x16 (~25 GB/s sustained pinned copies), 756 TFLOP/s bf16 dense.
    "h100_pcie": Hardware("h100_pcie", h2d_gbps=25.0, h2d_latency_s=8e-6, copy_engines=2,
                          peak_tflops=756.0, hbm_gbps=2000.0, launch_s=5e-6),
    # H200 SXM: PCIe Gen5 host link (~50 GB/s peak; 40 assumed sustained), 989 TFLOP/s bf16.
    "h200": Hardware("h200", h2d_gbps=40.0, h2d_latency_s=8e-6, copy_engines=2,
                     peak_tflops=989.0, hbm_gbps=4800.0, launch_s=4e-6),
    # This 2-core CPU: figures of the order measured here (benchmarks/), for wall-vs-virtual checks.
    "cpu": Hardware("cpu", h2d_gbps=10.0, h2d_latency_s=20e-6, copy_engines=1,
                    peak_tflops=0.05, hbm_gbps=10.0, launch_s=50e-6),
}


def get(name: str, **overrides) -> Hardware:
    if name not in PRESETS:
        raise ConfigError(f"hardware.preset={name!r} is not one of {sorted(PRESETS)}")
    hw = dataclasses.replace(PRESETS[name], **{k: v for k, v in overrides.items() if v})
    hw.validate()
    return hw
