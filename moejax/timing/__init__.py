"""How long things take, on the virtual clock and the wall clock alike: hardware, storage and
host CPU profiles (`hardware.py`, `storage.py`, `host.py`: the host that computes missed
experts and its latency model; what the three share, a preset with a user's overrides and a
measured profile read from hardware.json, `profiles.py`), the roofline cost model of compute
(`cost.py`), the booking of transfers on copy engines over a shared link (`timeline.py`, the
maths the compiled replay kernel compiles too), and the two clocks (`clock.py`: virtual for
replay and CPU runs, wall for GPU runs; the virtual clock with the host's work modelled,
`HostDeviceClock`, when a calibrated profile has its terms: `host_work.py`). Code outside
the package imports through this face."""

from moejax.timing import hardware, host, host_work, storage
from moejax.timing.clock import (
    Channels,
    HostDeviceClock,
    TransferSlot,
    VirtualClock,
    WallClock,
)
from moejax.timing.cost import CostModel
from moejax.timing.hardware import Hardware
from moejax.timing.host import HostCPU
from moejax.timing.host_work import TERMS, HostWork, StepTable, model_key
from moejax.timing.storage import Storage, StorageQueue

__all__ = ["TERMS", "Channels", "CostModel", "Hardware", "HostCPU", "HostDeviceClock",
           "HostWork", "StepTable", "Storage", "StorageQueue", "TransferSlot", "VirtualClock",
           "WallClock", "hardware", "host", "host_work", "model_key", "storage"]
