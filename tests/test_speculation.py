"""Speculative passes (`CachedExperts._may_speculate`, `_speculative_wave`, `_verify`): a
pass runs every layer's experts step on the experts of that layer resident when it began, with
no host round trip per layer, and its decisions are taken after it, each layer checked; at
the first layer whose decision would read other slots, the decoder re-runs the pass from that
layer's experts step, deciding layer by layer. Tokens, logits, every counter and virtual time
equal deciding layer by layer (speculation off), and the tokens equal the resident model's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moejax.jobs.schema import base_config
from moejax.models import stepped
from moejax.models.stepped import SteppedDecoder
from moejax.policies import names
from moejax.serving.build import build_cached_experts
from tests.tiny_reference import tiny_reference

MAX_LEN = 32
PREFETCHES = ["none", "score_percentile(p=80)", "topk(overfetch=1.5, lookahead=2)"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_reference(seed=5, prompt_seed=1, prompt_len=6, tokens=12, max_len=MAX_LEN)


def _run(tiny, speculate, capacity, eviction, prefetch, observe=False, clock="virtual",
         landed=None, mid_pass="adaptive", prepare=None, latency_s=None, warm_start="none"):
    cfg, model, loaded, prompt, _ = tiny
    c = base_config()
    c.clock.kind = clock
    c.cache.warm_start = warm_start
    if latency_s is not None:
        c.hardware.h2d_latency_s = latency_s
    c.cache.capacity_frac = capacity
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    source = build_cached_experts(c, loaded)
    source.speculate = speculate
    source.mid_pass_checks = mid_pass
    if landed is not None:  # every gate landed when asked, or none before the pass ends
        source.gate_landed = lambda gate: landed
    if prepare is not None:
        prepare(source)
    seen = []
    dec = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2,
                         gate_observers=(seen.append,) if observe else ())
    out = dec.generate(prompt, 12, keep_logits=True)
    cache = source.cache
    state = {"metrics": cache.metrics.to_dict(), "now": cache.clock.now(),
             "residency": dict(cache.residency)}
    return out, state, source, seen


def _same_generation(a, b):
    assert a.generated_ids == b.generated_ids
    np.testing.assert_array_equal(a.prefill_logits, b.prefill_logits)
    for x, y in zip(a.step_logits, b.step_logits, strict=True):
        np.testing.assert_array_equal(x, y)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
       eviction=st.sampled_from(names("eviction", live=True)),
       prefetch=st.sampled_from(PREFETCHES))
def test_speculation_gives_the_numbers_and_tokens_of_deciding_layer_by_layer(
        tiny, capacity, eviction, prefetch):
    spec_out, spec_state, source, _ = _run(tiny, True, capacity, eviction, prefetch)
    ref_out, ref_state, _, _ = _run(tiny, False, capacity, eviction, prefetch)
    _same_generation(spec_out, ref_out)
    _same_generation(spec_out, tiny[4])  # the resident model's
    assert spec_state == ref_state


@pytest.mark.parametrize("landed, mid_pass", [(True, "always"), (False, "always"),
                                            (True, "adaptive"), (True, "never")])
def test_checks_mid_pass_and_after_it_give_the_numbers_of_deciding_layer_by_layer(
        tiny, landed, mid_pass):
    """A speculative run checks a layer as soon as its router step is done (`_landed`), while
    later layers are dispatched, and stops the pass there on a failed check (`Rewind`), or at
    the end of the pass. Every way, forced here (every gate landed when checked, or none
    before the pass ends; mid-pass checks in every pass, in a pass after one whose residency
    changed or whose check failed, or in none), gives the numbers and tokens of deciding
    layer by layer."""
    for capacity, eviction, prefetch in [(1.0, "least_stale", "score_percentile(p=80)"),
                                         (0.5, "lru", "topk(overfetch=1.5, lookahead=2)")]:
        spec_out, spec_state, source, _ = _run(tiny, True, capacity, eviction, prefetch,
                                               landed=landed, mid_pass=mid_pass)
        ref_out, ref_state, _, _ = _run(tiny, False, capacity, eviction, prefetch)
        _same_generation(spec_out, ref_out)
        _same_generation(spec_out, tiny[4])
        assert spec_state == ref_state
        assert source.speculation_misses > 0
        # Mid-pass failures only when checked mid-pass.
        assert (source.rewinds > 0) == (landed and mid_pass != "never")
        eager = {"always": source.speculative_passes, "never": 0}.get(mid_pass)
        if eager is not None:
            assert source.eager_passes == eager


def test_adaptive_mid_pass_checks_follow_the_residency(tiny):
    """`mid_pass_checks="adaptive"`: a pass checks mid-pass after one whose residency changed or
    whose check failed, at the end otherwise. From cold at full capacity the first passes
    change the residency (misses, prefetches) and later ones mostly do not: both kinds."""
    seen = []  # per pass: the residency's change count and failed checks; speculative, eager

    def watch(source):
        begin = source.begin_pass

        def begin_pass(tokens, position):
            state = (sum(source.cache_unsynced.layer_changes.values()),
                     source.speculation_misses)
            counts = source.speculative_passes, source.eager_passes
            begin(tokens, position)
            seen.append((state, source.speculative_passes - counts[0],
                         source.eager_passes - counts[1]))

        source.begin_pass = begin_pass

    _, _, source, _ = _run(tiny, True, 1.0, "lru", "none", landed=True, prepare=watch)
    assert 0 < source.eager_passes < source.speculative_passes
    checked = 0
    for (before, _, _), (now, speculative, eager) in zip(seen, seen[1:]):
        if speculative:
            assert eager == (now != before)
            checked += 1
    assert checked == source.speculative_passes
    _, _, stays, _ = _run(tiny, True, 1.0, "lru", "none", landed=True, mid_pass="never")
    assert stays.rewinds == 0 < source.rewinds


def test_a_cold_full_cache_speculates_and_re_runs_on_a_miss(tiny):
    """Cold at full capacity: later passes speculate and most checks hold, and some fail (a
    miss) and re-run, so the property above covers both paths."""
    out, _, source, _ = _run(tiny, True, 1.0, "lru", "none")
    assert source.speculative_passes > source.speculation_misses > 0
    _same_generation(out, tiny[4])


def test_only_decode_passes_speculate(tiny):
    """A prefill layer asks for most of its experts: below a complete cache its checks would
    fail and the pass run twice. On a warm half-size cache the prefill decides layer by
    layer, and the decode passes after it speculate."""
    _, model, loaded, prompt, _ = tiny
    c = base_config()
    c.cache.capacity_frac, c.cache.warm_start = 0.5, "all"
    source = build_cached_experts(c, loaded)
    assert source.cache_unsynced.residency  # warm: the prefill finds experts resident
    dec = SteppedDecoder(model, source, max_len=MAX_LEN, lookahead=2)
    dec.generate(prompt, 1)  # the prefill alone
    assert source.speculative_passes == 0
    dec.generate(prompt, 6)
    assert source.speculative_passes > 0


def test_no_speculation_with_gate_observers(tiny):
    """An observer (a trace recorder) would see a re-run pass's gates twice."""
    _, _, source, seen = _run(tiny, True, 1.0, "lru", "none", observe=True)
    assert source.speculative_passes == 0
    cfg = tiny[0]
    assert len(seen) == len(cfg.moe_layers) * 12  # each pass's gates once


