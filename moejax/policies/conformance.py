"""A conformance kit for a policy of one's own: the cache's invariants, checked with it in place.

    python -m moejax.policies.conformance my_policies.py:MyPolicy [--captures=olmoe_code,...]
        [--no-live]

or, in a user's pytest, `assert conformance.check("my_policies.py:MyPolicy").passed`.

The policy (a registered class in a file or module, `user_modules`) takes its kind's place in a
cache otherwise at the defaults of a replay (eviction `lru`, prefetch `none`, miss `fetch`,
routing `standard`, unless the policy is that kind), and the cache replays real routing on the
reference engine (the one that calls the policy's own hooks): shipped captures (`--captures`,
default olmoe_code and qwen_prose) at 5% and 25% of their experts and at top-k slots (the
smallest cache: every miss evicts), a scored trace with multi-token prefills, and a scored
trace with empty layers: MoE layers 1, 3 and 6 (dense layers between them, as Qwen2-MoE's
`mlp_only_layers` or a model with a MoE layer every other layer has), layer 3 routed to 2 of
its 16 experts only (the other 14 never requested), in a cache of twice top-k slots, where a
layer often holds none of its experts when the cache asks for a victim. Checked on every run:

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

Then, once (`--no-live` / `live=False` leaves it out: it compiles a model, some seconds), live
equals replay: a live run (the generate job with its warm-up, as a user runs it) driven by a
shipped trace (`policies.routing='trace(path=T)'`, `moejax/traces/driven.py`), the policy in
its kind's place and the defaults above for the rest, over the trace's first 12 passes in a
cache of 64 slots, and the replay job over those passes (`Trace.first_passes`, on the virtual
clock) must count the same (every counter of `cache.total` and `cache.per_layer`) and model
the same time (`cache.timing.total_s`). T is the olmoe_code capture driving OLMoE-1B-7B
narrowed to width 32 (16 MoE layers x 64 experts, top-8; one token a pass); for a policy that
reads router probabilities or speculative scores (`needs_probs`, `needs_spec`), which an
id-only capture lacks, the embedded model's scored trace assets/traces/code_0.npz driving the
embedded model (8 x 32, top-4; a 64-token prompt first). Both runs name the policy's file or
module in `policies.modules`, as a user's run does. The check does not apply (the table says
"n/a" and why, and the report still passes) to a `replay_only` policy (it reads the future
routing: it cannot run live), to a routing policy (a trace-driven run's routing is the trace)
and, off the CPU backend, to a miss policy that computes on the host (a live run does that on
the CPU only). The runtime makes the same calls to a policy live as in replay; a policy breaks
this check by reading what the two runs do not share: the wall clock, or state kept outside
its instance (a module's globals), which the live run's warm-up changes (its throwaway cache
is built after the timed run's and runs two passes before the timed run starts).

What is not checked here: live runs of the other captures, at other cache sizes, with other
policies beside this one or of several requests; and a policy's speed. Each line of the table
says the condition it ran under; a failure prints the first failing condition and the error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import tempfile

import numpy as np

from moejax import bundled, cli, jobs
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
# The live check: the first passes of a shipped trace, live and replayed, in a cache of these
# slots (of OLMoE's 16 x 64 experts, or the embedded model's 8 x 32: evictions in both).
LIVE_CAPTURE = "olmoe_code"
LIVE_PASSES = 12
LIVE_SLOTS = 64


@dataclasses.dataclass(frozen=True)
class Result:
    check: str
    condition: str
    passed: bool
    detail: str = ""
    # False: the check cannot run for this policy ("n/a", `detail` says why; not a failure).
    applies: bool = True


@dataclasses.dataclass(frozen=True)
class Report:
    policy: str  # "kind name"
    results: tuple[Result, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results if r.applies)

    def table(self) -> str:
        width = max(len(r.condition) for r in self.results)
        ran = [r for r in self.results if r.applies]
        skipped = len(self.results) - len(ran)
        lines = [f"{self.policy}: {sum(r.passed for r in ran)} of {len(ran)} checks passed"
                 + (f", {skipped} not applicable" if skipped else "")]
        for r in self.results:
            mark = "n/a " if not r.applies else "pass" if r.passed else "FAIL"
            lines.append(f"  {mark}  {r.check:<12} {r.condition:<{width}}"
                         f"  {r.detail}".rstrip())
        return "\n".join(lines)


def resolve_target(target: str) -> tuple[str, str]:
    """`FILE.py:Class` or `module:Class` -> (kind, registered name), the file loaded."""
    kind, name, _ = _resolve(target)
    return kind, name


def _resolve(target: str) -> tuple[str, str, str]:
    """`resolve_target`, and the file or module as given (what `policies.modules` names)."""
    source, sep, cls_name = target.rpartition(":")
    if not sep or not source or not cls_name:
        raise ConfigError(f"{target!r}: give FILE.py:Class or module:Class")
    loaded = user_modules.load(source)[0]
    for kind, classes in registry.registered().items():
        for name, cls in classes.items():
            if cls.__name__ == cls_name and loaded.path == sys.modules[cls.__module__].__file__:
                return kind, name, source
    raise ConfigError(f"{target!r}: {loaded.path} registers no policy class {cls_name!r} "
                      f"(it registers: {', '.join(loaded.registers) or 'none'})")


def cache_with(kind: str, spec: str, trace, slots: int):
    """A replay's default cache of `slots` slots for `trace`, with policy `spec` of `kind` in
    its kind's place."""
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


