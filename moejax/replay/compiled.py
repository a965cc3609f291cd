"""The compiled replay engine: trace replay through the numba kernel (`kernel.py`) instead of the
policy objects, for the configurations it declares (`coverage.py`; everything else runs on the
reference engine, `engine.py`).

**What it implements.** The evictions with a kernel form (lru, fifo, lru_per_layer, lfu, fld,
least_stale in its three orders with `prefetch_current="pass"`, belady); every prefetcher
whose predictions never read the cache (all of them: they are taken from the policy object
itself, pass by pass, before the kernel runs, exactly as the reference calls it, or for the
oracles and the temporal prefetcher from the whole request stream at once,
`stream_predictions.py`); fetch and
standard routing; both prefetch queues and pin scopes; prefill layers in waves; the virtual
clock's copy engines and host link, and the cost model's compute.

**What is written once.** The time arithmetic — a transfer's booking, when a slot holds its
expert, a stall, when the watchdog may issue, the roofline of the experts step — is
`moejax/timing/timeline.py`, which the reference calls and the kernel compiles. The victim
orders of FLD and Least-Stale are `farthest_layer_walk` / `least_stale_walk`
(`moejax/policies/eviction.py`), which the reference's policies use and which are handed to
the kernel here as tables. The other victim orders (LRU's recency list, LFU's counts, Belady's
next use), the allocation, admission, collision and wave bookkeeping and the watchdog's queue
exist twice: as the reference's Python objects and as the kernel's flat integer state
(docs/DESIGN.md, "Two replay engines" says why). `tests/test_compiled_replay.py` holds the
two equal — counters per layer, pass timings, per-pass running totals, final residency,
prefetch origins and clock — by a fuzzer drawn from the policy registry, on every shipped
trace and on a slice of the capture grid; `tests/reference_cache.py` is a from-scratch oracle
that shares no code with either.

`replay()` (`engine.py`) takes this engine when `coverage.decide` says so; results.json's
`replay.engine` and `replay.engine_reason` say which ran and why. The kernel's one-time load
(numba's on-disk cache, or a compile) is timed apart from the replay (`run` returns it,
results.json's `replay.setup_s`, and `replay.setup` says which of the two it was, from numba's
own cache counters), so that `replay.requests_per_s` is the engine's own rate. numba compiles
the kernel once per machine (and again after `kernel.py` or `moejax/timing/timeline.py`
changes); a later process reads it from numba's disk cache in under a second.
The eviction policy object is not stepped (its state stays empty); the prefetch policy object
is, by the predictions taken from it.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import time
from typing import Callable

import numba
import numpy as np

from moejax.cache import BYTES, COUNTERS, SECONDS, CacheMetrics, ExpertCache, PassTiming
from moejax.policies.eviction import farthest_layer_walk, least_stale_walk
from moejax.replay import coverage, lean_kernel
from moejax.replay import kernel as K
from moejax.replay.future import future_of_requests
from moejax.replay.gates import layer_gates
from moejax.replay.stream_predictions import stream_predictions

assert K.ROWS == COUNTERS + BYTES + SECONDS, "kernel.ROWS must follow CacheMetrics"


def walk_table(form: str, n_layers: int) -> np.ndarray:
    """The victim walk of a layered eviction per running position -1..L-1, as the table the
    kernel reads (`[L + 1, width]`: row `pos + 1`); empty for the others."""
    if form == "fld":
        return np.asarray([farthest_layer_walk(p, n_layers) for p in range(-1, n_layers)],
                          np.int64)
    if form.startswith("least_stale:"):
        order = form.split(":", 1)[1]
        return np.asarray([least_stale_walk(order, p, n_layers) for p in range(-1, n_layers)],
                          np.int64)
    return np.zeros((n_layers + 1, 0), np.int64)


@dataclasses.dataclass(frozen=True)
class Passes:
    """Per pass, every trace's passes in order: prefill or decode, its tokens, and its
    token-expert pairs; and the longest pass-layer."""
    prefill: np.ndarray  # bool
    tokens: np.ndarray  # int64
    pairs: np.ndarray  # int64
    longest: int  # the most requests a pass-layer has (more than the cache's slots: waves)

    def __len__(self) -> int:
        return len(self.tokens)


def requests(traces, n_experts: int):
    """The requests of every pass-layer (global key `position * E + expert`, rank order) as one
    array, the start of each pass-layer in it, each request's token-expert pairs in its
    pass-layer (empty when every pass has one token: one pair each), and the `Passes`. Keys and
    pair counts are int32 (keys < L * E, counts <= a pass's tokens): half the memory of int64
    and of its page faults on fresh arrays. A trace listed more than once (a capture replayed
    16 times through one cache) is laid out once and copied (`_trace_requests`: about a tenth
    of a millisecond a 512-pass capture)."""
    n_keys = max((len(t.layers) for t in traces), default=0) * n_experts
    if n_keys > np.iinfo(np.int32).max:
        raise ValueError(f"{n_keys} keys (layers x experts) do not fit the int32 request keys")
    laid: dict[int, tuple] = {}  # by trace object
    blocks = []
    for trace in traces:
        if id(trace) not in laid:
            laid[id(trace)] = _trace_requests(trace, n_experts)
        blocks.append(laid[id(trace)])
    if len(blocks) == 1:
        keys, starts, mult = blocks[0][:3]
    else:
        keys = np.concatenate([b[0] for b in blocks])
        # Each block's starts, shifted by the requests before it, written in place (a shifted
        # copy of each, then joined, wrote every start twice into fresh pages).
        starts = np.empty(sum(len(b[1]) - 1 for b in blocks) + 1, np.int64)
        starts[0] = at = pl = 0
        for block in blocks:
            n = len(block[1]) - 1
            np.add(block[1][1:], at, out=starts[pl + 1:pl + n + 1])
            at += len(block[0])
            pl += n
        mult = (np.concatenate([b[2] if len(b[2]) else np.ones(len(b[0]), np.int32)
                                for b in blocks])
                if any(len(b[2]) for b in blocks) else np.zeros(0, np.int32))
    passes = Passes(*(np.concatenate([b[3][j] for b in blocks]) for j in range(3)),
                    longest=max(b[4] for b in blocks))
    return keys, starts, mult, passes


def _trace_requests(trace, n_experts: int):
    """One trace's `(keys, starts, mult, (prefill, tokens, pairs), longest)` (`requests`). Runs of
    one-token passes (decode) are taken as whole arrays: a token's top-k are distinct and
    already in rank order."""
    # Pieces of the key array in order: a run of one-token passes as (rows, offsets), laid out
    # straight into the array below; a wider pass-layer's requests as an array.
    pieces, counted = [], []  # counted: (where in keys, pairs) of wider passes
    # The pass-layers' lengths: (how many, each one's length) for a run of one-token passes,
    # else (1, that pass-layer's length).
    lengths = []
    prefill, tokens, pairs = [], [], []
    at = 0
    n_layers, k, n_passes = len(trace.layers), trace.top_k, trace.num_passes
    n_prefill = trace.prefill_passes
    offsets = np.arange(n_layers, dtype=np.int64) * n_experts
    # A one-token pass's keys are its ids plus these, as one row of L * k (numpy's inner loop
    # then runs over the row, not over each layer's k: twice as fast).
    row_offsets = np.repeat(offsets, k)
    sizes = np.diff(trace.pass_offsets)
    ids_all = trace.ids
    # Where each run of one-token passes, or a single wider pass, starts and ends.
    one = sizes == 1
    edges = np.flatnonzero(np.diff(one.astype(np.int8))) + 1
    bounds = np.concatenate(([0], edges, [n_passes])).tolist()
    for p, q in zip(bounds[:-1], bounds[1:]):
        if p == q:
            continue
        kind = np.arange(p, q) < n_prefill
        if one[p]:  # a run of one-token passes: their rows as they are, at once
            rows = ids_all[trace.pass_offsets[p]:trace.pass_offsets[q]]
            pieces.append(rows.reshape(len(rows), n_layers * k))
            at += rows.size
            lengths.append(((q - p) * n_layers, k))
            prefill.append(kind)
            tokens.append(np.ones(q - p, np.int64))
            pairs.append(np.full(q - p, k, np.int64))
            continue
        for r in range(p, q):
            ids = ids_all[int(trace.pass_offsets[r]):int(trace.pass_offsets[r + 1])]
            prefill.append(kind[r - p:r - p + 1])
            tokens.append(np.asarray([ids.shape[0]], np.int64))
            pairs.append(np.asarray([ids.shape[0] * ids.shape[2]], np.int64))
            # Every layer's distinct experts at once (`requests_in_rank_order` per layer):
            # global keys layer-major, each layer's rank-major over the tokens, the first
            # occurrence of each key in that order kept.
            order = (ids + offsets[None, :, None]).transpose(1, 2, 0).reshape(-1)
            _, first = np.unique(order, return_index=True)
            req = order[np.sort(first)]
            counts = np.bincount(order, minlength=n_layers * n_experts)
            per_layer = np.bincount(req // n_experts, minlength=n_layers)
            pieces.append(req)
            counted.append((at, counts[req]))
            at += len(req)
            lengths.extend((1, int(n)) for n in per_layer)
    keys = np.empty(at, np.int32)
    at = 0
    for piece in pieces:
        if piece.ndim == 2:
            np.add(piece, row_offsets[None, :], out=keys[at:at + piece.size].reshape(piece.shape))
        else:
            keys[at:at + len(piece)] = piece
        at += piece.size
    starts = np.empty(sum(n for n, _ in lengths) + 1, np.int64)
    starts[0] = at = pl = 0
    for n, length in lengths:
        starts[pl + 1:pl + n + 1] = at + length * np.arange(1, n + 1)
        at += n * length
        pl += n
    # A one-token pass's request is one pair; a stream of one-token passes only leaves `mult`
    # empty (the kernels then count one pair a request), not a million ones written into
    # fresh pages (on this machine, about a millisecond a million requests).
    mult = np.ones(len(keys) if counted else 0, np.int32)
    for where, counts in counted:
        mult[where:where + len(counts)] = counts
    empty = (np.zeros(0, bool), np.zeros(0, np.int64), np.zeros(0, np.int64))
    return (keys, starts, mult,
            tuple(np.concatenate(x) if x else e for x, e in zip((prefill, tokens, pairs), empty)),
            max((length for _, length in lengths), default=0))


# The request arrays built last in this process, each with copies of the trace fields they were
# built from (`_kept_requests`): a grid replays one trace at many cache sizes, evictions and
# queues, and comparing a replay's traces with those copies, value for value, costs a small
# part of building the arrays again (a capture grid's cell: about 0.1 ms against 1.4). At most
# `KEEP_REQUESTS` of them and `KEEP_REQUEST_BYTES` of arrays (oldest out first): a long trace,
# replayed once, is not held after its replay.
_REQUESTS: collections.deque = collections.deque()
KEEP_REQUESTS = 8
KEEP_REQUEST_BYTES = 1 << 28


def _request_inputs(traces) -> tuple[list[int], list[tuple]]:
    """What `requests` reads of the traces (their arrays as they are: the caller copies): each
    distinct trace object's once, and which of them each listed trace is."""
    which, first, inputs = [], {}, []
    for t in traces:
        if id(t) not in first:
            first[id(t)] = len(inputs)
            inputs.append((tuple(t.layers), t.top_k, t.num_passes, t.prefill_passes,
                           t.pass_offsets, t.ids))
        which.append(first[id(t)])
    return which, inputs


def _same_inputs(kept: tuple[list[int], list[tuple]], now: tuple[list[int], list[tuple]]
                 ) -> bool:
    return kept[0] == now[0] and len(kept[1]) == len(now[1]) and all(
        a[:4] == b[:4] and np.array_equal(a[4], b[4]) and np.array_equal(a[5], b[5])
        for a, b in zip(kept[1], now[1]))


def _kept_requests(traces, n_experts: int):
    """`requests(traces, n_experts)`, built once per process for traces of the same values
    (compared with copies of the kept ones': a trace changed in place is built anew). Its
    arrays are shared by the replays that take them: nothing writes them (the kernels read
    `keys` and `mult`, the lean ones `starts` too; `layout` copies `starts` for the general
    one)."""
    now = _request_inputs(traces)
    for inputs, experts, out, _ in _REQUESTS:
        if experts == n_experts and _same_inputs(inputs, now):
            return out
    out = requests(traces, n_experts)
    inputs = (now[0], [(*x[:4], x[4].copy(), x[5].copy()) for x in now[1]])
    nbytes = (sum(x[4].nbytes + x[5].nbytes for x in inputs[1])
              + sum(a.nbytes for a in out[:3])
              + sum(a.nbytes for a in (out[3].prefill, out[3].tokens, out[3].pairs)))
    if nbytes <= KEEP_REQUEST_BYTES:
        _REQUESTS.append((inputs, n_experts, out, nbytes))
        while (len(_REQUESTS) > KEEP_REQUESTS
               or sum(entry[3] for entry in _REQUESTS) > KEEP_REQUEST_BYTES):
            _REQUESTS.popleft()
    return out


def stepped_predictions(cache: ExpertCache, traces, keys: np.ndarray, starts: np.ndarray):
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


# Predictions already taken in this process, by `_predictions_key` (most recent last): a grid
# replays one trace under one prefetcher at many cache sizes, evictions and queues, and the
# predictions depend on none of those (they never read the cache: `KernelForm("predictions")`).
_KEPT: collections.OrderedDict = collections.OrderedDict()
_KEEP = 32
_PLAIN = (int, float, str, bool, type(None))


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return isinstance(value, _PLAIN)


def _predictions_key(cache: ExpertCache, traces) -> tuple | None:
    """What a prefetcher's predictions are a function of: its class and its whole state before
    the run (None, so nothing is kept, unless that state is plain values), the cache's MoE
    layers and expert count, and every trace's arrays and metadata, by content."""
    prefetch = cache.prefetch
    state = vars(prefetch)
    if not _plain(state) or cache.pass_id != -1:
        return None
    digest = hashlib.sha256()
    for trace in traces:
        digest.update(json.dumps(trace.meta, sort_keys=True, default=str).encode())
        for name in ("pass_offsets", "ids", "weights", "probs", "spec"):
            array = getattr(trace, name)
            if array is not None:
                digest.update(f"{name}{array.dtype}{array.shape}".encode())
                digest.update(np.ascontiguousarray(array).data)
    return (type(prefetch), repr(sorted(state.items())), tuple(cache.shape.layers),
            cache.shape.num_experts, digest.hexdigest())


def forget_predictions() -> None:
    """Drops the predictions and the request arrays this process kept (a benchmark timing how
    long they take)."""
    _KEPT.clear()
    _REQUESTS.clear()


def _kept_predictions(cache: ExpertCache, traces, keys: np.ndarray, starts: np.ndarray):
    """`stepped_predictions`, taken once per process for the same prefetcher and traces, and
    for the whole stream at once where the prefetcher's choice is a function of the requests
    alone (`stream_predictions`). The policy object of a later run is then not stepped
    (nothing reads it after a replay: its predictions are the run's whole use of it)."""
    if cache.prefetch.name == "none":
        return stepped_predictions(cache, traces, keys, starts)
    key = _predictions_key(cache, traces)
    if key in _KEPT:
        _KEPT.move_to_end(key)
        return _KEPT[key]
    out = stream_predictions(cache, traces, keys, starts)  # (None: not a stream's function)
    if out is None:
        out = stepped_predictions(cache, traces, keys, starts)
    if key is not None:
        _KEPT[key] = out
        if len(_KEPT) > _KEEP:
            _KEPT.popitem(last=False)
    return out


def _uses(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Belady's future: each key's request indices, sorted, as CSR (`off`, `uses`)."""
    uses = np.argsort(keys, kind="stable").astype(np.int64)
    off = np.zeros(n_keys + 1, np.int64)
    np.cumsum(np.bincount(keys, minlength=n_keys), out=off[1:])
    return off, uses


def _layer_walk(layers, num_layers: int) -> tuple[list[int], int]:
    """How many dense (non-MoE) layers run before each MoE layer of a pass, in the
    reference's walk over the decoder layers, and how many after the last."""
    moe, before, nxt = set(layers), [], 0
    for layer in layers:
        before.append(sum(1 for i in range(nxt, layer) if i not in moe))
        nxt = max(nxt, layer + 1)
    return before, sum(1 for i in range(nxt, num_layers) if i not in moe)


def _compute_plan(cache: ExpertCache, passes: Passes, context_start: list[int] | None, traces):
    """The cost model's compute increments, as the kernels charge them in the reference's order
    (the experts' steps, which depend on the waves, the kernels compute): per pass its dense
    layer's, its attention + router's and half its embedding and logits' time (`dense`,
    `attn`, `half`), and the layer walk: how many dense layers come before each MoE layer
    (`dense_before`) and after the last (`dense_after`). A pass starts with `half`; each MoE
    layer is preceded by its dense layers then its attention + router; the pass ends with the
    dense layers after the last MoE layer, then `half`. Every value is the cost model's own
    (one call per distinct tokens and context). Without a cost model all are zero (and the
    kernels charge none)."""
    n_layers = len(cache.shape.layers)
    n_pass = len(passes)
    cost = cache.cost
    if cost is None:
        return (np.zeros(n_pass), np.zeros(n_pass), np.zeros(n_pass),
                np.zeros(n_layers, np.int64), 0)
    # Each pass's context: the sequence's start, then its tokens so far (this pass's included).
    context = np.empty(n_pass, np.int64)
    at = 0
    for s, trace in enumerate(traces):
        n = trace.num_passes
        context[at:at + n] = ((context_start[s] if context_start else 0)
                              + np.cumsum(passes.tokens[at:at + n]))
        at += n
    lookahead = cache.lookahead_scores
    before, after = _layer_walk(cache.shape.layers, cache.shape.num_layers)
    # Every pass's at once, as arrays (a replay of 512 decode passes has 512 distinct
    # contexts: called one by one, 1.2 ms of its preparation); or where a term could pass
    # int64's range, one call per distinct (tokens, context), a pair as one integer.
    times = cost.pass_times(passes.tokens, context, lookahead)
    if times is not None:
        return (*times, np.asarray(before, np.int64), after)
    span = int(context.max()) + 1
    pair = passes.tokens * span + context
    combined = np.unique(pair)
    which = np.searchsorted(combined, pair)  # (np.unique's return_inverse: 3x the time)
    distinct = list(zip((combined // span).tolist(), (combined % span).tolist()))
    dense = np.asarray([cost.dense_layer(t, c) for t, c in distinct], np.float64)[which]
    attn = np.asarray([cost.attention_router(t, c, lookahead) for t, c in distinct],
                      np.float64)[which]
    half = np.asarray([cost.embed_and_logits(t) / 2 for t, _ in distinct], np.float64)[which]
    return dense, attn, half, np.asarray(before, np.int64), after


def _cost_params(cache: ExpertCache) -> tuple:
    """What `timeline.experts_step` reads besides a wave's counts, for the kernel (with
    `has_cost` False, and never read, without a cost model)."""
    if cache.cost is None:
        return False, 0, 0, 0.0, 1.0, 1.0, 0.0
    per_expert, shared, dtype_b, peak, hbm, launch = cache.cost.experts_terms()
    return True, int(per_expert), int(shared), float(dtype_b), float(peak), float(hbm), \
        float(launch)


# How the kernel was made callable (`KernelLoad.how`).
COMPILED, DISK_CACHE, IN_PROCESS = "compiled", "numba disk cache", "in process"


@dataclasses.dataclass(frozen=True)
class KernelLoad:
    seconds: float  # `load_kernel`'s time, this machine's wall clock
    # COMPILED (numba compiled it: the first run on a machine, or its source changed),
    # DISK_CACHE (read from numba's disk cache) or IN_PROCESS (already loaded: about nothing).
    how: str


# (kernel, `type_key` of its arguments) this process has made callable: numba's own check
# types every argument (`numba.typeof`, about a quarter of a millisecond for a kernel's
# arguments, three times a replay: a grid cell's replay is a few milliseconds).
_HELD: set = set()


def type_key(value):
    """What decides `value`'s numba type, from Python's view of it: an array's dtype, rank
    and flags, a tuple's items', a scalar's type (an int's, whether it fits int64). At least
    as fine as numba's typing, so a key held is a type held; None for anything else (the
    check is then numba's own)."""
    if isinstance(value, np.ndarray):
        f = value.flags
        return (value.dtype.str, value.ndim, f.c_contiguous, f.f_contiguous, f.writeable,
                f.aligned)
    if isinstance(value, tuple):
        items = tuple(type_key(v) for v in value)
        return None if None in items else ("tuple", items)
    if isinstance(value, bool | float | np.generic):
        return type(value)
    if isinstance(value, int):
        return int, -2 ** 63 <= value < 2 ** 63
    return None


def kernel_loaded(args: tuple, kernel=None) -> bool:
    """Whether this process already holds `kernel` (the replay kernel by default) for `args`'
    types (its load is nothing)."""
    kernel = K.run if kernel is None else kernel
    key = type_key(args)
    if key is not None and (kernel, key) in _HELD:
        return True
    held = tuple(numba.typeof(a) for a in args) in kernel.overloads
    if held and key is not None:
        _HELD.add((kernel, key))
    return held


def load(args: tuple, kernel=None) -> KernelLoad:
    """`load_kernel`, and how numba made `kernel` (a `cache=True` dispatcher, the replay
    kernel by default) callable: from its own counters (a compile counts a cache miss, a read
    from its disk cache a hit)."""
    kernel = K.run if kernel is None else kernel
    if kernel_loaded(args, kernel):
        return KernelLoad(load_kernel(args, kernel), IN_PROCESS)
    misses = sum(kernel.stats.cache_misses.values())
    seconds = load_kernel(args, kernel)
    compiled = sum(kernel.stats.cache_misses.values()) > misses
    return KernelLoad(seconds, COMPILED if compiled else DISK_CACHE)


def load_kernel(args: tuple, kernel=None) -> float:
    """Makes `kernel` (the replay kernel by default) callable with `args`' types, and returns
    the seconds it took: loading it from numba's on-disk cache (or compiling it) the first time
    in a process, about 0 after. Taken apart from the run, so that the replay's own time leaves
    this one-time cost out."""
    kernel = K.run if kernel is None else kernel
    t0 = time.perf_counter()
    if not kernel_loaded(args, kernel):
        kernel.compile(tuple(numba.typeof(a) for a in args))
    return time.perf_counter() - t0


def run(cache: ExpertCache, traces, context_start: list[int] | None = None,
        on_load: Callable[[Callable[[], KernelLoad], bool], KernelLoad] | None = None
        ) -> KernelLoad:
    """Replays `traces` through `cache` on the compiled engine (`coverage.uncovered(cache)` is
    None), filling its metrics and leaving its state as the reference would. Returns the
    kernel's load (`load`), part of the call's time. `on_load(make, loaded)`, when given, makes
    the kernel callable by calling `make()` and returns its answer (`loaded`: this process
    already holds it): a job's way to say the load (a compile, the first time on a machine)
    as a phase of its own, before the replay runs."""
    reason = coverage.uncovered(cache)
    if reason is not None:
        raise ValueError(f"the compiled replay engine cannot run this cache: {reason}")
    shape = cache.shape
    n_layers, n_experts = len(shape.layers), shape.num_experts
    n_keys = n_layers * n_experts
    keys, starts, mult, passes = _kept_requests(traces, n_experts)
    n_pl = len(starts) - 1
    assert n_pl == len(passes) * n_layers
    form = cache.eviction.kernel_form()
    policy = K.EVICTIONS[form]
    # Without a prefetcher there are no predictions, and the lean kernel never reads their
    # (empty) arrays: a pass-layer's offset each, fresh pages, not made for it.
    preds = (None if cache.prefetch.name == "none" and lean_kernel.covers(policy, False)
             else _kept_predictions(cache, traces, keys, starts))
    uses_off, uses = (_uses(keys, n_keys) if policy == K.BELADY
                      else (np.zeros(n_keys + 1, np.int64), np.zeros(0, np.int64)))
    quota = np.asarray(getattr(cache.eviction, "quota", [0] * n_layers), np.int64)
    clock = cache.clock
    # Without predictions and with a list eviction, the lean kernel (the same steps, the same
    # outcome: `lean_kernel.py`), which takes the pass-layers' starts as they are; the general
    # one otherwise, which reads them from `I`.
    lean = preds is None or lean_kernel.covers(policy, len(preds[1]) > 0)
    I, F = K.layout(policy, shape.num_slots, n_experts, n_layers,
                    K.QUEUES[cache.options.prefetch_queue],
                    cache.pin_scope == "layer", len(clock.engine_free), quota,
                    starts[:0] if lean else starts,
                    uses_off, uses, walk_table(form, n_layers),
                    (float(shape.expert_bytes), clock.latency_s, clock.engine_bps,
                     clock.link_bps))
    plan, cost = _compute_plan(cache, passes, context_start, traces), _cost_params(cache)
    if lean:
        kernel = lean_kernel.kernel_for(I, F, len(passes), passes.longest, cost[0])
        args = (I, F, keys, starts, mult, passes.tokens, passes.pairs, plan, cost)
        rows = [K.ROWS[j] for j in lean_kernel.RUNNING]  # its running totals' columns
    else:
        kernel, args = K.run, (I, F, keys, mult, passes.tokens, passes.pairs, preds, plan,
                               cost)
        rows = list(K.ROWS)
    setup = (load(args, kernel) if on_load is None
             else on_load(lambda: load(args, kernel), kernel_loaded(args, kernel)))
    timings, running, pins = kernel(*args)
    per_key = K.key_rows(I, n_keys)
    slot_of, origin_pass, origin_tpos = (per_key[K.SLOT], per_key[K.ORIGIN_PASS],
                                         per_key[K.ORIGIN_TPOS])
    c = F[I[K.O_C]:I[K.O_C] + len(K.ROWS) * n_layers].reshape(len(K.ROWS), n_layers)
    slot_ready = F[I[K.O_SR]:I[K.O_SR] + shape.num_slots]
    T = F[I[K.O_T]:I[K.O_T] + 2 + len(clock.engine_free)]
    free = I[I[K.O_SLOTS] + shape.num_slots:I[K.O_SLOTS] + shape.num_slots + I[K.FREE_N]]
    _fill_metrics(cache.metrics, c, timings, running, rows, passes)
    # The cache's state as the reference leaves it.
    layers = shape.layers
    cache.pass_id = len(passes) - 1
    cache.running_pos = n_layers - 1
    # The resident keys in key order (layer by layer, each layer's experts ascending), each
    # container filled in that order as one key at a time would fill it.
    resident = np.flatnonzero(slot_of >= 0)
    at, experts = np.divmod(resident, n_experts)
    slots = slot_of[resident].tolist()
    held = list(zip([layers[q] for q in at.tolist()], experts.tolist()))
    cache.residency.update(zip(held, slots))
    for key, slot in zip(held, slots):
        cache.slot_key[slot] = key
    ends = np.cumsum(np.bincount(at, minlength=n_layers)).tolist()
    for q, layer in enumerate(layers):
        first = ends[q - 1] if q else 0
        if ends[q] > first:
            cache.in_cache[layer].update(experts[first:ends[q]].tolist())
            cache.layer_changes[layer] += ends[q] - first
    for k in np.flatnonzero(origin_pass >= 0).tolist():
        key = (layers[k // n_experts], k % n_experts)
        cache.prefetch_origin[key] = (int(origin_pass[k]), layers[int(origin_tpos[k])])
    cache.running_pins = {(layers[k // n_experts], k % n_experts) for k in pins.tolist()}
    cache.slot_ready[:] = slot_ready.tolist()
    cache.free[:] = free.tolist()
    clock.t, clock.link_free = float(T[0]), float(T[1])
    clock.engine_free[:] = T[2:].tolist()
    cache.finish()
    return setup


def _fill_metrics(m: CacheMetrics, c, timings, running, rows: list[str], passes: Passes
                  ) -> None:
    """The counters, and (deferred: built when read) the per-pass timings and running totals;
    `running`'s columns are the totals of `rows`, the other rows' are 0."""
    for j, name in enumerate(K.ROWS):
        values = c[j]
        m.c[name] = values.tolist() if name in SECONDS else [int(v) for v in values]
    m.defer_passes(lambda: [
        PassTiming("prefill" if prefill else "decode", tokens, s, e, st)
        for prefill, tokens, (s, e, st) in zip(passes.prefill.tolist(), passes.tokens.tolist(),
                                               timings.tolist())])
    m.defer_snapshots(lambda: _snapshots(running, rows, timings))


def _snapshots(running: np.ndarray, rows: list[str], timings: np.ndarray) -> list[dict]:
    """The per-pass running totals `CacheMetrics.snapshot` would have taken (`running`: the
    totals of `rows`, the other rows' 0)."""
    zero = {name: 0.0 if name in SECONDS else 0 for name in K.ROWS}
    out = []
    for row, (start, end, _) in zip(running.tolist(), timings.tolist()):
        sums = dict(zero)
        sums.update((name, v if name in SECONDS else int(v)) for name, v in zip(rows, row))
        t = CacheMetrics.summary(sums)
        t["pass_s"] = end - start
        out.append(t)
    return out
