"""The eval tasks as seqio Tasks (the `eval` extra: seqio, TensorFlow).

Each task's source is a `seqio.FunctionDataSource` over the rows `moejax.eval.data` reads, so
seqio and the plain reader give the same examples. Preprocessors: few-shot (generation tasks,
`shots` > 0: the first `shots` rows become a prefix of every prompt and leave the split), then
`seqio.preprocessors.tokenize` with a byte vocabulary, keeping the text fields
`inputs_pretokenized` / `targets_pretokenized` that moejax's own tokenizer encodes. A `meta`
field carries what scoring needs (JSON). `postprocess_fn` and `metric_fns` are
`moejax.eval.scoring`'s, in seqio's signatures.

Names: `moejax_gsm8k` (the split moejax ships), `moejax_heldout`, and for a file
`moejax_{task}_{hash}` (a short hash of the file's absolute path and the field names);
`_{k}shot` is appended for k-shot prompts. Tasks are registered on first use.

seqio imports TensorFlow, and TensorFlow must not share a process with JAX's compilations:
with it loaded, XLA's executable (de)serialization for the persistent compilation cache
segfaulted after a few hundred compilations (the test suite, docs/findings/quality.md). So seqio runs in a
process of its own: `Isolated` (a spawned worker, reused across calls) builds the Task and
returns its examples as plain `data.Example`s; `load` is one call in a fresh worker. The
postprocess and metric functions are `moejax.eval.scoring`'s (`POSTPROCESS`, `METRICS`, pure
Python), the same objects the seqio Task holds. In the worker the GPUs are hidden from
TensorFlow before anything runs, so it never takes accelerator memory.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import multiprocessing
import os
from typing import TYPE_CHECKING, Callable

from moejax.errors import ConfigError
from moejax.eval import data, scoring

if TYPE_CHECKING:
    import seqio


@functools.cache
def seqio_module():
    """seqio, imported once, with TensorFlow kept off the GPUs."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow already initialised its devices (someone else imported it)
        pass
    import seqio

    return seqio


POSTPROCESS = {"gsm8k": scoring.postprocess_gsm8k, "jsonl": scoring.postprocess_strip,
               "nq_open": scoring.postprocess_nq, "truthfulqa_mc": scoring.postprocess_mc,
               "heldout": scoring.postprocess_identity}
METRICS = {"gsm8k": (scoring.gsm8k_metrics,), "jsonl": (scoring.exact_match_metrics,),
           "nq_open": (scoring.nq_metrics,), "truthfulqa_mc": (scoring.truthfulqa_metrics,),
           "heldout": (scoring.bits_per_byte_metrics,)}


@dataclasses.dataclass(frozen=True)
class TaskData:
    """What the eval job needs of a seqio Task: its name, its split and its examples."""

    name: str
    split: str
    examples: list[data.Example]


def _load_here(task: str, data_file: str, shots: int, input_field: str, target_field: str,
               max_examples: int) -> TaskData:
    obj = get_task(task, data_file=data_file, shots=shots, input_field=input_field,
                   target_field=target_field)
    return TaskData(obj.name, obj.splits[0], task_examples(obj, max_examples))


def tensorflow_gpus() -> int:
    """The GPUs TensorFlow sees once seqio is loaded (0: it stays off the accelerator)."""
    seqio_module()
    import tensorflow as tf

    return len(tf.config.get_visible_devices("GPU"))


class Isolated:
    """seqio (and TensorFlow) in a spawned worker process of their own, reused across calls.
    A ConfigError in the worker (a missing or corrupt file) is raised here."""

    def __init__(self):
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"))

    def load(self, task: str, *, data_file: str = "", shots: int = 0,
             input_field: str = data.DEFAULT_INPUT_FIELD,
             target_field: str = data.DEFAULT_TARGET_FIELD, max_examples: int = 0) -> TaskData:
        """The task's seqio Task (registered in the worker on first use) and its first
        `max_examples` examples (0: all). Bad arguments fail here, before the worker runs."""
        data.check_task(task, data_file)
        data.check_counts(task, shots, max_examples)
        return self.run(_load_here, task, data_file, shots, input_field, target_field,
                        max_examples)

    def run(self, fn: Callable, *args):
        """`fn(*args)` in the worker (`fn` a module-level function)."""
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown()

    def __enter__(self) -> "Isolated":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: Isolated | None = None


def shared() -> Isolated:
    """The process's one seqio worker, started on first use and shut down at exit: starting
    one imports TensorFlow (seconds on a small machine), so every task load of a process (a
    job, or a test session running many jobs) reuses it."""
    global _shared
    if _shared is None:
        _shared = Isolated()
        atexit.register(_shared.close)
    return _shared


