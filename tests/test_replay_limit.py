"""`benchmarks/replay_limit.py`'s bare kernels count the hits moejax's compiled replay counts in
the cases the benchmark pairs them with: the plain LRU and the strict per-layer LRU with only
the incoming expert protected, and the LRU with `temporal` prefetch on the immediate queue;
and the LRU with the virtual clock's booking ends at moejax's clock, to the bit, where no cost
model adds compute. The script checks this at its own sizes; here on random streams of any shape, down to a cache
of one request's worth (where the prefetch call runs out of victims), and on a real capture.
A random stream runs twice through one cache, so the temporal prefetcher's "previous pass"
crosses from one copy into the next, as in the benchmark's 16 copies."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from fuzzing import examples
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from moejax import bundled
from moejax.testing import random_scored_trace
from moejax.traces import load_traces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark():
    path = os.path.join(ROOT, "benchmarks", "replay_limit.py")
    spec = importlib.util.spec_from_file_location("replay_limit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RL = _benchmark()
# The bare kernels as Python (their `py_func`): compiled here, numba's disk cache beside the
# script would hold them under this module's name, which the script, run as `__main__`, cannot
# load back. The script compiles and checks them itself at its own sizes.
for _name in ("bare_lru", "bare_lru_per_layer", "bare_lru_temporal", "bare_lru_clock"):
    setattr(RL, _name, getattr(RL, _name).py_func)
PAIRED = [case for case in RL.CASES if case[:2] in RL.BARE_OF]


def _hits(traces, repeats: int, capacity: float, case) -> tuple[int, int]:
    """(moejax's hits and late hits, the bare kernel's hits) over `traces` `repeats` times."""
    _, totals, cache = RL.moejax_run(traces, repeats, capacity, case)
    keys, starts = RL.stream(traces, repeats)
    trace = traces[0]
    _, bare = RL.bare_run(RL.BARE_OF[case[:2]], keys, starts, len(trace.layers),
                          trace.num_experts, cache)
    return totals["hits"] + totals["late_hits"], bare


def test_every_bare_kernel_is_paired_with_a_case():
    assert {case[:2] for case in PAIRED} == set(RL.BARE_OF)


@settings(max_examples=examples(25))
@given(layers=st.integers(1, 5), experts=st.integers(2, 9), passes=st.integers(1, 10),
       seed=st.integers(0, 2 ** 32 - 1), data=st.data())
def test_the_bare_kernels_count_moejax_hits_on_random_streams(layers, experts, passes, seed,
                                                               data):
    top_k = data.draw(st.integers(1, experts), label="top_k")
    # At least a pass-layer's requests (the bare kernels serve no waves), fewer than every key
    # (a share below 1: the benchmark's `--capacities`).
    assume(top_k < layers * experts)
    slots = data.draw(st.integers(top_k, layers * experts - 1), label="slots")
    trace = random_scored_trace(np.random.default_rng(seed), layers, experts, top_k,
                                [1] * passes, 1000, scores=False, prefill_passes=0)
    capacity = (slots + 0.5) / (layers * experts)  # `moejax_cache` rounds it down to `slots`
    for case in PAIRED:
        if RL.BARE_OF[case[:2]] == "per_layer" and slots < layers:
            # A share of 0: moejax's strict quota still gives the layer's miss a slot (DESIGN,
            # lru_per_layer), a fixed-capacity per-layer LRU never holds it.
            continue
        ours, bare = _hits([trace], 2, capacity, case)
        assert ours == bare, (case, slots)


@settings(max_examples=examples(25))
@given(layers=st.integers(1, 5), experts=st.integers(2, 9), passes=st.integers(1, 10),
       seed=st.integers(0, 2 ** 32 - 1), data=st.data())
def test_the_bare_lru_with_the_clock_gives_moejax_hits_and_clock(layers, experts, passes,
                                                                 seed, data):
    """Without a cost model (a shape no preset has) moejax's clock is its transfers' and
    stalls' alone: `bare_lru_clock` ends at the same time, to the bit."""
    top_k = data.draw(st.integers(1, experts), label="top_k")
    assume(top_k < layers * experts)
    slots = data.draw(st.integers(top_k, layers * experts - 1), label="slots")
    trace = random_scored_trace(np.random.default_rng(seed), layers, experts, top_k,
                                [1] * passes, 1000, scores=False, prefill_passes=0)
    capacity = (slots + 0.5) / (layers * experts)
    _, totals, cache = RL.moejax_run([trace, trace], 1, capacity, RL.CASES[0])
    assert RL.CASES[0][:2] == RL.CLOCKED and cache.cost is None
    terms = RL.clock_terms(cache)
    assert terms is not None  # (one copy engine, idle at the start)
    keys, starts = RL.stream([trace], 2)
    _, hits, clock = RL.bare_clock_run(keys, starts, layers * experts, terms, cache)
    assert hits == totals["hits"] + totals["late_hits"]
    assert clock == cache.clock.t


@pytest.mark.parametrize("capacity", [0.05, 0.25])
@pytest.mark.parametrize("case", PAIRED, ids=lambda case: "/".join(case[:2]))
def test_the_bare_kernels_count_moejax_hits_on_a_capture(case, capacity):
    traces = load_traces(bundled.capture_path("olmoe_prose"))
    ours, bare = _hits(traces, 1, capacity, case)
    assert ours == bare
    assert ours > 0 or case[1] == "none"  # (temporal prefetch hits even at 5%)
