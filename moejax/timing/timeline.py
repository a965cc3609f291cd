"""The arithmetic of time, written once for both replay engines.

The reference engine (the clocks in `clock.py`, the cost model in `cost.py`, the watchdog in
`moejax/cache/expert_cache.py`) calls these functions from Python; the compiled replay kernel
(`moejax/replay/kernel.py`) compiles the very same functions with numba
(`register_jitable`: a plain Python function to Python, inlined into the jitted code that
calls it). So the two engines book a transfer, charge a compiled step and decide when the
watchdog may issue with one formula, and the same floating-point operations in the same order:
there is nothing to keep in step by hand. Each function is plain Python over scalars and one
indexable sequence (a list in the reference; in the kernel a window of a larger array, read in
place by the `_in` forms: `earliest_in`'s docstring says why). Two are a second form of
another, each held to it bit for bit by a test: `book_alone` (`book_in` on one copy engine, in
two additions: `tests/test_hardware.py`) and `roofline_of_arrays` (`roofline` over numpy
arrays, for the cost plan of every pass at once: `tests/test_cost_model.py`).

The transfer booking (DESIGN.md "Clocks and the hardware model"): a transfer of `nbytes`
issued at `issue_at`

    e          = the copy engine that frees first (the lowest index among equals)
    start      = max(issue_at, engine_free[e])
    data_start = start + latency_s                         (the engine's fixed cost)
    link_start = max(data_start, link_free)                (the shared host link, FIFO)
    end        = max(data_start + nbytes / engine_bps,     (one engine's rate)
                     link_start + nbytes / link_bps)       (the link's rate, shared)
    engine_free[e] = end;  link_free = link_start + nbytes / link_bps
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable


@register_jitable
def earliest(free) -> int:
    """The index of the smallest entry of `free` (the lowest index among equals): the copy
    engine (or storage queue slot) that frees first."""
    return earliest_in(free, 0, len(free))


@register_jitable
def earliest_in(buffer, first: int, n: int) -> int:
    """`earliest(buffer[first:first + n])`, read in place. The kernel keeps the engines' free
    times inside a larger array: a slice of it is an array view, which numba's runtime counts
    a reference to, two atomic operations each time, where the kernel's loop runs with the
    runtime (`kernel.kernel_jit`)."""
    e = 0
    for j in range(1, n):
        if buffer[first + j] < buffer[first + e]:
            e = j
    return e


@register_jitable
def book(engine_free, link_free: float, nbytes: float, issue_at: float, latency_s: float,
         engine_bps: float, link_bps: float) -> tuple[int, float, float, float, float]:
    """Books one transfer (module docstring): sets `engine_free[e]` to its end and returns
    `(e, start, link_start, link_end, end)`; the caller keeps `link_end` as the link's new
    free time."""
    return book_in(engine_free, 0, len(engine_free), link_free, nbytes, issue_at, latency_s,
                   engine_bps, link_bps)


@register_jitable
def book_in(buffer, first: int, n: int, link_free: float, nbytes: float, issue_at: float,
            latency_s: float, engine_bps: float, link_bps: float
            ) -> tuple[int, float, float, float, float]:
    """`book(buffer[first:first + n], ...)` in place (`earliest_in`): `e` is the engine's
    index among the `n`."""
    e = earliest_in(buffer, first, n)
    free = buffer[first + e]
    start = issue_at if issue_at > free else free
    data_start = start + latency_s
    link_start = data_start if data_start > link_free else link_free
    link_end = link_start + nbytes / link_bps
    end = data_start + nbytes / engine_bps
    if link_end > end:
        end = link_end
    buffer[first + e] = end
    return e, start, link_start, link_end, end


@register_jitable
def book_alone(engine_free: float, issue_at: float, latency_s: float, per_link: float,
               per_slower: float) -> tuple[float, float]:
    """`book_in` on a single copy engine that frees no earlier than the link
    (`link_free <= engine_free`: every booking on one engine keeps it, its end being at least
    the link's), with `per_link = nbytes / link_bps` and `per_slower = max(nbytes / engine_bps,
    per_link)`: `(end, link_end)`, bit for bit `book_in`'s. The data starts once the engine is
    free, so once the link is: the link starts with the data (`link_start = data_start`), and
    `max(data_start + nbytes / engine_bps, data_start + per_link)` is `data_start +
    per_slower` (rounding is monotone: `x <= y` gives `fl(a + x) <= fl(a + y)`). Two
    additions on the chain from one booking to the next instead of `book_in`'s five steps:
    the compiled replay's lean kernel books its demand fetches this way."""
    data_start = (issue_at if issue_at > engine_free else engine_free) + latency_s
    return data_start + per_slower, data_start + per_link


@register_jitable
def landed(transfer_end: float, slot_ready: float) -> float:
    """When a slot holds its new expert: a slot still being filled by an earlier transfer is
    reused only after that one lands."""
    return transfer_end if transfer_end > slot_ready else slot_ready


def roofline_of_arrays(flops: np.ndarray, nbytes: np.ndarray, peak_flops: float,
                       hbm_bps: float, launch_s: float) -> np.ndarray:
    """`roofline` of int64 arrays of FLOPs and bytes, element by element: the same operations
    (each count converted to float as Python converts an int for the division, the larger
    quotient, then the launch)."""
    compute = flops.astype(np.float64) / peak_flops
    memory = nbytes.astype(np.float64) / hbm_bps
    return np.where(compute > memory, compute, memory) + launch_s


@register_jitable
def stall(ready: float, now: float) -> float:
    """How long compute at `now` waits for what lands at `ready` (never negative)."""
    wait = ready - now
    return wait if wait > 0.0 else 0.0


@register_jitable
def watchdog_issue_time(queued_at: float, engine_free) -> float:
    """When the queue head would go under `watchdog_idle` (the variant that waits for an
    idle copy engine): once it is queued and a copy engine is free. (SpecMD's `watchdog`
    issues at once when a slot can be had; its transfer queues on the engine.)"""
    return watchdog_issue_time_in(queued_at, engine_free, 0, len(engine_free))


@register_jitable
def watchdog_issue_time_in(queued_at: float, buffer, first: int, n: int) -> float:
    """`watchdog_issue_time(queued_at, buffer[first:first + n])` in place (`earliest_in`)."""
    free = buffer[first + earliest_in(buffer, first, n)]
    return queued_at if queued_at > free else free


@register_jitable
def watchdog_may_issue(issue: float, now: float, strict: bool) -> bool:
    """Whether a transfer `watchdog_idle` would start at `issue` goes now: no later than `now`,
    or strictly before it when a demand fetch booked at `now` must go first."""
    return issue < now or (issue == now and not strict)


@register_jitable
def roofline(flops: float, nbytes: float, peak_flops: float, hbm_bps: float,
             launch_s: float) -> float:
    """One compiled step: `max(FLOPs / peak, bytes / HBM bandwidth) + launch`."""
    compute = flops / peak_flops
    memory = nbytes / hbm_bps
    return (compute if compute > memory else memory) + launch_s


@register_jitable
def experts_step(pairs: int, unique: int, tokens: int, per_expert: int, shared_params: int,
                 dtype_bytes: float, peak_flops: float, hbm_bps: float,
                 launch_s: float) -> float:
    """The experts step of one wave: `pairs` token-expert products over `unique` experts'
    weights, plus the shared expert (`shared_params`, 0 when the wave has none) over `tokens`."""
    flops = 2 * pairs * per_expert + 2 * tokens * shared_params
    nbytes = (unique * per_expert + shared_params) * dtype_bytes
    return roofline(flops, nbytes, peak_flops, hbm_bps, launch_s)
