"""Speculative passes (`CachedExperts._may_speculate`, `_speculative_wave`, `_verify`): a
pass runs every layer's experts step on the experts of that layer resident when it began, with
no host round trip per layer, and its decisions are taken after it, each layer checked; at
the first layer whose decision would read other slots, the decoder re-runs the pass from that
layer's experts step, deciding layer by layer. On the CPU backend and the virtual clock a step
reads a non-resident expert from its host copy (`cache.speculate_from_host`), and only a layer
its decision splits into waves fails. Tokens, logits, every counter and virtual time equal
deciding layer by layer (speculation off), and the tokens equal the resident model's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
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
         landed=None, mid_pass="adaptive", prepare=None, latency_s=None, warm_start="none",
         from_host=True, **cache):
    cfg, model, loaded, prompt, _ = tiny
    c = base_config()
    c.clock.kind = clock
    c.cache.warm_start = warm_start
    c.cache.speculate_from_host = from_host
    for field, value in cache.items():
        c.cache[field] = value
    if latency_s is not None:
        c.hardware.h2d_latency_s = latency_s
    c.cache.capacity_frac = capacity
    c.policies.eviction, c.policies.prefetch = eviction, prefetch
    source = build_cached_experts(resolve(c), loaded)
    source.speculate = speculate
    source.read_host_copies = from_host  # (the job sets it from the config)
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
       prefetch=st.sampled_from(PREFETCHES), from_host=st.booleans())
def test_speculation_gives_the_numbers_and_tokens_of_deciding_layer_by_layer(
        tiny, capacity, eviction, prefetch, from_host):
    spec_out, spec_state, source, _ = _run(tiny, True, capacity, eviction, prefetch,
                                           from_host=from_host)
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
    layer by layer. Steps read slots only (no host copy), so misses fail checks."""
    for capacity, eviction, prefetch in [(1.0, "least_stale", "score_percentile(p=80)"),
                                         (0.5, "lru", "topk(overfetch=1.5, lookahead=2)")]:
        spec_out, spec_state, source, _ = _run(tiny, True, capacity, eviction, prefetch,
                                               landed=landed, mid_pass=mid_pass,
                                               from_host=False)
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
    change the residency (misses, prefetches) and later ones mostly do not: both kinds.
    (Steps read slots only: reading host copies, a residency change fails no check.)"""
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

    _, _, source, _ = _run(tiny, True, 1.0, "lru", "none", landed=True, prepare=watch,
                           from_host=False)
    assert 0 < source.eager_passes < source.speculative_passes
    checked = 0
    for (before, _, _), (now, speculative, eager) in zip(seen, seen[1:]):
        if speculative:
            assert eager == (now != before)
            checked += 1
    assert checked == source.speculative_passes
    _, _, stays, _ = _run(tiny, True, 1.0, "lru", "none", landed=True, mid_pass="never",
                          from_host=False)
    assert stays.rewinds == 0 < source.rewinds


def test_a_cold_full_cache_speculates_and_re_runs_on_a_miss(tiny):
    """Cold at full capacity, steps reading slots only: later passes speculate and most checks
    hold, and some fail (a miss) and re-run, so the property above covers both paths."""
    out, _, source, _ = _run(tiny, True, 1.0, "lru", "none", from_host=False)
    assert source.speculative_passes > source.speculation_misses > 0
    assert source.host_copy_reads == 0
    _same_generation(out, tiny[4])


@pytest.mark.parametrize("capacity, prefetch", [(1.0, "none"), (0.25, "score_percentile(p=80)")])
def test_reading_host_copies_no_miss_fails_a_check(tiny, capacity, prefetch):
    """Reading a non-resident expert's host copy, a speculative step computes what its
    layer's decision serves whatever that decision fetches, evicts or prefetches: from cold,
    at full capacity and at a quarter with evictions and prefetches, every decode pass
    speculates, no check fails, no pass checks mid-pass (no residency change can fail a
    check), steps read host copies, and every number is deciding layer by layer's."""
    decode_fetches = []

    def count_decode_fetches(source):  # demand loads the decode passes' decisions issue
        begin, load = source.begin_pass, source.load
        where = {"decode": False}

        def begin_pass(tokens, position):
            where["decode"] = position > 0
            begin(tokens, position)

        def counted(key, slot, prefetch):
            if where["decode"] and not prefetch:
                decode_fetches.append(key)
            load(key, slot, prefetch)

        source.begin_pass, source.load = begin_pass, counted

    out, state, source, _ = _run(tiny, True, capacity, "lru", prefetch, landed=True,
                                 prepare=count_decode_fetches)
    ref_out, ref_state, _, _ = _run(tiny, False, capacity, "lru", prefetch)
    _same_generation(out, ref_out)
    _same_generation(out, tiny[4])
    assert state == ref_state
    assert source.speculative_passes == 11  # every decode pass
    assert source.speculation_misses == source.eager_passes == 0
    # Decode passes fetched (and, with prefetches, admitted experts a step had read from its
    # host copy before their layer was decided: a read per expert, not per fetch).
    assert decode_fetches and source.host_copy_reads > 0


