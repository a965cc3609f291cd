"""A complete cache's decisions taken late (`CachedExperts`: `_can_defer`, `end_pass`,
`sync`): every expert resident and landed, standard routing, fetch, one pool. A pass runs on a
fixed full slot map; its decisions (`ExpertCache.begin_pass`, `run_layer` per layer,
`end_pass`) are taken after it — on the virtual clock one pass late, while the next pass runs
(pipelined). Whatever reads the cache (`CachedExperts.cache`, `jobs.common.settle` /
`report_cache`, the end of `SteppedDecoder.generate`) sees them all taken, and every counter
and virtual time equals deciding layer by layer, at every point it can be read.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moejax.families import preset
from moejax.jobs.cache_report import report_cache, settle
from moejax.jobs.common import cache_of
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import in_memory
from moejax.models.stepped import SteppedDecoder
from moejax.policies import names
from moejax.serving.build import build_cached_experts
from moejax.testing import random_model

EVICTIONS = names("eviction", live=True)
PREFETCHES = ["none", "score_percentile(p=80)", "topk(overfetch=1.5, lookahead=2)"]
MAX_LEN = 40
# defer_complete, pipeline_complete
MODES = {"inline": (False, False), "per_pass": (True, False), "pipelined": (True, True)}


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=11)
    return cfg, model, in_memory(cfg, model, gate_up, down)


def _decoder(tiny, mode, eviction="least_stale", prefetch="score_percentile(p=80)",
             clock="virtual", capacity=1.0, warm="all"):
    cfg, model, loaded = tiny
    c = base_config()
    c.clock.kind = clock
    c.cache.capacity_frac, c.cache.warm_start = capacity, warm
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    source = build_cached_experts(resolve(c), loaded)
    source.defer_complete, source.pipeline_complete = MODES[mode]
    return source, SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2)


def _state(source) -> dict:
    """What a reader sees of the cache, read through the runtime (which settles it)."""
    cache = source.cache
    return {"metrics": cache.metrics.to_dict(), "now": cache.clock.now(),
            "pass_id": cache.pass_id, "residency": dict(cache.residency)}


def _prompt(cfg, n, seed=0):
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (1, n))


@pytest.mark.parametrize("mode", ["per_pass", "pipelined"])
def test_generations_decide_late_with_the_numbers_of_deciding_layer_by_layer(tiny, mode):
    """Two requests on one source (prefill and decode passes): tokens, logits, counters,
    pass timings and virtual times equal the layer-by-layer run's; every pass was deferred,
    and `generate` leaves nothing pending (its wall time holds every decision)."""
    cfg = tiny[0]
    runs = []
    for m in (mode, "inline"):
        source, dec = _decoder(tiny, m)
        outs = [dec.generate(_prompt(cfg, n, n), 5, keep_logits=True) for n in (5, 11)]
        assert source.pending_passes == 0
        runs.append((outs, source))
    (outs, late), (refs, inline) = runs
    for a, b in zip(outs, refs, strict=True):
        assert a.generated_ids == b.generated_ids
        np.testing.assert_array_equal(a.prefill_logits, b.prefill_logits)
        for x, y in zip(a.step_logits, b.step_logits, strict=True):
            np.testing.assert_array_equal(x, y)
    assert late.deferred_passes == 10 and inline.deferred_passes == 0
    assert _state(late) == _state(inline)
    late.cache.finish(), inline.cache.finish()
    assert late.cache.metrics.to_dict() == inline.cache.metrics.to_dict()
    assert late.cache.metrics.totals()["misses"] == 0


def test_pipelined_passes_wait_one_pass_and_are_taken_on_read(tiny):
    """On the virtual clock a complete pass's decisions wait until the next pass ran (at most
    one pass pending); reading the cache through the runtime takes them."""
    cfg = tiny[0]
    source, dec = _decoder(tiny, "pipelined")
    dec.reset()
    dec.forward(_prompt(cfg, 5))
    assert source.pending_passes == 1 and source.cache_unsynced.pass_id == 0  # begun, not ended
    assert source.cache_unsynced.metrics.passes == []
    for t in range(3):
        dec.forward(np.asarray([[t]]))
        assert source.pending_passes == 1
    assert len(source.cache_unsynced.metrics.passes) == 3
    assert len(source.cache.metrics.passes) == 4 and source.pending_passes == 0
    assert source.deferred_passes == 4


def test_the_jobs_settle_a_cache_they_took_before_the_passes(tiny, tmp_path):
    """The quality job takes its cache (`cache_of`) before teacher-forcing through
    `forward`; `report_cache` and `settle` take what is pending before reading."""
    cfg = tiny[0]
    results = []
    for mode in ("pipelined", "inline"):
        source, dec = _decoder(tiny, mode)
        cache = cache_of(source)
        dec.reset()
        dec.forward(_prompt(cfg, 7))
        dec.forward(np.asarray([[3]]))
        assert bool(source.pending_passes) == (mode == "pipelined")
        assert settle(cache) is cache and source.pending_passes == 0
        dec.forward(np.asarray([[4]]))
        c = base_config()
        results.append(report_cache(c, cache, str(tmp_path)))
        assert source.pending_passes == 0
    assert results[0] == results[1]


def test_the_wall_clock_decides_each_pass_at_its_end(tiny):
    """A wall clock would time the passes at their decisions: there a pass's decisions are
    taken at its own end (deferred, not pipelined)."""
    cfg = tiny[0]
    source, dec = _decoder(tiny, "pipelined", clock="wall")
    dec.reset()
    for tokens in (_prompt(cfg, 5), np.asarray([[1]]), np.asarray([[2]])):
        dec.forward(tokens)
        assert source.pending_passes == 0
    assert source.deferred_passes == 3
    assert len(source.cache_unsynced.metrics.passes) == 3


def test_a_cache_that_is_not_complete_decides_layer_by_layer(tiny):
    cfg = tiny[0]
    source, dec = _decoder(tiny, "pipelined", capacity=0.5, warm="none")
    dec.generate(_prompt(cfg, 5), 4)
    assert source.deferred_passes == 0 and source.pending_passes == 0


def test_turning_deferral_off_takes_the_pending_pass_first(tiny):
    cfg = tiny[0]
    states = []
    for mode in ("pipelined", "inline"):
        source, dec = _decoder(tiny, mode)
        dec.reset()
        dec.forward(_prompt(cfg, 5))
        dec.forward(np.asarray([[1]]))
        source.defer_complete = False
        dec.forward(np.asarray([[2]]))  # decided layer by layer, after the pending pass
        assert source.pending_passes == 0
        states.append(_state(source))
    assert states[0] == states[1]


# One step of a run: a prefill of n tokens from position 0, a decode token, a whole greedy
# generation, or a read of the cache.
_OPS = st.one_of(st.tuples(st.just("prefill"), st.integers(1, 9)),
                 st.tuples(st.just("decode"), st.integers(0, 255)),
                 st.tuples(st.just("generate"), st.integers(1, 4)),
                 st.tuples(st.just("read"), st.just(0)))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(eviction=st.sampled_from(EVICTIONS), prefetch=st.sampled_from(PREFETCHES),
       mode=st.sampled_from(["per_pass", "pipelined"]),
       ops=st.lists(_OPS, min_size=1, max_size=10))
def test_late_decisions_read_anywhere_equal_layer_by_layer(tiny, eviction, prefetch, mode,
                                                            ops):
    """Any sequence of passes and reads: at every read (and at the end) the cache's metrics,
    clock, pass count and residency equal the layer-by-layer run's, and the logits of every
    pass are the same."""
    cfg = tiny[0]
    (late, dec_late), (inline, dec_inline) = (_decoder(tiny, m, eviction, prefetch)
                                              for m in (mode, "inline"))
    cfg_vocab = cfg.vocab_size
    for op, n in ops:
        if op == "read":
            assert _state(late) == _state(inline)
            continue
        outs = []
        for dec in (dec_late, dec_inline):
            if op == "generate":
                outs.append(dec.generate(_prompt(cfg, 3, n), n, keep_logits=True).step_logits)
                continue
            if op == "prefill" or dec.pos + 1 > MAX_LEN:
                dec.reset()
                tokens = _prompt(cfg, n if op == "prefill" else 1, n)
            else:
                tokens = np.asarray([[n % cfg_vocab]])
            outs.append([np.asarray(dec.forward(tokens))])
        assert len(outs[0]) == len(outs[1])
        for x, y in zip(*outs):
            np.testing.assert_array_equal(x, y)
        assert late.pending_passes <= (1 if mode == "pipelined" else 0)
    assert _state(late) == _state(inline)
    assert late.deferred_passes == inline.cache.pass_id + 1
