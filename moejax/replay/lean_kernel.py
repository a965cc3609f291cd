"""The compiled replay kernels specialised to the runs most grids and capacity sweeps are made
of: no prefetch (no predictions, so no queue, no predicted sets, no prefetch origins), and an
eviction whose victim order is a list (`lru`, `fifo`, `lru_per_layer` under either quota,
`fld`, `least_stale` in its three orders). They run on the very state `kernel.layout` makes
and leave what `compiled.run` reads of it as `kernel.run` would, with the same outputs (the
running totals narrower), so `compiled.run` reads either alike; the general kernel runs
everything else. `kernel_for` hands out the one for a run.

Without prefetch, what the cache holds never depends on time: which request hits, which
slot it lands in, which key it evicts follow from the requests alone. So a run is served in
two parts: the cache's steps, which decide each request's outcome, and the clock's loop,
which books the misses' transfers, weighs each hit's slot against the wave's start (a hit or a
late hit), charges the stalls and the compute, and counts. For `lru` and `fifo` without waves
the clock's loop serves the requests itself, on one list kept in int32 arrays of its own
(where every request misses, a loop of its own for the cache's steps took a third longer:
the two loops' work did not overlap); for the others, a first loop (`_cache_steps`) writes
each request's outcome as a code the clock's loop reads.

Why not the general kernel's loop: it reaches every field through accessors that read the
layout's offsets from `I` at each access (stores into `I` keep LLVM from hoisting them) and
calls a function per step of a request; per request that was most of its time. Here:
- the offsets are read once, and the request's path (the list moves, the allocation, the
  booking) is written out in the loop or in inner functions, which numba inlines;
- the scalars the general kernel keeps in `I` and `F` (the clock, the link's free time, a
  single copy engine's free time, the stamp, the free slots' count, the recency tick) live in
  locals, written back at the end (the engine's: 7% of a 1M-request `lru` replay's loop);
- the integer counters are summed per layer in a local array, added to `F` at the end (sums
  of integers: exact in any order), and the running totals are returned for the rows these
  kernels count only (`RUNNING`);
- every index is cast to unsigned (`u`): numba checks a signed index for a negative value
  (Python's wraparound) at every access, and no index here is ever negative; on a 1M-request
  replay that check was about a third of the loop's time;
- a transfer's booking is `timeline.book` written out with its two quotients taken once
  (called, it cost 15-25% of the loop: numba does not inline it), or on one copy engine
  `timeline.book_alone`'s two additions;
- each kernel is compiled with its booking, its way of serving and whether a cost model
  charges compute as constants, the others' code left out, and only when a run takes it
  (`kernel_for`);
- serving one list (one wave a pass-layer), the clock's loop counts per wave only the late
  hits, misses and collisions, and a layer's demand bytes are its misses times the expert's
  bytes where every sum is exact (`run`): the rest follows from the requests; on a top-2
  model, two requests a wave, the work a wave had outweighed the requests'.
(Measured with `benchmarks/replay_limit.py`; its figures are in benchmarks/README.md.)

Their semantics are the general kernel's, step for step (`kernel.py`'s docstring): the rarer
steps (Least-Stale's pass start, the strict quota's check) are the general kernel's own
functions, and the victim searches (`lru_per_layer`'s walk over the layers, FLD's and
Least-Stale's along their lists) are its `victim` written out on hoisted offsets, with
shortcuts that find the same victim (`_cache_steps`: the layers over their share, each layer's
first key's recency, the walk's first list that holds a key).
`tests/test_compiled_replay.py` holds every kernel here equal to the general one (every count,
every time, bit for bit), and both to the reference engine."""

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


# A request's code, `_cache_steps`' word to the clock's loop: its slot in the low bits, and
# whether it missed and whether that miss is a collision.
MISS = 1 << 30
COLLISION = 1 << 29
SLOT_BITS = COLLISION - 1


def covers(policy: int, has_predictions: bool) -> bool:
    """Whether this kernel runs eviction code `policy` (`kernel.EVICTIONS`) for a run with or
    without predictions."""
    return not has_predictions and policy in LIST_EVICTIONS


