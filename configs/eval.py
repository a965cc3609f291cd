"""A task evaluated through the expert cache: seqio tasks of moejax/eval (the `eval` extra).

GSM8K (the test split moejax ships), the first 3 problems, greedy answers scored by exact match
of the final number (and the last number of the answer, `flexible_match`):
python -m moejax.main --config=configs/eval.py --config.eval.task=gsm8k \
    --config.eval.max_examples=3 --workdir=W
8-shot (the first 8 problems become the exemplars, and are not scored), a converted model:
python -m moejax.main --config=configs/eval.py --config.eval.shots=8 \
    --config.model.checkpoint=CKPT --workdir=W
Bits per byte of the held-out texts (prose, code, math, unseen):
python -m moejax.main --config=configs/eval.py --config.eval.task=heldout --workdir=W
A local JSONL file of {"input": ..., "target": ...} lines (field names: eval.input_field,
eval.target_field); TruthfulQA MC1/MC2 and NQ-open from local files in the Hugging Face formats:
python -m moejax.main --config=configs/eval.py --config.eval.task=jsonl \
    --config.eval.data_file=PATH --workdir=W
python -m moejax.main --config=configs/eval.py --config.eval.task=truthfulqa_mc \
    --config.eval.data_file=truthful_qa_mc.jsonl --workdir=W
python -m moejax.main --config=configs/eval.py --config.eval.task=nq_open \
    --config.eval.data_file=nq_open_validation.jsonl --workdir=W

Every cache option applies as in the other jobs (`--config.cache.capacity_frac=0.25`,
`--config.policies.miss='drop(keep=2)'`, ...). results.json's `eval` section holds the scores
and one record per example; `cache` the cache's report.
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    if arg:  # (`:scale=tiny` belongs to the family configs, configs/olmoe_5pct.py ...)
        raise ValueError(f"configs/eval.py takes no argument (got {arg!r})")
    c = base_config()
    c.job = "eval"
    c.eval.task = "gsm8k"
    c.eval.max_examples = 0
    return c