def conditions(captures) -> list[tuple[str, list, int]]:
    """(condition, traces, slots) of each replay: each capture at `CAPACITIES` of its experts
    and at top-k slots (one decode layer's experts: every miss evicts), a scored trace with
    prefills, and one with empty layers."""
    runs = []

    def at(share: float, t) -> int:
        return max(t.top_k, int(share * len(t.layers) * t.num_experts))

    for name in captures:
        if name not in bundled.CAPTURE_NAMES:
            raise ConfigError(f"--captures: {name!r} is not a shipped capture; they are: "
                              f"{', '.join(bundled.CAPTURE_NAMES)}")
        traces = load_traces(bundled.capture_path(name))
        for share in CAPACITIES:
            runs.append((f"{name}, {share:.0%} of experts", traces, at(share, traces[0])))
        runs.append((f"{name}, top-k slots", traces, traces[0].top_k))
    rng = np.random.default_rng(0)
    scored = random_scored_trace(rng, 4, 16, 2, [8, 1, 1, 1, 6, 1, 1], 1, prefill_passes=2)
    runs.append(("scored trace, 8- and 6-token prefills, 25% of experts", [scored],
                 at(0.25, scored)))
    # Dense layers between the MoE ones, a layer whose other experts are never requested, and
    # a cache so small that a layer often holds none of its experts when a victim is asked.
    empty = random_scored_trace(rng, 3, 16, 2, [8] + [1] * 23, 1, layer_ids=[1, 3, 6],
                                confine={3: 2})
    runs.append(("empty layers (MoE 1, 3, 6; layer 3 on 2 of 16 experts), 2x top-k slots",
                 [empty], 2 * empty.top_k))
    return runs


def _not_live(kind: str, cls) -> str:
    """Why the policy cannot run live in its kind's place ("" when it can)."""
    if cls.replay_only:
        return (f"{kind} {cls.name} is replay_only (it reads the future routing): it cannot "
                "run live")
    if kind == "routing":
        return ("a trace-driven live run's routing is the trace (policies.routing=trace): a "
                "routing policy cannot take its place")
    if getattr(cls, "computes_on_host", False):
        import jax

        platform = jax.devices()[0].platform
        if platform != "cpu":
            return (f"miss {cls.name} computes experts on the host, which a live run does on "
                    f"the CPU backend only (this one is {platform})")
    return ""


def _configure(c, kind: str, spec: str, modules: str, routing: str = "standard") -> None:
    for k, default in DEFAULTS.items():
        setattr(c.policies, k, spec if k == kind else default)
    if routing != "standard":  # (never for a routing policy: `_not_live`)
        c.policies.routing = routing
    c.policies.modules = modules
    c.cache.slots = LIVE_SLOTS
    c.log.progress = c.log.tensorboard = False


