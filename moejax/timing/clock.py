"""The two clocks, one timeline code (DESIGN.md "Clocks and the hardware model").

Both model host->device transfers the same way (`_TransferFIFO`), so the emulated bandwidth is
enforced in wall mode too. A transfer of `b` bytes issued at `t`:

    e          = the copy engine that frees first
    start      = max(t, engine_free[e])
    data_start = start + h2d_latency_s                   (the engine's fixed cost)
    link_start = max(data_start, link_free)              (the shared host link, FIFO)
    end        = max(data_start + b / h2d_gbps,          (one engine's rate)
                     link_start + b / link_gbps)         (the link's rate, shared)
    engine_free[e] = end;  link_free = link_start + b / link_gbps

The host link is one byte timeline for all engines: transfers hold it back to back, in issue
order, for `b / link_gbps` each, so N concurrent transfers never move more than `link_gbps`
bytes per second together. Several engines overlap the transfers' fixed latencies (one
engine's latency runs while another's bytes cross the link); they add no bandwidth. With one
engine and `link_gbps = h2d_gbps` this is `start + latency + b / h2d_gbps` on a FIFO (the
link is never behind the engine), bit for bit.

They differ in compute:

* `VirtualClock`: compute takes what the cost model says; deterministic, any machine.
* `WallClock`: compute takes what it takes (host wall time since the run started); waiting for
  an expert sleeps until its emulated transfer ends (the real transfer is ordered before the
  expert step by data dependency, so it is waited for too).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from moejax.timing.hardware import Hardware


class TransferSlot(NamedTuple):
    """Where a transfer ran: its engine, when the engine took it, when its bytes held the
    host link, and when it was on the device (`end`, the ready time)."""
    engine: int
    start: float
    link_start: float
    link_end: float
    end: float


class Channels:
    """FIFO channels sharing one byte timeline: `channels` parallel queues (copy engines, or a
    storage device's queue depth), each paying `latency_s` per operation and moving its bytes
    at up to `rate_gbps`, all sharing `shared_gbps` (the host link, or the device's bandwidth).
    The booking formula is the module docstring's, with engines for channels."""

    def __init__(self, channels: int, rate_gbps: float, latency_s: float, shared_gbps: float):
        self.engine_free = [0.0] * channels
        self.link_free = 0.0  # the shared timeline has moved every byte issued so far
        self._engine_bps = rate_gbps * 1e9
        self._link_bps = shared_gbps * 1e9
        self._latency = latency_s

    def _book(self, nbytes: int, issue_at: float) -> tuple[int, float, float, float, float]:
        """Books an operation issued at `issue_at` (formula in the module docstring); returns
        (engine, start, link_start, link_end, end). The replay hot path: plain floats."""
        free = self.engine_free
        e = 0 if len(free) == 1 else min(range(len(free)), key=free.__getitem__)
        start = issue_at if issue_at > free[e] else free[e]
        data_start = start + self._latency
        link_start = data_start if data_start > self.link_free else self.link_free
        link_end = link_start + nbytes / self._link_bps
        end = data_start + nbytes / self._engine_bps
        if link_end > end:
            end = link_end
        free[e] = end
        self.link_free = link_end
        return e, start, link_start, link_end, end

    def schedule(self, nbytes: int, issue_at: float) -> TransferSlot:
        """Books an operation issued at `issue_at`; where and when it ran."""
        return TransferSlot(*self._book(nbytes, issue_at))

    def transfer(self, nbytes: int, issue_at: float) -> float:
        """Books an operation issued at `issue_at`; when it ends."""
        return self._book(nbytes, issue_at)[4]


class _TransferFIFO(Channels):
    """Host->device transfers: the hardware profile's copy engines over its host link."""

    def __init__(self, hw: Hardware):
        super().__init__(hw.copy_engines, hw.h2d_gbps, hw.h2d_latency_s, hw.link_bandwidth_gbps)
        self.hw = hw


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
