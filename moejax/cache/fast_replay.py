"""A compiled replay core (numba) for the configurations grids replay most: LRU or Belady
eviction, no prefetch, the fetch miss policy, standard routing, one precision pool, no host
tier or placement, every pass-layer's experts fitting the slots at once (one wave).

It runs the same semantics as `ExpertCache.run_layer` + the policy objects, request by request
(DESIGN.md "one policy code path": this is a second implementation of one path, and
`tests/test_fast_replay.py` checks it against the reference on every shipped trace and on
random traces, counter for counter and time for time): rank-order requests, free slots lowest
first, LRU's order (admission and every access count as a use), Belady's furthest next use
(ties: the lowest `(layer, expert)`), the pin scope, collision misses (a miss on an expert
evicted earlier in the same pass), the copy engines and host link of the virtual clock, and
the cost model's compute as the same float additions in the same order. It fills the cache's
metrics (per layer, pass timings, and the per-pass running totals TensorBoard plots, built
when read) and leaves the cache's residency and clock where the reference would; the policy
objects themselves are not stepped.

`replay()` takes this path by itself when `applicable` says so; `cache.replay_engine`
("auto", "reference") chooses.
"""

from __future__ import annotations

import numba
import numpy as np

from moejax.cache.cache import ExpertCache
from moejax.cache.metrics import BYTES, COUNTERS, SECONDS, CacheMetrics, PassTiming
from moejax.seam import requests_in_rank_order

LRU, BELADY = 0, 1
POLICIES = {"lru": LRU, "belady": BELADY}
NEVER = np.iinfo(np.int64).max
# The counters the kernel keeps per layer (the others stay 0 on this path), in this order.
KEPT = ("requests", "hits", "late_hits", "misses", "collision_misses", "evictions", "waves",
        "products", "demand_bytes", "stall_s")


def applicable(cache: ExpertCache) -> str | None:
    """None when the fast path can run `cache`, else why not (one line)."""
    if cache.eviction.name not in POLICIES:
        return f"eviction {cache.eviction.name} has no compiled form"
    if cache.prefetch.name != "none" or cache.miss.name != "fetch" or \
            cache.routing.name != "standard":
        return "prefetch, miss or routing other than none / fetch / standard"
    if cache.multi or cache.host is not None or cache.fixed or cache.residency or \
            cache.pass_id >= 0 or cache.watchdog or cache.sink is not None:
        return "several pools, a host tier, placement, a used cache, the watchdog or a sink"
    return None


def fits(cache: ExpertCache, traces) -> bool:
    """Whether every pass-layer's distinct experts fit the slots at once (no waves): a pass
    of `n` tokens asks for at most `n * top_k` of them."""
    k = cache.shape.top_k
    return all(int(np.diff(t.pass_offsets).max()) * k <= cache.shape.num_slots
               or _distinct_max(t) <= cache.shape.num_slots for t in traces)


def _distinct_max(trace) -> int:
    """The most distinct experts any pass-layer of `trace` asks for."""
    most = 0
    for p in range(trace.num_passes):
        ids = trace.ids[trace.pass_rows(p)]
        if ids.shape[0] * ids.shape[2] <= most:
            continue
        for pos in range(ids.shape[1]):
            most = max(most, len(np.unique(ids[:, pos])))
    return most


def _requests(traces) -> tuple[np.ndarray, np.ndarray, list]:
    """The requests of every pass-layer (global key `position * E + expert`, rank order) as one
    array, the start of each pass-layer in it, and per pass `(kind, tokens, rows)`."""
    chunks, starts, passes = [], [0], []
    total = 0
    for trace in traces:
        e = trace.num_experts
        offsets = np.arange(len(trace.layers), dtype=np.int64) * e
        sizes = np.diff(trace.pass_offsets)
        single = np.all(sizes == 1)
        for p in range(trace.num_passes):
            rows = trace.pass_rows(p)
            ids = trace.ids[rows]
            kind = "prefill" if p < trace.prefill_passes else "decode"
            passes.append((kind, int(sizes[p]), ids.shape[0] * ids.shape[2]))
            if single or ids.shape[0] == 1:
                keys = (ids[0] + offsets[:, None]).astype(np.int64)
                chunks.append(keys.reshape(-1))
                for _ in range(keys.shape[0]):
                    total += keys.shape[1]
                    starts.append(total)
            else:
                for pos in range(ids.shape[1]):
                    req = np.asarray(requests_in_rank_order(ids[:, pos]), np.int64) + \
                        offsets[pos]
                    chunks.append(req)
                    total += len(req)
                    starts.append(total)
    return np.concatenate(chunks), np.asarray(starts, np.int64), passes


