"""The compiled replay kernel specialised to the runs most grids and capacity sweeps are made of:
no prefetch (no predictions, so no queue, no predicted sets, no prefetch origins), and an
eviction whose victim order is a list (`lru`, `fifo`, `lru_per_layer` under either quota,
`fld`, `least_stale` in its three orders). It runs on the very state `kernel.layout` makes and
leaves it as `kernel.run` would, with the same outputs, so `compiled.run` reads either alike;
the general kernel runs everything else.

Why a second loop: the general kernel reaches every field through accessors that read the
layout's offsets from `I` at each access (stores into `I` keep LLVM from hoisting them) and
calls a function per step of a request; per request that was most of its time. Here the
offsets are read once, and the request's path (the list moves, the allocation, the booking)
is written out in the loop or in inner functions, which numba inlines. Its semantics are the
general kernel's, step for step (`kernel.py`'s docstring): the rarer steps (a layered victim
search, Least-Stale's pass start, the strict quota's check) are the general kernel's own
functions. `tests/test_compiled_replay.py` holds the two kernels equal, and both to the
reference engine. The time arithmetic is `moejax/timing/timeline.py`'s, as everywhere.
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


def covers(policy: int, has_predictions: bool) -> bool:
    """Whether this kernel runs eviction code `policy` (`kernel.EVICTIONS`) for a run with or
    without predictions."""
    return not has_predictions and policy in LIST_EVICTIONS


@K.jit
def run(I, F, keys, mult, pass_tokens, pass_pairs, compute, cost):
    """`kernel.run` without predictions, for the list evictions (`covers`): the same arguments
    less `pred`, the same outcome in `(I, F)` and the same returns."""
    pre_off, pre_vals, begin, end_off, end_vals = compute
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
    slot_b, evicted_b, prot_b = ko + K.SLOT * nk, ko + K.EVICTED_IN * nk, ko + K.PROT * nk
    origin_b, origin_t = ko + K.ORIGIN_PASS * nk, ko + K.ORIGIN_TPOS * nk
    so = I[K.O_SLOTS]
    key_of_b, free_b = so + K.KEY_OF * n_slots, so + K.FREE * n_slots
    sr, t = I[K.O_SR], I[K.O_T]
    engines = F[t + 2:t + 2 + I[K.ENGINES]]  # a view: the copy engines' free times
    c0 = I[K.O_C]
    fo = I[K.O_FC]
    nbytes, latency = F[fo + K.F_BYTES], F[fo + K.F_LATENCY]
    engine_bps, link_bps = F[fo + K.F_ENGINE_BPS], F[fo + K.F_LINK_BPS]
    starts = I[I[K.O_STARTS]:I[K.O_STARTS] + len(pass_pairs) * n_layers + 1]
    # The eviction lists (`kernel._append`, `_remove`, `_to_end`, written out on hoisted
    # offsets; inner functions, which numba inlines).
    lo, nl = I[K.O_LISTS], I[K.N_LISTS]
    head_b, tail_b, len_b = lo + K.HEAD * nl, lo + K.TAIL * nl, lo + K.LEN * nl
    prev_b, next_b, list_b = ko + K.EL * nk, ko + K.EL_NEXT * nk, ko + K.EL_LIST * nk
    last_b = ko + K.LAST * nk

    def append(w, k):
        tail = I[tail_b + w]
        I[list_b + k] = w
        I[prev_b + k] = tail
        I[next_b + k] = -1
        if tail >= 0:
            I[next_b + tail] = k
        else:
            I[head_b + w] = k
        I[tail_b + w] = k
        I[len_b + w] += 1

    def unlink(k):
        w = I[list_b + k]
        if w >= 0:
            before, after = I[prev_b + k], I[next_b + k]
            if before >= 0:
                I[next_b + before] = after
            else:
                I[head_b + w] = after
            if after >= 0:
                I[prev_b + after] = before
            else:
                I[tail_b + w] = before
            I[prev_b + k] = -1
            I[next_b + k] = -1
            I[list_b + k] = -1
            I[len_b + w] -= 1

    def to_end(k):
        w = I[list_b + k]
        if I[tail_b + w] != k:
            unlink(k)
            append(w, k)

    def use(k):  # lru_per_layer's recency tick
        I[K.TICK] += 1
        I[last_b + k] = I[K.TICK]

    def requested(k, pos):
        """`kernel._on_access` of key `k` of MoE position `pos` (FIFO: nothing)."""
        if policy == K.LRU or policy == K.FLD:
            to_end(k)
        elif per_layer:
            to_end(k)
            use(k)
        elif is_ls:  # current for the pass; a current key keeps its place
            if I[list_b + k] != n_layers + pos:
                unlink(k)
                append(n_layers + pos, k)

    def admitted(k, pos):
        """`kernel._on_admit` of key `k` of MoE position `pos`."""
        if policy == K.LRU or policy == K.FIFO:
            append(0, k)
        elif policy == K.FLD:
            append(pos, k)
        elif per_layer:
            append(pos, k)
            use(k)
        elif is_ls:
            if I[list_b + k] != n_layers + pos:
                unlink(k)
                append(n_layers + pos, k)

    n_pass = len(pass_pairs)
    n_rows = len(K.ROWS)
    passes = np.zeros((n_pass, 3))
    running = np.zeros((n_pass, n_rows))
    tot = np.zeros(n_rows)  # the counts' totals over the layers (rows this kernel counts)
    pins = np.zeros(n_slots, np.int64)
    n_pins = 0
    longest = 1
    for pl in range(len(starts) - 1):
        longest = max(longest, starts[pl + 1] - starts[pl])
    order = np.zeros(longest, np.int64)
    layer_of = np.arange(nk) // n_experts  # each key's MoE position (no division per eviction)
    for p in range(n_pass):
        start = F[t]
        F[t] += begin[p]
        pass_stall = 0.0
        tokens = pass_tokens[p]
        if is_ls:
            K.begin_pass(I)
        for pos in range(n_layers):
            pl = p * n_layers + pos
            for i in range(pre_off[pl], pre_off[pl + 1]):
                F[t] += pre_vals[i]
            a, b = starts[pl], starts[pl + 1]
            n = b - a
            # More experts than slots: waves, resident experts first (`waves.py`), in
            # `order`; else the requests in their own order.
            waves = n > n_slots
            if waves:
                m = 0
                for resident in (True, False):
                    for i in range(a, b):
                        if (I[slot_b + keys[i]] >= 0) == resident:
                            order[m] = i
                            m += 1
            n_waves = (n + n_slots - 1) // n_slots if waves else 1
            for w in range(n_waves):
                w0 = w * n_slots
                w1 = min(n, w0 + n_slots)
                now = F[t]
                n_pins = 0
                I[K.STAMP] += 1
                wave_stamp = I[K.STAMP]
                for j in range(w0, w1):
                    k = keys[order[j] if waves else a + j]
                    pins[n_pins] = k
                    n_pins += 1
                    I[prot_b + k] = wave_stamp
                ready = now
                engine_wait = 0.0
                hits = 0
                late = 0
                misses = 0
                coll = 0
                pairs = 0
                for j in range(w0, w1):
                    i = order[j] if waves else a + j
                    k = keys[i]
                    pairs += mult[i]
                    s = I[slot_b + k]
                    if s >= 0:
                        at = F[sr + s]
                        if at > now:
                            late += 1
                            if at > ready:
                                ready = at
                        else:
                            hits += 1
                        if I[origin_b + k] >= 0:  # (never, without prefetch)
                            I[origin_b + k] = -1
                            I[origin_t + k] = -1
                    else:
                        if I[evicted_b + k] == p:
                            coll += 1
                        st = wave_stamp
                        if not pin_layer:  # only the expert being fetched is protected
                            I[K.STAMP] += 1
                            st = I[K.STAMP]
                            I[prot_b + k] = st
                        # A slot: a free one, else the policy's victim (`kernel._allocate`).
                        if I[K.FREE_N] > 0 and not (strict and K.keeps_own(I, st, k)):
                            I[K.FREE_N] -= 1
                            s = I[free_b + I[K.FREE_N]]
                        else:
                            if policy == K.LRU or policy == K.FIFO:  # the first not protected
                                v = I[head_b]
                                while v >= 0 and I[prot_b + v] == st:
                                    v = I[next_b + v]
                            else:
                                v = K.victim(I, pos, st, k, p)
                            s = I[slot_b + v]
                            I[slot_b + v] = -1
                            I[key_of_b + s] = -1
                            I[evicted_b + v] = p
                            unlink(v)
                            F[c0 + K.R_EVICT * n_layers + layer_of[v]] += 1
                            tot[K.R_EVICT] += 1
                        if misses == 0:  # what is on the engines went before it
                            engine_wait = timeline.stall(engines[timeline.earliest(engines)],
                                                         now)
                        booked = timeline.book(engines, F[t + 1], nbytes, now, latency,
                                               engine_bps, link_bps)
                        F[t + 1] = booked[3]
                        r = timeline.landed(booked[4], F[sr + s])
                        I[slot_b + k] = s
                        I[key_of_b + s] = k
                        F[sr + s] = r
                        admitted(k, pos)
                        if r > ready:
                            ready = r
                        misses += 1
                    requested(k, pos)
                stall = timeline.stall(ready, F[t])
                F[t] += stall
                pass_stall += stall
                if n_waves == 1:
                    pairs = pass_pairs[p]
                row = c0 + pos
                F[row + K.R_REQ * n_layers] += w1 - w0
                F[row + K.R_HIT * n_layers] += hits
                F[row + K.R_LATE * n_layers] += late
                F[row + K.R_MISS * n_layers] += misses
                F[row + K.R_COLL * n_layers] += coll
                F[row + K.R_DEMAND_B * n_layers] += misses * nbytes
                F[row + K.R_PRODUCTS * n_layers] += pairs
                F[row + K.R_WAVES * n_layers] += 1
                tot[K.R_REQ] += w1 - w0
                tot[K.R_HIT] += hits
                tot[K.R_LATE] += late
                tot[K.R_MISS] += misses
                tot[K.R_COLL] += coll
                tot[K.R_DEMAND_B] += misses * nbytes
                tot[K.R_PRODUCTS] += pairs
                tot[K.R_WAVES] += 1
                F[row + K.R_STALL * n_layers] += stall
                if engine_wait > 0.0:
                    F[row + K.R_BEHIND * n_layers] += min(stall, engine_wait)
                if has_cost:  # CostModel.experts, with the shared expert on the first wave
                    F[t] += timeline.experts_step(pairs, w1 - w0, tokens, per_expert,
                                                  shared_params if w == 0 else 0, dtype_b,
                                                  peak_flops, hbm_bps, launch)
        for i in range(end_off[p], end_off[p + 1]):
            F[t] += end_vals[i]
        passes[p, 0] = start
        passes[p, 1] = F[t]
        passes[p, 2] = pass_stall
        # The running totals: the counts kept as they go (sums of integers, exact in any
        # order), the seconds summed over the layers as the general kernel sums them.
        for j in range(n_rows):
            running[p, j] = tot[j]
        for j in (K.R_STALL, K.R_BEHIND):
            total = 0.0
            base = c0 + j * n_layers
            for q in range(n_layers):
                total += F[base + q]
            running[p, j] = total
    return passes, running, pins[:n_pins].copy()
