"""Examples of the eval job's tasks, read from the data moejax ships or a local JSONL file.

Pure Python (no seqio, no TensorFlow): `moejax.eval.tasks` builds its seqio Tasks from these
same rows, so the seqio pipeline and this reader give the same examples.

Tasks (`TASKS`):

* `gsm8k`: the GSM8K test split moejax ships (`moejax.bundled.GSM8K`; `data_file` may name
  another file of the same format, one `{"question", "answer"}` object a line). Inputs
  `"Question: {question}\\nAnswer:"`, targets `" {answer}"`: the full reference answer, its
  reasoning and its final `#### N` line (the format the embedded model trained on).
* `heldout`: the held-out texts (`moejax.bundled.HELDOUT_NAMES`: prose, code, math, unseen), one
  example each with empty inputs and the text as targets; scored in bits per byte.
* `jsonl`: a user file of `{"input": ..., "target": ...}` objects (field names configurable).
* `truthfulqa_mc`: Hugging Face `truthful_qa` `multiple_choice` rows: `{"question",
  "mc1_targets": {"choices": [...], "labels": [...]}, "mc2_targets": {...}}`. Inputs
  `"Q: {question}\\nA:"`; each choice is scored as the continuation `" {choice}"`.
* `nq_open`: Hugging Face `nq_open` rows: `{"question", "answer": [reference answers]}`. Inputs
  `"Question: {question}?\\nAnswer:"`, targets the first answer; any answer counts.

Bad input (a missing file, a line that is not JSON, a missing or ill-typed field) raises
`moejax.errors.ConfigError` naming the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterator

from moejax import bundled
from moejax.errors import ConfigError

TASKS = ("gsm8k", "heldout", "jsonl", "truthfulqa_mc", "nq_open")
# What the job does with a task's examples: greedy generation scored against the targets,
# log-likelihood of each choice, or bits per byte of the targets.
KIND = {"gsm8k": "generate", "jsonl": "generate", "nq_open": "generate",
        "truthfulqa_mc": "choice", "heldout": "bits"}
# Tasks that read `data_file` and cannot run without one (gsm8k reads one when given).
NEEDS_DATA_FILE = ("jsonl", "truthfulqa_mc", "nq_open")
# The split each task's examples come from (the name of the seqio split).
SPLITS = {"gsm8k": "test", "heldout": "test", "jsonl": "test", "truthfulqa_mc": "validation",
          "nq_open": "validation"}
# Generation stops at the first of these (the text is cut there); and at EOS, or after
# `max_new_tokens`.
STOP = {"gsm8k": ("\n\n", "Question:"), "nq_open": ("\n",), "jsonl": ("\n",)}

DEFAULT_INPUT_FIELD = "input"
DEFAULT_TARGET_FIELD = "target"


@dataclasses.dataclass(frozen=True)
class Example:
    """One example: the model's prompt, the reference, and what scoring needs besides
    (`line`: 1-based line of the source file; `answers` for nq_open; `mc1`/`mc2` choices and
    labels for truthfulqa_mc; `name` of a held-out text)."""

    inputs: str
    targets: str
    meta: dict = dataclasses.field(default_factory=dict)


def load_examples(task: str, *, data_file: str = "", max_examples: int = 0, shots: int = 0,
                  input_field: str = DEFAULT_INPUT_FIELD,
                  target_field: str = DEFAULT_TARGET_FIELD) -> list[Example]:
    """The examples of `task` the eval job runs, in file order.

    `shots` > 0 (generation tasks): the first `shots` examples of the file become the
    exemplars, each `inputs + targets` followed by a blank line, prepended to every prompt, and
    are removed from the evaluated examples. moejax ships only GSM8K's test split, so its
    exemplars come from that split (and are not scored). Then `max_examples` > 0 keeps the
    first that many.
    """
    rows = read_task(task, data_file=data_file, input_field=input_field,
                     target_field=target_field)
    return select(task, rows, shots=shots, max_examples=max_examples)


def read_task(task: str, *, data_file: str = "", input_field: str = DEFAULT_INPUT_FIELD,
              target_field: str = DEFAULT_TARGET_FIELD) -> list[Example]:
    """Every example of `task`'s file, zero-shot (what a seqio source yields)."""
    check_task(task, data_file)
    if task == "heldout":
        return _heldout()
    if task == "gsm8k":
        return _gsm8k(data_file or bundled.GSM8K)
    if task == "jsonl":
        for name, value in (("eval.input_field", input_field),
                            ("eval.target_field", target_field)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name}={value!r} must be a non-empty field name")
        return _jsonl(data_file, input_field, target_field)
    if task == "truthfulqa_mc":
        return _truthfulqa(data_file)
    return _nq_open(data_file)


