"""The machine's measurements turned into a hardware profile, and the hardware.json holding both.

The profile is what the virtual clock runs on (`moejax.timing.hardware.Hardware`):

* `h2d_gbps`, `h2d_latency_s`: the transfer fit of the back-to-back stream (`measure.transfers`:
  what a wave's loads are, and what the clock's copy-engine FIFO books: each transfer its
  latency, then its bytes);
* `copy_engines` 1 and `link_gbps` null (one engine's worth): several engines would show as
  latencies overlapping within a stream, which the stream's per-transfer time already holds,
  so one engine with that per-transfer cost is what was measured;
* `peak_tflops`, `hbm_gbps`, `launch_s`: the roofline fit of the compiled steps against the
  FLOPs and bytes the cost model charges them. A side of the roofline no step reached is a
  lower bound (the best rate measured) and the file says so (`roofline.determined`).

The file is `{"format", "hardware": <the profile>, "measured": <every table and fit>,
"command", "date", "hostname", "device", "host"}`; `moejax.timing.hardware.from_file` reads its
`hardware` object (`--config.hardware.file=W/hardware.json`), `moejax.timing.host.from_file`
its `host` section (`{"profile": <a HostCPU>, "measured": ...}`, `moejax.calibration.host_cpu`).
"""

from __future__ import annotations

import datetime
import socket

from moejax.calibration.fit import RooflineFit, TransferFit
from moejax.timing import Hardware
from moejax.timing import hardware as hw_lib


def calibrated_name(hostname: str | None = None) -> str:
    return f"calibrated:{hostname or socket.gethostname()}"


def profile_of(transfer: TransferFit, roofline: RooflineFit, name: str) -> Hardware:
    """The profile the fits describe (module docstring), validated."""
    hw = Hardware(name, h2d_gbps=transfer.gbps, h2d_latency_s=transfer.latency_s,
                  copy_engines=1, peak_tflops=roofline.peak_tflops, hbm_gbps=roofline.hbm_gbps,
                  launch_s=roofline.launch_s, link_gbps=None)
    hw.validate()
    return hw


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def document(hw: Hardware, measured: dict, command: str, device: dict) -> dict:
    """The hardware.json of a calibration (`hw_lib.from_file` reads its `hardware`)."""
    return {"format": hw_lib.FILE_FORMAT, "hardware": hw_lib.as_dict(hw), "measured": measured,
            "command": command,
            "date": now(),
            "hostname": socket.gethostname(), "device": device}
