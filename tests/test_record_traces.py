"""The record_traces job and the scored traces it wrote (moejax/assets/traces/README.md): the
embedded model's long traces and the random-weight traces of the four families' tiny presets."""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import numpy as np
import pytest

from moejax import bundled, jobs
from moejax.errors import ConfigError
from moejax.families import FAMILIES, preset
from moejax.jobs.record_traces import check_tokenizer, token_ids
from moejax.jobs.schema import base_config
from moejax.model_config import ModelConfig
from moejax.model_source import embedded_config
from moejax.tokenizer import ByteTokenizer, HFTokenizer, IdsOnly
from moejax.traces.format import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = 64


def _config(arg: str | None = None):
    path = os.path.join(ROOT, "configs", "record_traces.py")
    spec = importlib.util.spec_from_file_location("record_traces_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def _check_recorded(path: str, cfg, tokens: int, domain: str, source: str) -> None:
    """A trace of `tokens` teacher-forced held-out tokens of `cfg` (a 64-token prompt)."""
    t = load(path)
    rows, layers = tokens - 1, len(cfg.moe_layers)
    assert t.has_scores and t.spec is not None and t.weights is not None
    assert t.ids.shape == (rows, layers, cfg.top_k)
    assert t.probs.shape == (rows, layers, cfg.num_experts) and t.probs.dtype == np.float16
    assert t.spec.shape == (rows, layers, 2, cfg.num_experts)
    assert t.num_passes == tokens - PROMPT and t.prefill_passes == 1
    assert int(t.pass_offsets[1]) == PROMPT
    assert ModelConfig.from_dict(t.meta["model"]) == cfg and t.meta["source"] == source
    assert t.tokens.min() >= 0 and t.tokens.max() < 256  # held-out bytes
    info = t.meta["info"]
    assert info["domain"] == domain and info["teacher_forced"] is True
    assert info["bits_per_byte"] == info["bits_per_token"] and info["prompt_tokens"] == PROMPT
    if cfg.norm_topk_prob:  # Mixtral renormalises its top-k weights
        np.testing.assert_allclose(t.weights.sum(-1), 1.0, atol=1e-3)


def test_bundled_lists_the_trace_sets_apart():
    assert len(bundled.scored_trace_files()) == 6
    # The six short traces are all a glob of SCORED_TRACES_DIR/*.npz sees (the grid, the tests).
    assert sorted(glob.glob(os.path.join(bundled.SCORED_TRACES_DIR, "*.npz"))) == \
        bundled.scored_trace_files()
    assert [os.path.basename(p) for p in bundled.long_trace_files()] == \
        ["code.npz", "math.npz", "prose.npz"]
    assert set(bundled.TRACE_FAMILIES) == set(FAMILIES)
    assert len(bundled.family_trace_files()) == 3 * len(FAMILIES)
    assert bundled.family_trace_files("mixtral") == sorted(
        bundled.family_trace_path("mixtral", d) for d in bundled.TRACE_DOMAINS)
    on_disk = sorted(glob.glob(os.path.join(bundled.SCORED_TRACES_DIR, "**", "*.npz"),
                               recursive=True))
    assert on_disk == sorted(bundled.scored_trace_files() + bundled.long_trace_files()
                             + bundled.family_trace_files())
    with pytest.raises(ValueError, match="family"):
        bundled.family_trace_path("qwen_moe")
    with pytest.raises(ValueError, match="domain"):
        bundled.long_trace_path("poetry")


def test_long_traces_span_the_embedded_models_context():
    cfg = embedded_config()
    assert cfg.max_position_embeddings == 1024
    for domain in bundled.TRACE_DOMAINS:
        path = bundled.long_trace_path(domain)
        t = load(path)
        assert t.meta["source"].endswith(os.path.join("assets", "small_moe"))
        _check_recorded(path, cfg, cfg.max_position_embeddings, domain, t.meta["source"])
        assert os.path.getsize(path) < 1.5e6
        # Learned routing: the speculative scores predict the next layer far above chance.
        nxt = t.ids[:, 1]
        hits = np.mean([len(set(np.argsort(-t.spec[r, 0, 0])[:t.top_k]) & set(nxt[r]))
                        for r in range(len(nxt))]) / t.top_k
        assert hits > 3 * t.top_k / t.num_experts
    assert sum(os.path.getsize(p) for p in bundled.long_trace_files()) <= 5 * 10**6


def test_family_traces_are_random_weight_tiny_presets():
    for family in FAMILIES:
        cfg = preset(family, "tiny")
        for domain in bundled.TRACE_DOMAINS:
            path = bundled.family_trace_path(family, domain)
            _check_recorded(path, cfg, cfg.max_position_embeddings, domain,
                            f"preset:{family}/tiny")
            assert os.path.getsize(path) < 10**6
    # The architectures differ where the README says they do.
    shapes = {f: (load(bundled.family_trace_path(f)).num_experts,
                  load(bundled.family_trace_path(f)).top_k) for f in FAMILIES}
    assert shapes == {"mixtral": (8, 2), "olmoe": (16, 4), "phimoe": (8, 2), "qwen2_moe": (15, 4)}
    meta = load(bundled.family_trace_path("qwen2_moe")).meta["model"]
    assert meta["shared_expert_intermediate_size"] > 0
    assert load(bundled.family_trace_path("phimoe")).meta["model"]["router"] == "sparsemixer"


def test_configs_size_the_traces_to_the_models_context():
    short = _config()
    assert (short.tracing.prompts_per_domain, short.run.max_new_tokens) == (2, 192)
    long = _config("long")
    assert long.tracing.prompts_per_domain == 1
    assert long.tracing.prompt_tokens + long.run.max_new_tokens == 1024
    fam = _config("family=phimoe")
    assert (fam.model.family, fam.model.preset) == ("phimoe", "tiny")
    assert fam.tracing.prompt_tokens + fam.run.max_new_tokens == 512
    with pytest.raises(ValueError, match="family"):
        _config("family=gpt")


def test_text_becomes_token_ids_or_a_config_error(tmp_path):
    window = np.frombuffer(b"def f(x):\n    return x\n", np.uint8)
    np.testing.assert_array_equal(token_ids(ByteTokenizer(), window, 5, 256), window[:5])
    with pytest.raises(ConfigError, match="give 5 tokens, 9 are needed"):
        token_ids(ByteTokenizer(), window[:5], 9, 256)
    with pytest.raises(ConfigError, match="too small for bytes"):
        check_tokenizer(IdsOnly(100), 100)
    # A checkpoint's own tokenizer.json: the window is encoded, not fed as bytes.
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "def": 1, "f": 2, "(": 3, "x": 4, "):": 5, "return": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = HFTokenizer(str(tmp_path / "tokenizer.json"))
    check_tokenizer(hf, len(vocab))
    np.testing.assert_array_equal(token_ids(hf, window, 6, len(vocab)), [1, 2, 3, 4, 5, 6])


def test_record_a_tiny_family_then_replay_it(tmp_path):
    c = _config("family=mixtral")
    c.tracing.prompt_tokens = PROMPT
    c.run.max_new_tokens = 4
    res = jobs.run(c, str(tmp_path / "rec"))
    cfg = preset("mixtral", "tiny")
    paths = sorted(r["path"] for r in res["traces"])
    assert [os.path.basename(p) for p in paths] == ["code.npz", "math.npz", "prose.npz"]
    for r in res["traces"]:
        _check_recorded(r["path"], cfg, PROMPT + 4, r["domain"], "preset:mixtral/tiny")
        assert r["bits_per_byte"] > 0 and r["tokenizer"] == "bytes"
    assert json.load(open(tmp_path / "rec" / "results.json"))["model"] == "preset:mixtral/tiny"

    r = base_config()
    r.job, r.model.preset, r.clock.kind = "replay", "", "virtual"
    r.replay.trace = str(tmp_path / "rec" / "prose.npz")
    r.cache.capacity_frac = 0.25  # 8 slots of 32 experts (5% is below top-k)
    r.policies.prefetch = "score_percentile(p=80)"
    r.log.progress = r.log.tensorboard = False
    out = jobs.run(r, str(tmp_path / "replay"))
    assert out["trace"]["has_scores"] and out["trace"]["passes"] == 4
    total = out["cache"]["total"]
    assert total["requests"] > 0 and total["prefetch_issued"] > 0
