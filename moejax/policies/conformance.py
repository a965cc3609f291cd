"""A conformance kit for a policy of one's own: the cache's invariants, checked with it in place.

    python -m moejax.policies.conformance my_policies.py:MyPolicy [--captures=olmoe_code,...]

or, in a user's pytest, `assert conformance.check("my_policies.py:MyPolicy").passed`.

The policy (a registered class in a file or module, `user_modules`) takes its kind's place in a
cache otherwise at the defaults of a replay (eviction `lru`, prefetch `none`, miss `fetch`,
routing `standard`, unless the policy is that kind), and the cache replays real routing on the
reference engine (the one that calls the policy's own hooks): shipped captures (`--captures`,
default olmoe_code and qwen_prose) at 5% and 25% of their experts and at top-k slots (the
smallest cache: every miss evicts), and a scored trace with multi-token prefills. Checked on
every run:

* accounting: every request of every layer is a hit, a late hit or a miss, and a collision
  miss is a miss (per layer and in total);
* capacity: the cache's bookkeeping after the run (`ExpertCache.check_invariants`): resident
  and in-flight keys within the slots, each slot's key where the cache says it is; a victim
  the policy names must be resident and not pinned by the running wave (the cache refuses
  any other, and the refusal is this check's failure);
* determinism: the same replay twice gives the same counters;
* no exception from the policy's hooks on any of these runs.

Accounting and capacity hold by the cache's construction for any policy whose choices it
accepts (it refuses a victim that is not resident or is pinned, which shows as a failed run):
they are structural here, checked so that a policy that corrupts the cache's state some other
way, or a change in the cache, shows. Determinism and the runs are the policy's own.

What is not checked here: that a live run equals its replay (the project's own tests hold the
built-in policies to it), and a policy's speed. Each line of the table says the condition it
ran under; a failure prints the first failing condition and the error.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from moejax import bundled, cli
from moejax.cache import build_cache_for
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.policies import registry, user_modules
from moejax.replay import replay
from moejax.traces import load_traces, random_scored_trace

PROG = "python -m moejax.policies.conformance"
CAPTURES = ("olmoe_code", "qwen_prose")
CAPACITIES = (0.05, 0.25)
DEFAULTS = {"eviction": "lru", "prefetch": "none", "miss": "fetch", "routing": "standard"}


@dataclasses.dataclass(frozen=True)
class Result:
    check: str
    condition: str
    passed: bool
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Report:
    policy: str  # "kind name"
    results: tuple[Result, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def table(self) -> str:
        width = max(len(r.condition) for r in self.results)
        lines = [f"{self.policy}: {sum(r.passed for r in self.results)} of "
                 f"{len(self.results)} checks passed"]
        for r in self.results:
            mark = "pass" if r.passed else "FAIL"
            lines.append(f"  {mark}  {r.check:<12} {r.condition:<{width}}"
                         f"  {r.detail}".rstrip())
        return "\n".join(lines)


def resolve_target(target: str) -> tuple[str, str]:
    """`FILE.py:Class` or `module:Class` -> (kind, registered name), the file loaded."""
    source, sep, cls_name = target.rpartition(":")
    if not sep or not source or not cls_name:
        raise ConfigError(f"{target!r}: give FILE.py:Class or module:Class")
    loaded = user_modules.load(source)[0]
    for kind, classes in registry.registered().items():
        for name, cls in classes.items():
            if cls.__name__ == cls_name and loaded.path == sys.modules[cls.__module__].__file__:
                return kind, name
    raise ConfigError(f"{target!r}: {loaded.path} registers no policy class {cls_name!r} "
                      f"(it registers: {', '.join(loaded.registers) or 'none'})")


def _cache(kind: str, spec: str, trace, slots: int):
    c = base_config()
    c.job = "replay"
    for k, default in DEFAULTS.items():
        setattr(c.policies, k, spec if k == kind else default)
    c.cache.slots = slots
    shape = dict(layers=tuple(trace.layers), num_layers=max(trace.layers) + 1,
                 num_experts=trace.num_experts, top_k=trace.top_k)
    return build_cache_for(resolve(c), None, {"native": 1}, False, **shape)


COUNTERS = ("requests", "hits", "late_hits", "misses", "collision_misses")


def _counters(cache) -> list[tuple]:
    """(requests, hits, late hits, misses, collision misses): the totals, then each layer's."""
    totals, per_layer = cache.metrics.totals(), cache.metrics.per_layer
    return [tuple(int(totals[k]) for k in COUNTERS)] + [
        tuple(int(v) for v in row) for row in zip(*(per_layer[k] for k in COUNTERS))]


