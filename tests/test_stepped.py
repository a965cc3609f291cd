"""Layer-stepped execution: one compilation per step shape, KV-cache decode equals a full
re-run, gate outputs are consistent, and the two grouped-matmul paths agree end to end."""

from __future__ import annotations

import numpy as np
import pytest

from moejax.families import preset
from moejax.models import stepped
from moejax.testing import random_model, resident_decoder


@pytest.fixture(scope="module", params=["olmoe", "qwen2_moe"])
def tiny(request):
    cfg = preset(request.param, "tiny")
    return cfg, *random_model(cfg, seed=1)


def test_kv_cache_decode_matches_full_recompute(tiny):
    cfg, model, gate_up, down = tiny
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 12))
    full = resident_decoder(model, gate_up, down, max_len=12).forward(tokens)
    inc = resident_decoder(model, gate_up, down, max_len=12)
    inc.forward(tokens[:, :8])
    for t in range(8, 12):
        step = inc.forward(tokens[:, t:t + 1])
        np.testing.assert_allclose(np.asarray(step[0, 0]), np.asarray(full[0, t]), atol=2e-5)


def test_every_layer_shares_one_compilation(tiny):
    cfg, model, gate_up, down = tiny
    before = stepped.attention_router_step._cache_size()
    dec = resident_decoder(model, gate_up, down, max_len=40)
    dec.generate(np.zeros((1, 7), np.int32), 5)
    # One new compilation per (prefill, decode) shape, however many layers and steps.
    assert stepped.attention_router_step._cache_size() - before <= 2
    assert cfg.num_moe_layers >= 2


def test_gate_outputs_are_consistent(tiny):
    cfg, model, gate_up, down = tiny
    seen = []
    dec = resident_decoder(model, gate_up, down, max_len=16, lookahead=2,
                           gate_observers=(seen.append,))
    dec.forward(np.arange(6)[None])
    assert [g.layer for g in seen] == list(cfg.moe_layers)
    for g in seen:
        ids, w, probs = np.asarray(g.ids), np.asarray(g.weights), np.asarray(g.probs)
        assert ids.shape == (6, cfg.top_k) and probs.shape == (6, cfg.num_experts)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
        # Router-rank order: the chosen experts' probabilities are the top-k, descending.
        chosen = np.take_along_axis(probs, ids, -1)
        assert np.all(np.diff(chosen, axis=-1) <= 1e-7)
        np.testing.assert_allclose(np.sort(probs, -1)[:, ::-1][:, :cfg.top_k], chosen, atol=1e-6)
        if not cfg.norm_topk_prob:
            np.testing.assert_allclose(w, chosen, atol=1e-6)
        later = [l for l in cfg.moe_layers if l > g.layer][:2]
        assert g.spec_layers == tuple(later)
        assert np.asarray(g.spec).shape == (2, 6, cfg.num_experts)


def test_speculative_scores_equal_next_gate_on_this_hidden_state(tiny):
    """spec[0] of layer l is layer l+1's gate on l's post-attention residual, which we
    recompute from the model's modules directly."""
    import jax
    import jax.numpy as jnp

    cfg, model, gate_up, down = tiny
    seen = []
    dec = resident_decoder(model, gate_up, down, max_len=16, gate_observers=(seen.append,))
    tokens = np.arange(5)[None]
    dec.forward(tokens)
    first, nxt = cfg.moe_layers[0], cfg.moe_layers[1]
    # Recompute layer `first`'s post-attention residual.
    x = model.embed(jnp.asarray(tokens))
    from moejax.models.attention import KVCache
    for l in range(first):
        blk = model.layers[l]
        h, h_norm, _ = blk.attend(x, KVCache.zeros(cfg, 1, 16), jnp.int32(0))
        x = h + blk.mlp(h_norm)
    h, _, _ = model.layers[first].attend(x, KVCache.zeros(cfg, 1, 16), jnp.int32(0))
    blk = model.layers[nxt]
    expect = jax.nn.softmax(blk.router(blk.post_norm(h).reshape(-1, cfg.hidden_size)), -1)
    np.testing.assert_allclose(np.asarray(seen[0].spec[0]), np.asarray(expect), atol=1e-5)


def test_tiled_and_ragged_dot_models_agree(tiny):
    cfg, model, gate_up, down = tiny
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, 9))
    a = resident_decoder(model, gate_up, down, max_len=9, batch=2).forward(tokens)
    b = resident_decoder(model, gate_up, down, max_len=9, batch=2,
                         gmm_impl="ragged_dot").forward(tokens)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_position_overflow_is_a_clear_error(tiny):
    cfg, model, gate_up, down = tiny
    dec = resident_decoder(model, gate_up, down, max_len=4)
    with pytest.raises(ValueError, match="exceeds max_len=4"):
        dec.forward(np.zeros((1, 5), np.int32))


@pytest.mark.parametrize("gate_path", stepped.GATE_PATHS)
def test_a_finished_decoder_and_its_kv_caches_are_freed(tiny, gate_path):
    """Nothing process-wide (the interned static arguments, jit's caches of the compiled
    steps, the io_callback hook) keeps a decoder alive: the warm-up decoder of a job, or one
    per prompt when recording traces, must not pin its KV caches until the process exits."""
    import gc
    import weakref

    cfg, model, gate_up, down = tiny
    dec = resident_decoder(model, gate_up, down, max_len=16, gate_path=gate_path)
    dec.generate(np.zeros((1, 5), np.int32), 3)
    alive, caches = weakref.ref(dec), [weakref.ref(c.k) for c in dec.caches]
    del dec
    gc.collect()
    assert alive() is None
    assert all(ref() is None for ref in caches)
