"""Trains the embedded small MoE (OLMoE family, byte-level) on prose, code and math.

python -m moejax.main --config=configs/train_small.py --workdir=/tmp/moejax-train
(`python -m moejax.train ...` is the same door.)

About 30 minutes on 2 CPU cores. Re-running the same command resumes from the last checkpoint.
`--config=configs/train_small.py:smoke` is a seconds-long run for tests.
"""

import ml_collections

from moejax.train.corpus import DEFAULT_GSM8K


def get_config(arg: str | None = None):
    c = ml_collections.ConfigDict()
    c.job = "train"
    c.seed = 0
    c.model = ml_collections.ConfigDict(dict(
        hidden_size=96, num_layers=8, num_heads=3, num_kv_heads=3, num_experts=32, top_k=4,
        expert_intermediate_size=48, max_position_embeddings=1024))
    c.train = ml_collections.ConfigDict(dict(
        steps=900, batch_size=16, seq_len=256, learning_rate=3e-3, warmup_steps=40,
        final_lr_frac=0.1, weight_decay=0.01, grad_clip=1.0, aux_loss_coef=0.01,
        z_loss_coef=0.001))
    c.data = ml_collections.ConfigDict(dict(gsm8k_path=DEFAULT_GSM8K))
    c.log = ml_collections.ConfigDict(dict(every=10, eval_every=100, eval_batches=4,
                                           checkpoint_every=50))
    # blosc-compressed expert chunks keep the shipped model under 12 MB.
    c.export = ml_collections.ConfigDict(dict(dtype="bfloat16", compression="blosc"))
    if arg == "smoke":
        c.model.update(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=8,
                       top_k=2, expert_intermediate_size=16, max_position_embeddings=64)
        c.train.update(steps=6, batch_size=2, seq_len=32, warmup_steps=1)
        c.log.update(every=2, eval_every=3, eval_batches=1, checkpoint_every=3)
    elif arg:
        raise ValueError(f"unknown train_small variant {arg!r}; known: smoke")
    return c