def _accounting(cache) -> None:
    for requests, hits, late, misses, collisions in _counters(cache):
        if hits + late + misses != requests:
            raise AssertionError(f"{hits} hits + {late} late + {misses} misses != "
                                 f"{requests} requests")
        if collisions > misses:
            raise AssertionError(f"{collisions} collision misses > {misses} misses")


def _runs(captures) -> list[tuple[str, list, float | None]]:
    """(condition, traces, capacity as a share of experts, or None for the smallest cache:
    top-k slots, one decode layer's experts, so that every miss evicts)."""
    runs = []
    for name in captures:
        if name not in bundled.CAPTURE_NAMES:
            raise ConfigError(f"--captures: {name!r} is not a shipped capture; they are: "
                              f"{', '.join(bundled.CAPTURE_NAMES)}")
        traces = load_traces(bundled.capture_path(name))
        for share in CAPACITIES:
            runs.append((f"{name}, {share:.0%} of experts", traces, share))
        runs.append((f"{name}, top-k slots", traces, None))
    rng = np.random.default_rng(0)
    scored = random_scored_trace(rng, 4, 16, 2, [8, 1, 1, 1, 6, 1, 1], 1, prefill_passes=2)
    runs.append(("scored trace, 8- and 6-token prefills, 25% of experts", [scored], 0.25))
    return runs


def check(target: str, captures=CAPTURES) -> Report:
    """Runs every check on the policy `target` names (`FILE.py:Class`, `module:Class`), on the
    shipped `captures` and a scored trace."""
    if not __debug__:  # `python -O` strips the cache's own checks, which are assertions
        raise ConfigError("the conformance kit needs Python's assertions: run it without -O")
    kind, name = resolve_target(target)
    results = []
    for condition, traces, share in _runs(captures):
        t = traces[0]
        slots = t.top_k if share is None else max(t.top_k, int(share * len(t.layers) *
                                                               t.num_experts))
        outcome = []
        for _ in range(2):
            try:
                cache = _cache(kind, name, t, slots)
                replay(cache, traces, engine="reference")
            except Exception as e:  # the policy's code or the cache refusing what it did
                results.append(Result("runs", condition, False, f"{type(e).__name__}: {e}"))
                break
            outcome.append(_counters(cache))
            if len(outcome) > 1:  # the second run is for determinism only
                continue
            for check_name, fn in (("accounting", _accounting),
                                   ("capacity", lambda c: c.check_invariants())):
                try:
                    fn(cache)
                    results.append(Result(check_name, condition, True))
                except AssertionError as e:
                    results.append(Result(check_name, condition, False, str(e)))
        if len(outcome) == 2:
            first, again = outcome[0][0], outcome[1][0]  # the totals
            differ = [f"{k} {a} then {b}" for k, a, b in zip(COUNTERS, first, again) if a != b]
            same = outcome[0] == outcome[1]
            results.append(Result("determinism", condition, same, "" if same else
                                  "two runs differ: " + (", ".join(differ) or "in a layer")))
    return Report(f"{kind} {name}", tuple(results))


def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser(prog=PROG, description="Checks a policy of your own against the "
                            "cache's invariants on real routing; exit 1 when a check fails.")
    ap.add_argument("target", help="FILE.py:Class or module:Class (a registered policy)")
    ap.add_argument("--captures", default=",".join(CAPTURES),
                    help="the shipped captures to replay, comma-separated (default: %(default)s)")
    args = ap.parse_args(sys.argv[1:] if argv is None else list(argv))

    def run() -> int:
        report = check(args.target, tuple(c for c in args.captures.split(",") if c))
        print(report.table())
        return 0 if report.passed else 1

    return cli.guarded(PROG, run)


if __name__ == "__main__":
    sys.exit(main())
