"""The host compute stage of a layer: experts computed on the host, beside the device's waves.

Experts the miss policy names (`MissDecision.host`) and every expert of the first
`host_compute_layers` MoE layers (the miss policy is not asked there: every selected expert
runs, on the host) are computed on the host: no slot, no transfer, no eviction, never
prefetched or seeded. Their path starts when the router has decided and runs beside the
device's waves; the layer ends at the later of the two (`host_path.HostPath`, the model of
the path; counted by `CacheMetrics.count_host`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.cache.host_path import HostSpan, LayerPlanner
from moejax.errors import ConfigError
from moejax.policies.base import MissDecision


@dataclasses.dataclass(slots=True)
class HostRun:
    """One layer's host path: the contributions it computes, its span and when its results
    are back on the device (on the cache's clock)."""

    mask: np.ndarray
    span: HostSpan
    back: float


def first_layers(layers: tuple[int, ...], n) -> frozenset[int]:
    """The first `n` MoE layers (`cache.host_compute_layers`), computed on the host."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(layers):
        raise ConfigError(f"cache.host_compute_layers={n!r} must be an integer from 0 to "
                          f"{len(layers)} (the MoE layers whose experts always run on the "
                          "host)")
    return frozenset(layers[:n])


class HostCompute:
    """The host compute of one `ExpertCache` (`cache`): `layers`, the MoE layers computed on
    the host whole; `start` a layer's host path, `finish` its end."""

    def __init__(self, cache, n_layers, full_layers: int):
        self.cache = cache
        self.layers = first_layers(cache.shape.layers, n_layers)
        miss = cache.miss
        if miss.computes_on_host or self.layers:
            self._check(full_layers)
        if miss.computes_on_host:
            miss.set_planner(LayerPlanner(cache))

    def _check(self, full_layers: int) -> None:
        """Host compute needs a host model and every expert in host memory, and is not ds4's
        full layers (both place the first layers, one on the device, one on the host)."""
        cache = self.cache
        what = (f"miss policy {cache.miss.name!r}" if cache.miss.computes_on_host
                else f"cache.host_compute_layers={len(self.layers)}")
        if cache.host_path is None:
            raise ConfigError(f"{what} computes experts on the host, which needs the host's "
                              "model and the model's shapes: name the model "
                              "(--config.model.family=F --config.model.preset=P)")
        if cache.host is not None:
            raise ConfigError(f"{what} computes experts from host memory, so every expert "
                              "must be there: it needs cache.host_capacity_frac=1 and "
                              "cache.host_bytes=0 (no disk tier)")
        if full_layers and self.layers:
            raise ConfigError(f"cache.full_layers={full_layers} and cache.host_compute_layers="
                              f"{len(self.layers)} both place the first MoE layers (on "
                              "the device, on the host): set one")

    @staticmethod
    def whole_layer(ids: np.ndarray, weights: np.ndarray) -> MissDecision:
        """A layer computed on the host: every selected expert runs there."""
        return MissDecision(ids, weights, np.ones(ids.shape, bool),
                            host=frozenset(np.unique(ids).tolist()))

    def start(self, layer: int, ids: np.ndarray, active: np.ndarray, host: frozenset[int]
              ) -> HostRun | None:
        """The host path of the experts `host` names, starting now (None when none of their
        contributions runs)."""
        cache = self.cache
        if cache.sink is not None and not getattr(cache.sink, "computes_host_experts", False):
            what = (f"cache.host_compute_layers={len(self.layers)}"
                    if layer in self.layers else f"policies.miss={cache.miss.name}")
            raise ConfigError(f"{what}: this live runtime does not compute experts on the host "
                              "yet; replay it (configs/replay.py) instead")
        mask = active & np.isin(ids, list(host))
        if not mask.any():
            return None
        span = cache.host_path.span(ids, mask)
        return HostRun(mask, span, cache.clock.now() + span.down_s + span.compute_s
                       + span.back_s)

    def count(self, layer: int, pos: int, run: HostRun, had_prediction: bool) -> None:
        span, seen = run.span, self.cache.seen_this_pass
        self.cache.metrics.count_host(pos, len(span.experts), span.pairs,
                                      sum((layer, e) in seen for e in span.experts),
                                      span.compute_s, span.down_bytes, span.back_bytes,
                                      had_prediction)

    def finish(self, pos: int, run: HostRun) -> float:
        """The layer ends when the later of its two paths does: the device waits for the
        host's results. Returns the wait."""
        waited = self.cache.clock.wait(run.back)
        self.cache.metrics.count_host_wait(pos, waited)
        return waited
