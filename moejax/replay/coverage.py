"""Which engine replays a cache, and why: the compiled one only where it declares everything.

The compiled kernel (`kernel.py`) is a second implementation of `ExpertCache` and of some
policies. It runs a cache only when every part of it is declared here or by the policy itself,
and fails closed: anything not declared — a policy class or argument value without a kernel
form (`Policy.kernel_form`, `moejax/policies/declare.py`), a field of
`CacheOptions` this module does not list, a subclass of `ExpertCache`, a cache that was already
used — runs on the reference engine, which is the live runtime's own code. `decide` returns the
engine and the reason, which results.json records (`replay.engine`, `replay.engine_reason`).
"""

from __future__ import annotations

import dataclasses

from moejax.cache import CacheOptions, ExpertCache
from moejax.replay import kernel
from moejax.timing import CostModel, VirtualClock

ENGINES = ("auto", "reference")

POLICIES = ("eviction", "prefetch", "miss", "routing")
# The kernel form each policy kind must have (eviction: one the kernel has a code for).
FORMS = {"eviction": tuple(kernel.EVICTIONS), "prefetch": ("predictions",),
         "miss": ("fetch",), "routing": ("standard",)}
# What the kernel implements of the fields of `CacheOptions` (moejax/cache/cache_options.py): a test
# of the value, and what a value that fails it is. A field missing here (a new one) is not
# covered, whatever its value; so is a cache's shape with several pools.
SHAPE = (lambda s: len(s.pools) == 1, lambda s: f"several precision pools {list(s.precisions)}")
OPTIONS = {
    "clock": (lambda c: type(c) is VirtualClock, lambda c: f"a {type(c).__name__}"),
    "cost": (lambda c: c is None or type(c) is CostModel, lambda c: f"a {type(c).__name__}"),
    "sink": (lambda s: s is None, lambda s: "a slot sink (a live runtime)"),
    "lookahead_scores": (lambda n: isinstance(n, int), lambda n: f"lookahead_scores={n!r}"),
    "pin_scope": (lambda s: s in ("layer", "request"), lambda s: f"pin_scope={s!r}"),
    "prefetch_queue": (lambda q: q in ("immediate", "watchdog", "watchdog_idle"),
                       lambda q: f"prefetch_queue={q!r}"),
    "host": (lambda h: h is None, lambda h: "a host tier"),
    "full_layers": (lambda n: n == 0, lambda n: f"full-layer placement (full_layers={n})"),
    # Host compute (moejax/cache/host_path.py): the kernel computes nothing on the host.
    "host_compute_layers": (lambda n: n == 0,
                            lambda n: f"host compute of whole layers (host_compute_layers={n})"),
    "host_path": (lambda h: h is None, lambda h: "a host compute model (moejax/cache/"
                  "host_path.py)"),
    # The host's work (moejax/cache/runtime_timing.py): the kernel charges the device's steps.
    # The staging share (moejax/cache/staging.py): the kernel's slots are one share.
    "prefetch_share": (lambda s: s == 0, lambda s: f"a prefetch staging share "
                       f"(prefetch_share={s})"),
    "prefetch_share_use": (lambda u: True, lambda u: ""),  # read only with a share
    "timing": (lambda t: t is None, lambda t: "the live runtime's host work modelled "
               "(hardware.json's host_work)"),
}


@dataclasses.dataclass(frozen=True)
class Decision:
    engine: str  # "compiled" or "reference"
    reason: str  # one line: what made the choice
    # After the replay (`engine.replay`): seconds its engine took to load before running (the
    # compiled kernel's load or compile, once per process; 0 for the reference engine), and
    # how (`compiled.KernelLoad.how`; "" for the reference engine).
    setup_s: float = 0.0
    setup: str = ""


def _policy_text(policy) -> str:
    """`eviction least_stale(order='cyclic', prefetch_current='pass')`: the policy as built."""
    args = ", ".join(f"{k}={v!r}" for k, v in (policy.arguments or {}).items())
    return f"{policy.kind} {policy.name}({args})"


def uncovered(cache: ExpertCache) -> str | None:
    """None when the compiled engine implements everything `cache` is, else what it does not
    (one line)."""
    if type(cache) is not ExpertCache:
        return (f"{type(cache).__name__} is a subclass of ExpertCache, whose changes the kernel "
                "does not know")
    options = getattr(cache, "options", None)
    if not isinstance(options, CacheOptions):
        return "the cache does not record its options"
    for kind in POLICIES:
        policy = getattr(cache, kind)
        form = policy.kernel_form()
        if form not in FORMS[kind]:
            return (f"{_policy_text(policy)} has no compiled form"
                    + (f" (its form {form!r} is not the kernel's)" if form else ""))
    test, describe = SHAPE
    if not test(cache.shape):
        return f"{describe(cache.shape)}: the compiled engine has none"
    for name, value in options.fields().items():
        # What the cache holds now where it keeps the option under its own name (a live
        # runtime sets `sink` after construction), else the value it was built with.
        value = getattr(cache, name, value)
        if name not in OPTIONS:
            return f"cache option {name}={value!r} is not declared by the compiled engine"
        test, describe = OPTIONS[name]
        if not test(value):
            return f"{describe(value)}: the compiled engine has none"
    if not cache.untouched:
        return "the cache was already used (seeded, warm-started or run)"
    return None


def decide(cache: ExpertCache, engine: str = "auto") -> Decision:
    """The engine that replays `cache` under `replay.engine=engine`, and why."""
    if engine == "reference":
        return Decision("reference", "replay.engine=reference")
    why = uncovered(cache)
    if why is not None:
        return Decision("reference", why)
    policies = ", ".join(_policy_text(p) for p in cache.policies())
    return Decision("compiled", f"every policy and option has a compiled form ({policies})")
