"""The compiled replay engine: trace replay through `moejax/replay/kernel.py` (numba)
instead of the policy objects, for the configurations grids replay.

**Covers:** eviction lru, fifo, lru_per_layer, lfu, fld, least_stale (its three orders, with
`prefetch_current="pass"`) and belady; every prefetch policy (their predictions depend on the
gates and the future only, never on the cache, so they are taken from the policy object itself
before the kernel runs, in pass order, exactly as the reference calls it); both prefetch
queues (immediate, watchdog); both pin scopes; prefill layers in waves; the virtual clock
with its copy engines and host link and the cost model's compute. Not covered (the reference
runs): other evictions (score, random, lhu, priority, least_stale until_target), miss
policies other than fetch, routing other than standard, several precision pools, the host
tier, full-layer placement, a seeded or already used cache, a slot sink, a wall clock.

**One semantics.** It is a second implementation of `ExpertCache.run_layer` and the policies
(DESIGN.md "one policy code path"): rank-order requests, free slots lowest first, each policy's
order and tie-breaks, what a prefetch call and the watchdog protect, collision misses, late
hits, prefetch origins (used, wasted, evicted before use), the predicted sets, the dropped
queue entries, and the compute as the same float additions in the same order.
`tests/test_fast_replay.py` checks it against the reference — counters per layer, pass timings,
per-pass running totals, final residency, prefetch origins and clock — on every shipped trace
and on random traces (property tests over policies, queues, pin scopes, waves and engines).

`replay()` takes it by itself when `applicable` says so; `cache.replay_engine` ("auto",
"reference") chooses, and results.json `replay.engine` says which ran. The eviction policy
object is not stepped (its state stays empty); the prefetch policy object is, by the
predictions taken from it.
"""

from __future__ import annotations

import numpy as np

from moejax.cache import BYTES, COUNTERS, SECONDS, CacheMetrics, ExpertCache, PassTiming
from moejax.replay import kernel as K
from moejax.replay.future import future_of_requests
from moejax.replay.gates import layer_gates
from moejax.seam import requests_in_rank_order

assert K.ROWS == COUNTERS + BYTES + SECONDS, "kernel.ROWS must follow CacheMetrics"

EVICTIONS = {"lru": K.LRU, "fifo": K.FIFO, "lru_per_layer": K.LRU_PER_LAYER, "lfu": K.LFU,
             "fld": K.FLD, "belady": K.BELADY}
LEAST_STALE = {"two_queue": K.LS_TWO_QUEUE, "left_first": K.LS_LEFT_FIRST,
               "cyclic": K.LS_CYCLIC}


def _policy_code(eviction) -> int | None:
    if eviction.name == "least_stale":
        return None if eviction.until_target else LEAST_STALE[eviction.order]
    return EVICTIONS.get(eviction.name)


def applicable(cache: ExpertCache) -> str | None:
    """None when the compiled engine can run `cache`, else why not (one line)."""
    if _policy_code(cache.eviction) is None:
        return f"eviction {cache.eviction.name} has no compiled form"
    if cache.miss.name != "fetch" or cache.routing.name != "standard":
        return "a miss policy other than fetch or routing other than standard"
    if cache.clock.kind != "virtual":
        return "a wall clock"
    if cache.multi or cache.host is not None or cache.fixed or cache.residency or \
            cache.pass_id >= 0 or cache.sink is not None:
        return "several pools, a host tier, placement, a used cache or a sink"
    return None


def _requests(traces, n_experts: int):
    """The requests of every pass-layer (global key `position * E + expert`, rank order) as one
    array, the start of each pass-layer in it, each request's token-expert pairs in its
    pass-layer, and per pass `(kind, tokens, pairs)`."""
    chunks, mults, lengths, passes = [], [], [], []
    for trace in traces:
        n_layers, k = len(trace.layers), trace.top_k
        offsets = np.arange(n_layers, dtype=np.int64) * n_experts
        sizes = np.diff(trace.pass_offsets)
        p = 0
        while p < trace.num_passes:
            if sizes[p] == 1:  # a run of one-token passes: their rows as they are, at once
                q = p
                while q < trace.num_passes and sizes[q] == 1:
                    q += 1
                rows = trace.ids[trace.pass_offsets[p]:trace.pass_offsets[q]]
                chunks.append((rows + offsets[None, :, None]).reshape(-1).astype(np.int64))
                mults.append(np.ones(rows.size, np.int64))
                lengths.append(np.full((q - p) * n_layers, k, np.int64))
                passes += [("prefill" if r < trace.prefill_passes else "decode", 1, k)
                           for r in range(p, q)]
                p = q
                continue
            ids = trace.ids[trace.pass_rows(p)]
            kind = "prefill" if p < trace.prefill_passes else "decode"
            passes.append((kind, int(sizes[p]), ids.shape[0] * ids.shape[2]))
            p += 1
            for pos in range(ids.shape[1]):  # rank order, first occurrence wins
                req = np.asarray(requests_in_rank_order(ids[:, pos]), np.int64)
                counts = np.bincount(ids[:, pos].reshape(-1), minlength=n_experts)
                chunks.append(req + offsets[pos])
                mults.append(counts[req].astype(np.int64))
                lengths.append(np.asarray([len(req)], np.int64))
    starts = np.zeros(sum(len(x) for x in lengths) + 1, np.int64)
    np.cumsum(np.concatenate(lengths), out=starts[1:])
    return np.concatenate(chunks), starts, np.concatenate(mults), passes


