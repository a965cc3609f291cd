"""The compiled replay kernel specialised to the runs most grids and capacity sweeps are made of:
no prefetch (no predictions, so no queue, no predicted sets, no prefetch origins), and an
eviction whose victim order is a list (`lru`, `fifo`, `lru_per_layer` under either quota,
`fld`, `least_stale` in its three orders). It runs on the very state `kernel.layout` makes and
leaves it as `kernel.run` would, with the same outputs (the running totals narrower), so
`compiled.run` reads either alike; the general kernel runs everything else.

Why a second loop: the general kernel reaches every field through accessors that read the
layout's offsets from `I` at each access (stores into `I` keep LLVM from hoisting them) and
calls a function per step of a request; per request that was most of its time. Here:
- the offsets are read once, and the request's path (the list moves, the allocation, the
  booking) is written out in the loop or in inner functions, which numba inlines;
- the scalars the general kernel keeps in `I` and `F` (the clock, the link's free time, a
  single copy engine's free time, the stamp, the free slots' count, the recency tick) live in
  locals, written back at the end (the engine's: 7% of a 1M-request `lru` replay's loop);
- the integer counters are summed per layer in a local array, added to `F` at the end (sums
  of integers: exact in any order), and the running totals are returned for the rows this
  loop counts only (`RUNNING`);
- every index is cast to unsigned (`u`): numba checks a signed index for a negative value
  (Python's wraparound) at every access, and no index here is ever negative; on a 1M-request
  replay that check was about a third of the loop's time;
- a transfer's booking is `timeline.book` written out with its two quotients taken once
  (called, it cost 15-25% of the loop: numba does not inline it).
(Measured with `benchmarks/replay_limit.py`; its figures are in benchmarks/README.md.)

Its semantics are the general kernel's, step for step (`kernel.py`'s docstring): the rarer
steps (a layered victim search, Least-Stale's pass start, the strict quota's check) are the
general kernel's own functions. `tests/test_compiled_replay.py` holds the two kernels equal
(every count, every time, bit for bit), and both to the reference engine.
"""

from __future__ import annotations

import numpy as np

from moejax.replay import kernel as K
from moejax.timing import timeline

# This kernel compiles in `kernel.py`'s steps and `timeline.py`'s arithmetic.
K.drop_stale_cache("lean_kernel", (K, timeline))

# The evictions this kernel runs (kernel codes).
LIST_EVICTIONS = (K.LRU, K.FIFO, K.LRU_PER_LAYER, K.LRU_PER_LAYER_STRICT, K.FLD,
                  K.LS_TWO_QUEUE, K.LS_LEFT_FIRST, K.LS_CYCLIC)


# The integer counter rows this kernel sums per layer in a local array (`cnt`), in this order.
COUNTED = (K.R_REQ, K.R_HIT, K.R_LATE, K.R_MISS, K.R_COLL, K.R_PRODUCTS, K.R_WAVES)
# The rows this kernel counts at all, in the order of its running totals' columns (the others
# stay 0 without prefetch): a 1M-request replay's totals are then 8192 x 11, not 8192 x 26.
RUNNING = COUNTED + (K.R_EVICT, K.R_DEMAND_B, K.R_STALL, K.R_BEHIND)


def covers(policy: int, has_predictions: bool) -> bool:
    """Whether this kernel runs eviction code `policy` (`kernel.EVICTIONS`) for a run with or
    without predictions."""
    return not has_predictions and policy in LIST_EVICTIONS


