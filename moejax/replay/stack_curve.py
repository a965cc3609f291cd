"""Capacity curves: a trace's hits, late hits, misses and collision misses at every cache size,
from one pass over its requests where moejax's own semantics make the eviction a stack
algorithm (Mattson et al. 1970), and from the compiled replay engine at each size elsewhere.

**The rule, and why it is exact** (docs/DESIGN.md, "Capacity curves in one pass"). A request
is a `(pass, MoE layer position, expert)`; a pass-layer's requests are distinct, in router-rank
order. The stack of a request is every key by its last use, most recent first; its *depth* is
its place in that stack counting itself (1: the key used last), 0 when it was never used.
Global LRU (`lru`), with no prefetch, the fetch miss policy, standard routing, one precision
pool and nothing placed before the first pass, at C slots with C at least the widest
pass-layer's requests (one wave per pass-layer: `moejax/cache/waves.py`):

* `cache.pin_scope=layer`: the running pass-layer's keys are protected together. At every
  pass-layer's start the cache holds exactly the top C keys of the stack: a miss takes a free
  slot, else evicts the least recent key outside the pass-layer, so after the pass-layer the
  cache holds its n keys and the C - n most recent others — the top C of the new stack, in
  which the pass-layer's keys are the n most recent (n <= C). So a request hits iff its depth
  *at its pass-layer's start* is <= C (the keys of the same pass-layer ahead of it in rank
  order do not push it down: they are protected, it is not evicted for them).
* `cache.pin_scope=request`: only the key being fetched is protected, so the cache is the
  textbook LRU over the requests in rank order: hit iff the depth *at the request* is <= C.
* A collision miss is a miss on a key evicted earlier in the same pass (the kernel's "evicted
  in this pass"). Without prefetch a key enters the cache only at its own request, once per
  pass, so that is a key resident at its pass's start and gone at its request: depth at the
  pass's start <= C < depth at the request. Its depth only grows in between (the key is not
  used), so `collision_misses(C) = #{depth at pass start <= C} - hits(C)`.
* Late hits are 0: without prefetch every transfer is a demand fetch, and its wave waits for
  it (the stall) before the next pass-layer asks.

Below the widest pass-layer a pass-layer is served in waves, resident keys first, and which
keys are resident depends on C: those sizes are replayed. The strict per-layer LRU
(`lru_per_layer(quota=strict)`, `strict_per_layer`: each layer a fixed quota) is the same rule
over each layer's own requests at its quota, wherever every quota is at least its layer's
widest pass-layer. Every other eviction — moejax's `lru_per_layer`, which lets a layer exceed its share while free slots
remain (not a stack algorithm), FIFO, LFU, FLD, Least-Stale, Belady — and any prefetcher, miss
or routing policy other than the above, is replayed at each size (`moejax.replay.replay`,
`replay.engine`), each row saying its `method`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable

import numba
import numpy as np

from moejax.cache import ExpertCache
from moejax.replay import compiled, coverage
from moejax.replay.engine import replay

STACK, REPLAY = "stack", "replay"
# The stack forms: one stack over every key, or one per MoE layer (a strict per-layer quota).
GLOBAL, PER_LAYER = "global", "per_layer"
# The counters a curve row has (the cache's totals of the same names).
COUNTED = ("hits", "late_hits", "misses", "collision_misses")


@dataclasses.dataclass(frozen=True)
class Requests:
    """A replay's cache requests, as the cache receives them: `keys[i] = position * E + expert`,
    pass-layer after pass-layer (pass by pass, MoE layer positions in order), each pass-layer's
    distinct experts in router-rank order; pass-layer `j` is `keys[starts[j]:starts[j + 1]]`."""

    keys: np.ndarray
    starts: np.ndarray
    num_layers: int
    num_experts: int

    @property
    def num_passes(self) -> int:
        return (len(self.starts) - 1) // self.num_layers

    @property
    def sizes(self) -> np.ndarray:
        """Requests per pass-layer, `[passes, layers]`."""
        return np.diff(self.starts).reshape(self.num_passes, self.num_layers)

    @property
    def widest(self) -> int:
        """The most requests of one pass-layer (0 for no pass)."""
        return int(self.sizes.max()) if len(self.keys) else 0

    def widest_per_layer(self) -> np.ndarray:
        return (self.sizes.max(axis=0) if self.num_passes
                else np.zeros(self.num_layers, np.int64))

    def distinct(self) -> int:
        """The distinct experts (keys) requested."""
        return int(len(np.unique(self.keys)))

    def distinct_per_layer(self) -> np.ndarray:
        layer = np.unique(self.keys) // self.num_experts
        return np.bincount(layer, minlength=self.num_layers).astype(np.int64)

    def of_layer(self, pos: int) -> Requests:
        """The requests of MoE layer position `pos` alone, as a one-layer trace's (one
        pass-layer per pass, keys the experts)."""
        sizes = self.sizes[:, pos]
        starts = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=starts[1:])
        mine = self.keys[self.keys // self.num_experts == pos] - pos * self.num_experts
        return Requests(mine, starts, 1, self.num_experts)


def requests_of(traces, num_experts: int) -> Requests:
    """The requests of `traces` replayed one after another through one cache (standard routing
    and the fetch miss policy: the router's selection, distinct experts per pass-layer in rank
    order), as the compiled engine lays them out (`compiled.requests`)."""
    n_layers = len(traces[0].layers) if traces else 0
    if any(len(trace.layers) != n_layers for trace in traces):
        raise ValueError("traces of different layer counts in one replay")
    if not traces or not any(trace.num_passes for trace in traces):
        return Requests(np.zeros(0, np.int32), np.zeros(1, np.int64), n_layers, num_experts)
    keys, starts, _, _ = compiled.requests(traces, num_experts)
    return Requests(keys, starts, n_layers, num_experts)


# -- stack depths ----------------------------------------------------------------------------
@numba.njit(cache=True)
def _marks_before(tree, t):
    """Marks at request indices < t (a Fenwick tree over request indices, 1-based)."""
    s = 0
    while t > 0:
        s += tree[t]
        t -= t & -t
    return s


@numba.njit(cache=True)
def _mark(tree, t, v):
    t += 1
    while t < len(tree):
        tree[t] += v
        t += t & -t


@numba.njit(cache=True)
def _depths(keys, starts, per_pass, n_keys, at_request):
    """Each request's stack depth (1: its key was the last used; 0: never used before) when the
    cache decides it — at its pass-layer's start, or at the request itself (`at_request`) —
    and at its pass's start (`per_pass` pass-layers a pass). The stack is a Fenwick tree
    marking each key's last use among the request indices: a key's depth is the marks at or
    after its last use."""
    n = len(keys)
    tree = np.zeros(n + 1, np.int64)
    last = np.full(n_keys, -1, np.int64)
    at = np.zeros(n, np.int64)
    at_pass = np.zeros(n, np.int64)
    marked = 0
    n_pl = len(starts) - 1
    for pl0 in range(0, n_pl, per_pass):
        pl1 = min(pl0 + per_pass, n_pl)
        for i in range(starts[pl0], starts[pl1]):
            t = last[keys[i]]
            if t >= 0:
                at_pass[i] = marked - _marks_before(tree, t)
        for pl in range(pl0, pl1):
            a, b = starts[pl], starts[pl + 1]
            if not at_request:
                for i in range(a, b):
                    t = last[keys[i]]
                    if t >= 0:
                        at[i] = marked - _marks_before(tree, t)
            for i in range(a, b):
                k = keys[i]
                t = last[k]
                if t >= 0:
                    if at_request:
                        at[i] = marked - _marks_before(tree, t)
                    _mark(tree, t, -1)
                else:
                    marked += 1
                _mark(tree, i, 1)
                last[k] = i
    return at, at_pass


def load_depths() -> float:
    """Makes the depth kernel callable (numba's disk cache, or a compile the first time on a
    machine); the seconds it took (about 0 once loaded in this process)."""
    t0 = time.perf_counter()
    i64 = numba.typeof(np.zeros(1, np.int64))
    _depths.compile((i64, i64, numba.int64, numba.int64, numba.boolean))
    return time.perf_counter() - t0


def depths(requests: Requests, pin_scope: str) -> tuple[np.ndarray, np.ndarray]:
    """`(at, at_pass)`: each request's depth in one stack over every key when the cache decides
    it (`pin_scope=layer`: at its pass-layer's start; `request`: at the request), and at its
    pass's start."""
    if pin_scope not in ("layer", "request"):
        raise ValueError(f"pin_scope={pin_scope!r}")
    n_keys = requests.num_layers * requests.num_experts
    keys = requests.keys
    if len(keys) and not (0 <= keys.min() and keys.max() < n_keys):  # (no bounds checks in it)
        raise ValueError(f"request keys outside 0..{n_keys - 1}")
    if requests.starts[-1] != len(keys):
        raise ValueError("the pass-layer starts do not cover the requests")
    return _depths(requests.keys, requests.starts, requests.num_layers,
                   requests.num_layers * requests.num_experts, pin_scope == "request")


@dataclasses.dataclass(frozen=True)
class StackCounts:
    """Counts at every capacity from one stack's depths: `hits[c]` requests of depth 1..c,
    `resident_at_pass[c]` of depth 1..c at their pass's start (c up to the deepest, then
    flat)."""

    requests: int
    hits: np.ndarray
    resident_at_pass: np.ndarray

    @classmethod
    def of(cls, at: np.ndarray, at_pass: np.ndarray) -> StackCounts:
        top = int(max(at.max(initial=0), at_pass.max(initial=0))) + 1
        return cls(len(at), np.cumsum(np.bincount(at[at > 0], minlength=top + 1)),
                   np.cumsum(np.bincount(at_pass[at_pass > 0], minlength=top + 1)))

    def at(self, capacity: int) -> dict[str, int]:
        c = min(capacity, len(self.hits) - 1)
        hits = int(self.hits[c])
        return {"hits": hits, "late_hits": 0, "misses": self.requests - hits,
                "collision_misses": int(self.resident_at_pass[c]) - hits}


def global_counts(requests: Requests, pin_scope: str) -> StackCounts:
    """Global LRU's counts at every capacity at least `requests.widest`."""
    return StackCounts.of(*depths(requests, pin_scope))


def per_layer_counts(requests: Requests, pin_scope: str) -> list[StackCounts]:
    """A strict per-layer LRU's counts: each layer's own stack, at every quota of it at least
    its widest pass-layer."""
    return [global_counts(requests.of_layer(pos), pin_scope)
            for pos in range(requests.num_layers)]


def sum_per_layer(counts: list[StackCounts], quota: Iterable[int]) -> dict[str, int]:
    """The cache's counts with layer `pos` at `quota[pos]` slots of its own."""
    out = dict.fromkeys(COUNTED, 0)
    for layer, q in zip(counts, quota):
        for k, v in layer.at(int(q)).items():
            out[k] += v
    return out


# -- which method -------------------------------------------------------------------------------
def stack_form(cache: ExpertCache) -> tuple[str | None, str]:
    """Whether `cache`'s counts come from stack distances, and in which form: `(GLOBAL or
    PER_LAYER, what)`, or `(None, why not)` (then every size is replayed)."""
    eviction = cache.eviction
    if eviction.kernel_form() == "lru":
        kind = GLOBAL
    elif strict_per_layer(eviction):
        kind = PER_LAYER
    else:
        return None, (f"eviction {eviction.name} is not a stack algorithm in moejax's "
                      "semantics (only lru and a strict per-layer LRU are)")
    if cache.prefetch.name != "none":
        return None, f"prefetch {cache.prefetch.name}: the stack rule holds without prefetch"
    why = coverage.uncovered(cache)
    if why is not None:  # (miss fetch, routing standard, one pool, nothing placed, ...)
        return None, f"{why}: the stack rule is derived for what the compiled engine runs"
    return kind, ("stack distances over every key" if kind == GLOBAL
                  else "stack distances per layer, each at its quota")


def strict_per_layer(eviction) -> bool:
    """Whether `eviction` is an LRU per layer whose layers never hold more than their quota
    (`lru_per_layer(quota=strict)`, the registry's own class, with a compiled form). The
    default `lru_per_layer` lends free slots to a layer over its share, which is not a stack
    algorithm."""
    from moejax.policies.registry import policy_class

    return (type(eviction) is policy_class("eviction", "lru_per_layer")
            and (eviction.arguments or {}).get("quota") == "strict"
            and eviction.kernel_form() is not None)


def _quota(cache: ExpertCache) -> np.ndarray:
    return np.asarray(cache.eviction.quota, np.int64)


@dataclasses.dataclass
class Curve:
    """One eviction's counts at each capacity (`rows`: `slots`, the `COUNTED` counters,
    `requests`, `method`), how they were made (`form`: GLOBAL, PER_LAYER or None; `why`), the
    smallest size the stack rule holds at (`stack_from`, None without one) and the wall-clock
    seconds of each part (`stack_s`: the depths and the counts; `replay_s`: the replays)."""

    rows: list[dict]
    form: str | None
    why: str
    stack_from: int | None
    stack_s: float = 0.0
    replay_s: float = 0.0
    replays: int = 0


def counts_of(cache: ExpertCache) -> dict[str, int]:
    """The `COUNTED` totals of a replayed cache."""
    totals = cache.metrics.totals()
    return {k: int(totals[k]) for k in COUNTED}


def replayed(make_cache: Callable[[int], ExpertCache], capacity: int, traces,
             context: list[int] | None, engine: str, on_load=None) -> dict[str, int]:
    """The counts of one replay at `capacity` slots (`moejax.replay.replay`)."""
    cache = make_cache(capacity)
    replay(cache, traces, context, engine=engine, on_load=on_load)
    return counts_of(cache)


def capacity_curve(make_cache: Callable[[int], ExpertCache], traces,
                   context: list[int] | None, capacities: list[int], *,
                   engine: str = "auto", requests: Requests | None = None, on_row=None,
                   on_load=None) -> Curve:
    """The counts at each of `capacities` (slots, ascending) of the cache `make_cache(slots)`
    builds (a fresh one per call, every setting but the size the same): from stack distances
    where they are exact (`stack_form`; at least the widest pass-layer, per layer at its
    quota), else by replaying the trace through it (`engine`: `replay.engine`). `requests`:
    `requests_of(traces)`, when the caller has it. `on_row(capacity, method)` is called as
    each row is done (a progress bar); `on_load` is `moejax.replay.replay`'s."""
    if not capacities:
        return Curve([], None, "no capacity", None)
    probe = make_cache(capacities[-1])
    form, why = stack_form(probe)
    rows: dict[int, dict] = {}
    stack_s = 0.0
    if form is not None:
        t0 = time.perf_counter()
        if requests is None:
            requests = requests_of(traces, probe.shape.num_experts)
        if form == GLOBAL:
            counts = global_counts(requests, probe.pin_scope)
            for c in capacities:
                if c >= requests.widest:
                    rows[c] = counts.at(c)
        else:
            per_layer = per_layer_counts(requests, probe.pin_scope)
            widest = requests.widest_per_layer()
            for c in capacities:
                quota = _quota(make_cache(c))
                if (quota >= widest).all():
                    rows[c] = sum_per_layer(per_layer, quota)
        stack_s = time.perf_counter() - t0
    stack_from = min(rows) if rows else None
    replay_s, replays = 0.0, 0
    out = []
    for c in capacities:
        if c in rows:
            method, row = STACK, rows[c]
        else:
            t0 = time.perf_counter()
            row = replayed(make_cache, c, traces, context, engine, on_load)
            replay_s += time.perf_counter() - t0
            replays += 1
            method = REPLAY
        out.append({"slots": int(c), **row,
                    "requests": sum(row[k] for k in ("hits", "late_hits", "misses")),
                    "method": method})
        if on_row is not None:
            on_row(c, method)
    counted = {r["requests"] for r in out} | (set() if requests is None
                                               else {len(requests.keys)})
    if len(counted) != 1:  # (a defect: every size serves the same requests)
        raise AssertionError(f"the curve's sizes counted different requests: {sorted(counted)}")
    return Curve(out, form, why, stack_from, stack_s, replay_s, replays)
