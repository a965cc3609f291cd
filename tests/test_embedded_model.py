"""The shipped model (moejax/assets/small_moe): trained by moejax, loads, has learned.

Also the scored traces recorded from it (moejax/assets/traces): routing a cache can exploit."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from moejax import bundled, jobs
from moejax.analysis.routing_stats import summarize
from moejax.jobs.schema import base_config
from moejax.model_source import EMBEDDED_DIR, embedded_config
from moejax.traces.format import load
from moejax.train import corpus

TRACES = sorted(glob.glob(os.path.join(bundled.SCORED_TRACES_DIR, "*.npz")))


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def test_shape_keeps_the_ratios_that_make_caching_interesting():
    cfg = embedded_config()
    assert cfg.family == "olmoe" and cfg.vocab_size == 256
    assert cfg.num_moe_layers >= 8 and cfg.num_experts >= 32 and cfg.top_k >= 4
    # 12.83 MB: native bf16 experts (blosc, one chunk file per expert: 5.1 MB), dense
    # parameters (0.6 MB) and int8/int4/int2 copies (7.1 MB, one zarr3 shard file per layer,
    # kind, precision and part); 829 files in all.
    assert _dir_bytes(EMBEDDED_DIR) <= 13 * 10**6


def _perplexity(tmp_path, text: bytes, name: str) -> float:
    path = tmp_path / f"{name}.txt"
    path.write_bytes(text)
    c = base_config()
    c.job = "perplexity"
    c.perplexity.text_file = str(path)
    c.cache.enabled = False  # the cache is exact; resident is faster here
    return jobs.run(c, str(tmp_path / name))["bits_per_byte"]


def _heldout(name: str) -> bytes:
    with open(bundled.heldout_path(name), "rb") as f:
        return f.read()


@pytest.mark.slow
@pytest.mark.parametrize("domain", corpus.DOMAINS)
def test_heldout_bits_per_byte_well_below_unigram(domain, tmp_path):
    """Committed held-out documents (moejax/assets/heldout: never trained on) against a unigram
    byte model of the training split. Measured: prose 1.70 / code 1.98 / math 1.97 bits per
    byte, 0.36-0.42 of unigram."""
    text = _heldout(domain)
    bpb = _perplexity(tmp_path, text, domain)
    unigram = corpus.unigram_bits_per_byte(corpus.load_domain(domain, False).data,
                                           np.frombuffer(text, np.uint8))
    assert bpb < 0.6 * unigram, (bpb, unigram)


def test_committed_math_text_is_held_out():
    """The committed math excerpt is GSM8K problems of the held-out split, verbatim (prose and
    code excerpts depend on the CPython version they were taken from, so only math is
    re-derivable on any install)."""
    docs = corpus.math_docs(bundled.GSM8K)
    text = _heldout("math").decode()
    chosen = [n for n, d in docs.items() if d in text]
    assert len(chosen) >= 10 and all(corpus.is_heldout(n) for n in chosen)
    assert text == "\n\n".join(docs[n] for n in chosen)


@pytest.mark.slow
def test_unseen_text_below_unigram(tmp_path):
    """A kind of text the model never saw: the Apache License 2.0 (moejax/assets/heldout/
    unseen.txt). Measured: 2.48 bits per byte against 4.63 for the unigram model."""
    text = _heldout("unseen")
    train = np.concatenate([corpus.load_domain(d, False).data for d in corpus.DOMAINS])
    bpb = _perplexity(tmp_path, text, "unseen")
    assert bpb < corpus.unigram_bits_per_byte(train, np.frombuffer(text, np.uint8)) < 8.0
    assert bpb < 3.0


def test_scored_traces_cover_the_domains_with_learned_routing():
    assert {os.path.basename(p).split("_")[0] for p in TRACES} == set(corpus.DOMAINS)
    for path in TRACES:
        trace = load(path)
        assert trace.has_scores and trace.spec is not None
        assert trace.meta["info"]["teacher_forced"] is True
        s = summarize(trace)
        # Learned routing: the next layer's gate on this hidden state predicts the next
        # layer's experts far better than chance (top_k / num_experts).
        assert s["spec_topk_precision"] > 3 * trace.top_k / trace.num_experts
        # ... and tokens re-use the previous token's experts more than independent choices.
        assert s["reuse"] > s["reuse_uniform"]
        assert s["entropy_frac"] < 0.99