def check_task(task: str, data_file: str) -> None:
    if task not in TASKS:
        raise ConfigError(f"eval.task={task!r} is not one of {TASKS}")
    if task in NEEDS_DATA_FILE and not data_file:
        raise ConfigError(f"eval.task={task!r} reads a local JSONL file and eval.data_file is "
                          f"empty: pass --config.eval.data_file=PATH")
    if task == "heldout" and data_file:
        raise ConfigError(f"eval.task='heldout' scores the held-out texts moejax ships; "
                          f"eval.data_file={data_file!r} must be empty (for bits per byte of "
                          f"a file of your own, run configs/perplexity.py)")


def select(task: str, rows: list[Example], *, shots: int, max_examples: int) -> list[Example]:
    """Few-shot prompts and the first `max_examples` (see `load_examples`)."""
    check_counts(task, shots, max_examples)
    if shots:
        if shots >= len(rows):
            raise ConfigError(f"eval.shots={shots} takes every one of the {len(rows)} examples "
                              f"of {task} as an exemplar: nothing is left to evaluate")
        prefix = fewshot_prefix(rows[:shots])
        rows = [dataclasses.replace(r, inputs=prefix + r.inputs) for r in rows[shots:]]
    return rows[:max_examples] if max_examples else rows


def check_counts(task: str, shots: int, max_examples: int) -> None:
    if max_examples < 0:
        raise ConfigError(f"eval.max_examples={max_examples} must be >= 0 (0: all)")
    if shots < 0:
        raise ConfigError(f"eval.shots={shots} must be >= 0")
    if shots and KIND[task] != "generate":
        raise ConfigError(f"eval.shots={shots}: few-shot prompts apply to the generation tasks "
                          f"{[t for t in TASKS if KIND[t] == 'generate']}, not {task!r}")


def fewshot_prefix(exemplars: list[Example]) -> str:
    """The exemplars as they precede each prompt: inputs, targets, a blank line."""
    return "".join(e.inputs + e.targets + "\n\n" for e in exemplars)


def choice_text(choice: str) -> str:
    """The continuation a multiple-choice answer is scored as, after the inputs."""
    return " " + choice


# -- readers -------------------------------------------------------------------------------------


def read_jsonl(path: str, what: str = "eval.data_file") -> Iterator[tuple[int, dict]]:
    """(1-based line number, object) for every non-blank line of `path`."""
    if not os.path.isfile(path):
        raise ConfigError(f"{what}={path!r}: no such file")
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}, line {number}: not UTF-8 ({e.reason})") from e
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}, line {number}: not JSON ({e.msg} at column "
                                  f"{e.colno})") from e
            if not isinstance(obj, dict):
                raise ConfigError(f"{path}, line {number}: expected a JSON object, got "
                                  f"{_type(obj)}")
            yield number, obj


def _field(obj: dict, name: str, kind: type, path: str, line: int) -> Any:
    if name not in obj:
        raise ConfigError(f"{path}, line {line}: field {name!r} is missing (the line has "
                          f"{sorted(obj)})")
    value = obj[name]
    if not isinstance(value, kind):
        raise ConfigError(f"{path}, line {line}: field {name!r} must be {_name(kind)}, got "
                          f"{_type(value)}")
    return value