def _predictions(cache: ExpertCache, traces, keys: np.ndarray, starts: np.ndarray):
    """Every prefetch call's selection, from the policy object, per pass-layer in order:
    groups `(target position, experts)` as CSR arrays (`grp_off` per pass-layer, `grp_start`
    per group into `experts`)."""

    prefetch = cache.prefetch
    grp_off = np.zeros(len(starts), np.int64)
    if prefetch.name == "none":
        return grp_off, np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64)
    if prefetch.needs_future:
        prefetch.set_future(future_of_requests(keys % cache.shape.num_experts, starts,
                                               list(cache.shape.layers)), cache)
    pos_of = cache.pos_of
    targets, sizes, experts = [], [], []
    pl = 0
    # Oracle-style predictors read the cache's pass id; it is put back after.
    try:
        for trace in traces:
            for p in range(trace.num_passes):
                cache.pass_id += 1
                for gate in layer_gates(trace, p):
                    for target, chosen in prefetch.predict(gate):
                        if target in pos_of:
                            targets.append(pos_of[target])
                            sizes.append(len(chosen))
                            experts.extend(chosen)
                    pl += 1
                    grp_off[pl] = len(targets)
    finally:
        cache.pass_id = -1
    grp_start = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=grp_start[1:])
    return (grp_off, np.asarray(targets, np.int64), grp_start,
            np.asarray(experts, np.int64).reshape(-1))