@K.kernel_jit
def _held_per_layer(I):
    """How many experts of each MoE layer the cache holds."""
    n_experts = I[K.N_EXPERTS]
    held = np.zeros(I[K.N_LAYERS], np.int64)
    for k in range(I[K.N_KEYS]):
        if I[I[K.O_KEYS] + k * K.N_KEY_ROWS + K.SLOT] >= 0:
            held[k // n_experts] += 1
    return held


@K.kernel_jit
def _cache_steps(I, F, keys, starts, code, order, evictions):
    """The cache's steps, for every eviction and pin scope these kernels cover: serves the
    requests on the cache's state in `I` (`kernel._allocate`, `_on_access`, `_on_admit`, and
    `kernel.victim` on hoisted offsets; Least-Stale's pass start and the strict quota's check
    are `kernel.py`'s own functions), writing each one's code (`code`, in the order served: a
    pass-layer's requests in rank order, or where it has waves resident ones first, with the
    request in `order`), the evictions per pass, and per layer into F's counters."""
    policy = I[K.POLICY]
    n_slots, n_layers = I[K.N_SLOTS], I[K.N_LAYERS]
    pin_layer = I[K.PIN_LAYER] == 1
    is_ls = policy == K.LS_TWO_QUEUE or policy == K.LS_LEFT_FIRST or policy == K.LS_CYCLIC
    per_layer = policy == K.LRU_PER_LAYER or policy == K.LRU_PER_LAYER_STRICT
    strict = policy == K.LRU_PER_LAYER_STRICT
    lru_like = policy == K.LRU or policy == K.FIFO
    # The layout's offsets, read once (`kernel._k` and friends read them at every access).
    ko = I[K.O_KEYS]
    so = I[K.O_SLOTS]
    key_of_b, free_b = so + K.KEY_OF * n_slots, so + K.FREE * n_slots
    c_evict = I[K.O_C] + K.R_EVICT * n_layers
    lo, nl = I[K.O_LISTS], I[K.N_LISTS]
    head_b, tail_b, len_b = lo + K.HEAD * nl, lo + K.TAIL * nl, lo + K.LEN * nl
    # A key's fields, at `key_at(field, key)` (key-major: `kernel._k`).
    slot_b, evicted_b, prot_b = ko + K.SLOT, ko + K.EVICTED_IN, ko + K.PROT
    prev_b, next_b, list_b = ko + K.EL, ko + K.EL_NEXT, ko + K.EL_LIST
    last_b, layer_b = ko + K.LAST, ko + K.LAYER
    # An index into I, F or an input array: never negative, so unsigned (the module's
    # docstring).
    u = np.uint64

    def key_at(field, k):
        return u(field + k * K.N_KEY_ROWS)

    # The eviction lists (`kernel.append`, `remove`, written out on hoisted offsets; inner
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

    quota_b = I[K.O_POS] + K.QUOTA * n_layers

    def first_free(w, st):  # `kernel._first_free`
        k = I[u(head_b + w)]
        while k >= 0 and I[key_at(prot_b, k)] == st:
            k = I[key_at(next_b, k)]
        return k

    # `lru_per_layer`: the layers over their share, as a set (`over[:n_over]`, and each
    # layer's place in it, `over_at`, -1 where it is not), kept as the loop admits and evicts
    # (a layer's list changes length nowhere else), so that a victim search looks at those
    # layers only, not at every layer: at 5% of OLMoE (3 slots a layer, 8 requests a
    # layer-pass) one or two layers are over their share, and searching all 16 (with the
    # incoming layer's list walked twice) took 13 ms of a 1M-request replay's 46.
    over = np.empty(n_layers if per_layer else 0, np.int64)
    over_at = np.full(n_layers if per_layer else 0, -1, np.int64)
    n_over = 0
    if per_layer:
        for q in range(n_layers):
            if I[u(len_b + q)] > I[u(quota_b + q)]:
                over[n_over] = q
                over_at[q] = n_over
                n_over += 1

    # `lru_per_layer`: each layer's first key's LAST (`NO_HEAD` where its list is empty), kept
    # as the loop moves, evicts or admits a layer's first key. The search over every layer
    # reads these, not each first key's row: only the incoming layer's keys are ever protected
    # (the wave's experts, or the one being fetched, are its own: the loop checks that a
    # request's key is its layer's), so every other layer's first key not protected is its
    # head. At 5% of OLMoE two of every five misses search every layer, and reading sixteen
    # keys' rows took 4 ms of a 1M-request replay's 32.
    NO_HEAD = np.int64(2 ** 62)
    head_last = np.full(n_layers if per_layer else 0, NO_HEAD, np.int64)

    def reset_head(q):
        h = I[u(head_b + q)]
        head_last[u(q)] = I[key_at(last_b, h)] if h >= 0 else NO_HEAD

    if per_layer:
        for q in range(n_layers):
            reset_head(q)

    def least_recent_first(k, best, best_last):
        """Whether `k` (its layer's first key not protected) goes before `best`: less recent
        (`LAST`: a tick of its own each use), a tie (none in a run the loop made) to the
        lower layer, as `kernel.victim`'s walk in layer order keeps the first."""
        last = I[key_at(last_b, k)]
        return best < 0 or last < best_last or (last == best_last and k < best)

    def layer_victim(own, st, n_over, own_free):
        """`kernel.victim` for `lru_per_layer`, on hoisted offsets: the incoming key's layer
        (`own`) gives its own first key not protected where it holds its share; else, of each
        layer's first key not protected, the least recent among the layers over their share
        (`over[:n_over]`, in any order: the least recent is one key), else among all (the
        other layers' heads by `head_last`, in layer order). Walks `own`'s list once, not at
        all where `own_free` is False (its keys all protected), and returns the victim and
        whether `own`'s list held a key not protected."""
        k_own = first_free(own, st) if own_free else -1
        if k_own >= 0 and I[u(len_b + own)] >= I[u(quota_b + own)]:
            return k_own, True
        best = -1
        best_last = 0
        for i in range(n_over):
            q = over[u(i)]
            k = k_own if q == own else first_free(q, st)
            if k >= 0 and least_recent_first(k, best, best_last):
                best, best_last = k, I[key_at(last_b, k)]
        if best < 0:
            best_q = -1
            best_l = NO_HEAD
            for q in range(n_layers):  # (no branch on the comparison: it is a coin toss)
                l = head_last[u(q)]
                take = (l < best_l) & (q != own)
                best_l = l if take else best_l
                best_q = q if take else best_q
            if best_q >= 0:
                best = I[u(head_b + best_q)]
                best_last = best_l
            if k_own >= 0 and least_recent_first(k_own, best, best_last):
                best = k_own
        return best, k_own >= 0

    walk_o, walk_w = I[K.O_WALK], I[K.WALK_W]
    # Where every position's walk is the lists in their order (Least-Stale's `two_queue`), a
    # walk starts at `first`, below which no list holds a key (`kernel.victim`'s
    # `WALK_FIRST`, kept here in a local: each admission or move lowers it to its list, a
    # pass start resets it to 0).
    in_order = I[K.WALK_IN_ORDER] == 1
    first = 0

    def walk_victim(pos, st, first):
        """`kernel.victim` for FLD and Least-Stale, on hoisted offsets: the first key not
        protected along the lists of the running position's walk; with the walk in order,
        from the first list that holds a key, which it returns with the victim."""
        if in_order:
            while first < walk_w and I[u(len_b + first)] == 0:
                first += 1
            for w in range(first, walk_w):
                k = first_free(w, st)
                if k >= 0:
                    return k, first
            return -1, first
        q0 = pos if pos < n_layers - 1 else n_layers - 1
        if q0 < -1:
            q0 = -1
        row = walk_o + (q0 + 1) * walk_w
        for j in range(walk_w):
            k = first_free(I[u(row + j)], st)
            if k >= 0:
                return k, first
        return -1, first

    def current(k, pos):
        """Least-Stale: `k` current for the pass; a current key keeps its place
        (`kernel._ls_request`)."""
        if I[key_at(list_b, k)] != n_layers + pos:
            unlink(k)
            append(n_layers + pos, k)

    stamp = I[K.STAMP]
    free_n = I[K.FREE_N]
    tick = I[K.TICK]
    for p in range(len(evictions)):
        if is_ls:
            K.begin_pass(I)
            first = 0
        n_evicted = 0
        for pos in range(n_layers):
            pl = p * n_layers + pos
            a, b = starts[u(pl)], starts[u(pl + 1)]
            waves = b - a > n_slots
            if waves:  # resident experts first (`ExpertCache.run_layer`)
                m = a
                for resident in (True, False):
                    for i in range(a, b):
                        if (I[key_at(slot_b, keys[u(i)])] >= 0) == resident:
                            order[u(m)] = i
                            m += 1
            for j0 in range(a, b, n_slots):
                j1 = min(b, j0 + n_slots)
                wave_stamp = stamp
                # (lru_per_layer) Whether the layer's list may hold a key not protected. With
                # the layer's experts protected, once its walk finds none in a wave it finds
                # none for the rest of the wave (the list takes only the wave's own experts),
                # and the victim search skips it.
                own_free = True
                if pin_layer:  # the wave's experts are protected while it runs
                    stamp += 1
                    wave_stamp = stamp
                    for j in range(j0, j1):
                        I[key_at(prot_b, keys[u(order[u(j)] if waves else j)])] = wave_stamp
                for j in range(j0, j1):
                    k = keys[u(order[u(j)] if waves else j)]
                    s = I[key_at(slot_b, k)]
                    if s >= 0:
                        code[u(j)] = s
                        # (No prefetch origin to clear, as the general kernel does on a use:
                        # without predictions none is ever set.)
                        # `kernel._on_access`
                        if policy == K.LRU or policy == K.FLD or per_layer:
                            lw = I[key_at(list_b, k)]
                            was_head = per_layer and I[key_at(prev_b, k)] < 0
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
                                if was_head:
                                    reset_head(lw)
                        elif is_ls:
                            current(k, pos)
                            first = min(first, n_layers + pos)
                        continue
                    c = MISS | (COLLISION if I[key_at(evicted_b, k)] == p else 0)
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
                            v = first_free(0, st)
                        elif per_layer:
                            if I[key_at(layer_b, k)] != pos:
                                raise ValueError("a request's key is not its layer's")
                            v, own_free = layer_victim(pos, st, n_over, own_free)
                            own_free = own_free or not pin_layer
                        else:  # FLD, Least-Stale
                            v, first = walk_victim(pos, st, first)
                        s = I[key_at(slot_b, v)]
                        I[key_at(slot_b, v)] = -1
                        I[u(key_of_b + s)] = -1
                        I[key_at(evicted_b, v)] = p
                        w = I[key_at(list_b, v)]
                        was_head = I[key_at(prev_b, v)] < 0
                        unlink(v)
                        if per_layer and was_head:
                            reset_head(w)
                        if per_layer and I[u(len_b + w)] == I[u(quota_b + w)]:
                            # no longer over its share: out of the set (the last one takes
                            # its place)
                            i = over_at[u(w)]
                            n_over -= 1
                            moved = over[u(n_over)]
                            over[u(i)] = moved
                            over_at[u(moved)] = i
                            over_at[u(w)] = -1
                        F[u(c_evict + I[key_at(layer_b, v)])] += 1
                        n_evicted += 1
                    I[key_at(slot_b, k)] = s
                    I[u(key_of_b + s)] = k
                    # `kernel._on_admit`
                    if lru_like:
                        append(0, k)
                    elif policy == K.FLD:
                        append(pos, k)
                        first = min(first, pos)
                    elif per_layer:
                        append(pos, k)
                        if I[u(len_b + pos)] == I[u(quota_b + pos)] + 1:  # now over its share
                            over[u(n_over)] = pos
                            over_at[u(pos)] = n_over
                            n_over += 1
                        tick += 1
                        I[key_at(last_b, k)] = tick
                        if I[u(len_b + pos)] == 1:
                            reset_head(pos)
                    elif is_ls:
                        current(k, pos)
                        first = min(first, n_layers + pos)
                    code[u(j)] = c | s
        evictions[u(p)] = n_evicted
    I[K.STAMP] = stamp
    I[K.FREE_N] = free_n
    I[K.TICK] = tick
    I[K.WALK_FIRST] = 0  # a bound that holds for any lists (this loop's appends do not keep it)


# How the clock's loop learns each request's outcome (`_kernel_for`): from `_cache_steps`' code, or
# by serving it itself on one list (`lru`, `fifo`), with the layer's experts protected or
# only the one being fetched.
CODED, ONE_LIST_REQUEST, ONE_LIST_LAYER = range(3)
SERVES = ("coded", "one_list_request", "one_list_layer")


@K.kernel_jit
def _one_list_state(I):
    """Each key's slot, the pass it was last evicted in and its neighbours in the eviction list
    (`I`'s rows), as int32 arrays: the served loop's state (`_kernel_for`)."""
    nk, ko = I[K.N_KEYS], I[K.O_KEYS]
    slot = np.empty(nk, np.int32)
    evicted = np.empty(nk, np.int32)
    prev = np.empty(nk, np.int32)
    nxt = np.empty(nk, np.int32)
    for k in range(nk):
        at = ko + k * K.N_KEY_ROWS
        slot[k] = I[at + K.SLOT]
        evicted[k] = I[at + K.EVICTED_IN]
        prev[k] = I[at + K.EL]
        nxt[k] = I[at + K.EL_NEXT]
    return slot, evicted, prev, nxt


@K.kernel_jit
def _one_list_write_back(I, slot, evicted, prev, nxt):
    """The served loop's state back into `I`, with what the loop leaves out: each slot's key,
    and an evicted key's neighbours and list (it is in none)."""
    n_slots, ko = I[K.N_SLOTS], I[K.O_KEYS]
    key_of_b = I[K.O_SLOTS] + K.KEY_OF * n_slots
    I[key_of_b:key_of_b + n_slots] = -1
    for k in range(I[K.N_KEYS]):
        at = ko + k * K.N_KEY_ROWS
        held = slot[k] >= 0
        I[at + K.SLOT] = slot[k]
        I[at + K.EVICTED_IN] = evicted[k]
        I[at + K.EL] = prev[k] if held else -1
        I[at + K.EL_NEXT] = nxt[k] if held else -1
        I[at + K.EL_LIST] = 0 if held else -1
        if held:
            I[key_of_b + slot[k]] = k


def _kernel_for(alone: bool, serve: int, costed: bool):
    """The kernel, with the demand fetches booked by `timeline.book_alone` (`alone`: one copy
    engine that frees no earlier than the link) or in full, each request's outcome from
    `_cache_steps` (`serve=CODED`) or served in the clock's loop itself on one list, and the
    compute charged from a cost model or not (`costed`: a replay without one counts and books
    only). numba compiles each combination with its three constants, the others' code left
    out, and only the combinations a process runs (`kernel_for`): on a 1M-request replay, with
    both bookings in one loop the clock's loop took a sixth longer, and serving `lru` in a loop
    of its own took a third longer where every request misses (the two loops' work did not
    overlap); on a top-2 model (two requests a wave) the cost model's branches, left in where
    it is off, took a twentieth."""
    one_list = serve != CODED
    pin_layer = serve == ONE_LIST_LAYER

    def run(I, F, keys, starts, mult, pass_tokens, pass_pairs, compute, cost):
        """`kernel.run` without predictions, for the list evictions (`covers`): the same
        arguments less `pred`, with each pass-layer's start in `keys` given as it is
        (`compiled.requests`; `kernel.run` reads them from `I`, whose layout copies them into
        fresh pages: about a millisecond of a 524,288-request top-2 replay), the same outcome in
        `(I, F)` (all `compiled.run` reads of it) and the same returns, but for the running
        totals: those of RUNNING's rows only (`compiled.run` widens them).

        The clock and the counters: a pass's compute, each wave's demand fetches booked on
        the copy engines and the link, a slot's ready time against the wave's start (a hit or
        a late hit), the wave's stall. Each request's outcome is its code from the cache's steps
        (`_cache_steps`), or with one list, served here (`_cache_steps`' outcome on
        `_one_list_state`'s arrays: the victim is the first key from the list's head not
        protected, the head itself where only the expert being fetched is, as that one is not
        yet in the list; a layer's evictions follow from its misses, as each admits its expert
        into its own layer and only evictions take one out, and a pass's from its misses less
        the free slots it took)."""
        n_slots, n_layers = I[K.N_SLOTS], I[K.N_LAYERS]
        n_pass = len(pass_pairs)
        if len(starts) != n_pass * n_layers + 1:
            raise ValueError("the pass-layers' starts are not the passes' layers'")
        evictions = np.zeros(n_pass, np.int64)  # per pass
        if one_list:
            for pl in range(len(starts) - 1):  # (`kernel_for` takes it only without waves)
                if starts[pl + 1] - starts[pl] > n_slots:
                    raise ValueError("a pass-layer has more requests than the cache has slots")
            code = np.empty(0, np.int32)
            order = np.empty(0, np.int64)
            c_miss = I[K.O_C] + K.R_MISS * n_layers
            held = _held_per_layer(I)
            missed = F[c_miss:c_miss + n_layers].copy()
        else:
            waves = False
            for pl in range(len(starts) - 1):
                waves |= starts[pl + 1] - starts[pl] > n_slots
            code = np.empty(len(keys), np.int32)  # per request, in the order served
            # Which request is served, where a pass-layer has waves (resident ones first).
            order = np.empty(len(keys) if waves else 0, np.int64)
            _cache_steps(I, F, keys, starts, code, order, evictions)
        dense, attn, half, dense_before, dense_after = compute
        given, per_expert, shared_params, dtype_b, peak_flops, hbm_bps, launch = cost
        if given != costed:
            raise ValueError("the kernel's cost model setting is not the run's (`kernel_for`)")
        has_cost = costed
        sr, t = I[K.O_SR], I[K.O_T]
        engines = F[t + 2:t + 2 + I[K.ENGINES]]  # a view: the copy engines' free times
        c0 = I[K.O_C]
        fo = I[K.O_FC]
        nbytes, latency = F[fo + K.F_BYTES], F[fo + K.F_LATENCY]
        engine_bps, link_bps = F[fo + K.F_ENGINE_BPS], F[fo + K.F_LINK_BPS]
        u = np.uint64
        has_mult = len(mult) > 0  # (empty: one pair a request, `compiled.requests`)
        passes = np.zeros((n_pass, 3))
        running = np.zeros((n_pass, len(RUNNING)))  # the running totals of RUNNING's rows
        # The scalars the loop keeps in registers, written back at the end: the clock, the
        # link's free time.
        clock = F[u(t)]
        link = F[u(t + 1)]
        one_engine = len(engines) == 1
        engine = engines[0] if one_engine else 0.0  # the one engine's free time, when one
        per_link = nbytes / link_bps  # `timeline.book`'s quotients, the same each time
        per_engine = nbytes / engine_bps
        per_slower = per_engine if per_engine > per_link else per_link
        t_evict = 0  # the evictions so far (counted per pass as the cache serves)
        cnt = np.zeros((len(COUNTED), n_layers), np.int64)  # per layer, the rows of COUNTED
        # The one list, served here: its arrays, its ends and length, the free slots' stack.
        if one_list:
            slot, evicted, prev, nxt = _one_list_state(I)
        else:
            slot = evicted = prev = nxt = np.empty(0, np.int32)
        lru = I[K.POLICY] == K.LRU
        lo, nl = I[K.O_LISTS], I[K.N_LISTS]
        head, tail, listed = I[lo + K.HEAD * nl], I[lo + K.TAIL * nl], I[lo + K.LEN * nl]
        free_b = I[K.O_SLOTS] + K.FREE * n_slots
        free_n = I[K.FREE_N]
        prot = np.zeros(I[K.N_KEYS] if pin_layer else 0, np.int32)  # the loop's own stamps
        stamp = 0
        r_pairs = r_late = r_miss = r_coll = 0  # (one list) the counts so far
        missed_before = 0  # (one list) the misses before this pass
        free_at_start = free_n  # (one list: the list grows by the free slots taken)
        # A layer's demand bytes are its misses times the expert's bytes, summed wave by
        # wave: where those bytes are a whole number and no sum can reach 2**53, every sum is
        # exact, so the sum is the product, taken once at the end (one list: a twelfth of a
        # top-2 model's replay was this multiply-add a wave).
        demand_b = c0 + K.R_DEMAND_B * n_layers
        exact_bytes = (one_list and nbytes >= 0.0 and nbytes == np.floor(nbytes)
                       and len(keys) * nbytes < 2.0 ** 53)
        for q in range(n_layers):
            exact_bytes = exact_bytes and F[demand_b + q] == 0.0
        for p in range(n_pass):
            start = clock
            if has_cost:
                clock += half[p]
            pass_stall = 0.0
            tokens = pass_tokens[p]
            free_before = free_n  # (one list) the free slots at the pass's start
            for pos in range(n_layers):
                pl = p * n_layers + pos
                if has_cost:  # the dense layers before it, then its attention + router
                    for _ in range(dense_before[u(pos)]):
                        clock += dense[u(p)]
                    clock += attn[u(p)]
                a, b = starts[u(pl)], starts[u(pl + 1)]
                waves = not one_list and b - a > n_slots  # (one list: `run` checks there are none)
                # Its waves, from `a` on, `n_slots` requests each: at least one, as the
                # reference runs a pass-layer without requests, and with one list exactly one
                # (a loop whose count needs no division).
                j0 = a
                while True:
                    j1 = b if one_list else min(b, j0 + n_slots)
                    now = clock
                    ready = now
                    engine_wait = 0.0
                    hits = 0
                    late = 0
                    misses = 0
                    coll = 0
                    if not waves:
                        pairs = pass_pairs[p]
                    elif has_mult:
                        pairs = 0
                        for j in range(j0, j1):
                            pairs += mult[u(order[u(j)])]
                    else:  # one pair a request (`compiled.requests`)
                        pairs = j1 - j0
                    if pin_layer:  # the wave's experts are protected while it runs
                        stamp += 1
                        for j in range(j0, j1):
                            prot[u(keys[u(j)])] = stamp
                    for j in range(j0, j1):
                        if one_list:
                            k = keys[u(j)]
                            s = slot[u(k)]
                            hit = s >= 0
                            collided = False
                            if hit:
                                if lru and tail != k:  # to the end of the list
                                    before, after = prev[u(k)], nxt[u(k)]
                                    if before >= 0:
                                        nxt[u(before)] = after
                                    else:
                                        head = after
                                    prev[u(after)] = before
                                    prev[u(k)] = tail
                                    nxt[u(k)] = -1
                                    nxt[u(tail)] = k
                                    tail = k
                            else:
                                collided = evicted[u(k)] == p
                                if free_n > 0:
                                    free_n -= 1
                                    s = I[u(free_b + free_n)]
                                else:  # the first from the head not protected goes
                                    v = head
                                    if pin_layer:
                                        while prot[u(v)] == stamp:
                                            v = nxt[u(v)]
                                    s = slot[u(v)]
                                    slot[u(v)] = -1
                                    evicted[u(v)] = p
                                    before, after = prev[u(v)], nxt[u(v)]
                                    if not pin_layer or before < 0:  # (the head)
                                        head = after
                                    else:
                                        nxt[u(before)] = after
                                    if after >= 0:
                                        prev[u(after)] = before
                                    else:
                                        tail = before
                                slot[u(k)] = s
                                prev[u(k)] = tail
                                nxt[u(k)] = -1
                                if tail >= 0:
                                    nxt[u(tail)] = k
                                else:
                                    head = k
                                tail = k
                        else:
                            c = code[u(j)]
                            s = c & SLOT_BITS
                            hit = c < MISS
                            collided = (c & COLLISION) != 0
                        if hit:
                            at = F[u(sr + s)]
                            if at > now:
                                late += 1
                                if at > ready:
                                    ready = at
                            else:
                                hits += 1
                            continue
                        # Counted without a branch: whether a miss collides follows the
                        # routing, which no predictor guesses (with a branch, the loop took
                        # 2-12% longer on 0.5M-1M-request `lru` replays).
                        coll += collided
                        # `timeline.book`, written out (the module's docstring)
                        if alone:
                            if misses == 0:  # what is on the engine went before it
                                engine_wait = timeline.stall(engine, now)
                            engine, link = timeline.book_alone(engine, now, latency, per_link,
                                                               per_slower)
                            end = engine
                        else:
                            if one_engine:  # its free time in a register (`engine`)
                                free = engine
                            else:
                                e = timeline.earliest(engines)
                                free = engines[u(e)]
                            if misses == 0:
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
                        F[u(sr + s)] = r
                        if r > ready:
                            ready = r
                        misses += 1
                    stall = timeline.stall(ready, clock)
                    clock += stall
                    pass_stall += stall
                    row = c0 + pos
                    if one_list:  # the others follow from the requests (at the end)
                        cnt[2, pos] += late
                        cnt[3, pos] += misses
                        cnt[4, pos] += coll
                    else:
                        cnt[0, pos] += j1 - j0  # COUNTED's order
                        cnt[1, pos] += hits
                        cnt[2, pos] += late
                        cnt[3, pos] += misses
                        cnt[4, pos] += coll
                        cnt[5, pos] += pairs
                        cnt[6, pos] += 1
                    if not exact_bytes:
                        F[u(row + K.R_DEMAND_B * n_layers)] += misses * nbytes
                    F[u(row + K.R_STALL * n_layers)] += stall
                    if engine_wait > 0.0:
                        F[u(row + K.R_BEHIND * n_layers)] += min(stall, engine_wait)
                    if has_cost:  # CostModel.experts, the shared expert on the first wave
                        clock += timeline.experts_step(pairs, j1 - j0, tokens, per_expert,
                                                       shared_params if j0 == a else 0,
                                                       dtype_b, peak_flops, hbm_bps, launch)
                    j0 += n_slots
                    if one_list or j0 >= b:
                        break
            if has_cost:  # the dense layers after the last MoE layer, then the logits
                for _ in range(dense_after):
                    clock += dense[u(p)]
                clock += half[u(p)]
            passes[p, 0] = start
            passes[p, 1] = clock
            passes[p, 2] = pass_stall
            # The running totals, summed over the layers as the general kernel sums them (the
            # counts from this loop's own, in `cnt`).
            if one_list:  # one wave a pass-layer, each request a hit, a late hit or a miss
                n_req = starts[(p + 1) * n_layers] - starts[0]
                r_pairs += pass_pairs[p] * n_layers
                r_late = r_miss = r_coll = 0
                for q in range(n_layers):
                    r_late += cnt[2, q]
                    r_miss += cnt[3, q]
                    r_coll += cnt[4, q]
                running[p, 0] = n_req  # COUNTED's order
                running[p, 1] = n_req - r_late - r_miss
                running[p, 2] = r_late
                running[p, 3] = r_miss
                running[p, 4] = r_coll
                running[p, 5] = r_pairs
                running[p, 6] = (p + 1) * n_layers
                # Each miss takes a free slot or evicts a key: the pass's evictions are its
                # misses less the free slots it took (counted in the loop, they and the
                # list's length took it 2-5% longer).
                evictions[u(p)] = (r_miss - missed_before) - (free_before - free_n)
                missed_before = r_miss
            else:
                for j in range(len(COUNTED)):
                    total = 0
                    for q in range(n_layers):
                        total += cnt[j, q]
                    running[p, j] = total
            t_evict += evictions[u(p)]
            running[p, 7] = t_evict
            if exact_bytes:  # (each layer's sum an exact whole number: so is theirs)
                running[p, 8] = r_miss * nbytes
            for j in range(9 if exact_bytes else 8, 11):
                total = 0.0
                base = c0 + RUNNING[j] * n_layers
                for q in range(n_layers):
                    total += F[u(base + q)]
                running[p, j] = total
        if one_list:  # the counts that follow from the requests, per layer
            all_pairs = 0
            for p in range(n_pass):
                all_pairs += pass_pairs[p]
            for q in range(n_layers):
                n_req = 0
                for p in range(n_pass):
                    n_req += starts[p * n_layers + q + 1] - starts[p * n_layers + q]
                cnt[0, q] = n_req
                cnt[1, q] = n_req - cnt[2, q] - cnt[3, q]
                cnt[5, q] = all_pairs
                cnt[6, q] = n_pass
        for j in range(len(COUNTED)):
            for q in range(n_layers):
                F[u(c0 + COUNTED[j] * n_layers + q)] += cnt[j, q]
        if exact_bytes:
            for q in range(n_layers):
                F[demand_b + q] = cnt[3, q] * nbytes
        if one_engine:
            engines[0] = engine
        F[u(t)] = clock
        F[u(t + 1)] = link
        if one_list:
            _one_list_write_back(I, slot, evicted, prev, nxt)
            I[lo + K.HEAD * nl], I[lo + K.TAIL * nl] = head, tail
            I[lo + K.LEN * nl] = listed + (free_at_start - free_n)
            I[K.FREE_N] = free_n
            now_held = _held_per_layer(I)
            c_evict = c0 + K.R_EVICT * n_layers
            for q in range(n_layers):
                F[c_evict + q] += F[c_miss + q] - missed[q] - (now_held[q] - held[q])
        if n_pass == 0:
            return passes, running, np.zeros(0, np.int64)
        a, b = starts[-2], starts[-1]  # the last wave's keys: the running pins
        first = a + (b - a - 1) // n_slots * n_slots if b - a > n_slots else a
        pins = np.empty(b - first, np.int64)
        for j in range(first, b):
            pins[j - first] = keys[order[j]] if b - a > n_slots else keys[j]
        return passes, running, pins

    # Each combination under a name of its own. numba names a function's machine code after
    # its qualified name and how many functions the process compiled before it: under one
    # name, two combinations compiled by two processes into the disk cache could get the
    # same symbols, and a process that loaded both ran one with the other's environment (a
    # SystemError, "returned a result with an exception set", in a capture grid's worker).
    # The name also gives each combination a cache index file of its own.
    run.__name__ = f"run_{'alone' if alone else 'engines'}_{SERVES[serve]}_" \
                   f"{'costed' if costed else 'uncosted'}"
    run.__qualname__ = f"_kernel_for.<locals>.{run.__name__}"
    return K.kernel_jit(run)


# Every combination, each compiled the first time `kernel_for` hands it out.
KERNELS = {(alone, serve, costed): _kernel_for(alone, serve, costed)
           for alone in (True, False) for serve in (CODED, ONE_LIST_REQUEST, ONE_LIST_LAYER)
           for costed in (True, False)}


def kernel_for(I: np.ndarray, F: np.ndarray, n_pass: int, longest: int, costed: bool):
    """The kernel for the run `(I, F)` lays out (`kernel.layout`) over `n_pass` passes whose
    pass-layers have at most `longest` requests, with a cost model or not (`costed`: the first
    of `compiled._cost_params`). One list is served in the clock's loop for
    `lru` and `fifo` without waves (where a pass-layer has more requests than the cache has
    slots, `_cache_steps` orders them); the int32 state it keeps bounds the passes
    and waves it counts."""
    t, fo = I[K.O_T], I[K.O_FC]
    alone = I[K.ENGINES] == 1 and F[t + 1] <= F[t + 2] and F[fo + K.F_LATENCY] >= 0.0
    serve = CODED
    if (I[K.POLICY] in (K.LRU, K.FIFO) and longest <= I[K.N_SLOTS]
            and n_pass * I[K.N_LAYERS] < SLOT_BITS):
        serve = ONE_LIST_LAYER if I[K.PIN_LAYER] == 1 else ONE_LIST_REQUEST
    return KERNELS[(bool(alone), serve, bool(costed))]