def _next_use(keys: np.ndarray, n_keys: int) -> np.ndarray:
    """Index of each request's key's next request (NEVER when none)."""
    out = np.full(len(keys), NEVER, np.int64)
    order = np.lexsort((np.arange(len(keys)), keys))
    same = keys[order][1:] == keys[order][:-1]
    out[order[:-1][same]] = order[1:][same]
    return out


def _compute_plan(cache: ExpertCache, passes: list, context_start: list[int], traces,
                  starts: np.ndarray):
    """The cost model's compute increments, in the reference's order: per pass-layer those
    before its requests are served (dense layers, attention + router), the experts after;
    per pass those at its start and end. Without a cost model all are empty."""
    n_pl = sum(len(t.layers) for t in traces for _ in range(t.num_passes))
    pre_off = np.zeros(n_pl + 1, np.int64)
    post = np.zeros(n_pl, np.float64)
    begin = np.zeros(len(passes), np.float64)
    end_off = np.zeros(len(passes) + 1, np.int64)
    cost = cache.cost
    if cost is None:
        return pre_off, np.zeros(0), post, begin, end_off, np.zeros(0)
    pre_vals, end_vals = [], []
    layers, num_layers = cache.shape.layers, cache.shape.num_layers
    moe = set(layers)
    pl, p_global = 0, 0
    for s, trace in enumerate(traces):
        context = context_start[s] if context_start else 0
        for p in range(trace.num_passes):
            _, tokens, pairs = passes[p_global]
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
                pre_off[pl + 1] = len(pre_vals)
                post[pl] = cost.experts(pairs, int(starts[pl + 1] - starts[pl]), tokens,
                                        shared=True)
                pl += 1
            while nxt < num_layers:
                if nxt not in moe:
                    end_vals.append(cost.dense_layer(tokens, context))
                nxt += 1
            end_vals.append(cost.embed_and_logits(tokens) / 2)
            end_off[p_global + 1] = len(end_vals)
            p_global += 1
    return (pre_off, np.asarray(pre_vals, np.float64), post, begin, end_off,
            np.asarray(end_vals, np.float64))


