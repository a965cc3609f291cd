"""The compiled replay against the machine's own limit: a bare compiled LRU (a numba linked list
over the `L * E` keys, hits only), a bare per-layer LRU (one list and a fixed quota per layer),
the bare LRU with temporal prefetch and the bare LRU with the virtual clock's transfer booking
beside moejax's compiled replay of the same request stream, in one process, alternated.

    python benchmarks/replay_limit.py [--trace=olmoe_prose | --trace=FILE |
        --random_shape=LxExK] [--reps=5] [--repeats=1,16] [--capacities=0.05,0.25]

The stream: a shipped real capture (`moejax/assets/captures/`, 512 decode steps x 16 layers x
top-8 = 65 536 requests for OLMoE) or any trace file the replay job reads (`--trace=FILE`:
every sequence in it, in order), replayed `--repeats` times through one cache (16: about 1M
requests for a capture), every pass's MoE layers in order and each layer's experts in
router-rank order, as one global stream of keys `position * E + expert`. The cache holds 5% and
25% of all experts (at 5% of an OLMoE decode capture no recency policy hits at all: each pass
asks for 128 experts in a fixed layer order, and 51 slots hold the last few layers', so the
bare LRU only evicts its head and appends, its fastest possible loop).

moejax runs its whole replay (`moejax.replay.replay`, engine auto: the compiled engine) with
full metrics: every counter per layer, collisions, prefetch accounting, the virtual clock on
SpecMD's A100 profile with the model's cost model (`model.preset=olmoe-1b-7b`), the per-pass
timings and running totals. Its time is the call's, the kernel's one-time load excluded (done
before the timed runs), the prefetcher's predictions and the cost model's values included
(taken anew each run: a grid's worker keeps them across cells); the trace is already in memory
on both sides. The bare kernels count hits and nothing else, but `bare_lru_clock`, which also
keeps the clock a one-engine replay without prefetch keeps. `cache.pin_scope=request` for
`lru` and the strict per-layer LRU (only the incoming expert protected: the bare kernels'
reading), and `lru` with `temporal` prefetch on the immediate queue beside the bare LRU with
the same prefetch (`bare_lru_temporal`), whose hits must equal the bare kernels' (the script
checks), as `lru`'s must `bare_lru_clock`'s, and without a cost model its clock at the end too.
Each rep runs every case once, in turn (alternated), and the table gives the median rate and
the spread (min-max) over reps, moejax's median rate over the bare LRU's in the same run, over
the median rate of the bare kernel that takes the same cache steps (for the prefetching row:
against a loop that prefetches too), and for `lru` over the bare LRU with the clock's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from moejax import bundled
from moejax.cache import build_cache_for
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.quant import formats
from moejax.replay import compiled, replay
from moejax.testing import random_scored_trace
from moejax.timing import CostModel
from moejax.traces import TraceError, load_traces

# (eviction, prefetch, queue, pin scope): the bare kernels' reading for the two LRUs; the
# defaults otherwise.
CASES = (("lru", "none", "immediate", "request"),
         ("lru_per_layer(quota=strict)", "none", "immediate", "request"),
         ("lru_per_layer", "none", "immediate", "layer"),
         ("fifo", "none", "immediate", "layer"),
         ("least_stale", "none", "immediate", "layer"),
         ("least_stale", "temporal", "watchdog", "layer"),
         ("lru", "temporal", "immediate", "request"))
# The cases a bare kernel runs too, by (eviction, prefetch): their hits must be equal.
BARE_OF = {("lru", "none"): "lru", ("lru_per_layer(quota=strict)", "none"): "per_layer",
           ("lru", "temporal"): "lru_temporal"}
BARE_NOTE = {"lru": "", "per_layer": " per layer", "lru_temporal": " with temporal prefetch"}
# The case `bare_lru_clock` runs beside too (the LRU with the virtual clock's booking).
CLOCKED = ("lru", "none")


# Each bare kernel writes the LRU's request step out in its own loop. Called as one shared
# `numba.njit(inline="always")` step, the bare loops ran 1.7-7.5x slower (2026-12-07, each
# kernel against its written-out form, alternated 21 times, on this script's 1M OLMoE stream
# and on --random_shape=32x8x2 at 5% and 25%: numba passes the arrays with their reference
# counts at each call), which would lower the limit they measure.
@numba.njit(cache=True)
def bare_lru(keys, n_keys, slots):
    """Hits of a global LRU of `slots` over `keys` (a doubly linked list, most recent last)."""
    prev = np.full(n_keys, -1, np.int64)
    nxt = np.full(n_keys, -1, np.int64)
    resident = np.zeros(n_keys, np.bool_)
    head, tail, size, hits = -1, -1, 0, 0
    for k in keys:
        if resident[k]:
            hits += 1
            if k == tail:
                continue
            p, n = prev[k], nxt[k]  # unlink
            if p >= 0:
                nxt[p] = n
            else:
                head = n
            prev[n] = p
        elif size == slots:  # evict the head
            v = head
            head = nxt[v]
            if head >= 0:
                prev[head] = -1
            else:
                tail = -1
            resident[v] = False
        else:
            size += 1
        resident[k] = True
        prev[k], nxt[k] = tail, -1  # append
        if tail >= 0:
            nxt[tail] = k
        else:
            head = k
        tail = k
    return hits


@numba.njit(cache=True)
def bare_lru_temporal(keys, starts, n_layers, n_keys, slots):
    """Hits of `bare_lru` with `temporal` prefetch (lookahead 1) on the immediate queue:
    after each pass-layer's requests (`starts`: where each starts in `keys`), the requests of
    the next layer in the previous pass are fetched ahead in their order. One held already
    moves to the end of the list; one not held takes a free slot, or evicts the first key from
    the head that is neither this pass-layer's request nor an earlier prediction of this call,
    and where none is left the call ends. -1 where a pass-layer has more requests than slots
    (moejax serves it in waves, which this does not)."""
    prev = np.full(n_keys, -1, np.int64)
    nxt = np.full(n_keys, -1, np.int64)
    resident = np.zeros(n_keys, np.bool_)
    protected = np.zeros(n_keys, np.int64)  # the stamp of the call that protects a key
    head, tail, size, hits, stamp = -1, -1, 0, 0, 0
    for pl in range(len(starts) - 1):
        a, b = starts[pl], starts[pl + 1]
        if b - a > slots:
            return -1
        for i in range(a, b):  # the requests: `bare_lru`
            k = keys[i]
            if resident[k]:
                hits += 1
                if k == tail:
                    continue
                p, n = prev[k], nxt[k]
                if p >= 0:
                    nxt[p] = n
                else:
                    head = n
                prev[n] = p
            elif size == slots:  # evict the head
                v = head
                head = nxt[v]
                if head >= 0:
                    prev[head] = -1
                else:
                    tail = -1
                resident[v] = False
            else:
                size += 1
            resident[k] = True
            prev[k], nxt[k] = tail, -1
            if tail >= 0:
                nxt[tail] = k
            else:
                head = k
            tail = k
        if pl < n_layers or pl % n_layers == n_layers - 1:
            continue  # no previous pass, or no next layer
        stamp += 1
        for i in range(a, b):
            protected[keys[i]] = stamp
        src = pl - n_layers + 1
        for i in range(starts[src], starts[src + 1]):
            k = keys[i]
            if resident[k]:  # to the end
                protected[k] = stamp
                if k == tail:
                    continue
                p, n = prev[k], nxt[k]
                if p >= 0:
                    nxt[p] = n
                else:
                    head = n
                prev[n] = p
            elif size < slots:
                size += 1
            else:
                v = head
                while v >= 0 and protected[v] == stamp:
                    v = nxt[v]
                if v < 0:
                    break
                resident[v] = False
                p, n = prev[v], nxt[v]  # unlink the victim, wherever it is
                if p >= 0:
                    nxt[p] = n
                else:
                    head = n
                if n >= 0:
                    prev[n] = p
                else:
                    tail = p
            resident[k] = True
            protected[k] = stamp
            prev[k], nxt[k] = tail, -1
            if tail >= 0:
                nxt[tail] = k
            else:
                head = k
            tail = k
    return hits


@numba.njit(cache=True)
def bare_lru_clock(keys, starts, n_keys, slots, latency, per_slower):
    """`bare_lru` keeping the virtual clock's transfer booking as a one-engine replay without
    prefetch does: each pass-layer (`starts`) one wave from the clock's time; each miss booked
    on the copy engine after its last transfer (`timeline.book_alone`: `latency`, then the
    slower of the link's and the engine's seconds for one expert, `per_slower`); the wave's
    stall, until its last miss lands, added to the clock. Its hits and the clock at the end
    (moejax's own, to the bit, where no cost model adds compute). What a replay also does that
    cannot change the clock here is left out: a slot's earlier transfer (one engine books in
    order, so a slot's next transfer lands later) and a hit's wait for its transfer (each wave
    waits for all of its own, and nothing else is in flight without prefetch)."""
    prev = np.full(n_keys, -1, np.int64)
    nxt = np.full(n_keys, -1, np.int64)
    resident = np.zeros(n_keys, np.bool_)
    head, tail, size, hits = -1, -1, 0, 0
    clock = engine = 0.0
    for pl in range(len(starts) - 1):
        now = ready = clock
        for i in range(starts[pl], starts[pl + 1]):
            k = keys[i]
            if resident[k]:
                hits += 1
                if k == tail:
                    continue
                p, n = prev[k], nxt[k]
                if p >= 0:
                    nxt[p] = n
                else:
                    head = n
                prev[n] = p
            else:
                if size == slots:  # evict the head
                    v = head
                    head = nxt[v]
                    if head >= 0:
                        prev[head] = -1
                    else:
                        tail = -1
                    resident[v] = False
                else:
                    size += 1
                ready = engine = (now if now > engine else engine) + latency + per_slower
            resident[k] = True
            prev[k], nxt[k] = tail, -1
            if tail >= 0:
                nxt[tail] = k
            else:
                head = k
            tail = k
        if ready > clock:
            clock += ready - clock  # (`timeline.stall`, added as the replay adds it)
    return hits, clock


@numba.njit(cache=True)
def bare_lru_per_layer(keys, n_keys, n_experts, quota):
    """Hits of one LRU per layer (`keys // n_experts`), layer q holding at most `quota[q]`."""
    n_layers = n_keys // n_experts
    prev = np.full(n_keys, -1, np.int64)
    nxt = np.full(n_keys, -1, np.int64)
    resident = np.zeros(n_keys, np.bool_)
    head = np.full(n_layers, -1, np.int64)
    tail = np.full(n_layers, -1, np.int64)
    size = np.zeros(n_layers, np.int64)
    hits = 0
    for k in keys:
        q = k // n_experts
        if resident[k]:
            hits += 1
            if k == tail[q]:
                continue
            p, n = prev[k], nxt[k]
            if p >= 0:
                nxt[p] = n
            else:
                head[q] = n
            prev[n] = p
        elif size[q] == quota[q]:
            if quota[q] == 0:
                continue
            v = head[q]
            head[q] = nxt[v]
            if head[q] >= 0:
                prev[head[q]] = -1
            else:
                tail[q] = -1
            resident[v] = False
        else:
            size[q] += 1
        resident[k] = True
        prev[k], nxt[k] = tail[q], -1
        if tail[q] >= 0:
            nxt[tail[q]] = k
        else:
            head[q] = k
        tail[q] = k
    return hits


def stream(traces, repeats: int) -> tuple[np.ndarray, np.ndarray]:
    """The global keys of every request, pass by pass, layer by layer, rank order, `repeats`
    times over, and where each pass-layer starts in them (the compiled engine's own layout,
    `compiled.requests`)."""
    keys, starts = compiled.requests(traces, traces[0].num_experts)[:2]
    n = len(keys)
    return (np.tile(keys, repeats),
            np.concatenate([starts[:-1] + r * n for r in range(repeats)] + [[repeats * n]]))


def moejax_cache(trace, capacity: float, eviction: str, prefetch: str, queue: str,
                 pin_scope: str):
    c = base_config()
    c.job, c.clock.kind = "replay", "virtual"
    c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
    c.cache.capacity_frac, c.cache.prefetch_queue, c.cache.pin_scope = capacity, queue, pin_scope
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    c.policies.miss, c.policies.routing = "fetch", "standard"
    spec = resolve(c)
    cfg = preset("olmoe", "olmoe-1b-7b", 0)
    if (cfg.num_moe_layers, cfg.num_experts, cfg.top_k) != (len(trace.layers),
                                                           trace.num_experts, trace.top_k):
        cfg = None  # another model's capture: counts only, the shape from the trace
    bytes_ = ({"native": int(cfg.expert_bytes)} if cfg is not None
              else dict.fromkeys(formats.PRECISIONS, 1))
    if cfg is None:
        c.cache.slots = int(capacity * len(trace.layers) * trace.num_experts)
        spec = resolve(c)
    return build_cache_for(spec, cfg, bytes_, False, layers=tuple(trace.layers),
                           num_layers=cfg.num_layers if cfg else max(trace.layers) + 1,
                           num_experts=trace.num_experts, top_k=trace.top_k)


def moejax_run(traces, repeats: int, capacity: float, case) -> tuple[float, dict, object]:
    cache = moejax_cache(traces[0], capacity, *case)
    traces = traces * repeats
    # Every run takes its predictions and its cost-model values anew (a grid's worker keeps
    # both for the cells that share them).
    compiled.forget_predictions()
    CostModel.forget_shared()
    start = time.perf_counter()
    decision = replay(cache, traces)
    seconds = time.perf_counter() - start - decision.setup_s
    if decision.engine != "compiled":
        raise SystemExit(f"{case}: ran on the {decision.engine} engine ({decision.reason})")
    return seconds, cache.metrics.totals(), cache


def paired(case, cache) -> str | None:
    """The bare kernel `case` is timed beside and must count the hits of (`BARE_OF`), or None.
    None for the strict per-layer LRU where a layer's share is 0 (fewer slots than layers):
    moejax's strict quota still gives that layer's miss a slot (docs/DESIGN.md,
    lru_per_layer), while a per-layer LRU of fixed capacity never holds it."""
    kind = BARE_OF.get(case[:2])
    if kind == "per_layer" and min(cache.eviction.quota) < 1:
        return None
    return kind


def bare_run(kind: str, keys: np.ndarray, starts: np.ndarray, n_layers: int, n_experts: int,
             cache) -> tuple[float, int]:
    """The bare kernel `kind` over the stream `(keys, starts)` at the cache's size: its
    seconds and hits (-1: it cannot run this stream, `bare_lru_temporal`)."""
    n_keys = n_layers * n_experts
    start = time.perf_counter()
    if kind == "lru":
        hits = bare_lru(keys, n_keys, cache.shape.num_slots)
    elif kind == "lru_temporal":
        hits = bare_lru_temporal(keys, starts, n_layers, n_keys, cache.shape.num_slots)
    else:
        quota = np.asarray(cache.eviction.quota, np.int64)
        hits = bare_lru_per_layer(keys, n_keys, n_experts, quota)
    return time.perf_counter() - start, int(hits)


def clock_terms(cache) -> tuple[float, float] | None:
    """`bare_lru_clock`'s `(latency, per_slower)` for the cache's clock, or None
    where a replay books on more than one copy engine or the link can be busy past the
    engine's free time (`timeline.book_alone` is then not its booking)."""
    clock = cache.clock
    if (len(clock.engine_free) != 1 or clock.link_free > clock.engine_free[0]
            or clock.latency_s < 0):
        return None
    nbytes = float(cache.shape.expert_bytes)
    per_link, per_engine = nbytes / clock.link_bps, nbytes / clock.engine_bps
    return clock.latency_s, max(per_link, per_engine)


def bare_clock_run(keys: np.ndarray, starts: np.ndarray, n_keys: int, terms, cache
                   ) -> tuple[float, int, float]:
    """`bare_lru_clock` over the stream at the cache's size: its seconds, hits and clock."""
    start = time.perf_counter()
    hits, clock = bare_lru_clock(keys, starts, n_keys, cache.shape.num_slots, *terms)
    return time.perf_counter() - start, int(hits), float(clock)


def random_shape_trace(shape: str, parser: argparse.ArgumentParser):
    """512 one-token passes of random routing (`moejax.testing.random_scored_trace`, seed 0,
    ids only) over the `LxExK` shape: a speed check on a model shape no shipped capture has.
    Random routing reuses experts less than a model's, so its hit rate is lower."""
    try:
        layers, experts, k = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        parser.error(f"--random_shape={shape!r} takes LxExK, e.g. 32x8x2")
    if not (layers >= 1 and experts >= 2 and 1 <= k <= experts):
        parser.error(f"--random_shape={shape!r}: layers >= 1, experts >= 2, 1 <= K <= experts")
    return random_scored_trace(np.random.default_rng(0), layers, experts, k, [1] * 512, 1000,
                               scores=False, prefill_passes=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="olmoe_prose",
                        help=f"a shipped capture ({', '.join(bundled.CAPTURE_NAMES)}) or the path "
                             "of a trace file the replay job reads")
    parser.add_argument("--random_shape", default="", metavar="LxExK",
                        help="instead of a capture, 512 decode passes of random routing over L "
                             "MoE layers of E experts, top-K (a model shape with no capture "
                             "shipped, e.g. 32x8x2 for Mixtral's)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--repeats", default="1,16",
                        help="how many times the capture runs through one cache, per size")
    parser.add_argument("--capacities", default="0.05,0.25",
                        help="the cache's share of all experts")
    args = parser.parse_args()
    try:
        repeat_list = [int(r) for r in args.repeats.split(",")]
        capacities = [float(c) for c in args.capacities.split(",")]
    except ValueError:
        parser.error(f"--repeats={args.repeats!r} takes whole numbers, --capacities="
                     f"{args.capacities!r} shares of the experts, comma-separated")
    if args.reps < 1 or min(repeat_list) < 1 or not all(0 < c <= 1 for c in capacities):
        parser.error("--reps and --repeats take numbers >= 1, --capacities shares in (0, 1]")
    if args.random_shape:
        traces = [random_shape_trace(args.random_shape, parser)]
        name = f"random {args.random_shape}"
    else:
        path = (bundled.capture_path(args.trace) if args.trace in bundled.CAPTURE_NAMES
                else args.trace)
        try:
            traces, name = load_traces(path), args.trace
        except (OSError, TraceError) as e:
            parser.error(f"--trace={args.trace!r} takes a shipped capture "
                         f"({', '.join(bundled.CAPTURE_NAMES)}) or a trace file: {e}")
    trace = traces[0]
    n_layers = len(trace.layers)
    n_keys = n_layers * trace.num_experts
    print(f"{name}: {sum(t.num_passes for t in traces)} passes in {len(traces)} sequence(s) x "
          f"{len(trace.layers)} layers x top-{trace.top_k} of {trace.num_experts} experts; "
          f"{args.reps} alternated reps")
    print("| requests | capacity | case | moejax M req/s (min-max) | bare M req/s (min-max) "
          "| moejax / bare LRU | moejax / its bare kernel | bare LRU with the clock M req/s "
          "(min-max), moejax / it | hits |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for repeats in repeat_list:
        keys, starts = stream(traces, repeats)
        n = len(keys)
        first = starts[:2 * n_layers + 1]  # two passes, to load the bare kernels
        for capacity in capacities:
            for case in CASES:  # every kernel loaded (or compiled) before the timed reps
                try:
                    cache = moejax_run(traces, 1, capacity, case)[2]
                except ConfigError as e:  # (a size the cache refuses: said in one line)
                    parser.error(f"--capacities: {capacity:g} of {name}: {e}")
                bare_run(BARE_OF.get(case[:2], "lru"), keys[:first[-1]], first, n_layers,
                         trace.num_experts, cache)
                if case[:2] == CLOCKED and clock_terms(cache) is not None:
                    bare_clock_run(keys[:first[-1]], first, n_keys, clock_terms(cache), cache)
            ours = {case: [] for case in CASES}
            bare = {kind: [] for kind in BARE_OF.values()}
            clocked = []  # `bare_lru_clock`'s seconds, beside the CLOCKED case
            hits, kinds = {}, {}
            for _ in range(args.reps):
                for case in CASES:
                    seconds, totals, cache = moejax_run(traces, repeats, capacity, case)
                    ours[case].append(seconds)
                    hits[case] = totals["hits"] + totals["late_hits"]
                    assert totals["requests"] == n, (totals["requests"], n)
                    kind = kinds[case] = paired(case, cache)
                    if kind is not None:
                        seconds, bare_hits = bare_run(kind, keys, starts, n_layers,
                                                      trace.num_experts, cache)
                        bare[kind].append(seconds)
                        if bare_hits < 0:
                            raise SystemExit(f"{'/'.join(case[:2])} at {capacity:.0%}: a "
                                             f"pass-layer has more requests than the cache "
                                             f"has slots, which the bare kernel does not "
                                             f"serve (moejax serves it in waves)")
                        if bare_hits != hits[case]:
                            raise SystemExit(f"{'/'.join(case[:2])} at {capacity:.0%}: moejax "
                                             f"{hits[case]} hits, the bare kernel "
                                             f"{bare_hits}")
                    terms = clock_terms(cache) if case[:2] == CLOCKED else None
                    if terms is not None:
                        seconds, bare_hits, clock = bare_clock_run(keys, starts, n_keys, terms,
                                                                   cache)
                        clocked.append(seconds)
                        # Without a cost model the clock is the transfers' alone: the same.
                        if bare_hits != hits[case] or (cache.cost is None
                                                       and clock != cache.clock.t):
                            raise SystemExit(f"lru with its clock at {capacity:.0%}: moejax "
                                             f"{hits[case]} hits, clock {cache.clock.t!r} s; "
                                             f"the bare kernel {bare_hits}, {clock!r} s")
            limit = n / statistics.median(bare["lru"])
            slots = cache.shape.num_slots
            for case in CASES:
                rates = [n / s for s in ours[case]]
                kind = kinds[case]
                name = "/".join(x for x in case[:3] if x not in ("none", "immediate"))
                name += f" (pin {case[3]})"
                if kind is None:
                    own = "-"
                    bare_cell = "-" if case[:2] not in BARE_OF else "- (a share of 0)"
                else:
                    b = [n / s for s in bare[kind]]
                    bare_cell = (f"{statistics.median(b) / 1e6:.1f} ({min(b) / 1e6:.1f}-"
                                 f"{max(b) / 1e6:.1f}){BARE_NOTE[kind]}")
                    own = f"{statistics.median(rates) / statistics.median(b):.2f}"
                clock_cell = "-"
                if case[:2] == CLOCKED and clocked:
                    c = [n / s for s in clocked]
                    clock_cell = (f"{statistics.median(c) / 1e6:.1f} ({min(c) / 1e6:.1f}-"
                                  f"{max(c) / 1e6:.1f}), "
                                  f"{statistics.median(rates) / statistics.median(c):.2f}")
                print(f"| {n:,} | {capacity:.0%} ({slots}) | {name} | "
                      f"{statistics.median(rates) / 1e6:.1f} ({min(rates) / 1e6:.1f}-"
                      f"{max(rates) / 1e6:.1f}) | {bare_cell} | "
                      f"{statistics.median(rates) / limit:.2f} | {own} | {clock_cell} | "
                      f"{hits[case]:,} |")


if __name__ == "__main__":
    main()
