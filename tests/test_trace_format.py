"""The moejax routing trace (moejax/traces/format.py) written by `TraceRecorder` from a live
`SteppedDecoder`: pass layout, agreement with the gate outputs the decoder really produced, the
save/load round trip, the generate job's `trace.npz`, and `load`'s errors on malformed files."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from moejax import jobs
from moejax.families import preset
from moejax.jobs.schema import base_config
from moejax.testing import random_model, resident_decoder
from moejax.traces.format import FORMAT, Trace, TraceError, load
from moejax.traces.recorder import TraceRecorder

PREFILL, DECODE = 7, 5


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("olmoe", "tiny")
    return cfg, *random_model(cfg, seed=3)


def _record(tiny, tokens: np.ndarray, decode_tokens: np.ndarray | None = None):
    """Runs a prefill of `tokens` [B, PREFILL] and DECODE single-token forwards (the columns of
    `decode_tokens` [B, DECODE]) with a recorder and a plain gate observer attached. Returns the
    trace and, per pass, the GateOutputs of every MoE layer."""
    cfg, model, gate_up, down = tiny
    b = tokens.shape[0]
    rec = TraceRecorder(cfg, lookahead=1, source="test", info={"case": "round-trip"})
    seen = []
    dec = resident_decoder(model, gate_up, down, max_len=PREFILL + DECODE, batch=b, lookahead=1,
                           gate_observers=(rec.on_gate, seen.append),
                           pass_observers=(rec.end_pass,))
    passes = []
    dec.forward(tokens)
    passes.append(seen[:])
    seen.clear()
    for i in range(DECODE):
        dec.forward(decode_tokens[:, i:i + 1])
        passes.append(seen[:])
        seen.clear()
    return rec.trace(), passes


@pytest.fixture(scope="module")
def recorded(tiny):
    cfg = tiny[0]
    rng = np.random.default_rng(11)
    prompt = rng.integers(0, cfg.vocab_size, (1, PREFILL)).astype(np.int32)
    steps = rng.integers(0, cfg.vocab_size, (1, DECODE)).astype(np.int32)
    trace, passes = _record(tiny, prompt, steps)
    return trace, passes, prompt, steps


def test_pass_layout_and_tokens(tiny, recorded):
    cfg = tiny[0]
    trace, passes, prompt, steps = recorded
    assert trace.pass_offsets.tolist() == [0, 7, 8, 9, 10, 11, 12]
    assert trace.num_passes == 1 + DECODE
    np.testing.assert_array_equal(trace.tokens, np.concatenate([prompt[0], steps[0]]))
    assert trace.tokens.dtype == np.int32
    assert trace.meta["format"] == FORMAT
    assert trace.layers == list(cfg.moe_layers)
    assert (trace.num_experts, trace.top_k) == (cfg.num_experts, cfg.top_k)
    assert trace.meta["lookahead"] == 1 and trace.meta["info"] == {"case": "round-trip"}
    r, l, k, e = 12, cfg.num_moe_layers, cfg.top_k, cfg.num_experts
    assert trace.ids.shape == (r, l, k) and trace.weights.shape == (r, l, k)
    assert trace.probs.shape == (r, l, e) and trace.spec.shape == (r, l, 1, e)
    trace.validate()


def test_arrays_equal_the_gate_outputs(tiny, recorded):
    cfg = tiny[0]
    trace, passes, _, _ = recorded
    for p, gates in enumerate(passes):
        rows = trace.pass_rows(p)
        assert [g.layer for g in gates] == list(cfg.moe_layers)
        for i, g in enumerate(gates):
            n = rows.stop - rows.start
            np.testing.assert_array_equal(trace.ids[rows, i], np.asarray(g.ids)[:n])
            np.testing.assert_array_equal(trace.weights[rows, i], np.asarray(g.weights)[:n])
            np.testing.assert_array_equal(trace.probs[rows, i],
                                          np.asarray(g.probs)[:n].astype(trace.probs.dtype))
            # Rows past the last MoE layer predict nothing: zeros, not softmax(0) = 1/E.
            spec = np.asarray(g.spec)[0, :n] if g.spec_layers else np.zeros((n, cfg.num_experts))
            np.testing.assert_array_equal(trace.spec[rows, i, 0],
                                          spec.astype(trace.spec.dtype))
    # spec_probs[:, i, 0] predicts layer i+1: real probabilities for every layer but the last.
    spec = trace.spec.astype(np.float32)
    np.testing.assert_allclose(spec[:, :-1, 0].sum(-1), 1.0, atol=1e-2)


def test_spec_probs_past_the_last_layer_are_zero(recorded):
    trace = recorded[0]
    assert not trace.spec[:, -1].astype(np.float32).any()


def test_save_load_round_trip(tmp_path, recorded):
    trace = recorded[0]
    path = str(tmp_path / "t.npz")
    trace.save(path)
    assert os.listdir(tmp_path) == ["t.npz"]  # no temporary file left behind
    back = load(path)
    assert back.meta == json.loads(json.dumps(trace.meta))
    for key in ("pass_offsets", "tokens", "ids", "weights", "probs", "spec"):
        a, b = getattr(trace, key), getattr(back, key)
        np.testing.assert_array_equal(b, a, err_msg=key)
        if key != "ids":  # ids are widened to int64 on load
            assert b.dtype == a.dtype, key
    dec = back.decode_ids()
    assert dec.shape == (DECODE, len(trace.layers), trace.top_k)
    np.testing.assert_array_equal(dec, trace.ids[7:12])


def test_only_batch_row_zero_is_recorded(tiny):
    cfg = tiny[0]
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, cfg.vocab_size, (2, PREFILL)).astype(np.int32)
    steps = rng.integers(0, cfg.vocab_size, (2, DECODE)).astype(np.int32)
    assert (prompt[0] != prompt[1]).any()
    two, passes = _record(tiny, prompt, steps)
    one, _ = _record(tiny, prompt[:1], steps[:1])
    assert two.pass_offsets.tolist() == one.pass_offsets.tolist()
    np.testing.assert_array_equal(two.tokens, np.concatenate([prompt[0], steps[0]]))
    np.testing.assert_array_equal(two.ids, one.ids)
    np.testing.assert_allclose(two.weights, one.weights, atol=1e-5)
    # The two rows were routed differently, so row 1 would have been distinguishable.
    row1 = np.stack([np.asarray(g.ids)[PREFILL:] for g in passes[0]], 1)
    assert (row1 != two.ids[:PREFILL]).any()


@pytest.fixture(scope="module")
def generate_job(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("gen"))
    config = base_config()
    config.model.family, config.model.preset = "olmoe", "tiny"
    config.cache.capacity_frac = 0.25
    config.model.checkpoint = ""
    config.tracing.record = True
    config.run.max_new_tokens = 4
    config.run.stop_at_eos = False
    config.log.progress = False
    results = jobs.run(config, workdir)
    return workdir, results


@pytest.mark.slow
def test_generate_job_writes_the_trace(generate_job):
    workdir, results = generate_job
    path = os.path.join(workdir, "trace.npz")
    assert results["trace"] == path
    trace = load(path)
    cfg = preset("olmoe", "tiny")
    assert trace.meta["source"] == "preset:olmoe/tiny"
    assert trace.meta["model"]["num_experts"] == cfg.num_experts
    prompt, generated = results["prompt_ids"], results["generated_token_ids"]
    assert len(generated) == 4
    # Warm-up passes are not recorded: one prefill, then one pass per generated token but the last.
    n = len(prompt)
    assert trace.pass_offsets.tolist() == [0, n, n + 1, n + 2, n + 3]
    assert trace.tokens[:n].tolist() == prompt
    assert trace.tokens[n:].tolist() == generated[:-1]
    assert trace.decode_ids().shape == (3, cfg.num_moe_layers, cfg.top_k)


# --- load errors --------------------------------------------------------------------------


def _small_trace(**over) -> Trace:
    ids = np.array([[[0, 1]], [[2, 3]], [[1, 2]]], np.int16)  # 3 rows, 1 layer, top-2
    meta = {"format": FORMAT, "model": {}, "layers": [0], "num_experts": 4, "top_k": 2,
            "expert_bytes": None, "lookahead": 0, "prefill_passes": 1, "source": "x", "info": {}}
    t = Trace(meta, np.array([0, 2, 3], np.int64), np.array([5, 6, 7], np.int32), ids)
    for k, v in over.items():
        setattr(t, k, v)
    return t


def _npz(path, trace: Trace, drop=(), meta=None):
    arrays = {"meta": np.asarray(json.dumps(meta if meta is not None else trace.meta)),
              "pass_offsets": trace.pass_offsets, "tokens": trace.tokens, "ids": trace.ids}
    for k in drop:
        del arrays[k]
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return str(path)


def test_small_trace_loads(tmp_path):
    path = _npz(tmp_path / "ok.npz", _small_trace())
    t = load(path)
    assert t.decode_ids().tolist() == [[[1, 2]]]


def test_load_rejects_a_file_that_is_not_npz(tmp_path):
    path = tmp_path / "notes.npz"
    path.write_text("just some text\n")
    with pytest.raises(TraceError, match=re.escape(str(path))):
        load(str(path))


def test_load_rejects_missing_ids(tmp_path):
    path = _npz(tmp_path / "noids.npz", _small_trace(), drop=("ids",))
    with pytest.raises(TraceError, match=f"{re.escape(path)}.*ids"):
        load(path)


def test_load_rejects_a_wrong_format_string(tmp_path):
    t = _small_trace()
    path = _npz(tmp_path / "v0.npz", t, meta={**t.meta, "format": "moejax-trace-v0"})
    with pytest.raises(TraceError, match=f"{re.escape(path)}.*moejax-trace-v0"):
        load(path)


@pytest.mark.parametrize("bad", [4, -1])
def test_load_rejects_ids_out_of_range(tmp_path, bad):
    ids = np.array([[[0, 1]], [[2, bad]], [[1, 2]]], np.int16)
    path = _npz(tmp_path / "range.npz", _small_trace(ids=ids))
    with pytest.raises(TraceError, match=f"{re.escape(path)}.*outside 0..3"):
        load(path)


@pytest.mark.parametrize("offsets", [[0, 2], [0, 2, 4], [1, 2, 3], [0, 2, 2, 3], [0, 3, 2, 3]])
def test_load_rejects_offsets_that_do_not_tile_the_rows(tmp_path, offsets):
    path = _npz(tmp_path / "tile.npz", _small_trace(pass_offsets=np.array(offsets, np.int64)))
    with pytest.raises(TraceError, match=f"{re.escape(path)}.*pass_offsets"):
        load(path)


def _rewrite(path, **changes):
    with np.load(path) as z:
        arrays = dict(z)
    arrays.update(changes)
    np.savez(path, **arrays)


@pytest.mark.parametrize("case", ["meta-not-json", "meta-not-object", "meta-without-layers",
                                  "ids-2d"])
def test_load_names_the_file_for_other_malformations(tmp_path, case):
    path = _npz(tmp_path / "bad.npz", _small_trace())
    meta = _small_trace().meta
    changes = {
        "meta-not-json": {"meta": np.asarray("{not json")},
        "meta-not-object": {"meta": np.asarray("[1, 2]")},
        "meta-without-layers": {"meta": np.asarray(json.dumps(
            {k: v for k, v in meta.items() if k != "layers"}))},
        "ids-2d": {"ids": np.zeros((3, 2), np.int16)},
    }[case]
    _rewrite(path, **changes)
    with pytest.raises(TraceError, match=re.escape(path)):
        load(path)