def _kernel(keys, starts, pos_of_pl, pass_first_pl, products, next_use,
            n_slots, n_keys, n_layers, policy, pin_layer, expert_bytes,
            engines, latency, engine_bps, link_bps,
            pre_off, pre_vals, post, begin, end_off, end_vals):
    """The per-request loop (module docstring). Returns per-layer counters `[len(KEPT), L]`
    (float64), per-pass `(start, end, stall)`, per-pass running totals of KEPT, and the final
    state: slot of each key, ready time of each slot, the clock `(t, link_free)`, the engines'
    free times, and the free slots left."""
    n_pass = len(pass_first_pl)
    c = np.zeros((10, n_layers))
    passes = np.zeros((n_pass, 3))
    running = np.zeros((n_pass, 10))
    slot_of = np.full(n_keys, -1, np.int64)
    key_of = np.full(n_slots, -1, np.int64)
    slot_ready = np.zeros(n_slots)
    free = np.arange(n_slots - 1, -1, -1).astype(np.int64)  # pop from the end: lowest first
    n_free = n_slots
    # LRU: a doubly linked list over keys, head the least recent.
    prev = np.full(n_keys, -1, np.int64)
    nxt = np.full(n_keys, -1, np.int64)
    head, tail = -1, -1
    # Belady: each resident key's next use, and the resident keys in slot order.
    next_of = np.full(n_keys, NEVER, np.int64)
    pinned = np.full(n_keys, -1, np.int64)  # pass-layer that pins the key
    evicted_in = np.full(n_keys, -1, np.int64)  # pass a key was last evicted in
    engine_free = np.zeros(engines)
    link_free = 0.0
    t = 0.0
    for p in range(n_pass):
        start = t
        t += begin[p]
        pass_stall = 0.0
        pl_end = pass_first_pl[p + 1] if p + 1 < n_pass else len(pos_of_pl)
        for pl in range(pass_first_pl[p], pl_end):
            for i in range(pre_off[pl], pre_off[pl + 1]):
                t += pre_vals[i]
            pos = pos_of_pl[pl]
            a, b = starts[pl], starts[pl + 1]
            now = t
            ready = now
            if pin_layer:
                for i in range(a, b):
                    pinned[keys[i]] = pl
            hits = 0
            late = 0
            misses = 0
            coll = 0
            for i in range(a, b):
                k = keys[i]
                s = slot_of[k]
                if s >= 0:
                    at = slot_ready[s]
                    if at > now:
                        late += 1
                        if at > ready:
                            ready = at
                    else:
                        hits += 1
                else:
                    if evicted_in[k] == p:
                        coll += 1
                    if n_free > 0:
                        n_free -= 1
                        s = free[n_free]
                    else:
                        victim = -1
                        if policy == 0:
                            v = head
                            while v >= 0:
                                if not (pin_layer and pinned[v] == pl) and v != k:
                                    victim = v
                                    break
                                v = nxt[v]
                        else:
                            far = -1
                            for slot in range(n_slots):
                                v = key_of[slot]
                                if v < 0 or (pin_layer and pinned[v] == pl) or v == k:
                                    continue
                                nu = next_of[v]
                                if nu > far or (nu == far and v < victim):
                                    far = nu
                                    victim = v
                        # _evict: the victim's slot, counted at the victim's layer.
                        s = slot_of[victim]
                        slot_of[victim] = -1
                        key_of[s] = -1
                        evicted_in[victim] = p
                        c[5, victim // (n_keys // n_layers)] += 1
                        if policy == 0:
                            pv, nx = prev[victim], nxt[victim]
                            if pv >= 0:
                                nxt[pv] = nx
                            else:
                                head = nx
                            if nx >= 0:
                                prev[nx] = pv
                            else:
                                tail = pv
                            prev[victim] = -1
                            nxt[victim] = -1
                    # _admit: book the transfer (moejax.sim.clock.Channels._book).
                    e = 0
                    for j in range(1, engines):
                        if engine_free[j] < engine_free[e]:
                            e = j
                    st = now if now > engine_free[e] else engine_free[e]
                    data_start = st + latency
                    link_start = data_start if data_start > link_free else link_free
                    link_end = link_start + expert_bytes / link_bps
                    end = data_start + expert_bytes / engine_bps
                    if link_end > end:
                        end = link_end
                    engine_free[e] = end
                    link_free = link_end
                    r = end if end > slot_ready[s] else slot_ready[s]
                    slot_of[k] = s
                    key_of[s] = k
                    slot_ready[s] = r
                    if policy == 0:  # on_admit: to the tail
                        prev[k] = tail
                        nxt[k] = -1
                        if tail >= 0:
                            nxt[tail] = k
                        else:
                            head = k
                        tail = k
                    if r > ready:
                        ready = r
                    misses += 1
                # on_access
                if policy == 0:
                    if k != tail:
                        pv, nx = prev[k], nxt[k]
                        if pv >= 0:
                            nxt[pv] = nx
                        else:
                            head = nx
                        prev[nx] = pv
                        prev[k] = tail
                        nxt[k] = -1
                        nxt[tail] = k
                        tail = k
                else:
                    next_of[k] = next_use[i]
            stall = ready - t if ready - t > 0.0 else 0.0
            t += stall
            pass_stall += stall
            c[0, pos] += b - a
            c[1, pos] += hits
            c[2, pos] += late
            c[3, pos] += misses
            c[4, pos] += coll
            c[6, pos] += 1
            c[7, pos] += products[pl]
            c[8, pos] += misses * expert_bytes
            c[9, pos] += stall
            t += post[pl]
        for i in range(end_off[p], end_off[p + 1]):
            t += end_vals[i]
        passes[p, 0] = start
        passes[p, 1] = t
        passes[p, 2] = pass_stall
        for j in range(10):
            total = 0.0
            for l in range(n_layers):
                total += c[j, l]
            running[p, j] = total
    return c, passes, running, slot_of, slot_ready, t, link_free, engine_free, free[:n_free]


_kernel = numba.njit(cache=True)(_kernel)


def run(cache: ExpertCache, traces, context_start: list[int] | None = None) -> None:
    """Replays `traces` through `cache` on the compiled path (`applicable(cache)` is None),
    filling its metrics as `replay` would (`replay` decides when: `applicable`, `fits`)."""
    shape = cache.shape
    n_layers, n_experts = len(shape.layers), shape.num_experts
    keys, starts, passes = _requests(traces)
    pl_len = np.diff(starts)
    if len(pl_len) and pl_len.max() > shape.num_slots:
        raise ValueError("a pass-layer needs more experts than slots: waves (reference path)")
    pos_of_pl = np.tile(np.arange(n_layers, dtype=np.int64), len(passes))
    pass_first_pl = np.arange(len(passes), dtype=np.int64) * n_layers
    products = np.repeat(np.asarray([pairs for _, _, pairs in passes], np.int64), n_layers)
    assert len(pl_len) == len(pos_of_pl)
    pre_off, pre_vals, post, begin, end_off, end_vals = _compute_plan(
        cache, passes, context_start, traces, starts)
    policy = POLICIES[cache.eviction.name]
    nu = _next_use(keys, n_layers * n_experts) if policy == BELADY else np.zeros(1, np.int64)
    clock = cache.clock
    hw = clock.hw
    out = _kernel(keys, starts, pos_of_pl, pass_first_pl, products, nu,
                  shape.num_slots, n_layers * n_experts, n_layers, policy,
                  cache.pin_scope == "layer", float(shape.expert_bytes),
                  len(clock.engine_free), hw.h2d_latency_s, clock._engine_bps,
                  clock._link_bps, pre_off, pre_vals, post, begin, end_off, end_vals)
    c, timings, running, slot_of, slot_ready, t, link_free, engine_free, free = out
    _fill_metrics(cache.metrics, c, timings, running, passes)
    # The cache's state as the reference leaves it.
    cache.pass_id = len(passes) - 1
    resident = np.flatnonzero(slot_of >= 0)
    for k in resident.tolist():
        key = (shape.layers[k // n_experts], k % n_experts)
        slot = int(slot_of[k])
        cache.residency[key] = slot
        cache.slot_key[slot] = key
        cache.in_cache[key[0]].add(key[1])
    cache.slot_ready[:] = slot_ready.tolist()
    cache.free[:] = free.tolist()
    clock.t = t
    clock.link_free = link_free
    clock.engine_free[:] = engine_free.tolist()
    cache.finish()


def _fill_metrics(m: CacheMetrics, c, timings, running, passes) -> None:
    for j, name in enumerate(KEPT):
        values = c[j]
        m.c[name] = values.tolist() if name in SECONDS else [int(v) for v in values]
    m.passes = [PassTiming(kind, tokens, float(s), float(e), float(st))
                for (kind, tokens, _), (s, e, st) in zip(passes, timings.tolist())]
    m.defer_snapshots(lambda: _snapshots(m, running))


def _snapshots(m: CacheMetrics, running: np.ndarray) -> list[dict]:
    """The per-pass running totals `CacheMetrics.snapshot` would have taken."""
    out = []
    zero = {k: 0 for k in COUNTERS + BYTES}
    zero.update({k: 0.0 for k in SECONDS})
    for p, row in enumerate(running.tolist()):
        sums = dict(zero)
        for name, v in zip(KEPT, row):
            sums[name] = v if name in SECONDS else int(v)
        t = CacheMetrics.summary(sums)
        t["pass_s"] = m.passes[p].end_s - m.passes[p].start_s
        out.append(t)
    return out
