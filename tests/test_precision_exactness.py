"""DESIGN.md invariant 1 at a quantized precision, live: with every fetch at precision P
(standard routing, plain fetch) the cached model's logits equal the resident model's at P, at
every capacity and under every eviction and prefetch policy — real packed experts in host
memory, real slot loads moving the packed bytes, dequantization inside the experts step.
"""

from __future__ import annotations

import numpy as np
import pytest

from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import in_memory
from moejax.models.stepped import ResidentExperts, SteppedDecoder
from moejax.policies import names
from moejax.quant.weights import QuantizedWeights
from moejax.serving.build import build_cached_experts
from moejax.testing import random_model

EVICTIONS = names("eviction", live=True)
PREFETCHES = names("prefetch", live=True)
MAX_LEN, NEW = 40, 5


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=5)
    return in_memory(cfg, model, gate_up, down)


_reference: dict = {}


def _resident(loaded, precision, prompt_len, seed):
    key = (precision, prompt_len, seed)
    if key not in _reference:
        prompt = np.random.default_rng(seed).integers(0, loaded.cfg.vocab_size, (1, prompt_len))
        experts = ResidentExperts.from_host(*loaded.experts_at(precision))
        dec = SteppedDecoder(loaded.model, experts, max_len=MAX_LEN, lookahead=2)
        _reference[key] = (prompt, dec.generate(prompt, NEW, keep_logits=True))
    return _reference[key]


def _cached(loaded, prompt, precision, slots, eviction, prefetch, miss="fetch"):
    c = base_config()
    c.cache.slots, c.cache.precision = slots, precision
    c.policies.eviction, c.policies.prefetch, c.policies.miss = eviction, prefetch, miss
    source = build_cached_experts(resolve(c), loaded)
    cache = source.cache

    def after_pass(_tokens):
        cache.check_invariants()

    dec = SteppedDecoder(loaded.model, source, max_len=MAX_LEN, lookahead=2,
                         pass_observers=(after_pass,))
    out = dec.generate(prompt, NEW, keep_logits=True)
    cache.finish()
    return out, source


# Every live eviction at int8 and at int4; the prefetcher, the capacity and the prompt take
# turns, so every prefetcher and capacity meets both precisions.
CASES = [(precision, eviction, PREFETCHES[(i + j) % len(PREFETCHES)], (4, 7, 64)[(i + 2 * j) % 3],
          (5, 23)[(i + j) % 2], i % 2)
         for j, precision in enumerate(("int8", "int4")) for i, eviction in enumerate(EVICTIONS)]


@pytest.mark.slow
@pytest.mark.parametrize("precision,eviction,prefetch,slots,prompt_len,seed", CASES)
def test_cached_equals_resident_at_the_same_precision(tiny, precision, eviction, prefetch,
                                                      slots, prompt_len, seed):
    prompt, ref = _resident(tiny, precision, prompt_len, seed)
    out, source = _cached(tiny, prompt, precision, slots, eviction, prefetch)
    np.testing.assert_array_equal(out.prefill_logits, ref.prefill_logits)
    assert out.generated_ids == ref.generated_ids
    assert len(out.step_logits) == len(ref.step_logits) == NEW - 1
    for a, b in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_cases_cover_every_live_eviction_and_prefetcher_at_both_precisions():
    for precision in ("int8", "int4"):
        assert {c[1] for c in CASES if c[0] == precision} == set(EVICTIONS)
        assert {c[2] for c in CASES if c[0] == precision} == set(PREFETCHES)


def test_decode_at_int4_is_bit_exact_and_moves_packed_bytes(tiny):
    prompt, ref = _resident(tiny, "int4", 5, 0)
    out, source = _cached(tiny, prompt, "int4", 64, "lru", "none")
    for a, b in zip(out.step_logits, ref.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    # The device pool holds packed values: what a load moves is the packed expert.
    pool = source.pool.pools[0]
    assert isinstance(pool.gate_up, QuantizedWeights) and pool.gate_up.bits == 4
    per_expert = (pool.gate_up.nbytes + pool.down.nbytes) // pool.num_slots
    bytes_int4 = tiny.precision_bytes()["int4"]
    assert per_expert == bytes_int4 < tiny.cfg.expert_bytes * 0.35
    total = source.cache.metrics.totals()
    assert total["h2d_bytes"] == pool.loads * bytes_int4 > 0


def test_quantized_models_differ_from_native_by_their_error(tiny):
    """Each precision is really applied, in the right order: the resident model's logits move
    away from native as the precision drops (on this random model a small change of the hidden
    state can flip a later layer's routing, so the gaps are larger than the weight errors)."""
    _, native = _resident(tiny, "native", 23, 0)
    errors = {}
    for precision in ("int8", "int4", "int2"):
        _, ref = _resident(tiny, precision, 23, 0)
        diff = np.abs(ref.prefill_logits - native.prefill_logits).mean()
        errors[precision] = diff / np.abs(native.prefill_logits).mean()
    assert 0 < errors["int8"] < errors["int4"] < errors["int2"]
    assert errors["int8"] < errors["int2"] / 3, errors


def test_fetch_priority_runs_live_at_several_precisions(tiny):
    prompt, _ = _resident(tiny, "int8", 23, 1)
    c = base_config()
    c.cache.capacity_frac = 0.5
    c.policies.eviction, c.policies.prefetch = "lhu", "none"
    c.policies.miss = 'fetch_priority(levels="int8:int4:int2", percentile=60)'
    source = build_cached_experts(resolve(c), tiny)
    dec = SteppedDecoder(tiny.model, source, max_len=MAX_LEN, lookahead=2,
                         pass_observers=(lambda _t: source.cache.check_invariants(),))
    out = dec.generate(prompt, NEW, keep_logits=True)
    total = source.cache.metrics.totals()
    used = {p for p, n in total["requests_by_precision"].items() if n}
    assert len(used) > 1, total["requests_by_precision"]
    assert np.isfinite(np.concatenate(out.step_logits)).all()
    assert len(source.pool.pools) == 3
