"""The two clocks, one timeline code (DESIGN.md "Clocks and the hardware model").

Both model host->device transfers the same way (`_TransferFIFO`), so the emulated bandwidth is
enforced in wall mode too. A transfer is booked by `timeline.book` (the formula is in
`moejax/timing/timeline.py`, which the compiled replay kernel compiles too): on the copy engine
that frees first, paying its latency, its bytes moving at one engine's rate and, in issue
order, over the one host link all engines share. So N concurrent transfers never move more
than `link_gbps` bytes per second together; several engines overlap the transfers' fixed
latencies (one engine's latency runs while another's bytes cross the link) and add no
bandwidth. With one engine and `link_gbps = h2d_gbps` this is `start + latency + b / h2d_gbps`
on a FIFO (the link is never behind the engine), bit for bit.

They differ in compute:

* `VirtualClock`: compute takes what the cost model says; deterministic, any machine.
* `WallClock`: compute takes what it takes (host wall time since the run started); waiting for
  an expert sleeps until its emulated transfer ends (the real transfer is ordered before the
  expert step by data dependency, so it is waited for too).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from moejax.timing import timeline
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
        self.latency_s = latency_s
        self.engine_bps = rate_gbps * 1e9  # one channel's bytes per second
        self.link_bps = shared_gbps * 1e9  # all channels' together

    def _book(self, nbytes: int, issue_at: float) -> tuple[int, float, float, float, float]:
        """Books an operation issued at `issue_at` (`timeline.book`); returns (engine, start,
        link_start, link_end, end)."""
        booked = timeline.book(self.engine_free, self.link_free, nbytes, issue_at,
                               self.latency_s, self.engine_bps, self.link_bps)
        self.link_free = booked[3]
        return booked

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
        stall = timeline.stall(ready_at, self.t)
        self.t += stall
        return stall


class HostDeviceClock(VirtualClock):
    """The virtual clock with the host's work modelled (`moejax.cache.runtime_timing`): two
    timelines. `t` — what `now()` says — is the host thread's: it dispatches each compiled step,
    decides, issues transfers and waits for them (as the live runtime's host thread does);
    `device` is when the device finishes the steps dispatched so far (it runs them in order,
    each no earlier than its dispatch). Reading a step's results waits for the device
    (`sync`). `host_s` counts the host's own work (dispatching, deciding) since the clock
    started, the part of a pass the cache reports as host work."""

    def __init__(self, hw: Hardware):
        super().__init__(hw)
        self.device = 0.0
        self.host_s = 0.0

    def host(self, seconds: float) -> None:
        """The host thread works `seconds` (deciding, preparing a step's arguments)."""
        self.t += seconds
        self.host_s += seconds

    def dispatch(self, host_s: float, device_s: float) -> float:
        """A compiled step: the host spends `host_s` dispatching it, then the device runs it
        for `device_s` once it is done with the steps before. Returns when its results are
        ready (`sync` to read them)."""
        self.host(host_s)
        start = self.device if self.device > self.t else self.t
        self.device = start + device_s
        return self.device

    def sync(self, ready: float | None = None) -> float:
        """The host reads a step's results: waits until `ready` (None: every step dispatched).
        Returns the wait."""
        return self.wait(self.device if ready is None else ready)


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
