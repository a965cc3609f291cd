"""Precision tiers as a user meets them: a Hugging Face checkpoint converted with
`--precisions`, run through the cache at int4 and with the precision cascade; the perplexity
job at every precision of the embedded model; the precision of resident runs."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from moejax import bundled, jobs
from moejax.convert import convert
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config


def _hf_dir(tmp_path):
    cfg = transformers.AutoConfig.for_model(
        "olmoe", vocab_size=97, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        eos_token_id=2, pad_token_id=1, bos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    d = str(tmp_path / "hf")
    model.save_pretrained(d)
    return d


@pytest.mark.slow
def test_converted_checkpoint_runs_at_int4_and_with_the_cascade(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    convert(_hf_dir(tmp_path), ckpt, dtype="bfloat16", precisions=("int8", "int4", "int2"))
    assert set(json.load(open(f"{ckpt}/config.json"))["precisions"]) == {"int8", "int4", "int2"}

    def run(name, **cache):
        c = base_config()
        c.model.checkpoint, c.run.prompt_ids, c.run.max_new_tokens = ckpt, "3,4,5,6,7", 6
        c.log.progress, c.log.tensorboard = False, False
        c.cache.capacity_frac = 0.5
        for k, v in cache.items():
            setattr(c.cache, k, v)
        if name == "cascade":
            c.policies.miss = 'fetch_priority(levels="int8:int4:int2", percentile=60)'
        return jobs.run(c, str(tmp_path / name))["cache"]

    native, int4 = run("native"), run("int4", precision="int4")
    ratio = int4["expert_bytes"] / native["expert_bytes"]
    assert 0.25 < ratio < 0.32  # 4 bits of 16, plus float16 scales and zero points
    moved = int4["total"]["h2d_bytes_by_precision"]
    assert set(moved) == {"int4"} and moved["int4"] == int4["total"]["h2d_bytes"] > 0
    assert int4["total"]["h2d_bytes"] % int4["expert_bytes"] == 0
    cascade = run("cascade")
    used = [p for p, n in cascade["total"]["requests_by_precision"].items() if n]
    assert len(used) > 1 and list(cascade["pools"]) == ["int8", "int4", "int2"]


def _bits_per_byte(tmp_path, precision, enabled):
    c = base_config()
    c.job, c.perplexity.text_file = "perplexity", bundled.heldout_path("prose")
    c.perplexity.window, c.perplexity.stride, c.perplexity.max_tokens = 64, 32, 400
    c.log.progress, c.log.tensorboard = False, False
    c.cache.enabled, c.cache.precision = enabled, precision
    res = jobs.run(c, str(tmp_path / f"{precision}-{enabled}"))
    assert res["model"]["precision"] == (precision or "native")
    return res["bits_per_byte"]


@pytest.mark.slow
def test_perplexity_at_each_precision_of_the_embedded_model(tmp_path):
    bpb = {p: _bits_per_byte(tmp_path, p, enabled=False) for p in ("", "int8", "int4", "int2")}
    assert abs(bpb["int8"] - bpb[""]) < 0.01 * bpb[""]
    assert bpb[""] < bpb["int4"] < bpb["int2"]
    # The cache at int4 (standard routing, plain fetch) is the resident model at int4, bit
    # for bit (tests/test_precision_exactness.py: cached == resident at every precision).
    assert _bits_per_byte(tmp_path, "int4", enabled=True) == bpb["int4"]


def test_resident_run_at_a_precision_the_checkpoint_lacks_is_a_clear_error(tmp_path):
    from moejax.checkpoint import save_model
    from moejax.families import preset
    from moejax.testing import random_model

    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=0)
    save_model(str(tmp_path / "ck"), model, gate_up, down)
    c = base_config()
    c.model.checkpoint, c.run.prompt_ids, c.log.progress = str(tmp_path / "ck"), "1,2", False
    c.cache.enabled, c.cache.precision = False, "int4"
    with pytest.raises(ConfigError, match="add_precisions"):
        jobs.run(c, str(tmp_path / "w"))