def _strings(value: list, name: str, path: str, line: int) -> list[str]:
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise ConfigError(f"{path}, line {line}: field {name}[{i}] must be a string, got "
                              f"{_type(v)}")
    return list(value)


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), f"a number ({value!r})")


def _name(kind: type) -> str:
    return {dict: "an object", list: "a list", str: "a string"}[kind]


def _nonempty(rows: list[Example], path: str) -> list[Example]:
    if not rows:
        raise ConfigError(f"{path}: no examples (the file has no non-blank lines)")
    return rows


def _gsm8k(path: str) -> list[Example]:
    rows = []
    for line, obj in read_jsonl(path):
        question = _field(obj, "question", str, path, line)
        answer = _field(obj, "answer", str, path, line)
        rows.append(Example(f"Question: {question}\nAnswer:", f" {answer}", {"line": line}))
    return _nonempty(rows, path)


def _heldout() -> list[Example]:
    rows = []
    for name in bundled.HELDOUT_NAMES:
        with open(bundled.heldout_path(name), encoding="utf-8") as f:
            rows.append(Example("", f.read(), {"name": name}))
    return rows


def _jsonl(path: str, input_field: str, target_field: str) -> list[Example]:
    rows = []
    for line, obj in read_jsonl(path):
        meta: dict[str, Any] = {"line": line}
        if isinstance(obj.get("id"), (str, int)):
            meta["id"] = obj["id"]
        rows.append(Example(_field(obj, input_field, str, path, line),
                            _field(obj, target_field, str, path, line), meta))
    return _nonempty(rows, path)


def _choices(obj: dict, name: str, path: str, line: int, single: bool) -> dict:
    targets = _field(obj, name, dict, path, line)
    choices = _strings(_field(targets, "choices", list, path, line), f"{name}.choices", path,
                       line)
    labels = _field(targets, "labels", list, path, line)
    if len(labels) != len(choices) or not choices:
        raise ConfigError(f"{path}, line {line}: field {name} has {len(choices)} choices and "
                          f"{len(labels)} labels (one label per choice, at least one choice)")
    if any(label not in (0, 1) or isinstance(label, bool) for label in labels):
        raise ConfigError(f"{path}, line {line}: field {name}.labels={labels} must be 0s and "
                          f"1s")
    true = sum(labels)
    if (single and true != 1) or not true:
        raise ConfigError(f"{path}, line {line}: field {name}.labels={labels} must have "
                          f"{'exactly one 1' if single else 'at least one 1'}")
    return {"choices": choices, "labels": [int(x) for x in labels]}


def _truthfulqa(path: str) -> list[Example]:
    rows = []
    for line, obj in read_jsonl(path):
        question = _field(obj, "question", str, path, line)
        mc1 = _choices(obj, "mc1_targets", path, line, single=True)
        mc2 = _choices(obj, "mc2_targets", path, line, single=False)
        best = mc1["choices"][mc1["labels"].index(1)]
        rows.append(Example(f"Q: {question}\nA:", choice_text(best),
                            {"line": line, "mc1": mc1, "mc2": mc2}))
    return _nonempty(rows, path)


def _nq_open(path: str) -> list[Example]:
    rows = []
    for line, obj in read_jsonl(path):
        question = _field(obj, "question", str, path, line).strip()
        answers = _strings(_field(obj, "answer", list, path, line), "answer", path, line)
        if not answers:
            raise ConfigError(f"{path}, line {line}: field 'answer' is an empty list (at least "
                              f"one reference answer)")
        mark = "" if question.endswith("?") else "?"
        rows.append(Example(f"Question: {question}{mark}\nAnswer:", f" {answers[0]}",
                            {"line": line, "answers": answers}))
    return _nonempty(rows, path)
