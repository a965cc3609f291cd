"""Experts computed on the host (Fiddler; llama.cpp's `--n-cpu-moe`): the host path of one
layer, on the cache's clock, and the planner a miss policy reads to choose it.

A layer's host experts (`MissDecision.host`, or every expert of a layer in
`cache.host_compute_layers`) take no slot and no transfer of weights. Their path
(`moejax/timing/host.py` has the formulas), starting when the router has decided (`t0`):

    down  = t0 + h2d_latency_s + tokens_down * hidden * dtype_bytes / d2h_bw
    done  = down + sum over the host experts e, in rank order, of expert_s(t_e)
    back  = done + h2d_latency_s + host_pairs * hidden * 4 / link_bw

runs beside the device's (its fetches, its stall, its experts step over the resident
experts: Fiddler's CPU and GPU work in parallel). The layer ends at the later of the two:
`end = max(device end, back)`; `host_wait_s` counts `back - device end` where positive.

Each way is one transfer at its own rate with the link's latency, not queued on the copy
engines behind the expert transfers (a runtime sends them on a stream of their own, and they
are small beside an expert: a decode step of OLMoE returns 64 KB against 12.6 MB an expert);
their bytes are counted apart (`d2h_activation_bytes`, `h2d_activation_bytes`).

`LayerPlan.end` is that end for a choice of host experts, before anything is booked:
the device's fetches booked on copies of the copy engines' and the link's free times (what is
in flight already delays them), its late hits' landing times, its experts step from the cost
model, and the host path above. Every expert in host memory, it is the end the cache then
books, exactly (`tests/test_host_compute.py`), prefetches issued in the layer included (they
are booked after its demand fetches) — unless a demand fetch reuses the slot of a transfer
still in flight (it waits for that one to land) or `cache.prefetch_queue=watchdog_idle` issues
queued prefetches onto idle copy engines between the decision and the fetches.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.model_config import ModelConfig, dtype_bytes
from moejax.seam import requests_in_rank_order
from moejax.timing import CostModel, Hardware, HostCPU, timeline

# Bytes of one returned contribution element: the experts step carries a layer's
# contributions in float32 and sums them once after its last wave (moejax/seam.py, Wave).
CONTRIBUTION_BYTES = 4


@dataclasses.dataclass(frozen=True)
class HostSpan:
    """One layer's host work: its experts (rank order), the contributions and distinct tokens
    they compute, the activation bytes each way, and the modelled seconds of each step."""

    experts: tuple[int, ...]
    pairs: int
    tokens: int
    down_bytes: int
    back_bytes: int
    down_s: float
    compute_s: float
    back_s: float


class HostPath:
    """The host model of a cache: the host CPU, the link's latency and the way down's rate,
    and the model's shapes (an expert's parameters and bytes at the plain precision, the
    hidden size and activation dtype)."""

    def __init__(self, host: HostCPU, hw: Hardware, cfg: ModelConfig, expert_bytes: int):
        self.host, self.hw = host, hw
        self.params = cfg.expert_param_count
        self.expert_bytes = expert_bytes
        self.hidden = cfg.hidden_size
        self.act_bytes = dtype_bytes(cfg.dtype)
        self.link_gbps = hw.link_bandwidth_gbps
        self.d2h_gbps = host.d2h_gbps if host.d2h_gbps is not None else self.link_gbps
        self.cost = CostModel(cfg, hw)  # the experts step for plans on the wall clock

    def expert_s(self, tokens: int) -> float:
        return self.host.expert_s(tokens, self.params, self.expert_bytes)

    def span(self, ids: np.ndarray, mask: np.ndarray) -> HostSpan:
        """The host work of the contributions `mask` ([N, K] bool) of a layer's `ids`."""
        experts = requests_in_rank_order(ids, mask)
        flat = ids[mask]
        compute_s = 0.0
        for e in experts:
            compute_s += self.expert_s(int(np.count_nonzero(flat == e)))
        pairs = int(flat.size)
        tokens = int(np.count_nonzero(mask.any(axis=1)))
        return HostSpan(tuple(experts), pairs, tokens, self.down_bytes(tokens),
                        self.back_bytes(pairs), self.down_s(tokens), compute_s,
                        self.back_s(pairs))

    def down_bytes(self, tokens: int) -> int:
        """The hidden states of `tokens` tokens, sent to the host."""
        return tokens * self.hidden * self.act_bytes

    def down_s(self, tokens: int) -> float:
        """Sending them: the link's latency and the way down's rate (0 for no token)."""
        if not tokens:
            return 0.0
        return self.hw.h2d_latency_s + self.down_bytes(tokens) / (self.d2h_gbps * 1e9)

    def back_bytes(self, pairs: int) -> int:
        """`pairs` contributions returned, float32."""
        return pairs * self.hidden * CONTRIBUTION_BYTES

    def back_s(self, pairs: int) -> float:
        """Returning them: the link's latency and rate (0 for none)."""
        if not pairs:
            return 0.0
        return self.hw.h2d_latency_s + self.back_bytes(pairs) / (self.link_gbps * 1e9)

    def to_dict(self) -> dict:
        """results.json's `cache.host_compute.host` and the model's numbers it used."""
        return {**dataclasses.asdict(self.host), "d2h_gbps_used": self.d2h_gbps,
                "expert_params": self.params, "expert_bytes": self.expert_bytes,
                "hidden_size": self.hidden, "activation_bytes": self.act_bytes,
                "contribution_bytes": CONTRIBUTION_BYTES}