@K.kernel_jit
def run(I, F, keys, mult, pass_tokens, pass_pairs, compute, cost):
    """`kernel.run` without predictions, for the list evictions (`covers`): the same arguments
    less `pred`, the same outcome in `(I, F)` and the same returns, but for the running
    totals: those of RUNNING's rows only (`compiled.run` widens them)."""
    dense, attn, half, dense_before, dense_after = compute
    has_cost, per_expert, shared_params, dtype_b, peak_flops, hbm_bps, launch = cost
    policy = I[K.POLICY]
    n_slots, n_layers, n_experts = I[K.N_SLOTS], I[K.N_LAYERS], I[K.N_EXPERTS]
    pin_layer = I[K.PIN_LAYER] == 1
    is_ls = policy == K.LS_TWO_QUEUE or policy == K.LS_LEFT_FIRST or policy == K.LS_CYCLIC
    per_layer = policy == K.LRU_PER_LAYER or policy == K.LRU_PER_LAYER_STRICT
    strict = policy == K.LRU_PER_LAYER_STRICT
    # The layout's offsets, read once (`kernel._k` and friends read them at every access).
    nk = I[K.N_KEYS]
    ko = I[K.O_KEYS]
    so = I[K.O_SLOTS]
    key_of_b, free_b = so + K.KEY_OF * n_slots, so + K.FREE * n_slots
    sr, t = I[K.O_SR], I[K.O_T]
    engines = F[t + 2:t + 2 + I[K.ENGINES]]  # a view: the copy engines' free times
    c0 = I[K.O_C]
    fo = I[K.O_FC]
    nbytes, latency = F[fo + K.F_BYTES], F[fo + K.F_LATENCY]
    engine_bps, link_bps = F[fo + K.F_ENGINE_BPS], F[fo + K.F_LINK_BPS]
    starts = I[I[K.O_STARTS]:I[K.O_STARTS] + len(pass_pairs) * n_layers + 1]
    lo, nl = I[K.O_LISTS], I[K.N_LISTS]
    head_b, tail_b, len_b = lo + K.HEAD * nl, lo + K.TAIL * nl, lo + K.LEN * nl
    # A key's fields, at `key_at(field, key)` (key-major: `kernel._k`).
    slot_b, evicted_b, prot_b = ko + K.SLOT, ko + K.EVICTED_IN, ko + K.PROT
    prev_b, next_b, list_b = ko + K.EL, ko + K.EL_NEXT, ko + K.EL_LIST
    last_b = ko + K.LAST
    # An index into I, F or an input array: never negative, so unsigned (the module's
    # docstring).
    u = np.uint64

    def key_at(field, k):
        return u(field + k * K.N_KEY_ROWS)

    # The eviction lists (`kernel._append`, `_remove`, written out on hoisted offsets; inner
    # functions, which numba inlines).
    def append(w, k):
        tail = I[u(tail_b + w)]
        I[key_at(list_b, k)] = w
        I[key_at(prev_b, k)] = tail
        I[key_at(next_b, k)] = -1
        if tail >= 0:
            I[key_at(next_b, tail)] = k
        else:
            I[u(head_b + w)] = k
        I[u(tail_b + w)] = k
        I[u(len_b + w)] += 1

    def unlink(k):
        w = I[key_at(list_b, k)]
        if w >= 0:
            before, after = I[key_at(prev_b, k)], I[key_at(next_b, k)]
            if before >= 0:
                I[key_at(next_b, before)] = after
            else:
                I[u(head_b + w)] = after
            if after >= 0:
                I[key_at(prev_b, after)] = before
            else:
                I[u(tail_b + w)] = before
            I[key_at(prev_b, k)] = -1
            I[key_at(next_b, k)] = -1
            I[key_at(list_b, k)] = -1
            I[u(len_b + w)] -= 1

    def current(k, pos):
        """Least-Stale: `k` current for the pass; a current key keeps its place
        (`kernel._ls_request`)."""
        if I[key_at(list_b, k)] != n_layers + pos:
            unlink(k)
            append(n_layers + pos, k)

    n_pass = len(pass_pairs)
    has_mult = len(mult) > 0  # (empty: one pair a request, `compiled.requests`)
    passes = np.zeros((n_pass, 3))
    running = np.zeros((n_pass, len(RUNNING)))  # the running totals of RUNNING's rows
    pins = np.zeros(n_slots, np.int64)
    n_pins = 0
    longest = 1
    for pl in range(len(starts) - 1):
        longest = max(longest, starts[u(pl + 1)] - starts[u(pl)])
    order = np.zeros(longest, np.int64)
    layer_of = np.arange(nk) // n_experts  # each key's MoE position (no division per eviction)
    # The scalars the loop keeps in registers, written back at the end: the clock, the link's
    # free time, the stamp, the free slots' count, the recency tick.
    clock = F[u(t)]
    link = F[u(t + 1)]
    stamp = I[K.STAMP]
    free_n = I[K.FREE_N]
    tick = I[K.TICK]
    one_engine = len(engines) == 1
    engine = engines[0] if one_engine else 0.0  # the one engine's free time, when one
    per_link = nbytes / link_bps  # `timeline.book`'s quotients, the same each time
    per_engine = nbytes / engine_bps
    lru_like = policy == K.LRU or policy == K.FIFO
    # The running totals of the rows this kernel counts.
    t_req = t_hit = t_late = t_miss = t_coll = t_evict = t_prod = t_waves = 0
    t_dem = 0.0
    cnt = np.zeros((len(COUNTED), n_layers), np.int64)  # per layer, the rows of COUNTED
    for p in range(n_pass):
        start = clock
        if has_cost:
            clock += half[p]
        pass_stall = 0.0
        tokens = pass_tokens[p]
        if is_ls:
            K.begin_pass(I)
        for pos in range(n_layers):
            pl = p * n_layers + pos
            if has_cost:  # the dense layers before it, then its attention + router
                for _ in range(dense_before[u(pos)]):
                    clock += dense[u(p)]
                clock += attn[u(p)]
            a, b = starts[u(pl)], starts[u(pl + 1)]
            n = b - a
            waves = n > n_slots
            if waves:
                m = 0
                for resident in (True, False):
                    for i in range(a, b):
                        if (I[key_at(slot_b, keys[u(i)])] >= 0) == resident:
                            order[u(m)] = i
                            m += 1
            n_waves = (n + n_slots - 1) // n_slots if waves else 1
            for w in range(n_waves):
                w0 = w * n_slots
                w1 = min(n, w0 + n_slots)
                now = clock
                n_pins = 0
                stamp += 1
                wave_stamp = stamp
                for j in range(w0, w1):
                    k = keys[u(order[u(j)] if waves else a + j)]
                    pins[u(n_pins)] = k
                    n_pins += 1
                    I[key_at(prot_b, k)] = wave_stamp
                ready = now
                engine_wait = 0.0
                hits = 0
                late = 0
                misses = 0
                coll = 0
                pairs = 0
                for j in range(w0, w1):
                    i = order[u(j)] if waves else a + j
                    k = keys[u(i)]
                    if waves:  # (one wave: the pass's pairs, below)
                        pairs += mult[u(i)] if has_mult else 1
                    s = I[key_at(slot_b, k)]
                    if s >= 0:
                        at = F[u(sr + s)]
                        if at > now:
                            late += 1
                            if at > ready:
                                ready = at
                        else:
                            hits += 1
                        # (No prefetch origin to clear, as the general kernel does on a use:
                        # without predictions none is ever set.)
                        # `kernel._on_access`
                        if policy == K.LRU or policy == K.FLD or per_layer:
                            lw = I[key_at(list_b, k)]
                            tail = I[u(tail_b + lw)]
                            if tail != k:  # to the end of its list (it stays in it)
                                before, after = I[key_at(prev_b, k)], I[key_at(next_b, k)]
                                if before >= 0:
                                    I[key_at(next_b, before)] = after
                                else:
                                    I[u(head_b + lw)] = after
                                I[key_at(prev_b, after)] = before
                                I[key_at(prev_b, k)] = tail
                                I[key_at(next_b, k)] = -1
                                I[key_at(next_b, tail)] = k
                                I[u(tail_b + lw)] = k
                            if per_layer:
                                tick += 1
                                I[key_at(last_b, k)] = tick
                        elif is_ls:
                            current(k, pos)
                    else:
                        if I[key_at(evicted_b, k)] == p:
                            coll += 1
                        st = wave_stamp
                        if not pin_layer:  # only the expert being fetched is protected
                            stamp += 1
                            st = stamp
                            I[key_at(prot_b, k)] = st
                        # A slot: a free one, else the policy's victim (`kernel._allocate`).
                        if free_n > 0 and not (strict and K.keeps_own(I, st, k)):
                            free_n -= 1
                            s = I[u(free_b + free_n)]
                        else:
                            if lru_like:  # the first not protected
                                v = I[u(head_b)]
                                while v >= 0 and I[key_at(prot_b, v)] == st:
                                    v = I[key_at(next_b, v)]
                            else:
                                v = K.victim(I, pos, st, k, p)
                            s = I[key_at(slot_b, v)]
                            I[key_at(slot_b, v)] = -1
                            I[u(key_of_b + s)] = -1
                            I[key_at(evicted_b, v)] = p
                            unlink(v)
                            F[u(c0 + K.R_EVICT * n_layers + layer_of[u(v)])] += 1
                            t_evict += 1
                        # `timeline.book`, written out (the module's docstring)
                        if one_engine:  # its free time in a register (`engine`)
                            free = engine
                        else:
                            e = timeline.earliest(engines)
                            free = engines[u(e)]
                        if misses == 0:  # what is on the engines went before it
                            engine_wait = timeline.stall(free, now)
                        data_start = (now if now > free else free) + latency
                        link = (data_start if data_start > link else link) + per_link
                        end = data_start + per_engine
                        if link > end:
                            end = link
                        if one_engine:
                            engine = end
                        else:
                            engines[u(e)] = end
                        r = timeline.landed(end, F[u(sr + s)])
                        I[key_at(slot_b, k)] = s
                        I[u(key_of_b + s)] = k
                        F[u(sr + s)] = r
                        # `kernel._on_admit`
                        if lru_like:
                            append(0, k)
                        elif policy == K.FLD:
                            append(pos, k)
                        elif per_layer:
                            append(pos, k)
                            tick += 1
                            I[key_at(last_b, k)] = tick
                        elif is_ls:
                            current(k, pos)
                        if r > ready:
                            ready = r
                        misses += 1
                stall = timeline.stall(ready, clock)
                clock += stall
                pass_stall += stall
                if n_waves == 1:
                    pairs = pass_pairs[p]
                row = c0 + pos
                cnt[0, pos] += w1 - w0  # COUNTED's order
                cnt[1, pos] += hits
                cnt[2, pos] += late
                cnt[3, pos] += misses
                cnt[4, pos] += coll
                cnt[5, pos] += pairs
                cnt[6, pos] += 1
                F[u(row + K.R_DEMAND_B * n_layers)] += misses * nbytes
                t_req += w1 - w0
                t_hit += hits
                t_late += late
                t_miss += misses
                t_coll += coll
                t_dem += misses * nbytes
                t_prod += pairs
                t_waves += 1
                F[u(row + K.R_STALL * n_layers)] += stall
                if engine_wait > 0.0:
                    F[u(row + K.R_BEHIND * n_layers)] += min(stall, engine_wait)
                if has_cost:  # CostModel.experts, with the shared expert on the first wave
                    clock += timeline.experts_step(pairs, w1 - w0, tokens, per_expert,
                                                   shared_params if w == 0 else 0, dtype_b,
                                                   peak_flops, hbm_bps, launch)
        if has_cost:  # the dense layers after the last MoE layer, then the logits
            for _ in range(dense_after):
                clock += dense[u(p)]
            clock += half[u(p)]
        passes[p, 0] = start
        passes[p, 1] = clock
        passes[p, 2] = pass_stall
        # The running totals: the counts as they go, the seconds summed over the layers as
        # the general kernel sums them.
        running[p, 0] = t_req  # RUNNING's order
        running[p, 1] = t_hit
        running[p, 2] = t_late
        running[p, 3] = t_miss
        running[p, 4] = t_coll
        running[p, 5] = t_prod
        running[p, 6] = t_waves
        running[p, 7] = t_evict
        running[p, 8] = t_dem
        for j in range(9, 11):
            total = 0.0
            base = c0 + RUNNING[j] * n_layers
            for q in range(n_layers):
                total += F[u(base + q)]
            running[p, j] = total
    for j in range(len(COUNTED)):
        for q in range(n_layers):
            F[u(c0 + COUNTED[j] * n_layers + q)] += cnt[j, q]
    if one_engine:
        engines[0] = engine
    F[u(t)] = clock
    F[u(t + 1)] = link
    I[K.STAMP] = stamp
    I[K.FREE_N] = free_n
    I[K.TICK] = tick
    return passes, running, pins[:n_pins].copy()