def _live_equals_replay(kind: str, name: str, modules: str) -> Result:
    """The live check (the module's docstring): a trace-driven live run of a shipped trace's
    first `LIVE_PASSES` passes against the replay of those passes."""
    cls = registry.policy_class(kind, name)
    scored = cls.needs_probs or cls.needs_spec  # an id-only capture cannot drive it
    path = bundled.scored_trace_files()[0] if scored else bundled.capture_path(LIVE_CAPTURE)
    model = "embedded model" if scored else "OLMoE-1B-7B, width 32"
    label = os.path.splitext(os.path.basename(path))[0]
    condition = f"{label}, {LIVE_PASSES} passes live ({model}) = replay, {LIVE_SLOTS} slots"
    why_not = _not_live(kind, cls)
    if why_not:
        return Result("live", condition, True, f"n/a: {why_not}", applies=False)
    with tempfile.TemporaryDirectory(prefix="moejax-conformance-") as tmp, \
            contextlib.redirect_stdout(io.StringIO()):  # (the jobs' tables)
        try:
            c = base_config()  # the generate job, with its warm-up
            _configure(c, kind, name, modules, routing=f"trace(path={path!r})")
            if not scored:
                c.model.preset, c.model.width = "olmoe-1b-7b", 32
            c.run.max_new_tokens = LIVE_PASSES
            live = jobs.run(c, os.path.join(tmp, "live"))
            (whole,) = load_traces(path)
            # A capture's passes on the live run's model and sizes, from position 0 (its first
            # pass was the live prompt); a scored trace has its own.
            meta = {} if scored else {
                "model": live["model"]["config"], "expert_bytes": live["cache"]["expert_bytes"],
                "info": {**whole.meta["info"], "prompt_tokens": 0}}
            cut = os.path.join(tmp, "passes.npz")
            whole.first_passes(LIVE_PASSES, **meta).save(cut)
            r = base_config()
            r.job, r.replay.trace, r.model.preset, r.clock.kind = "replay", cut, "", "virtual"
            _configure(r, kind, name, modules)
            replayed = jobs.run(r, os.path.join(tmp, "replay"))
        except Exception as e:  # the policy's code, or a run refusing what it did
            return Result("live", condition, False, f"{type(e).__name__}: {e}")
    ran, rep = live["cache"], replayed["cache"]
    passes = live["trace_driven"]["passes_run"]
    if passes != LIVE_PASSES:
        return Result("live", condition, False, f"the live run ran {passes} passes")
    keys = [k for k, v in ran["total"].items() if v != rep["total"].get(k)]
    keys.sort(key=lambda k: k not in COUNTERS)  # the counts first
    differ = [f"{k} {ran['total'][k]} live, {rep['total'].get(k)} replayed" for k in keys[:4]]
    if not differ and ran["per_layer"] != rep["per_layer"]:
        at = next(i for i, (a, b) in enumerate(zip(ran["per_layer"], rep["per_layer"]))
                  if a != b)
        differ = [f"the counters of the MoE layer at position {at}"]
    live_s, replay_s = ran["timing"]["total_s"], rep["timing"]["total_s"]
    if live_s != replay_s:
        differ.append(f"modelled time {live_s:.6g} s live, {replay_s:.6g} s replayed")
    return Result("live", condition, not differ, "" if not differ else
                  "live and replay differ: " + "; ".join(differ))


def check(target: str, captures=CAPTURES, live: bool = True) -> Report:
    """Runs every check on the policy `target` names (`FILE.py:Class`, `module:Class`), on the
    shipped `captures` and the scored traces; with `live`, the live check too."""
    if not __debug__:  # `python -O` strips the cache's own checks, which are assertions
        raise ConfigError("the conformance kit needs Python's assertions: run it without -O")
    kind, name, modules = _resolve(target)
    results = []
    for condition, traces, slots in conditions(captures):
        t = traces[0]
        outcome = []
        for _ in range(2):
            try:
                cache = cache_with(kind, name, t, slots)
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
    if live:
        results.append(_live_equals_replay(kind, name, modules))
    return Report(f"{kind} {name}", tuple(results))


def main(argv: list[str] | None = None) -> int:
    ap = cli.ArgumentParser(prog=PROG, description="Checks a policy of your own against the "
                            "cache's invariants on real routing; exit 1 when a check fails.")
    ap.add_argument("target", help="FILE.py:Class or module:Class (a registered policy)")
    ap.add_argument("--captures", default=",".join(CAPTURES),
                    help="the shipped captures to replay, comma-separated (default: %(default)s)")
    ap.add_argument("--no-live", dest="live", action="store_false",
                    help="leave out the live check (a live run against its replay: it "
                         "compiles a model, some seconds)")
    args = ap.parse_args(sys.argv[1:] if argv is None else list(argv))

    def run() -> int:
        report = check(args.target, tuple(c for c in args.captures.split(",") if c), args.live)
        print(report.table())
        return 0 if report.passed else 1

    return cli.guarded(PROG, run)


if __name__ == "__main__":
    sys.exit(main())