@pytest.mark.parametrize("scenario, speculate", [("cold", True), ("cold", False),
                                                ("link behind", True)])
def test_on_the_wall_clock_no_kept_step_read_an_expert_in_flight(tiny, monkeypatch, scenario,
                                                                 speculate):
    """The wall clock times a decision when it is taken, and emulates the link by making a
    step wait for its experts' transfers: deciding layer by layer sleeps until they land,
    then dispatches the step. A speculative step is dispatched before its layer is decided,
    so it may read only experts whose transfers had landed when it was dispatched; a layer
    whose step read one still in flight fails its check and runs again.

    Observed from outside the runtime — each transfer's landing as the cache books it (its
    sink), and the slots each experts step reads when dispatched — no step whose output was
    kept (the last of its pass and layer) read a slot before the transfer into it landed, and
    the tokens are the resident model's. "cold": 100% from cold at 3 ms a transfer, where
    speculative passes run and some of their checks fail. "link behind": every expert
    resident (a warm start), but as the first decode pass begins every slot's transfer is made
    to land 30 ms later (a link that far behind): the cache is not complete until then, every
    speculative step reads experts in flight, and their checks fail for it."""
    events = []  # ("load", slot, lands at) / ("step", pass, layer, dispatched at, slots read)
    where = {"pass": -1, "layer": None}
    clock = {}

    def prepare(source):
        cache = source.cache_unsynced
        clock["now"] = cache.clock.now
        book, waves, begin = source.load, source.experts_for, source.begin_pass

        def load(key, slot, prefetch):
            events.append(("load", slot, cache.slot_ready[slot]))
            book(key, slot, prefetch)

        def experts_for(gate):  # the layer whose steps the decoder dispatches next
            where["layer"] = gate.layer
            yield from waves(gate)

        def begin_pass(tokens, position):
            if scenario == "link behind" and where["pass"] == 1:
                lands = cache.clock.now() + 0.03
                for slot in cache.residency.values():
                    cache.slot_ready[slot] = lands
                    events.append(("load", slot, lands))
            begin(tokens, position)

        source.load, source.experts_for, source.begin_pass = load, experts_for, begin_pass

    forward, experts_step = SteppedDecoder.forward, stepped.experts_step

    def counted_forward(self, tokens):
        where["pass"] += 1
        return forward(self, tokens)

    def recorded_step(graphdef, state, residual, h_norm, ids, weights, gate_up, down, slot_of,
                      **kw):
        read = np.unique(np.asarray(slot_of)[np.asarray(ids)])
        events.append(("step", where["pass"], where["layer"], clock["now"](), read))
        return experts_step(graphdef, state, residual, h_norm, ids, weights, gate_up, down,
                            slot_of, **kw)

    monkeypatch.setattr(SteppedDecoder, "forward", counted_forward)
    monkeypatch.setattr(stepped, "experts_step", recorded_step)
    out, _, source, _ = _run(tiny, speculate, 1.0, "lru", "score_percentile(p=80)",
                             clock="wall", prepare=prepare, latency_s=0.003,
                             warm_start="all" if scenario == "link behind" else "none")
    _same_generation(out, tiny[4])
    kept, lands = {}, {}
    for i, e in enumerate(events):
        if e[0] == "step":
            kept[e[1], e[2]] = i  # a re-run's step replaces the one before
    assert len(kept) == 12 * len(tiny[0].moe_layers)  # each layer of each pass: a kept step
    for i, e in enumerate(events):
        if e[0] == "load":
            lands[e[1]] = e[2]
        elif kept[e[1], e[2]] == i:  # (a warm start's slots landed before the first token)
            late = {int(s): lands[s] - e[3] for s in e[4] if lands.get(s, 0.0) > e[3]}
            assert not late, f"pass {e[1]} layer {e[2]} read slots before they landed: {late}"
    if not speculate:
        assert source.speculative_passes == 0
    elif scenario == "cold":  # (how many checks fail for a transfer in flight is timing)
        assert source.speculative_passes > 0 and source.speculation_misses > 0
    else:
        assert source.speculation_in_flight > 0
