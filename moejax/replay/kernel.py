"""The compiled replay kernel (numba): `ExpertCache.run_layer` and the eviction policies it
covers, request by request, on flat integer state. `moejax/replay/compiled.py` prepares its
inputs and reads its outputs; the module docstring there says what it covers and how it is
checked against the reference.

**State.** Keys are global: `g = position * E + expert`. All state lives in two flat arrays,
`I` (int64) and `F` (float64), in blocks whose offsets head `I` (`O_*`): a numba call pays a
reference count per array argument, which with the usual dozen arrays per step was most of a
request's time, so every step takes `(I, F)` and scalars (small accessors, inlined by LLVM,
turn a block and row into an index):

* per key (`_k(I, row, g)`): slot, pass last evicted in, protection stamp, the eviction
  policy's intrusive list `(prev, next, list)`, recency tick, prefetch origin (pass, target
  position), use count, Belady's pointer into its uses, predicted-set mark, distinct mark,
  queued target, and the watchdog queue's list. Key-major (a key's rows side by side, those a
  request reads first): a request touches one key's state in one or two cache lines, not one
  line per row (a 1M-request replay without prefetch: 17 -> 14 ms, `lean_kernel.py`);
* per list (`_h(I, row, list)`): head, tail, length. Lists: LRU / FIFO use list 0; FLD and
  lru_per_layer (either quota) one per position; Least-Stale stale[p] = p and current[p] =
  L + p; the last one is the watchdog's queue;
* per slot (`_s(I, row, slot)`): its key, and the free-slot stack; per MoE layer position:
  lru_per_layer's quota and this pass's predicted set (id, size); LFU only: its heap of the
  resident keys with the victim search's stack, and each key's place in the heap;
* read-only: each pass-layer's first request, each key's sorted request indices (Belady), the
  victim walk of FLD or Least-Stale per running position (`policies/eviction.py`'s walks, as a
  table `[L + 1, width]`);
* `F`: each slot's ready time, the clock `(t, link_free, engine free times...)`, the counters
  `[len(ROWS), L]`, each queued key's queue time.

The ordered containers of the policies (LRU's order, a layer's queue, Least-Stale's queues,
the watchdog's queue) are the intrusive lists: a key is in at most one list of each kind, as
it is in at most one of the policy's OrderedDicts; LFU's order is a binary heap. "Protected"
sets (the running wave, one prefetch call's selection) are stamps: key `g` is protected while
its stamp is the current one.

The time arithmetic (a transfer's booking, when a slot lands, a stall, the watchdog's timing, the
experts step's roofline) is `moejax/timing/timeline.py`'s, compiled in: the reference calls the
same functions.
"""

from __future__ import annotations

import glob
import hashlib
import inspect
import os

import numba
import numpy as np
from numba.extending import register_jitable

from moejax.timing import timeline

# Eviction policy codes, and the policies' kernel forms they implement (`KernelForm`).
(LRU, FIFO, LRU_PER_LAYER, LFU, FLD, LS_TWO_QUEUE, LS_LEFT_FIRST, LS_CYCLIC, BELADY,
 LRU_PER_LAYER_STRICT) = range(10)
EVICTIONS = {"lru": LRU, "fifo": FIFO, "lru_per_layer": LRU_PER_LAYER, "lfu": LFU, "fld": FLD,
             "least_stale:two_queue": LS_TWO_QUEUE, "least_stale:left_first": LS_LEFT_FIRST,
             "least_stale:cyclic": LS_CYCLIC, "belady": BELADY,
             "lru_per_layer:strict": LRU_PER_LAYER_STRICT}
NEVER = np.iinfo(np.int64).max
# `cache.prefetch_queue` -> the kernel's code (`I[QUEUE]`).
IMMEDIATE, WATCHDOG, WATCHDOG_IDLE = range(3)
QUEUES = {"immediate": IMMEDIATE, "watchdog": WATCHDOG, "watchdog_idle": WATCHDOG_IDLE}

# Counter rows, in `metrics.COUNTERS + BYTES + SECONDS` order (checked by compiled.py).
ROWS = ("requests", "hits", "late_hits", "misses", "collision_misses", "dropped",
        "substituted", "prefetch_issued", "prefetch_used", "recall_served",
        "recall_requests", "evictions", "waves", "upgrades", "served_below_wanted",
        "products", "evicted_before_use", "prefetch_dropped", "predicted",
        "predicted_routed", "routed", "demand_bytes", "prefetch_bytes",
        "wasted_prefetch_bytes", "stall_s", "stall_behind_prefetch_s")
(R_REQ, R_HIT, R_LATE, R_MISS, R_COLL, _, _, R_PF_ISSUED, R_PF_USED, R_REC_SERVED,
 R_REC_REQ, R_EVICT, R_WAVES, _, _, R_PRODUCTS, R_EARLY, R_PF_DROPPED, R_PRED,
 R_PRED_ROUTED, R_ROUTED, R_DEMAND_B, R_PF_B, R_WASTED_B, R_STALL, R_BEHIND) = range(len(ROWS))

# Per-key rows, side by side per key (key-major: the module's docstring), the ones every
# request reads first. LAYER: the key's MoE layer position, `key // E` looked up (a division
# at each eviction and Least-Stale request was a tenth of a small cache's miss).
(SLOT, EVICTED_IN, PROT, EL, EL_NEXT, EL_LIST, LAYER, LAST, ORIGIN_PASS, ORIGIN_TPOS, COUNT,
 UPTR, PMARK, SEEN, Q_TPOS, QL, QL_NEXT, QL_LIST) = range(18)
