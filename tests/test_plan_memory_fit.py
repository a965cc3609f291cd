"""The planner's memory fit (`moejax/plan/memory_fit.py`): the KV cache against the arrays the
runtime allocates, the dense bytes against the decoder's abstract shapes, OLMoE-1B-7B worked by
hand, a budget that does not fit, and the fit's monotonicity as a property."""

from __future__ import annotations

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.cache import precision_bytes_of
from moejax.families import FAMILIES, preset
from moejax.model_config import dtype_bytes
from moejax.models.attention import KVCache
from moejax.models.sizes import abstract_dense_param_count
from moejax.plan import GB, dense_bytes, fit, kv_cache_bytes
from tests.fuzzing import examples

OLMOE = preset("olmoe", "olmoe-1b-7b")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_kv_cache_is_what_the_runtime_allocates(family):
    cfg = preset(family, "tiny")
    context, batch = 37, 2
    allocated = sum(sum(a.nbytes for a in KVCache.zeros(cfg, batch, context))
                    for _ in range(cfg.num_layers))
    assert kv_cache_bytes(cfg, context, batch) == allocated
    # (and no more memory than the arrays: jax allocates them at their nbytes)
    assert all(isinstance(a, jax.Array) for a in KVCache.zeros(cfg, 1, 1))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_dense_bytes_are_the_decoders_own_shapes(family):
    cfg = preset(family, "tiny")
    assert dense_bytes(cfg) == abstract_dense_param_count(cfg) * dtype_bytes(cfg.dtype)


def test_olmoe_on_a_4_gb_budget_worked_by_hand():
    """OLMoE-1B-7B in bfloat16: 16 layers of 16 KV heads of 128 dims; an expert is
    3 x 2048 x 1024 parameters, 12,582,912 bytes; 64 experts x 16 MoE layers."""
    f = fit(OLMOE, 4.0, context=4096)
    kv = 16 * 2 * 16 * 128 * 2 * 4096  # layers x (k, v) x heads x dims x bytes x positions
    assert f.kv_bytes == kv == 536_870_912
    dense = abstract_dense_param_count(OLMOE) * 2
    assert f.dense_bytes == dense
    assert f.expert_bytes == 3 * 2048 * 1024 * 2
    assert f.slots == (4_000_000_000 - dense - kv) // 12_582_912 == 199
    assert f.fits and f.shortfall_bytes == 0 and f.total_experts == 1024
    assert "199 native expert slots of 12.58 MB (19.4% of the 1,024 routed experts" in f.line()
    # At int4 (packed, with its scales: `capacity.precision_bytes_of`) the same free bytes.
    int4 = fit(OLMOE, 4.0, context=4096, precision="int4")
    assert int4.expert_bytes == precision_bytes_of(OLMOE)["int4"] < f.expert_bytes / 3
    assert int4.slots == (4_000_000_000 - dense - kv) // int4.expert_bytes == 709


def test_a_budget_below_the_dense_weights_does_not_fit_and_says_by_how_much():
    f = fit(OLMOE, 1.0, context=4096)
    need = f.dense_bytes + f.kv_bytes + 8 * f.expert_bytes
    assert not f.fits and f.slots == 0 and f.free_bytes < 0
    assert f.shortfall_bytes == need - 1_000_000_000
    assert f"does not fit; {f.shortfall_bytes / GB:.2f} GB short of 8 native" in f.line()
    assert f.to_dict()["fits"] is False


def test_every_expert_is_the_most_a_budget_holds():
    f = fit(OLMOE, 80.0, context=4096)
    assert f.slots == 1024 and f.share_of_experts == 1.0


@pytest.mark.parametrize("args,message", [
    (dict(device_gb=0.0, context=1), "device_gb=0.0 must be > 0"),
    (dict(device_gb=1.0, context=0), "context=0 and batch=1 must be >= 1"),
    (dict(device_gb=1.0, context=1, precision="int3"), "precision='int3' is not one of"),
])
def test_bad_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        fit(OLMOE, **args)


@settings(max_examples=examples(200))
@given(gb=st.floats(0.5, 40.0), more=st.floats(0.0, 10.0), context=st.integers(1, 32_768),
       longer=st.integers(0, 32_768), precision=st.sampled_from(["native", "int8", "int4",
                                                                  "int2"]))
def test_more_memory_never_fewer_slots_and_a_longer_context_never_more(gb, more, context,
                                                                        longer, precision):
    f = fit(OLMOE, gb, context, precision)
    assert fit(OLMOE, gb + more, context, precision).slots >= f.slots
    assert fit(OLMOE, gb, context + longer, precision).slots <= f.slots
    # Whole experts within what is free; one more would not be (unless every one is there).
    assert f.slots * f.expert_bytes <= max(f.free_bytes, 0)
    assert f.slots == f.total_experts or (f.slots + 1) * f.expert_bytes > f.free_bytes


def test_fewer_slots_than_top_k_do_not_fit():
    """Room for 4 of OLMoE's top-8 experts: a decode step cannot be served."""
    base = fit(OLMOE, 4.0, context=128)
    budget = (base.dense_bytes + base.kv_bytes + 4 * base.expert_bytes) / GB
    f = fit(OLMOE, budget, context=128)
    assert f.slots == 4 and not f.fits
    assert f.shortfall_bytes == 4 * f.expert_bytes


def test_a_budget_of_the_expert_slots_counts_the_rest_beside_it():
    """`budget_of="experts"` (the plan job's default): the whole budget is for slots, and the
    dense weights and the KV cache are what the device holds besides. OLMoE-1B-7B at width 32:
    an expert is 3 x 32 x 32 bfloat16 parameters, 6,144 bytes."""
    cfg = preset("olmoe", "olmoe-1b-7b", 32)
    f = fit(cfg, 0.0015, context=4096, budget_of="experts")
    assert f.expert_bytes == 3 * 32 * 32 * 2 == 6144
    assert f.free_bytes == 1_500_000 and f.slots == 1_500_000 // 6144 == 244
    assert f.device_bytes == f.dense_bytes + f.kv_bytes + 244 * 6144
    assert f.line().startswith("1.50 MB for expert slots: 244 native slots of 6.1 kB (23.8% of "
                               "the 1,024 routed experts); beside them dense")
    # The same budget read as the whole device holds nothing: the dense weights alone are more.
    assert not fit(cfg, 0.0015, context=4096).fits and f.dense_bytes > 1_500_000
    short = fit(cfg, 0.00004, context=4096, budget_of="experts")  # 40 kB: 6 slots of 8
    assert not short.fits and short.slots == 6
    assert short.shortfall_bytes == 8 * 6144 - 40_000
    assert short.line().startswith("40.0 kB for expert slots: does not fit; 9.2 kB short of 8")


def test_a_budget_of_something_else_is_named():
    with pytest.raises(ValueError, match="budget_of='gpu' is not one of"):
        fit(OLMOE, 1.0, context=1, budget_of="gpu")
