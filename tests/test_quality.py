"""The quality job: the cached model against the reference (every expert resident at native).

Exactness-preserving configurations (standard routing, plain fetch, native precision) give
KL exactly 0, top-1 agreement 1 and identical greedy continuations at every capacity, under
every eviction and prefetch policy and both prefetch queues, in both teacher-forcing modes
(DESIGN.md invariant 1, as users see it); drop(keep=1) and int2 experts move the output.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from moejax import jobs
from moejax.errors import ConfigError
from moejax.families import preset
from moejax.jobs.quality import greedy_drift, teacher_forced
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import in_memory
from moejax.models.stepped import ResidentExperts, SteppedDecoder
from moejax.policies import names
from moejax.quality import drift, token_comparison
from moejax.serving.build import build_cached_experts
from moejax.testing import random_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVICTIONS = names("eviction", live=True)
PREFETCHES = names("prefetch", live=True)
MAX_LEN = 24


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=3)
    loaded = in_memory(cfg, model, gate_up, down)
    reference = SteppedDecoder(model, ResidentExperts.from_host(*loaded.experts_at("native")),
                               max_len=MAX_LEN, lookahead=2)
    return cfg, model, loaded, reference


def _cached(tiny, slots, eviction="lru", prefetch="none", queue="immediate", miss="fetch",
            precision=""):
    _, model, loaded, _ = tiny
    c = base_config()
    c.cache.slots, c.cache.prefetch_queue, c.cache.precision = slots, queue, precision
    c.policies.eviction, c.policies.prefetch, c.policies.miss = eviction, prefetch, miss
    c.policies.routing = "standard"
    return SteppedDecoder(model, build_cached_experts(resolve(c), loaded), max_len=MAX_LEN, lookahead=2)


def _tokens(cfg, seed, n):
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, n).astype(np.int32)


def _exact_cases() -> list:
    """Every live eviction once, beside a rotating live prefetch, slot count, prefetch queue,
    teacher-forcing mode and seed: every prefetch, queue and mode appear too (the queue and
    the mode rotate with different periods, so each queue meets each mode)."""
    cases = []
    for i, eviction in enumerate(EVICTIONS):
        case = (eviction, PREFETCHES[i % len(PREFETCHES)], (4, 7, 16, 64)[i * 3 % 4],
                ("immediate", "watchdog")[i % 2], ("decode", "prefill")[i // 2 % 2], i % 4)
        cases.append(pytest.param(*case, id="-".join(map(str, case))))
    return cases


def test_the_exact_cases_cover_every_policy_queue_and_mode():
    cases = [p.values for p in _exact_cases()]
    assert [c[0] for c in cases] == EVICTIONS
    assert {c[1] for c in cases} == set(PREFETCHES)
    assert {(c[3], c[4]) for c in cases} == {(q, m) for q in ("immediate", "watchdog")
                                             for m in ("decode", "prefill")}


@pytest.mark.parametrize("eviction, prefetch, slots, queue, mode, seed", _exact_cases())
def test_exact_configurations_have_no_drift(tiny, eviction, prefetch, slots, queue, mode, seed):
    cfg, _, _, reference = tiny
    cached = _cached(tiny, slots, eviction, prefetch, queue)
    segments = [_tokens(cfg, seed, 12), _tokens(cfg, seed + 10, 5)]
    tokens, segment_of = teacher_forced(reference, cached, segments, mode)
    assert len(tokens.kl) == 11 + 4 and segment_of.tolist() == [0] * 11 + [1] * 4
    assert np.all(tokens.kl == 0.0) and tokens.agree.all()
    np.testing.assert_array_equal(tokens.nll_cached, tokens.nll_reference)
    ref_out, cached_out = greedy_drift(reference, cached, [segments[0][:6]], 8)
    assert cached_out == ref_out and len(ref_out[0]) == 8
    summary = token_comparison.summary(tokens, scored_bytes=15)
    assert summary["kl_mean"] == 0.0 and summary["top1_agreement"] == 1.0
    assert summary["bits_per_byte"] == summary["reference_bits_per_byte"]


@pytest.mark.parametrize("change", [dict(miss="drop(keep=1)"), dict(precision="int2")])
def test_drop_and_int2_move_the_output(tiny, change):
    cfg, _, _, reference = tiny
    cached = _cached(tiny, 16, **change)
    tokens, _ = teacher_forced(reference, cached, [_tokens(cfg, 7, 20)], "decode")
    assert tokens.kl.mean() > 1e-4 and tokens.agree.mean() < 1.0
    assert np.all(tokens.kl >= 0.0)


def test_compare_matches_a_hand_computed_kl():
    ref = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]], np.float32))
    cached = np.log(np.array([[0.25, 0.5, 0.25], [0.1, 0.7, 0.2]], np.float32))
    t = token_comparison.compare(ref, cached, np.array([0, 2]))
    want = [0.5 * math.log(2) + 0.25 * math.log(0.5),
            0.8 * math.log(0.8 / 0.7) + 0.1 * math.log(0.5)]
    np.testing.assert_allclose(t.kl, want, rtol=1e-5)
    assert t.agree.tolist() == [False, True]
    np.testing.assert_allclose(t.nll_reference, [-math.log(0.5), -math.log(0.1)], rtol=1e-5)
    np.testing.assert_allclose(t.nll_cached, [-math.log(0.25), -math.log(0.2)], rtol=1e-5)


def test_drift_counts_tokens_to_the_first_divergence():
    assert drift.tokens_to_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert drift.tokens_to_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert drift.tokens_to_divergence([4], [5]) == 0
    d = drift.summary([[1, 2], [3, 4]], [[1, 2], [3, 9]], [5, 5], 2)
    assert d["tokens_to_divergence"] == [2, 1] and d["identical_share"] == 0.5
    assert d["mean_tokens_to_divergence"] == 1.5


def _config(tmp_path, **fields):
    c = base_config()
    c.job = "quality"
    c.log.progress = False
    c.quality.max_tokens, c.quality.segment_tokens = 40, 24
    c.quality.drift_prompts, c.quality.drift_prompt_tokens, c.quality.drift_new_tokens = 2, 8, 6
    for key, value in fields.items():
        group, _, name = key.rpartition(".")
        (c[group] if group else c)[name] = value
    return c


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("The Python interpreter reads a program and runs it line by line. " * 3)
    return str(path)


@pytest.mark.slow
def test_job_reports_zero_drift_under_fetch_and_drift_under_drop(tmp_path, text_file):
    exact = jobs.run(_config(tmp_path, **{"quality.text_file": text_file}), str(tmp_path / "exact"))
    q = exact["quality"]
    assert q["kl_mean"] == 0.0 and q["kl_max"] == 0.0 and q["top1_agreement"] == 1.0
    assert q["bits_per_byte"] == q["reference_bits_per_byte"] and q["tokens"] == 39 - 1
    assert q["drift"]["identical_share"] == 1.0 and q["drift"]["prompts"] == 2
    assert exact["speed"]["ttft_s"] > 0 and exact["speed"]["decode_tok_per_s"] > 0
    on_disk = json.loads((tmp_path / "exact" / "results.json").read_text())
    assert on_disk["quality"]["kl_mean"] == 0.0 and "cache" in on_disk
    per_token = np.load(tmp_path / "exact" / "quality_tokens.npz")
    assert len(per_token["kl"]) == q["tokens"] and per_token["agree"].all()

    dropped = jobs.run(_config(tmp_path, **{"quality.text_file": text_file,
                                            "policies.miss": "drop(keep=1)"}),
                       str(tmp_path / "drop"))["quality"]
    assert dropped["kl_mean"] > 0 and dropped["top1_agreement"] < 1
    assert dropped["reference_bits_per_byte"] == q["reference_bits_per_byte"]


@pytest.mark.slow
def test_resident_at_int2_against_the_native_reference(tmp_path, text_file):
    r = jobs.run(_config(tmp_path, **{"quality.text_file": text_file, "cache.enabled": False,
                                      "cache.precision": "int2"}), str(tmp_path))
    assert r["model"]["precision"] == "int2" and r["speed"] is None and "cache" not in r
    assert r["quality"]["kl_mean"] > 0 and r["quality"]["top1_agreement"] < 1


@pytest.mark.slow
def test_cli_as_a_user_runs_it(tmp_path, subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-m", "moejax.main", "--config=configs/quality.py",
         "--config.quality.text_file=README.md", "--config.quality.max_tokens=48",
         "--config.quality.drift_prompts=1", "--config.log.progress=False",
         f"--workdir={tmp_path}"], cwd=REPO, env=subprocess_env, capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "top-1 agreement 100.00%" in proc.stdout and "mean 0 nats" in proc.stdout
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["quality"]["kl_mean"] == 0 and r["quality"]["top1_agreement"] == 1


@pytest.mark.parametrize("fields,match", [
    ({}, "give one text"),
    ({"quality.text_file": "README.md", "eval.task": "gsm8k"}, "give one text"),
    ({"quality.text_file": "/no/such/file.txt"}, "^quality.text_file=.* is not a file"),
    ({"quality.text_file": "README.md", "quality.teacher_forcing": "greedy"}, "teacher_forcing"),
    ({"quality.text_file": "README.md", "quality.segment_tokens": 1}, "segment_tokens"),
    ({"quality.text_file": "README.md", "quality.drift_new_tokens": 0}, "drift_new_tokens"),
])
def test_bad_config_is_a_clear_error(tmp_path, fields, match):
    with pytest.raises(ConfigError, match=match):
        jobs.run(_config(tmp_path, **fields), str(tmp_path))


@pytest.mark.slow
def test_job_over_a_tasks_examples(tmp_path):
    rows = [{"input": f"Question {i}: what is {i} plus {i}?\nAnswer:", "target": f" {2 * i}"}
            for i in range(5)]
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = _config(tmp_path, **{"eval.task": "jsonl", "eval.data_file": str(path),
                             "eval.max_examples": 4, "model.preset": "tiny",
                             "cache.slots": 8, "quality.max_tokens": 0,
                             "quality.segment_tokens": 64})
    r = jobs.run(c, str(tmp_path / "w"))
    assert r["task"] == "jsonl" and r["examples"] == 4
    assert r["quality"]["kl_mean"] == 0.0 and r["quality"]["drift"]["prompts"] == 2
    assert r["quality"]["drift"]["prompt_tokens"] == [8, 8]  # the inputs' last 8 tokens
    # each example a sequence of its own (inputs + target), every token but its first scored
    want = sum(len((row["input"] + row["target"]).encode()) - 1 for row in rows[:4])
    assert r["quality"]["tokens"] == want and r["quality"]["segments"] == 4