def test_host_copies_of_a_packed_precision_give_its_numbers(tiny):
    """A cache at int4 holds packed experts in its slots and its host tables alike: a step
    reading host copies dequantizes them as it does a slot's, so tokens, logits and every
    number are deciding layer by layer's at int4."""
    out, state, source, _ = _run(tiny, True, 0.5, "lru", "score_percentile(p=80)",
                                 precision="int4")
    ref_out, ref_state, _, _ = _run(tiny, False, 0.5, "lru", "score_percentile(p=80)",
                                    precision="int4")
    _same_generation(out, ref_out)
    assert state == ref_state
    assert source.host_copy_reads > 0 and source.speculation_misses == 0


def test_host_copies_switched_from_pass_to_pass(tiny):
    """`read_host_copies` turned on and off from one pass to the next on one runtime, whose
    slot maps are kept while a layer's residency does not change (at 100% from cold, most
    passes change none): tokens and logits are the resident model's, and every number is
    deciding layer by layer's."""
    def alternate(source):
        begin = source.begin_pass

        def begin_pass(tokens, position):
            source.read_host_copies = position % 2 == 0
            begin(tokens, position)

        source.begin_pass = begin_pass

    out, state, source, _ = _run(tiny, True, 1.0, "lru", "none", prepare=alternate)
    ref_out, ref_state, _, _ = _run(tiny, False, 1.0, "lru", "none")
    _same_generation(out, ref_out)
    _same_generation(out, tiny[4])
    assert state == ref_state
    assert source.host_copy_reads > 0 and source.speculation_misses > 0


def test_reading_host_copies_a_layer_split_into_waves_fails_its_check(tiny):
    """A decision that splits its layer into waves is not the one step that ran: that check
    fails and the layer runs again, decided, even when steps read host copies. (A decode
    layer's experts always fit one wave of a live cache — fewer slots than top-k are refused —
    so a wave is made to hold one expert here, in both runs.)"""
    def one_expert_waves(source):
        source.cache_unsynced.wave_slots = 1

    out, state, source, _ = _run(tiny, True, 1.0, "lru", "none", prepare=one_expert_waves)
    ref_out, ref_state, _, _ = _run(tiny, False, 1.0, "lru", "none", prepare=one_expert_waves)
    _same_generation(out, ref_out)
    _same_generation(out, tiny[4])
    assert state == ref_state
    assert source.speculation_misses > 0


@pytest.mark.parametrize("fields", [dict(clock="wall"), dict(load_path="copy_stream")])
def test_host_copies_are_read_only_where_a_step_may(tiny, fields):
    """Only on the virtual clock (the wall clock must see a step wait for its transfer), with
    slots loaded from the host tables a step would read (fused): elsewhere steps read slots
    only, and misses fail."""
    fields = dict(fields)  # (the parameter itself stays as given)
    clock = fields.pop("clock", "virtual")
    out, _, source, _ = _run(tiny, True, 1.0, "lru", "none", clock=clock, **fields)
    _same_generation(out, tiny[4])
    assert source.host_copy_reads == 0 < source.speculative_passes
    assert source.speculation_misses > 0


def test_only_decode_passes_speculate(tiny):
    """A prefill layer asks for most of its experts: below a complete cache its checks would
    fail and the pass run twice. On a warm half-size cache the prefill decides layer by
    layer, and the decode passes after it speculate."""
    _, model, loaded, prompt, _ = tiny
    c = base_config()
    c.cache.capacity_frac, c.cache.warm_start = 0.5, "all"
    source = build_cached_experts(resolve(c), loaded)
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

    forward, experts_step = SteppedDecoder.forward_next, stepped.experts_step

    def counted_forward(self, tokens):
        where["pass"] += 1
        return forward(self, tokens)

    def recorded_step(graphdef, state, residual, h_norm, ids, weights, gate_up, down, slot_of,
                      **kw):
        read = np.unique(np.asarray(slot_of)[np.asarray(ids)])
        events.append(("step", where["pass"], where["layer"], clock["now"](), read))
        return experts_step(graphdef, state, residual, h_norm, ids, weights, gate_up, down,
                            slot_of, **kw)

    monkeypatch.setattr(SteppedDecoder, "forward_next", counted_forward)
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
