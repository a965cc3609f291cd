"""The two clocks, one timeline code (DESIGN.md "Clocks and the hardware model").

Both model host->device transfers the same way — `latency + bytes / bandwidth` on a FIFO per
copy engine — so the emulated bandwidth is enforced in wall mode too. They differ in compute:

* `VirtualClock`: compute takes what the cost model says; deterministic, any machine.
* `WallClock`: compute takes what it takes (host wall time since the run started); waiting for
  an expert sleeps until its emulated transfer ends (the real transfer is ordered before the
  expert step by data dependency, so it is waited for too).
"""

from __future__ import annotations

import time

from moejax.sim.hardware import Hardware


class _TransferFIFO:
    def __init__(self, hw: Hardware):
        self.hw = hw
        self.engine_free = [0.0] * hw.copy_engines

    def transfer(self, nbytes: int, issue_at: float) -> float:
        """Ready time of a transfer issued at `issue_at`."""
        e = min(range(len(self.engine_free)), key=self.engine_free.__getitem__)
        start = max(issue_at, self.engine_free[e])
        end = start + self.hw.h2d_latency_s + nbytes / (self.hw.h2d_gbps * 1e9)
        self.engine_free[e] = end
        return end


class VirtualClock(_TransferFIFO):
    kind = "virtual"

    def __init__(self, hw: Hardware):
        super().__init__(hw)
        self.t = 0.0  # the compute stream is busy until t

    def now(self) -> float:
        return self.t

    def compute(self, seconds: float) -> None:
        self.t += seconds

    def wait(self, ready_at: float) -> float:
        """Compute waits for a transfer; returns the stall."""
        stall = max(0.0, ready_at - self.t)
        self.t += stall
        return stall


class WallClock(_TransferFIFO):
    kind = "wall"

    def __init__(self, hw: Hardware):
        super().__init__(hw)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def compute(self, seconds: float) -> None:
        pass  # real compute takes real time

    def wait(self, ready_at: float) -> float:
        start = self.now()
        if ready_at > start:
            time.sleep(ready_at - start)
        return max(0.0, self.now() - start)
