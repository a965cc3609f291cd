"""Routing policies: `standard` keeps the router's choice; `cache_aware(lam)` biases the
selection toward cached experts (Skliar et al.; SpecMD §3):

    z' = z + lam * delta_avg * 1_C

selection by z' (top-k), contribution weights from the *original* router probabilities
(dual-logit semantics), renormalised over the new selection when the family renormalises.
`z` is the log of the router softmax (logits up to a per-token constant, which neither the
selection nor the bias depends on). `delta_avg` is the running average, per layer, of the
per-token logit range max(z) - min(z): the historical scale of the logits, so `lam` is a
fraction of it (SpecMD finds 0.1-0.5 works best).

`trace(path=T)` makes a live run choose exactly the experts the recorded trace T chose, pass by
pass (`moejax/traces/driven.py`): the runtime hands the cache T's gate in place of the router's
(`CachedExperts.gate_source`, wired in `moejax/serving/build.py`), so this policy passes the
selection through like `standard`; only an id-only trace's missing weights become `1/K` each
for the experts step (the cache counts nothing by weight on such a gate: the miss policies read
`gate.weights`, still None). Replay already follows its own trace and refuses it.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError
from moejax.policies.base import LayerGate, RoutingPolicy
from moejax.policies.declare import Choice, Floats, KernelForm
from moejax.policies.registry import register


@register("routing", "standard")
class Standard(RoutingPolicy):
    """The router's own top-k, whatever is resident."""

    name = "standard"
    KERNEL = KernelForm("standard")

    def select(self, gate, cached):
        return gate.ids, gate.weights


@register("routing", "cache_aware")
class CacheAware(RoutingPolicy):
    """Top-k with resident experts favoured: their log router probabilities raised by `lam`
    times the layer's mean range of log probabilities over the tokens seen so far."""

    name = "cache_aware"
    ARGS = {"lam": Floats(0.0, 2.0, at_least=0.0)}
    needs_probs = True

    def __init__(self, top_k: int, renormalize: bool, lam: float = 0.3):
        if lam < 0:
            raise ValueError(f"lam={lam} must be >= 0")
        self.top_k, self.renormalize, self.lam = top_k, renormalize, lam
        self.range_sum: dict[int, float] = {}
        self.range_count: dict[int, int] = {}

    def select(self, gate: LayerGate, cached: set[int]):
        if gate.probs is None:
            raise ConfigError("routing policy 'cache_aware' needs router probabilities; this "
                              "source has none (an id-only trace?)")
        probs = gate.probs.astype(np.float64)
        z = np.log(np.maximum(probs, 1e-30))
        self.range_sum[gate.layer] = self.range_sum.get(gate.layer, 0.0) + float(
            (z.max(-1) - z.min(-1)).sum())
        self.range_count[gate.layer] = self.range_count.get(gate.layer, 0) + len(z)
        if not cached or self.lam == 0:
            return gate.ids, gate.weights
        delta = self.range_sum[gate.layer] / self.range_count[gate.layer]
        bias = np.zeros(z.shape[-1])
        bias[list(cached)] = self.lam * delta
        ids = np.argsort(-(z + bias), axis=-1, kind="stable")[:, : self.top_k]
        weights = np.take_along_axis(probs, ids, axis=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdims=True)
        ids, weights = ids.astype(gate.ids.dtype), weights.astype(np.float32)
        # Tokens whose expert set did not change keep the router's own ids and weights exactly
        # (this also keeps families with other weight rules, e.g. sparsemixer, unchanged).
        same = (np.sort(ids, -1) == np.sort(gate.ids, -1)).all(-1)
        ids[same], weights[same] = gate.ids[same], gate.weights[same]
        return ids, weights


class TracePath(Choice):
    """A trace file's path: any string (`trace(path=T)`), or None, the default (not given: a
    live run refuses it). A `Choice` to the tools that dispatch on the declared domain kinds:
    the policy fuzzers draw its `values` (the path is read only when a live run is built, never
    by the cache), and a string is a value of its kind."""

    def __init__(self):
        super().__init__((None, "trace.npz"))

    def contains(self, value):
        return value is None or isinstance(value, str)

    def takes(self):
        return "a path to a trace file (moejax .npz, capture JSONL or vLLM rows)"


@register("routing", "trace")
class TraceRouting(RoutingPolicy):
    """Runs what the trace at `path` chose (module docstring). No compiled form: replay refuses
    it, and a cache built with it directly runs on the reference engine."""

    name = "trace"
    ARGS = {"path": TracePath()}

    def __init__(self, path: str | None = None):
        self.path = path

    def select(self, gate, cached):
        if gate.weights is not None:
            return gate.ids, gate.weights
        # An id-only trace has no weights: the experts step sums the K experts with equal
        # weights 1/K, keeping the layer's output at the scale of one expert's.
        return gate.ids, np.full(gate.ids.shape, 1.0 / gate.ids.shape[-1], np.float32)
