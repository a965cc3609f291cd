"""Cache metrics exactly as DESIGN.md defines them, per MoE layer and in total.

* request: a (pass, layer, expert) the layer's computation needs after routing and miss policy;
* hit: resident and ready; late hit: in flight when needed; miss: neither
  (hits + late_hits + misses == requests);
* collision miss: a miss on an expert resident at the start of the pass or admitted during it;
* hit rate: `hit_rate` = (hits + late hits) / requests — an expert in the cache's table when
  the layer asks, landed or in flight: SpecMD's hit rate (docs/DESIGN.md, "One hit rate");
  `ready_hit_rate` = hits / requests (landed), `late_hit_rate` = late hits / requests; every
  table shows the two parts apart;
* prefetch precision = prefetched experts used by the pass-layer they were fetched for /
  experts prefetched; recall = requests served by a prefetch / requests in layers that had a
  prediction (both count transfers: what was fetched, not what was predicted);
* prediction precision / recall: the experts the prefetcher predicted for a pass-layer (every
  call's selection, fetched or found resident) against the router's own selection of that
  layer when it runs — |predicted ∩ routed| / |predicted| and / |routed|, whatever is resident;
* evicted before use: a prefetched expert evicted before the layer of this pass it was fetched
  for ran;
* prefetch dropped: a prediction the watchdog queue (`cache.prefetch_queue=watchdog` or
  `watchdog_idle`) never issued, because its target layer started first (no slot, or with
  `watchdog_idle` no idle copy engine, until then);
* collision share of misses = collision misses / misses;
* stall: time compute waits on transfers; `stall_behind_prefetch_s`, the part of it that
  demand fetches spent behind prefetch transfers already on the copy engines (per wave with a
  demand fetch: the wait of its first demand transfer for an engine, at most the wave's
  stall; a transfer on the engine is never pre-empted); bytes host->device split demand /
  prefetch, and wasted prefetch bytes (prefetched, evicted or left at the end without ever
  being used);
* products: active token-expert contributions computed (after the miss policy);
* TTFT per request: the clock time of each prefill pass (a request starts with one); the
  first is cold (`cold_ttft_s`, also `ttft_s`), `warm_ttft_s` the mean of the later ones,
  whose cache holds what earlier requests left.

Precisions (one slot pool per precision, `moejax/cache/capacity.py`). Bytes are counted at the
precision that moved (the pool's expert bytes), wasted prefetch bytes too. Per precision, per
layer and in total: `requests_by_precision` (each request under the precision it was *served*
at: its resident copy's), `products_by_precision` (contributions computed at each precision)
and `products_share_by_precision`, `h2d_bytes_by_precision` (demand + prefetch);
`sum(requests_by_precision) == requests`, `sum(h2d_bytes_by_precision) == h2d_bytes`.
* upgrade: an expert wanted at a higher precision than its resident copy, fetched again at the
  wanted one (the miss policy's `upgrade`). It is a **miss** for the hit/miss counters (and
  its bytes demand bytes), not a collision miss, and not an eviction;
* served below wanted: a hit on a copy at a lower precision than the one wanted (no upgrade).

Host compute (`moejax/cache/host_path.py`; `policies.miss=host_compute|latency_aware`,
`cache.host_compute_layers`), per layer and in total, 0 when nothing ran on the host:
* `host_computed`: requests computed on the host — per pass and layer, each distinct expert
  whose contributions the host computed (as misses are counted). Such a request was neither
  resident nor in flight: it is a **miss** (in `misses`, so SpecMD's hit rate counts it as
  one, and a collision miss when it was resident at the pass start or admitted since), but
  it moved no weights (not in `demand_bytes`): misses fetched = `misses - host_computed`;
  `host_computed_rate` = host_computed / requests. Under several pools it counts under the
  plain precision (the host computes from its copy at it) in `requests_by_precision`;
* `host_products`: the contributions the host computed (also in `products`);
* `host_compute_s`: the host's modelled compute (the sum of its calls, `timing/host.py`);
* `host_wait_s`: how long layers' ends waited for the host path (activations down, the
  host's compute, contributions back) after the device's own work was done;
* `d2h_activation_bytes` / `h2d_activation_bytes`: activations sent to the host (each token's
  hidden state once) and contributions returned (float32); apart from `h2d_bytes`, which are
  expert weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np

COUNTERS = ("requests", "hits", "late_hits", "misses", "collision_misses", "dropped",
            "substituted", "prefetch_issued", "prefetch_used", "recall_served",
            "recall_requests", "evictions", "waves", "upgrades", "served_below_wanted",
            "products", "evicted_before_use", "prefetch_dropped", "predicted",
            "predicted_routed", "routed")
SECONDS = ("stall_s", "stall_behind_prefetch_s")
BYTES = ("demand_bytes", "prefetch_bytes", "wasted_prefetch_bytes")
# Host compute (module docstring), kept apart from the compiled replay kernel's rows (which
# are COUNTERS + BYTES + SECONDS): the kernel never computes on the host, so they stay 0 there.
HOST_COUNTERS = ("host_computed", "host_products")
HOST_SECONDS = ("host_compute_s", "host_wait_s")
HOST_BYTES = ("d2h_activation_bytes", "h2d_activation_bytes")
HOST_ZEROS = {**dict.fromkeys(HOST_COUNTERS + HOST_BYTES, 0), **dict.fromkeys(HOST_SECONDS, 0.0)}
# Kept per precision when the cache has several pools (else they are the totals above).
BY_PRECISION = ("requests", "products", "demand_bytes", "prefetch_bytes")
PRECISION_FIELDS = ("requests_by_precision", "products_by_precision",
                    "products_share_by_precision", "h2d_bytes_by_precision")


@dataclasses.dataclass(slots=True)
class WaveOutcome:
    """What serving one wave of a layer found (the cache decides, the metrics count)."""

    hits: int = 0
    late_hits: int = 0
    misses: int = 0
    collisions: int = 0  # misses on experts resident at the pass start or admitted since
    prefetch_used: int = 0  # hits on experts prefetched for exactly this pass and layer
    upgrades: int = 0  # misses that replaced a lower-precision copy (counted in misses too)
    served_below_wanted: int = 0  # hits on a copy below the wanted precision
    products: int = 0  # token-expert contributions the wave computes
    demand_bytes: int | None = None  # None: misses x the plain precision's expert bytes
    demand_by_pool: list[int] | None = None  # the demand bytes of each precision pool
    ready: float = 0.0  # when the last of the wave's experts lands
    # When the last storage read feeding the wave (a demand fetch's, or the one behind a late
    # hit's transfer) lands; 0.0 when none was waited for (or no host tier).
    storage_ready: float = 0.0
    stall: float = 0.0  # how long compute waited for it
    # How long the wave's first demand transfer waited for a copy engine busy with prefetch
    # transfers (earlier waves' demand fetches have landed: compute waited for them).
    engine_wait: float = 0.0


@dataclasses.dataclass
class PassTiming:
    kind: str  # "prefill" or "decode"
    tokens: int
    start_s: float
    end_s: float
    stall_s: float  # waiting for transfers (storage reads behind them included)
    storage_stall_s: float = 0.0  # of the stall, waiting for storage reads
    host_wait_s: float = 0.0  # the layers' ends waiting for the host compute path
    host_work_s: float = 0.0  # the host's own work (dispatching, deciding: `RuntimeTiming`)

    @property
    def parts(self) -> dict[str, float]:
        """The pass's time by what it was spent on (`PARTS`): they add up to
        `end_s - start_s` (compute is the rest: the device's steps, or the host waiting for
        them)."""
        stall, host_wait, host_work = self.stall_s, self.host_wait_s, self.host_work_s
        return {"compute": (self.end_s - self.start_s) - stall - host_wait - host_work,
                "transfer_stall": stall - self.storage_stall_s,
                "storage_stall": self.storage_stall_s, "host_work": host_work,
                "host_compute": host_wait}


# A virtual time's parts (results.json `timing.parts`): the compiled steps (on the device, or
# the host waiting for them), waiting for transfers, waiting for storage reads behind them,
# the host's own work (only where the profile models it), waiting for the host compute path.
PARTS = ("compute", "transfer_stall", "storage_stall", "host_work", "host_compute")


def parts_of(passes: list[PassTiming]) -> dict[str, float]:
    """The parts of `passes`' time, summed (`PassTiming.parts`, each pass's part added in pass
    order: the same sums, without a dict a pass; a grid cell sums a few hundred passes)."""
    compute = transfer = storage = host_work = host_compute = 0.0
    for p in passes:
        stall, wait, work = p.stall_s, p.host_wait_s, p.host_work_s
        compute += (p.end_s - p.start_s) - stall - wait - work
        transfer += stall - p.storage_stall_s
        storage += p.storage_stall_s
        host_work += work
        host_compute += wait
    return dict(zip(PARTS, (compute, transfer, storage, host_work, host_compute)))


class CacheMetrics:
    def __init__(self, layers: list[int], precisions: tuple[str, ...] = ("native",)):
        """`precisions`: the cache's pools, high to low; the first is the plain one."""
        self.layers = list(layers)
        self.precisions = tuple(precisions)
        n = len(layers)
        # Plain Python lists: the cache increments them several times per request, and a list
        # item add is ~10x cheaper than a numpy scalar one (replay runs millions of requests).
        self.c: dict[str, list] = {k: [0] * n for k in COUNTERS + BYTES + HOST_COUNTERS
                                   + HOST_BYTES}
        self.c.update({k: [0.0] * n for k in SECONDS + HOST_SECONDS})
        self._passes: list[PassTiming] = []
        # The compiled replay hands over a function that builds the pass timings when first
        # read (thousands of objects a replay that reads only its totals never needs).
        self._deferred_passes = None
        # Running totals after each pass (TensorBoard series); the compiled replay path
        # (`moejax/replay/compiled.py`) hands over a function that builds them when read.
        self._snapshots: list[dict] = []
        self._deferred = None
        # Snapshots taken but not built yet: each pass's counter sums (in `c`'s order) and
        # its clock seconds; a snapshot's dict is built when `snapshots` is read (the live
        # runtime takes one per pass on the host's critical path).
        self._raw_snapshots: list[tuple[list, float]] = []
        # With several pools: counter -> pool index -> per layer (`count_pools`).
        self.pc: dict[str, list[list]] | None = None
        if len(self.precisions) > 1:
            self.pc = {k: [[0] * n for _ in self.precisions] for k in BY_PRECISION}

    @property
    def snapshots(self) -> list[dict]:
        if self._raw_snapshots:
            names = list(self.c)
            for sums, pass_s in self._raw_snapshots:
                t = self.summary(dict(zip(names, sums)))
                t["pass_s"] = pass_s
                self._snapshots.append(t)
            self._raw_snapshots.clear()
        if self._deferred is not None:
            self._snapshots, self._deferred = self._deferred(), None
        return self._snapshots

    def defer_snapshots(self, build) -> None:
        """`build()` -> the list of snapshots, called when they are first read."""
        self._deferred = build

    @property
    def passes(self) -> list[PassTiming]:
        """Every pass's timing, in order (the cache appends one per pass)."""
        if self._deferred_passes is not None:
            self._passes, self._deferred_passes = self._deferred_passes(), None
        return self._passes

    @passes.setter
    def passes(self, value: list[PassTiming]) -> None:
        self._passes, self._deferred_passes = value, None

    def defer_passes(self, build) -> None:
        """`build()` -> the list of pass timings, called when they are first read."""
        self._deferred_passes = build

    @property
    def per_layer(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.c.items()}

    # -- counting (called by the cache; plain list updates, the replay hot path) ---------------
    def count_wave(self, pos: int, requests: int, o: WaveOutcome, had_prediction: bool,
                   expert_bytes: int) -> None:
        c = self.c
        c["requests"][pos] += requests
        c["hits"][pos] += o.hits
        c["late_hits"][pos] += o.late_hits
        c["misses"][pos] += o.misses
        c["collision_misses"][pos] += o.collisions
        c["demand_bytes"][pos] += (o.misses * expert_bytes if o.demand_bytes is None
                                   else o.demand_bytes)
        c["prefetch_used"][pos] += o.prefetch_used
        c["products"][pos] += o.products
        if o.upgrades or o.served_below_wanted:
            c["upgrades"][pos] += o.upgrades
            c["served_below_wanted"][pos] += o.served_below_wanted
        if had_prediction:
            c["recall_served"][pos] += o.prefetch_used
            c["recall_requests"][pos] += requests
        c["waves"][pos] += 1
        c["stall_s"][pos] += o.stall
        if o.engine_wait:
            c["stall_behind_prefetch_s"][pos] += min(o.stall, o.engine_wait)

    def count_decision(self, pos: int, dropped: int, substituted: int) -> None:
        self.c["dropped"][pos] += dropped
        self.c["substituted"][pos] += substituted

    def count_pools(self, pos: int, requests: list[int], products: list[int],
                    demand_bytes: list[int]) -> None:
        """One wave's requests (by served precision), products and demand bytes, per pool
        (several pools only; `count_wave` counts the totals)."""
        pc = self.pc
        for i in range(len(self.precisions)):
            pc["requests"][i][pos] += requests[i]
            pc["products"][i][pos] += products[i]
            pc["demand_bytes"][i][pos] += demand_bytes[i]

    def count_host(self, pos: int, experts: int, pairs: int, collisions: int, compute_s: float,
                   d2h_bytes: int, h2d_bytes: int, had_prediction: bool) -> None:
        """A layer's `experts` computed on the host (`pairs` contributions, `collisions` of
        them resident at the pass start or admitted since): requests and misses that moved no
        weights (module docstring)."""
        c = self.c
        c["requests"][pos] += experts
        c["misses"][pos] += experts
        c["collision_misses"][pos] += collisions
        c["products"][pos] += pairs
        c["host_computed"][pos] += experts
        c["host_products"][pos] += pairs
        c["host_compute_s"][pos] += compute_s
        c["d2h_activation_bytes"][pos] += d2h_bytes
        c["h2d_activation_bytes"][pos] += h2d_bytes
        if had_prediction:
            c["recall_requests"][pos] += experts
        if self.pc is not None:  # computed at the plain precision, the first pool's
            self.pc["requests"][0][pos] += experts
            self.pc["products"][0][pos] += pairs

    def count_host_wait(self, pos: int, seconds: float) -> None:
        """The layer's end waited `seconds` for the host path after the device's work."""
        self.c["host_wait_s"][pos] += seconds

    def count_prefetch(self, target_pos: int, nbytes: int, pool: int = 0) -> None:
        self.c["prefetch_issued"][target_pos] += 1
        self.c["prefetch_bytes"][target_pos] += nbytes
        if self.pc is not None:
            self.pc["prefetch_bytes"][pool][target_pos] += nbytes

    def count_eviction(self, pos: int, wasted_bytes: int, before_use: bool = False) -> None:
        """An eviction; `wasted_bytes` when the expert was prefetched and never used,
        `before_use` when the layer it was prefetched for had not run yet."""
        self.c["evictions"][pos] += 1
        self.c["wasted_prefetch_bytes"][pos] += wasted_bytes
        if before_use:
            self.c["evicted_before_use"][pos] += 1

    def count_prefetch_dropped(self, target_pos: int) -> None:
        """A queued prediction the watchdog never issued: its target layer started first."""
        self.c["prefetch_dropped"][target_pos] += 1

    def count_prediction(self, pos: int, predicted: int, correct: int, routed: int) -> None:
        """A pass-layer that had a prediction: sizes of the predicted set, of its intersection
        with the router's selection, and of that selection."""
        c = self.c
        c["predicted"][pos] += predicted
        c["predicted_routed"][pos] += correct
        c["routed"][pos] += routed

    def count_wasted_prefetch(self, pos: int, nbytes: int) -> None:
        self.c["wasted_prefetch_bytes"][pos] += nbytes

    # -- summaries ---------------------------------------------------------------------------
    @staticmethod
    def _rates(c: dict) -> dict:
        req = c["requests"]
        issued = c["prefetch_issued"]
        return {
            "hit_rate": (c["hits"] + c["late_hits"]) / req if req else None,
            "ready_hit_rate": c["hits"] / req if req else None,
            "late_hit_rate": c["late_hits"] / req if req else None,
            "miss_rate": c["misses"] / req if req else None,
            "host_computed_rate": c["host_computed"] / req if req else None,
            "collision_miss_rate": c["collision_misses"] / req if req else None,
            "collision_share_of_misses": (c["collision_misses"] / c["misses"]
                                          if c["misses"] else None),
            "prefetch_precision": c["prefetch_used"] / issued if issued else None,
            "prefetch_recall": (c["recall_served"] / c["recall_requests"]
                                if c["recall_requests"] else None),
            "prediction_precision": (c["predicted_routed"] / c["predicted"]
                                     if c["predicted"] else None),
            "prediction_recall": c["predicted_routed"] / c["routed"] if c["routed"] else None,
        }

    def _by_precision(self, c: dict, pick) -> dict:
        """The per-precision fields of a row `c` of totals; `pick(list)` reduces one per-layer
        list (a sum for the totals, one item for a layer)."""
        if self.pc is None:
            (p,) = self.precisions
            per = {k: {p: c[k]} for k in BY_PRECISION}
        else:
            per = {k: {p: pick(self.pc[k][i]) for i, p in enumerate(self.precisions)}
                   for k in BY_PRECISION}
        products = c["products"]
        return {
            "requests_by_precision": per["requests"],
            "products_by_precision": per["products"],
            "products_share_by_precision": {p: (v / products if products else None)
                                            for p, v in per["products"].items()},
            "h2d_bytes_by_precision": {p: per["demand_bytes"][p] + per["prefetch_bytes"][p]
                                       for p in self.precisions},
        }

    @classmethod
    def summary(cls, c: dict) -> dict:
        """Counter sums `c` with `h2d_bytes` and the rates added (a snapshot's fields)."""
        c = {**HOST_ZEROS, **c, "h2d_bytes": c["demand_bytes"] + c["prefetch_bytes"]}
        return {**c, **cls._rates(c)}

    def totals(self, by_precision: bool = True) -> dict:
        t = self.summary({k: sum(v) for k, v in self.c.items()})
        if not by_precision:
            return t
        return {**t, **self._by_precision(t, sum)}

    def snapshot(self) -> None:
        """The running totals now (`totals` without the per-precision ones, which the
        TensorBoard series do not plot) and the last pass's seconds, built when read."""
        self._raw_snapshots.append(
            ([sum(v) for v in self.c.values()],
             self.passes[-1].end_s - self.passes[-1].start_s if self.passes else 0.0))

    def layer_table(self) -> list[dict]:
        rows = []
        for pos, layer in enumerate(self.layers):
            c = {k: v[pos] for k, v in self.c.items()}
            rows.append({"layer": layer, **c, **self._rates(c),
                         **self._by_precision(c, lambda v, pos=pos: v[pos])})
        return rows

    def timing(self) -> dict:
        prefill = [p for p in self.passes if p.kind == "prefill"]
        decode = [p for p in self.passes if p.kind == "decode"]
        decode_s = sum(p.end_s - p.start_s for p in decode)
        # A request starts with a prefill pass: its TTFT is that pass's clock time. The first
        # request's cache is cold; a later one finds what earlier requests left (warm).
        ttfts = [p.end_s - p.start_s for p in prefill]
        return {
            "ttft_s": ttfts[0] if ttfts else None,
            "ttft_per_request_s": ttfts,
            "cold_ttft_s": ttfts[0] if ttfts else None,
            "warm_ttft_s": sum(ttfts[1:]) / (len(ttfts) - 1) if len(ttfts) > 1 else None,
            "decode_s": decode_s,
            "decode_tokens": sum(p.tokens for p in decode),
            "decode_tok_per_s": (sum(p.tokens for p in decode) / decode_s) if decode_s else None,
            "total_s": (self.passes[-1].end_s - self.passes[0].start_s) if self.passes else 0.0,
            "prefill_stall_s": sum(p.stall_s for p in prefill),
            "decode_stall_s": sum(p.stall_s for p in decode),
            # What the cold TTFT and the decode time were spent on (`PARTS`).
            "parts": {"ttft": parts_of(prefill[:1]), "decode": parts_of(decode)},
        }

    def to_dict(self, passes: bool = True) -> dict:
        """Totals, per layer, timing and (`passes`) every pass's timing."""
        out = {"total": self.totals(), "per_layer": self.layer_table(), "timing": self.timing()}
        if passes:
            out["passes"] = [dataclasses.asdict(p) for p in self.passes]
        return out