class LayerPlanner:
    """What a miss policy that `computes_on_host` reads of the cache: `plan(layer, ids,
    active)`, the running layer's `LayerPlan` (module docstring)."""

    def __init__(self, cache):
        self.cache = cache

    def plan(self, layer: int, ids: np.ndarray, active: np.ndarray) -> "LayerPlan":
        return LayerPlan(self.cache, layer, ids, active)


class LayerPlan:
    """The running layer's choices, before anything is booked: `end(host)` is when the layer
    would end on the cache's clock if the experts `host` were computed on the host and every
    other missing expert fetched — in one wave when the device's experts fit `wave_slots`,
    else in the waves the cache would run (its resident experts first, `wave_slots` a wave,
    each wave's fetches booked when the previous wave's experts step ends). `fits(n)`: whether
    a plan fetching `n` missing experts is modelled — always with one slot pool; with several
    precision pools only a one-wave plan is (`fetch_room` missing experts beside the resident
    ones: the pools' wave planning is not modelled). Computed once per layer, so that a
    policy can ask for many choices (the arithmetic is the cache's own: `HostPath.span`, the
    clock's booking, the cost model's experts step)."""

    def __init__(self, cache, layer: int, ids: np.ndarray, active: np.ndarray):
        clock = self.clock = cache.clock
        self.path = cache.host_path
        # The experts step as the clock charges it: the cache's cost model; none on a virtual
        # clock without one (compute takes no time there); on the wall clock, which charges
        # real time, the host model's estimate of it.
        self.cost = cache.cost
        if self.cost is None and clock.kind == "wall":
            self.cost = self.path.cost
        self.now = clock.now()
        self.tokens = ids.shape[0]
        self.requests = requests_in_rank_order(ids, active)
        flat = ids[active]
        self.pairs = {e: int(np.count_nonzero(flat == e)) for e in self.requests}
        # The tokens (rows) each expert's contributions come from (a decode step has one).
        self.rows = (None if self.tokens == 1 else
                     {e: ((ids == e) & active).any(axis=1) for e in self.requests})
        self.ready: dict[int, float] = {}  # resident or in flight: when it lands
        for e in self.requests:
            slot = cache.residency.get((layer, e))
            if slot is not None:
                self.ready[e] = cache.slot_ready[slot]
        self.expert_bytes = cache.shape.expert_bytes
        hits = len(self.ready)
        self.missing = [e for e in self.requests if e not in self.ready]
        self.fetch_room = max(0, min(len(self.missing), cache.wave_slots - hits))
        # A reserved full layer is resident whole: one wave, whatever its size (`waves.py`).
        fixed = bool(cache.fixed) and (layer, 0) in cache.fixed
        self.wave_slots = max(len(self.requests) if fixed else cache.wave_slots, 1)
        # Several pools plan their waves by pool (`PrecisionPools.plan_wave`): not modelled.
        self.multi_pool = cache.multi

    def fits(self, fetched: int) -> bool:
        """Whether a plan that fetches `fetched` of the missing experts is modelled."""
        return not self.multi_pool or fetched <= self.fetch_room

    def end(self, host: frozenset[int]) -> float:
        clock, path, now = self.clock, self.path, self.now
        engine_free, link_free = list(clock.engine_free), clock.link_free
        device = [e for e in self.requests if e not in host]
        if len(device) > self.wave_slots:  # several waves: resident first, as `waves.single_pool` cuts
            device = ([e for e in device if e in self.ready]
                      + [e for e in device if e not in self.ready])
        end = now
        for w in range(0, max(len(device), 1), self.wave_slots):
            # One wave, in the clock's own steps and order (the same floating-point
            # operations): its fetches booked at its start, compute waits for its experts,
            # then runs the experts step (the shared expert with the first wave).
            start, chunk = end, device[w:w + self.wave_slots]
            ready, pairs = start, 0
            for e in chunk:
                pairs += self.pairs[e]
                at = self.ready.get(e)
                if at is None:
                    booked = timeline.book(engine_free, link_free, self.expert_bytes, start,
                                           clock.latency_s, clock.engine_bps, clock.link_bps)
                    link_free, at = booked[3], booked[4]
                if at > ready:
                    ready = at
            end = start + timeline.stall(ready, start)
            if self.cost is not None:
                end += self.cost.experts(pairs, len(chunk), self.tokens, w == 0)
        # Then the layer waits for the host path.
        if not host:
            return end
        compute_s, host_pairs, rows = 0.0, 0, None
        for e in self.requests:  # rank order: the order `HostPath.span` adds them in
            if e in host:
                compute_s += path.expert_s(self.pairs[e])
                host_pairs += self.pairs[e]
                if self.rows is not None:
                    rows = self.rows[e] if rows is None else rows | self.rows[e]
        if not host_pairs:
            return end
        tokens = 1 if self.rows is None else int(np.count_nonzero(rows))
        back = now + path.down_s(tokens) + compute_s + path.back_s(host_pairs)
        return end + timeline.stall(back, end)
