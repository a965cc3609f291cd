"""The eval tasks as seqio Tasks (moejax/eval/tasks.py) give exactly the examples of the plain
reader (moejax/eval/data.py), and bad data files are errors that name the file, line and field.

seqio and TensorFlow run in one spawned worker (`tasks.Isolated`) for the whole module, as the
eval job runs them: never in this (JAX) process. Starting it loads TensorFlow (a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from moejax import bundled
from moejax.errors import ConfigError
from moejax.eval import data, tasks


@pytest.fixture(scope="module")
def fresh_worker():
    """The module's one seqio worker, and the `tf.config.set_visible_devices` calls it made
    as it first loaded seqio (`_gpu_hiding_calls`, before any test used it)."""
    with tasks.Isolated() as worker:
        yield worker, worker.run(_gpu_hiding_calls)


@pytest.fixture(scope="module")
def seqio_worker(fresh_worker):
    return fresh_worker[0]


def _write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _both(worker, task: str, **kw) -> list[data.Example]:
    """The examples through seqio, checked equal to the plain reader's."""
    via_seqio = worker.load(task, **kw).examples
    plain = data.load_examples(task, **kw)
    assert via_seqio == plain
    return plain


def _bundled_rows() -> list[dict]:
    with open(bundled.GSM8K, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_gsm8k_seqio_task_is_the_shipped_split(seqio_worker):
    rows = _bundled_rows()
    examples = _both(seqio_worker, "gsm8k")
    assert len(examples) == len(rows) == 1319
    for i in (0, 1, 1318):
        assert examples[i].inputs == f"Question: {rows[i]['question']}\nAnswer:"
        assert examples[i].targets == f" {rows[i]['answer']}"  # the full answer, "#### N" too
        assert examples[i].meta == {"line": i + 1}
    assert seqio_worker.load("gsm8k", max_examples=1).name == "moejax_gsm8k"


def test_gsm8k_from_a_file_of_its_format(seqio_worker, tmp_path):
    path = _write(tmp_path / "train.jsonl", [{"question": "1+1?", "answer": "2\n#### 2"},
                                             {"question": "2+2?", "answer": "#### 4"}])
    examples = _both(seqio_worker, "gsm8k", data_file=path, shots=1)
    assert examples == [data.Example("Question: 1+1?\nAnswer: 2\n#### 2\n\n"
                                      "Question: 2+2?\nAnswer:", " #### 4", {"line": 2})]
    name = seqio_worker.load("gsm8k", data_file=path, shots=1).name
    assert name.startswith("moejax_gsm8k_") and name.endswith("_1shot")


def _gpu_hiding_calls() -> list:
    """In a fresh seqio worker: every tf.config.set_visible_devices call made while
    moejax.eval.tasks loads seqio (the original still runs), as (devices, device type).
    (Run by the `fresh_worker` fixture as it starts the module's worker.)"""
    import tensorflow as tf

    assert "seqio" not in sys.modules  # a fresh worker: nothing configured TensorFlow yet
    calls = []
    original = tf.config.set_visible_devices

    def record(devices, device_type=None):
        calls.append((list(devices), device_type))
        return original(devices, device_type)

    tf.config.set_visible_devices = record
    try:
        tasks.seqio_module.cache_clear()
        tasks.seqio_module()
    finally:
        tf.config.set_visible_devices = original
    return calls


def test_tensorflow_stays_off_the_gpus_and_out_of_the_plain_modules(fresh_worker):
    # On a machine without GPUs TensorFlow sees none whatever tasks.py does, so the test
    # watches the call that hides them, in the seqio worker as it first loaded seqio (never
    # this JAX process).
    worker, calls = fresh_worker
    assert calls == [([], "GPU")]
    assert worker.run(tasks.tensorflow_gpus) == 0
    # The plain reader, the scoring and the job modules import neither seqio nor TensorFlow.
    code = ("import sys, moejax.eval.data, moejax.eval.scoring, moejax.eval.tasks, "
            "moejax.jobs.evaluate; "
            "print(sorted(m for m in ('seqio', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_few_shot_prefixes_the_exemplars_and_removes_them(seqio_worker):
    rows = _bundled_rows()
    examples = _both(seqio_worker, "gsm8k", shots=2, max_examples=3)
    prefix = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in rows[:2])
    assert len(examples) == 3
    for ex, row in zip(examples, rows[2:5]):  # the exemplars are not evaluated
        assert ex.inputs == prefix + f"Question: {row['question']}\nAnswer:"
        assert ex.targets == f" {row['answer']}"
    two_shot = seqio_worker.load("gsm8k", shots=2)
    assert two_shot.name == "moejax_gsm8k_2shot" and len(two_shot.examples) == len(rows) - 2


def test_heldout_texts(seqio_worker):
    examples = _both(seqio_worker, "heldout")
    assert [e.meta["name"] for e in examples] == list(bundled.HELDOUT_NAMES)
    with open(bundled.heldout_path("code"), encoding="utf-8") as f:
        assert examples[1].targets == f.read() and examples[1].inputs == ""


def test_user_jsonl_with_its_own_field_names(seqio_worker, tmp_path):
    path = _write(tmp_path / "user.jsonl", [
        {"prompt": "2 + 2 =", "answer": " 4", "id": "a"},
        "",  # blank lines are skipped
        {"prompt": "Héllo, ", "answer": "wörld", "extra": [1, 2]},
    ])
    examples = _both(seqio_worker, "jsonl", data_file=path, input_field="prompt",
                     target_field="answer")
    assert examples == [data.Example("2 + 2 =", " 4", {"line": 1, "id": "a"}),
                        data.Example("Héllo, ", "wörld", {"line": 3})]
    name = seqio_worker.load("jsonl", data_file=path, input_field="prompt",
                             target_field="answer").name
    assert name == tasks.task_name("jsonl", data_file=path, input_field="prompt",
                                   target_field="answer")
    other = tasks.task_name("jsonl", data_file=str(tmp_path / "other.jsonl"))
    assert name.startswith("moejax_jsonl_") and name != other


def test_truthfulqa_and_nq_open_files(seqio_worker, tmp_path):
    tqa = _write(tmp_path / "tqa.jsonl", [{
        "question": "What is the capital of France?",
        "mc1_targets": {"choices": ["Paris", "Lyon"], "labels": [1, 0]},
        "mc2_targets": {"choices": ["Paris", "Lyon", "Paris, France"], "labels": [1, 0, 1]},
    }])
    [ex] = _both(seqio_worker, "truthfulqa_mc", data_file=tqa)
    assert ex.inputs == "Q: What is the capital of France?\nA:" and ex.targets == " Paris"
    assert ex.meta["mc2"] == {"choices": ["Paris", "Lyon", "Paris, France"], "labels": [1, 0, 1]}
    nq = _write(tmp_path / "nq.jsonl", [
        {"question": "who wrote python", "answer": ["Guido van Rossum", "van Rossum"]},
        {"question": "what is 2+2?", "answer": ["4"]},
    ])
    examples = _both(seqio_worker, "nq_open", data_file=nq, max_examples=2)
    assert examples[0].inputs == "Question: who wrote python?\nAnswer:"
    assert examples[1].inputs == "Question: what is 2+2?\nAnswer:"
    assert examples[0].targets == " Guido van Rossum"
    assert examples[0].meta["answers"] == ["Guido van Rossum", "van Rossum"]


PREDICTIONS = (" so 18.\n#### 18", " 18", " #### ", "", " The Beatles.\n", " $1,234.50")


def _task_functions(task: str, data_file: str):
    """(in the worker) the seqio Task's postprocessed PREDICTIONS and its metric functions."""
    obj = tasks.get_task(task, data_file=data_file)
    return [obj.postprocess_fn(p) for p in PREDICTIONS], tuple(obj.metric_fns)


def test_the_tasks_postprocess_and_metrics_score_examples(seqio_worker, tmp_path):
    # The job scores with tasks.POSTPROCESS / METRICS: what the Task postprocesses and scores.
    nq_file = _write(tmp_path / "nq.jsonl", [{"question": "q", "answer": ["The Beatles",
                                                                          "Beatles"]}])
    for task, data_file in (("gsm8k", ""), ("nq_open", nq_file)):
        processed, metric_fns = seqio_worker.run(_task_functions, task, data_file)
        assert processed == [tasks.POSTPROCESS[task](p) for p in PREDICTIONS]
        assert metric_fns == tasks.METRICS[task]
    [ex] = seqio_worker.load("gsm8k", max_examples=1).examples
    postprocess, seqio_ex = tasks.POSTPROCESS["gsm8k"], tasks.seqio_example(ex)
    target = postprocess(ex.targets, example=seqio_ex, is_target=True)
    preds = [postprocess(p, example=seqio_ex) for p in (" so 18.\n#### 18", " 18")]
    metrics = {}
    for fn in tasks.METRICS["gsm8k"]:
        metrics.update(fn([target, target], preds))
    assert metrics == {"exact_match": 0.5, "flexible_match": 1.0}
    [ex] = seqio_worker.load("nq_open", data_file=nq_file).examples
    postprocess = tasks.POSTPROCESS["nq_open"]
    target = postprocess(ex.targets, example=tasks.seqio_example(ex), is_target=True)
    assert tasks.METRICS["nq_open"][0]([target], [postprocess(" beatles.\n")]) == \
        {"exact_match": 1.0}


# -- bad input ------------------------------------------------------------------------------------


def _errors(worker, task: str, path: str, **kw) -> list[str]:
    """The message of the plain reader's ConfigError and of the seqio task's (same input)."""
    messages = []
    with pytest.raises(ConfigError) as plain:
        data.load_examples(task, data_file=path, **kw)
    messages.append(str(plain.value))
    with pytest.raises(ConfigError) as via_seqio:
        worker.load(task, data_file=path, **kw)
    messages.append(str(via_seqio.value))
    return messages


def test_missing_file_is_named(seqio_worker, tmp_path):
    path = str(tmp_path / "nowhere.jsonl")
    for message in _errors(seqio_worker, "jsonl", path):
        assert path in message and "no such file" in message


def test_corrupt_line_is_named(seqio_worker, tmp_path):
    path = _write(tmp_path / "bad.jsonl", [{"input": "a", "target": "b"}] * 2 +
                  ['{"input": "c", "target": '])
    for message in _errors(seqio_worker, "jsonl", path):
        assert path in message and "line 3" in message and "not JSON" in message


def test_missing_and_ill_typed_fields_are_named(seqio_worker, tmp_path):
    path = _write(tmp_path / "fields.jsonl", [{"input": "a", "target": "b"},
                                              {"input": "c", "answer": "d"}])
    for message in _errors(seqio_worker, "jsonl", path):
        assert path in message and "line 2" in message and "'target' is missing" in message
    path = _write(tmp_path / "typed.jsonl", [{"input": "a", "target": 7}])
    for message in _errors(seqio_worker, "jsonl", path):
        assert "line 1" in message and "'target' must be a string" in message
    path = _write(tmp_path / "nq.jsonl", [{"question": "q", "answer": "not a list"}])
    for message in _errors(seqio_worker, "nq_open", path):
        assert "line 1" in message and "'answer' must be a list" in message
    path = _write(tmp_path / "tqa.jsonl", [{
        "question": "q", "mc1_targets": {"choices": ["a", "b"], "labels": [1]},
        "mc2_targets": {"choices": ["a"], "labels": [1]}}])
    for message in _errors(seqio_worker, "truthfulqa_mc", path):
        assert "line 1" in message and "mc1_targets has 2 choices and 1 labels" in message
    path = _write(tmp_path / "list.jsonl", ['["input", "target"]'])
    for message in _errors(seqio_worker, "jsonl", path):
        assert "line 1" in message and "expected a JSON object" in message


def test_task_needs_its_data_file_and_few_shot_room(seqio_worker):
    for task in data.NEEDS_DATA_FILE:
        with pytest.raises(ConfigError, match=f"eval.task='{task}'.*eval.data_file is empty"):
            seqio_worker.load(task)
        with pytest.raises(ConfigError, match="eval.data_file is empty"):
            data.load_examples(task)
    with pytest.raises(ConfigError, match="eval.task='mmlu' is not one of"):
        seqio_worker.load("mmlu")
    with pytest.raises(ConfigError, match="eval.shots=2: few-shot prompts apply"):
        seqio_worker.load("heldout", shots=2)
    with pytest.raises(ConfigError, match="eval.shots=4 takes every one of the 4 examples"):
        data.select("gsm8k", data.read_task("heldout"), shots=4, max_examples=0)
    with pytest.raises(ConfigError, match="eval.max_examples=-1"):
        seqio_worker.load("gsm8k", max_examples=-1)


def test_few_shot_taking_every_example_is_an_error_through_seqio(seqio_worker, tmp_path):
    path = _write(tmp_path / "two.jsonl", [{"input": "a", "target": "b"}] * 2)
    for message in _errors(seqio_worker, "jsonl", path, shots=2):
        assert "eval.shots=2 takes every one of the 2 examples" in message
