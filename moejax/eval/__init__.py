"""Evaluation tasks of the eval job (`moejax/jobs/evaluate.py`, `configs/eval.py`).

* `data`: examples read from the bundled GSM8K split, the held-out texts or a user JSONL file
  (pure Python);
* `scoring`: answer extraction and metrics (pure Python and numpy);
* `tasks`: the same examples as seqio Tasks (the `eval` extra). seqio and TensorFlow load
  only in a spawned worker (`tasks.Isolated`, `tasks.load`), never beside JAX.
"""

from moejax.eval import data, scoring

__all__ = ["data", "scoring"]  # `tasks` imports seqio: `from moejax.eval import tasks`
