"""Trains the embedded small MoE (OLMoE family, byte-level) on prose, code and math.

python -m moejax.main --config=configs/train_small.py --workdir=/tmp/moejax-train
(`python -m moejax.train ...` is the same door.)

About 30 minutes on 2 CPU cores. Re-running the same command resumes from the last checkpoint.
`--config=configs/train_small.py:smoke` is a seconds-long run for tests. Every field is the
schema's `train` section (moejax/jobs/schema.py), overridable as any other:
`--config.train.steps=1200`, `--config.train.model.num_experts=16`.
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    c = base_config()
    c.job = "train"  # the train section's defaults are the full run
    if arg == "smoke":
        c.train.model.update(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             num_experts=8, top_k=2, expert_intermediate_size=16,
                             max_position_embeddings=64)
        c.train.update(steps=6, batch_size=2, seq_len=32, warmup_steps=1, log_every=2,
                       eval_every=3, eval_batches=1, checkpoint_every=3)
    elif arg:
        raise ValueError(f"unknown train_small variant {arg!r}; known: smoke")
    return c