def load(task: str, **kw) -> TaskData:
    """`Isolated().load(task, **kw)` in the process's shared worker (`shared`); a worker that
    died (killed, out of memory) is replaced once."""
    global _shared
    try:
        return shared().load(task, **kw)
    except concurrent.futures.process.BrokenProcessPool:
        _shared = None
        return shared().load(task, **kw)


def task_name(task: str, *, data_file: str = "", shots: int = 0,
              input_field: str = data.DEFAULT_INPUT_FIELD,
              target_field: str = data.DEFAULT_TARGET_FIELD) -> str:
    name = f"moejax_{task}"
    if data_file:
        key = [os.path.abspath(data_file)]
        if task == "jsonl":
            key += [input_field, target_field]
        name += "_" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:10]
    return name + (f"_{shots}shot" if shots else "")


def get_task(task: str, *, data_file: str = "", shots: int = 0,
             input_field: str = data.DEFAULT_INPUT_FIELD,
             target_field: str = data.DEFAULT_TARGET_FIELD) -> "seqio.Task":
    """The seqio Task of `task` (registered on first use). A task that needs `data_file` and
    has none, or a few-shot count it cannot take, is a ConfigError here; a missing or bad
    file is one when the dataset is built (`task_examples`)."""
    data.check_task(task, data_file)
    data.check_counts(task, shots, 0)
    seqio = seqio_module()
    name = task_name(task, data_file=data_file, shots=shots, input_field=input_field,
                     target_field=target_field)
    if name in seqio.TaskRegistry.names():
        return seqio.TaskRegistry.get(name)
    read = functools.partial(data.read_task, task, data_file=data_file,
                             input_field=input_field, target_field=target_field)
    split = data.SPLITS[task]
    vocab = seqio.ByteVocabulary()
    features = {"inputs": seqio.Feature(vocab, add_eos=False, required=False),
                "targets": seqio.Feature(vocab, add_eos=False)}
    preprocessors = ([_fewshot(task, shots)] if shots else []) + [seqio.preprocessors.tokenize]
    source = seqio.FunctionDataSource(functools.partial(_dataset, read), splits=(split,))
    return seqio.TaskRegistry.add(name, source=source, output_features=features,
                                  preprocessors=preprocessors, postprocess_fn=POSTPROCESS[task],
                                  metric_fns=METRICS[task])


def task_examples(task_obj: "seqio.Task", max_examples: int = 0) -> list[data.Example]:
    """The task's examples in order (its only split, unshuffled): the first `max_examples`
    (0: all)."""
    if max_examples < 0:
        raise ConfigError(f"eval.max_examples={max_examples} must be >= 0 (0: all)")
    ds = task_obj.get_dataset(split=task_obj.splits[0], shuffle=False, sequence_length=None)
    if max_examples:
        ds = ds.take(max_examples)
    return [data.Example(ex["inputs_pretokenized"].decode("utf-8"),
                         ex["targets_pretokenized"].decode("utf-8"),
                         json.loads(ex["meta"].decode("utf-8")))
            for ex in ds.as_numpy_iterator()]


def seqio_example(example: data.Example) -> dict:
    """An example as the task's postprocess_fn sees it from seqio (`example=`)."""
    return {"inputs_pretokenized": example.inputs, "targets_pretokenized": example.targets,
            "meta": json.dumps(example.meta)}


def _dataset(read, split: str, shuffle_files: bool = False, seed: int | None = None):
    """The rows of the task's file as a tf.data.Dataset of strings (never shuffled)."""
    import tensorflow as tf

    del split, shuffle_files, seed  # one split; the order is the file's
    rows = read()
    return tf.data.Dataset.from_tensor_slices({
        "inputs": tf.constant([r.inputs for r in rows], tf.string),
        "targets": tf.constant([r.targets for r in rows], tf.string),
        "meta": tf.constant([json.dumps(r.meta) for r in rows], tf.string),
    })


def _fewshot(task: str, shots: int):
    """The first `shots` examples, each inputs + targets + a blank line, prefixed to the
    inputs of every later one; the exemplars leave the dataset."""

    def fewshot(dataset):
        import tensorflow as tf

        total = int(dataset.cardinality())
        if total >= 0 and shots >= total:
            raise ConfigError(f"eval.shots={shots} takes every one of the {total} examples of "
                              f"{task} as an exemplar: nothing is left to evaluate")
        prefix = dataset.take(shots).reduce(
            tf.constant("", tf.string),
            lambda acc, ex: tf.strings.join([acc, ex["inputs"], ex["targets"], "\n\n"]))
        return dataset.skip(shots).map(
            lambda ex: {**ex, "inputs": tf.strings.join([prefix, ex["inputs"]])})

    return fewshot