def _uses(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Belady's future: each key's request indices, sorted, as CSR (`off`, `uses`)."""
    uses = np.argsort(keys, kind="stable").astype(np.int64)
    off = np.zeros(n_keys + 1, np.int64)
    np.cumsum(np.bincount(keys, minlength=n_keys), out=off[1:])
    return off, uses


def _compute_plan(cache: ExpertCache, passes: list, context_start: list[int] | None, traces):
    """The cost model's compute increments, in the reference's order: per pass-layer those
    before its requests are served (dense layers, attention + router), per pass those at its
    start and end (the experts' steps, which depend on the waves, the kernel computes).
    Without a cost model all are empty."""
    n_pl = sum(len(t.layers) for t in traces for _ in range(t.num_passes))
    pre_off = np.zeros(n_pl + 1, np.int64)
    begin = np.zeros(len(passes), np.float64)
    end_off = np.zeros(len(passes) + 1, np.int64)
    cost = cache.cost
    if cost is None:
        return pre_off, np.zeros(0), begin, end_off, np.zeros(0)
    pre_vals, end_vals = [], []
    layers, num_layers = cache.shape.layers, cache.shape.num_layers
    moe = set(layers)
    pl, p_global = 0, 0
    for s, trace in enumerate(traces):
        context = context_start[s] if context_start else 0
        for _ in range(trace.num_passes):
            tokens = passes[p_global][1]
            context += tokens
            begin[p_global] = cost.embed_and_logits(tokens) / 2
            nxt = 0
            for layer in layers:
                while nxt < layer:
                    if nxt not in moe:
                        pre_vals.append(cost.dense_layer(tokens, context))
                    nxt += 1
                pre_vals.append(cost.attention_router(tokens, context, cache.lookahead_scores))
                nxt = layer + 1
                pl += 1
                pre_off[pl] = len(pre_vals)
            while nxt < num_layers:
                if nxt not in moe:
                    end_vals.append(cost.dense_layer(tokens, context))
                nxt += 1
            end_vals.append(cost.embed_and_logits(tokens) / 2)
            end_off[p_global + 1] = len(end_vals)
            p_global += 1
    return (pre_off, np.asarray(pre_vals, np.float64), begin, end_off,
            np.asarray(end_vals, np.float64))


def _cost_params(cache: ExpertCache) -> tuple:
    """What `CostModel.experts` reads, for the kernel (zeros without a cost model)."""
    cost = cache.cost
    if cost is None:
        return False, 0, 0, 0.0, 1.0, 1.0, 0.0  # (has_cost False: never read)
    cfg, hw = cost.cfg, cost.hw
    return (True, int(cfg.expert_param_count),
            int(3 * cfg.hidden_size * cfg.shared_expert_intermediate_size), float(cost.b),
            hw.peak_tflops * 1e12, hw.hbm_gbps * 1e9, float(hw.launch_s))


def run(cache: ExpertCache, traces, context_start: list[int] | None = None) -> None:
    """Replays `traces` through `cache` on the compiled engine (`applicable(cache)` is None),
    filling its metrics and leaving its state as `replay` would."""
    reason = applicable(cache)
    if reason is not None:
        raise ValueError(f"the compiled replay engine cannot run this cache: {reason}")
    shape = cache.shape
    n_layers, n_experts = len(shape.layers), shape.num_experts
    n_keys = n_layers * n_experts
    keys, starts, mult, passes = _requests(traces, n_experts)
    n_pl = len(starts) - 1
    assert n_pl == len(passes) * n_layers
    grp_off, grp_target, grp_start, pred_experts = _predictions(cache, traces, keys, starts)
    policy = _policy_code(cache.eviction)
    uses_off, uses = (_uses(keys, n_keys) if policy == K.BELADY
                      else (np.zeros(n_keys + 1, np.int64), np.zeros(0, np.int64)))
    quota = np.asarray(getattr(cache.eviction, "quota", [0] * n_layers), np.int64)
    clock = cache.clock
    I, F = K.layout(policy, shape.num_slots, n_experts, n_layers, cache.watchdog,
                    cache.pin_scope == "layer", len(clock.engine_free), quota, starts,
                    uses_off, uses,
                    (float(shape.expert_bytes), clock.hw.h2d_latency_s, clock._engine_bps,
                     clock._link_bps))
    timings, running, pins = K.run(
        I, F, keys, mult, np.asarray([t for _, t, _ in passes], np.int64),
        np.asarray([pairs for _, _, pairs in passes], np.int64),
        (grp_off, grp_target, grp_start, pred_experts),
        _compute_plan(cache, passes, context_start, traces), _cost_params(cache))
    per_key = I[I[K.O_KEYS]:I[K.O_KEYS] + K.N_KEY_ROWS * n_keys].reshape(K.N_KEY_ROWS, n_keys)
    slot_of, origin_pass, origin_tpos = (per_key[K.SLOT], per_key[K.ORIGIN_PASS],
                                         per_key[K.ORIGIN_TPOS])
    c = F[I[K.O_C]:I[K.O_C] + len(K.ROWS) * n_layers].reshape(len(K.ROWS), n_layers)
    slot_ready = F[I[K.O_SR]:I[K.O_SR] + shape.num_slots]
    T = F[I[K.O_T]:I[K.O_T] + 2 + len(clock.engine_free)]
    free = I[I[K.O_SLOTS] + shape.num_slots:I[K.O_SLOTS] + shape.num_slots + I[K.FREE_N]]
    _fill_metrics(cache.metrics, c, timings, running, passes)
    # The cache's state as the reference leaves it.
    layers = shape.layers
    cache.pass_id = len(passes) - 1
    cache.running_pos = n_layers - 1
    for k in np.flatnonzero(slot_of >= 0).tolist():
        key = (layers[k // n_experts], k % n_experts)
        slot = int(slot_of[k])
        cache.residency[key] = slot
        cache.slot_key[slot] = key
        cache.in_cache[key[0]].add(key[1])
    for k in np.flatnonzero(origin_pass >= 0).tolist():
        key = (layers[k // n_experts], k % n_experts)
        cache.prefetch_origin[key] = (int(origin_pass[k]), layers[int(origin_tpos[k])])
    cache.running_pins = {(layers[k // n_experts], k % n_experts) for k in pins.tolist()}
    cache.slot_ready[:] = slot_ready.tolist()
    cache.free[:] = free.tolist()
    clock.t, clock.link_free = float(T[0]), float(T[1])
    clock.engine_free[:] = T[2:].tolist()
    cache.finish()


def _fill_metrics(m: CacheMetrics, c, timings, running, passes) -> None:
    for j, name in enumerate(K.ROWS):
        values = c[j]
        m.c[name] = values.tolist() if name in SECONDS else [int(v) for v in values]
    m.passes = [PassTiming(kind, tokens, float(s), float(e), float(st))
                for (kind, tokens, _), (s, e, st) in zip(passes, timings.tolist())]
    m.defer_snapshots(lambda: _snapshots(m, running))


def _snapshots(m: CacheMetrics, running: np.ndarray) -> list[dict]:
    """The per-pass running totals `CacheMetrics.snapshot` would have taken."""
    out = []
    for p, row in enumerate(running.tolist()):
        sums = {name: v if name in SECONDS else int(v) for name, v in zip(K.ROWS, row)}
        t = CacheMetrics.summary(sums)
        t["pass_s"] = m.passes[p].end_s - m.passes[p].start_s
        out.append(t)
    return out
