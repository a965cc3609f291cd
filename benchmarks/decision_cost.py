"""What the live cache's decisions cost the host thread, in one process:

    python benchmarks/decision_cost.py [--rounds 12] [--parts 123456] [--model fresh|once]

1. decode at 100% from cold against every expert resident, `configs/default.py`'s model and
   prompt, 64 tokens: every run on a model loaded for it, as each CLI run is (`--model once`:
   one model and one decoder per setting for the whole benchmark, as before 2026-12-02; both
   settings decoded slower on it), a fresh cache every round, the settings alternated
   (`--rounds`; the order reversed every other round): ms a token, median [25th, 75th
   percentile], and resident / cached round by round (the CLI's job adds its warm-up and
   reporting around the same generation: `cache_runtime.py` part 2);
2. the host thread's CPU per steady decode pass (passes 21-64, `time.thread_time`) split by
   piece — attention / experts step dispatch, the speculative checks and decisions
   (`CachedExperts._check`, of it `ExpertCache.run_layer`), the rest — resident and cached;
   and from one pass's start to the next's, on the wall clock and in host-thread CPU (their
   difference is what the host thread waits for the device: what work moved off its
   critical path could hide behind);
3. the same decisions replayed alone: the exact `begin_pass` / `run_layer` / `end_pass`
   calls of one such run fed to a fresh cache in a loop (no model, no JAX), µs a layer, alone
   and beside a numpy matmul spinning in another process (on this 2-core machine the XLA
   threads are that other process's part in a live run);
4. where a speculative pass checks its layers (`CachedExperts.mid_pass_checks`): part 1's
   decode at 100% from cold with checks mid-pass in every pass ("always"), in none ("never":
   all at the end of the pass) and in a pass after one whose residency changed or whose check
   failed ("adaptive", the default), alternated with resident as in part 1;
5. the most a cheaper decision path could gain: part 1's decode at 100% from cold and warm
   (`cache.warm_start=all`: a complete cache, decided after each pass), each with the real
   `ExpertCache.run_layer` and with a stand-in that serves every one-token layer whose experts
   are all resident as one wave from their slots without deciding anything (`free_decisions`;
   the other layers are decided for real), alternated with resident. The stand-in's counters
   are wrong by construction: it times, it does not run the cache;
6. speculative steps reading host copies (`cache.speculate_from_host`, 2026-12-02) and the
   next token picked in the logits step (`stepped.logits_next_step`, the same day): part 1's
   decode at 100% from cold and warm at 25% and 5% (`cache.warm_start=all`), each with steps
   reading a non-resident expert's host copy (the default) and reading slots only
   (`speculate_from_host=False`, where a miss fails its check), and resident and 100% cold
   as before that day (slots only, the token's argmax dispatched after the pass ended:
   `next_token_after_the_pass`), alternated; each cached setting's ratio to resident, and
   before that day's to resident's then.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing
import time

import jax.numpy as jnp
import numpy as np

from moejax.cache import expert_cache, speculation
from moejax.jobs.common import configured_decoder
from moejax.jobs.generate import requests_of
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import load_model
from moejax.models import stepped
from moejax.seam import Wave
from moejax.serving import runtime

TOKENS = 64
STEADY = 20  # passes before the steady state (the cold cache's first misses)


def _config(**cache):
    config = base_config()
    for k, v in cache.items():
        config.cache[k] = v
    return config


SETTINGS = {"resident": dict(enabled=False), "100% cold": dict(capacity_frac=1.0)}
# Part 4: a setting's cache fields, and the mid-pass checks of its runtime.
CHECKS = {"resident": (dict(enabled=False), None),
          **{f"100% cold, {mode}": (dict(capacity_frac=1.0), mode)
             for mode in speculation.MID_PASS_CHECKS}}
# Part 5: a setting's cache fields, no mid-pass setting, and whether its decisions are free.
FREE = {"resident": (dict(enabled=False), None),
        "100% cold": (dict(capacity_frac=1.0), None),
        "100% cold, free decisions": (dict(capacity_frac=1.0), None, "free_decisions"),
        "100% warm": (dict(capacity_frac=1.0, warm_start="all"), None),
        "100% warm, free decisions": (dict(capacity_frac=1.0, warm_start="all"), None,
                                      "free_decisions")}
# Part 6: host-copy reads on and off, and the day before's resident and 100% cold (slots only,
# the next token's argmax dispatched after the pass).
SLOTS_ONLY = dict(speculate_from_host=False)
HOST_COPIES = {
    "resident": (dict(enabled=False), None),
    "100% cold": (dict(capacity_frac=1.0), None),
    "100% cold, slots only": (dict(capacity_frac=1.0, **SLOTS_ONLY), None),
    "25% warm": (dict(capacity_frac=0.25, warm_start="all"), None),
    "25% warm, slots only": (dict(capacity_frac=0.25, warm_start="all", **SLOTS_ONLY), None),
    "5% warm": (dict(capacity_frac=0.05, warm_start="all"), None),
    "5% warm, slots only": (dict(capacity_frac=0.05, warm_start="all", **SLOTS_ONLY), None),
    "resident before": (dict(enabled=False), None, "next_token_after_the_pass"),
    "100% cold before": (dict(capacity_frac=1.0, **SLOTS_ONLY), None,
                         "next_token_after_the_pass")}

# Parts 4-6: their settings, what they time, and the settings whose ratio is not to resident.
ALTERNATED_PARTS = {
    4: (CHECKS, "mid-pass checks (`mid_pass_checks`), decode as in 1", None),
    5: (FREE, "decode as in 1 with the decisions free (a stand-in serving every all-hit "
        "one-token layer)", None),
    6: (HOST_COPIES, "speculative steps reading host copies, and the next token in the logits "
        "step; decode as in 1", {"100% cold before": "resident before"}),
}


def alternated(loaded, prompt, rounds: int, settings: dict | None = None,
               fresh: bool = True) -> dict[str, np.ndarray]:
    """Part 1 (parts 4 to 6 with `settings`: name -> (cache fields, mid-pass checks[, the name
    of a stand-in: `free_decisions`, `next_token_after_the_pass`])): per setting,
    `[rounds, 3]`: the decode ms a token of each round, and the ms a pass of its decode passes
    1-15 (the cold cache's misses) and 21-63 (steady), each pass from its start to the next's
    (the generation reads each pass's token before the next).

    `fresh`: every run on a model loaded for it (`load_model`), as every CLI run is; else every
    run on `loaded`, one decoder per setting (`--model once`). On the model loaded at the start
    both settings decoded slower (benchmarks/README.md), and the CLI never runs on such a
    model."""
    settings = settings or {name: (fields, None) for name, fields in SETTINGS.items()}
    starts: list[float] = []
    forward = stepped.SteppedDecoder.forward_next
    max_len = prompt.shape[1] + TOKENS + 2

    def stamped(self, tokens):
        starts.append(time.perf_counter())
        return forward(self, tokens)

    def decoder(fields: dict, model):
        _, dec = configured_decoder(resolve(_config(**fields)), model, max_len=max_len)
        dec.generate(prompt, 3)  # compiles (the first time)
        return dec

    decoders = {} if fresh else {name: decoder(fields, loaded)
                                 for name, (fields, _) in settings.items()}
    out = {name: [] for name in settings}
    names = list(settings)
    stepped.SteppedDecoder.forward_next = stamped
    try:
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                fields, checks, *stand_in = settings[name]
                # (a stand-in from the warm-up on: what it dispatches is compiled untimed)
                with STAND_INS[stand_in[0]]() if stand_in else contextlib.nullcontext():
                    model = load_model(resolve(base_config()).model) if fresh else loaded
                    dec = decoder(fields, model) if fresh else decoders[name]
                    if fields.get("enabled", True):  # a fresh, cold cache
                        dec.experts, _ = configured_decoder(resolve(_config(**fields)), model,
                                                            max_len=max_len)
                        if checks is not None:
                            dec.experts.mid_pass_checks = checks
                    starts.clear()
                    gen = dec.generate(prompt, TOKENS)
                per_pass = np.diff(starts) * 1e3  # [i]: pass i (0: the prefill)
                out[name].append((gen.decode_s / (TOKENS - 1) * 1e3,
                                  np.median(per_pass[1:16]), np.median(per_pass[STEADY + 1:])))
    finally:
        stepped.SteppedDecoder.forward_next = forward
    return {k: np.asarray(v) for k, v in out.items()}


@contextlib.contextmanager
def free_decisions():
    """Part 5: `ExpertCache.run_layer` serves a one-token layer whose experts are
    all resident as one wave from their slots, deciding nothing (no counter, no policy state,
    no prefetch) — what the runtime sees of a decision that costs nothing; any other layer is
    decided for real."""
    decide = expert_cache.ExpertCache.run_layer

    def free(self, gate):
        ids = gate.ids
        layer, residency = gate.layer, self.residency
        requested = set(ids.ravel().tolist())
        if ids.shape[0] != 1 or any((layer, e) not in residency for e in requested):
            return decide(self, gate)
        return iter((Wave(layer, {e: residency[(layer, e)] for e in requested}, ids,
                          gate.weights, np.ones(ids.shape, bool), first=True, last=True),))

    expert_cache.ExpertCache.run_layer = free
    try:
        yield
    finally:
        expert_cache.ExpertCache.run_layer = decide


class _ArgmaxWhenRead:
    """The next token as the generation computed it before 2026-12-02: the argmax of the
    logits' last position, dispatched (slice, squeeze, argmax) when the generation reads it,
    after the pass ended (the cache's checks and decisions included)."""

    def __init__(self, logits):
        self.logits = logits

    def __array__(self, dtype=None, copy=None):
        return np.asarray(jnp.argmax(self.logits[:, -1], axis=-1), dtype)


@contextlib.contextmanager
def next_token_after_the_pass():
    """Part 6: the pass's head step computes the logits alone, and the next token is picked
    when the generation reads it (`_ArgmaxWhenRead`), as before `stepped.logits_next_step`."""
    fused = stepped.logits_next_step

    def logits_only(graphdef, state, x):
        logits = stepped.logits_step(graphdef, state, x)
        return logits, _ArgmaxWhenRead(logits)

    stepped.logits_next_step = logits_only
    try:
        yield
    finally:
        stepped.logits_next_step = fused


STAND_INS = {"free_decisions": free_decisions,
             "next_token_after_the_pass": next_token_after_the_pass}


PIECES = ("pass to pass, wall", "pass to pass, host-thread CPU", "pass (all)",
          "attention + router dispatch", "experts step dispatch", "checks and decisions",
          "  of which ExpertCache.run_layer", "  of which the gate's host copy")


class _Timer:
    """Host-thread CPU seconds of wrapped callables, counted only while `on`."""

    def __init__(self):
        self.on, self.cpu = False, collections.defaultdict(float)
        self._undo = []

    def wrap(self, owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[label] += time.thread_time() - start

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def undo(self) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)


def host_cpu_by_piece(loaded, prompt) -> dict[str, dict[str, float]]:
    """Part 2: per setting, ms of host-thread CPU a steady pass, by piece."""
    timer = _Timer()
    timer.wrap(stepped.SteppedDecoder, "forward_next", "pass (all)")
    timer.wrap(stepped.SteppedDecoder, "_attention_router", "attention + router dispatch")
    timer.wrap(stepped, "experts_step", "experts step dispatch")
    timer.wrap(runtime.CachedExperts, "_check", "checks and decisions")
    timer.wrap(runtime.CachedExperts, "_to_host", "  of which the gate's host copy")
    forward = stepped.SteppedDecoder.forward_next
    passes = [0]
    # Each pass's start on both clocks: from one pass's start to the next's is the whole
    # generation loop's time a token, the wait for the token's host copy included; wall time
    # the host thread does not spend on the CPU is time it waits for the device.
    stamps: list[tuple[float, float]] = []

    def counting(self, tokens):
        passes[0] += 1
        timer.on = passes[0] > STEADY
        if timer.on:
            stamps.append((time.perf_counter(), time.thread_time()))
        return forward(self, tokens)

    stepped.SteppedDecoder.forward_next = counting
    decide = expert_cache.ExpertCache.run_layer

    def run_layer(self, gate):  # the generator run to its end inside the timing
        start = time.thread_time()
        waves = list(decide(self, gate))
        if timer.on:
            timer.cpu["  of which ExpertCache.run_layer"] += time.thread_time() - start
        yield from waves

    expert_cache.ExpertCache.run_layer = run_layer
    out = {}
    try:
        for name, fields in SETTINGS.items():
            _, dec = configured_decoder(resolve(_config(**fields)), loaded,
                                        max_len=prompt.shape[1] + TOKENS + 2)
            dec.generate(prompt, 3)
            if fields.get("enabled", True):
                dec.experts, _ = configured_decoder(resolve(_config(**fields)), loaded,
                                                    max_len=prompt.shape[1] + TOKENS + 2)
            timer.cpu.clear()
            stamps.clear()
            passes[0] = 0
            dec.generate(prompt, TOKENS)
            timer.on = False
            steady = passes[0] - STEADY
            out[name] = {k: v / steady * 1e3 for k, v in timer.cpu.items()}
            wall, cpu = np.diff(np.asarray(stamps), axis=0).mean(axis=0) * 1e3
            out[name].update({"pass to pass, wall": wall, "pass to pass, host-thread CPU": cpu})
    finally:
        stepped.SteppedDecoder.forward_next = forward
        expert_cache.ExpertCache.run_layer = decide
        timer.undo()
    return out


def recorded_calls(loaded, prompt) -> list:
    """The cache calls of one 100% cold generation, layer by layer (each pass once)."""
    calls, cls = [], expert_cache.ExpertCache
    begin, run_layer, end = cls.begin_pass, cls.run_layer, cls.end_pass
    cls.begin_pass = lambda self, *a: (calls.append(("begin", a)), begin(self, *a))[1]
    cls.run_layer = lambda self, gate: (calls.append(("layer", gate)), run_layer(self, gate))[1]
    cls.end_pass = lambda self: (calls.append(("end", ())), end(self))[1]
    try:
        experts, dec = configured_decoder(
            resolve(_config(capacity_frac=1.0, speculate=False)), loaded,
            max_len=prompt.shape[1] + TOKENS + 2)
        dec.generate(prompt, TOKENS)
    finally:
        cls.begin_pass, cls.run_layer, cls.end_pass = begin, run_layer, end
    return calls


class _Sink:
    def load(self, key, slot, prefetch):
        pass


def replayed_us_per_layer(loaded, calls, repeats: int = 5) -> float:
    """Part 3: the calls fed to a fresh cache, best of `repeats`, µs a layer decision."""
    from moejax.serving.build import build_cached_experts

    best = float("inf")
    layers = sum(kind == "layer" for kind, _ in calls)
    for _ in range(repeats):
        cache = build_cached_experts(resolve(_config(capacity_frac=1.0)), loaded).cache_unsynced
        cache.sink = _Sink()
        start = time.perf_counter()
        for kind, arg in calls:
            if kind == "begin":
                cache.begin_pass(*arg)
            elif kind == "end":
                cache.end_pass()
            else:
                for _ in cache.run_layer(arg):
                    pass
        best = min(best, time.perf_counter() - start)
    return best / layers * 1e6


def _spin_matmul(stop):
    a = np.random.default_rng(0).random((300, 300))
    while not stop.is_set():
        a @ a


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12,
                        help="parts 1, 4, 5 and 6's alternated rounds")
    parser.add_argument("--parts", default="123456", help="which parts to run, e.g. 14")
    parser.add_argument("--model", choices=("fresh", "once"), default="fresh",
                        help="parts 1, 4, 5 and 6: a model loaded for every run, as the CLI's "
                        "(default), or one for the whole benchmark")
    args = parser.parse_args()
    if not args.parts or set(args.parts) - set("123456"):
        parser.error(f"--parts={args.parts!r}: the digits of the parts to run, 1 to 6")
    parts = {int(p) for p in args.parts}
    config = base_config()
    loaded = load_model(resolve(config).model)
    prompt = np.asarray(requests_of(config, loaded)[0].ids, np.int32)[None]

    if 1 in parts:
        ms = alternated(loaded, prompt, args.rounds, fresh=args.model == "fresh")
        print(f"1. decode, {TOKENS} tokens, {args.rounds} alternated rounds in one process: "
              "ms, median [25th, 75th percentile] over the rounds")
        _print_rounds(ms)

    if 2 in parts:
        pieces = host_cpu_by_piece(loaded, prompt)
        print(f"2. a steady decode pass (passes {STEADY + 1}-{TOKENS}), ms: the host thread's "
              "wall and CPU time, and its CPU by piece:")
        for label in PIECES:
            print(f"   {label:36s} " + "  ".join(f"{name} {v.get(label, 0.0):6.3f}"
                                                 for name, v in pieces.items()))

    if 3 in parts:
        calls = recorded_calls(loaded, prompt)
        alone = replayed_us_per_layer(loaded, calls)
        spawn = multiprocessing.get_context("spawn")  # (no fork of a process running JAX)
        stop = spawn.Event()
        spinner = spawn.Process(target=_spin_matmul, args=(stop,), daemon=True)
        spinner.start()
        try:
            time.sleep(2.0)  # (the spawned interpreter's start)
            beside = replayed_us_per_layer(loaded, calls)
        finally:
            stop.set()
            spinner.join()
        print(f"3. the same decisions replayed without the model (100% from cold, "
              f"{sum(k == 'layer' for k, _ in calls)} layer decisions): {alone:.1f} µs a layer "
              f"alone, {beside:.1f} beside a numpy matmul in another process")

    for part, (settings, what, baselines) in ALTERNATED_PARTS.items():
        if part in parts:
            ms = alternated(loaded, prompt, args.rounds, settings, fresh=args.model == "fresh")
            print(f"{part}. {what}, {args.rounds} alternated rounds: ms, median [25th, 75th "
                  "percentile]")
            _print_rounds(ms, baselines)

def _print_rounds(ms: dict[str, np.ndarray], baselines: dict[str, str] | None = None) -> None:
    """Parts 1, 4, 5 and 6: each setting's ms and each cached one's ratio by round to resident
    (or to the setting `baselines` names for it)."""
    baselines = baselines or {}
    for i, what in enumerate(("a token", "a pass, passes 1-15", f"a pass, passes {STEADY + 1}-"
                              f"{TOKENS - 1}")):
        print(f"   {what}: " + "  ".join(
            f"{name} {np.median(v[:, i]):.3f} [{np.percentile(v[:, i], 25):.3f}, "
            f"{np.percentile(v[:, i], 75):.3f}]" for name, v in ms.items()))
        for name, v in ms.items():
            base = baselines.get(name, "resident")
            if name != base:
                ratio = v[:, i] / ms[base][:, i]
                print(f"      {name} / {base} by round {np.median(ratio):.3f} "
                      f"[{np.percentile(ratio, 25):.3f}, {np.percentile(ratio, 75):.3f}]")


if __name__ == "__main__":
    main()
