"""The eval job end to end on the embedded model (configs/eval.py): generation, multiple choice
and bits per byte through the expert cache, results.json read back, and the command line.

The embedded model is a tiny byte-level model: its task scores are near 0 and the tests check
the wiring (records, metrics recomputed from them, a target set to the model's own answer
scoring 1), not the model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from moejax import bundled, jobs
from moejax.errors import ConfigError
from moejax.eval import scoring
from moejax.families import preset
from moejax.jobs import evaluate
from moejax.testing import config_from_flags, random_model, resident_decoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(task: str, *flags: str, **eval_fields):
    """configs/eval.py as the command line parses it, quiet, with `eval.*` fields set."""
    c = config_from_flags(os.path.join(ROOT, "configs", "eval.py"), f"--config.eval.task={task}",
                          "--config.log.progress=False", "--config.log.tensorboard=False",
                          *flags)
    for k, v in eval_fields.items():
        setattr(c.eval, k, v)
    return c


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("field,value,message", [
    ("task", "mmlu", "eval.task='mmlu' is not one of"),
    ("task", "", "eval.task is empty"),
    ("max_examples", -1, "eval.max_examples=-1 must be >= 0"),
    ("shots", -2, "eval.shots=-2 must be >= 0"),
    ("max_new_tokens", 0, "eval.max_new_tokens=0 must be >= 1"),
    ("stop", ("",), "eval.stop=('',) must be a list of non-empty strings"),
    ("data_file", "x.jsonl", "eval.task='heldout' scores the held-out texts"),
])
def test_bad_eval_fields_are_named(field, value, message, tmp_path):
    c = _config("heldout" if field == "data_file" else "gsm8k")
    setattr(c.eval, field, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jobs.run(c, str(tmp_path))


def test_a_task_without_its_data_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="eval.task='nq_open'.*eval.data_file is empty"):
        jobs.run(_config("nq_open"), str(tmp_path))


def test_stop_sequences_from_the_command_line(tmp_path):
    c = _config("nq_open", '--config.eval.stop=["\\n\\n", "###"]')
    assert tuple(c.eval.stop) == ("\n\n", "###")
    assert evaluate.stop_sequences(c) == ("\n\n", "###")
    assert evaluate.stop_sequences(_config("gsm8k")) == ("\n\n", "Question:")
    assert evaluate.stop_sequences(_config("nq_open")) == ("\n",)


def test_cut_at_the_first_stop_sequence():
    assert evaluate.cut_at_stop(" 18\n\nQuestion: x", ("\n\n", "Question:")) == (" 18", True)
    assert evaluate.cut_at_stop(" 18 Question:\n\n", ("\n\n", "Question:")) == (" 18 ", True)
    assert evaluate.cut_at_stop(" 18", ("\n\n",)) == (" 18", False)
    assert evaluate.cut_at_stop("a\nb", ()) == ("a\nb", False)


def test_fit_keeps_the_end_of_the_context_and_the_choice():
    assert evaluate.fit_context([1, 2, 3], [7, 8], 10) == ([1, 2, 3, 7, 8], 2, False)
    assert evaluate.fit_context([1, 2, 3], [7, 8], 4) == ([2, 3, 7, 8], 2, True)
    assert evaluate.fit_context([1, 2, 3], [7, 8, 9, 10], 3) == ([3, 7, 8], 2, True)


def test_generate_stops_each_row_at_its_stop():
    """`SteppedDecoder.generate(stop=...)`: a row whose generated ids satisfy `stop` is done
    (no more tokens appended); decoding ends when every row is done; None changes nothing."""
    cfg = preset("olmoe", "tiny")
    model, gate_up, down = random_model(cfg, seed=1)
    decoder = resident_decoder(model, gate_up, down, max_len=16, batch=2)
    prompt = np.asarray([[5, 6, 7, 8], [40, 41, 42, 43]], np.int32)
    free = decoder.generate(prompt, 6).generated_ids
    assert decoder.generate(prompt, 6, stop=None).generated_ids == free
    assert free[0][:2] != free[1][:2]  # the rows are told apart by their tokens
    row0 = decoder.generate(prompt, 6, stop=lambda ids: ids == free[0][:2]).generated_ids
    assert row0 == [free[0][:2], free[1]]
    seen = []
    both = decoder.generate(prompt, 6, stop=lambda ids: seen.append(list(ids)) or len(ids) >= 3)
    assert both.generated_ids == [free[0][:3], free[1][:3]]
    assert [len(ids) for ids in seen] == [1, 1, 2, 2, 3, 3]  # after each token, per live row


@pytest.mark.slow
def test_gsm8k_writes_records_and_exact_match(tmp_path):
    results = jobs.run(_config("gsm8k", max_examples=2, max_new_tokens=8), str(tmp_path))
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["job"] == "eval" and on_disk["eval"] == json.loads(json.dumps(results["eval"]))
    # A wall-clock duration that holds XLA's compiles says both.
    assert (on_disk["timings"]["clock"], on_disk["timings"]["compiles"]) == ("wall", "included")
    ev = on_disk["eval"]
    assert ev["task"] == "gsm8k" and ev["seqio_task"] == "moejax_gsm8k" and ev["examples"] == 2
    records = ev["records"]
    assert [r["line"] for r in records] == [1, 2]
    assert records[0]["target"].endswith("#### 18")
    for r in records:
        n = r["tokens_generated"]
        assert 1 <= n <= 8 and r["ttft_s"] > 0 and r["truncated"] is False
        assert "\n\n" not in r["prediction"] and "Question:" not in r["prediction"]
        # The finish reason agrees with the tokens generated (a byte-level model: one token
        # per byte of the prediction): "length" used all 8 and cut nothing; "eos" dropped its
        # end token only; "stop" cut at least a stop sequence's bytes ("\n\n" the shortest);
        # fewer than 8 tokens is never "length".
        got = len(r["prediction"].encode("utf-8"))
        assert {"length": n == 8 and got == n, "eos": got == n - 1,
                "stop": got <= n - 2}[r["finish"]], r
        assert n == 8 or r["finish"] in ("eos", "stop")
        # The job records the scorer's output for its prediction (the scorer's own checks are
        # tests/test_eval_scoring.py's).
        assert r["extracted"] == scoring.postprocess_gsm8k(r["prediction"])
        assert r["correct"] == scoring.gsm8k_match(r["target"], r["prediction"])
    # The tiny model's greedy answers (" The tot", " The sec") hold no number: by hand,
    # neither extraction finds one, nothing is correct, both scores are 0.
    assert not any(ch.isdigit() for r in records for ch in r["prediction"]), records
    assert [r["extracted"] for r in records] == [{"strict": None, "flexible": None}] * 2
    assert [r["correct"] for r in records] == [False, False]
    assert ev["exact_match"] == 0.0 and ev["flexible_match"] == 0.0
    assert on_disk["model"]["family"] == "olmoe" and on_disk["model"]["precision"] == "native"
    # Both requests went through the expert cache: a prefill and up to 7 decode passes each.
    assert 2 <= len(on_disk["cache"]["passes"]) <= 16
    assert on_disk["cache"]["total"]["requests"] > 0
    assert on_disk["config"]["eval"]["max_examples"] == 2
    # seqio ran in its worker process: TensorFlow never loaded beside JAX (it crashes XLA's
    # compilation cache there).
    assert "tensorflow" not in sys.modules and "seqio" not in sys.modules


def _gsm8k_prompts(n: int) -> list[str]:
    with open(bundled.GSM8K, encoding="utf-8") as f:
        return [f"Question: {json.loads(next(f))['question']}\nAnswer:" for _ in range(n)]


@pytest.mark.slow
def test_user_jsonl_scores_one_when_the_target_is_the_models_answer(tmp_path):
    # GSM8K's first two prompts as a user's file: the shapes the gsm8k test compiled.
    prompts = _gsm8k_prompts(2)
    first = _write(tmp_path / "a.jsonl", [{"input": p, "target": "nothing like it"}
                                          for p in prompts])
    a = jobs.run(_config("jsonl", data_file=first, max_new_tokens=8), str(tmp_path / "a"))
    assert a["eval"]["exact_match"] == 0.0 and a["eval"]["examples"] == 2
    assert a["eval"]["stop"] == ["\n"]
    answers = [r["prediction"] for r in a["eval"]["records"]]
    assert all(answer.strip() and "\n" not in answer for answer in answers), answers
    # The same prompts with the model's own (greedy, deterministic) answers as targets.
    second = _write(tmp_path / "b.jsonl", [{"q": p, "a": answer}
                                           for p, answer in zip(prompts, answers)])
    b = jobs.run(_config("jsonl", data_file=second, max_new_tokens=8, input_field="q",
                         target_field="a"), str(tmp_path / "b"))
    assert b["eval"]["exact_match"] == 1.0
    assert [r["prediction"] for r in b["eval"]["records"]] == answers


@pytest.mark.slow
def test_truthfulqa_mc_scores_from_the_loglikelihoods(tmp_path):
    # Questions and choices of one length in bytes each: every teacher-forced forward has one
    # shape (one compilation).
    path = _write(tmp_path / "tqa.jsonl", [
        {"question": "What is the capital of France?",
         "mc1_targets": {"choices": ["Paris", "Lyons", "Nice!"], "labels": [1, 0, 0]},
         "mc2_targets": {"choices": ["Paris", "Lyons", "Rome."], "labels": [1, 0, 0]}},
        {"question": "What colour is a clear sky?...",
         "mc1_targets": {"choices": ["Blue.", "Green"], "labels": [1, 0]},
         "mc2_targets": {"choices": ["Blue.", "Green", "Azure"], "labels": [1, 0, 1]}},
    ])
    results = jobs.run(_config("truthfulqa_mc", data_file=path), str(tmp_path / "w"))
    ev = results["eval"]
    assert 0.0 <= ev["mc1"] <= 1.0 and 0.0 < ev["mc2"] < 1.0 and ev["examples"] == 2
    assert ev["forwards"] == 4 + 3  # the distinct choices of each question, scored once each
    for r in ev["records"]:
        ll = r["loglikelihoods"]
        assert all(math.isfinite(x) and x < 0 for x in ll["mc1"] + ll["mc2"])
        assert ll["mc1"][:2] == ll["mc2"][:2]  # the same choices, the same scores
    labels = [([1, 0, 0], [1, 0, 0]), ([1, 0], [1, 0, 1])]
    # By hand: mc1 is 1 when the highest log-likelihood is a true choice's; mc2 is the true
    # choices' share of the probability mass.
    recomputed = []
    for r, (one, two) in zip(ev["records"], labels):
        ll1, ll2 = r["loglikelihoods"]["mc1"], r["loglikelihoods"]["mc2"]
        m1 = float(one[ll1.index(max(ll1))] == 1)
        m2 = (sum(math.exp(x) for x, t in zip(ll2, two) if t)
              / sum(math.exp(x) for x in ll2))
        recomputed.append((m1, m2))
    assert ev["mc1"] == sum(m for m, _ in recomputed) / 2
    assert ev["mc2"] == pytest.approx(sum(m for _, m in recomputed) / 2, rel=1e-9)
    assert [r["correct"] for r in ev["records"]] == [m == 1.0 for m, _ in recomputed]


@pytest.mark.slow
def test_heldout_bits_per_byte_match_the_perplexity_job(tmp_path):
    c = _config("heldout", max_examples=1, max_tokens=300)
    results = jobs.run(c, str(tmp_path / "eval"))
    [record] = results["eval"]["records"]
    assert record["name"] == "prose" and record["tokens_scored"] == 299
    bpb = results["eval"]["bits_per_byte"]
    assert math.isfinite(bpb) and 0 < bpb < 8
    # The perplexity job on the same text, window and cache configuration.
    p = _config("heldout")
    p.job, p.perplexity.text_file = "perplexity", bundled.heldout_path("prose")
    p.perplexity.max_tokens = 300  # (the eval job's eval.max_tokens, eval.window, eval.stride)
    # The same scorer on the same tokens and window: the same number, bit for bit.
    assert jobs.run(p, str(tmp_path / "ppl"))["bits_per_byte"] == bpb


@pytest.mark.slow
def test_eval_command_line(tmp_path, pytestconfig):
    env = dict(os.environ)
    if pytestconfig.pluginmanager.hasplugin("cacheprovider"):  # the suite's compilation cache
        env.update(JAX_COMPILATION_CACHE_DIR=str(pytestconfig.cache.mkdir("jax")),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    cmd = [sys.executable, "-m", "moejax.main", "--config=configs/eval.py",
           "--config.eval.task=gsm8k", "--config.eval.max_examples=1",
           "--config.eval.max_new_tokens=8", "--config.log.progress=False",
           "--config.log.tensorboard=False", f"--workdir={tmp_path}"]
    ok = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    ev = json.loads((tmp_path / "results.json").read_text())["eval"]
    assert ev["examples"] == 1 and len(ev["records"]) == 1
    assert "gsm8k [moejax_gsm8k]: exact_match" in ok.stdout