N_KEY_ROWS = 18
# Per-slot rows, per-list rows, per-position rows.
KEY_OF, FREE = range(2)
HEAD, TAIL, LEN = range(3)
QUOTA, PSET, PCOUNT = range(3)

# The head of I: settings, scalars, and the blocks' offsets.
(POLICY, N_SLOTS, N_EXPERTS, N_LAYERS, N_KEYS, N_LISTS, QUEUE, PIN_LAYER, ENGINES,
 STAMP, FREE_N, TICK, BEL_PASS, BEL_POS, BEL_DONE, WALK_W, WALK_IN_ORDER, WALK_FIRST, H_LEN,
 O_KEYS, O_SLOTS, O_LISTS, O_POS, O_STARTS, O_UOFF, O_USES, O_WALK, O_HEAP, O_HPOS,
 O_SR, O_T, O_C, O_QT, O_FC) = range(34)
HEAD_SIZE = 34
# The head of F: expert bytes, transfer latency, one engine's and the link's bytes/s.
F_BYTES, F_LATENCY, F_ENGINE_BPS, F_LINK_BPS = range(4)


def drop_stale_cache(module: str, sources: tuple) -> None:
    """numba's on-disk cache of a kernel module (`module`, its name in this package) is
    checked against that file's timestamp only, not against the other modules' sources it
    compiles in (`sources`): when one of them changes, the module's cached kernels are dropped
    so that they are compiled again."""
    cache_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    digest = hashlib.sha256("".join(inspect.getsource(m) for m in sources).encode()).hexdigest()
    stamp = os.path.join(cache_dir, f"{module}.sources.sha256")
    try:
        with open(stamp) as f:
            if f.read() == digest:
                return
    except OSError:
        pass
    try:
        for path in glob.glob(os.path.join(cache_dir, f"{module}.*.nb[ci]")):
            os.remove(path)
        os.makedirs(cache_dir, exist_ok=True)
        with open(stamp, "w") as f:
            f.write(digest)
    except OSError:  # a read-only install: numba caches elsewhere, or compiles each time
        pass


# This kernel compiles in `timeline.py`'s arithmetic.
drop_stale_cache("kernel", (timeline,))
# The kernel's steps, compiled without numba's reference counting (`_nrt=False`): each is a
# function of its own that takes the state arrays, and with reference counting numba takes and
# gives back their counts around every call, two atomic operations each time (about a quarter
# of a prefetching replay's kernel time: docs/findings/speed.md). No step allocates (one that
# did would not compile) or keeps an array past its call.
# `register_jitable`, not `njit`: a step is compiled into the kernel that calls it, once per
# argument types. An `njit` step was compiled again for every distinct constant it was called
# with (numba types a constant argument as its literal value: 34 copies of `_at`, 184
# functions in all), which made a cold compile of the kernel about 34 s instead of 15; the
# machine code is the same (the constants are folded in after inlining either way).
jit = register_jitable(_nrt=False)
# The kernels (`run`, here and in `lean_kernel.py`): they allocate their outputs.
kernel_jit = numba.njit(cache=True)


