"""What an `ExpertCache` runs with besides its shape and its four policies: one typed object.

`CacheOptions` is frozen: a cache's options are fixed when it is built. The compiled replay
engine reads its fields (`moejax/replay/coverage.py`) and runs a cache only when it declares
every one of them, so a field added here runs on the reference engine until the kernel learns
it. Values are checked here, in one place, when the object is made; what depends on the
cache's shape (`full_layers`, `host_compute_layers` against its MoE layers) is checked by the
stage that uses it (`placement.py`, `host_stage.py`).
"""

from __future__ import annotations

import dataclasses

from moejax.cache.staging import check as check_prefetch_share
from moejax.errors import ConfigError

# What a demand fetch may not evict. "layer": any expert the running layer (wave) requests —
# its experts run as one grouped matmul, so they must be resident together (moejax's live
# runtime). "request": only the expert being fetched — experts run one at a time, an earlier
# one of the same layer may go once used (SpecMD's per-expert execution; replay only).
PIN_SCOPES = ("layer", "request")

# How predictions become transfers. "immediate": each prediction takes a slot and books its
# transfer when it is made (one call's predictions protect each other, so a prefetched expert
# is never evicted before its use, and bandwidth changes timings only). "watchdog" (SpecMD's
# appendix: "a watchdog thread monitors this queue and GPU capacity, issuing non-blocking CUDA
# transfers when space allows"): predictions wait in a FIFO queue and go as soon as a slot can
# be had; their transfers queue on the copy engines. "watchdog_idle": the same queue with a
# transfer issued only onto an idle copy engine (a named variant). See `watchdog_queue.py`.
PREFETCH_QUEUES = ("immediate", "watchdog", "watchdog_idle")


def _count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"cache.{name}={value!r} must be an integer >= 0")


@dataclasses.dataclass(frozen=True)
class CacheOptions:
    """The clock and the cache's optional parts and settings.

    `clock`: the time source (`moejax.timing.clock`); `cost`: the cost model charging the
    device's steps on a virtual clock (None: compute takes no time); `sink`: what moves an
    expert's bytes into a slot (the live runtime; replay has none); `lookahead_scores`: the
    speculative router scores a layer computes (charged to its router step); `pin_scope` and
    `prefetch_queue`: see `PIN_SCOPES`, `PREFETCH_QUEUES`; `host`: the host tier in front of
    storage (None: every expert in host memory); `full_layers`: ds4's whole-layer placement;
    `host_compute_layers` and `host_path`: the MoE layers whose experts run on the host and
    the model of that path; `timing`: the live runtime's host work (`RuntimeTiming`) on a
    `HostDeviceClock`; `prefetch_share`: the staging share and what a prefetched expert's use does
    (`prefetch_share_use`; `staging.py`)."""

    clock: object
    cost: object = None  # moejax.timing.CostModel
    sink: object = None  # moejax.cache.expert_cache.SlotSink
    lookahead_scores: int = 0
    pin_scope: str = "layer"
    prefetch_queue: str = "immediate"
    host: object = None  # moejax.cache.host_tier.HostTier
    full_layers: int = 0
    host_compute_layers: int = 0
    host_path: object = None  # moejax.cache.host_path.HostPath
    timing: object = None  # moejax.cache.runtime_timing.RuntimeTiming
    prefetch_share: float = 0.0
    prefetch_share_use: str = "promote"

    def __post_init__(self):
        if self.pin_scope not in PIN_SCOPES:
            raise ConfigError(f"cache.pin_scope={self.pin_scope!r} is not one of {PIN_SCOPES}")
        if self.prefetch_queue not in PREFETCH_QUEUES:
            raise ConfigError(f"cache.prefetch_queue={self.prefetch_queue!r} is not one of "
                              f"{PREFETCH_QUEUES}")
        _count("full_layers", self.full_layers)
        check_prefetch_share(self.prefetch_share, self.prefetch_share_use)
        if self.timing is not None:
            self.timing.check_clock(self.clock)

    def fields(self) -> dict[str, object]:
        """Every option by name, as given (what the compiled engine's coverage check reads)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
