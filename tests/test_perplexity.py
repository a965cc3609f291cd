"""The perplexity job: each token scored exactly once, with the context the windows promise."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

from moejax import jobs
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.perplexity import score
from moejax.jobs.schema import base_config
from moejax.testing import random_model, resident_decoder


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("olmoe", "tiny")
    return cfg, *random_model(cfg, seed=5)


def _direct_nll(model, gate_up, down, ids: np.ndarray) -> np.ndarray:
    """NLL of ids[1:] given ids[:i], from one forward of the whole sequence."""
    dec = resident_decoder(model, gate_up, down, max_len=len(ids))
    logp = jax.nn.log_softmax(np.asarray(dec.forward(ids[None]))[0, :-1], axis=-1)
    return -np.take_along_axis(np.asarray(logp), ids[1:, None], axis=-1)[:, 0]


def test_one_window_equals_a_single_forward(tiny):
    cfg, model, gate_up, down = tiny
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 40).astype(np.int32)
    dec = resident_decoder(model, gate_up, down, max_len=40)
    np.testing.assert_allclose(score(dec, ids, 40, 20), _direct_nll(model, gate_up, down, ids),
                               atol=1e-5)


@pytest.mark.parametrize("n,window,stride", [(50, 16, 1), (50, 16, 5), (33, 16, 15), (17, 16, 8)])
def test_strided_windows_score_each_token_once_with_promised_context(tiny, n, window, stride):
    cfg, model, gate_up, down = tiny
    ids = np.random.default_rng(n).integers(0, cfg.vocab_size, n).astype(np.int32)
    dec = resident_decoder(model, gate_up, down, max_len=window)
    nll = score(dec, ids, window, stride)
    assert nll.shape == (n - 1,) and not np.isnan(nll).any()
    # The first window scores its own tokens with all their (short) context.
    np.testing.assert_allclose(nll[: window - 1],
                               _direct_nll(model, gate_up, down, ids[:window]), atol=1e-5)
    if stride == 1:  # every later token has exactly window-1 tokens of context
        for j in (window, n - 1):
            ctx = ids[j - window + 1: j + 1]
            np.testing.assert_allclose(nll[j - 1], _direct_nll(model, gate_up, down, ctx)[-1],
                                       atol=1e-5)


@pytest.mark.slow
def test_job_writes_bits_per_byte(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("Bits per byte of a random model are close to eight.\n" * 3)
    c = base_config()
    c.job = "perplexity"
    c.model.preset, c.model.family = "tiny", "olmoe"
    c.cache.capacity_frac = 0.25
    c.perplexity.text_file = str(text)
    c.perplexity.window, c.perplexity.stride = 64, 32
    results = jobs.run(c, str(tmp_path / "w"))
    on_disk = json.loads((tmp_path / "w" / "results.json").read_text())
    assert on_disk["bits_per_byte"] == results["bits_per_byte"]
    assert on_disk["tokens_scored"] == len(text.read_bytes()) - 1
    # A random byte-level model is near uniform over 256 ids: about 8 bits.
    assert 6.0 < results["bits_per_byte"] < 10.0
    assert math.isclose(results["bits_per_byte"], results["bits_per_token"])


@pytest.mark.parametrize("field,value,message", [
    ("perplexity.text_file", "", "^perplexity.text_file is empty"),
    ("perplexity.text_file", "/nonexistent.txt", "is not a file"),
    ("perplexity.stride", 64, "^perplexity.stride=64"),
    ("perplexity.window", 1, "^perplexity.window=1"),
    # The eval job's fields, which the perplexity job read before it had its own section.
    ("eval.window", 512, "^eval.window=512 is not read by the perplexity job: it moved to "
                         "perplexity.window$"),
    ("eval.stride", 64, "^eval.stride=64 is not read by the perplexity job: it moved to "
                        "perplexity.stride$"),
    ("eval.max_tokens", 9, "^eval.max_tokens=9 is not read by the perplexity job: it moved to "
                           "perplexity.max_tokens$"),
])
def test_bad_perplexity_config(field, value, message, tmp_path):
    (tmp_path / "t.txt").write_text("abc")
    c = base_config()
    c.job = "perplexity"
    c.perplexity.text_file = str(tmp_path / "t.txt")
    c.perplexity.window = 64
    group, name = field.split(".")
    setattr(getattr(c, group), name, value)
    with pytest.raises(ConfigError, match=message):
        jobs.run(c, str(tmp_path / "w"))