# -- layout ---------------------------------------------------------------------------------
def layout(policy: int, n_slots: int, n_experts: int, n_layers: int, queue: int,
           pin_layer: bool, engines: int, quota: np.ndarray, starts: np.ndarray,
           uses_off: np.ndarray, uses: np.ndarray, walks: np.ndarray,
           fc: tuple[float, float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The initial `(I, F)` of an empty cache. `starts`: each pass-layer's start in the
    requests, for `run` (the lean kernels take them as an argument: empty for them). `walks`:
    the victim walk of a layered eviction (FLD's layers, Least-Stale's queues) per running
    position -1..L-1, `[L + 1, width]`."""
    n_keys = n_layers * n_experts
    n_lists = 2 * n_layers + 1
    sizes = {O_KEYS: N_KEY_ROWS * n_keys, O_SLOTS: 2 * n_slots, O_LISTS: 3 * n_lists,
             O_POS: 3 * n_layers, O_STARTS: len(starts),
             O_UOFF: len(uses_off), O_USES: len(uses), O_WALK: walks.size,
             # LFU's heap of the resident keys and the stack its victim search uses, and
             # each key's place in the heap (`_lfu_victim`); nothing for the others.
             O_HEAP: (2 * n_slots + 1) * (policy == LFU), O_HPOS: n_keys * (policy == LFU)}
    head = np.zeros(HEAD_SIZE, np.int64)
    head[[POLICY, N_SLOTS, N_EXPERTS, N_LAYERS, N_KEYS, N_LISTS, QUEUE, PIN_LAYER,
          ENGINES, WALK_W, WALK_IN_ORDER]] = [
        policy, n_slots, n_experts, n_layers, n_keys, n_lists, queue, int(pin_layer), engines,
        walks.shape[1], int(walks.shape[1] > 0 and (walks == np.arange(walks.shape[1])).all())]
    at = HEAD_SIZE
    for block, size in sizes.items():
        head[block] = at
        at += size
    assert head[O_KEYS] == HEAD_SIZE, "the key block must come first (`_k`)"
    I = np.full(at, -1, np.int64)
    I[:HEAD_SIZE] = head
    per_key = key_rows(I, n_keys)
    per_key[[PROT, LAST, COUNT]] = 0
    per_key[LAYER] = np.arange(n_keys) // n_experts
    per_key[UPTR] = uses_off[:-1]
    I[head[O_SLOTS] + n_slots:head[O_SLOTS] + 2 * n_slots] = np.arange(n_slots - 1, -1, -1)
    I[head[O_LISTS] + LEN * n_lists:head[O_LISTS] + 3 * n_lists] = 0
    I[head[O_POS] + QUOTA * n_layers:head[O_POS] + (QUOTA + 1) * n_layers] = quota
    for block, values in ((O_STARTS, starts), (O_UOFF, uses_off),
                          (O_USES, uses), (O_WALK, walks.reshape(-1))):
        I[head[block]:head[block] + len(values)] = values
    I[FREE_N] = n_slots
    I[BEL_PASS] = I[BEL_POS] = -1
    I[WALK_FIRST] = 0
    F_sizes = ((O_FC, 4), (O_T, 2 + engines), (O_SR, n_slots), (O_C, len(ROWS) * n_layers),
               (O_QT, n_keys))
    at = 0
    for block, size in F_sizes:
        I[block] = at
        at += size
    F = np.zeros(at)
    F[I[O_FC]:I[O_FC] + 4] = fc
    return I, F


def key_rows(I: np.ndarray, n_keys: int) -> np.ndarray:
    """The per-key block of `I` as `[N_KEY_ROWS, n_keys]` (a view: row `SLOT` is every key's
    slot)."""
    return I[I[O_KEYS]:I[O_KEYS] + N_KEY_ROWS * n_keys].reshape(n_keys, N_KEY_ROWS).T


@jit
def _at(I, block, width, row, j):
    """Where item `j` of row `row` is, in a block (offset `I[block]`) of rows `I[width]` long.
    Unsigned: numba checks a signed index for a negative value (Python's wraparound) at every
    access, and no index here is negative (`lean_kernel.py`'s docstring)."""
    return np.uint64(I[block] + row * I[width] + j)


@jit
def _k(I, row, g):  # per key, in I (key-major)
    # The key block comes first after the head (`layout`): its offset is the constant
    # HEAD_SIZE, not a load of I[O_KEYS] at every access (5% of a prefetching replay).
    return np.uint64(HEAD_SIZE + g * N_KEY_ROWS + row)


@jit
def _h(I, row, w):  # per list, in I
    return _at(I, O_LISTS, N_LISTS, row, w)


@jit
def _s(I, row, s):  # per slot, in I
    return _at(I, O_SLOTS, N_SLOTS, row, s)


@jit
def _p(I, row, pos):  # per MoE layer position, in I
    return _at(I, O_POS, N_LAYERS, row, pos)


@jit
def _c(I, row, pos):  # the counters, in F
    return _at(I, O_C, N_LAYERS, row, pos)


@jit
def _fc(I, F, j):
    return F[I[O_FC] + j]


# -- intrusive lists (`base`: EL or QL) -----------------------------------------------------
@jit
def append(I, base, w, k):
    if base == EL and w < I[WALK_FIRST]:  # (the in-order walk's bound: `victim`)
        I[WALK_FIRST] = w
    tail = I[_h(I, TAIL, w)]
    I[_k(I, base + 2, k)] = w
    I[_k(I, base, k)] = tail
    I[_k(I, base + 1, k)] = -1
    if tail >= 0:
        I[_k(I, base + 1, tail)] = k
    else:
        I[_h(I, HEAD, w)] = k
    I[_h(I, TAIL, w)] = k
    I[_h(I, LEN, w)] += 1


@jit
def remove(I, base, k):
    w = I[_k(I, base + 2, k)]
    if w >= 0:
        p, n = I[_k(I, base, k)], I[_k(I, base + 1, k)]
        if p >= 0:
            I[_k(I, base + 1, p)] = n
        else:
            I[_h(I, HEAD, w)] = n
        if n >= 0:
            I[_k(I, base, n)] = p
        else:
            I[_h(I, TAIL, w)] = p
        I[_k(I, base, k)] = -1
        I[_k(I, base + 1, k)] = -1
        I[_k(I, base + 2, k)] = -1
        I[_h(I, LEN, w)] -= 1


@jit
def _to_end(I, k):
    w = I[_k(I, EL_LIST, k)]
    if I[_h(I, TAIL, w)] != k:
        remove(I, EL, k)
        append(I, EL, w, k)


@jit
def _first_free(I, w, st):
    """The first key of eviction list `w` not protected (-1: none)."""
    k = I[_h(I, HEAD, w)]
    while k >= 0 and I[_k(I, PROT, k)] == st:
        k = I[_k(I, EL_NEXT, k)]
    return k


# -- LFU's order: a binary heap of the resident keys --------------------------------------------
# LFU's victim is the first key in its order (fewest uses, then least recent: a total order,
# each use having its own tick) that is not protected. A scan of every slot per miss made LFU's
# replays cost in proportion to the cache's size; the heap keeps the resident keys in that
# order (a key's place changes only when it is admitted, used or evicted), and the search
# descends from the root only through protected keys.
@jit
def _hp(I, k):  # where key `k` is in the heap
    return np.uint64(I[O_HPOS] + k)


@jit
def _lfu_before(I, a, b):
    """Whether key `a` comes before key `b` in LFU's order."""
    ca, cb = I[_k(I, COUNT, a)], I[_k(I, COUNT, b)]
    return ca < cb or (ca == cb and I[_k(I, LAST, a)] < I[_k(I, LAST, b)])


@jit
def _heap_put(I, i, k):
    I[np.uint64(I[O_HEAP] + i)] = k
    I[_hp(I, k)] = i


@jit
def _heap_up(I, i):
    h = I[O_HEAP]
    k = I[np.uint64(h + i)]
    while i > 0:
        parent = (i - 1) // 2
        above = I[np.uint64(h + parent)]
        if not _lfu_before(I, k, above):
            break
        _heap_put(I, i, above)
        i = parent
    _heap_put(I, i, k)


@jit
def _heap_down(I, i):
    h, n = I[O_HEAP], I[H_LEN]
    k = I[np.uint64(h + i)]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _lfu_before(I, I[np.uint64(h + c + 1)], I[np.uint64(h + c)]):
            c += 1
        below = I[np.uint64(h + c)]
        if not _lfu_before(I, below, k):
            break
        _heap_put(I, i, below)
        i = c
    _heap_put(I, i, k)


@jit
def _heap_push(I, k):
    i = I[H_LEN]
    I[H_LEN] += 1
    _heap_put(I, i, k)
    _heap_up(I, i)


@jit
def _heap_remove(I, k):
    i = I[_hp(I, k)]
    n = I[H_LEN] - 1
    I[H_LEN] = n
    I[_hp(I, k)] = -1
    if i < n:  # the last key takes its place, then moves up or down to where it belongs
        last = I[np.uint64(I[O_HEAP] + n)]
        _heap_put(I, i, last)
        _heap_up(I, i)
        _heap_down(I, I[_hp(I, last)])


@jit
def _lfu_victim(I, st):
    """The first key in LFU's order not protected by stamp `st` (-1: none): a key comes
    before every key below it, so an unprotected key ends its branch, and a protected one
    leads to its children (a stack in I, after the heap)."""
    h, n = I[O_HEAP], I[H_LEN]
    stack = h + I[N_SLOTS]
    best = -1
    top = 0
    if n > 0:
        I[np.uint64(stack)] = 0
        top = 1
    while top > 0:
        top -= 1
        i = I[np.uint64(stack + top)]
        k = I[np.uint64(h + i)]
        if best >= 0 and not _lfu_before(I, k, best):
            continue  # (nothing below it comes before `best` either)
        if I[_k(I, PROT, k)] != st:
            best = k
            continue
        for c in (2 * i + 1, 2 * i + 2):
            if c < n:
                I[np.uint64(stack + top)] = c
                top += 1
    return best


# -- the eviction policies (moejax/policies/eviction.py) --------------------------------------
@jit
def _is_ls(policy):
    return policy == LS_TWO_QUEUE or policy == LS_LEFT_FIRST or policy == LS_CYCLIC


@jit
def _is_lpl(policy):
    """lru_per_layer, either quota (they differ only in `keeps_own`)."""
    return policy == LRU_PER_LAYER or policy == LRU_PER_LAYER_STRICT


@jit
def keeps_own(I, st, incoming):
    """`LRUPerLayer.may_take_free` refusing: lru_per_layer(quota=strict) with `incoming`'s
    layer at (or over) its quota and an entry of its own not protected (stamp `st`)."""
    if I[POLICY] != LRU_PER_LAYER_STRICT:
        return False
    own = I[_k(I, LAYER, incoming)]
    return I[_h(I, LEN, own)] >= I[_p(I, QUOTA, own)] and _first_free(I, own, st) >= 0


@jit
def _ls_request(I, k):
    """Least-Stale: requested (or, with prefetch_current="pass", selected), so current for the
    pass; a current key keeps its place."""
    cur = I[N_LAYERS] + I[_k(I, LAYER, k)]
    if I[_k(I, EL_LIST, k)] != cur:
        remove(I, EL, k)
        append(I, EL, cur, k)


@jit
def _use(I, k):
    I[TICK] += 1
    I[_k(I, LAST, k)] = I[TICK]


@jit
def _on_admit(I, k, prefetch):
    policy = I[POLICY]
    if policy == LRU or policy == FIFO:
        append(I, EL, 0, k)
    elif policy == FLD:
        append(I, EL, I[_k(I, LAYER, k)], k)
    elif _is_lpl(policy):
        append(I, EL, I[_k(I, LAYER, k)], k)
        _use(I, k)
    elif policy == LFU:
        _use(I, k)
        _heap_push(I, k)
    elif _is_ls(policy):
        _ls_request(I, k)


@jit
def _bel_where(I, pos, p):
    """Belady's `_now`: the count of requests served restarts at a new (pass, position)
    (position -1, before the pass's first layer, is its first)."""
    if pos < 0:
        pos = 0
    if I[BEL_PASS] != p or I[BEL_POS] != pos:
        I[BEL_PASS] = p
        I[BEL_POS] = pos
        I[BEL_DONE] = 0


@jit
def _on_access(I, k, pos, p):
    policy = I[POLICY]
    if policy == LRU or policy == FLD:
        _to_end(I, k)
    elif _is_lpl(policy):
        _to_end(I, k)
        _use(I, k)
    elif policy == LFU:
        I[_k(I, COUNT, k)] += 1
        _use(I, k)
        _heap_down(I, I[_hp(I, k)])  # one use more, and the latest: later in the order
    elif _is_ls(policy):
        _ls_request(I, k)
    elif policy == BELADY:
        _bel_where(I, pos, p)
        I[BEL_DONE] += 1


@jit
def _on_touch(I, k):
    """A resident key selected by the prefetcher."""
    policy = I[POLICY]
    if policy == LRU or policy == FLD:
        _to_end(I, k)
    elif _is_lpl(policy):
        _to_end(I, k)
        _use(I, k)
    elif _is_ls(policy):
        _ls_request(I, k)


@jit
def victim(I, pos, st, incoming, p):
    policy = I[POLICY]
    L = I[N_LAYERS]
    if policy == LRU or policy == FIFO:
        return _first_free(I, 0, st)
    if I[WALK_IN_ORDER] == 1:
        # Every position's walk is the lists in their order (Least-Stale's `two_queue`): from
        # the first that holds a key. No list below `WALK_FIRST` holds one: an append lowers
        # it to its list (`append`), a pass start's splice to 0 (`begin_pass`). A small
        # cache's pass empties the stale lists in its first layers, and the walk over the
        # empty ones was a large part of a miss.
        w = I[WALK_FIRST]
        while w < I[WALK_W] and I[_h(I, LEN, w)] == 0:
            w += 1
        I[WALK_FIRST] = w
        for j in range(w, I[WALK_W]):
            k = _first_free(I, j, st)
            if k >= 0:
                return k
        return -1
    if policy == FLD or _is_ls(policy):  # the policy's walk (moejax/policies/eviction.py)
        q0 = pos if pos < L - 1 else L - 1
        if q0 < -1:
            q0 = -1
        row = I[O_WALK] + (q0 + 1) * I[WALK_W]
        for j in range(I[WALK_W]):
            k = _first_free(I, I[row + j], st)
            if k >= 0:
                return k
        return -1
    if _is_lpl(policy):
        own = I[_k(I, LAYER, incoming)]
        if I[_h(I, LEN, own)] >= I[_p(I, QUOTA, own)]:
            k = _first_free(I, own, st)
            if k >= 0:
                return k
        best = -1
        for over in (True, False):  # layers over their share first, then any
            for q in range(L):
                if over and I[_h(I, LEN, q)] <= I[_p(I, QUOTA, q)]:
                    continue
                k = _first_free(I, q, st)
                if k >= 0 and (best < 0 or I[_k(I, LAST, k)] < I[_k(I, LAST, best)]):
                    best = k
            if best >= 0:
                return best
        return -1
    # Belady's scan over the slots reads the offsets once (the stores into I in the loop keep
    # LLVM from hoisting them), and indexes unsigned (`_at`).
    u = np.uint64
    ko, so = I[O_KEYS], I[O_SLOTS]
    if policy == LFU:  # fewest uses, then least recent
        return _lfu_victim(I, st)
    if policy == BELADY:  # furthest next use, ties to the lowest key
        _bel_where(I, pos, p)
        # The request index: the pass's pass-layers start at p * L.
        now = I[u(I[O_STARTS] + p * L + I[BEL_POS])] + I[BEL_DONE]
        uses, uses_off = I[O_USES], I[O_UOFF]
        best = -1
        far = -1
        for s in range(I[N_SLOTS]):
            k = I[u(so + s)]
            if k < 0:
                continue
            at_k = ko + k * N_KEY_ROWS
            if I[u(at_k + PROT)] == st:
                continue
            j = I[u(at_k + UPTR)]
            end = I[u(uses_off + k + 1)]
            while j < end and I[u(uses + j)] < now:
                j += 1
            I[u(at_k + UPTR)] = j
            nu = I[u(uses + j)] if j < end else NEVER
            if nu > far or (nu == far and k < best):
                far = nu
                best = k
        return best
    return -1


# -- the cache's steps --------------------------------------------------------------------------
@jit
def _book(I, F, issue_at):
    """`Channels._book` of one expert issued at `issue_at` (`timeline.book`): when it lands."""
    t = I[O_T]
    booked = timeline.book_in(F, t + 2, I[ENGINES], F[t + 1], _fc(I, F, F_BYTES), issue_at,
                              _fc(I, F, F_LATENCY), _fc(I, F, F_ENGINE_BPS),
                              _fc(I, F, F_LINK_BPS))
    F[t + 1] = booked[3]
    return booked[4]


@jit
def _admit(I, F, k, s, issue_at, prefetch):
    sr = I[O_SR] + s
    r = timeline.landed(_book(I, F, issue_at), F[sr])
    I[_k(I, SLOT, k)] = s
    I[_s(I, KEY_OF, s)] = k
    F[sr] = r
    _on_admit(I, k, prefetch)
    return r


@jit
def _allocate(I, F, pos, st, incoming, p, running_pos):
    """A free slot (lowest first), or a victim's that is not protected (stamp `st`); -1 when
    nothing may go. A strict per-layer quota skips the free slot (`keeps_own`). An eviction
    is counted at the victim's layer, with its bytes wasted when it was prefetched and never
    used."""
    if I[FREE_N] > 0 and not keeps_own(I, st, incoming):
        I[FREE_N] -= 1
        return I[_s(I, FREE, I[FREE_N])]
    v = victim(I, pos, st, incoming, p)
    if v < 0:
        return -1
    s = I[_k(I, SLOT, v)]
    I[_k(I, SLOT, v)] = -1
    I[_s(I, KEY_OF, s)] = -1
    I[_k(I, EVICTED_IN, v)] = p
    remove(I, EL, v)
    if I[POLICY] == LFU:
        _heap_remove(I, v)
    vpos = I[_k(I, LAYER, v)]
    F[_c(I, R_EVICT, vpos)] += 1
    if I[_k(I, ORIGIN_PASS, v)] >= 0:
        F[_c(I, R_WASTED_B, vpos)] += _fc(I, F, F_BYTES)
        if I[_k(I, ORIGIN_PASS, v)] == p and I[_k(I, ORIGIN_TPOS, v)] > running_pos:
            F[_c(I, R_EARLY, vpos)] += 1
        I[_k(I, ORIGIN_PASS, v)] = -1
        I[_k(I, ORIGIN_TPOS, v)] = -1
    return s


@jit
def _prefetched(I, F, k, tpos, p):
    """A prefetch of `k` for target position `tpos` was issued in pass `p`."""
    I[_k(I, ORIGIN_PASS, k)] = p
    I[_k(I, ORIGIN_TPOS, k)] = tpos
    F[_c(I, R_PF_ISSUED, tpos)] += 1
    F[_c(I, R_PF_B, tpos)] += _fc(I, F, F_BYTES)


@jit
def _predicted(I, tpos, experts, e0, e1, new_id):
    """Adds one call's selection for `tpos` to this pass's predicted set of it."""
    if I[_p(I, PSET, tpos)] < 0:
        I[_p(I, PSET, tpos)] = new_id
        I[_p(I, PCOUNT, tpos)] = 0
    sid = I[_p(I, PSET, tpos)]
    for i in range(e0, e1):
        k = tpos * I[N_EXPERTS] + experts[i]
        if I[_k(I, PMARK, k)] != sid:
            I[_k(I, PMARK, k)] = sid
            I[_p(I, PCOUNT, tpos)] += 1


@jit
def _prefetch(I, F, pred, pins, n_pins, pl, pos, now, p, next_set):
    """`admission.prefetch_now`, immediate queue: what one call selected (and the running wave)
    is never its own victim; the first prediction without a slot ends the call."""
    grp_off, grp_target, grp_start, experts = pred
    I[STAMP] += 1
    st = I[STAMP]
    for j in range(n_pins):
        I[_k(I, PROT, pins[j])] = st
    for g in range(grp_off[pl], grp_off[pl + 1]):
        tpos = grp_target[g]
        _predicted(I, tpos, experts, grp_start[g], grp_start[g + 1], next_set + g - grp_off[pl])
        for i in range(grp_start[g], grp_start[g + 1]):
            k = tpos * I[N_EXPERTS] + experts[i]
            if I[_k(I, SLOT, k)] >= 0:
                _on_touch(I, k)
                I[_k(I, PROT, k)] = st
                continue
            s = _allocate(I, F, pos, st, k, p, pos)
            if s < 0:
                return
            I[_k(I, PROT, k)] = st
            _admit(I, F, k, s, now, True)
            _prefetched(I, F, k, tpos, p)


@jit
def _enqueue(I, F, pred, pins, n_pins, pl, pos, now, p, next_set, issued):
    """`WatchdogQueue.enqueue`: predictions join the watchdog's FIFO, then it runs."""
    grp_off, grp_target, grp_start, experts = pred
    queue = I[N_LISTS] - 1
    for g in range(grp_off[pl], grp_off[pl + 1]):
        tpos = grp_target[g]
        _predicted(I, tpos, experts, grp_start[g], grp_start[g + 1], next_set + g - grp_off[pl])
        for i in range(grp_start[g], grp_start[g + 1]):
            k = tpos * I[N_EXPERTS] + experts[i]
            if I[_k(I, SLOT, k)] >= 0:
                _on_touch(I, k)
            elif I[_k(I, QL_LIST, k)] < 0:
                append(I, QL, queue, k)
                I[_k(I, Q_TPOS, k)] = tpos
                F[I[O_QT] + k] = now
    _watchdog(I, F, pins, n_pins, now, False, p, pos, issued)


@jit
def _watchdog(I, F, pins, n_pins, now, strict, p, running_pos, issued):
    """`WatchdogQueue.issue`: issues queued prefetches, head first, while a slot can be had
    sparing `pins` and this pass's prefetches whose target has not run: at `now`, or under
    `watchdog_idle` once a copy engine is free by `now` (before it when `strict`). `issued`:
    the keys this pass's prefetches went to (`issued[0]` of them, from `issued[1]`), the only
    keys that can be such a prefetch (a key's origin is cleared when it is used or evicted:
    `_allocate`); a scan for the ones to spare drops from it those whose target has run or that
    were used or evicted since (none of them can be one again but by a prefetch of its own).
    It replaced a scan of every slot (about 8% of a prefetching replay's kernel time at 25%:
    docs/findings/speed.md)."""
    idle = I[QUEUE] == WATCHDOG_IDLE
    queue = I[N_LISTS] - 1
    t = I[O_T]
    st = -1
    while I[_h(I, LEN, queue)] > 0:
        k = I[_h(I, HEAD, queue)]
        if I[_k(I, SLOT, k)] >= 0:
            remove(I, QL, k)
            continue
        issue = now
        if idle:
            issue = timeline.watchdog_issue_time_in(F[I[O_QT] + k], F, t + 2, I[ENGINES])
            if not timeline.watchdog_may_issue(issue, now, strict):
                return
        if st < 0:
            I[STAMP] += 1
            st = I[STAMP]
            for j in range(n_pins):
                I[_k(I, PROT, pins[j])] = st
            kept = 0
            for i in range(1, issued[0] + 1):
                v = issued[i]
                if I[_k(I, ORIGIN_PASS, v)] == p and I[_k(I, ORIGIN_TPOS, v)] > running_pos:
                    I[_k(I, PROT, v)] = st
                    kept += 1
                    issued[kept] = v
            issued[0] = kept
        s = _allocate(I, F, running_pos, st, k, p, running_pos)
        if s < 0:
            return
        remove(I, QL, k)
        I[_k(I, PROT, k)] = st
        _admit(I, F, k, s, issue, True)
        _prefetched(I, F, k, I[_k(I, Q_TPOS, k)], p)
        if issued[0] + 1 >= len(issued):  # (never: `run` sizes it by the pass's predictions)
            raise ValueError("a pass issued more prefetches than it has predictions")
        issued[0] += 1
        issued[issued[0]] = k


@jit
def _drop_queued(I, F, upto):
    """Drops the queued predictions whose target position (<= `upto`) has started."""
    queue = I[N_LISTS] - 1
    k = I[_h(I, HEAD, queue)]
    while k >= 0:
        nk = I[_k(I, QL_NEXT, k)]
        tpos = I[_k(I, Q_TPOS, k)]
        if tpos <= upto:
            remove(I, QL, k)
            F[_c(I, R_PF_DROPPED, tpos)] += 1
        k = nk


@jit
def begin_pass(I):
    """Least-Stale's current queues become stale; predicted sets are per pass. A layer's
    current queue goes to the end of its stale one in its order, as its keys taken from its
    head and appended one by one would: spliced, each key's links within it kept, only its
    list changed (a pass moves up to every key it used: as many moves as requests)."""
    L = I[N_LAYERS]
    if _is_ls(I[POLICY]):
        for q in range(L):
            first = I[_h(I, HEAD, L + q)]
            if first < 0:
                continue
            k = first
            while k >= 0:
                I[_k(I, EL_LIST, k)] = q
                k = I[_k(I, EL_NEXT, k)]
            tail = I[_h(I, TAIL, q)]
            I[_k(I, EL, first)] = tail
            if tail >= 0:
                I[_k(I, EL_NEXT, tail)] = first
            else:
                I[_h(I, HEAD, q)] = first
            I[_h(I, TAIL, q)] = I[_h(I, TAIL, L + q)]
            I[_h(I, LEN, q)] += I[_h(I, LEN, L + q)]
            I[_h(I, HEAD, L + q)] = -1
            I[_h(I, TAIL, L + q)] = -1
            I[_h(I, LEN, L + q)] = 0
        I[WALK_FIRST] = 0
    for q in range(L):
        I[_p(I, PSET, q)] = -1


# -- the run ------------------------------------------------------------------------------------
@kernel_jit
def run(I, F, keys, mult, pass_tokens, pass_pairs, pred, compute, cost):
    """Replays the pass-layers on the state `(I, F)` of `layout` (compiled.run gives the
    arguments). `keys` / `mult`: each request's key and token-expert pairs (`mult` empty: one
    each), pass-layer after pass-layer (their starts are in `I`); `pred`: the predictions
    `(grp_off, grp_target, grp_start, experts)`; `compute`: the cost model's per-pass times and the layer walk
    `(dense, attn, half, dense_before, dense_after)` (`compiled._compute_plan`); `cost`:
    `CostModel.experts`'s terms `(has_cost, per_expert, shared_params, dtype_bytes,
    peak_flops, hbm_bps, launch)`. Returns per pass `(start, end, stall)` and running totals
    of ROWS, and the keys of the last wave; the rest of the outcome is in `(I, F)`."""
    dense, attn, half, dense_before, dense_after = compute
    has_cost, per_expert, shared_params, dtype_b, peak_flops, hbm_bps, launch = cost
    n_slots, n_layers = I[N_SLOTS], I[N_LAYERS]
    watchdog, pin_layer = I[QUEUE] != IMMEDIATE, I[PIN_LAYER] == 1
    has_mult = len(mult) > 0  # (empty: one pair a request, `compiled.requests`)
    idle = I[QUEUE] == WATCHDOG_IDLE
    starts = I[I[O_STARTS]:I[O_STARTS] + len(pass_pairs) * n_layers + 1]
    n_pass = len(pass_pairs)
    queue = I[N_LISTS] - 1
    t = I[O_T]
    passes = np.zeros((n_pass, 3))
    running = np.zeros((n_pass, len(ROWS)))
    next_set = 0
    seen_id = 0
    pins = np.zeros(n_slots, np.int64)  # the running wave's keys (the watchdog spares them)
    n_pins = 0
    longest = 1
    for pl in range(len(starts) - 1):
        longest = max(longest, starts[pl + 1] - starts[pl])
    order = np.zeros(longest, np.int64)  # one pass-layer's requests, resident first
    grp_off, grp_start = pred[0], pred[2]
    # This pass's prefetches (`_watchdog`): at most one per prediction of the pass, as the
    # queue takes a prediction once and is empty when a pass starts (`_drop_queued`).
    most = 0
    for p in range(n_pass):
        first, last = grp_off[p * n_layers], grp_off[(p + 1) * n_layers]
        most = max(most, grp_start[last] - grp_start[first])
    issued = np.zeros(most + 1, np.int64)
    for p in range(n_pass):
        start = F[t]
        if has_cost:
            F[t] += half[p]
        pass_stall = 0.0
        tokens = pass_tokens[p]
        begin_pass(I)
        issued[0] = 0
        running_pos = -1
        for pos in range(n_layers):
            pl = p * n_layers + pos
            if not idle and I[_h(I, LEN, queue)] > 0:  # the previous layer's experts are done
                _watchdog(I, F, pins, 0, F[t], False, p, running_pos, issued)
            if has_cost:  # the dense layers before it, then its attention + router
                for _ in range(dense_before[pos]):
                    F[t] += dense[p]
                F[t] += attn[p]
            a, b = starts[pl], starts[pl + 1]
            if idle and I[_h(I, LEN, queue)] > 0:  # what an idle engine took meanwhile
                _watchdog(I, F, pins, n_pins, F[t], True, p, running_pos, issued)
            running_pos = pos
            if I[_h(I, LEN, queue)] > 0:
                _drop_queued(I, F, pos)
            had_prediction = I[_p(I, PSET, pos)] >= 0
            if had_prediction:  # the predicted set against the router's own selection
                seen_id += 1
                routed = 0
                correct = 0
                for i in range(a, b):
                    k = keys[i]
                    if I[_k(I, SEEN, k)] != seen_id:
                        I[_k(I, SEEN, k)] = seen_id
                        routed += 1
                        if I[_k(I, PMARK, k)] == I[_p(I, PSET, pos)]:
                            correct += 1
                F[_c(I, R_PRED, pos)] += I[_p(I, PCOUNT, pos)]
                F[_c(I, R_PRED_ROUTED, pos)] += correct
                F[_c(I, R_ROUTED, pos)] += routed
                I[_p(I, PSET, pos)] = -1
            n = b - a
            # More experts than slots: waves, resident experts first (`waves.py`).
            m = 0
            if n > n_slots:
                for resident in (True, False):
                    for i in range(a, b):
                        if (I[_k(I, SLOT, keys[i])] >= 0) == resident:
                            order[m] = i
                            m += 1
            else:
                for i in range(a, b):
                    order[m] = i
                    m += 1
            n_waves = (n + n_slots - 1) // n_slots if n > 0 else 1
            for w in range(n_waves):
                w0 = w * n_slots
                w1 = min(n, w0 + n_slots)
                now = F[t]
                n_pins = 0
                I[STAMP] += 1
                wave_stamp = I[STAMP]
                for j in range(w0, w1):
                    k = keys[order[j]]
                    pins[n_pins] = k
                    n_pins += 1
                    I[_k(I, PROT, k)] = wave_stamp
                ready = now
                engine_wait = 0.0
                hits = 0
                late = 0
                misses = 0
                coll = 0
                used = 0
                pairs = 0
                for j in range(w0, w1):
                    i = order[j]
                    k = keys[i]
                    pairs += mult[i] if has_mult else 1
                    s = I[_k(I, SLOT, k)]
                    if s >= 0:
                        at = F[I[O_SR] + s]
                        if at > now:
                            late += 1
                            if at > ready:
                                ready = at
                        else:
                            hits += 1
                        if I[_k(I, ORIGIN_PASS, k)] >= 0:
                            if I[_k(I, ORIGIN_PASS, k)] == p and I[_k(I, ORIGIN_TPOS, k)] == pos:
                                used += 1
                            I[_k(I, ORIGIN_PASS, k)] = -1
                            I[_k(I, ORIGIN_TPOS, k)] = -1
                    else:
                        if I[_k(I, EVICTED_IN, k)] == p:
                            coll += 1
                        st = wave_stamp
                        if not pin_layer:  # only the expert being fetched is protected
                            I[STAMP] += 1
                            st = I[STAMP]
                            I[_k(I, PROT, k)] = st
                        s = _allocate(I, F, pos, st, k, p, running_pos)
                        if misses == 0:  # what is on the engines went before it
                            e = I[O_T] + 2
                            engine_wait = timeline.stall(
                                F[e + timeline.earliest_in(F, e, I[ENGINES])], now)
                        r = _admit(I, F, k, s, now, False)
                        if r > ready:
                            ready = r
                        misses += 1
                    _on_access(I, k, pos, p)
                if w == 0 and grp_off[pl + 1] > grp_off[pl]:
                    if watchdog:
                        _enqueue(I, F, pred, pins, n_pins, pl, pos, now, p, next_set,
                                 issued)
                    else:
                        _prefetch(I, F, pred, pins, n_pins, pl, pos, now, p, next_set)
                    next_set += grp_off[pl + 1] - grp_off[pl]
                elif watchdog and (w == 0 or not idle) and I[_h(I, LEN, queue)] > 0:
                    # ExpertCache: a layer's first wave always lets the watchdog look
                    # (`_enqueue`), a later one under the space rule (the previous is done)
                    _watchdog(I, F, pins, n_pins, now, False, p, pos, issued)
                stall = timeline.stall(ready, F[t])
                F[t] += stall
                pass_stall += stall
                if n_waves == 1:
                    pairs = pass_pairs[p]
                F[_c(I, R_REQ, pos)] += w1 - w0
                F[_c(I, R_HIT, pos)] += hits
                F[_c(I, R_LATE, pos)] += late
                F[_c(I, R_MISS, pos)] += misses
                F[_c(I, R_COLL, pos)] += coll
                F[_c(I, R_DEMAND_B, pos)] += misses * _fc(I, F, F_BYTES)
                F[_c(I, R_PF_USED, pos)] += used
                F[_c(I, R_PRODUCTS, pos)] += pairs
                if had_prediction:
                    F[_c(I, R_REC_SERVED, pos)] += used
                    F[_c(I, R_REC_REQ, pos)] += w1 - w0
                F[_c(I, R_WAVES, pos)] += 1
                F[_c(I, R_STALL, pos)] += stall
                if engine_wait > 0.0:
                    F[_c(I, R_BEHIND, pos)] += min(stall, engine_wait)
                if has_cost:  # CostModel.experts, with the shared expert on the first wave
                    F[t] += timeline.experts_step(pairs, w1 - w0, tokens, per_expert,
                                                  shared_params if w == 0 else 0, dtype_b,
                                                  peak_flops, hbm_bps, launch)
        if I[_h(I, LEN, queue)] > 0:  # every target of this pass has started: the rest drop
            _drop_queued(I, F, n_layers)
        if has_cost:  # the dense layers after the last MoE layer, then the logits
            for _ in range(dense_after):
                F[t] += dense[p]
            F[t] += half[p]
        passes[p, 0] = start
        passes[p, 1] = F[t]
        passes[p, 2] = pass_stall
        for j in range(len(ROWS)):
            total = 0.0
            for q in range(n_layers):
                total += F[_c(I, j, q)]
            running[p, j] = total
    return passes, running, pins[:n_pins].copy()
